//! The server's half of one session: its keys, its control queue, what it serves, and its
//! streams ([`ServerLink`]: how they are carried is the transport's business).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use warren_proto::handshake::SessionId;
use warren_proto::message::ControlMessage;

use crate::config::ServerForward;
use crate::crypto::keys::SessionKeys;
use crate::session::CONTROL_QUEUE;
use crate::session::link::{Carrier, ServerLink};
use crate::session::vitals::Vitals;
/// How long a client asked to claim again may take before the server ends its session.
pub(super) const RECLAIM_GRACE: Duration = Duration::from_secs(10);

/// Server-side state of one authenticated client.
pub struct ServerSession {
    pub(super) keys: SessionKeys,
    pub(super) peer: SocketAddr,
    /// The protocol version the client speaks.
    pub(super) version: u16,
    /// A diagnostic session (`warren doctor`, `warren ping`): it serves nothing.
    pub(super) probe: bool,
    /// Services this session was accepted for.
    pub(super) services: Vec<String>,
    /// Forward services this session may open streams for: the client's name -> the
    /// server's forward service (its target, protocol and PROXY setting).
    pub(super) forwards: HashMap<String, ServerForward>,
    /// Services the client claimed that the server refused or denied: a reload that adds
    /// one of them asks the client to claim it again.
    pub(super) unserved: Vec<String>,
    pub(super) cancel: CancellationToken,
    /// When the session was established (for the admin API).
    pub(super) since: std::time::SystemTime,
    /// What the goodbye says when the server ends the session ([`ServerSession::close`]).
    goodbye: Mutex<Option<String>>,
    control: mpsc::Sender<ControlMessage>,
    control_rx: Mutex<Option<mpsc::Receiver<ControlMessage>>>,
    /// The session's streams.
    pub(super) link: ServerLink,
    /// The congestion control its connection runs ([`Carrier::congestion`]).
    pub(super) congestion: Option<String>,
    /// Its round trip, streams open (visitors of every service it serves), and whether
    /// the client still answers.
    pub(super) vitals: Vitals,
}

impl ServerSession {
    /// A session that serves nothing yet: the caller fills in what its hello was granted
    /// before sharing it.
    pub(super) fn new(
        keys: SessionKeys,
        peer: SocketAddr,
        cancel: CancellationToken,
        carrier: Carrier,
        tasks: TaskTracker,
    ) -> Self {
        let (control, control_rx) = mpsc::channel(CONTROL_QUEUE);
        let congestion = carrier.congestion();
        let link = ServerLink::new(carrier, control.clone(), cancel.clone(), tasks);
        ServerSession {
            keys,
            peer,
            version: warren_proto::handshake::PROTOCOL_VERSION,
            probe: false,
            services: Vec::new(),
            forwards: HashMap::new(),
            unserved: Vec::new(),
            cancel,
            since: std::time::SystemTime::now(),
            goodbye: Mutex::new(None),
            control,
            control_rx: Mutex::new(Some(control_rx)),
            link,
            congestion,
            vitals: Vitals::default(),
        }
    }

    pub(super) fn id(&self) -> SessionId {
        *self.keys.session_id()
    }

    /// Ends the session from the server's side; the client reads `reason` in the goodbye.
    /// Streams already open keep flowing (they are not the session's).
    pub(super) fn close(&self, reason: &str) {
        *self
            .goodbye
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason.to_owned());
        self.cancel.cancel();
    }

    /// Asks the client to establish a new session, claiming its services again, and to end
    /// this one; ends it after [`RECLAIM_GRACE`] if the client does not (an older client,
    /// or one that cannot get a new session).
    pub(super) fn reclaim(self: &Arc<Self>, tasks: &TaskTracker) {
        let reason = "the server's config changed what this session serves".to_owned();
        // Full queue: the session is already wedged; the deadline below ends it.
        let _ = self.control.try_send(ControlMessage::Reclaim { reason });
        let session = Arc::clone(self);
        tasks.spawn(async move {
            tokio::select! {
                () = session.cancel.cancelled() => {}
                () = tokio::time::sleep(RECLAIM_GRACE) => {
                    session.close("the server's config changed; this session was not replaced in time");
                }
            }
        });
    }

    /// The goodbye's reason: the one given to [`ServerSession::close`], else shutdown.
    pub(super) fn goodbye_reason(&self) -> String {
        self.goodbye
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "shutting down".to_owned())
    }

    /// A sender of messages to the client, queued for the control loop.
    pub(super) fn control_sender(&self) -> mpsc::Sender<ControlMessage> {
        self.control.clone()
    }

    /// The receiving end of the control queue, for the control loop (taken once).
    pub(super) fn take_control_receiver(&self) -> mpsc::Receiver<ControlMessage> {
        self.control_rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| mpsc::channel(1).1)
    }
}

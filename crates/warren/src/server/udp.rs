//! The server's half of a reverse (or client-declared) UDP service.
//!
//! One socket per service, bound at start (declared: when the session's hello is
//! accepted). The flow table, the queue and the channel tasks are the shared
//! visitor-facing machinery in [`crate::relay::udp::visitors`]; this module only says where
//! its datagram channels come from: a pooled data channel of the session serving the
//! service, taken like a TCP visitor's (with `StreamOpen { service }`).

use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::session::ServerSession;
use super::{STREAM_OPEN_TIMEOUT, ServiceSlot, Shared, open_stream};
use crate::config::UdpSettings;
use crate::relay::udp::UdpStats;
use crate::relay::udp::visitors::{self, ChannelSource, VisitorSide};
use crate::session::stream::Stream;

/// A UDP service, bound and ready to serve.
pub(super) struct UdpService {
    pub(super) slot: Arc<ServiceSlot>,
    pub(super) socket: Arc<UdpSocket>,
    pub(super) settings: UdpSettings,
    pub(super) stats: Arc<UdpStats>,
}

/// Channels from the sessions serving a service slot: each new flow goes to the session
/// the service's balancing picks.
struct SlotSource(Arc<ServiceSlot>);

impl ChannelSource for SlotSource {
    type Session = ServerSession;

    fn pick(&self) -> Option<Arc<ServerSession>> {
        // A flow is not a stream: the lease ends at once, so flows spread round-robin.
        self.0.pick(&[]).map(|lease| Arc::clone(&lease.session))
    }

    fn session_cancel(&self, session: &ServerSession) -> CancellationToken {
        session.cancel.clone()
    }

    fn is_live(&self, session: &ServerSession) -> bool {
        !session.cancel.is_cancelled()
    }

    async fn open(&self, session: Arc<ServerSession>) -> Result<Stream, String> {
        match tokio::time::timeout(
            STREAM_OPEN_TIMEOUT,
            open_stream(&session, &self.0.name, None, None),
        )
        .await
        {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!(
                "no data channel from the client within {STREAM_OPEN_TIMEOUT:?}"
            )),
        }
    }
}

/// Serves one UDP service until `until` is cancelled (the server stops; for a declared
/// service, its session ends, which also closes the socket).
pub(super) async fn serve_udp(shared: Arc<Shared>, service: UdpService, until: CancellationToken) {
    let side = VisitorSide {
        name: service.slot.name.clone(),
        socket: service.socket,
        settings: service.settings,
        stats: service.stats,
        limit: shared.limits.get(&service.slot.name),
        source: Arc::new(SlotSource(service.slot)),
    };
    visitors::serve(side, shared.tasks.clone(), until).await;
}

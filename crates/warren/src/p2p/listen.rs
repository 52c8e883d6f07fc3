//! Keeping a tunnel's exit offered: offer it at the server's mailbox (under a fresh code,
//! or by a named service's name), serve every peer that comes (each over its own pinned
//! connection, up to a bound), and offer a named service again whenever the server is lost.
//!
//! What `warren p2p listen` and a client's `p2p = true` service with a `target` both run.
//! A code lives as long as its offering: losing the server ends a code's listener, since
//! its peers could not find it under the same code again. A name outlives server restarts
//! and another client offering it for a while: it is offered again, pausing longer each
//! time (0.5 s doubling to 30 s).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::session::{Offering, Options, SessionError};
use super::tunnel::{Event, Exit, Reporter, TunnelStats, report_moves};
use crate::crypto::secret::Secret;

/// First pause before a named service is offered again; it doubles up to
/// [`REOFFER_MAX_PAUSE`].
const REOFFER_FIRST_PAUSE: Duration = Duration::from_millis(500);
/// Longest pause between two offers.
const REOFFER_MAX_PAUSE: Duration = Duration::from_secs(30);
/// How long a finished peer's endpoint may take to tell the peer goodbye.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(1);

/// An exit and how it is offered.
#[derive(Clone)]
pub struct Listener {
    /// The service and what kind it is.
    pub exit: Arc<Exit>,
    /// `Some((name, token))`: a named service of the server's; `None`: under a code.
    pub service: Option<(String, Secret)>,
    /// The server, the peers' settings (its purpose must be [`super::session::Purpose::Tunnel`]).
    pub options: Options,
    /// Peers served at once; more are refused with the reason.
    pub max_peers: usize,
    /// What all its peers moved.
    pub stats: Arc<TunnelStats>,
}

/// Offers `listener` and serves its peers until `stop` fires (`Ok`), or, for a code, until
/// the mailbox fails (`Err`, why). `report` hears each step.
///
/// # Errors
///
/// A code's offering failed or its mailbox was lost (a named service never fails: it is
/// offered again).
pub async fn keep_offered(
    listener: &Listener,
    stop: &CancellationToken,
    report: &Reporter,
) -> Result<(), String> {
    // Ends the peers too when a code's offering fails: nothing else would.
    let stop = &stop.child_token();
    let mut peers = JoinSet::new();
    let mut pause = REOFFER_FIRST_PAUSE;
    let failure = loop {
        let opened = match &listener.service {
            Some((name, token)) => {
                Offering::open_service(listener.options.clone(), name, token.clone()).await
            }
            None => Offering::open(listener.options.clone()).await,
        };
        let mut offering = match opened {
            Ok(offering) => offering,
            Err(error) if listener.service.is_some() => {
                report(Event::Retrying {
                    error: &format!("cannot offer the service: {error}"),
                    pause,
                });
                tokio::select! {
                    () = stop.cancelled() => break None,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(REOFFER_MAX_PAUSE);
                continue;
            }
            Err(error) => break Some(error.to_string()),
        };
        pause = REOFFER_FIRST_PAUSE;
        report(Event::Offered(offering.code()));
        let ended = serve_peers(listener, &mut offering, &mut peers, stop, report).await;
        offering.close().await;
        match ended {
            None => break None,
            Some(error) if listener.service.is_some() => {
                report(Event::Notice(&format!(
                    "lost the server's mailbox ({error}); offering again"
                )));
            }
            Some(error) => break Some(error),
        }
    };
    stop.cancel();
    while peers.join_next().await.is_some() {}
    failure.map_or(Ok(()), Err)
}

/// Serves every peer that comes to `offering` (each in `peers`) until `stop` (`None`) or
/// the mailbox fails (`Some`, why).
async fn serve_peers(
    listener: &Listener,
    offering: &mut Offering,
    peers: &mut JoinSet<()>,
    stop: &CancellationToken,
    report: &Reporter,
) -> Option<String> {
    loop {
        while peers.try_join_next().is_some() {}
        // `next_receiver` is not cancel-safe, which only matters for the peer of the
        // moment: a stop ends everything anyway.
        let connected = tokio::select! {
            () = stop.cancelled() => return None,
            connected = offering.next_receiver() => connected,
        };
        let connected = match connected {
            Ok(connected) => connected,
            Err(
                error @ (SessionError::Pake(_)
                | SessionError::WrongPurpose { .. }
                | SessionError::WrongPeer { .. }),
            ) => {
                report(Event::Notice(&format!("a peer was refused: {error}")));
                continue;
            }
            Err(error @ (SessionError::PeerLeft(_) | SessionError::NoPath(_))) => {
                report(Event::Notice(&format!("a peer could not connect: {error}")));
                continue;
            }
            Err(error) => return Some(error.to_string()),
        };
        if peers.len() >= listener.max_peers {
            connected
                .connection
                .close(1u32.into(), b"the listener serves as many peers as it may");
            report(Event::Notice(&format!(
                "refused peer {}: {} peers are connected, the most it serves at once",
                connected.peer.short(),
                peers.len()
            )));
            continue;
        }
        report(Event::Connected(&connected));
        let (exit, stats, stop, report) = (
            Arc::clone(&listener.exit),
            Arc::clone(&listener.stats),
            stop.clone(),
            Arc::clone(report),
        );
        peers.spawn(async move {
            let served = tokio::select! {
                served = exit.serve(&connected.connection, &stats, &stop) => served,
                () = report_moves(&connected, &report) => unreachable!("report_moves never returns"),
            };
            let reason = match served {
                Ok(reason) => reason,
                Err(error) => error.to_string(),
            };
            report(Event::Disconnected {
                peer: &connected,
                reason: &reason,
            });
            let _ = tokio::time::timeout(GOODBYE_TIMEOUT, connected.endpoint.wait_idle()).await;
        });
    }
}

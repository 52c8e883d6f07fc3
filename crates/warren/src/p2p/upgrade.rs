//! A tunnel's connection starts through the server's relay at once and moves to the
//! direct path when the connectivity checks find one, without dropping a stream.
//!
//! Both sides join the relay before they check, so the relayed path is ready at once; the
//! connecting side waits [`DIRECT_FIRST`] for the checks, then connects through the relay
//! if they have not succeeded. The checks go on meanwhile ([`spawn_upgrade`]): when they
//! succeed, the peer socket carries the connection's packets on the direct path
//! underneath ([`DemuxSocket::go_direct`]; QUIC keeps talking to the relay's address and
//! never notices). Checks that fail are tried again, pausing 2 s doubling to 60 s, while
//! the connection lives: a NAT that lets nothing through at first (a firewall rule,
//! a mapping not yet open) may later. Once direct, the side keeps answering the peer's
//! checks (with a check back) so a peer still checking finds the path too.
//!
//! Both sides retry on the same schedule from nearly the same moment (their connection's
//! start), so their checks overlap, which punching through two NATs needs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::net::candidates::Candidates;
use super::net::demux::{DemuxSocket, StunChannel};
use super::net::punch::{Checker, PunchError, Punched};
use super::session::Route;

/// How long the connecting side waits for the checks before it connects through the
/// relay: long enough for a path with no NAT in the way (a LAN, loopback) to be found
/// first and keep its bigger packets, short enough that a visitor barely waits.
pub(super) const DIRECT_FIRST: Duration = Duration::from_millis(500);
/// First pause before checking again after the checks failed.
const RETRY_FIRST: Duration = Duration::from_secs(2);
/// Longest pause between two rounds of checks.
const RETRY_MAX: Duration = Duration::from_secs(60);
/// One stretch of answering once direct (it goes on for as long as the connection).
const ANSWER_STRETCH: Duration = Duration::from_secs(3600);

/// Checks running on their own task: the checker comes back with the result.
pub(super) type Punching = JoinHandle<(Checker<StunChannel>, Result<Punched, PunchError>)>;

/// Starts the checks on their own task.
pub(super) fn start_punching(
    mut checker: Checker<StunChannel>,
    ours: Candidates,
    theirs: Candidates,
) -> Punching {
    tokio::spawn(async move {
        let result = checker.punch(&ours, &theirs).await;
        (checker, result)
    })
}

/// The route a connection's packets take now: relayed, then direct once moved.
#[derive(Debug, Clone)]
pub struct PathWatch(watch::Receiver<Route>);

impl PathWatch {
    /// A route that never changes.
    pub(super) fn fixed(route: Route) -> PathWatch {
        PathWatch(watch::channel(route).1)
    }

    /// The route now.
    pub fn route(&self) -> Route {
        *self.0.borrow()
    }

    /// Waits for the route to change; `None` once it no longer can (moved for good, or
    /// the connection ended).
    pub async fn changed(&mut self) -> Option<Route> {
        self.0.changed().await.ok()?;
        Some(*self.0.borrow_and_update())
    }
}

/// Moves `connection`, relayed through `relay` on `socket`, to the direct path once
/// `punching` (or a later round of checks) finds one; stops with the connection.
pub(super) fn spawn_upgrade(
    connection: quinn::Connection,
    socket: Arc<DemuxSocket>,
    relay: SocketAddr,
    punching: Punching,
    candidates: (Candidates, Candidates),
) -> PathWatch {
    socket.hold_relayed(relay);
    let (tx, rx) = watch::channel(Route::Relayed(relay));
    tokio::spawn(async move {
        tokio::select! {
            () = upgrade(&socket, punching, &candidates, &tx) => {}
            _ = connection.closed() => {}
        }
    });
    PathWatch(rx)
}

async fn upgrade(
    socket: &DemuxSocket,
    punching: Punching,
    (ours, theirs): &(Candidates, Candidates),
    route: &watch::Sender<Route>,
) {
    let Ok((mut checker, mut result)) = punching.await else {
        return;
    };
    let mut pause = RETRY_FIRST;
    loop {
        match result {
            Ok(punched) => {
                socket.go_direct(punched.remote);
                let _ = route.send(Route::Direct(punched.remote));
                tracing::info!(
                    event = "p2p_path_direct",
                    peer = %punched.remote,
                    rtt_ms = punched.rtt.as_secs_f64() * 1e3,
                    "the relayed connection moved to the direct path"
                );
                while checker.answer_for(ANSWER_STRETCH).await.is_ok() {}
                return;
            }
            Err(PunchError::Io(error)) => {
                tracing::debug!(event = "p2p_upgrade_stopped", %error, "checks stopped; the connection stays relayed");
                return;
            }
            Err(_) => {}
        }
        // Answer meanwhile: a peer whose round started a little earlier still hears us.
        if checker.answer_for(pause).await.is_err() {
            return;
        }
        pause = (pause * 2).min(RETRY_MAX);
        result = checker.punch(ours, theirs).await;
    }
}

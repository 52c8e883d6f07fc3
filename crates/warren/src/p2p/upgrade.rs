//! A tunnel's connection keeps the best path that works for as long as it lives, and no
//! stream notices when it changes.
//!
//! **Relay first.** Both sides join the relay before they check, so the relayed path is
//! ready at once; the connecting side waits [`DIRECT_FIRST`] for the checks, then
//! connects through the relay if they have not succeeded. The checks go on meanwhile
//! ([`keep_path`]): when they succeed, the peer socket carries the connection's packets on
//! the direct path underneath ([`DemuxSocket::send_via`]; QUIC keeps talking to the
//! address it was made with, its anchor, and never notices). Checks that fail are tried
//! again, pausing 2 s doubling to 60 s: a NAT that lets nothing through at first (a
//! firewall rule, a mapping not yet open) may later. Both sides retry on the same schedule
//! from nearly the same moment (their connection's start), so their checks overlap, which
//! punching through two NATs needs.
//!
//! **Direct, watched.** Once direct, each side checks the path every second and answers
//! the peer's checks ([`Checker::watch`], RFC 7675's consent freshness). When a NAT gives
//! the peer a new port (a *rebinding*: a router restarted, a mapping timed out), the peer's
//! checks come from the new port; we check it back and the path follows it. When the path
//! stops answering for [`CONSENT`]'s `lost_after`, the packets go back through the relay
//! and the checks start again from the first pause.
//!
//! **The relay stays ready.** Each side binds at the relay again every
//! [`RELAY_REFRESH`], so the server keeps the pair while the packets go direct (it forgets
//! pairs idle for `relay_idle`, 60 s by default), and a side whose own NAT gave it a new
//! port moves its leg there (the relay moves a silent leg to a new port of its address).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::net::StunIo;
use super::net::candidates::Candidates;
use super::net::demux::{DemuxSocket, StunChannel};
use super::net::punch::{Checker, Consent, PunchError, Punched, Watched};
use super::net::relay::{self, JoinConfig, RelayAuth, RelayError, RelayToken};
use super::session::Route;

/// How long the connecting side waits for the checks before it connects through the
/// relay: long enough for a path with no NAT in the way (a LAN, loopback) to be found
/// first and keep its bigger packets, short enough that a visitor barely waits.
pub(super) const DIRECT_FIRST: Duration = Duration::from_millis(500);
/// First pause before checking again after the checks failed.
const RETRY_FIRST: Duration = Duration::from_secs(2);
/// Longest pause between two rounds of checks.
const RETRY_MAX: Duration = Duration::from_secs(60);
/// How a direct path is watched: lost after 5 s without an answer, well inside QUIC's
/// idle timeout (30 s), so the connection moves to the relay before it times out.
const CONSENT: Consent = Consent {
    every: Duration::from_secs(1),
    lost_after: Duration::from_secs(5),
    stretch: RELAY_REFRESH,
};
/// Between two binds at the relay: a quarter of the server's default `relay_idle`.
const RELAY_REFRESH: Duration = Duration::from_secs(15);
/// One refreshing bind: the pair exists, so its answer comes in a round trip. A pair the
/// server forgot (it restarted) gets our leg back as waiting, and the peer's next
/// refresh pairs it again; we do not wait for that here, since no check is answered
/// while we wait (a second, well inside the peer's 5 s of consent).
const REFRESH_JOIN: JoinConfig = JoinConfig {
    first_wait: Duration::from_millis(100),
    timeout: Duration::from_secs(1),
};

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

/// Checks that already succeeded, as [`Punching`].
pub(super) fn punched(checker: Checker<StunChannel>, punched: Punched) -> Punching {
    tokio::spawn(async move { (checker, Ok(punched)) })
}

/// The route a connection's packets take now: relayed or direct, changing as the path
/// does.
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

    /// Waits for the route to change; `None` once it no longer can (the connection
    /// ended, or its path is not kept).
    pub async fn changed(&mut self) -> Option<Route> {
        self.0.changed().await.ok()?;
        Some(*self.0.borrow_and_update())
    }
}

/// Our leg at the server's relay: where, and what a bind presents.
#[derive(Clone)]
pub(super) struct RelayLeg {
    pub addr: SocketAddr,
    pub token: RelayToken,
    pub auth: RelayAuth,
}

impl RelayLeg {
    /// Binds (or binds again) at the relay from `io`, re-sending as `config` says.
    pub async fn join<S: StunIo>(&self, io: &mut S, config: &JoinConfig) -> Result<(), RelayError> {
        relay::join(io, self.addr, &self.token, &self.auth, config).await
    }
}

/// What a kept path starts from.
pub(super) struct Keep {
    /// The connection, made with `anchor` as its peer's address.
    pub connection: quinn::Connection,
    pub socket: Arc<DemuxSocket>,
    /// The relay's address (a relayed start) or the peer's (a direct one).
    pub anchor: SocketAddr,
    /// Our relay leg, when we joined one.
    pub relay: Option<RelayLeg>,
    /// Ours, then the peer's.
    pub candidates: (Candidates, Candidates),
}

/// Anchors `keep`'s connection on its socket and keeps it on the best path that works
/// until it ends (see the module's doc); `punching` are the checks that decide the first
/// move.
pub(super) fn keep_path(keep: Keep, punching: Punching) -> PathWatch {
    keep.socket.anchor(keep.anchor);
    let start = match &keep.relay {
        Some(relay) if relay.addr == keep.anchor => Route::Relayed(relay.addr),
        _ => Route::Direct(keep.anchor),
    };
    let (tx, rx) = watch::channel(start);
    tokio::spawn(async move {
        let connection = keep.connection.clone();
        let keeper = Keeper { keep, route: tx };
        tokio::select! {
            () = keeper.run(punching) => {}
            _ = connection.closed() => {}
        }
    });
    PathWatch(rx)
}

struct Keeper {
    keep: Keep,
    route: watch::Sender<Route>,
}

impl Keeper {
    async fn run(&self, punching: Punching) {
        let Ok((mut checker, mut result)) = punching.await else {
            return;
        };
        let mut pause = RETRY_FIRST;
        let mut refresh_at = Instant::now() + RELAY_REFRESH;
        loop {
            match result {
                Ok(punched) => {
                    if let Err(error) = self.direct(&mut checker, punched).await {
                        tracing::debug!(event = "p2p_upgrade_stopped", %error, "the path is no longer watched");
                        return;
                    }
                    // `direct` bound at the relay as it left the direct path.
                    pause = RETRY_FIRST;
                    refresh_at = Instant::now() + RELAY_REFRESH;
                }
                Err(PunchError::Io(error)) => {
                    tracing::debug!(event = "p2p_upgrade_stopped", %error, "checks stopped; the connection stays on its path");
                    return;
                }
                Err(_) => {}
            }
            // Relayed: answer meanwhile (a peer whose round started a little earlier still
            // hears us), keep the relay's pair, then check again.
            let next_round = Instant::now() + pause;
            while Instant::now() < next_round {
                if Instant::now() >= refresh_at {
                    self.refresh(&mut checker).await;
                    refresh_at = Instant::now() + RELAY_REFRESH;
                }
                let stretch = next_round
                    .min(refresh_at)
                    .saturating_duration_since(Instant::now());
                if checker.answer_for(stretch).await.is_err() {
                    return;
                }
            }
            pause = (pause * 2).min(RETRY_MAX);
            let (ours, theirs) = &self.keep.candidates;
            result = checker.punch(ours, theirs).await;
        }
    }

    /// On the direct path found by `punched` until it is lost (then back on the relay).
    async fn direct(
        &self,
        checker: &mut Checker<StunChannel>,
        punched: Punched,
    ) -> std::io::Result<()> {
        let mut remote = punched.remote;
        self.go(Route::Direct(remote));
        tracing::info!(
            event = "p2p_path_direct",
            peer = %remote,
            rtt_ms = punched.rtt.as_secs_f64() * 1e3,
            "the connection is on the direct path"
        );
        let mut heard = Instant::now();
        loop {
            match checker.watch(remote, &CONSENT, &mut heard).await? {
                Watched::Alive => self.refresh(checker).await,
                Watched::Moved(to) => {
                    tracing::info!(
                        event = "p2p_path_rebound",
                        from = %remote,
                        to = %to,
                        "the peer answers from a new address (its NAT gave it a new port); the direct path follows"
                    );
                    remote = to;
                    self.go(Route::Direct(remote));
                }
                Watched::Lost => break,
            }
        }
        let Some(relay) = &self.keep.relay else {
            tracing::warn!(
                event = "p2p_path_lost",
                peer = %remote,
                "the direct path stopped answering and there is no relay to fall back on; checking again"
            );
            return Ok(());
        };
        tracing::warn!(
            event = "p2p_path_lost",
            peer = %remote,
            after_s = CONSENT.lost_after.as_secs(),
            "the direct path stopped answering; the connection goes through the relay and checks again"
        );
        self.go(Route::Relayed(relay.addr));
        // Our own NAT may have given us a new port too: the bind moves our leg there.
        self.refresh(checker).await;
        Ok(())
    }

    /// Sends the connection's packets along `route`.
    fn go(&self, route: Route) {
        let (Route::Direct(to) | Route::Relayed(to)) = route;
        self.keep.socket.send_via(to);
        self.route.send_if_modified(|now| {
            let changed = *now != route;
            *now = route;
            changed
        });
    }

    /// Binds at the relay again (see the module's doc); a failure is only logged: the
    /// next refresh tries again.
    async fn refresh(&self, checker: &mut Checker<StunChannel>) {
        let Some(relay) = &self.keep.relay else {
            return;
        };
        if let Err(error) = relay.join(checker.io_mut(), &REFRESH_JOIN).await {
            tracing::debug!(event = "p2p_relay_refresh_failed", %error, "the relay did not confirm our pair");
        }
    }
}

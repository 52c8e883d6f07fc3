//! A service's slot: its settings and the **set** of sessions serving it, and the lease a
//! visitor holds on the session picked for it.
//!
//! Several clients (or one client through several sessions) that claim the same service
//! all serve it: each session joins the slot's [`ServingSet`] when its hello is accepted
//! and leaves it the moment it ends, so visitors go to the rest with no gap. Diagnostics
//! (`warren doctor`, `warren ping`) never join. Picking follows the service's
//! `load_balance` strategy (the balancer itself is sans-IO, in `warren_proto::balance`);
//! a [`Lease`] counts the stream as open on its session until it is dropped.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;
use warren_proto::balance::{ServingSet, Strategy};
use warren_proto::handshake::SessionId;

use super::session::ServerSession;
use crate::config::ServiceKind;
use crate::crypto::secret::Secret;
use crate::metrics::ServiceMeter;

/// One service and the sessions serving it.
pub(super) struct ServiceSlot {
    pub(super) name: String,
    pub(super) kind: ServiceKind,
    pub(super) token: Secret,
    /// This service's counters (lock-free handles).
    pub(super) meter: ServiceMeter,
    /// Stops the service's listener and every stream of its visitors: the server's
    /// shutdown, or a reload that removes or changes the service.
    pub(super) stop: CancellationToken,
    serving: Mutex<ServingSet<SessionId, Arc<ServerSession>>>,
}

/// A session serving a slot, as the admin API shows it.
#[derive(Clone)]
pub(super) struct Server {
    pub(super) session: Arc<ServerSession>,
    pub(super) weight: u32,
    pub(super) ready: bool,
    pub(super) open: u32,
    pub(super) picked: u64,
}

impl ServiceSlot {
    pub(super) fn new(
        name: String,
        kind: ServiceKind,
        token: Secret,
        meter: ServiceMeter,
        stop: CancellationToken,
        strategy: Strategy,
    ) -> ServiceSlot {
        ServiceSlot {
            name,
            kind,
            token,
            meter,
            stop,
            serving: Mutex::new(ServingSet::new(strategy)),
        }
    }

    fn set(&self) -> MutexGuard<'_, ServingSet<SessionId, Arc<ServerSession>>> {
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `session` to the sessions serving this service.
    pub(super) fn join(&self, session: &Arc<ServerSession>, weight: u32, ready: bool) {
        self.set()
            .insert(session.id(), Arc::clone(session), weight, ready);
    }

    /// Removes `session`; its open streams go on (they do not belong to the set).
    pub(super) fn leave(&self, session: &SessionId) {
        self.set().remove(*session);
    }

    /// Marks `session` ready (picked) or withdrawn (its target failed its health check).
    pub(super) fn set_ready(&self, session: &SessionId, ready: bool) -> bool {
        self.set().set_ready(*session, ready)
    }

    /// Picks the session for the next visitor among those not in `tried`: one whose client
    /// answers, or a suspect one when no other is left (it may only be slow).
    pub(super) fn pick(self: &Arc<Self>, tried: &[SessionId]) -> Option<Lease> {
        let random = if self.set().strategy() == Strategy::Random {
            rand::random()
        } else {
            0
        };
        let session = {
            let mut set = self.set();
            match set.pick_if(tried, random, |session| !session.vitals.is_suspect()) {
                Some(member) => Arc::clone(&member.value),
                None => Arc::clone(&set.pick(tried, random)?.value),
            }
        };
        session.vitals.stream_opened();
        Some(Lease {
            slot: Arc::clone(self),
            session,
        })
    }

    /// Sessions serving the service: (ready, withdrawn).
    pub(super) fn readiness(&self) -> (usize, usize) {
        let set = self.set();
        (set.ready_len(), set.len() - set.ready_len())
    }

    /// How visitors are spread.
    pub(super) fn strategy(&self) -> Strategy {
        self.set().strategy()
    }

    /// Spreads the next visitors by `strategy` (a reload); sessions and streams stay.
    pub(super) fn set_strategy(&self, strategy: Strategy) {
        self.set().set_strategy(strategy);
    }

    /// The sessions serving the service now, in the order they joined.
    pub(super) fn servers(&self) -> Vec<Server> {
        self.set()
            .members()
            .iter()
            .map(|member| Server {
                session: Arc::clone(&member.value),
                weight: member.weight,
                ready: member.ready,
                open: member.open,
                picked: member.picked,
            })
            .collect()
    }

    /// Counts a visitor handed on to another session.
    pub(super) fn retried(&self) {
        self.meter.retried();
    }
}

/// A visitor's hold on the session picked for it: the stream counts as open there until
/// the lease is dropped.
pub(super) struct Lease {
    slot: Arc<ServiceSlot>,
    /// The session picked.
    pub(super) session: Arc<ServerSession>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.set().release(self.session.id());
        self.session.vitals.stream_closed();
    }
}

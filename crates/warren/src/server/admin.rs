//! The server's view for the admin API: sessions, services and UDP gauges, read from
//! snapshots and atomics.

use std::sync::{Arc, PoisonError};

use super::Shared;
use crate::admin::{AdminSource, ServiceInfo, SessionInfo};
use crate::metrics::{Telemetry, unix_seconds};
use crate::reload::Reload;
use crate::session::short_id;

/// The admin API's handle on a running server.
pub(super) struct ServerAdmin {
    pub(super) shared: Arc<Shared>,
    /// Reads the config file again, when the server runs from one.
    pub(super) reloader: Option<Arc<dyn Reload>>,
}

impl AdminSource for ServerAdmin {
    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.shared.telemetry
    }

    fn side(&self) -> &'static str {
        "server"
    }

    fn sessions(&self) -> Vec<SessionInfo> {
        let mut list: Vec<SessionInfo> = self
            .shared
            .sessions_now()
            .iter()
            .map(|session| SessionInfo {
                id: short_id(&session.id()),
                peer: session.peer.to_string(),
                cipher: session.keys.cipher().to_string(),
                cipher_choice: session.keys.negotiation().into(),
                since: unix_seconds(session.since),
                services: session.services.clone(),
            })
            .collect();
        list.sort_by_key(|s| s.since);
        list
    }

    fn services(&self) -> Vec<ServiceInfo> {
        let mut list: Vec<ServiceInfo> = self
            .shared
            .services
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|binding| &binding.slot)
            .map(|slot| ServiceInfo {
                name: slot.name.clone(),
                kind: slot.kind.name().to_owned(),
                state: if slot.current().is_some() {
                    "serving"
                } else {
                    "waiting"
                },
                active_connections: slot.meter.active(),
                total_connections: slot.meter.total(),
                bytes_in: slot.meter.bytes_in(),
                bytes_out: slot.meter.bytes_out(),
                errors: slot.meter.errors(),
            })
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    fn refresh_metrics(&self) {
        let udp: Vec<_> = self
            .shared
            .services
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(name, binding)| Some((name.clone(), binding.udp_stats.clone()?)))
            .collect();
        for (name, stats) in &udp {
            let s = stats.snapshot();
            let active = s
                .flows_opened
                .saturating_sub(s.flows_evicted + s.flows_expired);
            self.shared.telemetry.metrics.set_udp(
                name,
                i64::try_from(active).unwrap_or(i64::MAX),
                s.to_tunnel,
                s.from_tunnel,
            );
        }
    }

    fn reloader(&self) -> Option<Arc<dyn Reload>> {
        self.reloader.clone()
    }
}

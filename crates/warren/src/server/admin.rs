//! The server's view for the admin API: sessions, services and UDP gauges, read from
//! snapshots and atomics.

use std::sync::{Arc, PoisonError};

use super::Shared;
use crate::admin::{AdminSource, Page, Paged, ServiceInfo, ServingSession, SessionInfo};
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
    fn captures(&self) -> Option<&Arc<crate::http::capture::Captures>> {
        Some(&self.shared.captures)
    }

    fn replay(
        &self,
        id: u64,
        edit: Option<crate::admin::ReplayEdit>,
    ) -> crate::http::middleware::BoxFuture<'_, Result<(u64, u16), String>> {
        Box::pin(super::http::replay(&self.shared, id, edit))
    }

    fn bind(&self) -> Option<String> {
        Some(self.shared.live().config.bind.to_string())
    }

    fn disconnect(&self, id: &str) -> Result<(), String> {
        let session = self
            .shared
            .sessions_now()
            .into_iter()
            .find(|session| short_id(&session.id()) == id)
            .ok_or_else(|| format!("no session {id}: it may have ended (see /api/v1/sessions)"))?;
        session.close("disconnected by the operator");
        Ok(())
    }

    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.shared.telemetry
    }

    fn side(&self) -> &'static str {
        "server"
    }

    fn drain(&self) -> &crate::drain::Drain {
        &self.shared.drain
    }

    fn readiness(&self) -> Result<(), String> {
        super::drain::readiness(&self.shared)
    }

    fn sessions(&self, page: Page) -> Paged<SessionInfo> {
        let mut sessions = self.shared.sessions_now();
        sessions.sort_by_key(|session| session.since);
        let total = sessions.len();
        let items = sessions[page.range(total)]
            .iter()
            .map(|session| {
                let quic = session.link.quic_path();
                SessionInfo {
                    id: short_id(&session.id()),
                    peer: session.peer.to_string(),
                    transport: crate::admin::transport_name(quic.as_ref(), &session.keys),
                    cipher: session.keys.cipher_label(),
                    cipher_choice: session.keys.negotiation().into(),
                    since: unix_seconds(session.since),
                    services: session.services.clone(),
                    open_streams: session.vitals.open_streams(),
                    state: session.vitals.state().into(),
                    server: None,
                    rtt_ms: session.vitals.rtt_millis(),
                    version: session.version,
                    quic,
                    congestion: session.congestion.clone(),
                }
            })
            .collect();
        Paged { items, total }
    }

    fn services(&self, page: Page) -> Paged<ServiceInfo> {
        let mut slots: Vec<_> = self
            .shared
            .services
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|binding| (Arc::clone(&binding.slot), binding.service.bind))
            .collect();
        slots.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let total = slots.len();
        let front = self.shared.http_front();
        // Only the page's entries are built: each one locks its slot's serving set.
        let items = slots[page.range(total)]
            .iter()
            .map(|(slot, bind)| {
                let servers = slot.servers();
                let http = front.describe(&slot.name);
                ServiceInfo {
                    name: slot.name.clone(),
                    kind: slot.kind.name().to_owned(),
                    state: if servers.iter().any(|s| s.ready) {
                        "serving"
                    } else if servers.is_empty() {
                        "waiting"
                    } else {
                        "withdrawn"
                    },
                    active_connections: slot.meter.active(),
                    total_connections: slot.meter.total(),
                    bytes_in: slot.meter.bytes_in(),
                    bytes_out: slot.meter.bytes_out(),
                    errors: slot.meter.errors(),
                    load_balance: Some(slot.strategy().name()),
                    sessions: Some(
                        servers
                            .into_iter()
                            .map(|server| ServingSession {
                                session: short_id(&server.session.id()),
                                peer: server.session.peer.to_string(),
                                weight: server.weight,
                                ready: server.ready,
                                open_streams: server.open,
                                picked: server.picked,
                            })
                            .collect(),
                    ),
                    retries: Some(slot.meter.retries()),
                    health: None,
                    address: http.is_none().then(|| bind.to_string()),
                    hosts: http.as_ref().map(|h| h.hosts.clone()),
                    paths: http.as_ref().map(|h| h.paths.clone()),
                    middleware: http.map(|h| h.middleware),
                    p2p: None,
                }
            })
            .collect();
        Paged { items, total }
    }

    fn refresh_metrics(&self) {
        let slots: Vec<_> = self
            .shared
            .services
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|binding| Arc::clone(&binding.slot))
            .collect();
        let metrics = &self.shared.telemetry.metrics;
        for slot in &slots {
            let (ready, withdrawn) = slot.readiness();
            metrics.set_serving(&slot.name, ready, withdrawn);
        }
    }

    fn reloader(&self) -> Option<Arc<dyn Reload>> {
        self.reloader.clone()
    }
}

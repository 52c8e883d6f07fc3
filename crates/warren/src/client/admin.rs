//! The client's view for the admin API: its session and services.

use std::collections::HashSet;
use std::sync::Arc;

use super::Shared;
use crate::admin::{AdminSource, Page, Paged, ServiceInfo, SessionInfo};
use crate::metrics::Telemetry;
use crate::reload::Reload;

/// The admin API's handle on a running client.
pub(super) struct ClientAdmin {
    pub(super) shared: Arc<Shared>,
    /// Reads the config file again, when the client runs from one.
    pub(super) reloader: Option<Arc<dyn Reload>>,
}

impl AdminSource for ClientAdmin {
    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.shared.telemetry
    }

    fn side(&self) -> &'static str {
        "client"
    }

    fn drain(&self) -> &crate::drain::Drain {
        &self.shared.drain
    }

    fn readiness(&self) -> Result<(), String> {
        if self.shared.drain.is_draining() {
            return Err("draining".to_owned());
        }
        if self.shared.sessions_now().is_empty() {
            return Err("no session with a server".to_owned());
        }
        Ok(())
    }

    fn sessions(&self, page: Page) -> Paged<SessionInfo> {
        let sessions = self.shared.sessions_now();
        let total = sessions.len();
        Paged {
            items: sessions[page.range(total)]
                .iter()
                .map(|session| session.info())
                .collect(),
            total,
        }
    }

    fn services(&self, page: Page) -> Paged<ServiceInfo> {
        let (connected, serving) = {
            let status = self.shared.status.borrow();
            // A set: with 10,000 services a list lookup per service is 10^8 comparisons.
            let serving: HashSet<String> = status.services.iter().cloned().collect();
            (status.connected, serving)
        };
        let config = self.shared.config();
        // The session's services, then the P2P services (both by name).
        let p2p = self.p2p_services();
        let total = config.services.len() + p2p.len();
        let range = page.range(total);
        let sessions = config.services.len();
        let items = config
            .services
            .values()
            .skip(range.start)
            .take(range.end.min(sessions).saturating_sub(range.start))
            .map(|service| {
                let state = if !connected {
                    "waiting"
                } else if serving.contains(&service.name) {
                    "serving"
                } else {
                    "refused"
                };
                let meter = self
                    .shared
                    .meter(&service.name)
                    .unwrap_or_else(|| self.shared.telemetry.metrics.service(&service.name));
                let mut info = ServiceInfo::new(&service.name, service.kind.name(), state);
                info.active_connections = meter.active();
                info.total_connections = meter.total();
                info.bytes_in = meter.bytes_in();
                info.bytes_out = meter.bytes_out();
                info.errors = meter.errors();
                info.health = Some(self.shared.health.state(&service.name));
                info.address = Some(service.target.to_string());
                info
            })
            .chain(
                p2p.into_iter()
                    .skip(range.start.saturating_sub(sessions))
                    .take(range.end.saturating_sub(sessions.max(range.start))),
            )
            .collect();
        Paged { items, total }
    }

    fn refresh_metrics(&self) {
        #[cfg(unix)]
        {
            let running = self.shared.p2p_running();
            let gauges: Vec<_> = running
                .iter()
                .flat_map(|(name, running)| running.state.gauges(name))
                .collect();
            drop(running);
            self.shared.telemetry.metrics.set_p2p(gauges);
        }
    }

    fn reloader(&self) -> Option<Arc<dyn Reload>> {
        self.reloader.clone()
    }
}

impl ClientAdmin {
    /// The P2P services as the API lists them, by name.
    fn p2p_services(&self) -> Vec<ServiceInfo> {
        #[cfg(unix)]
        {
            let running = self.shared.p2p_running();
            let mut items: Vec<ServiceInfo> = running
                .values()
                .map(|running| {
                    let config = &running.config;
                    let stats = &running.state.stats;
                    let mut info =
                        ServiceInfo::new(&config.name, config.kind.name(), running.state.state());
                    info.active_connections = stats.active.get();
                    info.total_connections = stats.streams.get();
                    info.bytes_in = stats.bytes_up.get();
                    info.bytes_out = stats.bytes_down.get();
                    info.errors = stats.failed.get();
                    info.address = Some(match &config.end {
                        crate::config::P2pEnd::Exit { target } => target.to_string(),
                        crate::config::P2pEnd::Entrance { bind } => bind.to_string(),
                    });
                    info.p2p = Some(running.state.info(&config.end));
                    info
                })
                .collect();
            items.sort_by(|a, b| a.name.cmp(&b.name));
            items
        }
        #[cfg(not(unix))]
        Vec::new()
    }
}

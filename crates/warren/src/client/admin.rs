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
        let total = config.services.len();
        let range = page.range(total);
        let items = config
            .services
            .values()
            .skip(range.start)
            .take(range.len())
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
                ServiceInfo {
                    name: service.name.clone(),
                    kind: service.kind.name().to_owned(),
                    state,
                    active_connections: meter.active(),
                    total_connections: meter.total(),
                    bytes_in: meter.bytes_in(),
                    bytes_out: meter.bytes_out(),
                    errors: meter.errors(),
                    load_balance: None,
                    sessions: None,
                    retries: None,
                    health: Some(self.shared.health.state(&service.name)),
                    address: Some(service.target.to_string()),
                    hosts: None,
                    paths: None,
                    middleware: None,
                }
            })
            .collect();
        Paged { items, total }
    }

    fn reloader(&self) -> Option<Arc<dyn Reload>> {
        self.reloader.clone()
    }
}

//! The client's view for the admin API: its session and services.

use std::sync::Arc;

use super::Shared;
use crate::admin::{AdminSource, ServiceInfo, SessionInfo};
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

    fn sessions(&self) -> Vec<SessionInfo> {
        self.shared
            .sessions_now()
            .iter()
            .map(|session| session.info())
            .collect()
    }

    fn services(&self) -> Vec<ServiceInfo> {
        let status = self.shared.status.borrow().clone();
        self.shared
            .config()
            .services
            .values()
            .map(|service| {
                let state = if !status.connected {
                    "waiting"
                } else if status.services.contains(&service.name) {
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
                }
            })
            .collect()
    }

    fn reloader(&self) -> Option<Arc<dyn Reload>> {
        self.reloader.clone()
    }
}

//! The client's view for the admin API: its session and services.

use std::sync::{Arc, PoisonError};

use super::Shared;
use crate::admin::{AdminSource, ServiceInfo, SessionInfo};
use crate::metrics::Telemetry;

/// The admin API's handle on a running client.
pub(super) struct ClientAdmin(pub(super) Arc<Shared>);

impl AdminSource for ClientAdmin {
    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.0.telemetry
    }

    fn side(&self) -> &'static str {
        "client"
    }

    fn sessions(&self) -> Vec<SessionInfo> {
        self.0
            .admin_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    fn services(&self) -> Vec<ServiceInfo> {
        let status = self.0.status.borrow().clone();
        self.0
            .config
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
                // Invariant: `meters` has an entry for every configured service.
                let meter = &self.0.meters[&service.name];
                ServiceInfo {
                    name: service.name.clone(),
                    kind: service.kind.name().to_owned(),
                    state,
                    active_connections: meter.active(),
                    total_connections: meter.total(),
                    bytes_in: meter.bytes_in(),
                    bytes_out: meter.bytes_out(),
                    errors: meter.errors(),
                }
            })
            .collect()
    }
}

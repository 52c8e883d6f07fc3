//! The client's half of reverse services: serving the streams the server opens.
//!
//! A stream the server opens names its service in its `StreamOpen`; the client dials that
//! service's target (as the config in force says, so a reload applies to the next stream)
//! and relays, or carries the flows of a UDP service (see
//! [`crate::relay::udp::targets`]). How streams arrive (the TCP pool of pre-opened data
//! channels, say) is the session link's business ([`crate::session::link`]).

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};
use warren_proto::message::StreamOpen;

use super::{ClientSession, Shared};
use crate::config::ServiceKind;
use crate::metrics::{LocalEnd, Meter};
use crate::relay;
use crate::relay::udp::UdpEnd;
use crate::session::link::{Replenish, StreamHandler};
use crate::session::stream::Stream;
use crate::transport::tcp;

/// How long dialing a service's target may take.
const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the streams of one session.
pub(super) struct ReverseStreams {
    pub(super) shared: Arc<Shared>,
    pub(super) session: Arc<ClientSession>,
}

impl StreamHandler for ReverseStreams {
    // Not an `async fn`: its future would keep its own copy of the stream beside the one
    // `serve_stream` holds, for the life of the connection.
    fn serve(
        &self,
        open: StreamOpen,
        stream: Stream,
        replenish: Replenish,
    ) -> impl std::future::Future<Output = Option<Stream>> + Send {
        self.session.vitals.counting(serve_stream(
            &self.shared,
            &self.session,
            stream,
            open,
            replenish,
        ))
    }
}

/// Dials the service's target and relays; gives the stream back when it ended cleanly,
/// for reuse. The link replenishes once the target answered, so a replacement channel's
/// handshake does not compete with this stream's first bytes.
async fn serve_stream(
    shared: &Arc<Shared>,
    session: &Arc<ClientSession>,
    mut channel: Stream,
    open: StreamOpen,
    mut replenish: Replenish,
) -> Option<Stream> {
    let service = open.service;
    // The target is the config's in force, so a reload that changed it applies to the next
    // stream without a new session.
    let current = shared.config();
    let Some(config) = current
        .services
        .get(&service)
        .filter(|_| session.services.contains(&service))
    else {
        warn!(event = "stream_rejected", %service, "server opened a stream for a service this session does not serve");
        replenish.now();
        let _ = channel.writer.reset("unknown service").await;
        return None;
    };
    if let ServiceKind::Udp(settings) = config.kind {
        replenish.now();
        let side = relay::udp::targets::TargetSide {
            name: &config.name,
            target: &config.target,
            settings,
            tasks: &shared.tasks,
            cancel: session.cancel.clone(),
            stats: shared
                .telemetry
                .metrics
                .udp_stats(&config.name, UdpEnd::Targets),
            limit: shared.limits.get(&config.name),
        };
        relay::udp::targets::serve(side, channel).await;
        return None;
    }
    let meter = shared.meter(&service);
    let meter = meter.as_ref();
    let started = tokio::time::Instant::now();
    let family = super::forward::family(&current);
    let connected = tcp::connect_preferring(&config.target, TARGET_CONNECT_TIMEOUT, family)
        .await
        .map_err(|error| {
            if let Some(meter) = meter {
                meter.error();
            }
            warn!(event = "target_unreachable", %service, target = %config.target, %error, "cannot reach the service's target");
            format!("target unreachable: {error}")
        });
    replenish.now();
    let mut target = match connected {
        Ok(target) => target,
        Err(reason) => {
            let _ = channel.writer.reset(&reason).await;
            return None;
        }
    };
    if let Some(version) = config.proxy_protocol
        && let Err(error) =
            relay::write_proxy_header(&mut target, &mut channel, version, open.visitor, open.local)
                .await
    {
        warn!(event = "target_write_failed", %service, %error, "cannot send the PROXY header to the target");
        return None;
    }
    let listed = meter.map(|meter| {
        meter.connected_in(started.elapsed());
        let peer = target
            .peer_addr()
            .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        shared
            .telemetry
            .open(meter, &service, peer, LocalEnd::Target)
    });
    let limit = shared.limits.get(&service);
    let (byte_meter, _listed) = match listed {
        Some((byte_meter, guard)) => (
            Some(byte_meter.paced(limit).compressing(config.compression)),
            Some(guard),
        ),
        None => (Meter::shaping(limit, config.compression), None),
    };
    // The last end is staged: it leaves with what the link sends next (see
    // `relay::pump_for_reuse`).
    match relay::pump_for_reuse(target, &mut channel, &shared.cancel, byte_meter.as_ref()).await {
        Ok(moved) => {
            debug!(event = "stream_closed", %service, up = moved.to_tunnel, down = moved.to_local, "stream done");
            Some(channel)
        }
        Err(error) => {
            if let Some(meter) = meter.filter(|_| !matches!(error, relay::RelayError::Cancelled)) {
                meter.error();
            }
            debug!(event = "stream_aborted", %service, %error, "stream aborted");
            None
        }
    }
}

//! The client's half of the data channel pool.
//!
//! Each pooled channel is one task: connect to the server, prove membership of the session,
//! then wait (holding no buffers) for the server's `StreamOpen`. An opened channel dials the
//! service's target and relays until the stream ends (or, for a UDP service, carries its
//! datagrams: see [`crate::relay::udp::targets`]); a stream that ended cleanly leaves its channel idle at
//! both ends, so it goes back to the pool instead of being closed. The pool is topped up to
//! [`POOL_SIZE`] idle or opening channels as streams take them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, warn};
use warren_proto::message::{self, StreamOpen};

use super::{ClientSession, MAX_POOLED, POOL_SIZE, Shared};
use crate::config::ServiceKind;
use crate::crypto::record::RecordKind;
use crate::metrics::LocalEnd;
use crate::relay;
use crate::transport::records::Record;
use crate::transport::{Channel, preamble, tcp};

/// How long sending a stream's last staged record may take when the channel is not reused.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// How long dialing a service's target may take.
const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens one more pooled data channel for `session`, if the pool has room.
pub(super) fn spawn_channel(shared: &Arc<Shared>, session: &Arc<ClientSession>) {
    let Ok(slot) = Arc::clone(&session.pool_slots).try_acquire_owned() else {
        debug!(
            event = "pool_full",
            "data channel pool at its limit; not opening another"
        );
        return;
    };
    let shared_for_task = Arc::clone(shared);
    let session = Arc::clone(session);
    shared.tasks.spawn(async move {
        let cancel = session.cancel.clone();
        let channel = tokio::select! {
            () = cancel.cancelled() => return,
            channel = open_channel(&session) => channel,
        };
        match channel {
            Ok(channel) => run_channel(&shared_for_task, &session, channel, slot).await,
            Err(error) => {
                debug!(event = "channel_open_failed", %error, "could not open a data channel");
            }
        }
    });
}

/// Opens more channels while fewer than the pool's target are idle or opening.
fn top_up(shared: &Arc<Shared>, session: &Arc<ClientSession>) {
    if MAX_POOLED - session.pool_slots.available_permits() < POOL_SIZE {
        spawn_channel(shared, session);
    }
}

/// One data channel for its whole life: idle in the pool (holding `slot` and no buffers)
/// until the server sends `StreamOpen`, then serving that stream, then idle again if the
/// stream ended cleanly and the pool has room.
async fn run_channel(
    shared: &Arc<Shared>,
    session: &Arc<ClientSession>,
    mut channel: Channel,
    slot: OwnedSemaphorePermit,
) {
    let mut slot = Some(slot);
    loop {
        let open = tokio::select! {
            () = session.pool_closed() => return,
            first = channel.reader.read() => match first {
                Ok(Some(Record::Control(bytes))) => match message::decode_stream_open(bytes) {
                    Ok(open) => open,
                    Err(error) => {
                        warn!(event = "protocol_error", %error, "bad stream open from server");
                        return;
                    }
                },
                Ok(None) => return, // the server closed an extra idle channel
                Ok(Some(_)) | Err(_) => return,
            },
        };
        drop(slot.take());
        let Some(reusable) = session
            .counting(serve_stream(shared, session, channel, open))
            .await
        else {
            return;
        };
        channel = reusable;
        // Back to the pool only if it has room, and only once the server knows: it hands
        // the channel out again only after this "idle again" notice.
        let Ok(permit) = Arc::clone(&session.pool_slots).try_acquire_owned() else {
            // The stream's last `End` may still be staged: the server must see it.
            let _ = tokio::time::timeout(FLUSH_TIMEOUT, channel.writer.flush_staged()).await;
            return;
        };
        if !relay::announce_idle(&mut channel.writer).await {
            return;
        }
        slot = Some(permit);
    }
}

async fn open_channel(session: &ClientSession) -> Result<Channel, String> {
    let attempt = async {
        let stream = super::forward::dial_server(
            &session.config,
            &session.server,
            session.proxy.as_ref(),
            Some(session.server_addr),
            session.handshake_timeout,
        )
        .await
        .map_err(|e| e.to_string())?;
        preamble::client_data_channel(stream, &session.keys)
            .await
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(session.handshake_timeout, attempt)
        .await
        .unwrap_or_else(|_| Err("data channel handshake timed out".into()))
}

/// Dials the service's target and relays; gives the channel back when the stream ended
/// cleanly, for the pool. The pool is topped up once the target answered, so a
/// replacement's handshake does not compete with this stream's first bytes.
async fn serve_stream(
    shared: &Arc<Shared>,
    session: &Arc<ClientSession>,
    mut channel: Channel,
    open: StreamOpen,
) -> Option<Channel> {
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
        top_up(shared, session);
        let _ = channel
            .writer
            .send(RecordKind::Close, b"unknown service")
            .await;
        return None;
    };
    if let ServiceKind::Udp(settings) = config.kind {
        top_up(shared, session);
        let side = relay::udp::targets::TargetSide {
            name: &config.name,
            target: &config.target,
            settings,
            tasks: &shared.tasks,
            cancel: session.cancel.clone(),
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
    top_up(shared, session);
    let mut target = match connected {
        Ok(target) => target,
        Err(reason) => {
            let _ = channel
                .writer
                .send(RecordKind::Close, reason.as_bytes())
                .await;
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
    let byte_meter = listed.as_ref().map(|(byte_meter, _)| byte_meter);
    // The last `End` is staged: it leaves with the idle notice (see `run_channel`).
    match relay::pump_for_reuse(target, &mut channel, &shared.cancel, byte_meter).await {
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

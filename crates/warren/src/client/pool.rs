//! The client's half of the data channel pool.
//!
//! Each pooled channel is one task: connect to the server, prove membership of the session,
//! then wait (holding no buffers) for the server's `StreamOpen`. Once opened it is replaced
//! by a fresh one, dials the service's target and relays until the stream ends (or, for a
//! UDP service, carries its datagrams: see [`super::udp`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tracing::{debug, warn};
use warren_proto::message::{self, StreamOpen};
use warren_proto::proxy_header;

use super::{ClientSession, Shared};
use crate::config::ServiceKind;
use crate::crypto::record::RecordKind;
use crate::relay;
use crate::transport::records::Record;
use crate::transport::{Channel, preamble, tcp};

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
            channel = open_channel(&shared_for_task, &session) => channel,
        };
        let mut channel = match channel {
            Ok(channel) => channel,
            Err(error) => {
                debug!(event = "channel_open_failed", %error, "could not open a data channel");
                return;
            }
        };
        // Idle until the server hands this channel to a visitor.
        let open = tokio::select! {
            () = cancel.cancelled() => return,
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
        drop(slot);
        serve_stream(&shared_for_task, &session, channel, open).await;
    });
}

async fn open_channel(shared: &Shared, session: &ClientSession) -> Result<Channel, String> {
    let attempt = async {
        let stream = super::forward::dial_server(
            &shared.config,
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

/// Dials the service's target and relays. The used pool channel is replaced once the target
/// answered, so the replacement's handshake does not compete with this stream's first bytes.
async fn serve_stream(
    shared: &Arc<Shared>,
    session: &Arc<ClientSession>,
    mut channel: Channel,
    open: StreamOpen,
) {
    let service = open.service;
    let Some(config) = session.services.get(&service) else {
        warn!(event = "stream_rejected", %service, "server opened a stream for a service this session does not serve");
        spawn_channel(shared, session);
        let _ = channel
            .writer
            .send(RecordKind::Close, b"unknown service")
            .await;
        return;
    };
    if let ServiceKind::Udp(settings) = config.kind {
        spawn_channel(shared, session);
        super::udp::serve_udp(shared, session, channel, config, settings).await;
        return;
    }
    let family = super::forward::family(&shared.config);
    let connected = tcp::connect_preferring(&config.target, TARGET_CONNECT_TIMEOUT, family)
        .await
        .map_err(|error| {
            warn!(event = "target_unreachable", %service, target = %config.target, %error, "cannot reach the service's target");
            format!("target unreachable: {error}")
        });
    spawn_channel(shared, session);
    let mut target = match connected {
        Ok(target) => target,
        Err(reason) => {
            let _ = channel
                .writer
                .send(RecordKind::Close, reason.as_bytes())
                .await;
            return;
        }
    };
    if let Some(version) = config.proxy_protocol {
        let addresses = open.visitor.zip(open.local);
        let header = proxy_header::encode(version, addresses);
        if let Err(error) = target.write_all(&header).await {
            warn!(event = "target_write_failed", %service, %error, "cannot send the PROXY header to the target");
            let _ = channel
                .writer
                .send(RecordKind::Close, b"target closed")
                .await;
            return;
        }
    }
    match relay::pump(target, channel, &shared.cancel).await {
        Ok(moved) => {
            debug!(event = "stream_closed", %service, up = moved.to_tunnel, down = moved.to_local, "stream done")
        }
        Err(error) => debug!(event = "stream_aborted", %service, %error, "stream aborted"),
    }
}

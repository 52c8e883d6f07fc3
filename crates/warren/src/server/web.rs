//! The server port's web layers: the TLS certificate of `tls` and `wss` and the WebSocket
//! settings of `ws` and `wss` ([`crate::transport::layers::ServerLayers`]).
//!
//! A server takes every TCP-family transport it is set up for on each of its TCP ports
//! (`bind`'s, and those `transports` names): `noise` always (and `tcp` with `insecure`),
//! `tls` and `wss` when it has a certificate (one of its transports is one of them, or
//! `[server.tls]` is set), `ws` and `wss` when one of its transports is one of them or
//! `[server.ws]` is set. Which protocol a connection speaks is told by its first bytes.

use tracing::info;

use super::ServerError;
use crate::config::ServerConfig;
use crate::config::quic::QuicConfig;
use crate::transport::layers::ServerLayers;
use crate::transport::quic::certs;
use crate::transport::tls::TlsServer;
use crate::transport::ws::WsServer;

/// The layers `config` asks for; loads (or makes) the certificate.
///
/// # Errors
/// [`ServerError::Certificate`] for unreadable or unusable certificate files.
pub(super) fn layers(config: &ServerConfig) -> Result<ServerLayers, ServerError> {
    let (wants_tls, wants_ws) = takes(config);
    let tls = if wants_tls {
        Some(certificate(config).map_err(ServerError::Certificate)?)
    } else {
        None
    };
    Ok(ServerLayers {
        tls,
        ws: wants_ws.then(|| WsServer {
            path: config.ws.path.clone(),
            decoy: config.ws.decoy,
            ping_interval: config.ws.ping_interval,
        }),
    })
}

/// Whether the port takes TLS (`tls`, `wss`) and WebSocket (`ws`, `wss`) under `config`.
pub(super) fn takes(config: &ServerConfig) -> (bool, bool) {
    let list = config.transport_list();
    (
        list.iter().any(|e| e.transport.uses_tls()) || config.tls.configured,
        list.iter().any(|e| e.transport.uses_websocket()) || config.ws.configured,
    )
}

fn certificate(config: &ServerConfig) -> Result<TlsServer, String> {
    match &config.tls.files {
        Some((cert, key)) => {
            let chain = certs::load_certs(cert).map_err(|e| format!("server.tls.cert: {e}"))?;
            let key = certs::load_key(key).map_err(|e| format!("server.tls.key: {e}"))?;
            TlsServer::new(chain, key)
        }
        None => {
            let path = match &config.tls.self_signed {
                Some(path) => path.clone(),
                None => QuicConfig::server_cert_path(None)
                    .map_err(|_| "no place for the self-signed TLS certificate: set cert in [server.tls] (or HOME / STATE_DIRECTORY)".to_owned())?
                    .with_file_name("tls.pem"),
            };
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                let _ = std::fs::create_dir_all(dir);
            }
            let own = certs::load_or_create_self_signed(&path).map_err(|e| e.to_string())?;
            info!(
                event = "tls_certificate",
                path = %path.display(),
                sha256 = %own.sha256_hex(),
                created = own.created,
                "self-signed TLS certificate (clients may pin it with server_cert_sha256)"
            );
            TlsServer::new(vec![own.cert], own.key)
        }
    }
}

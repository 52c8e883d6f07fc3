//! What sits between a TCP connection and Warren's preamble on each TCP-family transport,
//! both sides: nothing (`noise`, `tcp`), TLS (`tls`), WebSocket (`ws`) or both (`wss`).
//!
//! The client wraps every connection of a session the same way ([`ClientLayers`]). The
//! server takes them all on one port and tells them apart by their first bytes
//! ([`ServerLayers::accept`]): `0x16` opens a TLS handshake, `G` an HTTP request, and a
//! Warren preamble starts with a length below 1024 (`0x00`..`0x03`). Inside TLS the same
//! test tells `wss` from `tls`.
//!
//! On `tls` the TLS session is end to end, so the PSK proof inside is bound to it
//! ([`Connected::binding`]) and the records inside are not encrypted a second time. `wss`
//! may be ended by a reverse proxy or a CDN, so its handshake is not bound: the client
//! proves its TLS exporter instead, and only if the server's matches (nothing ended the
//! TLS) do the records go without a cipher of their own; otherwise they keep the
//! negotiated one. Plain `ws` always keeps it.

use std::io;
use std::net::SocketAddr;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use socket2::SockRef;

use super::Transport;
use super::congestion;
use super::tls::{TlsClient, TlsServer, TlsSession};
use super::wire::{BaseReader, BaseWriter, Wire, tcp_halves, tls_halves};
use super::ws::{self, Role, Upgrade, WsServer};

/// A connection ready for Warren's preamble.
pub struct Connected {
    /// The bytes below the records.
    pub wire: Wire,
    /// The exporter of the TLS session under the connection (`tls` and `wss`).
    pub binding: Option<[u8; 32]>,
    /// The TCP peer (a proxy's address when there is one).
    pub peer: SocketAddr,
    /// The TCP congestion control under the connection, as the kernel reports it.
    pub congestion: Option<String>,
}

/// How a client wraps its connections to the server.
#[derive(Clone, Debug)]
pub struct ClientLayers {
    tls: Option<(TlsClient, String)>,
    ws: Option<(String, String)>,
    /// How long a WebSocket connection carrying a stream may stay silent before a ping.
    ping_interval: std::time::Duration,
}

impl ClientLayers {
    /// No layers: `noise` and `tcp`.
    pub fn plain() -> ClientLayers {
        ClientLayers {
            tls: None,
            ws: None,
            ping_interval: ws::PING_INTERVAL,
        }
    }

    /// The layers of `transport`: TLS with `tls` naming `server_name` (SNI), WebSocket
    /// asking for `path` with `host` in the `Host` header.
    pub fn new(
        transport: Transport,
        tls: TlsClient,
        server_name: String,
        (host, path): (String, String),
    ) -> ClientLayers {
        ClientLayers {
            tls: transport.uses_tls().then_some((tls, server_name)),
            ws: transport.uses_websocket().then_some((host, path)),
            ping_interval: ws::PING_INTERVAL,
        }
    }

    /// WebSocket connections ping after `interval` of silence instead of
    /// [`ws::PING_INTERVAL`].
    pub fn ping_every(mut self, interval: std::time::Duration) -> ClientLayers {
        self.ping_interval = interval;
        self
    }

    /// Wraps a fresh connection to the server. The caller bounds the time it takes.
    ///
    /// # Errors
    /// TLS and WebSocket handshake failures, with what to check.
    pub async fn wrap(&self, stream: TcpStream) -> io::Result<Connected> {
        let peer = stream.peer_addr()?;
        let congestion = congestion::in_use(SockRef::from(&stream));
        let ((mut reader, mut writer), binding) = match &self.tls {
            Some((client, name)) => tls_base(client.connect(stream, name).await?),
            None => (tcp_halves(stream), None),
        };
        let Some((host, path)) = &self.ws else {
            return Ok(Connected {
                wire: Wire::from_base(reader, writer),
                binding,
                peer,
                congestion,
            });
        };
        ws::client_upgrade(&mut reader, &mut writer, host, path)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        let (reader, mut writer) = ws::framed(reader, writer, Role::Client);
        writer.set_ping_interval(self.ping_interval);
        Ok(Connected {
            wire: Wire::ws(reader, writer),
            binding,
            peer,
            congestion,
        })
    }
}

/// What the server's port takes besides plain Warren connections.
#[derive(Clone, Debug)]
pub struct ServerLayers {
    /// TLS for `tls` and `wss`; `None` when the server has no certificate.
    pub tls: Option<TlsServer>,
    /// WebSocket for `ws` and `wss`; `None`: HTTP requests are not answered.
    pub ws: Option<WsServer>,
}

/// A connection on the server port, once its layers are peeled.
pub enum Accepted {
    /// A Warren connection (any transport), ready for its preamble.
    Warren(Connected),
    /// An HTTP request that was not an upgrade, answered; nothing more to do.
    Answered,
}

impl ServerLayers {
    /// Peels the layers of a new connection. The caller bounds the time it takes.
    ///
    /// # Errors
    /// TLS on a server without a certificate, handshake failures, malformed HTTP.
    pub async fn accept(&self, stream: TcpStream, peer: SocketAddr) -> io::Result<Accepted> {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let congestion = congestion::in_use(SockRef::from(&stream));
        let ((mut reader, mut writer), tls_binding) = if first[0] == TLS_HANDSHAKE {
            let Some(tls) = &self.tls else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a TLS client, but this server has no certificate: set transport = \"tls\" or \"wss\", or add [server.tls]",
                ));
            };
            tls_base(tls.accept(stream).await?)
        } else {
            (tcp_halves(stream), None)
        };
        // The first byte inside TLS (it may have brought none yet: read one, put it back).
        let mut inside = first;
        if tls_binding.is_some() {
            if reader.read(&mut inside).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            reader.unread(&inside);
        }
        let ws_server = self.ws.as_ref().filter(|_| inside[0] == b'G');
        let Some(ws_server) = ws_server else {
            return Ok(Accepted::Warren(Connected {
                wire: Wire::from_base(reader, writer),
                binding: tls_binding,
                peer,
                congestion,
            }));
        };
        match ws::server_upgrade(&mut reader, &mut writer, ws_server)
            .await
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        {
            Upgrade::NotWebSocket => Ok(Accepted::Answered),
            Upgrade::WebSocket => {
                let (reader, mut writer) = ws::framed(reader, writer, Role::Server);
                writer.set_ping_interval(ws_server.ping_interval);
                // Whoever proxies WebSocket may end the TLS: the handshake checks the
                // client's proof of this exporter before it counts on it.
                Ok(Accepted::Warren(Connected {
                    wire: Wire::ws(reader, writer),
                    binding: tls_binding,
                    peer,
                    congestion,
                }))
            }
        }
    }
}

/// A connection's base halves (TCP or TLS), with the TLS exporter when there is TLS.
type Base = ((BaseReader, BaseWriter), Option<[u8; 32]>);

/// The base halves of a finished TLS session, with its exporter for the binding.
fn tls_base(session: TlsSession) -> Base {
    let binding = session.binding();
    let (reader, writer) = session.split();
    (tls_halves(reader, writer), Some(binding))
}

/// The first byte of a TLS record carrying a handshake (the ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

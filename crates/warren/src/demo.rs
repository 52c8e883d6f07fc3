//! `warren demo`: the whole product in one process, on loopback.
//!
//! Starts a small local HTTP service (the "home" service), a server and a client with fresh
//! random secrets over the real encrypted transport, and exposes the HTTP service through the
//! tunnel. What a newcomer opens in a browser has crossed a real Warren session.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{Client, ClientError, ClientStatus};
use crate::config::HostPort;
use crate::server::{Server, ServerError};

/// Errors starting the demo.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// A loopback port could not be bound.
    #[error("cannot bind a loopback port: {0}")]
    Bind(#[from] std::io::Error),
    /// The server could not start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The generated config was refused (a bug).
    #[error("internal: {0}")]
    Config(#[from] crate::config::ConfigErrors),
    /// The client gave up.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The tunnel did not come up in time.
    #[error("the tunnel did not come up within 10s")]
    Timeout,
}

/// A running demo.
pub struct Demo {
    /// The public URL, served through the tunnel.
    pub url: String,
    /// The server port.
    pub server_addr: SocketAddr,
    /// The local service the client exposes.
    pub local_addr: SocketAddr,
    /// The generated PSK (to show how to split the demo across machines).
    pub psk: String,
    /// The generated token.
    pub token: String,
    /// The negotiated cipher.
    pub cipher: String,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

/// A random secret of 32 url-safe characters.
pub fn random_secret() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

impl Demo {
    /// Starts everything; returns once a visitor can be served.
    ///
    /// `public_port`: the service port to try first (falls back to any free port).
    ///
    /// # Errors
    /// [`DemoError`] when a part cannot start.
    pub async fn start(public_port: u16) -> Result<Demo, DemoError> {
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        let psk = random_secret();
        let token = random_secret();

        let http = TcpListener::bind("127.0.0.1:0").await?;
        let local_addr = http.local_addr()?;
        tasks.spawn(serve_hello(http, cancel.clone()));

        let public = match TcpListener::bind(("127.0.0.1", public_port)).await {
            Ok(probe) => probe.local_addr()?,
            Err(_) => SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let server = Server::builder()
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .psk(&psk)
            .default_token(&token)
            .tcp_service("web", public)
            .build()?
            .bind()
            .await?;
        let server_addr = server.local_addr();
        // Invariant: the service was configured just above.
        let service_addr = server.service_addr("web").expect("demo service is bound");
        let server_cancel = server.shutdown_token();
        let stop_server = cancel.clone();
        tasks.spawn(async move {
            stop_server.cancelled().await;
            server_cancel.cancel();
        });
        tasks.spawn(server.run());

        let client = Client::builder(HostPort::from(server_addr))
            .psk(&psk)
            .default_token(&token)
            .tcp_service("web", HostPort::from(local_addr))
            .build()?;
        let mut status = client.status();
        tasks.spawn(client.run(cancel.clone()));
        let up = tokio::time::timeout(
            Duration::from_secs(10),
            status.wait_for(|s: &ClientStatus| s.connected),
        )
        .await;
        let cipher = match up {
            Ok(Ok(s)) => s.cipher.map(|c| c.to_string()).unwrap_or_default(),
            _ => {
                cancel.cancel();
                return Err(DemoError::Timeout);
            }
        };
        tasks.close();
        Ok(Demo {
            url: format!("http://{service_addr}/"),
            server_addr,
            local_addr,
            psk,
            token,
            cipher,
            tasks,
            cancel,
        })
    }

    /// Stops everything and waits for it to finish.
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.tasks.wait()).await;
    }
}

/// The demo's "home" service: a tiny HTTP/1.1 server saying hello.
async fn serve_hello(listener: TcpListener, cancel: CancellationToken) {
    let visits = Arc::new(AtomicU64::new(0));
    let tasks = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let visits = Arc::clone(&visits);
        tasks.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), answer(stream, &visits)).await;
        });
    }
    tasks.close();
    tasks.wait().await;
}

async fn answer(mut stream: TcpStream, visits: &AtomicU64) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || request.len() > 16 * 1024 {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let visit = visits.fetch_add(1, Ordering::Relaxed) + 1;
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Warren demo</title></head>\
         <body style=\"font-family:sans-serif;max-width:40em;margin:4em auto\">\
         <h1>Hello from behind the tunnel</h1>\
         <p>This page is served by a local service on 127.0.0.1 and reached you through an \
         encrypted Warren session (server &rarr; client &rarr; service).</p>\
         <p>Visit number {visit}.</p></body></html>\n"
    );
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

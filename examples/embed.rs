//! Embedding Warren as a library: a server and a client in one program, exposing a local
//! service through an encrypted tunnel on loopback.
//!
//! Run with `cargo run --example embed`, then `curl http://127.0.0.1:PORT/` (the port is
//! printed). Ctrl-C stops it.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use warren::{Client, HostPort, Server};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let psk = warren::demo::random_secret();
    let token = warren::demo::random_secret();

    // The service behind NAT: answers every connection with a short text.
    let local = TcpListener::bind("127.0.0.1:0").await?;
    let local_addr = local.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut visitor, _)) = local.accept().await {
            let _ = visitor
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nhello\n")
                .await;
        }
    });

    // The public server.
    let server = Server::builder()
        .bind("127.0.0.1:0".parse()?)
        .psk(&psk)
        .default_token(&token)
        .tcp_service("web", "127.0.0.1:0".parse()?)
        .build()?
        .bind()
        .await?;
    let public = server.service_addr("web").ok_or("service not bound")?;
    let server_addr = server.local_addr();
    tokio::spawn(server.run());

    // The client, dialing out to the server.
    let client = Client::builder(HostPort::from(server_addr))
        .psk(&psk)
        .default_token(&token)
        .tcp_service("web", HostPort::from(local_addr))
        .build()?;
    let mut status = client.status();
    let stop = CancellationToken::new();
    let running = tokio::spawn(client.run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected)).await??;

    println!("tunnel up: curl http://{public}/");
    tokio::signal::ctrl_c().await?;
    stop.cancel();
    running.await??;
    Ok(())
}

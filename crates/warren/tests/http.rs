//! HTTP services in process: a server with `[server.http]`, clients serving `type = "http"`
//! services from local backends (axum), and real requests (hyper's client, or raw bytes for
//! the malformed ones). Bodies are checked by hash.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::routing::{any, get, post};
use http_body_util::{BodyExt, Full};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use warren::{Client, HostPort, ServerConfig};

/// A backend that says who it is and what it saw.
async fn backend(name: &'static str) -> SocketAddr {
    let app = Router::new()
        .route(
            "/big/{len}",
            get(
                |axum::extract::Path(len): axum::extract::Path<usize>| async move {
                    let mut bytes = vec![0u8; len];
                    for (i, b) in bytes.iter_mut().enumerate() {
                        *b = (i * 31 % 251) as u8;
                    }
                    bytes
                },
            ),
        )
        .route(
            "/upload",
            post(|body: Bytes| async move { blake3::hash(&body).to_hex().to_string() }),
        )
        .fallback(any(move |request: Request| async move {
            let headers = request.headers();
            let get = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned()
            };
            format!(
                "backend={name} path={} host={} xff={} xfp={} xfh={}",
                request.uri(),
                get("host"),
                get("x-forwarded-for"),
                get("x-forwarded-proto"),
                get("x-forwarded-host"),
            )
        }))
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct HttpServer {
    http: SocketAddr,
    addr: SocketAddr,
    stop: CancellationToken,
}

/// A port free now (config files refuse port 0).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

async fn start_http_server(services: &str) -> HttpServer {
    let (port, http) = (free_port(), free_port());
    let toml = format!(
        "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\nheartbeat_interval = \"1s\"\n[server.http]\nbind = \"127.0.0.1:{http}\"\n{services}"
    );
    let config = ServerConfig::from_toml_str(&toml, "server.toml").expect("valid config");
    let bound = warren::Server::from_config(config)
        .unwrap()
        .bind()
        .await
        .unwrap();
    let addr = bound.local_addr();
    let http = bound.http_addrs().0.expect("the HTTP port");
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    HttpServer { http, addr, stop }
}

async fn start_http_client(server: SocketAddr, services: &[(&str, SocketAddr)]) -> TestClient {
    let mut builder = Client::builder(HostPort::from(server))
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_timeout(Duration::from_secs(3))
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400));
    for (name, target) in services {
        builder = builder.tcp_service(*name, HostPort::from(*target));
    }
    let client = builder.build().expect("valid client");
    let status = client.status();
    let stop = CancellationToken::new();
    let task = tokio::spawn(client.run(stop.clone()));
    let mut client = TestClient { status, stop, task };
    client.wait_sessions(1).await;
    client
}

/// Sends raw request bytes and reads the whole answer (the request asks to close).
async fn raw(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

type HyperClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

fn hyper_client() -> HyperClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// A request to `host` through the HTTP port; returns (status, body).
async fn request(
    client: &HyperClient,
    port: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Bytes) {
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{port}{path}"))
        .header("host", host)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), client.request(request))
        .await
        .expect("an answer within 20 s")
        .expect("a response");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

const TWO_SERVICES: &str = "[server.services.app]\ntype = \"http\"\nhosts = [\"app.test\"]\n[server.services.api]\ntype = \"http\"\nhosts = [\"api.test\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_service_their_host_names_with_forwarded_headers() {
    let (app, api) = (backend("app").await, backend("api").await);
    let server = start_http_server(TWO_SERVICES).await;
    let _client = start_http_client(server.addr, &[("app", app), ("api", api)]).await;
    let client = hyper_client();
    let (status, body) = request(&client, server.http, "GET", "app.test", "/x?y=1", vec![]).await;
    assert_eq!(status, 200);
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.starts_with("backend=app path=/x?y=1 host=app.test "),
        "{body}"
    );
    assert!(
        body.contains("xff=127.0.0.1 xfp=http xfh=app.test"),
        "{body}"
    );
    // The same pooled connection, another host: routed per request.
    let (status, body) = request(&client, server.http, "GET", "API.test", "/", vec![]).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).starts_with("backend=api "));
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_arrive_exactly_both_ways() {
    let app = backend("app").await;
    let server = start_http_server(TWO_SERVICES).await;
    let _client = start_http_client(server.addr, &[("app", app)]).await;
    let client = hyper_client();
    let upload = random_bytes(3 * 1024 * 1024 + 5);
    let (status, body) = request(
        &client,
        server.http,
        "POST",
        "app.test",
        "/upload",
        upload.clone(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body, blake3::hash(&upload).to_hex().to_string());
    let len = 5 * 1024 * 1024 + 3;
    let (status, body) = request(
        &client,
        server.http,
        "GET",
        "app.test",
        &format!("/big/{len}"),
        vec![],
    )
    .await;
    assert_eq!(status, 200);
    let expected: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(blake3::hash(&body), blake3::hash(&expected));
    // Many requests on warm pooled backend connections.
    for i in 0..50 {
        let (status, _) = request(
            &client,
            server.http,
            "GET",
            "app.test",
            &format!("/n/{i}"),
            vec![],
        )
        .await;
        assert_eq!(status, 200);
    }
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_hosts_and_ambiguous_requests_get_warren_pages() {
    let app = backend("app").await;
    let server = start_http_server(TWO_SERVICES).await;
    let _client = start_http_client(server.addr, &[("app", app)]).await;
    let answer = raw(
        server.http,
        "GET / HTTP/1.1\r\nHost: nope.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        answer.contains("nope.test"),
        "the page names the host: {answer}"
    );
    let answer = raw(
        server.http,
        "GET / HTTP/1.1\r\nHost: app.test\r\nHost: api.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 400"),
        "two Host headers: {answer}"
    );
    // A service with no client connected: 502, no backend details.
    let answer = raw(
        server.http,
        "GET / HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(answer.contains("api.test"), "{answer}");
    server.stop.cancel();
}

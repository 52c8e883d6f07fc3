//! HTTP services in process: a server with `[server.http]`, clients serving `type = "http"`
//! services from local backends (axum), and real requests (hyper's client, or raw bytes for
//! the malformed ones). Bodies are checked by hash.

#[path = "support/http_backends.rs"]
mod http_backends;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::routing::{any, get, post};
use http_backends::{h2c_backend, websocket_echo};
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
                "backend={name} path={} host={} xff={} xfp={} xfh={} auth={} pauth={}",
                request.uri(),
                get("host"),
                get("x-forwarded-for"),
                get("x-forwarded-proto"),
                get("x-forwarded-host"),
                get("authorization"),
                get("proxy-authorization"),
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
    admin: Option<SocketAddr>,
    stop: CancellationToken,
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
    let admin = bound.admin_addr();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    HttpServer {
        http,
        addr,
        admin,
        stop,
    }
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

/// A TCP relay in front of `target` that counts the connections it accepts and can cut
/// every connection it carries.
struct CountingRelay {
    addr: SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    cut: std::sync::Arc<std::sync::Mutex<CancellationToken>>,
}

impl CountingRelay {
    async fn start(target: SocketAddr) -> CountingRelay {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relay = CountingRelay {
            addr,
            accepted: Default::default(),
            cut: std::sync::Arc::new(std::sync::Mutex::new(CancellationToken::new())),
        };
        let (accepted, cut) = (relay.accepted.clone(), relay.cut.clone());
        tokio::spawn(async move {
            while let Ok((mut visitor, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let cut = cut.lock().unwrap().clone();
                tokio::spawn(async move {
                    let mut backend = TcpStream::connect(target).await.unwrap();
                    tokio::select! {
                        () = cut.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut visitor, &mut backend) => {}
                    }
                });
            }
        });
        relay
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Closes every connection carried so far.
    fn cut_all(&self) {
        std::mem::take(&mut *self.cut.lock().unwrap()).cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_connections_are_kept_alive_and_a_closed_one_is_replaced() {
    let app = CountingRelay::start(backend("app").await).await;
    let server = start_http_server(TWO_SERVICES).await;
    let _client = start_http_client(server.addr, &[("app", app.addr)]).await;
    let client = hyper_client();
    for i in 0..30 {
        let path = format!("/n/{i}");
        let (status, body) = request(&client, server.http, "GET", "app.test", &path, vec![]).await;
        assert_eq!(status, 200);
        assert!(
            String::from_utf8_lossy(&body).contains(&path),
            "answered in order"
        );
    }
    assert_eq!(
        app.accepted(),
        1,
        "30 requests one after another on one backend connection"
    );
    // The backend closes its connections while they are idle: the next request gets a
    // new one, not an error.
    app.cut_all();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = request(&client, server.http, "GET", "app.test", "/again", vec![]).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(app.accepted(), 2);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_pass_through() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let echo = websocket_echo().await;
    let server = start_http_server(TWO_SERVICES).await;
    let _client = start_http_client(server.addr, &[("app", echo)]).await;
    let stream = TcpStream::connect(server.http).await.unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async("ws://app.test/chat", stream)
        .await
        .expect("the WebSocket handshake passes through");
    assert_eq!(response.status(), 101);
    for size in [1, 1000, 200_000] {
        let payload = random_bytes(size);
        ws.send(Message::binary(payload.clone())).await.unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an echo within 10 s")
            .expect("a message")
            .unwrap();
        assert_eq!(hash(&echoed.into_data()), hash(&payload));
    }
    ws.close(None).await.unwrap();
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_backends_get_http2_and_trailers_come_back() {
    let backend = h2c_backend().await;
    let server = start_http_server(
        "[server.services.grpc]\ntype = \"http\"\nhosts = [\"grpc.test\"]\nbackend = \"h2c\"\n",
    )
    .await;
    let _client = start_http_client(server.addr, &[("grpc", backend)]).await;
    // The visitor speaks h2c with prior knowledge too; `:authority` names the route.
    let stream = TcpStream::connect(server.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .uri("http://grpc.test/pkg.Service/Call")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .unwrap()
        .expect("a response over h2c");
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers came back");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(collected.to_bytes(), "HTTP/2.0 /pkg.Service/Call");
    server.stop.cancel();
}

/// A self-signed certificate for `name`, written as PEM files in `dir`; returns the
/// (cert path, key path, DER) triple.
fn certificate(
    dir: &std::path::Path,
    name: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    rustls::pki_types::CertificateDer<'static>,
) {
    let issued = warren::transport::quic::certs::self_signed(&[name.to_owned()]).unwrap();
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, &issued.cert_pem).unwrap();
    std::fs::write(&key, &issued.key_pem).unwrap();
    (cert, key, issued.cert_der)
}

fn temp_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("warren-http-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A TLS connection to `addr` with SNI `name`, trusting only `root`.
async fn tls_connect(
    addr: SocketAddr,
    name: &'static str,
    root: rustls::pki_types::CertificateDer<'static>,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let stream = TcpStream::connect(addr).await?;
    let server_name = rustls::pki_types::ServerName::try_from(name).unwrap();
    connector.connect(server_name, stream).await
}

/// One GET over an established connection, HTTP/2 when ALPN chose it; (status, body).
async fn get_over<S>(stream: S, h2: bool, host: &str, path: &str) -> (u16, Bytes)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let uri = format!("https://{host}{path}");
    let request = http::Request::builder()
        .uri(&uri)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = if h2 {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(connection);
        let (mut parts, body) = request.into_parts();
        parts.headers.remove("host");
        sender
            .send_request(http::Request::from_parts(parts, body))
            .await
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        let (mut parts, body) = request.into_parts();
        parts.uri = path.parse().unwrap();
        sender
            .send_request(http::Request::from_parts(parts, body))
            .await
    }
    .expect("a response");
    let status = response.status().as_u16();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// A backend that terminates TLS itself (for passthrough) and says so.
async fn tls_backend(cert: &std::path::Path, key: &std::path::Path) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    let chain = vec![rustls::pki_types::CertificateDer::from_pem_file(cert).unwrap()];
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |_request: http::Request<hyper::body::Incoming>| async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"tls terminated by the backend"),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

async fn start_tls_server(services: &str) -> (HttpServer, SocketAddr) {
    let (port, http, https) = (free_port(), free_port(), free_port());
    let toml = format!(
        "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\nheartbeat_interval = \"1s\"\n[server.http]\nbind = \"127.0.0.1:{http}\"\ntls_bind = \"127.0.0.1:{https}\"\n{services}"
    );
    let config = ServerConfig::from_toml_str(&toml, "server.toml").expect("valid config");
    let bound = warren::Server::from_config(config)
        .unwrap()
        .bind()
        .await
        .unwrap();
    let addr = bound.local_addr();
    let (http, tls) = bound.http_addrs();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    (
        HttpServer {
            http: http.unwrap(),
            addr,
            admin: None,
            stop,
        },
        tls.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_terminated_by_sni_passed_through_untouched_and_unknown_names_get_an_alert() {
    let dir = temp_dir("tls");
    let (app_cert, app_key, app_der) = certificate(&dir, "app.test");
    let (pass_cert, pass_key, pass_der) = certificate(&dir, "pass.test");
    let app = backend("app").await;
    let pass = tls_backend(&pass_cert, &pass_key).await;
    let services = format!(
        "[server.services.app]\ntype = \"http\"\nhosts = [\"app.test\"]\ntls = \"terminate\"\ncert = \"{}\"\nkey = \"{}\"\n[server.services.pass]\ntype = \"http\"\nhosts = [\"pass.test\"]\ntls = \"passthrough\"\n",
        app_cert.display(),
        app_key.display()
    );
    let (server, https) = start_tls_server(&services).await;
    let _client = start_http_client(server.addr, &[("app", app), ("pass", pass)]).await;

    // Terminated by Warren, HTTP/2 over ALPN and HTTP/1.1.
    let tls = tls_connect(https, "app.test", app_der.clone(), &[b"h2", b"http/1.1"])
        .await
        .expect("Warren presents app.test's certificate");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (status, body) = get_over(tls, true, "app.test", "/secure").await;
    assert_eq!(status, 200);
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("backend=app path=/secure") && body.contains("xfp=https"),
        "{body}"
    );
    let tls = tls_connect(https, "app.test", app_der, &[b"http/1.1"])
        .await
        .unwrap();
    let (status, _) = get_over(tls, false, "app.test", "/").await;
    assert_eq!(status, 200);

    // Passed through: the certificate that arrives is the backend's own (trusting only it
    // works), and the backend answered.
    let tls = tls_connect(https, "pass.test", pass_der, &[b"http/1.1"])
        .await
        .expect("the backend's certificate came through");
    let (status, body) = get_over(tls, false, "pass.test", "/").await;
    assert_eq!(
        (status, &body[..]),
        (200, &b"tls terminated by the backend"[..])
    );

    // An unknown name: a fatal unrecognized_name alert, nothing else.
    let error = tls_connect(https, "nope.test", certificate(&dir, "nope.test").2, &[])
        .await
        .expect_err("no certificate for nope.test");
    // rustls spells the alert the British way.
    let text = error.to_string().to_lowercase();
    assert!(
        text.contains("unrecognisedname") || text.contains("unrecognizedname"),
        "{error}"
    );
    server.stop.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_lists_requests_hides_secrets_and_replays_them() {
    let app = backend("app").await;
    let admin_port = free_port();
    let services = format!(
        "[server.services.app]\ntype = \"http\"\nhosts = [\"app.test\"]\ncapture_body_bytes = 1024\n[admin]\nbind = \"127.0.0.1:{admin_port}\"\n"
    );
    let server = start_http_server(&services).await;
    let admin = server.admin.expect("admin API");
    let _client = start_http_client(server.addr, &[("app", app)]).await;
    let client = hyper_client();
    let body = b"{\"hello\": 1}".to_vec();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/upload", server.http))
        .header("host", "app.test")
        .header("authorization", "Bearer very-secret")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.into_body().collect().await.unwrap();
    let listed = loop {
        let (status, text) = http(admin, "GET", "/api/v1/requests?service=app", None).await;
        assert_eq!(status, 200, "{text}");
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        if !list.as_array().unwrap().is_empty() {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let id = listed[0]["id"].as_u64().unwrap();
    assert_eq!(listed[0]["uri"], "/upload");
    let (status, text) = http(admin, "GET", &format!("/api/v1/requests/{id}"), None).await;
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains("very-secret"), "a secret leaked: {text}");
    let record: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(record["request_body"], "{\"hello\": 1}");
    assert_eq!(record["status"], 200);
    assert_eq!(
        record["response_body"],
        blake3::hash(&body).to_hex().as_str()
    );
    // Replay: the same request again, captured as a replay of the first.
    let (status, text) = http(
        admin,
        "POST",
        &format!("/api/v1/requests/{id}/replay"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let replayed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(replayed["status"], 200);
    let new_id = replayed["id"].as_u64().unwrap();
    let record = loop {
        let (status, text) = http(admin, "GET", &format!("/api/v1/requests/{new_id}"), None).await;
        if status == 200 {
            break serde_json::from_str::<serde_json::Value>(&text).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(record["replay_of"], id);
    assert_eq!(
        record["response_body"],
        blake3::hash(&body).to_hex().as_str()
    );
    // Edit and replay: another body and header; the backend hashes what it received.
    let edit = r#"{"uri": "/upload?edited=1", "headers": [["host", "app.test"], ["x-edited", "yes"]], "body": "changed"}"#;
    let answer = raw(
        admin,
        &format!(
            "POST /api/v1/requests/{id}/replay HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{edit}",
            edit.len()
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let edited: serde_json::Value =
        serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    let edited_id = edited["id"].as_u64().unwrap();
    let record = loop {
        let (status, text) =
            http(admin, "GET", &format!("/api/v1/requests/{edited_id}"), None).await;
        if status == 200 {
            break serde_json::from_str::<serde_json::Value>(&text).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(record["uri"], "/upload?edited=1");
    assert_eq!(record["request_body"], "changed");
    assert_eq!(
        record["response_body"],
        blake3::hash(b"changed").to_hex().as_str()
    );
    assert!(
        record["request_headers"].to_string().contains("x-edited"),
        "{record}"
    );
    let bad = r#"{"uri": "http://elsewhere.test/"}"#;
    let answer = raw(
        admin,
        &format!(
            "POST /api/v1/requests/{id}/replay HTTP/1.1\r\nHost: {admin}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{bad}",
            bad.len()
        ),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 409"),
        "an absolute URI is refused: {answer}"
    );
    assert!(answer.contains("not a path"), "{answer}");

    // The backend connections count as the service's connections, their bytes as its bytes.
    let (_, text) = http(admin, "GET", "/api/v1/services", None).await;
    let services: serde_json::Value = serde_json::from_str(&text).unwrap();
    let app = &services[0];
    assert_eq!(app["name"], "app");
    assert!(app["total_connections"].as_u64().unwrap() >= 1, "{app}");
    assert!(app["bytes_in"].as_u64().unwrap() > 0, "{app}");
    assert!(app["bytes_out"].as_u64().unwrap() > 0, "{app}");
    assert_eq!(app["hosts"][0], "app.test", "{app}");

    let (status, _) = http(admin, "GET", "/api/v1/requests/99999999", None).await;
    assert_eq!(status, 404);
    let (status, _) = http(admin, "GET", "/api/v1/requests/abc", None).await;
    assert_eq!(status, 400);
    let (_, metrics) = http(admin, "GET", "/metrics", None).await;
    assert!(
        metrics.contains("warren_http_requests_total{service=\"app\",class=\"2xx\"} 3"),
        "{metrics}"
    );
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middleware_chain_guards_the_service() {
    let app = backend("app").await;
    // bcrypt of "pw" at cost 4 (made with the bcrypt crate).
    let hash = bcrypt::hash("pw", 4).unwrap();
    let services = format!(
        "[server.services.app]\ntype = \"http\"\nhosts = [\"app.test\"]\n[[server.services.app.middleware]]\ntype = \"ip_deny\"\ncidrs = [\"192.0.2.0/24\"]\n[[server.services.app.middleware]]\ntype = \"basic_auth\"\nrealm = \"staff\"\nusers = {{ alice = \"{hash}\" }}\n[[server.services.app.middleware]]\ntype = \"rate_limit\"\nrate = \"2/s\"\nburst = 2\n[[server.services.app.middleware]]\ntype = \"max_body\"\nlimit = 1000\n"
    );
    let server = start_http_server(&services).await;
    let _client = start_http_client(server.addr, &[("app", app)]).await;
    let get = |auth: Option<&'static str>| {
        let http_addr = server.http;
        async move {
            let auth = auth
                .map(|a| format!("Authorization: Basic {a}\r\n"))
                .unwrap_or_default();
            raw(
                http_addr,
                &format!("GET / HTTP/1.1\r\nHost: app.test\r\n{auth}Connection: close\r\n\r\n"),
            )
            .await
        }
    };
    let answer = get(None).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer.to_lowercase().contains("www-authenticate: basic"),
        "{answer}"
    );
    // alice:pw
    let answer = get(Some("YWxpY2U6cHc=")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The backend never sees the password.
    assert!(!answer.contains("YWxpY2U6cHc="));
    let answer = get(Some("YWxpY2U6cHc=")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = get(Some("YWxpY2U6cHc=")).await;
    assert!(
        answer.starts_with("HTTP/1.1 429"),
        "the third request within the burst: {answer}"
    );
    assert!(answer.to_lowercase().contains("retry-after"), "{answer}");
    server.stop.cancel();
}

/// A client from a TOML `[client]` table (for what the builder does not offer).
async fn start_toml_client(toml: &str) -> TestClient {
    let config = warren::ClientConfig::from_toml_str(toml, "client.toml").expect("valid client");
    let client = Client::from_config(config).expect("valid client");
    let status = client.status();
    let stop = CancellationToken::new();
    let task = tokio::spawn(client.run(stop.clone()));
    TestClient { status, stop, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_declare_http_services_by_subdomain_until_they_leave() {
    let app = backend("declared").await;
    let server = start_http_server(
        "subdomain_host = \"tunnel.test\"\nallow_hosts = [\"*.apps.test\"]\n[server.services.configured]\ntype = \"http\"\nhosts = [\"taken.apps.test\"]\n",
    )
    .await;
    let client_toml = |name: &str, names: &str| {
        format!(
            "[client]\nserver = \"{}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\nreconnect_initial_delay = \"100ms\"\n[client.services.{name}]\ntype = \"http\"\ntarget = \"{app}\"\n{names}\n",
            server.addr
        )
    };
    let mut first = start_toml_client(&client_toml(
        "mine",
        "subdomain = \"app\"\nhosts = [\"www.apps.test\"]",
    ))
    .await;
    if tokio::time::timeout(
        Duration::from_secs(10),
        first.status.wait_for(|s| s.urls.contains_key("mine")),
    )
    .await
    .is_err()
        || first.task.is_finished()
    {
        panic!(
            "the declaring client did not connect: {:?}",
            (&mut first.task).await
        );
    }
    let urls = first
        .status
        .borrow()
        .urls
        .get("mine")
        .cloned()
        .unwrap_or_default();
    let port = server.http.port();
    assert_eq!(
        urls,
        vec![
            format!("http://app.tunnel.test:{port}/"),
            format!("http://www.apps.test:{port}/")
        ]
    );
    let client = hyper_client();
    for host in ["app.tunnel.test", "www.apps.test"] {
        let (status, body) = request(&client, server.http, "GET", host, "/", vec![]).await;
        assert_eq!(status, 200, "{host}");
        assert!(String::from_utf8_lossy(&body).starts_with("backend=declared"));
    }
    // Another client may not take a name that is declared, configured, or not allowed.
    for (names, why) in [
        ("subdomain = \"app\"", "already declared"),
        ("hosts = [\"taken.apps.test\"]", "configured"),
        ("hosts = [\"evil.example.com\"]", "not among"),
    ] {
        let mut other = start_toml_client(&client_toml("theirs", names)).await;
        let error = tokio::time::timeout(Duration::from_secs(10), &mut other.task)
            .await
            .expect("the refused client stops")
            .unwrap()
            .expect_err("refused");
        assert!(error.to_string().contains(why), "{names}: {error}");
    }
    // The declaring client leaves: its names are not routed any more.
    first.stop.cancel();
    let _ = first.task.await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = raw(
            server.http,
            "GET / HTTP/1.1\r\nHost: app.tunnel.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        if answer.starts_with("HTTP/1.1 404") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still routed: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop.cancel();
}

/// The CVE-2026-40910 class through a running server: requests whose Host, absolute-form
/// URI, `:authority`, `Authorization` and `Proxy-Authorization` disagree, and paths that try
/// to walk around a route, each get the documented answer — never a route past the
/// protected service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreeing_hosts_and_path_tricks_never_bypass_a_route() {
    let (open, admin) = (backend("open").await, backend("admin").await);
    let hash = bcrypt::hash("pw", 4).unwrap();
    let services = format!(
        "[server.services.open]\ntype = \"http\"\nhosts = [\"a.test\", \"b.test\"]\n[server.services.admin]\ntype = \"http\"\nhosts = [\"a.test\"]\npaths = [\"/admin\"]\n[[server.services.admin.middleware]]\ntype = \"basic_auth\"\nusers = {{ alice = \"{hash}\" }}\n[server.services.locked]\ntype = \"http\"\nhosts = [\"locked.test\"]\n[[server.services.locked.middleware]]\ntype = \"basic_auth\"\nusers = {{ alice = \"{hash}\" }}\n"
    );
    let server = start_http_server(&services).await;
    let _client = start_http_client(
        server.addr,
        &[("open", open), ("admin", admin), ("locked", open)],
    )
    .await;
    // alice:pw
    const ALICE: &str = "YWxpY2U6cHc=";
    let cases: &[(&str, &str, &str)] = &[
        // (what, request head, expected status line prefix [+ body marker])
        (
            "absolute-form names another host than Host",
            "GET http://locked.test/ HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 400",
        ),
        (
            "Host names another host than absolute-form",
            "GET http://a.test/ HTTP/1.1\r\nHost: locked.test\r\n",
            "HTTP/1.1 400",
        ),
        (
            "absolute-form and Host agree",
            "GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 200",
        ),
        (
            "two Host headers",
            "GET / HTTP/1.1\r\nHost: a.test\r\nHost: locked.test\r\n",
            "HTTP/1.1 400",
        ),
        ("no Host", "GET / HTTP/1.1\r\n", "HTTP/1.1 400"),
        (
            "userinfo in the authority",
            "GET http://alice@a.test/ HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 400",
        ),
        (
            "credentials only in Proxy-Authorization",
            "GET / HTTP/1.1\r\nHost: locked.test\r\nProxy-Authorization: Basic YWxpY2U6cHc=\r\n",
            "HTTP/1.1 401",
        ),
        (
            "credentials in Authorization",
            "GET / HTTP/1.1\r\nHost: locked.test\r\nAuthorization: Basic YWxpY2U6cHc=\r\n",
            "HTTP/1.1 200",
        ),
        (
            "a route that does not exist",
            "GET / HTTP/1.1\r\nHost: nowhere.test\r\n",
            "HTTP/1.1 404",
        ),
        (
            "dot segments into the protected prefix",
            "GET /public/../admin/x HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 401",
        ),
        (
            "encoded dot segments",
            "GET /%2e%2e/admin HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 40",
        ),
        (
            "doubled slash before the prefix",
            "GET //admin HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 401",
        ),
        (
            "an encoded slash",
            "GET /admin%2fx HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 400",
        ),
        (
            "a prefix that only starts the same",
            "GET /administrator HTTP/1.1\r\nHost: a.test\r\n",
            "HTTP/1.1 200",
        ),
        (
            "the protected prefix, authenticated",
            "GET /admin/x HTTP/1.1\r\nHost: a.test\r\nAuthorization: Basic YWxpY2U6cHc=\r\n",
            "HTTP/1.1 200",
        ),
        (
            "the host in another case with a port and a dot",
            "GET /admin HTTP/1.1\r\nHost: A.TEST.:80\r\n",
            "HTTP/1.1 401",
        ),
    ];
    for (what, head, expected) in cases {
        let answer = raw(server.http, &format!("{head}Connection: close\r\n\r\n")).await;
        assert!(
            answer.starts_with(expected),
            "{what}: expected {expected}, got:\n{answer}"
        );
        if expected.ends_with("200") {
            // The backend never sees Proxy-Authorization, nor the password the
            // basic_auth middleware checked.
            assert!(
                !answer.contains(ALICE),
                "{what}: credentials reached the backend"
            );
        }
    }
    // Proxy-Authorization is the proxy's business: it never reaches a backend.
    let answer = raw(server.http, &format!("GET / HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic {ALICE}\r\nConnection: close\r\n\r\n")).await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("pauth=-"),
        "{answer}"
    );
    // The protected prefix reached the admin backend, the near miss the open one.
    let answer = raw(server.http, &format!("GET /admin/x HTTP/1.1\r\nHost: a.test\r\nAuthorization: Basic {ALICE}\r\nConnection: close\r\n\r\n")).await;
    assert!(answer.contains("backend=admin path=/admin/x"), "{answer}");
    let answer = raw(
        server.http,
        "GET /administrator HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.contains("backend=open path=/administrator"),
        "{answer}"
    );

    // HTTP/2: `:authority` decides; a Host header that disagrees is a 400.
    let stream = TcpStream::connect(server.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    for (host_header, expected) in [
        (None, 401),
        (Some("a.test"), 400),
        (Some("locked.test"), 401),
    ] {
        let mut request = http::Request::builder().uri("http://locked.test/");
        if let Some(host) = host_header {
            request = request.header("host", host);
        }
        let response = sender
            .send_request(request.body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), expected, "h2 with Host {host_header:?}");
    }
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_services_work_over_a_quic_session() {
    let app = backend("app").await;
    let (port, http) = (free_port(), free_port());
    let cert = match quic_config().auth {
        warren::config::quic::QuicAuth::Psk {
            cert: Some(cert), ..
        } => cert,
        _ => unreachable!("quic_config is psk mode with a cert path"),
    };
    let toml = format!(
        "[server]\nbind = \"127.0.0.1:{port}\"\ntransport = \"quic\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\n[server.quic]\ncert = \"{}\"\nmax_packet = 6500\n[server.http]\nbind = \"127.0.0.1:{http}\"\n{TWO_SERVICES}",
        cert.display()
    );
    let config = ServerConfig::from_toml_str(&toml, "server.toml").expect("valid config");
    let bound = warren::Server::from_config(config)
        .unwrap()
        .bind()
        .await
        .unwrap();
    let addr = bound.local_addr();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let client = Client::builder(HostPort::from(addr))
        .psk(PSK)
        .default_token(TOKEN)
        .transport(warren::config::Transport::Quic)
        .quic(quic_config())
        .tcp_service("app", HostPort::from(app))
        .build()
        .unwrap();
    let mut status = client.status();
    let client_stop = CancellationToken::new();
    tokio::spawn(client.run(client_stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected))
        .await
        .expect("connects over QUIC")
        .unwrap();
    let http_addr = SocketAddr::from(([127, 0, 0, 1], http));
    let client = hyper_client();
    let upload = random_bytes(2 * 1024 * 1024 + 1);
    let (status, body) = request(
        &client,
        http_addr,
        "POST",
        "app.test",
        "/upload",
        upload.clone(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body, blake3::hash(&upload).to_hex().to_string());
    let len = 3 * 1024 * 1024;
    let (status, body) = request(
        &client,
        http_addr,
        "GET",
        "app.test",
        &format!("/big/{len}"),
        vec![],
    )
    .await;
    assert_eq!(status, 200);
    let expected: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(blake3::hash(&body), blake3::hash(&expected));
    client_stop.cancel();
    stop.cancel();
}

/// A reload that changes only routes applies in place: the client's session stays (no
/// reconnect), the new host is routed and the removed one is not; a new HTTP port asks for
/// a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_reload_applies_in_place_and_a_new_port_asks_for_a_restart() {
    let app = backend("app").await;
    let (port, http) = (free_port(), free_port());
    let toml = |hosts: &str, http: u16| {
        format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\nheartbeat_interval = \"1s\"\n[server.http]\nbind = \"127.0.0.1:{http}\"\n[server.services.app]\ntype = \"http\"\nhosts = [{hosts}]\n"
        )
    };
    let config = ServerConfig::from_toml_str(&toml("\"old.test\"", http), "s.toml").unwrap();
    let bound = warren::Server::from_config(config)
        .unwrap()
        .bind()
        .await
        .unwrap();
    let addr = bound.local_addr();
    let reloader = bound.reloader();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let client = start_http_client(addr, &[("app", app)]).await;
    let http_addr = SocketAddr::from(([127, 0, 0, 1], http));
    let get = |host: &'static str| async move {
        raw(
            http_addr,
            &format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        )
        .await
    };
    assert!(get("old.test").await.starts_with("HTTP/1.1 200"));
    let summary = reloader
        .apply(ServerConfig::from_toml_str(&toml("\"new.test\"", http), "s.toml").unwrap())
        .await
        .expect("reload applies");
    assert!(
        summary
            .applied
            .iter()
            .any(|line| line.contains("routes and middleware updated")),
        "{summary:?}"
    );
    assert!(summary.needs_restart.is_empty(), "{summary:?}");
    assert!(get("new.test").await.starts_with("HTTP/1.1 200"));
    assert!(get("old.test").await.starts_with("HTTP/1.1 404"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = client.status.borrow().clone();
    assert!(
        status.connected && status.sessions == 1,
        "the session was kept: {status:?}"
    );
    let other = free_port();
    let summary = reloader
        .apply(ServerConfig::from_toml_str(&toml("\"new.test\"", other), "s.toml").unwrap())
        .await
        .expect("reload applies");
    assert!(
        summary
            .needs_restart
            .iter()
            .any(|line| line.contains("[server.http]")),
        "{summary:?}"
    );
    stop.cancel();
}

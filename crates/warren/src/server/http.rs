//! The server's shared HTTP ports (`[server.http]`): accept visitors, decide each request's
//! route once, run the service's middleware and hand the request to a backend connection
//! through a session serving the service.
//!
//! * The plain port speaks HTTP/1.1 and h2c (prior knowledge); the TLS port terminates TLS
//!   with the certificate the SNI names (ALPN h2 and http/1.1), or passes the connection
//!   through untouched when the SNI names a `tls = "passthrough"` service (its bytes are only
//!   peeked, then relayed like any TCP visitor's).
//! * What routes a request is a [`Front`]: the route table, the services' chains and
//!   backend pools, and the certificates, built from one config and swapped whole on
//!   reload. A connection reads the front in force when each request arrives, so a reload
//!   changes routes between two requests of one keep-alive connection.
//! * Backend connections are tunnel streams opened on a session serving the service
//!   ([`TunnelConnector`](super::backend::TunnelConnector)), kept alive in a pool per
//!   service (hyper-util's client), so a request on a warm pool opens nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use super::backend::BackendClient;
use super::serving::ServiceSlot;
use super::session::ServerSession;
use super::{Binding, Shared};
use crate::config::http::{Backend, HttpListen, HttpRoute, HttpTls};
use crate::config::{ServerConfig, ServiceKind};
use crate::http::capture::Capture;
use crate::http::middleware::{Chain, RequestContext};
use crate::http::page::error_page;
use crate::http::route::{self, HostPattern, RouteSpec, RouteTable};
use crate::http::{Body, BoxError};
use crate::transport::tcp;

/// Most visitor connections the HTTP ports hold at once; more are refused (closed) until
/// some end.
const MAX_CONNECTIONS: usize = 16_384;

/// How long a visitor may take to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the TLS port waits for a ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a backend may take to answer when no `timeout` middleware says otherwise.
const DEFAULT_BACKEND_TIMEOUT: Duration = Duration::from_secs(120);

/// Most response bytes a replay reads before letting the rest go.
const REPLAY_READ_LIMIT: usize = 16 * 1024 * 1024;

/// How long a closing server lets requests in flight finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Request numbers (the inspector's ids).
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

/// The HTTP ports, bound.
pub(super) struct HttpPorts {
    pub(super) plain: Option<TcpListener>,
    pub(super) tls: Option<TcpListener>,
}

impl HttpPorts {
    /// Binds the ports `listen` names.
    pub(super) async fn bind(listen: &HttpListen) -> Result<HttpPorts, super::ServerError> {
        let plain = match listen.bind {
            Some(addr) => Some(super::bind_listener("the HTTP port", addr).await?),
            None => None,
        };
        let tls = match listen.tls_bind {
            Some(addr) => Some(super::bind_listener("the HTTPS port", addr).await?),
            None => None,
        };
        Ok(HttpPorts { plain, tls })
    }
}

/// What routes requests: built from one config, swapped whole on reload.
pub(super) struct Front {
    routes: RouteTable,
    services: HashMap<Arc<str>, Arc<HttpService>>,
    /// `tls = "passthrough"` services, matched on the SNI.
    passthrough: Vec<(HostPattern, Arc<ServiceSlot>)>,
    /// Certificates of `tls = "terminate"` services, by SNI.
    tls: Option<TlsFront>,
    trusted_proxies: Vec<crate::http::forwarded::Cidr>,
}

/// The TLS port's terminating side: the rustls config and the certificates it picks from
/// (asked directly whether a name has one, so the port answers an unknown name with
/// `unrecognized_name` before any handshake).
struct TlsFront {
    config: Arc<rustls::ServerConfig>,
    certificates: Arc<SniCertificates>,
}

/// One http service as the front sees it.
struct HttpService {
    /// The service's name, shared with every request's context.
    name: Arc<str>,
    slot: Arc<ServiceSlot>,
    meter: crate::metrics::HttpMeter,
    route: HttpRoute,
    chain: Chain,
    backend: BackendClient,
}

/// An http service's routes and chain, as the admin API shows them.
pub(super) struct Description {
    pub(super) hosts: Vec<String>,
    pub(super) paths: Vec<String>,
    pub(super) middleware: Vec<crate::admin::MiddlewareInfo>,
}

impl Front {
    /// The routes and chain of http service `name`, if the front has it.
    pub(super) fn describe(&self, name: &str) -> Option<Description> {
        let service = self.services.get(name)?;
        Some(Description {
            hosts: service
                .route
                .hosts
                .iter()
                .map(ToString::to_string)
                .collect(),
            paths: service.route.paths.clone(),
            middleware: service
                .chain
                .rejections()
                .into_iter()
                .map(|(name, rejected)| crate::admin::MiddlewareInfo { name, rejected })
                .collect(),
        })
    }

    /// An empty front (no http services).
    pub(super) fn empty() -> Front {
        Front {
            routes: RouteTable::default(),
            services: HashMap::new(),
            passthrough: Vec::new(),
            tls: None,
            trusted_proxies: Vec::new(),
        }
    }

    /// The front for `config`, whose http services' slots are in `bindings`. Problems
    /// (a certificate that does not load, a chain that does not build) are logged and leave
    /// that service out, so one bad certificate does not take every site down.
    fn build(
        config: &ServerConfig,
        bindings: &HashMap<String, Binding>,
        declared: &HashMap<String, DeclaredHttp>,
        previous: Option<&Front>,
        telemetry: &Arc<crate::metrics::Telemetry>,
    ) -> Front {
        let mut front = Front::empty();
        let Some(listen) = &config.http else {
            return front;
        };
        front.trusted_proxies = listen.trusted_proxies.clone();
        let mut specs = Vec::new();
        let mut certs = Vec::new();
        let configured = config.services.values().filter_map(|service| {
            let (ServiceKind::Http, Some(route)) = (service.kind, &service.http) else {
                return None;
            };
            let binding = bindings.get(&service.name)?;
            Some((Arc::clone(&binding.slot), (**route).clone()))
        });
        let declared = declared
            .values()
            .map(|d| (Arc::clone(&d.slot), declared_route(&d.hosts)));
        for (slot, route) in configured.chain(declared).collect::<Vec<_>>() {
            let name: Arc<str> = Arc::from(slot.name.as_str());
            match &route.tls {
                HttpTls::Passthrough => {
                    for host in &route.hosts {
                        front.passthrough.push((host.clone(), Arc::clone(&slot)));
                    }
                    continue;
                }
                HttpTls::Terminate { cert, key } => match load_certified_key(cert, key) {
                    Ok(key) => {
                        for host in &route.hosts {
                            certs.push((host.clone(), Arc::clone(&key)));
                        }
                    }
                    Err(error) => {
                        warn!(event = "http_certificate", service = %name, %error, "cannot load the service's certificate; its TLS port is off until it loads");
                    }
                },
                HttpTls::Off => {}
            }
            specs.push(RouteSpec {
                service: Arc::clone(&name),
                hosts: route.hosts.clone(),
                paths: route.paths.clone(),
            });
            // Unchanged (same slot, same settings): keep the service as it runs, with its
            // warm backend pool and its middleware's state (rate-limit buckets, cached
            // logins), so a declared service coming or going elsewhere costs it nothing.
            if let Some(same) = previous
                .and_then(|p| p.services.get(&name))
                .filter(|s| Arc::ptr_eq(&s.slot, &slot) && s.route == route)
            {
                front.services.insert(name, Arc::clone(same));
                continue;
            }
            let chain = match crate::http::middleware::build_chain(&route.middleware) {
                Ok(chain) => chain,
                Err(error) => {
                    specs.pop();
                    warn!(event = "http_middleware", service = %name, %error, "cannot build the service's middleware; the service is off");
                    continue;
                }
            };
            let backend = BackendClient::new(&slot, route.backend, telemetry);
            front.services.insert(
                Arc::clone(&name),
                Arc::new(HttpService {
                    name,
                    meter: telemetry.metrics.http_meter(&slot.name),
                    slot,
                    route,
                    chain,
                    backend,
                }),
            );
        }
        match RouteTable::build(specs) {
            Ok(routes) => front.routes = routes,
            // The config's check refuses conflicting routes; this is a last guard.
            Err(conflicts) => {
                warn!(event = "http_routes", conflicts = ?conflicts, "conflicting http routes; no http service is routed");
            }
        }
        if !certs.is_empty() {
            front.tls = tls_front(certs);
        }
        front
    }
}

/// Accepts visitors on one HTTP port until the server stops.
pub(super) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, tls: bool) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            // The shutdown or a drain: the port closes with this loop.
            () = shared.taking_visitors.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(event = "accept_failed", port = if tls { "https" } else { "http" }, %error, "accept failed on the HTTP port; retrying");
                tokio::time::sleep(super::ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            debug!(event = "visitor_rejected", %peer, "too many HTTP connections; closing the visitor");
            continue;
        };
        tcp::tune_peer(&stream, peer);
        let shared_for_task = Arc::clone(&shared);
        shared.tasks.spawn(async move {
            if tls {
                serve_tls(shared_for_task, stream, peer).await;
            } else {
                serve_http(shared_for_task, TokioIo::new(stream), peer, false).await;
            }
            drop(permit);
        });
    }
}

/// The TLS port: peek the SNI, then pass the connection through or terminate it.
async fn serve_tls(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    let sni = match tokio::time::timeout(HELLO_TIMEOUT, peek_sni(&stream)).await {
        Ok(Ok(sni)) => sni,
        Ok(Err(reason)) => {
            debug!(event = "tls_refused", %peer, %reason, "not a TLS ClientHello on the HTTPS port");
            return;
        }
        Err(_) => {
            debug!(event = "tls_refused", %peer, "no ClientHello within {HELLO_TIMEOUT:?}");
            return;
        }
    };
    let front = shared.http_front();
    if let Some(name) = &sni
        && let Some((_, slot)) = front
            .passthrough
            .iter()
            .find(|(host, _)| host.matches(name))
    {
        let slot = Arc::clone(slot);
        let cancel = slot.stop.clone();
        debug!(event = "tls_passthrough", %peer, sni = %name, service = %slot.name, "passing TLS through");
        // Not limited: `bandwidth_limit` is for tcp and udp services on the server.
        let telemetry = Arc::clone(&shared.telemetry);
        super::serve_visitor(slot, (stream, peer), cancel, telemetry, Default::default()).await;
        return;
    }
    let config = front
        .tls
        .as_ref()
        .filter(|tls| {
            sni.as_deref()
                .is_some_and(|name| tls.certificates.find(name).is_some())
        })
        .map(|tls| Arc::clone(&tls.config));
    let Some(config) = config else {
        debug!(event = "tls_refused", %peer, sni = sni.as_deref().unwrap_or("(none)"), "no service has a certificate for this name; sent unrecognized_name");
        let mut stream = stream;
        let _ = tokio::io::AsyncWriteExt::write_all(
            &mut stream,
            &warren_proto::sni::ALERT_UNRECOGNIZED_NAME,
        )
        .await;
        return;
    };
    drop(front);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    match tokio::time::timeout(HELLO_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => serve_http(shared, TokioIo::new(tls), peer, true).await,
        Ok(Err(error)) => {
            debug!(event = "tls_refused", %peer, %error, "TLS handshake failed");
        }
        Err(_) => debug!(event = "tls_refused", %peer, "TLS handshake timed out"),
    }
}

/// Waits until the ClientHello's SNI can be read without consuming it.
async fn peek_sni(stream: &TcpStream) -> Result<Option<String>, String> {
    use warren_proto::sni::{MAX_CLIENT_HELLO, Peek, peek_sni};
    let mut buf = vec![0u8; MAX_CLIENT_HELLO];
    let mut last = 0;
    loop {
        let n = stream.peek(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before its ClientHello".to_owned());
        }
        match peek_sni(&buf[..n]).map_err(|e| e.to_string())? {
            Peek::Sni(name) => return Ok(Some(name.to_string())),
            Peek::NoSni => return Ok(None),
            Peek::NotTls => return Err("not TLS".to_owned()),
            Peek::NeedMore if n >= buf.len() => return Err("ClientHello too large".to_owned()),
            Peek::NeedMore => {
                if n == last {
                    // peek returns what is there at once; wait for more to arrive.
                    stream.readable().await.map_err(|e| e.to_string())?;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                last = n;
            }
        }
    }
}

/// Serves HTTP/1.1 and HTTP/2 on one visitor connection until it closes, the server stops
/// (in-flight requests get [`DRAIN_TIMEOUT`]), or the visitor idles past the header timeout.
async fn serve_http<I>(shared: Arc<Shared>, io: I, peer: SocketAddr, tls: bool)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let service_shared = Arc::clone(&shared);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let shared = Arc::clone(&service_shared);
        async move {
            let front = shared.http_front();
            let request = request.map(|body| body.map_err(BoxError::from).boxed_unsync());
            let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
            Ok::<_, std::convert::Infallible>(
                handle(&shared, &front, request, (peer, tls), id, None).await,
            )
        }
    });
    let connection = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                debug!(event = "http_connection_closed", %peer, %error, "HTTP connection ended with an error");
            }
        }
        // A drain lets the requests in flight finish (its own timeout bounds them) and closes
        // an idle keep-alive connection at once; a shutdown gives them DRAIN_TIMEOUT.
        () = shared.taking_visitors.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                () = shared.cancel.cancelled() => {
                    let _ = tokio::time::timeout(DRAIN_TIMEOUT, connection).await;
                }
            }
        }
    }
}

/// Answers one request: route, middleware, backend. `id` numbers it (the inspector's id);
/// `replay_of` marks a replay from the admin API.
async fn handle(
    shared: &Shared,
    front: &Front,
    request: Request<Body>,
    (peer, tls): (SocketAddr, bool),
    id: u64,
    replay_of: Option<u64>,
) -> Response<Body> {
    let started = tokio::time::Instant::now();
    let key = match route::route_key(&request) {
        Ok(key) => key,
        Err(error) => {
            debug!(event = "http_bad_request", %peer, %error, "refused a request");
            return error_page(error.status(), "Bad request", &error.to_string());
        }
    };
    let Some(found) = front.routes.lookup(&key.host, &key.path) else {
        debug!(event = "http_no_route", %peer, host = %key.host, path = %key.path, "no http service for this host and path");
        return error_page(
            StatusCode::NOT_FOUND,
            "No such site here",
            &format!(
                "This Warren server has no service for {} (path {}). Check the address, or ask the site's owner to add the host to a service's `hosts`.",
                key.host, key.path
            ),
        );
    };
    let prefix = found.prefix.to_owned();
    let Some(service) = front.services.get(found.service).map(Arc::clone) else {
        return error_page(
            StatusCode::NOT_FOUND,
            "No such site here",
            &format!("No service answers for {}.", key.host),
        );
    };
    let name = &service.slot.name;
    let client_ip =
        crate::http::forwarded::client_ip(peer.ip(), request.headers(), &front.trusted_proxies);
    let mut capture = service.route.capture.then(|| {
        Capture::start(
            Arc::clone(&shared.captures),
            id,
            &request,
            name,
            &key.host,
            client_ip,
            tls,
            started,
            service.route.capture_body_bytes,
        )
    });
    let mut request = request;
    if let Some(capture) = capture.as_mut() {
        if let Some(original) = replay_of {
            capture.replay_of(original);
        }
        let body = std::mem::replace(request.body_mut(), crate::http::empty());
        *request.body_mut() = capture.tee_request(body);
    }
    let mut cx = RequestContext::new(
        id,
        Arc::clone(&service.name),
        key.host.clone(),
        key.path.clone(),
        peer,
        client_ip,
        tls,
    );
    cx.started = started;
    let response = if tls && !matches!(service.route.tls, HttpTls::Terminate { .. }) {
        error_page(
            StatusCode::MISDIRECTED_REQUEST,
            "Wrong connection for this host",
            &format!(
                "{} is not served over TLS here. Connect with http:// instead.",
                key.host
            ),
        )
    } else {
        match service.chain.request(&mut request, &mut cx).await {
            Ok(ran) => {
                let mut response = forward(&service, request, &key, &prefix, &cx).await;
                service.chain.response(ran, &mut response, &cx);
                response
            }
            Err((ran, mut response)) => {
                service.chain.response(ran, &mut response, &cx);
                response
            }
        }
    };
    service
        .meter
        .request(response.status().as_u16(), started.elapsed());
    match capture {
        Some(capture) => capture.finish(response, &cx.decisions),
        None => response,
    }
}

/// Replays captured request `id` through the front in force, as if its visitor sent it
/// again (same headers, same body, same TLS flag); the replay is captured too. Returns the
/// new request's id and status.
pub(super) async fn replay(
    shared: &Arc<Shared>,
    id: u64,
    edit: Option<crate::admin::ReplayEdit>,
) -> Result<(u64, u16), String> {
    let mut original = shared.captures.replay_request(id)?;
    if let Some(edit) = edit {
        apply_edit(&mut original, edit)?;
    }
    let mut request = Request::builder()
        .method(original.method)
        .uri(original.uri.as_str())
        .version(http::Version::HTTP_11)
        .body(crate::http::full(original.body))
        .map_err(|e| format!("request {id} cannot be rebuilt: {e}"))?;
    *request.headers_mut() = original.headers;
    let new_id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
    let front = shared.http_front();
    let peer = SocketAddr::from(([127, 0, 0, 1], 0));
    let response = handle(
        shared,
        &front,
        request,
        (peer, original.tls),
        new_id,
        Some(id),
    )
    .await;
    let status = response.status().as_u16();
    // Read the answer (bounded) so the replay's capture completes, then let it go.
    let mut body = response.into_body();
    let mut read = 0usize;
    while read < REPLAY_READ_LIMIT {
        match tokio::time::timeout(DEFAULT_BACKEND_TIMEOUT, body.frame()).await {
            Ok(Some(Ok(frame))) => read += frame.data_ref().map_or(0, bytes::Bytes::len),
            _ => break,
        }
    }
    Ok((new_id, status))
}

/// Changes a captured request as the dashboard's "Edit and replay" asks.
fn apply_edit(
    request: &mut crate::http::capture::ReplayRequest,
    edit: crate::admin::ReplayEdit,
) -> Result<(), String> {
    if let Some(method) = edit.method {
        request.method = method
            .trim()
            .parse()
            .map_err(|_| format!("`{method}` is not an HTTP method"))?;
    }
    if let Some(uri) = edit.uri {
        // Origin form only: the Host header (edited or captured) still picks the route.
        if !uri.starts_with('/') || uri.parse::<http::Uri>().is_err() {
            return Err(format!(
                "`{uri}` is not a path: give the path and query, e.g. /items?page=2 (change the Host header to reach another service)"
            ));
        }
        request.uri = uri;
    }
    if let Some(headers) = edit.headers {
        let mut map = http::HeaderMap::new();
        for (name, value) in headers {
            let header = http::HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| format!("`{name}` is not a header name"))?;
            // The inspector shows secrets as "(redacted)"; a header left so is sent with
            // its captured value, which the page never saw.
            if value == crate::http::capture::REDACTED_VALUE {
                for captured in request.headers.get_all(&header) {
                    map.append(header.clone(), captured.clone());
                }
                continue;
            }
            let value = http::HeaderValue::from_str(&value)
                .map_err(|_| format!("the value of {name} has characters a header cannot carry"))?;
            map.append(header, value);
        }
        request.headers = map;
    }
    if let Some(body) = edit.body {
        request.body = bytes::Bytes::from(body);
    }
    // The body may have changed: its length is what is sent now.
    request.headers.remove(http::header::TRANSFER_ENCODING);
    request.headers.remove(http::header::CONTENT_LENGTH);
    if !request.body.is_empty() {
        request
            .headers
            .insert(http::header::CONTENT_LENGTH, request.body.len().into());
    }
    Ok(())
}

/// Sends the request to the service's backend and returns its response (or a Warren page
/// saying why there is none).
async fn forward(
    service: &HttpService,
    mut request: Request<Body>,
    key: &route::RouteKey,
    prefix: &str,
    cx: &RequestContext,
) -> Response<Body> {
    let upgrade = wants_upgrade(request.headers());
    let visitor_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let original_host = request.headers().get(header::HOST).cloned().or_else(|| {
        request
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let path = if service.route.strip_prefix {
        route::strip_prefix(prefix, &key.path)
    } else {
        key.path.clone()
    };
    let host = match &service.route.host_rewrite {
        Some(host) => host.clone(),
        None => match key.port {
            Some(port) => format!("{}:{port}", authority_host(&key.host)),
            None => authority_host(&key.host),
        },
    };
    let path_and_query = match &key.query {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    // HTTP/1 sends the origin form (`Host` is a header; the service's one pool serves
    // every host). HTTP/2 carries the host as `:authority`, taken from the URI, and
    // hyper-util's client keys its (multiplexed) connections by it: one per host.
    let uri = match service.route.backend {
        Backend::Http1 => Uri::builder()
            .path_and_query(path_and_query.as_str())
            .build(),
        Backend::H2c => Uri::builder()
            .scheme("http")
            .authority(host.as_str())
            .path_and_query(path_and_query.as_str())
            .build(),
    };
    let Ok(uri) = uri else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "The request's path cannot be forwarded.",
        );
    };
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    strip_hop_by_hop(headers, upgrade);
    headers.remove(header::HOST);
    if service.route.backend == Backend::Http1 {
        if let Ok(value) = HeaderValue::from_str(&host) {
            headers.insert(header::HOST, value);
        }
        *request.version_mut() = http::Version::HTTP_11;
    } else {
        *request.version_mut() = http::Version::HTTP_2;
    }
    add_forwarded(request.headers_mut(), cx, original_host);
    let timeout = cx.timeout.unwrap_or(DEFAULT_BACKEND_TIMEOUT);
    let mut response = match tokio::time::timeout(timeout, service.backend.request(request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            if body_too_large(&*error) {
                return error_page(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Request body too large",
                    &format!(
                        "{} accepts smaller bodies than this one (see its max_body).",
                        key.host
                    ),
                );
            }
            service.slot.meter.error();
            let cause = error_chain(&*error);
            warn!(event = "http_backend_failed", service = %service.slot.name, host = %key.host, error = %cause, "the backend did not answer");
            return error_page(
                StatusCode::BAD_GATEWAY,
                "The site is not answering",
                &format!(
                    "Warren could not reach the service behind {}. If you run it, check that its client is connected and its target is up (`warren doctor`).",
                    key.host
                ),
            );
        }
        Err(_) => {
            service.slot.meter.error();
            warn!(event = "http_backend_timeout", service = %service.slot.name, host = %key.host, "the backend did not answer within {timeout:?}");
            return error_page(
                StatusCode::GATEWAY_TIMEOUT,
                "The site took too long",
                &format!(
                    "The service behind {} did not answer within {} s.",
                    key.host,
                    timeout.as_secs()
                ),
            );
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(visitor_upgrade) = visitor_upgrade {
            let backend_upgrade = hyper::upgrade::on(&mut response);
            let name = service.slot.name.clone();
            let stop = service.slot.stop.clone();
            tokio::spawn(async move {
                let (visitor, backend) = match tokio::join!(visitor_upgrade, backend_upgrade) {
                    (Ok(visitor), Ok(backend)) => (visitor, backend),
                    (visitor, backend) => {
                        debug!(event = "http_upgrade_failed", service = %name, visitor = ?visitor.err(), backend = ?backend.err(), "an upgrade did not complete");
                        return;
                    }
                };
                let mut visitor = TokioIo::new(visitor);
                let mut backend = TokioIo::new(backend);
                tokio::select! {
                    () = stop.cancelled() => {}
                    result = tokio::io::copy_bidirectional(&mut visitor, &mut backend) => {
                        if let Err(error) = result {
                            debug!(event = "http_upgrade_closed", service = %name, %error, "upgraded connection ended with an error");
                        }
                    }
                }
            });
        }
    } else {
        strip_hop_by_hop(response.headers_mut(), false);
    }
    response
}

/// A host as it goes into an authority (IPv6 in brackets).
fn authority_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// Whether a backend exchange failed because `max_body` cut the request body.
fn body_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(cause) = source {
        if cause.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = cause.source();
    }
    false
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Whether a request asks to switch protocols (WebSocket and friends).
fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes the headers that belong to one connection (RFC 9110 §7.6.1), and those the
/// `Connection` header names; an upgrade keeps `Connection: upgrade` and `Upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    // One pass over the (few) headers present finds what to drop: removing each of the
    // nine names blindly cost ~2 % of the server's CPU per request (a hash per name).
    let mut drop: Vec<HeaderName> = Vec::new();
    for name in headers.keys() {
        let hop_by_hop = matches!(
            name.as_str(),
            "te" | "trailer"
                | "transfer-encoding"
                | "proxy-authorization"
                | "proxy-authenticate"
                | "keep-alive"
                | "proxy-connection"
        ) || (!upgrade && (name == header::CONNECTION || name == header::UPGRADE));
        if hop_by_hop {
            drop.push(name.clone());
        }
    }
    // Headers the `Connection` header names are hop-by-hop too.
    drop.extend(
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
            .filter(|name| !(upgrade && name == header::UPGRADE)),
    );
    for name in drop {
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// `X-Forwarded-Proto` and `X-Forwarded-Host`, parsed once (a `&str` name is parsed and
/// checked on every insert).
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Adds `X-Forwarded-For` (appended to what a trusted proxy sent; replaced otherwise),
/// `X-Forwarded-Proto` and `X-Forwarded-Host`.
fn add_forwarded(headers: &mut HeaderMap, cx: &RequestContext, original_host: Option<HeaderValue>) {
    use crate::http::forwarded::X_FORWARDED_FOR;
    let trusted_chain = cx.client_ip != cx.peer.ip();
    let for_value = if trusted_chain {
        let earlier: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        format!("{}, {}", earlier.join(", "), cx.peer.ip())
    } else {
        cx.peer.ip().to_string()
    };
    // Takes the string's bytes as they are (`from_str` would copy them).
    if let Ok(value) = HeaderValue::try_from(for_value) {
        headers.insert(X_FORWARDED_FOR.clone(), value);
    }
    headers.insert(
        X_FORWARDED_PROTO.clone(),
        HeaderValue::from_static(if cx.tls { "https" } else { "http" }),
    );
    if let Some(host) = original_host {
        headers.insert(X_FORWARDED_HOST.clone(), host);
    }
}

/// Loads a PEM certificate chain and key for rustls.
fn load_certified_key(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::sign::CertifiedKey>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("cannot read {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{} is not a PEM certificate chain: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no certificate", cert.display()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read the private key in {}: {e}", key.display()))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| format!("{} is not a usable private key: {e}", key.display()))?;
    let certified = rustls::sign::CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        format!(
            "{} does not belong to {}: {e}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(Arc::new(certified))
}

/// The TLS port's config for `certs`, picked by SNI (ALPN h2 and http/1.1); `None` (logged)
/// if rustls refuses the provider, which aws-lc-rs never gives it cause to.
fn tls_front(certs: Vec<(HostPattern, Arc<rustls::sign::CertifiedKey>)>) -> Option<TlsFront> {
    let certificates = Arc::new(SniCertificates(certs));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = match rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
    {
        Ok(builder) => builder,
        Err(error) => {
            warn!(event = "http_certificate", %error, "the TLS provider refused the default TLS versions; the HTTPS port terminates nothing");
            return None;
        }
    };
    let mut config = builder.with_no_client_auth().with_cert_resolver(
        Arc::clone(&certificates) as Arc<dyn rustls::server::ResolvesServerCert>
    );
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Some(TlsFront {
        config: Arc::new(config),
        certificates,
    })
}

/// Terminate services' certificates by host pattern.
#[derive(Debug)]
struct SniCertificates(Vec<(HostPattern, Arc<rustls::sign::CertifiedKey>)>);

impl SniCertificates {
    /// The certificate for `name` (lowercase): an exact name first, then a wildcard.
    fn find(&self, name: &str) -> Option<&Arc<rustls::sign::CertifiedKey>> {
        self.0
            .iter()
            .find(|(host, _)| matches!(host, HostPattern::Exact(_)) && host.matches(name))
            .or_else(|| self.0.iter().find(|(host, _)| host.matches(name)))
            .map(|(_, key)| key)
    }
}

impl rustls::server::ResolvesServerCert for SniCertificates {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let name = hello.server_name()?.to_ascii_lowercase();
        self.find(&name).map(Arc::clone)
    }
}

impl Shared {
    /// The HTTP front in force.
    pub(super) fn http_front(&self) -> Arc<Front> {
        Arc::clone(&self.http.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Logs the HTTP ports at start.
pub(super) fn log_ports(ports: &HttpPorts) {
    for (listener, what) in [(&ports.plain, "http"), (&ports.tls, "https")] {
        if let Some(listener) = listener
            && let Ok(addr) = listener.local_addr()
        {
            info!(event = "http_listening", port = what, %addr, "serving http services");
        }
    }
}

/// How often the certificate files of `tls = "terminate"` services are checked for
/// changes.
const CERTIFICATE_POLL: Duration = Duration::from_secs(2);

/// Rebuilds the front when a certificate or key file of a `tls = "terminate"` service
/// changes on disk (renewed by certbot, replaced by a deploy), until the server stops. A
/// handshake in progress keeps the certificate it started with.
pub(super) async fn watch_certificates(shared: Arc<Shared>) {
    let mut seen = certificate_stamps(&shared.live().config);
    let mut tick = tokio::time::interval(CERTIFICATE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let live = shared.live();
        let now = certificate_stamps(&live.config);
        if now == seen {
            continue;
        }
        seen = now;
        rebuild_front(&shared);
        info!(
            event = "http_certificates_reloaded",
            "a certificate file changed; the HTTPS port serves the new files"
        );
    }
}

/// The modification times (and lengths) of every terminate service's files.
fn certificate_stamps(
    config: &ServerConfig,
) -> Vec<(std::path::PathBuf, Option<(std::time::SystemTime, u64)>)> {
    let mut stamps = Vec::new();
    for service in config.services.values() {
        if let Some(route) = &service.http
            && let HttpTls::Terminate { cert, key } = &route.tls
        {
            for path in [cert, key] {
                let stamp = std::fs::metadata(path)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())));
                stamps.push((path.clone(), stamp));
            }
        }
    }
    stamps
}

/// A client-declared http service: its slot (the sessions serving it) and its names.
pub(super) struct DeclaredHttp {
    slot: Arc<ServiceSlot>,
    hosts: Vec<String>,
}

/// Most client-declared http services at once.
const MAX_DECLARED: usize = 1024;

/// The route of a declared service: its names, every path, no TLS, no middleware.
fn declared_route(hosts: &[String]) -> HttpRoute {
    HttpRoute {
        hosts: hosts
            .iter()
            .map(|h| HostPattern::Exact(h.clone()))
            .collect(),
        paths: vec!["/".to_owned()],
        tls: HttpTls::Off,
        host_rewrite: None,
        strip_prefix: false,
        backend: Backend::Http1,
        middleware: Vec::new(),
        capture: true,
        capture_body_bytes: 0,
    }
}

/// Judges a declared http claim: the names it gets, or why not. Several sessions may
/// declare the same service (same name, same names): they share it, balanced.
pub(super) fn judge_declared(
    shared: &Shared,
    config: &ServerConfig,
    name: &str,
    subdomain: Option<&str>,
    hosts: &[String],
) -> Result<Vec<String>, String> {
    let Some(listen) = &config.http else {
        return Err("this server has no [server.http] ports for http services".to_owned());
    };
    if config.services.contains_key(name) || config.forwards.contains_key(name) {
        return Err(format!(
            "`{name}` is a service in the server's config; give the declared service another name"
        ));
    }
    let mut wanted = Vec::new();
    if let Some(label) = subdomain {
        let Some(parent) = &listen.subdomain_host else {
            return Err("this server takes no `subdomain` services (its [server.http] sets no subdomain_host)".to_owned());
        };
        if !crate::config::http::is_dns_label(label) {
            return Err(format!("{label:?} is not one DNS label"));
        }
        wanted.push(format!("{}.{parent}", label.to_ascii_lowercase()));
    }
    for host in hosts {
        let host = host.to_ascii_lowercase();
        let allowed = listen.allow_hosts.iter().any(|p| p.matches(&host))
            || listen.subdomain_host.as_ref().is_some_and(|parent| {
                host.strip_suffix(parent.as_str())
                    .and_then(|label| label.strip_suffix('.'))
                    .is_some_and(crate::config::http::is_dns_label)
            });
        if !allowed {
            return Err(format!(
                "{host} is not among the names this server lets clients declare (its allow_hosts / subdomain_host)"
            ));
        }
        wanted.push(host);
    }
    if wanted.is_empty() || wanted.len() > crate::config::http::MAX_CLAIMED_HOSTS {
        return Err(format!(
            "a declared http service names 1 to {} hosts",
            crate::config::http::MAX_CLAIMED_HOSTS
        ));
    }
    wanted.sort();
    wanted.dedup();
    for host in &wanted {
        if let Some(other) = config.services.values().find(|s| {
            s.http
                .as_ref()
                .is_some_and(|r| r.hosts.iter().any(|p| p.matches(host)))
        }) {
            return Err(format!(
                "{host} is routed to `{}` by the server's config",
                other.name
            ));
        }
    }
    let declared = shared
        .declared_http
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for (other, entry) in declared.iter() {
        if other == name {
            if entry.hosts != wanted {
                return Err(format!(
                    "`{name}` is already declared by another client for {}; declare the same names to share it",
                    entry.hosts.join(", ")
                ));
            }
        } else if let Some(host) = wanted.iter().find(|h| entry.hosts.contains(h)) {
            return Err(format!(
                "{host} is already declared by another client's service `{other}`"
            ));
        }
    }
    if declared.len() >= MAX_DECLARED && !declared.contains_key(name) {
        return Err(format!(
            "this server holds {MAX_DECLARED} declared http services already"
        ));
    }
    Ok(wanted)
}

/// The URLs visitors use for `hosts` on this server's plain HTTP port.
pub(super) fn urls(config: &ServerConfig, hosts: &[String]) -> Vec<String> {
    let port = config.http.as_ref().and_then(|l| l.bind).map(|a| a.port());
    hosts
        .iter()
        .map(|host| match port {
            Some(80) | None => format!("http://{host}/"),
            Some(port) => format!("http://{host}:{port}/"),
        })
        .collect()
}

/// Routes the declared http services a new session was granted, until it ends; the last
/// session of a service takes its routes with it.
pub(super) fn serve_declared(
    shared: &Arc<Shared>,
    session: &Arc<ServerSession>,
    granted: Vec<(String, Vec<String>)>,
) {
    if granted.is_empty() {
        return;
    }
    {
        let mut declared = shared
            .declared_http
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (name, hosts) in &granted {
            // Judged before this lock was taken: another session may have claimed one of
            // the names under another service since. It keeps them.
            let taken = declared
                .iter()
                .find(|(other, d)| *other != name && d.hosts.iter().any(|h| hosts.contains(h)));
            if let Some((other, _)) = taken {
                warn!(event = "declared_denied", service = %name, other = %other, "a name of this declared http service was claimed by another service a moment earlier; not routed");
                continue;
            }
            let entry = declared
                .entry(name.clone())
                .or_insert_with(|| DeclaredHttp {
                    slot: Arc::new(ServiceSlot::new(
                        name.clone(),
                        ServiceKind::Http,
                        crate::crypto::secret::Secret::default(),
                        shared.telemetry.metrics.service(name),
                        shared.cancel.child_token(),
                        warren_proto::balance::Strategy::default(),
                    )),
                    hosts: hosts.clone(),
                });
            entry.slot.join(session, 1, true);
            info!(event = "http_declared", service = %name, hosts = %hosts.join(" "), "routing a client-declared http service");
        }
    }
    rebuild_front(shared);
    let shared = Arc::clone(shared);
    let session = Arc::clone(session);
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        session.cancel.cancelled().await;
        {
            let mut declared = shared
                .declared_http
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (name, _) in &granted {
                let empty = declared.get(name).is_some_and(|entry| {
                    entry.slot.leave(&session.id());
                    entry.slot.readiness() == (0, 0)
                });
                if empty && let Some(entry) = declared.remove(name) {
                    entry.slot.stop.cancel();
                    info!(event = "http_undeclared", service = %name, "a client-declared http service ended with its last session");
                }
            }
        }
        rebuild_front(&shared);
    });
}

/// Rebuilds the front from the config in force, the configured services' slots and the
/// declared services, and swaps it in.
pub(super) fn rebuild_front(shared: &Shared) {
    let live = shared.live();
    let front = {
        let services = shared
            .services
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let declared = shared
            .declared_http
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Front::build(
            &live.config,
            &services,
            &declared,
            Some(&shared.http_front()),
            &shared.telemetry,
        )
    };
    *shared.http.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(front);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_names_are_dropped() {
        let mut map = headers(&[
            ("host", "app.test"),
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic eA=="),
            ("proxy-connection", "keep-alive"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut map, false);
        let mut left: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "x-kept"]);
    }

    #[test]
    fn an_edit_keeps_redacted_secrets_and_refuses_absolute_uris() {
        let captured = || crate::http::capture::ReplayRequest {
            method: http::Method::POST,
            uri: "/upload".into(),
            headers: headers(&[
                ("authorization", "Bearer real-secret"),
                ("content-length", "5"),
            ]),
            body: bytes::Bytes::from_static(b"hello"),
            tls: false,
        };
        let mut request = captured();
        let edit = crate::admin::ReplayEdit {
            method: Some("PUT".into()),
            uri: Some("/other?x=1".into()),
            headers: Some(vec![
                ("authorization".into(), "(redacted)".into()),
                ("x-new".into(), "1".into()),
            ]),
            body: Some("changed!".into()),
        };
        apply_edit(&mut request, edit).unwrap();
        assert_eq!(request.method, http::Method::PUT);
        assert_eq!(request.uri, "/other?x=1");
        assert_eq!(request.headers["authorization"], "Bearer real-secret");
        assert_eq!(request.headers["x-new"], "1");
        assert_eq!(request.headers["content-length"], "8");
        assert_eq!(&request.body[..], b"changed!");
        let absolute = crate::admin::ReplayEdit {
            uri: Some("http://elsewhere.test/".into()),
            ..Default::default()
        };
        assert!(apply_edit(&mut captured(), absolute).is_err());
    }

    #[test]
    fn an_upgrade_keeps_upgrade_and_says_connection_upgrade() {
        let mut map = headers(&[
            ("connection", "Upgrade, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
            ("keep-alive", "1"),
        ]);
        strip_hop_by_hop(&mut map, true);
        assert_eq!(map["connection"], "upgrade");
        assert_eq!(map["upgrade"], "websocket");
        assert!(!map.contains_key("x-hop") && !map.contains_key("keep-alive"));
    }
}

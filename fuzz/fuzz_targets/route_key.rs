//! The route key of an HTTP request (`warren::http::route`): a request parsed from
//! arbitrary bytes with httparse (the first byte picks HTTP/1.0, 1.1 or 2) never panics
//! `route_key`, and an accepted key keeps the rules that close CVE-2026-40910's class:
//! two Host headers are always refused; the host is the one the target's authority names,
//! else the Host header's, and both name the same host when both exist; the host is in
//! normal form; the path is normalized (stable, no dot segments, no `%2F`). The raw path
//! also goes through `normalize_path`, `path_matches` and `strip_prefix` directly.
#![no_main]

use std::sync::LazyLock;

use http::{HeaderName, HeaderValue, Request, Uri, Version, header::HOST};
use libfuzzer_sys::fuzz_target;
use warren::http::route::{
    self, HostPattern, RouteKey, RouteSpec, RouteTable, normalize_path, path_matches, route_key,
    strip_prefix,
};

const PREFIXES: [&str; 5] = ["/", "/api", "/api/v1", "/a", "/%C3%A9"];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, wire)) = data.split_first() else {
        return;
    };
    if let Some(request) = parse(mode, wire) {
        check_request(&request);
    }
    if let Ok(raw) = std::str::from_utf8(wire) {
        check_path(raw);
    }
});

/// An `http::Request` from HTTP/1 bytes, as hyper would hand it over (or `None` where
/// hyper would refuse it first).
fn parse(mode: u8, wire: &[u8]) -> Option<Request<()>> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut parsed = httparse::Request::new(&mut headers);
    // A partial parse is fine: the request line and headers so far are still a request.
    let _ = parsed.parse(wire).ok()?;
    let version = match mode % 3 {
        0 => Version::HTTP_10,
        1 => Version::HTTP_11,
        _ => Version::HTTP_2,
    };
    let mut builder = Request::builder()
        .version(version)
        .method(parsed.method?)
        .uri(Uri::try_from(parsed.path?).ok()?);
    for header in parsed
        .headers
        .iter()
        .take_while(|header| !header.name.is_empty())
    {
        builder = builder.header(
            HeaderName::from_bytes(header.name.as_bytes()).ok()?,
            HeaderValue::from_bytes(header.value).ok()?,
        );
    }
    builder.body(()).ok()
}

fn check_request(request: &Request<()>) {
    let hosts = request.headers().get_all(HOST).iter().count();
    let Ok(key) = route_key(request) else {
        return;
    };
    assert!(hosts <= 1, "{hosts} Host headers accepted: {request:?}");
    check_key(&key);

    // The Host header alone, and the target's authority alone, name the same host.
    if let Some(host) = request.headers().get(HOST) {
        let alone = Request::builder()
            .uri("/")
            .header(HOST, host.clone())
            .body(())
            .expect("a request with one header");
        let from_header = route_key(&alone).expect("the Host header was accepted once");
        assert_eq!(from_header.host, key.host, "{request:?}");
    }
    if let Some(authority) = request.uri().authority() {
        let alone = Request::builder()
            .version(Version::HTTP_2)
            .uri(format!("http://{authority}/"))
            .body(())
            .expect("a request with this authority");
        let from_target = route_key(&alone).expect("the authority was accepted once");
        assert_eq!(from_target.host, key.host, "{request:?}");
    }

    // Whatever the table answers, the chosen route covers the key's path and host.
    if let Some(found) = TABLE.lookup(&key.host, &key.path) {
        assert!(path_matches(found.prefix, &key.path));
        assert!(TABLE.serves_host(&key.host));
    }
}

fn check_key(key: &RouteKey) {
    assert_eq!(
        HostPattern::parse(&key.host),
        Ok(HostPattern::Exact(key.host.clone())),
        "the host is in normal form"
    );
    assert_eq!(normalize_path(&key.path).as_ref(), Ok(&key.path));
    check_normalized(&key.path);
}

fn check_path(raw: &str) {
    let Ok(path) = normalize_path(raw) else {
        return;
    };
    check_normalized(&path);
    assert_eq!(normalize_path(&path).as_ref(), Ok(&path), "{raw:?}");
    for prefix in PREFIXES {
        let stripped = strip_prefix(prefix, &path);
        assert!(stripped.starts_with('/'));
        if path_matches(prefix, &path) {
            // Putting the prefix back gives the path (up to the slash a bare prefix gains).
            let back = if prefix == "/" {
                stripped.clone()
            } else {
                format!("{prefix}{stripped}")
            };
            assert!(
                back == path || back == format!("{path}/"),
                "{prefix} {path}"
            );
        } else {
            assert_eq!(stripped, path);
        }
    }
}

fn check_normalized(path: &str) {
    assert!(path.starts_with('/'), "{path:?}");
    for bad in [
        "/../", "/./", "//", "%2F", "%2f", "%5C", "%5c", "\\", "?", "#",
    ] {
        assert!(!path.contains(bad), "{path:?} contains {bad}");
    }
    assert!(!path.ends_with("/..") && !path.ends_with("/."), "{path:?}");
    assert!(path.bytes().all(|byte| byte.is_ascii_graphic()), "{path:?}");
}

static TABLE: LazyLock<RouteTable> = LazyLock::new(table);

fn table() -> RouteTable {
    let spec = |service: &str, host: &str, paths: &[&str]| RouteSpec {
        service: service.into(),
        hosts: vec![HostPattern::parse(host).expect("pattern")],
        paths: paths
            .iter()
            .map(|path| route::parse_prefix(path).expect("prefix"))
            .collect(),
    };
    RouteTable::build(vec![
        spec("a", "a.example.com", &["/"]),
        spec("b", "a.example.com", &["/api"]),
        spec("c", "*.example.com", &["/api/v1"]),
        spec("d", "[::1]", &[]),
    ])
    .expect("no conflict")
}

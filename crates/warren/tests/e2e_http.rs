//! End to end, HTTP services (issue 15): the real `warren` binary between curl and nginx.
//! nginx serves random files over plain HTTP (and over its own TLS for passthrough); curl
//! fetches them by host name through Warren's HTTP ports with `--resolve`, over HTTP/1.1,
//! h2c and TLS (h2 by ALPN) with a development CA made by `warren cert`. Bodies are checked
//! by BLAKE3 hash.
//!
//! Needs `nginx` and `curl` on PATH; skipped without them unless
//! `WARREN_E2E_REQUIRE_TOOLS=1` (as `scripts/test.sh` sets), which makes a missing tool fail.

mod e2e_support;
#[path = "support/http_backends.rs"]
mod http_backends;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e_support::*;

const MIB: usize = 1024 * 1024;

fn tools_present(test: &str) -> bool {
    let missing: Vec<&str> = ["nginx", "curl"]
        .into_iter()
        .filter(|tool| {
            !std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths)
                    .chain([PathBuf::from("/usr/sbin")])
                    .any(|dir| dir.join(tool).is_file())
            })
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("WARREN_E2E_REQUIRE_TOOLS").as_deref() == Ok("1") {
        panic!(
            "{missing:?} not on PATH but WARREN_E2E_REQUIRE_TOOLS=1: apt-get install nginx curl"
        );
    }
    eprintln!("SKIPPED {test}: {missing:?} not on PATH (apt-get install nginx curl)");
    false
}

/// nginx serving `www/` on `plain` (HTTP) and `tls` (HTTPS with `cert`/`key`), in the
/// foreground, everything under the test dir.
fn start_nginx(dir: &TestDir, plain: u16, tls: u16, cert: &Path, key: &Path) -> Proc {
    let root = dir.path().display();
    spawn_nginx(
        dir,
        &format!(
            "  server {{ listen 127.0.0.1:{plain}; root {root}/www; }}\n  server {{ listen 127.0.0.1:{tls} ssl; ssl_certificate {cert}; ssl_certificate_key {key}; root {root}/www; }}",
            cert = cert.display(),
            key = key.display(),
        ),
    )
}

/// A random file of `len` bytes under `www/`; returns its hash.
fn www_file(dir: &TestDir, name: &str, len: usize) -> blake3::Hash {
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let bytes = random_bytes(len);
    std::fs::write(www.join(name), &bytes).unwrap();
    blake3::hash(&bytes)
}

/// Runs curl with `args` (plus `-sS --max-time 30`); returns (exit code, stdout bytes,
/// stderr).
fn curl(args: &[&str]) -> (i32, Vec<u8>, String) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "30"])
        .args(args)
        .output()
        .expect("run curl");
    (
        output.status.code().unwrap_or(-1),
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `warren cert ca` + `warren cert server --name NAME`: returns (ca.pem, server.pem,
/// server.key).
async fn dev_certificate(dir: &TestDir, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca = dir.path().join("ca");
    if !ca.join("ca.pem").exists() {
        let (code, _, err) =
            Proc::warren_output(dir, "cert-ca", &["cert", "ca", "--out", "ca"], &[]).await;
        assert_eq!(code, 0, "{err}");
    }
    let out = format!("cert-{name}");
    let (code, _, err) = Proc::warren_output(
        dir,
        "cert-server",
        &[
            "cert", "server", "--ca", "ca", "--name", name, "--out", &out, "--force",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let out = dir.path().join(out);
    (
        ca.join("ca.pem"),
        out.join("server.pem"),
        out.join("server.key"),
    )
}

fn server_config(server: u16, http: u16, https: u16, services: &str) -> String {
    format!(
        "[server]\nbind = \"127.0.0.1:{server}\"\npsk = \"${{WARREN_PSK}}\"\ndefault_token = \"{TOKEN}\"\n[server.http]\nbind = \"127.0.0.1:{http}\"\ntls_bind = \"127.0.0.1:{https}\"\n{services}"
    )
}

fn client_config(server: u16, services: &[(&str, u16)]) -> String {
    let mut text = format!(
        "[client]\nserver = \"127.0.0.1:{server}\"\npsk = \"${{WARREN_PSK}}\"\ndefault_token = \"{TOKEN}\"\n"
    );
    for (name, port) in services {
        text.push_str(&format!(
            "[client.services.{name}]\ntype = \"http\"\ntarget = \"127.0.0.1:{port}\"\n"
        ));
    }
    text
}

/// Polls `url` (with curl `extra` args) until it answers 200, for at most 10 s.
async fn wait_200(extra: &[&str], url: &str) {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        let mut args = extra.to_vec();
        args.extend(["-o", "/dev/null", "-w", "%{http_code}", url]);
        let (_, out, _) = curl(&args);
        if out == b"200" {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url} did not answer 200 within {READY_TIMEOUT:?} (last: {})",
            String::from_utf8_lossy(&out)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_nginx_by_host_over_http1_h2c_tls_and_passthrough() {
    if !tools_present("curl_reaches_nginx_by_host_over_http1_h2c_tls_and_passthrough") {
        return;
    }
    let dir = TestDir::new("http");
    let (ca, app_cert, app_key) = dev_certificate(&dir, "app.test").await;
    let (_, pass_cert, pass_key) = dev_certificate(&dir, "pass.test").await;
    let big = www_file(&dir, "big.bin", 8 * MIB + 3);
    let small = www_file(&dir, "small.bin", 1024);
    let (nginx_plain, nginx_tls) = (free_port(), free_port());
    let _nginx = start_nginx(&dir, nginx_plain, nginx_tls, &pass_cert, &pass_key);
    let (server_port, http, https) = (free_port(), free_port(), free_port());
    let services = format!(
        "[server.services.app]\ntype = \"http\"\nhosts = [\"app.test\"]\ntls = \"terminate\"\ncert = \"{}\"\nkey = \"{}\"\n[server.services.pass]\ntype = \"http\"\nhosts = [\"pass.test\"]\ntls = \"passthrough\"\n",
        app_cert.display(),
        app_key.display()
    );
    let server_toml = dir.write(
        "server.toml",
        &server_config(server_port, http, https, &services),
    );
    let client_toml = dir.write(
        "client.toml",
        &client_config(server_port, &[("app", nginx_plain), ("pass", nginx_tls)]),
    );
    let _server = Proc::warren(
        &dir,
        "server",
        &["server", server_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let _client = Proc::warren(
        &dir,
        "client",
        &["client", client_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );

    let resolve_http = format!("app.test:{http}:127.0.0.1");
    let url = format!("http://app.test:{http}/big.bin");
    wait_200(&["--resolve", &resolve_http], &url).await;

    // HTTP/1.1 and h2c (prior knowledge), the bytes exactly.
    for version in ["--http1.1", "--http2-prior-knowledge"] {
        let (code, body, err) = curl(&["--resolve", &resolve_http, version, &url]);
        assert_eq!(code, 0, "{version}: {err}");
        assert_eq!(blake3::hash(&body), big, "{version}: the body differs");
    }
    let (_, out, _) = curl(&[
        "--resolve",
        &resolve_http,
        "--http2-prior-knowledge",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        &format!("http://app.test:{http}/small.bin"),
    ]);
    assert_eq!(out, b"2", "h2c was not used");

    // TLS terminated by Warren with the dev CA's certificate; h2 by ALPN.
    let resolve_https = format!("app.test:{https}:127.0.0.1");
    let tls_url = format!("https://app.test:{https}/big.bin");
    let (code, body, err) = curl(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve_https,
        "--http2",
        &tls_url,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(blake3::hash(&body), big);
    let (_, out, _) = curl(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve_https,
        "--http2",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        &format!("https://app.test:{https}/small.bin"),
    ]);
    assert_eq!(out, b"2", "h2 over TLS was not negotiated");

    // Passed through: curl checks nginx's own certificate (pass.test), which Warren never
    // holds the key of.
    let resolve_pass = format!("pass.test:{https}:127.0.0.1");
    let (code, body, err) = curl(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve_pass,
        &format!("https://pass.test:{https}/small.bin"),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(blake3::hash(&body), small);

    // An unknown name over TLS: refused during the handshake.
    let resolve_nope = format!("nope.test:{https}:127.0.0.1");
    let (code, _, err) = curl(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve_nope,
        &format!("https://nope.test:{https}/"),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.to_lowercase().contains("unrecognized name") || err.contains("alert"),
        "{err}"
    );
    // An unknown host over plain HTTP: Warren's 404 page names it.
    let (_, body, _) = curl(&[
        "--resolve",
        &format!("nope.test:{http}:127.0.0.1"),
        &format!("http://nope.test:{http}/"),
    ]);
    assert!(String::from_utf8_lossy(&body).contains("nope.test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_routes_and_certificates_without_failing_a_download_in_flight() {
    if !tools_present(
        "a_reload_changes_routes_and_certificates_without_failing_a_download_in_flight",
    ) {
        return;
    }
    let dir = TestDir::new("http-reload");
    let (ca, cert, key) = dev_certificate(&dir, "app.test").await;
    let big = www_file(&dir, "big.bin", 6 * MIB);
    let (nginx_plain, nginx_tls) = (free_port(), free_port());
    let _nginx = start_nginx(&dir, nginx_plain, nginx_tls, &cert, &key);
    let (server_port, http, https) = (free_port(), free_port(), free_port());
    let services = |hosts: &str, cert: &Path, key: &Path| {
        format!(
            "[server.services.app]\ntype = \"http\"\nhosts = [{hosts}]\ntls = \"terminate\"\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        )
    };
    let server_toml = dir.write(
        "server.toml",
        &server_config(
            server_port,
            http,
            https,
            &services("\"app.test\"", &cert, &key),
        ),
    );
    let client_toml = dir.write(
        "client.toml",
        &client_config(server_port, &[("app", nginx_plain)]),
    );
    let mut server = Proc::warren(
        &dir,
        "server",
        &["server", server_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let _client = Proc::warren(
        &dir,
        "client",
        &["client", client_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let resolve = format!("app.test:{https}:127.0.0.1");
    let url = format!("https://app.test:{https}/big.bin");
    let ca_arg = ca.to_str().unwrap().to_owned();
    wait_200(&["--cacert", &ca_arg, "--resolve", &resolve], &url).await;

    // A slow download (about 3 s) across the reload.
    let download = {
        let (ca_arg, resolve, url) = (ca_arg.clone(), resolve.clone(), url.clone());
        tokio::task::spawn_blocking(move || {
            curl(&[
                "--cacert",
                &ca_arg,
                "--resolve",
                &resolve,
                "--limit-rate",
                "2M",
                &url,
            ])
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A new certificate (another CA: the old one must no longer verify) and a new host.
    let other = TestDir::new("http-reload-ca");
    let (new_ca, new_cert, new_key) = dev_certificate(&other, "app.test").await;
    let text = server_config(
        server_port,
        http,
        https,
        &services("\"app.test\", \"new.test\"", &new_cert, &new_key),
    );
    let aside = server_toml.with_extension("toml.new");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, &server_toml).unwrap();
    assert!(
        server
            .stderr_contains_within("config_reloaded", Duration::from_secs(10))
            .await,
        "the server did not reload:\n{}",
        server.logs()
    );
    let (code, body, err) = download.await.unwrap();
    assert_eq!(code, 0, "the download in flight failed: {err}");
    assert_eq!(
        blake3::hash(&body),
        big,
        "the download in flight was damaged"
    );

    // The new route and the new certificate are in force.
    let (code, _, err) = curl(&[
        "--cacert",
        new_ca.to_str().unwrap(),
        "--resolve",
        &format!("new.test:{https}:127.0.0.1"),
        "--resolve",
        &resolve,
        "-o",
        "/dev/null",
        &url,
    ]);
    assert_eq!(code, 0, "the new certificate is not served: {err}");
    let (code, out, _) = curl(&[
        "--resolve",
        &format!("new.test:{http}:127.0.0.1"),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://new.test:{http}/big.bin"),
    ]);
    assert_eq!(
        (code, &out[..]),
        (0, &b"200"[..]),
        "the new host is not routed"
    );
    let (code, _, _) = curl(&[
        "--cacert",
        &ca_arg,
        "--resolve",
        &resolve,
        "-o",
        "/dev/null",
        &url,
    ]);
    assert_ne!(code, 0, "the old certificate is still served");

    // Certificate files renewed in place (no reload): served within a few seconds.
    let third = TestDir::new("http-renew-ca");
    let (renewed_ca, renewed_cert, renewed_key) = dev_certificate(&third, "app.test").await;
    std::fs::copy(&renewed_key, &new_key).unwrap();
    std::fs::copy(&renewed_cert, &new_cert).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _, err) = curl(&[
            "--cacert",
            renewed_ca.to_str().unwrap(),
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
            &url,
        ]);
        if code == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "renewed certificate files were not picked up: {err}\n{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_http_publishes_a_local_server_at_a_subdomain_and_prints_the_url() {
    if !tools_present("warren_http_publishes_a_local_server_at_a_subdomain_and_prints_the_url") {
        return;
    }
    let dir = TestDir::new("http-oneliner");
    let (_, cert, key) = dev_certificate(&dir, "unused.test").await;
    let small = www_file(&dir, "index.bin", 4096);
    let (nginx_plain, nginx_tls) = (free_port(), free_port());
    let _nginx = start_nginx(&dir, nginx_plain, nginx_tls, &cert, &key);
    let (server_port, http, https) = (free_port(), free_port(), free_port());
    let server_toml = dir.write(
        "server.toml",
        &server_config(server_port, http, https, "").replace(
            "[server.http]\n",
            "[server.http]\nsubdomain_host = \"tunnel.test\"\n",
        ),
    );
    let mut server = Proc::warren(
        &dir,
        "server",
        &["server", server_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    // The one-liner backs off between connection attempts (1, 2, 4, 5, 15 s): start it
    // once the server listens, so a server slow to start on a loaded machine cannot use
    // up its 15 s, and a server that failed says why.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while tokio::net::TcpStream::connect(loopback(server_port))
        .await
        .is_err()
    {
        assert!(
            server.is_running() && tokio::time::Instant::now() < deadline,
            "the server did not start listening on {server_port}\n{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut oneliner = Proc::warren(
        &dir,
        "http",
        &[
            "http",
            &nginx_plain.to_string(),
            "--to",
            &format!("127.0.0.1:{server_port}"),
            "--subdomain",
            "app",
        ],
        &[("WARREN_PSK", PSK), ("WARREN_TOKEN", TOKEN)],
    );
    let out = oneliner
        .wait_stdout("Forwarding", Duration::from_secs(15))
        .await;
    let url = format!("http://app.tunnel.test:{http}/");
    assert!(
        out.contains(&format!(
            "Forwarding {url} -> http://127.0.0.1:{nginx_plain}"
        )),
        "{out}"
    );
    let resolve = format!("app.tunnel.test:{http}:127.0.0.1");
    let (code, body, err) = curl(&["--resolve", &resolve, &format!("{url}index.bin")]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(blake3::hash(&body), small);
    // Gone with the one-liner.
    oneliner.terminate();
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        let (_, out, _) = curl(&[
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ]);
        if out == b"404" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still routed after the one-liner stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every built-in middleware, with the release binary, nginx behind and curl in front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_built_in_middleware_does_its_job_with_curl() {
    if !tools_present("each_built_in_middleware_does_its_job_with_curl") {
        return;
    }
    let dir = TestDir::new("http-middleware");
    let (_, cert, key) = dev_certificate(&dir, "unused.test").await;
    let small = www_file(&dir, "small.bin", 2048);
    let (nginx_plain, nginx_tls) = (free_port(), free_port());
    let _nginx = start_nginx(&dir, nginx_plain, nginx_tls, &cert, &key);
    // A backend that accepts connections and never answers (for `timeout`).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let hash = bcrypt::hash("pw", 4).unwrap();
    let log = dir.path().join("access.log");
    let service = |name: &str, chain: &str| {
        format!("[server.services.{name}]\ntype = \"http\"\nhosts = [\"{name}.test\"]\n{chain}")
    };
    let mw = |body: &str| format!("[[server.services.SERVICE.middleware]]\n{body}\n");
    let with =
        |name: &str, chains: &[String]| service(name, &chains.concat().replace("SERVICE", name));
    let services = [
        with("allow", &[mw("type = \"ip_allow\"\ncidrs = [\"127.0.0.0/8\"]")]),
        with("deny", &[mw("type = \"ip_deny\"\ncidrs = [\"127.0.0.0/8\"]")]),
        with("basic", &[mw(&format!("type = \"basic_auth\"\nrealm = \"staff\"\nusers = {{ alice = \"{hash}\" }}"))]),
        with("bearer", &[mw("type = \"bearer_auth\"\ntokens = [\"a-very-long-bearer-token-0123\"]")]),
        with("limited", &[mw("type = \"rate_limit\"\nrate = \"1/m\"\nburst = 2")]),
        with("headers", &[mw("type = \"headers\"\nresponse = { set = { \"X-Served-By\" = \"warren-test\" }, remove = [\"Server\"] }")]),
        with("logged", &[mw(&format!("type = \"access_log\"\nformat = \"json\"\nfile = \"{}\"", log.display()))]),
        with("secure", &[mw("type = \"redirect_https\"")]),
        with("small", &[mw("type = \"max_body\"\nlimit = 1000")]),
        with("slow", &[mw("type = \"timeout\"\nduration = \"1s\"")]),
    ]
    .concat();
    let (server_port, http, https) = (free_port(), free_port(), free_port());
    let server_toml = dir.write(
        "server.toml",
        &server_config(server_port, http, https, &services),
    );
    let names = [
        "allow", "deny", "basic", "bearer", "limited", "headers", "logged", "secure", "small",
    ];
    let mut targets: Vec<(&str, u16)> = names.iter().map(|n| (*n, nginx_plain)).collect();
    targets.push(("slow", silent_port));
    let client_toml = dir.write("client.toml", &client_config(server_port, &targets));
    let _server = Proc::warren(
        &dir,
        "server",
        &["server", server_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let _client = Proc::warren(
        &dir,
        "client",
        &["client", client_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let at = |name: &str| {
        (
            format!("{name}.test:{http}:127.0.0.1"),
            format!("http://{name}.test:{http}/small.bin"),
        )
    };
    let status = |name: &str, extra: &[&str]| {
        let (resolve, url) = at(name);
        let mut args = vec![
            "--resolve",
            resolve.as_str(),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ];
        args.extend_from_slice(extra);
        args.push(url.as_str());
        let (_, out, _) = curl(&args);
        String::from_utf8_lossy(&out).into_owned()
    };
    let (resolve, url) = at("allow");
    wait_200(&["--resolve", &resolve], &url).await;

    assert_eq!(status("allow", &[]), "200", "ip_allow lets loopback in");
    assert_eq!(status("deny", &[]), "403", "ip_deny keeps loopback out");
    assert_eq!(status("basic", &[]), "401");
    assert_eq!(status("basic", &["-u", "alice:wrong"]), "401");
    assert_eq!(status("basic", &["-u", "alice:pw"]), "200");
    assert_eq!(status("bearer", &[]), "401");
    assert_eq!(
        status(
            "bearer",
            &["-H", "Authorization: Bearer a-very-long-bearer-token-0123"]
        ),
        "200"
    );
    assert_eq!(status("limited", &[]), "200");
    assert_eq!(status("limited", &[]), "200");
    let (resolve, url) = at("limited");
    let (_, headers, _) = curl(&[
        "--resolve",
        &resolve,
        "-s",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &url,
    ]);
    let headers = String::from_utf8_lossy(&headers).to_lowercase();
    assert!(
        headers.starts_with("http/1.1 429") && headers.contains("retry-after:"),
        "{headers}"
    );
    let (resolve, url) = at("headers");
    let (code, headers, _) = curl(&["--resolve", &resolve, "-D", "-", "-o", "/dev/null", &url]);
    let headers = String::from_utf8_lossy(&headers).to_lowercase();
    assert_eq!(code, 0);
    assert!(
        headers.contains("x-served-by: warren-test") && !headers.contains("server: nginx"),
        "{headers}"
    );
    let (resolve, url) = at("logged");
    let (code, body, _) = curl(&["--resolve", &resolve, &url]);
    assert_eq!((code, blake3::hash(&body)), (0, small));
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("/small.bin") && text.contains("200") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no access log line: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (resolve, url) = at("secure");
    let (_, headers, _) = curl(&["--resolve", &resolve, "-D", "-", "-o", "/dev/null", &url]);
    let headers = String::from_utf8_lossy(&headers).to_lowercase();
    assert!(
        headers.starts_with("http/1.1 308")
            && headers.contains("location: https://secure.test/small.bin"),
        "{headers}"
    );
    let big = dir.write("big-upload.bin", &"x".repeat(5000));
    let big_arg = format!("@{}", big.display());
    assert_eq!(status("small", &["--data-binary", &big_arg]), "413");
    assert_eq!(
        status("small", &["--data-binary", "tiny"]),
        "405",
        "nginx refuses a POST to a static file, after max_body let it through"
    );
    assert_eq!(status("slow", &[]), "504");
    drop(silent);
}

/// A WebSocket echo and an h2c (gRPC-like) backend with trailers, through the release
/// binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_and_h2c_with_trailers_pass_through_the_binary() {
    use futures_util::{SinkExt, StreamExt};
    use http_body_util::{BodyExt, Full};
    use tokio_tungstenite::tungstenite::Message;
    let dir = TestDir::new("http-ws-h2c");
    let echo = http_backends::websocket_echo().await;
    let grpc = http_backends::h2c_backend().await;
    let (server_port, http, https) = (free_port(), free_port(), free_port());
    let services = "[server.services.ws]\ntype = \"http\"\nhosts = [\"ws.test\"]\n[server.services.grpc]\ntype = \"http\"\nhosts = [\"grpc.test\"]\nbackend = \"h2c\"\n";
    let server_toml = dir.write(
        "server.toml",
        &server_config(server_port, http, https, services),
    );
    let client_toml = dir.write(
        "client.toml",
        &client_config(server_port, &[("ws", echo.port()), ("grpc", grpc.port())]),
    );
    let _server = Proc::warren(
        &dir,
        "server",
        &["server", server_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let _client = Proc::warren(
        &dir,
        "client",
        &["client", client_toml.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let port = loopback(http);
    // The port listens and the handshake passes (not 502) once the client's session is up.
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let mut ws = loop {
        let attempt = async {
            let stream = tokio::net::TcpStream::connect(port)
                .await
                .map_err(|e| e.to_string())?;
            tokio_tungstenite::client_async("ws://ws.test/chat", stream)
                .await
                .map_err(|e| e.to_string())
        };
        match attempt.await {
            Ok((ws, response)) => {
                assert_eq!(response.status(), 101);
                break ws;
            }
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no WebSocket: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    for size in [1, 100_000] {
        let payload = random_bytes(size);
        ws.send(Message::binary(payload.clone())).await.unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an echo")
            .expect("a message")
            .unwrap();
        assert_eq!(blake3::hash(&echoed.into_data()), blake3::hash(&payload));
    }
    ws.close(None).await.unwrap();

    let stream = tokio::net::TcpStream::connect(port).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .uri("http://grpc.test/pkg.Service/Call")
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .expect("h2c through the binary");
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers came back");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(collected.to_bytes(), "HTTP/2.0 /pkg.Service/Call");
}

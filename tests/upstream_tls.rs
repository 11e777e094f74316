//! `https://` upstreams: taskgate's own HTTP/1.1 client over TLS (rustls), the server's
//! certificate chain and host name verified against `upstream.ca_file` or the Mozilla roots.
//!
//! The upstream is a scripted task server behind a TLS front ([`TlsFront`], on 127.0.0.1, with
//! the test-only certificates of `tests/fixtures/tls`), so every path the plain tests cover
//! (JSON answers, SSE answers read by taskgate's chunked reader, pooled connections) is shown
//! again through TLS.

use crate::common::*;

use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use taskgate::mcp::task::TaskStatus;
use tokio::net::{TcpListener, TcpStream};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A TLS server on 127.0.0.1 (or `bind`) in front of a plain test upstream: it terminates TLS with the
/// fixture certificate `cert` (`local`: localhost, 127.0.0.1 and ::1; `other`: example.test only)
/// and passes the bytes both ways. Counts the TLS connections it completed.
struct TlsFront {
    addr: SocketAddr,
    path: String,
    handshakes: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl TlsFront {
    async fn start(upstream_url: &str, cert: &str) -> TlsFront {
        TlsFront::start_on("127.0.0.1:0", upstream_url, cert).await
    }

    /// The front listening on `bind` (`[::1]:0`: IPv6).
    async fn start_on(bind: &str, upstream_url: &str, cert: &str) -> TlsFront {
        TlsFront::start_with(bind, upstream_url, cert, false).await
    }

    /// The front requiring a client certificate the test CA signed (mTLS).
    async fn start_mtls(upstream_url: &str) -> TlsFront {
        TlsFront::start_with("127.0.0.1:0", upstream_url, "local", true).await
    }

    async fn start_with(bind: &str, upstream_url: &str, cert: &str, client_auth: bool) -> TlsFront {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(fixture(&format!("{cert}.pem")))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(fixture(&format!("{cert}.key"))).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_file_iter(fixture("ca.pem")).unwrap() {
                roots.add(ca.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(certs, key).unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let plain: http::Uri = upstream_url.parse().unwrap();
        let behind = format!("{}:{}", plain.host().unwrap(), plain.port_u16().unwrap());
        let listener = TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counted = handshakes.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, behind, counted) =
                    (acceptor.clone(), behind.clone(), counted.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut up) = TcpStream::connect(&behind).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
        TlsFront {
            addr,
            path: plain.path().to_string(),
            handshakes,
            accept,
        }
    }

    /// `https://<host>:<port><path>`.
    fn url(&self, host: &str) -> String {
        format!("https://{host}:{}{}", self.addr.port(), self.path)
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

/// taskgate with one upstream at `url`, trusting `ca_file` (a fixture name) when given; one
/// serving thread, so its pooled connections are one idle list (the pool keeps one per thread).
async fn taskgate(url: &str, ca_file: Option<&str>) -> Tg {
    let cfg = TgConfig::new(url).gateway("threads = 1");
    let extra = ca_file
        .map(|f| format!("ca_file = {:?}\n", fixture(f)))
        .unwrap_or_default();
    Tg::start(|store| cfg.to_toml(store) + &extra).await
}

/// A 2025-11-25 task's whole life (create, poll, result) through an `https://` upstream whose
/// certificate chains to `ca_file`: recorded, answered, and every request on one pooled TLS
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_lifecycle_runs_over_tls_on_one_pooled_connection() {
    let up = TaskServer::default().await;
    let front = TlsFront::start(&up.url(), "local").await;
    let tg = taskgate(&front.url("127.0.0.1"), Some("ca.pem")).await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("1").await;
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Working);
    let got = c.get("2", &t).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    up.set(&t, "completed");
    let got = c.get("3", &t).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
    let res = c.result("4", &t).await;
    assert!(res.get("result").is_some(), "{res}");
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Completed);
    assert_eq!(up.count("tools/call"), 1);
    assert_eq!(up.count("tasks/get"), 2);
    // One client at a time: each exchange found the last one's connection idle.
    assert_eq!(front.handshakes(), 1, "connections were not reused");
}

/// SSE answers (a `CreateTaskResult` inside an event stream), read by taskgate's own chunked
/// body reader over TLS: relayed, recorded, and the connection pooled again after each stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answers_come_through_tls_and_their_connection_is_reused() {
    let up = TaskServer::start(Behaviour {
        creation_sse: true,
        ..Behaviour::default()
    })
    .await;
    let front = TlsFront::start(&up.url(), "local").await;
    let tg = taskgate(&front.url("localhost"), Some("ca.pem")).await;
    let mut c = tg.client();
    c.initialize().await;
    for id in 1..=3 {
        let t = c.create_task(&id.to_string()).await;
        assert!(tg.record(&t).is_some(), "task {t} recorded");
    }
    assert_eq!(up.count("tools/call"), 3);
    assert_eq!(front.handshakes(), 1, "connections were not reused");
}

/// The JSON-RPC error a refused upstream connection gives the client: `-32603` naming the
/// `taskgate_upstream_errors_total{upstream="default",kind="connect"}` is `count`.
async fn assert_connect_errors(tg: &Tg, count: f64) {
    let m = tg.metrics_text().await;
    let kind = [("upstream", "default"), ("kind", "connect")];
    assert_eq!(
        metric(&m, "taskgate_upstream_errors_total", &kind),
        count,
        "{m}"
    );
}

/// upstream and why, under HTTP 502; nothing reached the upstream.
async fn refused(tg: &Tg) -> (u16, Value) {
    let resp = Req::mcp_post(&tg.mcp_url(), initialize_body("1"))
        .send()
        .await;
    let status = resp.status();
    (status, resp.json().await)
}

/// A certificate that chains to no trusted root (no `ca_file`: the Mozilla roots) is refused
/// before any byte of a request is sent, and the client is told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused_and_named() {
    let up = TaskServer::default().await;
    let front = TlsFront::start(&up.url(), "local").await;
    let tg = taskgate(&front.url("127.0.0.1"), None).await;
    let (status, v) = refused(&tg).await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], -32603, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("unreachable") && message.contains("UnknownIssuer"),
        "{v}"
    );
    assert_eq!(up.count("initialize"), 0);
    assert_connect_errors(&tg, 1.0).await;
}

/// A certificate of a trusted CA that does not name the URL's host is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused() {
    let up = TaskServer::default().await;
    let front = TlsFront::start(&up.url(), "other").await;
    let tg = taskgate(&front.url("127.0.0.1"), Some("ca.pem")).await;
    let (status, v) = refused(&tg).await;
    assert_eq!(status, 502, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("not valid for name"), "{v}");
    assert_eq!(up.count("initialize"), 0);
}

/// A server that does not speak TLS at an `https://` URL: the handshake fails at once with an
/// error, it does not wait for the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_server_at_an_https_url_fails_fast() {
    let up = TaskServer::default().await;
    let url = up.url().replacen("http://", "https://", 1);
    let tg = taskgate(&url, Some("ca.pem")).await;
    let started = std::time::Instant::now();
    let (status, v) = refused(&tg).await;
    assert_eq!(status, 502, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("TLS with 127.0.0.1"),
        "{v}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}

/// An upstream at an IPv6 literal, `https://[::1]:port/mcp` (the certificate lists the IP
/// address ::1): POST, the standalone GET stream and DELETE go through TLS, each with the URL's
/// authority as `Host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_literal_upstream_gets_post_get_and_delete_over_tls() {
    let up = Upstream::start(|req| match req.method.as_str() {
        "GET" => ScriptedResponse::sse(vec![
            SseStep::Raw(ev().data(&server_note(1)).wire()),
            SseStep::HoldOpen,
        ]),
        _ => mcp_handler(req),
    })
    .await;
    let front = TlsFront::start_on("[::1]:0", &up.url(), "local").await;
    let url = front.url("[::1]");
    let tg = taskgate(&url, Some("ca.pem")).await;
    let mut c = tg.client();
    c.initialize().await;
    let v = c.rpc(rpc("2", "tools/list", "{}")).await;
    assert_eq!(v["result"]["echo"], "tools/list", "{v}");
    let mut events = c.get_stream().await;
    let note = events.next_event(STEP).await.json();
    assert_eq!(note["params"]["data"], "note 1", "{note}");
    drop(events);
    let deleted = Req::delete(&tg.mcp_url())
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(deleted.status(), 200);
    let authority = format!("[::1]:{}", front.addr.port());
    let methods: Vec<_> = up.requests().iter().map(|r| r.method.clone()).collect();
    assert!(
        methods.contains(&"GET".to_string()) && methods.contains(&"DELETE".to_string()),
        "{methods:?}"
    );
    for r in up.requests() {
        assert_eq!(
            r.header("host").as_deref(),
            Some(authority.as_str()),
            "{} {}",
            r.method,
            r.path
        );
    }
}

/// Writes taskgate's config for the binary into `dir`: one upstream at `url` with the extra
/// `[[upstream]]` lines `lines`; returns its path.
fn binary_config(dir: &std::path::Path, url: &str, lines: &str) -> String {
    let cfg = TgConfig::new(url).gateway("threads = 1");
    let path = cfg.write_for_binary(dir);
    let mut toml = std::fs::read_to_string(&path).unwrap();
    toml.push_str(lines);
    std::fs::write(&path, toml).unwrap();
    path
}

/// `ca_roots = "system"` trusts the platform's store, which honours `SSL_CERT_FILE`: the
/// binary, started with it pointing at the test CA (only the child's environment is set),
/// reaches an upstream whose certificate that CA signed; the same upstream with the Mozilla
/// roots is refused (`an_untrusted_certificate_is_refused_and_named`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_roots_system_trusts_the_ssl_cert_file() {
    let up = TaskServer::default().await;
    let front = TlsFront::start(&up.url(), "local").await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = binary_config(
        dir.path(),
        &front.url("localhost"),
        "ca_roots = \"system\"\n",
    );
    let ca = fixture("ca.pem");
    let (mut p, gw) = tokio::task::block_in_place(|| {
        let mut p = TaskgateProcess::spawn(
            &["serve", "--config", &cfg],
            // Only the file: this machine's SSL_CERT_DIR (if any) would add its own CAs.
            &[("SSL_CERT_FILE", ca.as_str()), ("SSL_CERT_DIR", "")],
        );
        let (gw, _) = p.listening();
        (p, gw)
    });
    let mut c = Client::new(&format!("http://{gw}/mcp"));
    c.initialize().await;
    let t = c.create_task("2").await;
    assert!(!t.is_empty());
    assert_eq!(up.count("tools/call"), 1);
    assert_eq!(front.handshakes(), 1);
    let _ = p.stderr();
}

/// A system trust store that yields no certificate (`SSL_CERT_FILE` at a file without one, or
/// at none) is an error of `check-config` and `serve` naming `ca_roots = "system"` and where it
/// looked, not a gateway that trusts nothing.
#[test]
fn an_empty_system_trust_store_is_a_start_up_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = binary_config(
        dir.path(),
        "https://localhost:8443/mcp",
        "ca_roots = \"system\"\n",
    );
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let missing = dir.path().join("missing.pem");
    for bundle in [&empty, &missing] {
        let bundle = bundle.to_str().unwrap();
        for command in ["check-config", "serve"] {
            let args: Vec<&str> = match command {
                "serve" => vec!["serve", "--config", &cfg],
                _ => vec!["check-config", &cfg],
            };
            let ran = run_taskgate(&args, &[("SSL_CERT_FILE", bundle), ("SSL_CERT_DIR", "")]);
            assert!(!ran.status.success(), "{command} {bundle}: {ran:?}");
            assert!(
                ran.stderr
                    .contains("upstream[0].ca_roots = \"system\": no usable CA certificate")
                    && ran.stderr.contains(bundle),
                "{command} {bundle}: {}",
                ran.stderr
            );
        }
    }
}

/// `ca_file` beside `ca_roots = "mozilla"`: the file's CA is trusted as well as the set (the
/// file alone replaces the set, as before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_beside_a_root_set_is_trusted_too() {
    let up = TaskServer::default().await;
    let front = TlsFront::start(&up.url(), "local").await;
    let cfg = TgConfig::new(&front.url("127.0.0.1")).gateway("threads = 1");
    let extra = format!(
        "ca_roots = \"mozilla\"\nca_file = {:?}\n",
        fixture("ca.pem")
    );
    let tg = Tg::start(|store| cfg.to_toml(store) + &extra).await;
    let mut c = tg.client();
    c.initialize().await;
    assert_eq!(up.count("initialize"), 1);
}

/// mTLS: an upstream that requires a client certificate of its CA is reached with
/// `client_cert_file` and `client_key_file` (every request on one pooled connection); without
/// them it refuses the connection and the client is told the server wanted a certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_when_the_upstream_requires_one() {
    let up = TaskServer::default().await;
    let front = TlsFront::start_mtls(&up.url()).await;
    let cfg = TgConfig::new(&front.url("localhost")).gateway("threads = 1");
    let extra = format!(
        "ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}\n",
        fixture("ca.pem"),
        fixture("client.pem"),
        fixture("client.key")
    );
    let tg = Tg::start(|store| cfg.to_toml(store) + &extra).await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("2").await;
    let got = c.get("3", &t).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert_eq!(front.handshakes(), 1);
    drop(tg);

    let without = taskgate(&front.url("localhost"), Some("ca.pem")).await;
    let (status, v) = refused(&without).await;
    assert_eq!(status, 502, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("CertificateRequired"), "{v}");
    let m = without.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_upstream_errors_total",
            &[("upstream", "default"), ("kind", "connect")]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(up.count("initialize"), 1, "only the first taskgate's");
    assert_eq!(front.handshakes(), 1, "the second one's was refused");
}

/// A `CONNECT` proxy on 127.0.0.1 for the tests: tunnels to the target it is asked for, or
/// refuses every `CONNECT` with 407; counts its tunnels and keeps each request head.
struct ConnectProxy {
    addr: SocketAddr,
    tunnels: Arc<AtomicUsize>,
    heads: Arc<std::sync::Mutex<Vec<String>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl ConnectProxy {
    async fn start(refuse: bool) -> ConnectProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tunnels = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tun, hds) = (tunnels.clone(), heads.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (tun, hds) = (tun.clone(), hds.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match client.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let target = head.split(' ').nth(1).unwrap_or_default().to_string();
                    hds.lock().unwrap().push(head);
                    if refuse {
                        let _ = client
                            .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
                            .await;
                        return;
                    }
                    let Ok(mut up) = TcpStream::connect(&target).await else {
                        return;
                    };
                    if client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await
                        .is_ok()
                    {
                        tun.fetch_add(1, Ordering::SeqCst);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                    }
                });
            }
        });
        ConnectProxy {
            addr,
            tunnels,
            heads,
            accept,
        }
    }
}

/// taskgate (one serving thread) in front of `front` by way of `proxy`, trusting the test CA.
async fn through_proxy(front: &TlsFront, proxy: &ConnectProxy) -> Tg {
    let cfg = TgConfig::new(&front.url("localhost")).gateway("threads = 1");
    let extra = format!(
        "ca_file = {:?}\nproxy = \"http://{}\"\n",
        fixture("ca.pem"),
        proxy.addr
    );
    Tg::start(|store| cfg.to_toml(store) + &extra).await
}

/// `upstream.proxy`: an `https://` upstream reached through the proxy's `CONNECT` tunnel (TLS
/// inside it, verified for the upstream's name), every exchange on that one tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_reached_through_a_connect_proxy() {
    let up = TaskServer::default().await;
    let front = TlsFront::start(&up.url(), "local").await;
    let proxy = ConnectProxy::start(false).await;
    let tg = through_proxy(&front, &proxy).await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("2").await;
    let got = c.get("3", &t).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert_eq!(proxy.tunnels.load(Ordering::SeqCst), 1);
    assert_eq!(front.handshakes(), 1);
    let target = format!("localhost:{}", front.addr.port());
    assert!(
        proxy.heads.lock().unwrap()[0]
            .starts_with(&format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n")),
        "{:?}",
        proxy.heads.lock().unwrap()
    );
}

/// A proxy that answers 407: the client gets 502 `-32603` naming the proxy's status and what to
/// do, counted as a connect error; nothing reached the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_refusing_with_407_is_a_connect_error_that_says_so() {
    let up = TaskServer::default().await;
    let front = TlsFront::start(&up.url(), "local").await;
    let proxy = ConnectProxy::start(true).await;
    let tg = through_proxy(&front, &proxy).await;
    let (status, v) = refused(&tg).await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], -32603, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("proxy {}", proxy.addr))
            && message.contains("407 Proxy Authentication Required")
            && message.contains("needs authentication"),
        "{v}"
    );
    assert_eq!(front.handshakes(), 0);
    assert_connect_errors(&tg, 1.0).await;
}

/// `/readyz` of an upstream behind a proxy connects to the proxy (what taskgate reaches), not
/// to the upstream's host, which only the proxy can resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_of_a_proxied_upstream_connects_to_the_proxy() {
    let proxy = ConnectProxy::start(false).await;
    let url = "https://mcp.unresolvable.invalid/mcp";
    let cfg = TgConfig::new(url).gateway("threads = 1");
    let extra = format!("proxy = \"http://{}\"\n", proxy.addr);
    let tg = Tg::start(|store| cfg.to_toml(store) + &extra).await;
    let (status, v) = tg.admin("/readyz").await;
    assert_eq!(status, 200, "{v}");
    let direct = Tg::start(|store| cfg.to_toml(store)).await;
    let (status, v) = direct.admin("/readyz").await;
    assert_eq!(status, 503, "{v}");
    // A proxy that is down: the reason names the proxy, not only "unreachable", which read as
    // the upstream being down (found by the cold review: "unreachable: Connection refused").
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_addr = gone.local_addr().unwrap();
    drop(gone);
    let extra = format!("proxy = \"http://{gone_addr}\"\n");
    let down = Tg::start(|store| cfg.to_toml(store) + &extra).await;
    let (status, v) = down.admin("/readyz").await;
    assert_eq!(status, 503, "{v}");
    let why = v["upstreams"]["default"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("unreachable: proxy ") && why.contains(&gone_addr.to_string()),
        "{v}"
    );
}

/// `/readyz` of an `https://` upstream makes the TLS handshake a request would: a certificate
/// that chains to no trusted root, or that does not name the host, is "unreachable" with the
/// handshake's reason, and a verified one is ready (tester 3 F12: the check was a TCP connect,
/// so a pod with a wrong CA went Ready and served only 502s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_of_an_https_upstream_makes_the_tls_handshake() {
    let up = TaskServer::default().await;
    let untrusted = TlsFront::start(&up.url(), "local").await;
    let other_name = TlsFront::start(&up.url(), "other").await;
    let good = TlsFront::start(&up.url(), "local").await;
    for (front, ca, why) in [
        (&untrusted, None, "UnknownIssuer"),
        (&other_name, Some("ca.pem"), "not valid for name"),
    ] {
        let tg = taskgate(&front.url("127.0.0.1"), ca).await;
        let (status, v) = tg.admin("/readyz").await;
        assert_eq!(status, 503, "{v}");
        let reason = v["upstreams"]["default"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("unreachable: ") && reason.contains("TLS") && reason.contains(why),
            "{v}"
        );
    }
    let tg = taskgate(&good.url("127.0.0.1"), Some("ca.pem")).await;
    let (status, v) = tg.admin("/readyz").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(up.count("initialize"), 0, "the check sends no request");
}

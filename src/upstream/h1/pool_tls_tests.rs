//! The pool over TLS (`https://` upstreams): a scripted TLS server with the test-only
//! certificates of `tests/fixtures/tls`, answering each request as the test says and closing
//! its connections as the test says (close_notify, or TCP FIN without it).

use super::*;
use crate::upstream::h1::Tls;
use http_body_util::BodyExt;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(super) fn fixture(name: &str) -> std::path::PathBuf {
    format!("{}/tests/fixtures/tls/{name}", env!("CARGO_MANIFEST_DIR")).into()
}

/// What the scripted server answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Answer {
    /// `Content-Length: 2`, `ok`.
    Json,
    /// A chunked SSE body of three events, each a chunk of its own (taskgate's own reader).
    Sse,
    /// `Connection: close`, no length: `ok`, ended by closing the connection.
    UntilClose,
    /// `Content-Length: 10` and two bytes of it.
    ShortLength,
    /// A chunked body cut inside its first chunk.
    ShortChunked,
}

/// How the scripted server ends a connection after an answer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Close {
    /// Keeps it open until `close` is signalled, then sends close_notify and FIN.
    NotifyOnSignal,
    /// Keeps it open until `close` is signalled, then FIN without close_notify.
    FinOnSignal,
    /// close_notify and FIN right after the answer.
    NotifyAtOnce,
    /// FIN without close_notify right after the answer.
    FinAtOnce,
}

pub(super) struct TlsServer {
    pub(super) addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    close: tokio::sync::watch::Sender<u32>,
}

impl TlsServer {
    pub(super) async fn start(bind: &str, answer: Answer, close: Close) -> TlsServer {
        TlsServer::with_cert(
            bind,
            &fixture("local.pem"),
            &fixture("local.key"),
            answer,
            close,
        )
        .await
    }

    /// The server with the certificate (chain) `cert` and its key `key`, PEM files.
    async fn with_cert(
        bind: &str,
        cert: &std::path::Path,
        key: &std::path::Path,
        answer: Answer,
        close: Close,
    ) -> TlsServer {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let signal = tokio::sync::watch::channel(0u32).0;
        let (acc, clo, sig) = (accepted.clone(), closed.clone(), signal.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, acc, clo, mut rx) =
                    (acceptor.clone(), acc.clone(), clo.clone(), sig.subscribe());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    acc.fetch_add(1, Ordering::SeqCst);
                    loop {
                        tokio::select! {
                            more = serve_one(&mut tls, answer) => if !more { break },
                            _ = rx.changed() => break,
                        }
                        if matches!(close, Close::NotifyAtOnce | Close::FinAtOnce) {
                            break;
                        }
                    }
                    if matches!(close, Close::FinOnSignal | Close::FinAtOnce) {
                        // The TCP stream alone: FIN, no close_notify.
                        let (tcp, _) = tls.into_inner();
                        drop(tcp);
                    } else {
                        let _ = tls.shutdown().await;
                    }
                    clo.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        TlsServer {
            addr,
            accepted,
            closed,
            close: signal,
        }
    }

    pub(super) fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Closes every open connection and waits until they are closed.
    async fn close_connections(&self) {
        let n = self.accepted();
        self.close.send_modify(|v| *v += 1);
        while self.closed.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Let the client's runtime see the close.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads one request (head and `Content-Length` body) and answers it; false at the end of the
/// connection.
async fn serve_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    answer: Answer,
) -> bool {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let wire: &[u8] = match answer {
        Answer::Json => b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok",
        Answer::Sse => b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        Answer::ShortLength => b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\nok",
        Answer::ShortChunked => b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata:",
        Answer::UntilClose => {
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\nok"
        }
    };
    if s.write_all(wire).await.is_err() {
        return false;
    }
    if answer == Answer::Sse {
        for event in ["data: 1\n\n", "data: 2\n\n", "data: 3\n\n"] {
            let chunk = format!("{:x}\r\n{event}\r\n", event.len());
            if s.write_all(chunk.as_bytes()).await.is_err() {
                return false;
            }
            let _ = s.flush().await;
        }
        if s.write_all(b"0\r\n\r\n").await.is_err() {
            return false;
        }
    }
    s.flush().await.is_ok()
}

fn tls_pool(addr: SocketAddr, host: &str, connect_timeout: Duration) -> Arc<Pool> {
    let tls = Tls::new(host, crate::tls::Trust::file(&fixture("ca.pem")), None).unwrap();
    Pool::with_tls(addr.to_string(), connect_timeout, tls)
}

pub(super) fn request() -> Request<Full<Bytes>> {
    Request::builder()
        .method(http::Method::POST)
        .uri("/mcp")
        .header(http::header::HOST, "localhost")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

pub(super) async fn fetch(pool: &Arc<Pool>) -> Result<Bytes, String> {
    let resp = pool.send(request()).await.map_err(|e| e.to_string())?;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(body.to_bytes())
}

pub(super) const SSE_BODY: &[u8] = b"data: 1\n\ndata: 2\n\ndata: 3\n\n";

/// A chunked (SSE) body read to its end by taskgate's own reader over TLS gives its connection
/// back: the next requests use it.
#[tokio::test]
async fn a_chunked_body_over_tls_gives_its_connection_back() {
    let server = TlsServer::start("127.0.0.1:0", Answer::Sse, Close::NotifyOnSignal).await;
    let pool = tls_pool(server.addr, "localhost", Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(&fetch(&pool).await.unwrap()[..], SSE_BODY);
    }
    assert_eq!(server.accepted(), 1);
    assert_eq!(pool.open.load(Ordering::SeqCst), 1);
}

/// An SSE body dropped before its end closes its TLS connection (not reused, its slot freed).
#[tokio::test]
async fn a_tls_body_dropped_early_closes_its_connection() {
    let server = TlsServer::start("127.0.0.1:0", Answer::Sse, Close::NotifyOnSignal).await;
    let pool = tls_pool(server.addr, "localhost", Duration::from_secs(5));
    let resp = pool.send(request()).await.unwrap();
    drop(resp);
    assert_eq!(pool.open.load(Ordering::SeqCst), 0);
    assert_eq!(&fetch(&pool).await.unwrap()[..], SSE_BODY);
    assert_eq!(server.accepted(), 2);
}

/// An idle TLS connection the server closed, with close_notify or with a bare TCP FIN, is
/// not reused: the next request goes on a new connection and succeeds.
#[tokio::test]
async fn an_idle_tls_connection_the_server_closed_is_replaced() {
    for close in [Close::NotifyOnSignal, Close::FinOnSignal] {
        for answer in [Answer::Json, Answer::Sse] {
            let server = TlsServer::start("127.0.0.1:0", answer, close).await;
            let pool = tls_pool(server.addr, "localhost", Duration::from_secs(5));
            fetch(&pool).await.unwrap();
            server.close_connections().await;
            let got = fetch(&pool).await;
            assert!(got.is_ok(), "{close:?} {answer:?}: {got:?}");
            assert_eq!(server.accepted(), 2, "{close:?} {answer:?}");
        }
    }
}

/// A server that closes (close_notify) right after each answer: every request still succeeds,
/// each on a connection of its own.
#[tokio::test]
async fn a_tls_server_that_closes_after_each_answer() {
    for answer in [Answer::Json, Answer::Sse] {
        let server = TlsServer::start("127.0.0.1:0", answer, Close::NotifyAtOnce).await;
        let pool = tls_pool(server.addr, "localhost", Duration::from_secs(5));
        for i in 0..3 {
            let got = fetch(&pool).await;
            assert!(got.is_ok(), "{answer:?} request {i}: {got:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(server.accepted(), 3, "{answer:?}");
    }
}

/// A server that accepts TCP and never answers the ClientHello: the request fails within the
/// connect timeout, naming the handshake.
#[tokio::test]
async fn a_tls_handshake_that_never_ends_fails_within_the_connect_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    let pool = tls_pool(addr, "localhost", Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = fetch(&pool).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.contains("did not complete the TLS handshake within 300 ms"),
        "{err}"
    );
    hold.abort();
}

/// A JSON-answering server with fixture certificate `name` (`name.pem`, `name.key`), and a pool
/// reaching it as `host` that trusts that same certificate as its `ca_file`.
async fn own_ca_file(name: &str, host: &str) -> (TlsServer, Arc<Pool>) {
    let (cert, key) = (
        fixture(&format!("{name}.pem")),
        fixture(&format!("{name}.key")),
    );
    let server = TlsServer::with_cert(
        "127.0.0.1:0",
        &cert,
        &key,
        Answer::Json,
        Close::NotifyOnSignal,
    )
    .await;
    let tls = Tls::new(host, crate::tls::Trust::file(&cert), None).unwrap();
    let pool = Pool::with_tls(server.addr.to_string(), Duration::from_secs(5), tls);
    (server, pool)
}

/// A self-signed certificate made the common way (`openssl req -x509`, which marks it a CA:
/// basicConstraints CA:TRUE) as the server's own and as `ca_file`: rustls refuses a CA
/// certificate as a server's; the error says so and what to do, not rustls's
/// `Other(OtherError(CaUsedAsEndEntity))`.
#[tokio::test]
async fn a_self_signed_ca_certificate_as_the_servers_own_is_refused_clearly() {
    let (_server, pool) = own_ca_file("selfsigned", "localhost").await;
    let err = fetch(&pool).await.unwrap_err();
    assert!(
        err.contains("is a CA certificate (basicConstraints CA:TRUE)") && err.contains("CA:FALSE"),
        "{err}"
    );
    assert!(!err.contains("OtherError"), "{err}");
}

/// A self-signed server certificate that is not a CA's (basicConstraints CA:FALSE), given as
/// `ca_file`, is trusted: what README and config/REFERENCE.md tell users to make.
#[tokio::test]
async fn a_self_signed_server_certificate_is_trusted_as_its_own_ca_file() {
    let (_server, pool) = own_ca_file("selfleaf", "127.0.0.1").await;
    assert_eq!(&fetch(&pool).await.unwrap()[..], b"ok");
}

/// A body delimited by the end of the connection (`Connection: close`, no length), the server
/// closing without close_notify (Python's `ssl` sockets close so; `http.server` answers
/// HTTP/1.0 so): the body is what came, as over plain TCP, not rustls's "peer closed
/// connection without sending TLS close_notify". A length or chunked framing still tells a
/// truncated body from a whole one (the next test).
#[tokio::test]
async fn a_body_until_close_ends_cleanly_without_close_notify() {
    let server = TlsServer::start("127.0.0.1:0", Answer::UntilClose, Close::FinAtOnce).await;
    let pool = tls_pool(server.addr, "localhost", Duration::from_secs(5));
    assert_eq!(&fetch(&pool).await.unwrap()[..], b"ok");
    let server = TlsServer::start("127.0.0.1:0", Answer::UntilClose, Close::NotifyAtOnce).await;
    let pool = tls_pool(server.addr, "localhost", Duration::from_secs(5));
    assert_eq!(&fetch(&pool).await.unwrap()[..], b"ok");
}

/// A body with a length or chunked framing that the server cuts short by closing, with or
/// without close_notify, is an error, never a clean end.
#[tokio::test]
async fn a_framed_body_cut_short_over_tls_is_an_error() {
    for answer in [Answer::ShortLength, Answer::ShortChunked] {
        for close in [Close::FinAtOnce, Close::NotifyAtOnce] {
            let server = TlsServer::start("127.0.0.1:0", answer, close).await;
            let pool = tls_pool(server.addr, "localhost", Duration::from_secs(5));
            let got = fetch(&pool).await;
            assert!(got.is_err(), "{answer:?} {close:?}: {got:?}");
        }
    }
}

/// A certificate that chains to no trusted root (here: the test CA, with the Mozilla roots):
/// rustls's `UnknownIssuer` is named, with what to do about it (`ca_file`, `ca_roots =
/// "system"`, or a server that does not send its intermediate certificates).
#[tokio::test]
async fn an_unknown_issuer_names_ca_file() {
    let server = TlsServer::start("127.0.0.1:0", Answer::Json, Close::NotifyOnSignal).await;
    let tls = Tls::new("localhost", crate::tls::Trust::default(), None).unwrap();
    let pool = Pool::with_tls(server.addr.to_string(), Duration::from_secs(5), tls);
    let err = fetch(&pool).await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(
        err.contains("upstream.ca_file")
            && err.contains("upstream.ca_roots = \"system\"")
            && err.contains("intermediate"),
        "{err}"
    );
}

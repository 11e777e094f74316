//! The pool through an HTTP proxy (`upstream.proxy`): a small `CONNECT` proxy on 127.0.0.1
//! that tunnels, refuses, or misbehaves as the test says, in front of the plain and TLS test
//! servers of `pool_tests` and `pool_tls_tests`.

use super::tls_tests::{fetch, fixture, Answer, Close, TlsServer, SSE_BODY};
use super::*;
use crate::upstream::h1::{Proxy, Tls};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the test proxy does with a `CONNECT`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Act {
    /// `200 Connection established`, then the bytes both ways to the named target.
    Tunnel,
    /// `407 Proxy Authentication Required`, then close.
    Refuse407,
    /// `401 Unauthorized` (tinyproxy's answer to a `CONNECT` without good credentials), then close.
    Refuse401,
    /// The start of a 200 status line, then close.
    CloseMidHead,
    /// A status line and 9000 bytes of one header, no end of head; stays open.
    LongHead,
    /// No answer at all; stays open.
    Silent,
    /// `200` and, in the same write, bytes past the head; stays open.
    ExtraBytes,
    /// Something that is not HTTP; stays open.
    NotHttp,
}

struct TestProxy {
    addr: SocketAddr,
    tunnels: Arc<AtomicUsize>,
    /// Each `CONNECT` head received.
    heads: Arc<Mutex<Vec<String>>>,
}

impl TestProxy {
    async fn start(act: Act) -> TestProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tunnels = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (tun, hds) = (tunnels.clone(), heads.clone());
        tokio::spawn(async move {
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
                    hds.lock().push(head);
                    match act {
                        Act::Tunnel => {
                            let Ok(mut up) = tokio::net::TcpStream::connect(&target).await else {
                                return;
                            };
                            let ok = b"HTTP/1.1 200 Connection established\r\n\r\n";
                            if client.write_all(ok).await.is_err() {
                                return;
                            }
                            tun.fetch_add(1, Ordering::SeqCst);
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                        }
                        Act::Refuse407 => {
                            let _ = client
                                .write_all(
                                    b"HTTP/1.1 407 Proxy Authentication Required\r\n\
                                      Proxy-Authenticate: Basic realm=\"corp\"\r\n\
                                      Content-Length: 0\r\n\r\n",
                                )
                                .await;
                        }
                        Act::Refuse401 => {
                            let _ = client
                                .write_all(
                                    b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n",
                                )
                                .await;
                        }
                        Act::CloseMidHead => {
                            let _ = client.write_all(b"HTTP/1.1 200 Conn").await;
                        }
                        Act::LongHead => {
                            let mut long = b"HTTP/1.1 200 OK\r\nX-Pad: ".to_vec();
                            long.resize(9000, b'a');
                            let _ = client.write_all(&long).await;
                            let _ = client.read(&mut byte).await;
                        }
                        Act::Silent => {
                            let _ = client.read(&mut byte).await;
                        }
                        Act::ExtraBytes => {
                            let _ = client.write_all(b"HTTP/1.1 200 OK\r\n\r\nSURPRISE").await;
                            let _ = client.read(&mut byte).await;
                        }
                        Act::NotHttp => {
                            let _ = client.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\n").await;
                            let _ = client.read(&mut byte).await;
                        }
                    }
                });
            }
        });
        TestProxy {
            addr,
            tunnels,
            heads,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn tunnels(&self) -> usize {
        self.tunnels.load(Ordering::SeqCst)
    }
}

fn proxied_pool(
    target: SocketAddr,
    proxy_url: &str,
    tls: Option<Tls>,
    connect_timeout: Duration,
) -> Arc<Pool> {
    let url = crate::config::ProxyUrl::parse(proxy_url).unwrap();
    let proxy = Proxy::new(&url, &target.to_string());
    Pool::for_upstream(target.to_string(), connect_timeout, tls, Some(proxy))
}

/// An `http://` upstream through the proxy: one `CONNECT` naming the upstream (with `Host`),
/// and the tunnel is the pooled connection every request reuses.
#[tokio::test]
async fn an_http_upstream_is_reached_through_one_reused_tunnel() {
    let server = super::tests::counting_server().await;
    let proxy = TestProxy::start(Act::Tunnel).await;
    let pool = proxied_pool(server.addr, &proxy.url(), None, Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(&fetch(&pool).await.unwrap()[..], b"ok");
    }
    assert_eq!(proxy.tunnels(), 1);
    assert_eq!(server.accepted(), 1);
    let target = server.addr.to_string();
    assert_eq!(
        proxy.heads.lock()[0],
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
    );
}

/// An `https://` upstream through the proxy: TLS inside the tunnel (the certificate verified
/// for the upstream's name), SSE bodies read by taskgate's own reader, the tunnel reused.
#[tokio::test]
async fn an_https_upstream_is_reached_with_tls_inside_the_tunnel() {
    let server = TlsServer::start("127.0.0.1:0", Answer::Sse, Close::NotifyOnSignal).await;
    let proxy = TestProxy::start(Act::Tunnel).await;
    let tls = Tls::new(
        "localhost",
        crate::tls::Trust::file(&fixture("ca.pem")),
        None,
    )
    .unwrap();
    let pool = proxied_pool(server.addr, &proxy.url(), Some(tls), Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(&fetch(&pool).await.unwrap()[..], SSE_BODY);
    }
    assert_eq!(proxy.tunnels(), 1);
    assert_eq!(server.accepted(), 1);
}

/// A 407 fails the connection naming the proxy, its status and what to do; with credentials
/// in the URL they were sent (Basic, percent-decoded) and the error says they were refused,
/// never showing them.
#[tokio::test]
async fn a_407_names_the_proxy_and_never_the_credentials() {
    let server = super::tests::counting_server().await;
    let proxy = TestProxy::start(Act::Refuse407).await;
    let pool = proxied_pool(server.addr, &proxy.url(), None, Duration::from_secs(5));
    let err = fetch(&pool).await.unwrap_err();
    assert!(
        err.contains(&format!("proxy {}", proxy.addr))
            && err.contains("407 Proxy Authentication Required")
            && err.contains("needs authentication"),
        "{err}"
    );
    let with = format!("http://alice:s%40cret@{}", proxy.addr);
    let pool = proxied_pool(server.addr, &with, None, Duration::from_secs(5));
    let err = fetch(&pool).await.unwrap_err();
    assert!(err.contains("did not accept the credentials"), "{err}");
    assert!(!err.contains("cret") && !err.contains("alice"), "{err}");
    use base64::Engine;
    let token = base64::engine::general_purpose::STANDARD.encode("alice:s@cret");
    assert!(
        proxy.heads.lock()[1].contains(&format!("\r\nProxy-Authorization: Basic {token}\r\n")),
        "{:?}",
        proxy.heads.lock()
    );
    assert_eq!(server.accepted(), 0);
    assert_eq!(pool.open.load(Ordering::SeqCst), 0);
}

/// tinyproxy answers a `CONNECT` without credentials, or with wrong ones, `401 Unauthorized`, not
/// 407: the error says what a 407 says. Before: "refused CONNECT with 401 Unauthorized" alone
/// (found against tinyproxy 1.11 with `BasicAuth`).
#[tokio::test]
async fn a_401_to_connect_is_about_the_credentials_too() {
    let server = super::tests::counting_server().await;
    let proxy = TestProxy::start(Act::Refuse401).await;
    let pool = proxied_pool(server.addr, &proxy.url(), None, Duration::from_secs(5));
    let err = fetch(&pool).await.unwrap_err();
    assert!(
        err.contains("401 Unauthorized") && err.contains("needs authentication"),
        "{err}"
    );
    let with = format!("http://alice:wrong@{}", proxy.addr);
    let pool = proxied_pool(server.addr, &with, None, Duration::from_secs(5));
    let err = fetch(&pool).await.unwrap_err();
    assert!(
        err.contains("401 Unauthorized") && err.contains("did not accept the credentials"),
        "{err}"
    );
    assert!(!err.contains("wrong") && !err.contains("alice"), "{err}");
    assert_eq!(server.accepted(), 0);
}

/// A proxy that closes in the middle of its answer, one whose answer head never ends within
/// 8 KiB, one that never answers, one that sends bytes past its 200 and one that does not speak
/// HTTP: each fails the connection (the silent one within the connect timeout), naming why.
#[tokio::test]
async fn a_proxy_that_misbehaves_fails_the_connection_saying_how() {
    let server = super::tests::counting_server().await;
    for (act, why) in [
        (
            Act::CloseMidHead,
            "closed the connection in the middle of its answer to CONNECT",
        ),
        (Act::LongHead, "no end of head within 8192 bytes"),
        (Act::Silent, "did not open a tunnel to"),
        (
            Act::ExtraBytes,
            "sent 8 bytes after its 200 answer to CONNECT",
        ),
        (
            Act::NotHttp,
            "not an HTTP/1 status line: \"SSH-2.0-OpenSSH_9.6\"",
        ),
    ] {
        let proxy = TestProxy::start(act).await;
        let pool = proxied_pool(server.addr, &proxy.url(), None, Duration::from_millis(300));
        let started = std::time::Instant::now();
        let err = fetch(&pool).await.unwrap_err();
        assert!(
            err.contains(&format!("proxy {}", proxy.addr)) && err.contains(why),
            "{act:?}: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(3), "{act:?}");
    }
    // A proxy that is not there.
    let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = gone.local_addr().unwrap();
    drop(gone);
    let pool = proxied_pool(
        server.addr,
        &format!("http://{addr}"),
        None,
        Duration::from_secs(5),
    );
    let err = fetch(&pool).await.unwrap_err();
    assert!(err.contains(&format!("proxy {addr}")), "{err}");
    assert_eq!(server.accepted(), 0);
}

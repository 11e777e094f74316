//! Tests of the upstream connection pool; `counting_server` is shared with the client tests.

use super::*;
use http_body_util::BodyExt;
use std::net::SocketAddr;

/// A hyper HTTP/1 server on 127.0.0.1:0 answering `ok` to every request, counting the TCP
/// connections it accepted; it can close its (idle) connections on demand.
pub(crate) struct TestServer {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    close: Arc<tokio::sync::watch::Sender<u32>>,
}

impl TestServer {
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Closes every open connection (without a `Connection: close` answer) and waits until
    /// they are closed.
    pub async fn close_connections(&self) {
        let n = self.accepted();
        self.close.send_modify(|v| *v += 1);
        while self.closed.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

pub(crate) async fn counting_server() -> TestServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let close = Arc::new(tokio::sync::watch::channel(0u32).0);
    let (acc, clo, tx) = (accepted.clone(), closed.clone(), close.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            acc.fetch_add(1, Ordering::SeqCst);
            let (closed, mut rx) = (clo.clone(), tx.subscribe());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"ok",
                    ))))
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                let mut conn = std::pin::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = rx.changed() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.as_mut().await;
                    }
                }
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    TestServer {
        addr,
        accepted,
        closed,
        close,
    }
}

fn request() -> Request<Full<Bytes>> {
    Request::builder()
        .uri("/mcp")
        .header(http::header::HOST, "test")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// One request, its body read to the end (the connection goes back to the pool).
async fn fetch(pool: &Arc<Pool>) -> Bytes {
    let resp = pool.send(request()).await.expect("send");
    resp.into_body().collect().await.unwrap().to_bytes()
}

fn pool_for(server: &TestServer, limits: PoolLimits) -> Arc<Pool> {
    Pool::with_limits(server.addr.to_string(), Duration::from_secs(5), limits)
}

fn idle_len(pool: &Pool) -> usize {
    let listed: usize = pool.idle.iter().map(|l| l.0.lock().len()).sum();
    assert_eq!(listed, pool.idle_count.load(Ordering::Relaxed));
    listed
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection() {
    let server = counting_server().await;
    let pool = pool_for(&server, PoolLimits::default());
    for _ in 0..5 {
        assert_eq!(&fetch(&pool).await[..], b"ok");
    }
    assert_eq!(server.accepted(), 1);
    assert_eq!(idle_len(&pool), 1);
    assert_eq!(pool.open.load(Ordering::SeqCst), 1);
}

/// Each serving thread reuses only the connections it opened (its runtime's I/O driver
/// watches them), and the idle bound holds over all threads.
#[test]
fn serving_threads_keep_their_own_idle_connections() {
    let upstream = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = upstream.block_on(counting_server());
    let pool = pool_for(
        &server,
        PoolLimits {
            max_idle: 2,
            ..PoolLimits::default()
        },
    );
    // Serving threads 1 to 3, each with its own single-threaded runtime (driven here in turn).
    let runtimes: Vec<_> = (0..4)
        .map(|_| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        })
        .collect();
    let on_thread = |index: usize| {
        pin_thread(index);
        let body = runtimes[index].block_on(fetch(&pool));
        pin_thread(0);
        body
    };
    assert_eq!(&on_thread(1)[..], b"ok");
    assert_eq!(&on_thread(2)[..], b"ok");
    assert_eq!(
        server.accepted(),
        2,
        "thread 2 did not take thread 1's connection"
    );
    assert_eq!(&on_thread(1)[..], b"ok");
    assert_eq!(server.accepted(), 2, "thread 1 reuses its own connection");
    // Thread 3's connection is not kept: two are idle already.
    assert_eq!(&on_thread(3)[..], b"ok");
    assert_eq!(server.accepted(), 3);
    assert_eq!(idle_len(&pool), 2);
}

/// The upstream closes an idle connection: the next request goes out on a fresh one, with no
/// error (the closed connection is noticed at checkout, or the unsent request is retried).
#[tokio::test]
async fn connection_closed_while_idle_is_replaced_transparently() {
    let server = counting_server().await;
    let pool = pool_for(&server, PoolLimits::default());
    assert_eq!(&fetch(&pool).await[..], b"ok");
    server.close_connections().await;
    // Let the FIN reach the pool's socket.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(&fetch(&pool).await[..], b"ok");
    assert_eq!(server.accepted(), 2);
    assert_eq!(pool.open.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn connection_idle_past_the_timeout_is_not_reused() {
    let server = counting_server().await;
    let limits = PoolLimits {
        idle_timeout: Duration::from_millis(50),
        ..PoolLimits::default()
    };
    let pool = pool_for(&server, limits);
    assert_eq!(&fetch(&pool).await[..], b"ok");
    assert_eq!(&fetch(&pool).await[..], b"ok");
    assert_eq!(server.accepted(), 1, "reused within the idle timeout");
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(&fetch(&pool).await[..], b"ok");
    assert_eq!(
        server.accepted(),
        2,
        "a fresh connection past the idle timeout"
    );
    // The expired connection was dropped, not kept in the idle list.
    assert_eq!(idle_len(&pool), 1);
    assert_eq!(pool.open.load(Ordering::SeqCst), 1);
}

/// An expired connection is dropped when another one is checked in.
#[tokio::test]
async fn checkin_drops_expired_idle_connections() {
    let server = counting_server().await;
    let limits = PoolLimits {
        idle_timeout: Duration::from_millis(50),
        ..PoolLimits::default()
    };
    let pool = pool_for(&server, limits);
    // Two connections in use at once, then both idle.
    let a = pool.send(request()).await.unwrap();
    let b = pool.send(request()).await.unwrap();
    a.into_body().collect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    b.into_body().collect().await.unwrap();
    assert_eq!(server.accepted(), 2);
    assert_eq!(idle_len(&pool), 1, "the expired one went at checkin");
    assert_eq!(pool.open.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn open_connections_are_capped() {
    let server = counting_server().await;
    let limits = PoolLimits {
        max_connections: 1,
        ..PoolLimits::default()
    };
    let pool = pool_for(&server, limits);
    let held = pool.send(request()).await.unwrap();
    match pool.send(request()).await {
        Err(e @ PoolError::Limit(1)) => assert!(e.to_string().contains("limit of 1 open")),
        other => panic!("expected the connection limit, got {:?}", other.map(|_| ())),
    }
    // A body dropped early closes its connection, which frees its place.
    drop(held);
    assert_eq!(&fetch(&pool).await[..], b"ok");
    assert_eq!(server.accepted(), 2);
}

/// A pooled connection has SO_KEEPALIVE set (and the probe timing where the OS reports it).
#[tokio::test]
async fn pooled_connection_has_tcp_keepalive() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pool = Pool::new(addr.to_string(), Duration::from_secs(5));
    let (stream, accepted) = tokio::join!(
        pool.connect_tcp(
            &pool.authority,
            tokio::time::Instant::now() + Duration::from_secs(5)
        ),
        listener.accept()
    );
    let stream = stream.expect("connect");
    let _server_side = accepted.unwrap();
    let sock = socket2::SockRef::from(&stream);
    assert!(sock.keepalive().unwrap(), "SO_KEEPALIVE must be set");
    assert!(stream.nodelay().unwrap());
}

#[path = "pool_wire_tests.rs"]
mod wire;

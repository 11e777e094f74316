//! The pool against a scripted wire server: chunked answers read by taskgate (issue 15) and
//! the cold review's cases.

use super::*;
use http_body_util::BodyExt;
use std::net::SocketAddr;

/// A server on 127.0.0.1:0 that answers each request on any connection with the next scripted
/// answer, written in the given pieces (each flushed on its own; an empty piece closes the
/// connection), and counts connections.
struct WireServer {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

async fn wire_server(answers: Vec<Vec<&'static [u8]>>) -> WireServer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let script = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
    let acc = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            acc.fetch_add(1, Ordering::SeqCst);
            let script = script.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    // A request: its head, then `Content-Length` bytes.
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        if let Some(i) = memchr::memmem::find(&seen, b"\r\n\r\n") {
                            break i + 4;
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&seen[..head_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while seen.len() < head_end + length {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&chunk[..n]),
                        }
                    }
                    seen.drain(..head_end + length);
                    let Some(pieces) = script.lock().pop_front() else {
                        return;
                    };
                    for piece in pieces {
                        if piece.is_empty() {
                            return; // the script says: close the connection here
                        }
                        if stream.write_all(piece).await.is_err() {
                            return;
                        }
                        stream.flush().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            });
        }
    });
    WireServer { addr, accepted }
}

fn wire_pool(server: &WireServer) -> Arc<Pool> {
    Pool::with_limits(
        server.addr.to_string(),
        Duration::from_secs(5),
        PoolLimits::default(),
    )
}

async fn fetch_result(pool: &Arc<Pool>) -> Result<Bytes, String> {
    let resp = pool.send(request()).await.map_err(|e| e.to_string())?;
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}

const CHUNKED_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

/// Chunked answers (read by taskgate after the gate, issue 15) and `Content-Length` ones
/// alternate on one connection, whatever pieces they arrive in: every body is whole and the
/// connection is reused throughout.
#[tokio::test]
async fn chunked_and_sized_answers_share_one_reused_connection() {
    let server = wire_server(vec![
        vec![b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", b"6\r\n world\r\n0\r\n\r\n"],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
        vec![b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"],
        vec![&CHUNKED_HEAD[..20], &CHUNKED_HEAD[20..], b"2\r", b"\nxy\r", b"\n0\r\n\r", b"\n"],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n\r\n\r\n"],
    ])
    .await;
    let pool = wire_pool(&server);
    let expected: [&[u8]; 5] = [b"hello world", b"ok", b"abc", b"xy", b"\r\n\r\n"];
    for want in expected {
        assert_eq!(&fetch_result(&pool).await.unwrap()[..], want);
    }
    assert_eq!(server.accepted(), 1, "one connection for all five answers");
    assert_eq!(idle_len(&pool), 1);
}

/// A chunked answer cut short by the upstream is an error naming it, not a clean end (the
/// SSE relay aborts the client's stream on it), and the next request gets a new connection.
#[tokio::test]
async fn a_chunked_answer_cut_short_is_an_error_and_its_connection_is_not_reused() {
    let server = wire_server(vec![
        vec![CHUNKED_HEAD, b"5\r\nhel", b""],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    ])
    .await;
    let pool = wire_pool(&server);
    let err = fetch_result(&pool).await.unwrap_err();
    assert!(
        err.contains("before the chunked body's last chunk"),
        "{err}"
    );
    assert_eq!(&fetch_result(&pool).await.unwrap()[..], b"ok");
    assert_eq!(server.accepted(), 2);
}

/// `Connection: close` on a chunked answer: the body is read whole, the connection is not kept.
#[tokio::test]
async fn a_chunked_answer_with_connection_close_is_not_kept() {
    let server = wire_server(vec![
        vec![b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    ])
    .await;
    let pool = wire_pool(&server);
    assert_eq!(&fetch_result(&pool).await.unwrap()[..], b"ok");
    assert_eq!(idle_len(&pool), 0);
    assert_eq!(&fetch_result(&pool).await.unwrap()[..], b"ok");
    assert_eq!(server.accepted(), 2);
}

/// A head with bare LF line ends (which hyper takes) is left to hyper whole: the gate cannot
/// know where hyper's head ended, and the body is still read right.
#[tokio::test]
async fn a_head_with_bare_line_feeds_is_left_to_hyper() {
    let server = wire_server(vec![vec![
        b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n4\r\n\r\n\r\n\r\n0\r\n\r\n",
    ]])
    .await;
    let pool = wire_pool(&server);
    assert_eq!(&fetch_result(&pool).await.unwrap()[..], b"\r\n\r\n");
}

/// A truncated chunked answer's error is taskgate's own (the body was taken over from hyper),
/// and a broken chunk-size line is refused with what was wrong.
#[tokio::test]
async fn chunked_framing_errors_are_reported() {
    let server = wire_server(vec![vec![CHUNKED_HEAD, b"zz\r\n"]]).await;
    let pool = wire_pool(&server);
    let err = fetch_result(&pool).await.unwrap_err();
    assert!(err.contains("invalid chunk-size line"), "{err}");
}

impl WireServer {
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------------------------
// Review tests (cold review of c423bb8).

fn review_pool(server: &WireServer, max_connections: usize) -> Arc<Pool> {
    Pool::with_limits(
        server.addr.to_string(),
        Duration::from_secs(5),
        PoolLimits {
            max_connections,
            ..PoolLimits::default()
        },
    )
}

/// A chunked answer that is taken over but will not be reused (`Connection: close`) is still an
/// open connection while its body streams: it must count against `max_connections`.
#[tokio::test]
async fn review_a_non_reused_chunked_stream_still_counts_as_open() {
    let server = wire_server(vec![
        vec![b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n"],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    ])
    .await;
    let pool = review_pool(&server, 1);
    let resp = pool.send(request()).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"ok");
    let open = pool.open.load(Ordering::SeqCst);
    let second = pool.send(request()).await;
    let accepted = server.accepted();
    drop(body);
    eprintln!("open connections counted while the Connection: close stream is read: {open}");
    match second {
        Err(PoolError::Limit(1)) => {}
        other => panic!(
            "expected the connection limit, got {:?} (TCP connections accepted: {accepted})",
            other.map(|_| ())
        ),
    }
}

/// The same with `Transfer-Encoding` and `Content-Length` both present (also not reused).
#[tokio::test]
async fn review_a_te_and_cl_chunked_stream_still_counts_as_open() {
    let server = wire_server(vec![
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n"],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    ])
    .await;
    let pool = review_pool(&server, 1);
    let resp = pool.send(request()).await.unwrap();
    let mut body = resp.into_body();
    let _ = body.frame().await.unwrap().unwrap();
    let open = pool.open.load(Ordering::SeqCst);
    drop(body);
    assert_eq!(open, 1, "the streaming connection is not counted as open");
}

/// A chunk-size line with no hex digit (`\r\n`, `;ext\r\n`): hyper 1.12 refuses it ("Invalid
/// chunk size line: missing size digit"); taken over, it must not end the body cleanly.
#[tokio::test]
async fn review_a_chunk_size_line_without_digits_is_not_a_clean_end() {
    for wire in [
        b"5\r\nhello\r\n\r\n\r\n".as_slice(),
        b"5\r\nhello\r\n;x\r\n\r\n".as_slice(),
        b"5\r\nhello\r\n \r\n\r\n".as_slice(),
    ] {
        let server = wire_server(vec![vec![CHUNKED_HEAD, wire]]).await;
        let pool = wire_pool(&server);
        let got = fetch_result(&pool).await;
        assert!(
            got.is_err(),
            "{:?} ended the body cleanly: {got:?} (idle connections kept: {})",
            String::from_utf8_lossy(wire),
            idle_len(&pool)
        );
    }
}

/// The upstream closes (FIN) right after a taken-over chunked answer: the next request still
/// succeeds (noticed at checkout, or the unsent request retried).
#[tokio::test]
async fn review_upstream_closing_after_a_chunked_answer_is_replaced() {
    let server = wire_server(vec![
        vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            b"",
        ],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    ])
    .await;
    let pool = wire_pool(&server);
    assert_eq!(&fetch_result(&pool).await.unwrap()[..], b"ok");
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(&fetch_result(&pool).await.unwrap()[..], b"ok");
    assert_eq!(server.accepted(), 2);
}

/// The same with a reset (SO_LINGER 0) instead of a FIN.
#[tokio::test]
async fn review_upstream_resetting_after_a_chunked_answer_is_replaced() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let acc = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let n = acc.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut chunk = [0u8; 4096];
                while !seen.ends_with(b"\r\n\r\n{}") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => seen.extend_from_slice(&chunk[..k]),
                    }
                }
                if n == 0 {
                    s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    socket2::SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(s);
                } else {
                    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await
                        .unwrap();
                    let _ = s.read(&mut chunk).await;
                }
            });
        }
    });
    let pool = Pool::new(addr.to_string(), Duration::from_secs(5));
    assert_eq!(&fetch(&pool).await[..], b"ok");
    tokio::time::sleep(Duration::from_millis(30)).await;
    let r = fetch_result(&pool).await;
    assert_eq!(r.as_deref(), Ok(&b"ok"[..]));
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A request too big to be written at once, answered (chunked) before the upstream reads its
/// body: the request must still arrive whole, and the connection serve the next request.
#[tokio::test]
async fn review_an_early_chunked_answer_to_a_big_request_loses_no_request_bytes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BIG: usize = 32 << 20;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got_body = Arc::new(AtomicUsize::new(0));
    let gb = got_body.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut chunk = vec![0u8; 65536];
        // Request 1: head, answer, then the body.
        let head_end = loop {
            if let Some(i) = memchr::memmem::find(&seen, b"\r\n\r\n") {
                break i + 4;
            }
            let k = s.read(&mut chunk).await.unwrap();
            assert!(k > 0);
            seen.extend_from_slice(&chunk[..k]);
        };
        s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
            .await
            .unwrap();
        while seen.len() < head_end + BIG {
            let k = s.read(&mut chunk).await.unwrap();
            if k == 0 {
                return;
            }
            seen.extend_from_slice(&chunk[..k]);
        }
        gb.store(BIG.min(seen.len() - head_end), Ordering::SeqCst);
        seen.drain(..head_end + BIG);
        // Request 2.
        while memchr::memmem::find(&seen, b"\r\n\r\n{}").is_none() {
            let k = s.read(&mut chunk).await.unwrap();
            if k == 0 {
                return;
            }
            seen.extend_from_slice(&chunk[..k]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
            .await
            .unwrap();
        let _ = s.read(&mut chunk).await;
    });
    let pool = Pool::new(addr.to_string(), Duration::from_secs(5));
    let big = Request::builder()
        .method("POST")
        .uri("/mcp")
        .header(http::header::HOST, "test")
        .body(Full::new(Bytes::from(vec![b'x'; BIG])))
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), async {
        let resp = pool.send(big).await.map_err(|e| e.to_string())?;
        resp.into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| e.to_string())
    })
    .await
    .expect("first exchange hung");
    assert_eq!(r.as_deref(), Ok(&b"ok"[..]));
    let r = tokio::time::timeout(Duration::from_secs(20), fetch_result(&pool))
        .await
        .expect("second exchange hung");
    assert_eq!(r.as_deref(), Ok(&b"OK"[..]));
    assert_eq!(got_body.load(Ordering::SeqCst), BIG);
}

/// HEAD and 204 answers that say `chunked`: no body, and the connection goes on.
#[tokio::test]
async fn review_head_and_204_with_chunked_have_no_body() {
    let server = wire_server(vec![
        vec![CHUNKED_HEAD],
        vec![b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n"],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    ])
    .await;
    let pool = wire_pool(&server);
    let head = Request::builder()
        .method("HEAD")
        .uri("/mcp")
        .header(http::header::HOST, "test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), pool.send(head))
        .await
        .unwrap()
        .unwrap();
    let b = tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect())
        .await
        .expect("HEAD body hung")
        .unwrap();
    assert!(b.to_bytes().is_empty());
    let r = tokio::time::timeout(Duration::from_secs(5), fetch_result(&pool))
        .await
        .expect("204 hung");
    assert_eq!(r.as_deref(), Ok(&b""[..]));
    let r = tokio::time::timeout(Duration::from_secs(5), fetch_result(&pool))
        .await
        .expect("third hung");
    assert_eq!(r.as_deref(), Ok(&b"ok"[..]));
    assert_eq!(server.accepted(), 1);
}

/// Heads of many shapes, each cut into reads at every place (and at random pairs of places):
/// the outcome is the one of the uncut answer, nothing hangs, and the connection (if kept)
/// serves the next answer right.
#[tokio::test]
async fn review_head_shapes_cut_anywhere_give_the_same_outcome() {
    let cases: &[&[u8]] = &[
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nX-Chunked: no\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n000\r\n\r\n",
    ];
    static NEXT: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    async fn run(pieces: Vec<&'static [u8]>) -> (Result<Bytes, String>, Result<Bytes, String>) {
        let server = wire_server(vec![pieces, vec![NEXT]]).await;
        let pool = wire_pool(&server);
        let a = tokio::time::timeout(Duration::from_secs(3), fetch_result(&pool))
            .await
            .unwrap_or_else(|_| Err("HUNG".into()));
        let b = tokio::time::timeout(Duration::from_secs(3), fetch_result(&pool))
            .await
            .unwrap_or_else(|_| Err("HUNG".into()));
        (a, b)
    }
    let norm = |r: &Result<Bytes, String>| match r {
        Ok(b) => format!("ok {:?}", b),
        Err(e) if e == "HUNG" => "HUNG".to_string(),
        Err(_) => "error".to_string(),
    };
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut failures = Vec::new();
    for case in cases {
        let case: &'static [u8] = case;
        let (wa, wb) = run(vec![case]).await;
        let whole = (norm(&wa), norm(&wb));
        eprintln!("{:?}: {:?} / {:?}", String::from_utf8_lossy(case), wa, wb);
        let mut cuts: Vec<Vec<usize>> = (1..case.len()).map(|c| vec![c]).collect();
        for _ in 0..60 {
            let mut a = 1 + (rnd() as usize) % (case.len() - 1);
            let mut b = 1 + (rnd() as usize) % (case.len() - 1);
            if a > b {
                std::mem::swap(&mut a, &mut b);
            }
            if a != b {
                cuts.push(vec![a, b]);
            }
        }
        for cut in cuts {
            let mut pieces = Vec::new();
            let mut start = 0;
            for &c in &cut {
                pieces.push(&case[start..c]);
                start = c;
            }
            pieces.push(&case[start..]);
            let (a, b) = run(pieces).await;
            let got = (norm(&a), norm(&b));
            if got != whole {
                failures.push(format!(
                    "{:?} cut at {cut:?}: {got:?} (whole: {whole:?}) {a:?} {b:?}",
                    String::from_utf8_lossy(case)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

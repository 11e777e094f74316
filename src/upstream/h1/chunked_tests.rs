//! The chunked body read from a real socket: framing split at every byte, bounds, truncation.

use super::*;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A connected pair: the upstream's end (written by the test) and taskgate's.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (b.unwrap().0, a.unwrap())
}

/// No pool: a body that ends cleanly closes its connection.
struct Closed;

impl Reuse for Closed {
    fn reuse(self, _io: Io) {}
}

struct Body(Chunked<Closed>);

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.0.poll_frame(cx)
    }
}

/// Writes `wire` in pieces of `step` bytes (flushed one by one) and reads the body: the data,
/// or the error's text.
async fn read(wire: &[u8], step: usize, close: bool) -> Result<Vec<u8>, String> {
    let (mut up, tg) = pair().await;
    let wire = wire.to_vec();
    let writer = tokio::spawn(async move {
        for piece in wire.chunks(step.max(1)) {
            if up.write_all(piece).await.is_err() {
                return;
            }
            up.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        if !close {
            // Held open until the reader is done, so a missing end is not an EOF.
            let _ = tokio::io::AsyncReadExt::read(&mut up, &mut [0u8; 1]).await;
        }
    });
    let body = Body(Chunked::new(Io::Plain(tg), BytesMut::new(), None, false));
    let got = body.collect().await;
    drop(writer);
    got.map(|c| c.to_bytes().to_vec())
        .map_err(|e| e.to_string())
}

const WIRE: &[u8] = b"5\r\nhello\r\n1;ext=1\r\n \r\n10\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\n\r\n";

#[tokio::test]
async fn the_data_is_read_whatever_the_pieces_it_arrives_in() {
    for step in [1, 2, 3, 5, 7, WIRE.len()] {
        assert_eq!(
            read(WIRE, step, false).await.unwrap(),
            b"hello 0123456789abcdef",
            "pieces of {step}"
        );
    }
}

#[tokio::test]
async fn a_connection_ending_before_the_last_chunk_is_an_error_not_an_end() {
    for cut in [1, 3, 8, 12, WIRE.len() - 3] {
        let err = read(&WIRE[..cut], 4, true).await.unwrap_err();
        assert!(err.contains("closed the connection"), "cut at {cut}: {err}");
    }
}

#[tokio::test]
async fn bad_framing_is_an_error_that_says_what() {
    let cases: &[(&[u8], &str)] = &[
        (b"zz\r\nab\r\n0\r\n\r\n", "invalid chunk-size"),
        (b"2\r\nabXY0\r\n\r\n", "no CRLF after a chunk's data"),
        (b"fffffffffffffffffffff\r\n", "invalid chunk-size"),
    ];
    for (wire, says) in cases {
        let err = read(wire, 64, false).await.unwrap_err();
        assert!(
            err.contains(says),
            "{:?}: {err}",
            String::from_utf8_lossy(wire)
        );
    }
}

#[tokio::test]
async fn an_endless_size_line_or_trailer_is_refused_at_its_bound() {
    let mut line = b"1;".to_vec();
    line.resize(MAX_LINE + 100, b'x');
    let err = read(&line, 512, false).await.unwrap_err();
    assert!(err.contains("chunk-size line over"), "{err}");
    let mut trailers = b"0\r\n".to_vec();
    while trailers.len() < MAX_TRAILERS + 100 {
        trailers.extend_from_slice(b"X-A: b\r\n");
    }
    let err = read(&trailers, 512, false).await.unwrap_err();
    assert!(err.contains("trailers over"), "{err}");
}

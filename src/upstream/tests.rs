//! The seam ([`Upstream`] over any [`Transport`]) and how the Streamable HTTP transport applies
//! each [`Deadline`], against a scripted upstream socket.

use super::*;
use crate::exchange::{Deadline, Operation, Principal, ReplyBody, RequestContext, RequestParts};
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower::ServiceExt;

fn request(method: &str, deadline: Option<Deadline>) -> McpRequest {
    let text = format!(r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{{}}}}"#);
    let mut req = McpRequest::from(RequestParts {
        op: Operation::Post(crate::jsonrpc::Message::parse(Bytes::from(text)).unwrap()),
        ctx: RequestContext {
            upstream: "up".into(),
            client_session_id: None,
            session_id: None,
            principal: Principal::Anonymous,
            client_addr: None,
            headers: ::http::HeaderMap::new(),
        },
        extensions: ::http::Extensions::new(),
        trace: None,
    });
    if let Some(d) = deadline {
        req.extensions.insert(d);
    }
    req
}

/// An upstream that reads one request per connection and, after `delay`, writes `answer`
/// (then keeps the connection open for a while); taskgate's `timeout_ms` for it is 100.
async fn scripted(delay: Duration, answer: &'static str) -> Upstream {
    scripted_with_timeout(delay, answer, 100).await
}

async fn scripted_with_timeout(delay: Duration, answer: &'static str, timeout_ms: u64) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                tokio::time::sleep(delay).await;
                let _ = socket.write_all(answer.as_bytes()).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            });
        }
    });
    let config: UpstreamConfig = toml::from_str(&format!(
        "name = \"up\"\nurl = \"http://{addr}/mcp\"\ntimeout_ms = {timeout_ms}\n"
    ))
    .unwrap();
    Upstream::for_config(&config, Arc::new(Metrics::new(&["up".to_string()]))).unwrap()
}

const JSON: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 36\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}";
const SILENT_SSE: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

#[tokio::test]
async fn head_deadline_bounds_the_time_to_the_answer() {
    let up = scripted(Duration::from_millis(400), JSON).await;
    let err = up.oneshot(request("tools/call", None)).await.unwrap_err();
    assert!(
        matches!(
            err,
            GatewayError::UpstreamTimeout {
                timeout_ms: 100,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn unbounded_deadline_waits_for_the_answer() {
    let up = scripted(Duration::from_millis(400), JSON).await;
    let reply = up
        .oneshot(request("tasks/result", Some(Deadline::Unbounded)))
        .await
        .unwrap();
    assert!(matches!(reply.body, ReplyBody::Json(ref b) if b.len() == 36));
}

#[tokio::test]
async fn the_method_name_alone_picks_no_deadline() {
    // A `tasks/result` no layer marked is an ordinary request to the transport.
    let up = scripted(Duration::from_millis(400), JSON).await;
    let err = up.oneshot(request("tasks/result", None)).await.unwrap_err();
    assert!(
        matches!(err, GatewayError::UpstreamTimeout { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn exchange_deadline_ends_a_stream_that_never_answers() {
    let up = scripted(Duration::ZERO, SILENT_SSE).await;
    let reply = up
        .oneshot(request("tasks/cancel", Some(Deadline::Exchange)))
        .await
        .unwrap();
    let ReplyBody::Stream(mut events) = reply.body else {
        panic!("an SSE answer");
    };
    let event = tokio::time::timeout(Duration::from_secs(2), events.next())
        .await
        .expect("the deadline ends the stream")
        .expect("an error event");
    let data = event.data.expect("data");
    assert!(
        data.contains("upstream did not answer tasks/cancel within 100 ms"),
        "{data}"
    );
    assert!(data.contains(r#""id":7"#), "{data}");
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn head_deadline_lets_a_started_stream_run() {
    // The head must arrive within timeout_ms for this to test anything: 500 ms leaves room for
    // a loaded machine's scheduling (at 100 ms the head itself timed out once under load 10).
    let up = scripted_with_timeout(Duration::ZERO, SILENT_SSE, 500).await;
    let reply = up.oneshot(request("tasks/cancel", None)).await.unwrap();
    let ReplyBody::Stream(mut events) = reply.body else {
        panic!("an SSE answer");
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(1_000), events.next())
            .await
            .is_err(),
        "no event and no end past timeout_ms"
    );
}

/// What another transport (a stdio child, issue 31) plugs into: the stack sees only `Upstream`.
struct Echo(Arc<str>);

impl Transport for Echo {
    fn name(&self) -> &Arc<str> {
        &self.0
    }

    fn exchange(self: Arc<Self>, req: McpRequest) -> Exchange {
        Box::pin(async move {
            let id = req.id().cloned().expect("a request");
            Ok(McpReply::new(
                ::http::StatusCode::OK,
                ::http::HeaderMap::new(),
                ReplyBody::Json(crate::jsonrpc::result_response(&id, "{}")),
            ))
        })
    }
}

#[tokio::test]
async fn any_transport_is_the_stack_s_innermost_service() {
    let up = Upstream::new(Echo("echo".into()));
    assert_eq!(&**up.name(), "echo");
    let reply = up.oneshot(request("ping", None)).await.unwrap();
    let ReplyBody::Json(body) = reply.body else {
        panic!("a JSON answer");
    };
    assert_eq!(&body[..], br#"{"jsonrpc":"2.0","id":7,"result":{}}"#);
}

/// An `https://` upstream whose `ca_file` cannot be read when its client is built (it went
/// away after the config was checked) is a start-up error naming the file, not a panic.
#[test]
fn an_https_upstream_whose_ca_file_went_away_is_an_error() {
    let config: UpstreamConfig = toml::from_str(
        "name = \"up\"\nurl = \"https://127.0.0.1:1/mcp\"\nca_file = \"/nonexistent/taskgate-ca.pem\"\n",
    )
    .unwrap();
    let err = Upstream::for_config(&config, Arc::new(Metrics::new(&["up".to_string()])))
        .err()
        .expect("refused");
    assert!(
        err.contains("upstream.ca_file") && err.contains("/nonexistent/taskgate-ca.pem"),
        "{err}"
    );
}

//! Tests of the `ids` layer (the module docs say what it must do).

use super::*;
use crate::exchange::Principal;
use crate::layers::testing::{json_of, request};
use crate::sse::Event;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};
use tokio::sync::{mpsc, watch};
use tower::{Layer, ServiceExt};

/// A stack of `ids` over an upstream that hands every request to the test and answers a request
/// (echoing its id and `params`) once the gate opens; as SSE when `sse`.
fn stack(
    sse: bool,
) -> (
    IdsService<
        impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError, Future: Send> + Clone,
    >,
    mpsc::UnboundedReceiver<McpRequest>,
    watch::Sender<bool>,
    Arc<IdsState>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (gate, _) = watch::channel(false);
    let opened = gate.clone();
    let layer = IdsLayer::new(Arc::new(Metrics::new(&["up".to_string()])));
    let state = layer.state.clone();
    let svc = layer.layer(tower::service_fn(move |req: McpRequest| {
        let _ = tx.send(req.clone());
        let mut open = opened.subscribe();
        async move {
            let Operation::Post(msg) = &req.op else {
                return Ok(McpReply::accepted());
            };
            let Some(id) = msg.id().cloned() else {
                return Ok(McpReply::accepted());
            };
            let _ = open.wait_for(|o| *o).await;
            let v: serde_json::Value = msg.parse_as().unwrap();
            let answer = format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{{"echo":{}}}}}"#,
                id.as_json(),
                v["params"]
            );
            if !sse {
                return Ok(McpReply::local_json(Bytes::from(answer)));
            }
            let events = [
                r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#.to_string(),
                answer,
            ]
            .into_iter()
            .map(|d| Event {
                event: None,
                data: Some(d.into()),
                ..Default::default()
            });
            // (Built from `local_json` so that it stays right whatever fields a reply has.)
            let mut reply = McpReply::local_json(Bytes::new());
            reply.headers = HeaderMap::new();
            reply.body = ReplyBody::Stream(Box::pin(futures_util::stream::iter(
                events.collect::<Vec<_>>(),
            )));
            Ok(reply)
        }
    }));
    (svc, rx, gate, state)
}

/// A request of `principal` (with client session `s1` on upstream session `s1`).
fn from(principal: Option<&str>, json: &str) -> McpRequest {
    let mut req = request(json);
    if let Some(p) = principal {
        req.ctx.principal = Principal::Token(p.into());
    }
    req
}

fn body(req: &McpRequest) -> serde_json::Value {
    let Operation::Post(msg) = &req.op else {
        panic!("not a POST")
    };
    msg.parse_as().unwrap()
}

async fn next(rx: &mut mpsc::UnboundedReceiver<McpRequest>) -> McpRequest {
    tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("a request reached the upstream in time")
        .expect("the upstream is alive")
}

/// Issue 29 #10: two callers (alice, bob) with the same id in flight on one upstream session
/// (a session-less upstream: none): the upstream sees two different ids; each caller gets its
/// own answer under its own id, its type kept (`0` a number, `"0"` a string); bob's
/// `notifications/cancelled` names his call upstream, and one naming an id only alice has in
/// flight is not forwarded for him.
#[tokio::test]
async fn the_same_id_from_two_callers_is_kept_apart_upstream() {
    for (id, sse) in [("0", false), ("\"0\"", false), ("7", true)] {
        let (svc, mut seen, gate, state) = stack(sse);
        let call = |who: &str| {
            let mut req = from(
                Some(who),
                &format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{who}"}}}}"#
                ),
            );
            req.ctx.session_id = None;
            req.ctx.client_session_id = None;
            svc.clone().oneshot(req)
        };
        let alice = tokio::spawn(call("alice"));
        let first = next(&mut seen).await;
        let bob = tokio::spawn(call("bob"));
        let second = next(&mut seen).await;
        let (a, b) = (body(&first), body(&second));
        assert_eq!(a["id"].to_string(), id, "the first goes as it came");
        assert_ne!(a["id"], b["id"], "the upstream sees two ids: {a} {b}");

        // bob cancels his call: the cancel names his call's upstream id.
        let cancel = |who: &str, rid: &str| {
            let mut req = from(
                Some(who),
                &format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{rid}}}}}"#
                ),
            );
            req.ctx.session_id = None;
            req.ctx.client_session_id = None;
            svc.clone().oneshot(req)
        };
        cancel("bob", id).await.unwrap();
        let forwarded = body(&next(&mut seen).await);
        assert_eq!(forwarded["params"]["requestId"], b["id"], "{forwarded}");
        // carol has nothing in flight under that id: her cancel would cancel alice's.
        let dropped = cancel("carol", id).await.unwrap();
        assert_eq!(dropped.status, StatusCode::ACCEPTED);
        assert!(seen.try_recv().is_err(), "carol's cancel is not forwarded");

        gate.send_replace(true);
        for (who, task) in [("alice", alice), ("bob", bob)] {
            let reply = task.await.unwrap().unwrap();
            let v = match reply.body {
                ReplyBody::Json(_) => json_of(&reply),
                ReplyBody::Stream(events) => {
                    let all: Vec<Event> = events.collect().await;
                    serde_json::from_str(all.last().unwrap().data.as_deref().unwrap()).unwrap()
                }
                other => panic!("{other:?}"),
            };
            assert_eq!(v["id"].to_string(), id, "{who}: {v}");
            assert_eq!(v["result"]["echo"]["name"], who, "{who}: {v}");
        }
        assert_eq!(
            state.in_flight(),
            0,
            "nothing left once the replies are done"
        );
    }
}

/// Issue 29 #10: a client session reusing an id it has in flight gets `-32600` saying so, and
/// nothing reaches the upstream; once the first is answered the id is free again. Another id
/// type (`"1"` after `1`) is another id.
#[tokio::test]
async fn a_client_reusing_its_own_id_in_flight_is_refused() {
    let (svc, mut seen, gate, state) = stack(false);
    let call = |id: &str| {
        svc.clone().oneshot(request(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x"}}}}"#
        )))
    };
    let first = tokio::spawn(call("1"));
    next(&mut seen).await;
    let again = tokio::time::timeout(std::time::Duration::from_secs(10), call("1"))
        .await
        .expect("answered at once, not forwarded to wait for the upstream")
        .unwrap();
    let again = json_of(&again);
    assert_eq!(again["error"]["code"], -32600, "{again}");
    assert_eq!(again["id"], 1);
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already in flight"),
        "{again}"
    );
    assert!(seen.try_recv().is_err(), "the second is not forwarded");
    let string = tokio::spawn(call("\"1\""));
    let other = body(&next(&mut seen).await);
    assert_eq!(other["id"], "1", "\"1\" is not 1: forwarded as it is");
    gate.send_replace(true);
    first.await.unwrap().unwrap();
    string.await.unwrap().unwrap();
    assert_eq!(state.in_flight(), 0);
    let later = json_of(&call("1").await.unwrap());
    assert_eq!(later["result"]["echo"]["name"], "x", "{later}");
}

/// 2026-07-28 requests (stateless: each POST its own exchange) and `initialize` are not
/// tracked: the same id twice passes as it came.
#[tokio::test]
async fn modern_requests_and_initialize_pass_untouched() {
    let (svc, mut seen, gate, state) = stack(false);
    let mut handles = Vec::new();
    for _ in 0..2 {
        let mut req =
            request(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#);
        req.extensions.insert(Era::Modern);
        handles.push(tokio::spawn(svc.clone().oneshot(req)));
        assert_eq!(body(&next(&mut seen).await)["id"], 1);
        let init = request(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#);
        handles.push(tokio::spawn(svc.clone().oneshot(init)));
        assert_eq!(body(&next(&mut seen).await)["id"], 0);
    }
    assert_eq!(state.in_flight(), 0);
    gate.send_replace(true);
    for h in handles {
        h.await.unwrap().unwrap();
    }
}

//! Unit tests of the session table: only sessions the upstream issued get an entry, the table is
//! bounded, and nobody's traffic evicts a session in use (issue 16, items 1 and 3).

use super::*;
use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::layers::session_guard::SessionGuardLayer;
use crate::layers::testing::request;
use bytes::Bytes;
use tower::{Layer, ServiceExt};

/// An upstream answering `initialize` with session `issued-<n>` and anything else with a
/// `tools/list` result naming one tool.
fn stack(
    sessions: Arc<Sessions>,
) -> impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Clone {
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let upstream = tower::service_fn(move |req: McpRequest| {
        let n = n.clone();
        async move {
            let id = req
                .id()
                .map(|i| i.as_json().to_string())
                .unwrap_or("null".into());
            let mut reply = if req.request_method() == Some("initialize") {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"capabilities":{{"tasks":{{"requests":{{"tools":{{"call":{{}}}}}}}}}}}}}}"#
                );
                let mut r = McpReply::local_json(Bytes::from(body));
                let k = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                r.headers.insert(
                    "mcp-session-id",
                    HeaderValue::from_str(&format!("issued-{k}")).unwrap(),
                );
                r
            } else {
                McpReply::local_json(Bytes::from(format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"t","execution":{{"taskSupport":"required"}}}}]}}}}"#
                )))
            };
            reply.status = http::StatusCode::OK;
            Ok::<_, GatewayError>(reply)
        }
    });
    let inner = SessionLayer::new(sessions.clone()).layer(upstream);
    SessionGuardLayer::new(sessions, false).layer(inner)
}

fn with_session(json: &str, sid: Option<&str>) -> McpRequest {
    let mut req = request(json);
    let sid = sid.map(|s| HeaderValue::from_str(s).unwrap());
    req.ctx.session_id = sid.clone();
    req.ctx.client_session_id = sid;
    req
}

async fn drain(reply: McpReply) {
    // The session layer observes the body as it is read.
    if let ReplyBody::Json(_) = &reply.body {
        let _ = reply.body.map_messages(|_| None);
    }
}

#[tokio::test]
async fn client_chosen_session_ids_create_no_state() {
    let sessions = Sessions::new();
    let svc = stack(sessions.clone());
    for i in 0..1000 {
        let req = with_session(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            Some(&format!("random-{i}")),
        );
        drain(svc.clone().oneshot(req).await.unwrap()).await;
    }
    assert_eq!(
        sessions.len(),
        0,
        "tools/list on unknown sessions must not create entries"
    );
    let init = with_session(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"tasks":{}}}}"#,
        Some("stale"),
    );
    drain(svc.clone().oneshot(init).await.unwrap()).await;
    assert_eq!(sessions.len(), 1);
    let key = SessionKey::Session(HeaderValue::from_static("issued-0"));
    let info = sessions
        .get(&"up".into(), Some(&key))
        .expect("issued session known");
    assert!(info.client_declares_tasks());
    assert!(info.upstream_tasks_tools_call());
    assert!(sessions
        .get(
            &"up".into(),
            Some(&SessionKey::Session(HeaderValue::from_static("stale")))
        )
        .is_none());
}

#[tokio::test]
async fn a_full_table_refuses_new_sessions_and_keeps_the_old_ones() {
    let sessions = Sessions::with_limits(3, Duration::from_secs(3600));
    let svc = stack(sessions.clone());
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#;
    for _ in 0..3 {
        let reply = svc.clone().oneshot(with_session(init, None)).await.unwrap();
        assert_eq!(reply.status, 200);
        drain(reply).await;
    }
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    drain(
        svc.clone()
            .oneshot(with_session(list, Some("issued-0")))
            .await
            .unwrap(),
    )
    .await;
    let refused = svc.clone().oneshot(with_session(init, None)).await.unwrap();
    assert_eq!(refused.status, 503);
    for k in 0..3 {
        let key = SessionKey::Session(HeaderValue::from_str(&format!("issued-{k}")).unwrap());
        assert!(
            sessions.get(&"up".into(), Some(&key)).is_some(),
            "issued-{k} kept"
        );
    }
    let key = SessionKey::Session(HeaderValue::from_static("issued-0"));
    assert_eq!(
        sessions.tool_support(&"up".into(), Some(&key), "t"),
        Some(TaskSupport::Required)
    );
}

#[test]
fn equal_tool_caches_are_shared() {
    let sessions = Sessions::new();
    let up: Arc<str> = "up".into();
    let keys: Vec<_> = (0..2)
        .map(|k| SessionKey::Session(HeaderValue::from_str(&format!("s{k}")).unwrap()))
        .collect();
    let result = serde_json::json!({"tools":[{"name":"a"},{"name":"b","execution":{"taskSupport":"optional"}}]});
    for k in &keys {
        assert!(sessions.insert(&up, Some(k.clone()), Principal::Anonymous, None, None, None));
        sessions.record_tools(&up, Some(k), &result);
    }
    let a = sessions.get(&up, Some(&keys[0])).unwrap().tools;
    let b = sessions.get(&up, Some(&keys[1])).unwrap().tools;
    assert!(Arc::ptr_eq(&a, &b), "one copy of an upstream's tool list");
}

//! MRTR for 2025-11-25 clients (issue 12; 2026-07-28 §2.3 multi-round-trip requests): a pure
//! 2026-07-28 upstream (taskgate holds the client's session) answers a request
//! `input_required`; the 2025 client gets each input request as a server→client request on its
//! stream, answers it with a POSTed response, and gets the final answer under its own id, while
//! the upstream sees the request again under a new id with `inputResponses` and its
//! `requestState` echoed. Only the wire, the upstream's received requests, the registry and
//! `/metrics` are asserted.

use crate::common::*;

use serde_json::{json, Value};
use taskgate::store::Origin;

const CAPS: &str = "io.modelcontextprotocol/clientCapabilities";

/// A `requestState` with characters a careless re-encoding would change.
const STATE_1: &str = "s1:\u{2603}:\"q\"\\/+==";

fn input_required(id: &str, key: &str, method: &str, state: Option<&str>) -> ScriptedResponse {
    let params = match method {
        "elicitation/create" => json!({"mode": "form", "message": format!("{key}?"),
            "requestedSchema": {"type": "object", "properties": {"v": {"type": "string"}}}}),
        "sampling/createMessage" => json!({"messages": [], "maxTokens": 5}),
        _ => json!({}),
    };
    let mut result = json!({"resultType": "input_required",
        "inputRequests": {key: {"method": method, "params": params}}});
    if let Some(s) = state {
        result["requestState"] = json!(s);
    }
    ScriptedResponse::json(rpc_result(id, &result.to_string()))
}

fn complete(id: &str, text: &str) -> ScriptedResponse {
    ScriptedResponse::json(rpc_result(
        id,
        &json!({"resultType": "complete", "content": [{"type": "text", "text": text}]}).to_string(),
    ))
}

/// A pure 2026 upstream (no `initialize`, no sessions) whose tools and prompt ask for input.
fn handler(req: &RecordedRequest) -> ScriptedResponse {
    let id = req.rpc_id_json();
    if req.method != "POST" {
        return ScriptedResponse::status(405, Some("text/plain"), "no GET here");
    }
    let body = req.json();
    let params = &body["params"];
    let answers = &params["inputResponses"];
    let answer = |k: &str| {
        answers[k]["content"]["v"]
            .as_str()
            .unwrap_or("?")
            .to_string()
    };
    match req.rpc_method().as_deref() {
        Some("initialize") => ScriptedResponse::status(
            400,
            Some("application/json"),
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32022,"message":"Unsupported protocol version"}}}}"#
            ),
        ),
        Some("server/discover") => ScriptedResponse::json(rpc_result(
            &id,
            &json!({"resultType":"complete","supportedVersions":[MODERN],
                "capabilities":{"tools":{},"prompts":{},"extensions":{EXT:{}}}})
            .to_string(),
        )),
        Some("tools/call") => match params["name"].as_str().unwrap_or("") {
            "ask_once" if answers.is_null() => {
                input_required(&id, "name", "elicitation/create", Some(STATE_1))
            }
            "ask_once" => complete(&id, &format!("hello {}", answer("name"))),
            "ask_twice" if answers.is_null() => {
                input_required(&id, "a", "elicitation/create", Some(STATE_1))
            }
            "ask_twice" if answers.get("a").is_some() => {
                input_required(&id, "b", "elicitation/create", Some("s2"))
            }
            "ask_twice" => complete(&id, &format!("b={}", answer("b"))),
            "ask_forever" => input_required(&id, "k", "elicitation/create", None),
            "ask_sampling" => input_required(&id, "m", "sampling/createMessage", None),
            // Task-only (`-32021` without the extension); input first, then the task.
            "upgrade_ask" if params["_meta"][CAPS]["extensions"][EXT].is_null() => {
                ScriptedResponse::status(
                    400,
                    Some("application/json"),
                    format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32021,"message":"Missing required client capability","data":{{"requiredCapabilities":{{"extensions":{{"{EXT}":{{}}}}}}}}}}}}"#
                    ),
                )
            }
            "upgrade_ask" if answers.is_null() => {
                input_required(&id, "go", "elicitation/create", Some("u"))
            }
            "upgrade_ask" => {
                let now = format_rfc3339_ms(now_ms());
                ScriptedResponse::json(rpc_result(
                    &id,
                    &json!({"resultType":"task","taskId":"t-up","status":"working",
                        "createdAt": now, "lastUpdatedAt": now, "ttlMs": 60000,
                        "pollIntervalMs": 100})
                    .to_string(),
                ))
            }
            "task_ask" if answers.is_null() => {
                input_required(&id, "go", "elicitation/create", Some("t"))
            }
            "task_ask" => {
                let now = format_rfc3339_ms(now_ms());
                ScriptedResponse::json(rpc_result(
                    &id,
                    &json!({"resultType":"task","taskId":"t-mrtr","status":"working",
                        "createdAt": now, "lastUpdatedAt": now, "ttlMs": 60000,
                        "pollIntervalMs": 1000})
                    .to_string(),
                ))
            }
            _ => complete(&id, "plain"),
        },
        Some("tasks/get") => ScriptedResponse::json(rpc_result(
            &id,
            &detailed(params["taskId"].as_str().unwrap_or(""), "completed").to_string(),
        )),
        Some("prompts/get") if answers.is_null() => {
            input_required(&id, "topic", "elicitation/create", Some("p"))
        }
        Some("prompts/get") => ScriptedResponse::json(rpc_result(
            &id,
            &json!({"resultType":"complete","messages":[{"role":"user",
                "content":{"type":"text","text": format!("about {}", answer("topic"))}}]})
            .to_string(),
        )),
        _ => ScriptedResponse::status(
            404,
            Some("application/json"),
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found"}}}}"#
            ),
        ),
    }
}

async fn setup(caps: Value) -> (Upstream, Tg, Client) {
    let up = Upstream::start(handler).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), caps).await;
    (up, tg, c)
}

/// Answers the client's next server→client request on `sse` (an `elicitation/create`) with
/// `{"action":"accept","content":{"v": value}}`; returns the request.
async fn answer_next(c: &Client, sse: &mut SseReader, value: &str) -> Value {
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"v": value}}});
    assert_eq!(c.send(answer.to_string()).await.status(), 202);
    ask
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in the scrape"))
}

/// One round: the client gets the `elicitation/create` (no related-task `_meta`: there is no
/// task) on its call's stream, answers it, and gets the final result under its own id; the
/// upstream sees the call again under a new id with `inputResponses` and `requestState` echoed
/// verbatim, the rest of `params` as first sent.
#[tokio::test]
async fn one_round_of_input_reaches_a_2025_client_and_the_call_is_retried() {
    let (up, tg, c) = setup(json!({"elicitation": {}})).await;
    let body = rpc(
        "5",
        "tools/call",
        &json!({"name": "ask_once", "arguments": {"x": 1}}).to_string(),
    );
    let r = c.send(body).await;
    assert_eq!(r.status(), 200);
    assert!(r
        .header("content-type")
        .unwrap_or_default()
        .starts_with("text/event-stream"));
    let mut sse = r.sse();
    let ask = answer_next(&c, &mut sse, "Luca").await;
    assert_eq!(ask["params"]["message"], "name?", "{ask}");
    assert!(ask["params"]["_meta"].get(RELATED).is_none(), "{ask}");
    let done = sse.next_event(STEP).await.json();
    assert_eq!(done["id"], 5, "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "hello Luca", "{done}");
    sse.expect_end(STEP).await;

    let calls = up.received("tools/call");
    assert_eq!(calls.len(), 2);
    let (first, retry) = (calls[0].json(), calls[1].json());
    assert_eq!(first["id"], 5);
    assert_ne!(retry["id"], first["id"], "a new id for the retry");
    assert_eq!(retry["params"]["requestState"], json!(STATE_1), "{retry}");
    assert_eq!(
        retry["params"]["inputResponses"]["name"],
        json!({"action": "accept", "content": {"v": "Luca"}}),
        "{retry}"
    );
    assert_eq!(retry["params"]["arguments"], json!({"x": 1}));
    assert_eq!(calls[1].header("mcp-name").as_deref(), Some("ask_once"));
    assert!(!calls[1].has_header("mcp-session-id"));
    let m = tg.metrics_text().await;
    let up_label = r#"upstream="default""#;
    assert_eq!(
        metric(
            &m,
            &format!(r#"taskgate_bridge_mrtr_total{{outcome="completed",{up_label}}}"#)
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            &format!("taskgate_bridge_mrtr_rounds_total{{{up_label}}}")
        ),
        1.0
    );
}

/// Two rounds: each retry has its own new id, carries only the last round's answers and echoes
/// that round's `requestState`; `prompts/get` is bridged the same way.
#[tokio::test]
async fn two_rounds_each_with_a_new_id_and_the_last_request_state() {
    let (up, _tg, c) = setup(json!({"elicitation": {}})).await;
    let r = c
        .send(rpc(
            "\"call-2\"",
            "tools/call",
            &json!({"name": "ask_twice"}).to_string(),
        ))
        .await;
    let mut sse = r.sse();
    answer_next(&c, &mut sse, "one").await;
    answer_next(&c, &mut sse, "two").await;
    let done = sse.next_event(STEP).await.json();
    assert_eq!(done["id"], "call-2", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "b=two", "{done}");
    let calls: Vec<Value> = up
        .received("tools/call")
        .iter()
        .map(RecordedRequest::json)
        .collect();
    assert_eq!(calls.len(), 3);
    let ids: std::collections::HashSet<String> =
        calls.iter().map(|c| c["id"].to_string()).collect();
    assert_eq!(ids.len(), 3, "a new id per round: {ids:?}");
    assert_eq!(calls[1]["params"]["requestState"], json!(STATE_1));
    assert_eq!(calls[2]["params"]["requestState"], "s2");
    let second: Vec<&String> = calls[2]["params"]["inputResponses"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(second, vec!["b"], "{}", calls[2]);

    let r = c
        .send(rpc(
            "9",
            "prompts/get",
            &json!({"name": "p", "arguments": {}}).to_string(),
        ))
        .await;
    let mut sse = r.sse();
    answer_next(&c, &mut sse, "rust").await;
    let done = sse.next_event(STEP).await.json();
    assert_eq!(done["id"], 9);
    assert_eq!(
        done["result"]["messages"][0]["content"]["text"], "about rust",
        "{done}"
    );
}

/// A client that did not declare the capability an input request needs gets a clear JSON-RPC
/// error naming it; nothing is asked and the request is not retried.
#[tokio::test]
async fn a_client_without_the_capability_gets_an_error_naming_it() {
    let (up, tg, c) = setup(json!({"elicitation": {}})).await;
    let v = c.rpc(call_body("3", "ask_sampling", None)).await;
    assert_eq!(err_code(&v), -32600, "{v}");
    let message = err_message(&v);
    assert!(
        message.contains("sampling/createMessage") && message.contains("`sampling`"),
        "{message}"
    );
    assert_eq!(count(&up, "tools/call"), 1);
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            r#"taskgate_bridge_mrtr_total{outcome="refused_capability",upstream="default"}"#
        ),
        1.0
    );
    // An input request not relayed for want of a capability, as a bridged task's is (README:
    // `taskgate_bridge_input_refused_total`). Before: counted in `taskgate_bridge_mrtr_total`
    // only, so the refusals a dashboard of `bridge_input_refused_total` shows left it out.
    assert_eq!(
        metric(
            &m,
            r#"taskgate_bridge_input_refused_total{reason="capability",upstream="default"}"#
        ),
        1.0
    );
}

/// The same for a client that declared no capability at all (`capabilities: {}`): the
/// refusal comes at once, not after the round's `timeout_ms` (30 s by default) spent waiting
/// for an answer the client was never asked for (a report of session 24; it did not reproduce:
/// every MRTR entry's capability is checked before its round asks anything).
#[tokio::test]
async fn a_client_that_declared_nothing_is_refused_at_once() {
    let (up, _tg, c) = setup(json!({})).await;
    let started = std::time::Instant::now();
    let v = c.rpc(call_body("3", "ask_sampling", None)).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err_code(&v), -32600, "{v}");
    assert!(err_message(&v).contains("`sampling`"), "{v}");
    assert_eq!(count(&up, "tools/call"), 1);
}

/// An upstream that asks for input round after round: taskgate relays at most 8 rounds, then
/// answers the client with an error naming the bound.
#[tokio::test]
async fn the_round_bound_ends_an_endless_exchange() {
    let (up, tg, c) = setup(json!({"elicitation": {}})).await;
    let r = c.send(call_body("4", "ask_forever", None)).await;
    let mut sse = r.sse();
    let end = loop {
        let v = sse.next_event(STEP).await.json();
        if v["method"] == "elicitation/create" {
            let answer = json!({"jsonrpc": "2.0", "id": v["id"],
                "result": {"action": "accept", "content": {"v": "again"}}});
            assert_eq!(c.send(answer.to_string()).await.status(), 202);
            continue;
        }
        break v;
    };
    assert_eq!(end["id"], 4, "{end}");
    assert_eq!(err_code(&end), -32603, "{end}");
    assert!(err_message(&end).contains("more than 8 rounds"), "{end}");
    assert_eq!(
        count(&up, "tools/call"),
        9,
        "the first request and 8 retries"
    );
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            r#"taskgate_bridge_mrtr_total{outcome="too_many_rounds",upstream="default"}"#
        ),
        1.0
    );
}

/// A task-augmented call whose upstream needs input before the task exists (2026: MRTR on the
/// call): the client answers, the retry creates the task, and the client gets the nested
/// `CreateTaskResult` under its id, the task recorded as bridged.
#[tokio::test]
async fn a_task_call_that_needs_input_before_its_task_exists() {
    let (up, tg, c) = setup(json!({"elicitation": {}, "tasks": {}})).await;
    let body = rpc(
        "6",
        "tools/call",
        &json!({"name": "task_ask", "arguments": {}, "task": {"ttl": 60000}}).to_string(),
    );
    let r = c.send(body).await;
    let mut sse = r.sse();
    answer_next(&c, &mut sse, "yes").await;
    let done = sse.next_event(STEP).await.json();
    assert_eq!(done["id"], 6, "{done}");
    assert_eq!(done["result"]["task"]["taskId"], "t-mrtr", "{done}");
    assert_eq!(tg.record("t-mrtr").unwrap().origin, Origin::Bridged);
    let retry = up.received("tools/call").pop().unwrap().json();
    assert_eq!(retry["params"]["requestState"], "t");
    assert!(retry["params"].get("task").is_none(), "{retry}");
}

/// The client's `notifications/cancelled` while its input is awaited ends the exchange: its
/// stream ends without an answer and the request is never retried.
#[tokio::test]
async fn a_cancel_while_input_is_awaited_ends_the_exchange() {
    let (up, tg, c) = setup(json!({"elicitation": {}})).await;
    let r = c.send(call_body("8", "ask_once", None)).await;
    let mut sse = r.sse();
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "elicitation/create");
    assert_eq!(
        c.notify("notifications/cancelled", json!({"requestId": 8}))
            .await,
        202
    );
    sse.expect_end(STEP).await;
    let m = eventually(STEP, || async {
        let m = tg.metrics_text().await;
        m.contains(r#"taskgate_bridge_mrtr_total{outcome="disconnected",upstream="default"} 1"#)
            .then_some(m)
    })
    .await;
    assert!(m.is_some(), "counted as disconnected");
    // A late answer goes nowhere.
    let late = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "decline"}});
    assert_eq!(c.send(late.to_string()).await.status(), 202);
    assert_eq!(count(&up, "tools/call"), 1);
}

/// `[upgrade]`: a plain call to a task-only tool is sent again as a task; the upstream needs input
/// before that task exists (MRTR on the call). The client gets its stream as soon as the
/// `elicitation/create` comes (not only once the task exists), answers it, and gets the task's
/// result under its own id.
#[tokio::test]
async fn an_upgraded_call_that_needs_input_before_its_task_exists() {
    let up = Upstream::start(handler).await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({"elicitation": {}})).await;
    let r = c.send(call_body("11", "upgrade_ask", None)).await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    answer_next(&c, &mut sse, "go").await;
    let out = read_to_answer(
        &mut sse,
        &json!(11),
        String::new(),
        std::time::Instant::now(),
    )
    .await;
    assert_eq!(
        out.answer["result"]["content"][0]["text"], "done t-up",
        "{out:?}"
    );
    assert_eq!(tg.record("t-up").unwrap().origin, Origin::Upgraded);
    let calls = up.received("tools/call");
    assert_eq!(calls.len(), 3, "plain, as a task, retried with the answer");
    assert_eq!(calls[2].json()["params"]["requestState"], "u");
}

/// A `sampling/createMessage` the client answers with a JSON-RPC error ends the exchange with
/// `-32603` saying so, and the request is not retried: a 2026 `CreateMessageResult` has no
/// refusal form and `InputResponse` no error member (counted
/// `taskgate_bridge_mrtr_total{outcome="client_error"}`). Before: the retry carried
/// `{"action":"decline"}` (an `ElicitResult`) as the sampling result.
#[tokio::test]
async fn a_sampling_request_answered_with_an_error_is_not_retried() {
    let (up, tg, c) = setup(json!({"sampling": {}})).await;
    let body = rpc(
        "5",
        "tools/call",
        &json!({"name": "ask_sampling", "arguments": {}}).to_string(),
    );
    let r = c.send(body).await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let refusal = json!({"jsonrpc": "2.0", "id": ask["id"],
        "error": {"code": -1, "message": "User rejected sampling request"}});
    assert_eq!(c.send(refusal.to_string()).await.status(), 202);
    let done = sse.next_event(STEP).await.json();
    assert_eq!(done["id"], 5, "{done}");
    assert_eq!(err_code(&done), -32603, "{done}");
    assert!(
        err_message(&done).contains("sampling/createMessage"),
        "{done}"
    );
    let calls: Vec<Value> = up.received("tools/call").iter().map(|c| c.json()).collect();
    assert_eq!(calls.len(), 1, "not retried: {calls:?}");
    // The stream ends once the exchange is counted.
    sse.expect_end(STEP).await;
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            r#"taskgate_bridge_mrtr_total{outcome="client_error",upstream="default"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            r#"taskgate_bridge_input_refused_total{reason="client_error",upstream="default"}"#
        ),
        1.0,
        "an input request the client refused, as a bridged task's"
    );
}

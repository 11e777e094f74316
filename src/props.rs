//! Properties of the parsers that clients and upstreams feed, checked on any input: by the
//! `fuzz/` targets (cargo-fuzz) and, with random inputs, by `cargo test` (the tests below).
//! Each function panics (with what was wrong) when its property does not hold, so a fuzzer
//! reports it as a crash.
//!
//! - [`sse_chunking`]: how a stream is cut into chunks does not change its events.
//! - [`sse_roundtrip`]: [`sse::encode`] then decode gives the events back.
//! - [`envelope`]: a body [`Message::parse_checked`] accepts is one JSON object whose `id`
//!   round-trips; nothing panics.
//! - [`config`]: loading any text never panics.
//! - [`status_rewrite`]: the rewrite that keeps a recorded terminal status final (2025-11-25 and
//!   2026-07-28 task shapes) changes only the status members of the task it targets.
//! - [`modern_task`]: a 2026-07-28 `DetailedTask` read with the registry's field names keeps
//!   every member but the renamed ones.
//! - [`chunked_framing`]: how an upstream's chunked body is cut into reads does not change its
//!   data or how it ends (`upstream/h1/chunked.rs`); nothing panics.
//! - [`bridge_translate`]: the bridge's 2026 → 2025 translations (task, `CreateTaskResult`,
//!   `tasks/result` payload) and 2025 → 2026 request params keep what they must and drop what
//!   the other era does not have.
//! - [`bridge_legacy`]: the bridge's whole-message translations (`notifications/tasks`) and the
//!   2026-only error-code mapping change exactly what they must; the bridge and the registry
//!   read a `CreateTaskResult` alike.
//! - [`held_request`], [`held_answer`], [`held_initialize`]: a held session's request goes
//!   upstream as a 2026 request with its id, params and agreeing routing headers; the answer
//!   comes back in 2025 form; its `initialize` answer is built from `server/discover`.
//! - [`held_record`]: held-session records and the sled expiry index round-trip, bounded.
//! - [`routing_headers`]: `Mcp-Name` encode/decode round-trip; `check` passes exactly
//!   agreeing headers and reports what is missing.
//! - [`listen_mrtr`]: `subscriptions/listen` messages, MRTR `input_required` answers and their
//!   input requests reach a 2025 client as it takes them.

use crate::jsonrpc::{Id, Kind, Message};
use crate::sse::{self, Decoder, Event};
use bytes::Bytes;

/// Decodes `wire` whole, and cut at the positions `cuts` (taken modulo its length, in any
/// order): both give the same events, and both hit the line limit (`max`) or neither does.
pub fn sse_chunking(wire: &[u8], cuts: &[usize], max: usize) {
    let run = |chunks: &[&[u8]]| {
        let mut d = Decoder::new(max);
        let mut out = Vec::new();
        let mut failed = false;
        for c in chunks {
            if d.feed(c, &mut out).is_err() {
                failed = true;
                break;
            }
        }
        (out, failed)
    };
    let (whole, whole_failed) = run(&[wire]);
    let chunks = cut(wire, cuts);
    let (parts, parts_failed) = run(&chunks);
    if whole_failed || parts_failed {
        // Past the limit the events before it may differ by how much was buffered; what is
        // decoded before the failure is a prefix of the whole.
        assert!(
            whole.starts_with(&parts) || parts.starts_with(&whole),
            "events before the limit differ"
        );
        return;
    }
    assert_eq!(parts, whole, "chunks {chunks:?}");
}

/// Cuts `wire` at the positions `cuts` (taken modulo its length, in any order).
fn cut<'a>(wire: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    at.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for c in at {
        chunks.push(&wire[start..c]);
        start = c;
    }
    chunks.push(&wire[start..]);
    chunks
}

/// Decodes `wire` as an upstream's chunked body (RFC 9112 section 7.1) read whole, and read in
/// the pieces `cuts` makes: the same data, and the same ending (the end of the body, an error,
/// or more bytes needed).
pub fn chunked_framing(wire: &[u8], cuts: &[usize]) {
    use crate::upstream::h1::chunked::{next, State, Step};
    let run = |pieces: &[&[u8]]| {
        let (mut state, mut buf) = (State::Size, bytes::BytesMut::new());
        let mut data = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            loop {
                match next(&mut state, &mut buf) {
                    Ok(Step::Data(d)) => data.extend_from_slice(&d),
                    Ok(Step::More) => break,
                    Ok(Step::End) => return (data, "end"),
                    Err(_) => return (data, "error"),
                }
            }
        }
        (data, "more")
    };
    let whole = run(&[wire]);
    let pieces = cut(wire, cuts);
    assert_eq!(run(&pieces), whole, "pieces {pieces:?}");
}

/// The events that `fields` spell (each `(kind, text)`: 0 `event`, 1 `id`, 2 `data`, 3 `retry`,
/// 4 end of event), made valid for the wire (no CR/LF in values, no NUL in ids), encoded with
/// [`sse::encode`] and decoded again: the same events.
pub fn sse_roundtrip(fields: &[(u8, String)]) {
    let clean = |s: &str| s.replace(['\r', '\n'], " ");
    let mut events = Vec::new();
    let mut ev = Event::default();
    for (kind, text) in fields {
        match kind % 5 {
            0 => ev.event = Some(clean(text).into()),
            1 => ev.id = Some(clean(text).replace('\0', "").into()),
            2 => {
                // Lines of data, joined by LF (a CR would end a line on the wire).
                ev.data = Some(text.replace('\r', " ").into());
            }
            3 => ev.retry = Some(text.len() as u64),
            _ => {
                if ev != Event::default() {
                    events.push(std::mem::take(&mut ev));
                }
            }
        }
    }
    if ev != Event::default() {
        events.push(ev);
    }
    // A leading space of a value is eaten by the decoder only when it follows the colon, and
    // `encode` always writes ": ": values keep their own leading spaces.
    let wire: Vec<u8> = events
        .iter()
        .flat_map(|e| sse::encode(e).to_vec())
        .collect();
    let mut d = Decoder::new(usize::MAX / 2);
    let mut out = Vec::new();
    d.feed(&wire, &mut out).expect("no limit");
    assert_eq!(out, events, "wire {:?}", String::from_utf8_lossy(&wire));
}

/// A client body as the edge parses it: accepted ⇒ one JSON object, with `jsonrpc: "2.0"`, whose
/// `id` (if any) is the message's id and reads back as itself.
pub fn envelope(body: &[u8]) {
    let Ok(msg) = Message::parse_checked(Bytes::copy_from_slice(body)) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_slice(body).expect("accepted ⇒ JSON");
    let obj = v.as_object().expect("accepted ⇒ one JSON object");
    assert_eq!(obj.get("jsonrpc"), Some(&serde_json::json!("2.0")));
    match msg.id() {
        Some(id) => {
            assert_eq!(
                Id::from_json(id.as_json()).as_ref(),
                Some(id),
                "id reads back"
            );
            assert_eq!(
                Id::from_value(&obj["id"]).as_ref(),
                Some(id),
                "id is the message's"
            );
        }
        None => assert!(
            matches!(msg.kind(), Kind::Notification | Kind::Error),
            "only notifications and errors have no id"
        ),
    }
}

/// Loading any text as a configuration returns a config or an error; it never panics.
pub fn config(text: &str) {
    let _ = crate::config::Config::from_toml_str(text);
}

/// Where an upstream message carries a task: 2025-11-25 `result` (`tasks/get`), `result.task`
/// (`CreateTaskResult`), `params` (`notifications/tasks/status`); 2026-07-28 `result`
/// (`DetailedTask`) and `params` (`notifications/tasks`).
const TASK_AT: &[&[&str]] = &[&["result"], &["result", "task"], &["params"]];

/// The terminal-status rewrite on any upstream message `body`: the task at `TASK_AT[at % 3]` is
/// rewritten to show the recorded terminal status `TaskStatus::ALL[2 + status % 3]` and
/// `message`, by the 2025 path ([`Observed::rewrite_bytes`]) and, for one-member paths, the
/// 2026 path (`observe::modern::rewrite`, which also drops `result`/`error` from a cancelled
/// task). When either rewrites: the output is JSON; the task shows that status and
/// `statusMessage` (absent when `message` is `None`); a 2026 cancelled task has no `result` or
/// `error`; every other member of the message is as it was.
///
/// [`Observed::rewrite_bytes`]: crate::registry::Observed::rewrite_bytes
pub fn status_rewrite(body: &[u8], at: u8, status: u8, message: Option<&str>) {
    use crate::mcp::task::TaskStatus;
    use crate::registry::Observed;
    use serde_json::Value;
    let path = TASK_AT[at as usize % TASK_AT.len()];
    let status = TaskStatus::ALL[2 + status as usize % 3];
    let observed = Observed::Rewrite {
        status,
        status_message: message.map(str::to_string),
    };
    let check = |out: &[u8], modern: bool| {
        let before: Value = serde_json::from_slice(body).expect("rewritten ⇒ the input was JSON");
        let after: Value = serde_json::from_slice(out).unwrap_or_else(|e| {
            panic!(
                "rewrite gave no JSON ({e}): {}",
                String::from_utf8_lossy(out)
            )
        });
        let task_of = |v: &Value| {
            path.iter()
                .try_fold(v.clone(), |v, k| v.get(k).cloned())
                .expect("the task is still there")
        };
        let mut task = task_of(&after);
        assert_eq!(task["status"], status.as_str(), "status: {task}");
        assert_eq!(
            task.get("statusMessage").and_then(Value::as_str),
            message,
            "statusMessage: {task}"
        );
        let mut dropped = vec!["status", "statusMessage"];
        if modern && status == TaskStatus::Cancelled {
            assert!(
                task.get("result").is_none() && task.get("error").is_none(),
                "{task}"
            );
            dropped.extend(["result", "error"]);
        }
        let mut was = task_of(&before);
        for k in dropped {
            for t in [&mut task, &mut was] {
                if let Some(o) = t.as_object_mut() {
                    o.remove(k);
                }
            }
        }
        assert_eq!(task, was, "other task members changed");
        let (mut a, mut b) = (before, after);
        for v in [&mut a, &mut b] {
            let mut slot = &mut *v;
            for k in path {
                slot = &mut slot[*k];
            }
            *slot = Value::Null;
        }
        assert_eq!(a, b, "members outside the task changed");
    };
    if let Some(out) = observed.rewrite_bytes(body, path) {
        check(&out, false);
    }
    if let [member] = path {
        let bytes = Bytes::copy_from_slice(body);
        let out = crate::layers::observe::modern::rewrite(&observed, &bytes, member);
        if out != bytes {
            check(&out, true);
        }
    }
}

/// A 2026-07-28 task object (any JSON in `body`) as the registry reads it
/// ([`crate::registry::as_registry_task`]): `ttlMs` becomes `ttl` (`null` becomes `cap`),
/// `pollIntervalMs` becomes `pollInterval`, every other member (`taskId`, `status`, ...) is kept
/// as it was, and a value that is not an object is returned unchanged.
pub fn modern_task(body: &[u8], cap: u64) {
    use serde_json::Value;
    let Ok(task) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let out = crate::registry::as_registry_task(&task, cap);
    let Some(obj) = task.as_object() else {
        assert_eq!(out, task);
        return;
    };
    let out = out.as_object().expect("an object stays an object");
    for (k, v) in obj {
        match k.as_str() {
            "ttlMs" => {
                let want = if v.is_null() {
                    Value::from(cap)
                } else {
                    v.clone()
                };
                assert_eq!(out.get("ttl"), Some(&want), "ttl");
            }
            "pollIntervalMs" => assert_eq!(out.get("pollInterval"), Some(v), "pollInterval"),
            "ttl" if obj.contains_key("ttlMs") => {}
            "pollInterval" if obj.contains_key("pollIntervalMs") => {}
            _ => assert_eq!(out.get(k), Some(v), "member {k}"),
        }
    }
    assert!(!out.contains_key("ttlMs") && !out.contains_key("pollIntervalMs"));
}
/// `v` without the `createdAt` / `lastUpdatedAt` of the task it is or holds (`task`,
/// `params`): the bridge shows an upstream's invalid time as taskgate's clock, which moves
/// between two translations of one message.
fn clockless(mut v: serde_json::Value) -> serde_json::Value {
    for at in ["", "/task", "/params"] {
        if let Some(o) = v.pointer_mut(at).and_then(serde_json::Value::as_object_mut) {
            o.remove("createdAt");
            o.remove("lastUpdatedAt");
        }
    }
    v
}

/// The bridge's translations (`layers::bridge::translate`) on any JSON value `body`:
/// - `legacy_task`: a task only for an object with string `taskId` and `status`; the same
///   `taskId`; `status` kept, except a `completed` with `result.isError: true` is `failed`;
///   `ttlMs`/`pollIntervalMs` become `ttl`/`pollInterval` (`ttl` null when absent); `resultType`,
///   `result`, `error`, `inputRequests`, `_meta` dropped; every other member kept;
/// - `legacy_create_result`: `{"task": legacy_task}` exactly when `resultType` is `"task"`;
/// - `modern_params`: no `task`; `_meta` declares the tasks extension and protocol 2026-07-28,
///   keeps the client's other `_meta` members but the 2025 related-task key; other params kept;
/// - `terminal_payload`: only for a terminal `status`; a result without `resultType` and with
///   the related-task `_meta`; an error with an integer `code`.
pub fn bridge_translate(body: &[u8]) {
    use crate::layers::bridge::translate::{self as t, Payload};
    use crate::mcp::capabilities::declares_tasks_extension;
    use crate::mcp::era::{MODERN_VERSION, PROTOCOL_VERSION_META};
    use crate::mcp::task::RELATED_TASK_META;
    use serde_json::{json, Value};
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let str_of = |k: &str| v.get(k).and_then(Value::as_str);
    let legacy = t::legacy_task(&v);
    let is_task = v.is_object() && str_of("taskId").is_some() && str_of("status").is_some();
    assert_eq!(legacy.is_some(), is_task, "legacy_task of {v}");
    if let Some(out) = &legacy {
        let o = out.as_object().expect("a task is an object");
        assert_eq!(o.get("taskId"), v.get("taskId"));
        let tool_error = v.pointer("/result/isError") == Some(&json!(true));
        let want = if str_of("status") == Some("completed") && tool_error {
            "failed"
        } else {
            str_of("status").unwrap_or_default()
        };
        assert_eq!(o.get("status").and_then(Value::as_str), Some(want), "{out}");
        let renamed = |new: &str, old: &str, default: Option<Value>| {
            let want = v.get(old).or(v.get(new)).cloned().or(default);
            assert_eq!(o.get(new).cloned(), want, "{new} of {v}");
        };
        renamed("ttl", "ttlMs", Some(Value::Null));
        // A `pollInterval` only when a whole number of ms, times only RFC 3339 ones (the
        // upstream's when valid): what a 2025 client's schema checks is valid.
        let poll = v
            .get("pollIntervalMs")
            .or(v.get("pollInterval"))
            .filter(|p| p.is_u64());
        assert_eq!(o.get("pollInterval"), poll, "pollInterval of {v}");
        let valid = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .filter(|t| crate::mcp::task::parse_rfc3339_ms(t).is_some())
        };
        for k in ["createdAt", "lastUpdatedAt"] {
            let at = o.get(k).and_then(Value::as_str).unwrap_or_default();
            assert!(
                crate::mcp::task::parse_rfc3339_ms(at).is_some(),
                "{k} of {out}"
            );
        }
        if let Some(created) = valid("createdAt") {
            assert_eq!(o.get("createdAt").and_then(Value::as_str), Some(created));
        }
        if let Some(updated) = valid("lastUpdatedAt").or(valid("createdAt")) {
            assert_eq!(
                o.get("lastUpdatedAt").and_then(Value::as_str),
                Some(updated)
            );
        }
        for (k, val) in v.as_object().into_iter().flatten() {
            match k.as_str() {
                "resultType" | "result" | "error" | "inputRequests" | "_meta" | "ttlMs"
                | "pollIntervalMs" => assert!(!o.contains_key(k), "{k} kept in {out}"),
                "status" | "ttl" | "pollInterval" | "createdAt" | "lastUpdatedAt" => {}
                _ => assert_eq!(o.get(k), Some(val), "member {k}"),
            }
        }
    }
    let created = t::legacy_create_result(&v);
    match (str_of("resultType") == Some("task"), &legacy) {
        (true, Some(task)) => assert_eq!(
            created.map(clockless),
            Some(clockless(json!({ "task": task })))
        ),
        _ => assert_eq!(created, None),
    }
    let params = t::modern_params(Some(&v));
    assert!(params.get("task").is_none(), "task kept: {params}");
    assert!(declares_tasks_extension(Some(&params)), "{params}");
    // Read from the raw `_meta` (the 2026 `tasks/*` gate) as from the `Value`.
    let raw_meta = crate::jsonrpc::splice::raw_at(body, &["_meta"])
        .ok()
        .flatten();
    assert_eq!(
        crate::mcp::capabilities::meta_declares_tasks_extension(raw_meta.map(|r| r.get())),
        declares_tasks_extension(Some(&v)),
        "{v}"
    );
    let meta = &params["_meta"];
    assert_eq!(meta[PROTOCOL_VERSION_META], MODERN_VERSION);
    assert!(meta.get(RELATED_TASK_META).is_none());
    if let Some(client) = v.get("_meta").and_then(Value::as_object) {
        for (k, val) in client {
            if k != RELATED_TASK_META
                && k != PROTOCOL_VERSION_META
                && k != crate::mcp::capabilities::CLIENT_CAPABILITIES_META
            {
                assert_eq!(meta.get(k), Some(val), "_meta member {k}");
            }
        }
    }
    for (k, val) in v.as_object().into_iter().flatten() {
        if k != "task" && k != "_meta" {
            assert_eq!(params.get(k), Some(val), "param {k}");
        }
    }
    let terminal = matches!(str_of("status"), Some("completed" | "failed" | "cancelled"));
    match t::terminal_payload(&v, "t") {
        None => assert!(!terminal, "no payload for terminal {v}"),
        Some(p) => {
            assert!(terminal, "payload for live {v}");
            match p {
                Payload::Result(r) => {
                    assert!(r.get("resultType").is_none(), "{r}");
                    assert_eq!(r["_meta"][RELATED_TASK_META], json!({"taskId": "t"}), "{r}");
                }
                Payload::Error(e) => assert!(e["code"].is_i64(), "{e}"),
                Payload::None(_) => {}
            }
        }
    }
}

/// A reply with these parts (built from a constructor: `McpReply` may gain fields).
fn reply_of(
    status: http::StatusCode,
    headers: http::HeaderMap,
    body: crate::exchange::ReplyBody,
) -> crate::exchange::McpReply {
    let mut reply = crate::exchange::McpReply::accepted();
    reply.status = status;
    reply.headers = headers;
    reply.body = body;
    reply
}

/// A JSON-RPC id as a `Value`, when it is one an [`Id`] takes (a string or an integer).
fn id_value(v: &serde_json::Value) -> Option<&serde_json::Value> {
    v.get("id").filter(|id| Id::from_value(id).is_some())
}

/// The bridge's 2026 → 2025 translations of whole messages and errors
/// (`layers::bridge::translate`, `layers::bridge::errors`) on any JSON text `body`:
/// - `legacy_notification`: exactly a `notifications/tasks` notification (no `id`) whose params
///   `legacy_task` reads becomes `notifications/tasks/status` with those params, and nothing
///   else does (however the method is spelled: `\/`, `\u` escapes);
/// - `legacy_code` follows the table (`-32021` naming the tasks extension → `-32601`, other
///   `-32021` and `-32020` → `-32600`, `-32022` → `-32602`, nothing else); `legacy_error`
///   changes only `code`; `is_task_required` reads the same before and after the mapping;
/// - `legacy_message` maps exactly the messages whose `error` has such a code, changing nothing
///   but `error.code`; `legacy_reply` answers HTTP 200 for a mapped `-32021` only;
/// - the flat `CreateTaskResult`, read by the bridge (`legacy_create_result`) and by the
///   registry (`era::as_registry_task`), gives the same `taskId`, `ttl` (`null` ⇒ the cap),
///   `pollInterval`, and the same status but for a tool error shown `failed`;
/// - `mark_task_support` gives every tool object a `taskSupport` and changes no other member;
///   `add_legacy_tasks_capability` adds `tasks` once, to a capabilities object without it.
pub fn bridge_legacy(body: &[u8]) {
    use crate::exchange::ReplyBody;
    use crate::layers::bridge::{errors as e, translate as t};
    use crate::mcp::capabilities::TASKS_EXTENSION;
    use crate::mcp::errors::{
        HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION,
    };
    use crate::registry::as_registry_task;
    use serde_json::{json, Value};
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let parsed = serde_json::from_str::<Value>(text).ok();
    // Notifications.
    let out = t::legacy_notification(text);
    let want = parsed.as_ref().and_then(|v| {
        let is_tasks = v.get("method").and_then(Value::as_str) == Some("notifications/tasks")
            && v.get("id").is_none();
        is_tasks.then(|| t::legacy_task(v.get("params")?)).flatten()
    });
    match (&out, &want) {
        (Some(out), Some(task)) => {
            let out: Value = serde_json::from_str(out).expect("the notification is JSON");
            assert_eq!(
                clockless(out),
                clockless(
                    json!({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task})
                )
            );
        }
        (None, None) => {}
        _ => panic!("legacy_notification of {text}: {out:?}, want {want:?}"),
    }
    let Some(v) = parsed else {
        assert_eq!(e::legacy_message(text), None, "not JSON: {text}");
        return;
    };
    // Error codes.
    let error = v.get("error").unwrap_or(&v);
    let code = error.get("code").and_then(Value::as_i64);
    let names_tasks = error
        .pointer("/data/requiredCapabilities/extensions")
        .and_then(|x| x.get(TASKS_EXTENSION))
        .is_some();
    let want = match code {
        Some(MISSING_REQUIRED_CLIENT_CAPABILITY) if names_tasks => Some(-32601),
        Some(MISSING_REQUIRED_CLIENT_CAPABILITY | HEADER_MISMATCH) => Some(-32600),
        Some(UNSUPPORTED_PROTOCOL_VERSION) => Some(-32602),
        _ => None,
    };
    assert_eq!(e::legacy_code(error), want, "code of {error}");
    let mapped = e::legacy_error(error);
    let mut back = mapped.clone();
    if let (Some(_), Some(o)) = (want, back.as_object_mut()) {
        assert_eq!(o.get("code"), Some(&json!(want)));
        o.insert("code".into(), json!(code));
    }
    assert_eq!(&back, error, "only the code changes");
    assert_eq!(e::is_task_required(&mapped), e::is_task_required(error));
    // Whole messages.
    let message_code = v.get("error").and_then(e::legacy_code);
    match (e::legacy_message(text), message_code) {
        (Some(out), Some(code)) => {
            let mut want = v.clone();
            want["error"]["code"] = json!(code);
            let out: Value = serde_json::from_str(&out).expect("the mapped message is JSON");
            assert_eq!(out, want);
        }
        (None, None) => {}
        (out, _) => panic!("legacy_message of {text}: {out:?}, want {message_code:?}"),
    }
    let reply = reply_of(
        http::StatusCode::BAD_REQUEST,
        http::HeaderMap::new(),
        ReplyBody::Json(Bytes::copy_from_slice(body)),
    );
    let was = v.pointer("/error/code").and_then(Value::as_i64);
    let ok = message_code.is_some() && was == Some(MISSING_REQUIRED_CLIENT_CAPABILITY);
    assert_eq!(
        e::legacy_reply(reply).status.as_u16(),
        if ok { 200 } else { 400 }
    );
    // A CreateTaskResult read by the bridge and by the registry.
    if let Some(created) = t::legacy_create_result(&v) {
        let task = &created["task"];
        let registry = as_registry_task(&v, 7);
        assert_eq!(task["taskId"], registry["taskId"]);
        let tool_error = v.pointer("/result/isError") == Some(&json!(true));
        if registry["status"] == "completed" && tool_error {
            assert_eq!(task["status"], "failed");
        } else {
            assert_eq!(task["status"], registry["status"]);
        }
        if v.get("ttlMs").is_some_and(|t| !t.is_null()) {
            assert_eq!(task["ttl"], registry["ttl"], "ttl of {v}");
        }
        assert_eq!(task.get("pollInterval"), registry.get("pollInterval"));
    }
    // tools/list and InitializeResult.
    let mut tools = v.clone();
    let changed = t::mark_task_support(&mut tools, &|name| name.len() % 2 == 1);
    assert_eq!(changed, tools != v, "whether it changed");
    if let (Some(before), Some(after)) = (
        v.get("tools").and_then(Value::as_array),
        tools.get("tools").and_then(Value::as_array),
    ) {
        assert_eq!(before.len(), after.len());
        for (b, a) in before.iter().zip(after) {
            let (Some(bo), Some(ao)) = (b.as_object(), a.as_object()) else {
                assert_eq!(a, b, "a tool that is not an object is kept");
                continue;
            };
            for (k, val) in bo {
                if k != "execution" {
                    assert_eq!(ao.get(k), Some(val), "tool member {k}");
                }
            }
            let exec = &ao["execution"];
            match bo.get("execution") {
                Some(x) if !x.is_object() => assert_eq!(exec, x),
                Some(x) if x.get("taskSupport").is_some() => assert_eq!(exec, x),
                x => {
                    let support = exec["taskSupport"].as_str().expect("taskSupport added");
                    assert!(matches!(support, "optional" | "required"), "{support}");
                    let mut rest = exec.clone();
                    rest.as_object_mut().map(|o| o.remove("taskSupport"));
                    assert_eq!(&rest, x.unwrap_or(&json!({})));
                }
            }
        }
    } else {
        assert_eq!(tools, v);
    }
    let mut init = v.clone();
    let caps = v.get("capabilities").and_then(Value::as_object);
    let adds = caps.is_some_and(|c| !c.contains_key("tasks"));
    assert_eq!(t::add_legacy_tasks_capability(&mut init), adds);
    assert!(!t::add_legacy_tasks_capability(&mut init.clone()));
    if adds {
        assert!(init
            .pointer("/capabilities/tasks/requests/tools/call")
            .is_some());
        init["capabilities"]
            .as_object_mut()
            .map(|c| c.remove("tasks"));
    }
    assert_eq!(init, v);
}

/// A fixed held session for the properties: 0 none, 1 every capability (some taskgate does not
/// relay) and a `clientInfo`, 2 nothing declared, 3 only `roots`.
fn held_session_of(pick: u8) -> Option<crate::layers::extensions::HeldSession> {
    use crate::layers::extensions::HeldSession;
    use serde_json::json;
    let params = match pick % 4 {
        0 => return None,
        1 => json!({"capabilities": {"elicitation": {"form": {}}, "sampling": {},
            "roots": {"listChanged": true}, "experimental": {"x": {}}, "tasks": {"list": {}},
            "extensions": {crate::mcp::capabilities::TASKS_EXTENSION: {}}},
            "clientInfo": {"name": "c", "version": "1"}}),
        2 => json!({}),
        _ => json!({"capabilities": {"roots": {}}}),
    };
    Some(HeldSession::from_initialize(Some(&params)))
}

/// A POSTed `msg` as a request of a held session, with the client's own headers.
fn held_request_of(
    msg: Message,
    headers: http::HeaderMap,
    held: Option<crate::layers::extensions::HeldSession>,
) -> crate::exchange::McpRequest {
    use crate::exchange::{McpRequest, Operation, Principal, RequestContext, RequestParts};
    let session = http::HeaderValue::from_static("tgh-00000000000000000000000000000000");
    let mut extensions = http::Extensions::new();
    if let Some(h) = held {
        extensions.insert(std::sync::Arc::new(h));
    }
    McpRequest::from(RequestParts {
        op: Operation::Post(msg),
        ctx: RequestContext {
            upstream: "up".into(),
            session_id: Some(session.clone()),
            client_session_id: Some(session),
            principal: Principal::Anonymous,
            client_addr: None,
            headers,
        },
        extensions,
        trace: None,
    })
}

/// A held session's request (any client `body` the edge accepts) as the stateless 2026-07-28
/// request that goes upstream (`layers::bridge::sessionless::modernize`, `add_session_meta`).
/// `flags`: bits 0-1 pick the held session (`held_session_of`); bits 2, 3, 4 make the
/// client send a stale `Mcp-Name`, a wrong `Mcp-Method`, a 2025 `MCP-Protocol-Version`.
/// - made exactly for a request (an id and a method);
/// - the id is the client's, as the same JSON text (so of the same JSON type), the method too;
///   the upstream's envelope parse accepts the message;
/// - `params`: every member but `_meta` kept, nothing added; `_meta`: the 2026 protocol
///   version, the session's relayed capabilities (`elicitation`, `sampling`, `roots`; never the
///   extensions), the client's `clientInfo` (else the session's), no related-task key, every
///   other member kept;
/// - no `Mcp-Session-Id` upstream, `MCP-Protocol-Version: 2026-07-28`, and routing headers the
///   edge's check (`mcp::routing_headers::check`) finds agreeing with the body and complete
///   (only a method that cannot be a header value is missing).
pub fn held_request(flags: u8, body: &[u8]) {
    use crate::exchange::Operation;
    use crate::layers::bridge::sessionless::{self as held, CLIENT_INFO_META};
    use crate::mcp::capabilities::CLIENT_CAPABILITIES_META;
    use crate::mcp::era::{MODERN_VERSION, PROTOCOL_VERSION_META};
    use crate::mcp::routing_headers::{self as routing, MCP_METHOD, MCP_NAME};
    use crate::mcp::task::RELATED_TASK_META;
    use http::{HeaderMap, HeaderValue};
    use serde_json::{Map, Value};
    let Ok(msg) = Message::parse_checked(Bytes::copy_from_slice(body)) else {
        return;
    };
    let session = held_session_of(flags);
    let mut headers = HeaderMap::new();
    if flags & 4 != 0 {
        headers.insert(&MCP_NAME, HeaderValue::from_static("stale"));
    }
    if flags & 8 != 0 {
        headers.insert(&MCP_METHOD, HeaderValue::from_static("other/method"));
    }
    if flags & 16 != 0 {
        headers.insert(
            &crate::headers::MCP_PROTOCOL_VERSION,
            HeaderValue::from_static("2025-11-25"),
        );
    }
    let input: Option<Value> = msg.parse_as().ok();
    let req = held_request_of(msg.clone(), headers, session.clone());
    let out = held::modernize(&req);
    let is_request = msg.id().is_some() && msg.method().is_some() && input.is_some();
    assert_eq!(out.is_some(), is_request, "modernize of {msg:?}");
    let (Some(out), Some(input)) = (out, input) else {
        return;
    };
    let Operation::Post(sent) = &out.op else {
        panic!("not a POST")
    };
    let sent = Message::parse_checked(sent.bytes().clone())
        .unwrap_or_else(|e| panic!("the upstream would refuse {sent:?}: {e:?}"));
    assert_eq!(sent.kind(), Kind::Request);
    assert_eq!(
        sent.id().map(Id::as_json),
        msg.id().map(Id::as_json),
        "the id"
    );
    assert_eq!(sent.method(), msg.method());
    let v: Value = sent.parse_as().expect("JSON");
    assert_eq!(v["id"], input["id"], "the id's JSON");
    let params = v["params"].as_object().expect("params");
    let empty = Map::new();
    let client = input
        .get("params")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (k, val) in params {
        if k != "_meta" {
            assert_eq!(client.get(k), Some(val), "param {k}");
        }
    }
    for k in client.keys() {
        assert!(params.contains_key(k), "param {k} lost");
    }
    let meta = params["_meta"].as_object().expect("_meta");
    let client_meta = client
        .get("_meta")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    assert_eq!(meta[PROTOCOL_VERSION_META], MODERN_VERSION);
    assert!(!meta.contains_key(RELATED_TASK_META));
    let relayed: Map<String, Value> = session
        .iter()
        .flat_map(|s| s.client_capabilities.as_object())
        .flatten()
        .filter(|(k, _)| matches!(k.as_str(), "elicitation" | "sampling" | "roots"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(meta[CLIENT_CAPABILITIES_META], Value::Object(relayed));
    let info = client_meta
        .get(CLIENT_INFO_META)
        .or(session.as_ref().and_then(|s| s.client_info.as_ref()));
    assert_eq!(meta.get(CLIENT_INFO_META), info, "clientInfo");
    for (k, val) in client_meta {
        if ![
            RELATED_TASK_META,
            PROTOCOL_VERSION_META,
            CLIENT_CAPABILITIES_META,
        ]
        .contains(&&**k)
        {
            assert_eq!(meta.get(k), Some(val), "_meta member {k}");
        }
    }
    assert!(out.ctx.session_id.is_none());
    assert_eq!(
        out.ctx.headers.get(&crate::headers::MCP_PROTOCOL_VERSION),
        Some(&HeaderValue::from_static(MODERN_VERSION))
    );
    let method = sent.method().expect("a request");
    match routing::check(&out.ctx.headers, &sent) {
        Ok(r) => assert!(
            r.missing
                .iter()
                .all(|(n, _)| **n == MCP_METHOD && HeaderValue::from_str(method).is_err()),
            "the upstream leg lacks {:?}",
            r.missing
        ),
        Err(e) => panic!("the upstream leg's routing headers: {e}"),
    }
}

/// A 2026 upstream's reply to a held session's request as a 2025 client takes it
/// (`layers::bridge::sessionless::legacy_answer`), for any JSON body (`flags` bits 0-2 pick the HTTP
/// status; bit 3 sends `body` as SSE events, cut at `0xFF` bytes):
/// - no `Mcp-Session-Id`; a 4xx carrying one JSON-RPC error is HTTP 200, any other status
///   stays;
/// - each message is as it came, or: a `notifications/tasks` is the `notifications/tasks/status`
///   of `legacy_task`; an `input_required` answer with a string or integer id is a `-32603`
///   error under the same id (same JSON value), never relayed as it is.
pub fn held_answer(flags: u8, body: &[u8]) {
    use crate::exchange::ReplyBody;
    use crate::layers::bridge::{sessionless as held, translate as t};
    use futures_util::{FutureExt, StreamExt};
    use serde_json::Value;
    let status = [200, 400, 404, 401, 500, 413, 202, 409][flags as usize % 8];
    let status = http::StatusCode::from_u16(status).expect("a status");
    let mut headers = http::HeaderMap::new();
    headers.insert("mcp-session-id", http::HeaderValue::from_static("up-1"));
    let check = |before: &str, after: &str| {
        let Ok(v) = serde_json::from_str::<Value>(before) else {
            assert_eq!(after, before, "not JSON: kept");
            return;
        };
        let out: Value = serde_json::from_str(after)
            .unwrap_or_else(|e| panic!("{after:?} is no JSON ({e}), from {before}"));
        if let Some(status) = t::legacy_notification(before) {
            let status: Value = serde_json::from_str(&status).expect("the notification is JSON");
            assert_eq!(clockless(out), clockless(status));
            return;
        }
        let input_required =
            v.pointer("/result/resultType").and_then(Value::as_str) == Some("input_required");
        match id_value(&v).filter(|_| input_required) {
            Some(id) => {
                assert_eq!(out.get("id"), Some(id), "the id");
                assert_eq!(out.pointer("/error/code"), Some(&Value::from(-32603)));
                assert!(out.get("result").is_none());
            }
            None => assert_eq!(after, before, "kept"),
        }
    };
    if flags & 8 == 0 {
        let reply = reply_of(
            status,
            headers,
            ReplyBody::Json(Bytes::copy_from_slice(body)),
        );
        let out = held::legacy_answer(reply);
        assert!(out.headers.get("mcp-session-id").is_none());
        let error = serde_json::from_slice::<Value>(body).is_ok_and(|v| {
            v.get("jsonrpc").is_some() && v.get("error").is_some_and(Value::is_object)
        });
        let want = if status.is_client_error() && error {
            http::StatusCode::OK
        } else {
            status
        };
        assert_eq!(out.status, want);
        let ReplyBody::Json(after) = out.body else {
            panic!("a JSON body stays JSON")
        };
        match std::str::from_utf8(body) {
            Ok(before) => check(before, std::str::from_utf8(&after).expect("UTF-8")),
            Err(_) => assert_eq!(&after[..], body),
        }
        return;
    }
    let events: Vec<sse::Event> = body
        .split(|&b| b == 0xFF)
        .map(|d| sse::Event::message(String::from_utf8_lossy(d).into_owned()))
        .collect();
    let reply = reply_of(
        http::StatusCode::OK,
        headers,
        ReplyBody::Stream(Box::pin(futures_util::stream::iter(events.clone()))),
    );
    let out = held::legacy_answer(reply);
    let ReplyBody::Stream(stream) = out.body else {
        panic!("a stream stays a stream")
    };
    let after: Vec<sse::Event> = stream
        .collect()
        .now_or_never()
        .expect("a ready stream is read at once");
    assert_eq!(after.len(), events.len(), "events");
    for (b, a) in events.iter().zip(&after) {
        assert_eq!((&a.event, &a.id, a.retry), (&b.event, &b.id, b.retry));
        check(
            b.data.as_deref().unwrap_or_default(),
            a.data.as_deref().unwrap_or_default(),
        );
    }
}

/// The `InitializeResult` taskgate answers a held session's `initialize` with, from any
/// `server/discover` result `body` (`layers::held_sessions::held_initialize_result`); `flags`
/// picks the client's requested `protocolVersion` and whether the upstream has the tasks
/// extension:
/// - `protocolVersion` the requested one when it is a 2025-era revision, else `2025-11-25`
///   (never 2026-07-28);
/// - `capabilities` the upstream's without `extensions`, plus the 2025 `tasks` (when the
///   upstream has the extension and does not declare `tasks` itself);
/// - `serverInfo` the upstream's when it has a string `name`, else taskgate's; `instructions`
///   exactly when the upstream gave a string; nothing else.
pub fn held_initialize(flags: u8, body: &[u8]) {
    use crate::layers::held_sessions::held_initialize_result;
    use serde_json::{json, Value};
    let Ok(discovered) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let requested = [
        None,
        Some(json!("2025-06-18")),
        Some(json!("2026-07-28")),
        Some(json!("2024-11-05")),
        Some(json!(20251125)),
        Some(json!("2025-03-26")),
        Some(json!("2025-11-25 ")),
        Some(json!("2025-11-25")),
    ][flags as usize % 8]
        .clone();
    let modern_tasks = flags & 8 != 0;
    let r = held_initialize_result(requested.as_ref(), &discovered, modern_tasks);
    let o = r.as_object().expect("an object");
    let legacy = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
    let want = requested
        .as_ref()
        .and_then(Value::as_str)
        .filter(|v| legacy.contains(v))
        .unwrap_or("2025-11-25");
    assert_eq!(o["protocolVersion"], want);
    let mut caps = match discovered.get("capabilities") {
        Some(Value::Object(c)) => c.clone(),
        _ => Default::default(),
    };
    caps.remove("extensions");
    if modern_tasks && !caps.contains_key("tasks") {
        caps.insert(
            "tasks".into(),
            json!({"cancel": {}, "list": {}, "requests": {"tools": {"call": {}}}}),
        );
    }
    assert_eq!(o["capabilities"], Value::Object(caps));
    let info = discovered.pointer("/_meta/io.modelcontextprotocol~1serverInfo");
    match info.filter(|i| i.get("name").is_some_and(Value::is_string)) {
        Some(i) => assert_eq!(&o["serverInfo"], i),
        None => assert_eq!(o["serverInfo"]["name"], "taskgate"),
    }
    let instructions = discovered.get("instructions").filter(|i| i.is_string());
    assert_eq!(o.get("instructions"), instructions);
    assert_eq!(o.len(), 3 + usize::from(instructions.is_some()));
}

/// Held sessions in the stores (`store::held`, the sled store's expiry index):
/// - `HeldSessionRecord::decode` of any bytes never panics; what it reads is within its bounds,
///   encodes to at most [`held_record_max_len`] bytes and reads back as itself;
/// - what a held session keeps of any `initialize` params (`HeldSession::from_initialize`) is
///   within the record's bounds (the store never refuses it) and round-trips;
/// - the sled `held_by_expiry` key reads back as its parts (`read_expiry_key`), sorts by
///   `expires_at` first, and the sweep's bound `expiry_key(now + 1, "", "")` lies above the
///   keys of exactly the sessions expired at `now`.
pub fn held_record(body: &[u8]) {
    use crate::layers::extensions::HeldSession;
    use crate::store::held::HeldSessionRecord;
    use crate::store::sled_store::held::{expiry_key, read_expiry_key};
    if let Ok(r) = HeldSessionRecord::decode(body) {
        assert_eq!(r.check(), Ok(()));
        let text = r.encode();
        assert!(text.len() <= held_record_max_len(), "{} bytes", text.len());
        assert_eq!(HeldSessionRecord::decode(text.as_bytes()).ok(), Some(r));
    }
    if let Ok(params) = serde_json::from_slice::<serde_json::Value>(body) {
        let held = HeldSession::from_initialize(Some(&params));
        assert!(held.client_capabilities.get("tasks").is_none());
        let r = HeldSessionRecord {
            upstream: "u".repeat(crate::store::held::MAX_HELD_UPSTREAM),
            session_id: "tgh-00000000000000000000000000000000".into(),
            owner: Some("o".repeat(crate::store::held::MAX_HELD_OWNER)),
            protocol_version: Some("2025-11-25".into()),
            capability_bits: 15,
            upstream_tasks_tools_call: true,
            upstream_without_tasks: false,
            client_capabilities: held.client_capabilities,
            client_info: held.client_info,
            expires_at: u64::MAX,
            upstream_issued: false,
        };
        assert_eq!(
            r.check(),
            Ok(()),
            "the store refuses what a held session keeps"
        );
        assert_eq!(
            HeldSessionRecord::decode(r.encode().as_bytes()).ok(),
            Some(r)
        );
    }
    // The sled expiry index: two keys and a sweep time from the input.
    let mut parts = body.split(|&b| b == 0xFF);
    let mut next = || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let (u1, s1, u2, s2) = (next(), next(), next(), next());
    let num = |at: usize| {
        let mut b = [0u8; 8];
        for (i, x) in b.iter_mut().enumerate() {
            *x = body.get(at + i).copied().unwrap_or(0);
        }
        // Small values too, so that equal times happen.
        let n = u64::from_be_bytes(b);
        if n % 3 == 0 {
            n % 4
        } else {
            n
        }
    };
    let (e1, e2, now) = (num(0), num(8), num(16));
    let (k1, k2) = (expiry_key(e1, &u1, &s1), expiry_key(e2, &u2, &s2));
    assert_eq!(read_expiry_key(&k1), Some((e1, u1.as_str(), s1.as_str())));
    assert_eq!(read_expiry_key(&k2), Some((e2, u2.as_str(), s2.as_str())));
    if e1 != e2 {
        assert_eq!(k1.cmp(&k2), e1.cmp(&e2), "keys sort by expiry");
    }
    if now < u64::MAX {
        let bound = expiry_key(now + 1, "", "");
        assert_eq!(k1 < bound, e1 <= now, "the sweep's bound at {now} for {e1}");
    }
    if let Some((e, u, s)) = read_expiry_key(body) {
        assert!(body.starts_with(&expiry_key(e, u, s)));
    }
}

/// The longest a valid `HeldSessionRecord` encodes to: its bounded fields at the worst JSON
/// escaping (6 bytes a byte), the bounded JSON as it is, and the rest.
pub fn held_record_max_len() -> usize {
    use crate::store::held::*;
    use crate::store::held::{MAX_HELD_CAPABILITIES, MAX_HELD_CLIENT_INFO};
    6 * (MAX_HELD_UPSTREAM + MAX_HELD_SESSION_ID + MAX_HELD_OWNER + MAX_HELD_PROTOCOL_VERSION)
        + MAX_HELD_CAPABILITIES
        + MAX_HELD_CLIENT_INFO
        + 512
}

/// The 2026-07-28 routing headers (`mcp::routing_headers`) on any input: `flags` picks what
/// the client sends, `parts` (cut at `0xFF`) give the body's method, the body's name, a raw
/// `Mcp-Method` and a raw `Mcp-Name`.
/// - `decode(encode(s))` is `s` for any text, and `encode` gives visible ASCII without
///   surrounding whitespace; `decode` of any header value never panics, and a value without
///   the `=?base64?…?=` form decodes to itself;
/// - `check` of headers that agree with the body (the method, the name as `encode` writes it
///   or as its base64 form) passes; of any headers: never a panic; a refusal says "Header
///   mismatch"; a pass means each header sent says what the body says; what it reports missing
///   is exactly what was not sent (and can be written), and with it added the check passes
///   with nothing missing.
pub fn routing_headers(flags: u8, parts: &[u8]) {
    use crate::mcp::routing_headers::{check, decode, encode, name_param, MCP_METHOD, MCP_NAME};
    use http::{HeaderMap, HeaderValue};
    use serde_json::json;
    let mut cut = parts.split(|&b| b == 0xFF);
    let mut next = || cut.next().unwrap_or_default();
    let (method_raw, name_raw, header_method, header_name) = (next(), next(), next(), next());
    let name = String::from_utf8_lossy(name_raw).into_owned();
    let enc = encode(&name);
    assert!(
        enc.as_bytes().iter().all(|b| (0x20..0x7f).contains(b)),
        "{enc:?}"
    );
    assert_eq!(
        enc.to_str().expect("ASCII").trim(),
        enc.to_str().expect("ASCII")
    );
    assert_eq!(decode(&enc).as_deref(), Ok(name.as_str()), "{enc:?}");
    if let Ok(raw) = HeaderValue::from_bytes(header_name) {
        if let Ok(text) = decode(&raw) {
            if !header_name.starts_with(b"=?base64?") {
                assert_eq!(text.as_bytes(), header_name);
            }
            assert_eq!(decode(&encode(&text)).as_deref(), Ok(text.as_str()));
        }
    }
    let methods = [
        "tools/call",
        "prompts/get",
        "resources/read",
        "tasks/get",
        "tools/list",
    ];
    let method = match flags % 8 {
        m @ 0..=4 => methods[m as usize].to_string(),
        _ => String::from_utf8_lossy(method_raw).into_owned(),
    };
    let key = name_param(&method);
    let mut params = json!({"name": 1, "uri": [1], "taskId": null});
    if flags & 8 != 0 {
        if let Some(k) = key {
            params[k] = json!(name);
        }
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let msg = Message::parse(Bytes::from(body.to_string())).expect("a request");
    let body_name = key.and_then(|k| params[k].as_str());
    // Agreeing headers pass.
    let mut agree = HeaderMap::new();
    if let Ok(m) = HeaderValue::from_str(&method) {
        agree.insert(&MCP_METHOD, m);
    }
    if let Some(n) = body_name {
        let v = if flags & 16 != 0 {
            use base64::Engine;
            let b64 = base64::engine::general_purpose::STANDARD.encode(n);
            HeaderValue::from_str(&format!("=?base64?{b64}?=")).expect("ASCII")
        } else {
            encode(n)
        };
        agree.insert(&MCP_NAME, v);
    }
    assert_eq!(
        check(&agree, &msg),
        Ok(Default::default()),
        "{agree:?} {body}"
    );
    // Any headers.
    let mut headers = HeaderMap::new();
    let sent_method = (flags & 32 != 0)
        .then(|| HeaderValue::from_bytes(header_method).ok())
        .flatten();
    let sent_name = (flags & 64 != 0)
        .then(|| HeaderValue::from_bytes(header_name).ok())
        .flatten();
    for (h, v) in [(&MCP_METHOD, &sent_method), (&MCP_NAME, &sent_name)] {
        if let Some(v) = v {
            headers.append(h, v.clone());
            if flags & 128 != 0 {
                headers.append(h, v.clone());
            }
        }
    }
    match check(&headers, &msg) {
        Err(e) => assert!(e.starts_with("Header mismatch"), "{e}"),
        Ok(r) => {
            assert!(flags & 128 == 0 || (sent_method.is_none() && sent_name.is_none()));
            if let Some(m) = &sent_method {
                assert_eq!(m.as_bytes(), method.as_bytes());
            }
            if let Some(n) = &sent_name {
                assert_eq!(decode(n).ok().as_deref(), body_name);
            }
            let want_method = sent_method.is_none() && HeaderValue::from_str(&method).is_ok();
            let want_name = sent_name.is_none() && body_name.is_some();
            let names: Vec<_> = r.missing.iter().map(|(n, _)| (*n).clone()).collect();
            let mut want = Vec::new();
            if want_method {
                want.push(MCP_METHOD.clone());
            }
            if want_name {
                want.push(MCP_NAME.clone());
            }
            assert_eq!(names, want);
            for (n, v) in r.missing {
                headers.insert(n, v);
            }
            assert_eq!(check(&headers, &msg), Ok(Default::default()));
        }
    }
}

/// The 2026 path's other untrusted inputs, on any JSON text `body` (`flags` picks an id):
/// - a `subscriptions/listen` message for a held session's GET stream
///   (`layers::held_sessions::listen::legacy_listen_event`): a relayed one is a JSON notification that
///   is not the acknowledgement and carries no subscription id `_meta`, otherwise as it came
///   (or its `notifications/tasks/status` translation); an answer ends the stream, a request or
///   anything else is skipped;
/// - the listen filter (`Offer`) names only what the capabilities offer;
/// - an MRTR `input_required` answer (`mrtr::input_required`) is recognised only for its own id,
///   and always for it; each of its `inputRequests` becomes, for the client
///   (`Inputs::ask_round` / `ask`), a JSON-RPC request the edge parses, under an id taskgate
///   mints, with the entry's method and params (plus the related-task `_meta` for a task),
///   or is refused for a method taskgate does not relay; at most one request per key.
pub fn listen_mrtr(flags: u8, body: &[u8]) {
    use crate::exchange::{Principal, RequestContext};
    use crate::layers::bridge::translate as t;
    use crate::layers::held_sessions::listen::{legacy_listen_event, Listened, Offer};
    use crate::layers::relay::input::{capability_for, Ask, Inputs};
    use crate::layers::relay::mrtr;
    use crate::mcp::capabilities::SUBSCRIPTION_ID_META;
    use crate::mcp::task::RELATED_TASK_META;
    use serde_json::{json, Value};
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let parsed = serde_json::from_str::<Value>(text).ok();
    match (legacy_listen_event(text), &parsed) {
        (Listened::Skip, None) => {}
        (_, None) => panic!("not JSON, not skipped: {text}"),
        (Listened::End, Some(v)) => {
            assert!(v.get("id").is_some() && v.get("method").is_none(), "{v}")
        }
        (Listened::Skip, Some(v)) => {
            let method = v.get("method").and_then(Value::as_str);
            assert!(
                v.get("id").is_some()
                    || matches!(
                        method,
                        None | Some("notifications/subscriptions/acknowledged")
                    ),
                "{v}"
            );
        }
        (Listened::Relay(out), Some(v)) => {
            let out: Value = serde_json::from_str(&out).expect("relayed JSON");
            assert!(v.get("id").is_none() && out.get("id").is_none());
            assert_ne!(
                out["method"].as_str(),
                Some("notifications/subscriptions/acknowledged")
            );
            assert!(out
                .pointer("/params/_meta")
                .and_then(|m| m.get(SUBSCRIPTION_ID_META))
                .is_none());
            let mut want = v.clone();
            if let Some(p) = want.get_mut("params").and_then(Value::as_object_mut) {
                if let Some(m) = p.get_mut("_meta").and_then(Value::as_object_mut) {
                    m.remove(SUBSCRIPTION_ID_META);
                    if m.is_empty() {
                        p.remove("_meta");
                    }
                }
            }
            match t::legacy_notification(&want.to_string()) {
                Some(status) => assert_eq!(
                    clockless(out),
                    clockless(serde_json::from_str::<Value>(&status).unwrap())
                ),
                None => assert_eq!(out, want),
            }
        }
    }
    let Some(v) = parsed else {
        return;
    };
    // The listen filter.
    let offer = Offer::of(v.get("capabilities").unwrap_or(&v));
    let uris: std::collections::BTreeSet<String> = ["a://1".to_string(), "b".to_string()].into();
    for u in [&uris, &Default::default()] {
        if let Some(f) = offer.filter(u) {
            let f = f.as_object().expect("an object");
            assert!(!f.is_empty());
            for (k, val) in f {
                match k.as_str() {
                    "resourceSubscriptions" => assert_eq!(val, &json!(u)),
                    "toolsListChanged" | "promptsListChanged" | "resourcesListChanged" => {
                        assert_eq!(val, &json!(true))
                    }
                    _ => panic!("filter member {k}"),
                }
            }
        }
    }
    // MRTR input requests.
    let ids = [json!(1), json!("1"), json!(-7), json!("taskgate-bridge-1")];
    let id_json = &ids[flags as usize % ids.len()];
    let id = Id::from_value(id_json).expect("an id");
    let is_answer = v.get("jsonrpc") == Some(&json!("2.0"))
        && v.get("method").is_none()
        && v.get("error").is_none()
        && v.get("result").is_some()
        && v.get("id").and_then(Id::from_value).as_ref() == Some(&id);
    let want = is_answer
        && v.pointer("/result/resultType").and_then(Value::as_str) == Some("input_required");
    let got = mrtr::input_required(body, &id);
    assert_eq!(got.is_some(), want, "input_required of {v} for {id_json}");
    let Some(requests) = v
        .pointer("/result/inputRequests")
        .and_then(Value::as_object)
    else {
        return;
    };
    let ctx = RequestContext {
        upstream: "up".into(),
        session_id: None,
        client_session_id: Some(http::HeaderValue::from_static("s")),
        principal: Principal::Anonymous,
        client_addr: None,
        headers: http::HeaderMap::new(),
    };
    let inputs = Inputs::default();
    let (answers, _rx) = tokio::sync::mpsc::channel(requests.len().max(1));
    let round = flags & 8 == 0;
    let mut minted = std::collections::HashSet::new();
    for _ in 0..2 {
        for (key, request) in requests {
            let ask = if round {
                inputs.ask_round(&|_| true, &ctx, "mrtr-1-1", key, request, &answers)
            } else {
                inputs.ask(&|_| true, &ctx, "t-1", key, request)
            };
            let method = request.get("method").and_then(Value::as_str).unwrap_or("");
            match ask {
                Ask::Send(m) => {
                    assert!(capability_for(method).is_some(), "{method} relayed");
                    let msg = Message::parse_checked(Bytes::from(m.clone()))
                        .unwrap_or_else(|e| panic!("the client would refuse {m}: {e:?}"));
                    assert_eq!(msg.kind(), Kind::Request);
                    assert_eq!(msg.method(), Some(method));
                    let id = msg.id().expect("an id").as_json().to_string();
                    assert!(id.starts_with("\"taskgate-input-"), "{id}");
                    assert!(minted.insert(id), "a key asked twice");
                    let out: Value = serde_json::from_str(&m).expect("JSON");
                    let mut params = request
                        .get("params")
                        .filter(|p| p.is_object())
                        .cloned()
                        .unwrap_or(json!({}));
                    if !round {
                        let meta = params
                            .as_object_mut()
                            .expect("an object")
                            .entry("_meta")
                            .or_insert(json!({}));
                        if let Some(m) = meta.as_object_mut() {
                            m.insert(RELATED_TASK_META.into(), json!({"taskId": "t-1"}));
                        }
                    }
                    assert_eq!(out["params"], params);
                }
                Ask::Already => {}
                Ask::Unsupported(m) => {
                    assert_eq!(m, method);
                    assert!(capability_for(method).is_none());
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "props_tests.rs"]
mod tests;

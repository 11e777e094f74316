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
//!   data or how it ends (`upstream/chunked.rs`); nothing panics.
//! - [`bridge_translate`]: the bridge's 2026 → 2025 translations (task, `CreateTaskResult`,
//!   `tasks/result` payload) and 2025 → 2026 request params keep what they must and drop what
//!   the other era does not have.

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
    use crate::upstream::chunked::{next, State, Step};
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
/// ([`crate::era::as_registry_task`]): `ttlMs` becomes `ttl` (`null` becomes `cap`),
/// `pollIntervalMs` becomes `pollInterval`, every other member (`taskId`, `status`, ...) is kept
/// as it was, and a value that is not an object is returned unchanged.
pub fn modern_task(body: &[u8], cap: u64) {
    use serde_json::Value;
    let Ok(task) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let out = crate::era::as_registry_task(&task, cap);
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
    use crate::era::{declares_tasks_extension, MODERN_VERSION, PROTOCOL_VERSION_META};
    use crate::layers::bridge::translate::{self as t, Payload};
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
        renamed("pollInterval", "pollIntervalMs", None);
        for (k, val) in v.as_object().into_iter().flatten() {
            match k.as_str() {
                "resultType" | "result" | "error" | "inputRequests" | "_meta" | "ttlMs"
                | "pollIntervalMs" => assert!(!o.contains_key(k), "{k} kept in {out}"),
                "status" | "ttl" | "pollInterval" => {}
                _ => assert_eq!(o.get(k), Some(val), "member {k}"),
            }
        }
    }
    let created = t::legacy_create_result(&v);
    match (str_of("resultType") == Some("task"), &legacy) {
        (true, Some(task)) => assert_eq!(created, Some(json!({ "task": task }))),
        _ => assert_eq!(created, None),
    }
    let params = t::modern_params(Some(&v));
    assert!(params.get("task").is_none(), "task kept: {params}");
    assert!(declares_tasks_extension(Some(&params)), "{params}");
    let meta = &params["_meta"];
    assert_eq!(meta[PROTOCOL_VERSION_META], MODERN_VERSION);
    assert!(meta.get(RELATED_TASK_META).is_none());
    if let Some(client) = v.get("_meta").and_then(Value::as_object) {
        for (k, val) in client {
            if k != RELATED_TASK_META
                && k != PROTOCOL_VERSION_META
                && k != crate::era::CLIENT_CAPABILITIES_META
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

#[cfg(test)]
#[path = "props_tests.rs"]
mod tests;

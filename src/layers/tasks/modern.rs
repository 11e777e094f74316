//! The `tasks` layer under MCP 2026-07-28 (the tasks extension `io.modelcontextprotocol/tasks`,
//! SEP-2663; DESIGN.md "Two eras, one gateway"). Requests whose [`Era`] is modern come here.
//!
//! - `tools/call`: the server alone decides whether it becomes a task, so every call goes
//!   upstream with a [`PendingCreation`] (era `modern`, a provisional slot of the owner's taken
//!   even at `tasks.max_live_tasks_per_owner`); `observe` records a `CreateTaskResult`
//!   (`resultType:"task"`) durably before the reply is passed on, and gives the slot back for any
//!   other answer. A live task over the limit (the provisional slot not admitted:
//!   `Registry::admit_creation`) is not recorded: `observe` cancels it upstream and answers
//!   `-32029`, the limit's answer in both eras.
//! - `tasks/get`, `tasks/update`, `tasks/cancel`: the spec's gates first, in its order, then the
//!   registry, all answered here and never forwarded when they refuse:
//!   1. `params._meta` does not declare the extension → `-32021` with
//!      `data.requiredCapabilities` (HTTP 400);
//!   2. no string `params.taskId` → `-32602` (HTTP 400);
//!   3. a `taskId` taskgate never recorded, expired, or another owner's → `-32602` (HTTP 400).
//!      The owner is the bearer principal; with `[auth] mode = "none"` there is no session to
//!      bind to in 2026, so the unguessable `taskId` is the only key (as the spec allows), and
//!      ids taskgate never recorded are still refused.
//!
//!   A `tasks/get` of a task whose terminal result the record holds (see
//!   `tasks.max_stored_result_bytes`) is answered from the record with the bytes that passed
//!   through. Otherwise the request goes on with an [`AuthorisedTask`].
//! - `tasks/result`, `tasks/list`: do not exist under 2026-07-28 → `-32601` (HTTP 404).
//! - `subscriptions/listen`: `params.notifications.taskIds` keeps only the caller's recorded tasks
//!   (the others are removed from the request, byte-exact splice; the server then acknowledges
//!   only those in `notifications/subscriptions/acknowledged`), so no caller can listen to
//!   another owner's task. More than [`MAX_LISTEN_TASK_IDS`] ids → `-32602` (HTTP 400).

use crate::exchange::{McpReply, McpRequest, Operation};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::{AuthorisedTask, OnBehalfOf, PendingCreation};
use crate::mcp::capabilities::{declares_tasks_extension, meta_declares_tasks_extension};
use crate::mcp::classify::Classified;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::metrics::{CancelOutcome, LocalReason, TaskMethod};
use crate::registry::Registry;
use crate::store::TaskRecord;
use serde_json::Value;
use std::sync::Arc;

/// What the layer does with a modern request.
pub(super) enum Decision {
    /// Forward it (possibly after setting extensions).
    Forward,
    /// Answer it here.
    Answer(McpReply),
    /// A `tasks/get|update|cancel` to authorise against the registry.
    Authorise,
    /// A `subscriptions/listen` whose `notifications.taskIds` are filtered to the caller's tasks.
    Listen,
}

/// The decision that needs no registry read.
pub(super) fn decide(registry: &Registry, req: &mut McpRequest) -> Decision {
    match req.request_method() {
        Some("tools/call") => {
            prepare_creation(registry, req);
            Decision::Forward
        }
        Some("tasks/get" | "tasks/update" | "tasks/cancel") => Decision::Authorise,
        Some("subscriptions/listen") => Decision::Listen,
        Some(m @ ("tasks/result" | "tasks/list")) => {
            let error = McpError::NotInModernEra {
                method: m.to_string(),
            };
            Decision::Answer(
                McpReply::error(Era::Modern, req.id(), &error)
                    .answered_locally(LocalReason::MethodNotFound),
            )
        }
        _ => Decision::Forward,
    }
}

/// Every modern `tools/call` may come back as a task: a [`PendingCreation`] for `observe`.
fn prepare_creation(registry: &Registry, req: &mut McpRequest) {
    let Operation::Post(msg) = &req.op else {
        return;
    };
    if msg.id().is_none() {
        return;
    }
    // The tool name, as the edge classified it.
    let tool = Classified::of(msg).tool().map(std::borrow::Cow::into_owned);
    let owner = req.ctx.caller().modern_owner();
    let reservation = registry.reserve_modern(&req.ctx.upstream, &owner);
    let template = TaskRecord {
        upstream_session: None,
        era: Era::Modern,
        ..super::template(req, owner, tool)
    };
    req.extensions.insert(PendingCreation {
        template: Arc::new(template),
        reservation: Arc::new(reservation),
        progress_token: None,
        created: Arc::default(),
    });
}

/// Gates and owner binding for `tasks/get|update|cancel` (see the module docs).
pub(super) async fn authorise(
    registry: &Arc<Registry>,
    req: &mut McpRequest,
) -> Result<(), McpReply> {
    let Operation::Post(msg) = &req.op else {
        return Ok(());
    };
    let (Some(id), Some(method)) = (msg.id().cloned(), msg.method().map(str::to_string)) else {
        return Ok(());
    };
    let refuse = |error: McpError, reason: LocalReason| {
        McpReply::error(Era::Modern, Some(&id), &error).answered_locally(reason)
    };
    // Read from the members the edge's envelope parse indexed (no `Value` tree of the request).
    let classified = Classified::of(msg);
    if !meta_declares_tasks_extension(classified.param("_meta")) {
        tracing::debug!(method, "tasks request without the tasks extension in _meta");
        return Err(refuse(
            McpError::MissingTasksExtension,
            LocalReason::MissingExtension,
        ));
    }
    let Some(task_id) = classified.task_id().map(std::borrow::Cow::into_owned) else {
        let error = McpError::MissingParam {
            method: Some(method),
            key: "taskId",
            shape: "a string",
        };
        return Err(refuse(error, LocalReason::InvalidParams));
    };
    let owner = match req.extensions.get::<OnBehalfOf>() {
        Some(OnBehalfOf(owner)) => owner.clone(),
        None => req.ctx.caller().modern_owner(),
    };
    let upstream = req.ctx.upstream.clone();
    let Ok(looked) = registry.lookup_checked(&upstream, &task_id, &owner).await else {
        return Err(refuse(
            McpError::StoreUnavailable { method: None },
            LocalReason::StoreUnavailable,
        ));
    };
    let Some(record) = looked else {
        if let Some(m) = TaskMethod::parse(&method) {
            registry.metrics().task_lookup_rejected(&upstream, m);
        }
        if method == "tasks/cancel" {
            registry
                .metrics()
                .cancel_request(&upstream, CancelOutcome::RejectedUnknown);
        }
        return Err(refuse(
            McpError::TaskNotFound { task_id },
            LocalReason::TaskNotFound,
        ));
    };
    super::link_creating_span(req, &record);
    // A 2025-11-25 task's stored payload is its `tasks/result`, not a `DetailedTask`: the
    // reverse bridge (`bridge::reverse`) builds that one.
    if method == "tasks/get" && record.era == Era::Modern {
        if let Some(reply) = stored_result(&record, &id) {
            return Err(reply);
        }
    }
    // A task taskgate ended itself (its upstream or child lost it), whichever era created it:
    // the failed `DetailedTask` with the error it was failed with (`super::lost`), not a
    // request to the session that lost it (review 17 #13).
    if method == "tasks/get" {
        if let Some(reply) = super::lost::answer(&record, TaskMethod::Get, Era::Modern, &id) {
            return Err(reply);
        }
    }
    // A task created on a 2025 session keeps going out on it (dual-era servers serve it there).
    if record.era == Era::Legacy {
        req.ctx.session_id = record
            .upstream_session
            .as_deref()
            .and_then(|s| http::HeaderValue::from_str(s).ok());
    }
    req.extensions.insert(AuthorisedTask { record });
    Ok(())
}

/// The answer to a `tasks/get` of a terminal task from the result its record holds.
fn stored_result(record: &TaskRecord, id: &Id) -> Option<McpReply> {
    if !record.status.is_terminal() {
        return None;
    }
    let result = record.terminal_result.as_deref()?;
    Some(
        McpReply::local_json(jsonrpc::result_response(id, result))
            .answered_locally(LocalReason::StoredResult),
    )
}

/// Most `taskIds` one `subscriptions/listen` may name (each is one registry read).
pub const MAX_LISTEN_TASK_IDS: usize = 256;

/// Filters `params.notifications.taskIds` of a `subscriptions/listen` to the tasks `owner`
/// owns; refusals are answered in `era`'s form (the method is 2026-07-28's, but a 2025 client
/// can send it on a held session).
pub(super) async fn filter_listen(
    registry: &Arc<Registry>,
    req: &mut McpRequest,
    owner: &crate::store::Owner,
    era: Era,
) -> Result<(), McpReply> {
    let Operation::Post(msg) = &req.op else {
        return Ok(());
    };
    const PATH: [&str; 3] = ["params", "notifications", "taskIds"];
    // A `taskIds` that is not an array is refused, never passed on unread: an upstream that
    // took one id as a string, or a set as an object, streamed another owner's task to the
    // caller (break-edge F2). Entries that are not strings name no task: they are removed like
    // unknown ids.
    let not_an_array = || {
        let error = McpError::InvalidParam {
            method: Some("subscriptions/listen".into()),
            key: "notifications.taskIds".into(),
            problem: "must be an array of task ids".into(),
        };
        McpReply::error(era, msg.id(), &error).answered_locally(LocalReason::InvalidParams)
    };
    let (named, ids): (usize, Vec<String>) =
        match crate::jsonrpc::splice::raw_at(msg.bytes(), &PATH) {
            Ok(Some(raw)) => match serde_json::from_str::<Vec<Value>>(raw.get()) {
                Ok(v) => (
                    v.len(),
                    v.into_iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect(),
                ),
                Err(_) => return Err(not_an_array()),
            },
            Ok(None) => return Ok(()),
            Err(_) => return Err(not_an_array()),
        };
    // 2026-07-28: a listen naming tasks needs the tasks extension, whoever owns the ids (asked
    // after the ids were filtered, a client naming only others' tasks was acknowledged).
    if era == Era::Modern
        && named > 0
        && !declares_tasks_extension(
            msg.parse_as::<Value>()
                .ok()
                .as_ref()
                .and_then(|v| v.get("params")),
        )
    {
        return Err(
            McpReply::error(Era::Modern, msg.id(), &McpError::MissingTasksExtension)
                .answered_locally(LocalReason::MissingExtension),
        );
    }
    if named > MAX_LISTEN_TASK_IDS {
        let error = McpError::TooManyTaskIds {
            max: MAX_LISTEN_TASK_IDS,
        };
        return Err(
            McpReply::error(era, msg.id(), &error).answered_locally(LocalReason::InvalidParams)
        );
    }
    let mut kept = Vec::with_capacity(ids.len());
    for id in &ids {
        // A failed read is not "not yours": the listen is refused like a `tasks/*` request
        // then, instead of silently listening to fewer tasks.
        match registry.lookup_checked(&req.ctx.upstream, id, owner).await {
            Ok(Some(_)) => kept.push(id.as_str()),
            Ok(None) => {}
            Err(_) => {
                let error = McpError::StoreUnavailable {
                    method: Some("subscriptions/listen".into()),
                };
                return Err(McpReply::error(era, msg.id(), &error)
                    .answered_locally(LocalReason::StoreUnavailable));
            }
        }
    }
    if kept.len() == named {
        return Ok(());
    }
    tracing::debug!(
        named,
        kept = kept.len(),
        "subscriptions/listen: taskIds of other owners or never recorded removed"
    );
    let list = serde_json::to_string(&kept).unwrap_or_else(|_| "[]".into());
    let rewritten = crate::jsonrpc::splice::replace(msg.bytes(), &PATH, &list)
        .ok()
        .flatten()
        .and_then(|b| crate::jsonrpc::Message::parse(b).ok());
    match rewritten {
        Some(m) => {
            req.op = Operation::Post(m);
            Ok(())
        }
        None => {
            let error = McpError::InvalidParam {
                method: Some("subscriptions/listen".into()),
                key: "notifications.taskIds".into(),
                problem: "cannot be read".into(),
            };
            Err(McpReply::error(era, msg.id(), &error).answered_locally(LocalReason::InvalidParams))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::GatewayError;
    use crate::layers::tasks::TasksLayer;
    use crate::layers::testing::{json_of, record, registry, request};
    use crate::store::Owner;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, ServiceExt};

    const WITH_EXT: &str = r#"{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#;

    fn modern(method: &str, params: &str, name: Option<&str>) -> McpRequest {
        let mut req = request(&format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{params}}}"#
        ));
        req.extensions.insert(Era::Modern);
        if let Some(n) = name {
            req.ctx.headers.insert(
                &crate::mcp::routing_headers::MCP_NAME,
                http::HeaderValue::from_str(n).unwrap(),
            );
        }
        req
    }

    /// The gates in the spec's order, each answered here with its 2026 HTTP status; the
    /// upstream is never called; the owner's own request goes through.
    #[tokio::test]
    async fn gates_then_registry_then_upstream() {
        let (registry, _store) = registry();
        let slot = registry.reserve(&"up".into(), &Owner::Anonymous).unwrap();
        let mine = TaskRecord {
            owner: Owner::Anonymous,
            era: Era::Modern,
            ..record("t1")
        };
        registry.record_creation(mine, &slot).await.unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let stack = TasksLayer::new(registry.clone(), false).layer(tower::service_fn(
            move |_req: McpRequest| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, GatewayError>(McpReply::local_json(Bytes::from_static(b"{}"))) }
            },
        ));
        let no_ext = modern("tasks/get", r#"{"taskId":"t1"}"#, Some("t1"));
        let with = |id: &str| format!(r#"{{"taskId":"{id}","_meta":{WITH_EXT}}}"#);
        let cases = [
            (no_ext, 400, -32021),
            (modern("tasks/cancel", &with("t9"), Some("t9")), 400, -32602),
            (modern("tasks/result", &with("t1"), Some("t1")), 404, -32601),
            (modern("tasks/list", "{}", None), 404, -32601),
        ];
        for (req, status, code) in cases {
            let reply = stack.clone().oneshot(req).await.unwrap();
            assert_eq!(reply.status.as_u16(), status);
            assert_eq!(json_of(&reply)["error"]["code"], code);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let ok = stack
            .clone()
            .oneshot(modern("tasks/update", &with("t1"), None))
            .await
            .unwrap();
        assert_eq!(ok.status.as_u16(), 200);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

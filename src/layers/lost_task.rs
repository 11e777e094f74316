//! Whether an upstream lost a task: the check `tasks` (its lost-task probe) and `cancel` (a
//! cancel's flight, the follow-up polls after a 2026-07-28 ack) share. Not a layer: both name it
//! below them (review 18a #7: `cancel` named `tasks::lost`, an import pointing up).
//!
//! - **A `-32602` is not proof** (review 18a #1, #2): an upstream answers `-32602` to a
//!   `tasks/*` request whose `taskId` it does not know, but also to a client's own malformed
//!   params (an ill-typed `_meta.progressToken`, a missing required `_meta` member under
//!   2026-07-28), and a 2025-11-25 `tasks/result` returns the tool's own error, `-32602`
//!   included, "exactly" as the underlying request would have. So a `-32602` to a client's
//!   `tasks/*` about a task recorded live is [`Confirm`]ed with one `tasks/get` of taskgate's
//!   own, clean (`own_request`: `{taskId}` and, under 2026-07-28, the required `_meta`),
//!   carrying the task's `AuthorisedTask` (`observe` applies a `Task` it answers, so a task
//!   that ended unobserved is recorded terminal). Only when that too is answered `-32602` is
//!   the task lost: its record is failed ([`fail_lost`]) and its owner's slot given back.
//!   Otherwise the client's answer passes as it came.
//! - **Once per task** ([`Confirmations`]): the callers whose answers arrive while a task's
//!   confirmation runs share it (one `tasks/get`); a cancel's flight confirms once for all the
//!   callers that share the flight. A confirmation runs to its end (its `tasks/get` is bounded
//!   by the upstream's `timeout_ms`) even when its callers go away, then leaves the table.
//! - **Cost**: a `tasks/get|result` about a live task keeps a copy of its context (one header
//!   map; the values are shared) until its answer is read; only a `-32602` answer pays the
//!   confirmation itself.

use crate::exchange::{McpReply, McpRequest, RequestContext};
use crate::layers::extensions::AuthorisedTask;
use crate::layers::own_request;
use crate::mcp::needles;
use crate::mcp::task::now_ms;
use crate::registry::Registry;
use crate::store::{Origin, TaskRecord};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;

/// JSON-RPC `-32602` Invalid params: the spec's answer for a nonexistent `taskId`.
pub(crate) const INVALID_PARAMS: i64 = -32602;

/// Replies longer than this are not read for an error (a JSON-RPC error about a task is short;
/// a long reply is a payload).
pub(crate) const MAX_ERROR_REPLY: usize = 16 * 1024;

/// Whether `answer` (a parsed JSON-RPC answer) is the upstream's `-32602`, its answer about a
/// `taskId` it does not know, to a `tasks/*` request taskgate built itself (params `{taskId}`,
/// and the required `_meta` under 2026-07-28: never about a client's own params). Both bridges
/// take it for the task lost.
pub(crate) fn is_not_found(answer: Option<&serde_json::Value>) -> bool {
    answer
        .and_then(|a| a.pointer("/error/code"))
        .and_then(serde_json::Value::as_i64)
        == Some(INVALID_PARAMS)
}

/// Whether a reply (its HTTP `status` and JSON body `bytes`) is the 2025-11-25 transport's
/// "session gone": an HTTP 404 whose JSON-RPC error [`says_session_not_found`]. Only the 404
/// says so: a `-32001` under another status or in an SSE event is a server's own error (the
/// TypeScript SDK's `RequestTimeout`, a tool's; review 21 #1). The one test of it: the lost-task
/// probe, the cancel flight and the gateway tasks' held call ask it.
pub(crate) fn says_session_gone(status: http::StatusCode, bytes: &[u8]) -> bool {
    status == http::StatusCode::NOT_FOUND
        && error_code(bytes).is_some_and(|code| says_session_not_found(code, bytes))
}

/// Whether an HTTP 404's JSON-RPC error `bytes` (its code `code`) says its session is gone: the
/// TypeScript SDK's `-32001`, or the Python SDK's (`mcp` 1.x) `-32600` "Session not found". A
/// 404 with any other error (a proxy's during a deploy) is not taken for the session lost: the
/// tasks of a session may outlive it upstream (review 20 #2: any code was taken, and a live
/// task was failed for good).
pub(crate) fn says_session_not_found(code: i64, bytes: &[u8]) -> bool {
    if code == crate::mcp::errors::SESSION_NOT_FOUND {
        return true;
    }
    #[derive(Deserialize)]
    struct Envelope {
        error: Option<Message>,
    }
    #[derive(Deserialize)]
    struct Message {
        message: Option<String>,
    }
    code == crate::jsonrpc::INVALID_REQUEST
        && serde_json::from_slice::<Envelope>(bytes)
            .ok()
            .and_then(|e| e.error?.message)
            .is_some_and(|m| m.to_ascii_lowercase().contains("session not found"))
}

/// Whether `bytes` may be a JSON-RPC error reply [`error_code`] reads: short enough, and an
/// `"error"` member found by a byte search.
pub(crate) fn may_be_error(bytes: &[u8]) -> bool {
    bytes.len() <= MAX_ERROR_REPLY && needles::found(&needles::ERROR_KEY, bytes)
}

/// The `error.code` of a JSON-RPC error reply; `None` for anything else (read only when a byte
/// search finds an `"error"` member in a short body).
pub(crate) fn error_code(bytes: &[u8]) -> Option<i64> {
    if !may_be_error(bytes) {
        return None;
    }
    #[derive(Deserialize)]
    struct Envelope {
        error: Option<Code>,
    }
    serde_json::from_slice::<Envelope>(bytes)
        .ok()?
        .error
        .map(|e| e.code)
}

/// The `code` of a JSON-RPC `error` object (its JSON text).
pub(crate) fn error_object_code(error: &str) -> Option<i64> {
    serde_json::from_str::<Code>(error).ok().map(|c| c.code)
}

#[derive(Deserialize)]
struct Code {
    code: i64,
}

/// Fails the record of a task its upstream lost (`why`: what showed it), as a dead child's
/// tasks are (`failed`, `reason="upstream_lost"`, the owner's slot given back); whether this
/// call failed it (logged at warn then).
pub(crate) async fn fail_lost(
    registry: &Arc<Registry>,
    upstream: &str,
    task_id: &str,
    method: &str,
    why: &str,
) -> bool {
    let failed = registry
        .fail_task_lost_upstream(upstream, task_id, why)
        .await;
    if failed {
        tracing::warn!(upstream = %upstream, task_id = %task_id, method, "the upstream lost a task: its record is failed and its slot released");
    }
    failed
}

/// A bridged task (either bridge) whose upstream answered taskgate's own clean `tasks/get` of
/// it `-32602`: as [`fail_lost`] (`why` names `method`, the request first answered so), which
/// keeps the `-32603` error saying `why` in the record (`terminal_error`) in the same update as
/// its `failed`; from it the bridge answers the task from then on. A record already `failed`
/// without an error gets this one (within `tasks.max_stored_result_bytes`). The record as it
/// now is (`None`: it could not be read; the upstream's answer then passes).
pub(crate) async fn fail_lost_bridged(
    registry: &Arc<Registry>,
    record: &TaskRecord,
    method: &str,
) -> Option<Arc<TaskRecord>> {
    let (upstream, task_id) = (&record.upstream, &record.task_id);
    let why = format!(
        "upstream `{upstream}` no longer has this task (it answered taskgate's own `{method}` with -32602, task not found); the task's state was lost (a restart of the upstream?)"
    );
    fail_lost(registry, upstream, task_id, method, &why).await;
    let error = serde_json::json!({"code": crate::jsonrpc::INTERNAL_ERROR, "message": why});
    registry
        .store_terminal_error(upstream, task_id, error.to_string())
        .await;
    registry
        .lookup_checked(upstream, task_id, &record.owner)
        .await
        .ok()
        .flatten()
}

/// The confirmation a `-32602` answer about a task recorded live needs (see the module docs).
pub(crate) struct Confirm {
    /// The context of the request answered `-32602` (its upstream, session, caller and
    /// headers): the confirmation is sent with it as taskgate's other own requests are
    /// (`own_request::context`), so the credentials the client sent (`Authorization`, or an
    /// upstream's own header such as `X-Api-Key`) go with it. Taken for every
    /// `tasks/get|result` about a live task, before its answer is known: one copy of the
    /// request's context (its header map; the values are shared).
    ctx: RequestContext,
    record: Arc<TaskRecord>,
}

impl Confirm {
    /// The confirmation `req` (a `tasks/*` request, authorised) may need: `None` when its task
    /// is not a client's task recorded live in the request's era (a gateway task, a terminal
    /// one, or one bridged to the other era, where the bridge answers for it).
    pub(crate) fn of(req: &McpRequest) -> Option<Confirm> {
        let record = &req.extensions.get::<AuthorisedTask>()?.record;
        let live_here = !record.status.is_terminal()
            && record.origin == Origin::Client
            && record.era == req.era();
        live_here.then(|| Confirm {
            ctx: req.ctx.clone(),
            record: record.clone(),
        })
    }

    /// The task's id.
    pub(crate) fn task_id(&self) -> &str {
        &self.record.task_id
    }

    /// Sends the clean `tasks/get` (see the module docs) through `inner`: answered `-32602`
    /// too, the task is lost and its record is failed, naming `method` (the request first
    /// answered `-32602`). Whether the task was found lost (any failure: it was not, nothing
    /// changes).
    pub(crate) async fn run<S>(self, registry: &Arc<Registry>, inner: &mut S, method: &str) -> bool
    where
        S: tower::Service<McpRequest, Response = McpReply>,
    {
        if past_upstream_ttl(&self.record) {
            // Kept past the ttl the upstream gave only by the registry's retention floor
            // (`registry::MIN_RETENTION_MS`): the upstream forgot it as it said it would. Not
            // lost: its `-32602` passes, and the record is left to expire.
            return false;
        }
        let id = own_request::own_id("lost-check");
        let (upstream, task_id) = (&self.record.upstream, &self.record.task_id);
        let era = self.record.era;
        let mut get = own_request::task_request(&self.ctx, era, "tasks/get", task_id, &id);
        get.extensions.insert(AuthorisedTask {
            record: self.record.clone(),
        });
        let Ok(Some(answer)) = own_request::ask(inner, get).await else {
            return false;
        };
        if error_code(&answer) != Some(INVALID_PARAMS) {
            return false;
        }
        let why = format!(
            "upstream `{upstream}` no longer has this task (it answered `{method}` and taskgate's own `tasks/get` with -32602, task not found); the task's state was lost (a restart of the upstream?)"
        );
        // Failed here or a moment before by another path: the task is gone either way.
        fail_lost(registry, upstream, task_id, method, &why).await;
        true
    }
}

/// The confirmation of one task that is running.
type Flight = Shared<BoxFuture<'static, bool>>;

/// Whether `record`'s task is past the ttl its upstream gave, counted on taskgate's clock from
/// when it was recorded (an upstream's clock may be off).
fn past_upstream_ttl(record: &TaskRecord) -> bool {
    record
        .ttl_ms
        .is_some_and(|ttl| record.recorded_at.saturating_add(ttl) <= now_ms())
}

/// The confirmations running for one upstream's tasks, by task id: callers whose `-32602`
/// arrives while one runs share it (one `tasks/get` per task at a time).
#[derive(Default)]
pub(crate) struct Confirmations {
    flights: Mutex<HashMap<String, Flight>>,
}

impl Confirmations {
    /// Runs `confirm` (with `inner`, the service below the caller), or joins the one running for
    /// its task; whether the task was found lost ([`Confirm::run`]).
    pub(crate) async fn confirm<S>(
        self: &Arc<Self>,
        confirm: Confirm,
        registry: Arc<Registry>,
        mut inner: S,
        method: &'static str,
    ) -> bool
    where
        S: tower::Service<McpRequest, Response = McpReply> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        let flight = {
            let mut flights = self.flights.lock();
            match flights.get(confirm.task_id()) {
                Some(running) => running.clone(),
                None => {
                    let task_id = confirm.task_id().to_string();
                    let done = Done {
                        table: self.clone(),
                        task_id: task_id.clone(),
                    };
                    let flight = async move {
                        let _done = done;
                        confirm.run(&registry, &mut inner, method).await
                    }
                    .boxed()
                    .shared();
                    flights.insert(task_id, flight.clone());
                    // Driven to its end (bounded by the upstream's `timeout_ms`) even when
                    // every caller goes away, so it always leaves the table.
                    tokio::spawn(flight.clone());
                    flight
                }
            }
        };
        flight.await
    }
}

/// Removes a confirmation from its table when its future ends in any way.
struct Done {
    table: Arc<Confirmations>,
    task_id: String,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.table.flights.lock().remove(&self.task_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::GatewayError;
    use crate::layers::testing::{owner, record, registry, request};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Review 18a #1: `-32602`s about one task that arrive while its confirmation runs share
    /// it: the upstream gets one `tasks/get`, clean (`{taskId}` only), and both callers learn
    /// the task is lost; the record is failed once.
    #[tokio::test]
    async fn concurrent_confirmations_of_one_task_send_one_clean_tasks_get() {
        let (registry, _) = registry();
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        let recorded = Arc::new(record("t1"));
        registry
            .record_creation((*recorded).clone(), &slot)
            .await
            .unwrap();
        let (calls, params) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(None)));
        let (counted, seen) = (calls.clone(), params.clone());
        let upstream = tower::service_fn(move |req: McpRequest| {
            counted.fetch_add(1, Ordering::SeqCst);
            if let crate::exchange::Operation::Post(m) = &req.op {
                *seen.lock() = m.params().map(str::to_string);
            }
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let id = req
                    .id()
                    .map(|i| i.as_json().to_string())
                    .unwrap_or_default();
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"Task not found"}}}}"#
                );
                Ok::<_, GatewayError>(McpReply::local_json(bytes::Bytes::from(body)))
            }
        });
        let mut get = request(
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"t1","_meta":{"progressToken":{}}}}"#,
        );
        get.extensions.insert(AuthorisedTask { record: recorded });
        let confirming = Arc::new(Confirmations::default());
        let (a, b) = tokio::join!(
            confirming.confirm(
                Confirm::of(&get).unwrap(),
                registry.clone(),
                upstream.clone(),
                "tasks/get"
            ),
            confirming.confirm(
                Confirm::of(&get).unwrap(),
                registry.clone(),
                upstream,
                "tasks/result"
            ),
        );
        assert!(a && b, "both learn the task is lost");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one tasks/get");
        assert_eq!(params.lock().as_deref(), Some(r#"{"taskId":"t1"}"#));
        let r = registry.record_cached("up", "t1").await.unwrap().unwrap();
        assert_eq!(r.status, crate::mcp::task::TaskStatus::Failed);
        assert!(confirming.flights.lock().is_empty(), "it left the table");
    }

    #[test]
    fn only_error_replies_have_a_code() {
        assert_eq!(
            error_code(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#),
            Some(-32602)
        );
        assert_eq!(
            error_code(br#"{"jsonrpc":"2.0","id":1,"result":{"type":"error"}}"#),
            None
        );
        assert_eq!(error_code(br#"{"error":{"code":"no"}}"#), None);
        assert_eq!(error_code(b"not json \"error\""), None);
        let mut long = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":""#.to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_ERROR_REPLY));
        long.extend(br#""}}"#);
        assert_eq!(error_code(&long), None, "bounded");
        assert_eq!(error_object_code(r#"{"code":-32602}"#), Some(-32602));
    }
}

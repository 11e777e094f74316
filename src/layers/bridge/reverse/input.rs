//! Input a 2025-11-25 task asks for, shown to the 2026-07-28 client (2025-11-25 tasks:
//! `input_required`, the server's `elicitation/create` / `sampling/createMessage` /
//! `roots/list` requests tied to the task, delivered on a `tasks/result` stream; 2026-07-28
//! tasks: `inputRequests` in `tasks/get`, answered with `tasks/update` `inputResponses`).
//!
//! When the upstream reports a task `input_required`, the reverse bridge opens one upstream
//! `tasks/result` for it on the task's session and reads it in the background: each request of
//! the upstream's on that stream is kept here under a key (its JSON-RPC id: a number as its
//! digits, a string as it is unless it reads as JSON, then quoted; see [`key_of`]), shown in every `tasks/get` answer as
//! `inputRequests[key] = {method, params}` until answered. A `tasks/update` answer under a key
//! kept here is sent upstream as the JSON-RPC response to that request (its `result`, with the
//! related-task `_meta`); unknown or answered keys are ignored (2026-07-28 tasks: a server
//! SHOULD ignore them). The background `tasks/result` ends with the task's result, which
//! `observe` keeps in the record like any other.
//!
//! **The record.** Each captured request is also written to the task's record
//! (`TaskRecord::input_requests`: key → `{id, method, params}`) before it is shown, so a
//! `tasks/get` on any replica of a PostgreSQL tier, or after a restart, shows it, and a
//! `tasks/update` there answers it on the task's upstream session (a 2025-11-25 server matches a
//! response to its waiting request by id, on any stream or POST of the session: TypeScript SDK
//! 1.32.2 `Protocol._onresponse`). The table here stays the fast path of the process that
//! captured it; for a request the record holds, the record decides: answering takes the key out
//! of the record first (the store's compare-and-swap: one taker across replicas, so a key is
//! answered once), and a `tasks/get` shows what the record still holds. A request whose answer
//! could not be sent is put back. The record's requests are cleared when the task ends.
//!
//! **What is shown.** Only what the 2026-07-28 client can answer: an `elicitation/create`,
//! `sampling/createMessage` or `roots/list` (2026-07-28 `inputRequests` values are those three
//! requests) whose capability the `tasks/get` that started the follower declared in its
//! `_meta["io.modelcontextprotocol/clientCapabilities"]` (2026-07-28 declares capabilities per
//! request; that `tasks/get` is the task owner's). The held session declares all three for
//! every caller (`super::HELD_CLIENT_CAPABILITIES` says why), so any other request is answered
//! upstream at once on the task's session, as a 2025-11-25 client without the capability (or
//! the method) answers it ([`refusal`]: `-32601`, a `ping` `{}`), counted
//! `taskgate_bridge_input_refused_total{reason="undeclared"}`: the server is not left waiting
//! for an answer nobody can give.
//!
//! Bounds: at most [`MAX_KEYS`] requests kept per task (more are not shown: the task stays
//! `input_required` until its ttl), at most [`MAX_TASKS`] tasks followed per upstream (past it,
//! no new follower: the task's `inputRequests` stay empty, but for what the record holds). The
//! record holds at most [`MAX_KEYS`] requests and `tasks.max_stored_result_bytes` bytes of JSON
//! (default 1 MiB; 0: none): a request past either is kept here only, shown and answered by this
//! process alone.
//!
//! **A restart.** The upstream asks once: the 1.x SDKs (TypeScript 1.32.2 `Protocol`'s
//! `tasks/result` handler, Python `mcp` 1.30 `TaskResultHandler`) dequeue a task's request when
//! they write it on a `tasks/result` stream and never write it again on a later one, though they
//! still wait for its answer. So after taskgate restarts, a request its previous run captured is
//! had from the record. When the record holds none (it could not be stored: over the bound, or
//! the store write failed), it cannot be had again. The sign of it: the record already says
//! `input_required` (an earlier `tasks/get` saw it and opened a follower), holds no request, and
//! this process never followed the task. Such a task's `tasks/get` still opens a
//! follower (an upstream that does ask again is shown as usual) and waits up to
//! [`LOST_INPUT_WAIT`]; when nothing arrives, the task is recorded `failed` with
//! [`LOST_INPUT_MESSAGE`] as its `statusMessage` and its `error` (`-32603`, kept in the record:
//! later `tasks/get` calls are answered from it), and one upstream `tasks/cancel` is sent so the
//! server stops waiting (first terminal status wins, as everywhere: an upstream that ended the
//! task meanwhile keeps its status, and nothing is cancelled). Only with a store of one gateway:
//! in a PostgreSQL tier another live replica may hold the follower that captured the request, so
//! there the task is left as it is.

use super::{
    declared_by, legacy_body, listen, send, task_params, On, ReverseState, UpstreamSession,
};
use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::AuthorisedTask;
use crate::layers::relay::input::capability_for;
use crate::layers::McpService;
use crate::mcp::capabilities::ClientCapabilities;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::{format_rfc3339_ms, now_ms, TaskStatus};
use crate::metrics::LocalReason;
use crate::registry::Observed;
use crate::store::TaskRecord;
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most input requests kept per task.
pub const MAX_KEYS: usize = 32;
/// Most tasks whose input is followed at once per upstream.
pub const MAX_TASKS: usize = 1024;

/// One upstream request for input, kept until answered.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The request's JSON-RPC id, as the upstream sent it (the response must carry it).
    pub id: Value,
    /// `{method, params}`: what the client is shown.
    pub request: Value,
    /// Also written in the task's record (`TaskRecord::input_requests`): the record, not this
    /// table, decides whether it is still unanswered (another replica may have answered it).
    pub stored: bool,
}

impl Pending {
    /// The pending request in `msg` (a JSON-RPC request with an id) and its key; `None` when
    /// `msg` is not one. `params` lose the 2025 related-task `_meta` (2026-07-28 has no
    /// related-task key: the request is shown inside its task).
    pub fn of_message(msg: &Value) -> Option<(String, Pending)> {
        let (Some(id), Some(method)) = (msg.get("id"), msg.get("method").and_then(Value::as_str))
        else {
            return None;
        };
        let mut request = json!({ "method": method });
        if let Some(p) = msg.get("params") {
            let mut params = p.clone();
            if let Some(meta) = params.get_mut("_meta").and_then(Value::as_object_mut) {
                meta.remove(crate::mcp::task::RELATED_TASK_META);
                if meta.is_empty() {
                    params.as_object_mut().map(|o| o.remove("_meta"));
                }
            }
            request["params"] = params;
        }
        Some((
            key_of(id),
            Pending {
                id: id.clone(),
                request,
                stored: false,
            },
        ))
    }

    /// Its stored form, `{id, method, params}` (see `TaskRecord::input_requests`).
    fn stored_form(&self) -> Value {
        let mut v = self.request.clone();
        if let Some(o) = v.as_object_mut() {
            o.insert("id".into(), self.id.clone());
        }
        v
    }

    /// From its stored form; `None` for anything else.
    fn from_stored(v: &Value) -> Option<Pending> {
        let mut request = v.as_object()?.clone();
        let id = request.remove("id")?;
        request.get("method")?.as_str()?;
        Some(Pending {
            id,
            request: Value::Object(request),
            stored: true,
        })
    }
}

/// The requests a record holds (`TaskRecord::input_requests`), by key; empty when none (or
/// unreadable: taskgate wrote it, so only a corrupt record).
pub fn stored_requests(text: Option<&str>) -> Map<String, Value> {
    text.and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        })
        .unwrap_or_default()
}

/// The input requests of one task.
#[derive(Default)]
pub struct TaskInputs {
    pending: Mutex<BTreeMap<String, Pending>>,
    /// Woken when a request arrives or the follower ends.
    pub arrived: tokio::sync::Notify,
    following: AtomicBool,
    /// The capabilities the `tasks/get` that started the follower declared
    /// ([`ClientCapabilities::bits`]; none until then): what may be shown of a request that
    /// comes on the GET stream instead of the follower's (`listen::seen`).
    declared: std::sync::atomic::AtomicU8,
}

impl TaskInputs {
    /// Keeps the upstream request `msg` (a JSON-RPC request with an id); `false` when it is not
    /// one or [`MAX_KEYS`] are kept.
    pub fn add(&self, msg: &Value) -> bool {
        Pending::of_message(msg).is_some_and(|(key, pending)| self.insert(key, pending))
    }

    /// Keeps `pending` under `key`; `false` when [`MAX_KEYS`] are kept.
    pub fn insert(&self, key: String, pending: Pending) -> bool {
        let mut kept = self.pending.lock();
        if kept.len() >= MAX_KEYS {
            return false;
        }
        kept.insert(key, pending);
        drop(kept);
        self.arrived.notify_waiters();
        true
    }

    /// Whether the upstream's request for `method` may be shown to the task's client: its
    /// capability was declared by the `tasks/get` that started the follower (see [`refusal`]).
    pub fn may_show(&self, method: &str) -> bool {
        let declared = ClientCapabilities::from_bits(self.declared.load(Ordering::Relaxed));
        refusal(method, declared).is_none()
    }

    /// Whether [`MAX_KEYS`] are kept.
    pub fn is_full(&self) -> bool {
        self.pending.lock().len() >= MAX_KEYS
    }

    /// The `inputRequests` object: every request not yet answered, by key.
    pub fn shown(&self) -> Value {
        Value::Object(self.shown_unstored(true))
    }

    /// The kept requests as `inputRequests` entries: all of them, or (`all` false) only those
    /// not also in the record.
    fn shown_unstored(&self, all: bool) -> Map<String, Value> {
        let pending = self.pending.lock();
        pending
            .iter()
            .filter(|(_, p)| all || !p.stored)
            .map(|(k, p)| (k.clone(), p.request.clone()))
            .collect()
    }

    /// Whether a kept request is also in the record.
    fn any_stored(&self) -> bool {
        self.pending.lock().values().any(|p| p.stored)
    }

    /// Whether no request is kept.
    pub fn is_empty(&self) -> bool {
        self.pending.lock().is_empty()
    }

    /// The request under `key`, taken (answered once).
    pub fn take(&self, key: &str) -> Option<Pending> {
        self.pending.lock().remove(key)
    }

    /// Puts back under `key` a request [`TaskInputs::take`] gave (its answer could not be sent).
    pub fn restore(&self, key: &str, pending: Pending) {
        self.pending
            .lock()
            .entry(key.to_string())
            .or_insert(pending);
    }

    /// The follower ended (its stream ended or failed).
    pub fn done(&self) {
        self.following.store(false, Ordering::SeqCst);
        self.arrived.notify_waiters();
    }
}

/// The key a request id is shown under: a number (anything but a string) as its JSON text; a
/// string as it is unless it reads as JSON itself (`"7"`, `"null"`, `"\"a\""`), which is shown
/// as its JSON text (quoted). So two ids never share a key: the id `7` is `7`, the id `"7"` is
/// `"7"` with its quotes, and a key shown as it came is never JSON.
pub fn key_of(id: &Value) -> String {
    match id {
        Value::String(s) if serde_json::from_str::<Value>(s).is_err() => s.clone(),
        other => other.to_string(),
    }
}

/// How a 2025-11-25 client that `declared` these capabilities answers the upstream's request
/// `method` it is not shown (see `input`): `None` when it is shown (an `elicitation/create`,
/// `sampling/createMessage` or `roots/list` whose capability was declared); `Ok` with the
/// `result` of a `ping` (`{}`); `Err` with the `error` (`-32601`, naming the method and why)
/// of anything else: no handler, as a 2025-11-25 client without the capability answers.
pub fn refusal(method: &str, declared: ClientCapabilities) -> Option<Result<Value, Value>> {
    if method == "ping" {
        return Some(Ok(json!({})));
    }
    let why = match capability_for(method) {
        Some(pointer) if declared.has(pointer) => return None,
        Some(pointer) => format!(
            "{method}: the 2026-07-28 client did not declare the `{}` capability, so taskgate cannot ask it",
            pointer.trim_start_matches('/')
        ),
        None => format!(
            "{method}: taskgate relays only elicitation/create, sampling/createMessage and roots/list to a 2026-07-28 client"
        ),
    };
    Some(Err(
        json!({"code": jsonrpc::METHOD_NOT_FOUND, "message": why}),
    ))
}

/// The tasks whose input is followed, per upstream.
#[derive(Default)]
pub struct Inputs {
    tasks: Mutex<HashMap<String, Arc<TaskInputs>>>,
}

impl Inputs {
    /// The task's inputs, and whether the caller is to start its follower (none runs); `None`
    /// past [`MAX_TASKS`].
    pub fn follow(&self, task_id: &str) -> Option<(Arc<TaskInputs>, bool)> {
        let mut tasks = self.tasks.lock();
        if !tasks.contains_key(task_id) && tasks.len() >= MAX_TASKS {
            // Tasks nobody follows any more and that have nothing to show go first.
            tasks.retain(|_, t| t.following.load(Ordering::SeqCst) || !t.is_empty());
            if tasks.len() >= MAX_TASKS {
                return None;
            }
        }
        let t = tasks.entry(task_id.to_string()).or_default().clone();
        let start = !t.following.swap(true, Ordering::SeqCst);
        Some((t, start))
    }

    /// The task's inputs, when any are kept.
    pub fn of(&self, task_id: &str) -> Option<Arc<TaskInputs>> {
        self.tasks.lock().get(task_id).cloned()
    }

    /// Forgets a task (it ended).
    pub fn forget(&self, task_id: &str) {
        self.tasks.lock().remove(task_id);
    }
}

// ---- the flow: following a task's input upstream, showing it, sending the answers ----

/// How long a `tasks/get` of a task that just went `input_required` waits for the upstream's
/// first input request to arrive on the follower's stream (then it answers what it has).
pub const INPUT_WAIT: Duration = Duration::from_secs(1);

/// How long the `tasks/get` of a task whose input request a previous run of taskgate captured
/// waits for the upstream to send it again before the task is failed (see `input`: the 1.x
/// SDKs answer a new `tasks/result` at once, with what they still have to send).
pub const LOST_INPUT_WAIT: Duration = Duration::from_secs(3);

/// The `statusMessage` and `error.message` of a task whose input request was lost (see `input`).
pub const LOST_INPUT_MESSAGE: &str = "the task's input request was lost when taskgate restarted: the upstream sent it on a tasks/result stream of taskgate's previous run and does not send it again; the task was cancelled upstream";

/// What a `tasks/get` of an `input_required` task shows.
pub(super) enum Input {
    /// The `inputRequests` object (empty when none arrived in time).
    Shown(Value),
    /// The task's input request was lost with a previous run (see `input`).
    Lost,
}

/// The `inputRequests` of an `input_required` task (see `input`): what the record holds and
/// what this process keeps that the record does not; its follower started when none runs; the
/// first request waited for up to [`INPUT_WAIT`] (not at all when the record holds some), or
/// [`LOST_INPUT_WAIT`] when `record` says a previous run followed it and holds none
/// ([`Input::Lost`] when none arrives).
pub(super) async fn input_requests<S: McpService>(
    state: &Arc<ReverseState>,
    inner: &S,
    req: &McpRequest,
    record: &TaskRecord,
) -> Input {
    let task_id = record.task_id.as_str();
    let stored = stored_requests(record.input_requests.as_deref());
    // Seen `input_required` before, never followed here, nothing in the record: a previous
    // run's follower took the request and could not store it (with a shared store, maybe a live
    // replica's follower holds it: left alone).
    let followed_before = record.status == TaskStatus::InputRequired
        && stored.is_empty()
        && state.inputs.of(task_id).is_none()
        && !state.registry.store().shared();
    let Some((task, start)) = state.inputs.follow(task_id) else {
        return Input::Shown(Value::Object(shown_stored(&stored)));
    };
    if start {
        tokio::spawn(follow_input(
            state.clone(),
            inner.clone(),
            req.clone(),
            task.clone(),
            task_id.to_string(),
        ));
    }
    let wait = if !stored.is_empty() {
        // Requests to show already (captured by another replica or a previous run).
        Duration::ZERO
    } else if followed_before {
        LOST_INPUT_WAIT
    } else {
        INPUT_WAIT
    };
    let until = tokio::time::Instant::now() + wait;
    while task.is_empty()
        && task.following.load(Ordering::SeqCst)
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if followed_before && task.is_empty() {
        return Input::Lost;
    }
    // The record decides for the requests it holds (answered elsewhere: gone from it); it is
    // read again when this process stored some since `record` was read.
    let mut shown = if task.any_stored() {
        let now = state
            .registry
            .lookup(&record.upstream, task_id, &record.owner)
            .await;
        shown_stored(&stored_requests(
            now.as_deref().and_then(|r| r.input_requests.as_deref()),
        ))
    } else {
        shown_stored(&stored)
    };
    for (key, request) in task.shown_unstored(false) {
        shown.entry(key).or_insert(request);
    }
    Input::Shown(Value::Object(shown))
}

/// `inputRequests` entries (`{method, params}`) of the requests a record holds.
fn shown_stored(stored: &Map<String, Value>) -> Map<String, Value> {
    stored
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), Pending::from_stored(v)?.request)))
        .collect()
}

/// Keeps a captured request in the task's record (`TaskRecord::input_requests`) under `key`:
/// at most [`MAX_KEYS`] keys and `tasks.max_stored_result_bytes` bytes of JSON (0: nothing
/// stored). Returns whether the record holds it.
async fn store_request(
    state: &ReverseState,
    upstream: &str,
    task_id: &str,
    key: &str,
    pending: &Pending,
) -> bool {
    let max = state.registry.config().max_stored_result_bytes;
    let (k, entry) = (key.to_string(), pending.stored_form());
    let edited = state
        .registry
        .edit_input_requests(upstream, task_id, move |field| {
            let mut all = stored_requests(field.as_deref());
            if all.contains_key(&k) || all.len() >= MAX_KEYS {
                return false;
            }
            all.insert(k.clone(), entry.clone());
            let text = Value::Object(all).to_string();
            if max == 0 || text.len() as u64 > max {
                return false;
            }
            *field = Some(text);
            true
        })
        .await;
    matches!(edited, Some((_, Some(after))) if stored_requests(Some(&after)).contains_key(key))
}

/// Takes the request under `key` out of the task's record (answered once across replicas: the
/// store's compare-and-swap lets one taker have it); `None` when the record holds none.
async fn take_stored(
    state: &ReverseState,
    upstream: &str,
    task_id: &str,
    key: &str,
) -> Option<Pending> {
    let k = key.to_string();
    let (before, after) = state
        .registry
        .edit_input_requests(upstream, task_id, move |field| {
            let mut all = stored_requests(field.as_deref());
            if all.remove(&k).is_none() {
                return false;
            }
            *field = (!all.is_empty()).then(|| Value::Object(all).to_string());
            true
        })
        .await?;
    if before == after {
        return None;
    }
    Pending::from_stored(stored_requests(before.as_deref()).get(key)?)
}

/// A task whose input request was lost (see `input`): recorded `failed` with
/// [`LOST_INPUT_MESSAGE`] (its `error` kept in the record), then one upstream `tasks/cancel` on
/// the task's session. Returns whether this recorded the failure (`false`: the record was
/// already terminal otherwise, and nothing was cancelled).
pub(super) async fn input_lost<S: McpService>(
    state: &Arc<ReverseState>,
    inner: &S,
    req: &McpRequest,
    task_id: &str,
) -> bool {
    state.inputs.forget(task_id);
    let upstream = req.ctx.upstream.clone();
    let report = json!({"status": "failed", "statusMessage": LOST_INPUT_MESSAGE,
        "lastUpdatedAt": format_rfc3339_ms(now_ms())});
    let observed = state
        .registry
        .observe_task_as(&upstream, task_id, report, "input request lost")
        .await;
    if !matches!(observed, Observed::Recorded(TaskStatus::Failed)) {
        return false;
    }
    let error = json!({"code": jsonrpc::INTERNAL_ERROR, "message": LOST_INPUT_MESSAGE});
    state
        .registry
        .store_terminal_error(&upstream, task_id, error.to_string())
        .await;
    tracing::warn!(upstream = %upstream, task_id = %task_id, "a bridged task's input request was lost with taskgate's previous run: failed, cancelled upstream");
    let own = state.ids.next_id();
    let body = legacy_body(&own, "tasks/cancel", task_params(task_id));
    let cancelled = state
        .bounded(&upstream, async {
            Ok(
                match send(state, inner, req, &body, On::Task, &|_, _| {}).await? {
                    Ok(reply) => super::answer_of(reply, &own).await,
                    Err(_) => None,
                },
            )
        })
        .await;
    if !matches!(cancelled, Ok(Some(ref a)) if a.get("result").is_some()) {
        tracing::warn!(upstream = %upstream, task_id = %task_id, "the upstream did not accept the tasks/cancel of a task whose input request was lost");
    }
    true
}

/// Holds one upstream `tasks/result` of an `input_required` task open (no deadline but the
/// task's longest ttl, `tasks.max_ttl_ms`) and keeps each request of the upstream's on it (see
/// `input`); ends with the stream (the task's result, which `observe` keeps in the record).
async fn follow_input<S: McpService>(
    state: Arc<ReverseState>,
    inner: S,
    req: McpRequest,
    task: Arc<TaskInputs>,
    task_id: String,
) {
    use futures_util::StreamExt;
    let own = state.ids.next_id();
    let body = legacy_body(&own, "tasks/result", task_params(&task_id));
    let unbounded = |out: &mut McpRequest, _: &UpstreamSession| {
        out.extensions.insert(crate::exchange::Deadline::Unbounded);
    };
    let limit = Duration::from_millis(state.registry.config().max_ttl_ms);
    // What the 2026-07-28 client can be shown (see `input`): what this `tasks/get` declared.
    let declared = declared_by(&req);
    task.declared.store(declared.bits(), Ordering::Relaxed);
    let followed = async {
        let Ok(Ok(reply)) = send(&state, &inner, &req, &body, On::Task, &unbounded).await else {
            return;
        };
        let ReplyBody::Stream(mut events) = reply.body else {
            return;
        };
        while let Some(ev) = events.next().await {
            let Some(v) = ev
                .data
                .as_deref()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
            else {
                continue;
            };
            if let Some((key, mut pending)) = Pending::of_message(&v) {
                let method = pending.request["method"].as_str().unwrap_or_default();
                if let Some(answer) = refusal(method, declared) {
                    refuse(&state, &inner, &req, &task_id, &pending.id, method, answer).await;
                    continue;
                }
                // The record first: once the request is shown, any replica can answer it.
                if task.is_full() {
                    tracing::debug!(task_id = %task_id, "an upstream input request was not kept (bound)");
                    continue;
                }
                pending.stored =
                    store_request(&state, &req.ctx.upstream, &task_id, &key, &pending).await;
                if !pending.stored {
                    tracing::warn!(task_id = %task_id, key = %key, "an upstream input request was not stored in the task's record (bound, or the store failed): only this process can show and answer it");
                }
                if !task.insert(key, pending) {
                    tracing::debug!(task_id = %task_id, "an upstream input request was not kept (bound)");
                }
            } else if v.get("method").is_some() {
                if let Some(data) = ev.data.as_deref() {
                    listen::seen(&state, &inner, &req.ctx.tenant(), data);
                }
            } else if v.get("id").map(|i| i.to_string()).as_deref() == Some(own.as_json()) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(limit, followed).await;
    task.done();
}

/// Answers the upstream's request `id` (`method`) of `task_id`'s `tasks/result` stream with
/// `answer` (its `result` or `error`, see [`refusal`]) on the task's session, before the
/// follower reads on (bounded by `timeout_ms`).
async fn refuse<S: McpService>(
    state: &ReverseState,
    inner: &S,
    req: &McpRequest,
    task_id: &str,
    id: &Value,
    method: &str,
    answer: Result<Value, Value>,
) {
    let mut body = json!({"jsonrpc": "2.0", "id": id});
    match answer {
        Ok(result) => body["result"] = result,
        Err(error) => {
            state
                .registry
                .metrics()
                .bridge_input_refused(&req.ctx.upstream, crate::metrics::InputRefusal::Undeclared);
            tracing::info!(upstream = %req.ctx.upstream, task_id, method, "a bridged task's input request its 2026-07-28 client cannot answer: refused -32601 upstream");
            body["error"] = error;
        }
    }
    let plain = |out: &mut McpRequest, _: &UpstreamSession| {
        out.extensions.remove::<AuthorisedTask>();
    };
    let sent = state
        .bounded(&req.ctx.upstream, async {
            Ok(send(state, inner, req, &body, On::Task, &plain).await)
        })
        .await;
    if !matches!(sent, Ok(Ok(Ok(_)))) {
        tracing::warn!(upstream = %req.ctx.upstream, task_id, method, "the refusal of an input request could not be sent upstream");
    }
}

/// A 2026-07-28 `tasks/update`: each `inputResponses[key]` for a request kept for the task (see
/// `input`: in this process's table, or in the task's record, taken from it first so a key is
/// answered once across replicas) goes upstream as the JSON-RPC response to it, on the task's
/// session (its result with the related-task `_meta`); other keys are ignored. The ack, unless
/// `inputResponses` or one of its answers is not an object (`-32602`).
pub(super) async fn tasks_update<S: McpService>(
    state: &ReverseState,
    inner: S,
    req: &McpRequest,
    id: &Id,
    record: Arc<TaskRecord>,
    params: Option<&Value>,
) -> McpReply {
    let responses = params.and_then(|p| p.get("inputResponses"));
    // `inputResponses` maps keys to responses (2026-07-28 tasks §input_required): anything
    // else is the client's mistake, not an answer to ack and drop.
    if responses.is_some_and(|r| !r.is_object()) {
        let error = McpError::InvalidParam {
            method: None,
            key: "inputResponses".to_string(),
            problem: "must be an object of input responses by key".to_string(),
        };
        return McpReply::error(Era::Modern, Some(id), &error)
            .answered_locally(LocalReason::InvalidParams);
    }
    let responses = responses.and_then(Value::as_object);
    // Each answer is the client's result for one request: one that is not an object is refused
    // before any is taken (taken first, it went upstream as a result the server cannot read and
    // the request was gone for good).
    if let Some((key, _)) = responses.and_then(|r| r.iter().find(|(_, v)| !v.is_object())) {
        let error = McpError::InvalidParam {
            method: None,
            key: format!("inputResponses[{}]", Value::String(key.clone())),
            problem: "must be an object (the client's result for that input request)".to_string(),
        };
        return McpReply::error(Era::Modern, Some(id), &error)
            .answered_locally(LocalReason::InvalidParams);
    }
    let (upstream, task_id) = (record.upstream.as_str(), record.task_id.as_str());
    if let Some(responses) = responses {
        let kept = state.inputs.of(task_id);
        for (key, response) in responses {
            // This process's table first (fast path); a request the record holds too is taken
            // from the record, which says whether it is still unanswered (any replica, or a
            // previous run, may have stored or answered it).
            let here = kept.as_ref().and_then(|t| t.take(key));
            let (pending, from_record) = match here {
                Some(p) if !p.stored => (p, false),
                _ => match take_stored(state, upstream, task_id, key).await {
                    Some(p) => (p, true),
                    None => continue,
                },
            };
            let mut result = response.clone();
            if let Some(o) = result.as_object_mut() {
                crate::mcp::task::set_related_task(o, &record.task_id);
            }
            let body = json!({"jsonrpc": "2.0", "id": pending.id, "result": result});
            let plain = |out: &mut McpRequest, _: &UpstreamSession| {
                out.extensions.remove::<AuthorisedTask>();
            };
            if !matches!(
                send(state, &inner, req, &body, On::Task, &plain).await,
                Ok(Ok(_))
            ) {
                // Kept, so the client sees it again in `tasks/get` and can answer once more.
                if from_record {
                    store_request(state, upstream, task_id, key, &pending).await;
                }
                if let Some(t) = &kept {
                    t.restore(key, pending);
                }
                tracing::warn!(task_id = %record.task_id, key = %key, "an input response could not be sent upstream; the request is kept");
            }
        }
    }
    McpReply::local_json(jsonrpc::result_response(
        id,
        crate::layers::cancel::MODERN_ACK,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_kept_by_key_until_answered_and_bounded() {
        let inputs = Inputs::default();
        let (t, start) = inputs.follow("t1").unwrap();
        assert!(start);
        assert!(!inputs.follow("t1").unwrap().1, "one follower per task");
        assert!(t.add(&json!({"jsonrpc":"2.0","id":"ask-1","method":"elicitation/create","params":{"message":"?"}})));
        assert!(t.add(&json!({"jsonrpc":"2.0","id":7,"method":"sampling/createMessage"})));
        assert!(!t.add(&json!({"jsonrpc":"2.0","method":"notifications/progress"})));
        let shown = t.shown();
        assert_eq!(shown["ask-1"]["method"], "elicitation/create");
        assert_eq!(shown["ask-1"]["params"]["message"], "?");
        assert_eq!(shown["7"]["method"], "sampling/createMessage");
        assert!(t.add(&json!({"jsonrpc":"2.0","id":"m","method":"elicitation/create",
            "params":{"message":"?","_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t1"}}}})));
        assert_eq!(
            t.shown()["m"]["params"],
            json!({"message":"?"}),
            "no 2025 related-task key in a 2026 inputRequests entry"
        );
        let m = t.take("m").unwrap();
        t.restore("m", m);
        assert_eq!(t.shown()["m"]["method"], "elicitation/create", "restored");
        t.take("m");
        assert_eq!(t.take("7").unwrap().id, json!(7));
        // The ids 9 and "9" (and "null" and null) are two requests, under two keys.
        assert!(t.add(&json!({"jsonrpc":"2.0","id":9,"method":"elicitation/create"})));
        assert!(t.add(&json!({"jsonrpc":"2.0","id":"9","method":"roots/list"})));
        assert!(t.add(&json!({"jsonrpc":"2.0","id":"null","method":"roots/list"})));
        let shown = t.shown();
        assert_eq!(shown["9"]["method"], "elicitation/create");
        assert_eq!(shown["\"9\""]["method"], "roots/list");
        assert_eq!(t.take("\"9\"").unwrap().id, json!("9"));
        assert_eq!(t.take("9").unwrap().id, json!(9));
        assert_eq!(t.take("\"null\"").unwrap().id, json!("null"));
        assert!(t.take("7").is_none(), "answered once");
        for i in 0..MAX_KEYS {
            t.add(&json!({"id": format!("k{i}"), "method": "roots/list"}));
        }
        assert_eq!(t.shown().as_object().unwrap().len(), MAX_KEYS);
        t.done();
        assert!(
            inputs.follow("t1").unwrap().1,
            "a new follower after the last ended"
        );
        inputs.forget("t1");
        assert!(inputs.of("t1").is_none());
    }

    /// Tester 5 #4: the held session declares elicitation, sampling and roots for every caller,
    /// so what a caller did not declare is refused upstream on its behalf, never shown.
    #[test]
    fn a_get_stream_request_is_shown_only_when_its_capability_was_declared() {
        let t = TaskInputs::default();
        assert!(!t.may_show("elicitation/create"), "nothing declared yet");
        let declared = ClientCapabilities::of(&json!({"elicitation": {}}));
        t.declared.store(declared.bits(), Ordering::Relaxed);
        assert!(t.may_show("elicitation/create"));
        assert!(!t.may_show("sampling/createMessage"));
        assert!(!t.may_show("ping"));
    }

    #[test]
    fn only_what_the_client_declared_is_shown() {
        let declared = ClientCapabilities::of(&json!({"elicitation": {}, "extensions": {}}));
        assert_eq!(refusal("elicitation/create", declared), None);
        let refused = refusal("sampling/createMessage", declared)
            .unwrap()
            .unwrap_err();
        assert_eq!(refused["code"], -32601);
        assert!(
            refused["message"].as_str().unwrap().contains("`sampling`"),
            "{refused}"
        );
        assert!(refusal("roots/list", declared).unwrap().is_err());
        let none = ClientCapabilities::default();
        assert!(refusal("elicitation/create", none).unwrap().is_err());
        assert_eq!(refusal("ping", none), Some(Ok(json!({}))));
        let all = ClientCapabilities::of(&json!({"elicitation": {}, "sampling": {}, "roots": {}}));
        assert!(
            refusal("tasks/get", all).unwrap().is_err(),
            "not an input request"
        );
        assert_eq!(refusal("roots/list", all), None);
    }
}

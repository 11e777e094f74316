//! Input during a gateway task (2025-11-25 tasks: `input_required`; 2026-07-28 tasks extension
//! §1.5 `input_required` and `tasks/update`): a request the server sends the client during the
//! held call (`elicitation/create`, `sampling/createMessage`, `roots/list`) makes the task
//! `input_required` and waits here, keyed `input-<n>` (unique over the task's life), for the
//! client's answer; the answer goes upstream as the JSON-RPC response to the server's request
//! (its id the server's, its `result` or `error` the client's), and once no request waits the
//! task is `working` again. How each era's client sees and answers them:
//!
//! - 2025-11-25: on the `tasks/result` stream (the client calls it on `input_required`), each
//!   request under an id taskgate mints, with the related-task `_meta` (`relay::Inputs`:
//!   bounded per caller and upstream, only a declared capability asked). Every `tasks/result`
//!   stream carries each request still waiting once, so a client that lost its stream and
//!   calls `tasks/result` again is asked again, under the same id; the client's POSTed answer
//!   to that id, from the same caller, is taken by the layer once (HTTP 202; a second answer
//!   is not relayed).
//!   A request whose capability the client's session did not declare is answered to the server
//!   `-32601` saying so (the task goes on). The stream also carries a
//!   `notifications/tasks/status` for each status change it sees, then the `tasks/result`
//!   answer last.
//! - 2026-07-28: `tasks/get` shows `inputRequests` (`{key: {method, params}}`, every waiting
//!   one); `tasks/update` with `inputResponses` (`{key: result}`) answers them (unknown or
//!   answered keys ignored), acknowledged `{"resultType":"complete"}`; an `inputResponses`
//!   that is not an object, or a result in it that is not one, is refused `-32602` (HTTP 400)
//!   and answers nothing.
//!
//! A 2026-07-28 upstream asks within the call itself (MRTR, 2026-07-28 §2.3): it answers the
//! plain call `{"resultType":"input_required","inputRequests":{…},"requestState":…}`. Each
//! entry then waits here as a request sent during the call would (the client sees and answers
//! it the same way, in its era), and once all are answered the held call is sent again under a
//! new id with `params.inputResponses` (by the server's keys; an error answer as
//! `{"action":"decline"}` for `elicitation/create`, `{"roots":[]}` for `roots/list`) and
//! `requestState` echoed ([`mrtr_round`]; at most `relay::mrtr::MAX_ROUNDS` rounds). An error
//! answering a `sampling/createMessage` has no `inputResponses` form (a `CreateMessageResult`
//! cannot refuse; a `decline` is an `ElicitResult`): as in the bridge's MRTR (`relay::mrtr`),
//! the round ends there, the call is not sent again, and the task fails with the `-32603`
//! saying so.
//!
//! Bounds: at most [`MAX_WAITING`] requests wait per task (one more is answered `-32603` to the
//! server); waiting requests die with the held call (the task is terminal).

use super::{GatewayTasksState, Live};
use crate::exchange::McpRequest;
use crate::jsonrpc;
use crate::layers::extensions::SessionView;
use crate::layers::relay::input::{capability_for, response_value, Ask};
use crate::mcp::errors::McpError;
use crate::mcp::task::{format_rfc3339_ms, now_ms, TaskStatus};
use crate::sse::Event;
use crate::store::TaskRecord;
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// Most of the server's requests that wait for the client's answer, per gateway task.
pub const MAX_WAITING: usize = crate::layers::relay::input::MAX_KEYS_PER_TASK;

/// One request of the server's waiting for the client's answer.
#[derive(Debug, Clone)]
struct Waiting {
    key: String,
    /// The server's request id (JSON), the id its answer goes under.
    upstream_id: Value,
    method: String,
    params: Value,
    /// The key in the `inputRequests` of a 2026-07-28 `input_required` result (MRTR), for a
    /// request that came that way: its answer is collected for the call's retry instead of
    /// going upstream as a response (see [`mrtr_round`]).
    mrtr_key: Option<String>,
}

/// The input side of one held call.
pub(super) struct CallInput {
    waiting: Mutex<Vec<Waiting>>,
    next: AtomicU64,
    /// Bumped when a request arrives.
    changed: watch::Sender<u64>,
    /// Answers (whole JSON-RPC responses) for the held call to send upstream.
    to_upstream: mpsc::Sender<Bytes>,
    /// Held across every status write that follows from `waiting` (an answer's `working`, a
    /// request's `input_required`, a progress `statusMessage`), see [`CallInput::status_lock`].
    status_write: tokio::sync::Mutex<()>,
    /// The `inputResponses` of the MRTR round in progress, by the server's keys.
    round: Mutex<Map<String, Value>>,
    /// Woken when the MRTR round's last request is answered (or one is refused).
    round_done: tokio::sync::Notify,
    /// The method of an MRTR request of the round in progress that the client answered with an
    /// error no `inputResponses` value can carry (a `sampling/createMessage`, see
    /// [`response_value`]): the round ends on it, the call is not sent again.
    refused: Mutex<Option<String>>,
}

/// Why a server's request is not kept for the client.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotKept {
    /// Not a method whose answer a client gives (`ping` is answered by taskgate).
    Method,
    /// [`MAX_WAITING`] wait already.
    Full,
}

impl CallInput {
    /// The input side of a held call whose answers go on `to_upstream`.
    pub(super) fn new(to_upstream: mpsc::Sender<Bytes>) -> CallInput {
        CallInput {
            waiting: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            changed: watch::channel(0).0,
            to_upstream,
            status_write: tokio::sync::Mutex::new(()),
            round: Mutex::new(Map::new()),
            round_done: tokio::sync::Notify::new(),
            refused: Mutex::new(None),
        }
    }

    /// The lock every status write that follows from the waiting requests takes: the writer
    /// decides (with [`CallInput::waits`]) and writes while holding it. So the writes land in
    /// the order of the decisions, and every change to the list (made before its own write
    /// takes the lock) is seen by a later write: the last write always matches the list (an
    /// answer that leaves none waiting cannot write `working` after a new request's
    /// `input_required`).
    pub(super) async fn status_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.status_write.lock().await
    }

    /// Whether any request waits for the client's answer (the task is `input_required`).
    pub(super) fn waits(&self) -> bool {
        !self.waiting.lock().is_empty()
    }

    /// Keeps the server's request `id` → `method` / `params` for the client; its key. The
    /// `tasks/result` streams learn of it on [`CallInput::wake`] (after the caller has recorded
    /// `input_required`, so that the stream shows that status with it).
    pub(super) fn arrived(
        &self,
        id: &Value,
        method: &str,
        params: Value,
    ) -> Result<String, NotKept> {
        self.keep(id, method, params, None)
    }

    /// [`CallInput::arrived`] for one entry (`mrtr_key`) of an MRTR `input_required` result.
    fn arrived_mrtr(&self, mrtr_key: &str, method: &str, params: Value) -> Result<String, NotKept> {
        self.keep(&Value::Null, method, params, Some(mrtr_key.to_string()))
    }

    fn keep(
        &self,
        id: &Value,
        method: &str,
        params: Value,
        mrtr_key: Option<String>,
    ) -> Result<String, NotKept> {
        capability_for(method).ok_or(NotKept::Method)?;
        let key = {
            let mut waiting = self.waiting.lock();
            if waiting.len() >= MAX_WAITING {
                return Err(NotKept::Full);
            }
            let key = format!("input-{}", self.next.fetch_add(1, Ordering::Relaxed));
            waiting.push(Waiting {
                key: key.clone(),
                upstream_id: id.clone(),
                method: method.to_string(),
                params,
                mrtr_key,
            });
            key
        };
        Ok(key)
    }

    /// Wakes the `tasks/result` streams (a request arrived, or the status changed).
    pub(super) fn wake(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// The 2026-07-28 `inputRequests` of the waiting requests (`None` when none waits).
    pub(super) fn input_requests(&self) -> Option<Value> {
        let waiting = self.waiting.lock();
        (!waiting.is_empty()).then(|| {
            let map: Map<String, Value> = waiting
                .iter()
                .map(|w| {
                    let mut request = json!({ "method": w.method });
                    if !w.params.is_null() {
                        request["params"] = w.params.clone();
                    }
                    (w.key.clone(), request)
                })
                .collect();
            Value::Object(map)
        })
    }

    /// The waiting request `key`, taken, with the server's answer to it made of `answer`
    /// (`Ok`: the client's `result`; `Err`: an `error` object); `None` when `key` does not wait.
    /// An MRTR request's answer is kept for the round (an error as
    /// [`crate::layers::relay::input::response_value`] has it): no bytes then.
    fn answer(&self, key: &str, answer: Result<Value, Value>) -> Option<(String, Option<Bytes>)> {
        let (w, round_done) = {
            let mut waiting = self.waiting.lock();
            let at = waiting.iter().position(|w| w.key == key)?;
            let w = waiting.remove(at);
            let done = w.mrtr_key.is_some() && !waiting.iter().any(|o| o.mrtr_key.is_some());
            (w, done)
        };
        if let Some(mrtr_key) = &w.mrtr_key {
            let value = match answer {
                Ok(result) => Some(result),
                Err(_) => response_value(&w.method, &Value::Null),
            };
            match value {
                Some(value) => {
                    self.round.lock().insert(mrtr_key.clone(), value);
                    if round_done {
                        self.round_done.notify_one();
                    }
                }
                None => {
                    // As an MRTR round of the bridge (`relay::mrtr`): an error no input
                    // response can carry (a `decline` is an `ElicitResult`, not a sampling
                    // result) ends the round at once, no retry; the round's other requests no
                    // longer wait.
                    self.waiting.lock().retain(|o| o.mrtr_key.is_none());
                    self.refused.lock().get_or_insert_with(|| w.method.clone());
                    self.round_done.notify_one();
                }
            }
            return Some((w.method, None));
        }
        let mut msg = json!({"jsonrpc": "2.0", "id": w.upstream_id});
        match answer {
            Ok(result) => msg["result"] = result,
            Err(error) => msg["error"] = error,
        }
        Some((w.method, Some(Bytes::from(msg.to_string()))))
    }

    /// Whether a request of the MRTR round in progress still waits.
    fn round_waits(&self) -> bool {
        self.waiting.lock().iter().any(|w| w.mrtr_key.is_some())
    }

    /// How the MRTR round in progress ended, once it has: `Ok` with the `inputResponses` when
    /// every request was answered, `Err` (why, the call not sent again) when the client
    /// answered one with an error no input response can carry; `None` while one still waits.
    fn round_outcome(&self) -> Option<Result<Map<String, Value>, String>> {
        if let Some(method) = self.refused.lock().take() {
            self.round.lock().clear();
            return Some(Err(McpError::InputRefused { method }.to_string()));
        }
        if self.round_waits() {
            return None;
        }
        Some(Ok(std::mem::take(&mut *self.round.lock())))
    }
}

/// One MRTR round of a held call (2026-07-28 §2.3): the upstream answered the plain call
/// `input_required` (`answer`, the whole JSON-RPC message). Each `inputRequests` entry waits
/// for the client as a request the server sent during the call would (the task
/// `input_required`; 2025-11-25: asked on the `tasks/result` stream, 2026-07-28: shown in
/// `tasks/get`, answered by `tasks/update`); once every one is answered, returns the
/// `inputResponses` by the server's keys, for the call's retry. `Err` says why the round
/// cannot be relayed (no `inputRequests` object, an empty one, more than [`MAX_WAITING`], or a
/// method taskgate does not relay); the task then fails with it.
pub(super) async fn mrtr_round(
    state: &GatewayTasksState,
    live: &Live,
    answer: &Value,
) -> Result<Map<String, Value>, String> {
    let requests = match answer.pointer("/result/inputRequests") {
        Some(Value::Object(m)) if !m.is_empty() => m,
        _ => {
            return Err("the upstream answered the call input_required without inputRequests (an object with at least one request)".into())
        }
    };
    if requests.len() > MAX_WAITING {
        return Err(format!(
            "the upstream asked for {} inputs in one round; taskgate relays at most {MAX_WAITING}",
            requests.len()
        ));
    }
    live.input.round.lock().clear();
    *live.input.refused.lock() = None;
    let mut last = String::new();
    for (key, request) in requests {
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        let params = request.get("params").cloned().unwrap_or(Value::Null);
        if live.input.arrived_mrtr(key, method, params).is_err() {
            return Err(format!(
                "the upstream asked for input with {method:?}; taskgate relays only elicitation/create, sampling/createMessage and roots/list"
            ));
        }
        last = method.to_string();
    }
    requested(state, live, &last).await;
    loop {
        let done = live.input.round_done.notified();
        if let Some(outcome) = live.input.round_outcome() {
            return outcome;
        }
        done.await;
    }
}

/// Answers the waiting request `key` of `task_id` with `answer` (see [`CallInput`]); when none
/// waits any more, the task is `working` again. Returns whether `key` was waiting.
///
/// [`requested`] is the other side: a request that arrived makes the task `input_required`.
pub(super) async fn answered(
    state: &GatewayTasksState,
    task_id: &str,
    key: &str,
    answer: Result<Value, Value>,
) -> bool {
    let Some(live) = state.live.lock().get(task_id).cloned() else {
        return false;
    };
    let Some((method, bytes)) = live.input.answer(key, answer) else {
        return false;
    };
    if bytes.is_some_and(|b| live.input.to_upstream.try_send(b).is_err()) {
        tracing::warn!(task_id, key, "a client's answer to a gateway task's input request could not be passed to its held call (it ended)");
    }
    // Decided under the status lock, from the list as it is then (see `status_lock`): a
    // request that arrived since the answer keeps the task `input_required`.
    let written = {
        let _lock = live.input.status_lock().await;
        let working = !live.input.waits() && !*live.terminal.borrow();
        if working {
            let report = json!({"status": "working", "lastUpdatedAt": format_rfc3339_ms(now_ms()),
                "statusMessage": format!("the client answered {method}")});
            state
                .registry
                .observe_task_as(
                    &live.upstream,
                    task_id,
                    report,
                    "gateway task input answered",
                )
                .await;
        }
        working
    };
    if written {
        live.input.wake();
        super::listen::publish(state, live.session.as_deref(), &live.record).await;
    }
    true
}

/// Records `input_required` for the request (`method`) that just arrived in `live` (see
/// [`CallInput::arrived`]), unless none waits any more by the time the status lock is taken
/// (the client answered it already, and that answer's `working` stands); then wakes the
/// `tasks/result` streams and tells the session's listeners. Returns whether it wrote.
pub(super) async fn requested(state: &GatewayTasksState, live: &Live, method: &str) -> bool {
    let written = {
        let _lock = live.input.status_lock().await;
        let waits = live.input.waits() && !*live.terminal.borrow();
        if waits {
            let report = json!({"status": "input_required",
                "statusMessage": format!("waiting for the client's answer to {method}"),
                "lastUpdatedAt": format_rfc3339_ms(now_ms())});
            state
                .registry
                .observe_task_as(
                    &live.upstream,
                    &live.record.task_id,
                    report,
                    "gateway task input",
                )
                .await;
        }
        waits
    };
    live.input.wake();
    super::listen::publish(state, live.session.as_deref(), &live.record).await;
    written
}

/// A 2025-11-25 client's POSTed answer to an input request taskgate sent it for a gateway task
/// (see the module docs), relayed; `false` when `req` is no such answer.
pub(super) async fn client_answer(state: &GatewayTasksState, req: &McpRequest) -> bool {
    let crate::exchange::Operation::Post(msg) = &req.op else {
        return false;
    };
    if !matches!(msg.kind(), jsonrpc::Kind::Response | jsonrpc::Kind::Error) {
        return false;
    }
    let Some(pending) = msg
        .id()
        .and_then(|id| state.inputs.take(id, &req.ctx.caller()))
    else {
        return false;
    };
    let answer = msg.parse_as::<Value>().unwrap_or(Value::Null);
    let answer = match (answer.get("result"), answer.get("error")) {
        (Some(r), _) => Ok(r.clone()),
        (None, Some(e)) => Err(e.clone()),
        (None, None) => Err(
            json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the client's answer had neither result nor error"}),
        ),
    };
    if !answered(state, &pending.task_id, &pending.key, answer).await {
        tracing::info!(task_id = %pending.task_id, key = %pending.key, "a client's answer to an input request of a gateway task that no longer waits: dropped");
    }
    true
}

/// The 2026-07-28 `tasks/update` of a gateway task: each `inputResponses[key]` answers the
/// waiting request `key` (unknown or answered keys ignored). `inputResponses` maps keys to the
/// client's results (2026-07-28 tasks §input_required), as the reverse bridge has it: a value
/// that is not an object, or a member that is not one (no request taskgate relays has any
/// other result), is the client's mistake, not an answer to relay; `Err` says what is wrong
/// (the caller answers `-32602`) and nothing is answered, so every request still waits.
pub(super) async fn update(
    state: &GatewayTasksState,
    task_id: &str,
    req: &McpRequest,
) -> Result<(), McpError> {
    let Some(raw) = req.classified().and_then(|c| c.param("inputResponses")) else {
        return Ok(());
    };
    let responses = match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) => map,
        _ => {
            return Err(McpError::InvalidParam {
                method: None,
                key: "inputResponses".into(),
                problem: "must be an object of input responses by key".into(),
            })
        }
    };
    if let Some((key, _)) = responses.iter().find(|(_, v)| !v.is_object()) {
        return Err(McpError::InvalidParam {
            method: None,
            key: format!("inputResponses[{}]", Value::from(key.as_str())),
            problem: "must be an object (the client's result for that input request)".into(),
        });
    }
    for (key, value) in responses {
        answered(state, task_id, &key, Ok(value)).await;
    }
    Ok(())
}

/// Capacity of the channel to a gateway task's `tasks/result` stream.
const STREAM_CAPACITY: usize = 64;

/// The 2025-11-25 `tasks/result` of a gateway task this process holds, not yet terminal: an
/// SSE stream of its input requests and status changes, then `last` (the answer once the task
/// is terminal, JSON-RPC text). Stops when the client goes away.
pub(super) fn stream<F>(
    state: Arc<GatewayTasksState>,
    live: Arc<Live>,
    record: Arc<TaskRecord>,
    req: McpRequest,
    last: F,
) -> tokio::sync::mpsc::Receiver<Event>
where
    F: std::future::Future<Output = Bytes> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Event>(STREAM_CAPACITY);
    tokio::spawn(async move {
        let closed = tx.clone();
        tokio::select! {
            _ = closed.closed() => {}
            _ = async {
                if follow(&state, &live, &record, &req, &tx).await {
                    let bytes = last.await;
                    let _ = tx.send(Event::message(String::from_utf8_lossy(&bytes).into_owned())).await;
                }
            } => {}
        }
    });
    rx
}

/// Sends the held call's input requests (asked through `relay::Inputs`, each still waiting
/// once per stream, see [`crate::layers::relay::Inputs::ask_again`]) and status changes on
/// `tx` until the task is terminal; `false` when the client went away.
async fn follow(
    state: &Arc<GatewayTasksState>,
    live: &Live,
    record: &TaskRecord,
    req: &McpRequest,
    tx: &mpsc::Sender<Event>,
) -> bool {
    let task_id = record.task_id.as_str();
    let declared = req.extensions.get::<SessionView>().map(|v| v.client);
    let declared = move |pointer: &str| declared.is_some_and(|c| c.has(pointer));
    let mut changed = live.input.changed.subscribe();
    let mut terminal = live.terminal.subscribe();
    let mut status: Option<TaskStatus> = None;
    // The keys this stream has carried: every new stream carries each request still waiting
    // (a client that lost its stream sees them again, under the ids they were first sent
    // under), and each once.
    let mut sent: HashSet<String> = HashSet::new();
    loop {
        // A status change seen here: `notifications/tasks/status` (2025-11-25, optional).
        let now = state
            .registry
            .lookup(&record.upstream, task_id, &record.owner)
            .await;
        if let Some(record) = now {
            if status != Some(record.status) {
                status = Some(record.status);
                let note = json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                    "params": serde_json::to_value(record.to_task()).unwrap_or_default()});
                if tx.send(Event::message(note.to_string())).await.is_err() {
                    return false;
                }
            }
        }
        let waiting = live.input.waiting.lock().clone();
        // Only what still waits is remembered (bounded by [`MAX_WAITING`]).
        sent.retain(|k| waiting.iter().any(|w| &w.key == k));
        for w in waiting {
            if sent.contains(&w.key) {
                continue;
            }
            let request = json!({"method": w.method, "params": w.params});
            match state
                .inputs
                .ask_again(&declared, &req.ctx, task_id, &w.key, &request)
            {
                Ask::Already => {}
                Ask::Send(message) => {
                    if tx.send(Event::message(message)).await.is_err() {
                        return false;
                    }
                    sent.insert(w.key);
                }
                Ask::Unsupported(method) => {
                    let error = json!({"code": jsonrpc::METHOD_NOT_FOUND, "message": format!("{method}: the client did not declare the capability it needs, so taskgate cannot ask it")});
                    answered(state, task_id, &w.key, Err(error)).await;
                }
            }
        }
        if *terminal.borrow() {
            return true;
        }
        let woken = tokio::select! {
            r = changed.changed() => r.is_ok(),
            _ = terminal.wait_for(|t| *t) => true,
        };
        if !woken {
            let _ = terminal.wait_for(|t| *t).await;
        }
    }
}

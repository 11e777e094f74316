//! A gateway task's creation and its held call (see the module docs of `gateway_tasks`): the
//! record written durably, the `CreateTaskResult` answered, the plain `tools/call` sent upstream
//! under taskgate's id and held on a task of its own until it ends, is cancelled, or expires.

use super::answers::{create_result, detailed_task, id_value, with_member, with_related_task_raw};
use super::{
    GatewayTasksState, Live, Outcome, PENDING_FINAL_BYTES, PENDING_FINAL_WRITES, POLL_INTERVAL_MS,
};
use crate::exchange::{Deadline, GatewayError, HeldTask, McpReply, McpRequest, Operation};
use crate::jsonrpc::{self, splice, Id, Message};
use crate::layers::extensions::{PendingCreation, RelaysUpstreamRequests};
use crate::layers::observe::lenient_value;
use crate::layers::relay::mrtr::MAX_ROUNDS;
use crate::layers::relay::read_to_raw_answer;
use crate::layers::McpService;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::{format_rfc3339_ms, now_ms, TaskStatus};
use crate::metrics::LocalReason;
use crate::registry::{FinalWriteBackoff, Observed, OnRefusal};
use crate::sse::Event;
use crate::store::{LeaseKind, Origin, TaskRecord};
use crate::text::cut;
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a 2025-11-25 call taskgate holds for a cancelled gateway task may go on after its
/// `notifications/cancelled` before taskgate closes it (its end is then "resources released",
/// after the quiet window). 5 s: a server that stops its handler answers or ends its stream
/// well within it; one that keeps the stream open does not keep a connection per cancelled
/// task until the task's ttl.
pub const CANCELLED_CALL_GRACE: Duration = Duration::from_secs(5);
use super::input::{CallInput, NotKept, MAX_WAITING};
use tokio::sync::{mpsc, oneshot, watch};
use tower::ServiceExt;

/// The shortest time between two `statusMessage` writes from progress notifications (a chatty
/// server makes one store write per this interval at most).
pub const PROGRESS_WRITE_EVERY: Duration = Duration::from_millis(200);
/// The longest `statusMessage` taken from a progress notification's `message` (or its
/// `progress`/`total` when it has none; longer ones are
/// cut at a character boundary and marked `…`): it is written to the record at every
/// [`PROGRESS_WRITE_EVERY`] and sent in every `tasks/get`, `tasks/list` and status
/// notification, so a server's megabyte of progress text must not be.
pub const MAX_PROGRESS_MESSAGE: usize = 4096;

/// The answer to a task-augmented `tools/call` taskgate runs itself: the record written
/// durably, then the `CreateTaskResult`; the held call started in the background.
pub(super) async fn create<S: McpService>(
    state: Arc<GatewayTasksState>,
    inner: S,
    mut req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let era = req.era();
    let Some(pending) = req.extensions.remove::<PendingCreation>() else {
        return inner.oneshot(req).await;
    };
    let (Operation::Post(msg), Some(client_id)) = (&req.op, req.id().cloned()) else {
        return inner.oneshot(req).await;
    };
    // A session the upstream said is gone (`gone`): 404, so that the client initializes
    // again, rather than one more task whose held call fails (the slot `pending` reserved is
    // given back as it drops).
    if era == Era::Legacy && super::gone::is_gone(&state, &req) {
        return Ok(
            McpReply::error(era, Some(&client_id), &McpError::SessionNotFound)
                .answered_locally(LocalReason::GatewayTask),
        );
    }
    let refuse = |error: McpError| {
        McpReply::error(era, Some(&client_id), &error).answered_locally(LocalReason::GatewayTask)
    };
    match state.registry.admit_creation(&pending.reservation).await {
        Ok(true) => {}
        // The call took a provisional slot, as the server would decide whether it becomes a
        // task; here taskgate decides, so the slot is admitted against the owner's live tasks
        // before anything goes upstream: other calls in flight, holding provisional slots too,
        // are not tasks and do not count; on a shared store the database counts. (A
        // 2025-11-25 creation's slot was taken within the limit by `tasks`: admitted at once.)
        Ok(false) => {
            let error = state.registry.refuse_over_limit(&req.ctx.upstream);
            return Ok(McpReply::error(era, Some(&client_id), &error)
                .answered_locally(LocalReason::OwnerLimit));
        }
        Err(_) => {
            // The store's error is logged and counted by the registry, not sent.
            let error = McpError::StoreUnavailable {
                method: Some("tools/call".into()),
            };
            return Ok(McpReply::error(era, Some(&client_id), &error)
                .answered_locally(LocalReason::StoreUnavailable));
        }
    }
    let Some(task_id) = minted_task_id() else {
        return Ok(refuse(McpError::NoRandomTaskId));
    };
    let n = state.seq.fetch_add(1, Ordering::Relaxed);
    let own_id = Id::from_json(&format!("\"taskgate-gt-{n}\"")).expect("a string id");
    let Some((plain, token)) = plain_call(msg, &own_id, &task_id) else {
        return Ok(refuse(McpError::InvalidParams {
            message: "tools/call: params must be an object for taskgate to run the call as a task"
                .into(),
        }));
    };
    let ttl = task_ttl(&req, state.registry.config().max_ttl_ms);
    let now = format_rfc3339_ms(now_ms());
    let task = json!({"taskId": task_id, "status": "working", "createdAt": now,
        "lastUpdatedAt": now, "ttl": ttl, "pollInterval": POLL_INTERVAL_MS});
    let template = TaskRecord {
        origin: Origin::Gateway,
        ..TaskRecord::clone(&pending.template)
    };
    let Some(record) = state.registry.creation_record(&template, &task) else {
        return Ok(refuse(McpError::RecordNotMade));
    };
    let (cancel_tx, cancel_rx) = oneshot::channel();
    let (answers_tx, answers_rx) = mpsc::channel(MAX_WAITING);
    let live = Arc::new(Live {
        upstream: req.ctx.upstream.to_string(),
        record: Arc::new(record.clone()),
        session: super::listen::session_of(&req),
        cancel: Mutex::new(Some(cancel_tx)),
        terminal: watch::channel(false).0,
        input: CallInput::new(answers_tx),
    });
    // A tier: the call's lease, before the record (the client can then ask another replica
    // to cancel the call, and a replica adopts it if this one is lost). Without it the call is
    // refused as without its record: nothing has gone upstream yet.
    let lease = match take_lease(&state, &req.ctx.upstream, &task_id, &live).await {
        Ok(lease) => lease,
        Err(e) => return Ok(refuse(e)),
    };
    if state
        .registry
        .record_creation(record.clone(), &pending.reservation)
        .await
        .is_err()
    {
        // Logged and counted by the registry (`record_creation`).
        return Ok(refuse(McpError::NotRecorded {
            before_upstream: true,
        }));
    }
    // `cancel` drops a notifications/cancelled for the client's id from now on (tasks are
    // cancelled with tasks/cancel).
    let _ = pending.created.set(task_id.clone());
    state
        .registry
        .releases()
        .note_progress_token(&req.ctx.upstream, token.clone(), &task_id);
    state.live.lock().insert(task_id.clone(), live.clone());
    req.op = Operation::Post(plain);
    // The task's expiry bounds the held call; no upstream timeout (a tool may run for minutes).
    req.extensions.insert(Deadline::Unbounded);
    // The server's requests during the call reach this layer, and its answers the server, also
    // through the reverse bridge (a 2026-07-28 client on a 2025-11-25 server).
    req.extensions.insert(RelaysUpstreamRequests);
    // A transport that loses the call with its process names the task in that death, so the
    // task is released as the dead process's (`gateway.rs`, `registry::gone`).
    req.extensions.insert(HeldTask(task_id.as_str().into()));
    let held = Held {
        state: state.clone(),
        record,
        own_id,
        token,
        era,
        lease,
    };
    tokio::spawn(held.run(inner, req, cancel_rx, answers_rx, live));
    let body = create_result(&task, era);
    Ok(
        McpReply::local_json(jsonrpc::result_response(&client_id, &body.to_string()))
            .answered_locally(LocalReason::GatewayTask),
    )
}

/// A gateway task's ttl in ms: the client's `params.task.ttl` (2025-11-25, already bounded by
/// `tasks`), else `cap` (`tasks.max_ttl_ms`).
fn task_ttl(req: &McpRequest, cap: u64) -> u64 {
    req.classified()
        .and_then(|c| c.task())
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|t| t.get("ttl").and_then(Value::as_f64))
        .map_or(cap, |t| (t as u64).min(cap))
}

/// In a tier (a store with leases): the lease on task `task_id`'s held call, a cancel from
/// another replica reaching `live`; `None` without leases. `McpError::LeaseNotTaken` when the
/// store could not give it.
async fn take_lease(
    state: &Arc<GatewayTasksState>,
    upstream: &str,
    task_id: &str,
    live: &Arc<Live>,
) -> Result<Option<crate::registry::LeaseGuard>, McpError> {
    let Some(keeper) = state.registry.leases() else {
        return Ok(None);
    };
    let hook = super::cancelled_elsewhere(state.clone(), live.clone());
    keeper
        .hold(upstream, task_id, LeaseKind::Held, Some(hook))
        .await
        .map(Some)
        .map_err(|e| {
            tracing::warn!(upstream, task_id, error = %e, "a gateway task's call lease could not be taken");
            McpError::LeaseNotTaken
        })
}

/// Whether an answer (JSON text) is a 2026-07-28 `input_required` result (MRTR).
fn asks_for_input(answer: &[u8]) -> bool {
    splice::raw_at(answer, &["result", "resultType"])
        .ok()
        .flatten()
        .and_then(|t| serde_json::from_str::<String>(t.get()).ok())
        .is_some_and(|t| t == "input_required")
}

/// `tgt-` and 32 random hex digits: unguessable (a 2026-07-28 task without auth has no other key).
fn minted_task_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).ok()?;
    Some(format!("tgt-{}", hex::encode(bytes)))
}

/// The client's `tools/call` as the plain call taskgate sends: `params.task` removed, the id
/// taskgate's, and a `progressToken` (the client's, else `task_id`); every other byte as the
/// client sent it. Returns it with the token's JSON text. `None` when `params` is not an object.
pub(super) fn plain_call(msg: &Message, own_id: &Id, task_id: &str) -> Option<(Message, String)> {
    msg.params().filter(|p| p.starts_with('{'))?;
    let mut bytes: Bytes = msg.bytes().clone();
    if let Ok(Some(without)) = splice::remove(&bytes, &["params", "task"]) {
        bytes = without;
    }
    // A 2026-07-28 client's tasks extension is taskgate's to serve here: declared to the
    // server, it invites a task of the server's own, which fails the gateway task.
    let extension = [
        "params",
        "_meta",
        crate::mcp::capabilities::CLIENT_CAPABILITIES_META,
        "extensions",
        crate::mcp::capabilities::TASKS_EXTENSION,
    ];
    if let Ok(Some(without)) = splice::remove(&bytes, &extension) {
        bytes = without;
    }
    bytes = splice::replace(&bytes, &["id"], own_id.as_json()).ok()??;
    let token_path = ["params", "_meta", "progressToken"];
    let token = match splice::raw_at(&bytes, &token_path).ok()? {
        Some(raw) => serde_json::from_str::<Value>(raw.get()).ok()?.to_string(),
        None => {
            let token = serde_json::to_string(task_id).ok()?;
            let member = format!("\"progressToken\":{token}");
            let with = match splice::raw_at(&bytes, &["params", "_meta"]).ok()? {
                Some(meta) if meta.get().starts_with('{') => {
                    splice::insert_first(&bytes, meta.get(), &member)
                }
                Some(_) => None,
                None => {
                    let params = splice::raw_at(&bytes, &["params"]).ok()??;
                    splice::insert_first(&bytes, params.get(), &format!("\"_meta\":{{{member}}}"))
                }
            };
            bytes = with?;
            token
        }
    };
    Some((Message::parse(bytes).ok()?, token))
}

/// The held call `out` sent again after an MRTR round (2026-07-28 §2.3): under the id `id`
/// (JSON text), its `params` as first sent plus `inputResponses` and `requestState` (echoed as
/// the upstream gave it; absent when it gave none). `None` when the call is not a request with
/// object `params`.
fn retried(
    out: &McpRequest,
    id: &str,
    responses: serde_json::Map<String, Value>,
    state: Option<Value>,
) -> Option<(Message, Id)> {
    let Operation::Post(msg) = &out.op else {
        return None;
    };
    let mut v: Value = msg.parse_as().ok()?;
    let params = v.get_mut("params")?.as_object_mut()?;
    params.insert("inputResponses".into(), Value::Object(responses));
    match state {
        Some(s) => params.insert("requestState".into(), s),
        None => params.remove("requestState"),
    };
    let id = Id::from_json(id)?;
    v["id"] = id_value(&id);
    Some((Message::parse(Bytes::from(v.to_string())).ok()?, id))
}

/// One held call and what it needs to finish its task.
struct Held {
    state: Arc<GatewayTasksState>,
    /// The record as created.
    record: TaskRecord,
    /// The id the call went upstream under (before `ids`).
    own_id: Id,
    /// The call's `progressToken`, JSON text.
    token: String,
    era: Era,
    /// The call's lease in a tier (ended when the call has).
    lease: Option<crate::registry::LeaseGuard>,
}

/// How a held call ended, as its final write records it.
struct Final {
    status: TaskStatus,
    /// The `statusMessage` (empty: none).
    message: String,
    outcome: Outcome,
    /// When the call ended (the record's `lastUpdatedAt`).
    now: String,
}

/// How the wait on a held call ended.
enum Ended {
    Answer(Result<Option<Bytes>, GatewayError>),
    Cancelled,
    Expired,
}

impl Held {
    /// Sends the plain call and holds it (see the module docs), then forgets the live entry.
    async fn run<S: McpService>(
        self,
        inner: S,
        out: McpRequest,
        cancel_rx: oneshot::Receiver<()>,
        answers_rx: mpsc::Receiver<Bytes>,
        live: Arc<Live>,
    ) {
        let upstream = out.ctx.upstream.clone();
        let task_id = self.record.task_id.clone();
        // "Resources released" waits for this hold: the held call, until it has ended.
        let hold = self.state.registry.releases().hold(&upstream, &task_id);
        let until = Duration::from_millis(self.record.expires_at.saturating_sub(now_ms()));
        let expiry = tokio::time::sleep(until);
        tokio::pin!(expiry);
        let notify_ctx = out.clone();
        // The client's answers to the server's requests go upstream in the call's context.
        tokio::spawn(respond(inner.clone(), out.clone(), answers_rx));
        let progress = Progress::new(self.state.clone(), &upstream, &task_id, &self.token)
            .until_terminal(live.clone());
        let answer_inner = inner.clone();
        let own_id = self.own_id.clone();
        let (round_state, round_live) = (self.state.clone(), live.clone());
        // Boxed, so that dropping it below closes the call's stream before the hold goes.
        let mut call = Box::pin(async move {
            let (mut out, mut own_id) = (out, own_id);
            let base = own_id.as_json().trim_end_matches('"').to_string();
            for round in 1.. {
                let reply = answer_inner.clone().oneshot(out.clone()).await?;
                // Remembered before the task is recorded failed: whoever sees it failed and
                // asks for another task on the session gets the 404 (`gone`).
                if super::gone::says_session_gone(&reply) {
                    super::gone::remember(
                        &round_state,
                        &out.ctx.upstream,
                        round_live.session.as_deref(),
                    );
                }
                // Kept as the bytes that came: a result nested past serde_json's 128 levels
                // is still the call's result (cold test, session 25).
                let (answer, _rest) = read_to_raw_answer(reply, &own_id, |ev| {
                    let (progress, inner, out) =
                        (progress.clone(), answer_inner.clone(), out.clone());
                    async move {
                        progress.on_event(ev, inner, out).await;
                        true
                    }
                })
                .await;
                // A 2026-07-28 upstream asking for input within the call (MRTR): relayed to the
                // client as the task's input requests, then the call sent again (`input`).
                let answer = match answer {
                    Some(a) if asks_for_input(&a) => {
                        // An `input_required` answer is read whole (its input requests and
                        // state are relayed); one nested too deep to read has none usable.
                        lenient_value(&a).unwrap_or(Value::Null)
                    }
                    other => return Ok(other),
                };
                let why = if round > MAX_ROUNDS {
                    format!("the upstream asked for input more than {MAX_ROUNDS} times in one call (relay::mrtr::MAX_ROUNDS)")
                } else {
                    match super::input::mrtr_round(&round_state, &round_live, &answer).await {
                        Ok(responses) => {
                            let state = answer.pointer("/result/requestState").cloned();
                            let retry_id = format!("{base}-r{round}\"");
                            match retried(&out, &retry_id, responses, state) {
                                Some((msg, id)) => {
                                    out.op = Operation::Post(msg);
                                    own_id = id;
                                    continue;
                                }
                                None => "the call could not be sent again with the client's input"
                                    .into(),
                            }
                        }
                        Err(why) => why,
                    }
                };
                return Ok(Some(Bytes::from(
                    json!({"jsonrpc": "2.0", "id": id_value(&own_id),
                    "error": {"code": jsonrpc::INTERNAL_ERROR, "message": why}})
                    .to_string(),
                )));
            }
            Ok(None)
        });
        let cancelled = async {
            if cancel_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let ended = tokio::select! {
            answer = &mut call => Ended::Answer(answer),
            _ = cancelled => Ended::Cancelled,
            _ = &mut expiry => Ended::Expired,
        };
        match ended {
            Ended::Answer(answer) => {
                self.finish(answer).await;
                super::listen::publish(&self.state, live.session.as_deref(), &live.record).await;
            }
            Ended::Cancelled => {
                // The status is recorded already (`answers::cancel`): the server is told the
                // result is no longer needed, and the call is held until it has really ended.
                if self.era == Era::Legacy {
                    self.notify_cancelled(&inner, &notify_ctx, "the task was cancelled")
                        .await;
                    // Bounded: a server that heeds the notification sends no answer and may
                    // keep its stream open (the TypeScript SDK does), so after
                    // [`CANCELLED_CALL_GRACE`] taskgate closes the call itself (the connection's
                    // close is the call's end); otherwise every cancelled task would hold a
                    // connection until its ttl.
                    tokio::select! {
                        late = &mut call => self.late(late).await,
                        _ = tokio::time::sleep(CANCELLED_CALL_GRACE) => {}
                        _ = &mut expiry => {}
                    }
                }
                // 2026-07-28: closing the stream (dropping the call) is the cancel.
            }
            Ended::Expired => {
                self.fail(
                    "the task's ttl ended before the upstream answered the call taskgate held",
                )
                .await;
                super::listen::publish(&self.state, live.session.as_deref(), &live.record).await;
                if self.era == Era::Legacy {
                    self.notify_cancelled(&inner, &notify_ctx, "the task expired")
                        .await;
                }
            }
        }
        drop(call);
        drop(hold);
        drop(self.lease);
        self.state.live.lock().remove(&task_id);
        self.state.held_ended.notify_waiters();
        self.state.inputs.forget(&task_id);
        live.terminal.send_replace(true);
    }

    /// Applies how the call ended: a result is `completed`, a JSON-RPC error `failed`,
    /// anything else `failed` saying why; the outcome kept for `tasks/result`. The answer is
    /// read member by member from its bytes, and the result kept is a slice of them (never a
    /// `Value` serialised again): a result nested past serde_json's 128 levels is kept exactly.
    async fn finish(&self, answer: Result<Option<Bytes>, GatewayError>) {
        let task_id = &self.record.task_id;
        let answer = match answer {
            Ok(Some(a)) => a,
            Ok(None) => {
                return self
                    .fail("the upstream's answer ended without the call's result")
                    .await
            }
            Err(e) => return self.fail(&e.to_string()).await,
        };
        let member = |name: &str| {
            splice::raw_at(&answer, &[name])
                .ok()
                .flatten()
                .map(|r| r.get())
                .filter(|r| r.starts_with('{'))
        };
        if let Some(error) = member("error") {
            // An error object is read whole (its members too deep to read as `null`).
            let error = lenient_value(error.as_bytes()).unwrap_or(Value::Null);
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the call failed")
                .to_string();
            let outcome = Outcome::Error(Arc::new(error));
            self.end(TaskStatus::Failed, &message, outcome).await;
            return;
        }
        let Some(result) = member("result") else {
            return self
                .fail("the upstream answered the call with neither a result nor an error")
                .await;
        };
        let result_type = splice::raw_at(result.as_bytes(), &["resultType"])
            .ok()
            .flatten()
            .and_then(|t| serde_json::from_str::<String>(t.get()).ok());
        if result_type.as_deref() == Some("task") {
            self.state.learn(true);
            return self
                .fail("the upstream created a task of its own for the plain call; set upstream.tasks = \"upstream\"")
                .await;
        }
        // 2025-11-25: a `tasks/result` answer carries the related-task `_meta`; 2026-07-28 has
        // no such key (the result sits inside the task it belongs to).
        let result: Arc<str> = match self.record.era {
            Era::Legacy => match with_related_task_raw(result, task_id) {
                Some(r) => r.into(),
                None => {
                    return self
                        .fail("the upstream's result could not be read to add the task's _meta")
                        .await
                }
            },
            Era::Modern => result.into(),
        };
        self.end(TaskStatus::Completed, "", Outcome::Result(result))
            .await;
    }

    /// `failed` with `why` as the `statusMessage` (and the `error` a 2026 `DetailedTask` needs).
    async fn fail(&self, why: &str) {
        let error = json!({"code": jsonrpc::INTERNAL_ERROR, "message": why});
        self.end(TaskStatus::Failed, why, Outcome::Error(Arc::new(error)))
            .await;
    }

    /// Keeps `outcome` for `tasks/result` (in memory, see `remember`), records the terminal
    /// `status` (durably, through the registry's status machine: a task already cancelled
    /// stays so, the answer counted late) and what the record keeps (2025: the `CallToolResult`
    /// of a completed task, the JSON-RPC `error` of a failed one; 2026: the `DetailedTask` with
    /// the outcome inline). The outcome is serialized once, here.
    ///
    /// A write the task store refuses (a PostgreSQL outage) is retried ([`Held::retry_final`])
    /// until the store takes it or the task's ttl ends: nobody else holds the outcome (the
    /// upstream got a plain call), and the call's lease stays held and renewed meanwhile (it
    /// ends after this returns), so no other replica adopts the task and fails it.
    async fn end(&self, status: TaskStatus, message: &str, outcome: Outcome) {
        let (registry, task_id) = (&self.state.registry, self.record.task_id.as_str());
        let end = Final {
            status,
            message: message.to_string(),
            outcome,
            now: format_rfc3339_ms(now_ms()),
        };
        let (text, modern_stored) = self.final_texts(&end);
        let kept = modern_stored.as_ref().map_or(text.len(), String::len);
        let max = registry.config().max_stored_result_bytes;
        if matches!(end.outcome, Outcome::Result(_)) && kept as u64 > max {
            // Neither the record nor memory may keep it: `completed` would be a task whose
            // result nobody can fetch (a 2026 `tasks/get` could not even be answered: its
            // `DetailedTask` must carry the result; break-tasks M4). `failed`, saying why.
            let why = format!(
                "the call's result ({kept} bytes as kept) is larger than tasks.max_stored_result_bytes ({max}), so taskgate could not keep it for the task"
            );
            return Box::pin(self.fail(&why)).await;
        }
        self.state
            .remember(task_id, end.outcome.clone(), text.len());
        if self.write_final(&end, text, modern_stored).await {
            return;
        }
        // Only a shared store refuses a write for a while (a PostgreSQL outage); sled's
        // refusal (a full disk) is logged and counted, as any failed write (review).
        if registry.store().shared() {
            self.retry_final(end, kept).await;
        }
    }

    /// The outcome's JSON text, and (2026) the `DetailedTask` the record keeps with it inline
    /// (a few hundred bytes more: measured whole, review 17 #8).
    fn final_texts(&self, end: &Final) -> (String, Option<String>) {
        let text = match &end.outcome {
            Outcome::Result(raw) => raw.to_string(),
            Outcome::Error(v) => v.to_string(),
        };
        let modern_stored = (self.era == Era::Modern).then(|| {
            let mut record = self.record.clone();
            record.status = end.status;
            record.last_updated_at = end.now.clone();
            record.status_message = (!end.message.is_empty()).then(|| end.message.clone());
            let member = match end.outcome {
                Outcome::Result(_) => "result",
                Outcome::Error(_) => "error",
            };
            with_member(&detailed_task(&record), member, &text)
        });
        (text, modern_stored)
    }

    /// One try of the final write: the status and what the record keeps in one store update,
    /// awaited (nobody else holds the outcome, so no crash may leave the one without the
    /// other: review 19 #2). Returns whether the store holds a terminal record now (or none:
    /// swept); `false` when the store refused it (logged and counted by the registry).
    async fn write_final(&self, end: &Final, text: String, modern_stored: Option<String>) -> bool {
        let (registry, upstream, task_id) = (
            &self.state.registry,
            self.record.upstream.as_str(),
            self.record.task_id.as_str(),
        );
        let mut report = json!({"status": end.status.as_str(), "lastUpdatedAt": end.now});
        if !end.message.is_empty() {
            report["statusMessage"] = json!(end.message);
        }
        const SOURCE: &str = "gateway task";
        // `retry_final` writes a refused one again (it holds the outcome and the call's lease).
        const OWN_RETRY: OnRefusal = OnRefusal::CallerRetries;
        // 2026: the `DetailedTask` (result or error inline) is what the record keeps either
        // way; 2025: the result, or the error in its own field.
        let observed = match (modern_stored, &end.outcome) {
            (Some(stored), _) => {
                registry
                    .observe_task_with_result(upstream, task_id, report, stored, SOURCE, OWN_RETRY)
                    .await
            }
            (None, Outcome::Result(_)) => {
                registry
                    .observe_task_with_result(upstream, task_id, report, text, SOURCE, OWN_RETRY)
                    .await
            }
            (None, Outcome::Error(_)) => {
                registry
                    .observe_task_with_error(upstream, task_id, report, text, SOURCE, OWN_RETRY)
                    .await
            }
        };
        match observed {
            Observed::Recorded(s) if s.is_terminal() => true,
            Observed::Rewrite { .. } => true,
            // `Unknown` is also what a refused write returns: the store says which.
            _ => match registry.try_record_of(upstream, task_id).await {
                Ok(None) => true,
                Ok(Some(r)) => r.status.is_terminal(),
                Err(_) => false,
            },
        }
    }

    /// The final write `end` (of `bytes` of outcome as kept), refused by the store, tried again
    /// after [`crate::registry::FINAL_WRITE_FIRST_WAIT`], the wait doubling up to
    /// [`crate::registry::FINAL_WRITE_MAX_WAIT`], until the store takes it or the task's ttl
    /// ends (or taskgate stops: a graceful stop's drain waits for it as for a held call, see
    /// `GatewayTasksState::held_calls_ended`). The outcome is served from memory meanwhile
    /// (`remember`; `tasks/result` of this replica waits for the write, as it waits for the
    /// call). The registry does not keep this write itself ([`OnRefusal::CallerRetries`]). Past [`PENDING_FINAL_WRITES`] or
    /// [`PENDING_FINAL_BYTES`] of outcomes held so, the task is written `failed` instead,
    /// saying its outcome could not be kept. Each refused try is counted in
    /// `taskgate_store_write_failures_total` (by the registry).
    async fn retry_final(&self, end: Final, bytes: usize) {
        let (upstream, task_id) = (self.record.upstream.as_str(), self.record.task_id.as_str());
        let pending = self.state.pend_final(bytes);
        let end = if pending.is_some() {
            end
        } else {
            let why = format!(
                "the call ended while the task store was out of reach, and {PENDING_FINAL_WRITES} outcomes ({PENDING_FINAL_BYTES} bytes at most) already waited in taskgate's memory to be written: this call's outcome was not kept"
            );
            tracing::warn!(upstream, task_id, "{why}");
            let error = json!({"code": jsonrpc::INTERNAL_ERROR, "message": why});
            let outcome = Outcome::Error(Arc::new(error));
            let size = why.len() + 40;
            self.state.remember(task_id, outcome.clone(), size);
            Final {
                status: TaskStatus::Failed,
                message: why,
                outcome,
                now: end.now,
            }
        };
        tracing::warn!(
            upstream,
            task_id,
            status = end.status.as_str(),
            "a gateway task's final status and outcome could not be written (the task store failed): tried again until the store takes it or the task's ttl ends; its call lease is kept meanwhile"
        );
        let mut backoff = FinalWriteBackoff::default();
        let mut tries = 1u32;
        loop {
            let left = self.record.expires_at.saturating_sub(now_ms());
            if left == 0 {
                tracing::warn!(upstream, task_id, tries, "a gateway task's ttl ended before the task store took its final status and outcome: they are lost");
                return;
            }
            backoff.sleep(Duration::from_millis(left)).await;
            tries += 1;
            // Ended meanwhile (a client's `tasks/cancel` once the store was back), or gone:
            // nothing to write, and no late result to count (review).
            match self.state.registry.try_record_of(upstream, task_id).await {
                Ok(Some(r)) if !r.status.is_terminal() => {}
                Ok(_) => {
                    drop(pending);
                    return;
                }
                Err(_) => continue,
            }
            let (text, modern_stored) = self.final_texts(&end);
            if self.write_final(&end, text, modern_stored).await {
                tracing::info!(
                    upstream,
                    task_id,
                    tries,
                    "a gateway task's final status and outcome were written after the task store came back"
                );
                drop(pending);
                return;
            }
        }
    }

    /// An answer that came after the task was cancelled. A result (the work ran to its end
    /// after all) is applied as a `completed` report, which the status machine counts as a
    /// late result and never lets overturn `cancelled`. An error, or no answer, is how a server
    /// heeds the `notifications/cancelled` (the Python SDK `mcp` 1.x answers the cancelled call
    /// `{"code":0,"message":"Request cancelled"}`): the call's end, nothing late.
    /// Awaited before the held call lets go of its task (its release follows), so whoever
    /// sees the task released sees its late result too (review 20 #8: written by a task of its
    /// own, a test had to sleep for it).
    async fn late(&self, answer: Result<Option<Bytes>, GatewayError>) {
        let status = match &answer {
            Ok(Some(a)) if matches!(splice::raw_at(a, &["result"]), Ok(Some(_))) => {
                TaskStatus::Completed
            }
            _ => return,
        };
        self.state
            .registry
            .observe_task_as(
                &self.record.upstream,
                &self.record.task_id,
                json!({"status": status.as_str()}),
                "gateway task (answer after cancel)",
            )
            .await;
    }

    /// One `notifications/cancelled` naming the held call's id, sent as the client's (so `ids`
    /// names the id it used upstream), at most once per held call (its caller ends the wait).
    async fn notify_cancelled<S: McpService>(&self, inner: &S, out: &McpRequest, reason: &str) {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id_value(&self.own_id), "reason": reason}});
        let Ok(msg) = Message::parse(Bytes::from(note.to_string())) else {
            return;
        };
        let mut req = out.clone();
        req.op = Operation::Post(msg);
        req.extensions.remove::<Deadline>();
        match inner.clone().oneshot(req).await {
            Ok(_) => tracing::info!(
                upstream = %self.record.upstream,
                task_id = %self.record.task_id,
                request_id = %self.own_id.as_json(),
                "gateway task cancelled: notifications/cancelled sent upstream"
            ),
            Err(e) => tracing::warn!(
                upstream = %self.record.upstream,
                task_id = %self.record.task_id,
                error = %e,
                "gateway task cancelled: notifications/cancelled could not be sent"
            ),
        }
    }
}

/// The progress of one held call: `notifications/progress` on its token become the task's
/// `statusMessage` (at most one write per [`PROGRESS_WRITE_EVERY`]); requests the server sends
/// the client during the call are refused (see the module docs).
#[derive(Clone)]
struct Progress {
    state: Arc<GatewayTasksState>,
    upstream: Arc<str>,
    task_id: Arc<str>,
    token: Arc<str>,
    last_write: Arc<Mutex<Option<Instant>>>,
    /// The held call's live entry (its terminal flag, its input).
    live: Option<Arc<Live>>,
}

impl Progress {
    fn new(state: Arc<GatewayTasksState>, upstream: &Arc<str>, task_id: &str, token: &str) -> Self {
        Progress {
            state,
            upstream: upstream.clone(),
            task_id: task_id.into(),
            token: token.into(),
            last_write: Arc::default(),
            live: None,
        }
    }

    /// Stops writing `statusMessage`s once `terminal` says the task is terminal (a cancelled
    /// task's server may go on sending progress: `observe` counts that as activity after the
    /// cancel; the record is not touched).
    fn until_terminal(mut self, live: Arc<Live>) -> Self {
        self.live = Some(live);
        self
    }

    fn is_terminal(&self) -> bool {
        self.live.as_ref().is_some_and(|l| *l.terminal.borrow())
    }

    async fn on_event<S: McpService>(&self, ev: Event, inner: S, out: McpRequest) {
        let Some(data) = ev.data.as_deref() else {
            return;
        };
        let Ok(msg) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match (msg.get("method").and_then(Value::as_str), msg.get("id")) {
            (Some("notifications/progress"), None) => self.on_progress(&msg).await,
            (Some(method), Some(id)) => self.on_request(&msg, method, id, inner, out).await,
            _ => {}
        }
    }

    async fn on_progress(&self, msg: &Value) {
        if self.is_terminal() {
            return;
        }
        let Some(params) = msg.get("params") else {
            return;
        };
        let token = params.get("progressToken").map(Value::to_string);
        if token.as_deref() != Some(&*self.token) {
            return;
        }
        {
            let mut last = self.last_write.lock();
            if last.is_some_and(|l| l.elapsed() < PROGRESS_WRITE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        // Cut either way: `progress` and `total` are the server's JSON too (a string or an
        // array of any size, not only the numbers the spec has them).
        let message = match params.get("message").and_then(Value::as_str) {
            Some(m) => cut(m, MAX_PROGRESS_MESSAGE),
            None => {
                let progress = params.get("progress").map(Value::to_string);
                let total = params.get("total").map(Value::to_string);
                match (progress, total) {
                    (Some(p), Some(t)) => cut(&format!("{p}/{t}"), MAX_PROGRESS_MESSAGE),
                    (Some(p), None) => cut(&p, MAX_PROGRESS_MESSAGE),
                    _ => return,
                }
            }
        };
        // The status stays what the waiting requests make it (`input_required` while one
        // waits), decided under their status lock (see `input::CallInput::status_lock`).
        let _lock = match &self.live {
            Some(live) => Some(live.input.status_lock().await),
            None => None,
        };
        let status = match &self.live {
            Some(live) if live.input.waits() => "input_required",
            _ => "working",
        };
        let report = json!({"status": status, "statusMessage": message,
            "lastUpdatedAt": format_rfc3339_ms(now_ms())});
        self.state
            .registry
            .observe_task_as(
                &self.upstream,
                &self.task_id,
                report,
                "notifications/progress",
            )
            .await;
    }

    /// A request the server sends the client during the held call (see `input`): an input
    /// request waits for the client's answer (the task `input_required`), `ping` is answered
    /// at once, anything else (and an input request past the bound, or once the task is
    /// terminal) is answered with an error, so the server is not left waiting.
    async fn on_request<S: McpService>(
        &self,
        msg: &Value,
        method: &str,
        id: &Value,
        inner: S,
        out: McpRequest,
    ) {
        let Some(rpc_id) = Id::from_value(id) else {
            return;
        };
        if method == "ping" {
            send_upstream(inner, out, jsonrpc::result_response(&rpc_id, "{}")).await;
            return;
        }
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let kept = match &self.live {
            Some(live) if !self.is_terminal() => live.input.arrived(id, method, params),
            _ => Err(NotKept::Method),
        };
        let (code, why) = match kept {
            Ok(key) => {
                // `kept` is `Ok` only with a live entry.
                if let Some(live) = &self.live {
                    super::input::requested(&self.state, live, method).await;
                }
                tracing::info!(upstream = %self.upstream, task_id = %self.task_id, method, key, "a request to the client during a gateway task: input_required");
                return;
            }
            Err(NotKept::Full) => (
                jsonrpc::INTERNAL_ERROR,
                format!("{method}: {MAX_WAITING} requests of this call already wait for the client's answer"),
            ),
            Err(NotKept::Method) => (
                jsonrpc::METHOD_NOT_FOUND,
                format!("{method}: taskgate runs this call as a gateway task and relays only elicitation/create, sampling/createMessage and roots/list to its client while it is not terminal"),
            ),
        };
        tracing::info!(upstream = %self.upstream, task_id = %self.task_id, method, "a request to the client during a gateway task: refused");
        send_upstream(
            inner,
            out,
            jsonrpc::error_response(Some(&rpc_id), code, &why),
        )
        .await;
    }
}

/// Sends `bytes` (a JSON-RPC response to one of the server's requests) upstream in the held
/// call's context `out` (so `ids` and the session route it as the call went).
async fn send_upstream<S: McpService>(inner: S, out: McpRequest, bytes: Bytes) {
    let Ok(msg) = Message::parse(bytes) else {
        return;
    };
    let mut req = out;
    req.op = Operation::Post(msg);
    req.extensions.remove::<Deadline>();
    let _ = inner.oneshot(req).await;
}

/// Sends the client's answers to the server's requests upstream, in order, until the held
/// call's live entry (which holds the sender) is gone.
async fn respond<S: McpService>(inner: S, out: McpRequest, mut answers: mpsc::Receiver<Bytes>) {
    while let Some(bytes) = answers.recv().await {
        send_upstream(inner.clone(), out.clone(), bytes).await;
    }
}

//! The follower: relays one upgraded task to the client until its end.

use super::early::{answer_of, Others};
use super::progress::next_progress;
use super::requests::{internal_request, send_tasks_cancel, CancelSent};
use super::{TokenKey, UpgradeState, RELAY_CAPACITY};
use crate::config::OnDisconnect;
use crate::exchange::{CallKey, GatewayError, RequestContext};
use crate::jsonrpc::Id;
use crate::layers::McpService;
use crate::mcp::capabilities::ClientCapabilities;
use crate::mcp::errors::McpError;
use crate::mcp::task::{now_ms, remove_related_task, TaskStatus, MAX_POLL, MIN_POLL};
use crate::metrics::UpgradeOutcome;
use crate::registry::FinalWriteBackoff;
use crate::sse::Event;

use parking_lot::Mutex;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tower::ServiceExt;

/// A pending `tasks/get` poll (see [`poll_status`]).
type PollFut = Pin<Box<dyn Future<Output = Option<(String, String)>> + Send>>;

/// A `tasks/result` exchange that stayed open this long before it ended without an answer (a
/// server that closes its stream now and then, SSE polling) is no failure in a row: the wait
/// before the next one starts again from [`MIN_POLL`].
const HELD_OPEN: Duration = Duration::from_secs(1);

/// Follows one upgraded task to its end and writes to the client's stream.
pub(super) struct Follower<S> {
    pub(super) state: Arc<UpgradeState>,
    pub(super) inner: Arc<S>,
    pub(super) ctx: RequestContext,
    /// What the client declared in its session (the session stage's `SessionView`).
    pub(super) client: ClientCapabilities,
    pub(super) task_id: String,
    pub(super) original_id: Id,
    pub(super) progress_token: Option<Value>,
    pub(super) poll: Duration,
    pub(super) tx: mpsc::Sender<Event>,
    /// The last progress value sent on the client's token (shared with the GET-stream relay).
    pub(super) progress: Arc<Mutex<Option<f64>>>,
    /// This call's entry in `UpgradeState::tokens`.
    pub(super) token_key: Option<TokenKey>,
    pub(super) key: CallKey,
    pub(super) call_token: u64,
    /// `(status, statusMessage)` of the task's `CreateTaskResult`: the client's first progress
    /// message (the call became a task), and the status polls compare with first.
    pub(super) created: Option<(String, String)>,
}

/// A status as a progress message: `status`, or `status: statusMessage`.
fn status_text((status, message): &(String, String)) -> String {
    if message.is_empty() {
        status.clone()
    } else {
        format!("{status}: {message}")
    }
}

enum End {
    Answer(Value),
    /// A `tasks/get` poll said the task ended (status, statusMessage) and `tasks/result` has not
    /// answered within one more poll interval.
    Terminal(String, String),
    NeedsCapability(&'static str, &'static str),
    ClientCancelled,
    Disconnected,
    /// taskgate is shutting down: the client gets the error, the record stays as it is.
    Failed(String),
    /// Following gave up (why): the upstream stayed out of reach, timed out or answered 5xx
    /// until the task's ttl, or failed in a way that asking again does not mend. The client
    /// gets the error, the task is cancelled upstream and recorded failed ([`Terminal::GaveUp`]).
    GaveUp(String),
}

/// What one `tasks/result` exchange came to ([`Follower::result_once`]).
enum Asked {
    Answer(Value),
    /// A failure that may pass (why): the upstream out of reach, a timeout, a 5xx, a stream
    /// closed before the answer.
    Again(String),
    /// A failure that asking again does not mend (why).
    GiveUp(String),
    /// taskgate is shutting down (why).
    Stopping(String),
}

impl<S: McpService> Follower<S> {
    async fn send(&self, data: String) -> bool {
        self.tx.send(Event::message(data)).await.is_ok()
    }

    /// The next progress value on the client's token: above every value sent so far (the spec
    /// requires progress to increase), below `total` when there is one.
    fn next_progress(&self, wanted: Option<f64>, total: Option<f64>) -> f64 {
        next_progress(&self.progress, wanted, total)
    }

    /// Sends a status change as a progress message on the client's token (if it gave one).
    async fn progress(&self, message: String) {
        let Some(token) = &self.progress_token else {
            return;
        };
        let value = self.next_progress(None, None);
        let msg = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": { "progressToken": token, "progress": value, "message": message },
        });
        let _ = self.tx.send(Event::message(msg.to_string())).await;
    }

    /// Relays what the upstream sends on the task's streams: status notifications become
    /// progress messages, progress on the client's token is kept increasing, the rest as it came.
    pub(super) async fn relay_other(&self, mut ev: Event) {
        let Some(data) = &ev.data else { return };
        let bytes = data.as_bytes();
        use crate::mcp::needles::{may_name, PROGRESS, TASK_STATUS};
        // Only a status notification (its method read, escapes and all) becomes progress; a
        // message that merely mentions the method goes on as it came.
        let status_params = || {
            let v: Value = serde_json::from_str(data).ok()?;
            (v.get("method")?.as_str()? == "notifications/tasks/status")
                .then(|| v.get("params").cloned())
                .flatten()
        };
        if may_name(&TASK_STATUS, bytes) {
            if let Some(p) = status_params() {
                let status = p.get("status").and_then(Value::as_str).unwrap_or("");
                let message = p.get("statusMessage").and_then(Value::as_str).unwrap_or("");
                let text = if message.is_empty() {
                    status.to_string()
                } else {
                    format!("{status}: {message}")
                };
                self.progress(text).await;
                return;
            }
        }
        if self.progress_token.is_some() && may_name(&PROGRESS, bytes) {
            if let Ok(mut v) = serde_json::from_str::<Value>(data) {
                let on_token = v.pointer("/params/progressToken") == self.progress_token.as_ref();
                if on_token {
                    let wanted = v.pointer("/params/progress").and_then(Value::as_f64);
                    let total = v.pointer("/params/total").and_then(Value::as_f64);
                    let value = self.next_progress(wanted, total);
                    if Some(value) != wanted {
                        v["params"]["progress"] = Value::from(value);
                        ev.data = Some(v.to_string().into());
                    }
                }
            }
        }
        let _ = self.tx.send(ev).await;
    }

    /// Asks `tasks/result` until it answers; what the upstream sends before the answer goes to
    /// `relay`. A failure that may pass ([`Asked::Again`]: the upstream out of reach for a
    /// while, a restart or a network blip; a timeout; a 5xx, a proxy's; a stream closed before
    /// the answer, as SSE polling does) is asked again, as a reconnecting client would, after
    /// [`MIN_POLL`] doubling up to [`MAX_POLL`] (from [`MIN_POLL`] again after an exchange
    /// held open [`HELD_OPEN`]), until just before the task's ttl ([`give_up_at`], read at the
    /// first failure): then, or at once on a failure that asking again does not mend,
    /// [`End::GaveUp`]. taskgate shutting down: [`End::Failed`].
    async fn ask_result(
        inner: S,
        state: Arc<UpgradeState>,
        ctx: RequestContext,
        task_id: String,
        relay: mpsc::Sender<Event>,
        started: std::time::Instant,
    ) -> End {
        let mut wait = MIN_POLL;
        let mut until = None;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let asked = tokio::time::Instant::now();
            let failure = match Self::result_once(&inner, &state, &ctx, &task_id, &relay).await {
                Asked::Answer(v) => return End::Answer(v),
                Asked::Again(why) => why,
                Asked::GiveUp(why) => return End::GaveUp(why),
                Asked::Stopping(why) => return End::Failed(why),
            };
            if asked.elapsed() >= HELD_OPEN {
                wait = MIN_POLL;
            }
            let until = match until {
                Some(until) => until,
                None => *until.insert(give_up_at(&state, &ctx.upstream, &task_id, started).await),
            };
            // Given up when the next wait would reach the end: the last wait is not spent
            // without asking (review).
            let now = tokio::time::Instant::now();
            if now + wait >= until {
                return End::GaveUp(format!(
                    "{failure} (tasks/result asked {tries} times, until the task's ttl)"
                ));
            }
            tracing::debug!(task_id, tries, error = %failure, "an upgraded task's tasks/result failed: asked again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_POLL);
        }
    }

    /// One `tasks/result` (see [`Self::ask_result`]). A 5xx's body is the answer only when it
    /// names this request (a proxy's error names none, or `null`); a 2xx, a 408 or a 429
    /// without an answer may pass; another status without one does not.
    async fn result_once(
        inner: &S,
        state: &UpgradeState,
        ctx: &RequestContext,
        task_id: &str,
        relay: &mpsc::Sender<Event>,
    ) -> Asked {
        let id = state.next_id();
        let req = internal_request(
            ctx,
            &id,
            "tasks/result",
            serde_json::json!({ "taskId": task_id }),
        );
        let reply = match inner.clone().oneshot(req).await {
            Ok(r) => r,
            Err(
                e @ (GatewayError::UpstreamUnreachable { .. }
                | GatewayError::UpstreamTimeout { .. }),
            ) => return Asked::Again(e.to_string()),
            Err(e @ GatewayError::ShuttingDown) => return Asked::Stopping(e.to_string()),
            Err(e) => return Asked::GiveUp(e.to_string()),
        };
        let status = reply.status;
        let answer = answer_of(reply, &id, Others::Relay(relay)).await;
        let names_this = |v: &Value| {
            serde_json::from_str::<Value>(id.as_json()).is_ok_and(|id| v.get("id") == Some(&id))
        };
        match answer {
            Some(v) if !status.is_server_error() || names_this(&v) => Asked::Answer(v),
            _ if status.is_success() => {
                Asked::Again("the tasks/result stream ended without an answer".into())
            }
            _ => {
                let why = format!(
                    "upstream `{}` answered tasks/result with HTTP {status}",
                    ctx.upstream
                );
                let may_pass = status.is_server_error()
                    || status == http::StatusCode::TOO_MANY_REQUESTS
                    || status == http::StatusCode::REQUEST_TIMEOUT;
                if may_pass {
                    Asked::Again(why)
                } else {
                    Asked::GiveUp(why)
                }
            }
        }
    }

    /// Follows the task to its end ([`Self::follow`]), then answers the client and counts the
    /// outcome ([`Self::finish`]).
    pub(super) async fn run(self, cancel_rx: oneshot::Receiver<()>) {
        let started = std::time::Instant::now();
        // A refused write moves this counter: the record's end is read back only then
        // (`record_terminal`; review: a read of the whole record at every upgraded call's end).
        // A kept call's background follow takes its own, just before the exchange that ends
        // it (`poll_to_end`): compared over its hours, any refusal meanwhile would count (L6).
        let mut failures_before = self.write_failures();
        let _hold = self
            .state
            .registry
            .releases()
            .hold(&self.ctx.upstream, &self.task_id);
        // A tier: the call's lease, so another replica adopts it if this one is lost
        // (`adopt`); ended when this follower is done.
        let lease = match self.state.registry.leases() {
            Some(keeper) => match keeper
                .hold(
                    &self.ctx.upstream,
                    &self.task_id,
                    crate::store::LeaseKind::Followed,
                    None,
                )
                .await
            {
                Ok(guard) => Some(guard),
                Err(e) => {
                    tracing::warn!(task_id = %self.task_id, error = %e, "an upgraded call's lease could not be taken: it is not adopted if this replica is lost");
                    None
                }
            },
            None => None,
        };
        let (relay_tx, mut relay_rx) = mpsc::channel::<Event>(RELAY_CAPACITY);
        // Progress first: the client learns at once that its call runs (as a task).
        if let Some(created) = &self.created {
            self.progress(status_text(created)).await;
        }
        let end = self
            .follow(cancel_rx, &relay_tx, &mut relay_rx, started)
            .await;
        let end = self.confirm_terminal(end, &relay_tx, started).await;
        drop(relay_tx);
        self.forget();
        if matches!(
            end,
            End::Answer(_) | End::Failed(_) | End::GaveUp(_) | End::Terminal(..)
        ) {
            // What the upstream sent before its answer goes out before the answer.
            while let Ok(ev) = relay_rx.try_recv() {
                self.relay_other(ev).await;
            }
        }
        let kept = matches!(end, End::Disconnected)
            && self.state.config.on_client_disconnect == OnDisconnect::Keep;
        let mut terminal = terminal_of(&end);
        if let Some(ended) = self.finish(end).await {
            terminal = Some(ended);
        }
        if kept {
            match self.follow_kept(started).await {
                Kept::Ended(end) => {
                    terminal = end.map(|(end, before)| {
                        failures_before = before;
                        end
                    });
                }
                Kept::NotFollowed => {}
                Kept::Stopped => {
                    // Not ended: it lapses once this process is gone, and another replica
                    // adopts the call (`adopt`).
                    if let Some(lease) = lease {
                        lease.leave();
                    }
                    return;
                }
            }
        }
        let registry = &self.state.registry;
        let refused = self.write_failures() != failures_before;
        let Some(terminal) = terminal else { return };
        let gave_up = matches!(terminal, Terminal::GaveUp(_));
        // Only a shared store refuses a write for a while (a PostgreSQL outage); sled's refusal
        // (a full disk) is no reason to hold the call. A call given up on is written here, its
        // end seen by nothing below.
        if !(gave_up || refused && registry.store().shared()) {
            return;
        }
        let (state, inner, ctx, task_id) = (
            self.state.clone(),
            self.inner.clone(),
            self.ctx.clone(),
            self.task_id.clone(),
        );
        // The client's stream ends now (`self.tx` is its only sender: held through the retry,
        // it kept the principal's in-flight slot and the client waiting; review).
        drop(self);
        // The lease (`lease`) stays held until the record is terminal; a graceful stop's
        // drain waits for this, the cancel included (`UpgradeState::final_writes_ended`).
        let end = {
            let state = state.clone();
            async move {
                if gave_up {
                    // The task's one tasks/cancel, best effort, as for a client gone with
                    // `on_client_disconnect = "cancel"` (the `cancel` layer records it; a task
                    // it cancels is `cancelled`, and `record_terminal` leaves it so).
                    send_tasks_cancel(&*inner, &state, &ctx, &task_id).await;
                }
                record_terminal(&state, &ctx.upstream, &task_id, terminal, started).await
            }
        };
        state.final_writes.track_future(end).await;
    }

    /// `taskgate_store_write_failures_total` now.
    fn write_failures(&self) -> u64 {
        self.state
            .registry
            .metrics()
            .store_write_failures_total
            .get()
    }

    /// `on_client_disconnect = "keep"`, the client gone (tester 3 F13): follows the task in the
    /// background, with no client stream, so its record ends when the task does and stops
    /// holding one of its owner's live-task slots (a client that speaks no tasks never polls
    /// it). Takes one of [`super::MAX_KEPT_FOLLOWERS`] permits (none left: not followed,
    /// logged), counted in `taskgate_upgrade_kept_followers` while held; ends at a graceful
    /// stop (`UpgradeState::stop_kept`).
    async fn follow_kept(&self, started: std::time::Instant) -> Kept {
        let Ok(_permit) = self.state.kept.try_acquire() else {
            tracing::warn!(task_id = %self.task_id, max = super::MAX_KEPT_FOLLOWERS, "the client of an upgraded call went away and too many kept calls are followed already: this one is not followed (its record stays as it is until something polls it or its ttl ends)");
            return Kept::NotFollowed;
        };
        let _followed = self
            .state
            .registry
            .metrics()
            .kept_follower_started(&self.ctx.upstream);
        tracing::info!(task_id = %self.task_id, "the client of an upgraded call went away: the task is kept, followed in the background until it ends");
        tokio::select! {
            () = self.state.stop_kept.cancelled() => Kept::Stopped,
            end = self.poll_to_end(started) => Kept::Ended(end),
        }
    }

    /// Polls `tasks/get` at the task's poll interval until it reports a terminal status, then
    /// asks `tasks/result` once (bounded by the upstream's `timeout_ms`), whose answer `observe`
    /// keeps in the record, as for an adopted call (`adopt`). Returns what the record must hold
    /// ([`record_terminal`]) and `taskgate_store_write_failures_total` just before that last
    /// round (its own writes refused: the count moved since); `None` once the record is gone,
    /// terminal or expired (seen when a poll gets no status), or the task's ttl has passed: the
    /// record's `expires_at` (read once here), within `upgrade.ttl_ms` from `started`. Past the
    /// ttl nothing is polled nor written: the record is left to the registry (expired, swept),
    /// as for a task nobody follows (L7).
    async fn poll_to_end(&self, started: std::time::Instant) -> Option<(Terminal, u64)> {
        let until = ttl_end(&self.state, &self.ctx.upstream, &self.task_id, started).await;
        let registry = &self.state.registry;
        let mut ticker = tokio::time::interval(self.poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {
                    tracing::warn!(task_id = %self.task_id, "a kept upgraded call's ttl ended before its task did: no longer followed");
                    return None;
                }
                _ = ticker.tick() => {}
            }
            let failures_before = self.write_failures();
            let polled = poll_status(
                (*self.inner).clone(),
                self.state.clone(),
                self.ctx.clone(),
                self.task_id.clone(),
            )
            .await;
            match polled.and_then(|(status, _)| TaskStatus::parse(&status)) {
                Some(status) if status.is_terminal() => {
                    let answer = tokio::time::timeout(self.state.result_deadline(), self.result())
                        .await
                        .ok()
                        .flatten();
                    let paid = answer.and_then(|v| terminal_of(&End::Answer(v)));
                    return Some((paid.unwrap_or(Terminal::Status(status)), failures_before));
                }
                Some(_) => {}
                // An error, or no valid status: the record says whether there is anything
                // left to follow (`observe` fails it as lost on a "not found").
                None => {
                    match registry
                        .try_record_of(&self.ctx.upstream, &self.task_id)
                        .await
                    {
                        Ok(None) => return None,
                        Ok(Some(r)) if r.status.is_terminal() || now_ms() >= r.expires_at => {
                            return None
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// One `tasks/result` for an ended task, what the upstream sends before its answer
    /// discarded (no client to take it). `None`: no answer.
    async fn result(&self) -> Option<Value> {
        let id = self.state.next_id();
        let req = internal_request(
            &self.ctx,
            &id,
            "tasks/result",
            serde_json::json!({ "taskId": self.task_id }),
        );
        let reply = (*self.inner).clone().oneshot(req).await.ok()?;
        answer_of(reply, &id, Others::Discard).await
    }

    /// The `select!` loop: waits for the `tasks/result` answer while polling `tasks/get` and
    /// relaying what the upstream sends (to `relay_tx`, read from `relay_rx`), until the answer,
    /// a terminal poll, the client's cancel or disconnect, or a request the client cannot take.
    async fn follow(
        &self,
        mut cancel_rx: oneshot::Receiver<()>,
        relay_tx: &mpsc::Sender<Event>,
        relay_rx: &mut mpsc::Receiver<Event>,
        started: std::time::Instant,
    ) -> End {
        // Given up when the loop ends.
        let mut result_fut = Box::pin(Self::ask_result(
            (*self.inner).clone(),
            self.state.clone(),
            self.ctx.clone(),
            self.task_id.clone(),
            relay_tx.clone(),
            started,
        ));
        let mut ticker = tokio::time::interval(self.poll);
        // A tick missed while a slow `tasks/get` was out is not made up for: the next poll goes
        // when that one is answered, the ones after it a poll interval apart (the default,
        // `Burst`, sent the missed ones back to back, so a server slow to answer one poll got
        // the next ones at once).
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut last_status: Option<(String, String)> = self.created.clone();
        // One tasks/get at a time, polled alongside (a slow one never delays the answer).
        let mut polling: Option<PollFut> = None;
        // Set once a poll reported a terminal status: tasks/result gets one more poll interval.
        let mut terminal: Option<Pin<Box<tokio::time::Sleep>>> = None;
        // The cancel signal can only end in Ok (a client's cancel) or Err (the entry is gone);
        // only Ok is a cancel, and a finished receiver is not polled again.
        let mut cancel_open = true;
        loop {
            tokio::select! {
                end = &mut result_fut => break end,
                signal = &mut cancel_rx, if cancel_open => {
                    cancel_open = false;
                    if signal.is_ok() {
                        break End::ClientCancelled;
                    }
                }
                _ = self.tx.closed() => break End::Disconnected,
                _ = async { terminal.as_mut().expect("guarded").await }, if terminal.is_some() => {
                    let (status, message) = last_status.clone().unwrap_or_default();
                    break End::Terminal(status, message);
                }
                _ = ticker.tick(), if polling.is_none() && terminal.is_none() => {
                    polling = Some(Box::pin(poll_status(
                        (*self.inner).clone(),
                        self.state.clone(),
                        self.ctx.clone(),
                        self.task_id.clone(),
                    )));
                }
                st = async { polling.as_mut().expect("guarded").await }, if polling.is_some() => {
                    polling = None;
                    if self.on_status(st, &mut last_status).await {
                        terminal = Some(Box::pin(tokio::time::sleep(self.poll)));
                    }
                }
                Some(ev) = relay_rx.recv() => {
                    if let Some(end) = needs_capability(self.client, &ev) {
                        break end;
                    }
                    self.relay_other(ev).await;
                }
            }
        }
    }

    /// A `tasks/get` poll's `(status, statusMessage)`: a change goes to the client as progress.
    /// Returns whether the task has newly reached a terminal status.
    async fn on_status(
        &self,
        st: Option<(String, String)>,
        last_status: &mut Option<(String, String)>,
    ) -> bool {
        let Some(st) = st else { return false };
        if last_status.as_ref() == Some(&st) {
            return false;
        }
        let message = status_text(&st);
        let ended = TaskStatus::parse(&st.0).is_some_and(|s| s.is_terminal());
        *last_status = Some(st);
        self.progress(message).await;
        ended
    }

    /// After a terminal poll, asks `tasks/result` once more (again after a failure that may
    /// pass), bounded by the upstream's `timeout_ms`: the task has ended, so its result is there
    /// or never. Other ends are returned as they are.
    async fn confirm_terminal(
        &self,
        end: End,
        relay_tx: &mpsc::Sender<Event>,
        started: std::time::Instant,
    ) -> End {
        let End::Terminal(status, message) = end else {
            return end;
        };
        tracing::info!(task_id = %self.task_id, status, "tasks/get says the upgraded task ended; tasks/result asked again");
        let again = Self::ask_result(
            (*self.inner).clone(),
            self.state.clone(),
            self.ctx.clone(),
            self.task_id.clone(),
            relay_tx.clone(),
            started,
        );
        let deadline = self.state.result_deadline();
        match tokio::time::timeout(deadline, again).await {
            Ok(End::Answer(v)) => End::Answer(v),
            _ => End::Terminal(status, message),
        }
    }

    /// Forgets the call, and its progress token unless another call's state is there.
    fn forget(&self) {
        self.state.forget(&self.key, self.call_token);
        if let Some(k) = &self.token_key {
            let mut tokens = self.state.tokens.lock();
            if tokens
                .get(k)
                .is_some_and(|p| Arc::ptr_eq(p, &self.progress))
            {
                tokens.remove(k);
            }
        }
    }

    /// Answers the client (or cancels upstream) according to how following ended, and counts the
    /// outcome.
    /// Tells the client how its call ended (and counts it); `Some` when that end leaves the
    /// record for `run` to end: the client gone under `on_client_disconnect = "cancel"` and its
    /// task's `tasks/cancel` failed (the upstream out of reach), which is then given up as
    /// [`Terminal::GaveUp`] (the cancel tried once more, the record `failed`, its slot freed).
    async fn finish(&self, end: End) -> Option<Terminal> {
        let upstream = &self.ctx.upstream;
        match end {
            End::Answer(Value::Object(mut v)) => {
                let failed = v.get("error").is_some()
                    || v.get("result")
                        .and_then(|r| r.get("isError"))
                        .and_then(Value::as_bool)
                        == Some(true);
                self.state.count(
                    upstream,
                    if failed {
                        UpgradeOutcome::Failed
                    } else {
                        UpgradeOutcome::Completed
                    },
                );
                // The client asked for no task: its result names none (tester 5 #8b).
                if let Some(Value::Object(result)) = v.get_mut("result") {
                    remove_related_task(result);
                }
                let id = serde_json::from_str(self.original_id.as_json()).unwrap_or(Value::Null);
                v.insert("id".into(), id);
                self.send(Value::Object(v).to_string()).await;
            }
            End::Answer(_) => {
                self.state.count(upstream, UpgradeOutcome::UpstreamError);
                self.send_error(McpError::UpgradeResultNotObject).await;
            }
            End::Terminal(status, message) => {
                self.state.count(upstream, UpgradeOutcome::UpstreamError);
                let error = McpError::UpgradeNoResult {
                    status,
                    status_message: (!message.is_empty()).then_some(message),
                };
                self.send_error(error).await;
            }
            End::NeedsCapability(method, pointer) => {
                self.state
                    .count(upstream, UpgradeOutcome::RefusedCapability);
                let _ = self.cancel_upstream().await;
                let error = McpError::UpgradeNeedsCapability {
                    method,
                    capability: pointer.trim_start_matches('/').to_string(),
                };
                self.send_error(error).await;
            }
            End::ClientCancelled => {
                self.state.count(upstream, UpgradeOutcome::Cancelled);
                let _ = self.cancel_upstream().await;
            }
            End::Disconnected => {
                self.state.count(upstream, UpgradeOutcome::Disconnected);
                if self.state.config.on_client_disconnect == OnDisconnect::Cancel {
                    tokio::time::sleep(Duration::from_millis(
                        self.state.config.disconnect_grace_ms,
                    ))
                    .await;
                    if let CancelSent::Refused(why) = self.cancel_upstream().await {
                        // Left `working`, the record held its owner's slot until its ttl
                        // (tester 5's review of #3).
                        return Some(Terminal::GaveUp(format!(
                            "its client went away and the task's tasks/cancel failed: {why}"
                        )));
                    }
                }
            }
            End::Failed(why) => {
                self.state.count(upstream, UpgradeOutcome::UpstreamError);
                self.send_error(McpError::UpgradeFollowFailed { detail: why })
                    .await;
            }
            End::GaveUp(why) => {
                // The cancel and the record's end follow once the client's stream has ended
                // (`run`).
                self.state.count(upstream, UpgradeOutcome::UpstreamError);
                let detail = format!("{why}; taskgate gave up on the task and cancels it");
                self.send_error(McpError::UpgradeFollowFailed { detail })
                    .await;
            }
        }
        None
    }

    /// Answers the client's original request with `error` (`-32603`), as the stream's last event.
    async fn send_error(&self, error: McpError) {
        let err = error.body(Some(&self.original_id));
        self.send(String::from_utf8_lossy(&err).into_owned()).await;
    }

    async fn cancel_upstream(&self) -> CancelSent {
        send_tasks_cancel(&*self.inner, &self.state, &self.ctx, &self.task_id).await
    }
}

/// How following a kept call (`on_client_disconnect = "keep"`, client gone) ended.
enum Kept {
    /// Followed to its end: what the record must hold (`None`: nothing more to write), and
    /// `taskgate_store_write_failures_total` before the exchange that ended it.
    Ended(Option<(Terminal, u64)>),
    /// Not followed: [`super::MAX_KEPT_FOLLOWERS`] are already.
    NotFollowed,
    /// A graceful stop.
    Stopped,
}

/// What the record of a followed task must hold once following ended (see
/// [`record_terminal`]).
enum Terminal {
    /// The `tasks/result` answer's result came (`failed`: `isError`), as `observe` applies it.
    Payload { failed: bool },
    /// A `tasks/get` poll said the task ended so.
    Status(TaskStatus),
    /// Following gave up (why, [`End::GaveUp`]): after the task's `tasks/cancel` (best
    /// effort), a record that is not terminal becomes `failed` with a `statusMessage` saying
    /// why, which frees its owner's live-task slot (the plain client never learned the task id
    /// and cannot cancel it).
    GaveUp(String),
}

/// The end the record must hold after `end`: `None` for an end that says nothing of the
/// task's (a JSON-RPC error, a cancel, a disconnect: the record stays as the upstream makes it).
fn terminal_of(end: &End) -> Option<Terminal> {
    match end {
        End::Answer(v) => {
            let result = v.get("result")?;
            let failed = result.get("isError").and_then(Value::as_bool) == Some(true);
            Some(Terminal::Payload { failed })
        }
        End::Terminal(status, _) => TaskStatus::parse(status)
            .filter(|s| s.is_terminal())
            .map(Terminal::Status),
        End::GaveUp(why) => Some(Terminal::GaveUp(why.clone())),
        _ => None,
    }
}

/// The end of following when `ev` is an `elicitation/create` or `sampling/createMessage` request
/// and the client (`client`) did not declare the capability it needs.
fn needs_capability(client: ClientCapabilities, ev: &Event) -> Option<End> {
    let data = ev.data.as_ref()?;
    let method = serde_json::from_str::<Value>(data)
        .ok()
        .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_string));
    let (method, pointer) = match method.as_deref() {
        Some("elicitation/create") => ("elicitation/create", "/elicitation"),
        Some("sampling/createMessage") => ("sampling/createMessage", "/sampling"),
        _ => return None,
    };
    (!client.has(pointer)).then_some(End::NeedsCapability(method, pointer))
}

/// One `tasks/get` for the follower: the task's `(status, statusMessage)`.
pub(super) async fn poll_status<S: McpService>(
    inner: S,
    state: Arc<UpgradeState>,
    ctx: RequestContext,
    task_id: String,
) -> Option<(String, String)> {
    let id = state.next_id();
    let req = internal_request(
        &ctx,
        &id,
        "tasks/get",
        serde_json::json!({ "taskId": task_id }),
    );
    let reply = inner.oneshot(req).await.ok()?;
    let v = answer_of(reply, &id, Others::Discard).await?;
    let r = v.get("result")?;
    Some((
        r.get("status")?.as_str()?.to_string(),
        r.get("statusMessage")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    ))
}

/// When following `task_id` ends at the latest: its ttl, `upgrade.ttl_ms` from `started` (the
/// call's start), or the record's `expires_at` when sooner (one read of the record).
async fn ttl_end(
    state: &UpgradeState,
    upstream: &str,
    task_id: &str,
    started: std::time::Instant,
) -> tokio::time::Instant {
    let until =
        tokio::time::Instant::from_std(started) + Duration::from_millis(state.config.ttl_ms);
    match state.registry.try_record_of(upstream, task_id).await {
        Ok(Some(r)) => {
            let left = Duration::from_millis(r.expires_at.saturating_sub(now_ms()));
            until.min(tokio::time::Instant::now() + left)
        }
        _ => until,
    }
}

/// How long before the task's ttl asking `tasks/result` again gives up (at most a tenth of the
/// time from the call's start to its ttl): the task's `tasks/cancel` and its record's `failed`
/// must find the record live (taskgate itself answers `-32602` about an expired one).
const GIVE_UP_BEFORE_TTL: Duration = Duration::from_secs(1);

/// When [`Follower::ask_result`] gives up: [`GIVE_UP_BEFORE_TTL`] before the task's ttl
/// ([`ttl_end`]), at most a tenth of the time from `started` (the call's start) to it.
async fn give_up_at(
    state: &UpgradeState,
    upstream: &str,
    task_id: &str,
    started: std::time::Instant,
) -> tokio::time::Instant {
    let ttl = ttl_end(state, upstream, task_id, started).await;
    let span = ttl.saturating_duration_since(tokio::time::Instant::from_std(started));
    ttl - GIVE_UP_BEFORE_TTL.min(span / 10)
}

/// Makes sure the record holds the end the client was answered with ([`Follower::run`], once
/// the client's stream has ended): `observe` wrote it
/// as the upstream's answer passed, but a task store out of reach then (a PostgreSQL
/// outage) refused the write, and nothing else would write it (the record stayed `working`
/// until `upgrade.ttl_ms`, holding one of the owner's live-task slots). Reads the record;
/// while it is not terminal writes `terminal` again, after
/// [`crate::registry::FINAL_WRITE_FIRST_WAIT`], the wait doubling up to
/// [`crate::registry::FINAL_WRITE_MAX_WAIT`], until the store takes it, the task's ttl
/// (`upgrade.ttl_ms` from `started`, or the record's) ends, or taskgate stops. The call's
/// lease stays held meanwhile (the caller's), so no other replica adopts the call.
/// Each refused write is counted in `taskgate_store_write_failures_total` (the registry).
/// A call given up on ([`Terminal::GaveUp`]) is first written here (nothing below saw its
/// end), even when its ttl has just passed (often what ended it): `failed`, unless its
/// `tasks/cancel` ended it.
async fn record_terminal(
    state: &UpgradeState,
    upstream: &str,
    task_id: &str,
    terminal: Terminal,
    started: std::time::Instant,
) {
    let registry = &state.registry;
    let until = started + Duration::from_millis(state.config.ttl_ms);
    let mut backoff = FinalWriteBackoff::default();
    let mut tries = 0u32;
    let gave_up = matches!(terminal, Terminal::GaveUp(_));
    loop {
        let first_of_given_up = gave_up && tries == 0;
        match registry.try_record_of(upstream, task_id).await {
            Ok(None) => return,
            Ok(Some(r))
                if r.status.is_terminal() || (now_ms() >= r.expires_at && !first_of_given_up) =>
            {
                if tries > 0 && !(gave_up && tries == 1) {
                    tracing::info!(upstream, task_id, tries, status = r.status.as_str(), "an upgraded call's final status was written after the task store came back");
                }
                return;
            }
            Ok(Some(_)) => {
                if tries == 0 && !gave_up {
                    tracing::warn!(upstream, task_id, "an upgraded call ended but its record is not terminal (the task store refused the write): written again until the store takes it; its lease is kept meanwhile");
                }
                tries += 1;
                match &terminal {
                    Terminal::Payload { failed } => {
                        registry
                            .apply_result_payload(upstream, task_id, *failed)
                            .await
                    }
                    Terminal::Status(status) => {
                        let report = serde_json::json!({ "status": status.as_str() });
                        registry
                            .observe_task_as(upstream, task_id, report, "upgraded call")
                            .await;
                    }
                    Terminal::GaveUp(why) => {
                        let report = serde_json::json!({
                            "status": TaskStatus::Failed.as_str(),
                            "statusMessage": format!("taskgate gave up following this upgraded call: {why}"),
                        });
                        registry
                            .observe_task_as(upstream, task_id, report, "upgraded call")
                            .await;
                    }
                }
                // Read again at once: the write just made is seen, or the store failed.
                if let Ok(Some(r)) = registry.try_record_of(upstream, task_id).await {
                    if r.status.is_terminal() && gave_up && tries == 1 {
                        tracing::info!(
                            upstream,
                            task_id,
                            status = r.status.as_str(),
                            "taskgate gave up following an upgraded call: its record is ended"
                        );
                        return;
                    }
                    if r.status.is_terminal() {
                        tracing::info!(upstream, task_id, tries, status = r.status.as_str(), "an upgraded call's final status was written after the task store came back");
                        return;
                    }
                }
            }
            Err(_) => {
                if tries == 0 {
                    tracing::warn!(upstream, task_id, "an upgraded call ended but its record could not be read (the task store failed): its final status is written once the store answers; its lease is kept meanwhile");
                    tries = 1;
                }
            }
        }
        let now = std::time::Instant::now();
        if now >= until {
            tracing::warn!(
                upstream,
                task_id,
                tries,
                "an upgraded call's ttl ended before the task store took its final status"
            );
            return;
        }
        backoff.sleep(until - now).await;
    }
}

//! The `tasks` layer: task policy (2025-11-25 basic/utilities/tasks). It decides; what the
//! upstream then reports is applied below, by `observe`.
//!
//! What it does to which messages:
//! - `tools/call` with `params.task` (task-augmented): refused locally with `-32029` ([`McpError::TaskLimitExceeded`])
//!   when the owner already has `tasks.max_live_tasks_per_owner` live tasks on this upstream;
//!   `params.task.ttl` above `tasks.max_ttl_ms` is lowered to it, one below [`MIN_TASK_TTL_MS`]
//!   (0 included) raised to it, a negative one refused `-32602`. Otherwise the request goes on
//!   with a [`PendingCreation`] (the record template and the owner's reserved slot) from which
//!   `observe` records the `CreateTaskResult` durably before the reply is passed on (the ttl the
//!   upstream reports is capped the same way in the record, `null` meaning the cap, and the
//!   client is shown the capped ttl in the `CreateTaskResult`, `tasks/get` and `tasks/list`).
//! - `tasks/get`, `tasks/result`, `tasks/cancel`: a `taskId` that is unknown, expired or owned by
//!   someone else is answered `-32602` "Task not found" here and never forwarded. A known one goes
//!   upstream on the task's recorded `Mcp-Session-Id` (SDK task stores are per session), so a
//!   client that opened a new session (same principal) still reaches it, with an
//!   [`AuthorisedTask`] (the record read here) for the layers below. A `tasks/result` of a live
//!   task waits for its answer at most until the record expires, then is answered the same
//!   `-32602` (`expiry`).
//! - `tasks/list`: answered here from the registry: the caller's tasks on this upstream, newest
//!   first, `tasks.list_page_size` per page, opaque `nextCursor` (an invalid cursor, or `params`
//!   neither an object nor absent, is `-32602`).
//!   Each task's status is the last one taskgate saw (see `observe`); call `tasks/get` for the
//!   upstream's current status.
//! - `initialize`: when callers cannot be told apart (`[auth] mode = "none"` and the upstream gives
//!   no `Mcp-Session-Id`), `capabilities.tasks.list` is removed from the result and `tasks/list`
//!   is refused with `-32601`.
//!
//! Owners ([`crate::store::Owner`], from [`crate::exchange::Caller::owner`]): the principal with
//! bearer auth; with `mode = "none"` the client's own `Mcp-Session-Id`, which is weaker (whoever
//! holds the session id is the owner), or `anonymous` without a session (no binding at all; task
//! ids are the upstream's).

mod expiry;
mod lost;
mod modern;

use crate::exchange::{Deadline, McpReply, McpRequest, Operation};
use crate::jsonrpc::splice;
use crate::jsonrpc::{self, Id, Message};
use crate::layers::extensions::{
    AuthorisedTask, OnBehalfOf, PendingCreation, Upgraded, UpstreamWithoutTasks,
};
use crate::layers::lost_task::Confirmations;
use crate::mcp::classify::Classified;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::{now_ms, TaskStatus};
use crate::metrics::{CancelOutcome, LocalReason, TaskMethod};
use crate::registry::Registry;
use crate::store::{ListCursor, Origin, Owner, TaskRecord};
use base64::Engine;
use futures_util::future::Either;
use http::HeaderValue;
use serde_json::Value;
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The shortest `params.task.ttl` taskgate sends upstream, in milliseconds: a smaller one (0
/// included) is raised to it, as a larger one than `tasks.max_ttl_ms` is lowered (issue 29 #12:
/// a ttl of 0 made a task that was gone 100 ms after its creation, before any poll).
pub const MIN_TASK_TTL_MS: u64 = 1_000;

/// Builds [`TasksService`]s over a shared [`Registry`].
#[derive(Clone)]
pub struct TasksLayer {
    registry: Arc<Registry>,
    /// `[auth] mode` `bearer` or `oauth`: callers are told apart by principal even without sessions.
    authenticated: bool,
    /// The running confirmations of a `-32602` about a live task (`lost`), shared by the
    /// services of one upstream's stack.
    confirming: Arc<Confirmations>,
}

impl TasksLayer {
    /// `authenticated`: whether `[auth]` identifies callers (`bearer` or `oauth`).
    pub fn new(registry: Arc<Registry>, authenticated: bool) -> TasksLayer {
        TasksLayer {
            registry,
            authenticated,
            confirming: Arc::default(),
        }
    }
}

impl<S> tower::Layer<S> for TasksLayer {
    type Service = TasksService<S>;

    fn layer(&self, inner: S) -> TasksService<S> {
        TasksService {
            inner,
            registry: self.registry.clone(),
            authenticated: self.authenticated,
            confirming: self.confirming.clone(),
        }
    }
}

/// The `tasks` layer's service (see the module docs).
#[derive(Clone)]
pub struct TasksService<S> {
    inner: S,
    registry: Arc<Registry>,
    authenticated: bool,
    confirming: Arc<Confirmations>,
}

type BoxFut<E> = Pin<Box<dyn Future<Output = Result<McpReply, E>> + Send>>;

impl<S: Clone> TasksService<S> {
    /// The inner service for a future that outlives `call`: the ready one goes with the
    /// request, this service keeps a clone.
    fn take_inner(&mut self) -> S {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

impl<S> tower::Service<McpRequest> for TasksService<S>
where
    S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = McpReply;
    type Error = S::Error;
    /// The inner service's own future for what passes unchanged (a plain `tools/call`, other
    /// requests, notifications, answers, a 2026-07-28 request to forward); a boxed one where
    /// this layer waits on the registry or answers.
    type Future = Either<S::Future, BoxFut<S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        if req.era() == Era::Modern {
            return match modern::decide(&self.registry, &mut req) {
                modern::Decision::Forward => Either::Left(self.inner.call(req)),
                modern::Decision::Answer(reply) => {
                    Either::Right(Box::pin(async move { Ok(reply) }))
                }
                modern::Decision::Listen => {
                    let (registry, mut inner) = (self.registry.clone(), self.take_inner());
                    Either::Right(Box::pin(async move {
                        let owner = req.ctx.caller().modern_owner();
                        match modern::filter_listen(&registry, &mut req, &owner, Era::Modern).await
                        {
                            Ok(()) => inner.call(req).await,
                            Err(answered) => Ok(answered),
                        }
                    }))
                }
                modern::Decision::Authorise => {
                    let (registry, mut inner) = (self.registry.clone(), self.take_inner());
                    let confirming = self.confirming.clone();
                    Either::Right(Box::pin(async move {
                        match modern::authorise(&registry, &mut req).await {
                            Ok(()) => {
                                let probe = lost::Probe::of(&req);
                                let reply = inner.call(req).await?;
                                Ok(match probe {
                                    Some(probe) if lost::Probe::may_change(&reply) => {
                                        probe.check(&registry, reply, inner, &confirming).await
                                    }
                                    _ => reply,
                                })
                            }
                            Err(answered) => Ok(answered),
                        }
                    }))
                }
            };
        }
        if req.extensions.get::<UpstreamWithoutTasks>().is_some() {
            // No tasks upstream: nothing to authorise, list or answer here.
            if req.request_method() == Some("tasks/result") {
                req.extensions.insert(Deadline::Unbounded);
            }
            return Either::Left(self.inner.call(req));
        }
        if names_a_task(&req) {
            let (registry, mut inner) = (self.registry.clone(), self.take_inner());
            let confirming = self.confirming.clone();
            return Either::Right(Box::pin(async move {
                match authorise(&registry, &mut req).await {
                    Ok(()) => {
                        let own = routed_from(&req);
                        let probe = lost::Probe::of(&req);
                        // A `tasks/result` waits at most until its task's record expires.
                        let expiry = expiry::Expiry::of(&req);
                        let call = inner.call(req);
                        let mut reply = match &expiry {
                            None => call.await?,
                            Some(e) => match e.bound(call).await? {
                                expiry::Bounded::Reply(reply) => reply,
                                expiry::Bounded::Expired(answer) => {
                                    return Ok(with_own_session(answer, own))
                                }
                            },
                        };
                        if let Some(probe) = probe.filter(|_| lost::Probe::may_change(&reply)) {
                            reply = probe.check(&registry, reply, inner, &confirming).await;
                        }
                        if let Some(expiry) = expiry {
                            reply = expiry.stream(reply);
                        }
                        Ok(with_own_session(reply, own))
                    }
                    Err(refused) => Ok(refused),
                }
            }));
        }
        if req.request_method() == Some("subscriptions/listen") {
            // A 2025 client may send the 2026 method (a held session, a dual-era upstream): its
            // `taskIds` are filtered to the caller's own tasks as in 2026 (issue 29 #2).
            let (registry, mut inner) = (self.registry.clone(), self.take_inner());
            return Either::Right(Box::pin(async move {
                let owner = req.ctx.caller().owner();
                match modern::filter_listen(&registry, &mut req, &owner, Era::Legacy).await {
                    Ok(()) => inner.call(req).await,
                    Err(answered) => Ok(answered),
                }
            }));
        }
        match req.request_method() {
            // A plain call (no `task` key, no escape that could spell one) passes unchanged.
            Some("tools/call") if is_task_call(&req) => {
                let (registry, mut inner) = (self.registry.clone(), self.take_inner());
                Either::Right(Box::pin(async move {
                    match prepare_creation(&registry, &mut req).await {
                        Ok(()) => inner.call(req).await,
                        Err(refused) => Ok(refused),
                    }
                }))
            }
            Some("tasks/list") => {
                let (registry, authenticated) = (self.registry.clone(), self.authenticated);
                Either::Right(Box::pin(async move {
                    let reply = list(&registry, authenticated, &req).await;
                    Ok(reply.answered_locally(LocalReason::TasksList))
                }))
            }
            Some("initialize") if !self.authenticated => {
                let mut inner = self.take_inner();
                Either::Right(Box::pin(async move {
                    let mut reply = inner.call(req).await?;
                    // A session tells callers apart: nothing to hide.
                    if !reply.headers.contains_key("mcp-session-id") {
                        reply.body = reply.body.map_messages(hide_tasks_list);
                    }
                    Ok(reply)
                }))
            }
            _ => Either::Left(self.inner.call(req)),
        }
    }
}

/// Whether a `tools/call` names `params.task` (as the edge classified it: `mcp::classify`): an
/// object is a task-augmented request; anything else is refused in [`prepare_creation`], since
/// taskgate cannot tell a task from a plain call by it. `false` means a plain call, forwarded
/// as it is.
fn is_task_call(req: &McpRequest) -> bool {
    req.classified().is_some_and(|c| c.param("task").is_some())
}

/// For a task-augmented `tools/call`: owner limit (across the tier on a shared store), ttl cap,
/// and the [`PendingCreation`] `observe` records from the answer.
async fn prepare_creation(registry: &Arc<Registry>, req: &mut McpRequest) -> Result<(), McpReply> {
    let Operation::Post(msg) = &req.op else {
        return Ok(());
    };
    let Some(id) = msg.id().cloned() else {
        return Ok(());
    };
    let Some(task_text) = Classified::of(msg).param("task") else {
        return Ok(());
    };
    // taskgate must know whether this is a task before it goes upstream; a message whose
    // params it cannot read (numbers beyond f64: a skip of the text would not notice them)
    // is not forwarded. (Nesting deeper than 128 levels never passed the edge.)
    let unreadable = |e: serde_json::Error| {
        refuse(
            &id,
            McpError::ParamsUnreadable {
                method: Some("tools/call".into()),
                detail: e.to_string(),
            },
        )
    };
    if let Some(Err(e)) = msg.params().map(readable) {
        return Err(unreadable(e));
    }
    let task_meta = serde_json::from_str::<Value>(task_text).map_err(unreadable)?;
    let cap = registry.config().max_ttl_ms;
    let ttl = bounded_ttl(&task_meta, cap).map_err(|e| refuse(&id, e))?;
    let owner = req.ctx.caller().owner();
    let upstream = req.ctx.upstream.clone();
    let reserved = match registry.reserve_creation(&upstream, &owner).await {
        Ok(r) => r,
        Err(e) => {
            // The store's error is logged and counted by the registry, not sent to the client.
            let error = store_refusal(Some("tools/call"), &e);
            return Err(refuse(&id, error).answered_locally(LocalReason::StoreUnavailable));
        }
    };
    let Some(reservation) = reserved else {
        let error = registry.refuse_over_limit(&upstream);
        return Err(refuse(&id, error).answered_locally(LocalReason::OwnerLimit));
    };
    if let Some(edit) = ttl {
        // Only the ttl changes: every other byte goes upstream as the client sent it.
        let path = ["params", "task", "ttl"];
        let edited = match edit {
            TtlEdit::Write(ttl) => splice::replace(msg.bytes(), &path, &ttl.to_string()),
            TtlEdit::Remove => splice::remove(msg.bytes(), &path),
        };
        let bounded = edited.ok().flatten().and_then(|b| Message::parse(b).ok());
        match bounded {
            Some(m) => req.op = Operation::Post(m),
            None => {
                return Err(refuse(
                    &id,
                    McpError::InvalidParam {
                        method: Some("tools/call".into()),
                        key: "task.ttl".into(),
                        problem: "is outside taskgate's bounds and the message cannot be rewritten"
                            .into(),
                    },
                ))
            }
        }
    }
    // Read from the message as it goes upstream (the ttl splice above left them as they were).
    let (tool, progress_token) = match req.classified() {
        Some(c) => (
            c.tool().map(Cow::into_owned),
            // In `serde_json::Value`'s spelling, as `observe` compares progress tokens.
            c.progress_token()
                .and_then(|t| serde_json::from_str::<Value>(t).ok())
                .map(|t| t.to_string()),
        ),
        None => (None, None),
    };
    let template = template(req, owner, tool);
    req.extensions.insert(PendingCreation {
        template: Arc::new(template),
        reservation: Arc::new(reservation),
        progress_token,
        created: Arc::default(),
    });
    Ok(())
}

/// Whether `params` reads as a `serde_json::Value` (the same error when it does not), without
/// building one: serde_json's reader checks the text, numbers beyond `f64` included, and this
/// visitor keeps nothing. A text `Value` reads differently (a map whose key is serde_json's
/// `RawValue` token) or does not read is read into a `Value` after all, which decides.
///
/// Why: the `Value` of a task-augmented call's params, built and dropped, cost about 5,700
/// instructions per creation in the lifecycle benchmark (callgrind, issue 36). Why not serde's
/// `IgnoredAny`: serde_json skips such a value without checking it, and takes what a `Value`
/// refuses (`1e400`, a lone `\ud800`, the `RawValue` token's map with a broken text).
fn readable(params: &str) -> Result<(), serde_json::Error> {
    match serde_json::from_str::<Readable>(params) {
        Ok(Readable(true)) => Ok(()),
        _ => serde_json::from_str::<Value>(params).map(drop),
    }
}

/// A JSON value read and dropped as it is read ([`readable`]); `false` inside when a map key is
/// serde_json's `RawValue` token (a `Value` reads such a map otherwise).
struct Readable(bool);

impl<'de> serde::Deserialize<'de> for Readable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Readable, D::Error> {
        d.deserialize_any(ReadableVisitor)
    }
}

/// A map key of a [`Readable`]: `false` for serde_json's `RawValue` token.
struct ReadableKey(bool);

impl<'de> serde::Deserialize<'de> for ReadableKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ReadableKey, D::Error> {
        struct KeyVisitor;
        impl serde::de::Visitor<'_> for KeyVisitor {
            type Value = ReadableKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<ReadableKey, E> {
                Ok(ReadableKey(key != "$serde_json::private::RawValue"))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

struct ReadableVisitor;

impl<'de> serde::de::Visitor<'de> for ReadableVisitor {
    type Value = Readable;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Readable, E> {
        Ok(Readable(true))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Readable, E> {
        Ok(Readable(true))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Readable, E> {
        Ok(Readable(true))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Readable, E> {
        Ok(Readable(true))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Readable, E> {
        Ok(Readable(true))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Readable, E> {
        Ok(Readable(true))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Readable, A::Error> {
        let mut plain = true;
        while let Some(Readable(ok)) = seq.next_element()? {
            plain &= ok;
        }
        Ok(Readable(plain))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Readable, A::Error> {
        let mut plain = true;
        while let Some(ReadableKey(ok)) = map.next_key()? {
            let Readable(value) = map.next_value()?;
            plain &= ok && value;
        }
        Ok(Readable(plain))
    }
}

/// What taskgate does to a creation's `params.task.ttl` before it goes upstream.
#[derive(Debug, PartialEq, Eq)]
enum TtlEdit {
    /// Writes this bound (ms) instead of the client's.
    Write(u64),
    /// Removes the member: a `null` ttl is no ttl (see [`bounded_ttl`]).
    Remove,
}

/// The ttl a task creation goes upstream with, from its `params.task` (2025-11-25
/// basic/utilities/tasks: `TaskMetadata`, an object whose optional `ttl` is in milliseconds):
/// `None` to leave the client's as it is, or the edit to make ([`TtlEdit`]). A `ttl` of `null`
/// is taken as no ttl and removed, so the upstream applies its default (and taskgate its cap):
/// the schema's `ttl` is an optional number, so `null` is not one a server must accept (the
/// TypeScript SDK answered it `-32603` with its validator's dump), yet a client that writes its
/// unset optional members as `null` means "none", not a bad value (tester 5 #9: it was passed
/// on as it came while `-1` and `"5000"` were refused; refusing it too would break such clients
/// for nothing). Any number above `cap`
/// (`tasks.max_ttl_ms`; 1e12 included) is lowered to it; one below [`MIN_TASK_TTL_MS`] (0
/// included) is raised to it; a fraction of a millisecond is dropped (1500.7 → 1500; it used to
/// be taken for "above the cap"). `-32602` when taskgate cannot bound it: `params.task` not an
/// object (`[]`, `null`, `"x"`: it was forwarded as a plain call, and a 2026-07-28 upstream
/// behind a held session could make a task of it the client never saw as one), or a `ttl`
/// that is neither absent, `null` nor a number of ms at least 0 (`"60000"`, `true`, `-1`: the
/// cap cannot be applied to it, and an upstream that reads `"99999999"` as a number would keep
/// the task past it).
fn bounded_ttl(task: &Value, cap: u64) -> Result<Option<TtlEdit>, McpError> {
    let Value::Object(task) = task else {
        return Err(McpError::InvalidParam {
            method: Some("tools/call".into()),
            key: "task".into(),
            problem: "must be an object ({} or {\"ttl\": <ms>})".into(),
        });
    };
    let n = match task.get("ttl") {
        None => return Ok(None),
        Some(Value::Null) => return Ok(Some(TtlEdit::Remove)),
        Some(Value::Number(n)) if n.as_f64().is_some_and(|t| t >= 0.0) => n,
        Some(other) => {
            let got = match other {
                Value::Number(_) => "a negative number",
                // Only on this refusal: the value written back to name its kind.
                _ => crate::jsonrpc::kind_of(&other.to_string()),
            };
            return Err(McpError::InvalidParam {
                method: Some("tools/call".into()),
                key: "task.ttl".into(),
                problem: format!("must be a number of milliseconds, at least 0 (got {got})"),
            });
        }
    };
    Ok(match n.as_u64() {
        Some(t) if t < MIN_TASK_TTL_MS => Some(MIN_TASK_TTL_MS.min(cap)),
        Some(t) if t <= cap => None,
        None => match n.as_f64().filter(|f| f.is_finite() && *f >= 0.0) {
            Some(f) if f < cap as f64 => Some((f.floor() as u64).max(MIN_TASK_TTL_MS).min(cap)),
            _ => Some(cap),
        },
        _ => Some(cap),
    }
    .map(TtlEdit::Write))
}

/// For `tasks/get|result|cancel`: authorise against the registry (→ [`AuthorisedTask`]) and
/// route to the task's session.
/// The client's own `Mcp-Session-Id` (`Some(None)`: it sent none) when `req` was routed to
/// another upstream session (the task's, [`authorise`]); `None` when it goes on its own.
fn routed_from(req: &McpRequest) -> Option<Option<HeaderValue>> {
    (req.ctx.session_id != req.ctx.client_session_id).then(|| req.ctx.client_session_id.clone())
}

/// The reply to a request routed to the task's upstream session names the client's own session
/// (or none), never the task's: a client (the TypeScript SDK does) adopts the `Mcp-Session-Id`
/// of any response, and would then use, and `DELETE`, the session another of its sessions
/// created the task on (issue 35, seen through a round-robin tier with bearer auth).
fn with_own_session(mut reply: McpReply, own: Option<Option<HeaderValue>>) -> McpReply {
    let Some(own) = own else {
        return reply;
    };
    let name = &crate::headers::MCP_SESSION_ID;
    if reply.headers.contains_key(name) {
        match own {
            Some(own) => {
                reply.headers.insert(name, own);
            }
            None => {
                reply.headers.remove(name);
            }
        }
    }
    reply
}

async fn authorise(registry: &Arc<Registry>, req: &mut McpRequest) -> Result<(), McpReply> {
    let Operation::Post(msg) = &req.op else {
        return Ok(());
    };
    let (Some(id), Some(name)) = (msg.id().cloned(), msg.method()) else {
        return Ok(());
    };
    // `None` for `tasks/update` and any other `tasks/*` method: authorised alike, not labelled.
    let method = TaskMethod::parse(name);
    // Borrowed from the message (owned only when it holds an escape): a `String` per request
    // was an allocation and a free on every `tasks/get` (issue 36).
    let task_id = match Classified::of(msg).task_id() {
        Some(t) => t,
        None => {
            let error = McpError::MissingParam {
                method: Some(name.to_string()),
                key: "taskId",
                shape: "a string",
            };
            return Err(refuse(&id, error).answered_locally(LocalReason::InvalidParams));
        }
    };
    let owner = match req.extensions.get::<OnBehalfOf>() {
        Some(OnBehalfOf(owner)) => owner.clone(),
        None => req.ctx.caller().owner(),
    };
    let looked = registry
        .lookup_checked(&req.ctx.upstream, &task_id, &owner)
        .await;
    let looked = match looked {
        Ok(looked) => looked,
        Err(e) => {
            return Err(refuse(&id, store_refusal(None, &e))
                .answered_locally(LocalReason::StoreUnavailable))
        }
    };
    let Some(record) = looked else {
        if let Some(method) = method {
            registry
                .metrics()
                .task_lookup_rejected(&req.ctx.upstream, method);
        }
        if method == Some(TaskMethod::Cancel) {
            registry
                .metrics()
                .cancel_request(&req.ctx.upstream, CancelOutcome::RejectedUnknown);
        }
        let task_id = task_id.into_owned();
        return Err(refuse(&id, McpError::TaskNotFound { task_id })
            .answered_locally(LocalReason::TaskNotFound));
    };
    link_creating_span(req, &record);
    // A task taskgate ended itself (its child died, its upstream lost it) is answered from its
    // record, whichever era created it: the process or session that lost it is not asked
    // (`lost`; review 17 #13). A `tasks/cancel` of it is answered by the `cancel` layer
    // (terminal).
    if lost::ended_here(&record) {
        if let Some(m @ (TaskMethod::Get | TaskMethod::Result)) = method {
            if let Some(reply) = lost::answer(&record, m, Era::Legacy, &id) {
                return Err(reply);
            }
        }
    }
    // A bridged (2026-07-28) record holds a `DetailedTask`: the `bridge` layer answers from it.
    if method == Some(TaskMethod::Result)
        && record.status.is_terminal()
        && record.era == Era::Legacy
    {
        // Cancelled is final: it has no result, whatever the upstream holds (`observe` answers
        // an upstream's late payload so too; a record kept one before that, it is not served).
        if record.status == TaskStatus::Cancelled {
            let task_id = record.task_id.clone();
            let error = McpError::NoResult {
                task_id,
                status: TaskStatus::Cancelled,
                status_message: None,
            };
            return Err(refuse(&id, error).answered_locally(LocalReason::StoredResult));
        }
        if let Some(result) = record.terminal_result.as_deref() {
            return Err(McpReply::local_json(jsonrpc::result_response(&id, result))
                .answered_locally(LocalReason::StoredResult));
        }
    }
    req.ctx.session_id = record
        .upstream_session
        .as_deref()
        .and_then(|s| HeaderValue::from_str(s).ok());
    req.extensions.insert(AuthorisedTask { record });
    if method == Some(TaskMethod::Result) {
        // It blocks until the task is terminal: no upstream timeout (see `Deadline`).
        req.extensions.insert(Deadline::Unbounded);
    }
    Ok(())
}

/// `error` under `id`, as the 2025-11-25 path of this layer answers it (HTTP 200).
fn refuse(id: &Id, error: McpError) -> McpReply {
    McpReply::error(Era::Legacy, Some(id), &error)
}

/// `tasks/list` from the registry.
async fn list(registry: &Arc<Registry>, authenticated: bool, req: &McpRequest) -> McpReply {
    let Operation::Post(msg) = &req.op else {
        return McpReply::accepted();
    };
    let Some(id) = msg.id().cloned() else {
        return McpReply::accepted();
    };
    let owner = req.ctx.caller().owner();
    if owner == Owner::Anonymous && !authenticated {
        return refuse(&id, McpError::TasksListUnavailable);
    }
    let params: Value = msg
        .parse_as::<Value>()
        .ok()
        .and_then(|v| v.get("params").cloned())
        .unwrap_or(Value::Null);
    // Absent (or `null`, as absent) lists from the start; any other non-object is no request
    // for a page (break-edge F12: `"x"` and `[]` listed the tasks).
    let got = match params {
        Value::Object(_) | Value::Null => None,
        Value::String(_) => Some("a string"),
        Value::Array(_) => Some("an array"),
        Value::Number(_) => Some("a number"),
        Value::Bool(_) => Some("a boolean"),
    };
    if let Some(got) = got {
        let message = format!("tasks/list: params must be an object, got {got}");
        return refuse(&id, McpError::InvalidParams { message });
    }
    let upstream = &req.ctx.upstream;
    let cursor = match params.get("cursor") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => {
            let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .ok()
                .map(ListCursor);
            match decoded {
                Some(c) => Some(c),
                None => {
                    let error = McpError::InvalidCursor {
                        not_a_string: false,
                    };
                    return refuse(&id, error);
                }
            }
        }
        Some(_) => return refuse(&id, McpError::InvalidCursor { not_a_string: true }),
    };
    // `[tasks] list_page_size` is 1..=1000, checked at load.
    let limit = registry.config().list_page_size;
    let invalid_cursor = cursor.is_some();
    match registry.list_page(upstream, &owner, cursor, limit).await {
        Ok(None) if invalid_cursor => refuse(
            &id,
            McpError::InvalidCursor {
                not_a_string: false,
            },
        ),
        Ok(None) => refuse(&id, McpError::ListFailed),
        Ok(Some((page, next))) => {
            let now = now_ms();
            let tasks: Vec<_> = page
                .iter()
                .filter(|r| !r.is_expired(now))
                .map(TaskRecord::to_task)
                .collect();
            let mut result = serde_json::json!({ "tasks": tasks });
            if let Some(next) = next {
                result["nextCursor"] =
                    Value::String(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(next.0));
            }
            McpReply::local_json(jsonrpc::result_response(&id, &result.to_string()))
        }
        // The store's error is logged (`Registry::list_page`), not sent to the client.
        Err(e) => refuse(&id, store_refusal(Some("tasks/list"), &e)),
    }
}

/// The record of a creation, before the `CreateTaskResult` completes it.
fn template(req: &McpRequest, owner: Owner, tool: Option<String>) -> TaskRecord {
    TaskRecord {
        upstream: req.ctx.upstream.to_string(),
        task_id: String::new(),
        owner,
        upstream_session: header_string(req.ctx.session_id.as_ref()),
        origin: if req.extensions.get::<Upgraded>().is_some() {
            Origin::Upgraded
        } else {
            Origin::Client
        },
        tool,
        protocol_version: header_string(req.ctx.protocol_version()),
        status: TaskStatus::Working,
        status_message: None,
        created_at: String::new(),
        last_updated_at: String::new(),
        ttl_ms: None,
        poll_interval_ms: None,
        recorded_at: 0,
        cancel_requested_at: None,
        cancelled_at: None,
        released_at: None,
        terminal_at: None,
        late_result_at: None,
        tool_error: false,
        era: crate::mcp::era::Era::Legacy,
        terminal_result: None,
        terminal_error: None,
        input_requests: None,
        cancel_acked: false,
        expires_at: 0,
        // The creating request's SERVER span, kept in the record (issue 34).
        trace_parent: req
            .trace
            .as_ref()
            .map(|t| crate::telemetry::stored(t.context())),
    }
}

/// Links the request's spans to the span that created `record`'s task (issue 34): the SERVER
/// span the edge made (when tracing is on), and through [`TaskLink`](crate::telemetry::TaskLink)
/// the CLIENT span of its upstream exchange, which for taskgate's own polls is a trace of its
/// own. Nothing without a stored creating span.
pub(crate) fn link_creating_span(req: &mut McpRequest, record: &TaskRecord) {
    let Some(creating) = record
        .trace_parent
        .as_deref()
        .and_then(crate::telemetry::restored)
    else {
        return;
    };
    if let Some(trace) = &req.trace {
        trace.link(&creating);
    }
    req.extensions.insert(crate::telemetry::TaskLink(creating));
}

/// Removes `result.capabilities.tasks.list` from an `InitializeResult`.
/// Returns the rewritten message, or `None` to leave it as it is.
fn hide_tasks_list(text: &str) -> Option<String> {
    // A key may be spelled with escapes (`"l\u0069st"`): those are always looked at.
    if !text.contains("\"list\"") && !text.contains("\\u") {
        return None;
    }
    let path = ["result", "capabilities", "tasks", "list"];
    let spliced = match splice::remove(text.as_bytes(), &path) {
        Ok(Some(b)) => String::from_utf8(b.to_vec()).ok(),
        // Absent: nothing to hide.
        Ok(None) if !matches!(splice::raw_at(text.as_bytes(), &path), Ok(Some(_))) => None,
        // Present, but its key is written with escapes: a full rewrite.
        Ok(None) => {
            let mut value = serde_json::from_str::<Value>(text).ok()?;
            value
                .pointer_mut("/result/capabilities/tasks")
                .and_then(Value::as_object_mut)
                .and_then(|t| t.remove("list"))?;
            serde_json::to_string(&value).ok()
        }
        Err(_) => None,
    }?;
    tracing::info!("no auth and no session: tasks.list removed from the upstream's capabilities");
    Some(spliced)
}

/// Whether a 2025-11-25 request names a task the caller must own before it goes on:
/// `tasks/get|result|cancel|update` always (`tasks/update` is 2026-07-28's, and a 2025 client
/// can send it on a held session or to a dual-era upstream: issue 29 #2), any other `tasks/*`
/// request except `tasks/list` when it carries `params.taskId`.
fn names_a_task(req: &McpRequest) -> bool {
    match req.request_method() {
        Some("tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/update") => true,
        Some("tasks/list") => false,
        Some(m) if m.starts_with("tasks/") => {
            req.classified().is_some_and(|c| c.task_id().is_some())
        }
        _ => false,
    }
}

fn header_string(v: Option<&HeaderValue>) -> Option<String> {
    v.and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The `-32603` for a request `method` (when named) that needed the store, which failed
/// with `e`: [`McpError::StoreFailed`] when the store failed for good (restart taskgate), else
/// [`McpError::StoreUnavailable`] (try again). The store's own text is never sent.
fn store_refusal(method: Option<&str>, e: &crate::store::StoreError) -> McpError {
    let method = method.map(str::to_string);
    match e {
        crate::store::StoreError::Failed(_) => McpError::StoreFailed { method },
        _ => McpError::StoreUnavailable { method },
    }
}

#[cfg(test)]
mod tests {
    /// The tasks layer over an upstream that answers `{}` and counts the requests it got.
    fn counting_stack(
        registry: &std::sync::Arc<crate::registry::Registry>,
    ) -> (
        impl tower::Service<
                crate::exchange::McpRequest,
                Response = crate::exchange::McpReply,
                Error = crate::exchange::GatewayError,
            > + Clone,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use crate::exchange::{GatewayError, McpReply, McpRequest};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tower::Layer;
        let calls = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let stack = super::TasksLayer::new(registry.clone(), false).layer(tower::service_fn(
            move |_req: McpRequest| {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    Ok::<_, GatewayError>(McpReply::local_json(bytes::Bytes::from_static(b"{}")))
                }
            },
        ));
        (stack, calls)
    }

    use super::{bounded_ttl, hide_tasks_list, readable, Readable, TtlEdit, MIN_TASK_TTL_MS};
    use serde_json::json;

    /// `readable` answers as reading the params into a `Value` does, with the same error: usual
    /// params, what serde_json refuses (numbers beyond `f64`, lone surrogates, nesting past 128,
    /// syntax), the `RawValue` token as a key, and texts with random edits.
    #[test]
    fn params_are_readable_as_a_value_reads_them() {
        let same = |text: &str| {
            let value = serde_json::from_str::<serde_json::Value>(text).map(drop);
            assert_eq!(
                readable(text).map_err(|e| e.to_string()),
                value.map_err(|e| e.to_string()),
                "{text}"
            );
        };
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(130), "]".repeat(130));
        for text in [
            r#"{"name":"echo","arguments":{"n":[1,-2.5e3,true,null,"x\ny\u00e9"]},"task":{"ttl":60000}}"#,
            r#"{"a":1e400}"#,
            r#"{"a":-1e400}"#,
            r#"{"a":123456789012345678901234567890}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"a":"\ud83d\ude00"}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"$serde_json::private::RawValue":"[1,2"}"#,
            r#"{"$serde_json::private::RawValue":"[1,2]"}"#,
            r#"{"$serde_json::private::RawValue":7}"#,
            r#"{"\u0024serde_json::private::RawValue":"{"}"#,
            r#"{"a":[{"$serde_json::private::RawValue":"x"}]}"#,
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            "{\"a\":\"\u{1}\"}",
            &deep,
        ] {
            same(text);
        }
        assert!(matches!(
            serde_json::from_str::<Readable>(r#"{"b":{"$serde_json::private::RawValue":"1"}}"#),
            Ok(Readable(false))
        ));
        let seeds =
            [r#"{"name":"echo","arguments":{"n":[1,-2.5e3,true,null,"x"]},"task":{"ttl":60000}}"#];
        let tokens: Vec<&str> = crate::jsonrpc::lex::JSON_TOKENS
            .iter()
            .copied()
            .chain(["\\ud800", "1e999"])
            .collect();
        crate::jsonrpc::lex::random_edits(&seeds, &tokens, 0x9e37_79b9_7f4a_7c15, 20_000, same);
    }

    /// The ttl bounds (`tasks.max_ttl_ms` 60 s here): left alone within them, lowered to the cap,
    /// raised to the floor, fractions dropped; no ttl left to the upstream, a `null` one removed
    /// (no ttl); a negative one, one that is not a number, or a `params.task` that is not an
    /// object refused.
    #[test]
    fn a_creations_ttl_is_bounded() {
        let cap = 60_000;
        let ttl = |t: serde_json::Value| bounded_ttl(&json!({ "ttl": t }), cap);
        let write = |t: u64| Ok(Some(TtlEdit::Write(t)));
        assert_eq!(ttl(json!(30_000)), Ok(None));
        assert_eq!(ttl(json!(cap)), Ok(None));
        assert_eq!(ttl(json!(cap + 1)), write(cap));
        assert_eq!(ttl(json!(1e12)), write(cap));
        assert_eq!(ttl(json!(0)), write(MIN_TASK_TTL_MS));
        assert_eq!(ttl(json!(1500.7)), write(1500));
        assert_eq!(ttl(json!(0.5)), write(MIN_TASK_TTL_MS));
        assert!(ttl(json!(-1)).is_err());
        assert!(ttl(json!(-0.5)).is_err());
        assert!(ttl(json!("5000")).is_err());
        assert!(ttl(json!(true)).is_err());
        assert_eq!(ttl(json!(null)), Ok(Some(TtlEdit::Remove)));
        assert_eq!(bounded_ttl(&json!({}), cap), Ok(None));
        assert!(bounded_ttl(&json!([]), cap).is_err());
        assert!(bounded_ttl(&json!(null), cap).is_err());
        // A cap below the floor wins.
        assert_eq!(bounded_ttl(&json!({"ttl": 0}), 500), write(500));
    }

    /// A `tasks/list` page the store cannot read (a database outage) is `-32603` "task store
    /// unavailable", counted in `taskgate_store_write_failures_total` as every other failed
    /// registry read is (the `TaskgateStoreWriteFailures` alert). It was neither counted nor
    /// logged, and the client's message carried the store's own error text.
    #[tokio::test]
    async fn a_tasks_list_the_store_fails_is_counted_and_names_no_store_detail() {
        use crate::exchange::{GatewayError, McpReply, McpRequest};
        use crate::layers::testing::{json_of, registry, request};
        use tower::{Layer, ServiceExt};
        let (registry, store) = registry();
        store
            .fail_lists
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let stack = super::TasksLayer::new(registry.clone(), false).layer(tower::service_fn(
            |_req: McpRequest| async {
                Ok::<_, GatewayError>(McpReply::local_json(bytes::Bytes::from_static(b"{}")))
            },
        ));
        let req = request(r#"{"jsonrpc":"2.0","id":3,"method":"tasks/list","params":{}}"#);
        let reply = json_of(&stack.oneshot(req).await.unwrap());
        assert_eq!(reply["error"]["code"], -32603, "{reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert_eq!(message, "tasks/list: task store unavailable; try again");
        assert_eq!(registry.metrics().store_write_failures_total.get(), 1);
    }

    /// A task creation whose live-task slot the store cannot take (a database outage, shared
    /// store) is `-32603` "task store unavailable" without the store's own error text (logged
    /// and counted by the registry), and nothing goes upstream. The client's message carried
    /// the driver's error.
    #[tokio::test]
    async fn a_creation_the_store_cannot_count_names_no_store_detail() {
        use crate::layers::testing::{json_of, registry, request};
        use std::sync::atomic::Ordering;
        use tower::ServiceExt;
        let (registry, store) = registry();
        store.with_slots.store(true, Ordering::SeqCst);
        store.slots.fail.store(true, Ordering::SeqCst);
        let (stack, calls) = counting_stack(&registry);
        let req = request(
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","arguments":{},"task":{}}}"#,
        );
        let reply = json_of(&stack.oneshot(req).await.unwrap());
        assert_eq!(reply["error"]["code"], -32603, "{reply}");
        assert_eq!(
            reply["error"]["message"],
            "tools/call: task store unavailable; try again"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing went upstream");
        assert_eq!(registry.metrics().store_write_failures_total.get(), 1);
    }

    /// tester4 #1: once the task store failed for good (sled after an I/O error), a task
    /// creation is refused at once, before anything goes upstream, and a `tasks/get` and a
    /// `tasks/list` fail at once, each `-32603` saying the store failed and "restart
    /// taskgate" (no "try again": it does not recover), without the store's own text.
    #[tokio::test]
    async fn a_failed_store_refuses_task_operations_at_once_naming_the_restart() {
        use crate::layers::testing::{json_of, registry, request};
        use std::sync::atomic::Ordering;
        use tower::ServiceExt;
        let (registry, store) = registry();
        store.fail_for_good("IO error: No space left on device (os error 28)");
        let (stack, calls) = counting_stack(&registry);
        for (body, method) in [
            (
                r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","arguments":{},"task":{}}}"#,
                "tools/call: ",
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"taskId":"t1"}}"#,
                "",
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"tasks/list","params":{}}"#,
                "tasks/list: ",
            ),
        ] {
            let reply = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                stack.clone().oneshot(request(body)),
            )
            .await
            .expect("answered at once")
            .unwrap();
            let reply = json_of(&reply);
            assert_eq!(reply["error"]["code"], -32603, "{reply}");
            assert_eq!(
                reply["error"]["message"],
                format!("{method}the task store failed and does not recover until taskgate is restarted (see taskgate's log); restart taskgate"),
                "{reply}"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing went upstream");
        assert!(registry.metrics().store_write_failures_total.get() >= 1);
    }

    #[test]
    fn tasks_list_is_spliced_out() {
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tasks":{"list":{},"cancel":{}},"x":1.10},"n":123456789012345678901234567890}}"#;
        let want = r#"{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tasks":{"cancel":{}},"x":1.10},"n":123456789012345678901234567890}}"#;
        assert_eq!(hide_tasks_list(text).as_deref(), Some(want));
        assert_eq!(hide_tasks_list(r#"{"result":{"list":1}}"#), None);
        let escaped = r#"{"result":{"capabilities":{"tasks":{"l\u0069st":{},"cancel":{}}}}}"#;
        assert_eq!(
            hide_tasks_list(escaped).as_deref(),
            Some(r#"{"result":{"capabilities":{"tasks":{"cancel":{}}}}}"#)
        );
    }
}

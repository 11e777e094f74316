//! `subscriptions/listen` of a 2026-07-28 client on a 2025-11-25 upstream (issue 33, item 8;
//! 2026-07-28 basic/patterns/subscriptions, tasks §notifications).
//!
//! **The filter** (`params.notifications`), as the client asked and the upstream can serve it;
//! the acknowledgement (`notifications/subscriptions/acknowledged`, the stream's first event)
//! names only what is honoured, the rest omitted (2026-07-28: "unsupported types are omitted"):
//! - `toolsListChanged`, `promptsListChanged`, `resourcesListChanged`: honoured when the
//!   upstream's `InitializeResult` declares `capabilities.{tools,prompts,resources}.listChanged`;
//!   its `notifications/{tools,prompts,resources}/list_changed` on the held session's GET stream
//!   reach the listens of that session's callers ([`Tenant`]) that asked for them.
//! - `taskIds` (the tasks extension): the `tasks` layer above has already kept only the caller's
//!   own recorded tasks (`tasks::modern::filter_listen`), so a listen names only tasks of its
//!   principal. Honoured when the upstream runs tool tasks; a listen naming task ids without
//!   declaring the extension is `-32021` (HTTP 400). An upstream `notifications/tasks/status`
//!   for one of them, wherever taskgate reads it (the held session's GET stream, the
//!   `tasks/result` stream an `input_required` task is followed on), becomes one bridged
//!   `tasks/get` (the same translation, stored result and `inputRequests` as the client's own),
//!   sent as `notifications/tasks` with that `DetailedTask` to every listen naming the task.
//!   At most one such `tasks/get` runs per task (a status seen meanwhile runs it once more) and
//!   [`MAX_REFRESHING`] tasks at once (past it a status is not relayed; `tasks/get` still
//!   answers).
//! - `resourceSubscriptions`: not honoured (a 2025 server's `resources/subscribe` is session
//!   state taskgate does not keep for 2026 clients); omitted from the acknowledgement.
//!
//! Every notification carries `_meta["io.modelcontextprotocol/subscriptionId"]`, the JSON-RPC id
//! of the listen. **The stream ends** with the listen's result (`{"resultType":"complete"}`, the
//! same `_meta`: the server ended it) when a newer listen of the same caller takes its place
//! (the bound below); the client closing it ends it; a listen whose events the client does not
//! read ([`LISTEN_QUEUE`] queued) is closed without a result (the 2026 client's "subscription
//! lost": it listens again and refetches), never left missing events silently.
//!
//! **The GET stream** (2025-11-25 transports: the server's standalone stream, where the 1.x
//! TypeScript SDK sends `notifications/tasks/status`): one per caller's held session while that
//! caller has a listen open, opened in the listen's context; an upstream that answers it 405
//! or ends it is asked again after 1 s, doubling up to [`MAX_TAP_RETRY`]; a 404 opens the
//! session again (as any request's would). It ends when the caller's last listen ends. A task
//! created on another caller's session (without auth: another client address naming the
//! unguessable id) is reported only when its status passes a stream taskgate reads.
//!
//! **Bounds**: [`MAX_LISTENS_PER_PRINCIPAL`] listens per caller (a newer one ends its own oldest,
//! never another caller's), [`MAX_LISTENS`] per upstream (past it a listen is refused with HTTP
//! 503 and `Retry-After`), [`LISTEN_QUEUE`] events queued per listen, the task ids per listen
//! bounded by the `tasks` layer (`MAX_LISTEN_TASK_IDS`).

use super::{session, tasks_get, NoSession, ReverseState};
use crate::exchange::{McpReply, McpRequest, Operation, ReplyBody, RequestParts, Tenant};
use crate::jsonrpc::Id;
use crate::layers::extensions::{AuthorisedTask, PendingCreation};
use crate::layers::McpService;
use crate::mcp::capabilities::SUBSCRIPTION_ID_META;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::metrics::LocalReason;
use crate::sse::Event;
use futures_util::StreamExt;
use http::{HeaderValue, StatusCode};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};
use tower::ServiceExt;

/// Most listens open per caller (principal, or client address without auth) and upstream.
pub const MAX_LISTENS_PER_PRINCIPAL: usize = 16;
/// Most listens open per upstream.
pub const MAX_LISTENS: usize = 1024;
/// Events queued per listen before it is closed as lost.
pub const LISTEN_QUEUE: usize = 32;
/// Most tasks whose status is being read for listens at once, per upstream.
pub const MAX_REFRESHING: usize = 64;
/// The longest wait before a GET stream the upstream refused or ended is asked for again.
pub const MAX_TAP_RETRY: Duration = Duration::from_secs(30);

/// The list-changed notifications a filter can name: (filter key, capability, method).
const LIST_CHANGED: [(&str, &str, &str); 3] = [
    (
        "toolsListChanged",
        "tools",
        "notifications/tools/list_changed",
    ),
    (
        "promptsListChanged",
        "prompts",
        "notifications/prompts/list_changed",
    ),
    (
        "resourcesListChanged",
        "resources",
        "notifications/resources/list_changed",
    ),
];

/// What one listen is honoured for (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Honoured {
    /// The list-changed methods relayed (`notifications/tools/list_changed`, …).
    pub methods: Vec<&'static str>,
    /// The task ids relayed as `notifications/tasks`.
    pub task_ids: Vec<String>,
}

impl Honoured {
    /// What `requested` (a `SubscriptionFilter`) gets from an upstream whose `InitializeResult`
    /// is `init` (`tasks`: it runs tool tasks).
    pub fn of(requested: &Value, init: &Value, tasks: bool) -> Honoured {
        let mut h = Honoured::default();
        for (key, capability, method) in LIST_CHANGED {
            let asked = requested.get(key).and_then(Value::as_bool) == Some(true);
            let offered = init
                .pointer(&format!("/capabilities/{capability}/listChanged"))
                .and_then(Value::as_bool)
                == Some(true);
            if asked && offered {
                h.methods.push(method);
            }
        }
        if tasks {
            if let Some(ids) = requested.get("taskIds").and_then(Value::as_array) {
                let mut seen = HashSet::new();
                h.task_ids = ids
                    .iter()
                    .filter_map(Value::as_str)
                    .filter(|id| seen.insert(*id))
                    .map(str::to_string)
                    .collect();
            }
        }
        h
    }

    /// The acknowledged filter (`notifications/subscriptions/acknowledged` params).
    pub fn filter(&self) -> Value {
        let mut f = Map::new();
        for (key, _, method) in LIST_CHANGED {
            if self.methods.contains(&method) {
                f.insert(key.into(), json!(true));
            }
        }
        if !self.task_ids.is_empty() {
            f.insert("taskIds".into(), json!(self.task_ids));
        }
        Value::Object(f)
    }
}

/// One open listen.
struct Listener {
    tenant: Tenant,
    /// The listen's JSON-RPC id (its subscription id).
    sub: Value,
    honoured: Honoured,
    tx: mpsc::Sender<Event>,
    /// The listen request: the context its task status reads are made in.
    req: McpRequest,
    /// Dropped with the listen: its watcher lets go of its sender, so the client's stream ends.
    _gone: oneshot::Sender<()>,
}

impl Listener {
    /// `method` with `params` and this listen's subscription id; `false` when the client does
    /// not keep up (the listen is then to be closed).
    fn notify(&self, method: &str, mut params: Map<String, Value>) -> bool {
        let meta = params.entry("_meta").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert(SUBSCRIPTION_ID_META.into(), self.sub.clone());
        }
        let msg = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.tx.try_send(Event::message(msg.to_string())).is_ok()
    }

    /// Ends the listen with its result (the server ended it).
    fn end(self) {
        let msg = json!({"jsonrpc": "2.0", "id": self.sub, "result": {
            "resultType": "complete", "_meta": {SUBSCRIPTION_ID_META: self.sub}}});
        let _ = self.tx.try_send(Event::message(msg.to_string()));
    }
}

/// The open listens of one upstream, the callers whose GET stream is read, and the task status
/// reads in flight (see the module docs).
#[derive(Default)]
pub struct Listens {
    table: Mutex<Table>,
    next: AtomicU64,
    /// Woken when a listen ends (a GET stream reader checks whether its caller still listens).
    ended: Notify,
    /// Task id → whether its status was seen again while being read.
    refreshing: Mutex<HashMap<String, bool>>,
}

#[derive(Default)]
struct Table {
    /// By creation order.
    open: BTreeMap<u64, Listener>,
    /// The callers whose held session's GET stream is being read.
    tapped: HashSet<Tenant>,
}

/// Why a listen could not be kept: [`MAX_LISTENS`] others are open.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl Listens {
    /// Keeps a listen; returns its number and whether its caller's GET stream is to be read
    /// (nobody reads it yet). The caller's oldest listen ends when it has
    /// [`MAX_LISTENS_PER_PRINCIPAL`].
    fn add(&self, listener: Listener) -> Result<(u64, bool), Full> {
        let mut table = self.table.lock();
        let mine: Vec<u64> = table
            .open
            .iter()
            .filter(|(_, l)| l.tenant == listener.tenant)
            .map(|(n, _)| *n)
            .collect();
        if mine.len() >= MAX_LISTENS_PER_PRINCIPAL {
            if let Some(oldest) = table.open.remove(&mine[0]) {
                tracing::debug!("a caller's newest listen ends its oldest");
                oldest.end();
            }
        } else if table.open.len() >= MAX_LISTENS {
            return Err(Full);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let tap = table.tapped.insert(listener.tenant.clone());
        table.open.insert(n, listener);
        Ok((n, tap))
    }

    fn remove(&self, n: u64) {
        if self.table.lock().open.remove(&n).is_some() {
            self.ended.notify_waiters();
        }
    }

    /// Whether `tenant` still listens; when not, its GET stream reader stops (and is forgotten,
    /// so the next listen starts one).
    fn keeps_tap(&self, tenant: &Tenant) -> bool {
        let mut table = self.table.lock();
        if table.open.values().any(|l| l.tenant == *tenant) {
            return true;
        }
        table.tapped.remove(tenant);
        false
    }

    /// Sends `method` (a list-changed notification) to `tenant`'s listens that asked for it.
    fn list_changed(&self, tenant: &Tenant, method: &str) {
        self.each(
            |l| l.tenant == *tenant && l.honoured.methods.contains(&method),
            |l| l.notify(method, Map::new()),
        );
    }

    /// Sends the task's `DetailedTask` to every listen naming it.
    fn task(&self, task_id: &str, detailed: &Map<String, Value>) {
        self.each(
            |l| l.honoured.task_ids.iter().any(|t| t == task_id),
            |l| l.notify("notifications/tasks", detailed.clone()),
        );
    }

    /// Runs `send` on the listens `which` picks; those whose client does not keep up are closed.
    fn each(&self, which: impl Fn(&Listener) -> bool, send: impl Fn(&Listener) -> bool) {
        let mut table = self.table.lock();
        let lost: Vec<u64> = table
            .open
            .iter()
            .filter(|(_, l)| which(l))
            .filter(|(_, l)| !send(l))
            .map(|(n, _)| *n)
            .collect();
        for n in &lost {
            tracing::info!("a subscriptions/listen whose client does not read it is closed");
            table.open.remove(n);
        }
        if !lost.is_empty() {
            drop(table);
            self.ended.notify_waiters();
        }
    }

    /// The request of a listen naming `task_id` (what its status is read in), if any.
    fn watcher(&self, task_id: &str) -> Option<McpRequest> {
        self.table
            .lock()
            .open
            .values()
            .find(|l| l.honoured.task_ids.iter().any(|t| t == task_id))
            .map(|l| l.req.clone())
    }

    /// Listens open now (for tests and metrics).
    pub fn open(&self) -> usize {
        self.table.lock().open.len()
    }
}

/// A 2026-07-28 `subscriptions/listen` (see the module docs): the acknowledgement, then the
/// notifications honoured, on an SSE stream.
pub(super) async fn open<S: McpService>(
    state: &Arc<ReverseState>,
    inner: S,
    req: McpRequest,
    id: &Id,
    params: Option<&Value>,
) -> McpReply {
    let requested = params
        .and_then(|p| p.get("notifications"))
        .cloned()
        .unwrap_or(Value::Null);
    if !requested.is_object() {
        let error = McpError::MissingParam {
            method: None,
            key: "notifications",
            shape: "a SubscriptionFilter object",
        };
        return McpReply::error(Era::Modern, Some(id), &error)
            .answered_locally(LocalReason::InvalidParams);
    }
    let names_tasks = requested
        .get("taskIds")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if names_tasks && !crate::mcp::capabilities::declares_tasks_extension(params) {
        return McpReply::error(Era::Modern, Some(id), &McpError::MissingTasksExtension)
            .answered_locally(LocalReason::MissingExtension);
    }
    let held = match session(state, &inner, &req).await {
        Ok(Ok(s)) => s,
        Ok(Err(NoSession(reply))) => return reply,
        // A listen's answer is its stream's: a failed opening is its `-32603` (HTTP 200).
        Err(e) => return super::no_session(&req, &e.to_string()).0,
    };
    let tasks = super::translate::runs_tool_tasks(&held.init);
    let honoured = Honoured::of(&requested, &held.init, tasks);
    let sub: Value = serde_json::from_str(id.as_json()).unwrap_or(Value::Null);
    let (tx, rx) = mpsc::channel(LISTEN_QUEUE);
    let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": honoured.filter(), "_meta": {SUBSCRIPTION_ID_META: sub}}});
    let _ = tx.try_send(Event::message(ack.to_string()));
    let tenant = req.ctx.tenant();
    let (gone_tx, gone) = oneshot::channel();
    let listener = Listener {
        tenant: tenant.clone(),
        sub,
        honoured,
        tx: tx.clone(),
        req: req.clone(),
        _gone: gone_tx,
    };
    let (n, tap) = match state.listens.add(listener) {
        Ok(added) => added,
        Err(Full) => {
            let error = McpError::Overloaded {
                message: format!("taskgate holds {MAX_LISTENS} subscriptions/listen streams for this upstream; try again later"),
            };
            return McpReply::error(Era::Modern, Some(id), &error)
                .answered_locally(LocalReason::HeldUpstreamSession);
        }
    };
    // The listen ends when its client goes away; the client's stream ends when the listen is
    // dropped here (ended, closed as lost), once this last other sender goes.
    let me = state.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tx.closed() => {}
            _ = gone => {}
        }
        drop(tx);
        me.listens.remove(n);
    });
    if tap {
        tokio::spawn(read_get_stream(state.clone(), inner, req, tenant));
    }
    McpReply::event_stream(rx, None).answered_locally(LocalReason::HeldUpstreamSession)
}

/// Reads the caller's held session's GET stream while the caller listens (see the module docs).
async fn read_get_stream<S: McpService>(
    state: Arc<ReverseState>,
    inner: S,
    req: McpRequest,
    tenant: Tenant,
) {
    let mut wait = Duration::from_secs(1);
    loop {
        let ended = state.listens.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if !state.listens.keeps_tap(&tenant) {
            return;
        }
        if let Ok(Ok(held)) = session(&state, &inner, &req).await {
            let get = get_request(&req, &held);
            let upstream = req.ctx.upstream.clone();
            match state.bounded(&upstream, inner.clone().oneshot(get)).await {
                Ok(reply) if reply.status == StatusCode::NOT_FOUND => {
                    // The session ended upstream: opened again, then asked after the wait (an
                    // upstream that answers every GET 404 gets no tight loop of initialize).
                    super::reopen(&state, &inner, &req, &held).await;
                }
                Ok(McpReply {
                    status,
                    body: ReplyBody::Stream(mut events),
                    ..
                }) if status.is_success() => {
                    wait = Duration::from_secs(1);
                    loop {
                        tokio::select! {
                            ev = events.next() => match ev {
                                Some(ev) => {
                                    if let Some(data) = ev.data.as_deref() {
                                        seen(&state, &inner, &tenant, data);
                                    }
                                }
                                None => break,
                            },
                            _ = ended.as_mut() => {
                                if !state.listens.keeps_tap(&tenant) {
                                    return;
                                }
                                ended.set(state.listens.ended.notified());
                                ended.as_mut().enable();
                            }
                        }
                    }
                    tracing::debug!(upstream = %upstream, "the held session's GET stream ended");
                }
                Ok(reply) => {
                    tracing::debug!(upstream = %upstream, status = %reply.status, "no GET stream on the held session")
                }
                Err(e) => {
                    tracing::debug!(upstream = %upstream, error = %e, "the held session's GET stream could not be opened")
                }
            }
        }
        // The whole wait, unless the caller stops listening (another caller's listen ending
        // wakes this too: it does not shorten the wait).
        let pause = tokio::time::sleep(wait);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = pause.as_mut() => break,
                _ = ended.as_mut() => {
                    if !state.listens.keeps_tap(&tenant) {
                        return;
                    }
                    ended.set(state.listens.ended.notified());
                    ended.as_mut().enable();
                }
            }
        }
        wait = (wait * 2).min(MAX_TAP_RETRY);
    }
}

/// The GET opening the standalone stream of `held`, in `req`'s context.
fn get_request(req: &McpRequest, held: &super::UpstreamSession) -> McpRequest {
    let mut ctx = req.ctx.clone();
    ctx.session_id = held.id.clone();
    ctx.headers
        .insert(&crate::headers::MCP_PROTOCOL_VERSION, held.version.clone());
    ctx.headers.remove(&crate::mcp::routing_headers::MCP_METHOD);
    ctx.headers.remove(&crate::mcp::routing_headers::MCP_NAME);
    ctx.headers.remove(http::header::CONTENT_TYPE);
    ctx.headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("text/event-stream"),
    );
    let mut extensions = http::Extensions::new();
    extensions.insert(Era::Legacy);
    McpRequest::from(RequestParts {
        op: Operation::OpenStream,
        ctx,
        extensions,
        trace: None,
    })
}

/// One upstream message read on a stream of `tenant`'s (the GET stream, a `tasks/result`
/// stream): a task's status or a list change goes to the listens that asked for it; a request
/// tied to a followed `input_required` task is kept as its input request.
pub(super) fn seen<S: McpService>(
    state: &Arc<ReverseState>,
    inner: &S,
    tenant: &Tenant,
    data: &str,
) {
    // Most events concern no listen: decided without a parse.
    if !data.contains("notifications/") && !data.contains(crate::mcp::task::RELATED_TASK_META) {
        return;
    }
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return;
    };
    let method = v.get("method").and_then(Value::as_str).unwrap_or_default();
    if v.get("id").is_some() {
        // A request of the upstream's on the GET stream, related to a task whose input is
        // followed (2025-11-25 tasks: input may come on either stream).
        let task = v
            .pointer("/params/_meta")
            .and_then(|m| m.get(crate::mcp::task::RELATED_TASK_META))
            .and_then(|r| r.get("taskId"))
            .and_then(Value::as_str);
        if let Some(t) = task.and_then(|t| state.inputs.of(t)) {
            // Only what the task's client declared (review of tester 5 #4's fix: the held
            // session declares every capability the bridge relays, and an undeclared request
            // on this stream was shown anyway). The rest is not shown and, like a request on
            // this stream that names no followed task, not answered here (the 1.x SDKs send a
            // task's input on its `tasks/result` stream, where it is refused upstream).
            if !t.may_show(method) {
                tracing::debug!(method, "an upstream input request on the GET stream its client did not declare was not shown");
                return;
            }
            if !t.add(&v) {
                tracing::debug!("an upstream input request was not kept (bound)");
            }
        }
        return;
    }
    if method == "notifications/tasks/status" {
        if let Some(task_id) = v.pointer("/params/taskId").and_then(Value::as_str) {
            status_seen(state, inner, task_id);
        }
        return;
    }
    if LIST_CHANGED.iter().any(|(_, _, m)| *m == method) {
        state.listens.list_changed(tenant, method);
    }
}

/// A task's status was seen upstream: when a listen names it, one bridged `tasks/get` (at most
/// one in flight per task; a status seen meanwhile runs it once more), its `DetailedTask` sent
/// to the listens naming it.
pub(super) fn status_seen<S: McpService>(state: &Arc<ReverseState>, inner: &S, task_id: &str) {
    let Some(req) = state.listens.watcher(task_id) else {
        return;
    };
    {
        let mut r = state.listens.refreshing.lock();
        if let Some(again) = r.get_mut(task_id) {
            *again = true;
            return;
        }
        if r.len() >= MAX_REFRESHING {
            tracing::debug!(
                "a task status is not relayed to listens: {MAX_REFRESHING} reads in flight"
            );
            return;
        }
        r.insert(task_id.to_string(), false);
    }
    let (state, inner, task_id) = (state.clone(), inner.clone(), task_id.to_string());
    tokio::spawn(async move {
        loop {
            if let Some(detailed) = read_task(&state, inner.clone(), &req, &task_id).await {
                state.listens.task(&task_id, &detailed);
            }
            let mut r = state.listens.refreshing.lock();
            match r.get_mut(&task_id) {
                Some(again) if *again => *again = false,
                _ => {
                    r.remove(&task_id);
                    return;
                }
            }
        }
    });
}

/// The task's `DetailedTask` as the listen's caller's `tasks/get` would get it.
async fn read_task<S: McpService>(
    state: &Arc<ReverseState>,
    inner: S,
    listen: &McpRequest,
    task_id: &str,
) -> Option<Map<String, Value>> {
    let owner = listen.ctx.caller().modern_owner();
    let record = state
        .registry
        .lookup(&listen.ctx.upstream, task_id, &owner)
        .await?;
    if record.era != Era::Legacy {
        return None;
    }
    let mut req = listen.clone();
    req.ctx.session_id = record
        .upstream_session
        .as_deref()
        .and_then(|s| HeaderValue::from_str(s).ok());
    req.extensions.remove::<PendingCreation>();
    req.extensions.insert(AuthorisedTask {
        record: record.clone(),
    });
    let id = Id::from_json("\"taskgate-listen\"").expect("a JSON string");
    let reply = tasks_get(state, inner, &req, &id, record).await.ok()?;
    let ReplyBody::Json(bytes) = reply.body else {
        return None;
    };
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    let mut detailed = v.get("result")?.as_object()?.clone();
    // A notification's params, not a result.
    detailed.remove("resultType");
    Some(detailed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acknowledged_filter_is_what_the_upstream_offers() {
        let init = json!({"capabilities": {"tools": {"listChanged": true}, "prompts": {},
            "resources": {"subscribe": true, "listChanged": false}}});
        let asked = json!({"toolsListChanged": true, "promptsListChanged": true,
            "resourcesListChanged": true, "resourceSubscriptions": ["a://b"],
            "taskIds": ["t1", "t2", "t1", 5]});
        let h = Honoured::of(&asked, &init, true);
        assert_eq!(h.methods, vec!["notifications/tools/list_changed"]);
        assert_eq!(
            h.filter(),
            json!({"toolsListChanged": true, "taskIds": ["t1", "t2"]})
        );
        let no_tasks = Honoured::of(&asked, &init, false);
        assert_eq!(no_tasks.filter(), json!({"toolsListChanged": true}));
        assert_eq!(
            Honoured::of(&json!({}), &init, true).filter(),
            json!({}),
            "nothing asked, nothing honoured"
        );
    }

    fn listener(tenant: &str, ids: &[&str]) -> (Listener, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(LISTEN_QUEUE);
        let req = crate::layers::testing::request(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
        (
            Listener {
                tenant: Tenant::Principal(tenant.into()),
                sub: json!(tenant),
                honoured: Honoured {
                    methods: vec!["notifications/tools/list_changed"],
                    task_ids: ids.iter().map(|s| s.to_string()).collect(),
                },
                tx,
                req,
                _gone: oneshot::channel().0,
            },
            rx,
        )
    }

    /// Per caller, a newer listen ends the oldest (with its result); the table bound refuses;
    /// a listen whose queue is full is closed; task notifications reach only the listens that
    /// name the task, list changes only the caller's.
    #[test]
    fn listens_are_bounded_and_routed() {
        let listens = Listens::default();
        let mut first = None;
        for i in 0..MAX_LISTENS_PER_PRINCIPAL {
            let (l, rx) = listener("alice", &["t-a"]);
            let (_, tap) = listens.add(l).unwrap();
            assert_eq!(tap, i == 0, "one GET stream reader per caller");
            if i == 0 {
                first = Some(rx);
            }
        }
        let (l, mut newest) = listener("alice", &["t-a"]);
        listens.add(l).unwrap();
        assert_eq!(listens.open(), MAX_LISTENS_PER_PRINCIPAL);
        let mut first = first.unwrap();
        let end: Value =
            serde_json::from_str(first.try_recv().unwrap().data.as_deref().unwrap()).unwrap();
        assert_eq!(end["id"], "alice");
        assert_eq!(end["result"]["resultType"], "complete");
        assert_eq!(end["result"]["_meta"][SUBSCRIPTION_ID_META], "alice");
        assert!(first.try_recv().is_err(), "ended: nothing more");

        let (bob, mut bob_rx) = listener("bob", &["t-b"]);
        listens.add(bob).unwrap();
        let mut detailed = Map::new();
        detailed.insert("taskId".into(), json!("t-b"));
        listens.task("t-b", &detailed);
        let n: Value =
            serde_json::from_str(bob_rx.try_recv().unwrap().data.as_deref().unwrap()).unwrap();
        assert_eq!(n["method"], "notifications/tasks");
        assert_eq!(n["params"]["taskId"], "t-b");
        assert_eq!(n["params"]["_meta"][SUBSCRIPTION_ID_META], "bob");
        assert!(
            newest.try_recv().is_err(),
            "alice's listens do not name t-b"
        );
        listens.list_changed(
            &Tenant::Principal("alice".into()),
            "notifications/tools/list_changed",
        );
        assert!(bob_rx.try_recv().is_err(), "another caller's list change");
        assert!(newest.try_recv().is_ok());

        // A client that does not read: its listen is closed once its queue is full.
        for _ in 0..=LISTEN_QUEUE {
            listens.task("t-b", &detailed);
        }
        assert!(listens.watcher("t-b").is_none(), "bob's listen closed");
        assert!(listens.keeps_tap(&Tenant::Principal("alice".into())));
        assert!(!listens.keeps_tap(&Tenant::Principal("bob".into())));

        // The upstream's bound: refused, never taken from another caller.
        let mut kept = Vec::new();
        for i in 0..MAX_LISTENS {
            let (l, rx) = listener(&format!("p{i}"), &[]);
            kept.push(rx);
            if listens.add(l).is_err() {
                assert!(i > 0);
                break;
            }
        }
        let (l, _rx) = listener("late", &[]);
        assert_eq!(listens.add(l).err(), Some(Full));
        assert!(listens.keeps_tap(&Tenant::Principal("alice".into())));
    }
}

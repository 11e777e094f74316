//! The `session` layer: what taskgate knows about each MCP session (2025-11-25 basic/lifecycle).
//!
//! Per `(upstream, Mcp-Session-Id)` it keeps the client's capabilities (from the `initialize`
//! request), the upstream's capabilities (from the `InitializeResult`) and a cache of the tools the
//! upstream listed (`execution.taskSupport` per tool, accumulated over every page of every
//! `tools/list` answer that passes by). `notifications/tools/list_changed` from the upstream
//! empties the tool cache. A DELETE of the session forgets it. It changes no message.
//!
//! The table is bounded: beyond 100,000 sessions the oldest half is forgotten (their later calls
//! are then simply not upgraded until a `tools/list` is seen again).

use crate::exchange::{McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::contains as memmem;
use crate::jsonrpc::needles;
use crate::jsonrpc::Id;
use http::HeaderValue;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

const MAX_SESSIONS: usize = 100_000;

/// `execution.taskSupport` of a tool (absent means `forbidden`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Must not be called as a task.
    Forbidden,
    /// May be called either way.
    Optional,
    /// Must be called as a task.
    Required,
}

impl TaskSupport {
    fn of(tool: &Value) -> TaskSupport {
        match tool
            .pointer("/execution/taskSupport")
            .and_then(Value::as_str)
        {
            Some("required") => TaskSupport::Required,
            Some("optional") => TaskSupport::Optional,
            _ => TaskSupport::Forbidden,
        }
    }
}

/// What is known of one session.
#[derive(Debug, Clone, Default)]
pub struct SessionInfo {
    /// `params.capabilities` of the client's `initialize`.
    pub client_capabilities: Option<Value>,
    /// `result.capabilities` of the upstream's `InitializeResult`.
    pub upstream_capabilities: Option<Value>,
    /// Tools seen in `tools/list` answers, with their `taskSupport`.
    pub tools: HashMap<String, TaskSupport>,
    /// Order of insertion, for bounding the table.
    seq: u64,
}

impl SessionInfo {
    /// Whether the client declared `capabilities.tasks`.
    pub fn client_declares_tasks(&self) -> bool {
        self.client_capabilities
            .as_ref()
            .is_some_and(|c| c.get("tasks").is_some())
    }

    /// Whether the client declared a capability, by JSON pointer (`/elicitation`, `/sampling`).
    pub fn client_has(&self, pointer: &str) -> bool {
        self.client_capabilities
            .as_ref()
            .is_some_and(|c| c.pointer(pointer).is_some())
    }

    /// Whether the upstream declared `tasks.requests.tools.call`.
    pub fn upstream_tasks_tools_call(&self) -> bool {
        self.upstream_capabilities
            .as_ref()
            .is_some_and(|c| c.pointer("/tasks/requests/tools/call").is_some())
    }
}

type Key = (Arc<str>, Option<SessionKey>);

/// The key of a caller's entry in the session table: its `Mcp-Session-Id`; without one (an
/// upstream without sessions), its bearer principal. Typed, so a client that sends
/// `Mcp-Session-Id: principal:alice` names a session, never alice's entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SessionKey {
    /// The client's `Mcp-Session-Id`.
    Session(HeaderValue),
    /// A bearer principal calling an upstream that issues no sessions.
    Principal(Arc<str>),
}

/// The session-table key of a caller (see [`SessionKey`]); without a session or a principal,
/// `None`, under which only the upstream's facts (capabilities, tools) are kept, never a client's.
pub fn session_key(ctx: &crate::exchange::RequestContext) -> Option<SessionKey> {
    match (&ctx.client_session_id, &ctx.principal) {
        (Some(s), _) => Some(SessionKey::Session(s.clone())),
        (None, crate::exchange::Principal::Token(p)) => Some(SessionKey::Principal(p.clone())),
        (None, crate::exchange::Principal::Anonymous) => None,
    }
}

/// The session table, shared by the `session` and `upgrade` layers.
#[derive(Default)]
pub struct Sessions {
    table: Mutex<HashMap<Key, SessionInfo>>,
    seq: std::sync::atomic::AtomicU64,
}

impl Sessions {
    /// An empty table.
    pub fn new() -> Arc<Sessions> {
        Arc::new(Sessions::default())
    }

    /// Whether the session's upstream declared `tasks.requests.tools.call` (no copy made).
    pub fn upstream_tasks_tools_call(
        &self,
        upstream: &Arc<str>,
        session: Option<&SessionKey>,
    ) -> bool {
        self.table
            .lock()
            .get(&(upstream.clone(), session.cloned()))
            .is_some_and(SessionInfo::upstream_tasks_tools_call)
    }

    /// Whether the session's upstream answered `initialize` with capabilities that have no
    /// `tasks` (unknown sessions: `false`).
    pub fn upstream_without_tasks(
        &self,
        upstream: &Arc<str>,
        session: Option<&SessionKey>,
    ) -> bool {
        self.table
            .lock()
            .get(&(upstream.clone(), session.cloned()))
            .and_then(|s| s.upstream_capabilities.as_ref())
            .is_some_and(|c| c.get("tasks").is_none())
    }

    /// The cached `taskSupport` of a tool (no copy of the session made).
    pub fn tool_support(
        &self,
        upstream: &Arc<str>,
        session: Option<&SessionKey>,
        tool: &str,
    ) -> Option<TaskSupport> {
        self.table
            .lock()
            .get(&(upstream.clone(), session.cloned()))
            .and_then(|s| s.tools.get(tool).copied())
    }

    /// A copy of what is known of a session.
    pub fn get(&self, upstream: &Arc<str>, session: Option<&SessionKey>) -> Option<SessionInfo> {
        self.table
            .lock()
            .get(&(upstream.clone(), session.cloned()))
            .cloned()
    }

    fn with<R>(
        &self,
        upstream: &Arc<str>,
        session: Option<&SessionKey>,
        f: impl FnOnce(&mut SessionInfo) -> R,
    ) -> R {
        let mut table = self.table.lock();
        if table.len() >= MAX_SESSIONS {
            let mut seqs: Vec<u64> = table.values().map(|s| s.seq).collect();
            seqs.sort_unstable();
            let cut = seqs[seqs.len() / 2];
            table.retain(|_, s| s.seq >= cut);
        }
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let info = table
            .entry((upstream.clone(), session.cloned()))
            .or_insert_with(|| SessionInfo {
                seq,
                ..Default::default()
            });
        f(info)
    }

    /// Records the tools of one `tools/list` result page.
    pub fn record_tools(&self, upstream: &Arc<str>, session: Option<&SessionKey>, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        self.with(upstream, session, |s| {
            for tool in tools {
                if let Some(name) = tool.get("name").and_then(Value::as_str) {
                    s.tools.insert(name.to_string(), TaskSupport::of(tool));
                }
            }
        });
    }

    fn forget(&self, upstream: &Arc<str>, session: Option<&SessionKey>) {
        self.table
            .lock()
            .remove(&(upstream.clone(), session.cloned()));
    }

    fn tools_changed(&self, upstream: &Arc<str>, session: Option<&SessionKey>) {
        self.with(upstream, session, |s| s.tools.clear());
    }

    fn on_upstream_message(&self, upstream: &Arc<str>, session: Option<&SessionKey>, bytes: &[u8]) {
        if needles::found(&needles::TOOLS_LIST_CHANGED, bytes) {
            if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
                if v.get("method").and_then(Value::as_str)
                    == Some("notifications/tools/list_changed")
                {
                    self.tools_changed(upstream, session);
                }
            }
        }
    }
}

/// Builds [`SessionService`]s over a shared [`Sessions`] table.
#[derive(Clone)]
pub struct SessionLayer {
    sessions: Arc<Sessions>,
}

impl SessionLayer {
    /// A layer filling `sessions`.
    pub fn new(sessions: Arc<Sessions>) -> SessionLayer {
        SessionLayer { sessions }
    }
}

impl<S> tower::Layer<S> for SessionLayer {
    type Service = SessionService<S>;
    fn layer(&self, inner: S) -> SessionService<S> {
        SessionService {
            inner,
            sessions: self.sessions.clone(),
        }
    }
}

/// The `session` layer's service (see the module docs).
#[derive(Clone)]
pub struct SessionService<S> {
    inner: S,
    sessions: Arc<Sessions>,
}

impl<S> tower::Service<McpRequest> for SessionService<S>
where
    S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = McpReply;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<McpReply, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let sessions = self.sessions.clone();
        let upstream = req.ctx.upstream.clone();
        let session = session_key(&req.ctx);
        if req
            .request_method()
            .is_some_and(|m| m.starts_with("tasks/"))
            && crate::era::Era::of(&req) == crate::era::Era::Legacy
            && sessions.upstream_without_tasks(&upstream, session.as_ref())
        {
            req.extensions
                .insert(crate::layers::extensions::UpstreamWithoutTasks);
        }
        let has_identity = req.ctx.client_session_id.is_some()
            || matches!(req.ctx.principal, crate::exchange::Principal::Token(_));
        let watch = match (&req.op, req.request_method()) {
            (Operation::Post(msg), Some("initialize")) => {
                let caps = msg
                    .parse_as::<Value>()
                    .ok()
                    .and_then(|v| v.pointer("/params/capabilities").cloned())
                    .unwrap_or(Value::Null);
                Watch::Initialize(caps)
            }
            (Operation::Post(_), Some("tools/list")) => Watch::ToolsList,
            (Operation::EndSession, _) => {
                sessions.forget(&upstream, session.as_ref());
                Watch::Nothing
            }
            (Operation::OpenStream, _) => Watch::Stream,
            _ => Watch::Nothing,
        };
        let id = req.id().cloned();
        let watch_kind = match &watch {
            Watch::Initialize(_) => WatchKind::Initialize,
            Watch::ToolsList => WatchKind::ToolsList,
            _ => WatchKind::Other,
        };
        Box::pin(async move {
            let mut reply = inner.call(req).await?;
            let reply_session = reply
                .headers
                .get("mcp-session-id")
                .cloned()
                .map(SessionKey::Session)
                .or(session);
            // Without a session or a principal every client shares one entry: keep the
            // upstream's facts there, never one client's capabilities.
            let keep_client_caps = has_identity || reply.headers.contains_key("mcp-session-id");
            let observe = move |bytes: &[u8]| match &watch {
                Watch::Initialize(caps) => {
                    if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
                        if v.get("id").and_then(Id::from_value).as_ref() == id.as_ref() {
                            if let Some(result) = v.get("result") {
                                sessions.with(&upstream, reply_session.as_ref(), |s| {
                                    s.client_capabilities = keep_client_caps.then(|| caps.clone());
                                    s.upstream_capabilities = result.get("capabilities").cloned();
                                    s.tools.clear();
                                });
                            }
                        }
                    }
                }
                Watch::ToolsList => {
                    if memmem(bytes, b"\"tools\"") {
                        if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
                            if let Some(result) = v.get("result") {
                                sessions.record_tools(&upstream, reply_session.as_ref(), result);
                            }
                        }
                    }
                    sessions.on_upstream_message(&upstream, reply_session.as_ref(), bytes);
                }
                Watch::Stream | Watch::Nothing => {
                    sessions.on_upstream_message(&upstream, reply_session.as_ref(), bytes)
                }
            };
            let json_matters = matches!(watch_kind, WatchKind::Initialize | WatchKind::ToolsList);
            // A JSON answer is the one response: only initialize and tools/list answers matter.
            if json_matters || matches!(reply.body, ReplyBody::Stream(_)) {
                reply.body = reply.body.map_messages(move |data| {
                    observe(data.as_bytes());
                    None
                });
            }
            Ok(reply)
        })
    }
}

enum WatchKind {
    Initialize,
    ToolsList,
    Other,
}

enum Watch {
    Nothing,
    Initialize(Value),
    ToolsList,
    Stream,
}

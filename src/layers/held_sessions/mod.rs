//! The `held_sessions` stage: 2025-11-25 sessions taskgate holds itself for an upstream without
//! 2025 sessions (a pure 2026-07-28 server that refuses `initialize`: rmcp 3 with
//! `legacy_session_mode` off, say). A session concern (DESIGN.md "Two eras, one gateway": held
//! upstream sessions, their own stage): who holds the session, its id, its answer to
//! `initialize`, and the session table's facts the layers below need, handed down typed.
//!
//! It sits below `cancel` and directly above `bridge` (assembled in `gateway`), so a held
//! session's requests pass `session_guard`, `session`, `upgrade`, `tasks` and `cancel` exactly
//! as an upstream-issued session's do (owner binding, routing, single-flight cancel,
//! `notifications/cancelled` routing), `upgrade`'s own requests on a held session included,
//! and only then are looked up here. The `bridge` below reads none of the session table: what
//! it needs comes down as request extensions.
//!
//! What it does, for 2025-11-25 requests only (a 2026-07-28 request passes untouched):
//! - **Lookup** (once this upstream's sessions are held, or any held session is in the table,
//!   say one `session_guard` brought back from the store after a restart): a request of a held
//!   session gets its [`HeldSession`] (what the client declared: carried upstream in every
//!   request's `_meta` by the `bridge` and the `upstream` stage). A session id the table does not know, on an upstream
//!   whose sessions are held, is answered HTTP 404 `-32001` "Session not found" (the 2025
//!   transport's answer to an unknown session; never forwarded), counted as
//!   `taskgate_local_answers_total{reason="held_session"}`.
//! - **Policy down**: [`SessionsHeld`] on every request to an upstream whose sessions are held
//!   (the `bridge` then answers `initialize` from `server/discover` without asking the upstream
//!   for a session); [`ClientDeclares`] (the input capabilities the session declared: a held
//!   session's own, and what the session stage's [`SessionView`] says) on the
//!   requests for which the `bridge` or the `relay` may ask the client for input: a held
//!   session's, a task-augmented `tools/call`, a bridged `tasks/result`; [`HeldAlive`] on a held
//!   session's GET stream and `resources/subscribe` (the `upstream` stage's listen state drops
//!   entries of sessions that ended).
//! - **`initialize`**: when the `bridge`'s reply carries [`HoldSession`] (the upstream refused a
//!   2025 `initialize` and answered `server/discover`; learned once per upstream, then every
//!   later `initialize` is answered so), this stage answers the client itself: the
//!   `InitializeResult` from the `server/discover` result ([`held_initialize_result`]:
//!   `serverInfo` from its `_meta["io.modelcontextprotocol/serverInfo"]`, `capabilities`
//!   without the 2026 `extensions`, the 2025 `capabilities.tasks` added when the upstream has
//!   the tasks extension, `instructions`; `protocolVersion` the client's when it is a 2025-era
//!   revision taskgate knows, else `2025-11-25`), under an `Mcp-Session-Id` it mints (`tgh-` and
//!   128 random bits from the OS as 32 hex digits, the held form
//!   `session::is_held_form`), with the [`HeldAnswer`] reply fact: the `session` layer above
//!   keeps the session (bounded by `gateway.max_sessions`: 503 when full) and writes it to the
//!   registry's store before the id goes on (500 when the store cannot write it;
//!   `session::held_store`, by `session_guard` brought back after a restart or on another
//!   replica). Errors: `-32603` when the OS random source fails.
//!
//! Where the session table and its store stay: the table is the `session` layer's (`Sessions`,
//! given to this stage in its constructor, read only); the held sessions' persistence
//! (`session::held_store`: written before the id goes on, revived by `session_guard`, removed on
//! DELETE, reclaim and expiry) is the table's own durability, so it stays with the table.
//!
//! Where a held session's requests go is this concern's other stage, [`upstream`], directly
//! below the `bridge`: it sends what the bridge passes on of a held session (every request
//! but `initialize` and the task requests the bridge translates) upstream as stateless
//! 2026-07-28 requests, keeps them in flight (a `notifications/cancelled` ends them), and
//! answers its notifications, `ping` and DELETE itself. The session is on both sides of the
//! era translation: above it, who the session is; below it, where its requests go. What the
//! requests and answers look like in either era (`bridge::sessionless`) is the bridge's.

pub mod listen;
pub mod upstream;

pub use upstream::{HeldUpstream, HeldUpstreamLayer};

use crate::exchange::{GatewayError, McpReply, McpRequest, Operation};
use crate::jsonrpc;
use crate::layers::bridge::translate;
use crate::layers::extensions::{
    AuthorisedTask, ClientDeclares, HeldAlive, HeldAnswer, HeldSession, HoldSession,
    PendingCreation, SessionView, SessionsHeld,
};
use crate::layers::session::{Sessions, HELD_SESSION_PREFIX};
use crate::layers::McpService;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::metrics::LocalReason;
use futures_util::future::Either;
use http::HeaderValue;
use serde_json::{json, Map, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// 2025-era revisions a held session may negotiate (the client's, when it asks for one).
const LEGACY_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// One upstream's held sessions: whether taskgate holds its 2025 sessions, and the session
/// table (the `session` layer's) it reads them from.
pub struct HeldSessions {
    sessions: Arc<Sessions>,
    /// The upstream refused a 2025 `initialize` and answered `server/discover`: taskgate holds
    /// 2025 sessions itself. Learned once (from a [`HoldSession`] reply), kept for the
    /// process's life.
    holds: AtomicBool,
}

impl HeldSessions {
    /// The held sessions of one upstream, read from `sessions` (the `session` layer's table,
    /// which keeps held sessions in the store it was given at start, see `gateway`).
    pub fn new(sessions: Arc<Sessions>) -> Arc<HeldSessions> {
        Arc::new(HeldSessions {
            sessions,
            holds: AtomicBool::new(false),
        })
    }

    /// Whether taskgate holds 2025 sessions itself for this upstream.
    pub fn holds(&self) -> bool {
        self.holds.load(Ordering::Relaxed)
    }
}

/// Builds [`HeldSessionsService`]s over one upstream's [`HeldSessions`].
#[derive(Clone)]
pub struct HeldSessionsLayer {
    state: Arc<HeldSessions>,
}

impl HeldSessionsLayer {
    /// A layer holding sessions with `state`.
    pub fn new(state: Arc<HeldSessions>) -> HeldSessionsLayer {
        HeldSessionsLayer { state }
    }
}

impl<S> tower::Layer<S> for HeldSessionsLayer {
    type Service = HeldSessionsService<S>;
    fn layer(&self, inner: S) -> HeldSessionsService<S> {
        HeldSessionsService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The `held_sessions` stage's service (see the module docs).
#[derive(Clone)]
pub struct HeldSessionsService<S> {
    inner: S,
    state: Arc<HeldSessions>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

/// What taskgate knows of a request's session.
enum Lookup {
    /// No `Mcp-Session-Id`.
    NoSession,
    /// A session taskgate holds.
    Held(Arc<HeldSession>),
    /// A session taskgate knows that it does not hold (issued by the upstream before it
    /// started refusing `initialize`).
    NotHeld,
    /// A session id taskgate does not know.
    Unknown,
}

impl<S: McpService> tower::Service<McpRequest> for HeldSessionsService<S> {
    type Response = McpReply;
    type Error = GatewayError;
    /// The inner service's own future (every request but `initialize` and a local 404); a
    /// boxed one otherwise.
    type Future = Either<S::Future, BoxFut>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        if req.era() == Era::Modern {
            return Either::Left(self.inner.call(req));
        }
        let state = &self.state;
        let holds = state.holds();
        let mut held = None;
        // A session taskgate holds (one may come back from the store before this process
        // learned that it holds sessions).
        if holds || state.sessions.any_held() {
            match lookup(&state.sessions, &req) {
                Lookup::Held(session) => held = Some(session),
                Lookup::Unknown if holds => {
                    return Either::Right(Box::pin(std::future::ready(Ok(not_found(&req)))))
                }
                Lookup::Unknown | Lookup::NotHeld | Lookup::NoSession => {}
            }
        }
        if holds {
            req.extensions.insert(SessionsHeld);
        }
        if let Some(declares) = client_declares(&req, held.as_deref()) {
            req.extensions.insert(declares);
        }
        if let Some(session) = held {
            let opens = matches!(req.op, Operation::OpenStream)
                || req.request_method() == Some("resources/subscribe");
            if opens {
                let (sessions, upstream) = (state.sessions.clone(), req.ctx.upstream.clone());
                req.extensions.insert(HeldAlive(Arc::new(move |id: &str| {
                    HeaderValue::from_str(id)
                        .map_or(true, |id| sessions.held(&upstream, &id).is_some())
                })));
            }
            req.extensions.insert(session);
        }
        if req.request_method() != Some("initialize") {
            return Either::Left(self.inner.call(req));
        }
        let (state, fut) = (self.state.clone(), self.inner.call(req.clone()));
        Either::Right(Box::pin(async move {
            let mut reply = fut.await?;
            match reply.extensions.remove::<HoldSession>() {
                Some(hold) => Ok(state.answer_initialize(&req, &hold)),
                None => Ok(reply),
            }
        }))
    }
}

impl HeldSessions {
    /// The `InitializeResult` of a held session from the [`HoldSession`] fact, with a new
    /// session id (see the module docs).
    fn answer_initialize(&self, req: &McpRequest, hold: &HoldSession) -> McpReply {
        if !self.holds.swap(true, Ordering::Relaxed) {
            tracing::info!(
                upstream = %req.ctx.upstream,
                "the upstream refused a 2025 initialize and answered server/discover: taskgate holds 2025 sessions for it"
            );
        }
        let Some(id) = req.id() else {
            return McpReply::accepted();
        };
        let Some(session) = new_session_id() else {
            return McpReply::error(Era::Legacy, Some(id), &McpError::NoRandomSessionId);
        };
        let requested = match &req.op {
            Operation::Post(m) => m
                .parse_as::<Value>()
                .ok()
                .and_then(|v| v.pointer("/params/protocolVersion").cloned()),
            _ => None,
        };
        let result =
            held_initialize_result(requested.as_ref(), &hold.discovered, hold.modern_tasks);
        let mut reply = McpReply::local_json(jsonrpc::result_response(id, &result.to_string()))
            .answered_locally(LocalReason::HeldSession);
        if let Ok(v) = HeaderValue::from_str(&session) {
            reply.headers.insert("mcp-session-id", v);
        }
        reply.extensions.insert(HeldAnswer);
        reply
    }
}

/// The [`Lookup`] of `req`'s `Mcp-Session-Id` (the client's own).
fn lookup(sessions: &Sessions, req: &McpRequest) -> Lookup {
    let Some(session) = req.ctx.client_session_id.as_ref() else {
        return Lookup::NoSession;
    };
    match sessions.held(&req.ctx.upstream, session) {
        Some(Some(held)) => Lookup::Held(held),
        Some(None) => Lookup::NotHeld,
        None => Lookup::Unknown,
    }
}

/// The input capabilities `req`'s client declared, for the requests that may ask it for input
/// (a held session's, a task-augmented `tools/call`, a bridged `tasks/result`): its held
/// session's capabilities, else (or also) what its session's `initialize` declared.
fn client_declares(req: &McpRequest, held: Option<&HeldSession>) -> Option<ClientDeclares> {
    let may_ask = held.is_some()
        || req.extensions.get::<PendingCreation>().is_some()
        || (req.request_method() == Some("tasks/result")
            && req
                .extensions
                .get::<AuthorisedTask>()
                .is_some_and(|a| a.record.era == Era::Modern));
    if !may_ask {
        return None;
    }
    // What the session's `initialize` declared, as the session stage handed it down.
    let declared = req.extensions.get::<SessionView>().map(|v| v.client);
    let has = |pointer: &str| {
        held.is_some_and(|h| h.client_capabilities.pointer(pointer).is_some())
            || declared.is_some_and(|c| c.has(pointer))
    };
    Some(ClientDeclares {
        elicitation: has("/elicitation"),
        sampling: has("/sampling"),
        roots: has("/roots"),
    })
}

/// HTTP 404 `-32001` "Session not found" (the 2025 transport's answer to an unknown session).
fn not_found(req: &McpRequest) -> McpReply {
    McpReply::error(Era::Legacy, req.id(), &McpError::SessionNotFound)
        .answered_locally(LocalReason::HeldSession)
}

/// The `InitializeResult` a held session's `initialize` gets: `protocolVersion` the client's
/// `requested` one when it is a 2025-era revision (`LEGACY_VERSIONS`), else `2025-11-25`;
/// the 2025 `capabilities.tasks` added when the upstream has the tasks extension
/// (`modern_tasks`).
pub fn held_initialize_result(
    requested: Option<&Value>,
    discovered: &Value,
    modern_tasks: bool,
) -> Value {
    let version = requested
        .and_then(Value::as_str)
        .filter(|v| LEGACY_VERSIONS.contains(v))
        .unwrap_or("2025-11-25");
    let mut result = legacy_initialize_result(discovered, version);
    if modern_tasks {
        translate::add_legacy_tasks_capability(&mut result);
    }
    result
}

/// A 2025 `InitializeResult` (`protocolVersion` `version`) from a 2026 `server/discover` result
/// (2026-07-28 `server/discover`: `capabilities`, `instructions`,
/// `_meta["io.modelcontextprotocol/serverInfo"]`; taskgate's own `serverInfo` when it gives none).
pub fn legacy_initialize_result(discovered: &Value, version: &str) -> Value {
    let mut capabilities = match discovered.get("capabilities") {
        Some(Value::Object(c)) => c.clone(),
        _ => Map::new(),
    };
    capabilities.remove("extensions");
    let server_info = discovered
        .pointer("/_meta/io.modelcontextprotocol~1serverInfo")
        .filter(|i| i.get("name").is_some_and(Value::is_string))
        .cloned()
        .unwrap_or_else(|| json!({"name": "taskgate", "version": env!("CARGO_PKG_VERSION")}));
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": server_info,
    });
    if let Some(i) = discovered.get("instructions").filter(|i| i.is_string()) {
        result["instructions"] = i.clone();
    }
    result
}

/// A new session id: `tgh-` and 128 bits from the operating system's random source as 32 hex
/// digits (the held form, `session::is_held_form`: only such ids are looked up in the store).
/// `None` when the random source fails.
fn new_session_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).ok()?;
    Some(format!("{HELD_SESSION_PREFIX}{}", hex::encode(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::capabilities::TASKS_EXTENSION;

    #[test]
    fn initialize_result_from_discover() {
        let d = json!({"resultType":"complete","supportedVersions":["2026-07-28"],
            "capabilities":{"tools":{"listChanged":true},"extensions":{TASKS_EXTENSION:{}}},
            "instructions":"be nice","_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"2"}}});
        let r = legacy_initialize_result(&d, "2025-11-25");
        assert_eq!(r["serverInfo"]["name"], "s");
        assert_eq!(r["instructions"], "be nice");
        assert!(r["capabilities"].get("extensions").is_none());
        assert_eq!(r["capabilities"]["tools"]["listChanged"], true);
        let bare = legacy_initialize_result(&json!({}), "2025-06-18");
        assert_eq!(bare["serverInfo"]["name"], "taskgate");
        assert_eq!(bare["protocolVersion"], "2025-06-18");
        assert!(bare["capabilities"].is_object());
    }

    #[test]
    fn minted_session_ids_have_the_held_form() {
        let a = new_session_id().unwrap();
        assert!(crate::layers::session::is_held_form(a.as_bytes()), "{a}");
        assert_ne!(a, new_session_id().unwrap());
    }
}

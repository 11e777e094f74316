//! The `session_guard` layer, outermost: a session belongs to the principal that initialized it
//! (2025-11-25 basic/transports: Session Management; security best practices: session hijacking).
//!
//! - A POST, GET or DELETE carrying an `Mcp-Session-Id` that taskgate saw issued to another
//!   principal is answered 404 with JSON-RPC `-32001` "Session not found", exactly as a session the
//!   upstream does not know; nothing is forwarded. With authentication, a session id taskgate has
//!   no entry for (never issued through it, reclaimed, or issued before a restart) gets the same
//!   answer: taskgate cannot tell whose it is, and the spec's answer to a 404 is a new
//!   `initialize`. Without authentication every caller is the same principal and unknown ids
//!   are forwarded (the upstream decides).
//! - A request on a known session without `MCP-Protocol-Version` goes upstream with the version
//!   the session negotiated (strict upstreams answer 400 without it), and carries what is known
//!   of the session down as the `SessionView` fact (the session stage's: the table is read once).
//! - An `initialize` never carries a session id upstream: a client's stale `Mcp-Session-Id` on it
//!   is dropped (an upstream may refuse an initialize naming an id it never issued).
//! - A DELETE of a session while its owner has live tasks on that upstream (the registry's
//!   live-task slots) is answered 200 by taskgate and not forwarded yet: the client's session
//!   ends at once (taskgate forgets it), but the upstream session stays open, so the owner can
//!   still reach its tasks from a new session (taskgate routes `tasks/*` to the session a task
//!   was created on; upstreams may keep tasks per session). taskgate sends the DELETE upstream
//!   once the owner has no live task left there (checked every second, at most
//!   `tasks.max_ttl_ms`, when every record has expired). At most 10,000 DELETEs wait at once;
//!   beyond that they are forwarded at once.
//! - An `initialize` while the session table is full (`gateway.max_sessions`, no session idle for
//!   `gateway.session_idle_ms`) is answered 503 with `-32603` before it reaches the upstream,
//!   unless its principal is at `limits.max_sessions_per_principal` (then its own least recently
//!   used session makes room, see `session`).
//! - A session id the table does not hold is looked up in the registry's store first (issue
//!   35: a restart, or another replica of a tier, saw its `initialize`; see
//!   `session::held_store`): a stored one comes back with its owner, and the checks above apply
//!   to it. One not stored (never issued, ended, reclaimed, idle past
//!   `gateway.session_idle_ms`) gets what an unknown id got before: 404 `-32001` with
//!   authentication, forwarded without (the upstream decides); a held form (`tgh-` and 32 hex
//!   digits: a session the `bridge` holds itself) is 404 either way, never forwarded. A stored
//!   one the full table has no room for is 503; a store that cannot be read is 500 `-32603`
//!   where the answer would be 404, and forwarded where it would be forwarded. On a store other
//!   replicas share, a session's entry is read again in the background once it is
//!   [`REVALIDATE_AFTER`] old (its request is served from the table meanwhile, so a store that
//!   does not answer holds no request): one another replica ended is then unknown here too.
//!   A session already in the table (and fresh) costs no store read.

#[cfg(doc)]
use super::session::REVALIDATE_AFTER;
use super::session::{end_session, is_held_form, Access, HandDown, Revived, SessionKey, Sessions};
use crate::exchange::Operation;
use crate::exchange::{McpReply, McpRequest};
use crate::jsonrpc::Id;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::registry::Registry;
use futures_util::future::{self, BoxFuture, Either, Ready};
use http::{HeaderValue, StatusCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// JSON-RPC code of "Session not found" (as the MCP SDKs answer it; its home is `mcp::errors`).
pub use crate::mcp::errors::SESSION_NOT_FOUND;

/// Builds [`SessionGuard`]s over the shared session table.
#[derive(Clone)]
pub struct SessionGuardLayer {
    sessions: Arc<Sessions>,
    authenticated: bool,
    deferred: Option<Deferred>,
    hand_down: HandDown,
}

/// What deferring a DELETE needs: the registry's live-task counts, and how many wait.
#[derive(Clone)]
struct Deferred {
    registry: Arc<Registry>,
    waiting: Arc<AtomicUsize>,
}

/// DELETEs waiting for their owner's live tasks at most.
const MAX_DEFERRED: usize = 10_000;

impl SessionGuardLayer {
    /// `authenticated`: callers carry principals (`[auth] mode` other than `none`).
    pub fn new(sessions: Arc<Sessions>, authenticated: bool) -> SessionGuardLayer {
        SessionGuardLayer {
            sessions,
            authenticated,
            deferred: None,
            hand_down: HandDown::Every,
        }
    }

    /// Which requests get the `SessionView` (every one unless told otherwise).
    pub fn hand_down(mut self, hand_down: HandDown) -> SessionGuardLayer {
        self.hand_down = hand_down;
        self
    }

    /// Defers a session's DELETE while its owner has live tasks in `registry` (module docs).
    pub fn defer_deletes(mut self, registry: Arc<Registry>) -> SessionGuardLayer {
        self.deferred = Some(Deferred {
            registry,
            waiting: Arc::default(),
        });
        self
    }
}

impl<S> tower::Layer<S> for SessionGuardLayer {
    type Service = SessionGuard<S>;
    fn layer(&self, inner: S) -> SessionGuard<S> {
        SessionGuard {
            inner,
            sessions: self.sessions.clone(),
            authenticated: self.authenticated,
            deferred: self.deferred.clone(),
            hand_down: self.hand_down,
        }
    }
}

/// The `session_guard` layer's service (see the module docs).
#[derive(Clone)]
pub struct SessionGuard<S> {
    inner: S,
    sessions: Arc<Sessions>,
    authenticated: bool,
    deferred: Option<Deferred>,
    hand_down: HandDown,
}

/// `error` under `id`: sessions are the 2025-11-25 transport's, refused at the HTTP level
/// (404 unknown, 503 full, 500 store failure).
fn local(id: Option<&Id>, error: McpError) -> McpReply {
    McpReply::error(Era::Legacy, id, &error)
}

/// What [`SessionGuard::check`] decided for a request.
enum Checked {
    /// It goes on.
    Pass,
    /// It is answered here.
    Refuse(McpReply),
    /// Its session must be read from the store first (not in the table, or due for a re-read).
    LookUp,
}

impl<S> SessionGuard<S> {
    /// Whether `req` goes on, is answered here, or needs its session read from the store
    /// (`looked_up`: it was, so never again); drops a session id from an initialize.
    fn check(&self, req: &mut McpRequest, looked_up: bool) -> Checked {
        if req.request_method() == Some("initialize") {
            req.ctx.session_id = None;
            req.ctx.client_session_id = None;
            if !self.sessions.has_room(&req.ctx.tenant()) {
                return Checked::Refuse(local(req.id(), McpError::SessionsFull));
            }
            return Checked::Pass;
        }
        let Some(session) = req.ctx.client_session_id.as_ref() else {
            return Checked::Pass;
        };
        let hand_down = self.hand_down;
        let (access, view) =
            self.sessions
                .access_view(&req.ctx.upstream, session, &req.ctx.principal, |held| {
                    hand_down.wants(req, held)
                });
        let access_is_due = matches!(access, Access::Recheck(_));
        let refuse = match access {
            Access::Owner(version) | Access::Recheck(version) => {
                if access_is_due {
                    // Served from the table; the shared store is asked again in the background.
                    let sessions = self.sessions.clone();
                    let (upstream, session) = (req.ctx.upstream.clone(), session.clone());
                    tokio::spawn(async move {
                        sessions.recheck(&upstream, &session).await;
                    });
                }
                // What is known of the session goes down with the request (`SessionView`).
                if let Some(view) = view {
                    req.extensions.insert(view);
                }
                // A request without `MCP-Protocol-Version` goes upstream with the negotiated one.
                // (`headers::has`, not a hashed `entry`: nearly every request has the header.)
                let version_name = &crate::headers::MCP_PROTOCOL_VERSION;
                if let Some(v) = version {
                    if !crate::headers::has(&req.ctx.headers, version_name) {
                        req.ctx.headers.insert(version_name, v);
                    }
                }
                false
            }
            Access::Foreign => true,
            Access::Unknown
                if !looked_up && self.sessions.may_look_up(&req.ctx.upstream, session) =>
            {
                return Checked::LookUp;
            }
            Access::Unknown => self.authenticated || is_held_form(session.as_bytes()),
        };
        if refuse {
            return Checked::Refuse(local(req.id(), McpError::SessionNotFound));
        }
        Checked::Pass
    }
}

impl<S> SessionGuard<S>
where
    S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    /// Answers a DELETE itself and sends it upstream later, when the owner has live tasks. The
    /// answer waits until the session is gone from the table and from the store (a stored
    /// session still in the store would be looked up and revived by the client's next request:
    /// its session must have ended when the 200 arrives). One task of its own forgets the
    /// session, waits for the owner's live tasks, and sends the DELETE, so a client that goes
    /// away before its answer changes none of that.
    fn defer_delete(&self, req: &McpRequest) -> Option<BoxFuture<'static, McpReply>> {
        let deferred = self.deferred.as_ref()?;
        if !matches!(req.op, Operation::EndSession) {
            return None;
        }
        let session = req.ctx.client_session_id.clone()?;
        let owner = req.ctx.caller().owner();
        let upstream = req.ctx.upstream.clone();
        let live = deferred.registry.owners_count(&upstream, &owner);
        if live == 0 || deferred.waiting.fetch_add(1, Ordering::SeqCst) >= MAX_DEFERRED {
            if live > 0 {
                deferred.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            return None;
        }
        tracing::info!(upstream = %upstream, live, "session DELETE deferred until the owner's live tasks end");
        let (registry, waiting) = (deferred.registry.clone(), deferred.waiting.clone());
        let give_up = Duration::from_millis(registry.config().max_ttl_ms);
        let mut inner = self.inner.clone();
        let sessions = self.sessions.clone();
        let later = req.ctx.clone();
        let (forgotten, answer) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            sessions
                .forget_ended(&upstream, Some(&SessionKey::Session(session)))
                .await;
            let _ = forgotten.send(());
            let started = tokio::time::Instant::now();
            while registry.owners_count(&upstream, &owner) > 0 && started.elapsed() < give_up {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let _ = end_session(&mut inner, later).await;
            waiting.fetch_sub(1, Ordering::SeqCst);
        });
        Some(Box::pin(async move {
            let _ = answer.await;
            let mut reply = McpReply::accepted();
            reply.status = StatusCode::OK;
            reply
        }))
    }
}

impl<S> tower::Service<McpRequest> for SessionGuard<S>
where
    S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = McpReply;
    type Error = S::Error;
    /// The request's own future, a local answer, or (a session to read from the store first)
    /// a boxed one.
    type Future = Either<
        Either<S::Future, Ready<Result<McpReply, S::Error>>>,
        BoxFuture<'static, Result<McpReply, S::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        match self.check(&mut req, false) {
            Checked::Pass => {}
            Checked::Refuse(reply) => return Either::Left(Either::Right(future::ready(Ok(reply)))),
            Checked::LookUp => return Either::Right(self.look_up(req)),
        }
        match self.defer_delete(&req) {
            Some(answer) => Either::Right(Box::pin(async move { Ok(answer.await) })),
            None => Either::Left(Either::Left(self.inner.call(req))),
        }
    }
}

impl<S> SessionGuard<S>
where
    S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    /// `req`'s session read from the store (brought back, re-read, or found absent), then the
    /// checks again (module docs).
    fn look_up(&mut self, mut req: McpRequest) -> BoxFuture<'static, Result<McpReply, S::Error>> {
        // The ready service goes with the request; this one keeps a clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let mut this = SessionGuard {
            inner,
            sessions: self.sessions.clone(),
            authenticated: self.authenticated,
            deferred: self.deferred.clone(),
            hand_down: self.hand_down,
        };
        Box::pin(async move {
            let session = req
                .ctx
                .client_session_id
                .clone()
                .unwrap_or_else(|| HeaderValue::from_static(""));
            let revived = this
                .sessions
                .revive(&req.ctx.upstream, &session, req.ctx.tenant())
                .await;
            // Where an unknown id would be refused (with authentication, or a held form), a
            // session the store does not give is refused; otherwise it goes on as unknown.
            let refuses_unknown = this.authenticated || is_held_form(session.as_bytes());
            let refused = match revived {
                Revived::InTable | Revived::NotStored => None,
                Revived::NoRoom => Some(McpError::SessionsFull),
                Revived::Failed if refuses_unknown => Some(McpError::SessionStore { write: false }),
                Revived::Failed => None,
            };
            if let Some(error) = refused {
                return Ok(local(req.id(), error));
            }
            match this.check(&mut req, true) {
                Checked::Refuse(reply) => return Ok(reply),
                Checked::Pass | Checked::LookUp => {}
            }
            match this.defer_delete(&req) {
                Some(answer) => Ok(answer.await),
                None => this.inner.call(req).await,
            }
        })
    }
}

//! The `session` layer's tower `Layer`/`Service`: it fills the [`Sessions`] table as
//! `initialize` and `DELETE` pass, and hands the [`SessionView`] down (see the parent module).

use super::*;
use crate::exchange::{RequestContext, RequestParts};
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use futures_util::future::Either;

/// Builds [`SessionService`]s over a shared [`Sessions`] table.
#[derive(Clone)]
pub struct SessionLayer {
    sessions: Arc<Sessions>,
    hand_down: HandDown,
}

impl SessionLayer {
    /// A layer filling `sessions`, handing the view down on every request.
    pub fn new(sessions: Arc<Sessions>) -> SessionLayer {
        SessionLayer {
            sessions,
            hand_down: HandDown::Every,
        }
    }

    /// Which requests get the `SessionView` (as `session_guard`'s).
    pub fn hand_down(mut self, hand_down: HandDown) -> SessionLayer {
        self.hand_down = hand_down;
        self
    }
}

impl<S> tower::Layer<S> for SessionLayer {
    type Service = SessionService<S>;
    fn layer(&self, inner: S) -> SessionService<S> {
        SessionService {
            inner,
            sessions: self.sessions.clone(),
            hand_down: self.hand_down,
        }
    }
}

/// The `session` layer's service (see the module docs).
#[derive(Clone)]
pub struct SessionService<S> {
    inner: S,
    sessions: Arc<Sessions>,
    hand_down: HandDown,
}

impl<S> tower::Service<McpRequest> for SessionService<S>
where
    S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = McpReply;
    type Error = S::Error;
    /// The inner service's own future (any request but `initialize` and `DELETE`: the reply
    /// passes untouched); a boxed one for those two, whose answers may be written to the store.
    type Future =
        Either<S::Future, Pin<Box<dyn Future<Output = Result<McpReply, S::Error>> + Send>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        let legacy = req.era() == crate::mcp::era::Era::Legacy;
        let watch = match (&req.op, req.request_method()) {
            (Operation::Post(msg), Some("initialize")) => {
                // Only `params`, where the edge's parse found it: not the whole message.
                let params = msg
                    .params()
                    .and_then(|p| serde_json::from_str::<Value>(p).ok());
                let caps = params.as_ref().and_then(|p| p.get("capabilities").cloned());
                Watch::Initialize(caps.unwrap_or(Value::Null), params)
            }
            (Operation::EndSession, _) => Watch::End,
            _ => {
                self.hand_down_view(&mut req, legacy);
                // Nothing to learn from the reply.
                return Either::Left(self.inner.call(req));
            }
        };
        // What a refused session's `DELETE` is sent with (see `issued`): initialize only.
        let end_ctx = matches!(watch, Watch::Initialize(..)).then(|| req.ctx.clone());
        let finish = Finish {
            sessions: self.sessions.clone(),
            upstream: req.ctx.upstream.clone(),
            principal: req.ctx.principal.clone(),
            tenant: req.ctx.tenant(),
            has_identity: req.ctx.client_session_id.is_some()
                || matches!(req.ctx.principal, Principal::Token(_)),
            session: session_key(&req.ctx),
            watch,
            id: req.id().cloned(),
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Either::Right(Box::pin(async move {
            let reply = inner.call(req).await?;
            Ok(finish.settle(reply, inner, end_ctx).await)
        }))
    }
}

impl<S> SessionService<S> {
    /// Hands down what is known of the session of a request that is neither `initialize` nor
    /// `DELETE`: `session_guard` handed down the view of a session the request names; a 2025
    /// request without one (`legacy`) is looked up here (under its principal, or the upstream's
    /// facts), and a 2025 `tasks/*` request to an upstream whose session declared no tasks is
    /// marked [`UpstreamWithoutTasks`](crate::layers::extensions::UpstreamWithoutTasks).
    fn hand_down_view(&self, req: &mut McpRequest, legacy: bool) {
        // (An entry without a session id is never a held session.)
        if legacy && req.ctx.client_session_id.is_none() && self.hand_down.wants(&req, false) {
            let key = session_key(&req.ctx);
            if let Some(view) = self.sessions.view(&req.ctx.upstream, key.as_ref()) {
                req.extensions.insert(view);
            }
        }
        let without_tasks = legacy
            && req
                .request_method()
                .is_some_and(|m| m.starts_with("tasks/"))
            && req
                .extensions
                .get::<SessionView>()
                .is_some_and(|v| v.upstream_without_tasks);
        if without_tasks {
            req.extensions
                .insert(crate::layers::extensions::UpstreamWithoutTasks);
        }
    }
}

impl Finish {
    /// An `initialize` or `DELETE` answer (`reply`) once what it says is in the table and the
    /// store: a held session's answer stored (`store_held`), an ended session forgotten, an
    /// upstream-issued session stored before its id goes on (`issued`; a refusal replaces the
    /// answer and ends that session upstream through `inner`, with `end_ctx`).
    async fn settle<S>(
        self,
        mut reply: McpReply,
        inner: S,
        end_ctx: Option<RequestContext>,
    ) -> McpReply
    where
        S: tower::Service<McpRequest, Response = McpReply> + Send + 'static,
        S::Future: Send + 'static,
    {
        let held = reply.extensions.remove::<HeldAnswer>().is_some();
        let Finish {
            sessions,
            upstream,
            principal,
            tenant,
            watch,
            session,
            ..
        } = &self;
        if held {
            let answered = match &reply.body {
                ReplyBody::Json(bytes) => Some(bytes.clone()),
                _ => None,
            };
            let issued = reply
                .headers
                .get("mcp-session-id")
                .and_then(|h| HeaderValue::from_bytes(h.as_bytes()).ok());
            if let Some(refused) = store_held(
                sessions,
                upstream,
                (principal, tenant),
                watch,
                answered,
                issued,
            )
            .await
            {
                return refused;
            }
        }
        if let Watch::End = watch {
            // Forgotten once the upstream ended it (or does not know it); a held session
            // leaves the store before the answer goes on.
            if reply.status.is_success() || reply.status == http::StatusCode::NOT_FOUND {
                sessions.forget_ended(upstream, session.as_ref()).await;
            }
            return reply;
        }
        // A session the upstream issued is stored before its id goes on (`issued`).
        if !held && sessions.keeps_store() && matches!(watch, Watch::Initialize(..)) {
            let issued = crate::headers::find(&reply.headers, &crate::headers::MCP_SESSION_ID)
                .map(crate::headers::owned);
            if let Some(issued) = issued {
                return match self.store_issued(reply, issued.clone()).await {
                    Issued::Answer(reply) => reply,
                    Issued::Refused(refused) => {
                        if let Some(ctx) = end_ctx {
                            end_refused(inner, ctx, issued);
                        }
                        refused
                    }
                };
            }
        }
        self.reply(reply, held)
    }
}

/// Ends upstream the session of an `initialize` answer the client was refused (`issued`,
/// see `issued`): one `DELETE` naming it, sent by a task of its own through the layers below
/// (as the client's own `DELETE` would go), its answer only logged.
fn end_refused<S>(mut inner: S, mut ctx: RequestContext, issued: HeaderValue)
where
    S: tower::Service<McpRequest, Response = McpReply> + Send + 'static,
    S::Future: Send + 'static,
{
    ctx.session_id = Some(issued.clone());
    ctx.client_session_id = Some(issued);
    let upstream = ctx.upstream.clone();
    tokio::spawn(async move {
        match end_session(&mut inner, ctx).await {
            // 2xx: ended; 404: the upstream no longer knows it, which is as good.
            Ok(reply)
                if reply.status.is_success() || reply.status == http::StatusCode::NOT_FOUND =>
            {
                tracing::info!(upstream = %upstream, status = reply.status.as_u16(), "the upstream session of a refused initialize was ended (DELETE)")
            }
            // 405: the upstream does not let clients end sessions (2025-11-25 basic/transports).
            Ok(reply) => {
                tracing::warn!(upstream = %upstream, status = reply.status.as_u16(), "the upstream did not end the session of a refused initialize (DELETE answered with this status)")
            }
            Err(_) => {
                tracing::warn!(upstream = %upstream, "the upstream session of a refused initialize could not be ended (DELETE)")
            }
        }
    });
}

/// Sends `DELETE` for the session `ctx` names (`ctx.session_id`) through `inner`, once it is
/// ready: how taskgate ends an upstream session the client did not end itself (a refused
/// `initialize`'s, see `issued`; a `DELETE` `session_guard` deferred while the owner had live
/// tasks).
pub(crate) async fn end_session<S>(inner: &mut S, ctx: RequestContext) -> Result<McpReply, S::Error>
where
    S: tower::Service<McpRequest, Response = McpReply>,
{
    futures_util::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    inner
        .call(McpRequest::from(RequestParts {
            op: Operation::EndSession,
            ctx,
            extensions: http::Extensions::new(),
            trace: None,
        }))
        .await
}

/// What became of an `initialize` answer naming an upstream session ([`Finish::store_issued`]).
pub(super) enum Issued {
    /// The answer goes on: the session is kept (or there was none to keep).
    Answer(McpReply),
    /// The session could not be kept: the client gets this refusal instead of the answer, and
    /// the upstream session must be ended (its id is the one the refused answer named).
    Refused(McpReply),
}

/// What the `session` layer reads from an `initialize` answer as it passes (the session, its
/// capabilities), once any store write is done.
pub(super) struct Finish {
    pub(super) sessions: Arc<Sessions>,
    pub(super) upstream: Arc<str>,
    pub(super) principal: Principal,
    pub(super) tenant: Tenant,
    has_identity: bool,
    session: Option<SessionKey>,
    pub(super) watch: Watch,
    pub(super) id: Option<Id>,
}

impl Finish {
    /// `reply` with its messages observed; `held`: the upstream answer came from a session
    /// taskgate holds (its `initialize` answer was recorded by `store_held`).
    pub(super) fn reply(self, mut reply: McpReply, held: bool) -> McpReply {
        let Finish {
            sessions,
            upstream,
            principal,
            tenant,
            has_identity,
            session,
            watch,
            id,
        } = self;
        // A copy: a clone would be a slice of hyper's whole read buffer (kilobytes), kept
        // alive as long as the entry.
        let issued = crate::headers::find(&reply.headers, &crate::headers::MCP_SESSION_ID)
            .map(crate::headers::owned);
        // Without a session or a principal every client shares one entry: keep the
        // upstream's facts there, never one client's capabilities.
        let keep_client_caps = has_identity || issued.is_some();
        let reply_session = issued.map(SessionKey::Session).or(session);
        let Watch::Initialize(caps, _) = watch else {
            return reply;
        };
        let observe = move |bytes: &[u8]| {
            let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            if v.get("id").and_then(Id::from_value).as_ref() != id.as_ref() {
                return;
            }
            if let Some(result) = v.get("result") {
                sessions.insert(
                    &upstream,
                    reply_session.clone(),
                    (principal.clone(), tenant.clone()),
                    keep_client_caps.then_some(&caps),
                    Some(result),
                    None,
                );
            }
        };
        // A held session's `initialize` answer was recorded by `store_held`, once.
        if !held || matches!(reply.body, ReplyBody::Stream(_)) {
            reply.body = reply.body.map_messages(move |data| {
                observe(data.as_bytes());
                None
            });
        }
        reply
    }
}

pub(super) enum Watch {
    /// The client's capabilities, and the whole `params` (for a held session).
    Initialize(Value, Option<Value>),
    End,
}

/// A held session's `initialize` answer (taskgate minted the session, see `held_sessions`) is
/// stored, in the table and in the registry's store (durably), before the client sees its id:
/// when the table has no room (concurrent `initialize`s past the `has_room` check), the client
/// gets 503 instead of an id that would be 404 at once (found by review); when the store
/// cannot write it, 500 (an id that a restart would lose). `None`: stored (or nothing to
/// store), pass the reply on.
async fn store_held(
    sessions: &Sessions,
    upstream: &Arc<str>,
    (principal, tenant): (&Principal, &Tenant),
    watch: &Watch,
    answer: Option<bytes::Bytes>,
    issued: Option<HeaderValue>,
) -> Option<McpReply> {
    let (Watch::Initialize(caps, params), Some(bytes), Some(issued)) = (watch, answer, issued)
    else {
        return None;
    };
    let v = serde_json::from_slice::<Value>(&bytes).ok()?;
    let result = v.get("result")?;
    let key = SessionKey::Session(issued.clone());
    let stored = sessions.insert(
        upstream,
        Some(key.clone()),
        (principal.clone(), tenant.clone()),
        Some(caps),
        Some(result),
        Some(Arc::new(HeldSession::from_initialize(params.as_ref()))),
    );
    let id = v.get("id").and_then(Id::from_value);
    let refuse = |error: McpError| Some(McpReply::error(Era::Legacy, id.as_ref(), &error));
    if !stored {
        return refuse(McpError::SessionsFull);
    }
    if let Err(e) = sessions.store_entry(upstream, &issued).await {
        crate::store::log_failure(&e, "a held session could not be written to the store");
        sessions.forget(upstream, Some(&key));
        return refuse(McpError::SessionStore { write: true });
    }
    None
}

//! The `upgrade` layer's tool cache: per session, the `execution.taskSupport` of every tool the
//! upstream listed, learned from the `tools/list` answers that pass through the layer (every
//! page; the client's own and the ones `upgrade` asks for itself) and emptied by
//! `notifications/tools/list_changed` from the upstream, wherever it comes (2025-11-25
//! server/tools: taskSupport, list changed).
//!
//! A session is named by the [`SessionTag`] of the [`SessionView`] the session stage hands
//! down: only a session taskgate holds gets a cache (a client-chosen session id creates no
//! state), and no session table is read. Memory: a cache equal to the upstream's last complete
//! listing is shared, not copied (one copy of an upstream's tools for every session that
//! listed the same), and an entry is two pointers. Bound: entries of sessions that ended
//! (DELETE, reclaimed, initialized again under the same key) are swept once the map holds
//! twice as many as were live at the last sweep (at least [`SWEEP_FLOOR`]), so it holds at
//! most about twice the session table's `gateway.max_sessions`.
//!
//! [`Watched`] is the inner service as `upgrade` sees it: every request it sends down (the
//! client's, and its own for that client, which carry the client's session) has its reply read
//! as it passes, in order, with no copy of the messages.

use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::layers::after::{AfterReply, ReplyStep};
use crate::layers::extensions::{SessionTag, SessionView};
use crate::mcp::needles;
use crate::mcp::tools::TaskSupport;

use futures_util::future::Either;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A session's tools: tool name → `taskSupport`.
pub type ToolMap = HashMap<Box<str>, TaskSupport>;

/// Entries below which ended sessions are not swept.
pub const SWEEP_FLOOR: usize = 64;

/// One upstream's tool caches, per session.
#[derive(Default)]
pub struct ToolCache {
    caches: Mutex<Caches>,
}

#[derive(Default)]
struct Caches {
    by_session: HashMap<SessionTag, Arc<ToolMap>>,
    /// The tools of the last complete listing, shared by equal caches.
    shared: Option<Arc<ToolMap>>,
    /// Entries after the last sweep.
    kept: usize,
}

impl ToolCache {
    /// The cached `taskSupport` of `tool` in `session` (none once the session ended).
    pub fn support(&self, session: &SessionTag, tool: &str) -> Option<TaskSupport> {
        if session.ended() {
            return None;
        }
        self.caches
            .lock()
            .by_session
            .get(session)?
            .get(tool)
            .copied()
    }

    /// Records the tools of one `tools/list` result page in `session`'s cache.
    pub fn record(&self, session: &SessionTag, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        if session.ended() {
            return;
        }
        let complete = result.get("nextCursor").is_none();
        let mut guard = self.caches.lock();
        let caches = &mut *guard;
        caches.sweep_if_due();
        let cache = caches.by_session.entry(session.clone()).or_default();
        let map = Arc::make_mut(cache);
        for tool in tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                map.insert(name.into(), TaskSupport::of(tool));
            }
        }
        match &caches.shared {
            Some(shared) if **shared == **cache => *cache = shared.clone(),
            _ if complete => caches.shared = Some(cache.clone()),
            _ => {}
        }
    }

    /// The upstream said its tools changed (on `session`'s streams): `session`'s cache and the
    /// shared listing are emptied.
    pub fn changed(&self, session: &SessionTag) {
        let mut caches = self.caches.lock();
        caches.shared = None;
        if let Some(cache) = caches.by_session.get_mut(session) {
            *cache = Arc::default();
        }
    }

    /// Sessions with a cache (ended ones not yet swept included).
    pub fn len(&self) -> usize {
        self.caches.lock().by_session.len()
    }

    /// Whether no session has a cache.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Caches {
    fn sweep_if_due(&mut self) {
        if self.by_session.len() < 2 * self.kept.max(SWEEP_FLOOR) {
            return;
        }
        self.by_session.retain(|session, _| !session.ended());
        self.kept = self.by_session.len();
    }
}

/// The service below `upgrade`, reading the replies of a known session's requests into the
/// [`ToolCache`] (none when upgrading is off: nothing reads it then).
#[derive(Clone)]
pub struct Watched<S> {
    inner: S,
    cache: Option<Arc<ToolCache>>,
    /// The client's session, for the requests `upgrade` sends itself for that client.
    session: Option<SessionView>,
}

impl<S> Watched<S> {
    /// `inner`, its replies read into `cache`.
    pub(super) fn new(inner: S, cache: Option<Arc<ToolCache>>) -> Watched<S> {
        Watched {
            inner,
            cache,
            session: None,
        }
    }

    /// This service for `upgrade`'s own requests on behalf of a client whose session is
    /// `session`: they carry it down (the layers below read it as the client's).
    pub(super) fn on_behalf_of(mut self, session: Option<&SessionView>) -> Watched<S> {
        self.session = session.cloned();
        self
    }
}

impl<S> tower::Service<McpRequest> for Watched<S>
where
    S: tower::Service<McpRequest, Response = McpReply>,
{
    type Response = McpReply;
    type Error = S::Error;
    /// The inner future, with `Learn` applied to the reply of a known session's request.
    type Future = Either<S::Future, AfterReply<S::Future, Learn>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        let Some(cache) = &self.cache else {
            return Either::Left(self.inner.call(req));
        };
        if let Some(view) = &self.session {
            if req.extensions.get::<SessionView>().is_none() {
                req.extensions.insert(view.clone());
            }
        }
        let Some(session) = req
            .extensions
            .get::<SessionView>()
            .map(|v| v.session.clone())
        else {
            return Either::Left(self.inner.call(req));
        };
        let learn = Learn {
            cache: cache.clone(),
            session,
            tools_list: req.request_method() == Some("tools/list"),
        };
        Either::Right(AfterReply::new(self.inner.call(req), learn))
    }
}

/// What the tool cache learns from one reply, as its messages pass.
#[doc(hidden)]
pub struct Learn {
    cache: Arc<ToolCache>,
    session: SessionTag,
    /// The reply answers a `tools/list`: its result is recorded.
    tools_list: bool,
}

impl<E> ReplyStep<E> for Learn {
    fn apply(self, reply: McpReply) -> Result<McpReply, E> {
        Ok(self.pass(reply))
    }
}

impl Learn {
    /// The reply as it goes on (see [`ReplyStep`]).
    fn pass(self, mut reply: McpReply) -> McpReply {
        // A JSON answer is the one response: only a tools/list answer matters; a stream may
        // carry `notifications/tools/list_changed`.
        if !self.tools_list && !matches!(reply.body, ReplyBody::Stream(_)) {
            return reply;
        }
        reply.body = reply.body.map_messages(move |data| {
            self.observe(data.as_bytes());
            None
        });
        reply
    }
}

impl Learn {
    fn observe(&self, bytes: &[u8]) {
        if self.tools_list && needles::found(&needles::TOOLS_KEY, bytes) {
            if let Some(result) = serde_json::from_slice::<Value>(bytes)
                .ok()
                .as_ref()
                .and_then(|v| v.get("result"))
            {
                self.cache.record(&self.session, result);
            }
        }
        if needles::found(&needles::TOOLS_LIST_CHANGED, bytes) {
            if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
                if v.get("method").and_then(Value::as_str)
                    == Some("notifications/tools/list_changed")
                {
                    self.cache.changed(&self.session);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpgradeConfig;
    use crate::exchange::GatewayError;
    use crate::layers::extensions::SessionLife;
    use crate::layers::session::{SessionKey, SessionLayer, Sessions};
    use crate::layers::session_guard::SessionGuardLayer;
    use crate::layers::testing::{registry, request};
    use crate::layers::upgrade::{UpgradeLayer, UpgradeState};
    use http::HeaderValue;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};

    fn tag_of(life: &SessionLife) -> SessionTag {
        life.tag()
    }

    /// Moved from the session table's tests with the cache (issue 30).
    #[test]
    fn equal_tool_caches_are_shared() {
        let cache = ToolCache::default();
        let lives = [SessionLife::new(), SessionLife::new()];
        let result = serde_json::json!({"tools":[{"name":"a"},{"name":"b","execution":{"taskSupport":"optional"}}]});
        for life in &lives {
            cache.record(&tag_of(life), &result);
        }
        let caches = cache.caches.lock();
        let a = &caches.by_session[&tag_of(&lives[0])];
        let b = &caches.by_session[&tag_of(&lives[1])];
        assert!(Arc::ptr_eq(a, b), "one copy of an upstream's tool list");
    }

    /// Every page is kept; `notifications/tools/list_changed` empties the session's cache; a
    /// session that ended answers nothing and its entry is swept, so ended sessions never grow
    /// the map past twice the live ones.
    #[test]
    fn pages_add_up_list_changed_empties_and_ended_sessions_are_swept() {
        let cache = ToolCache::default();
        let life = SessionLife::new();
        let tag = life.tag();
        cache.record(
            &tag,
            &serde_json::json!({"tools":[{"name":"a","execution":{"taskSupport":"required"}}],"nextCursor":"2"}),
        );
        cache.record(&tag, &serde_json::json!({"tools":[{"name":"b"}]}));
        assert_eq!(cache.support(&tag, "a"), Some(TaskSupport::Required));
        assert_eq!(cache.support(&tag, "b"), Some(TaskSupport::Forbidden));
        cache.changed(&tag);
        assert_eq!(cache.support(&tag, "a"), None);
        cache.record(&tag, &serde_json::json!({"tools":[{"name":"a"}]}));
        drop(life);
        assert_eq!(cache.support(&tag, "a"), None, "the session ended");
        cache.record(&tag, &serde_json::json!({"tools":[{"name":"a"}]}));
        let live: Vec<SessionLife> = (0..10).map(|_| SessionLife::new()).collect();
        for round in 0..1000 {
            let gone = SessionLife::new();
            cache.record(&gone.tag(), &serde_json::json!({"tools":[{"name":"x"}]}));
            let keep = &live[round % live.len()];
            cache.record(&keep.tag(), &serde_json::json!({"tools":[{"name":"y"}]}));
        }
        assert!(
            cache.len() <= 2 * SWEEP_FLOOR,
            "{} entries for 10 live sessions",
            cache.len()
        );
        assert_eq!(
            cache.support(&live[3].tag(), "y"),
            Some(TaskSupport::Forbidden)
        );
    }

    /// The session stage above, `upgrade` enabled, over an upstream answering `initialize`
    /// with session `issued-<n>` (declaring `tasks.requests.tools.call`) and anything else with
    /// a `tools/list` result naming one `required` tool.
    fn stack(
        sessions: Arc<Sessions>,
        state: Arc<UpgradeState>,
    ) -> impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Clone {
        let upstream = crate::layers::testing::issuing_upstream();
        let inner = UpgradeLayer::new(state).layer(upstream);
        let inner = SessionLayer::new(sessions.clone()).layer(inner);
        SessionGuardLayer::new(sessions, false).layer(inner)
    }

    fn with_session(json: &str, sid: Option<&str>) -> McpRequest {
        let mut req = request(json);
        let sid = sid.map(|s| HeaderValue::from_str(s).unwrap());
        req.ctx.session_id = sid.clone();
        req.ctx.client_session_id = sid;
        req
    }

    /// A kept session's `tools/list` answer fills its tool cache (moved from the session
    /// table's tests: `upgrade` owns the cache); a client-chosen session id gets none.
    #[tokio::test]
    async fn a_known_sessions_tools_list_fills_the_cache() {
        let sessions = Sessions::with_limits(3, Duration::from_secs(3600));
        let config = UpgradeConfig {
            enabled: true,
            ..UpgradeConfig::default()
        };
        let state = UpgradeState::new(registry().0, config, Duration::from_secs(5));
        let svc = stack(sessions.clone(), state.clone());
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#;
        let reply = svc.clone().oneshot(with_session(init, None)).await.unwrap();
        assert_eq!(reply.status, 200);
        let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        for i in 0..100 {
            let random = format!("random-{i}");
            let _ = svc.clone().oneshot(with_session(list, Some(&random))).await;
        }
        assert!(state.tools.is_empty(), "no cache for unknown sessions");
        let reply = svc
            .clone()
            .oneshot(with_session(list, Some("issued-0")))
            .await
            .unwrap();
        // A client without capabilities.tasks sees the tool as optional; the cache keeps what
        // the upstream said.
        assert!(String::from_utf8_lossy(&match reply.body {
            ReplyBody::Json(b) => b,
            other => panic!("{other:?}"),
        })
        .contains("\"optional\""));
        let key = SessionKey::Session(HeaderValue::from_static("issued-0"));
        let tag = sessions
            .get(&"up".into(), Some(&key))
            .expect("issued session known")
            .view()
            .session;
        assert_eq!(state.tools.support(&tag, "t"), Some(TaskSupport::Required));
        sessions.forget(&"up".into(), Some(&key));
        assert_eq!(
            state.tools.support(&tag, "t"),
            None,
            "forgotten with the session"
        );
    }
}

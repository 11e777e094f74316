//! The 2025-11-25 upstream sessions taskgate holds for stateless 2026-07-28 clients of a
//! 2025-11-25-only upstream (a session concern: what the reverse bridge sends each request on).
//!
//! **One session per caller's tenant** ([`Tenant`]): per authenticated principal with `[auth]`,
//! per client address (IPv6: its /64) without. Why:
//! - with auth, one principal's requests share one upstream session, and two principals never
//!   do. The 1.x SDKs scope what a session sees to that session (the Python SDK's task store,
//!   `tasks/list`, resource subscriptions, the logging level, notifications on the session's
//!   GET stream): per principal, the upstream's own scoping matches taskgate's owner binding,
//!   and one principal's tasks never show in another's upstream `tasks/list`.
//! - without auth, a 2026-07-28 request carries nothing that names its client but its address:
//!   per address keeps clients on different machines from sharing session state, without a
//!   session per request (an `initialize` per request would double the upstream's work and
//!   leave a session behind each time). It is not an owner binding (2026-07-28 without auth has
//!   none: the unguessable `taskId` is the key).
//! - taskgate's own requests (no caller) share one session ([`Tenant::Unknown`]).
//!
//! **Lifetime.** A session is opened by the first request that needs it (`initialize`, then
//! `notifications/initialized`), and kept while it is used or while a task created on it may
//! still be asked about: until the last such task's ttl ends ([`UpstreamSession::keep_for`]).
//! One idle for `gateway.session_idle_ms` with no task left is dropped (taskgate forgets it; the
//! upstream ends it on its own idle timeout). An upstream that answers a request on it with HTTP
//! 404 (the session ended upstream, 2025-11-25 transports) gets a new `initialize`; the old
//! id then routes to the new session ([`UpstreamSessions::replace`]), so requests about tasks
//! recorded on the old one go out on the new one (the TypeScript SDK 1.x store serves them
//! there; a server that scoped the task to the lost session answers "not found").
//!
//! **Pings** (2025-11-25 basic/utilities/ping): every held session is sent a `ping` each
//! [`ping_interval`] (`gateway.session_idle_ms` / 2, at most [`MAX_PING_INTERVAL`]), in the
//! context of the request that opened it, so an upstream that ends idle sessions keeps the ones
//! whose tasks a client may still ask about, and a session the upstream lost (404) is opened
//! again before a client needs it. A ping does not count as use: a session idle past its limit
//! with no live task is still forgotten.
//!
//! **Bounds**: at most [`MAX_UPSTREAM_SESSIONS`] sessions per upstream; past it the least
//! recently used one without live tasks is forgotten, and when every one has live tasks the
//! request is refused (`-32603`, "too many held upstream sessions"). At most
//! [`MAX_REPLACED`] old→new routes are kept (the oldest dropped first).

use crate::exchange::{RequestContext, Tenant};
use http::HeaderValue;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most upstream sessions held per upstream.
pub const MAX_UPSTREAM_SESSIONS: usize = 1024;
/// Most old→new session routes kept after re-initializations.
pub const MAX_REPLACED: usize = 4096;
/// Most tools of a `tools/list` kept per session (taskSupport lookups).
pub const MAX_TOOLS: usize = 4096;
/// The longest time between two pings of a held session.
pub const MAX_PING_INTERVAL: Duration = Duration::from_secs(30);

/// How often held sessions are pinged: half of `idle` (`gateway.session_idle_ms`), between
/// 100 ms and [`MAX_PING_INTERVAL`].
pub fn ping_interval(idle: Duration) -> Duration {
    (idle / 2).clamp(Duration::from_millis(100), MAX_PING_INTERVAL)
}

/// One 2025-11-25 session taskgate opened on the upstream.
#[derive(Debug)]
pub struct UpstreamSession {
    /// The upstream's `Mcp-Session-Id` (`None`: the upstream issued none, a stateless server).
    pub id: Option<HeaderValue>,
    /// The protocol version the session negotiated (sent as `MCP-Protocol-Version`).
    pub version: HeaderValue,
    /// The upstream's `InitializeResult`.
    pub init: Value,
    /// The last `tools/list` result seen on it (all pages, at most [`MAX_TOOLS`] tools).
    tools: Mutex<Option<Arc<Value>>>,
    /// Kept at least until then (the latest ttl end of a task created on it).
    keep_until: Mutex<Instant>,
    last_used: Mutex<Instant>,
    /// The context of the request that opened it (its upstream, headers and caller): what its
    /// pings are sent in.
    opened_in: Mutex<Option<RequestContext>>,
}

impl UpstreamSession {
    /// A session the upstream answered `init` to, under `id` at `version`.
    pub fn new(id: Option<HeaderValue>, version: HeaderValue, init: Value) -> UpstreamSession {
        let now = Instant::now();
        UpstreamSession {
            id,
            version,
            init,
            tools: Mutex::new(None),
            keep_until: Mutex::new(now),
            last_used: Mutex::new(now),
            opened_in: Mutex::new(None),
        }
    }

    /// Notes the context of the request that opened the session (see [`Self::opened_in`]).
    pub fn set_opened_in(&self, ctx: RequestContext) {
        *self.opened_in.lock() = Some(ctx);
    }

    /// The context of the request that opened the session, when noted.
    pub fn opened_in(&self) -> Option<RequestContext> {
        self.opened_in.lock().clone()
    }

    /// The session id as text (what a task record keeps), when it has one that is text.
    pub fn id_text(&self) -> Option<String> {
        self.id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// Keeps the session at least `ttl` from now (a task created on it lives that long).
    pub fn keep_for(&self, ttl: Duration) {
        let until = Instant::now() + ttl;
        let mut k = self.keep_until.lock();
        if until > *k {
            *k = until;
        }
    }

    /// The cached `tools/list` result.
    pub fn tools(&self) -> Option<Arc<Value>> {
        self.tools.lock().clone()
    }

    /// Caches a `tools/list` result (its `tools` cut to `MAX_TOOLS`).
    pub fn set_tools(&self, mut tools: Value) {
        if let Some(list) = tools.get_mut("tools").and_then(Value::as_array_mut) {
            list.truncate(MAX_TOOLS);
        }
        *self.tools.lock() = Some(Arc::new(tools));
    }

    fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    fn has_live_tasks(&self, now: Instant) -> bool {
        *self.keep_until.lock() > now
    }

    fn idle_since(&self) -> Instant {
        *self.last_used.lock()
    }
}

/// Old session id → the session that replaced it, and the old ids oldest first (for the bound).
type Replaced = (
    HashMap<HeaderValue, Arc<UpstreamSession>>,
    VecDeque<HeaderValue>,
);

/// The sessions held for one upstream (see the module docs).
pub struct UpstreamSessions {
    by_tenant: Mutex<HashMap<Tenant, Arc<UpstreamSession>>>,
    /// Old session id → the session that replaced it, oldest first for eviction.
    replaced: Mutex<Replaced>,
    /// Serialises the opening of sessions (two first requests open one session, not two).
    pub(super) opening: tokio::sync::Mutex<()>,
    idle: Duration,
}

/// Why no session could be kept.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl UpstreamSessions {
    /// An empty table; sessions idle for `idle` with no live task are forgotten.
    pub fn new(idle: Duration) -> UpstreamSessions {
        UpstreamSessions {
            by_tenant: Mutex::new(HashMap::new()),
            replaced: Mutex::new((HashMap::new(), VecDeque::new())),
            opening: tokio::sync::Mutex::new(()),
            idle,
        }
    }

    /// The session `tenant` uses, when one is held and not idle past its limit.
    pub fn get(&self, tenant: &Tenant) -> Option<Arc<UpstreamSession>> {
        let now = Instant::now();
        let mut table = self.by_tenant.lock();
        let s = table.get(tenant)?.clone();
        if now.duration_since(s.idle_since()) > self.idle && !s.has_live_tasks(now) {
            table.remove(tenant);
            return None;
        }
        s.touch();
        Some(s)
    }

    /// The sessions held now (those idle past the limit with no live task are forgotten here),
    /// without counting this as their use.
    pub fn held(&self) -> Vec<Arc<UpstreamSession>> {
        let now = Instant::now();
        let idle = self.idle;
        let mut table = self.by_tenant.lock();
        table.retain(|_, s| now.duration_since(s.idle_since()) <= idle || s.has_live_tasks(now));
        table.values().cloned().collect()
    }

    /// How often the held sessions are pinged (`ping_interval` of the idle limit).
    pub fn ping_every(&self) -> Duration {
        ping_interval(self.idle)
    }

    /// Keeps `session` as `tenant`'s. Errors: `Full` when [`MAX_UPSTREAM_SESSIONS`] are held
    /// and each has live tasks.
    pub fn insert(&self, tenant: Tenant, session: Arc<UpstreamSession>) -> Result<(), Full> {
        let now = Instant::now();
        let mut table = self.by_tenant.lock();
        if table.len() >= MAX_UPSTREAM_SESSIONS && !table.contains_key(&tenant) {
            let idle = self.idle;
            table
                .retain(|_, s| now.duration_since(s.idle_since()) <= idle || s.has_live_tasks(now));
            if table.len() >= MAX_UPSTREAM_SESSIONS {
                let oldest = table
                    .iter()
                    .filter(|(_, s)| !s.has_live_tasks(now))
                    .min_by_key(|(_, s)| s.idle_since())
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => {
                        table.remove(&k);
                    }
                    None => return Err(Full),
                }
            }
        }
        table.insert(tenant, session);
        Ok(())
    }

    /// Forgets `lost` (the upstream answered 404 on it) and routes its id to `new`, which
    /// becomes `tenant`'s session.
    pub fn replace(&self, tenant: &Tenant, lost: &UpstreamSession, new: Arc<UpstreamSession>) {
        {
            let mut table = self.by_tenant.lock();
            if table
                .get(tenant)
                .is_some_and(|s| s.id == lost.id && s.version == lost.version)
            {
                table.remove(tenant);
            }
        }
        // Whatever routed to the lost session goes to the new one.
        let keep = lost.keep_until.lock().to_owned();
        {
            let mut k = new.keep_until.lock();
            if keep > *k {
                *k = keep;
            }
        }
        if let Some(old) = lost.id.clone() {
            let mut r = self.replaced.lock();
            let (map, order) = &mut *r;
            for s in map.values_mut() {
                if s.id == lost.id {
                    *s = new.clone();
                }
            }
            if map.insert(old.clone(), new.clone()).is_none() {
                order.push_back(old);
            }
            while order.len() > MAX_REPLACED {
                if let Some(first) = order.pop_front() {
                    map.remove(&first);
                }
            }
        }
        let _ = self.insert(tenant.clone(), new);
    }

    /// The session a task recorded on upstream session `id` goes out on: the one that replaced
    /// it, or the held one with that id; `None` when taskgate holds neither (a restart: the
    /// caller sends on the recorded id and opens a new session on 404).
    pub fn route(&self, id: &HeaderValue) -> Option<Arc<UpstreamSession>> {
        if let Some(s) = self.replaced.lock().0.get(id) {
            return Some(s.clone());
        }
        self.by_tenant
            .lock()
            .values()
            .find(|s| s.id.as_ref() == Some(id))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session(id: &str) -> Arc<UpstreamSession> {
        Arc::new(UpstreamSession::new(
            Some(HeaderValue::from_str(id).unwrap()),
            HeaderValue::from_static("2025-11-25"),
            json!({}),
        ))
    }

    #[test]
    fn one_session_per_tenant_and_lost_ones_route_to_their_replacement() {
        let table = UpstreamSessions::new(Duration::from_secs(60));
        let alice = Tenant::Principal("alice".into());
        let bob = Tenant::Principal("bob".into());
        table.insert(alice.clone(), session("s1")).unwrap();
        table.insert(bob.clone(), session("s2")).unwrap();
        assert_eq!(table.get(&alice).unwrap().id_text().as_deref(), Some("s1"));
        let lost = table.get(&alice).unwrap();
        table.replace(&alice, &lost, session("s3"));
        assert_eq!(table.get(&alice).unwrap().id_text().as_deref(), Some("s3"));
        let s1 = HeaderValue::from_static("s1");
        assert_eq!(table.route(&s1).unwrap().id_text().as_deref(), Some("s3"));
        let s2 = HeaderValue::from_static("s2");
        assert_eq!(table.route(&s2).unwrap().id_text().as_deref(), Some("s2"));
        assert!(table.route(&HeaderValue::from_static("s9")).is_none());
    }

    #[test]
    fn idle_sessions_go_unless_a_task_lives_on_them() {
        let table = UpstreamSessions::new(Duration::ZERO);
        let a = Tenant::Unknown;
        table.insert(a.clone(), session("s1")).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        assert!(table.get(&a).is_none(), "idle past the limit");
        let kept = session("s2");
        kept.keep_for(Duration::from_secs(60));
        table.insert(a.clone(), kept).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        assert!(table.get(&a).is_some(), "a live task keeps it");
    }

    #[test]
    fn the_table_is_bounded_and_never_drops_a_session_with_live_tasks() {
        let table = UpstreamSessions::new(Duration::from_secs(60));
        for i in 0..MAX_UPSTREAM_SESSIONS {
            let s = session(&format!("s{i}"));
            s.keep_for(Duration::from_secs(60));
            table
                .insert(Tenant::Principal(format!("p{i}").into()), s)
                .unwrap();
        }
        let extra = Tenant::Principal("late".into());
        assert_eq!(table.insert(extra.clone(), session("x")), Err(Full));
        let _ = table.get(&Tenant::Principal("p0".into()));
        // One without live tasks can make room.
        table
            .by_tenant
            .lock()
            .insert(Tenant::Principal("p0".into()), session("s0"));
        assert_eq!(table.insert(extra, session("x")), Ok(()));
        assert_eq!(table.by_tenant.lock().len(), MAX_UPSTREAM_SESSIONS);
    }
}

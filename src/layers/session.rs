//! The `session` layer: what taskgate knows about each MCP session (2025-11-25 basic/lifecycle).
//!
//! Per `(upstream, Mcp-Session-Id)` it keeps the principal that initialized the session, the
//! client's capabilities that matter to taskgate (from the `initialize` request) and whether the
//! upstream declared `tasks.requests.tools.call` (from the `InitializeResult`), and hands them
//! down on each request of the session as the [`SessionView`] fact (`session_guard` on a
//! request naming its session, this layer on a 2025 request without one), so no layer below
//! reads the table. A DELETE the upstream accepted forgets the session. It changes no message.
//! The session stage is outermost: `upgrade`'s own requests do not pass it (`upgrade` keeps its
//! tool cache itself, per
//! [`SessionTag`](crate::layers::extensions::SessionTag)).
//!
//! Only sessions the upstream issued (an `Mcp-Session-Id` on an `InitializeResult`) get an entry:
//! a client-chosen session id creates no entry (only a store look-up, remembered as absent
//! for [`REVALIDATE_AFTER`] among at most `held_store::MAX_ABSENT` ids). A session the `bridge` holds itself (its
//! `initialize` answer carries the [`HeldAnswer`] reply fact, taken here) also keeps what the client declared
//! ([`HeldSession`], bounded), and is written to the registry's store before its id goes on
//! (see `held_store`: revived after a restart, removed when it ends, is reclaimed or expires). An entry is about 200 bytes plus its id (about
//! 1 KiB of RSS per session with the allocator, `benches/session_rss.py`). The table
//! holds at most `gateway.max_sessions` entries and is never trimmed by other callers' traffic:
//! when it is full, entries idle for `gateway.session_idle_ms` are reclaimed, and if none are,
//! a new `initialize` is refused (see `session_guard`).
//!
//! **One principal's share** (issue 29 #4): one principal (without auth, one client address:
//! [`Tenant`]) holds at most `limits.max_sessions_per_principal` sessions. Its new session past
//! that reclaims its own least recently used one (a held one leaves the store; its id then gets
//! 404 and the client initializes again), never another principal's. Reclaiming rather than
//! refusing: many clients never send `DELETE`, so a refusal would lock a principal out for
//! `gateway.session_idle_ms` (an hour by default) after enough ordinary reconnects, while the
//! session given up is one its own clients used least recently. So no principal can fill the
//! table: the others' `initialize`s keep succeeding. (This table only forgets a session; a
//! `per_session` stdio upstream applies the same share to its children itself, ending the
//! child of the principal's least recently used session: `upstream::stdio`.)

use crate::exchange::{McpReply, McpRequest, Operation, Principal, ReplyBody, Tenant};
use crate::jsonrpc::Id;
use crate::layers::extensions::{HeldAnswer, HeldSession, SessionLife, SessionView};
use crate::mcp::capabilities::ClientCapabilities;
use http::HeaderValue;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Default of `gateway.max_sessions`.
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;
/// Default of `gateway.session_idle_ms`.
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(3600);

/// What is known of one session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// The principal that initialized the session (its owner).
    pub owner: Principal,
    /// Whom the session counts against for `limits.max_sessions_per_principal`.
    tenant: Tenant,
    client_caps: ClientCapabilities,
    upstream_tasks_tools_call: bool,
    /// The upstream's `InitializeResult` had capabilities without `tasks`.
    upstream_without_tasks: bool,
    /// The session's life: its `SessionTag`s read as ended once the entry is gone (and the
    /// short-lived copies [`Sessions::get`] makes).
    life: SessionLife,
    /// The protocol version the session negotiated (`protocolVersion` of the `InitializeResult`).
    pub protocol_version: Option<HeaderValue>,
    /// Seconds since the table was made, at the last use.
    last_used: u32,
    /// A session taskgate holds itself (no upstream session; see `bridge`).
    pub held: Option<Arc<HeldSession>>,
    /// The session is in the registry's store (a held one, or one the upstream issued: see
    /// `held_store`); its id keeps working across a restart and on every replica.
    stored: bool,
    /// Seconds since the table was made, when a stored session's stored expiry was last set.
    stored_at: u32,
    /// Seconds since the table was made, when a stored session was last written to or read
    /// from a store other processes share (a tier): past [`REVALIDATE_AFTER`] it is read again
    /// before its next request is served.
    checked_at: u32,
}

impl SessionInfo {
    /// Whether the client declared `capabilities.tasks`.
    pub fn client_declares_tasks(&self) -> bool {
        self.client_caps.tasks()
    }

    /// Whether the client declared a top-level capability, by JSON pointer (`/elicitation`,
    /// `/sampling`, `/tasks`, `/roots`; other capabilities are not kept and read as absent).
    pub fn client_has(&self, pointer: &str) -> bool {
        self.client_caps.has(pointer)
    }

    /// Whether the upstream declared `tasks.requests.tools.call`.
    pub fn upstream_tasks_tools_call(&self) -> bool {
        self.upstream_tasks_tools_call
    }

    /// The fact handed down on the session's requests.
    pub fn view(&self) -> SessionView {
        SessionView {
            owner: self.owner.clone(),
            client: self.client_caps,
            upstream_tasks_tools_call: self.upstream_tasks_tools_call,
            upstream_without_tasks: self.upstream_without_tasks,
            session: self.life.tag(),
        }
    }
}

type Key = (Arc<str>, Option<SessionKey>);

/// Which requests the session stage hands the [`SessionView`] down on (set in `gateway`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HandDown {
    /// Every request of a session taskgate knows (what `upgrade` needs: it reads the view of
    /// every request, and its tool cache learns from every reply).
    #[default]
    Every,
    /// Every request but a plain `tools/call` (no `params.task`) of a session taskgate does not
    /// hold itself: with `[upgrade]` off no layer below reads the view of one (the `tasks` and
    /// `held_sessions` rules read it on `tasks/*`, task-augmented calls and held sessions'
    /// requests), and it is the most frequent request (the fact costs an allocation).
    AllButPlainCalls,
}

impl HandDown {
    /// Whether `req`, of a session taskgate holds itself (`held`) or not, gets the view.
    pub fn wants(self, req: &McpRequest, held: bool) -> bool {
        self == HandDown::Every || held || !is_plain_call(req)
    }
}

/// A `tools/call` without `params.task` (as the edge classified it).
fn is_plain_call(req: &McpRequest) -> bool {
    match &req.op {
        Operation::Post(msg) if req.request_method() == Some("tools/call") => {
            crate::mcp::classify::Classified::of(msg)
                .param("task")
                .is_none()
        }
        _ => false,
    }
}

/// The key of a caller's entry in the session table: its `Mcp-Session-Id`; without one (an
/// upstream without sessions), its bearer principal. Typed, so a client that sends
/// `Mcp-Session-Id: principal:alice` names a session, never alice's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionKey {
    /// The client's `Mcp-Session-Id`.
    Session(HeaderValue),
    /// A bearer principal calling an upstream that issues no sessions.
    Principal(Arc<str>),
}

/// One write, the key's text: the derived hash made four (the variant, the slice's length, the
/// bytes, `HeaderValue`'s sensitive flag), and every request naming a session hashes its key
/// (`Sessions::access_view`). Equal keys have equal texts, so equal hashes; a session and a
/// principal spelled alike only share a bucket.
impl std::hash::Hash for SessionKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            SessionKey::Session(id) => state.write(id.as_bytes()),
            SessionKey::Principal(p) => state.write(p.as_bytes()),
        }
    }
}

/// The table key of a session a request names, borrowed from the request: what
/// [`Sessions::access_view`] looks up on every request with a session, where a [`Key`] built
/// for it cost a clone and a drop of the upstream's name and of the session id. Hashes and
/// compares as `(upstream, Some(SessionKey::Session(id)))`.
struct SessionRef<'a> {
    upstream: &'a str,
    session: &'a [u8],
}

impl std::hash::Hash for SessionRef<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As the `Key` tuple: the name (`Arc<str>` hashes its `str`), `Some`'s discriminant,
        // then `SessionKey`'s own hash (the id's bytes).
        self.upstream.hash(state);
        Some(()).hash(state);
        state.write(self.session);
    }
}

impl hashbrown::Equivalent<Key> for SessionRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        *key.0 == *self.upstream
            && matches!(&key.1, Some(SessionKey::Session(id)) if id.as_bytes() == self.session)
    }
}

/// The session-table key of a caller (see [`SessionKey`]); without a session or a principal,
/// `None`, under which only the upstream's facts (capabilities, tools) are kept, never a client's.
pub fn session_key(ctx: &crate::exchange::RequestContext) -> Option<SessionKey> {
    match (&ctx.client_session_id, &ctx.principal) {
        (Some(s), _) => Some(SessionKey::Session(s.clone())),
        (None, Principal::Token(p)) => Some(SessionKey::Principal(p.clone())),
        (None, Principal::Anonymous) => None,
    }
}

/// Whether a caller may use a session id (see [`Sessions::access`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The session was issued through taskgate to this caller's principal; the protocol version
    /// it negotiated, if known.
    Owner(Option<HeaderValue>),
    /// The session was issued to another principal.
    Foreign,
    /// taskgate has no entry for this session id.
    Unknown,
    /// As [`Access::Owner`], and the entry was read from a store other replicas share longer
    /// than [`REVALIDATE_AFTER`] ago: the request is served from the table, and the caller has
    /// the store asked again in the background ([`Sessions::revive`]: a DELETE or the expiry on
    /// another replica removed it there, and then it leaves this table too), see `held_store`.
    /// Only one request per period is told so.
    Recheck(Option<HeaderValue>),
}

/// How long a session read from (or written to) a store other replicas share is served from
/// this replica's table before the store is asked again: the bound on how long a session
/// another replica ended (DELETE, idle expiry) stays usable here. At most one primary-key
/// read per session and replica per period, only while the session is used.
pub const REVALIDATE_AFTER: Duration = Duration::from_secs(5);

/// The session table's hasher: foldhash, seeded per process (from addresses and the time; it
/// does not claim HashDoS resistance). Why not the standard SipHash: every request with a
/// session looks its id up (`access`), and SipHash over the upstream name and the id was ~550
/// instructions of a ~70,000-instruction small `tools/call` (benches/profile.sh small, issue
/// 15). The exposure is small: a client cannot choose the keys inserted (`initialize` clears
/// the client's session id; the keys are session ids the upstream issued, held sessions read
/// back from the store, and authenticated principals), the ids a client sends are only looked
/// up, and the table holds at most `gateway.max_sessions` entries.
type TableHasher = foldhash::fast::RandomState;

pub(crate) struct Table {
    /// hashbrown's map, not std's: a request's session is looked up by a [`SessionRef`] of
    /// its own bytes, without a [`Key`] built for it.
    map: hashbrown::HashMap<Key, SessionInfo, TableHasher>,
    /// Per tenant, the keys of its entries under a client `Mcp-Session-Id` (the ones
    /// `limits.max_sessions_per_principal` counts).
    tenants: HashMap<Tenant, HashSet<Key, TableHasher>, TableHasher>,
    /// When idle entries were last looked for (at most once a second).
    last_reclaim: Option<Instant>,
}

fn counted(key: &Key) -> bool {
    matches!(key.1, Some(SessionKey::Session(_)))
}

impl Table {
    /// Puts an entry in (replacing one under the same key), keeping the per-tenant keys.
    fn put(&mut self, key: Key, info: SessionInfo) {
        if counted(&key) {
            self.tenants
                .entry(info.tenant.clone())
                .or_default()
                .insert(key.clone());
        }
        let tenant = info.tenant.clone();
        if let Some(old) = self.map.insert(key.clone(), info) {
            if old.tenant != tenant {
                self.untrack(&key, &old.tenant);
            }
        }
    }

    /// Takes an entry out, keeping the per-tenant keys.
    fn take(&mut self, key: &Key) -> Option<SessionInfo> {
        let info = self.map.remove(key)?;
        self.untrack(key, &info.tenant);
        Some(info)
    }

    fn untrack(&mut self, key: &Key, tenant: &Tenant) {
        if let Some(keys) = self.tenants.get_mut(tenant) {
            keys.remove(key);
            if keys.is_empty() {
                self.tenants.remove(tenant);
            }
        }
    }

    /// Sessions `tenant` holds.
    fn held_by(&self, tenant: &Tenant) -> usize {
        self.tenants.get(tenant).map_or(0, HashSet::len)
    }

    /// The key of `tenant`'s least recently used session.
    fn least_recent_of(&self, tenant: &Tenant) -> Option<Key> {
        self.tenants
            .get(tenant)?
            .iter()
            .min_by_key(|k| self.map.get(*k).map_or(0, |s| s.last_used))
            .cloned()
    }
}

/// The session table, shared by the `session` and `session_guard` layers and read by
/// `held_sessions`.
pub struct Sessions {
    table: Mutex<Table>,
    max: usize,
    /// Sessions one tenant may hold (`limits.max_sessions_per_principal`).
    per_tenant: usize,
    idle: Duration,
    epoch: Instant,
    /// Where held sessions are kept, and the threads their store calls run on (see
    /// `held_store`); none in unit tests.
    store: std::sync::OnceLock<held_store::Keeping>,
    /// A held session was in the table at some point.
    any_held: std::sync::atomic::AtomicBool,
    /// The store is shared by other processes (a tier on PostgreSQL): stored entries are
    /// re-read past [`REVALIDATE_AFTER`]. Set with the store.
    shared: std::sync::atomic::AtomicBool,
    /// Session ids the store was just asked for and did not have (see `held_store`).
    absent: Mutex<held_store::Absent>,
    /// Where the store calls that failed are counted (`taskgate_store_write_failures_total`),
    /// once given ([`Sessions::count_store_failures`]).
    store_failures: std::sync::OnceLock<prometheus::IntCounter>,
}

impl Sessions {
    /// An empty table with the default bounds.
    pub fn new() -> Arc<Sessions> {
        Sessions::with_limits(DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE)
    }

    /// An empty table of at most `max` sessions; at `max`, sessions idle for `idle` may be
    /// reclaimed for new ones. No per-principal cap below `max` (see [`Sessions::with_caps`]).
    pub fn with_limits(max: usize, idle: Duration) -> Arc<Sessions> {
        Sessions::with_caps(max, idle, max)
    }

    /// An empty table of at most `max` sessions, at most `per_tenant` of them held by one
    /// principal (without one, one client address: [`Tenant`]); a principal's new session past
    /// `per_tenant` reclaims that principal's own least recently used session, never another
    /// principal's. At `max`, sessions idle for `idle` may be reclaimed for new ones.
    pub fn with_caps(max: usize, idle: Duration, per_tenant: usize) -> Arc<Sessions> {
        Arc::new(Sessions {
            table: Mutex::new(Table {
                map: hashbrown::HashMap::default(),
                tenants: HashMap::default(),
                last_reclaim: None,
            }),
            max: max.max(1),
            per_tenant: per_tenant.max(1),
            idle,
            epoch: Instant::now(),
            store: std::sync::OnceLock::new(),
            any_held: std::sync::atomic::AtomicBool::new(false),
            shared: std::sync::atomic::AtomicBool::new(false),
            store_failures: std::sync::OnceLock::new(),
            absent: Mutex::default(),
        })
    }

    fn now(&self) -> u32 {
        self.epoch.elapsed().as_secs().min(u32::MAX as u64) as u32
    }

    /// Number of sessions known.
    pub fn len(&self) -> usize {
        self.table.lock().map.len()
    }

    /// Whether no session is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `principal` may use `session` on `upstream`; an owner's use counts as activity.
    pub fn access(
        &self,
        upstream: &Arc<str>,
        session: &HeaderValue,
        principal: &Principal,
    ) -> Access {
        self.access_view(upstream, session, principal, |_| false).0
    }

    /// [`Sessions::access`], and for its owner what is known of the session (the fact the
    /// session stage hands down) when `wants` says so (given whether the session is held), from
    /// one look at the table.
    pub fn access_view(
        &self,
        upstream: &Arc<str>,
        session: &HeaderValue,
        principal: &Principal,
        wants: impl FnOnce(bool) -> bool,
    ) -> (Access, Option<SessionView>) {
        let now = self.now();
        let mut table = self.table.lock();
        let key = SessionRef {
            upstream,
            session: session.as_bytes(),
        };
        match table.map.get_mut(&key) {
            Some(info) if info.owner == *principal => {
                let version = info.protocol_version.clone();
                let access = if info.stored
                    && self.shared.load(std::sync::atomic::Ordering::Relaxed)
                    && now.saturating_sub(info.checked_at) >= REVALIDATE_AFTER.as_secs() as u32
                {
                    // This request has the store asked again; the next ones need not.
                    info.checked_at = now;
                    Access::Recheck(version)
                } else {
                    Access::Owner(version)
                };
                info.last_used = now;
                self.touch_if_due(upstream, session, info, now);
                (access, wants(info.held.is_some()).then(|| info.view()))
            }
            Some(_) => (Access::Foreign, None),
            None => (Access::Unknown, None),
        }
    }

    /// Whether one more session of `tenant` fits: true when the tenant is at its own cap (its
    /// least recently used session makes room when the new one is recorded), below
    /// `max_sessions`, or when idle sessions could be reclaimed to make room. Never removes a
    /// session that is in use.
    pub fn has_room(&self, tenant: &Tenant) -> bool {
        let mut table = self.table.lock();
        self.at_tenant_cap(&table, tenant) || self.make_room(&mut table)
    }

    /// Whether `tenant` holds `per_tenant` sessions. Never true for [`Tenant::Unknown`]
    /// (sessions of no known caller are not told apart), nor when `per_tenant` is the whole
    /// table: then the table's own rule holds (a full table refuses, never drops a session in
    /// use).
    fn at_tenant_cap(&self, table: &Table, tenant: &Tenant) -> bool {
        self.per_tenant < self.max
            && *tenant != Tenant::Unknown
            && table.held_by(tenant) >= self.per_tenant
    }

    /// Room for a new entry under `key` of `tenant`: at its cap, its own least recently used
    /// session is reclaimed (a held one leaves the store); otherwise [`Sessions::make_room`].
    fn room_for(&self, table: &mut Table, key: &Key, tenant: &Tenant) -> bool {
        if table.map.contains_key(key) {
            return true;
        }
        if counted(key) && self.at_tenant_cap(table, tenant) {
            if let Some(lru) = table.least_recent_of(tenant) {
                if let Some(info) = table.take(&lru) {
                    tracing::info!(
                        upstream = %lru.0,
                        "a principal past limits.max_sessions_per_principal: its least recently used session is reclaimed"
                    );
                    self.unstore(Sessions::held_keys(std::iter::once((&lru, &info))));
                }
            }
            return true;
        }
        self.make_room(table)
    }

    fn make_room(&self, table: &mut Table) -> bool {
        if table.map.len() < self.max {
            return true;
        }
        let now = Instant::now();
        if table
            .last_reclaim
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return false;
        }
        table.last_reclaim = Some(now);
        let idle = self.idle.as_secs().min(u32::MAX as u64) as u32;
        let cutoff = self.now().saturating_sub(idle);
        if self.now() >= idle {
            // A reclaimed held session leaves the store too.
            let stale: Vec<Key> = table
                .map
                .iter()
                .filter(|(_, s)| s.last_used <= cutoff)
                .map(|(k, _)| k.clone())
                .collect();
            let mut gone = Vec::new();
            for key in stale {
                if let Some(info) = table.take(&key) {
                    gone.extend(Sessions::held_keys(std::iter::once((&key, &info))));
                }
            }
            self.unstore(gone);
        }
        if table.map.len() < self.max {
            tracing::info!(
                sessions = table.map.len(),
                "reclaimed sessions idle for gateway.session_idle_ms"
            );
        }
        table.map.len() < self.max
    }

    /// Records a session the upstream issued (or, `session` being a principal or `None`, the
    /// facts of an upstream without sessions) with its owner, capabilities and protocol version
    /// (from `upstream_result`, the `InitializeResult`). An id issued again
    /// belongs to its latest initializer. False when the table is full.
    fn insert(
        &self,
        upstream: &Arc<str>,
        session: Option<SessionKey>,
        (owner, tenant): (Principal, Tenant),
        client_caps: Option<&Value>,
        upstream_result: Option<&Value>,
        held: Option<Arc<HeldSession>>,
    ) -> bool {
        let upstream_caps = upstream_result.and_then(|r| r.get("capabilities"));
        let last_used = self.now();
        // Every session with an id is kept in the store when there is one (held ones and the
        // upstream's alike), but an upstream id past the stored bound (then served by this
        // process only).
        let stored = self.store.get().is_some()
            && match &session {
                Some(SessionKey::Session(id)) => {
                    held.is_some() || id.len() <= crate::store::held::MAX_HELD_SESSION_ID
                }
                _ => false,
            };
        let mut table = self.table.lock();
        let key = (upstream.clone(), session);
        if !self.room_for(&mut table, &key, &tenant) {
            return false;
        }
        let info = SessionInfo {
            owner,
            tenant,
            client_caps: client_caps
                .map_or_else(ClientCapabilities::default, ClientCapabilities::of),
            upstream_tasks_tools_call: upstream_caps
                .is_some_and(|c| c.pointer("/tasks/requests/tools/call").is_some()),
            upstream_without_tasks: upstream_caps.is_some_and(|c| c.get("tasks").is_none()),
            life: SessionLife::new(),
            protocol_version: upstream_result
                .and_then(|r| r.get("protocolVersion"))
                .and_then(Value::as_str)
                .filter(|v| v.len() <= 64)
                .and_then(|v| HeaderValue::from_str(v).ok()),
            last_used,
            stored_at: last_used,
            checked_at: last_used,
            stored,
            held,
        };
        if info.held.is_some() {
            self.any_held
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if stored {
            self.absent.lock().forget(&key);
        }
        table.put(key, info);
        true
    }

    /// For a session id: `Some(held)` when taskgate knows it (`held`: the session is one taskgate
    /// holds itself, see `bridge`), `None` when it does not.
    pub fn held(
        &self,
        upstream: &Arc<str>,
        session: &HeaderValue,
    ) -> Option<Option<Arc<HeldSession>>> {
        let key = SessionKey::Session(session.clone());
        self.read(upstream, Some(&key), |s| s.held.clone())
    }

    /// What is known of a caller's session, as the session stage hands it down (a sessionless
    /// caller's entry: under its principal, or the upstream's facts under `None`).
    pub fn view(&self, upstream: &Arc<str>, session: Option<&SessionKey>) -> Option<SessionView> {
        self.read(upstream, session, SessionInfo::view)
    }

    /// `read` applied to the entry of a session, under the table's lock (no copy made).
    fn read<T>(
        &self,
        upstream: &Arc<str>,
        session: Option<&SessionKey>,
        read: impl FnOnce(&SessionInfo) -> T,
    ) -> Option<T> {
        self.table
            .lock()
            .map
            .get(&(upstream.clone(), session.cloned()))
            .map(read)
    }

    /// A copy of what is known of a session.
    pub fn get(&self, upstream: &Arc<str>, session: Option<&SessionKey>) -> Option<SessionInfo> {
        self.read(upstream, session, SessionInfo::clone)
    }

    /// Forgets a session (its id becomes unknown to taskgate; a held one leaves the store in
    /// the background, see [`Sessions::forget_ended`] to wait for that).
    pub fn forget(&self, upstream: &Arc<str>, session: Option<&SessionKey>) {
        let key = (upstream.clone(), session.cloned());
        let removed = self.table.lock().take(&key);
        if let Some(info) = removed {
            self.unstore(Sessions::held_keys(std::iter::once((&key, &info))));
        }
    }
}

mod held_store;
mod issued;
mod service;
pub use held_store::{is_held_form, touch_every, Revived, HELD_SESSION_PREFIX};
pub use issued::{ANSWER_WAIT, MAX_EVENTS_BEFORE};
pub(crate) use service::end_session;
pub use service::{SessionLayer, SessionService};

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;

//! Sessions kept in the registry's store (see `crate::store::held`): held sessions (the
//! bridge's) and, since issue 35, the sessions an upstream issued that taskgate passes through,
//! so that an `Mcp-Session-Id` stays valid for its owner across a restart, and on every replica
//! sharing a PostgreSQL store (a tier needs no sticky routing).
//!
//! - **Written** before the session id leaves taskgate ([`Sessions::store_entry`], awaited by
//!   the `session` layer before the `initialize` answer goes on). What is written is what a
//!   replica needs to serve the session: the upstream's session id (the id itself, passed
//!   through), the owner principal, the negotiated version, the capability bits of the client
//!   and what the upstream declared (`tasks.requests.tools.call`, no `tasks`), a held
//!   session's client capabilities and `clientInfo`, and the expiry. Not written: `upgrade`'s
//!   tool cache (`taskSupport` per tool): a replica that has not seen the session's
//!   `tools/list` asks for it once on the upstream session on its first plain call of an
//!   unknown tool (`upgrade::tools::tool_support`), as it does today after a
//!   `notifications/tools/list_changed`, so the store holds nothing that can go stale when
//!   the tools change.
//! - **Read back**: a request carrying a session id the table does not hold is looked up in
//!   the store ([`Sessions::revive`], by `session_guard`, before anything else): a stored
//!   session not past its idle limit comes back into the table with its owner, capabilities
//!   and protocol version, and is served as it was on the replica that saw its `initialize`;
//!   one that is not stored is 404 with authentication (or when it has the held form,
//!   [`is_held_form`]), and without authentication goes upstream as before (the upstream
//!   decides). A store that cannot be read is 500 where the answer would be 404, and
//!   forwarded where it would be forwarded. A session in the table costs no store read.
//! - **DELETE on one replica, the others' tables** (a tier): a session read from (or written
//!   to) a shared store is served from the table; the first request after
//!   [`super::REVALIDATE_AFTER`] (5 s) has it read again in the background (the request itself
//!   is served from the table, so a slow or unreachable database holds no request): gone from
//!   the store (a DELETE on another replica, the sweep's expiry), it leaves this table too, and
//!   the session's next request is treated as an unknown id's; a store that cannot be read
//!   leaves it served from the table. Chosen over PostgreSQL `LISTEN`/`NOTIFY`: no connection held per
//!   replica, none to re-establish (notifications lost while it was down would need this
//!   re-read anyway), it works through a transaction-pooling proxy (PgBouncer), and the cost is
//!   bounded (one primary-key read per used session and replica every 5 s). What the 5 s
//!   window allows is small: the DELETE also ended the upstream session, which then answers
//!   the stale replica's request 404 itself, and only the session's owner passes the check.
//!   One process on sled needs no re-read (the table is the only cache of its store).
//! - **Kept fresh**: its `expires_at` (Unix ms; `gateway.session_idle_ms` after the last use) is
//!   moved forward on use, at most once per [`touch_every`] per session and replica, so it may
//!   be up to that much early.
//! - **Removed** when the session ends (DELETE, awaited), is reclaimed as idle (in the
//!   background), or expires (the registry's sweep; a stored session past its idle limit is
//!   never revived).

use super::{SessionInfo, SessionKey, Sessions};
use crate::exchange::{Principal, Tenant};
use crate::layers::extensions::{HeldSession, SessionLife};
use crate::mcp::capabilities::ClientCapabilities;
use crate::mcp::task::now_ms;
use crate::registry::StoreThreads;
use crate::store::{HeldSessionRecord, StoreError, TaskStore};
use http::HeaderValue;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The prefix of the session ids taskgate mints for the sessions it holds.
pub const HELD_SESSION_PREFIX: &str = "tgh-";

/// Whether `id` has the form of a held session id taskgate mints: [`HELD_SESSION_PREFIX`] and
/// 32 lowercase hex digits.
pub fn is_held_form(id: &[u8]) -> bool {
    id.strip_prefix(HELD_SESSION_PREFIX.as_bytes())
        .is_some_and(|hex| {
            hex.len() == 32 && hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// How often a held session in use has its stored `expires_at` moved forward: a sixteenth of
/// `gateway.session_idle_ms`, at least a second.
pub fn touch_every(idle: Duration) -> Duration {
    (idle / 16).max(Duration::from_secs(1))
}

/// Session ids the store did not have when last asked, for [`super::REVALIDATE_AFTER`]: a
/// request naming one again within that time is not looked up again (without authentication it
/// is forwarded, as an unknown id is; the ids of clients that keep using a session taskgate
/// does not know, one from before issue 35 or one it reclaimed, would otherwise cost a store
/// read each). At most [`MAX_ABSENT`] ids; a full set is emptied. An id this process then
/// issues leaves it; one another replica issues could be served here 5 s late at worst, if a
/// client had named it before it was issued.
#[derive(Default)]
pub(super) struct Absent {
    ids: std::collections::HashMap<super::Key, u32, super::TableHasher>,
}

/// Ids [`Absent`] keeps at most.
pub const MAX_ABSENT: usize = 4096;

impl Absent {
    /// Whether `key` was found absent at or after `since` (seconds of the table's clock).
    fn knows(&self, key: &super::Key, since: u32) -> bool {
        self.ids.get(key).is_some_and(|at| *at >= since)
    }

    fn note(&mut self, key: super::Key, now: u32) {
        if self.ids.len() >= MAX_ABSENT {
            self.ids.clear();
        }
        self.ids.insert(key, now);
    }

    pub(super) fn forget(&mut self, key: &super::Key) {
        if !self.ids.is_empty() {
            self.ids.remove(key);
        }
    }
}

/// What [`Sessions::revive`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revived {
    /// The session is in the table (it was, or it came back from the store).
    InTable,
    /// No such held session (not stored, or past its idle limit).
    NotStored,
    /// Stored, but the table is full (`gateway.max_sessions`, none idle).
    NoRoom,
    /// The store could not be read.
    Failed,
}

/// Where stored sessions are kept: the registry's store, whose calls run on the registry's
/// store threads ([`StoreThreads`]: bounded, and apart from the serving runtime's blocking pool,
/// which also resolves upstream host names; a database that does not answer must not fill it
/// with `initialize`s' session writes, issue 29's rule).
#[derive(Clone)]
pub(super) struct Keeping {
    store: Arc<dyn TaskStore>,
    threads: StoreThreads,
}

impl Keeping {
    /// Runs `work` on a store thread and waits for it; a job that did not run (the threads
    /// busy or shutting down) is a [`StoreError::Db`] saying why.
    async fn run<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnOnce(&dyn TaskStore) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let store = self.store.clone();
        self.threads
            .run(move || work(store.as_ref()))
            .await
            .unwrap_or_else(|why| Err(why.into_store_error()))
    }

    /// Queues `work` on a store thread in the background; its failure, or its not being queued,
    /// is logged with `what` (what was not done); a job dropped after waiting too long for a
    /// thread is logged by the store threads.
    fn spawn<F>(&self, what: &'static str, work: F)
    where
        F: FnOnce(&dyn TaskStore) -> Result<(), StoreError> + Send + 'static,
    {
        let store = self.store.clone();
        let queued = self.threads.spawn(move || {
            if let Err(e) = work(store.as_ref()) {
                tracing::warn!(error = %e, "{what}");
            }
        });
        if let Err(why) = queued {
            tracing::warn!(reason = %why, "{what}");
        }
    }
}

fn owner_of(p: &Principal) -> Option<String> {
    match p {
        Principal::Token(t) => Some(t.to_string()),
        Principal::Anonymous => None,
    }
}

impl Sessions {
    /// Keeps the sessions in `store` from now on, its calls run on `threads` (the registry's;
    /// the first store given is kept); a store other processes share has its entries re-read
    /// (see the module docs).
    pub fn keep_held_in(&self, store: Arc<dyn TaskStore>, threads: StoreThreads) {
        let shared = store.shared();
        if self.store.set(Keeping { store, threads }).is_ok() {
            self.shared.store(shared, Ordering::Relaxed);
        }
    }

    /// Counts the session store calls that fail in `counter` from now on (the registry's
    /// `taskgate_store_write_failures_total`: a replica whose database is unreachable answers
    /// the requests of sessions it has not seen 500, and the store alert must say so).
    pub fn count_store_failures(&self, counter: prometheus::IntCounter) {
        let _ = self.store_failures.set(counter);
    }

    /// A session store call failed: counted (see [`Sessions::count_store_failures`]), unless it
    /// raced a graceful stop.
    fn store_failed(&self, e: &StoreError) {
        if let (Some(counter), false) = (self.store_failures.get(), e.is_closed()) {
            counter.inc();
        }
    }

    /// Whether sessions are kept in a store (written before their `initialize` answer).
    pub fn keeps_store(&self) -> bool {
        self.store.get().is_some()
    }

    /// Whether sessions are kept in a store other processes share (a tier: any replica may get
    /// any request of a session).
    pub fn shares_store(&self) -> bool {
        self.store.get().is_some() && self.shared.load(Ordering::Relaxed)
    }

    /// Whether a request naming `session`, which the table does not hold, is looked up in the
    /// store: one is kept, and the store was not asked for it in the last
    /// [`super::REVALIDATE_AFTER`] (`Absent`).
    pub fn may_look_up(&self, upstream: &Arc<str>, session: &HeaderValue) -> bool {
        if self.store.get().is_none() {
            return false;
        }
        let absent = self.absent.lock();
        if absent.ids.is_empty() {
            return true;
        }
        let key = (upstream.clone(), Some(SessionKey::Session(session.clone())));
        let since = self
            .now()
            .saturating_sub(super::REVALIDATE_AFTER.as_secs() as u32);
        !absent.knows(&key, since)
    }

    fn idle_ms(&self) -> u64 {
        u64::try_from(self.idle.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether any held session was ever in the table (the bridge then looks sessions up even
    /// before it learned that it holds sessions for an upstream).
    pub fn any_held(&self) -> bool {
        self.any_held.load(Ordering::Relaxed)
    }

    /// The stored form of a stored session's entry.
    fn record_of(&self, upstream: &str, session: &str, info: &SessionInfo) -> HeldSessionRecord {
        let held = info.held.as_deref();
        HeldSessionRecord {
            upstream: upstream.to_string(),
            session_id: session.to_string(),
            owner: owner_of(&info.owner),
            protocol_version: info
                .protocol_version
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            capability_bits: info.client_caps.bits(),
            upstream_tasks_tools_call: info.upstream_tasks_tools_call,
            upstream_without_tasks: info.upstream_without_tasks,
            client_capabilities: held
                .map_or_else(|| serde_json::json!({}), |h| h.client_capabilities.clone()),
            client_info: held.and_then(|h| h.client_info.clone()),
            expires_at: now_ms().saturating_add(self.idle_ms()),
            upstream_issued: held.is_none(),
        }
    }

    /// Writes the session `session` of the table to the store; returns once it is durable
    /// (`Ok` at once when no store is kept or the entry is not one to store).
    pub async fn store_entry(
        &self,
        upstream: &Arc<str>,
        session: &HeaderValue,
    ) -> Result<(), StoreError> {
        let Some(store) = self.store.get().cloned() else {
            return Ok(());
        };
        let key = SessionKey::Session(session.clone());
        let Some(record) = self.read(upstream, Some(&key), |info| {
            info.stored
                .then(|| self.record_of(upstream, session.to_str().unwrap_or_default(), info))
        }) else {
            return Ok(());
        };
        let Some(record) = record else {
            return Ok(());
        };
        // The write on a store thread, the group commit awaited here: a thread held through
        // the commit's fdatasync made a burst of initializes start a thread each (issue 30).
        let written = match store.run(move |s| s.put_held_session(record)).await {
            Ok(()) => store.store.sync().await,
            Err(e) => Err(e),
        };
        if let Err(e) = &written {
            self.store_failed(e);
        }
        written
    }

    /// Brings a session the store keeps back into the table, or (an entry due for its re-read,
    /// [`super::Access::Recheck`], in the background) checks that the store still keeps it and
    /// forgets it when not (see the module docs).
    /// `tenant`: whom the session counts against when it has no owner principal (without
    /// auth, the client address of the request that brings it back).
    pub async fn revive(
        &self,
        upstream: &Arc<str>,
        session: &HeaderValue,
        tenant: Tenant,
    ) -> Revived {
        self.read_back(upstream, session, tenant, true).await
    }

    /// The background re-read of an entry due for it ([`super::Access::Recheck`]): forgets the
    /// entry when the store no longer keeps the session, refreshes it when it does, and never
    /// puts an entry back that went meanwhile (a local `DELETE` after the row was read: the
    /// session must not be served again).
    pub async fn recheck(&self, upstream: &Arc<str>, session: &HeaderValue) -> Revived {
        self.read_back(upstream, session, Tenant::Unknown, false)
            .await
    }

    /// [`Self::revive`] (`insert`: an entry missing from the table is put there) and
    /// [`Self::recheck`] (not).
    async fn read_back(
        &self,
        upstream: &Arc<str>,
        session: &HeaderValue,
        tenant: Tenant,
        insert: bool,
    ) -> Revived {
        let Some(store) = self.store.get().cloned() else {
            return Revived::NotStored;
        };
        let Ok(id) = session.to_str().map(str::to_string) else {
            return Revived::NotStored;
        };
        let up = upstream.to_string();
        let found = store
            .run(move |store| match store.held_session(&up, &id)? {
                Some(s) if s.expires_at <= now_ms() => {
                    // Past its idle limit: never revived, and gone.
                    store.remove_held_session(&up, &id)?;
                    Ok(None)
                }
                other => Ok(other),
            })
            .await;
        let key = (upstream.clone(), Some(SessionKey::Session(session.clone())));
        let record = match found {
            Ok(Some(r)) => r,
            Ok(None) => {
                // Gone from the store (ended or expired on another replica): gone here too.
                if self.table.lock().take(&key).is_some() {
                    tracing::debug!(upstream = %upstream, "a session another replica ended is forgotten");
                }
                self.absent.lock().note(key, self.now());
                return Revived::NotStored;
            }
            Err(StoreError::Corrupt(e)) => {
                // Never written so (bounds are checked on write): not a session taskgate serves.
                tracing::warn!(error = %e, "a stored session cannot be read back");
                self.table.lock().take(&key);
                return Revived::NotStored;
            }
            Err(e) => return self.unread(&key, &e),
        };
        let now = self.now();
        let owner = match record.owner {
            Some(p) => Principal::Token(p.into()),
            None => Principal::Anonymous,
        };
        let mut table = self.table.lock();
        if let Some(info) = table.map.get_mut(&key) {
            // Re-read (or brought back by a concurrent request): still stored.
            info.checked_at = now;
            return Revived::InTable;
        }
        if !insert {
            // Gone from the table while the row was read (ended here): it stays gone.
            return Revived::NotStored;
        }
        let tenant = match &owner {
            Principal::Token(p) => Tenant::Principal(p.clone()),
            Principal::Anonymous => tenant,
        };
        let info = SessionInfo {
            owner,
            tenant: tenant.clone(),
            client_caps: ClientCapabilities::from_bits(record.capability_bits),
            upstream_tasks_tools_call: record.upstream_tasks_tools_call,
            upstream_without_tasks: record.upstream_without_tasks,
            life: SessionLife::new(),
            protocol_version: record
                .protocol_version
                .as_deref()
                .and_then(|v| HeaderValue::from_str(v).ok()),
            last_used: now,
            stored_at: now,
            checked_at: now,
            stored: true,
            held: (!record.upstream_issued).then(|| {
                Arc::new(HeldSession {
                    client_capabilities: record.client_capabilities,
                    client_info: record.client_info,
                })
            }),
        };
        if !self.room_for(&mut table, &key, &tenant) {
            return Revived::NoRoom;
        }
        let held = info.held.is_some();
        table.put(key, info);
        if held {
            self.any_held.store(true, Ordering::Relaxed);
        }
        tracing::debug!(upstream = %upstream, held, "a session came back from the store");
        Revived::InTable
    }

    /// The store could not be read for `key`: an entry due for its re-read stays served from
    /// the table (re-read again after [`super::REVALIDATE_AFTER`]); an unknown one is
    /// [`Revived::Failed`].
    fn unread(&self, key: &super::Key, e: &StoreError) -> Revived {
        self.store_failed(e);
        if let Some(info) = self.table.lock().map.get_mut(key) {
            tracing::warn!(error = %e, "a session could not be re-read from the store; served from the table");
            info.checked_at = self.now();
            return Revived::InTable;
        }
        crate::store::log_failure(e, "a session could not be read from the store");
        Revived::Failed
    }

    /// Moves the stored expiry of a held session in use (at most once per [`touch_every`]);
    /// called under the table's lock by [`Sessions::access`], with its `now` (the table's
    /// clock, read once per request).
    pub(super) fn touch_if_due(
        &self,
        upstream: &Arc<str>,
        session: &HeaderValue,
        info: &mut SessionInfo,
        now: u32,
    ) {
        if !info.stored {
            return;
        }
        let Some(store) = self.store.get() else {
            return;
        };
        let every = touch_every(self.idle).as_secs().min(u32::MAX as u64) as u32;
        if now.saturating_sub(info.stored_at) < every {
            return;
        }
        info.stored_at = now;
        let Ok(id) = session.to_str() else {
            return;
        };
        let (up, id) = (upstream.to_string(), id.to_string());
        let expires_at = now_ms().saturating_add(self.idle_ms());
        store.spawn("a held session's stored expiry was not moved", move |s| {
            s.touch_held_session(&up, &id, expires_at).map(drop)
        });
    }

    /// Removes held sessions the table no longer holds from the store, in the background.
    pub(super) fn unstore(&self, gone: Vec<(Arc<str>, String)>) {
        let Some(store) = self.store.get() else {
            return;
        };
        if gone.is_empty() {
            return;
        }
        store.spawn("a held session was not removed from the store", move |s| {
            let mut failed = Ok(());
            for (up, id) in gone {
                if let Err(e) = s.remove_held_session(&up, &id) {
                    failed = Err(e);
                }
            }
            failed
        });
    }

    /// Forgets a session that ended (its DELETE); a stored one is removed from the store before
    /// this returns. The store first, then the table: a request on the session meanwhile still
    /// finds it in the table (the session has not ended for its client before this returns),
    /// and one after finds it in neither (taken from the table first, a request in between
    /// found it still stored, looked it up and brought it back; the cold review of 2026-12-05).
    pub async fn forget_ended(&self, upstream: &Arc<str>, session: Option<&SessionKey>) {
        let key = (upstream.clone(), session.cloned());
        let stored = self.table.lock().map.get(&key).is_some_and(|i| i.stored);
        if let (true, Some(store), Some(SessionKey::Session(id))) =
            (stored, self.store.get().cloned(), session)
        {
            if let Ok(id) = id.to_str().map(str::to_string) {
                let up = upstream.to_string();
                // The commit awaited here, not on the store thread (see `store_entry`).
                let done = match store.run(move |s| s.remove_held_session(&up, &id)).await {
                    Ok(_) => store.store.sync().await,
                    Err(e) => Err(e),
                };
                if let Err(e) = done {
                    self.store_failed(&e);
                    tracing::warn!(error = %e, "an ended held session was not removed from the store");
                }
            }
        }
        self.table.lock().take(&key);
    }

    /// The held sessions among the entries `table` is about to drop, as `(upstream, id)`.
    pub(super) fn held_keys<'a>(
        entries: impl Iterator<Item = (&'a (Arc<str>, Option<SessionKey>), &'a SessionInfo)>,
    ) -> Vec<(Arc<str>, String)> {
        entries
            .filter(|(_, info)| info.stored)
            .filter_map(|((up, key), _)| match key {
                Some(SessionKey::Session(id)) => {
                    id.to_str().ok().map(|id| (up.clone(), id.to_string()))
                }
                _ => None,
            })
            .collect()
    }
}

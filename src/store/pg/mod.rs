//! The PostgreSQL implementation of [`TaskStore`], for a tier of taskgate replicas sharing one
//! registry (`[store] backend = "postgres"`).
//!
//! **Driver**: `tokio-postgres` (the maintained async driver of the `rust-postgres` project; no C
//! library, binary protocol, prepared statements) with the `deadpool-postgres` pool (small, async,
//! bounded: `store.pool_size` connections, a wait for a free one within the query timeout). `sqlx` was the other
//! candidate; it brings a macro/runtime layer, its own migration tool and many more crates for
//! nothing this store needs. TLS to the database: rustls through `tokio-postgres-rustls`, the
//! certificate and host name always verified (see `tls`; `sslmode` in the URL, `store.ca_file`).
//!
//! **Off the runtime**: the pool's connections are driven by a runtime of the store's own (one
//! worker thread, `taskgate-pg`). The trait's synchronous methods hand their query to that runtime
//! and wait on a channel, so they run where the registry already runs store work (its store
//! threads, see `registry::offload`) and never on one of the gateway's runtime workers; the async
//! methods ([`TaskStore::create`], [`TaskStore::ping`]) await the query's join handle.
//!
//! **Bounded**: no query waits for an answer forever. Every store call's work runs under the
//! query timeout (the URL's `connect_timeout`, 5 s by default) once it holds a connection, and a
//! connection that did not answer in time is closed instead of going back to the pool; the
//! connections' `tcp_user_timeout` is the same. Why both, and what was measured: see `bounded`.
//!
//! **Schema** (see `migrations`): `taskgate_tasks` (one row per `(upstream, taskId)`: the record
//! as JSON text plus the columns queries need: owner, recorded_at, expires_at, status, a version
//! for compare-and-swap, and the cross-replica cancel claim), `taskgate_audit` (append-only),
//! `taskgate_slots` (live-task slots of creations in flight), `taskgate_held_sessions` (the
//! held sessions, see `held`), `taskgate_leases` (the call leases, see `leases`).
//!
//! **Guarantees across replicas, enforced by the database**:
//! - `create` is one autocommitted `INSERT … ON CONFLICT DO NOTHING` (with the server's
//!   `synchronous_commit`, on by default): committed before the `CreateTaskResult` is passed on;
//! - `update` is a compare-and-swap on `version` (`UPDATE … WHERE version = $seen`), retried on a
//!   lost race with the record re-read, so the status machine always decides on the latest
//!   record; and a trigger refuses any change of a terminal `status` (terminal is final even
//!   against a buggy writer);
//! - the audit facts that happen once per task (`created`, `status_cancelled`,
//!   `resources_released`) have a unique index: appended once even if two replicas try;
//! - single-flight cancel and the sweep lease: see `tier`;
//! - `tasks.max_live_tasks_per_owner` across replicas (slots taken in `taskgate_slots` under a
//!   per-owner advisory lock) and the counts behind the task gauges: see `slots`.
//!
//! Durability: every write is its own committed transaction, so [`TaskStore::sync`] has nothing
//! left to wait for.

mod bounded;
mod held;
mod leases;
mod migrations;
mod names;
mod open;
mod slots;
mod tier;
mod tls;

pub use names::redact;

use super::sled_store::{owner_prefix, push_str, read_str, read_u64};
use super::{
    AuditEvent, CancelClaim, CancelProgress, ListCursor, Owner, SharedCancelOutcome, StoreError,
    TaskRecord, TaskStore,
};
use crate::mcp::task::TaskStatus;
use bounded::{bounded, Conn};
use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use std::future::Future;
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};

/// The database's clock now, in ms since the epoch, as the lease columns hold it (the one clock
/// every replica shares): SQL for the slot and cancel-lease statements.
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The query timeout when the database URL sets no `connect_timeout`: how long a store call may
/// wait for a free pooled connection, a new connection may take, and a query's answer may take
/// (see `bounded`).
const POOL_TIMEOUT: Duration = Duration::from_secs(5);

/// The PostgreSQL-backed registry (see the module doc).
pub struct PgStore {
    pool: Pool,
    /// Drives the pool's connections; shut down in the background on drop.
    runtime: Option<Runtime>,
    handle: Handle,
    /// This process's name in cancel claims (`<hostname>:<pid>:<random>`).
    replica: String,
    /// The connection holding the sweep lease, once this process has it (see `tier`).
    sweep_holder: tier::SweepHolder,
    /// How long a store call's queries may wait for their answers, and the sweep lease's
    /// connection for its liveness check: the URL's `connect_timeout`, else [`POOL_TIMEOUT`]
    /// (see `bounded` and `tier`).
    query_timeout: Duration,
    /// Told how long each task write took (`taskgate_store_write_duration_seconds`), once set
    /// ([`PgStore::observe_writes`]).
    writes: std::sync::OnceLock<std::sync::Arc<dyn super::CommitObserver>>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Never blocks (a store may be dropped on a runtime worker).
            rt.shutdown_background();
        }
    }
}

/// Maps a driver error to [`StoreError::Db`] with the server's message when there is one.
pub(super) fn pg_err(e: tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) => StoreError::Db(format!("postgres: {} ({})", db.message(), db.code().code())),
        None => {
            let cause = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            StoreError::Db(format!("postgres: {e}{cause}"))
        }
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StoreError::Db(format!("postgres pool: {other}")),
    }
}

fn decode(text: &str) -> Result<TaskRecord, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn encode(r: &TaskRecord) -> String {
    String::from_utf8(r.to_json()).expect("a record's JSON is UTF-8")
}

/// Milliseconds as the `bigint` columns hold them (saturating: a `u64` past `i64::MAX` is "never").
fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The `tasks/list` cursor: the last row's `(upstream, owner, recorded_at, taskId)`, encoded like
/// the sled store's owner index key.
fn cursor_of(r: &TaskRecord) -> ListCursor {
    let mut k = owner_prefix(&r.upstream, &r.owner);
    k.extend_from_slice(&r.recorded_at.to_be_bytes());
    push_str(&mut k, &r.task_id);
    ListCursor(k)
}

fn cursor_parts(upstream: &str, owner: &Owner, c: &ListCursor) -> Option<(u64, String)> {
    let prefix = owner_prefix(upstream, owner);
    let mut rest = c.0.strip_prefix(prefix.as_slice())?;
    let at = read_u64(&mut rest)?;
    let id = read_str(&mut rest)?.to_string();
    // A forged cursor's id holding NUL: not a cursor (PostgreSQL took it for a database error).
    (rest.is_empty() && !id.contains('\0')).then_some((at, id))
}

impl PgStore {
    /// Runs `job` on the store's runtime; the future waits for it. Not bounded here: for the
    /// migrations (see `bounded`); store calls use [`PgStore::spawn`].
    fn spawn_job<T>(
        &self,
        job: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + 'static
    where
        T: Send + 'static,
    {
        let job = self.handle.spawn(job);
        async move {
            job.await
                .unwrap_or_else(|e| Err(StoreError::Db(format!("database task ended: {e}"))))
        }
    }

    /// Runs `job` on the store's runtime and blocks this thread until it is done: for the
    /// trait's synchronous methods, which run on the blocking pool. Not bounded here: store
    /// calls use [`PgStore::run`]; the sweep lease bounds its own queries (see `tier`).
    fn wait_job<T>(
        &self,
        job: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(job.await);
        });
        rx.recv()
            .unwrap_or_else(|_| Err(StoreError::Db("database task ended".into())))
    }

    /// Runs `work` on a pooled connection on the store's runtime, bounded by the query timeout
    /// (see [`bounded()`](bounded::bounded)); the future waits for it.
    fn spawn<T, F, Fut>(&self, work: F) -> impl Future<Output = Result<T, StoreError>> + 'static
    where
        F: FnOnce(Conn) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        self.spawn_job(bounded(self.pool.clone(), self.query_timeout, work))
    }

    /// Reports how long each task write takes (a creation, an update's compare-and-swap, a
    /// removal, an audit fact: the whole store call, from waiting for a pooled connection to
    /// the commit, failed ones included) to `observer` (`taskgate_store_write_duration_seconds`,
    /// as the sled store's group commits). Set once; later calls change nothing.
    pub fn observe_writes(&self, observer: std::sync::Arc<dyn super::CommitObserver>) {
        let _ = self.writes.set(observer);
    }

    /// Tells the write observer (if any) that a write which started at `started` has ended.
    fn wrote(&self, started: std::time::Instant) {
        if let Some(o) = self.writes.get() {
            o.write(started.elapsed().as_secs_f64());
        }
    }

    /// A synchronous task write, timed (see [`PgStore::observe_writes`]).
    fn timed<T>(&self, write: impl FnOnce() -> T) -> T {
        let started = std::time::Instant::now();
        let out = write();
        self.wrote(started);
        out
    }

    /// An asynchronous task write, timed (see [`PgStore::observe_writes`]).
    fn timed_async<'a, T: Send + 'a>(
        &'a self,
        write: impl Future<Output = T> + Send + 'a,
    ) -> BoxFuture<'a, T> {
        let started = std::time::Instant::now();
        async move {
            let out = write.await;
            self.wrote(started);
            out
        }
        .boxed()
    }

    /// [`PgStore::spawn`] that blocks this thread until the work is done (see
    /// [`PgStore::wait_job`]).
    fn run<T, F, Fut>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        self.wait_job(bounded(self.pool.clone(), self.query_timeout, work))
    }

    /// The record and its version.
    fn get_versioned(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> Result<Option<(TaskRecord, i64)>, StoreError> {
        let (up, id) = (upstream.to_string(), task_id.to_string());
        let row = self.run(|c| async move {
            let get = c
                .prepare_cached(
                    "SELECT record, version FROM taskgate_tasks WHERE upstream = $1 AND task_id = $2",
                )
                .await
                .map_err(pg_err)?;
            c.query_opt(&get, &[&up, &id]).await.map_err(pg_err)
        })?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some((decode(row.get(0))?, row.get(1)))),
        }
    }
}

/// Inserts `record` (JSON `text`) as a new row, unless its `(upstream, taskId)` exists: the
/// rows inserted, 0 or 1. On a pooled client or inside a transaction.
pub(super) async fn insert_task<C: deadpool_postgres::GenericClient>(
    c: &C,
    record: &TaskRecord,
    text: &str,
) -> Result<u64, tokio_postgres::Error> {
    let insert = c
        .prepare_cached(
            "INSERT INTO taskgate_tasks \
             (upstream, task_id, owner, recorded_at, expires_at, status, record) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .await?;
    c.execute(
        &insert,
        &[
            &record.upstream,
            &record.task_id,
            &record.owner.to_string(),
            &ms(record.recorded_at),
            &ms(record.expires_at),
            &record.status.as_str(),
            &text,
        ],
    )
    .await
}

impl PgStore {
    /// Runs `sql` over every row of `taskgate_tasks` in keyset pages of 500, so a large registry
    /// is never held in memory at once: `sql` selects `upstream, task_id` first, takes the last
    /// key seen as `$1, $2` and `$3` true for the first page, and ends with
    /// `ORDER BY upstream, task_id LIMIT 500`. `visit` returns false to stop.
    fn keyset_pages(
        &self,
        sql: &'static str,
        visit: &mut dyn FnMut(&tokio_postgres::Row) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let mut after: Option<(String, String)> = None;
        loop {
            let from = after.clone();
            let rows = self.run(move |c| async move {
                let (up, id) = from.clone().unwrap_or_default();
                c.query_rows(sql, &[&up, &id, &from.is_none()])
                    .await
                    .map_err(pg_err)
            })?;
            for row in &rows {
                if !visit(row)? {
                    return Ok(());
                }
            }
            match rows.last() {
                Some(last) if rows.len() == 500 => after = Some((last.get(0), last.get(1))),
                _ => return Ok(()),
            }
        }
    }
}

impl TaskStore for PgStore {
    fn create(&self, record: TaskRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        let text = encode(&record);
        self.timed_async(self.spawn(move |c| async move {
            let n = insert_task(&*c, &record, &text).await.map_err(pg_err)?;
            if n == 0 {
                return Err(StoreError::Conflict(record.task_id));
            }
            Ok(())
        }))
    }

    fn get(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.get_versioned(upstream, task_id)?.map(|(r, _)| r))
    }

    fn update(
        &self,
        upstream: &str,
        task_id: &str,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(TaskRecord, TaskRecord)>, StoreError> {
        // Compare-and-swap: a lost race re-reads and re-decides (bounded; a record changed 64
        // times while one update runs is a bug elsewhere).
        for _ in 0..64 {
            let Some((before, version)) = self.get_versioned(upstream, task_id)? else {
                return Ok(None);
            };
            let mut after = before.clone();
            if !change(&mut after) {
                return Ok(Some((before, after)));
            }
            let (up, id, text) = (upstream.to_string(), task_id.to_string(), encode(&after));
            let (status, expires) = (after.status.as_str(), ms(after.expires_at));
            let n = self.timed(|| {
                self.run(move |c| async move {
                let swap = c
                    .prepare_cached(
                        "UPDATE taskgate_tasks SET record = $3, status = $4, expires_at = $5, \
                         version = version + 1 WHERE upstream = $1 AND task_id = $2 AND version = $6",
                    )
                    .await
                    .map_err(pg_err)?;
                c.execute(&swap, &[&up, &id, &text, &status, &expires, &version])
                    .await
                    .map_err(pg_err)
                })
            })?;
            if n == 1 {
                return Ok(Some((before, after)));
            }
        }
        Err(StoreError::Db(format!(
            "task {task_id:?}: update lost 64 races in a row"
        )))
    }

    fn remove(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        let (up, id) = (upstream.to_string(), task_id.to_string());
        let row = self.timed(|| {
            self.run(|mut c| async move {
                let tx = c.transaction().await.map_err(pg_err)?;
                let row = tx
                    .query_opt(
                        "DELETE FROM taskgate_tasks WHERE upstream = $1 AND task_id = $2 \
                     RETURNING record",
                        &[&up, &id],
                    )
                    .await
                    .map_err(pg_err)?;
                tx.execute(
                    "DELETE FROM taskgate_audit WHERE upstream = $1 AND task_id = $2",
                    &[&up, &id],
                )
                .await
                .map_err(pg_err)?;
                tx.commit().await.map_err(pg_err)?;
                Ok(row)
            })
        })?;
        row.map(|r| decode(r.get(0))).transpose()
    }

    fn list_owner(
        &self,
        upstream: &str,
        owner: &Owner,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, Option<ListCursor>), StoreError> {
        let after = match cursor {
            Some(c) => Some(
                cursor_parts(upstream, owner, c)
                    .ok_or_else(|| StoreError::Db("not a list cursor of this owner".into()))?,
            ),
            None => None,
        };
        let (up, who) = (upstream.to_string(), owner.to_string());
        let take = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let rows = self.run(move |c| async move {
            let first = after.is_none();
            let (at, id) = after.unwrap_or((0, String::new()));
            c.query_rows(
                "SELECT record FROM taskgate_tasks WHERE upstream = $1 AND owner = $2 \
                 AND ($5 OR (recorded_at, task_id) < ($3, $4)) \
                 ORDER BY recorded_at DESC, task_id DESC LIMIT $6",
                &[&up, &who, &ms(at), &id, &first, &take],
            )
            .await
            .map_err(pg_err)
        })?;
        let mut page = Vec::with_capacity(rows.len().min(limit));
        for row in rows.iter().take(limit) {
            page.push(decode(row.get(0))?);
        }
        let next = (rows.len() > limit)
            .then(|| page.last().map(cursor_of))
            .flatten();
        Ok((page, next))
    }

    fn cursor_is_valid(&self, upstream: &str, owner: &Owner, cursor: &ListCursor) -> bool {
        cursor_parts(upstream, owner, cursor).is_some()
    }

    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.run(move |c| async move {
            c.query(
                "SELECT upstream, task_id FROM taskgate_tasks WHERE expires_at <= $1 \
                 ORDER BY expires_at LIMIT $2",
                &[&ms(now_ms), &limit],
            )
            .await
            .map_err(pg_err)
        })?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    fn scan(&self, visit: &mut dyn FnMut(TaskRecord) -> bool) -> Result<(), StoreError> {
        self.keyset_pages(
            "SELECT upstream, task_id, record FROM taskgate_tasks \
             WHERE $3 OR (upstream, task_id) > ($1, $2) \
             ORDER BY upstream, task_id LIMIT 500",
            &mut |row| Ok(visit(decode(row.get(2))?)),
        )
    }

    fn scan_heads(
        &self,
        visit: &mut dyn FnMut(super::RecordHead<'_>) -> bool,
    ) -> Result<(), StoreError> {
        // The columns, not the records: a record carries its stored result (up to
        // `tasks.max_stored_result_bytes`), and a page of 500 whole records must come within the
        // query bound (`bounded`) even over a slow link. The cancellation facts are read out of
        // the record of a cancelled row only: `cancelled_at` is set exactly when the status
        // becomes `cancelled` (`registry::status`), and a terminal status is final (the trigger
        // of migration 1), so no other row has them.
        self.keyset_pages(
            "SELECT upstream, task_id, owner, status, \
             CASE WHEN status = 'cancelled' \
                 THEN (record::json ->> 'cancelled_at')::bigint END, \
             CASE WHEN status = 'cancelled' \
                 THEN (record::json ->> 'released_at')::bigint END \
             FROM taskgate_tasks WHERE $3 OR (upstream, task_id) > ($1, $2) \
             ORDER BY upstream, task_id LIMIT 500",
            &mut |row| {
                let status: &str = row.get(3);
                let status = TaskStatus::parse(status)
                    .ok_or_else(|| StoreError::Corrupt(format!("not a status: {status:?}")))?;
                let at = |i: usize| row.get::<_, Option<i64>>(i).map(|v| v.max(0) as u64);
                Ok(visit(super::RecordHead {
                    upstream: row.get::<_, &str>(0).into(),
                    task_id: row.get::<_, &str>(1).into(),
                    owner: row.get::<_, &str>(2).into(),
                    status,
                    cancelled_at: at(4),
                    released_at: at(5),
                }))
            },
        )
    }

    fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError> {
        let body = serde_json::to_string(event).expect("an audit event always serialises");
        let (up, id, ev) = (
            event.upstream.clone(),
            event.task_id.clone(),
            event.event.clone(),
        );
        self.timed(|| {
            self.run(move |c| async move {
                let insert = c
                    .prepare_cached(
                        "INSERT INTO taskgate_audit (upstream, task_id, event, body) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    )
                    .await
                    .map_err(pg_err)?;
                c.execute(&insert, &[&up, &id, &ev, &body])
                    .await
                    .map_err(pg_err)
            })
        })
        .map(|_| ())
    }

    fn audit_for(&self, upstream: &str, task_id: &str) -> Result<Vec<AuditEvent>, StoreError> {
        let (up, id) = (upstream.to_string(), task_id.to_string());
        let rows = self.run(|c| async move {
            c.query(
                "SELECT body FROM taskgate_audit WHERE upstream = $1 AND task_id = $2 \
                 ORDER BY seq",
                &[&up, &id],
            )
            .await
            .map_err(pg_err)
        })?;
        rows.iter()
            .map(|r| serde_json::from_str(r.get(0)).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        // Every write was its own committed transaction.
        async { Ok(()) }.boxed()
    }

    fn sync_soon(&self) {}

    fn shared(&self) -> bool {
        true
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.spawn(|c| async move {
            c.simple_query("SELECT 1").await.map_err(pg_err)?;
            Ok(())
        })
        .boxed()
    }

    fn claim_cancel(
        &self,
        upstream: &str,
        task_id: &str,
        modern: bool,
        lease: std::time::Duration,
    ) -> Result<CancelClaim, StoreError> {
        self.claim_cancel_now(upstream, task_id, modern, lease)
    }

    fn finish_cancel(
        &self,
        upstream: &str,
        task_id: &str,
        generation: i64,
        outcome: &SharedCancelOutcome,
    ) -> Result<(), StoreError> {
        self.finish_cancel_now(upstream, task_id, generation, outcome)
    }

    fn cancel_outcome(
        &self,
        upstream: &str,
        task_id: &str,
        generation: i64,
    ) -> Result<CancelProgress, StoreError> {
        self.cancel_outcome_now(upstream, task_id, generation)
    }

    fn renew_cancel(
        &self,
        upstream: &str,
        task_id: &str,
        generation: i64,
        lease: std::time::Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.renew_cancel_now(upstream, task_id, generation, lease)
            .boxed()
    }

    fn sweep_lease(&self) -> Result<Option<Box<dyn Send>>, StoreError> {
        self.sweep_lease_now()
    }

    fn slots(&self) -> Option<&dyn super::SlotStore> {
        Some(self)
    }

    fn leases(&self) -> Option<&dyn super::lease::LeaseStore> {
        Some(self)
    }
}

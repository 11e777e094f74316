//! `tasks.max_live_tasks_per_owner` across a tier, and the counts behind the task gauges.
//!
//! **Slots**: a task-augmented `tools/call` takes a slot before it goes upstream. On PostgreSQL
//! the taking is one transaction under a per-owner transaction advisory lock
//! (`pg_advisory_xact_lock` on a hash of `(upstream, owner)`): the owner's expired slot rows are
//! deleted, its live tasks (`status` not terminal, a partial index) and slot rows are counted,
//! and a row is inserted only below the limit. Two replicas taking a slot for one owner are
//! serialised by the lock, and each count runs after the previous holder committed (the lock is
//! released at commit; under READ COMMITTED every statement sees what was committed before it),
//! so the limit holds across replicas. The taking commits without waiting for its WAL flush
//! (a slot row is a lease; see `reserve_slot`), so one owner's creations do not queue on each
//! other's flushes. The recorded task replaces its slot row in one
//! transaction ([`SlotStore::create_in_slot`]): one statement's snapshot sees either the row or
//! the task, never both or neither. A slot whose call ended without a task is deleted at once; a
//! row a killed replica left ends with its lease ([`crate::store::TASK_SLOT_LEASE`], on the
//! database's clock).
//!
//! **Counts**: `SELECT upstream, status, count(*) … GROUP BY`, read by the replica holding the
//! sweep lease for `taskgate_tasks` (see `registry::sweep`).

use super::{encode, pg_err, PgStore};
use crate::mcp::task::TaskStatus;
use crate::store::{Owner, SlotStore, StatusCounts, StoreError, TaskRecord};
use futures_util::future::BoxFuture;
use std::time::Duration;

use super::DB_NOW_MS;

/// Advisory lock keys of owners' slots: `hashtextextended(current_schema() || '\n' || upstream || '\n' || owner, SEED)` (a
/// collision only serialises two owners' slot takings).
const SLOT_LOCK_SEED: i64 = 0x7461_736b_6761_7403;

impl SlotStore for PgStore {
    fn reserve_slot(
        &self,
        upstream: &str,
        owner: &Owner,
        limit: usize,
        lease: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (up, who) = (upstream.to_string(), owner.to_string());
        self.run(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg_err)?;
            // The schema is part of the lock's key: two tiers in one database, each in its own
            // schema, never wait on each other's owners (issue 29 #18). The transaction commits
            // without waiting for its WAL flush (`synchronous_commit` off, for it alone): the
            // owner's lock is held until the commit, so a flush in it made every creation of
            // one owner wait for the one before it to reach the disk (scenario 10 at c=16:
            // 323 creations/s, p50 47 ms, one flush after another). Other sessions see the
            // committed row at once either way. What it trades: a database crash within about
            // three `wal_writer_delay`s of a taking may lose its row (and the id sequence's
            // step) while the replica's call goes on, so until that call's task is recorded
            // (a synchronous commit, later in the WAL) or its slot given back, the owner can be
            // one task per lost row past the limit, and a reused id's `DELETE` can give back
            // another call's row early: a brief overshoot of the limit after a database crash,
            // never a lost task record.
            let lock = tx
                .prepare_cached(
                    "SELECT set_config('synchronous_commit', 'off', true), \
                     pg_advisory_xact_lock(hashtextextended(current_schema() || E'\\n' || $1::text || E'\\n' || $2::text, $3::bigint))",
                )
                .await
                .map_err(pg_err)?;
            tx.execute(&lock, &[&up, &who, &SLOT_LOCK_SEED])
                .await
                .map_err(pg_err)?;
            // Under the lock (taken, so this statement's snapshot sees what the previous
            // holder committed): the owner's expired slot rows go, and a row is inserted only
            // below the limit. One statement's sub-statements share its snapshot, so the slot
            // count still sees the rows deleted here: they are subtracted.
            let take = tx
                .prepare_cached(&format!(
                    "WITH expired AS (DELETE FROM taskgate_slots WHERE upstream = $1 \
                     AND owner = $2 AND lease_until <= {DB_NOW_MS} RETURNING 1) \
                     INSERT INTO taskgate_slots (upstream, owner, lease_until) \
                     SELECT $1, $2, {DB_NOW_MS} + $3 WHERE \
                     (SELECT count(*) FROM taskgate_tasks WHERE upstream = $1 AND owner = $2 \
                      AND status NOT IN ('completed', 'failed', 'cancelled')) \
                     + (SELECT count(*) FROM taskgate_slots WHERE upstream = $1 AND owner = $2) \
                     - (SELECT count(*) FROM expired) < $4 RETURNING id"
                ))
                .await
                .map_err(pg_err)?;
            let Some(row) = tx
                .query_opt(&take, &[&up, &who, &lease_ms, &limit])
                .await
                .map_err(pg_err)?
            else {
                // At the limit: the transaction's rollback releases the lock.
                return Ok(None);
            };
            tx.commit().await.map_err(pg_err)?;
            Ok(Some(row.get(0)))
        })
    }

    fn release_slot(&self, slot: i64) {
        let deleted = super::bounded(self.pool.clone(), self.query_timeout, move |c| async move {
            c.execute("DELETE FROM taskgate_slots WHERE id = $1", &[&slot])
                .await
                .map_err(pg_err)
        });
        self.handle.spawn(async move {
            if let Err(e) = deleted.await {
                tracing::warn!(error = %e, slot, "a live-task slot could not be given back; it ends with its lease");
            }
        });
    }

    /// The task's row inserted and its slot's row deleted in one transaction.
    fn create_in_slot(
        &self,
        record: TaskRecord,
        slot: i64,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        self.timed_async(self.spawn(move |mut c| async move {
            let text = encode(&record);
            let tx = c.transaction().await.map_err(pg_err)?;
            let n = super::insert_task(&tx, &record, &text)
                .await
                .map_err(pg_err)?;
            if n == 0 {
                // The slot stays the caller's: dropping its reservation gives it back.
                return Err(StoreError::Conflict(record.task_id));
            }
            let delete = tx
                .prepare_cached("DELETE FROM taskgate_slots WHERE id = $1")
                .await
                .map_err(pg_err)?;
            tx.execute(&delete, &[&slot]).await.map_err(pg_err)?;
            tx.commit().await.map_err(pg_err)
        }))
    }

    fn count_by_status(&self) -> Result<StatusCounts, StoreError> {
        let rows = self.run(|c| async move {
            c.query(
                "SELECT upstream, status, count(*) FROM taskgate_tasks GROUP BY upstream, status",
                &[],
            )
            .await
            .map_err(pg_err)
        })?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let status: String = r.get(1);
                let status = TaskStatus::ALL
                    .iter()
                    .copied()
                    .find(|s| s.as_str() == status)?;
                Some((r.get(0), status, r.get(2)))
            })
            .collect())
    }
}

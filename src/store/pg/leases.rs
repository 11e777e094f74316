//! The call leases of a tier ([`crate::store::lease`]) in `taskgate_leases`: one row per held or
//! followed call, `holder` the replica's name (as in cancel claims), `lapse_at` on the
//! database's clock (the one clock every replica shares). Each operation is one statement:
//! renewing is one `UPDATE … WHERE holder = me RETURNING` per renewal for all of a replica's
//! leases (what it returns is what the replica still holds);
//! reading the cancel asks is one `UPDATE … RETURNING` that clears them as it reads them (each
//! ask seen once); adopting is one `UPDATE … RETURNING` over the lapsed rows locked with
//! `FOR UPDATE SKIP LOCKED` and re-checked in the `UPDATE`, so a lapsed lease goes to one
//! replica only.

use super::{pg_err, PgStore, DB_NOW_MS};
use crate::store::lease::{Adopted, LeaseKind, LeaseStore};
use crate::store::StoreError;
use futures_util::future::BoxFuture;
use std::time::Duration;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}

/// The `(upstream, task_id)` pairs of rows `RETURNING upstream, task_id`.
fn keys(rows: &[tokio_postgres::Row]) -> Vec<(String, String)> {
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

impl PgStore {
    /// Runs `statement` (parameters `$1` upstream, `$2` task id, `$3` this replica) on the lease
    /// of `(upstream, task_id)` this replica holds.
    fn on_own_lease(
        &self,
        upstream: &str,
        task_id: &str,
        statement: String,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let (up, id, me) = (
            upstream.to_string(),
            task_id.to_string(),
            self.replica.clone(),
        );
        Box::pin(self.spawn(move |c| async move {
            c.execute(&statement, &[&up, &id, &me])
                .await
                .map_err(pg_err)?;
            Ok(())
        }))
    }
}

impl LeaseStore for PgStore {
    fn take_lease(
        &self,
        upstream: &str,
        task_id: &str,
        kind: LeaseKind,
        lapse: Duration,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let (up, id, me, lapse) = (
            upstream.to_string(),
            task_id.to_string(),
            self.replica.clone(),
            ms(lapse),
        );
        Box::pin(self.spawn(move |c| async move {
            c.execute(
                &format!(
                    "INSERT INTO taskgate_leases (upstream, task_id, kind, holder, lapse_at) \
                     VALUES ($1, $2, $3, $4, {DB_NOW_MS} + $5) \
                     ON CONFLICT (upstream, task_id) DO UPDATE SET kind = EXCLUDED.kind, \
                     holder = EXCLUDED.holder, lapse_at = EXCLUDED.lapse_at"
                ),
                &[&up, &id, &kind.as_str(), &me, &lapse],
            )
            .await
            .map_err(pg_err)?;
            Ok(())
        }))
    }

    fn renew_leases(
        &self,
        lapse: Duration,
    ) -> BoxFuture<'static, Result<Vec<(String, String)>, StoreError>> {
        let (me, lapse) = (self.replica.clone(), ms(lapse));
        Box::pin(self.spawn(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "UPDATE taskgate_leases SET lapse_at = {DB_NOW_MS} + $2 WHERE holder = $1 \
                         RETURNING upstream, task_id"
                    ),
                    &[&me, &lapse],
                )
                .await
                .map_err(pg_err)?;
            Ok(keys(&rows))
        }))
    }

    fn end_lease(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.on_own_lease(
            upstream,
            task_id,
            "DELETE FROM taskgate_leases WHERE upstream = $1 AND task_id = $2 AND holder = $3"
                .to_string(),
        )
    }

    fn let_lapse(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.on_own_lease(
            upstream,
            task_id,
            format!(
                "UPDATE taskgate_leases SET holder = '', lapse_at = {DB_NOW_MS} \
                 WHERE upstream = $1 AND task_id = $2 AND holder = $3"
            ),
        )
    }

    fn ask_cancel(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        let (up, id) = (upstream.to_string(), task_id.to_string());
        Box::pin(self.spawn(move |c| async move {
            let n = c
                .execute(
                    &format!(
                        "UPDATE taskgate_leases SET cancel_asked = true \
                         WHERE upstream = $1 AND task_id = $2 AND lapse_at > {DB_NOW_MS}"
                    ),
                    &[&up, &id],
                )
                .await
                .map_err(pg_err)?;
            Ok(n == 1)
        }))
    }

    fn cancels_asked(&self) -> BoxFuture<'static, Result<Vec<(String, String)>, StoreError>> {
        let me = self.replica.clone();
        Box::pin(self.spawn(move |c| async move {
            let rows = c
                .query(
                    "UPDATE taskgate_leases SET cancel_asked = false \
                     WHERE holder = $1 AND cancel_asked RETURNING upstream, task_id",
                    &[&me],
                )
                .await
                .map_err(pg_err)?;
            Ok(keys(&rows))
        }))
    }

    fn adopt_lapsed(
        &self,
        lapse: Duration,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Adopted>, StoreError>> {
        let (me, lapse) = (self.replica.clone(), ms(lapse));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(self.spawn(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "UPDATE taskgate_leases l SET holder = $1, lapse_at = {DB_NOW_MS} + $2 \
                         FROM (SELECT upstream, task_id FROM taskgate_leases \
                               WHERE lapse_at <= {DB_NOW_MS} ORDER BY lapse_at LIMIT $3 \
                               FOR UPDATE SKIP LOCKED) lapsed \
                         WHERE l.upstream = lapsed.upstream AND l.task_id = lapsed.task_id \
                         AND l.lapse_at <= {DB_NOW_MS} \
                         RETURNING l.upstream, l.task_id, l.kind"
                    ),
                    &[&me, &lapse, &limit],
                )
                .await
                .map_err(pg_err)?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let kind: String = r.get(2);
                    Some(Adopted {
                        upstream: r.get(0),
                        task_id: r.get(1),
                        kind: LeaseKind::parse(&kind)?,
                    })
                })
                .collect())
        }))
    }
}

//! What makes a tier of replicas behave as one gateway: the single-flight `tasks/cancel` claim
//! and the TTL sweep lease, both decided by the database.
//!
//! **Cancel claim**: the task's row is locked (`SELECT … FOR UPDATE`) and the claim decided in
//! that transaction: terminal → answered locally; a claim of another replica whose lease
//! (the upstream's `timeout_ms` plus a margin,
//! [`crate::store::cancel_lease`]) still runs → wait for it; a 2026-07-28 task whose cancel was already
//! acknowledged → the ack; otherwise this replica takes claim `generation + 1` and forwards.
//! The lease runs from the statement that takes the claim, on the database's clock; the
//! forwarder renews it while its flight lives (`renew_cancel`: again from the renewing
//! statement, only while the claim's generation and replica are still its own; see
//! `registry::tier`), so the store writes it makes before the upstream call do not eat the
//! lease's margin.
//! The forwarder stores the outcome with the claim's generation; waiting replicas poll for it
//! (a bounded poll: the registry's deadline is the lease plus a second). A replica killed while
//! forwarding stops renewing and leaves a claim that expires with its lease: a waiter's poll
//! then reads it as lapsed (`CancelProgress::Lapsed`, on the database's clock) and claims again,
//! as the next cancel does; that claim is a take-over (`CancelClaim::TakeOver`: the row still
//! names the dead claim's replica), so the taker asks the upstream the task's state before it
//! forwards anything. A waiter on a lapsed claim that another replica took over and finished
//! reads that newer claim's outcome.
//!
//! **Sweep lease**: a session advisory lock (`pg_try_advisory_lock`) that the replica which gets
//! it keeps for its whole life, on a connection taken out of the pool (so `pool_size + 1`
//! connections at most): one replica sweeps, and exports the task gauges counted in the database
//! (`registry::sweep`), until it goes away; its connection closing (shutdown, kill -9, a broken
//! network) releases the lock and another replica takes it at its next sweep tick. Each tick the
//! holder checks that connection still answers (`SELECT 1`), within the database URL's
//! `connect_timeout` (5 s when the URL has none): an answer as slow as a new connection may be
//! means the connection is lost (a black-holed network, where TCP alone would take many minutes
//! to give up). Then the holder closes that connection and does not sweep that tick; the server
//! ends the session and its lock once the close reaches it, and the next replica to try takes
//! the lease. On a path that stays black-holed the close never arrives: the server then ends
//! the session when its own TCP keepalive gives up, which the holder sets on that session when
//! it takes the lock (`server_keepalive`: probes after the same bound, 3 probes 1 s apart,
//! `tcp_user_timeout` the same bound) instead of the server's defaults (7200 s, 9 x 75 s: the
//! lease stuck with a vanished replica for 2 h 11 min). Taking the
//! lock (`pg_try_advisory_lock` on a pooled connection) has the same bound; a connection that
//! does not answer it in time is closed (whether the lock was granted is unknown). A replica
//! that does not get the lock gives the pooled connection it tried with back to the pool (it
//! holds nothing): no connection is opened or closed per tick, by the holder or the others.

use super::{pg_err, pool_err, PgStore};
use crate::mcp::task::TaskStatus;
use crate::store::{CancelClaim, CancelProgress, SharedCancelOutcome, StoreError};
use deadpool_postgres::{ClientWrapper, Object};

use super::DB_NOW_MS;

/// Seed of the TTL sweep's advisory lock key (`'taskgate'` as bytes, plus 2). The key itself
/// is a hash of this seed and the session's `current_schema()` ([`SWEEP_LOCK_KEY`]), so two
/// tiers sharing one database in different schemas (`search_path` in the URL) do not take each
/// other's lease (advisory locks are per database; issue 29 #18).
const SWEEP_LOCK: i64 = 0x7461_736b_6761_7402;
/// The SQL expression of the sweep lock's key, `$1` being [`SWEEP_LOCK`].
pub(super) const SWEEP_LOCK_KEY: &str =
    "hashtextextended('taskgate sweep' || E'\\n' || current_schema(), $1::bigint)";

fn parse_status(s: &str) -> Option<TaskStatus> {
    TaskStatus::ALL.iter().copied().find(|t| t.as_str() == s)
}

/// The connection holding this process's sweep lease, once it has it (see the module doc).
pub(super) type SweepHolder = std::sync::Arc<tokio::sync::Mutex<Option<ClientWrapper>>>;

impl PgStore {
    pub(super) fn claim_cancel_now(
        &self,
        upstream: &str,
        task_id: &str,
        modern: bool,
        lease: std::time::Duration,
    ) -> Result<CancelClaim, StoreError> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
        let (up, id, me) = (
            upstream.to_string(),
            task_id.to_string(),
            self.replica.clone(),
        );
        self.run(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg_err)?;
            let row = tx
                .query_opt(
                    "SELECT status, cancel_generation, cancel_claimed_by, cancel_lease_until, \
                     cancel_acked, (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
                     FROM taskgate_tasks WHERE upstream = $1 AND task_id = $2 \
                     FOR UPDATE",
                    &[&up, &id],
                )
                .await
                .map_err(pg_err)?;
            let Some(row) = row else {
                // Removed meanwhile: nothing to single-flight on; the upstream decides.
                return Ok(CancelClaim::Forward { generation: 0 });
            };
            // The lease is measured on the database's clock, the one clock every replica
            // shares: with replicas' own clocks, a skew beyond the lease would let a second
            // replica take a live claim and send the cancel again (found by review).
            let now: i64 = row.get(5);
            let status: String = row.get(0);
            let generation: i64 = row.get(1);
            let claimed_by: Option<String> = row.get(2);
            let lease_until: Option<i64> = row.get(3);
            let acked: bool = row.get(4);
            if let Some(s) = parse_status(&status).filter(|s| s.is_terminal()) {
                return Ok(CancelClaim::Terminal(s));
            }
            if claimed_by.is_some() && lease_until.unwrap_or(0) > now {
                return Ok(CancelClaim::Wait { generation });
            }
            if modern && acked {
                return Ok(CancelClaim::Acknowledged);
            }
            let next = generation + 1;
            // The lease runs from this statement, not from the read above (one round trip
            // less of it spent before the claim is even made).
            tx.execute(
                &format!(
                    "UPDATE taskgate_tasks SET cancel_generation = $3, cancel_claimed_by = $4, \
                     cancel_lease_until = {DB_NOW_MS} + $5, cancel_outcome = NULL \
                     WHERE upstream = $1 AND task_id = $2"
                ),
                &[&up, &id, &next, &me, &lease_ms],
            )
            .await
            .map_err(pg_err)?;
            tx.commit().await.map_err(pg_err)?;
            // A claim left without an outcome lapsed under its replica (killed while
            // forwarding): its cancel may have reached the upstream.
            Ok(match claimed_by {
                Some(_) => CancelClaim::TakeOver { generation: next },
                None => CancelClaim::Forward { generation: next },
            })
        })
    }

    /// See [`crate::store::TaskStore::renew_cancel`]: the lease from this statement on the
    /// database's clock, only while claim `generation` is this replica's (the generation is the
    /// fence: a replica that took a newer claim after this one lapsed bumped it).
    pub(super) fn renew_cancel_now(
        &self,
        upstream: &str,
        task_id: &str,
        generation: i64,
        lease: std::time::Duration,
    ) -> impl std::future::Future<Output = Result<bool, StoreError>> + 'static {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
        let (up, id, me) = (
            upstream.to_string(),
            task_id.to_string(),
            self.replica.clone(),
        );
        self.spawn(move |c| async move {
            let n = c
                .execute(
                    &format!(
                        "UPDATE taskgate_tasks SET cancel_lease_until = {DB_NOW_MS} + $5 \
                         WHERE upstream = $1 AND task_id = $2 AND cancel_generation = $3 \
                         AND cancel_claimed_by = $4"
                    ),
                    &[&up, &id, &generation, &me, &lease_ms],
                )
                .await
                .map_err(pg_err)?;
            Ok(n == 1)
        })
    }

    pub(super) fn finish_cancel_now(
        &self,
        upstream: &str,
        task_id: &str,
        generation: i64,
        outcome: &SharedCancelOutcome,
    ) -> Result<(), StoreError> {
        let acked = matches!(outcome, SharedCancelOutcome::Result(_));
        let (up, id, text) = (upstream.to_string(), task_id.to_string(), outcome.encode());
        self.run(move |c| async move {
            c.execute(
                "UPDATE taskgate_tasks SET cancel_claimed_by = NULL, cancel_lease_until = NULL, \
                 cancel_outcome = $4, cancel_acked = cancel_acked OR $5 \
                 WHERE upstream = $1 AND task_id = $2 AND cancel_generation = $3",
                &[&up, &id, &generation, &text, &acked],
            )
            .await
            .map_err(pg_err)
        })
        .map(|_| ())
    }

    /// See [`crate::store::TaskStore::cancel_outcome`]: the lease compared on the database's
    /// clock, as the claim compares it.
    pub(super) fn cancel_outcome_now(
        &self,
        upstream: &str,
        task_id: &str,
        generation: i64,
    ) -> Result<CancelProgress, StoreError> {
        let (up, id) = (upstream.to_string(), task_id.to_string());
        let row = self.run(move |c| async move {
            c.query_opt(
                &format!(
                    "SELECT cancel_generation, cancel_outcome, cancel_claimed_by, \
                     cancel_lease_until, {DB_NOW_MS} \
                     FROM taskgate_tasks WHERE upstream = $1 AND task_id = $2"
                ),
                &[&up, &id],
            )
            .await
            .map_err(pg_err)
        })?;
        let Some(row) = row else {
            return Ok(CancelProgress::Done(SharedCancelOutcome::Failed(
                "the task was removed while its cancel was in flight".into(),
            )));
        };
        let (now_gen, outcome, claimed): (i64, Option<String>, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let (lease_until, now): (Option<i64>, i64) = (row.get(3), row.get(4));
        Ok(match claimed {
            // Finished: by the claim waited on, or by a newer one that took it over after it
            // lapsed (the same cancel, sent by the replica that took it over).
            None if now_gen >= generation => CancelProgress::Done(SharedCancelOutcome::decode(
                outcome.as_deref().unwrap_or(""),
            )),
            Some(_) if now_gen == generation && lease_until.unwrap_or(0) > now => {
                CancelProgress::InFlight
            }
            // Lapsed, or replaced by a newer claim still in flight: claim again (wait on the
            // newer one, or take the lapsed one over).
            _ => CancelProgress::Lapsed,
        })
    }

    pub(super) fn sweep_lease_now(&self) -> Result<Option<Box<dyn Send>>, StoreError> {
        let holder = self.sweep_holder.clone();
        let (liveness, pool) = (self.query_timeout, self.pool.clone());
        self.wait_job(async move {
            let mut held = holder.lock().await;
            if let Some(client) = held.as_ref() {
                // Still ours while the session that took the lock lives and answers in time.
                match tokio::time::timeout(liveness, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => return Ok(Some(Box::new(()) as Box<dyn Send>)),
                    Ok(Err(_)) => {
                        tracing::warn!(
                            "the connection holding the sweep lease broke; trying again"
                        );
                        *held = None;
                    }
                    Err(_) => {
                        // Dropping the client closes the connection: the server ends the session
                        // and its lock. This tick this replica does not sweep; next tick it tries
                        // for the lease like every other replica.
                        tracing::warn!(
                            timeout_ms = liveness.as_millis() as u64,
                            "the connection holding the sweep lease did not answer in time; \
                             closed, and the lease given up"
                        );
                        *held = None;
                        return Ok(None);
                    }
                }
            }
            let obj = pool.get().await.map_err(pool_err)?;
            let asked = tokio::time::timeout(
                liveness,
                obj.query_one(
                    &format!("SELECT pg_try_advisory_lock({SWEEP_LOCK_KEY})"),
                    &[&SWEEP_LOCK],
                ),
            )
            .await;
            let got: bool = match asked {
                Ok(Ok(row)) => row.get(0),
                failed => {
                    // Unknown whether the lock was granted: the connection is closed, not pooled.
                    drop(Object::take(obj));
                    return Err(match failed {
                        Ok(Err(e)) => pg_err(e),
                        _ => StoreError::Db(format!(
                            "postgres: no answer to the sweep lock within {} ms",
                            liveness.as_millis()
                        )),
                    });
                }
            };
            if !got {
                // It holds nothing: back to the pool when `obj` drops.
                return Ok(None);
            }
            let client = Object::take(obj);
            // The server must end this session (and its lock) in time once the path to this
            // replica is gone, not after its TCP defaults (about 2 h 11 min on Linux).
            let settings = server_keepalive(liveness);
            match tokio::time::timeout(liveness, client.batch_execute(&settings)).await {
                Ok(Ok(())) => {}
                failed => {
                    // Dropping the client closes the connection and gives the lock back.
                    drop(client);
                    return Err(match failed {
                        Ok(Err(e)) => pg_err(e),
                        _ => StoreError::Db(format!(
                            "postgres: no answer to the sweep lease's settings within {} ms",
                            liveness.as_millis()
                        )),
                    });
                }
            }
            *held = Some(client);
            Ok(Some(Box::new(()) as Box<dyn Send>))
        })
    }
}

/// The server-side TCP settings of the session holding the sweep lease (issue 29, item 9): the
/// liveness check ([`PgStore::sweep_lease_now`]) closes a connection that does not answer
/// within `liveness`, but on a path that drops packets the close never reaches the server,
/// whose session would keep the advisory lock (and every replica from sweeping) until the
/// server's TCP keepalive gives up: `tcp_keepalives_idle` 7200 s, 9 probes 75 s apart by
/// default on Linux. With these the server probes an idle lease connection after `liveness`
/// (whole seconds, at least 1) and ends the session after 3 unanswered probes 1 s apart, and
/// `tcp_user_timeout` ends it when data it sent stays unacknowledged for `liveness`. A live
/// holder's kernel answers the probes: nothing changes for it.
fn server_keepalive(liveness: std::time::Duration) -> String {
    let idle = liveness.as_secs().max(1);
    let user_ms = liveness.as_millis().max(1000);
    format!(
        "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = 1; \
         SET tcp_keepalives_count = 3; SET tcp_user_timeout = {user_ms}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TaskStore;

    /// The session that holds the sweep lease carries the server-side keepalive settings
    /// (issue 29, item 9), so the server ends it, and gives the lease up, within seconds of the
    /// path to this replica dropping packets. Needs `TASKGATE_TEST_DATABASE_URL` (skipped
    /// without it). Fails on 14e5d1c: the session kept the server's defaults (idle 0 = the
    /// OS's 7200 s).
    #[test]
    fn the_sweep_lease_session_has_server_side_keepalives() {
        let Ok(url) = std::env::var("TASKGATE_TEST_DATABASE_URL") else {
            eprintln!("SKIPPED: no TASKGATE_TEST_DATABASE_URL");
            return;
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // A database of its own (the lease is per database), dropped at the end.
        let db = format!("tg_lib_keepalive_{}", std::process::id());
        let admin = |sql: String| {
            let url = url.clone();
            runtime.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                client.batch_execute(&sql).await.unwrap();
            })
        };
        admin(format!("CREATE DATABASE {db}"));
        let base = url.split('?').next().unwrap();
        let base = &base[..base.rfind('/').unwrap()];
        let url = format!("{base}/{db}?connect_timeout=2");
        let store = runtime
            .block_on(PgStore::open(&url, 1, crate::tls::Trust::default()))
            .unwrap();
        let store2 = store.clone();
        let took = std::thread::spawn(move || store2.sweep_lease().map(|l| l.is_some()))
            .join()
            .unwrap();
        if !took.unwrap() {
            // Another test's replica holds the shared database's lease: nothing to look at.
            eprintln!("SKIPPED: the sweep lease is held elsewhere");
            return;
        }
        let holder = store.sweep_holder.clone();
        let shown = runtime.block_on(store.spawn_job(async move {
            let held = holder.lock().await;
            let client = held.as_ref().expect("the lease's connection is kept");
            let mut out = Vec::new();
            for name in [
                "tcp_keepalives_idle",
                "tcp_keepalives_interval",
                "tcp_keepalives_count",
                "tcp_user_timeout",
            ] {
                let row = client
                    .query_one(&format!("SHOW {name}"), &[])
                    .await
                    .map_err(pg_err)?;
                out.push(row.get::<_, String>(0));
            }
            Ok(out)
        }));
        drop(store);
        admin(format!("DROP DATABASE {db} WITH (FORCE)"));
        assert_eq!(shown.unwrap(), ["2", "1", "3", "2000"]);
    }

    /// Two tiers sharing one database, each in its own schema (`search_path` in the URL), each
    /// get their own sweep lease (issue 29 #18). Needs `TASKGATE_TEST_DATABASE_URL`. Fails on
    /// f2cd7c5: the lease key was one constant per database, so the second tier never swept.
    #[test]
    fn tiers_in_two_schemas_of_one_database_each_get_a_sweep_lease() {
        let Ok(url) = std::env::var("TASKGATE_TEST_DATABASE_URL") else {
            eprintln!("SKIPPED: no TASKGATE_TEST_DATABASE_URL");
            return;
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let db = format!("tg_lib_schemas_{}", std::process::id());
        let run = |url: String, sql: String| {
            runtime.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                client.batch_execute(&sql).await.unwrap();
            })
        };
        run(url.clone(), format!("CREATE DATABASE {db}"));
        let base = url.split('?').next().unwrap();
        let base = format!("{}/{db}", &base[..base.rfind('/').unwrap()]);
        run(
            base.clone(),
            "CREATE SCHEMA tier_a; CREATE SCHEMA tier_b".into(),
        );
        let open = |schema: &str| {
            let url = format!("{base}?connect_timeout=2&options=-c%20search_path%3D{schema}");
            runtime
                .block_on(PgStore::open(&url, 1, crate::tls::Trust::default()))
                .unwrap()
        };
        let (a, b) = (open("tier_a"), open("tier_b"));
        // Off the runtime, as the registry calls it; each lease is held while the other is asked.
        let (took_a, took_b) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let la = a.sweep_lease();
                    let lb = b.sweep_lease();
                    (la.map(|l| l.is_some()), lb.map(|l| l.is_some()))
                })
                .join()
                .unwrap()
        });
        drop((a, b));
        run(url.clone(), format!("DROP DATABASE {db} WITH (FORCE)"));
        assert_eq!((took_a.unwrap(), took_b.unwrap()), (true, true));
    }
}

//! The schema, as versioned migrations embedded in the binary and applied at start.
//!
//! `taskgate_schema` records each applied version. [`apply`] runs in one transaction under a
//! transaction-scoped advisory lock, so replicas starting together apply each migration once;
//! a database whose schema is newer than this binary knows is refused (downgrade protection).
//! Migrations are append-only: a released one is never edited, a change is a new version.

use super::{pg_err, pool_err};
use crate::store::StoreError;
use deadpool_postgres::Pool;

/// Seed of the migrations' advisory lock key (`'taskgate'` as bytes, plus 1), hashed with the
/// session's `current_schema()` so tiers in different schemas of one database migrate apart.
const MIGRATION_LOCK: i64 = 0x7461_736b_6761_7401;

/// `(version, SQL)`, in order.
pub(super) const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        r#"
CREATE TABLE taskgate_tasks (
    upstream           text    NOT NULL,
    task_id            text    NOT NULL,
    owner              text    NOT NULL,
    recorded_at        bigint  NOT NULL,
    expires_at         bigint  NOT NULL,
    status             text    NOT NULL,
    version            bigint  NOT NULL DEFAULT 0,
    record             text    NOT NULL,
    cancel_generation  bigint  NOT NULL DEFAULT 0,
    cancel_claimed_by  text,
    cancel_lease_until bigint,
    cancel_outcome     text,
    cancel_acked       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (upstream, task_id)
);
CREATE INDEX taskgate_tasks_by_owner
    ON taskgate_tasks (upstream, owner, recorded_at DESC, task_id DESC);
CREATE INDEX taskgate_tasks_by_expiry ON taskgate_tasks (expires_at);

CREATE TABLE taskgate_audit (
    seq      bigserial PRIMARY KEY,
    upstream text NOT NULL,
    task_id  text NOT NULL,
    event    text NOT NULL,
    body     text NOT NULL
);
CREATE INDEX taskgate_audit_by_task ON taskgate_audit (upstream, task_id, seq);
-- The facts that happen once per task are appended once, whichever replica tries.
CREATE UNIQUE INDEX taskgate_audit_once ON taskgate_audit (upstream, task_id, event)
    WHERE event IN ('created', 'status_cancelled', 'resources_released');

-- A terminal status is final (2025-11-25 basic/utilities/tasks), whoever writes.
CREATE FUNCTION taskgate_terminal_is_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('completed', 'failed', 'cancelled') AND NEW.status <> OLD.status THEN
        RAISE EXCEPTION 'task % is %, a terminal status is final', OLD.task_id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER taskgate_terminal_is_final BEFORE UPDATE OF status ON taskgate_tasks
    FOR EACH ROW EXECUTE FUNCTION taskgate_terminal_is_final();
"#,
    ),
    (
        2,
        r#"
-- Live-task slots of creations in flight (tasks.max_live_tasks_per_owner across replicas):
-- a row from the moment a task-augmented tools/call goes upstream until its task is recorded
-- (the row becomes the task in one transaction) or the call ends without one; lease_until (ms,
-- the database's clock) bounds a row a dead replica left.
CREATE TABLE taskgate_slots (
    id          bigserial PRIMARY KEY,
    upstream    text   NOT NULL,
    owner       text   NOT NULL,
    lease_until bigint NOT NULL
);
CREATE INDEX taskgate_slots_by_owner ON taskgate_slots (upstream, owner);
-- The owner's live tasks, counted when a slot is taken.
CREATE INDEX taskgate_tasks_live_by_owner ON taskgate_tasks (upstream, owner)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
"#,
    ),
    (
        3,
        r#"
-- Held sessions: the 2025-11-25 sessions taskgate holds itself for an upstream without 2025
-- sessions (layers::bridge::held), one row per (upstream, Mcp-Session-Id), written before the
-- session id is handed out; session is the JSON HeldSessionRecord; expires_at (ms, taskgate's
-- clock) is when it is idle past gateway.session_idle_ms (then never revived, and swept).
CREATE TABLE taskgate_held_sessions (
    upstream   text   NOT NULL,
    session_id text   NOT NULL,
    expires_at bigint NOT NULL,
    session    text   NOT NULL,
    PRIMARY KEY (upstream, session_id)
);
CREATE INDEX taskgate_held_sessions_by_expiry ON taskgate_held_sessions (expires_at);
"#,
    ),
    (
        4,
        r#"
-- Call leases (store::lease): the replica that holds a gateway task's tools/call (kind
-- 'held') or follows an upgraded call (kind 'followed'), renewed by it; lapse_at (ms, the
-- database's clock) passed means the replica is gone and another adopts the lease.
-- cancel_asked: a tasks/cancel answered elsewhere asks the holder to cancel its call.
CREATE TABLE taskgate_leases (
    upstream     text    NOT NULL,
    task_id      text    NOT NULL,
    kind         text    NOT NULL,
    holder       text    NOT NULL,
    lapse_at     bigint  NOT NULL,
    cancel_asked boolean NOT NULL DEFAULT false,
    PRIMARY KEY (upstream, task_id)
);
CREATE INDEX taskgate_leases_by_holder ON taskgate_leases (holder);
CREATE INDEX taskgate_leases_by_lapse ON taskgate_leases (lapse_at);
"#,
    ),
];

/// Applies every migration the database has not seen, in order, in one transaction.
///
/// Errors: the database's (unreachable, no permission to create tables), or a schema version
/// newer than [`MIGRATIONS`] knows.
pub(super) async fn apply(pool: &Pool) -> Result<(), StoreError> {
    let mut c = pool.get().await.map_err(pool_err)?;
    let tx = c.transaction().await.map_err(pg_err)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('taskgate migrations' || E'\\n' || current_schema(), $1::bigint))",
        &[&MIGRATION_LOCK],
    )
        .await
        .map_err(pg_err)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS taskgate_schema (\
         version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(pg_err)?;
    let current: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM taskgate_schema", &[])
        .await
        .map_err(pg_err)?
        .get(0);
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > known {
        return Err(StoreError::Db(format!(
            "the database schema is version {current}, newer than this taskgate knows ({known})"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql).await.map_err(pg_err)?;
        tx.execute(
            "INSERT INTO taskgate_schema (version) VALUES ($1)",
            &[version],
        )
        .await
        .map_err(pg_err)?;
        tracing::info!(version, "task store schema migrated");
    }
    tx.commit().await.map_err(pg_err)
}

/// Checks, without changing anything, that the database holds a taskgate schema this taskgate
/// can read (version 1 up to its own; the reads `taskgate tasks` makes exist since version 1).
///
/// Errors: the database's, no taskgate schema, or a schema newer than [`MIGRATIONS`] knows.
pub(super) async fn check(pool: &Pool) -> Result<(), StoreError> {
    let c = pool.get().await.map_err(pool_err)?;
    let exists: bool = c
        .query_one("SELECT to_regclass('taskgate_schema') IS NOT NULL", &[])
        .await
        .map_err(pg_err)?
        .get(0);
    let current: i32 = if exists {
        c.query_one("SELECT coalesce(max(version), 0) FROM taskgate_schema", &[])
            .await
            .map_err(pg_err)?
            .get(0)
    } else {
        0
    };
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if current == 0 {
        return Err(StoreError::Db(
            "this database holds no taskgate schema (taskgate serve creates it at start)".into(),
        ));
    }
    if current > known {
        return Err(StoreError::Db(format!(
            "the database schema is version {current}, newer than this taskgate knows ({known})"
        )));
    }
    Ok(())
}

//! The [`TaskStore`] contract, one suite run against both backends: sled (embedded) and
//! PostgreSQL (a throwaway cluster, see `common::pg`). Then what only a store shared by several
//! processes adds, with two `PgStore`s on one database standing for two replicas: the terminal
//! status enforced by the database, compare-and-swap updates racing, the cancel claim, the sweep
//! lease (kept by one replica, no connection churned per tick), audit facts appended once, and
//! the owner's live-task limit counted in the database. The held sessions' part of the contract
//! is `store_contract/held.rs`, the call leases' `store_contract/leases.rs`.

#[path = "store_contract/held.rs"]
mod held;
#[path = "store_contract/leases.rs"]
mod leases;

use crate::common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskgate::mcp::era::Era;
use taskgate::mcp::task::TaskStatus;
use taskgate::store::{
    cancel_lease, AuditEvent, CancelClaim, CancelProgress, Origin, Owner, PgStore, RecordHead,
    SharedCancelOutcome, SledStore, SlotStore, StoreError, TaskRecord, TaskStore,
};

/// The cancel claim lease of an upstream with the default `timeout_ms` (30 s).
const LEASE: Duration = Duration::from_secs(35);

/// A fresh name per run, so suites sharing a database (`TASKGATE_TEST_DATABASE_URL`) never meet.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), now_ms())
}

fn record(upstream: &str, task_id: &str, owner: &str, recorded_at: u64) -> TaskRecord {
    TaskRecord {
        upstream: upstream.into(),
        task_id: task_id.into(),
        owner: Owner::Session(owner.into()),
        upstream_session: Some("s1".into()),
        origin: Origin::Client,
        tool: Some("slow".into()),
        protocol_version: None,
        status: TaskStatus::Working,
        status_message: None,
        created_at: "2026-01-01T00:00:00Z".into(),
        last_updated_at: "2026-01-01T00:00:00Z".into(),
        ttl_ms: Some(60_000),
        poll_interval_ms: None,
        recorded_at,
        cancel_requested_at: None,
        cancelled_at: None,
        released_at: None,
        terminal_at: None,
        late_result_at: None,
        tool_error: false,
        era: Era::Legacy,
        terminal_result: None,
        terminal_error: None,
        input_requests: None,
        cancel_acked: false,
        trace_parent: None,
        expires_at: recorded_at + 60_000,
    }
}

/// The contract every backend keeps.
async fn contract(store: Arc<dyn TaskStore>) {
    let up = unique("up");
    let t0 = now_ms();
    // create, durable and readable; a second create of the key is a conflict, nothing overwritten.
    store.create(record(&up, "t1", "alice", t0)).await.unwrap();
    let mut other = record(&up, "t1", "mallory", t0);
    other.tool = Some("evil".into());
    assert!(matches!(
        store.create(other).await,
        Err(StoreError::Conflict(_))
    ));
    let got = store.get(&up, "t1").unwrap().expect("created");
    assert_eq!(got, record(&up, "t1", "alice", t0));
    assert!(store.get(&up, "nope").unwrap().is_none());
    assert!(store.get("other-upstream", "t1").unwrap().is_none());
    // Every origin reads back as written (`gateway`: issue 32's gateway-owned tasks).
    let origins = format!("{up}-origins");
    for origin in Origin::ALL {
        let id = format!("o-{}", origin.as_str());
        let mut r = record(&origins, &id, "carol", t0);
        r.origin = *origin;
        store.create(r.clone()).await.unwrap();
        assert_eq!(store.get(&origins, &id).unwrap().unwrap(), r);
    }
    // A task's creating span (issue 34) reads back as written; records without one (every
    // record above, and those written before traces) read back without one.
    let mut traced = record(&origins, "traced", "carol", t0);
    traced.trace_parent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    store.create(traced.clone()).await.unwrap();
    assert_eq!(store.get(&origins, "traced").unwrap().unwrap(), traced);
    // A failed 2025 gateway task's JSON-RPC error (issue 32) reads back as written, and is
    // written by an update too; records without one read back without one.
    let mut failed = record(&origins, "failed", "carol", t0);
    failed.origin = Origin::Gateway;
    failed.status = TaskStatus::Failed;
    failed.terminal_error = Some(r#"{"code":-32000,"message":"it broke","data":[1]}"#.into());
    store.create(failed.clone()).await.unwrap();
    assert_eq!(store.get(&origins, "failed").unwrap().unwrap(), failed);
    store
        .update(&origins, "traced", &mut |r| {
            r.terminal_error = Some(r#"{"code":-32001,"message":"x"}"#.into());
            true
        })
        .unwrap();
    let got = store.get(&origins, "traced").unwrap().unwrap();
    assert_eq!(
        got.terminal_error.as_deref(),
        Some(r#"{"code":-32001,"message":"x"}"#)
    );
    assert_eq!(store.get(&up, "t1").unwrap().unwrap().terminal_error, None);
    // A bridged task's input requests not yet answered (issue 33) read back as written, are
    // rewritten and cleared by updates; records without them read back without them.
    let asked =
        r#"{"ask-1":{"id":"ask-1","method":"elicitation/create","params":{"message":"?"}}}"#;
    let mut bridged = record(&origins, "asked", "carol", t0);
    bridged.status = TaskStatus::InputRequired;
    bridged.input_requests = Some(asked.into());
    store.create(bridged.clone()).await.unwrap();
    assert_eq!(store.get(&origins, "asked").unwrap().unwrap(), bridged);
    let two = r#"{"7":{"id":7,"method":"sampling/createMessage"},"ask-1":{"id":"ask-1","method":"elicitation/create"}}"#;
    store
        .update(&origins, "asked", &mut |r| {
            r.input_requests = Some(two.into());
            true
        })
        .unwrap();
    assert_eq!(
        store
            .get(&origins, "asked")
            .unwrap()
            .unwrap()
            .input_requests
            .as_deref(),
        Some(two)
    );
    store
        .update(&origins, "asked", &mut |r| {
            r.input_requests.take().is_some()
        })
        .unwrap();
    assert_eq!(
        store
            .get(&origins, "asked")
            .unwrap()
            .unwrap()
            .input_requests,
        None
    );
    assert_eq!(store.get(&up, "t1").unwrap().unwrap().input_requests, None);

    // update: (before, after); a change refused leaves it; unknown → None.
    let (before, after) = store
        .update(&up, "t1", &mut |r| {
            r.status = TaskStatus::InputRequired;
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(before.status, TaskStatus::Working);
    assert_eq!(after.status, TaskStatus::InputRequired);
    let (b, a) = store.update(&up, "t1", &mut |_| false).unwrap().unwrap();
    assert_eq!(b, a);
    assert!(store.update(&up, "nope", &mut |_| true).unwrap().is_none());
    assert_eq!(
        store.get(&up, "t1").unwrap().unwrap().status,
        TaskStatus::InputRequired
    );

    // update_from: the change applies to the stored record, whether `known` is that record or
    // an older one (a stale `known` never overwrites what the store holds).
    let known = store.get(&up, "t1").unwrap().unwrap();
    let (before, after) = store
        .update_from(&up, "t1", &known, &mut |r| {
            r.status_message = Some("from known".into());
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(before, known);
    assert_eq!(after.status_message.as_deref(), Some("from known"));
    assert_eq!(store.get(&up, "t1").unwrap().unwrap(), after);
    let (before, after) = store
        .update_from(&up, "t1", &known, &mut |r| {
            r.poll_interval_ms = Some(250);
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(before.status_message.as_deref(), Some("from known"));
    assert_eq!(after.status_message.as_deref(), Some("from known"));
    assert_eq!(after.poll_interval_ms, Some(250));
    assert_eq!(store.get(&up, "t1").unwrap().unwrap(), after);
    let (b, a) = store
        .update_from(&up, "t1", &known, &mut |_| false)
        .unwrap()
        .unwrap();
    assert_eq!((b.clone(), a), (after.clone(), after));
    assert!(store
        .update_from(&up, "nope", &known, &mut |_| true)
        .unwrap()
        .is_none());

    // list_owner: newest first, paged with a cursor valid only for its owner.
    for i in 2..=6 {
        store
            .create(record(&up, &format!("t{i}"), "alice", t0 + i))
            .await
            .unwrap();
    }
    store.create(record(&up, "b1", "bob", t0)).await.unwrap();
    let alice = Owner::Session("alice".into());
    let (page, next) = store.list_owner(&up, &alice, None, 4).unwrap();
    let ids: Vec<_> = page.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, ["t6", "t5", "t4", "t3"]);
    let next = next.expect("more remain");
    assert!(store.cursor_is_valid(&up, &alice, &next));
    assert!(!store.cursor_is_valid(&up, &Owner::Session("bob".into()), &next));
    let (page, last) = store.list_owner(&up, &alice, Some(&next), 4).unwrap();
    let ids: Vec<_> = page.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, ["t2", "t1"]);
    assert!(last.is_none());

    // audit: appended in order, read back.
    for ev in ["created", "cancel_requested"] {
        store
            .append_audit(&AuditEvent {
                time: now_ms(),
                upstream: up.clone(),
                task_id: "t1".into(),
                owner: alice.clone(),
                event: ev.into(),
                detail: String::new(),
            })
            .unwrap();
    }
    let events: Vec<_> = store
        .audit_for(&up, "t1")
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(events, ["created", "cancel_requested"]);

    // expired: only records whose time is up; remove takes the audit with it.
    let mut old = record(&up, "old", "alice", t0);
    old.expires_at = 1;
    store.create(old).await.unwrap();
    let expired = store.expired(t0, 10_000).unwrap();
    assert!(expired.contains(&(up.clone(), "old".to_string())));
    assert!(!expired.iter().any(|(u, id)| u == &up && id == "t1"));
    assert!(store.remove(&up, "t1").unwrap().is_some());
    assert!(store.remove(&up, "t1").unwrap().is_none());
    assert!(store.audit_for(&up, "t1").unwrap().is_empty());

    // scan_heads: the head of every record scan sees, in the same order, escaped strings too.
    let mut odd = record(&up, "q\"uote\\d\n", "unused", t0 + 9);
    odd.owner = Owner::Principal("p\u{1F600}\"é".into());
    odd.status = TaskStatus::Cancelled;
    odd.cancelled_at = Some(t0);
    store.create(odd).await.unwrap();
    let owned = |h: RecordHead<'_>| {
        let key = (h.upstream.into_owned(), h.task_id.into_owned());
        (
            key,
            h.owner.into_owned(),
            h.status,
            h.cancelled_at,
            h.released_at,
        )
    };
    let mut want = Vec::new();
    store
        .scan(&mut |r| {
            if r.upstream == up {
                want.push(owned(RecordHead::of(&r)));
            }
            true
        })
        .unwrap();
    let mut heads = Vec::new();
    store
        .scan_heads(&mut |h| {
            if h.upstream == up {
                heads.push(owned(h));
            }
            true
        })
        .unwrap();
    assert_eq!(heads, want);
    let odd_owner = "principal:p\u{1F600}\"é";
    assert!(heads
        .iter()
        .any(|h| h.1 == odd_owner && h.0 .1 == "q\"uote\\d\n"));

    // scan sees every record of this run.
    let mut seen = 0;
    store
        .scan(&mut |r| {
            seen += usize::from(r.upstream == up);
            true
        })
        .unwrap();
    assert_eq!(seen, 8, "t2..t6, b1, old, and the odd one");
    store.sync().await.unwrap();
    store.ping().await.unwrap();
    held::contract(store.clone()).await;
    leases::contract(store).await;
}

#[tokio::test]
async fn contract_sled() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    assert!(!store.shared());
    contract(store.clone()).await;
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_postgres() {
    let Some(pg) = PgCluster::start("contract_postgres") else {
        return;
    };
    let store = PgStore::open(&pg.url, 4, taskgate::tls::Trust::default())
        .await
        .unwrap();
    assert!(store.shared());
    contract(store.clone()).await;
    // Opening again (a second replica, or a restart) finds the schema migrated: no error.
    PgStore::open(&pg.url, 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
}

/// What a shared store adds, with two replicas' stores on one database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_share_one_truth() {
    let Some(pg) = PgCluster::start("postgres_replicas_share_one_truth") else {
        return;
    };
    let a = PgStore::open(&pg.url, 4, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let b = PgStore::open(&pg.url, 4, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let up = unique("tier");
    a.create(record(&up, "t1", "alice", now_ms()))
        .await
        .unwrap();
    // Created on a, read on b at once.
    assert!(b.get(&up, "t1").unwrap().is_some());

    // Racing compare-and-swap updates from both replicas: none lost.
    let bump = |s: Arc<PgStore>, up: String| {
        std::thread::spawn(move || {
            for _ in 0..25 {
                s.update(&up, "t1", &mut |r| {
                    r.poll_interval_ms = Some(r.poll_interval_ms.unwrap_or(0) + 1);
                    true
                })
                .unwrap();
            }
        })
    };
    let (ja, jb) = (bump(a.clone(), up.clone()), bump(b.clone(), up.clone()));
    ja.join().unwrap();
    jb.join().unwrap();
    assert_eq!(
        a.get(&up, "t1").unwrap().unwrap().poll_interval_ms,
        Some(50)
    );

    // Cancel claim: a forwards, b waits, b reads a's outcome; then the ack is final (2026).
    let claim = a.claim_cancel(&up, "t1", true, LEASE).unwrap();
    let CancelClaim::Forward { generation } = claim else {
        panic!("first claim forwards: {claim:?}")
    };
    assert_eq!(
        b.claim_cancel(&up, "t1", true, LEASE).unwrap(),
        CancelClaim::Wait { generation }
    );
    assert_eq!(
        b.cancel_outcome(&up, "t1", generation).unwrap(),
        CancelProgress::InFlight
    );
    let ack = SharedCancelOutcome::Result(r#"{"resultType":"complete"}"#.into());
    a.finish_cancel(&up, "t1", generation, &ack).unwrap();
    assert_eq!(
        b.cancel_outcome(&up, "t1", generation).unwrap(),
        CancelProgress::Done(ack)
    );
    assert_eq!(
        b.claim_cancel(&up, "t1", true, LEASE).unwrap(),
        CancelClaim::Acknowledged
    );

    // Terminal is final in the database: a replica's stale write cannot undo it.
    a.update(&up, "t1", &mut |r| {
        r.status = TaskStatus::Cancelled;
        true
    })
    .unwrap();
    let undo = b.update(&up, "t1", &mut |r| {
        r.status = TaskStatus::Working;
        true
    });
    assert!(
        matches!(&undo, Err(StoreError::Db(m)) if m.contains("terminal status is final")),
        "{undo:?}"
    );
    assert_eq!(
        b.claim_cancel(&up, "t1", false, LEASE).unwrap(),
        CancelClaim::Terminal(TaskStatus::Cancelled)
    );

    // Once-only audit facts are appended once, whichever replica tries.
    let ev = AuditEvent {
        time: now_ms(),
        upstream: up.clone(),
        task_id: "t1".into(),
        owner: Owner::Session("alice".into()),
        event: "status_cancelled".into(),
        detail: String::new(),
    };
    a.append_audit(&ev).unwrap();
    b.append_audit(&ev).unwrap();
    assert_eq!(a.audit_for(&up, "t1").unwrap().len(), 1);

    // The sweep lease: one holder at a time (more in `postgres_sweep_lease_...`).
    assert!(a.sweep_lease().unwrap().is_some(), "a sweeps");
    assert!(b.sweep_lease().unwrap().is_none(), "b must not sweep now");
}

/// The sweep lease stays with the replica that took it while that replica lives, and neither
/// the holder nor a replica that tries every tick opens or closes a connection per tick (before:
/// each attempt took a connection out of the pool and closed it, on every replica, every tick).
/// When the holder goes away, another replica takes the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sweep_lease_is_sticky_and_churns_no_connection() {
    let Some(pg) = PgCluster::start("postgres_sweep_lease_is_sticky_and_churns_no_connection")
    else {
        return;
    };
    let sep = if pg.url.contains('?') { '&' } else { '?' };
    let named = |name: &str| format!("{}{sep}application_name={name}", pg.url);
    let a = PgStore::open(&named("tg-a"), 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let b = PgStore::open(&named("tg-b"), 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let (client, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut pids: std::collections::HashMap<String, std::collections::HashSet<i32>> =
        Default::default();
    let mut holders = Vec::new();
    for _ in 0..20 {
        let (sa, sb) = (a.clone(), b.clone());
        let got = tokio::task::spawn_blocking(move || {
            let got_a = sa.sweep_lease().unwrap().is_some();
            (got_a, sb.sweep_lease().unwrap().is_some())
        })
        .await
        .unwrap();
        holders.push(got);
        let rows = client
            .query(
                "SELECT application_name, pid FROM pg_stat_activity \
                 WHERE application_name IN ('tg-a', 'tg-b')",
                &[],
            )
            .await
            .unwrap();
        for r in rows {
            pids.entry(r.get(0)).or_default().insert(r.get(1));
        }
    }
    for name in ["tg-a", "tg-b"] {
        let n = pids.get(name).map_or(0, |p| p.len());
        assert!(
            n <= 2,
            "{name}: {n} connections over 20 ticks (pool of 2): {pids:?}"
        );
    }
    assert_eq!(
        holders,
        vec![(true, false); 20],
        "a keeps the lease, b never gets it"
    );
    // The holder goes away (its connection closes): b takes the lease at a later tick.
    drop(a);
    let got = eventually(STEP, || {
        let b = b.clone();
        async move {
            tokio::task::spawn_blocking(move || b.sweep_lease().unwrap())
                .await
                .unwrap()
        }
    })
    .await;
    assert!(got.is_some(), "the lease is free once its holder is gone");
}

/// `tasks.max_live_tasks_per_owner` across replicas: 16 creators of one owner, half on each of
/// two stores, all at once, take a slot and record their task in it: exactly `limit` succeed.
/// A task turned terminal and a slot given back each make room; a slot whose lease ran out (a
/// replica killed mid-creation) counts no more; another owner is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_owner_limit_holds_across_replicas() {
    let Some(pg) = PgCluster::start("postgres_owner_limit_holds_across_replicas") else {
        return;
    };
    const LIMIT: usize = 3;
    let a = PgStore::open(&pg.url, 4, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let b = PgStore::open(&pg.url, 4, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let up = unique("limit");
    let alice = Owner::Session("alice".into());
    let start = Arc::new(std::sync::Barrier::new(16));
    let rt = tokio::runtime::Handle::current();
    let creators: Vec<_> = (0..16)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (up, alice, start, rt) = (up.clone(), alice.clone(), start.clone(), rt.clone());
            std::thread::spawn(move || {
                start.wait();
                let slot = store.reserve_slot(&up, &alice, LIMIT, LEASE).unwrap()?;
                let task = record(&up, &format!("t{i}"), "alice", now_ms());
                rt.block_on(store.create_in_slot(task, slot)).unwrap();
                Some(i)
            })
        })
        .collect();
    let created: Vec<_> = creators
        .into_iter()
        .filter_map(|c| c.join().unwrap())
        .collect();
    assert_eq!(created.len(), LIMIT, "{created:?}");
    let (live, _) = a.list_owner(&up, &alice, None, 100).unwrap();
    assert_eq!(live.len(), LIMIT);
    assert_eq!(b.reserve_slot(&up, &alice, LIMIT, LEASE).unwrap(), None);
    let bob = Owner::Session("bob".into());
    assert!(b.reserve_slot(&up, &bob, LIMIT, LEASE).unwrap().is_some());

    // A terminal task makes room; the slot, given back, makes room again.
    let done = &live[0].task_id;
    a.update(&up, done, &mut |r| {
        r.status = TaskStatus::Completed;
        true
    })
    .unwrap();
    let slot = b
        .reserve_slot(&up, &alice, LIMIT, LEASE)
        .unwrap()
        .expect("room");
    assert_eq!(a.reserve_slot(&up, &alice, LIMIT, LEASE).unwrap(), None);
    b.release_slot(slot);
    let slot = eventually(STEP, || {
        let a = a.clone();
        let (up, alice) = (up.clone(), alice.clone());
        async move {
            tokio::task::spawn_blocking(move || a.reserve_slot(&up, &alice, LIMIT, LEASE).unwrap())
                .await
                .unwrap()
        }
    })
    .await;
    assert!(slot.is_some(), "the given-back slot is free");
    // That slot's replica dies (nothing gives it back): it counts until its lease ends.
    a.update(&up, &live[1].task_id, &mut |r| {
        r.status = TaskStatus::Failed;
        true
    })
    .unwrap();
    let short = Duration::from_millis(1);
    assert!(a.reserve_slot(&up, &alice, LIMIT, short).unwrap().is_some());
    let after_lease = eventually(STEP, || {
        let b = b.clone();
        let (up, alice) = (up.clone(), alice.clone());
        async move {
            tokio::task::spawn_blocking(move || b.reserve_slot(&up, &alice, LIMIT, LEASE).unwrap())
                .await
                .unwrap()
        }
    })
    .await;
    assert!(after_lease.is_some(), "an expired slot counts no more");
}

/// An unreachable database is a clear error at start, naming the URL without its password.
#[tokio::test]
async fn postgres_unreachable_is_a_clear_error() {
    let port = free_port();
    let url = format!("postgres://taskgate:secret@127.0.0.1:{port}/postgres?connect_timeout=2");
    let err = PgStore::open(&url, 1, taskgate::tls::Trust::default())
        .await
        .err()
        .expect("nothing listens");
    let text = err.to_string();
    assert!(text.contains("cannot open the task store"), "{text}");
    assert!(!text.contains("secret"), "{text}");
    assert!(text.contains(&port.to_string()), "{text}");
}

/// `check-config` reaches the database (read only) and says clearly when it cannot; `/readyz`
/// turns 503 naming the store when the database goes away, and 200 again when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_and_readyz_report_the_database() {
    let Some(pg) = PgCluster::start("check_config_and_readyz_report_the_database") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tier.toml");
    std::fs::write(
        &file,
        "[gateway]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [store]\nbackend = \"postgres\"\nurl_env = \"TG_TEST_DB\"\n\
         [[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let ok = run_taskgate(&["check-config", f], &[("TG_TEST_DB", &pg.url)]);
    assert!(ok.status.success(), "{} {}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("reachable"), "{}", ok.stdout);
    let dead = format!(
        "postgres://taskgate:hunter2@127.0.0.1:{}/postgres?connect_timeout=2",
        free_port()
    );
    let bad = run_taskgate(&["check-config", f], &[("TG_TEST_DB", &dead)]);
    assert!(!bad.status.success());
    assert!(bad.stderr.contains("unreachable"), "{}", bad.stderr);
    assert!(!bad.stderr.contains("hunter2"), "{}", bad.stderr);
    let unset = run_taskgate(&["check-config", f], &[]);
    assert!(!unset.status.success());
    assert!(unset.stderr.contains("TG_TEST_DB"), "{}", unset.stderr);

    // /readyz follows the database.
    std::env::set_var("TG_TEST_DB", &pg.url);
    let upstream = Upstream::start(|_| ScriptedResponse::json("{}".to_string())).await;
    let toml = std::fs::read_to_string(&file)
        .unwrap()
        .replace("http://127.0.0.1:9/mcp", &upstream.url());
    let config = taskgate::config::Config::from_toml_str(&toml).unwrap();
    let running = taskgate::gateway::start(config).await.unwrap();
    let readyz = format!("http://{}/readyz", running.admin_addr);
    let r = Req::get(&readyz).send().await;
    let (status, body) = (r.status(), r.text().await);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""store":"ok""#), "{body}");
    drop(pg);
    let down = eventually(STEP * 2, || {
        let readyz = readyz.clone();
        async move {
            let r = Req::get(&readyz).send().await;
            let (status, body) = (r.status(), r.text().await);
            (status == 503 && body.contains(r#""store":"unreachable"#)).then_some(body)
        }
    })
    .await;
    assert!(down.is_some(), "readyz reports the database gone");
    // A task request that needs the registry gets -32603, not "Task not found".
    let url = format!("http://{}/mcp", running.gateway_addr);
    let (_, v) = task_call(&url, None, 7, "tasks/get", "t-any").await;
    assert_eq!(v["error"]["code"], -32603, "{v}");
    // So does a 2026-07-28 subscriptions/listen naming a task: it is refused, not narrowed
    // silently to the tasks that could be read.
    let listen = r#"{"jsonrpc":"2.0","id":8,"method":"subscriptions/listen","params":{"notifications":{"taskIds":["t-any"]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}"#;
    let r = Req::mcp_post(&url, listen)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .send()
        .await;
    let v = r.json().await;
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unavailable"),
        "{v}"
    );
    assert_eq!(upstream.count(), 0, "nothing reached the upstream");
    let m = Req::get(&format!("http://{}/metrics", running.admin_addr))
        .send()
        .await
        .text()
        .await;
    assert!(
        m.contains(r#"reason="store_unavailable",upstream="default"} 2"#),
        "{m}"
    );
    running.shutdown().await;
}

/// The cancel claim's lease follows the upstream's `timeout_ms` (plus the margin): a slow
/// upstream's cancel (40 s here, past the old fixed 30 s) is not claimed again while it may still
/// be answering; a lease that ran out is claimed again, and the late outcome of the expired claim
/// is not taken for the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cancel_lease_follows_the_upstream_timeout() {
    let Some(pg) = PgCluster::start("postgres_cancel_lease_follows_the_upstream_timeout") else {
        return;
    };
    let a = PgStore::open(&pg.url, 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let b = PgStore::open(&pg.url, 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let up = unique("lease");
    for id in ["slow", "short"] {
        a.create(record(&up, id, "alice", now_ms())).await.unwrap();
    }

    let lease = cancel_lease(Duration::from_secs(40));
    assert_eq!(lease, Duration::from_secs(45));
    let before = now_ms() as i64;
    let claim = a.claim_cancel(&up, "slow", false, lease).unwrap();
    let after = now_ms() as i64;
    assert_eq!(claim, CancelClaim::Forward { generation: 1 });
    let (client, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let until: i64 = client
        .query_one(
            "SELECT cancel_lease_until FROM taskgate_tasks WHERE upstream = $1 AND task_id = $2",
            &[&up, &"slow"],
        )
        .await
        .unwrap()
        .get(0);
    // The lease is the database's clock (`clock_timestamp()` in ms, rounded by the `::bigint`
    // cast, where `now_ms` truncates): up to 1 ms past `after`.
    assert!(
        (before + 45_000..=after + 45_001).contains(&until),
        "lease until {until}, claimed between {before} and {after}"
    );
    assert_eq!(
        b.claim_cancel(&up, "slow", false, lease).unwrap(),
        CancelClaim::Wait { generation: 1 }
    );

    // A lease that ran out (a replica that died while forwarding) is claimed again.
    let short = Duration::from_millis(300);
    assert_eq!(
        a.claim_cancel(&up, "short", false, short).unwrap(),
        CancelClaim::Forward { generation: 1 }
    );
    assert_eq!(
        b.claim_cancel(&up, "short", false, short).unwrap(),
        CancelClaim::Wait { generation: 1 }
    );
    // The waiter sees the claim lapse (a replica killed while forwarding), and takes it over:
    // the claim says so, since the lapsed one's cancel may have reached the upstream.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match b.cancel_outcome(&up, "short", 1).unwrap() {
            CancelProgress::Lapsed => break,
            CancelProgress::InFlight => {}
            other => panic!("{other:?}"),
        }
        assert!(Instant::now() < deadline, "the 300 ms lease never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        b.claim_cancel(&up, "short", false, short).unwrap(),
        CancelClaim::TakeOver { generation: 2 }
    );
    let late = SharedCancelOutcome::Result("{}".into());
    a.finish_cancel(&up, "short", 1, &late).unwrap();
    // The lapsed claim's late outcome is not taken for the new one, whose waiters wait on.
    assert_eq!(
        a.cancel_outcome(&up, "short", 1).unwrap(),
        CancelProgress::Lapsed
    );
    assert_eq!(
        b.cancel_outcome(&up, "short", 2).unwrap(),
        CancelProgress::InFlight
    );
    // The new claim's outcome reaches the waiters of both.
    let done = SharedCancelOutcome::Error(r#"{"code":-32602,"message":"x"}"#.into());
    b.finish_cancel(&up, "short", 2, &done).unwrap();
    assert_eq!(
        a.cancel_outcome(&up, "short", 1).unwrap(),
        CancelProgress::Done(done.clone())
    );
    assert_eq!(
        b.cancel_outcome(&up, "short", 2).unwrap(),
        CancelProgress::Done(done)
    );
    // A claim that ended with an outcome is claimed again as a plain forward.
    assert_eq!(
        b.claim_cancel(&up, "short", false, short).unwrap(),
        CancelClaim::Forward { generation: 3 }
    );
}

/// TLS to the database: with `sslmode=require` and `store.ca_file`, the pool's connections are
/// encrypted (the server's `pg_stat_ssl` says so); without the CA, or under a host name the
/// certificate does not name, taskgate refuses to connect instead of trusting the server; the
/// default `sslmode=prefer` connects in plain text as before TLS support.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_verifies_the_server() {
    let Some((pg, ca)) = PgCluster::start_tls("postgres_tls_verifies_the_server") else {
        return;
    };
    let require = format!("{}?sslmode=require&application_name=tg-tls", pg.url);
    let store = PgStore::open(&require, 2, taskgate::tls::Trust::file(&ca))
        .await
        .expect("TLS with the CA");
    let store: Arc<dyn TaskStore> = store;
    let r = record("up", &unique("tls"), "principal:a", 1);
    store.create(r.clone()).await.expect("create over TLS");
    assert!(store.get("up", &r.task_id).unwrap().is_some());
    // The server's own view: taskgate's connections use TLS.
    let plain = format!("{}?sslmode=disable", pg.url);
    let (client, conn) = tokio_postgres::connect(&plain, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let encrypted: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.application_name = 'tg-tls'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(encrypted >= 1, "no TLS connection from taskgate");
    // `prefer` (the default) connects in plain text, as before TLS support: a server whose
    // certificate taskgate cannot verify still serves a URL that did not ask for TLS.
    let default_mode = format!("{}?application_name=tg-plain", pg.url);
    let _plain = PgStore::open(&default_mode, 1, taskgate::tls::Trust::default())
        .await
        .expect("sslmode=prefer (the default) connects without TLS");
    let plain_tls: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.application_name = 'tg-plain'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain_tls, 0, "prefer must not encrypt unverified");
    driver.abort();

    let err = PgStore::open(&require, 1, taskgate::tls::Trust::default())
        .await
        .err()
        .expect("unknown CA refused");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    let by_name = require.replace("127.0.0.1", "localhost");
    let err = PgStore::open(&by_name, 1, taskgate::tls::Trust::file(&ca))
        .await
        .err()
        .expect("a host name the certificate does not name is refused");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}

/// mTLS to the database (`store.client_cert_file`, `store.client_key_file`): a role whose
/// `pg_hba.conf` line is `hostssl … cert` is reached with the client certificate (the server sees
/// its CN) and refused without it; the certificate with a URL that does not say
/// `sslmode=require` is refused before connecting, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_presents_the_client_certificate() {
    let Some((pg, ca)) = PgCluster::start_tls("postgres_presents_the_client_certificate") else {
        return;
    };
    let dir = ca.parent().unwrap().to_path_buf();
    let (client, conn) = tokio_postgres::connect(
        &format!("{}?sslmode=disable", pg.url),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let driver = tokio::spawn(conn);
    client
        .batch_execute("CREATE ROLE tgcert LOGIN SUPERUSER")
        .await
        .unwrap();
    // The `cert` method for the role, ahead of the cluster's `trust` lines.
    let hba = dir.join("data").join("pg_hba.conf");
    let before = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!(
            "hostssl all tgcert 127.0.0.1/32 cert\nhost all tgcert 127.0.0.1/32 reject\n{before}"
        ),
    )
    .unwrap();
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    let url =
        pg.url.replacen("taskgate@", "tgcert@", 1) + "?sslmode=require&application_name=tg-mtls";
    let (cert, key) = (dir.join("client.crt"), dir.join("client.key"));
    let with_cert = taskgate::tls::ClientTls {
        trust: taskgate::tls::Trust::file(&ca),
        client_auth: Some(taskgate::tls::ClientAuth {
            cert_file: &cert,
            key_file: &key,
        }),
    };
    // The reload is asynchronous: the first refusal without a certificate says it took effect.
    let mut refused = None;
    for _ in 0..100 {
        match PgStore::open(&url, 1, taskgate::tls::Trust::file(&ca)).await {
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let refused = refused.expect("without the client certificate the role is refused");
    assert!(
        refused.contains("certificate") || refused.contains("tgcert"),
        "{refused}"
    );
    let store: Arc<dyn TaskStore> = PgStore::open(&url, 1, with_cert)
        .await
        .expect("the client certificate is presented");
    let r = record("up", &unique("mtls"), "principal:a", 1);
    store.create(r.clone()).await.expect("create over mTLS");
    let dn: String = client
        .query_one(
            "SELECT s.client_dn FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.application_name = 'tg-mtls' LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(dn.contains("CN=tgcert"), "the server saw {dn:?}");
    // The certificate without TLS would never be sent: refused before connecting.
    let plain = url.replace("sslmode=require", "sslmode=prefer");
    let err = PgStore::open(&plain, 1, with_cert)
        .await
        .err()
        .expect("a client certificate without sslmode=require is refused");
    assert!(
        err.to_string().contains("store.client_cert_file")
            && err.to_string().contains("sslmode=require"),
        "{err}"
    );
    driver.abort();
}

/// `store.ca_roots = "system"` against a real PostgreSQL with TLS: `check-config` (the binary,
/// so the trust store is read from its own environment) reaches the database when the system
/// store (`SSL_CERT_FILE`) holds the database's CA, and names the certificate when it does not.
#[test]
fn check_config_trusts_the_system_store_for_the_database() {
    let Some((pg, ca)) =
        PgCluster::start_tls("check_config_trusts_the_system_store_for_the_database")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tls.toml");
    std::fs::write(
        &file,
        "[gateway]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [store]\nbackend = \"postgres\"\nurl_env = \"TG_TEST_DB\"\nca_roots = \"system\"\n\
         [[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let url = format!("{}?sslmode=require&connect_timeout=5", pg.url);
    // Only the file: an empty directory instead of this machine's own.
    let no_dir = dir.path().join("empty");
    std::fs::create_dir(&no_dir).unwrap();
    let env = |cert_file: &std::path::Path| {
        [
            ("TG_TEST_DB", url.clone()),
            ("SSL_CERT_FILE", cert_file.to_str().unwrap().to_string()),
            ("SSL_CERT_DIR", no_dir.to_str().unwrap().to_string()),
        ]
    };
    let with = env(&ca);
    let with: Vec<(&str, &str)> = with.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ok = run_taskgate(&["check-config", f], &with);
    assert!(ok.status.success(), "{} {}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("reachable"), "{}", ok.stdout);
    // A store holding another certificate only: the database's is not trusted.
    let other = ca.parent().unwrap().join("client.crt");
    let without = env(&other);
    let without: Vec<(&str, &str)> = without.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let bad = run_taskgate(&["check-config", f], &without);
    assert!(!bad.status.success(), "{}", bad.stdout);
    assert!(
        bad.stderr.to_lowercase().contains("certificate"),
        "{}",
        bad.stderr
    );
}

/// A row an earlier taskgate wrote (its `record` text as that code wrote it: no `era`, a
/// terminal result as an escaped JSON string) is read, updated and read back by this one, and
/// the text written back is the record's JSON as serde writes it (issue 36: the record's JSON
/// is now written by hand; the stored form must not change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_and_updates_a_record_in_the_old_encoding() {
    let Some(pg) = PgCluster::start("old_encoding") else {
        return;
    };
    let store = PgStore::open(&pg.url, 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let (client, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let up = unique("old");
    let old = format!(
        r#"{{"upstream":"{up}","task_id":"t1","owner":"session:s-1","upstream_session":"s-1","origin":"client","tool":"slow","protocol_version":"2025-11-25","status":"completed","status_message":null,"created_at":"2026-01-01T00:00:00Z","last_updated_at":"2026-01-01T00:00:01Z","ttl_ms":60000,"poll_interval_ms":null,"recorded_at":1,"cancel_requested_at":null,"cancelled_at":null,"released_at":null,"terminal_at":5,"expires_at":60001,"terminal_result":"{{\"content\":[{{\"type\":\"text\",\"text\":\"a\\\"b\"}}]}}"}}"#
    );
    client
        .execute(
            "INSERT INTO taskgate_tasks (upstream, task_id, owner, recorded_at, expires_at, status, record) \
             VALUES ($1, 't1', 'session:s-1', 1, 60001, 'completed', $2)",
            &[&up, &old],
        )
        .await
        .unwrap();
    let (s, u) = (store.clone(), up.clone());
    let (read, updated) = tokio::task::spawn_blocking(move || {
        let read = s.get(&u, "t1").unwrap().unwrap();
        let updated = s
            .update(&u, "t1", &mut |r| {
                r.released_at = Some(7);
                true
            })
            .unwrap()
            .unwrap();
        (read, updated)
    })
    .await
    .unwrap();
    assert_eq!(read.era, Era::Legacy, "no era: a record from before eras");
    assert_eq!(read.owner, Owner::Session("s-1".into()));
    assert_eq!(
        read.terminal_result.as_deref(),
        Some(r#"{"content":[{"type":"text","text":"a\"b"}]}"#)
    );
    assert_eq!(updated.0, read);
    assert_eq!(updated.1.released_at, Some(7));
    let text: String = client
        .query_one(
            "SELECT record FROM taskgate_tasks WHERE upstream = $1 AND task_id = 't1'",
            &[&up],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(text, serde_json::to_string(&updated.1).unwrap());
    let again: TaskRecord = serde_json::from_str(&text).unwrap();
    assert_eq!(again, updated.1);
}

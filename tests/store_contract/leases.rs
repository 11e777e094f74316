//! The call-lease part of the [`TaskStore`] contract (`store::lease`, issue 32 and issue 35):
//! taken, asked to cancel (each ask read once), renewed, ended, and adopted once lapsed; then,
//! with two `PgStore`s on one database standing for two replicas, what only a shared store
//! adds: the ask reaches the holder only, a lapsed lease is adopted by one replica, and a
//! replica cannot end a lease another one adopted.

use super::*;
use taskgate::store::{Adopted, LeaseKind, LeaseStore};

fn key(up: &str, id: &str) -> (String, String) {
    (up.to_string(), id.to_string())
}

/// Polls `adopt_lapsed` until it adopts something (the lapse must pass: no fixed sleep).
async fn adopt_when_lapsed(l: &dyn LeaseStore) -> Vec<Adopted> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = l.adopt_lapsed(Duration::from_secs(60), 100).await.unwrap();
        if !got.is_empty() || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What every backend keeps, one process holding every lease.
pub async fn contract(store: Arc<dyn TaskStore>) {
    let l = store.leases().expect("the store keeps call leases");
    let up = unique("leases");
    let long = Duration::from_secs(60);
    l.take_lease(&up, "held-1", LeaseKind::Held, long)
        .await
        .unwrap();
    l.take_lease(&up, "followed-1", LeaseKind::Followed, long)
        .await
        .unwrap();
    // Nothing asked yet; an ask is read once.
    assert!(l.cancels_asked().await.unwrap().iter().all(|k| k.0 != up));
    assert!(l.ask_cancel(&up, "held-1").await.unwrap());
    assert!(!l.ask_cancel(&up, "no-such").await.unwrap());
    let asked: Vec<_> = l
        .cancels_asked()
        .await
        .unwrap()
        .into_iter()
        .filter(|k| k.0 == up)
        .collect();
    assert_eq!(asked, vec![key(&up, "held-1")]);
    assert!(l.cancels_asked().await.unwrap().iter().all(|k| k.0 != up));
    // Renewed leases never lapse while renewed; nothing of this upstream is adoptable.
    let renewed = l.renew_leases(long).await.unwrap();
    assert!(renewed.contains(&key(&up, "held-1")), "{renewed:?}");
    assert!(renewed.contains(&key(&up, "followed-1")), "{renewed:?}");
    let adopted = l.adopt_lapsed(long, 100).await.unwrap();
    assert!(adopted.iter().all(|a| a.upstream != up), "{adopted:?}");
    // An ended lease is gone: no ask reaches it.
    l.end_lease(&up, "held-1").await.unwrap();
    assert!(!l.ask_cancel(&up, "held-1").await.unwrap());
    l.end_lease(&up, "followed-1").await.unwrap();
    // A lease not renewed within its lapse is adopted, once, with its kind; asking a lapsed
    // lease to cancel asks nobody.
    l.take_lease(
        &up,
        "lapsing",
        LeaseKind::Followed,
        Duration::from_millis(50),
    )
    .await
    .unwrap();
    let adopted: Vec<_> = adopt_when_lapsed(l)
        .await
        .into_iter()
        .filter(|a| a.upstream == up)
        .collect();
    assert_eq!(
        adopted,
        vec![Adopted {
            upstream: up.clone(),
            task_id: "lapsing".into(),
            kind: LeaseKind::Followed
        }]
    );
    let again = l.adopt_lapsed(long, 100).await.unwrap();
    assert!(
        again.iter().all(|a| a.upstream != up),
        "adopted once: {again:?}"
    );
    // Given back (its adoption failed): adopted again.
    l.let_lapse(&up, "lapsing").await.unwrap();
    let again: Vec<_> = l
        .adopt_lapsed(long, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.upstream == up)
        .collect();
    assert_eq!(again.len(), 1, "adopted again: {again:?}");
    l.end_lease(&up, "lapsing").await.unwrap();
    l.take_lease(&up, "short", LeaseKind::Held, Duration::from_millis(1))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while l.ask_cancel(&up, "short").await.unwrap() {
        assert!(Instant::now() < deadline, "the lease lapses");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    l.end_lease(&up, "short").await.unwrap();
}

/// Two replicas on one database: a cancel asked on one reaches the other, which holds the
/// call; the holder's lapsed lease is adopted by the survivor only, which then holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leases_reach_the_holder_and_are_adopted_once() {
    let Some(pg) = PgCluster::start("postgres_leases_reach_the_holder_and_are_adopted_once") else {
        return;
    };
    let a = PgStore::open(&pg.url, 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let b = PgStore::open(&pg.url, 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let (la, lb) = (a.leases().unwrap(), b.leases().unwrap());
    let up = unique("tier-leases");
    la.take_lease(&up, "t1", LeaseKind::Held, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(lb.ask_cancel(&up, "t1").await.unwrap(), "B asks A's lease");
    assert!(
        lb.cancels_asked().await.unwrap().is_empty(),
        "not B's lease"
    );
    assert_eq!(la.cancels_asked().await.unwrap(), vec![key(&up, "t1")]);
    assert!(la.cancels_asked().await.unwrap().is_empty(), "read once");
    // A stops renewing (a kill -9): its lease lapses and B adopts it, A does not get it too.
    la.take_lease(&up, "t2", LeaseKind::Followed, Duration::from_millis(100))
        .await
        .unwrap();
    let adopted: Vec<_> = adopt_when_lapsed(lb)
        .await
        .into_iter()
        .filter(|x| x.upstream == up)
        .collect();
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    assert_eq!(
        (adopted[0].task_id.as_str(), adopted[0].kind),
        ("t2", LeaseKind::Followed)
    );
    assert!(la
        .adopt_lapsed(Duration::from_secs(60), 100)
        .await
        .unwrap()
        .iter()
        .all(|x| x.upstream != up));
    // A's renewal no longer returns it (A stalled past the lapse: its call must stop).
    let renewed_a = la.renew_leases(Duration::from_secs(60)).await.unwrap();
    assert!(renewed_a.contains(&key(&up, "t1")), "{renewed_a:?}");
    assert!(
        !renewed_a.contains(&key(&up, "t2")),
        "adopted by B: {renewed_a:?}"
    );
    // The lease is B's now: A ending it (its call ended late) leaves it; B renews it.
    la.end_lease(&up, "t2").await.unwrap();
    assert!(la.ask_cancel(&up, "t2").await.unwrap(), "still B's lease");
    assert_eq!(lb.cancels_asked().await.unwrap(), vec![key(&up, "t2")]);
    let renewed_b = lb.renew_leases(Duration::from_secs(60)).await.unwrap();
    assert_eq!(renewed_b, vec![key(&up, "t2")]);
    assert_eq!(
        la.renew_leases(Duration::from_secs(60)).await.unwrap(),
        vec![key(&up, "t1")],
        "A still holds t1"
    );
    // B's adoption failed: it gives the lease back (not ended); A cannot, not being its
    // holder. B's renewals no longer keep it, and the next poll of any replica adopts it again.
    la.let_lapse(&up, "t2").await.unwrap();
    assert!(
        la.ask_cancel(&up, "t2").await.unwrap(),
        "A gave back nothing"
    );
    assert!(lb.cancels_asked().await.unwrap().contains(&key(&up, "t2")));
    lb.let_lapse(&up, "t2").await.unwrap();
    assert!(lb
        .renew_leases(Duration::from_secs(60))
        .await
        .unwrap()
        .is_empty());
    let again = la.adopt_lapsed(Duration::from_secs(60), 100).await.unwrap();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].task_id, "t2");
    la.end_lease(&up, "t2").await.unwrap();
    lb.end_lease(&up, "t2").await.unwrap();
    assert!(!la.ask_cancel(&up, "t2").await.unwrap(), "ended");
    la.end_lease(&up, "t1").await.unwrap();
}

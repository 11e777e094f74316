//! The held-session part of the [`TaskStore`] contract (`layers::held_sessions`: the 2025
//! sessions taskgate holds itself, kept across restarts): put (durable, replacing), read back
//! as written, touch (never creates), remove, the expiry sweep, and the bounds.

use super::*;
use serde_json::json;
use taskgate::store::HeldSessionRecord;

fn held(upstream: &str, id: &str, owner: Option<&str>, expires_at: u64) -> HeldSessionRecord {
    HeldSessionRecord {
        upstream: upstream.into(),
        session_id: id.into(),
        owner: owner.map(Into::into),
        protocol_version: Some("2025-11-25".into()),
        capability_bits: 2,
        upstream_tasks_tools_call: true,
        upstream_without_tasks: false,
        client_capabilities: json!({"elicitation": {}}),
        client_info: Some(json!({"name": "c", "version": "1"})),
        expires_at,
        upstream_issued: false,
    }
}

pub async fn contract(store: Arc<dyn TaskStore>) {
    let up = unique("held");
    let t0 = now_ms();
    let a = held(&up, "aaaa", Some("alice"), t0 + 60_000);
    store.put_held_session(a.clone()).unwrap();
    assert_eq!(store.held_session(&up, "aaaa").unwrap(), Some(a.clone()));
    assert!(store.held_session(&up, "nope").unwrap().is_none());
    assert!(store.held_session("other", "aaaa").unwrap().is_none());
    // A put replaces; a touch moves the expiry and never creates.
    let mut a2 = a.clone();
    a2.protocol_version = Some("2025-06-18".into());
    store.put_held_session(a2.clone()).unwrap();
    assert_eq!(store.held_session(&up, "aaaa").unwrap(), Some(a2.clone()));
    assert!(store.touch_held_session(&up, "aaaa", t0 + 90_000).unwrap());
    assert_eq!(
        store.held_session(&up, "aaaa").unwrap().unwrap().expires_at,
        t0 + 90_000
    );
    // Never back: a touch made earlier but run later keeps the latest expiry.
    assert!(store.touch_held_session(&up, "aaaa", t0 + 70_000).unwrap());
    assert_eq!(
        store.held_session(&up, "aaaa").unwrap().unwrap().expires_at,
        t0 + 90_000
    );
    assert!(!store.touch_held_session(&up, "nope", t0).unwrap());
    assert!(store.held_session(&up, "nope").unwrap().is_none());

    // The sweep removes only what is expired (and sees a touch made since).
    let anonymous = held(&up, "bbbb", None, 5);
    store.put_held_session(anonymous.clone()).unwrap();
    assert_eq!(store.held_session(&up, "bbbb").unwrap(), Some(anonymous));
    let c = held(&up, "cccc", None, 6);
    store.put_held_session(c).unwrap();
    assert!(store.touch_held_session(&up, "cccc", t0 + 60_000).unwrap());
    assert!(store.remove_expired_held_sessions(t0, 10_000).unwrap() >= 1);
    assert!(store.held_session(&up, "bbbb").unwrap().is_none());
    assert!(store.held_session(&up, "cccc").unwrap().is_some());
    assert!(store.held_session(&up, "aaaa").unwrap().is_some());

    // A session the upstream issued (issue 35) reads back as one: its id is the upstream's.
    let mut passed = held(&up, "3f0c8a52-upstream-uuid", Some("bob"), t0 + 60_000);
    passed.upstream_issued = true;
    passed.client_capabilities = json!({});
    passed.client_info = None;
    store.put_held_session(passed.clone()).unwrap();
    assert_eq!(
        store.held_session(&up, "3f0c8a52-upstream-uuid").unwrap(),
        Some(passed)
    );
    assert!(store
        .remove_held_session(&up, "3f0c8a52-upstream-uuid")
        .unwrap());

    // Remove; a second remove finds nothing.
    assert!(store.remove_held_session(&up, "aaaa").unwrap());
    assert!(!store.remove_held_session(&up, "aaaa").unwrap());
    assert!(store.held_session(&up, "aaaa").unwrap().is_none());

    // Bounds: nothing past them is written.
    let mut big = held(&up, "dddd", None, t0 + 60_000);
    big.client_capabilities = json!({"sampling": {"x": "y".repeat(5000)}});
    let e = store.put_held_session(big).unwrap_err();
    assert!(e.to_string().contains("capabilities"), "{e}");
    assert!(store.held_session(&up, "dddd").unwrap().is_none());
    let long_id = "e".repeat(taskgate::store::held::MAX_HELD_SESSION_ID + 1);
    assert!(store
        .put_held_session(held(&up, &long_id, None, t0))
        .is_err());
    store.sync().await.unwrap();
}

//! 2025-11-25 sessions through a tier without sticky routing (issue 35): three replicas (the
//! real binary) on one PostgreSQL behind nginx round-robin, under bearer authentication (where
//! a replica that never saw a session's `initialize` used to answer 404 `-32001`), in front of
//! a scripted 2025-11-25 task server that issues sessions. Proven on the wire:
//! - a session initialized on one replica is served by every replica: create, get, list,
//!   result, cancel, its requests spread over the replicas directly and through nginx;
//! - 500 concurrent identical `tasks/cancel` of one session over the replicas → one upstream
//!   cancel, every answer `cancelled` or `-32602`;
//! - a DELETE on one replica reaches another's table within `session::REVALIDATE_AFTER`;
//! - kill -9 of the replica that saw the `initialize`: its sessions keep working through the
//!   survivors (`tasks/get`, `tasks/result`, `tasks/cancel` in the same session), and after a
//!   restart it serves them again.
//!
//! `TASKGATE_TEST_BIN=/path/to/older/taskgate` runs them against another build (each fails on
//! the build before issue 35 with 404 "Session not found").

use crate::common::*;
use serde_json::json;
use std::time::Duration;

const AUTH: &[(&str, &str)] = &[("alice", "alice-token"), ("bob", "bob-token")];

async fn tier(test: &str, server: &TaskServer) -> Option<Tier> {
    Tier::start_with(test, &server.url(), &bearer_auth(AUTH))
}

/// `client`'s session, on `url`.
fn on(url: &str, token: &str, session: &str) -> Client {
    Client::new(url).with_token(token).with_session(session)
}

/// A session initialized on one replica is served by each: every request of its lifecycle on
/// the next replica, then the same through round-robin nginx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_session_is_served_by_every_replica_round_robin() {
    let server = TaskServer::default().await;
    let Some(t) = tier(
        "a_2025_session_is_served_by_every_replica_round_robin",
        &server,
    )
    .await
    else {
        return;
    };
    for (n, (_, token)) in AUTH.iter().enumerate() {
        let mut c = Client::new(&t.replicas[n].url()).with_token(token);
        c.initialize().await;
        let sid = c.session.clone().expect("the upstream's Mcp-Session-Id");
        let at = |i: usize| on(&t.replicas[(n + i) % 3].url(), token, &sid);
        let task = at(1).create_task("1").await;
        let v = at(2).get("2", &task).await;
        assert_eq!(v["result"]["taskId"], json!(task), "{v}");
        let v = at(3).list("3", None).await;
        assert!(v["result"]["tasks"].is_array(), "{v}");
        let v = at(4).result("4", &task).await;
        assert_eq!(
            v["result"]["content"][0]["text"],
            format!("result of {task}"),
            "{v}"
        );
        let other = at(5).create_task("5").await;
        let v = at(6).cancel("6", &other).await;
        assert_eq!(v["result"]["status"], "cancelled", "{v}");
        // Another principal's use of the session id is still refused, on every replica.
        for r in &t.replicas {
            let thief = on(&r.url(), AUTH[(n + 1) % 2].1, &sid);
            let resp = thief.send(rpc("7", "tasks/list", "{}")).await;
            assert_eq!(resp.status(), 404, "another principal");
        }
    }
    // Through nginx round-robin: consecutive requests land on different replicas.
    let mut c = Client::new(&t.balancer.mcp_url()).with_token("alice-token");
    c.initialize().await;
    for i in 0..12 {
        let task = c.create_task(&format!("\"c{i}\"")).await;
        let v = c.get(&format!("\"g{i}\""), &task).await;
        assert_eq!(v["result"]["taskId"], json!(task), "{v}");
    }
    let v = c.list("\"l\"", None).await;
    assert!(v["result"]["tasks"].as_array().unwrap().len() >= 12, "{v}");
}

/// 500 concurrent identical `tasks/cancel` of one 2025 session over the replicas (round-robin):
/// one upstream cancel, every answer the task `cancelled` or `-32602` (terminal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_2025_cancels_over_the_replicas_one_upstream_cancel() {
    let server = TaskServer::start(Behaviour {
        cancel_delay: std::sync::Arc::new(|_| Duration::from_millis(500)),
        ..Behaviour::default()
    })
    .await;
    let Some(t) = tier(
        "five_hundred_2025_cancels_over_the_replicas_one_upstream_cancel",
        &server,
    )
    .await
    else {
        return;
    };
    let mut c = Client::new(&t.replicas[0].url()).with_token("alice-token");
    c.initialize().await;
    let sid = c.session.clone().unwrap();
    let task = c.create_task("1").await;
    let url = t.balancer.mcp_url();
    let calls: Vec<_> = (0..500)
        .map(|i| {
            let (c, task) = (on(&url, "alice-token", &sid), task.clone());
            tokio::spawn(async move { c.cancel(&format!("\"x{i}\""), &task).await })
        })
        .collect();
    let (mut cancelled, mut terminal) = (0, 0);
    for call in calls {
        let v = call.await.unwrap();
        if v["result"]["status"] == "cancelled" {
            cancelled += 1;
        } else {
            assert_eq!(err_code(&v), -32602, "{v}");
            terminal += 1;
        }
    }
    assert_eq!(cancelled + terminal, 500);
    assert!(cancelled >= 1, "the flight's callers see cancelled");
    assert_eq!(
        server.count("tasks/cancel"),
        1,
        "exactly one upstream cancel"
    );
}

/// A DELETE on one replica reaches the replicas that have the session in their table within
/// `REVALIDATE_AFTER` (5 s; the first request past it has the store read in the background):
/// they answer 404 themselves from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_on_one_replica_reaches_the_others() {
    let server = TaskServer::default().await;
    let Some(t) = tier("a_delete_on_one_replica_reaches_the_others", &server).await else {
        return;
    };
    let mut c = Client::new(&t.replicas[0].url()).with_token("alice-token");
    c.initialize().await;
    let sid = c.session.clone().unwrap();
    let cached = on(&t.replicas[1].url(), "alice-token", &sid);
    assert_eq!(
        cached.send(rpc("1", "tasks/list", "{}")).await.status(),
        200
    );
    let deleted = Req::delete(&t.replicas[2].url())
        .header("authorization", "Bearer alice-token")
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert!(deleted.status() < 300, "{}", deleted.status());
    let gone = eventually(Duration::from_secs(12), || {
        let cached = cached.clone();
        async move {
            let r = cached.send(rpc("2", "tasks/list", "{}")).await;
            (r.status() == 404).then_some(())
        }
    })
    .await;
    assert!(
        gone.is_some(),
        "the other replica forgets the deleted session"
    );
    // And the replica that saw the initialize forgets it the same way.
    let first = on(&t.replicas[0].url(), "alice-token", &sid);
    let gone = eventually(Duration::from_secs(12), || {
        let first = first.clone();
        async move {
            let r = first.send(rpc("3", "tasks/list", "{}")).await;
            (r.status() == 404).then_some(())
        }
    })
    .await;
    assert!(gone.is_some(), "the initializing replica forgets it too");
}

/// kill -9 of the replica that saw three sessions' `initialize`: each session keeps working
/// through the survivors (get, result, cancel of its tasks in the same session), and the
/// restarted replica serves them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_2025_sessions_live_on() {
    let server = TaskServer::default().await;
    let Some(mut t) = tier("a_killed_replicas_2025_sessions_live_on", &server).await else {
        return;
    };
    let mut sessions = Vec::new();
    for i in 0..3 {
        let token = AUTH[i % 2].1;
        let mut c = Client::new(&t.replicas[1].url()).with_token(token);
        c.initialize().await;
        let sid = c.session.clone().unwrap();
        let tasks = [c.create_task("1").await, c.create_task("2").await];
        sessions.push((token, sid, tasks));
    }
    t.replicas[1]
        .process
        .as_ref()
        .unwrap()
        .signal(libc::SIGKILL);
    let survivors = [t.replicas[0].url(), t.replicas[2].url()];
    for (i, (token, sid, [a, b])) in sessions.iter().enumerate() {
        let here = on(&survivors[i % 2], token, sid);
        let there = on(&survivors[(i + 1) % 2], token, sid);
        let v = here.get("3", a).await;
        assert_eq!(v["result"]["status"], "working", "{v}");
        let v = there.result("4", a).await;
        assert_eq!(
            v["result"]["content"][0]["text"],
            format!("result of {a}"),
            "{v}"
        );
        let v = here.cancel("5", b).await;
        assert_eq!(v["result"]["status"], "cancelled", "{v}");
        let v = there.get("6", b).await;
        assert_eq!(v["result"]["status"], "cancelled", "{v}");
    }
    // Through the balancer too (nginx passes over the dead replica).
    let (token, sid, [a, _]) = &sessions[0];
    let v = on(&t.balancer.mcp_url(), token, sid).get("7", a).await;
    assert_eq!(v["result"]["taskId"], json!(a), "{v}");

    t.replicas[1].process = None;
    let db = t.pg.url.clone();
    t.replicas[1].start(&db);
    for (token, sid, [a, b]) in &sessions {
        let back = on(&t.replicas[1].url(), token, sid);
        let v = back.get("8", a).await;
        assert_eq!(v["result"]["status"], "completed", "{v}");
        let v = back.cancel("9", b).await;
        assert_eq!(err_code(&v), -32602, "terminal: {v}");
        let fresh = back.create_task("10").await;
        assert_eq!(back.get("11", &fresh).await["result"]["status"], "working");
    }
}

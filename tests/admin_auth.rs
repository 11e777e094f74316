//! An optional bearer token for the admin endpoints (issue 16, item 13).

use crate::common::*;

/// With `admin.token_env`, `/admin/tasks` needs `Authorization: Bearer <token>` (else 401 with
/// `WWW-Authenticate`); the probes and `/metrics` stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_guards_the_task_records() {
    std::env::set_var("TASKGATE_TEST_ADMIN_TOKEN", "admin-s3cret");
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .admin_opt("token_env = \"TASKGATE_TEST_ADMIN_TOKEN\"")
        .start()
        .await;
    // The scheme is case-insensitive (RFC 9110 §11.1; issue 29 #18: `bearer` got 401).
    for (scheme, token, status) in [
        ("Bearer", None, 401),
        ("Bearer", Some("wrong"), 401),
        ("Bearer", Some("admin-s3cret"), 200),
        ("bearer", Some("admin-s3cret"), 200),
        ("BEARER", Some("admin-s3cret"), 200),
    ] {
        for path in ["/admin/tasks", "/admin/tasks/default/some-task"] {
            let mut r = Req::get(&gw.admin_url(path));
            if let Some(t) = token {
                r = r.header("authorization", &format!("{scheme} {t}"));
            }
            let r = r.send().await;
            if status == 401 {
                assert_eq!(r.status(), 401, "{path} with {token:?}");
                assert!(r
                    .header("www-authenticate")
                    .is_some_and(|v| v.starts_with("Bearer")));
            } else {
                assert_ne!(r.status(), 401, "{path} with the token");
            }
        }
    }
    for path in ["/healthz", "/metrics"] {
        assert_eq!(
            Req::get(&gw.admin_url(path)).send().await.status(),
            200,
            "{path}"
        );
    }
}

/// A token variable that is not set is a start-up error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_variable_must_be_set() {
    let err = GatewayBuilder::single(&dead_url())
        .admin_opt("token_env = \"TASKGATE_TEST_ADMIN_TOKEN_UNSET\"")
        .try_start()
        .await
        .err()
        .expect("refused");
    assert!(err.contains("TASKGATE_TEST_ADMIN_TOKEN_UNSET"), "{err}");
}

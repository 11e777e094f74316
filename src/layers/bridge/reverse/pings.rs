//! The held sessions' pings (2025-11-25 basic/utilities/ping; see `sessions`: "Pings"): each
//! held session pinged every `gateway.session_idle_ms` / 2 (at most 30 s) in the context that
//! opened it, side by side and bounded; a ping answered 404 opens the session again.

use super::{id_value, reopen, request_with, ReverseState, UpstreamSession};
use crate::exchange::{McpRequest, Operation, RequestParts};
use crate::jsonrpc::Message;
use crate::layers::McpService;
use bytes::Bytes;
use http::StatusCode;
use parking_lot::Mutex;
use serde_json::json;
use std::sync::Arc;
use tower::ServiceExt;

/// Most pings of held sessions in flight at once, per upstream.
pub const MAX_CONCURRENT_PINGS: usize = 16;

/// Pings every held session each `sessions.ping_every()`, in the context of the request that
/// opened it, until the state is gone (see `sessions`: "Pings"). Each ping runs on its own, at
/// most [`MAX_CONCURRENT_PINGS`] at once and one per session (a session whose last ping still
/// waits, up to `timeout_ms`, is skipped this round), so an upstream slow to answer one ping
/// delays no other session's. A ping the upstream answers 404 opens the session again
/// ([`reopen`]); the answer itself is not read.
pub(super) async fn ping_held<S: McpService>(me: std::sync::Weak<ReverseState>, inner: S) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_PINGS));
    // The sessions (by address: each is held by its ping while in flight) with a ping out.
    let out: Arc<Mutex<std::collections::HashSet<usize>>> = Arc::default();
    loop {
        let Some(every) = me.upgrade().map(|s| s.sessions.ping_every()) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(state) = me.upgrade() else {
            return;
        };
        for session in state.sessions.held() {
            let key = Arc::as_ptr(&session) as usize;
            if !out.lock().insert(key) {
                continue;
            }
            // Each session's ping waits for a permit in a task of its own: every held session
            // is pinged each round, at most MAX_CONCURRENT_PINGS at once (a round that stopped
            // at the first busy permit pinged the same 16 sessions every time).
            let (state, inner, out) = (state.clone(), inner.clone(), out.clone());
            let permits = permits.clone();
            tokio::spawn(async move {
                if let Ok(_permit) = permits.acquire_owned().await {
                    ping(&state, &inner, session).await;
                }
                out.lock().remove(&key);
            });
        }
    }
}

/// One ping of a held session (see [`ping_held`]).
async fn ping<S: McpService>(state: &Arc<ReverseState>, inner: &S, session: Arc<UpstreamSession>) {
    let (Some(mut ctx), Some(id)) = (session.opened_in(), session.id.clone()) else {
        return;
    };
    ctx.session_id = Some(id);
    let own = state.ids.next_id();
    let body = json!({"jsonrpc": "2.0", "id": id_value(&own), "method": "ping"});
    let req = McpRequest::from(RequestParts {
        op: Operation::Post(
            Message::parse(Bytes::from(body.to_string())).expect("a well-formed ping"),
        ),
        ctx,
        extensions: http::Extensions::new(),
        trace: None,
    });
    let upstream = req.ctx.upstream.clone();
    let out = request_with(&req, body, Some(&session));
    let lost = match state.bounded(&upstream, inner.clone().oneshot(out)).await {
        Ok(reply) => reply.status == StatusCode::NOT_FOUND,
        Err(e) => {
            tracing::debug!(upstream = %upstream, error = %e, "a held upstream session's ping was not answered");
            false
        }
    };
    if lost {
        reopen(state, inner, &req, &session).await;
    }
}

//! `notifications/tasks/status` for gateway tasks on the client's GET stream (2025-11-25
//! tasks: status notifications are optional, "never rely on it"): a 2025-11-25 session whose
//! client declared `capabilities.tasks` gets, on each GET stream it opens, one notification (the
//! task's 2025 `Task`) per status change of a gateway task created on that session (working →
//! `input_required` → working, and the terminal status), merged into the upstream's own GET
//! stream. The `tasks/result` stream of a held call carries them too (see `input`).
//!
//! Bounds: one channel per session with an open GET stream (it goes with its last stream),
//! [`BACKLOG`] notifications each;
//! a stream that falls further behind misses the oldest (they are optional).

use super::GatewayTasksState;
use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::layers::extensions::SessionView;
use crate::sse::Event;
use crate::store::TaskRecord;
use futures_util::StreamExt;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::broadcast;

/// Most notifications a GET stream may fall behind by before it misses the oldest.
pub const BACKLOG: usize = 64;

/// The key of `req`'s session: its client's `Mcp-Session-Id`.
pub(super) fn session_of(req: &McpRequest) -> Option<String> {
    req.ctx
        .client_session_id
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Whether `req` (a 2025-11-25 GET stream) is one to add notifications to: a session whose
/// client declared `capabilities.tasks`.
pub(super) fn listens(req: &McpRequest) -> Option<String> {
    let declared = req.extensions.get::<SessionView>()?.client;
    if !declared.has("/tasks") {
        return None;
    }
    session_of(req)
}

/// The upstream's GET stream `reply` with the notifications for `session` merged in (as it
/// came when it is no stream). It ends when the upstream's stream ends; the session's channel
/// goes with its last stream.
pub(super) fn merged(
    state: &Arc<GatewayTasksState>,
    session: &str,
    mut reply: McpReply,
) -> McpReply {
    if !matches!(reply.body, ReplyBody::Stream(_)) {
        return reply;
    }
    let ReplyBody::Stream(upstream) = std::mem::replace(&mut reply.body, ReplyBody::Empty) else {
        return reply;
    };
    let rx = state
        .listeners
        .lock()
        .entry(session.to_string())
        .or_insert_with(|| broadcast::channel(BACKLOG).0)
        .subscribe();
    let listening = Listening {
        state: state.clone(),
        session: session.to_string(),
        rx: Some(rx),
    };
    let stream =
        futures_util::stream::unfold((upstream, listening), |(mut up, mut l)| async move {
            let Some(rx) = l.rx.as_mut() else {
                let ev = up.next().await?;
                return Some((ev, (up, l)));
            };
            loop {
                tokio::select! {
                    ev = up.next() => return ev.map(|ev| (ev, (up, l))),
                    note = rx.recv() => match note {
                        Ok(ev) => return Some((ev, (up, l))),
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        // The sender went (never while the entry lives): the upstream's alone.
                        Err(broadcast::error::RecvError::Closed) => {
                            l.rx = None;
                            let ev = up.next().await?;
                            return Some((ev, (up, l)));
                        }
                    },
                }
            }
        });
    reply.body = ReplyBody::Stream(Box::pin(stream));
    reply
}

/// One GET stream's subscription: when it goes and it was the session's last, the session's
/// channel goes too.
struct Listening {
    state: Arc<GatewayTasksState>,
    session: String,
    rx: Option<broadcast::Receiver<Event>>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut listeners = self.state.listeners.lock();
        if listeners
            .get(&self.session)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            listeners.remove(&self.session);
        }
    }
}

/// Sends `session`'s GET streams the task's status now (its 2025 `Task`, read from the
/// registry), when any listens.
pub(super) async fn publish(state: &GatewayTasksState, session: Option<&str>, task: &TaskRecord) {
    let Some(session) = session else {
        return;
    };
    let tx = {
        let mut listeners = state.listeners.lock();
        match listeners.get(session) {
            Some(tx) if tx.receiver_count() == 0 => {
                listeners.remove(session);
                return;
            }
            Some(tx) => tx.clone(),
            None => return,
        }
    };
    let now = state
        .registry
        .lookup(&task.upstream, &task.task_id, &task.owner)
        .await;
    let Some(record) = now else {
        return;
    };
    let note = json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
        "params": serde_json::to_value(record.to_task()).unwrap_or_default()});
    let _ = tx.send(Event::message(note.to_string()));
}

//! `input_required` on a bridged task (2026-07-28 tasks extension §input_required / 2025-11-25
//! tasks: input_required): each new `inputRequests` entry of a `DetailedTask` becomes an
//! `elicitation/create` or `sampling/createMessage` request to the 2025 client, sent on its
//! `tasks/result` stream with the related-task `_meta` and an id taskgate mints
//! (`"taskgate-input-<64 random bits>"`); the client's answer (a POSTed JSON-RPC response under that id,
//! from the same caller) is consumed here (HTTP 202) and sent upstream as `tasks/update` with
//! `inputResponses: {<key>: <result>}` (an error answer becomes `{"action":"decline"}`).
//!
//! Keys are never asked twice for a task (the snapshot repeats on every poll), across
//! `tasks/result` calls too, while taskgate runs. A key whose method the client did not declare
//! (`capabilities.elicitation` / `capabilities.sampling` of its session), or any other method
//! (`roots/list`), ends the `tasks/result` with `-32603` naming it, and the task is cancelled
//! upstream. Bounds: [`MAX_PENDING`] unanswered requests and [`MAX_TASKS_ASKED`] tasks with asked
//! keys; past them the oldest entries are dropped (a late answer then gets nothing upstream).

use crate::exchange::{Caller, RequestContext};
use crate::jsonrpc::Id;
use crate::layers::session::{session_key, Sessions};
use crate::mcp::task::RELATED_TASK_META;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

/// Most input requests sent to clients and not yet answered, per upstream.
pub const MAX_PENDING: usize = 4096;
/// Most tasks whose asked keys are remembered, per upstream.
pub const MAX_TASKS_ASKED: usize = 4096;

/// One input request sent to a client, waiting for its answer.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The upstream task.
    pub task_id: String,
    /// The `inputRequests` key.
    pub key: String,
    /// Who was asked (only that caller's answer counts).
    pub caller: Caller,
    /// The context the `tasks/update` goes out in.
    pub ctx: RequestContext,
}

/// A bounded map: entries and their insertion order (the oldest is dropped first).
type Bounded<V> = Mutex<(HashMap<String, V>, VecDeque<String>)>;

/// The input requests of one upstream's bridged tasks.
#[derive(Default)]
pub struct Inputs {
    pending: Bounded<Pending>,
    asked: Bounded<HashSet<String>>,
}

/// What to do with one `inputRequests` entry.
#[derive(Debug)]
pub enum Ask {
    /// Send this request message (JSON text) to the client.
    Send(String),
    /// The key was asked before.
    Already,
    /// The client cannot answer it: the method it needs (`elicitation/create`, ...).
    Unsupported(String),
}

impl Inputs {
    /// Decides about `key` → `request` (`{method, params}`) of `task_id`, for the caller of
    /// `ctx`; registers what it sends.
    pub fn ask(
        &self,
        sessions: Option<&Arc<Sessions>>,
        ctx: &RequestContext,
        task_id: &str,
        key: &str,
        request: &Value,
    ) -> Ask {
        {
            let asked = self.asked.lock();
            if asked.0.get(task_id).is_some_and(|s| s.contains(key)) {
                return Ask::Already;
            }
        }
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        let pointer = match method {
            "elicitation/create" => "/elicitation",
            "sampling/createMessage" => "/sampling",
            other => return Ask::Unsupported(other.to_string()),
        };
        let declared = sessions
            .and_then(|s| s.get(&ctx.upstream, session_key(ctx).as_ref()))
            .is_some_and(|info| info.client_has(pointer));
        if !declared {
            return Ask::Unsupported(method.to_string());
        }
        self.mark_asked(task_id, key);
        // SipHash under fresh random keys: not guessable by another client (who is also not
        // the caller the answer must come from).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write(task_id.as_bytes());
        h.write(key.as_bytes());
        let id = format!("taskgate-input-{:016x}", h.finish());
        let mut params = request
            .get("params")
            .filter(|p| p.is_object())
            .cloned()
            .unwrap_or_else(|| json!({}));
        let meta = params
            .as_object_mut()
            .expect("an object")
            .entry("_meta")
            .or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert(RELATED_TASK_META.into(), json!({ "taskId": task_id }));
        }
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut pending = self.pending.lock();
        if pending.0.len() >= MAX_PENDING {
            if let Some(old) = pending.1.pop_front() {
                pending.0.remove(&old);
            }
        }
        let id_json = Value::String(id).to_string();
        pending.1.push_back(id_json.clone());
        pending.0.insert(
            id_json,
            Pending {
                task_id: task_id.to_string(),
                key: key.to_string(),
                caller: ctx.caller(),
                ctx: ctx.clone(),
            },
        );
        Ask::Send(message.to_string())
    }

    fn mark_asked(&self, task_id: &str, key: &str) {
        let mut asked = self.asked.lock();
        if !asked.0.contains_key(task_id) {
            if asked.0.len() >= MAX_TASKS_ASKED {
                if let Some(old) = asked.1.pop_front() {
                    asked.0.remove(&old);
                }
            }
            asked.1.push_back(task_id.to_string());
        }
        asked
            .0
            .entry(task_id.to_string())
            .or_default()
            .insert(key.to_string());
    }

    /// The pending request a client's response `id` answers, taken, when `caller` was asked.
    pub fn take(&self, id: &Id, caller: &Caller) -> Option<Pending> {
        let mut pending = self.pending.lock();
        let key = id.as_json();
        if pending.0.get(key).is_some_and(|p| &p.caller == caller) {
            pending.1.retain(|k| k != key);
            return pending.0.remove(key);
        }
        None
    }

    /// Forgets a task's asked keys (it is terminal).
    pub fn forget(&self, task_id: &str) {
        let mut asked = self.asked.lock();
        asked.0.remove(task_id);
        asked.1.retain(|t| t != task_id);
    }
}

/// The `inputResponses` value for a client's answer message: its `result`, or
/// `{"action":"decline"}` for an error.
pub fn response_value(answer: &Value) -> Value {
    match answer.get("result") {
        Some(r) => r.clone(),
        None => json!({ "action": "decline" }),
    }
}

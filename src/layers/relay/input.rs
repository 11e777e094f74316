//! `input_required` on a bridged task (2026-07-28 tasks extension §input_required / 2025-11-25
//! tasks: input_required): each new `inputRequests` entry of a `DetailedTask` becomes an
//! `elicitation/create`, `sampling/createMessage` or `roots/list` request to the 2025 client,
//! sent on its `tasks/result` stream with the related-task `_meta` and an id taskgate mints
//! (`"taskgate-input-<64 random bits>"`); the client's answer (a POSTed JSON-RPC response under
//! that id, from the same caller) is consumed here (HTTP 202) and sent upstream as `tasks/update`
//! with `inputResponses: {<key>: <result>}`. An error answer becomes `{"action":"decline"}`
//! for `elicitation/create` and `{"roots":[]}` for `roots/list` (a client that cannot list its
//! roots offers none); a `sampling/createMessage` result has no refusal form (2026-07-28
//! `InputResponse` has no error member), so an error to it sends nothing upstream: the bridge
//! cancels the task instead ([`response_value`], `reason="client_error"`).
//!
//! Keys are never asked twice for a task (the snapshot repeats on every poll), across
//! `tasks/result` calls too, while taskgate runs ([`Inputs::ask`]). Gateway tasks (see
//! `gateway_tasks::input`) ask each still-waiting key again on every new `tasks/result` stream
//! with [`Inputs::ask_again`]: under the id it was first sent under, its answer taken once. A key whose method the client did not declare
//! (`capabilities.elicitation` / `capabilities.sampling` / `capabilities.roots` of its session),
//! or any other method, ends the `tasks/result` with `-32603` naming it, and the task is
//! cancelled upstream (counted in `taskgate_bridge_input_refused_total{reason="capability"}`).
//!
//! Bounds, per upstream:
//! - [`MAX_KEYS_PER_TASK`] keys asked per task: a snapshot that would take a task past it ends
//!   the `tasks/result` with `-32603` saying so, nothing of it is asked, and the task is
//!   cancelled upstream (`reason="too_many_keys"`, logged at warn).
//! - unanswered requests: [`MAX_PENDING_PER_CALLER`] per caller (a caller's own oldest is
//!   dropped past it) and [`MAX_PENDING`] in all (past it the oldest of the caller with the most
//!   is dropped), so requests for one task or one client never push out another client's. A
//!   dropped request's late answer gets nothing upstream (HTTP 202, logged). A task's unanswered
//!   requests are dropped when it ends.
//! - [`MAX_TASKS_ASKED`] tasks with asked keys; past it the oldest task's keys are forgotten.
//!
//! MRTR rounds (see `mrtr`) use the same relay ([`Inputs::ask_round`]): a round stands where a
//! task does (its keys, its pending requests, the same bounds), its requests carry no
//! related-task `_meta`, and the client's answer goes to the waiting round instead of a
//! `tasks/update`.

use crate::exchange::{Caller, RequestContext};
use crate::jsonrpc::Id;
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use tokio::sync::mpsc;

/// Most input requests sent to clients and not yet answered, per upstream.
pub const MAX_PENDING: usize = 4096;
/// Most unanswered input requests of one caller, per upstream.
pub const MAX_PENDING_PER_CALLER: usize = 256;
/// Most `inputRequests` keys asked of one task.
pub const MAX_KEYS_PER_TASK: usize = 32;
/// Most tasks whose asked keys are remembered, per upstream.
pub const MAX_TASKS_ASKED: usize = 4096;

/// One input request sent to a client, waiting for its answer.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The upstream task.
    pub task_id: String,
    /// The `inputRequests` key.
    pub key: String,
    /// The request's method (`elicitation/create`, `sampling/createMessage`, `roots/list`).
    pub method: String,
    /// Who was asked (only that caller's answer counts).
    pub caller: Caller,
    /// The context the `tasks/update` goes out in.
    pub ctx: RequestContext,
    /// For an MRTR round (see `mrtr`): where the answer goes (`(key, inputResponses value)`,
    /// `None` for an error no value can carry, see [`response_value`]) instead of a
    /// `tasks/update`; `task_id` then names the round.
    pub round: Option<mpsc::Sender<(String, Option<Value>)>>,
}

/// Unanswered requests by id (JSON text), with each caller's ids in the order they were sent.
#[derive(Default)]
struct PendingTable {
    by_id: HashMap<String, Pending>,
    by_caller: HashMap<Caller, VecDeque<String>>,
}

impl PendingTable {
    fn insert(&mut self, id: String, pending: Pending) {
        let caller = pending.caller.clone();
        if self
            .by_caller
            .get(&caller)
            .is_some_and(|q| q.len() >= MAX_PENDING_PER_CALLER)
        {
            self.drop_oldest_of(&caller);
        } else if self.by_id.len() >= MAX_PENDING {
            // The caller with the most unanswered requests gives up its oldest.
            let largest = self
                .by_caller
                .iter()
                .max_by_key(|(_, q)| q.len())
                .map(|(c, _)| c.clone());
            if let Some(c) = largest {
                self.drop_oldest_of(&c);
            }
        }
        self.by_caller
            .entry(caller)
            .or_default()
            .push_back(id.clone());
        self.by_id.insert(id, pending);
    }

    fn drop_oldest_of(&mut self, caller: &Caller) {
        let Some(q) = self.by_caller.get_mut(caller) else {
            return;
        };
        if let Some(old) = q.pop_front() {
            if let Some(p) = self.by_id.remove(&old) {
                tracing::info!(task_id = %p.task_id, key = %p.key, "an unanswered input request was dropped (bound reached)");
            }
        }
        if q.is_empty() {
            self.by_caller.remove(caller);
        }
    }

    /// The id (JSON text) of `caller`'s unanswered request for `key` of `task_id` (at most
    /// [`MAX_PENDING_PER_CALLER`] looked at).
    fn id_of(&self, task_id: &str, key: &str, caller: &Caller) -> Option<String> {
        self.by_caller.get(caller)?.iter().find_map(|id| {
            self.by_id
                .get(id)
                .filter(|p| p.task_id == task_id && p.key == key && p.round.is_none())
                .map(|_| id.clone())
        })
    }

    fn take(&mut self, id: &str, caller: &Caller) -> Option<Pending> {
        if self.by_id.get(id).is_none_or(|p| &p.caller != caller) {
            return None;
        }
        if let Some(q) = self.by_caller.get_mut(caller) {
            q.retain(|k| k != id);
            if q.is_empty() {
                self.by_caller.remove(caller);
            }
        }
        self.by_id.remove(id)
    }

    fn forget_task(&mut self, task_id: &str) {
        let ids: Vec<(String, Caller)> = self
            .by_id
            .iter()
            .filter(|(_, p)| p.task_id == task_id)
            .map(|(id, p)| (id.clone(), p.caller.clone()))
            .collect();
        for (id, caller) in ids {
            self.take(&id, &caller);
        }
    }
}

/// A bounded map: entries and their insertion order (the oldest is dropped first).
type Bounded<V> = Mutex<(HashMap<String, V>, VecDeque<String>)>;

/// The input requests of one upstream's bridged tasks.
#[derive(Default)]
pub struct Inputs {
    pending: Mutex<PendingTable>,
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

/// The client capability (JSON pointer) a 2026 input request's `method` needs; `None` for a
/// method taskgate does not relay.
pub fn capability_for(method: &str) -> Option<&'static str> {
    match method {
        "elicitation/create" => Some("/elicitation"),
        "sampling/createMessage" => Some("/sampling"),
        "roots/list" => Some("/roots"),
        _ => None,
    }
}

impl Inputs {
    /// How many keys of `requests` `task_id` has not been asked yet, when asking them would
    /// take it past [`MAX_KEYS_PER_TASK`] (`None`: within the bound).
    pub fn over_bound(&self, task_id: &str, requests: &Map<String, Value>) -> Option<usize> {
        let asked = self.asked.lock();
        let before = asked.0.get(task_id);
        let fresh = requests
            .keys()
            .filter(|k| before.is_none_or(|s| !s.contains(k.as_str())))
            .count();
        let total = before.map_or(0, HashSet::len) + fresh;
        (total > MAX_KEYS_PER_TASK).then_some(total)
    }

    /// Decides about `key` → `request` (`{method, params}`) of `task_id`, for the caller of
    /// `ctx`, whose declared client capabilities `declared` answers (by JSON pointer:
    /// `/elicitation`, ...); registers what it sends.
    pub fn ask(
        &self,
        declared: &dyn Fn(&str) -> bool,
        ctx: &RequestContext,
        task_id: &str,
        key: &str,
        request: &Value,
    ) -> Ask {
        self.ask_for(declared, ctx, task_id, key, request, None)
    }

    /// [`Inputs::ask`] for one MRTR round named `round` (see `mrtr`): the request carries no
    /// related-task `_meta`, and the client's answer is sent on `answers` as
    /// `(key, inputResponses value)`.
    pub fn ask_round(
        &self,
        declared: &dyn Fn(&str) -> bool,
        ctx: &RequestContext,
        round: &str,
        key: &str,
        request: &Value,
        answers: &mpsc::Sender<(String, Option<Value>)>,
    ) -> Ask {
        self.ask_for(declared, ctx, round, key, request, Some(answers.clone()))
    }

    /// [`Inputs::ask`] on a new stream to the client (a 2025-11-25 `tasks/result` stream opened
    /// again after the client lost the one it was asked on): a key asked before is sent again
    /// (never [`Ask::Already`]), under the id it was first sent under while that request waits
    /// for this caller's answer (whose answer is still taken once: [`Inputs::take`]), else
    /// (its pending request dropped by a bound, or asked of another caller) as a new request
    /// under a new id. The caller keeps which keys a stream has carried.
    pub fn ask_again(
        &self,
        declared: &dyn Fn(&str) -> bool,
        ctx: &RequestContext,
        task_id: &str,
        key: &str,
        request: &Value,
    ) -> Ask {
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        if !capability_for(method).is_some_and(declared) {
            return Ask::Unsupported(method.to_string());
        }
        let sent = self.pending.lock().id_of(task_id, key, &ctx.caller());
        if let Some(id) = sent.and_then(|id| serde_json::from_str::<Value>(&id).ok()) {
            return Ask::Send(request_message(&id, task_id, method, request, true));
        }
        self.send_new(ctx, task_id, key, method, request, None)
    }

    fn ask_for(
        &self,
        declared: &dyn Fn(&str) -> bool,
        ctx: &RequestContext,
        task_id: &str,
        key: &str,
        request: &Value,
        round: Option<mpsc::Sender<(String, Option<Value>)>>,
    ) -> Ask {
        {
            let asked = self.asked.lock();
            if asked.0.get(task_id).is_some_and(|s| s.contains(key)) {
                return Ask::Already;
            }
        }
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        if !capability_for(method).is_some_and(declared) {
            return Ask::Unsupported(method.to_string());
        }
        self.send_new(ctx, task_id, key, method, request, round)
    }

    /// Registers `key` of `task_id` as asked, and its request as pending under a new id; the
    /// message to send.
    fn send_new(
        &self,
        ctx: &RequestContext,
        task_id: &str,
        key: &str,
        method: &str,
        request: &Value,
        round: Option<mpsc::Sender<(String, Option<Value>)>>,
    ) -> Ask {
        self.mark_asked(task_id, key);
        // SipHash under fresh random keys: not guessable by another client (who is also not
        // the caller the answer must come from).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write(task_id.as_bytes());
        h.write(key.as_bytes());
        let id = Value::String(format!("taskgate-input-{:016x}", h.finish()));
        let message = request_message(&id, task_id, method, request, round.is_none());
        self.pending.lock().insert(
            id.to_string(),
            Pending {
                task_id: task_id.to_string(),
                key: key.to_string(),
                method: method.to_string(),
                caller: ctx.caller(),
                ctx: ctx.clone(),
                round,
            },
        );
        Ask::Send(message)
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
        self.pending.lock().take(id.as_json(), caller)
    }

    /// Forgets a task's asked keys and its unanswered requests (it is terminal).
    pub fn forget(&self, task_id: &str) {
        {
            let mut asked = self.asked.lock();
            asked.0.remove(task_id);
            asked.1.retain(|t| t != task_id);
        }
        self.pending.lock().forget_task(task_id);
    }
}

/// The request message (JSON text) under `id`: `request`'s `method` and `params`, with the
/// related-task `_meta` naming `task_id` when `related` (not for an MRTR round).
fn request_message(
    id: &Value,
    task_id: &str,
    method: &str,
    request: &Value,
    related: bool,
) -> String {
    let mut params = request
        .get("params")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if related {
        crate::mcp::task::set_related_task(&mut params, task_id);
    }
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// `result` without the 2025-11-25 related-task `_meta` key (the `_meta` dropped when nothing
/// else is in it): a 2025 client's answer to a task's request carries it (2025-11-25 tasks:
/// every message of a task does), with whatever `taskId` the client wrote; 2026-07-28 has no
/// such key (the `tasks/update` names its task).
fn without_related_task(result: &Value) -> Value {
    let mut r = result.clone();
    if let Some(o) = r.as_object_mut() {
        crate::mcp::task::remove_related_task(o);
    }
    r
}

/// Whether `result` has the members a `method` result needs (2025-11-25 schema: an
/// `ElicitResult`'s `action` is `accept`, `decline` or `cancel`; a `CreateMessageResult` has a
/// string `role` and `model` and a `content`; a `ListRootsResult` a `roots` array). Another
/// method's: any object.
fn is_result_of(method: &str, result: &Value) -> bool {
    let str_at = |k: &str| result.get(k).and_then(Value::as_str);
    match method {
        "elicitation/create" => matches!(str_at("action"), Some("accept" | "decline" | "cancel")),
        "sampling/createMessage" => {
            str_at("role").is_some() && str_at("model").is_some() && result.get("content").is_some()
        }
        "roots/list" => result.get("roots").is_some_and(Value::is_array),
        _ => result.is_object(),
    }
}

/// The `inputResponses` value for a client's answer message to a `method` request (2026-07-28
/// schema: `InputResponse = CreateMessageResult | ListRootsResult | ElicitResult`, no error
/// form): its `result` (without the 2025 related-task `_meta`) when it is a result of that
/// method; for an error, or a result that is not one (`{"bogus":true}` to an
/// `elicitation/create`: sent on, the server kept the request open under the key taskgate had
/// taken as answered, and the client's `tasks/result` waited until the ttl, tester 5 #6), the
/// refusal that method's result can express: `{"action":"decline"}` (an `ElicitResult`) for
/// `elicitation/create`, `{"roots":[]}` (a client that cannot list its roots offers none) for
/// `roots/list`. `None` for an error to `sampling/createMessage` (a `CreateMessageResult` has
/// no way to refuse) or any other method: no value says it, and the caller ends what asked
/// instead.
pub fn response_value(method: &str, answer: &Value) -> Option<Value> {
    match (answer.get("result"), method) {
        (Some(r), _) if is_result_of(method, r) => Some(without_related_task(r)),
        (_, "roots/list") => Some(json!({ "roots": [] })),
        (_, "elicitation/create") => Some(json!({ "action": "decline" })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::Principal;

    fn ctx(session: &str) -> RequestContext {
        RequestContext {
            upstream: "up".into(),
            session_id: None,
            client_session_id: Some(http::HeaderValue::from_str(session).unwrap()),
            principal: Principal::Anonymous,
            client_addr: None,
            headers: http::HeaderMap::new(),
        }
    }

    fn id_of(ask: Ask) -> Id {
        let Ask::Send(m) = ask else {
            panic!("not sent: {ask:?}")
        };
        let v: Value = serde_json::from_str(&m).unwrap();
        Id::from_value(&v["id"]).unwrap()
    }

    /// A flood of input requests for other tasks and callers never pushes out one client's
    /// unanswered request.
    #[test]
    fn a_flood_never_evicts_another_clients_pending_answer() {
        let inputs = Inputs::default();
        let all = |_: &str| true;
        let request = json!({"method": "elicitation/create", "params": {"message": "?"}});
        let alice = ctx("alice");
        let first = id_of(inputs.ask(&all, &alice, "a-task", "k", &request));
        let mallory = ctx("mallory");
        for n in 0..(2 * MAX_PENDING) {
            let task = format!("flood-{}", n / MAX_KEYS_PER_TASK);
            let _ = inputs.ask(&all, &mallory, &task, &n.to_string(), &request);
        }
        let p = inputs
            .take(&first, &alice.caller())
            .expect("alice's request kept");
        assert_eq!((p.task_id.as_str(), p.key.as_str()), ("a-task", "k"));
        assert!(inputs.pending.lock().by_id.len() <= MAX_PENDING_PER_CALLER);
    }

    /// A key asked again (a new stream) goes under the id it was first sent under while its
    /// request waits for that caller, and its answer is taken once; once answered, or for
    /// another caller, it is a new request under a new id. `ask` still asks a key once.
    #[test]
    fn a_key_asked_again_keeps_its_id_and_is_taken_once() {
        let inputs = Inputs::default();
        let all = |_: &str| true;
        let request = json!({"method": "elicitation/create", "params": {"message": "?"}});
        let c = ctx("s");
        let first = id_of(inputs.ask_again(&all, &c, "t", "k", &request));
        assert!(matches!(
            inputs.ask(&all, &c, "t", "k", &request),
            Ask::Already
        ));
        let Ask::Send(again) = inputs.ask_again(&all, &c, "t", "k", &request) else {
            panic!("asked again")
        };
        let again: Value = serde_json::from_str(&again).unwrap();
        assert_eq!(Id::from_value(&again["id"]).unwrap(), first);
        assert_eq!(again["params"]["message"], "?");
        assert_eq!(
            again["params"]["_meta"][crate::mcp::task::RELATED_TASK_META]["taskId"],
            "t"
        );
        let other = id_of(inputs.ask_again(&all, &ctx("o"), "t", "k", &request));
        assert_ne!(other, first, "another caller's own id");
        assert!(inputs.take(&first, &c.caller()).is_some());
        assert!(inputs.take(&first, &c.caller()).is_none(), "taken once");
        assert_ne!(id_of(inputs.ask_again(&all, &c, "t", "k", &request)), first);
        assert!(matches!(
            inputs.ask_again(&|_| false, &c, "t", "k", &request),
            Ask::Unsupported(_)
        ));
    }

    #[test]
    fn capabilities_keys_and_bounds() {
        let inputs = Inputs::default();
        let c = ctx("s");
        let roots = json!({"method": "roots/list"});
        assert!(matches!(
            inputs.ask(&|p| p == "/elicitation", &c, "t", "r", &roots),
            Ask::Unsupported(m) if m == "roots/list"
        ));
        let id = id_of(inputs.ask(&|p| p == "/roots", &c, "t", "r", &roots));
        assert!(matches!(
            inputs.ask(&|_| true, &c, "t", "r", &roots),
            Ask::Already
        ));
        assert!(inputs.take(&id, &ctx("other").caller()).is_none());
        assert_eq!(inputs.take(&id, &c.caller()).unwrap().method, "roots/list");
        let many: Map<String, Value> = (0..=MAX_KEYS_PER_TASK)
            .map(|n| (n.to_string(), roots.clone()))
            .collect();
        assert_eq!(inputs.over_bound("t", &many), Some(MAX_KEYS_PER_TASK + 2));
        let few: Map<String, Value> = many.into_iter().take(3).collect();
        assert_eq!(inputs.over_bound("t", &few), None);
        assert!(matches!(
            inputs.ask(&|_| true, &c, "t", "x", &json!({"method": "ping"})),
            Ask::Unsupported(_)
        ));
        // A 2025 client's answer carries the related-task key (2025-11-25 requires it), with
        // whatever taskId it wrote; a 2026 input response has no such key (tester 5 #8c).
        let answered = json!({"result": {"action": "accept", "content": {"a": 1},
            "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "other"}}}});
        assert_eq!(
            response_value("elicitation/create", &answered),
            Some(json!({"action": "accept", "content": {"a": 1}}))
        );
        let kept = json!({"result": {"roots": [], "_meta": {"x": 1,
            "io.modelcontextprotocol/related-task": {"taskId": "t"}}}});
        assert_eq!(
            response_value("roots/list", &kept),
            Some(json!({"roots": [], "_meta": {"x": 1}}))
        );
        assert_eq!(
            response_value("roots/list", &json!({"error": {}})),
            Some(json!({"roots": []}))
        );
        // A result that is not one of the method's is an error answer (tester 5 #6).
        for bogus in [
            json!({"bogus": true}),
            json!({"action": "maybe"}),
            json!([1]),
        ] {
            assert_eq!(
                response_value("elicitation/create", &json!({ "result": bogus })),
                Some(json!({"action": "decline"}))
            );
        }
        assert_eq!(
            response_value("roots/list", &json!({"result": {"roots": "x"}})),
            Some(json!({"roots": []}))
        );
        let sampled = json!({"role": "assistant", "model": "m",
            "content": {"type": "text", "text": "hi"}});
        assert_eq!(
            response_value("sampling/createMessage", &json!({ "result": sampled })),
            Some(sampled)
        );
        assert_eq!(
            response_value(
                "sampling/createMessage",
                &json!({"result": {"role": "assistant"}})
            ),
            None
        );
        assert_eq!(
            response_value("elicitation/create", &json!({"error": {}})),
            Some(json!({"action": "decline"}))
        );
        // A CreateMessageResult cannot refuse: no value (it is not an ElicitResult).
        assert_eq!(
            response_value("sampling/createMessage", &json!({"error": {}})),
            None
        );
    }
}

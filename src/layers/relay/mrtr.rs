//! MRTR for 2025-11-25 clients (2026-07-28 §2.3 "multi-round-trip requests"; DESIGN.md "Two
//! eras, one gateway"): a 2026-07-28 upstream that needs input within a request answers it
//! `{"resultType":"input_required","inputRequests":{<key>:{method,params}},"requestState":…}`
//! and expects the request again, under a new id, with `params.inputResponses` and
//! `params.requestState`. A 2025 client knows nothing of that; it answers server→client
//! requests. So, for the requests taskgate sends upstream in 2026 form for a 2025 client (a held
//! session's `tools/call`, `prompts/get`, `resources/read`; the bridged task-augmented
//! `tools/call` before its `CreateTaskResult`, and so `[upgrade]`'s re-issued call):
//!
//! - the client's answer becomes an SSE stream (HTTP 200), whatever the upstream's first answer
//!   was; each `inputRequests` entry is sent on it as an `elicitation/create`,
//!   `sampling/createMessage` or `roots/list` request under an id taskgate mints
//!   (`"taskgate-input-…"`, the relay of `input`; no related-task `_meta`: there is no task);
//! - the client's answers (JSON-RPC responses POSTed on its session, by the same caller) are
//!   collected (HTTP 202 each; an error answer is `{"action":"decline"}` for
//!   `elicitation/create`, `{"roots":[]}` for `roots/list`, as for tasks), then the request goes upstream again under a new id
//!   (`"taskgate-bridge-…"`), its `params` as first sent plus `inputResponses` (key → the
//!   client's result) and `requestState` echoed as the upstream gave it (absent when it gave
//!   none); notifications of the retried request's stream are relayed (`notifications/tasks` as
//!   `notifications/tasks/status`);
//! - rounds repeat until an answer that is not `input_required`; it is sent last, under the
//!   client's original id (for a task-augmented call: the nested `CreateTaskResult`, or the
//!   plain result recorded as a `completed` task, as without MRTR).
//!
//! Bounds and errors (each ends the exchange with a JSON-RPC error under the client's id, on the
//! stream; the upstream request is simply not retried: 2026 has nothing to cancel):
//! - at most [`MAX_ROUNDS`] rounds (`-32603` naming the bound);
//! - at most [`MAX_KEYS_PER_TASK`] keys in one round (`-32603`);
//! - an entry whose method needs a capability the client did not declare in its `initialize`
//!   (`elicitation`, `sampling`, `roots`), or a method taskgate does not relay: `-32600` naming
//!   the method and the capability (what a 2026 `-32021` for another capability becomes for a
//!   2025 client, see `errors`); nothing of that round is asked;
//! - the client's answers to one round within the upstream's `timeout_ms` (`-32603`), and each
//!   retry, its SSE answer included, within it too (as every exchange of the bridge);
//! - a malformed `input_required` (no `inputRequests` object, or an empty one): `-32603`.
//! - a `sampling/createMessage` the client answered with a JSON-RPC error: `-32603` saying so,
//!   no retry (a `CreateMessageResult` has no refusal form and a 2026 `InputResponse` no error
//!   member; a `decline` would be an `ElicitResult` sent as a sampling result).
//! - the client's `notifications/cancelled` (held sessions) or closing its stream ends the
//!   exchange at once: the retry in flight is dropped (closing the upstream request is the
//!   2026 cancel) and unanswered input requests are forgotten.
//!
//! Counted in `taskgate_bridge_mrtr_total{upstream,outcome}` (one per exchange) and
//! `taskgate_bridge_mrtr_rounds_total{upstream}` (one per round relayed); an exchange ended
//! because an input request could not be relayed (`refused_capability`, `too_many_keys`,
//! `client_error`) also in `taskgate_bridge_input_refused_total` with the same reason as a
//! bridged task's refusal (`Metrics::bridge_mrtr`).

use super::input::{capability_for, Ask, Inputs, MAX_KEYS_PER_TASK};
use super::{read_to_answer, Client, Relay};
use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody, RequestParts};
use crate::jsonrpc::{self, Id, Message};
use crate::layers::McpService;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::metrics::MrtrOutcome;
use crate::sse::{Event, EventStream};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Map, Value};
use std::future::Future;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Most MRTR rounds taskgate relays for one request of a 2025 client.
pub const MAX_ROUNDS: usize = 8;
/// Capacity of the channel to the client's stream.
const RELAY_CAPACITY: usize = 64;

/// The methods 2026-07-28 allows MRTR on.
pub fn allows_mrtr(method: Option<&str>) -> bool {
    matches!(
        method,
        Some("tools/call" | "prompts/get" | "resources/read")
    )
}

/// The answer (parsed) when `text` is one answering `id` with `resultType: "input_required"`.
pub(crate) fn input_required(text: &[u8], id: &Id) -> Option<Value> {
    if !jsonrpc::contains(text, b"input_required") || !jsonrpc::is_answer_to(text, id) {
        return None;
    }
    let v: Value = serde_json::from_slice(text).ok()?;
    is_input_required(&v).then_some(v)
}

/// Whether an answer is an MRTR `input_required` result.
pub fn is_input_required(answer: &Value) -> bool {
    answer.pointer("/result/resultType").and_then(Value::as_str) == Some("input_required")
}

/// How a client's request is sent upstream: a function of the service below and the request
/// (one round).
pub trait Send2026<S>: Clone + Send + Sync + 'static {
    /// The reply's future.
    type Fut: Future<Output = Result<McpReply, GatewayError>> + Send + 'static;
    /// Sends one round.
    fn send(&self, inner: S, req: McpRequest) -> Self::Fut;
}

impl<S, F, Fut> Send2026<S> for F
where
    F: Fn(S, McpRequest) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<McpReply, GatewayError>> + Send + 'static,
{
    type Fut = Fut;
    fn send(&self, inner: S, req: McpRequest) -> Fut {
        self(inner, req)
    }
}

/// One MRTR exchange: what every round needs.
pub struct Exchange<S, F> {
    /// The upstream's relay (its input requests, ids, `timeout_ms`, metrics).
    pub relay: Arc<Relay>,
    /// What the relay is told of the client (see [`Client`]).
    pub client: Client,
    /// The service below (a round goes there through `send`).
    pub inner: S,
    /// The first round's 2026 request; each retry is it under a new id with `inputResponses`
    /// and `requestState`.
    pub out: McpRequest,
    /// The client's id (the final answer goes under it).
    pub client_id: Id,
    /// How a round is sent.
    pub send: F,
}

/// The answer that ends an exchange early, and its outcome.
type Ended = (MrtrOutcome, McpReply);

/// A held session's request `out` (a 2026 request under the client's id) sent through `send`;
/// when the upstream answers `input_required` (JSON, or the answering event of its SSE stream),
/// the rounds run (see the module docs) and the client gets an SSE stream. Any other answer
/// passes as it came (an SSE stream is relayed as it arrives). Errors: the first round's, as
/// `send` gave it; later ones end the stream with a JSON-RPC error (see the module docs).
pub async fn call<S, F>(
    relay: Arc<Relay>,
    client: Client,
    inner: S,
    out: McpRequest,
    send: F,
) -> Result<McpReply, GatewayError>
where
    S: McpService,
    F: Send2026<S>,
{
    let Some(id) = out
        .id()
        .cloned()
        .filter(|_| allows_mrtr(out.request_method()))
    else {
        return send.send(inner, out).await;
    };
    let mut reply = send.send(inner.clone(), out.clone()).await?;
    let ex = Exchange {
        relay,
        client,
        inner,
        out,
        client_id: id,
        send,
    };
    match std::mem::replace(&mut reply.body, ReplyBody::Empty) {
        ReplyBody::Json(bytes) => match input_required(&bytes, &ex.client_id) {
            Some(first) => Ok(ex.spawn(first, Vec::new(), plain_answer)),
            None => {
                reply.body = ReplyBody::Json(bytes);
                Ok(reply)
            }
        },
        ReplyBody::Stream(events) => {
            reply.body = ReplyBody::Stream(intercept(ex, events));
            Ok(reply)
        }
        other => {
            reply.body = other;
            Ok(reply)
        }
    }
}

/// The final answer of a plain request, as it is.
fn plain_answer(
    answer: Value,
    _rest: Option<EventStream>,
) -> futures_util::future::Ready<McpReply> {
    futures_util::future::ready(McpReply::local_json(Bytes::from(answer.to_string())))
}

/// `events` relayed as they come until the event answering the client's id; when that one is
/// `input_required`, the rest of the stream is the rounds' (the upstream stream is closed).
fn intercept<S, F>(ex: Exchange<S, F>, events: EventStream) -> EventStream
where
    S: McpService,
    F: Send2026<S>,
{
    enum Phase<S, F> {
        Upstream(EventStream, Box<Exchange<S, F>>),
        Rounds(mpsc::Receiver<Event>),
    }
    let phase = Phase::Upstream(events, Box::new(ex));
    Box::pin(futures_util::stream::unfold(phase, |phase| async move {
        match phase {
            Phase::Upstream(mut events, ex) => {
                let ev = events.next().await?;
                let first = ev
                    .data
                    .as_deref()
                    .and_then(|d| input_required(d.as_bytes(), &ex.client_id));
                let Some(first) = first else {
                    return Some((ev, Phase::Upstream(events, ex)));
                };
                drop(events);
                let mut rx = ex.start(first, Vec::new(), plain_answer);
                let ev = rx.recv().await?;
                Some((ev, Phase::Rounds(rx)))
            }
            Phase::Rounds(mut rx) => {
                let ev = rx.recv().await?;
                Some((ev, Phase::Rounds(rx)))
            }
        }
    }))
}

impl<S, F> Exchange<S, F>
where
    S: McpService,
    F: Send2026<S>,
{
    /// Runs the rounds from the `input_required` answer `first` on a task of its own and
    /// answers with their SSE stream: `early` events first, then the input requests and the
    /// retries' notifications, then `finish`'s reply for the final answer (under the client's
    /// id) and the rest of the last retry's stream.
    pub fn spawn<G, GFut>(self, first: Value, early: Vec<Event>, finish: G) -> McpReply
    where
        G: FnOnce(Value, Option<EventStream>) -> GFut + Send + 'static,
        GFut: Future<Output = McpReply> + Send + 'static,
    {
        McpReply::event_stream(self.start(first, early, finish), None)
    }

    fn start<G, GFut>(self, first: Value, early: Vec<Event>, finish: G) -> mpsc::Receiver<Event>
    where
        G: FnOnce(Value, Option<EventStream>) -> GFut + Send + 'static,
        GFut: Future<Output = McpReply> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(RELAY_CAPACITY);
        tokio::spawn(async move {
            let closed = tx.clone();
            let relay = self.relay.clone();
            let upstream = self.out.ctx.upstream.clone();
            tokio::select! {
                outcome = self.run(first, early, finish, &tx) => {
                    relay.metrics.bridge_mrtr(&upstream, outcome);
                }
                _ = closed.closed() => {
                    tracing::debug!(%upstream, "MRTR: the client went away; the request is ended");
                    relay.metrics.bridge_mrtr(&upstream, MrtrOutcome::Disconnected);
                }
            }
        });
        rx
    }

    async fn run<G, GFut>(
        self,
        first: Value,
        early: Vec<Event>,
        finish: G,
        tx: &mpsc::Sender<Event>,
    ) -> MrtrOutcome
    where
        G: FnOnce(Value, Option<EventStream>) -> GFut,
        GFut: Future<Output = McpReply>,
    {
        for ev in early {
            if tx.send(ev).await.is_err() {
                return MrtrOutcome::Disconnected;
            }
        }
        let (outcome, reply) = match self.rounds(first, tx).await {
            Ok(Some((answer, rest))) => (MrtrOutcome::Completed, finish(answer, rest).await),
            Ok(None) => return MrtrOutcome::Disconnected,
            Err(ended) => ended,
        };
        match reply.body {
            ReplyBody::Json(bytes) | ReplyBody::Raw(bytes) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let _ = tx.send(Event::message(text)).await;
            }
            ReplyBody::Stream(mut events) => {
                while let Some(ev) = events.next().await {
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
            }
            ReplyBody::Empty => {}
        }
        outcome
    }

    /// The exchange's end with `error`, as the 2025-11-25 client's answer (HTTP 200).
    fn end(&self, outcome: MrtrOutcome, error: McpError) -> Ended {
        tracing::info!(upstream = %self.out.ctx.upstream, ?outcome, message = %error, "MRTR exchange ended");
        (
            outcome,
            McpReply::error(Era::Legacy, Some(&self.client_id), &error),
        )
    }

    /// The rounds: `Ok(Some)` with the final answer (under the client's id) and the rest of
    /// its stream; `Ok(None)` when the client went away.
    async fn rounds(
        &self,
        first: Value,
        tx: &mpsc::Sender<Event>,
    ) -> Result<Option<(Value, Option<EventStream>)>, Ended> {
        let declared: &(dyn Fn(&str) -> bool + Send + Sync) = &*self.client.declared;
        let upstream = self.out.ctx.upstream.clone();
        let mut answer = first;
        let mut rest = None;
        let mut round = 0;
        while is_input_required(&answer) {
            round += 1;
            if round > MAX_ROUNDS {
                return Err(self.end(
                    MrtrOutcome::TooManyRounds,
                    McpError::InputRoundsExceeded { max: MAX_ROUNDS },
                ));
            }
            let result = &answer["result"];
            let requests = match result.get("inputRequests").and_then(Value::as_object) {
                Some(r) if !r.is_empty() => r,
                _ => {
                    return Err(self.end(MrtrOutcome::UpstreamError, McpError::InputRequestsMissing))
                }
            };
            if requests.len() > MAX_KEYS_PER_TASK {
                let error = McpError::TooManyInputs {
                    asked: requests.len(),
                    max: MAX_KEYS_PER_TASK,
                };
                return Err(self.end(MrtrOutcome::TooManyKeys, error));
            }
            for request in requests.values() {
                let method = request.get("method").and_then(Value::as_str).unwrap_or("");
                if !capability_for(method).is_some_and(declared) {
                    let error = McpError::InputNotRelayed {
                        method: method.to_string(),
                        capability: capability_for(method)
                            .map(|cap| cap.trim_start_matches('/').to_string()),
                    };
                    return Err(self.end(MrtrOutcome::RefusedCapability, error));
                }
            }
            let Some(responses) = self.ask(round, requests, declared, tx).await? else {
                return Ok(None);
            };
            self.relay.metrics.bridge_mrtr_round(&upstream);
            let id = self.relay.next_id();
            let retry = self.retry(&id, responses, result.get("requestState"));
            let exchange = async {
                let reply = self.send.send(self.inner.clone(), retry).await?;
                Ok(read_relaying(reply, &id, self.client.shown, tx).await)
            };
            match self.relay.bounded(upstream.clone(), &id, exchange).await {
                Ok((Some(next), more)) => {
                    answer = next;
                    rest = more;
                }
                Ok((None, _)) => {
                    return Err(self.end(MrtrOutcome::UpstreamError, McpError::RetryUnanswered))
                }
                Err(e) => {
                    return Err((
                        MrtrOutcome::UpstreamError,
                        McpReply::error(Era::Legacy, Some(&self.client_id), &McpError::from(&e)),
                    ))
                }
            }
        }
        if let Some(o) = answer.as_object_mut() {
            o.insert(
                "id".into(),
                serde_json::from_str(self.client_id.as_json()).unwrap_or(Value::Null),
            );
        }
        Ok(Some((answer, rest)))
    }

    /// Sends one round's input requests to the client and collects its answers (key → the
    /// `inputResponses` value), within the upstream's `timeout_ms`; `Ok(None)` when the client
    /// went away.
    async fn ask(
        &self,
        round: usize,
        requests: &Map<String, Value>,
        declared: &(dyn Fn(&str) -> bool + Send + Sync),
        tx: &mpsc::Sender<Event>,
    ) -> Result<Option<Map<String, Value>>, Ended> {
        let inputs = &self.relay.inputs;
        let n = self.relay.ids.next();
        let group = format!("mrtr-{n}-{round}");
        let (answers, mut rx) = mpsc::channel(requests.len());
        let forget = Forget(inputs, &group);
        for (key, request) in requests {
            match inputs.ask_round(declared, &self.out.ctx, &group, key, request, &answers) {
                Ask::Send(message) => {
                    if tx.send(Event::message(message)).await.is_err() {
                        return Ok(None);
                    }
                }
                Ask::Already | Ask::Unsupported(_) => {}
            }
        }
        drop(answers);
        let mut responses = Map::new();
        let deadline = tokio::time::Instant::now() + self.relay.timeout;
        while responses.len() < requests.len() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((key, Some(value)))) => {
                    responses.insert(key, value);
                }
                Ok(Some((key, None))) => {
                    // A sampling request answered with an error: no `inputResponses` value
                    // says "refused" (a `decline` is an `ElicitResult`), so no retry.
                    let method = requests
                        .get(&key)
                        .and_then(|r| r.get("method"))
                        .and_then(Value::as_str)
                        .unwrap_or("input")
                        .to_string();
                    let error = McpError::InputRefused { method };
                    return Err(self.end(MrtrOutcome::ClientError, error));
                }
                Ok(None) => {
                    return Err(self.end(MrtrOutcome::UpstreamError, McpError::InputRequiredLost))
                }
                Err(_) => {
                    let error = McpError::InputTimeout {
                        round,
                        timeout_ms: self.relay.timeout.as_millis(),
                    };
                    return Err(self.end(MrtrOutcome::Timeout, error));
                }
            }
        }
        drop(forget);
        Ok(Some(responses))
    }

    /// The retry of the first round's request under `id` with `inputResponses` and the
    /// upstream's `requestState` as it came.
    fn retry(&self, id: &Id, responses: Map<String, Value>, state: Option<&Value>) -> McpRequest {
        let mut v = match &self.out.op {
            Operation::Post(msg) => msg.parse_as::<Value>().unwrap_or(Value::Null),
            _ => Value::Null,
        };
        if !v.is_object() {
            v = serde_json::json!({"jsonrpc": "2.0", "method": self.out.request_method()});
        }
        v["id"] = serde_json::from_str(id.as_json()).unwrap_or(Value::Null);
        if !v.get("params").is_some_and(Value::is_object) {
            v["params"] = serde_json::json!({});
        }
        let params = v["params"].as_object_mut().expect("an object");
        params.insert("inputResponses".into(), Value::Object(responses));
        match state {
            Some(s) => params.insert("requestState".into(), s.clone()),
            None => params.remove("requestState"),
        };
        let msg = Message::parse(Bytes::from(v.to_string())).expect("a well-formed request");
        McpRequest::from(RequestParts {
            op: Operation::Post(msg),
            ctx: self.out.ctx.clone(),
            extensions: self.out.extensions.clone(),
            trace: self.out.trace.clone(),
        })
    }
}

/// Forgets a round's input requests when dropped (answered, failed, or the client gone).
struct Forget<'a>(&'a Inputs, &'a str);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

/// Reads a retry's reply up to the answer to `id` ([`read_to_answer`]): its notifications before
/// it are relayed on `tx` as a 2025 client takes them (`shown`, the bridge's
/// `translate::legacy_event`); the answer and the rest of its stream. `(None, None)` when the
/// client's stream closed meanwhile.
async fn read_relaying(
    reply: McpReply,
    id: &Id,
    shown: fn(Event) -> Option<Event>,
    tx: &mpsc::Sender<Event>,
) -> (Option<Value>, Option<EventStream>) {
    read_to_answer(reply, id, |ev| async move {
        match shown(ev) {
            Some(ev) => tx.send(ev).await.is_ok(),
            None => true,
        }
    })
    .await
}

/// A client's answer to an MRTR round's input request (see `input`): handed to the round.
pub fn answered(req: &McpRequest, pending: super::input::Pending) {
    let Some(round) = pending.round else {
        return;
    };
    let answer = match &req.op {
        Operation::Post(m) => m.parse_as::<Value>().unwrap_or(Value::Null),
        _ => Value::Null,
    };
    // `None`: an error no input response can carry; the round ends on it.
    let value = super::input::response_value(&pending.method, &answer);
    // The round's channel has room for each of its keys (each answered once); a round that
    // ended has dropped its receiver.
    let _ = round.try_send((pending.key, value));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_required_is_recognised_only_for_its_id() {
        let id = Id::from_json("7").unwrap();
        let text = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{}}}"#;
        assert!(input_required(text, &id).is_some());
        assert!(input_required(text, &Id::from_json("8").unwrap()).is_none());
        let done = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","content":[{"type":"text","text":"input_required"}]}}"#;
        assert!(input_required(done, &id).is_none());
        assert!(allows_mrtr(Some("prompts/get")) && !allows_mrtr(Some("tools/list")));
    }
}

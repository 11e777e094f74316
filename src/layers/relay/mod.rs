//! The `relay` stage: input a 2026-07-28 upstream asks for, relayed to a 2025-11-25 client
//! that only answers server→client requests (DESIGN.md "Two eras, one gateway": input relay,
//! elicitation/sampling ↔ `inputRequests`/MRTR, one stage of its own).
//!
//! Two ways a 2026-07-28 upstream asks for input, one relay:
//! - `input` (2026-07-28 tasks extension, `input_required` on a task): the `inputRequests` of a
//!   `DetailedTask` become `elicitation/create`, `sampling/createMessage` or `roots/list`
//!   requests on the client's `tasks/result` stream; the client's answers go upstream as
//!   `tasks/update` ([`Inputs`]: what was asked, of whom, bounded).
//! - `mrtr` (2026-07-28 §2.3, multi-round-trip requests: an `input_required` *result*): the same
//!   requests on the request's own stream, then the request retried with `inputResponses` and
//!   the `requestState` ([`mrtr::Exchange`], at most [`mrtr::MAX_ROUNDS`] rounds).
//!
//! The relay reads no other stage's table and records no task fact: what the client declared
//! (its `initialize` capabilities) is handed to it with each exchange ([`Declared`]); how the
//! upstream's notifications are shown to the client is handed to it too
//! ([`Client::shown`], the `bridge`'s era translation). The `bridge` owns one
//! [`Relay`] per upstream and calls it; a client's POSTed answer to an input request reaches
//! the relay through the bridge's dispatch ([`Inputs::take`], then [`mrtr::answered`] or the
//! bridge's `tasks/update`).
//!
//! Bounds: see [`Inputs`] (pending requests per caller and per upstream, keys per task or
//! round), [`mrtr::MAX_ROUNDS`], and every exchange of the relay's own with the upstream within
//! the upstream's `timeout_ms` ([`Relay::bounded`]).

pub mod input;
pub mod mrtr;

pub use input::Inputs;

use crate::exchange::{GatewayError, McpReply, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::metrics::Metrics;
use crate::sse::{Event, EventStream};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the client declared in its `initialize` `capabilities`, asked by JSON pointer
/// (`"/elicitation"`): whether taskgate may send it a request needing that capability.
pub type Declared = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What the relay is told of the 2025-11-25 client it relays to, by the stage that calls it.
#[derive(Clone)]
pub struct Client {
    /// What the client declared in its `initialize` (its held session's capabilities, else
    /// its session's): only requests it declared a capability for are sent to it.
    pub declared: Declared,
    /// How an event of the upstream's stream is shown to the client (the `bridge`'s
    /// `translate::legacy_event`: `notifications/tasks` as `notifications/tasks/status`);
    /// `None` drops it.
    pub shown: fn(Event) -> Option<Event>,
}

/// The ids of taskgate's own upstream requests for one upstream (`"taskgate-bridge-<n>"`: a
/// string no client id equals by type and prefix), and tokens of the same sequence. One
/// sequence per upstream, shared by the `bridge` and the relay so their ids never collide.
#[derive(Debug)]
pub struct OwnIds(AtomicU64);

impl Default for OwnIds {
    fn default() -> Self {
        OwnIds(AtomicU64::new(1))
    }
}

impl OwnIds {
    /// The next number of the sequence (a token, or a name's part).
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }

    /// The next id for taskgate's own upstream request.
    pub fn next_id(&self) -> Id {
        let n = self.next();
        Id::from_json(&format!("\"taskgate-bridge-{n}\"")).expect("a JSON string")
    }
}

/// One upstream's relay: the input requests sent to clients and not yet answered, the keys
/// asked per task or round, and the handles it is given.
pub struct Relay {
    /// Input requests sent to clients (see `input`).
    pub inputs: Inputs,
    ids: Arc<OwnIds>,
    /// The upstream's `timeout_ms`: bounds each of the relay's own exchanges and each round's
    /// wait for the client's answers.
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Relay {
    /// The relay of one upstream: its own exchanges bounded by `timeout` (the upstream's
    /// `timeout_ms`), its ids from `ids` (shared with the `bridge`), counted in `metrics`
    /// (`taskgate_bridge_mrtr_total`, `taskgate_bridge_mrtr_rounds_total`,
    /// `taskgate_upstream_errors_total{kind="timeout"}`).
    pub fn new(ids: Arc<OwnIds>, timeout: Duration, metrics: Arc<Metrics>) -> Relay {
        Relay {
            inputs: Inputs::default(),
            ids,
            timeout,
            metrics,
        }
    }

    /// The upstream's `timeout_ms`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The next id for one of taskgate's own upstream requests (see [`OwnIds`]).
    pub fn next_id(&self) -> Id {
        self.ids.next_id()
    }

    /// `exchange` (one of taskgate's own exchanges with `upstream` under `id`) bounded by the
    /// upstream's `timeout_ms`: past it the error is the upstream timeout's
    /// ([`GatewayError::UpstreamTimeout`], "upstream `x` did not answer within N ms", counted
    /// in `taskgate_upstream_errors_total{kind="timeout"}`), answered to a 2025 client as
    /// JSON-RPC `-32603` (HTTP 200) like any error reaching the upstream.
    pub async fn bounded<T>(
        &self,
        upstream: Arc<str>,
        id: &Id,
        exchange: impl Future<Output = Result<T, GatewayError>>,
    ) -> Result<T, GatewayError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.bounded_until(upstream, id, deadline, exchange).await
    }

    /// As [`Relay::bounded`], for one of several exchanges that share one `deadline` (made
    /// `timeout_ms` from the first one's start): past it the error is the same upstream
    /// timeout's, naming `timeout_ms` (the bound of them all).
    pub async fn bounded_until<T>(
        &self,
        upstream: Arc<str>,
        id: &Id,
        deadline: tokio::time::Instant,
        exchange: impl Future<Output = Result<T, GatewayError>>,
    ) -> Result<T, GatewayError> {
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok(answer) => answer,
            Err(_) => {
                self.metrics
                    .upstream_error(&upstream, crate::metrics::UpstreamErrorKind::Timeout);
                tracing::warn!(%upstream, id = %id.as_json(), "the upstream did not answer a bridged request within timeout_ms");
                Err(GatewayError::UpstreamTimeout {
                    upstream,
                    timeout_ms: self.timeout.as_millis().min(u64::MAX as u128) as u64,
                })
            }
        }
    }
}

/// Reads `reply` up to the message answering `id`: the answer (parsed; `None` when there is
/// none: an HTTP error page, a stream that ended first, a body that is not JSON) and, for an
/// SSE body, the rest of its stream after the answer event (`None` when there is no answer).
/// Each event of the stream before the answer (notifications, answers to other ids, events
/// without data) is handed to `before`, in order, and awaited; when it yields `false` (its
/// reader went away) reading stops at once with `(None, None)`.
pub async fn read_to_answer<F, Fut>(
    reply: McpReply,
    id: &Id,
    before: F,
) -> (Option<Value>, Option<EventStream>)
where
    F: FnMut(Event) -> Fut,
    Fut: Future<Output = bool>,
{
    let (answer, rest) = read_to_raw_answer(reply, id, before).await;
    (answer.and_then(|a| serde_json::from_slice(&a).ok()), rest)
}

/// [`read_to_answer`], the answer kept as the bytes that came (valid JSON, not read into a
/// `Value`: one nesting past serde_json's 128 levels is still an answer, and a payload kept
/// from it is taken from these bytes).
pub async fn read_to_raw_answer<F, Fut>(
    reply: McpReply,
    id: &Id,
    mut before: F,
) -> (Option<Bytes>, Option<EventStream>)
where
    F: FnMut(Event) -> Fut,
    Fut: Future<Output = bool>,
{
    // Skipping a value (a `RawValue`) has no depth limit in serde_json.
    let valid = |b: &[u8]| serde_json::from_slice::<&serde_json::value::RawValue>(b).is_ok();
    let mut events = match reply.body {
        ReplyBody::Stream(events) => events,
        ReplyBody::Json(bytes) | ReplyBody::Raw(bytes) => {
            return (valid(&bytes).then_some(bytes), None)
        }
        ReplyBody::Empty => return (None, None),
    };
    while let Some(ev) = events.next().await {
        if let Some(data) = ev.data.as_deref() {
            if jsonrpc::is_answer_to(data.as_bytes(), id) {
                let answer = valid(data.as_bytes()).then(|| Bytes::from(data.to_string()));
                return (answer, Some(events));
            }
        }
        if !before(ev).await {
            return (None, None);
        }
    }
    (None, None)
}

//! What comes before an upgraded call's answer: reading a reply up to it ([`answer_of`],
//! [`read_to_answer`]), where the other messages go ([`Others`]), and where the answer goes
//! ([`First`]).

use super::EARLY_LIMIT;
use crate::exchange::{GatewayError, McpReply, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::sse::Event;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

/// Where the driver sends the client's answer: the task's stream, or the answer that ended it.
pub(super) type First = tokio::sync::oneshot::Sender<Result<McpReply, GatewayError>>;

/// Where [`answer_of`] puts the messages that are not the answer.
pub(super) enum Others<'a> {
    /// Dropped.
    Discard,
    /// Sent on a bounded channel (waits while it is full: backpressure on the upstream stream).
    Relay(&'a mpsc::Sender<Event>),
    /// Kept, up to [`EARLY_LIMIT`]; past it the rest is dropped and `overflowed` set.
    Buffer {
        events: &'a mut Vec<Event>,
        overflowed: &'a mut bool,
    },
}

impl Others<'_> {
    async fn put(&mut self, ev: Event) {
        match self {
            Others::Discard => {}
            Others::Relay(tx) => {
                let _ = tx.send(ev).await;
            }
            Others::Buffer { events, overflowed } => {
                if events.len() < EARLY_LIMIT && !**overflowed {
                    // Kept until the answer comes, maybe for long: not pinning the upstream's
                    // read buffer (up to EARLY_LIMIT of them).
                    events.push(ev.detached());
                } else {
                    **overflowed = true;
                    events.clear();
                }
            }
        }
    }
}

/// Reads a reply until the message answering `id`; other messages go to `others`.
pub(super) async fn answer_of(reply: McpReply, id: &Id, mut others: Others<'_>) -> Option<Value> {
    match reply.body {
        ReplyBody::Json(bytes) => serde_json::from_slice(&bytes).ok(),
        ReplyBody::Stream(mut events) => {
            while let Some(ev) = events.next().await {
                let answers = ev
                    .data
                    .as_ref()
                    .filter(|d| jsonrpc::is_answer_to(d.as_bytes(), id))
                    .and_then(|d| serde_json::from_str::<Value>(d).ok());
                match answers {
                    Some(v) => return Some(v),
                    None => others.put(ev).await,
                }
            }
            None
        }
        _ => None,
    }
}

/// Ends the call without a task: `reply` to `first`, or on the stream the client already has.
pub(super) async fn finish(pending: Pending, tx: &mpsc::Sender<Event>, reply: McpReply) {
    match pending {
        Some((first, ..)) => {
            let _ = first.send(Ok(reply));
        }
        None => {
            if let ReplyBody::Json(bytes) = reply.body {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let _ = tx.send(Event::message(text)).await;
            }
        }
    }
}

/// The client's stream of an upgraded call, read from `rx`. It is taskgate's own, made of
/// events of taskgate's exchanges with the upstream (the `tools/call` that made the task, its
/// `tasks/result`), so it carries none of their event ids: a client resuming with
/// `Last-Event-ID` would have the upstream replay those exchanges to it (server-everything
/// does: the `CreateTaskResult` under the client's own id, which the TypeScript SDK took as an
/// empty `CallToolResult`, and the answers to taskgate's polls). Events without data (priming
/// events, whose only use is their id) are dropped, but for the abort marker.
pub(super) fn client_stream(
    rx: mpsc::Receiver<Event>,
    session_id: Option<http::HeaderValue>,
) -> McpReply {
    let mut reply = McpReply::event_stream(rx, session_id);
    if let ReplyBody::Stream(events) = reply.body {
        reply.body = ReplyBody::Stream(Box::pin(events.filter_map(|mut ev| async move {
            ev.id = None;
            let data = ev.data.as_ref().is_some_and(|d| !d.is_empty());
            // The abort marker (the upstream cut the stream) carries no data but must reach
            // the edge, which aborts the client's stream (review 20 #6).
            (data || ev.is_transport_error() || ev.is_abort()).then_some(ev)
        })));
    }
    reply
}

/// The client's answer not sent yet: where it goes, the stream it will read, its session id.
pub(super) type Pending = Option<(First, mpsc::Receiver<Event>, Option<http::HeaderValue>)>;

/// Reads the upgraded call's reply up to the message answering `id`; the messages before it
/// are kept in `early` (up to [`EARLY_LIMIT`]; past it `overflowed` is set) until one is a
/// request to the client: then the client gets its stream (`pending` taken) and those
/// messages, and every later one but the answer, go on `tx` (bounded: backpressure).
pub(super) async fn read_to_answer(
    reply: McpReply,
    id: &Id,
    early: &mut Vec<Event>,
    overflowed: &mut bool,
    pending: &mut Pending,
    tx: &mpsc::Sender<Event>,
) -> Option<Value> {
    let mut events = match reply.body {
        ReplyBody::Stream(events) => events,
        other => {
            let reply = McpReply {
                body: other,
                ..reply
            };
            return answer_of(reply, id, Others::Discard).await;
        }
    };
    while let Some(ev) = events.next().await {
        let data = ev.data.as_deref().unwrap_or_default();
        if jsonrpc::is_answer_to(data.as_bytes(), id) {
            return serde_json::from_str::<Value>(data).ok();
        }
        if pending.is_some() && !is_client_request(data) {
            Others::Buffer {
                events: &mut *early,
                overflowed: &mut *overflowed,
            }
            .put(ev)
            .await;
            continue;
        }
        if let Some((first, rx, session_id)) = pending.take() {
            tracing::debug!("upgraded call: a request to the client before the task exists; the client's stream opens now");
            let _ = first.send(Ok(client_stream(rx, session_id)));
            for e in early.drain(..) {
                let _ = tx.send(e).await;
            }
        }
        if tx.send(ev).await.is_err() {
            return None;
        }
    }
    None
}

/// Whether an event's data is a JSON-RPC request (a `method` and an `id`).
fn is_client_request(data: &str) -> bool {
    data.contains("\"method\"")
        && serde_json::from_str::<Value>(data)
            .is_ok_and(|v| v.get("method").is_some() && v.get("id").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's stream of an upgraded call: upstream event ids gone, priming events
    /// dropped, and the abort marker kept, so the edge still aborts the client's stream when
    /// the upstream cut it (review 20 #6: the filter dropped it with the priming events).
    #[tokio::test]
    async fn the_clients_stream_drops_ids_and_primes_but_keeps_the_abort_marker() {
        let (tx, rx) = mpsc::channel(4);
        let mut prime = Event::message(String::new());
        prime.id = Some("up-1-prime".into());
        let mut message = Event::message(r#"{"jsonrpc":"2.0","method":"x"}"#.to_string());
        message.id = Some("up-1-2".into());
        for ev in [prime, message, Event::abort()] {
            tx.send(ev).await.unwrap();
        }
        drop(tx);
        let ReplyBody::Stream(events) = client_stream(rx, None).body else {
            panic!("a stream");
        };
        let got: Vec<Event> = events.collect().await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].data.is_some() && got[0].id.is_none(), "{:?}", got[0]);
        assert!(got[1].is_abort(), "{:?}", got[1]);
    }
}

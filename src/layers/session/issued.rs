//! A session the upstream issued (its `InitializeResult` came with an `Mcp-Session-Id`, which
//! taskgate passes through) is written to the registry's store before the `initialize` answer
//! goes on (issue 35; see `held_store`), so any replica of a tier, and this one after a
//! restart, serves its next requests.
//!
//! The answer is JSON or an SSE stream (2025-11-25 basic/transports: a POST may be answered
//! either way). For a stream, its events are read up to the `initialize` answer and held
//! until the session is stored, then passed on, the rest of the stream behind them: at most
//! [`MAX_EVENTS_BEFORE`] events, [`MAX_BYTES_BEFORE`] bytes of their data and [`ANSWER_WAIT`];
//! past any of them the stream goes on as it came
//! and the session is kept in this process's table only (as before issue 35), logged. A
//! table without room gets 503 and a store that cannot write 500 (`-32603`), not an id that
//! another replica would answer 404; so does (502) an upstream session id longer than
//! [`MAX_HELD_SESSION_ID`](crate::store::held::MAX_HELD_SESSION_ID) with a store other processes
//! share (with an embedded one it is served by this process only). The upstream session of such
//! a refusal is ended upstream (a `DELETE` naming it, sent once, its answer not waited for): the
//! client never learns its id, so nobody else would end it, and each retry would leave one more
//! session open upstream.

use super::service::{Finish, Issued, Watch};
use super::SessionKey;
use crate::exchange::{McpReply, ReplyBody};
use crate::jsonrpc::Id;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::sse::{Event, ReadAhead};
use futures_util::StreamExt;
use http::HeaderValue;
use serde_json::Value;
use std::time::Duration;

/// Events of an SSE `initialize` answer read ahead of the answer itself, at most.
pub const MAX_EVENTS_BEFORE: usize = 64;
/// Bytes of event data of an SSE `initialize` answer held ahead of the answer itself, at most
/// (the answer's own event included): one event may be as large as `limits.max_event_bytes`,
/// so the event count alone let one `initialize` hold 64 of them.
pub const MAX_BYTES_BEFORE: usize = 1 << 20;
/// How long an SSE `initialize` answer's stream is read for the answer, at most.
pub const ANSWER_WAIT: Duration = Duration::from_secs(30);

impl Finish {
    /// `reply` (an `initialize` answer naming the upstream's session `issued`) once the session
    /// is in the table and the store; or the refusal that replaces it.
    pub(super) async fn store_issued(self, mut reply: McpReply, issued: HeaderValue) -> Issued {
        let answer = |bytes: &[u8], id: Option<&Id>| -> Option<Value> {
            let v = serde_json::from_slice::<Value>(bytes).ok()?;
            (v.get("id").and_then(Id::from_value).as_ref() == id).then_some(v)
        };
        let (found, body) = match reply.body {
            ReplyBody::Json(bytes) => (answer(&bytes, self.id.as_ref()), ReplyBody::Json(bytes)),
            ReplyBody::Stream(mut events) => {
                let mut before: Vec<Event> = Vec::new();
                let mut found = None;
                let mut bound = ReadAhead::new(MAX_EVENTS_BEFORE, MAX_BYTES_BEFORE);
                let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
                while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.next()).await {
                    if !bound.admits(&ev) {
                        // Past the bound: passed on as it came, the answer not looked for.
                        before.push(ev);
                        break;
                    }
                    let hit = ev
                        .data
                        .as_deref()
                        .and_then(|d| answer(d.as_bytes(), self.id.as_ref()));
                    before.push(ev);
                    if hit.is_some() {
                        found = hit;
                        break;
                    }
                }
                let events = futures_util::stream::iter(before).chain(events);
                (found, ReplyBody::Stream(Box::pin(events)))
            }
            other => (None, other),
        };
        reply.body = body;
        let Some(answer) = found else {
            // No answer in reach: kept here only, from the stream as it passes.
            tracing::warn!(upstream = %self.upstream, "an initialize answer was not found in time; its session is not stored");
            return Issued::Answer(self.reply(reply, false));
        };
        let Some(result) = answer.get("result") else {
            // An error: no session to keep.
            return Issued::Answer(reply);
        };
        let Watch::Initialize(caps, _) = &self.watch else {
            return Issued::Answer(reply);
        };
        let key = SessionKey::Session(issued.clone());
        let refuse = |error: McpError| {
            Issued::Refused(McpReply::error(Era::Legacy, self.id.as_ref(), &error))
        };
        let (len, bound) = (issued.len(), crate::store::held::MAX_HELD_SESSION_ID);
        if len > bound {
            if self.sessions.shares_store() {
                // Only this replica could serve it: refused, not a session that fails on the others.
                tracing::warn!(upstream = %self.upstream, len, bound, "an upstream session id is too long to share; its initialize is refused");
                return refuse(McpError::SessionIdTooLong { len, bound });
            }
            tracing::warn!(upstream = %self.upstream, len, bound, "an upstream session id is too long to store; its session is served by this process only, and not after a restart");
        }
        let put = self.sessions.insert(
            &self.upstream,
            Some(key.clone()),
            (self.principal.clone(), self.tenant.clone()),
            Some(caps),
            Some(result),
            None,
        );
        if !put {
            return refuse(McpError::SessionsFull);
        }
        if let Err(e) = self.sessions.store_entry(&self.upstream, &issued).await {
            crate::store::log_failure(&e, "a session could not be written to the store");
            self.sessions.forget(&self.upstream, Some(&key));
            return refuse(McpError::SessionStore { write: true });
        }
        Issued::Answer(reply)
    }
}

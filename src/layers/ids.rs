//! The `ids` layer, innermost (below `observe`, just above the upstream client): a JSON-RPC
//! request id is in flight at most once on each 2025-11-25 upstream session (2025-11-25 basic:
//! request ids "are never reused within a session"), and a client's `notifications/cancelled`
//! reaches only its own request (basic/utilities/cancellation).
//!
//! **Why.** Several clients can share one upstream session, or, with an upstream that issues no
//! `Mcp-Session-Id`, the one session-less stream of requests: with authentication every
//! principal of a session-less upstream, without it every client; and a task's `tasks/result`
//! from another session of its owner is routed to the session the task was created on.
//! Clients number their requests from 0 or 1, so their ids meet. On Streamable HTTP each POST is
//! answered on its own response, but an upstream keys its per-session state by request id: the
//! SDKs' server transports map each id to the stream that answers it (TypeScript
//! `_requestToStreamMapping`, Python `_request_streams`), so the second request with an id takes
//! over the first one's stream (one client gets the other's answer, the other waits for ever),
//! and a `notifications/cancelled` naming the id cancels whichever of them the upstream finds.
//! 2026-07-28 requests are stateless (each POST its own exchange, no server→client requests, no
//! `notifications/cancelled` over HTTP: closing the stream is the cancel) and pass untouched, as
//! does `initialize` (it opens a session of its own).
//!
//! **Rules**, for a 2025-era request with an id (`initialize` apart) on upstream session `S` (the
//! one it is sent on, after routing; none for a session-less upstream):
//! - its id is not in flight on `S`: forwarded as it came (the common path: one insert and one
//!   removal in a table keyed by `(S, id)`; the bytes are not touched);
//! - it is, from the same client session (the same [`Caller`], with a session of its own): the
//!   client reused an id it has in flight, which MCP forbids: refused with `-32600` "request id
//!   … is already in flight on this session", never forwarded
//!   (`taskgate_local_answers_total{reason="id_in_flight"}`);
//! - it is, from anyone else (another principal or client session, callers taskgate cannot tell
//!   apart, taskgate's own requests), or the id has the form of taskgate's own ids
//!   (`"taskgate-…"`, so taskgate's own request is never refused for a client's choice of id): it
//!   goes upstream under an id taskgate mints (`"taskgate-id-<n>"`, checked free on `S`), and the
//!   message answering it (the JSON answer, or the SSE event that carries it) comes back under the
//!   client's id, its text and type exactly as the client sent them (`0` a number, `"0"` a string);
//! - the client chose it in taskgate's form ([`ClientIdInOwnForm`], set by the edge): it goes
//!   under a minted id in any case, so the upstream never sees a client's id in that form
//!   (unless the table is full, below: then every request passes untracked).
//!
//! A 2025-11-25 session's GET stream: an upstream replays answers there to a client that
//! resumes a stream (`Last-Event-ID`). An answer under a minted id whose request is still known
//! (in flight, or one of the last [`MAX_UNANSWERED`] whose stream ended before the answer) gets
//! the client's id back; every other answer under an id in taskgate's form is dropped (it
//! answers taskgate's own request, or one no longer known).
//!
//! A client's `notifications/cancelled` (2025 era) naming `requestId` `X` on `S`: when `X` is one
//! of the caller's calls in flight there, it goes upstream naming that call's upstream id (the
//! minted one for a mapped call); when `X` is in flight on `S` only for other callers, it is
//! dropped (it would cancel another client's request: `reason="other_caller"`); when the caller
//! has two calls under `X` (callers taskgate cannot tell apart, or a mapped call of its own), it
//! is dropped (`reason="ambiguous"`); an `X` not in flight passes as it came. Each drop is
//! counted in `taskgate_cancelled_notifications_dropped_total` and answered 202.
//!
//! An entry lives until its reply is done (a JSON answer at once, an SSE answer when its stream
//! ends or is dropped). The table holds at most [`MAX_IN_FLIGHT`] entries per upstream; past
//! that a request passes untracked (as before this layer) rather than waiting or failing.
//! Progress tokens (client-chosen as well) are not mapped.

use crate::exchange::{in_own_form, ClientIdInOwnForm};
use crate::exchange::{Caller, GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::{splice, Id, Kind, Message};
use crate::layers::after::{AfterReply, ReplyStep};
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::needles;
use crate::metrics::{DropReason, LocalReason, Metrics};
use bytes::Bytes;
use futures_util::future::{ready, Either, Ready};
use http::HeaderValue;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Most requests tracked in flight per upstream; past it a request passes untracked.
pub const MAX_IN_FLIGHT: usize = 65_536;
/// Most mapped requests per upstream whose reply ended before their answer passed, kept so that
/// the answer can reach a resumed GET stream under the client's id (the oldest forgotten first;
/// an entry is a few hundred bytes at most).
pub const MAX_UNANSWERED: usize = 1_024;

/// A client's request id on one upstream session (`None`: the upstream has no sessions): the
/// key of [`Table::mapped`], the rare path.
#[derive(Clone, PartialEq, Eq)]
struct Key(Option<HeaderValue>, Id);

/// Two writes, the id's text and the session's: the derived hash of the pair made six (the
/// `Option`'s and `HeaderValue`'s parts, each slice's length), ~114 instructions a hash
/// (benches/profile.sh small). Keys that are equal have equal texts, so equal hashes.
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        hash_key(state, self.0.as_ref(), &self.1);
    }
}

fn hash_key<H: std::hash::Hasher>(state: &mut H, session: Option<&HeaderValue>, id: &Id) {
    state.write(id.as_bytes());
    if let Some(session) = session {
        state.write(session.as_bytes());
    }
}

type Hasher = foldhash::fast::RandomState;

/// One request in flight on an upstream session, under its upstream id.
struct Entry {
    /// The hash of `(session, id)`, kept: the table grows without hashing again, and the
    /// request's [`Tracked`] finds its entry by it.
    hash: u64,
    /// This entry among those of its hash: what [`Tracked`] removes, without comparing keys.
    token: u64,
    /// The upstream session.
    session: Option<HeaderValue>,
    /// The upstream id.
    id: Id,
    /// Who sent it.
    caller: Caller,
    /// The client's own id when the request went upstream under a minted one.
    client_id: Option<Id>,
    /// A client chose `client_id` (not one of taskgate's own requests, which carry their
    /// client's context but an id of taskgate's form): its answer may be restored to it on a
    /// GET stream ([`Table::client_of`]).
    restorable: bool,
}

impl Entry {
    fn is(&self, session: Option<&HeaderValue>, id: &Id) -> bool {
        self.id == *id && self.session.as_ref() == session
    }
}

#[derive(Default)]
struct Table {
    /// `(session, upstream id)` → the request, by [`Entry::hash`]: a request is hashed once,
    /// when admitted, and its entry removed by hash and token when its reply is done.
    in_flight: hashbrown::HashTable<Entry>,
    /// Hashes the keys of `in_flight`.
    hasher: Hasher,
    /// The next [`Entry::token`].
    tokens: u64,
    /// `(session, client id)` → the minted ids of that client id's mapped requests, with who
    /// sent each (for `notifications/cancelled`).
    mapped: HashMap<Key, Vec<(Caller, Id)>, Hasher>,
    /// `(session, minted id)` → the client's id and who sent it, for mapped requests whose reply
    /// ended before
    /// their answer passed (the client's stream broke; it may resume it on the session's GET
    /// stream, where the upstream replays the answer under the minted id). At most
    /// [`MAX_UNANSWERED`], the oldest forgotten first.
    unanswered: HashMap<Key, (Id, Caller), Hasher>,
    /// The keys of `unanswered`, oldest first (some already taken).
    unanswered_order: std::collections::VecDeque<Key>,
}

impl Table {
    fn hash(&self, session: Option<&HeaderValue>, id: &Id) -> u64 {
        use std::hash::{BuildHasher, Hasher as _};
        let mut state = self.hasher.build_hasher();
        hash_key(&mut state, session, id);
        state.finish()
    }

    /// Keeps a mapped request's ids after its reply ended without its answer.
    fn keep_unanswered(&mut self, key: Key, client: (Id, Caller)) {
        while self.unanswered_order.len() >= MAX_UNANSWERED {
            if let Some(oldest) = self.unanswered_order.pop_front() {
                self.unanswered.remove(&oldest);
            }
        }
        self.unanswered.insert(key.clone(), client);
        self.unanswered_order.push_back(key);
    }

    /// The client's id of the request `caller` sent under `minted` on `session`: one in flight,
    /// or one whose reply ended without its answer (taken: an answer is restored once). `None`
    /// for another caller's request: callers may share an upstream session (a session-less
    /// upstream's, with authentication every principal's), and an answer goes to its own
    /// caller only.
    fn client_of(
        &mut self,
        session: Option<&HeaderValue>,
        minted: &Id,
        caller: &Caller,
    ) -> Option<Id> {
        // Callers taskgate cannot tell apart (no principal, no session of their own: a
        // session-less upstream without auth) get no answer restored: it may be another's
        // (review 21b #1).
        if !caller.is_identified() {
            return None;
        }
        let hash = self.hash(session, minted);
        if let Some(e) = self.in_flight.find(hash, |e| e.is(session, minted)) {
            let own = e.restorable && e.caller == *caller;
            return e.client_id.clone().filter(|_| own);
        }
        if self.unanswered.is_empty() {
            return None;
        }
        let key = Key(session.cloned(), minted.clone());
        match self.unanswered.get(&key) {
            Some((_, sent_by)) if sent_by == caller => {
                self.unanswered.remove(&key).map(|(client, _)| client)
            }
            _ => None,
        }
    }

    /// Enters a request; the token of its entry.
    fn enter(
        &mut self,
        hash: u64,
        session: Option<HeaderValue>,
        id: Id,
        caller: Caller,
        client_id: Option<Id>,
        restorable: bool,
    ) -> u64 {
        self.tokens += 1;
        let token = self.tokens;
        self.in_flight.insert_unique(
            hash,
            Entry {
                hash,
                token,
                session,
                id,
                caller,
                client_id,
                restorable,
            },
            |e| e.hash,
        );
        token
    }
}

/// The layer's state for one upstream.
pub struct IdsState {
    table: Mutex<Table>,
    next: AtomicU64,
    metrics: Arc<Metrics>,
}

impl IdsState {
    /// An empty table; drops and refusals are counted in `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Arc<IdsState> {
        Arc::new(IdsState {
            table: Mutex::default(),
            next: AtomicU64::new(1),
            metrics,
        })
    }

    /// How many requests are tracked in flight (for tests).
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.table.lock().in_flight.len()
    }

    /// Decides a request (see the module docs).
    /// `own_form`: the client chose `id` in taskgate's own form ([`ClientIdInOwnForm`]), so it
    /// is mapped even when free.
    fn admit(
        self: &Arc<Self>,
        session: Option<&HeaderValue>,
        id: &Id,
        caller: Caller,
        own_form: bool,
    ) -> Admit {
        let mut t = self.table.lock();
        if t.in_flight.len() >= MAX_IN_FLIGHT {
            return Admit::Untracked;
        }
        if !own_form {
            let hash = t.hash(session, id);
            t.tokens += 1;
            let token = t.tokens;
            // One probe for the common case (the id is free: inserted), not a look-up and then
            // an insert.
            match t.in_flight.entry(hash, |e| e.is(session, id), |e| e.hash) {
                hashbrown::hash_table::Entry::Vacant(free) => {
                    free.insert(Entry {
                        hash,
                        token,
                        session: session.cloned(),
                        id: id.clone(),
                        caller,
                        client_id: None,
                        restorable: false,
                    });
                    return Admit::Plain(Tracked {
                        state: self.clone(),
                        hash,
                        token,
                        mapped: None,
                    });
                }
                hashbrown::hash_table::Entry::Occupied(held) => {
                    if held.get().caller == caller
                        && caller.client_session.is_some()
                        && !in_own_form(id)
                    {
                        return Admit::Refuse;
                    }
                }
            }
        }
        let (minted, minted_hash) = loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let minted = Id::from_json(&format!("\"taskgate-id-{n}\"")).expect("a string id");
            let minted_hash = t.hash(session, &minted);
            if t.in_flight
                .find(minted_hash, |e| e.is(session, &minted))
                .is_none()
            {
                break (minted, minted_hash);
            }
        };
        // taskgate's own request (an id of its form the client did not choose) is never
        // restored to a client (review 21b #4: some own ids are fixed, `"taskgate-listen"`).
        let restorable = own_form || !in_own_form(id);
        let token = t.enter(
            minted_hash,
            session.cloned(),
            minted.clone(),
            caller.clone(),
            Some(id.clone()),
            restorable,
        );
        t.mapped
            .entry(Key(session.cloned(), id.clone()))
            .or_default()
            .push((caller, minted.clone()));
        Admit::Mapped(Tracked {
            state: self.clone(),
            hash: minted_hash,
            token,
            mapped: Some(Box::new(Mapped {
                session: session.cloned(),
                minted,
                client: id.clone(),
                answered: false,
            })),
        })
    }

    /// Where a `notifications/cancelled` naming `id` from `caller` on `session` goes.
    fn route_cancel(&self, session: Option<&HeaderValue>, id: &Id, caller: &Caller) -> CancelRoute {
        let t = self.table.lock();
        let mut own: Option<&Id> = None;
        let mut owns = 0;
        let mut others = false;
        if let Some(e) = t.in_flight.find(t.hash(session, id), |e| e.is(session, id)) {
            if e.client_id.is_none() {
                if e.caller == *caller {
                    own = Some(id);
                    owns += 1;
                } else {
                    others = true;
                }
            }
        }
        let key = Key(session.cloned(), id.clone());
        for (c, minted) in t.mapped.get(&key).into_iter().flatten() {
            if c == caller {
                own = Some(minted);
                owns += 1;
            } else {
                others = true;
            }
        }
        match (owns, own) {
            (1, Some(upstream_id)) if upstream_id == id => CancelRoute::AsIs,
            (1, Some(upstream_id)) => CancelRoute::Rewrite(upstream_id.clone()),
            (0, _) if others => CancelRoute::Drop(DropReason::OtherCaller),
            (0, _) => CancelRoute::AsIs,
            _ => CancelRoute::Drop(DropReason::Ambiguous),
        }
    }
}

/// What becomes of a request.
enum Admit {
    /// Forwarded as it is, tracked.
    Plain(Tracked),
    /// Forwarded under a minted id (the guard's key), tracked.
    Mapped(Tracked),
    /// The client reused an id it has in flight on this session.
    Refuse,
    /// The table is full: forwarded untracked.
    Untracked,
}

enum CancelRoute {
    AsIs,
    Rewrite(Id),
    Drop(DropReason),
}

/// A request's entry, removed when dropped (with its reply).
struct Tracked {
    state: Arc<IdsState>,
    /// Its entry's hash and token.
    hash: u64,
    token: u64,
    /// A mapped request's ids.
    mapped: Option<Box<Mapped>>,
}

/// A request sent under a minted id.
struct Mapped {
    /// The upstream session.
    session: Option<HeaderValue>,
    /// The id it went upstream under.
    minted: Id,
    /// The client's id.
    client: Id,
    /// Its answer passed (under the client's id).
    answered: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut t = self.state.table.lock();
        let removed = t
            .in_flight
            .find_entry(self.hash, |e| e.token == self.token)
            .ok()
            .map(|entry| entry.remove().0);
        if let Some(m) = &self.mapped {
            let k = Key(m.session.clone(), m.client.clone());
            if let Some(list) = t.mapped.get_mut(&k) {
                list.retain(|(_, minted)| *minted != m.minted);
                if list.is_empty() {
                    t.mapped.remove(&k);
                }
            }
            if let Some(entry) = removed.filter(|e| !m.answered && e.restorable) {
                // Its own bytes: the session id as it arrived is a slice of the client
                // connection's read buffer (see `Caller::detached`; review 21b #3).
                let session = m.session.as_ref().map(crate::headers::owned);
                let key = Key(session, m.minted.clone());
                t.keep_unanswered(key, (m.client.clone(), entry.caller.detached()));
            }
        }
    }
}

/// The reply step ([`Step`]).
#[doc(hidden)]
pub struct Release(Step);

/// What the reply step does.
enum Step {
    /// A request's: keeps the entry while the reply is relayed and, for a mapped request, gives
    /// the answer the client's id back.
    Request(Tracked),
    /// A 2025-11-25 session's GET stream on this upstream session: answers under ids in
    /// taskgate's form are dropped or given the client's id back ([`listen`]).
    Listen(Arc<IdsState>, Option<HeaderValue>, Caller),
}

impl<E> ReplyStep<E> for Release {
    fn apply(self, reply: McpReply) -> Result<McpReply, E> {
        Ok(match self.0 {
            Step::Request(tracked) => pass(tracked, reply),
            Step::Listen(state, session, caller) => listen(state, session, caller, reply),
        })
    }
}

/// A session's GET stream without the answers under taskgate's ids, but the client's own given
/// its id back. An upstream sends answers there only when a client resumes a stream
/// (`Last-Event-ID`), and it replays every later event of the session (server-everything
/// does), taskgate's own exchanges included: the answers to taskgate's own requests (a
/// gateway-owned task's held call, a lost-task check, `upgrade`'s calls), dropped; and the
/// answer to a client's request this layer sent under a minted id, whose stream broke before
/// the answer: given the client's id back when the GET's caller sent it ([`Table::client_of`];
/// dropped when no longer known, or another caller's).
/// A client's id never goes upstream in taskgate's form ([`ClientIdInOwnForm`]), so no other
/// answer under one is a client's.
fn listen(
    state: Arc<IdsState>,
    session: Option<HeaderValue>,
    caller: Caller,
    mut reply: McpReply,
) -> McpReply {
    if let ReplyBody::Stream(events) = reply.body {
        use futures_util::StreamExt;
        reply.body = ReplyBody::Stream(Box::pin(events.filter_map(move |mut ev| {
            let seen = ev
                .data
                .as_deref()
                .map(|d| state.heard(session.as_ref(), &caller, d));
            std::future::ready(match seen {
                None | Some(Heard::Pass) => Some(ev),
                Some(Heard::Drop) => None,
                Some(Heard::Restored(text)) => {
                    ev.data = Some(text.into());
                    Some(ev)
                }
            })
        })));
    }
    reply
}

/// What becomes of a message on a session's GET stream ([`listen`]).
enum Heard {
    Pass,
    Drop,
    /// The answer under the client's own id.
    Restored(String),
}

impl IdsState {
    /// What becomes of `data`, a message on `session`'s GET stream (see [`listen`]). Messages
    /// that cannot name `"taskgate-` are not parsed.
    fn heard(&self, session: Option<&HeaderValue>, caller: &Caller, data: &str) -> Heard {
        if !needles::may_name(&needles::OWN_ID, data.as_bytes()) {
            return Heard::Pass;
        }
        let Ok(msg) = Message::parse(Bytes::copy_from_slice(data.as_bytes())) else {
            return Heard::Pass;
        };
        let own =
            matches!(msg.kind(), Kind::Response | Kind::Error) && msg.id().is_some_and(in_own_form);
        let Some(id) = msg.id().filter(|_| own) else {
            return Heard::Pass;
        };
        let client = self.table.lock().client_of(session, id, caller);
        // The message is parsed already: its id is only replaced.
        match client.and_then(|client| with_client_id(data, &client)) {
            Some(text) => Heard::Restored(text),
            None => Heard::Drop,
        }
    }
}

/// A request's reply as it goes on (see [`Step::Request`]).
fn pass(mut tracked: Tracked, mut reply: McpReply) -> McpReply {
    let restore = tracked
        .mapped
        .as_ref()
        .map(|m| (m.minted.clone(), m.client.clone()));
    if restore.is_none() && !matches!(reply.body, ReplyBody::Stream(_)) {
        // A JSON answer is whole: the request is no longer in flight.
        return reply;
    }
    reply.body = reply.body.map_messages(move |text| {
        // The entry lives as long as the stream is relayed.
        let (minted, client) = restore.as_ref()?;
        let answer = client_answer(text, minted, client);
        if let (Some(_), Some(m)) = (&answer, tracked.mapped.as_mut()) {
            m.answered = true;
        }
        answer
    });
    reply
}

/// `text` with its id set back to `client` when it is the answer (result or error) to `minted`.
fn client_answer(text: &str, minted: &Id, client: &Id) -> Option<String> {
    if !text.contains(minted.as_json().trim_matches('"')) {
        return None;
    }
    let msg = Message::parse(Bytes::copy_from_slice(text.as_bytes())).ok()?;
    if msg.id() != Some(minted) || !matches!(msg.kind(), Kind::Response | Kind::Error) {
        return None;
    }
    with_client_id(text, client)
}

/// `text`, an answer, with its id replaced by `client`.
fn with_client_id(text: &str, client: &Id) -> Option<String> {
    let out = splice::replace(text.as_bytes(), &["id"], client.as_json()).ok()??;
    String::from_utf8(out.to_vec()).ok()
}

/// `req` with its JSON-RPC id replaced by `id`.
fn with_id(mut req: McpRequest, id: &Id) -> McpRequest {
    if let Operation::Post(msg) = &req.op {
        if let Ok(Some(bytes)) = splice::replace(msg.bytes(), &["id"], id.as_json()) {
            if let Ok(m) = Message::parse(bytes) {
                req.op = Operation::Post(m);
            }
        }
    }
    req
}

/// Builds [`IdsService`]s over one upstream's [`IdsState`].
#[derive(Clone)]
pub struct IdsLayer {
    state: Arc<IdsState>,
}

impl IdsLayer {
    /// A layer for one upstream (its own table).
    pub fn new(metrics: Arc<Metrics>) -> IdsLayer {
        IdsLayer {
            state: IdsState::new(metrics),
        }
    }
}

impl<S> tower::Layer<S> for IdsLayer {
    type Service = IdsService<S>;
    fn layer(&self, inner: S) -> IdsService<S> {
        IdsService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The `ids` layer's service (see the module docs).
#[derive(Clone)]
pub struct IdsService<S> {
    inner: S,
    state: Arc<IdsState>,
}

/// The future of a request: the inner one (tracked or not), or taskgate's own answer.
type IdsFuture<F> =
    Either<Either<F, AfterReply<F, Release>>, Ready<Result<McpReply, GatewayError>>>;

impl<S> tower::Service<McpRequest> for IdsService<S>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>,
{
    type Response = McpReply;
    type Error = GatewayError;
    type Future = IdsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: McpRequest) -> Self::Future {
        let Operation::Post(msg) = &req.op else {
            if matches!(req.op, Operation::OpenStream) && req.era() == Era::Legacy {
                let session = req.ctx.session_id.clone();
                let step = Step::Listen(self.state.clone(), session, req.ctx.caller().detached());
                return Either::Left(Either::Right(AfterReply::new(
                    self.inner.call(req),
                    Release(step),
                )));
            }
            return Either::Left(Either::Left(self.inner.call(req)));
        };
        let kind = msg.kind();
        let is_cancel =
            kind == Kind::Notification && msg.method() == Some("notifications/cancelled");
        if !(kind == Kind::Request || is_cancel)
            || msg.method() == Some("initialize")
            || req.era() == Era::Modern
        {
            return Either::Left(Either::Left(self.inner.call(req)));
        }
        if is_cancel {
            return self.cancel(req);
        }
        let id = msg.id().expect("a request has an id").clone();
        // The prefix first: the extension map is read only for an id in taskgate's form.
        let own_form = in_own_form(&id)
            && req
                .extensions
                .get::<ClientIdInOwnForm>()
                .is_some_and(|m| m.0 == id);
        match self
            .state
            .admit(req.ctx.session_id.as_ref(), &id, req.ctx.caller(), own_form)
        {
            Admit::Untracked => Either::Left(Either::Left(self.inner.call(req))),
            Admit::Plain(tracked) => {
                let fut = self.inner.call(req);
                Either::Left(Either::Right(AfterReply::new(
                    fut,
                    Release(Step::Request(tracked)),
                )))
            }
            Admit::Mapped(tracked) => {
                let minted = &tracked.mapped.as_ref().expect("a mapped request").minted;
                tracing::debug!(upstream = %req.ctx.upstream, id = %id, upstream_id = %minted, "request id in flight on the upstream session for another caller: sent under a minted id");
                let req = with_id(req, minted);
                let fut = self.inner.call(req);
                Either::Left(Either::Right(AfterReply::new(
                    fut,
                    Release(Step::Request(tracked)),
                )))
            }
            Admit::Refuse => {
                tracing::debug!(upstream = %req.ctx.upstream, id = %id, "request id already in flight on this session: refused");
                let error = McpError::IdInFlight { id: id.to_string() };
                // Sessions (and so this refusal) are the 2025-11-25 transport's: HTTP 200.
                let reply = McpReply::error(Era::Legacy, Some(&id), &error)
                    .answered_locally(LocalReason::IdInFlight);
                Either::Right(ready(Ok(reply)))
            }
        }
    }
}

impl<S> IdsService<S>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>,
{
    /// A client's `notifications/cancelled` (see the module docs).
    fn cancel(&mut self, req: McpRequest) -> IdsFuture<S::Future> {
        let target = req.classified().and_then(|c| c.request_id());
        let Some(target) = target else {
            return Either::Left(Either::Left(self.inner.call(req)));
        };
        let route =
            self.state
                .route_cancel(req.ctx.session_id.as_ref(), &target, &req.ctx.caller());
        match route {
            CancelRoute::AsIs => Either::Left(Either::Left(self.inner.call(req))),
            CancelRoute::Rewrite(upstream_id) => {
                let mut req = req;
                if let Operation::Post(msg) = &req.op {
                    if let Ok(Some(bytes)) = splice::replace(
                        msg.bytes(),
                        &["params", "requestId"],
                        upstream_id.as_json(),
                    ) {
                        if let Ok(m) = Message::parse(bytes) {
                            req.op = Operation::Post(m);
                        }
                    }
                }
                Either::Left(Either::Left(self.inner.call(req)))
            }
            CancelRoute::Drop(reason) => {
                tracing::debug!(upstream = %req.ctx.upstream, request_id = %target, reason = reason.as_str(), "notifications/cancelled not forwarded");
                self.state
                    .metrics
                    .cancelled_notification_dropped(&req.ctx.upstream, reason);
                Either::Right(ready(Ok(McpReply::accepted())))
            }
        }
    }
}

#[cfg(test)]
mod tests;

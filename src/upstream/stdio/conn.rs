//! One running child as a JSON-RPC peer: the writer (two queues: `tasks/cancel` overtakes; a
//! request whose caller was answered while its line waited is skipped, [`Claim`]), the reader
//! (each stdout line routed by [`super::route::Routes`]), and the keeper that owns the process
//! and ends it.
//!
//! What the child sends goes to whom it names:
//! - an answer (`result`/`error`) → the request taskgate wrote under that id, its id put back
//!   to the caller's;
//! - `notifications/progress` → the request (or, after the answer, the session) whose token it
//!   names, with the caller's token put back;
//! - `notifications/tasks/status` (`notifications/tasks`) → the session whose request created the
//!   task (its GET stream; none open, or full: to the registry instead, which applies it as
//!   `observe` would, [`Streams::unseen_status`]); not known → dropped (another client's task id
//!   is never shown, nor its record moved); a terminal status
//!   there or in an answer (`tasks/get`, `tasks/cancel`) marks the task's route ended, the
//!   first a full table forgets ([`super::route`]);
//! - `notifications/cancelled` (the child gives up a request it sent) → the session it sent it
//!   to;
//! - a notification of a 2026-07-28 `subscriptions/listen` (its
//!   `_meta["io.modelcontextprotocol/subscriptionId"]` the id the child saw for the listen) →
//!   that listen's reply stream while it is open, the caller's id put back; else dropped;
//! - other notifications (`list_changed`, logging) → every session's GET stream (a `per_session`
//!   child's: its own session's only, [`Owner`]);
//! - a request (`sampling/createMessage`, `elicitation/create`, `roots/list`) → only a client
//!   that declared the capability it needs in its `initialize` (`sampling`, `elicitation`,
//!   `roots`; a 2026-07-28 request's own `_meta` client capabilities): one that did not is
//!   never sent it, the child gets `-32601` at once (as gateway tasks answer it). Whose it is:
//!   the session of the task its `_meta["io.modelcontextprotocol/related-task"]` names, else
//!   the one request in flight whose client declared the capability, requests the child was
//!   told are cancelled left out ([`Routes::asked_of`]; a gateway task's held call is one
//!   like any other, so its task goes `input_required`). When the one request in flight is an
//!   `initialize`, a client's or taskgate's own, or taskgate's era probe, it is answered
//!   `-32603` at once: no client has a session to answer it on yet, and MCP lifecycle says a
//!   server SHOULD NOT send it; the `initialize` goes on. Requests in flight whose clients
//!   declared nothing it needs: `-32601`. None in flight, or several that could answer: a
//!   `per_session` child's own session's GET stream, else (a shared child) `-32603`, taskgate
//!   cannot tell which client it is for (the limit of a shared process: `process =
//!   "per_session"` is the way for tools that ask the client for input while other clients'
//!   calls run); `ping` is answered by taskgate.
//!   Every request refused is answered: taskgate's answers go ahead of queued requests, and
//!   when that queue is full the child's stdout is not read further until there is room (a
//!   child that floods requests is read at the pace it reads its answers; a deaf one, its
//!   pipe taking nothing for `timeout_ms` while taskgate reads nothing from its stdout, is
//!   found so by the writer and ended).
//!
//! A line that is not one JSON-RPC message is counted (`taskgate_upstream_errors_total
//! {kind="protocol"}`), logged at warn (at most one line a second), never forwarded; a line
//! over `max_message_bytes` likewise (and `taskgate_upstream_oversize_total`), and the request
//! it answers, when its id is in the line's first bytes, ends with a JSON-RPC error naming the
//! bound.

use super::framing::{one_line, Counting, Line, Lines};
use super::queue::{queue, QueueRx, QueueTx};
use super::route::{Answer, Candidates, Claim, Pending, Progress, Routes, SessionKey, TaskNote};
use crate::jsonrpc::{self, splice, Id, Kind, Message};
use crate::mcp::capabilities::ClientCapabilities;
use crate::mcp::task::TaskStatus;
use crate::metrics::{Metrics, OversizeKind, UpstreamErrorKind};
use crate::sse;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot};

/// Messages related to one request that may wait for its client (past it they are dropped).
pub const RELATED_QUEUE: usize = 64;
/// Bytes of the messages related to one request that may wait for its client, at most (past it
/// they are dropped as past [`RELATED_QUEUE`]; one larger message goes to an empty queue, alone:
/// [`super::queue::QueueTx`]).
pub const RELATED_QUEUE_BYTES: usize = 4 << 20;
/// Messages for one GET stream that may wait for its client (past it they are dropped).
pub const STREAM_QUEUE: usize = 64;
/// Bytes of the messages that may wait for one GET stream's client, at most: past it they are
/// dropped as past [`STREAM_QUEUE`] (a notification is lost, a request of the child's is
/// answered `-32603`). A message larger than this still goes to an empty queue, alone: one
/// slow client holds at most this much, or one message (`max_message_bytes`), not
/// [`STREAM_QUEUE`] of them (up to a gigabyte at the default 16 MiB).
pub const STREAM_QUEUE_BYTES: usize = 4 << 20;
/// Lines that may wait for the child's stdin (past it a writer waits for room).
const WRITE_QUEUE: usize = 256;
/// Bytes of requests that may wait for the child's stdin (past it a writer waits for room; a
/// line larger than this waits for an empty queue, alone). Why: lines were bounded only in
/// count, so a child that stopped reading pinned up to 256 requests of `max_message_bytes`
/// (16 MiB by default): 416 MB measured with 60 callers of 3 MiB (tester 3 F20). A caller
/// waiting for room holds only its own request, and lets it go at its deadline.
pub const WRITE_QUEUE_BYTES: usize = 64 << 20;
/// How long a `notifications/cancelled` taskgate sends on its own (a request given up or
/// abandoned) waits for room in a full queue before it is dropped: the child is not reading.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How a child's end begins when its command could not be started (exec failed, the shim's
/// word for it: [`super::shim::START_FAILED`]), followed by `: <program>: <reason>`.
pub const NOT_STARTED: &str = "its command could not be started";
/// How long the keeper of a child that exited 127 or 126 waits for the shim's stderr line
/// saying why (the pipe ends with the shim).
const NOT_STARTED_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// The key of the `_meta` member naming a server→client request's task (2025-11-25 tasks).
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// The client capability (a JSON pointer into `initialize` `capabilities`) a request of the
/// child's needs its client to have declared (MCP 2025-11-25 client features); `None` for
/// any other method.
fn capability_for(method: &str) -> Option<&'static str> {
    match method {
        "sampling/createMessage" => Some("/sampling"),
        "elicitation/create" => Some("/elicitation"),
        "roots/list" => Some("/roots"),
        _ => None,
    }
}

/// The key of the `_meta` member naming the `subscriptions/listen` a notification belongs to
/// (2026-07-28: the listen request's id).
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The GET streams of an upstream's sessions (they outlive a restarted child), and where a
/// task status notification goes that none of them could take ([`Streams::unseen_status`]).
#[derive(Default)]
pub struct Streams(
    Mutex<HashMap<Arc<str>, QueueTx<sse::Event>>>,
    std::sync::OnceLock<mpsc::Sender<Bytes>>,
);

/// Task status notifications no GET stream took, waiting for the registry (`gateway`
/// observes them); past it they are dropped (the next `tasks/get` still learns the status).
pub const UNSEEN_STATUS_QUEUE: usize = 1024;

/// The client's end of a GET stream ([`Streams::open`]).
pub type StreamRx = QueueRx<sse::Event>;

impl Streams {
    /// Where [`Streams::unseen_status`] sends; the receiver is the registry's (once: later
    /// calls return `None`).
    pub fn unseen_statuses(&self) -> Option<mpsc::Receiver<Bytes>> {
        let (tx, rx) = mpsc::channel(UNSEEN_STATUS_QUEUE);
        self.1.set(tx).ok().map(|()| rx)
    }

    /// A task status notification of the child's (`notifications/tasks/status`,
    /// `notifications/tasks`) for a task of a session whose GET stream could not take it (none
    /// open, or full): handed to the registry, so the record ends though no client saw it
    /// (tester 3 F17: a client that never polls and holds no GET stream left its finished tasks
    /// `working`, holding its live-task slots). Dropped when nobody takes them or the queue is
    /// full.
    pub fn unseen_status(&self, msg: &Bytes) {
        if let Some(tx) = self.1.get() {
            let _ = tx.try_send(msg.clone());
        }
    }

    /// Opens `session`'s GET stream (a second one replaces the first, which ends).
    pub fn open(&self, session: Arc<str>) -> StreamRx {
        let (tx, rx) = queue(STREAM_QUEUE, STREAM_QUEUE_BYTES);
        self.0.lock().insert(session, tx);
        rx
    }

    /// Ends `session`'s GET stream.
    pub fn close(&self, session: &str) {
        self.0.lock().remove(session);
    }

    /// Sends `msg` on `session`'s GET stream; false when it has none or it is full (in messages
    /// or in bytes: the message is dropped, the caller says what that means).
    pub fn send(&self, session: &str, msg: &Bytes) -> bool {
        let mut map = self.0.lock();
        let Some(tx) = map.get(session) else {
            return false;
        };
        match tx.try_send(event(msg)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => false,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                map.remove(session);
                false
            }
        }
    }

    /// Sends `msg` on every open GET stream; returns on how many. Every stream's event shares
    /// the message's bytes (a child's 10 MB notification is held once, not once per session).
    pub fn broadcast(&self, msg: &Bytes) -> usize {
        let ev = event(msg);
        let mut map = self.0.lock();
        map.retain(|_, tx| !tx.is_closed());
        map.values()
            .filter(|tx| tx.try_send(ev.clone()).is_ok())
            .count()
    }
}

/// One JSON-RPC message as an SSE event, over the message's own bytes (a line of the child's
/// stdout is UTF-8 already; anything else is copied, its invalid bytes replaced).
pub fn event(msg: &Bytes) -> sse::Event {
    let data = sse::ByteString::try_from(msg.clone())
        .unwrap_or_else(|_| String::from_utf8_lossy(msg).into_owned().into());
    sse::Event {
        data: Some(data),
        ..Default::default()
    }
}

/// A running child's JSON-RPC side.
pub struct Conn {
    name: Arc<str>,
    normal: mpsc::Sender<Outgoing>,
    urgent: mpsc::Sender<Outgoing>,
    routes: Mutex<Routes>,
    streams: Arc<Streams>,
    metrics: Arc<Metrics>,
    closed: AtomicBool,
    /// Why it closed, for requests that come after.
    ///
    /// Lock order (issue 31): `routes` before `why`. `register` holds `routes` while it reads
    /// `why`; nothing takes `routes` while holding `why` (`close` lets go of `why` first).
    why: Mutex<Option<String>>,
    /// When the last line-noise warning was logged (one a second at most).
    noise_logged: Mutex<Option<std::time::Instant>>,
    /// Whose GET streams get the child's notifications for every stream (see [`Owner`]).
    owner: Mutex<Owner>,
    /// The gateway tasks whose held calls were in flight when the child went ([`Conn::close`]):
    /// they died with it. At most the requests in flight then; taken by the death's announcer.
    dead_held: Mutex<Vec<String>>,
    /// Bytes the writer has put into the child's stdin so far (its progress).
    written: Arc<AtomicU64>,
    /// Bytes read from the child's stdout so far (it still speaks: not deaf, [`write_lines`]).
    heard: Arc<AtomicU64>,
    /// Wakes the keeper to end a child found deaf ([`Conn::deafened`]).
    deaf: Arc<tokio::sync::Notify>,
    /// Whether it was found deaf (the first finding ends it; later ones change nothing).
    found_deaf: AtomicBool,
    /// Room in the stdin queue, in bytes ([`WRITE_QUEUE_BYTES`]): a queued request holds its
    /// line's weight until the writer has written or skipped it.
    room: Arc<tokio::sync::Semaphore>,
}

/// A line for the child's stdin, with what decides, when the writer takes it, whether it is
/// still written.
pub struct Outgoing {
    line: Bytes,
    guard: Guard,
    /// Its weight in the stdin queue's room ([`Conn::room`]), given back when it is dropped
    /// (written or skipped); `None` for a line that is not counted (taskgate's own).
    _room: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Outgoing {
    /// A line written whatever happens (a notification, taskgate's answer to the child).
    fn always(line: Bytes) -> Outgoing {
        Outgoing {
            line,
            guard: Guard::Always,
            _room: None,
        }
    }
}

/// Whether a queued line is still for the child (tester 3 F3: a request whose caller was told
/// it failed ran at the child once it read again).
enum Guard {
    /// Always written.
    Always,
    /// A request: written only when the writer takes its [`Claim`] first (its caller still
    /// waits); skipped when its caller gave it up or went away while it was queued.
    Request(Arc<Claim>),
    /// A caller's `notifications/cancelled` for a request queued before it: written only when
    /// that request was not withdrawn (the child would read an id it never saw).
    CancelOf(Arc<Claim>),
}

/// Whose GET streams a child's notification for every stream (`notifications/message`, a list
/// change, ...) goes to.
#[derive(Debug, Clone)]
pub enum Owner {
    /// A shared child's: every session's.
    Every,
    /// A `per_session` child's whose session is not made yet: nobody's (no stream is open).
    NotYet,
    /// A `per_session` child's: its own session's only, with what its client declared.
    Session(Arc<str>, ClientCapabilities),
}

/// A started child: its connection, its end (a reason), and the switch that ends it.
pub struct Running {
    /// The JSON-RPC side.
    pub conn: Arc<Conn>,
    /// Resolves with why the child ended (it exited, or was ended).
    pub exited: oneshot::Receiver<String>,
    /// Ends the child (close stdin, `SIGTERM`, `SIGKILL`: see `child::end`).
    pub stop: oneshot::Sender<()>,
    /// The child's process id (its process group's id).
    pub pid: Option<u32>,
    /// The keeper task: done once the child is gone and reaped.
    pub keeper: tokio::task::JoinHandle<()>,
}

impl Conn {
    /// Starts `child`'s reader, writer and stderr logger and its keeper (which owns the process:
    /// it ends it on `stop`, or sees it exit, then fails every request still waiting).
    pub fn start(
        name: Arc<str>,
        mut child: Child,
        max_message_bytes: usize,
        streams: Arc<Streams>,
        metrics: Arc<Metrics>,
        owner: Owner,
        timeout: std::time::Duration,
    ) -> Running {
        let (normal, normal_rx) = mpsc::channel(WRITE_QUEUE);
        let (urgent, urgent_rx) = mpsc::channel(WRITE_QUEUE);
        let conn = Arc::new(Conn {
            name: name.clone(),
            normal,
            urgent,
            routes: Mutex::new(Routes::default()),
            streams,
            metrics,
            closed: AtomicBool::new(false),
            why: Mutex::new(None),
            noise_logged: Mutex::new(None),
            owner: Mutex::new(owner),
            dead_held: Mutex::new(Vec::new()),
            written: Arc::new(AtomicU64::new(0)),
            heard: Arc::new(AtomicU64::new(0)),
            room: Arc::new(tokio::sync::Semaphore::new(WRITE_QUEUE_BYTES)),
            deaf: Arc::new(tokio::sync::Notify::new()),
            found_deaf: AtomicBool::new(false),
        });
        let pid = child.id();
        let (close_stdin, close_rx) = oneshot::channel::<()>();
        // Issue 31: a child that closed its stdout or its stdin is a dead peer even if it runs
        // on; the keeper ends it (as `stop` does) so that supervision starts another.
        let pipe_closed = Arc::new(tokio::sync::Notify::new());
        if let Some(stdin) = child.stdin.take() {
            let pipe_closed = pipe_closed.clone();
            let watch = Liveness {
                name: name.clone(),
                written: conn.written.clone(),
                heard: conn.heard.clone(),
                conn: Arc::downgrade(&conn),
                timeout,
            };
            tokio::spawn(async move {
                if write_lines(stdin, normal_rx, urgent_rx, close_rx, watch).await {
                    pipe_closed.notify_one();
                }
            });
        }
        if let Some(stdout) = child.stdout.take() {
            let conn = conn.clone();
            let pipe_closed = pipe_closed.clone();
            tokio::spawn(async move {
                let stdout = Counting::new(stdout, conn.heard.clone());
                let mut lines = Lines::new(stdout, max_message_bytes);
                while let Ok(Some(line)) = lines.next().await {
                    // An answer of taskgate's own is written before the next line is read: a
                    // child that sends requests faster than it reads its stdin is read at the
                    // pace it reads (none is left unanswered, nothing piles up here).
                    if let Some(reply) = conn.on_line(line, max_message_bytes) {
                        conn.reply(reply).await;
                    }
                }
                // Usually the process is exiting: give the keeper the moment it needs to say
                // how (the first reason given is the one requests get).
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                conn.close("its child process closed its stdout");
                pipe_closed.notify_one();
            });
        }
        // The shim's word that the command could not be started (exec failed).
        let not_started = Arc::new(std::sync::OnceLock::new());
        let stderr_logger = child.stderr.take().map(|stderr| {
            tokio::spawn(super::child::log_stderr(
                name.clone(),
                stderr,
                not_started.clone(),
            ))
        });
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (exited_tx, exited) = oneshot::channel();
        let keeper_conn = conn.clone();
        let deaf = conn.deaf.clone();
        let keeper = tokio::spawn(async move {
            let mut group = super::child::GroupGuard::new(pid);
            let why = tokio::select! {
                // An exit seen first is told as one, whatever else is ready.
                biased;
                status = child.wait() => {
                    group.disarm();
                    // 127 or 126 from the shim: its stderr line says why (review L4); it ends
                    // with the pipe, which only the shim held.
                    let code = status.as_ref().ok().and_then(|s| s.code());
                    let mut why = format!("its child process exited ({})", super::child::describe(status));
                    if let (Some(126 | 127), Some(logger)) = (code, stderr_logger) {
                        let _ = tokio::time::timeout(NOT_STARTED_WAIT, logger).await;
                        if let Some(reason) = not_started.get() {
                            why = format!("{NOT_STARTED}: {reason}");
                        }
                    }
                    // What it left in its group goes with it.
                    if let Some(pid) = pid {
                        super::child::signal_group(pid, libc::SIGKILL);
                    }
                    tracing::warn!(target: "taskgate::upstream::stdio", upstream = %name, "child {why}");
                    why
                }
                _ = stop_rx => {
                    let _ = close_stdin.send(());
                    let how = super::child::end(&name, &mut child).await;
                    format!("its child process was ended ({how})")
                }
                () = pipe_closed.notified() => {
                    let _ = close_stdin.send(());
                    let how = super::child::end(&name, &mut child).await;
                    tracing::warn!(target: "taskgate::upstream::stdio", upstream = %name, "child closed its stdout or stdin: ended ({how})");
                    format!("its child process closed its stdout or stdin and was ended ({how})")
                }
                // A liveness rule: a child that stopped reading its stdin is a dead peer too.
                () = deaf.notified() => {
                    let _ = close_stdin.send(());
                    let how = super::child::end_deaf(&name, &mut child).await;
                    tracing::warn!(target: "taskgate::upstream::stdio", upstream = %name, "child stopped reading its stdin: ended ({how})");
                    format!("its child process stopped reading its stdin and was ended ({how})")
                }
            };
            group.disarm();
            keeper_conn.close(&why);
            let _ = exited_tx.send(why);
        });
        Running {
            conn,
            exited,
            stop,
            pid,
            keeper,
        }
    }

    /// The tasks the child created (noted from its answers), taken: the child is gone.
    pub fn take_tasks(&self) -> Vec<(String, TaskNote)> {
        self.routes.lock().drain_tasks()
    }

    /// The gateway tasks whose held calls were in flight when the child went, taken.
    pub fn take_held(&self) -> Vec<String> {
        std::mem::take(&mut *self.dead_held.lock())
    }

    /// A `per_session` child's session is made: its notifications for every stream go to that
    /// session's GET stream (and no other session's).
    pub fn owned_by(&self, session: Arc<str>, declared: ClientCapabilities) {
        *self.owner.lock() = Owner::Session(session, declared);
    }

    /// Bytes written to the child's stdin so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// The child is deaf: a line waited `timeout_ms` for its stdin pipe to take one more byte,
    /// and its stdout said nothing meanwhile (the writer's liveness rule, `write_lines`). The keeper ends it (close stdin and `SIGTERM` at once:
    /// `child::end_deaf`; `SIGKILL`): its requests in flight get the reason, and supervision
    /// restarts it (or ends its `per_session` session) as after a crash.
    /// Returns whether this was the first finding.
    pub fn deafened(&self) -> bool {
        let first = !self.found_deaf.swap(true, Ordering::AcqRel);
        if first {
            self.deaf.notify_one();
        }
        first
    }

    /// Requests waiting for the child's answer now.
    pub fn in_flight(&self) -> usize {
        self.routes.lock().in_flight()
    }

    /// Whether a task the child created is still live: not reported ended by the child, and
    /// within its ttl ([`Routes::has_live_task`]).
    pub fn has_live_task(&self) -> bool {
        self.routes.lock().has_live_task(std::time::Instant::now())
    }

    /// Whether the child is gone (no request can be written).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Why the child is gone, if it is.
    pub fn why_closed(&self) -> Option<String> {
        self.why.lock().clone()
    }

    /// The child is gone: every request waiting gets `why` (the first reason stays).
    ///
    /// `why` is let go of before `routes` is taken (the lock order: `routes`, then `why`). No
    /// request is left behind: `closed` is set before the drain, and `register` checks it
    /// under `routes`, so an entry is either drained here or never inserted.
    pub fn close(&self, why: &str) {
        {
            let mut w = self.why.lock();
            if w.is_none() {
                *w = Some(why.to_string());
            }
            self.closed.store(true, Ordering::Release);
        }
        let waiting = self.routes.lock().drain();
        let held: Vec<String> = waiting
            .iter()
            .filter_map(|p| p.held_task.as_deref().map(str::to_string))
            .collect();
        if !held.is_empty() {
            self.dead_held.lock().extend(held);
        }
        for p in waiting {
            let _ = p.answer.send(Err(why.to_string()));
        }
    }

    /// Writes one message (a line) to the child; `urgent` ones overtake the queue.
    /// Errors: the child is gone.
    pub async fn write(&self, msg: &[u8], urgent: bool) -> Result<(), String> {
        self.send(Outgoing::always(one_line(msg)), urgent).await
    }

    /// Writes registered request `reg` (its line) to the child, as [`Conn::write`]; the writer
    /// skips it when its caller gave it up or went away while it waited in the queue
    /// ([`Claim`]). Errors: the child is gone.
    pub async fn write_request(&self, reg: &Registered, urgent: bool) -> Result<(), String> {
        let line = one_line(&reg.bytes);
        // Room for its bytes first (a line larger than the room waits for all of it). Not for
        // an urgent one (`tasks/cancel`: small, bounded by its queue's lines): the room is
        // fair, so it would wait behind a large request waiting for room, and an urgent line
        // must overtake (review).
        let room = if urgent {
            None
        } else {
            let weight = line.len().min(WRITE_QUEUE_BYTES) as u32;
            match self.room.clone().acquire_many_owned(weight).await {
                Ok(permit) => Some(permit),
                Err(_) => return Err(self.gone()),
            }
        };
        let out = Outgoing {
            line,
            guard: Guard::Request(reg.claim.clone()),
            _room: room,
        };
        self.send(out, urgent).await
    }

    async fn send(&self, out: Outgoing, urgent: bool) -> Result<(), String> {
        if self.is_closed() {
            return Err(self.gone());
        }
        let sent = if urgent {
            self.urgent.send(out).await
        } else {
            self.normal.send(out).await
        };
        sent.map_err(|_| self.gone())
    }

    fn gone(&self) -> String {
        self.why_closed()
            .unwrap_or_else(|| "its child process is gone".into())
    }

    /// Registers a request of `session` and returns the id the child will see, with the
    /// message as written (its id, and a `progressToken`, replaced by that number).
    /// Errors: the message is not valid JSON (the edge let it through as one message, so
    /// this does not happen), or the child is gone.
    pub fn register(
        self: &Arc<Self>,
        msg: &Message,
        session: SessionKey,
        declared: ClientCapabilities,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        task_call: bool,
        held_task: Option<Arc<str>>,
    ) -> Result<Registered, String> {
        let client_id = msg.id().cloned().ok_or("a request without an id")?;
        let own = session.as_deref() == Some(super::OWN_SESSION);
        let initialize = msg.method() == Some("initialize");
        let (answer_tx, answer) = oneshot::channel();
        let (related_tx, related) = queue(RELATED_QUEUE, RELATED_QUEUE_BYTES);
        let claim = Arc::new(Claim::default());
        let mut routes = self.routes.lock();
        if self.is_closed() {
            return Err(self.gone());
        }
        let out = routes.insert(Pending {
            client_id,
            session: session.clone(),
            answer: answer_tx,
            related: related_tx,
            task_call,
            permit,
            told: false,
            queued: false,
            held_cancel: None,
            before_session: initialize || own,
            held_task,
            claim: claim.clone(),
            declared,
        });
        let rewritten = rewrite_request(msg.bytes(), out);
        match rewritten {
            Ok((bytes, token)) => {
                if let Some(original) = token {
                    routes.note_progress(out, Progress { session, original });
                }
                Ok(Registered {
                    out,
                    bytes,
                    answer,
                    related,
                    claim,
                    conn: Arc::downgrade(self),
                    // `initialize` must not be cancelled (MCP basic/utilities/cancellation);
                    // an abandoned one's child is ended by its starter. Nor is taskgate's
                    // `server/discover` probe: before `initialize` a legacy child is sent
                    // nothing else (rmcp's stdio server stops on a notification there).
                    tell_on_drop: !initialize && !own,
                })
            }
            Err(e) => {
                routes.take(out);
                Err(format!("the request is not valid JSON: {e}"))
            }
        }
    }

    /// Gives up request `out` (its deadline passed): its slot is freed and the child is told
    /// (`notifications/cancelled`), so it may stop the work; when its line still waits in the
    /// stdin queue, it is withdrawn instead (never written, so nothing to tell: [`Claim`]).
    pub fn give_up(&self, out: u64, reason: &str) {
        let told = self
            .routes
            .lock()
            .take(out)
            .is_none_or(|p| p.claim.withdraw() || p.told);
        if told || self.is_closed() {
            return;
        }
        self.tell_cancelled(out, reason);
    }

    /// Request `out`'s line is in the stdin queue: a cancellation its caller sent while it
    /// waited for room is written now, after it.
    pub fn queued(&self, out: u64) {
        let held = self.routes.lock().get_mut(out).and_then(|p| {
            p.queued = true;
            p.held_cancel.take().map(|note| (note, p.claim.clone()))
        });
        if let Some((note, claim)) = held {
            self.send_cancelled(&note, Guard::CancelOf(claim));
        }
    }

    /// The caller's `notifications/cancelled` for request `out` (told already, see
    /// [`Conn::tell_cancelled_id`]): written after the request when it is queued, else held
    /// until it is ([`Conn::queued`]; dropped with it when it never is).
    pub fn cancel_from_client(&self, out: u64, note: Bytes) {
        let claim = {
            let mut routes = self.routes.lock();
            match routes.get_mut(out) {
                Some(p) if !p.queued => {
                    p.held_cancel = Some(note);
                    return;
                }
                Some(p) => Some(p.claim.clone()),
                None => None,
            }
        };
        // After a request still queued: skipped with it when it is withdrawn.
        let guard = claim.map_or(Guard::Always, Guard::CancelOf);
        self.send_cancelled(&note, guard);
    }

    /// Request `out` was never written (the child never saw it): its route (and slot) goes,
    /// and the child is not told anything.
    pub fn forget(&self, out: u64) {
        self.routes.lock().take(out);
    }

    /// Request `out` was abandoned (its caller went away: hyper dropped the exchange): its
    /// route (and slot) goes, and, when `tell` and its line was written (or is being
    /// written: [`Claim`]), the child is told (`notifications/cancelled`) as a client's own
    /// cancel would. Nothing when it was answered or given up already, nor when it was never
    /// written (its caller went away while it waited for room, or while its line waited in
    /// the stdin queue, which then skips it: the child never sees it).
    fn abandon(&self, out: u64, tell: bool) {
        let told = self
            .routes
            .lock()
            .take(out)
            .is_none_or(|p| p.claim.withdraw() || p.told || !p.queued);
        if told || !tell || self.is_closed() {
            return;
        }
        self.tell_cancelled(out, "taskgate: the client went away");
    }

    /// Writes `notifications/cancelled` for request `out` (after it: see [`Conn::send_cancelled`]),
    /// without waiting: a child that stopped reading its stdin must not hold up the caller that gives
    /// its request up (its deadline already passed, or it is a drop).
    fn tell_cancelled(&self, out: u64, reason: &str) {
        let note = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": { "requestId": out, "reason": reason },
        });
        self.send_cancelled(note.to_string().as_bytes(), Guard::Always);
    }

    /// Writes a `notifications/cancelled` (`note`, naming the id the child saw) after the
    /// lines queued already, without waiting. A caller's own goes this way too: its request is
    /// marked told before, so a full queue must not drop it (the request's give-up or drop
    /// would then tell the child nothing, it being told).
    ///
    /// In order, not ahead of the queue: the request it names may still wait in the queue, and
    /// a child told before it sees the request ignores the id (not known yet), then runs it.
    fn send_cancelled(&self, note: &[u8], guard: Guard) {
        let line = Outgoing {
            line: one_line(note),
            guard,
            _room: None,
        };
        // Not awaited: a full queue gets it from a task, in its turn, within CANCEL_WAIT (a
        // child that stopped reading would otherwise keep one such task per request given up,
        // for as long as it runs).
        if let Err(mpsc::error::TrySendError::Full(line)) = self.normal.try_send(line) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let normal = self.normal.clone();
                rt.spawn(async move {
                    let _ = tokio::time::timeout(CANCEL_WAIT, normal.send(line)).await;
                });
            }
        }
    }

    /// The id the child saw for `session`'s request `id`, while it waits and its child was not
    /// told it is cancelled yet; marked told (it is not told again, also not when the request
    /// is then given up or dropped).
    pub fn tell_cancelled_id(&self, session: &SessionKey, id: &Id) -> Option<u64> {
        self.routes.lock().tell_cancelled(session, id)
    }

    /// Whether the child's request `id` (JSON text) was sent to `session`; forgets it then.
    pub fn answered_by(&self, id: &Id, session: &SessionKey) -> bool {
        let mut routes = self.routes.lock();
        match routes.asked(id.as_json()) {
            Some(s) if s == session => {
                routes.take_asked(id.as_json());
                true
            }
            _ => false,
        }
    }

    /// One line from the child's stdout, routed (see the module docs). Returns taskgate's own
    /// answer to it (a child's request refused, a `ping`), for [`Conn::reply`].
    fn on_line(&self, line: Line, max_message_bytes: usize) -> Option<Bytes> {
        let text = match line {
            Line::Text(t) if t.trim().is_empty() => return None,
            Line::Text(t) => t,
            Line::Oversize(id) => {
                self.metrics
                    .upstream_oversize(&self.name, OversizeKind::Json);
                // The request it answers (if its id could be read) ends with the error.
                if let Some(p) = id.and_then(|out| self.routes.lock().take(out)) {
                    let _ = p.answer.send(Err(format!(
                        "the upstream answer exceeded max_message_bytes={max_message_bytes}"
                    )));
                }
                self.noise(&format!(
                    "a line over max_message_bytes={max_message_bytes} (discarded)"
                ));
                return None;
            }
            Line::NotUtf8 => {
                self.noise("a line that is not UTF-8");
                return None;
            }
        };
        let bytes = Bytes::from(text);
        let msg = match Message::parse(bytes.clone()) {
            Ok(m) => m,
            Err(e) => {
                self.invalid_answer(&bytes, &e.to_string());
                let shown = crate::text::cut(&String::from_utf8_lossy(&bytes), 200);
                self.noise(&format!("a line that is not JSON-RPC ({e}): {shown}"));
                return None;
            }
        };
        match msg.kind() {
            Kind::Response | Kind::Error => self.answer(&msg),
            Kind::Notification => self.notification(&msg),
            Kind::Request => return self.request(&msg),
        }
        None
    }

    /// A line that is not JSON-RPC but reads as an answer to a request taskgate wrote (a JSON
    /// object with its numeric `id`, no `method`, and a `result` or an `error`: tester 3 F14,
    /// both at once): that request is answered at once with `-32603` naming the invalid answer
    /// (JSON-RPC 2.0 section 5: exactly one of the two) and `why` (the parse error), as an
    /// HTTP upstream's invalid response is, instead of waiting out its `timeout_ms`. The
    /// child's `error` member is not passed on: which of the two it meant cannot be told.
    fn invalid_answer(&self, line: &[u8], why: &str) {
        let member = |name: &str| splice::raw_at(line, &[name]).ok().flatten();
        if member("method").is_some() || (member("result").is_none() && member("error").is_none()) {
            return;
        }
        let Some(out) = member("id").and_then(|raw| raw.get().parse::<u64>().ok()) else {
            return;
        };
        let Some(p) = self.routes.lock().take(out) else {
            return;
        };
        let detail = if member("result").is_some() && member("error").is_some() {
            "it carries both `result` and `error` (JSON-RPC 2.0: exactly one of them)"
        } else {
            why
        };
        let message = format!("upstream `{}` sent an invalid answer: {detail}", self.name);
        let answer = jsonrpc::error_response(Some(&p.client_id), jsonrpc::INTERNAL_ERROR, &message);
        let _ = p.answer.send(Ok(answer));
    }

    fn noise(&self, what: &str) {
        self.metrics
            .upstream_error(&self.name, UpstreamErrorKind::Protocol);
        let mut last = self.noise_logged.lock();
        let now = std::time::Instant::now();
        if last.is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_secs(1)) {
            *last = Some(now);
            tracing::warn!(target: "taskgate::upstream::stdio", upstream = %self.name, "child stdout: {what}; not forwarded");
        }
    }

    /// An answer: to the request taskgate wrote under its id.
    fn answer(&self, msg: &Message) {
        let out = msg.id().and_then(|id| id.as_json().parse::<u64>().ok());
        let Some(p) = out.and_then(|out| self.routes.lock().take(out)) else {
            tracing::debug!(target: "taskgate::upstream::stdio", upstream = %self.name, id = ?msg.id().map(Id::as_json), "an answer no request waits for (given up or unknown): dropped");
            return;
        };
        if p.task_call {
            if let Some(task_id) = created_task_id(msg.bytes()) {
                let bytes = msg.bytes();
                let field = |name: &str| {
                    raw(bytes, &["result", "task", name]).or_else(|| raw(bytes, &["result", name]))
                };
                let note = TaskNote {
                    session: p.session.clone(),
                    declared: p.declared,
                    created_at: field("createdAt"),
                    ttl: field("ttl").or_else(|| field("ttlMs")),
                    ..TaskNote::default()
                };
                let ended = ended_at(bytes, &["result", "task", "status"])
                    || ended_at(bytes, &["result", "status"]);
                let mut routes = self.routes.lock();
                routes.note_task(task_id.clone(), note);
                if ended {
                    routes.task_ended(&task_id);
                }
            }
        } else if jsonrpc::contains(msg.bytes(), b"\"taskId\"") {
            // A task's status in an answer (`tasks/get`, `tasks/cancel`): an ended one is the
            // first its route table forgets (`Routes::task_ended`).
            let bytes = msg.bytes();
            if ended_at(bytes, &["result", "status"]) {
                if let Some(task_id) = raw_string(bytes, &["result", "taskId"]) {
                    self.routes.lock().task_ended(&task_id);
                }
            }
        }
        let answer: Answer = splice::replace(msg.bytes(), &["id"], p.client_id.as_json())
            .ok()
            .flatten()
            .ok_or_else(|| "its answer could not be read".to_string());
        let _ = p.answer.send(answer);
    }

    fn notification(&self, msg: &Message) {
        let bytes = msg.bytes();
        match msg.method().unwrap_or_default() {
            "notifications/progress" => {
                let token =
                    raw(bytes, &["params", "progressToken"]).and_then(|t| t.parse::<u64>().ok());
                let Some(token) = token else {
                    return self
                        .dropped("notifications/progress for a token taskgate did not write");
                };
                let (route, pending) = {
                    let routes = self.routes.lock();
                    (
                        routes.progress(token).cloned(),
                        routes.get(token).map(|p| p.related.clone()),
                    )
                };
                let Some(route) = route else {
                    return self.dropped("notifications/progress for a token no longer known");
                };
                let Some(rewritten) =
                    splice::replace(bytes, &["params", "progressToken"], &route.original)
                        .ok()
                        .flatten()
                else {
                    return;
                };
                let delivered = match pending {
                    Some(related) => related.try_send(rewritten.clone()).is_ok(),
                    None => false,
                };
                if !delivered {
                    self.to_session(&route.session, &rewritten);
                }
            }
            "notifications/tasks/status" | "notifications/tasks" => {
                let task = raw_string(bytes, &["params", "taskId"]);
                let ended = ended_at(bytes, &["params", "status"]);
                let session = task.and_then(|t| {
                    let mut routes = self.routes.lock();
                    if ended {
                        routes.task_ended(&t);
                    }
                    routes.task_session(&t).cloned()
                });
                match session {
                    Some(s) => {
                        if !self.to_session(&s, bytes) {
                            self.streams.unseen_status(bytes);
                        }
                    }
                    // Not observed either: this child did not create it (a `per_session`
                    // child must not move another session's record of the same upstream).
                    None => self.dropped("a task status for a task taskgate did not see created"),
                }
            }
            "notifications/cancelled" => {
                let id = raw(bytes, &["params", "requestId"]);
                let session = id.and_then(|id| self.routes.lock().take_asked(&id));
                match session {
                    Some(s) => {
                        self.to_session(&s, bytes);
                    }
                    None => self
                        .dropped("notifications/cancelled for a request of the child's not known"),
                }
            }
            _ => {
                let path = ["params", "_meta", SUBSCRIPTION_ID];
                let Some(listen) = raw(bytes, &path) else {
                    let owner = self.owner.lock().clone();
                    match owner {
                        Owner::Every => {
                            self.streams.broadcast(bytes);
                        }
                        Owner::Session(s, _) => {
                            self.to_session(&Some(s), bytes);
                        }
                        Owner::NotYet => self.dropped("a notification before its session"),
                    }
                    return;
                };
                let target = listen.parse::<u64>().ok().and_then(|out| {
                    let routes = self.routes.lock();
                    routes
                        .get(out)
                        .map(|p| (p.client_id.clone(), p.related.clone()))
                });
                let Some((client_id, related)) = target else {
                    return self.dropped("a notification of a subscription no longer open");
                };
                let rewritten = splice::replace(bytes, &path, client_id.as_json())
                    .ok()
                    .flatten();
                if rewritten.is_none_or(|m| related.try_send(m).is_err()) {
                    self.dropped("a subscription's notification its client did not take in time");
                }
            }
        }
    }

    /// A server→client request. Returns taskgate's answer to it, when it reaches no client.
    fn request(&self, msg: &Message) -> Option<Bytes> {
        let id = msg.id().cloned()?;
        let bytes = msg.bytes().clone();
        let method = msg.method().unwrap_or_default();
        if method == "ping" {
            return Some(jsonrpc::result_response(&id, "{}"));
        }
        // Tester 3 F6: a client is never sent a request it did not declare it can answer.
        let needs = capability_for(method);
        let declares = |c: ClientCapabilities| needs.is_none_or(|pointer| c.has(pointer));
        let task = raw_string(&bytes, &["params", "_meta", RELATED_TASK, "taskId"]);
        let mut routes = self.routes.lock();
        if let Some(note) = task.and_then(|t| routes.task_note(&t).cloned()) {
            if !declares(note.declared) {
                drop(routes);
                return Some(self.not_declared(&id, method));
            }
            let session = note.session;
            routes.note_asked(id.as_json().to_string(), session.clone());
            drop(routes);
            if self.to_session(&session, &bytes) {
                return None;
            }
            return Some(self.refuse(&id, &format!(
                "the client of upstream `{}` whose task this request is about has no open GET stream for it (or it is full)",
                self.name
            )));
        }
        let several = match routes.asked_of(declares) {
            // During an `initialize` (a client's, or taskgate's own): no client could answer
            // it (none has a session yet; MCP 2025-11-25 lifecycle: a server SHOULD NOT send
            // requests but `ping` before it is initialized). Refused at once, so the child
            // waits for nothing and the `initialize` goes on.
            Candidates::BeforeSession => {
                drop(routes);
                return Some(self.refuse(&id, &format!(
                    "taskgate cannot relay a request of upstream `{}` sent before its initialize was answered: no client has a session to answer it on",
                    self.name
                )));
            }
            Candidates::NoneDeclared => {
                drop(routes);
                return Some(self.not_declared(&id, method));
            }
            Candidates::One(out) => {
                let p = routes.get(out)?;
                let (session, related) = (p.session.clone(), p.related.clone());
                routes.note_asked(id.as_json().to_string(), session);
                drop(routes);
                let why = match related.try_send(bytes) {
                    Ok(()) => return None,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        "its reply holds as many messages as it may, its client does not take them"
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => "its client went away",
                };
                let why = format!(
                    "the request of upstream `{}`'s client this request is about cannot take it: {why}",
                    self.name
                );
                return Some(self.refuse(&id, &why));
            }
            Candidates::Several => true,
            Candidates::NoRequest => false,
        };
        drop(routes);
        // A `per_session` child's request outside any call (`roots/list` once initialized,
        // for one), or while several of its calls are in flight, is its own session's: it
        // goes to that session's GET stream.
        let owner = self.owner.lock().clone();
        if let Owner::Session(s, declared) = owner {
            if !declares(declared) {
                return Some(self.not_declared(&id, method));
            }
            let session = Some(s);
            self.routes
                .lock()
                .note_asked(id.as_json().to_string(), session.clone());
            if self.to_session(&session, &bytes) {
                return None;
            }
            return Some(self.refuse(&id, &format!(
                "the client of upstream `{}` has no open GET stream for this request (or it is full)",
                self.name
            )));
        }
        let why = match &*self.owner.lock() {
            Owner::NotYet => "no client has a session with it yet",
            Owner::Every | Owner::Session(..) if several => {
                "its process is shared, and several clients that declared what it needs have requests in flight: use process = \"per_session\""
            }
            Owner::Every | Owner::Session(..) => "its process is shared",
        };
        Some(self.refuse(
            &id,
            &format!(
                "taskgate cannot tell which client of upstream `{}` this request is for ({why})",
                self.name
            ),
        ))
    }

    /// The `-32601` answer to the child's request `id` (`method`) that no client it could be
    /// for declared the capability of (MCP 2025-11-25 client capabilities: `sampling`,
    /// `elicitation`, `roots`), for [`Conn::reply`]; as gateway tasks answer it.
    fn not_declared(&self, id: &Id, method: &str) -> Bytes {
        self.routes.lock().take_asked(id.as_json());
        jsonrpc::error_response(
            Some(id),
            jsonrpc::METHOD_NOT_FOUND,
            &format!("{method}: the client did not declare the capability it needs, so taskgate cannot ask it"),
        )
    }

    /// Refuses the child's request `id` (it reaches no client): its note (whom it was sent to)
    /// is forgotten; returns the `-32603` answer saying `why`, for [`Conn::reply`].
    fn refuse(&self, id: &Id, why: &str) -> Bytes {
        self.routes.lock().take_asked(id.as_json());
        jsonrpc::error_response(Some(id), jsonrpc::INTERNAL_ERROR, why)
    }

    /// Writes taskgate's own answer to a request of the child's, ahead of queued requests.
    /// The reader calls it before it reads the next line, so a full queue holds the child's
    /// stdout until there is room: every request of a child that floods them is answered, at
    /// the pace the child reads its stdin, and what waits is bounded by the queue and the
    /// pipes. A full queue means the writer waits on the pipe: a child that takes nothing for
    /// `timeout_ms` meanwhile (its stdout then waits unread, so it says nothing) is found deaf
    /// by the writer ([`write_lines`]) and ended, which
    /// closes the queue, and the answer is dropped (the child reads nothing more).
    async fn reply(&self, msg: Bytes) {
        let _ = self.urgent.send(Outgoing::always(one_line(&msg))).await;
    }

    fn to_session(&self, session: &SessionKey, msg: &Bytes) -> bool {
        let sent = session
            .as_deref()
            .is_some_and(|s| self.streams.send(s, msg));
        if !sent {
            self.dropped("the session has no open GET stream, or it is full");
        }
        sent
    }

    fn dropped(&self, why: &str) {
        tracing::debug!(target: "taskgate::upstream::stdio", upstream = %self.name, "child message dropped: {why}");
    }
}

/// A registered request: the id the child sees, the bytes to write, and where its messages
/// come back.
pub struct Registered {
    /// The id the child sees.
    pub out: u64,
    /// The message as written.
    pub bytes: Bytes,
    /// Its answer.
    pub answer: oneshot::Receiver<Answer>,
    /// Messages related to it, before its answer.
    pub related: QueueRx<Bytes>,
    /// Whether its line is written or withdrawn ([`Conn::write_request`]).
    claim: Arc<Claim>,
    /// Its child, for the drop guard.
    conn: std::sync::Weak<Conn>,
    /// Whether an abandoned one is cancelled at the child (not `initialize`), once its line
    /// is in the stdin queue ([`Conn::queued`], kept on its route: [`Pending::queued`]).
    tell_on_drop: bool,
}

/// The drop guard of a request (issue 31): dropped before its answer (the client went away,
/// hyper dropped the exchange; no timer runs then), its route and `max_in_flight` slot are
/// freed and the child gets `notifications/cancelled` (not when it was never written: the
/// child never saw it, and the writer skips a line still queued). After its answer, or once given up, its route is gone and this does
/// nothing.
impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.upgrade() {
            conn.abandon(self.out, self.tell_on_drop);
        }
    }
}

/// `msg` with its id replaced by `out`, and its `params._meta.progressToken` (if any) by
/// `out` too; returns the caller's token as JSON text.
fn rewrite_request(msg: &Bytes, out: u64) -> Result<(Bytes, Option<String>), serde_json::Error> {
    let number = out.to_string();
    let with_id = splice::replace(msg, &["id"], &number)?.unwrap_or_else(|| msg.clone());
    let path = ["params", "_meta", "progressToken"];
    let Some(token) = splice::raw_at(&with_id, &path)?.map(|t| t.get().to_string()) else {
        return Ok((with_id, None));
    };
    let with_token = splice::replace(&with_id, &path, &number)?.unwrap_or(with_id);
    Ok((with_token, Some(token)))
}

/// The JSON text at `path`, if any.
fn raw(bytes: &[u8], path: &[&str]) -> Option<String> {
    splice::raw_at(bytes, path)
        .ok()
        .flatten()
        .map(|r| r.get().to_string())
}

/// The string at `path`, if it is one.
fn raw_string(bytes: &[u8], path: &[&str]) -> Option<String> {
    let raw = splice::raw_at(bytes, path).ok().flatten()?;
    serde_json::from_str::<String>(raw.get()).ok()
}

/// Whether the string at `path` is a terminal task status (`completed`, `failed`,
/// `cancelled`).
fn ended_at(bytes: &[u8], path: &[&str]) -> bool {
    raw_string(bytes, path)
        .and_then(|s| TaskStatus::parse(&s))
        .is_some_and(TaskStatus::is_terminal)
}

/// The `taskId` of a `CreateTaskResult` (2025-11-25 `result.task.taskId`, or 2026-07-28's flat
/// `result.taskId`).
fn created_task_id(answer: &[u8]) -> Option<String> {
    raw_string(answer, &["result", "task", "taskId"])
        .or_else(|| raw_string(answer, &["result", "taskId"]))
}

/// What the writer needs for the liveness rule ([`write_lines`]).
struct Liveness {
    /// The upstream's name, for the log.
    name: Arc<str>,
    /// The child's progress, in bytes written ([`Conn::written`]).
    written: Arc<AtomicU64>,
    /// Bytes read from the child's stdout ([`Conn`]'s `heard`).
    heard: Arc<AtomicU64>,
    /// Found deaf through it ([`Conn::deafened`]); weak: the conn holds the writer's queues.
    conn: std::sync::Weak<Conn>,
    /// The upstream's `timeout_ms`.
    timeout: std::time::Duration,
}

/// The writer: lines from the two queues (urgent first) to the child's stdin, until `close`
/// fires or both queues end; dropping stdin closes it. `close` is seen also while a line waits
/// for room in a full pipe (its rest is not written): the child gets its EOF after what the
/// pipe holds, not after the rest of a long line it may never read. Returns true when a write
/// failed (the child closed its stdin).
///
/// The liveness rule (tester 3 F2): a line that waits `timeout_ms` for the pipe to take one
/// more byte, while not one byte is read from the child's stdout, finds the child deaf
/// ([`Conn::deafened`]: the keeper ends it), however few lines wait behind it. A reader making
/// progress resets the wait with every piece it takes; a child that speaks on its stdout
/// during the wait (an answer, progress, a notification) is busy, not deaf, and the wait
/// begins again (review M3: a single-threaded server reads its stdin only between requests,
/// so one long call with more than a pipe's worth queued got a shared child ended, every
/// session's calls and tasks with it). So a deaf child is found within `timeout_ms` of its
/// last byte read or written, or at most twice that.
async fn write_lines(
    mut stdin: tokio::process::ChildStdin,
    mut normal: mpsc::Receiver<Outgoing>,
    mut urgent: mpsc::Receiver<Outgoing>,
    mut close: oneshot::Receiver<()>,
    live: Liveness,
) -> bool {
    let mut found_deaf = false;
    loop {
        let next = tokio::select! {
            biased;
            _ = &mut close => break,
            Some(l) = urgent.recv() => l,
            Some(l) = normal.recv() => l,
            else => break,
        };
        let still_for_the_child = match &next.guard {
            Guard::Always => true,
            Guard::Request(claim) => claim.write(),
            Guard::CancelOf(claim) => !claim.withdrawn(),
        };
        if !still_for_the_child {
            continue;
        }
        let line = next.line;
        // In pieces, each counted: a child reading a long line slowly makes progress.
        let mut rest = &line[..];
        while !rest.is_empty() {
            // What the child had said when this wait began.
            let heard = live.heard.load(Ordering::Acquire);
            let wrote = tokio::select! {
                biased;
                _ = &mut close => return false,
                wrote = stdin.write(rest) => wrote,
                () = tokio::time::sleep(live.timeout), if !found_deaf => {
                    // It spoke meanwhile (an answer, progress): busy, not deaf (review M3: a
                    // single-threaded server reads its stdin only between requests). A new
                    // window begins.
                    if live.heard.load(Ordering::Acquire) != heard {
                        continue;
                    }
                    found_deaf = true;
                    if live.conn.upgrade().is_some_and(|conn| conn.deafened()) {
                        tracing::warn!(target: "taskgate::upstream::stdio", upstream = %live.name, timeout_ms = live.timeout.as_millis() as u64, "child read nothing from its stdin while a line waited timeout_ms to be written, and said nothing on its stdout: ending it");
                    }
                    continue;
                }
            };
            match wrote {
                Ok(0) | Err(_) => return true,
                Ok(n) => {
                    rest = rest.get(n..).unwrap_or_default();
                    live.written.fetch_add(n as u64, Ordering::AcqRel);
                }
            }
        }
        if stdin.flush().await.is_err() {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_goes_out_under_taskgates_id_and_token() {
        let msg = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x","_meta":{"progressToken":"p1"}}}"#,
        );
        let (bytes, token) = rewrite_request(&msg, 42).expect("valid");
        assert_eq!(
            &bytes[..],
            &br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":42}}}"#[..]
        );
        assert_eq!(token.as_deref(), Some("\"p1\""));
        let plain = Bytes::from_static(br#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#);
        let (bytes, token) = rewrite_request(&plain, 7).expect("valid");
        assert_eq!(&bytes[..], br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        assert!(token.is_none());
    }

    #[test]
    fn a_created_task_is_read_in_both_eras() {
        assert_eq!(
            created_task_id(br#"{"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"t:1","status":"working"}}}"#).as_deref(),
            Some("t:1")
        );
        assert_eq!(
            created_task_id(
                br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t2"}}"#
            )
            .as_deref(),
            Some("t2")
        );
        assert!(created_task_id(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).is_none());
    }

    /// A child's notification for every GET stream is held once: each stream's event shares
    /// the line's bytes (it was copied once per open stream, so a child's 4 MB notifications
    /// queued for 5 slow streams took 5 times the memory).
    #[test]
    fn a_broadcast_shares_the_messages_bytes_with_every_stream() {
        let streams = Streams::default();
        let mut a = streams.open("a".into());
        let mut b = streams.open("b".into());
        let msg = Bytes::from(r#"{"jsonrpc":"2.0","method":"notifications/message"}"#);
        assert_eq!(streams.broadcast(&msg), 2);
        let data = |ev: sse::Event| ev.data.expect("data");
        let (da, db) = (
            data(a.try_recv().expect("a")),
            data(b.try_recv().expect("b")),
        );
        assert_eq!(&*da, std::str::from_utf8(&msg).expect("utf-8"));
        assert_eq!(da.as_ptr(), msg.as_ptr(), "not copied");
        assert_eq!(db.as_ptr(), msg.as_ptr(), "not copied");
    }

    /// A Conn without a child: its stdin queues are the receivers returned (urgent second).
    fn bare(
        owner: Owner,
    ) -> (
        Arc<Conn>,
        mpsc::Receiver<Outgoing>,
        mpsc::Receiver<Outgoing>,
    ) {
        let (normal, normal_rx) = mpsc::channel(8);
        let (urgent, urgent_rx) = mpsc::channel(8);
        let conn = Arc::new(Conn {
            name: "kid".into(),
            normal,
            urgent,
            routes: Mutex::new(Routes::default()),
            streams: Arc::default(),
            metrics: Arc::new(Metrics::new(&["kid".to_string()])),
            closed: AtomicBool::new(false),
            why: Mutex::new(None),
            noise_logged: Mutex::new(None),
            owner: Mutex::new(owner),
            dead_held: Mutex::new(Vec::new()),
            written: Arc::default(),
            heard: Arc::default(),
            deaf: Arc::default(),
            found_deaf: AtomicBool::new(false),
            room: Arc::new(tokio::sync::Semaphore::new(WRITE_QUEUE_BYTES)),
        });
        (conn, normal_rx, urgent_rx)
    }

    /// One line of the child's stdout through `conn`; the answer taskgate writes back
    /// (`error.message`), if any.
    fn feed(conn: &Conn, line: &str) -> Option<String> {
        let reply = conn.on_line(Line::Text(line.to_string()), 1 << 20)?;
        let v: serde_json::Value = serde_json::from_slice(&reply).expect("json");
        Some(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    }

    /// A client that declared `sampling`, `elicitation` and `roots`.
    fn every() -> ClientCapabilities {
        ClientCapabilities::of(&serde_json::json!({"sampling": {}, "elicitation": {}, "roots": {}}))
    }

    /// Registers a `tools/call` (id `id`) of `session`, whose client declared `declared`.
    fn call_of(
        conn: &Arc<Conn>,
        session: &str,
        id: u32,
        declared: ClientCapabilities,
    ) -> Registered {
        let msg = Message::parse(Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x"}}}}"#
        )))
        .expect("json");
        conn.register(&msg, Some(session.into()), declared, None, false, None)
            .expect("registered")
    }

    /// One line of the child's through `conn`: taskgate's answer to it, as (code, message).
    fn refusal(conn: &Conn, line: &str) -> Option<(i64, String)> {
        let reply = conn.on_line(Line::Text(line.to_string()), 1 << 20)?;
        let v: serde_json::Value = serde_json::from_slice(&reply).expect("json");
        Some((
            v["error"]["code"].as_i64().unwrap_or_default(),
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ))
    }

    const SAMPLING: &str =
        r#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#;
    const ELICITATION: &str =
        r#"{"jsonrpc":"2.0","id":"e1","method":"elicitation/create","params":{}}"#;

    /// Tester 3 F6: a request of the child's needing a capability its client did not declare
    /// is answered `-32601`, never sent to it (the client would never answer, the child waited
    /// for ever): the one call in flight, a task's creator, a `per_session` child's owner.
    #[tokio::test]
    async fn a_childs_request_never_reaches_a_client_that_did_not_declare_it() {
        let (conn, _normal, _urgent) = bare(Owner::Every);
        let mut plain = call_of(&conn, "s1", 1, ClientCapabilities::default());
        let (code, why) = refusal(&conn, SAMPLING).expect("refused");
        assert_eq!(code, jsonrpc::METHOD_NOT_FOUND, "{why}");
        assert!(why.contains("declare"), "{why}");
        assert!(plain.related.try_recv().is_err(), "not sent to the client");
        // Declared `sampling` only: an elicitation is refused, a sampling request goes.
        let sampling = ClientCapabilities::of(&serde_json::json!({"sampling": {}}));
        drop(plain);
        let mut samples = call_of(&conn, "s1", 2, sampling);
        assert_eq!(
            refusal(&conn, ELICITATION).map(|r| r.0),
            Some(jsonrpc::METHOD_NOT_FOUND)
        );
        assert!(refusal(&conn, SAMPLING).is_none());
        assert!(samples.related.try_recv().is_ok());
        // Another method needs no capability: as before.
        let custom = r#"{"jsonrpc":"2.0","id":"x1","method":"x/ask","params":{}}"#;
        assert!(refusal(&conn, custom).is_none());
        drop(samples);
        // A task's creator that did not declare it.
        conn.routes.lock().note_task(
            "t1".into(),
            TaskNote {
                session: Some("s1".into()),
                ..TaskNote::default()
            },
        );
        let about_t1 = r#"{"jsonrpc":"2.0","id":"e2","method":"elicitation/create","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t1"}}}}"#;
        assert_eq!(
            refusal(&conn, about_t1).map(|r| r.0),
            Some(jsonrpc::METHOD_NOT_FOUND)
        );
        // A `per_session` child's owner that did not declare it, nothing in flight.
        let (conn, _normal, _urgent) =
            bare(Owner::Session("s1".into(), ClientCapabilities::default()));
        let roots = r#"{"jsonrpc":"2.0","id":"r1","method":"roots/list","params":{}}"#;
        assert_eq!(
            refusal(&conn, roots).map(|r| r.0),
            Some(jsonrpc::METHOD_NOT_FOUND)
        );
    }

    /// Tester 3 F5: with several calls in flight on a shared child, a request of the child's
    /// goes to the one whose client declared what it needs: it was refused `-32603` ("cannot
    /// tell which client") whenever any other client had a request in flight.
    #[tokio::test]
    async fn a_childs_request_goes_to_the_one_call_whose_client_declared_it() {
        let (conn, _normal, _urgent) = bare(Owner::Every);
        let mut plain = call_of(&conn, "s1", 1, ClientCapabilities::default());
        let mut asks = call_of(&conn, "s2", 1, every());
        assert!(refusal(&conn, SAMPLING).is_none(), "routed");
        assert!(
            asks.related.try_recv().is_ok(),
            "to the client that declared it"
        );
        assert!(plain.related.try_recv().is_err());
        // Two that declared it: taskgate cannot tell, and says what to do.
        let _also = call_of(&conn, "s3", 1, every());
        let (code, why) = refusal(&conn, ELICITATION).expect("refused");
        assert_eq!(code, jsonrpc::INTERNAL_ERROR, "{why}");
        assert!(why.contains("per_session"), "{why}");
    }

    /// Tester 3 F4: a call whose child was told it is cancelled (a cancelled gateway task's
    /// held call, kept open a grace period) takes no more input: a request of the child's goes
    /// to the other call in flight. It was refused while the cancelled one stayed.
    #[tokio::test]
    async fn a_cancelled_call_is_not_whom_a_childs_request_is_for() {
        let (conn, _normal, _urgent) = bare(Owner::Every);
        let mut cancelled = call_of(&conn, "s1", 1, every());
        let one = Id::from_json("1").expect("id");
        assert!(conn.tell_cancelled_id(&Some("s1".into()), &one).is_some());
        let mut live = call_of(&conn, "s1", 2, every());
        assert!(refusal(&conn, ELICITATION).is_none(), "routed");
        assert!(live.related.try_recv().is_ok());
        assert!(cancelled.related.try_recv().is_err());
    }

    /// A full table of task routes forgets a task the child reported ended before the oldest
    /// live one: a terminal task's route serves only late messages about it, a live task's its
    /// status notifications and the child's requests for its client. Before: the oldest note
    /// went whatever its task's status (the routes did not track it), so a long-running task
    /// lost its route to a stream of short ones that had ended.
    #[tokio::test]
    async fn a_full_table_forgets_an_ended_task_before_a_live_one() {
        let (conn, _normal, _urgent) = bare(Owner::Every);
        let max = super::super::route::MAX_NOTES;
        for i in 0..max {
            conn.routes.lock().note_task(
                format!("t{i}"),
                TaskNote {
                    session: Some("s1".into()),
                    ..TaskNote::default()
                },
            );
        }
        // t1 ends (a 2025 status notification), t2 too (a 2026 one); t0 is the oldest and live.
        for (task, method) in [
            ("t1", "notifications/tasks/status"),
            ("t2", "notifications/tasks"),
        ] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"{method}","params":{{"taskId":"{task}","status":"completed","createdAt":"x","lastUpdatedAt":"x","ttl":1000}}}}"#
            );
            assert!(feed(&conn, &line).is_none());
        }
        // A `working` report changes nothing.
        let working = r#"{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"t3","status":"working"}}"#;
        assert!(feed(&conn, working).is_none());
        let note = |task: &str| {
            conn.routes
                .lock()
                .note_task(task.into(), TaskNote::default())
        };
        note("n1");
        note("n2");
        {
            let routes = conn.routes.lock();
            assert!(
                routes.task_session("t0").is_some(),
                "the oldest live task stays"
            );
            assert!(
                routes.task_session("t1").is_none(),
                "an ended task goes first"
            );
            assert!(
                routes.task_session("t2").is_none(),
                "an ended task goes first"
            );
            assert!(routes.task_session("n1").is_some() && routes.task_session("n2").is_some());
        }
        // No ended task left: the oldest note goes, as before.
        note("n3");
        let routes = conn.routes.lock();
        assert!(routes.task_session("t0").is_none(), "then the oldest");
        assert!(routes.task_session("t3").is_some());
        assert!(routes.task_session("n3").is_some());
    }

    /// A `per_session` child's request refused because its client cannot take it now (no GET
    /// stream, or a full one; the request it belongs to cannot take more) says so: it said
    /// "its process is shared", which a `per_session` child's is not.
    #[tokio::test]
    async fn a_refused_request_says_the_real_reason() {
        let (conn, _normal, _urgent) = bare(Owner::Session("s1".into(), every()));
        conn.routes.lock().note_task(
            "t1".into(),
            TaskNote {
                session: Some("s1".into()),
                declared: every(),
                ..TaskNote::default()
            },
        );
        // Its task's session has no GET stream open.
        let why = feed(
            &conn,
            r#"{"jsonrpc":"2.0","id":"e1","method":"elicitation/create","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t1"}}}}"#,
        )
        .expect("refused");
        assert!(!why.contains("shared"), "{why}");
        assert!(why.contains("GET stream"), "{why}");

        // The one request in flight cannot take more related messages (its reply is gone).
        let msg = Message::parse(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
        ))
        .expect("json");
        let mut reg = conn
            .register(&msg, Some("s1".into()), every(), None, true, None)
            .expect("registered");
        reg.related.close();
        let why = feed(
            &conn,
            r#"{"jsonrpc":"2.0","id":"e2","method":"sampling/createMessage","params":{}}"#,
        )
        .expect("refused");
        assert!(!why.contains("shared"), "{why}");
        assert!(why.contains("request"), "{why}");
        drop(reg);
    }

    /// Messages related to one request (its progress, the child's requests for its client) are
    /// bounded in bytes too: 64 of up to `max_message_bytes` each let one slow client hold a
    /// gigabyte per request in flight.
    #[tokio::test]
    async fn a_requests_related_messages_are_bounded_in_bytes() {
        let (conn, _normal, _urgent) = bare(Owner::Every);
        let msg = Message::parse(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"p"}}}"#,
        ))
        .expect("json");
        let mut reg = conn
            .register(&msg, Some("s1".into()), every(), None, false, None)
            .expect("registered");
        let progress = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{},"progress":1,"message":"{}"}}}}"#,
            reg.out,
            "x".repeat(1 << 20)
        );
        for _ in 0..RELATED_QUEUE {
            feed(&conn, &progress);
        }
        let mut queued = 0;
        while let Ok(m) = reg.related.try_recv() {
            queued += m.len();
        }
        assert!(queued > 0, "the first message is taken");
        assert!(queued <= 8 << 20, "{queued} bytes queued for one request");
        // Room again once its client took them.
        feed(&conn, &progress);
        assert!(reg.related.try_recv().is_ok());
    }

    /// A `python3 -c script args…` child (stdin and stdout piped, its own process group,
    /// killed on drop) run by a [`Conn`] named `kid`: 1 MiB lines, a `timeout_ms` of 5 s.
    fn python_conn(script: &str, args: &[&str]) -> Running {
        python_conn_within(script, args, std::time::Duration::from_secs(5))
    }

    /// [`python_conn`] with a `timeout_ms` of `timeout`.
    fn python_conn_within(script: &str, args: &[&str], timeout: std::time::Duration) -> Running {
        let child = tokio::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("python3");
        Conn::start(
            "kid".into(),
            child,
            1 << 20,
            Arc::default(),
            Arc::new(Metrics::new(&["kid".to_string()])),
            Owner::Every,
            timeout,
        )
    }

    /// Review L1: a child whose keeper is dropped before it reaped the child (its runtime torn
    /// down) takes its process group with it: `kill_on_drop` reached the child alone, and what
    /// it started in its group ran on (through the shim: all but the shim and the command).
    #[test]
    fn a_dropped_keeper_kills_the_childs_group() {
        let dir = tempfile::tempdir().expect("dir");
        let pid_file = dir.path().join("pid");
        let script = r#"
import subprocess, sys, time
p = subprocess.Popen(["sleep", "300"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(p.pid))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"#;
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let running =
            rt.block_on(async { python_conn(script, &[&pid_file.display().to_string()]) });
        let mut sleeper = None;
        for _ in 0..250 {
            sleeper = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<libc::pid_t>().ok());
            if sleeper.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let sleeper = sleeper.expect("the child started its own child");
        drop(rt);
        drop(running);
        let gone = || {
            std::fs::read_to_string(format!("/proc/{sleeper}/stat")).map_or(true, |stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
        };
        let mut ended = gone();
        for _ in 0..100 {
            if ended {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            ended = gone();
        }
        if !ended {
            // SAFETY: a plain system call (the test's own leftover).
            unsafe { libc::kill(sleeper, libc::SIGKILL) };
        }
        assert!(ended, "the child's own child ran on");
    }

    /// Review M3: a child that reads its stdin only between requests (a single-threaded
    /// server) stops reading it for longer than `timeout_ms` while a long call runs, and sends
    /// its progress on stdout meanwhile, with more than a pipe's worth queued: it is alive, not
    /// deaf. Before, the pipe taking nothing for `timeout_ms` was enough: a shared child was
    /// ended with every session's calls and tasks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_that_speaks_on_stdout_while_not_reading_is_not_deaf() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("read");
        // Reads nothing for 3 s (3 times `timeout_ms`), with a progress notification every
        // 200 ms, then logs every line it reads.
        let script = r#"
import sys, time
for i in range(15):
    sys.stdout.write('{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":0,"progress":%d}}\n' % i)
    sys.stdout.flush()
    time.sleep(0.2)
with open(sys.argv[1], "w") as f:
    for line in sys.stdin:
        f.write(line)
        f.flush()
"#;
        let running = python_conn_within(
            script,
            &[&log.display().to_string()],
            std::time::Duration::from_secs(1),
        );
        // 256 KiB: far more than the pipe holds (64 KiB).
        for i in 0..16 {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"n":{i},"data":"{}"}}}}"#,
                "x".repeat(16 << 10)
            );
            running
                .conn
                .write(line.as_bytes(), false)
                .await
                .expect("queued");
        }
        let read = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .count()
        };
        let start = std::time::Instant::now();
        while read() < 16 && start.elapsed() < std::time::Duration::from_secs(10) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(
            running.conn.why_closed().is_none(),
            "ended: {:?}",
            running.conn.why_closed()
        );
        assert_eq!(read(), 16, "every line reached the child");
        let _ = running.stop.send(());
    }

    /// The same child silent on stdout as well is deaf: ended within about `timeout_ms`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_silent_on_both_pipes_is_deaf() {
        let running = python_conn_within(
            "import time; time.sleep(30)",
            &[],
            std::time::Duration::from_secs(1),
        );
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{}"}}}}"#,
            "x".repeat(256 << 10)
        );
        running
            .conn
            .write(line.as_bytes(), false)
            .await
            .expect("queued");
        let why = tokio::time::timeout(std::time::Duration::from_secs(10), running.exited)
            .await
            .expect("ended")
            .expect("a reason");
        assert!(why.contains("stopped reading its stdin"), "{why}");
    }

    /// A child that sends requests faster than it reads its stdin (here: it reads nothing for a
    /// second) gets an answer to every one taskgate refuses: past the stdin queue they were
    /// dropped, and the child waited for ever. Its stdout is read at the pace it reads its
    /// stdin instead (nothing is held beyond the queue).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_refused_request_of_a_flooding_child_is_answered() {
        const N: usize = 3000;
        let dir = std::env::temp_dir().join(format!("tg-conn-flood-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("read");
        let script = r#"
import sys, threading, time
n, log = int(sys.argv[1]), sys.argv[2]
def flood():
    sys.stdout.write("".join('{"jsonrpc":"2.0","id":%d,"method":"x/ask","params":{}}\n' % i for i in range(n)))
    sys.stdout.flush()
threading.Thread(target=flood, daemon=True).start()
time.sleep(1.0)
with open(log, "w") as f:
    for line in sys.stdin:
        f.write(line)
        f.flush()
"#;
        let running = python_conn(script, &[&N.to_string(), &log.display().to_string()]);
        let answered = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("\"error\""))
                .count()
        };
        let start = std::time::Instant::now();
        while answered() < N && start.elapsed() < std::time::Duration::from_secs(10) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let got = answered();
        let _ = running.stop.send(());
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got, N, "requests of the child left without an answer");
    }

    /// A child being ended while a long line is half written gets its stdin closed at once:
    /// the writer saw the close only between lines, so a child reading its stdin slowly read
    /// the rest of the line before its EOF, and got `SIGTERM` after `STDIN_GRACE` instead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_closes_stdin_while_a_line_is_half_written() {
        // Reads nothing for 1 s, then 4 KiB every 10 ms until EOF, and exits.
        let script = r#"
import os, time
time.sleep(1.0)
while os.read(0, 4096):
    time.sleep(0.01)
"#;
        let running = python_conn(script, &[]);
        // 4 MiB: far more than the pipe holds, and than the child reads within the grace.
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{}"}}}}"#,
            "x".repeat(4 << 20)
        );
        running
            .conn
            .write(line.as_bytes(), false)
            .await
            .expect("queued");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let _ = running.stop.send(());
        let why = tokio::time::timeout(std::time::Duration::from_secs(10), running.exited)
            .await
            .expect("ended")
            .expect("a reason");
        assert!(why.contains("exited after stdin closed"), "{why}");
    }

    /// A deaf child gets `SIGTERM` at once: it reads nothing, so its stdin closing is nothing it
    /// can see, and waiting `STDIN_GRACE` for it only put its end (and its restart) 2 s later.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deaf_child_gets_sigterm_without_the_stdin_grace() {
        let running = python_conn("import time; time.sleep(30)", &[]);
        let started = std::time::Instant::now();
        assert!(running.conn.deafened());
        let why = tokio::time::timeout(std::time::Duration::from_secs(10), running.exited)
            .await
            .expect("ended")
            .expect("a reason");
        let took = started.elapsed();
        assert!(why.contains("after SIGTERM"), "{why}");
        assert!(
            took < super::super::child::STDIN_GRACE,
            "ended after {took:?}"
        );
    }

    /// Registers `json` (a request) on `conn` for session `s1` and queues its line for the
    /// child's stdin, as `Inner::call` does.
    async fn queue_request(conn: &Arc<Conn>, json: String) -> Registered {
        let msg = Message::parse(Bytes::from(json)).expect("json");
        let reg = conn
            .register(&msg, Some("s1".into()), every(), None, false, None)
            .expect("registered");
        conn.write_request(&reg, false).await.expect("queued");
        conn.queued(reg.out);
        reg
    }

    /// Tester 3 F20: the stdin queue holds at most [`WRITE_QUEUE_BYTES`] of requests: a request
    /// past it waits for room (holding only itself, until its deadline) and is queued once the
    /// writer took enough; before, a child that stopped reading pinned 256 requests of up to
    /// `max_message_bytes` each.
    #[tokio::test]
    async fn the_stdin_queue_is_bounded_in_bytes() {
        let (conn, mut normal, _urgent) = bare(Owner::Every);
        let call = |id: usize| {
            let pad = "x".repeat(WRITE_QUEUE_BYTES / 3);
            let json = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"pad":"{pad}"}}}}}}"#
            );
            let msg = Message::parse(Bytes::from(json)).expect("json");
            conn.register(&msg, Some("s1".into()), every(), None, false, None)
                .expect("registered")
        };
        let regs: Vec<Registered> = (0..4).map(call).collect();
        // Three thirds (and a little) do not all fit: two are queued, the third waits.
        for reg in &regs[..2] {
            conn.write_request(reg, false).await.expect("queued");
        }
        let third = conn.write_request(&regs[2], false);
        tokio::pin!(third);
        assert!(
            futures_util::poll!(third.as_mut()).is_pending(),
            "a request past the queue's bytes waits for room"
        );
        // An urgent one (a `tasks/cancel`) does not wait behind it (review: the room is fair).
        let msg = Message::parse(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":"c","method":"tasks/cancel","params":{"taskId":"t"}}"#,
        ))
        .expect("json");
        let cancel = conn
            .register(&msg, Some("s1".into()), every(), None, false, None)
            .expect("registered");
        tokio::time::timeout(
            std::time::Duration::from_secs(1),
            conn.write_request(&cancel, true),
        )
        .await
        .expect("an urgent line overtakes a request waiting for room")
        .expect("queued");
        // The writer takes one: room for the third.
        drop(normal.recv().await.expect("the first line"));
        tokio::time::timeout(std::time::Duration::from_secs(5), third)
            .await
            .expect("queued once there is room")
            .expect("queued");
    }

    /// Tester 3 F3: a request still in taskgate's stdin queue when its caller is told it failed
    /// (its deadline passed: given up; or its caller went away: dropped) is never written: the
    /// child read it, and ran it, once it read again, followed by a `notifications/cancelled`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_given_up_while_queued_is_never_written() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("read");
        // Reads nothing for 1 s (well within `timeout_ms`), then logs every line.
        let script = r#"
import sys, time
time.sleep(1.0)
with open(sys.argv[1], "w") as f:
    for line in sys.stdin:
        f.write(line)
        f.flush()
"#;
        let running = python_conn(script, &[&log.display().to_string()]);
        let call = |text: &str, pad: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":"{text}","method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}","pad":"{}"}}}}}}"#,
                "x".repeat(pad)
            )
        };
        // More than the pipe holds: the writer waits in it; what follows waits in the queue.
        let big = queue_request(&running.conn, call("big", 256 << 10)).await;
        let late = queue_request(&running.conn, call("late", 0)).await;
        let gone = queue_request(&running.conn, call("gone", 0)).await;
        running
            .conn
            .give_up(late.out, "taskgate: the request timed out");
        drop(gone);
        let last = queue_request(&running.conn, call("last", 0)).await;
        let read = || std::fs::read_to_string(&log).unwrap_or_default();
        let start = std::time::Instant::now();
        while !read().contains(r#""text":"last""#) {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "the child read: {}",
                read().len()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _ = running.stop.send(());
        let read = read();
        assert!(read.contains(r#""text":"big""#));
        assert!(
            !read.contains(r#""text":"late""#),
            "a request given up was written"
        );
        assert!(
            !read.contains(r#""text":"gone""#),
            "a request dropped was written"
        );
        assert!(
            !read.contains("notifications/cancelled"),
            "a request never written was cancelled"
        );
        drop((big, last));
    }

    /// A GET stream's queue is bounded in bytes, not only in messages: 64 messages of up to
    /// `max_message_bytes` (16 MiB) each let one slow client hold a gigabyte.
    #[test]
    fn a_get_streams_queue_is_bounded_in_bytes() {
        let streams = Streams::default();
        let mut rx = streams.open("s".into());
        let big = Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{}"}}}}"#,
            "x".repeat(1 << 20)
        ));
        let mut queued = 0usize;
        for _ in 0..STREAM_QUEUE {
            if streams.send("s", &big) {
                queued += big.len();
            }
        }
        assert!(queued > 0, "the first message is taken");
        assert!(
            queued <= 8 << 20,
            "{queued} bytes queued for one GET stream"
        );
        assert!(!streams.send("s", &big), "full");
        // What its client takes makes room again; a message larger than the whole bound
        // still goes to an empty queue (else it could never be delivered).
        while rx.try_recv().is_ok() {}
        assert!(streams.send("s", &big));
        while rx.try_recv().is_ok() {}
        let huge = Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{}"}}}}"#,
            "x".repeat(12 << 20)
        ));
        assert!(streams.send("s", &huge), "alone, any message goes");
        assert!(!streams.send("s", &big), "but nothing after it");
        assert_eq!(streams.broadcast(&big), 0);
    }

    /// Issue 31: one lock order, `routes` before `why`. `register` holds `routes` and reads
    /// `why` (`gone`) once it sees the conn closed; `close` must not hold `why` while it
    /// waits for `routes`, or the two deadlock.
    #[test]
    fn close_does_not_hold_why_while_it_waits_for_routes() {
        let (normal, _n) = mpsc::channel(1);
        let (urgent, _u) = mpsc::channel(1);
        let conn = Arc::new(Conn {
            name: "kid".into(),
            normal,
            urgent,
            routes: Mutex::new(Routes::default()),
            streams: Arc::default(),
            metrics: Arc::new(Metrics::new(&["kid".to_string()])),
            closed: AtomicBool::new(false),
            why: Mutex::new(None),
            noise_logged: Mutex::new(None),
            owner: Mutex::new(Owner::Every),
            dead_held: Mutex::new(Vec::new()),
            written: Arc::default(),
            heard: Arc::default(),
            deaf: Arc::default(),
            found_deaf: AtomicBool::new(false),
            room: Arc::new(tokio::sync::Semaphore::new(WRITE_QUEUE_BYTES)),
        });
        // As `register` does: `routes` held, then `is_closed`, then `why`.
        let routes = conn.routes.lock();
        let closer = {
            let conn = conn.clone();
            std::thread::spawn(move || conn.close("gone"))
        };
        while !conn.is_closed() {
            std::thread::yield_now();
        }
        let why = conn
            .why
            .try_lock_for(std::time::Duration::from_secs(1))
            .map(|w| w.clone());
        drop(routes);
        closer.join().expect("close ends");
        assert_eq!(
            why.flatten().as_deref(),
            Some("gone"),
            "`why` was held by close while it waited for `routes`: register would deadlock"
        );
    }
}

//! stdio upstreams: an MCP server started as a child process that speaks newline-delimited
//! JSON-RPC on its stdin/stdout (MCP 2025-11-25 basic/transports: stdio), behind the same
//! [`Transport`] seam as Streamable HTTP: clients reach it at `/mcp/<name>` exactly as an HTTP
//! upstream, and every layer (records, owner binding, single cancel, audit, upgrade, bridge)
//! works unchanged.
//!
//! ```toml
//! [[upstream]]
//! name = "files"
//! command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]
//! env = { API_KEY = "${FILES_API_KEY}" }
//! cwd = "/srv"
//! process = "shared"        # or "per_session"
//! ```
//!
//! # `process = "shared"`: one child for every client
//!
//! A supervisor task starts the child, sends it taskgate's own `initialize` (2025-11-25,
//! `clientInfo` taskgate, no client capabilities) and `notifications/initialized`, and keeps
//! the answer. What is **shared** and what is **per client**:
//!
//! - shared: the child's one MCP session, so its `initialize` answer (serverInfo,
//!   capabilities, negotiated version), its tools and resources, and its tasks (a task lives
//!   in the child's memory, whoever created it); the client capabilities the child saw (none:
//!   taskgate cannot promise that every client answers sampling, elicitation or roots; a
//!   server→client request it sends anyway goes to the client it is for when taskgate can
//!   tell, among those that declared the capability it needs, else it is answered: `-32601`
//!   when no client it could be for declared it, `-32603` when several could: see [`conn`]);
//!   logging level and subscriptions.
//! - per client: its `Mcp-Session-Id` (minted by taskgate, `tgs-` + 32 hex; an `initialize`
//!   is answered with the kept answer under the client's own id, without reaching the child;
//!   its `notifications/initialized` is answered 202 likewise), its JSON-RPC ids and progress
//!   tokens (taskgate writes its own, [`route`]), its GET stream, and who may see, cancel or
//!   list a task: the layers above bind every task to its owner as for any upstream, and
//!   task status notifications go only to the session whose request created the task.
//!
//! Why: a stdio server is written for one client, so taskgate is that client; sessions,
//! owners and ids are taskgate's to keep apart, as they are with an HTTP upstream's sessions.
//!
//! **The era probe.** Before its `initialize`, taskgate asks a new shared child
//! `server/discover` (2026-07-28 `_meta`: protocol version, no client capabilities, clientInfo
//! taskgate), as MCP 2026-07-28 (basic/versioning, backward compatibility) tells a dual-era
//! client on stdio to:
//!
//! - a `DiscoverResult` (or a `-32022` UnsupportedProtocolVersion) whose supported versions
//!   are all 2026-07-28 or later: a **modern-only** child. It is never sent `initialize`: rmcp
//!   3.11's stdio server, for one, answers it with `-32022` and stops serving, so the process
//!   exits and would be restarted for ever. Clients' `initialize` are answered by taskgate
//!   with the child's own refusal (`-32022`, `data.supported` the versions it named, HTTP 200,
//!   as rmcp's HTTP server answers it), so the layers above hold 2025 sessions for it as for a
//!   2026-only HTTP upstream; 2026-07-28 requests (no session) go to it as they come.
//! - a supported version older than 2026-07-28 (a **dual-era** child), any other error, or
//!   no answer within the upstream's `timeout_ms` (a legacy server that ignores unknown
//!   requests; a child slower to start than that is taken for one and gets `initialize`,
//!   which has the start-up budget, `startup_timeout_ms`; a modern-only one refuses it, and
//!   its restart is probed again): `initialize` as below, on the same child. A dual-era child then
//!   serves 2025 clients in the session taskgate opened and 2026-07-28 requests by their own
//!   `_meta` (the spec's "MAY serve both eras concurrently"; rmcp 3.11 does).
//! - the child dies during the probe: a failed start; its restart is taken for a legacy
//!   server that cannot stand an unknown request before `initialize`.
//!
//! The era found is kept for the upstream's later children (the spec: cache it, and MAY keep
//! it across restarts of the same server, re-probing if it later fails): a restart goes
//! straight to `initialize`, or, modern-only, to serving. A legacy child that refuses
//! `initialize` makes the next start probe again.
//!
//! A child that refuses `initialize` (and was not found modern-only by the probe) gets every
//! client's `initialize` forwarded (the bridge then holds sessions, as for HTTP).
//!
//! **Supervision.** A child that exits or is killed is restarted after a back-off (100 ms,
//! doubling to 30 s), reset once a child has stayed up [`SUSTAINED_UPTIME`]; a child that closes
//! its stdout or its stdin but runs on is ended first (close stdin, `SIGTERM`, `SIGKILL`, as at
//! shutdown), then restarted likewise, and so is a **deaf** child (the liveness rule): one
//! whose stdin pipe took not one byte for `timeout_ms` while taskgate had a line to write to it
//! (a request waiting, or a notification, or taskgate's answer to the child's own request;
//! the writer watches its own write, so the rule holds under light traffic: one request larger
//! than the pipe is enough), and whose stdout said not one byte in that time either. A child
//! that speaks meanwhile (an answer, progress, a notification) is busy, not deaf: a
//! single-threaded server reads its stdin only between requests, so one call longer than
//! `timeout_ms` with more than a pipe's worth (64 KiB) queued found a shared child deaf, and
//! every session's calls and tasks ended with it (review M3); the wait begins again instead,
//! so a deaf child is found within one to two `timeout_ms`. It replaces the earlier rule, "a write that found taskgate's
//! 256-line stdin queue full for `timeout_ms`", which the writer's rule covers (a full queue
//! means the writer waits on the pipe) and which light traffic never met: with `max_in_flight`
//! at 64, only stale lines of timed-out requests could fill the queue, so a deaf child got
//! every call answered 504 for hours while `/readyz` stayed green (tester 3 F2). A slow
//! reader, which still takes bytes, is not deaf: every piece the pipe takes starts the wait
//! again (the kernel frees pipe room a 4 KiB page at a time and a reader buffers its input, so
//! one taking less than a few KiB per `timeout_ms`, small lines at a slow pace, is found deaf
//! too). A deaf child gets `SIGTERM` without the wait for an exit on EOF, which it cannot see,
//! and is logged at warn; every start after
//! the first counts in `taskgate_upstream_restarts_total{upstream}`. Requests waiting on the
//! dead child get a JSON-RPC error naming the upstream ("upstream `x` is unreachable: its
//! child process exited (…)"); requests that arrive while no child runs get it at once (while
//! one is starting, they wait for it within `timeout_ms`). A child that dies or does not
//! answer taskgate's `initialize` within `startup_timeout_ms` (a new child's budget, default
//! 60 s, apart from `timeout_ms`: a cold `npx -y` or `uv run` resolves packages first; tester 3
//! F21) is a failed start (logged, backed off), never a hang. A `per_session` child has the
//! same budget for the client's `initialize` forwarded to it.
//! Each death is announced as a [`ChildGone`] (the gateway marks the upstream's tasks that
//! were not terminal `failed`, with both audit facts: the process is gone; so are the gateway
//! tasks, `tasks = "gateway"`, whose held calls were in flight on it, [`ChildGone::held`],
//! released even when their held call recorded them `failed` first); the new child never
//! knew them, so taskgate answers their `tasks/get` (`failed`, the reason as `statusMessage`),
//! `tasks/result` (`-32603`) and `tasks/cancel` (`-32602`) itself. `/readyz` is red while no
//! child is live ([`StdioHandle::readiness`]).
//!
//! # `process = "per_session"`: one child per client session
//!
//! A client's `initialize` starts a child and is forwarded to it (ids mapped as in shared
//! mode); its answer gets a taskgate session id (a request the child sends before answering
//! it, `roots/list` say, is answered `-32603` by taskgate at once: the client has no session
//! to answer it on yet; see [`conn`]). The session's requests go to its child; a
//! `DELETE`, [`PER_SESSION_IDLE`]-style idle reclaim (`gateway.session_idle_ms`, counted while
//! no request is in flight on the child and no task of its is live: a long call, a gateway
//! task's held call or a task the child runs keeps it; a task is live until the child reports
//! it ended, in a status notification or an answer, or its ttl is over) and shutdown end it. A
//! child that dies ends its session (later requests get 404, so the client initializes again)
//! and its tasks fail as above. At most [`MAX_CHILDREN`] children at once, those still starting
//! counted ([`ChildCaps`]), and at most `limits.max_sessions_per_principal` of one principal
//! ([`Tenant`]: without auth its client address, IPv6 by its /64), its starting ones counted:
//! its next `initialize` past that ends its own least recently used session as a `DELETE`
//! does (the session then gets 404; in flight or not, as the session table reclaims a
//! principal's least recently used session): its child is ended, unless a task of its is live
//! (tester 3 F22): as a `DELETE` with live tasks is deferred (`layers::session_guard`), that
//! child is kept (no longer counted in the share; `tasks/*` still reach it) until its tasks
//! have ended, then [`RETIRED_GRACE`] with nothing in flight. At [`MAX_CHILDREN`] a
//! principal's new session ends its own least recently used **idle** child (nothing in flight
//! on it, no live task); a principal with none (or callers not told apart:
//! [`Tenant::Unknown`]) gets 503 with `Retry-After`. So one client that never sends `DELETE` neither locks itself out nor,
//! with a share below [`MAX_CHILDREN`], takes every child from the others (cold test, session
//! 25). An ended child's process may take the stop's few seconds to exit; it no longer counts.
//!
//! # Bounds
//!
//! Requests in flight on one upstream: `max_in_flight` (default 64); more wait for a slot
//! within `timeout_ms`, then get 504; one `timeout_ms` covers the wait for a slot, the write
//! and the answer (a request that got its slot late has what is left of it). `tasks/cancel`
//! takes no slot and is written ahead of queued requests (its task's creating call was
//! answered, so written, already);
//! `notifications/cancelled` takes none and is written in order, after the request it names
//! (ahead of it, while that request still waited in the queue, it named an id the child did
//! not know yet, and the request then ran); a request cancelled while it still waits for a
//! slot is never sent (`-32603` to its caller); a
//! `tasks/result` (which waits for its task's end) takes none either. A
//! stdout line is at most `max_message_bytes` (`framing.rs`); related messages and GET stream
//! messages wait in bounded queues ([`conn`]), and so do lines for the child's stdin: a write
//! waits at most `timeout_ms` for room (a child that stopped reading its stdin gets later
//! requests and notifications answered 504, never held open; a request not written is not
//! cancelled at the child, which never saw it). A request whose caller was answered before
//! its line left taskgate's stdin queue (its `timeout_ms` passed: 504; or its caller went
//! away) is skipped by the writer: never written, so never run, and not cancelled either
//! (`route::Claim`: the writer taking the line and the caller's end decide once, so a
//! request is either written, and then cancelled, or neither). A child whose pipe took
//! nothing for `timeout_ms`, while its stdout said nothing, is deaf, whether or not the queue is full: ended and restarted
//! (see Supervision), its requests in flight answered as on a crash ("… stopped reading its
//! stdin and was ended (…)"). A `notifications/cancelled` is not waited
//! for: one that finds the queue full is written by a task once there is room (within
//! 30 s), so it still reaches a child that reads again. taskgate's own answers to the child's
//! requests (a refusal, a `pong`) are never dropped: while they find the queue full, the
//! child's stdout waits unread (it is read at the pace the child reads its stdin; one that
//! takes nothing for `timeout_ms` meanwhile is deaf). A 2026-07-28 `subscriptions/listen` takes no
//! slot (it stays open until its client closes it); its notifications come back on its own
//! reply stream ([`conn`]). Processes: [`child`] (process group,
//! parent-death signal, close stdin → `SIGTERM` → `SIGKILL`; stderr to the log, target
//! `taskgate::upstream::stdio`, bounded in length and rate).
//!
//! [`Transport`]: super::Transport

pub mod child;
pub mod conn;
mod framing;
pub mod queue;
pub mod route;
pub mod shim;

use self::conn::{Conn, Registered, Streams};
use self::route::{SessionKey, TaskNote};
use super::{Exchange, Transport};
use crate::config::{ProcessMode, UpstreamConfig};
use crate::exchange::{Deadline, GatewayError, McpReply, McpRequest, Operation, ReplyBody, Tenant};
use crate::jsonrpc::{self, splice, Id, Kind, Message};
use crate::mcp::capabilities::ClientCapabilities;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::TaskStatus;
use crate::metrics::{Metrics, UpstreamErrorKind};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// Deaths announced and not yet handled by the gateway, at most (more wait for room).
pub const GONE_QUEUE: usize = 64;
/// A child that stayed up this long resets the restart back-off.
pub const SUSTAINED_UPTIME: Duration = Duration::from_secs(30);
/// The first restart's delay; doubled after each quick death, up to [`BACKOFF_MAX`].
pub const BACKOFF_START: Duration = Duration::from_millis(100);
/// The longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Client sessions of a shared child taskgate keeps at most (the least recently used goes).
pub const MAX_SHARED_SESSIONS: usize = 65_536;
/// Children of a `per_session` upstream at most, those still starting (in `initialize`)
/// counted (an `initialize` past it gets 503 with `Retry-After`, `-32603`).
pub const MAX_CHILDREN: usize = 256;
/// The default idle limit of a `per_session` child (the gateway passes
/// `gateway.session_idle_ms`).
pub const PER_SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// How long a `per_session` child given up for its principal's share while it had a live task
/// is kept once its last task ended and nothing is in flight on it (at most the idle limit):
/// its owner's `tasks/result` after the `tasks/get` that saw the task end still reaches it.
pub const RETIRED_GRACE: Duration = Duration::from_secs(5);
/// How often `per_session` children are looked at for the idle limit, at most (a shorter idle
/// limit is looked at four times per limit).
const RECLAIM_EVERY: Duration = Duration::from_secs(1);
/// The session key of taskgate's own requests to a shared child.
const OWN_SESSION: &str = "taskgate";

/// The protocol revision taskgate asks a shared child for.
const INITIALIZE_VERSION: &str = "2025-11-25";
/// The protocol revision of taskgate's `server/discover` probe; a child whose supported
/// versions are all this one or later is modern-only (never sent `initialize`).
const PROBE_VERSION: &str = "2026-07-28";

/// A child died: the tasks it ran died with it.
#[derive(Debug, Clone)]
pub struct ChildGone {
    /// The upstream's name.
    pub upstream: Arc<str>,
    /// `per_session`: the session whose child it was; shared: `None`.
    pub session: Option<String>,
    /// The tasks the child created, as taskgate saw their `CreateTaskResult` go by (at most
    /// [`route::MAX_NOTES`]; a child that created more has the notes of the tasks it reported
    /// ended forgotten first, then its oldest: the live ones, which its death fails, stay).
    pub tasks: Vec<String>,
    /// The gateway tasks (`upstream.tasks = "gateway"`) whose held calls were in flight on the
    /// child when it went (`exchange::HeldTask`): they died with it too. Their held call may
    /// have recorded them `failed` already (it saw its answer never come); they are released
    /// all the same.
    pub held: Vec<String>,
    /// When it was seen gone (ms since the epoch): tasks recorded after it are not its.
    pub at_ms: u64,
    /// Why, in words ("its child process exited (exit code 1)").
    pub why: String,
}

/// A shared child's state.
#[derive(Clone)]
enum State {
    Starting,
    Live(Arc<Conn>),
    Down(String),
    Stopped,
}

/// What a shared child answered to taskgate's `initialize`.
#[derive(Clone)]
enum Init {
    /// Its `result`, as JSON text.
    Answer(Arc<str>),
    /// It refused (an error): clients' `initialize` go to it.
    Refused,
    /// Modern-only (the era probe): it is never sent `initialize`; clients' are refused here
    /// with `-32022` naming its supported versions (a JSON array, as it answered them).
    Modern(Arc<str>),
}

/// What taskgate's `server/discover` probe found out about a new shared child.
#[derive(Debug, Clone, PartialEq)]
enum Probe {
    /// Every version it supports is [`PROBE_VERSION`] or later (the JSON array it named).
    ModernOnly(Arc<str>),
    /// It answered as a modern server that also supports a version with `initialize`.
    DualEra,
    /// Anything else: an error that is not a modern one, or no answer (why, in words).
    Legacy(String),
}

/// One client session.
struct Session {
    /// `per_session`: its child.
    conn: Option<Arc<Conn>>,
    /// `per_session`: ends its child.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    last_used: Instant,
    /// Whom its child counts against (`per_session`: the principal that initialized it,
    /// without auth its client address; see [`Tenant`]).
    tenant: Tenant,
    /// What its client declared in its `initialize` `capabilities`: the child's requests
    /// needing a capability it lacks never reach it (see [`conn`]).
    declared: ClientCapabilities,
    /// `per_session`: given up for its principal's share while its child had a live task
    /// ([`Inner::make_room_for`]): no longer counted in that share, its child kept until its
    /// tasks end, then ended after [`RETIRED_GRACE`] ([`Inner::reclaim_idle`]).
    retired: bool,
}

impl Session {
    /// `per_session`: whether its child has a task live (see [`Conn::has_live_task`]).
    fn has_live_task(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| c.has_live_task())
    }

    /// `per_session`: whether a request is in flight on its child.
    fn busy(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| c.in_flight() > 0)
    }
}

/// How many `per_session` children there may be (see [`StdioTransport::with_caps`]).
#[derive(Debug, Clone, Copy)]
pub struct ChildCaps {
    /// Children at most, those starting counted ([`MAX_CHILDREN`]).
    pub max_children: usize,
    /// Children one principal (without auth, one client address) holds at most
    /// (`limits.max_sessions_per_principal`); a new one past it ends that principal's own
    /// least recently used child. At or above `max_children`: only the cap rule holds.
    pub per_principal: usize,
}

impl ChildCaps {
    /// The caps of a gateway configured with `limits` and `gateway.max_sessions` =
    /// `max_sessions`: a principal's share is `limits.max_sessions_per_principal` when set;
    /// unset, the session table's default share (at least 100), but at most a quarter of
    /// [`MAX_CHILDREN`], so that without configuration one principal (one address without auth)
    /// cannot hold every child.
    pub fn for_config(limits: &crate::config::LimitsConfig, max_sessions: usize) -> ChildCaps {
        let per_principal = match limits.max_sessions_per_principal {
            Some(_) => limits.sessions_per_principal(max_sessions),
            None => limits
                .sessions_per_principal(max_sessions)
                .min(MAX_CHILDREN / 4),
        };
        ChildCaps {
            max_children: MAX_CHILDREN,
            per_principal,
        }
    }
}

impl Default for ChildCaps {
    fn default() -> Self {
        ChildCaps {
            max_children: MAX_CHILDREN,
            per_principal: MAX_CHILDREN,
        }
    }
}

struct Inner {
    name: Arc<str>,
    spec: child::Spec,
    mode: ProcessMode,
    metrics: Arc<Metrics>,
    timeout: Duration,
    timeout_ms: u64,
    /// `startup_timeout_ms`: a new child's budget for its `initialize` (taskgate's, or a
    /// `per_session` client's).
    startup: Duration,
    startup_ms: u64,
    max_message_bytes: usize,
    permits: Arc<Semaphore>,
    streams: Arc<Streams>,
    sessions: Mutex<HashMap<Arc<str>, Session>>,
    state: watch::Sender<State>,
    init: Mutex<Option<Init>>,
    /// Deaths, to the one taker of [`StdioHandle::deaths`]: bounded ([`GONE_QUEUE`]), and
    /// never dropped once taken (an announcer waits for room; see [`Inner::announce_gone`]).
    gone: mpsc::Sender<ChildGone>,
    /// The receiving end, until taken.
    gone_rx: Mutex<Option<mpsc::Receiver<ChildGone>>>,
    stop: watch::Sender<bool>,
    keepers: Mutex<Vec<JoinHandle<()>>>,
    idle: Duration,
    /// Tasks a dead shared child took with it (bounded, [`route::MAX_NOTES`]): their
    /// `tasks/get|result|cancel` are answered here, since the new child never knew them.
    dead: Mutex<route::Notes<String, DeadTask>>,
    /// `per_session`: asks the spawner task for a child (see [`Inner::spawner`]).
    spawner: Mutex<Option<tokio::sync::mpsc::Sender<Spawned>>>,
    /// `per_session`: children asked for and not yet kept as a session (starting, in
    /// `initialize`); counted against [`MAX_CHILDREN`] with the sessions (issue 31).
    starting: std::sync::atomic::AtomicUsize,
    /// `per_session`: the children starting, per tenant (entries only while some are; at most
    /// [`ChildCaps::max_children`] in all). Locked after `sessions`.
    starting_by: Mutex<HashMap<Tenant, usize>>,
    /// `per_session`: the bounds on children.
    caps: ChildCaps,
    /// Shared: the era the probe found, kept for later children (`None`: probe the next one).
    era: Mutex<Option<ChildEra>>,
    /// Requests waiting for a `max_in_flight` slot (not registered yet), by session and the
    /// client's id: how many, and whether the client cancelled one (then it is not sent). Only
    /// while they wait (at most `timeout_ms`); locked before a conn's routes.
    slot_waiters: Mutex<HashMap<WaiterKey, (usize, bool)>>,
}

/// A request waiting for a slot: its session and its client's id (JSON text).
type WaiterKey = (SessionKey, String);

/// A request's place in [`Inner::slot_waiters`] while it waits for a slot; left when it got
/// one ([`SlotWaiter::finish`]) or when its caller went away (dropped).
struct SlotWaiter {
    inner: Arc<Inner>,
    key: Option<WaiterKey>,
}

impl SlotWaiter {
    fn new(inner: &Arc<Inner>, key: WaiterKey) -> SlotWaiter {
        inner.slot_waiters.lock().entry(key.clone()).or_default().0 += 1;
        SlotWaiter {
            inner: inner.clone(),
            key: Some(key),
        }
    }

    /// Leaves the waiters (their lock held by the caller); true when the client cancelled it.
    fn finish(mut self, waiters: &mut HashMap<WaiterKey, (usize, bool)>) -> bool {
        self.key.take().is_some_and(|k| leave(waiters, &k))
    }
}

impl Drop for SlotWaiter {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            leave(&mut self.inner.slot_waiters.lock(), &key);
        }
    }
}

/// One waiter of `key` leaves; whether it was cancelled.
fn leave(waiters: &mut HashMap<WaiterKey, (usize, bool)>, key: &WaiterKey) -> bool {
    let Some(entry) = waiters.get_mut(key) else {
        return false;
    };
    entry.0 = entry.0.saturating_sub(1);
    let cancelled = entry.1;
    if entry.0 == 0 {
        waiters.remove(key);
    }
    cancelled
}

/// A shared child's era, as the probe found it.
#[derive(Clone)]
enum ChildEra {
    /// It takes `initialize` (legacy or dual-era, or it ignored or could not stand the probe).
    Initialize,
    /// Modern-only: never sent `initialize` (its supported versions, a JSON array).
    Modern(Arc<str>),
}

/// One `per_session` child counted as starting (for its tenant too), until dropped.
struct StartingSlot(Arc<Inner>, Tenant);

impl Drop for StartingSlot {
    fn drop(&mut self) {
        {
            let mut by = self.0.starting_by.lock();
            if let Some(n) = by.get_mut(&self.1) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by.remove(&self.1);
                }
            }
        }
        self.0
            .starting
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Where the spawner hands a started child.
type Spawned = tokio::sync::oneshot::Sender<std::io::Result<conn::Running>>;

/// A task whose child died.
struct DeadTask {
    note: TaskNote,
    why: Arc<str>,
}

/// The stdio transport of one `[[upstream]]` with a `command` (a [`Transport`]).
pub struct StdioTransport {
    inner: Arc<Inner>,
}

/// What the gateway keeps of a stdio upstream: readiness, deaths, shutdown.
#[derive(Clone)]
pub struct StdioHandle {
    inner: Arc<Inner>,
}

impl StdioTransport {
    /// The transport for a validated `command` upstream; a shared child is started at once
    /// (in the background, on the calling runtime). `idle` ends `per_session` children
    /// unused that long. `None` for a `url` upstream.
    pub fn new(
        config: &UpstreamConfig,
        metrics: Arc<Metrics>,
        idle: Duration,
    ) -> Option<StdioTransport> {
        StdioTransport::with_caps(config, metrics, idle, ChildCaps::default())
    }

    /// [`StdioTransport::new`], with `per_session` children bounded by `caps` (the gateway
    /// passes `limits.max_sessions_per_principal`).
    pub fn with_caps(
        config: &UpstreamConfig,
        metrics: Arc<Metrics>,
        idle: Duration,
        caps: ChildCaps,
    ) -> Option<StdioTransport> {
        let spec = child::Spec::of(config)?;
        let (gone, gone_rx) = mpsc::channel(GONE_QUEUE);
        let inner = Arc::new(Inner {
            name: config.name.as_str().into(),
            spec,
            mode: config.process,
            metrics,
            timeout: Duration::from_millis(config.timeout_ms),
            timeout_ms: config.timeout_ms,
            startup: Duration::from_millis(config.startup_timeout_ms),
            startup_ms: config.startup_timeout_ms,
            max_message_bytes: config.max_message_bytes,
            permits: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            streams: Arc::new(Streams::default()),
            sessions: Mutex::new(HashMap::new()),
            state: watch::Sender::new(State::Starting),
            init: Mutex::new(None),
            gone,
            gone_rx: Mutex::new(Some(gone_rx)),
            stop: watch::Sender::new(false),
            keepers: Mutex::new(Vec::new()),
            idle,
            dead: Mutex::new(route::Notes::default()),
            spawner: Mutex::new(None),
            starting: std::sync::atomic::AtomicUsize::new(0),
            starting_by: Mutex::new(HashMap::new()),
            caps: ChildCaps {
                max_children: caps.max_children.max(1),
                per_principal: caps.per_principal.max(1),
            },
            era: Mutex::new(None),
            slot_waiters: Mutex::new(HashMap::new()),
        });
        let keeper = match inner.mode {
            ProcessMode::Shared => tokio::spawn(inner.clone().supervise()),
            ProcessMode::PerSession => {
                let (tx, rx) = tokio::sync::mpsc::channel(16);
                *inner.spawner.lock() = Some(tx);
                let spawner = tokio::spawn(inner.clone().spawner(rx));
                inner.keepers.lock().push(spawner);
                tokio::spawn(inner.clone().reclaim_idle())
            }
        };
        inner.keepers.lock().push(keeper);
        Some(StdioTransport { inner })
    }

    /// Readiness, deaths and shutdown of this upstream, for the gateway.
    pub fn handle(&self) -> StdioHandle {
        StdioHandle {
            inner: self.inner.clone(),
        }
    }
}

impl StdioHandle {
    /// `Ok` while a shared child is live (a `per_session` upstream is always ready: its
    /// children start with sessions); else why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.inner.mode == ProcessMode::PerSession {
            return Ok(());
        }
        match &*self.inner.state.borrow() {
            State::Live(c) if !c.is_closed() => Ok(()),
            State::Live(_) => Err("its child process exited; restarting".into()),
            State::Starting => Err("its child process is starting".into()),
            State::Down(why) => Err(format!("no live child: {why}")),
            State::Stopped => Err("stopped".into()),
        }
    }

    /// Child deaths, as they happen, every one (none is dropped: an announcer waits for room
    /// while the queue is full). Taken once: `None` after the first call.
    pub fn deaths(&self) -> Option<mpsc::Receiver<ChildGone>> {
        self.inner.gone_rx.lock().take()
    }

    /// The child's task status notifications that no client's GET stream took, for the
    /// registry to observe (`conn::Streams::unseen_status`). Taken once: `None` after the
    /// first call.
    pub fn unseen_statuses(&self) -> Option<mpsc::Receiver<Bytes>> {
        self.inner.streams.unseen_statuses()
    }

    /// The upstream's name.
    pub fn name(&self) -> &Arc<str> {
        &self.inner.name
    }

    /// Ends every child of this upstream (close stdin, `SIGTERM`, `SIGKILL`; see [`child`])
    /// and stops restarting them; returns once they are gone.
    pub async fn shutdown(&self) {
        self.inner.stop.send_replace(true);
        let stops: Vec<_> = self
            .inner
            .sessions
            .lock()
            .values_mut()
            .filter_map(|s| s.stop.take())
            .collect();
        for stop in stops {
            let _ = stop.send(());
        }
        let keepers = std::mem::take(&mut *self.inner.keepers.lock());
        let bound = child::STDIN_GRACE + child::TERM_GRACE + Duration::from_secs(2);
        let _ = tokio::time::timeout(bound, futures_util::future::join_all(keepers)).await;
    }
}

impl Transport for StdioTransport {
    fn name(&self) -> &Arc<str> {
        &self.inner.name
    }

    fn exchange(self: Arc<Self>, req: McpRequest) -> Exchange {
        let inner = self.inner.clone();
        Box::pin(async move { inner.exchange(req).await })
    }

    fn traced_exchange(self: Arc<Self>, req: McpRequest, span: super::ClientSpan) -> Exchange {
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut result = inner.exchange(req).await;
            span.end(&mut result);
            result
        })
    }
}

impl Inner {
    async fn exchange(self: &Arc<Self>, req: McpRequest) -> Result<McpReply, GatewayError> {
        let deadline = req.deadline();
        let era = req.era();
        let held = req.held_task();
        let tenant = req.ctx.tenant();
        let session: SessionKey = req
            .ctx
            .session_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(Arc::from);
        match req.into_parts().op {
            Operation::EndSession => Ok(self.end_session(session)),
            Operation::OpenStream => Ok(self.open_stream(session)),
            Operation::Post(msg) => self.post(msg, session, deadline, era, held, tenant).await,
        }
    }

    async fn post(
        self: &Arc<Self>,
        msg: Message,
        session: SessionKey,
        deadline: Deadline,
        era: Era,
        held: Option<Arc<str>>,
        tenant: Tenant,
    ) -> Result<McpReply, GatewayError> {
        let kind = msg.kind();
        if kind == Kind::Request && msg.method() == Some("initialize") {
            return match self.mode {
                ProcessMode::Shared => self.initialize_shared(msg, deadline).await,
                ProcessMode::PerSession => self.initialize_per_session(msg, deadline, tenant).await,
            };
        }
        let conn = match self.conn_for(&session, msg.id()).await? {
            Ok(conn) => conn,
            Err(reply) => return Ok(reply),
        };
        match kind {
            Kind::Request => {
                let out = Outgoing {
                    msg,
                    session,
                    deadline,
                    era,
                    held,
                };
                self.call(&conn, out, self.timeout).await
            }
            Kind::Notification => {
                self.notify(&conn, msg, &session).await?;
                Ok(McpReply::accepted())
            }
            Kind::Response | Kind::Error => {
                // A client's answer to the child's request: only from the session asked.
                if let Some(id) = msg.id() {
                    if conn.answered_by(id, &session) {
                        self.write(&conn, msg.bytes(), true).await?;
                    }
                }
                Ok(McpReply::accepted())
            }
        }
    }

    /// The child `session`'s messages go to; `Ok(Err(reply))` when the session is unknown
    /// (404, as a Streamable HTTP server answers a session it does not hold).
    async fn conn_for(
        self: &Arc<Self>,
        session: &SessionKey,
        id: Option<&Id>,
    ) -> Result<Result<Arc<Conn>, McpReply>, GatewayError> {
        if let Some(s) = session {
            let mut sessions = self.sessions.lock();
            match sessions.get_mut(s) {
                Some(entry) => {
                    entry.last_used = Instant::now();
                    if let Some(conn) = &entry.conn {
                        return Ok(Ok(conn.clone()));
                    }
                }
                None => return Ok(Err(session_not_found(id))),
            }
        } else if self.mode == ProcessMode::PerSession {
            return Ok(Err(session_not_found(id)));
        }
        self.live().await.map(Ok)
    }

    /// The shared child, once live: waits while one is starting (within `timeout_ms`);
    /// errors at once while none runs.
    async fn live(&self) -> Result<Arc<Conn>, GatewayError> {
        let mut rx = self.state.subscribe();
        let wait = rx.wait_for(|s| !matches!(s, State::Starting));
        let state = match tokio::time::timeout(self.timeout, wait).await {
            Ok(Ok(s)) => s.clone(),
            Ok(Err(_)) => State::Stopped,
            Err(_) => return Err(self.unreachable("its child process is still starting".into())),
        };
        match state {
            State::Live(conn) if !conn.is_closed() => Ok(conn),
            State::Live(conn) => Err(self.unreachable(conn.why_closed().unwrap_or_default())),
            State::Down(why) => {
                Err(self.unreachable(format!("no child process is running ({why}); restarting")))
            }
            State::Stopped | State::Starting => Err(GatewayError::ShuttingDown),
        }
    }

    /// A request: written under taskgate's id, answered under the caller's (a 2026-07-28
    /// request's JSON-RPC error with the HTTP status its transport prescribes), within `budget`
    /// (`timeout_ms`, or a new child's start-up budget for its first request).
    async fn call(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        out: Outgoing,
        budget: Duration,
    ) -> Result<McpReply, GatewayError> {
        let Outgoing {
            msg,
            session,
            deadline,
            era,
            held,
        } = out;
        let method = msg.method().unwrap_or_default().to_string();
        // One deadline for the wait for a slot, the write and the answer: a request that got
        // its slot late has what is left of `timeout_ms`, not a whole one more.
        let until = tokio::time::Instant::now() + budget;
        // Only once a new child is live: by then the gateway has failed the dead child's tasks
        // with both audit facts (`ChildGone`); an answer here before that would be recorded as
        // a plain `failed`, and the death then skip the task (terminal already).
        if let Some(reply) = self.dead_task_answer(&msg, &method, era) {
            return Ok(reply);
        }
        let urgent = method == "tasks/cancel";
        // A cancel must overtake; a `tasks/result` (no deadline: it waits for its task's end)
        // must not hold a slot for as long as a task runs, nor a 2026-07-28
        // `subscriptions/listen` (open until its client closes it).
        let needs_slot =
            !(urgent || deadline == Deadline::Unbounded || method == "subscriptions/listen");
        // While it waits for a slot, a client's `notifications/cancelled` for it is kept (it is
        // not registered yet): cancelled, it is not sent at all.
        let waiter = match (needs_slot, msg.id()) {
            (true, Some(id)) => Some(SlotWaiter::new(
                self,
                (session.clone(), id.as_json().to_string()),
            )),
            _ => None,
        };
        let permit = if needs_slot {
            Some(self.permit(until).await?)
        } else {
            None
        };
        let task_call = method == "tools/call";
        let reg = {
            let mut waiters = self.slot_waiters.lock();
            if waiter.is_some_and(|w| w.finish(&mut waiters)) {
                return Ok(McpReply::local_json(jsonrpc::error_response(
                    msg.id(),
                    jsonrpc::INTERNAL_ERROR,
                    &format!(
                        "cancelled by the client before it was sent to upstream `{}`",
                        self.name
                    ),
                )));
            }
            // Registered under the waiters' lock: a cancellation finds it waiting or in flight.
            let declared = self.declared_by(&session, &msg);
            conn.register(&msg, session, declared, permit, task_call, held)
                .map_err(|why| self.unreachable(why))?
        };
        // Never written (the child is gone, or its stdin queue stayed full, or the caller went
        // away while it waited for room: `reg` dropped unqueued): the child does not know it,
        // so it is not told it is cancelled either.
        if let Err(e) = self
            .write_until(conn.write_request(&reg, urgent), until)
            .await
        {
            conn.forget(reg.out);
            return Err(e);
        }
        conn.queued(reg.out);
        let client_id = msg.id().cloned();
        self.reply(conn.clone(), reg, client_id, method, deadline, until, era)
            .await
    }

    /// A `max_in_flight` slot, waited for until `until` at most.
    async fn permit(
        &self,
        until: tokio::time::Instant,
    ) -> Result<OwnedSemaphorePermit, GatewayError> {
        match tokio::time::timeout_at(until, self.permits.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(_)) => Err(GatewayError::ShuttingDown),
            Err(_) => Err(self.timeout_error()),
        }
    }

    /// The reply to a written request: its answer as JSON, or, when related messages come
    /// first (progress, a server→client request), an SSE stream of them ending with it.
    /// `until`: the request's deadline (unless [`Deadline::Unbounded`]).
    #[allow(clippy::too_many_arguments)]
    async fn reply(
        self: &Arc<Self>,
        conn: Arc<Conn>,
        mut reg: Registered,
        client_id: Option<Id>,
        method: String,
        deadline: Deadline,
        until: tokio::time::Instant,
        era: Era,
    ) -> Result<McpReply, GatewayError> {
        let mut timer = match deadline {
            Deadline::Head | Deadline::Exchange => Some(Box::pin(tokio::time::sleep_until(until))),
            Deadline::Unbounded => None,
        };
        // Related messages first: the child sent them before its answer (one reader, in
        // order), so when both are there the reply is a stream of them, then the answer.
        let first = tokio::select! {
            biased;
            Some(first) = reg.related.recv() => first,
            answer = &mut reg.answer => {
                return match answer {
                    Ok(Ok(bytes)) => Ok(answered(bytes, era)),
                    Ok(Err(why)) => Err(self.unreachable(why)),
                    Err(_) => Err(self.unreachable("its child process is gone".into())),
                };
            }
            () = async { match timer.as_mut() { Some(t) => t.await, None => std::future::pending().await } } => {
                conn.give_up(reg.out, "taskgate: the request timed out");
                return Err(self.timeout_error());
            }
        };
        let give_up = match deadline {
            Deadline::Exchange => timer,
            _ => None,
        };
        let events = ReplyEvents {
            first: Some(first),
            reg,
            conn,
            client_id,
            method,
            give_up,
            name: self.name.clone(),
            timeout_ms: self.timeout_ms,
            done: false,
        };
        let stream = futures_util::stream::unfold(events, |mut ev| async move {
            ev.next().await.map(|e| (e, ev))
        });
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        Ok(McpReply::new(
            StatusCode::OK,
            headers,
            ReplyBody::Stream(Box::pin(stream)),
        ))
    }

    /// A client notification: `notifications/cancelled` names the id the child saw;
    /// `notifications/initialized` reached a shared child from taskgate already (or, to a
    /// modern-only child, has no place: rmcp's stdio server stops serving on a notification
    /// before its first request).
    async fn notify(
        &self,
        conn: &Arc<Conn>,
        msg: Message,
        session: &SessionKey,
    ) -> Result<(), GatewayError> {
        match msg.method() {
            Some("notifications/initialized")
                if self.mode == ProcessMode::Shared
                    && matches!(*self.init.lock(), Some(Init::Answer(_) | Init::Modern(_))) =>
            {
                Ok(())
            }
            Some("notifications/cancelled") => {
                let theirs = splice::raw_at(msg.bytes(), &["params", "requestId"])
                    .ok()
                    .flatten()
                    .and_then(|raw| Id::from_json(raw.get()));
                let Some(theirs) = theirs else {
                    return Ok(());
                };
                let out = {
                    let mut waiters = self.slot_waiters.lock();
                    let key = (session.clone(), theirs.as_json().to_string());
                    if let Some(waiting) = waiters.get_mut(&key) {
                        // Still waiting for a slot: it will not be sent.
                        waiting.1 = true;
                        return Ok(());
                    }
                    conn.tell_cancelled_id(session, &theirs)
                };
                let Some(out) = out else {
                    // Not in flight here (answered already, or not this caller's): nothing
                    // the child could stop; or the child was told already.
                    return Ok(());
                };
                let Some(bytes) =
                    splice::replace(msg.bytes(), &["params", "requestId"], &out.to_string())
                        .ok()
                        .flatten()
                else {
                    return Ok(());
                };
                if conn.is_closed() {
                    return Err(self.unreachable(conn.why_closed().unwrap_or_default()));
                }
                // Not waited for (its request is marked told: it must not be dropped when the
                // queue is full, nor hold its caller); held while its request waits for room.
                conn.cancel_from_client(out, bytes);
                Ok(())
            }
            _ => self.write(conn, msg.bytes(), false).await,
        }
    }

    /// A shared child's `initialize`: the kept answer under the client's id, with a session
    /// of its own; a child that refused it gets the client's.
    async fn initialize_shared(
        self: &Arc<Self>,
        msg: Message,
        deadline: Deadline,
    ) -> Result<McpReply, GatewayError> {
        let conn = self.live().await?;
        let init = self.init.lock().clone();
        match (init, msg.id()) {
            (Some(Init::Answer(result)), Some(id)) => {
                let Some(session) = new_session_id() else {
                    return Err(self.unreachable("no session id could be drawn".into()));
                };
                self.keep_session(
                    session.clone(),
                    None,
                    None,
                    Tenant::Unknown,
                    initialize_declares(&msg),
                );
                Ok(with_session(
                    McpReply::local_json(jsonrpc::result_response(id, &result)),
                    &session,
                ))
            }
            (Some(Init::Modern(supported)), id) => Ok(refuse_initialize(&msg, id, &supported)),
            _ => {
                let out = Outgoing::initialize(msg, deadline);
                self.call(&conn, out, self.timeout).await
            }
        }
    }

    /// A `per_session` `initialize`: a child of its own, the client's `initialize` forwarded.
    /// `tenant`'s children are bounded first ([`Inner::make_room_for`]).
    async fn initialize_per_session(
        self: &Arc<Self>,
        msg: Message,
        deadline: Deadline,
        tenant: Tenant,
    ) -> Result<McpReply, GatewayError> {
        if *self.stop.borrow() {
            return Err(GatewayError::ShuttingDown);
        }
        // Children starting count with the sessions' (checked and counted under one lock).
        let slot = {
            let mut sessions = self.sessions.lock();
            match self.make_room_for(&mut sessions, &tenant) {
                Ok(None) => {}
                Ok(Some(key)) => self.streams.close(&key),
                Err(why) => return Ok(overloaded(msg.id(), why)),
            }
            self.starting
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            *self.starting_by.lock().entry(tenant.clone()).or_default() += 1;
            StartingSlot(self.clone(), tenant.clone())
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let asked = self.spawner.lock().as_ref().map(|s| s.try_send(tx).is_ok());
        if asked != Some(true) {
            return Ok(overloaded(
                msg.id(),
                format!(
                    "upstream `{}`: too many children are starting at once",
                    self.name
                ),
            ));
        }
        let mut running = match rx.await {
            Ok(Ok(running)) => running,
            Ok(Err(e)) => {
                let program = std::ffi::OsStr::new(&self.spec.program);
                let why = format!("{}: {}", conn::NOT_STARTED, shim::not_started(program, &e));
                return Err(self.unreachable(why));
            }
            Err(_) => return Err(GatewayError::ShuttingDown),
        };
        let conn = running.conn.clone();
        let declared = initialize_declares(&msg);
        // A new child's first request: the start-up budget (tester 3 F21: a cold `npx -y`).
        let answer = self
            .call(&conn, Outgoing::initialize(msg, deadline), self.startup)
            .await;
        let session = match &answer {
            Ok(McpReply {
                body: ReplyBody::Json(b),
                ..
            }) if is_result(b) => new_session_id(),
            _ => None,
        };
        let Some(session) = session else {
            // Refused, not answered, or the child died during it: the child goes, the client
            // gets the child's error or one naming the upstream.
            let _ = running.stop.send(());
            let _ = (&mut running.exited).await;
            return match answer {
                Err(GatewayError::UpstreamUnreachable { upstream, detail }) => {
                    Err(GatewayError::UpstreamUnreachable {
                        upstream,
                        detail: format!("during initialize: {detail}"),
                    })
                }
                Ok(reply) if is_answer(&reply) => Ok(reply),
                Ok(_) => Err(self.unreachable("no session id could be drawn".into())),
                Err(e) => Err(e),
            };
        };
        let conn_for_tasks = conn.clone();
        conn.owned_by(session.clone(), declared);
        self.keep_session(
            session.clone(),
            Some(conn),
            Some(running.stop),
            tenant,
            declared,
        );
        // Counted as a session now.
        drop(slot);
        let (inner, key) = (self.clone(), session.clone());
        let mut stop_rx = self.stop.subscribe();
        let exited = running.exited;
        let watcher = tokio::spawn(async move {
            tokio::pin!(exited);
            let why = tokio::select! {
                why = &mut exited => why.unwrap_or_default(),
                _ = stopped(&mut stop_rx) => {
                    let stop = inner.sessions.lock().get_mut(&key).and_then(|s| s.stop.take());
                    if let Some(stop) = stop {
                        let _ = stop.send(());
                    }
                    exited.await.unwrap_or_default()
                }
            };
            inner.sessions.lock().remove(&key);
            inner.streams.close(&key);
            let tasks = conn_for_tasks
                .take_tasks()
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            let held = conn_for_tasks.take_held();
            inner
                .announce_gone(Some(key.to_string()), tasks, held, why)
                .await;
        });
        self.keepers.lock().push(watcher);
        self.keepers.lock().retain(|k| !k.is_finished());
        answer.map(|reply| with_session(reply, &session))
    }

    /// `per_session`, under the sessions' lock: room for one more child of `tenant`. A tenant
    /// holding [`ChildCaps::per_principal`] children (those starting counted) has its least
    /// recently used session ended, as a `DELETE` ends it (its child is stopped; whether or
    /// not a request is in flight on it, as the session table reclaims a principal's least
    /// recently used session); at [`ChildCaps::max_children`], a tenant's least recently used
    /// idle one (nothing in flight on its child) is. Never another tenant's, nor for
    /// [`Tenant::Unknown`] (callers not told apart). Returns the session ended, if one was
    /// (its streams are the caller's to close), or why there is no room (the cap is reached
    /// and the tenant has no idle child to give up, or its share is all still starting).
    fn make_room_for(
        &self,
        sessions: &mut HashMap<Arc<str>, Session>,
        tenant: &Tenant,
    ) -> Result<Option<Arc<str>>, String> {
        let starting = self.starting.load(std::sync::atomic::Ordering::Acquire);
        let max = self.caps.max_children;
        let full = sessions.len() + starting >= max;
        let refusal = || {
            format!(
                "upstream `{}` runs {max} sessions (one child process each, those starting counted) already",
                self.name
            )
        };
        if *tenant == Tenant::Unknown {
            return if full { Err(refusal()) } else { Ok(None) };
        }
        let own_starting = self.starting_by.lock().get(tenant).copied().unwrap_or(0);
        let own = sessions
            .values()
            .filter(|s| s.tenant == *tenant && !s.retired)
            .count()
            + own_starting;
        let over_share =
            self.caps.per_principal < self.caps.max_children && own >= self.caps.per_principal;
        if !over_share && !full {
            return Ok(None);
        }
        // At the cap a process must go: one without a live task (tester 3 F22: a DELETE keeps
        // it), over the share a session in flight too, else an idle one. Over the share alone,
        // the least recently used session goes from the share, its child kept while it has a
        // live task (retired), as a DELETE with live tasks is deferred.
        let candidate = |s: &Session| {
            s.tenant == *tenant
                && if full {
                    !s.has_live_task() && ((over_share && !s.retired) || !s.busy())
                } else {
                    !s.retired
                }
        };
        let lru = sessions
            .iter()
            .filter(|(_, s)| candidate(s))
            .min_by_key(|(_, s)| s.last_used)
            .map(|(k, _)| k.clone());
        let Some(key) = lru else {
            return Err(if full {
                refusal()
            } else {
                format!(
                    "upstream `{}`: this principal's {} sessions (one child process each) are all still starting",
                    self.name, self.caps.per_principal
                )
            });
        };
        if !full {
            if let Some(entry) = sessions.get_mut(&key).filter(|s| s.has_live_task()) {
                entry.retired = true;
                tracing::info!(
                    upstream = %self.name,
                    "a principal's new per_session child: its least recently used session ends, its child kept until its live tasks end"
                );
                return Ok(Some(key));
            }
        }
        if let Some(mut entry) = sessions.remove(&key) {
            if let Some(stop) = entry.stop.take() {
                let _ = stop.send(());
            }
        }
        tracing::info!(
            upstream = %self.name,
            "a principal's new per_session child: its least recently used one is ended"
        );
        Ok(Some(key))
    }

    fn keep_session(
        &self,
        session: Arc<str>,
        conn: Option<Arc<Conn>>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        tenant: Tenant,
        declared: ClientCapabilities,
    ) {
        let mut sessions = self.sessions.lock();
        if self.mode == ProcessMode::Shared && sessions.len() >= MAX_SHARED_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                sessions.remove(&k);
                self.streams.close(&k);
            }
        }
        sessions.insert(
            session,
            Session {
                conn,
                stop,
                last_used: Instant::now(),
                tenant,
                declared,
                retired: false,
            },
        );
    }

    /// What the client behind `msg` declared: its session's `initialize` capabilities, or a
    /// 2026-07-28 request's own (`_meta["io.modelcontextprotocol/clientCapabilities"]`).
    fn declared_by(&self, session: &SessionKey, msg: &Message) -> ClientCapabilities {
        match session {
            Some(s) => self
                .sessions
                .lock()
                .get(s)
                .map(|e| e.declared)
                .unwrap_or_default(),
            None => declared_at(
                msg,
                &[
                    "params",
                    "_meta",
                    "io.modelcontextprotocol/clientCapabilities",
                ],
            ),
        }
    }

    /// `DELETE`: the session ends (`per_session`: its child too).
    fn end_session(&self, session: SessionKey) -> McpReply {
        let Some(s) = session else {
            return status_reply(StatusCode::BAD_REQUEST);
        };
        let Some(mut entry) = self.sessions.lock().remove(&s) else {
            return status_reply(StatusCode::NOT_FOUND);
        };
        self.streams.close(&s);
        if let Some(stop) = entry.stop.take() {
            let _ = stop.send(());
        }
        status_reply(StatusCode::OK)
    }

    /// `GET`: the session's stream of the child's messages for it.
    fn open_stream(&self, session: SessionKey) -> McpReply {
        let Some(s) = session else {
            return status_reply(StatusCode::METHOD_NOT_ALLOWED);
        };
        if !self.sessions.lock().contains_key(&s) {
            return session_not_found(None);
        }
        let rx = self.streams.open(s.clone());
        McpReply::events(rx.into_stream(), None)
    }

    /// The shared child's life: start, initialize, wait for its end, back off, again.
    async fn supervise(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        let mut backoff = Backoff::default();
        let mut first = true;
        loop {
            if *stop.borrow() {
                break;
            }
            if !first {
                self.metrics.upstream_restart(&self.name);
            }
            first = false;
            self.state.send_replace(State::Starting);
            let started = Instant::now();
            let child = match self.spec.spawn() {
                Ok(c) => c,
                Err(e) => {
                    let program = std::ffi::OsStr::new(&self.spec.program);
                    let why = format!("{}: {}", conn::NOT_STARTED, shim::not_started(program, &e));
                    tracing::error!(target: "taskgate::upstream::stdio", upstream = %self.name, "{why}");
                    self.state.send_replace(State::Down(why));
                    if !backoff.wait(&mut stop).await {
                        break;
                    }
                    continue;
                }
            };
            let mut running = Conn::start(
                self.name.clone(),
                child,
                self.max_message_bytes,
                self.streams.clone(),
                self.metrics.clone(),
                conn::Owner::Every,
                self.timeout,
            );
            tracing::info!(target: "taskgate::upstream::stdio", upstream = %self.name, pid = ?running.pid, "child started");
            let init = tokio::select! {
                init = self.open_child(&running.conn) => init,
                _ = stopped(&mut stop) => Err("stopping".into()),
            };
            match init {
                Ok(init) => {
                    *self.init.lock() = Some(init);
                    self.state.send_replace(State::Live(running.conn.clone()));
                }
                Err(why) => {
                    let _ = running.stop.send(());
                    let ended = (&mut running.exited).await.unwrap_or_default();
                    if *stop.borrow() {
                        break;
                    }
                    // A command that could not be started is that, not a failed initialize.
                    let why = if ended.starts_with(conn::NOT_STARTED) {
                        ended
                    } else {
                        format!("its initialize failed: {why}; {ended}")
                    };
                    tracing::warn!(target: "taskgate::upstream::stdio", upstream = %self.name, "{why}");
                    self.state.send_replace(State::Down(why));
                    if !backoff.wait(&mut stop).await {
                        break;
                    }
                    continue;
                }
            }
            let why = tokio::select! {
                why = &mut running.exited => why.unwrap_or_default(),
                _ = stopped(&mut stop) => {
                    let _ = running.stop.send(());
                    let _ = (&mut running.exited).await;
                    break;
                }
            };
            self.state.send_replace(State::Down(why.clone()));
            let tasks = self.bury(&running.conn, &why);
            let held = running.conn.take_held();
            self.announce_gone(None, tasks, held, why).await;
            if started.elapsed() >= SUSTAINED_UPTIME {
                backoff = Backoff::default();
            }
            if !backoff.wait(&mut stop).await {
                break;
            }
        }
        self.state.send_replace(State::Stopped);
    }

    /// A new shared child's opening: the era probe ([`Inner::probe`]; see the module docs)
    /// unless an earlier child's era is known, then, unless it is modern-only, taskgate's
    /// `initialize`.
    async fn open_child(&self, conn: &Arc<Conn>) -> Result<Init, String> {
        let known = self.era.lock().clone();
        let era = match known {
            Some(era) => era,
            None => {
                let era = match self.probe(conn).await {
                    Ok(Probe::ModernOnly(supported)) => {
                        tracing::info!(target: "taskgate::upstream::stdio", upstream = %self.name, supported = %supported, "the child is modern-only (server/discover): it is never sent initialize");
                        ChildEra::Modern(supported)
                    }
                    Ok(Probe::DualEra) => {
                        tracing::info!(target: "taskgate::upstream::stdio", upstream = %self.name, "the child is dual-era (server/discover): initialized for 2025 clients");
                        ChildEra::Initialize
                    }
                    Ok(Probe::Legacy(why)) => {
                        tracing::info!(target: "taskgate::upstream::stdio", upstream = %self.name, "server/discover: {why}; a legacy child, initialized");
                        ChildEra::Initialize
                    }
                    Err(why) => {
                        *self.era.lock() = Some(ChildEra::Initialize);
                        return Err(format!(
                            "during taskgate's server/discover probe: {why} (its next child is initialized without one)"
                        ));
                    }
                };
                *self.era.lock() = Some(era.clone());
                era
            }
        };
        if let ChildEra::Modern(supported) = era {
            return Ok(Init::Modern(supported));
        }
        let init = self.initialize_child(conn).await;
        if matches!(init, Ok(Init::Refused)) {
            // Not the era it was taken for: the next child is probed again.
            *self.era.lock() = None;
        }
        init
    }

    /// taskgate's `server/discover` to a new shared child, before anything else: what it
    /// answers within `timeout_ms` says its era. `Err` when the child died (or its pipes
    /// closed) meanwhile.
    async fn probe(&self, conn: &Arc<Conn>) -> Result<Probe, String> {
        let request = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 0,
            "method": "server/discover",
            "params": { "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROBE_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": { "name": "taskgate", "version": env!("CARGO_PKG_VERSION") },
            } },
        });
        let mut reg = write_own_request(conn, &request).await?;
        // `timeout_ms`, not the start-up budget: a legacy server that ignores the probe would
        // cost that long at every first start. A child slower than it is taken for a legacy
        // one and gets `initialize` (within the budget); a modern-only one then refuses it,
        // and its restart is probed again.
        match tokio::time::timeout(self.timeout, &mut reg.answer).await {
            Ok(Ok(Ok(bytes))) => Ok(classify_probe(&bytes)),
            Ok(Ok(Err(why))) => Err(why),
            Ok(Err(_)) => Err("its child process is gone".into()),
            // `reg` goes: its route is freed; the child is not told (nothing before
            // `initialize` but the probe itself).
            Err(_) => Ok(Probe::Legacy(format!(
                "no answer within {} ms",
                self.timeout_ms
            ))),
        }
    }

    /// taskgate's own `initialize` and `notifications/initialized` to a new shared child.
    async fn initialize_child(&self, conn: &Arc<Conn>) -> Result<Init, String> {
        let request = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": INITIALIZE_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "taskgate", "version": env!("CARGO_PKG_VERSION") },
            },
        });
        let mut reg = write_own_request(conn, &request).await?;
        let answer = match tokio::time::timeout(self.startup, &mut reg.answer).await {
            Ok(Ok(Ok(bytes))) => bytes,
            Ok(Ok(Err(why))) => return Err(why),
            Ok(Err(_)) => return Err("its child process is gone".into()),
            Err(_) => {
                conn.give_up(reg.out, "taskgate: initialize timed out");
                return Err(format!(
                    "no answer within startup_timeout_ms ({} ms)",
                    self.startup_ms
                ));
            }
        };
        let result = splice::raw_at(&answer, &["result"])
            .ok()
            .flatten()
            .map(|r| Arc::<str>::from(r.get()));
        let Some(result) = result else {
            tracing::info!(target: "taskgate::upstream::stdio", upstream = %self.name, "the child refused initialize: clients' initialize go to it");
            return Ok(Init::Refused);
        };
        conn.write(
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            false,
        )
        .await?;
        Ok(Init::Answer(result))
    }

    /// `per_session`: starts the children, on the runtime (and so the thread) that built the
    /// transport, not on the serving thread whose request asked: the parent-death signal
    /// follows the thread that forked (`child`), and a serving thread ends at shutdown before
    /// the children are ended in order (stdin, `SIGTERM`, `SIGKILL`). The child's reader,
    /// writer and keeper run here too.
    async fn spawner(self: Arc<Self>, mut asks: tokio::sync::mpsc::Receiver<Spawned>) {
        let mut stop = self.stop.subscribe();
        loop {
            let reply = tokio::select! {
                Some(reply) = asks.recv() => reply,
                _ = stopped(&mut stop) => return,
                else => return,
            };
            let started = self.spec.spawn().map(|child| {
                let mut running = Conn::start(
                    self.name.clone(),
                    child,
                    self.max_message_bytes,
                    self.streams.clone(),
                    self.metrics.clone(),
                    conn::Owner::NotYet,
                    self.timeout,
                );
                // Shutdown waits for the child's end (the keeper), not only for the session.
                let keeper = std::mem::replace(&mut running.keeper, tokio::spawn(async {}));
                let mut keepers = self.keepers.lock();
                keepers.retain(|k| !k.is_finished());
                keepers.push(keeper);
                running
            });
            if let Err(Ok(running)) = reply.send(started) {
                // The asker is gone: the child goes too.
                let _ = running.stop.send(());
            }
        }
    }

    /// `per_session`: ends children idle longer than `idle` (a retired one, [`Session::retired`],
    /// [`RETIRED_GRACE`] at most).
    async fn reclaim_idle(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        let every = (self.idle / 4).clamp(Duration::from_millis(50), RECLAIM_EVERY);
        let retired_grace = self.idle.min(RETIRED_GRACE);
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = stopped(&mut stop) => return,
            }
            let now = Instant::now();
            let stops: Vec<_> = self
                .sessions
                .lock()
                .values_mut()
                .filter_map(|s| {
                    // A child answering a request is not idle (a call longer than the idle
                    // limit, a gateway task's held call, whose polls never reach the child),
                    // nor one running a task of its own (tester 3 F22: its owner may poll it
                    // less often than the idle limit, and a DELETE keeps it too): its idle time
                    // starts once nothing is in flight and no task is live.
                    if s.busy() || s.has_live_task() {
                        s.last_used = now;
                        return None;
                    }
                    let limit = if s.retired { retired_grace } else { self.idle };
                    if now.duration_since(s.last_used) < limit {
                        return None;
                    }
                    s.stop.take()
                })
                .collect();
            for stop in stops {
                let _ = stop.send(());
            }
        }
    }

    /// The tasks of a dead shared child, kept for [`Inner::dead_task_answer`]; returns their
    /// ids.
    fn bury(&self, conn: &Conn, why: &str) -> Vec<String> {
        let why: Arc<str> = format!(
            "upstream `{}` restarted: {why}; the task's state was lost",
            self.name
        )
        .into();
        let mut dead = self.dead.lock();
        let tasks = conn.take_tasks();
        let ids = tasks.iter().map(|(id, _)| id.clone()).collect();
        for (task_id, note) in tasks {
            dead.insert(
                task_id,
                DeadTask {
                    note,
                    why: why.clone(),
                },
            );
        }
        ids
    }

    /// taskgate's answer to `tasks/get|result|cancel` of a task a dead child took with it
    /// (only its creator's session sees it), in the request's era: `tasks/get` a `failed`
    /// `Task` with the reason as `statusMessage` (2025-11-25: `ttl`; 2026-07-28: flat, with
    /// `resultType` `complete` and `ttlMs`); `tasks/result` `-32603` with the reason;
    /// `tasks/cancel` `-32602` (2025-11-25: the task is terminal) or the 2026-07-28 ack
    /// `{"resultType":"complete"}` (a cancel of a terminal task is acknowledged). `None` for
    /// any other request.
    fn dead_task_answer(&self, msg: &Message, method: &str, era: Era) -> Option<McpReply> {
        if !matches!(method, "tasks/get" | "tasks/result" | "tasks/cancel") {
            return None;
        }
        let task_id = splice::raw_at(msg.bytes(), &["params", "taskId"])
            .ok()
            .flatten()
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())?;
        let dead = self.dead.lock();
        let task = dead.get(&task_id)?;
        let id = msg.id();
        let reply = match method {
            "tasks/get" => {
                let now = crate::mcp::task::format_rfc3339_ms(crate::mcp::task::now_ms());
                let created = task
                    .note
                    .created_at
                    .clone()
                    .unwrap_or_else(|| serde_json::Value::String(now.clone()).to_string());
                let (head, ttl) = match era {
                    Era::Legacy => ("", "ttl"),
                    Era::Modern => ("\"resultType\":\"complete\",", "ttlMs"),
                };
                let result = format!(
                    "{{{head}\"taskId\":{},\"status\":\"failed\",\"statusMessage\":{},\"createdAt\":{created},\"lastUpdatedAt\":{},\"{ttl}\":{}}}",
                    serde_json::Value::String(task_id.clone()),
                    serde_json::Value::String(task.why.to_string()),
                    serde_json::Value::String(now),
                    task.note.ttl.as_deref().unwrap_or("null"),
                );
                McpReply::local_json(jsonrpc::result_response(id?, &result))
            }
            "tasks/result" => {
                let error = McpError::Upstream {
                    detail: task.why.to_string(),
                };
                McpReply::error(era, id, &error)
            }
            _ if era == Era::Modern => McpReply::local_json(jsonrpc::result_response(
                id?,
                r#"{"resultType":"complete"}"#,
            )),
            _ => {
                let error = McpError::TaskAlreadyTerminal {
                    task_id,
                    status: TaskStatus::Failed,
                };
                McpReply::error(era, id, &error)
            }
        };
        Some(reply)
    }

    /// Announces a death. Issue 31: a death must never be lost (its tasks would stay
    /// `working` forever), so a full queue is waited on, not dropped from: the waiting is
    /// bounded too, each announcer (a session's watcher, at most [`MAX_CHILDREN`], or the
    /// supervisor) holding its one death. Only while nobody took [`StdioHandle::deaths`]
    /// (no gateway: unit tests) is a death past the queue dropped.
    async fn announce_gone(
        &self,
        session: Option<String>,
        tasks: Vec<String>,
        held: Vec<String>,
        why: String,
    ) {
        let at_ms = crate::mcp::task::now_ms();
        let gone = ChildGone {
            upstream: self.name.clone(),
            session,
            tasks,
            held,
            at_ms,
            why,
        };
        if let Err(mpsc::error::TrySendError::Full(gone)) = self.gone.try_send(gone) {
            if self.gone_rx.lock().is_none() {
                let _ = self.gone.send(gone).await;
            }
        }
    }

    fn unreachable(&self, detail: String) -> GatewayError {
        self.metrics
            .upstream_error(&self.name, UpstreamErrorKind::Connect);
        GatewayError::UpstreamUnreachable {
            upstream: self.name.clone(),
            detail,
        }
    }

    /// Writes one message to `conn` within `timeout_ms`: a child that stopped reading its
    /// stdin (its pipe and taskgate's queue full) gets the request or notification refused
    /// with the upstream's timeout (504), never waited for without end. Whether the child is
    /// deaf is the writer's to find (see Supervision in the module docs).
    async fn write(&self, conn: &Conn, bytes: &[u8], urgent: bool) -> Result<(), GatewayError> {
        let until = tokio::time::Instant::now() + self.timeout;
        self.write_until(conn.write(bytes, urgent), until).await
    }

    /// [`Inner::write`], within `until` (a request's deadline, part of it spent waiting for a
    /// slot).
    async fn write_until(
        &self,
        write: impl std::future::Future<Output = Result<(), String>>,
        until: tokio::time::Instant,
    ) -> Result<(), GatewayError> {
        match tokio::time::timeout_at(until, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(self.unreachable(why)),
            Err(_) => Err(self.timeout_error()),
        }
    }

    fn timeout_error(&self) -> GatewayError {
        self.metrics
            .upstream_error(&self.name, UpstreamErrorKind::Timeout);
        GatewayError::UpstreamTimeout {
            upstream: self.name.clone(),
            timeout_ms: self.timeout_ms,
        }
    }
}

/// The events of a request's SSE reply: the related messages, then its answer (or an error
/// event for the request when the child died or the deadline passed).
struct ReplyEvents {
    first: Option<Bytes>,
    reg: Registered,
    conn: Arc<Conn>,
    client_id: Option<Id>,
    method: String,
    give_up: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    name: Arc<str>,
    timeout_ms: u64,
    done: bool,
}

impl ReplyEvents {
    async fn next(&mut self) -> Option<crate::sse::Event> {
        if let Some(first) = self.first.take() {
            return Some(conn::event(&first));
        }
        if self.done {
            return None;
        }
        let give_up = async {
            match self.give_up.as_mut() {
                Some(t) => t.await,
                None => std::future::pending().await,
            }
        };
        let msg = tokio::select! {
            biased;
            Some(m) = self.reg.related.recv() => m,
            answer = &mut self.reg.answer => {
                self.done = true;
                match answer {
                    Ok(Ok(bytes)) => bytes,
                    Ok(Err(why)) => self.error(&format!("upstream `{}` is unreachable: {why}", self.name)),
                    Err(_) => self.error(&format!("upstream `{}` is unreachable: its child process is gone", self.name)),
                }
            }
            () = give_up => {
                self.done = true;
                self.conn.give_up(self.reg.out, "taskgate: the request timed out");
                self.error(&format!("upstream did not answer {} within {} ms", self.method, self.timeout_ms))
            }
        };
        Some(conn::event(&msg))
    }

    fn error(&self, message: &str) -> Bytes {
        jsonrpc::error_response(self.client_id.as_ref(), jsonrpc::INTERNAL_ERROR, message)
    }
}

/// What a client's `initialize` declared (`params.capabilities`).
fn initialize_declares(msg: &Message) -> ClientCapabilities {
    declared_at(msg, &["params", "capabilities"])
}

/// The client capabilities at `path` in `msg` (none when absent or not an object).
fn declared_at(msg: &Message, path: &[&str]) -> ClientCapabilities {
    splice::raw_at(msg.bytes(), path)
        .ok()
        .flatten()
        .and_then(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).ok())
        .map(|v| ClientCapabilities::of(&v))
        .unwrap_or_default()
}

/// Resolves once `stop` is set (or its sender is gone); holds no borrow of it.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// The restart delay: [`BACKOFF_START`], doubled per quick death, at most [`BACKOFF_MAX`].
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_START,
        }
    }
}

impl Backoff {
    /// The delay to wait now; the next one doubles.
    fn take(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        now
    }

    /// Waits the delay; false when stopped meanwhile.
    async fn wait(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        let delay = self.take();
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            _ = stopped(stop) => false,
        }
    }
}

/// A new session id: `tgs-` and 128 bits from the OS random source (`None` without one: a
/// session id must not be guessable).
fn new_session_id() -> Option<Arc<str>> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).ok()?;
    Some(format!("tgs-{}", hex::encode(bytes)).into())
}

fn with_session(mut reply: McpReply, session: &str) -> McpReply {
    if let Ok(v) = HeaderValue::from_str(session) {
        reply
            .headers
            .insert(crate::headers::MCP_SESSION_ID.clone(), v);
    }
    reply
}

/// Whether a reply is one JSON-RPC message (an answer the client can read).
fn is_answer(reply: &McpReply) -> bool {
    matches!(reply.body, ReplyBody::Json(_))
}

/// Whether a JSON-RPC answer carries a `result`.
fn is_result(answer: &[u8]) -> bool {
    splice::raw_at(answer, &["result"]).ok().flatten().is_some()
}

/// HTTP 404 `-32001`: a session this upstream does not hold (2025-11-25 transport).
fn session_not_found(id: Option<&Id>) -> McpReply {
    McpReply::error(Era::Legacy, id, &McpError::SessionNotFound)
}

/// 503 with `Retry-After` and a JSON-RPC `-32603`: no room for another child now.
fn overloaded(id: Option<&Id>, message: String) -> McpReply {
    McpReply::error(Era::Legacy, id, &McpError::Overloaded { message })
}

/// The era of a child by its answer to taskgate's `server/discover` probe: the versions a
/// `DiscoverResult` names (`supportedVersions`), or a `-32022` UnsupportedProtocolVersion
/// (`data.supported`); all of them [`PROBE_VERSION`] or later is modern-only. Dates compare as
/// text (`YYYY-MM-DD`). Any other answer is a legacy server's.
fn classify_probe(answer: &[u8]) -> Probe {
    let v: serde_json::Value = serde_json::from_slice(answer).unwrap_or_default();
    let versions = match (v.get("result"), v.get("error")) {
        (Some(result), _) => result.get("supportedVersions"),
        (None, Some(error))
            if error.get("code").and_then(serde_json::Value::as_i64)
                == Some(crate::mcp::errors::UNSUPPORTED_PROTOCOL_VERSION) =>
        {
            error.get("data").and_then(|d| d.get("supported"))
        }
        (None, Some(error)) => {
            let code = error.get("code").cloned().unwrap_or_default();
            return Probe::Legacy(format!("answered with error {code}"));
        }
        (None, None) => return Probe::Legacy("answered neither a result nor an error".into()),
    };
    let Some(list) = versions.and_then(serde_json::Value::as_array) else {
        return Probe::Legacy("no supported versions named".into());
    };
    let names: Vec<&str> = list.iter().filter_map(serde_json::Value::as_str).collect();
    if names.is_empty() || names.len() != list.len() {
        return Probe::Legacy("no supported versions named".into());
    }
    if names.iter().all(|n| *n >= PROBE_VERSION) {
        Probe::ModernOnly(serde_json::Value::from(names).to_string().into())
    } else {
        Probe::DualEra
    }
}

/// A client's `initialize` to a modern-only shared child, refused as the child refuses it
/// (`-32022` UnsupportedProtocolVersion, `data` `requested` and `supported`), without it.
fn refuse_initialize(msg: &Message, id: Option<&Id>, supported: &str) -> McpReply {
    let requested = splice::raw_at(msg.bytes(), &["params", "protocolVersion"])
        .ok()
        .flatten()
        .and_then(|r| serde_json::from_str::<serde_json::Value>(r.get()).ok())
        .unwrap_or_default();
    let supported: serde_json::Value = serde_json::from_str(supported).unwrap_or_default();
    McpReply::local_json(jsonrpc::error_response_with_data(
        id,
        crate::mcp::errors::UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        &serde_json::json!({ "requested": requested, "supported": supported }),
    ))
}

/// A child's answer as the reply to a client's request: a 2026-07-28 request's JSON-RPC
/// error gets the HTTP status the 2026-07-28 transport prescribes for its code (400 for
/// `-32020`, `-32021`, `-32022`, `-32602`, `-32600`; 404 for `-32601`), as an HTTP server
/// answers it (`mcp::errors::modern_error_status`); anything else HTTP 200.
fn answered(bytes: Bytes, era: Era) -> McpReply {
    let mut reply = McpReply::local_json(bytes);
    if era == Era::Modern {
        if let ReplyBody::Json(b) = &reply.body {
            let code = splice::raw_at(b, &["error", "code"])
                .ok()
                .flatten()
                .and_then(|c| c.get().parse::<i64>().ok());
            if let Some(code) = code {
                reply.status = crate::mcp::errors::modern_error_status(code);
            }
        }
    }
    reply
}

fn status_reply(status: StatusCode) -> McpReply {
    McpReply::new(status, HeaderMap::new(), ReplyBody::Empty)
}

/// Registers taskgate's own request `request` (the era probe, `initialize`) on `conn` under its
/// own session, declaring no client capability, and queues it for the child. Errors: the
/// message cannot be registered, or the child is gone.
async fn write_own_request(
    conn: &Arc<Conn>,
    request: &serde_json::Value,
) -> Result<Registered, String> {
    let msg = Message::parse(Bytes::from(request.to_string())).map_err(|e| e.to_string())?;
    let reg = conn.register(
        &msg,
        Some(OWN_SESSION.into()),
        ClientCapabilities::default(),
        None,
        false,
        None,
    )?;
    conn.write_request(&reg, false).await?;
    Ok(reg)
}

/// A request on its way to a child ([`Inner::call`]): the message and what its answer is owed
/// under.
struct Outgoing {
    msg: Message,
    /// The client session it came in (`None`: an `initialize`).
    session: SessionKey,
    deadline: Deadline,
    /// The caller's era: how an error is answered.
    era: Era,
    /// The gateway task it is the held call of, named in the child's death ([`ChildGone::held`]).
    held: Option<Arc<str>>,
}

impl Outgoing {
    /// An `initialize` (a shared child's, or a new `per_session` child's first request): under
    /// no client session yet, an error answered in 2025-11-25 terms.
    fn initialize(msg: Message, deadline: Deadline) -> Self {
        Outgoing {
            msg,
            session: None,
            deadline,
            era: Era::Legacy,
            held: None,
        }
    }
}

#[cfg(test)]
mod tests;

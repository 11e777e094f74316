//! The errors taskgate answers itself, in one place: the MCP codes beyond JSON-RPC's own,
//! [`McpError`] (every situation taskgate refuses or fails a request in, each variant's
//! JSON-RPC code, message and HTTP status per era), and the HTTP status the 2026-07-28
//! transport gives each code ([`modern_error_status`], also applied to upstream errors passed on).
//!
//! JSON-RPC 2.0's codes (`-32700`, `-32600`..`-32603`) stay in [`crate::jsonrpc`]: they are the
//! envelope's, used by code that knows no MCP (the envelope parser's own refusals); MCP's build
//! on them.

use crate::jsonrpc::{self, Id};
use crate::mcp::capabilities::TASKS_EXTENSION;
use crate::mcp::era::Era;
use crate::mcp::task::TaskStatus;
use bytes::Bytes;
use http::StatusCode;
use std::fmt;

/// `-32001` Session not found: the 2025-11-25 transport's answer (HTTP 404) to an
/// `Mcp-Session-Id` the server does not know (as the MCP SDKs answer it).
pub const SESSION_NOT_FOUND: i64 = -32001;
/// `-32020` HeaderMismatch: a standard header disagrees with the body, or is missing (HTTP 400).
pub const HEADER_MISMATCH: i64 = -32020;
/// `-32021` MissingRequiredClientCapability: the request did not declare a capability the
/// server needs; `data.requiredCapabilities` names it (HTTP 400).
pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
/// `-32022` UnsupportedProtocolVersion (HTTP 400).
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// `-32029`, taskgate's own: an owner is over `tasks.max_live_tasks_per_owner`, or a caller over
/// a `[limits]` bound (implementation-defined server error range, -32000 to -32099).
pub const TASK_LIMIT_EXCEEDED: i64 = -32029;

/// The HTTP status the 2026-07-28 transport prescribes for a JSON-RPC error: 400 for `-32020`,
/// `-32021`, `-32022`, `-32602` and `-32600`, 404 for `-32601`, 200 otherwise. Applied to
/// taskgate's own errors ([`McpError::http_status`]) and to a 2026-07-28 upstream's errors
/// passed on.
pub fn modern_error_status(code: i64) -> StatusCode {
    match code {
        HEADER_MISMATCH
        | MISSING_REQUIRED_CLIENT_CAPABILITY
        | UNSUPPORTED_PROTOCOL_VERSION
        | jsonrpc::INVALID_PARAMS
        | jsonrpc::INVALID_REQUEST => StatusCode::BAD_REQUEST,
        jsonrpc::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// The `-32021` error naming the tasks extension, under `id`:
/// `{"code":-32021,"message":"Missing required client capability","data":{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}`.
pub fn missing_tasks_extension(id: Option<&Id>) -> Bytes {
    McpError::MissingTasksExtension.body(id)
}

/// An error taskgate answers a request with itself (never an upstream's error passed on): what
/// happened, in typed fields. Each variant has one JSON-RPC code ([`McpError::code`]), one
/// message (its `Display`) and one HTTP status per era ([`McpError::http_status`]); the reply
/// is `exchange::McpReply::error`.
///
/// Under 2025-11-25 a JSON-RPC error is HTTP 200 (2025-11-25 basic/transports) except where the
/// transport answers at the HTTP level (an unknown session: 404; no room: 503). Under 2026-07-28
/// the status follows the code ([`modern_error_status`]: 400 for `-32602`/`-32600`/`-32021`,
/// 404 for `-32601`, else 200), with the same HTTP-level exceptions.
#[derive(Debug, Clone, PartialEq)]
pub enum McpError {
    // ---- one task (2025-11-25 basic/utilities/tasks; 2026-07-28 tasks extension) ----
    /// `-32602` "Task not found: {task_id}": no task `task_id` the caller may see (unknown,
    /// expired, or another owner's: the same answer, so a caller cannot learn whether another's
    /// task exists; "invalid or nonexistent taskId").
    TaskNotFound {
        /// The `taskId` as the request named it.
        task_id: String,
    },
    /// `-32602`: a 2025-11-25 `tasks/cancel` of a task already in a terminal status ("cannot
    /// cancel a task in a terminal status"; 2026-07-28 acks it instead).
    TaskAlreadyTerminal {
        /// The `taskId` as the request named it.
        task_id: String,
        /// The task's terminal status.
        status: TaskStatus,
    },
    /// `-32602`: a `tasks/cancel` that reached the cancel stage with no task authorised for
    /// it (only in a stack without the `tasks` stage).
    NoAuthorisedTask,
    /// `-32029` ([`TASK_LIMIT_EXCEEDED`]): the owner already has `limit` unfinished tasks on
    /// `upstream` (`tasks.max_live_tasks_per_owner`).
    TaskLimitExceeded {
        /// `tasks.max_live_tasks_per_owner`.
        limit: usize,
        /// The upstream's name.
        upstream: String,
    },
    /// `-32603`: task `task_id` completed, but taskgate did not keep its result (over
    /// `tasks.max_stored_result_bytes`, or lost in a restart).
    ResultNotKept {
        /// The task's id.
        task_id: String,
    },
    /// `-32602`: `method` (a `tasks/update` with input responses, in the wrong era or of a
    /// task taskgate does not run) about a task that does not wait for input.
    NotAwaitingInput {
        /// The method.
        method: String,
        /// The task's id.
        task_id: String,
    },
    /// `-32603`: a 2025-11-25 `tasks/result` of a gateway task that ended without a result
    /// (cancelled, or failed with no error kept).
    NoResult {
        /// The task's id.
        task_id: String,
        /// Its terminal status.
        status: TaskStatus,
        /// Its `statusMessage`, when it has one (the message then, unless cancelled).
        status_message: Option<String>,
    },
    /// `-32603`: taskgate could not draw a random `taskId` (the operating system's source failed).
    NoRandomTaskId,
    /// `-32603`: the task record of a gateway task could not be made.
    RecordNotMade,
    /// `-32603`: the creation could not be recorded durably, so the task was not handed out
    /// (or, `before_upstream`, nothing was sent upstream). The store's error is logged (and
    /// counted in `taskgate_store_write_failures_total`) by the registry, not sent to the
    /// client: a database's error names hosts and users.
    NotRecorded {
        /// Refused before the call went upstream (a gateway task), not after the upstream
        /// created it.
        before_upstream: bool,
    },
    /// `-32603`: the upstream answered a creation with a `taskId` taskgate already recorded for
    /// it (an upstream reusing ids, as one restarted with a counter does; break-tasks L4): the
    /// new task is neither recorded nor handed out, nor cancelled upstream (a `tasks/cancel` of
    /// that id would end the recorded task).
    TaskIdReused {
        /// The reused `taskId`.
        task_id: String,
        /// The upstream's name.
        upstream: String,
    },
    /// `-32603`: the call lease of a gateway task could not be taken; nothing was sent
    /// upstream. The store's error is logged where the lease was asked for, not sent.
    LeaseNotTaken,

    // ---- methods and capabilities ----
    /// `-32021` ([`MISSING_REQUIRED_CLIENT_CAPABILITY`]) with `data.requiredCapabilities` naming
    /// the tasks extension (2026-07-28 tasks extension: a `tasks/*` request must declare it).
    MissingTasksExtension,
    /// `-32601`: a 2025-11-25 method 2026-07-28 removed (`tasks/result`, `tasks/list`).
    NotInModernEra {
        /// The method.
        method: String,
    },
    /// `-32601`: `tasks/list` without `[auth]` and without a session: callers cannot be told
    /// apart, so nobody's tasks are listed.
    TasksListUnavailable,

    // ---- params (`-32602`) ----
    /// `-32602`: the request's `params` are not JSON taskgate can read (`detail`: the parser's
    /// error).
    ParamsUnreadable {
        /// The method, when the message names it.
        method: Option<String>,
        /// The parser's error.
        detail: String,
    },
    /// `-32602` "{method}: params.{key} ({shape}) is required".
    MissingParam {
        /// The method, when the message names it.
        method: Option<String>,
        /// The member's path under `params` (`taskId`, `uri`).
        key: &'static str,
        /// What it must be (`a string`).
        shape: &'static str,
    },
    /// `-32602` "{method}: params.{key} {problem}": a member is there but not usable.
    InvalidParam {
        /// The method, when the message names it.
        method: Option<String>,
        /// The member's path under `params` (`task.ttl`).
        key: String,
        /// What is wrong with it, as the end of a sentence.
        problem: String,
    },
    /// `-32602`: a `tasks/list` cursor taskgate did not give (or not a string).
    InvalidCursor {
        /// The cursor was not a string.
        not_a_string: bool,
    },
    /// `-32602`: a `subscriptions/listen` naming more than `max` `taskIds`.
    TooManyTaskIds {
        /// The bound.
        max: usize,
    },
    /// `-32602` with a message made where the params were judged (a `params.task` taskgate
    /// cannot run, a bad `_meta`).
    InvalidParams {
        /// The message.
        message: String,
    },

    // ---- requests and sessions (2025-11-25 transport) ----
    /// `-32600`: a request id already in flight on this session (2025-11-25 basic: "the request
    /// ID MUST NOT have been previously used by the requestor within the same session").
    IdInFlight {
        /// The id, as JSON.
        id: String,
    },
    /// HTTP 404 `-32001` ([`SESSION_NOT_FOUND`]): an `Mcp-Session-Id` taskgate does not know
    /// (or not for this caller): initialize a new session.
    SessionNotFound,
    /// HTTP 503 `-32603`: `gateway.max_sessions` sessions held, none idle.
    SessionsFull,
    /// HTTP 500 `-32603`: the session store could not be written (`write`) or read.
    SessionStore {
        /// A write (an initialize's session) rather than a read (a session looked up).
        write: bool,
    },
    /// HTTP 502 `-32603`: an upstream's `Mcp-Session-Id` longer than the replicas of a tier
    /// share.
    SessionIdTooLong {
        /// Its length in bytes.
        len: usize,
        /// The bound in bytes.
        bound: usize,
    },
    /// HTTP 503 `-32603` with `Retry-After: 1`: no room now (`message` says for what).
    Overloaded {
        /// The message.
        message: String,
    },

    // ---- the task store (`-32603`) ----
    /// `-32603` "{method}: task store unavailable; try again".
    StoreUnavailable {
        /// The method, when the message names it.
        method: Option<String>,
    },
    /// `-32603` "{method}: the task store failed and does not recover until taskgate is
    /// restarted (see taskgate's log); restart taskgate": the store failed for good in this
    /// process (`StoreError::Failed`: sled after an I/O error); its error text stays in the log.
    StoreFailed {
        /// The method, when the message names it.
        method: Option<String>,
    },
    /// `-32603`: the registry gave no `tasks/list` page (a store that failed is
    /// [`McpError::StoreUnavailable`]).
    ListFailed,

    // ---- the upstream (`-32603`) ----
    /// `-32603` with a failed exchange's text (`exchange::GatewayError`'s `Display`), where
    /// the failure is answered as JSON-RPC rather than as an HTTP status.
    Upstream {
        /// The failure's text.
        detail: String,
    },
    /// `-32603`: the upstream answered a `tasks/cancel` with HTTP `status` and no JSON-RPC answer.
    CancelAnsweredHttp {
        /// The upstream's name.
        upstream: String,
        /// Its HTTP status.
        status: u16,
    },
    /// `-32603`: a `tasks/cancel` flight ended with no outcome to answer with.
    CancelNoOutcome,
    /// `-32603`: the upgraded `tools/call` (issue 19) ended without an answer to give.
    UpgradeEnded,
    /// `-32603`: the upstream's stream ended with no answer to the upgraded `tools/call`.
    UpgradeUnanswered {
        /// The upstream's name.
        upstream: String,
    },
    /// `-32603`: the upstream sent more than `limit` messages before its answer to the upgraded
    /// `tools/call`; the exchange was ended (and the task cancelled, when it named one).
    UpgradeTooChatty {
        /// The upstream's name.
        upstream: String,
        /// The bound on messages before the answer.
        limit: usize,
        /// A task was named, and cancelled.
        cancelled: bool,
    },
    /// `-32603`: the upstream answered the followed `tasks/result` with a body that is not an
    /// object.
    UpgradeResultNotObject,
    /// `-32603`: the upgraded task ended (`tasks/get` said so) but `tasks/result` gave no answer.
    UpgradeNoResult {
        /// The terminal status `tasks/get` gave.
        status: String,
        /// Its `statusMessage`, when not empty.
        status_message: Option<String>,
    },
    /// `-32603`: the upgraded task asked for input by `method`, which needs the client
    /// capability `capability` this client did not declare; the task was cancelled.
    UpgradeNeedsCapability {
        /// The input request's method.
        method: &'static str,
        /// The capability's path (`elicitation`, `sampling`).
        capability: String,
    },
    /// `-32603`: following the upgraded task failed (`detail`: why).
    UpgradeFollowFailed {
        /// Why.
        detail: String,
    },

    // ---- input relayed from a 2026-07-28 upstream (MRTR, `input_required`) ----
    /// `-32603`: the upstream asked for input in more than `max` rounds of one request.
    InputRoundsExceeded {
        /// The bound on rounds.
        max: usize,
    },
    /// `-32603`: an `input_required` answer without `inputRequests`.
    InputRequestsMissing,
    /// `-32603`: more input requests in one round than taskgate relays.
    TooManyInputs {
        /// How many the upstream asked for.
        asked: usize,
        /// The bound.
        max: usize,
    },
    /// `-32600`: input by `method` this client cannot give: it needs `capability`, which the
    /// client did not declare (or, `None`, taskgate does not relay the method).
    InputNotRelayed {
        /// The input request's method.
        method: String,
        /// The client capability it needs (`elicitation`, `sampling`).
        capability: Option<String>,
    },
    /// `-32603`: the upstream gave no answer to the request retried with the client's input.
    RetryUnanswered,
    /// `-32603`: an input request was dropped before the client answered it (too many
    /// unanswered input requests): the input required is lost.
    InputRequiredLost,
    /// `-32603`: the client did not answer the input requests of `round` within `timeout_ms`.
    InputTimeout {
        /// The round (1 is the first).
        round: usize,
        /// The relay's timeout in ms.
        timeout_ms: u128,
    },
    /// `-32603`: the client answered an input request (`method`) with a JSON-RPC error that no
    /// 2026-07-28 `inputResponses` value can carry (a `sampling/createMessage` result has no
    /// refusal form): the request is not retried.
    InputRefused {
        /// The input request's method.
        method: String,
    },

    // ---- the bridges (a 2025-11-25 client on a 2026-07-28 upstream, and the reverse) ----
    /// `-32602` "Task {task_id} has expired": a bridged 2025 `tasks/result` waited past the
    /// task's ttl (2025-11-25 basic/utilities/tasks: an expired task is `-32602`).
    TaskExpired {
        /// The task's id.
        task_id: String,
    },
    /// `-32603`: a bridged task completed upstream, but its `DetailedTask` carried no result
    /// object (2026-07-28 tasks extension: a completed task's `result`).
    CompletedWithoutResult {
        /// The task's id.
        task_id: String,
    },
    /// `-32603`: the upstream of version `upstream_version` (`2026-07-28`, `2025-11-25`) gave
    /// no JSON-RPC answer to a request the bridge translated for it.
    BridgedUnanswered {
        /// The upstream's protocol version.
        upstream_version: &'static str,
    },
    /// `-32603`: the 2026-07-28 upstream answered a bridged request with neither `result` nor
    /// `error` (JSON-RPC 2.0 §5: one of them).
    BridgedNeitherResultNorError,
    /// `-32603`: the 2026-07-28 upstream gave no answer to the `tasks/get` that follows task
    /// `task_id` for a bridged `tasks/result`.
    TaskGetUnanswered {
        /// The task's id.
        task_id: String,
    },
    /// `-32603`: a bridged `tasks/result` stream ended without an answer to give.
    FollowUnanswered,
    /// `-32603`: the upstream answered a creation with a `CreateTaskResult` without a string
    /// `taskId`, or in the other era's shape (nothing to record or ask about). A missing or
    /// unknown `status` is not refused from a 2025-11-25 upstream: the task is recorded
    /// `working` and its answer passed on as it came (its next `tasks/get` goes to the
    /// upstream). The `bridge` refuses it from a 2026-07-28 upstream (its 2025 client's schema
    /// would reject the translated result) and cancels the task it names.
    MalformedCreateTaskResult,
    /// `-32603`: the 2026-07-28 upstream did not answer `server/discover` (2026-07-28
    /// lifecycle), so taskgate cannot hold a 2025 session for it.
    DiscoverUnanswered,
    /// `-32603`: bridged task `task_id` asks for `asked` inputs, more than taskgate relays for
    /// one task (`max`); the task was cancelled.
    TaskInputsExceeded {
        /// The task's id.
        task_id: String,
        /// How many inputs it asks for.
        asked: usize,
        /// The bound.
        max: usize,
    },
    /// `-32603`: bridged task `task_id` needs input by `method`, which the client did not
    /// declare (or taskgate cannot relay); the task was cancelled.
    TaskInputNotRelayed {
        /// The task's id.
        task_id: String,
        /// The input request's method.
        method: String,
    },
    /// `-32603`: the upstream acknowledged the cancel of task `task_id`, but taskgate could not
    /// record it.
    CancelNotRecorded {
        /// The task's id.
        task_id: String,
    },
    /// `-32603`: the 2026-07-28 upstream answered `input_required` to a request MRTR does not
    /// allow it for (2026-07-28: only `tools/call`, `prompts/get`, `resources/read`).
    InputNotAllowed,
    /// `-32603`: taskgate could not hold a 2025-11-25 session on `upstream` for a 2026-07-28
    /// client (`detail`: why).
    UpstreamSessionNotHeld {
        /// The upstream's name.
        upstream: String,
        /// Why.
        detail: String,
    },

    // ---- held sessions (2025-11-25 sessions taskgate holds on a 2026-07-28 upstream) ----
    /// `-32603`: taskgate could not draw a session id (the operating system's source failed).
    NoRandomSessionId,
    /// `-32600`: a message in a held session that has no 2026-07-28 form to send upstream.
    NotForwardable,
    /// `-32602`: a `resources/subscribe` URI longer than `max` bytes (what taskgate keeps).
    UriTooLong {
        /// The bound in bytes.
        max: usize,
    },
    /// `-32602`: a held session already has `max` resource subscriptions.
    TooManySubscriptions {
        /// The bound per session.
        max: usize,
    },
    /// `-32602`: the principal's resource subscriptions are over `max` bytes.
    SubscriptionBytesExceeded {
        /// The bound in bytes per principal.
        max: usize,
    },
    /// `-32603`: taskgate holds listen state for as many held sessions as it keeps (a
    /// `resources/subscribe` of a session without any); a GET stream gets
    /// [`McpError::Overloaded`] instead.
    HeldListenFull,
}

impl McpError {
    /// The JSON-RPC code.
    pub fn code(&self) -> i64 {
        use McpError::*;
        match self {
            TaskNotFound { .. }
            | TaskAlreadyTerminal { .. }
            | NoAuthorisedTask
            | NotAwaitingInput { .. }
            | ParamsUnreadable { .. }
            | MissingParam { .. }
            | InvalidParam { .. }
            | InvalidCursor { .. }
            | TooManyTaskIds { .. }
            | InvalidParams { .. }
            | TaskExpired { .. }
            | UriTooLong { .. }
            | TooManySubscriptions { .. }
            | SubscriptionBytesExceeded { .. } => jsonrpc::INVALID_PARAMS,
            TaskLimitExceeded { .. } => TASK_LIMIT_EXCEEDED,
            MissingTasksExtension => MISSING_REQUIRED_CLIENT_CAPABILITY,
            NotInModernEra { .. } | TasksListUnavailable => jsonrpc::METHOD_NOT_FOUND,
            IdInFlight { .. } | InputNotRelayed { .. } | NotForwardable => jsonrpc::INVALID_REQUEST,
            SessionNotFound => SESSION_NOT_FOUND,
            ResultNotKept { .. }
            | NoResult { .. }
            | NoRandomTaskId
            | RecordNotMade
            | NotRecorded { .. }
            | TaskIdReused { .. }
            | LeaseNotTaken
            | SessionsFull
            | SessionStore { .. }
            | SessionIdTooLong { .. }
            | Overloaded { .. }
            | StoreUnavailable { .. }
            | StoreFailed { .. }
            | ListFailed
            | Upstream { .. }
            | CancelAnsweredHttp { .. }
            | CancelNoOutcome
            | UpgradeEnded
            | UpgradeUnanswered { .. }
            | UpgradeTooChatty { .. }
            | UpgradeResultNotObject
            | UpgradeNoResult { .. }
            | UpgradeNeedsCapability { .. }
            | UpgradeFollowFailed { .. }
            | InputRoundsExceeded { .. }
            | InputRequestsMissing
            | TooManyInputs { .. }
            | RetryUnanswered
            | InputRequiredLost
            | InputTimeout { .. }
            | InputRefused { .. }
            | CompletedWithoutResult { .. }
            | BridgedUnanswered { .. }
            | BridgedNeitherResultNorError
            | TaskGetUnanswered { .. }
            | FollowUnanswered
            | MalformedCreateTaskResult
            | DiscoverUnanswered
            | TaskInputsExceeded { .. }
            | TaskInputNotRelayed { .. }
            | CancelNotRecorded { .. }
            | InputNotAllowed
            | UpstreamSessionNotHeld { .. }
            | NoRandomSessionId
            | HeldListenFull => jsonrpc::INTERNAL_ERROR,
        }
    }

    /// The HTTP status of the reply in `era`: the transport-level ones (404 for
    /// [`McpError::SessionNotFound`], 503 for no room, 500 for a session store failure, 502 for
    /// an upstream session id too long to share) in both eras; otherwise 200 under 2025-11-25
    /// and [`modern_error_status`] of the code under 2026-07-28.
    pub fn http_status(&self, era: Era) -> StatusCode {
        match self {
            McpError::SessionNotFound => StatusCode::NOT_FOUND,
            McpError::SessionsFull | McpError::Overloaded { .. } | McpError::HeldListenFull => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            McpError::SessionStore { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            McpError::SessionIdTooLong { .. } => StatusCode::BAD_GATEWAY,
            _ => match era {
                Era::Legacy => StatusCode::OK,
                Era::Modern => modern_error_status(self.code()),
            },
        }
    }

    /// The `Retry-After` the reply carries, in seconds: 1 for [`McpError::Overloaded`] and
    /// [`McpError::HeldListenFull`] (no room now; a held session's state is freed when it ends).
    pub fn retry_after_secs(&self) -> Option<u32> {
        matches!(self, McpError::Overloaded { .. } | McpError::HeldListenFull).then_some(1)
    }

    /// The JSON-RPC error response under `id` (`data` where the variant has one).
    pub fn body(&self, id: Option<&Id>) -> Bytes {
        match self {
            McpError::MissingTasksExtension => {
                let data = serde_json::json!({
                    "requiredCapabilities": { "extensions": { TASKS_EXTENSION: {} } }
                });
                jsonrpc::error_response_with_data(id, self.code(), &self.to_string(), &data)
            }
            _ => jsonrpc::error_response(id, self.code(), &self.to_string()),
        }
    }
}

/// `"{method}: "`, or nothing.
struct Prefix<'a>(&'a Option<String>);

impl fmt::Display for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(m) => write!(f, "{m}: "),
            None => Ok(()),
        }
    }
}

impl fmt::Display for McpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use McpError::*;
        match self {
            TaskNotFound { task_id } => write!(f, "Task not found: {}", Echoed(task_id)),
            TaskAlreadyTerminal { task_id, status } => write!(
                f,
                "Cannot cancel task {task_id}: it is already {status} (a terminal status)"
            ),
            NoAuthorisedTask => f.write_str("tasks/cancel: no authorised task"),
            TaskLimitExceeded { limit, upstream } => write!(
                f,
                "Task limit reached: this caller already has {limit} unfinished tasks on upstream `{upstream}` (tasks.max_live_tasks_per_owner); wait for one to finish or cancel one (a task counts until the upstream reports it ended: cancelled, completed or failed)"
            ),
            ResultNotKept { task_id } => write!(
                f,
                "task {task_id} completed, but its result was not kept (larger than tasks.max_stored_result_bytes, or lost in a restart)"
            ),
            NotAwaitingInput { method, task_id } => {
                write!(f, "{method}: task {task_id} does not wait for input")
            }
            NoResult {
                task_id,
                status: TaskStatus::Cancelled,
                ..
            } => write!(f, "task {task_id} was cancelled; it has no result"),
            NoResult {
                status_message: Some(m),
                ..
            } => f.write_str(m),
            NoResult {
                task_id, status, ..
            } => write!(f, "task {task_id} {status}"),
            NoRandomTaskId => f.write_str("taskgate could not draw a random taskId"),
            RecordNotMade => f.write_str("the task record cannot be made"),
            NotRecorded {
                before_upstream: false,
            } => f.write_str(
                "taskgate could not record the task durably (task store unavailable); the task was not handed out",
            ),
            NotRecorded {
                before_upstream: true,
            } => f.write_str(
                "taskgate could not record the task durably (task store unavailable); nothing was sent upstream",
            ),
            TaskIdReused { task_id, upstream } => write!(
                f,
                "upstream `{upstream}` answered with taskId {task_id:?}, which names a task taskgate already recorded for it (the upstream reuses taskIds, as one that restarted with a counter does): the new task was not recorded nor handed out, and is not cancelled upstream (that would end the recorded one)"
            ),
            LeaseNotTaken => f.write_str(
                "the task store is unavailable: taskgate could not take the task's call lease; nothing was sent upstream",
            ),
            MissingTasksExtension => f.write_str("Missing required client capability"),
            NotInModernEra { method } => write!(
                f,
                "Method not found: {method} does not exist under MCP {}",
                crate::mcp::era::MODERN_VERSION
            ),
            TasksListUnavailable => f.write_str(
                "tasks/list is not available: without [auth] and without an Mcp-Session-Id taskgate cannot tell callers apart",
            ),
            ParamsUnreadable { method, detail } => {
                write!(f, "{}params cannot be read: {detail}", Prefix(method))
            }
            MissingParam { method, key, shape } => {
                write!(f, "{}params.{key} ({shape}) is required", Prefix(method))
            }
            InvalidParam {
                method,
                key,
                problem,
            } => write!(f, "{}params.{key} {problem}", Prefix(method)),
            InvalidCursor { not_a_string } => {
                f.write_str("tasks/list: invalid cursor")?;
                if *not_a_string {
                    f.write_str(" (must be a string)")?;
                }
                Ok(())
            }
            TooManyTaskIds { max } => write!(f, "subscriptions/listen: at most {max} taskIds"),
            InvalidParams { message } | Overloaded { message } => f.write_str(message),
            IdInFlight { id } => write!(
                f,
                "request id {id} is already in flight on this session; a request id must not be reused while its request is in flight"
            ),
            SessionNotFound => f.write_str("Session not found: initialize a new session"),
            SessionsFull => f.write_str(
                "Service Unavailable: taskgate holds gateway.max_sessions sessions, none idle; try again later",
            ),
            SessionStore { write: true } => f.write_str(
                "taskgate could not record the session in its store; try again later",
            ),
            SessionStore { write: false } => f.write_str(
                "taskgate could not read the session from its store; try again later",
            ),
            SessionIdTooLong { len, bound } => write!(
                f,
                "the upstream's Mcp-Session-Id is {len} bytes; the replicas of this tier share sessions whose id is at most {bound} bytes"
            ),
            StoreUnavailable { method } => {
                write!(f, "{}task store unavailable; try again", Prefix(method))
            }
            StoreFailed { method } => write!(
                f,
                "{}the task store failed and does not recover until taskgate is restarted (see taskgate's log); restart taskgate",
                Prefix(method)
            ),
            ListFailed => f.write_str("tasks/list: the task registry gave no page"),
            Upstream { detail } => f.write_str(detail),
            CancelAnsweredHttp { upstream, status } => write!(
                f,
                "upstream `{upstream}` answered tasks/cancel with HTTP {status}"
            ),
            CancelNoOutcome => f.write_str("tasks/cancel: no outcome"),
            UpgradeEnded => f.write_str("the upgraded call ended without an answer"),
            UpgradeUnanswered { upstream } => write!(
                f,
                "upstream `{upstream}` sent no answer to the upgraded tools/call"
            ),
            UpgradeTooChatty {
                upstream,
                limit,
                cancelled,
            } => write!(
                f,
                "upstream `{upstream}` sent more than {limit} messages before answering the upgraded tools/call; the exchange was ended{}",
                if *cancelled { " and the task cancelled" } else { "" }
            ),
            UpgradeResultNotObject => {
                f.write_str("upstream answered tasks/result with a non-object body")
            }
            UpgradeNoResult {
                status,
                status_message,
            } => {
                write!(f, "the upgraded task ended with status `{status}`")?;
                if let Some(m) = status_message {
                    write!(f, " ({m})")?;
                }
                f.write_str(", but tasks/result gave no answer")
            }
            UpgradeNeedsCapability { method, capability } => write!(
                f,
                "the tool needs {method}, but this client did not declare capabilities.{capability}; the task was cancelled"
            ),
            UpgradeFollowFailed { detail } => {
                write!(f, "following the upgraded task failed: {detail}")
            }
            InputRoundsExceeded { max } => write!(
                f,
                "the 2026-07-28 upstream asked for input in more than {max} rounds of this request (MRTR); taskgate relays at most {max}"
            ),
            InputRequestsMissing => f.write_str(
                "the 2026-07-28 upstream answered input_required without inputRequests",
            ),
            TooManyInputs { asked, max } => write!(
                f,
                "the 2026-07-28 upstream asked for {asked} inputs in one round (MRTR), more than taskgate relays ({max})"
            ),
            InputNotRelayed {
                method,
                capability: Some(cap),
            } => write!(
                f,
                "the 2026-07-28 upstream needs input by `{method}` to answer this request, which needs the client capability `{cap}`; this client did not declare it in initialize"
            ),
            InputNotRelayed {
                method,
                capability: None,
            } => write!(
                f,
                "the 2026-07-28 upstream needs input by `{method}` to answer this request, which taskgate does not relay"
            ),
            RetryUnanswered => f.write_str(
                "the 2026-07-28 upstream gave no answer to the retried request (MRTR)",
            ),
            InputRequiredLost => f.write_str(
                "an input request of this request was dropped before the client answered it (too many unanswered input requests)",
            ),
            InputTimeout { round, timeout_ms } => write!(
                f,
                "the client did not answer the upstream's input requests (MRTR round {round}) within {timeout_ms} ms"
            ),
            InputRefused { method } => write!(
                f,
                "the client answered the upstream's {method} input request with an error, which a 2026-07-28 input response cannot carry; the request was not retried"
            ),
            TaskExpired { task_id } => write!(
                f,
                "Task {task_id} has expired: its ttl elapsed while tasks/result waited for it"
            ),
            CompletedWithoutResult { task_id } => write!(
                f,
                "task {task_id} completed but the upstream gave no result object"
            ),
            BridgedUnanswered { upstream_version } => write!(
                f,
                "the {upstream_version} upstream gave no JSON-RPC answer to the bridged request"
            ),
            BridgedNeitherResultNorError => f.write_str(
                "the 2026-07-28 upstream answered the bridged request with neither a result nor an error",
            ),
            TaskGetUnanswered { task_id } => write!(
                f,
                "the upstream gave no answer to tasks/get for task {task_id}"
            ),
            FollowUnanswered => f.write_str("no answer"),
            MalformedCreateTaskResult => {
                f.write_str("the upstream answered with a malformed CreateTaskResult (no string taskId, an empty one, one over 1024 bytes or holding a control character, no valid task status, or in the other protocol era's shape): not passed on; a task it names is cancelled upstream")
            }
            DiscoverUnanswered => f.write_str(
                "the 2026-07-28 upstream did not answer server/discover; taskgate cannot open a session for it",
            ),
            TaskInputsExceeded {
                task_id,
                asked,
                max,
            } => write!(
                f,
                "task {task_id} asks for {asked} inputs, more than taskgate relays for one task ({max}); the task was cancelled"
            ),
            TaskInputNotRelayed { task_id, method } => write!(
                f,
                "task {task_id} needs input by `{method}`, which this client did not declare (or taskgate cannot relay); the task was cancelled"
            ),
            CancelNotRecorded { task_id } => write!(
                f,
                "the cancel of task {task_id} was acknowledged but could not be recorded"
            ),
            InputNotAllowed => f.write_str(
                "the 2026-07-28 upstream asked for input within a request that MRTR does not allow (only tools/call, prompts/get and resources/read may answer input_required)",
            ),
            UpstreamSessionNotHeld { upstream, detail } => write!(
                f,
                "taskgate could not hold a 2025-11-25 session on upstream `{upstream}`: {detail}"
            ),
            NoRandomSessionId => f.write_str(
                "taskgate could not draw a session id from the operating system's random source",
            ),
            NotForwardable => f.write_str(
                "taskgate holds this session and cannot send this message to the 2026-07-28 upstream",
            ),
            UriTooLong { max } => write!(
                f,
                "the resource URI is longer than taskgate keeps ({max} bytes)"
            ),
            TooManySubscriptions { max } => write!(
                f,
                "taskgate keeps at most {max} resource subscriptions per session"
            ),
            SubscriptionBytesExceeded { max } => write!(
                f,
                "taskgate keeps at most {max} bytes of resource subscriptions per principal"
            ),
            HeldListenFull => f.write_str(
                "taskgate holds listen state for as many held sessions as it keeps; try again later",
            ),
        }
    }
}

impl std::error::Error for McpError {}

/// A `tasks/*` request taskgate refuses about one task, borrowing the id: the same words as
/// [`McpError::TaskNotFound`] and [`McpError::TaskAlreadyTerminal`] (its code, message and
/// response are theirs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TaskError<'a> {
    /// [`McpError::TaskNotFound`].
    NotFound {
        /// The `taskId` as the request named it.
        task_id: &'a str,
    },
    /// [`McpError::TaskAlreadyTerminal`].
    AlreadyTerminal {
        /// The `taskId` as the request named it.
        task_id: &'a str,
        /// The task's terminal status.
        status: TaskStatus,
    },
}

/// A `taskId` a client sent, as an error message repeats it: whole up to [`ECHOED_ID_BYTES`],
/// else its start and its length (break-tasks L5: a 3,000-byte id came back whole in the
/// `-32602`, for every such request).
struct Echoed<'a>(&'a str);

/// The longest client-sent `taskId` an error message repeats whole, in bytes.
const ECHOED_ID_BYTES: usize = 128;

impl fmt::Display for Echoed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = self.0;
        if id.len() <= ECHOED_ID_BYTES {
            return f.write_str(id);
        }
        let kept = crate::text::prefix(id, ECHOED_ID_BYTES / 2);
        write!(f, "{kept}… ({} bytes)", id.len())
    }
}

impl From<TaskError<'_>> for McpError {
    fn from(e: TaskError<'_>) -> McpError {
        match e {
            TaskError::NotFound { task_id } => McpError::TaskNotFound {
                task_id: task_id.to_string(),
            },
            TaskError::AlreadyTerminal { task_id, status } => McpError::TaskAlreadyTerminal {
                task_id: task_id.to_string(),
                status,
            },
        }
    }
}

impl TaskError<'_> {
    /// The JSON-RPC code: `-32602` for both.
    pub fn code(&self) -> i64 {
        McpError::from(*self).code()
    }

    /// The error's message.
    pub fn message(&self) -> String {
        McpError::from(*self).to_string()
    }

    /// The JSON-RPC error response under `id`.
    pub fn response(&self, id: Option<&Id>) -> Bytes {
        McpError::from(*self).body(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// One of each variant.
    fn every_variant() -> Vec<McpError> {
        let s = |t: &str| t.to_string();
        vec![
            McpError::TaskNotFound { task_id: s("t1") },
            McpError::TaskAlreadyTerminal {
                task_id: s("t1"),
                status: TaskStatus::Completed,
            },
            McpError::NoAuthorisedTask,
            McpError::TaskLimitExceeded {
                limit: 3,
                upstream: s("u"),
            },
            McpError::ResultNotKept { task_id: s("t1") },
            McpError::NotAwaitingInput {
                method: s("tasks/update"),
                task_id: s("t1"),
            },
            McpError::NoResult {
                task_id: s("t1"),
                status: TaskStatus::Failed,
                status_message: None,
            },
            McpError::NoRandomTaskId,
            McpError::RecordNotMade,
            McpError::NotRecorded {
                before_upstream: false,
            },
            McpError::TaskIdReused {
                task_id: s("t1"),
                upstream: s("u"),
            },
            McpError::LeaseNotTaken,
            McpError::MissingTasksExtension,
            McpError::NotInModernEra {
                method: s("tasks/list"),
            },
            McpError::TasksListUnavailable,
            McpError::ParamsUnreadable {
                method: None,
                detail: s("eof"),
            },
            McpError::MissingParam {
                method: None,
                key: "taskId",
                shape: "a string",
            },
            McpError::InvalidParam {
                method: None,
                key: s("task.ttl"),
                problem: s("is odd"),
            },
            McpError::InvalidCursor {
                not_a_string: false,
            },
            McpError::TooManyTaskIds { max: 256 },
            McpError::InvalidParams { message: s("bad") },
            McpError::IdInFlight { id: s("1") },
            McpError::SessionNotFound,
            McpError::SessionsFull,
            McpError::SessionStore { write: true },
            McpError::SessionIdTooLong { len: 9, bound: 8 },
            McpError::Overloaded { message: s("full") },
            McpError::StoreUnavailable { method: None },
            McpError::StoreFailed { method: None },
            McpError::ListFailed,
            McpError::Upstream { detail: s("x") },
            McpError::CancelAnsweredHttp {
                upstream: s("u"),
                status: 500,
            },
            McpError::CancelNoOutcome,
            McpError::UpgradeEnded,
            McpError::UpgradeUnanswered { upstream: s("u") },
            McpError::UpgradeTooChatty {
                upstream: s("u"),
                limit: 8,
                cancelled: true,
            },
            McpError::UpgradeResultNotObject,
            McpError::UpgradeNoResult {
                status: s("failed"),
                status_message: None,
            },
            McpError::UpgradeNeedsCapability {
                method: "elicitation/create",
                capability: s("elicitation"),
            },
            McpError::UpgradeFollowFailed { detail: s("x") },
            McpError::InputRoundsExceeded { max: 8 },
            McpError::InputRequestsMissing,
            McpError::TooManyInputs { asked: 9, max: 8 },
            McpError::InputNotRelayed {
                method: s("elicitation/create"),
                capability: None,
            },
            McpError::RetryUnanswered,
            McpError::InputRequiredLost,
            McpError::InputTimeout {
                round: 1,
                timeout_ms: 5,
            },
            McpError::InputRefused {
                method: s("sampling/createMessage"),
            },
            McpError::TaskExpired { task_id: s("t1") },
            McpError::CompletedWithoutResult { task_id: s("t1") },
            McpError::BridgedUnanswered {
                upstream_version: "2026-07-28",
            },
            McpError::BridgedNeitherResultNorError,
            McpError::TaskGetUnanswered { task_id: s("t1") },
            McpError::FollowUnanswered,
            McpError::MalformedCreateTaskResult,
            McpError::DiscoverUnanswered,
            McpError::TaskInputsExceeded {
                task_id: s("t1"),
                asked: 9,
                max: 8,
            },
            McpError::TaskInputNotRelayed {
                task_id: s("t1"),
                method: s("sampling/createMessage"),
            },
            McpError::CancelNotRecorded { task_id: s("t1") },
            McpError::InputNotAllowed,
            McpError::UpstreamSessionNotHeld {
                upstream: s("u"),
                detail: s("x"),
            },
            McpError::NoRandomSessionId,
            McpError::NotForwardable,
            McpError::UriTooLong { max: 8 },
            McpError::TooManySubscriptions { max: 8 },
            McpError::SubscriptionBytesExceeded { max: 8 },
            McpError::HeldListenFull,
        ]
    }

    /// The variant → (code, HTTP status under 2025-11-25, under 2026-07-28) table, pinned.
    #[test]
    fn each_variant_has_its_code_and_status_per_era() {
        let table: Vec<(String, i64, u16, u16)> = every_variant()
            .iter()
            .map(|e| {
                let name = format!("{e:?}");
                let name = name
                    .split([' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let status = |era| e.http_status(era).as_u16();
                (name, e.code(), status(Era::Legacy), status(Era::Modern))
            })
            .collect();
        let expected: Vec<(&str, i64, u16, u16)> = vec![
            ("TaskNotFound", -32602, 200, 400),
            ("TaskAlreadyTerminal", -32602, 200, 400),
            ("NoAuthorisedTask", -32602, 200, 400),
            ("TaskLimitExceeded", -32029, 200, 200),
            ("ResultNotKept", -32603, 200, 200),
            ("NotAwaitingInput", -32602, 200, 400),
            ("NoResult", -32603, 200, 200),
            ("NoRandomTaskId", -32603, 200, 200),
            ("RecordNotMade", -32603, 200, 200),
            ("NotRecorded", -32603, 200, 200),
            ("TaskIdReused", -32603, 200, 200),
            ("LeaseNotTaken", -32603, 200, 200),
            ("MissingTasksExtension", -32021, 200, 400),
            ("NotInModernEra", -32601, 200, 404),
            ("TasksListUnavailable", -32601, 200, 404),
            ("ParamsUnreadable", -32602, 200, 400),
            ("MissingParam", -32602, 200, 400),
            ("InvalidParam", -32602, 200, 400),
            ("InvalidCursor", -32602, 200, 400),
            ("TooManyTaskIds", -32602, 200, 400),
            ("InvalidParams", -32602, 200, 400),
            ("IdInFlight", -32600, 200, 400),
            ("SessionNotFound", -32001, 404, 404),
            ("SessionsFull", -32603, 503, 503),
            ("SessionStore", -32603, 500, 500),
            ("SessionIdTooLong", -32603, 502, 502),
            ("Overloaded", -32603, 503, 503),
            ("StoreUnavailable", -32603, 200, 200),
            ("StoreFailed", -32603, 200, 200),
            ("ListFailed", -32603, 200, 200),
            ("Upstream", -32603, 200, 200),
            ("CancelAnsweredHttp", -32603, 200, 200),
            ("CancelNoOutcome", -32603, 200, 200),
            ("UpgradeEnded", -32603, 200, 200),
            ("UpgradeUnanswered", -32603, 200, 200),
            ("UpgradeTooChatty", -32603, 200, 200),
            ("UpgradeResultNotObject", -32603, 200, 200),
            ("UpgradeNoResult", -32603, 200, 200),
            ("UpgradeNeedsCapability", -32603, 200, 200),
            ("UpgradeFollowFailed", -32603, 200, 200),
            ("InputRoundsExceeded", -32603, 200, 200),
            ("InputRequestsMissing", -32603, 200, 200),
            ("TooManyInputs", -32603, 200, 200),
            ("InputNotRelayed", -32600, 200, 400),
            ("RetryUnanswered", -32603, 200, 200),
            ("InputRequiredLost", -32603, 200, 200),
            ("InputTimeout", -32603, 200, 200),
            ("InputRefused", -32603, 200, 200),
            ("TaskExpired", -32602, 200, 400),
            ("CompletedWithoutResult", -32603, 200, 200),
            ("BridgedUnanswered", -32603, 200, 200),
            ("BridgedNeitherResultNorError", -32603, 200, 200),
            ("TaskGetUnanswered", -32603, 200, 200),
            ("FollowUnanswered", -32603, 200, 200),
            ("MalformedCreateTaskResult", -32603, 200, 200),
            ("DiscoverUnanswered", -32603, 200, 200),
            ("TaskInputsExceeded", -32603, 200, 200),
            ("TaskInputNotRelayed", -32603, 200, 200),
            ("CancelNotRecorded", -32603, 200, 200),
            ("InputNotAllowed", -32603, 200, 200),
            ("UpstreamSessionNotHeld", -32603, 200, 200),
            ("NoRandomSessionId", -32603, 200, 200),
            ("NotForwardable", -32600, 200, 400),
            ("UriTooLong", -32602, 200, 400),
            ("TooManySubscriptions", -32602, 200, 400),
            ("SubscriptionBytesExceeded", -32602, 200, 400),
            ("HeldListenFull", -32603, 503, 503),
        ];
        let expected: Vec<(String, i64, u16, u16)> = expected
            .into_iter()
            .map(|(name, code, legacy, modern)| (name.to_string(), code, legacy, modern))
            .collect();
        assert_eq!(table, expected);
    }

    #[test]
    fn only_no_room_asks_to_retry() {
        for e in every_variant() {
            let expected =
                matches!(e, McpError::Overloaded { .. } | McpError::HeldListenFull).then_some(1);
            assert_eq!(e.retry_after_secs(), expected, "{e:?}");
        }
    }

    #[test]
    fn the_body_carries_the_code_and_message_under_the_id() {
        let id = Id::from_json("7").unwrap();
        for e in every_variant() {
            let v: Value = serde_json::from_slice(&e.body(Some(&id))).unwrap();
            assert_eq!(v["id"], 7);
            assert_eq!(v["error"]["code"], e.code(), "{e:?}");
            assert_eq!(v["error"]["message"], e.to_string(), "{e:?}");
        }
    }

    #[test]
    fn the_tasks_extension_is_named_in_minus_32021() {
        let e: Value = serde_json::from_slice(&missing_tasks_extension(None)).unwrap();
        assert_eq!(e["error"]["code"], -32021);
        assert_eq!(e["error"]["message"], "Missing required client capability");
        assert!(
            e["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXTENSION].is_object()
        );
    }

    #[test]
    fn messages_are_built_from_their_fields() {
        let s = |t: &str| t.to_string();
        let cases = [
            (
                McpError::MissingParam {
                    method: Some(s("tasks/get")),
                    key: "taskId",
                    shape: "a string",
                },
                "tasks/get: params.taskId (a string) is required",
            ),
            (
                McpError::InvalidParam {
                    method: Some(s("subscriptions/listen")),
                    key: s("notifications.taskIds"),
                    problem: s("cannot be read"),
                },
                "subscriptions/listen: params.notifications.taskIds cannot be read",
            ),
            (
                McpError::InvalidCursor { not_a_string: true },
                "tasks/list: invalid cursor (must be a string)",
            ),
            (
                McpError::StoreUnavailable {
                    method: Some(s("subscriptions/listen")),
                },
                "subscriptions/listen: task store unavailable; try again",
            ),
            (
                McpError::StoreUnavailable { method: None },
                "task store unavailable; try again",
            ),
            (
                McpError::NotInModernEra {
                    method: s("tasks/result"),
                },
                "Method not found: tasks/result does not exist under MCP 2026-07-28",
            ),
            (
                McpError::NoResult {
                    task_id: s("t1"),
                    status: TaskStatus::Cancelled,
                    status_message: Some(s("ignored")),
                },
                "task t1 was cancelled; it has no result",
            ),
            (
                McpError::NoResult {
                    task_id: s("t1"),
                    status: TaskStatus::Failed,
                    status_message: Some(s("boom")),
                },
                "boom",
            ),
            (
                McpError::NoResult {
                    task_id: s("t1"),
                    status: TaskStatus::Failed,
                    status_message: None,
                },
                "task t1 failed",
            ),
            (
                McpError::UpgradeNoResult {
                    status: s("failed"),
                    status_message: Some(s("boom")),
                },
                "the upgraded task ended with status `failed` (boom), but tasks/result gave no answer",
            ),
            (
                McpError::UpgradeTooChatty {
                    upstream: s("u"),
                    limit: 8,
                    cancelled: false,
                },
                "upstream `u` sent more than 8 messages before answering the upgraded tools/call; the exchange was ended",
            ),
            (
                McpError::BridgedUnanswered {
                    upstream_version: crate::mcp::era::MODERN_VERSION,
                },
                "the 2026-07-28 upstream gave no JSON-RPC answer to the bridged request",
            ),
        ];
        for (e, message) in cases {
            assert_eq!(e.to_string(), message);
        }
    }

    #[test]
    fn task_errors_say_which_task() {
        let e = TaskError::NotFound { task_id: "t1" };
        assert_eq!(
            (e.code(), e.message().as_str()),
            (-32602, "Task not found: t1")
        );
        // A long id is not echoed whole (break-tasks L5), and is cut on a character boundary.
        let long = format!("é{}", "x".repeat(2_999));
        let message = McpError::from(TaskError::NotFound { task_id: &long }).to_string();
        assert_eq!(
            message,
            format!("Task not found: é{}… (3001 bytes)", "x".repeat(62))
        );
        let e = TaskError::AlreadyTerminal {
            task_id: "t1",
            status: TaskStatus::Completed,
        };
        assert_eq!(
            e.message(),
            "Cannot cancel task t1: it is already completed (a terminal status)"
        );
        assert_eq!(modern_error_status(e.code()), StatusCode::BAD_REQUEST);
    }
}

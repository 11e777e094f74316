//! Label enums: every label with a fixed set of values, with `as_str()` (the exposed value) and
//! `ALL` (every value, used both to pre-create series and, by construction, to record them).

pub use crate::mcp::task::TaskStatus;
pub use crate::store::record::Origin;

/// A label with a fixed set of values.
pub trait Label: Copy + 'static {
    /// Every value, in the order they are pre-created.
    const ALL: &'static [Self];
    /// The label value as exposed.
    fn as_str(self) -> &'static str;
}

/// Defines a label enum: variants with their label values, `as_str()`, `ALL` and [`Label`].
macro_rules! label_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $var:ident = $val:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* #[doc = concat!("`", $val, "`")] $var,)+
        }
        impl $name {
            /// Every value of this label.
            pub const ALL: &'static [Self] = &[$(Self::$var,)+];
            /// The label value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$var => $val,)+
                }
            }
        }
        impl Label for $name {
            const ALL: &'static [Self] = $name::ALL;
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }
    };
}

impl Label for TaskStatus {
    const ALL: &'static [Self] = TaskStatus::ALL;
    fn as_str(self) -> &'static str {
        TaskStatus::as_str(self)
    }
}

impl Label for Origin {
    const ALL: &'static [Self] = Origin::ALL;
    fn as_str(self) -> &'static str {
        Origin::as_str(self)
    }
}

label_enum! {
    /// `method` of `taskgate_requests_total` and `taskgate_request_duration_seconds`: the MCP
    /// method (anything unknown is `other`), or what a POST without a method or a GET/DELETE is.
    McpMethod {
        Initialize = "initialize",
        Ping = "ping",
        ToolsList = "tools/list",
        ToolsCall = "tools/call",
        ResourcesList = "resources/list",
        ResourcesRead = "resources/read",
        ResourcesTemplatesList = "resources/templates/list",
        ResourcesSubscribe = "resources/subscribe",
        ResourcesUnsubscribe = "resources/unsubscribe",
        PromptsList = "prompts/list",
        PromptsGet = "prompts/get",
        CompletionComplete = "completion/complete",
        LoggingSetLevel = "logging/setLevel",
        TasksGet = "tasks/get",
        TasksResult = "tasks/result",
        TasksList = "tasks/list",
        TasksCancel = "tasks/cancel",
        NotificationsInitialized = "notifications/initialized",
        NotificationsCancelled = "notifications/cancelled",
        NotificationsProgress = "notifications/progress",
        NotificationsRootsListChanged = "notifications/roots/list_changed",
        NotificationsTasksStatus = "notifications/tasks/status",
        ServerDiscover = "server/discover",
        TasksUpdate = "tasks/update",
        SubscriptionsListen = "subscriptions/listen",
        NotificationsTasks = "notifications/tasks",
        /// Any other method.
        Other = "other",
        /// A POSTed JSON-RPC error response.
        ErrorResponse = "(error)",
        /// A POSTed JSON-RPC result response.
        Response = "(response)",
        /// A GET (open the server-to-client stream).
        Get = "GET",
        /// A DELETE (end the session).
        Delete = "DELETE",
    }
}

impl McpMethod {
    /// The label of a JSON-RPC method name; `Other` when it is not a known MCP method.
    pub fn of(method: &str) -> McpMethod {
        // The values before `Other` in `ALL` are the MCP method names.
        McpMethod::ALL
            .iter()
            .take_while(|m| **m != McpMethod::Other)
            .find(|m| m.as_str() == method)
            .copied()
            .unwrap_or(McpMethod::Other)
    }
}

label_enum! {
    /// `outcome` of `taskgate_requests_total`.
    RequestOutcome {
        /// A 2xx reply from the upstream.
        Ok = "ok",
        /// Answered by taskgate itself, without the upstream (see [`LocalReason`]).
        Local = "local",
        /// The upstream answered non-2xx.
        UpstreamStatus = "upstream_status",
        /// The upstream could not be reached.
        Unreachable = "unreachable",
        /// The upstream did not answer in time.
        Timeout = "timeout",
        /// The upstream's answer was not valid.
        UpstreamInvalid = "upstream_invalid",
        /// taskgate refused the request (shutting down).
        Rejected = "rejected",
    }
}

label_enum! {
    /// `kind` of `taskgate_upstream_errors_total`.
    UpstreamErrorKind {
        Connect = "connect",
        Timeout = "timeout",
        Protocol = "protocol",
        /// An SSE answer or GET stream whose body failed before its end (reset, truncated).
        StreamReset = "stream_reset",
        /// The upstream refused taskgate's credentials, or a request without any (HTTP 401 or
        /// 403 to a request without the client's own `Authorization`; answered 502).
        Auth = "auth",
    }
}

label_enum! {
    /// `kind` of `taskgate_sse_streams_open`: the stream of a POST reply or a GET stream.
    SseKind {
        Post = "post",
        Get = "get",
    }
}

label_enum! {
    /// `reason` of `taskgate_http_rejections_total`.
    RejectReason {
        Parse = "parse",
        Batch = "batch",
        Invalid = "invalid",
        Accept = "accept",
        ContentType = "content_type",
        BodyTooLarge = "body_too_large",
        BodyTimeout = "body_timeout",
        Host = "host",
        Origin = "origin",
        Auth = "auth",
        Scope = "scope",
        RateLimit = "rate_limit",
        InFlight = "in_flight",
        /// A GET past `limits.max_get_streams`.
        GetStreams = "get_streams",
        /// A client address past `limits.auth_failures_per_minute`.
        AuthFailures = "auth_failures",
        Route = "route",
        Method = "method",
        /// An `Mcp-Session-Id` that is empty, not visible ASCII, a list, or on two lines.
        SessionId = "session_id",
        /// An `MCP-Protocol-Version` taskgate does not serve, or on two lines.
        ProtocolVersion = "protocol_version",
        /// `Mcp-Method`/`Mcp-Name` that disagree with the body or are malformed (`-32020`).
        HeaderMismatch = "header_mismatch",
    }
}

label_enum! {
    /// `reason` of `taskgate_task_creation_refused_total`.
    CreationRefusal {
        /// The owner was at `max_live_tasks_per_owner` (before the upstream; or, 2026, a task
        /// the upstream made anyway, cancelled).
        OwnerLimit = "owner_limit",
        /// The store write of the record failed.
        Store = "store",
        /// The upstream's `taskId` is already recorded for that upstream (not handed out).
        Duplicate = "duplicate",
    }
}

label_enum! {
    /// `method` of `taskgate_task_lookups_rejected_total`.
    TaskMethod {
        Get = "tasks/get",
        Result = "tasks/result",
        Cancel = "tasks/cancel",
    }
}

impl TaskMethod {
    /// The label of `tasks/get|result|cancel`; `None` for any other method.
    pub fn parse(method: &str) -> Option<TaskMethod> {
        TaskMethod::ALL
            .iter()
            .find(|m| m.as_str() == method)
            .copied()
    }
}

label_enum! {
    /// `outcome` of `taskgate_cancel_requests_total`.
    CancelOutcome {
        Forwarded = "forwarded",
        Deduplicated = "deduplicated",
        RejectedTerminal = "rejected_terminal",
        /// A 2026-07-28 cancel of a terminal task: taskgate acknowledges it (the spec defines
        /// no error there) without calling the upstream (break-tasks L7: it was counted
        /// `rejected_terminal`, which it is not).
        AcknowledgedTerminal = "acknowledged_terminal",
        RejectedUnknown = "rejected_unknown",
        UpstreamError = "upstream_error",
    }
}

impl CancelOutcome {
    /// The outcome of a cancel of a terminal task answered by taskgate: acknowledged
    /// (`acknowledged`: the 2026-07-28 ack) or rejected (the 2025-11-25 `-32602`).
    pub fn of_terminal(acknowledged: bool) -> CancelOutcome {
        match acknowledged {
            true => CancelOutcome::AcknowledgedTerminal,
            false => CancelOutcome::RejectedTerminal,
        }
    }
}

label_enum! {
    /// `reason` of `taskgate_task_resources_released_total`.
    ReleaseReason {
        /// The upstream went quiet about the task for `release_quiet_ms`.
        Quiet = "quiet",
        /// Released after a restart found the task cancelled but not released.
        Restart = "restart",
        /// The record expired before a release was seen.
        Expired = "expired",
        /// The upstream process that ran the task is gone (a stdio child exited).
        ProcessExited = "process_exited",
        /// The upstream answered that it no longer has the task (or the task's session): it
        /// lost it (a restart), so nothing is held for it any more.
        UpstreamLost = "upstream_lost",
    }
}

label_enum! {
    /// `outcome` of `taskgate_upgraded_calls_total` (see `layers::upgrade`).
    UpgradeOutcome {
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
        Orphaned = "orphaned",
        /// A PostgreSQL tier: a call whose follower was lost with its replica, adopted and
        /// followed to its end by this replica (`layers::upgrade::follow_adopted`).
        Adopted = "adopted",
        UpstreamError = "upstream_error",
        Disconnected = "disconnected",
        RefusedCapability = "refused_capability",
        NotATask = "not_a_task",
        RelayOverflow = "relay_overflow",
    }
}

label_enum! {
    /// `reason` of `taskgate_bridge_input_refused_total`: why an input request was not relayed
    /// to its 2025-11-25 client: a bridged task's (the task is then cancelled; see
    /// `layers::bridge::input`), or one of an MRTR exchange (the request is answered with an
    /// error; its [`MrtrOutcome`] says the same, `Metrics::bridge_mrtr`).
    InputRefusal {
        /// The client did not declare the capability the request needs (or taskgate does not
        /// relay its method).
        Capability = "capability",
        /// The task asked for more input keys than taskgate relays for one task.
        TooManyKeys = "too_many_keys",
        /// The client answered a `sampling/createMessage` (or any request whose 2026 result
        /// has no refusal form) with a JSON-RPC error: no `inputResponses` value can say so.
        ClientError = "client_error",
        /// The reverse bridge: a 2025-11-25 server's request a 2026-07-28 client cannot answer
        /// (during a plain call, or during a task for a capability the client did not
        /// declare), answered `-32601` upstream at once; nothing is cancelled.
        Undeclared = "undeclared",
    }
}

label_enum! {
    /// `outcome` of `taskgate_bridge_mrtr_total`: how a 2025-11-25 client's request that a
    /// 2026-07-28 upstream answered `input_required` (MRTR) ended (see `layers::bridge::mrtr`).
    MrtrOutcome {
        /// A final (not `input_required`) answer reached the client.
        Completed = "completed",
        /// The client did not declare the capability an input request needs.
        RefusedCapability = "refused_capability",
        /// One round asked for more keys than taskgate relays.
        TooManyKeys = "too_many_keys",
        /// The upstream asked for input in more rounds than taskgate relays.
        TooManyRounds = "too_many_rounds",
        /// The client did not answer a round's input requests within the upstream's `timeout_ms`.
        Timeout = "timeout",
        /// The client answered an input request with an error no input response can carry (a
        /// `sampling/createMessage`).
        ClientError = "client_error",
        /// The client cancelled the request or closed its stream.
        Disconnected = "disconnected",
        /// A retry failed or got no answer, or an `input_required` result was malformed.
        UpstreamError = "upstream_error",
    }
}

label_enum! {
    /// `reason` of `taskgate_cancelled_notifications_dropped_total`.
    DropReason {
        Initialize = "initialize",
        Task = "task",
        Duplicate = "duplicate",
        /// The `requestId` is in flight on the upstream session only for other callers
        /// (`layers::ids`): forwarding it would cancel another client's request.
        OtherCaller = "other_caller",
        /// The caller has two requests in flight under that `requestId` (`layers::ids`).
        Ambiguous = "ambiguous",
    }
}

label_enum! {
    /// `outcome` of `taskgate_unrecorded_task_cancels_total`: the `tasks/cancel` taskgate sends
    /// for a task it could not record (see `layers::observe`).
    UndoOutcome {
        /// The upstream answered it (a result or a JSON-RPC error).
        Answered = "answered",
        /// No answer: the upstream could not be reached, timed out or gave no JSON-RPC message.
        Failed = "failed",
    }
}

label_enum! {
    /// `kind` of `taskgate_upstream_oversize_total`: a whole JSON body, or one SSE line or event.
    OversizeKind {
        Json = "json",
        SseEvent = "sse_event",
    }
}

label_enum! {
    /// `reason` of `taskgate_local_answers_total`: why taskgate answered a request itself.
    LocalReason {
        /// `tasks/*` for a task that is unknown, expired or another owner's (`-32602`).
        TaskNotFound = "task_not_found",
        /// A `tasks/*` request without `params.taskId` (`-32602`).
        InvalidParams = "invalid_params",
        /// 2026-07-28 `tasks/*` without the tasks extension in `_meta` (`-32021`).
        MissingExtension = "missing_extension",
        /// A method the request's era does not have (`tasks/result`, `tasks/list` in 2026: `-32601`).
        MethodNotFound = "method_not_found",
        /// `tasks/cancel` of a task recorded terminal (2025: `-32602`; 2026: the ack).
        CancelTerminal = "cancel_terminal",
        /// 2026-07-28 `tasks/cancel` of a task whose cancel the upstream already acknowledged.
        CancelAcknowledged = "cancel_acknowledged",
        /// A terminal task's `tasks/get` / `tasks/result` served from the record.
        StoredResult = "stored_result",
        /// `tasks/list` served from the registry.
        TasksList = "tasks_list",
        /// A task-augmented call over `tasks.max_live_tasks_per_owner`.
        OwnerLimit = "owner_limit",
        /// `tasks/*` whose authorising registry read failed (the database is unreachable,
        /// PostgreSQL store): `-32603`, never "not found".
        StoreUnavailable = "store_unavailable",
        /// A 2025-11-25 session taskgate holds itself for an upstream without 2025 sessions
        /// (`layers::bridge`, held sessions): its `initialize`, `notifications/initialized`,
        /// `ping`, GET (405) and DELETE.
        HeldSession = "held_session",
        /// A 2026-07-28 request to a 2025-11-25-only upstream answered from the session taskgate
        /// holds on it (`layers::bridge::reverse`): `server/discover` from its
        /// `InitializeResult`, the `tasks/update` ack, GET and DELETE (405), a POSTed response.
        HeldUpstreamSession = "held_upstream_session",
        /// A 2025-11-25 request whose id the same client session has in flight on its
        /// upstream session (`layers::ids`: `-32600`).
        IdInFlight = "id_in_flight",
        /// A gateway-owned task's `CreateTaskResult`, `tasks/get`, `tasks/result` or
        /// `tasks/cancel` (`upstream.tasks = "gateway"`, `layers::gateway_tasks`): taskgate runs
        /// the task, so it answers them.
        GatewayTask = "gateway_task",
    }
}

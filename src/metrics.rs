//! Prometheus registry and metric handles, exposed in the text format on the admin `/metrics`.
//!
//! Names follow Prometheus conventions (`_total` counters, `_seconds` base units). Labels are
//! bounded: upstream names come from the config, methods from the MCP method list (anything else
//! is `other`), outcomes and statuses from fixed sets. A task id, session id or principal is never
//! a label. Label values that alerts and dashboards use are created at start-up for every
//! configured upstream, so their series exist (at 0) before the first event.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// MCP methods used as the `method` label; others are counted as `other`.
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "notifications/tasks/status",
];

/// The `method` label for a JSON-RPC method (bounded set).
pub fn method_label(method: &str) -> &'static str {
    KNOWN_METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("other")
}

/// Status values of the 2025-11-25 `TaskStatus` enum, used as label values.
pub const TASK_STATUSES: &[&str] = &[
    "working",
    "input_required",
    "completed",
    "failed",
    "cancelled",
];

/// Outcomes of `taskgate_cancel_requests_total`.
pub const CANCEL_OUTCOMES: &[&str] = &[
    "forwarded",
    "deduplicated",
    "rejected_terminal",
    "rejected_unknown",
    "upstream_error",
];

/// Every metric handle taskgate records into. Built once per process and shared by `Arc`.
pub struct Metrics {
    registry: Registry,
    /// `taskgate_requests_total{upstream,method,outcome}`: client requests by outcome
    /// (`ok`, `upstream_status` (upstream answered non-2xx), `unreachable`, `timeout`,
    /// `upstream_invalid`, `rejected` (taskgate refused it), `local` (taskgate answered it)).
    pub requests_total: IntCounterVec,
    /// `taskgate_request_duration_seconds{upstream,method}`: time from the request to the reply's
    /// headers (for SSE replies: to the start of the stream), in seconds.
    pub request_duration_seconds: HistogramVec,
    /// `taskgate_upstream_errors_total{upstream,kind}`: `connect`, `timeout`, `protocol`.
    pub upstream_errors_total: IntCounterVec,
    /// `taskgate_sse_streams_open{upstream,kind}`: SSE streams being relayed now (`post`, `get`).
    pub sse_streams_open: IntGaugeVec,
    /// `taskgate_http_rejections_total{reason}`: requests refused at the edge (reason: `parse`,
    /// `batch`, `invalid`, `accept`, `content_type`, `body_too_large`, `host`, `origin`, `auth`,
    /// `route`, `method`).
    pub http_rejections_total: IntCounterVec,
    /// `taskgate_tasks{upstream,status}`: task records in the registry by status.
    pub tasks: IntGaugeVec,
    /// `taskgate_tasks_created_total{upstream,origin}` (`client`, `upgraded`).
    pub tasks_created_total: IntCounterVec,
    /// `taskgate_task_creation_refused_total{upstream,reason}` (`owner_limit`, `store`).
    pub task_creation_refused_total: IntCounterVec,
    /// `taskgate_store_write_failures_total`: failed registry writes (each also logged).
    pub store_write_failures_total: IntCounter,
    /// `taskgate_store_write_duration_seconds`: one group commit (apply + flush + fdatasync).
    pub store_write_duration_seconds: Histogram,
    /// `taskgate_task_status_transitions_total{upstream,from,to}`.
    pub task_status_transitions_total: IntCounterVec,
    /// `taskgate_task_terminal_rewrites_total{upstream}`: replies where the upstream reported a
    /// different status for a task the registry holds as terminal (the reply shows the recorded one).
    pub task_terminal_rewrites_total: IntCounterVec,
    /// `taskgate_tasks_expired_total{upstream}`: records removed by the TTL sweeper.
    pub tasks_expired_total: IntCounterVec,
    /// `taskgate_task_lookups_rejected_total{upstream,method}`: tasks/get|result|cancel refused with
    /// -32602 because the task is unknown, expired or another principal's.
    pub task_lookups_rejected_total: IntCounterVec,
    /// `taskgate_cancel_requests_total{upstream,outcome}`.
    pub cancel_requests_total: IntCounterVec,
    /// `taskgate_tasks_cancelled_total{upstream}`: "status cancelled" audit facts.
    pub tasks_cancelled_total: IntCounterVec,
    /// `taskgate_task_resources_released_total{upstream,reason}`: "resources released" audit facts.
    pub task_resources_released_total: IntCounterVec,
    /// `taskgate_tasks_cancelled_unreleased`: tasks with "status cancelled" but not yet "released".
    pub tasks_cancelled_unreleased: IntGauge,
    /// `taskgate_cancel_to_cancelled_seconds`: from the first tasks/cancel to "status cancelled".
    pub cancel_to_cancelled_seconds: Histogram,
    /// `taskgate_cancelled_to_released_seconds`: from "status cancelled" to "resources released".
    pub cancelled_to_released_seconds: Histogram,
    /// `taskgate_task_late_results_total{upstream}`: terminal statuses reported after another
    /// terminal status was recorded (for example `completed` after `cancelled`).
    pub task_late_results_total: IntCounterVec,
    /// `taskgate_task_activity_after_cancel_total{upstream}`: upstream messages about a task after
    /// it was recorded `cancelled`.
    pub task_activity_after_cancel_total: IntCounterVec,
    /// `taskgate_upgraded_calls_total{upstream,outcome}`: plain `tools/call` turned into tasks, by
    /// outcome (see `layers::upgrade`).
    pub upgraded_calls_total: IntCounterVec,
    /// `taskgate_cancelled_notifications_dropped_total{upstream,reason}`: client
    /// `notifications/cancelled` not forwarded (`initialize`, `task`, `duplicate`).
    pub cancelled_notifications_dropped_total: IntCounterVec,
    /// `taskgate_upstream_oversize_total{upstream,kind}`: upstream answers cut off because they
    /// exceeded the upstream's `max_message_bytes` (`json`: a whole JSON body; `sse_event`: one
    /// SSE line or event).
    pub upstream_oversize_total: IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric; pre-creates the label values alerts rely on for each
    /// upstream name in `upstreams`.
    pub fn new(upstreams: &[String]) -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let latency_buckets = vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0,
        ];
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("valid metric");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        let request_duration_seconds = HistogramVec::new(
            HistogramOpts::new(
                "taskgate_request_duration_seconds",
                "Time from a client request to the reply's headers, in seconds.",
            )
            .buckets(latency_buckets.clone()),
            &["upstream", "method"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(request_duration_seconds.clone()))
            .expect("unique metric");
        let audit_buckets = vec![
            0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
        ];
        let store_write_failures_total = IntCounter::new(
            "taskgate_store_write_failures_total",
            "Task registry writes that failed.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(store_write_failures_total.clone()))
            .expect("unique metric");
        let tasks_cancelled_unreleased = IntGauge::new(
            "taskgate_tasks_cancelled_unreleased",
            "Tasks whose status is cancelled but whose resources are not yet released.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(tasks_cancelled_unreleased.clone()))
            .expect("unique metric");

        let m = Metrics {
            requests_total: counter(
                "taskgate_requests_total",
                "Client requests by upstream, MCP method and outcome.",
                &["upstream", "method", "outcome"],
            ),
            request_duration_seconds,
            upstream_errors_total: counter(
                "taskgate_upstream_errors_total",
                "Failed exchanges with an upstream by kind (connect, timeout, protocol).",
                &["upstream", "kind"],
            ),
            sse_streams_open: gauge(
                "taskgate_sse_streams_open",
                "SSE streams being relayed to clients (kind: post, get).",
                &["upstream", "kind"],
            ),
            http_rejections_total: counter(
                "taskgate_http_rejections_total",
                "Requests refused at the HTTP edge, by reason.",
                &["reason"],
            ),
            tasks: gauge(
                "taskgate_tasks",
                "Task records in the registry by upstream and status.",
                &["upstream", "status"],
            ),
            tasks_created_total: counter(
                "taskgate_tasks_created_total",
                "Tasks recorded, by origin (client: the client asked for a task; upgraded: taskgate did).",
                &["upstream", "origin"],
            ),
            task_creation_refused_total: counter(
                "taskgate_task_creation_refused_total",
                "Task-augmented requests refused before reaching the upstream, by reason.",
                &["upstream", "reason"],
            ),
            store_write_failures_total,
            store_write_duration_seconds: histogram(
                "taskgate_store_write_duration_seconds",
                "Duration of one durable registry commit (apply, flush, fdatasync), in seconds.",
                vec![0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
            ),
            task_status_transitions_total: counter(
                "taskgate_task_status_transitions_total",
                "Task status transitions recorded in the registry.",
                &["upstream", "from", "to"],
            ),
            task_terminal_rewrites_total: counter(
                "taskgate_task_terminal_rewrites_total",
                "Upstream replies that reported another status for a terminal task; the recorded status was shown instead.",
                &["upstream"],
            ),
            tasks_expired_total: counter(
                "taskgate_tasks_expired_total",
                "Task records removed after their ttl.",
                &["upstream"],
            ),
            task_lookups_rejected_total: counter(
                "taskgate_task_lookups_rejected_total",
                "tasks/* requests answered -32602 because the task is unknown, expired or another principal's.",
                &["upstream", "method"],
            ),
            cancel_requests_total: counter(
                "taskgate_cancel_requests_total",
                "tasks/cancel requests by outcome.",
                &["upstream", "outcome"],
            ),
            tasks_cancelled_total: counter(
                "taskgate_tasks_cancelled_total",
                "Audit fact 'status cancelled': tasks first seen cancelled.",
                &["upstream"],
            ),
            task_resources_released_total: counter(
                "taskgate_task_resources_released_total",
                "Audit fact 'resources released' for cancelled tasks, by reason.",
                &["upstream", "reason"],
            ),
            tasks_cancelled_unreleased,
            cancel_to_cancelled_seconds: histogram(
                "taskgate_cancel_to_cancelled_seconds",
                "Time from the first tasks/cancel to the status cancelled, in seconds.",
                audit_buckets.clone(),
            ),
            cancelled_to_released_seconds: histogram(
                "taskgate_cancelled_to_released_seconds",
                "Time from the status cancelled to the resources released, in seconds.",
                audit_buckets,
            ),
            task_late_results_total: counter(
                "taskgate_task_late_results_total",
                "Terminal statuses reported after a different terminal status was recorded.",
                &["upstream"],
            ),
            task_activity_after_cancel_total: counter(
                "taskgate_task_activity_after_cancel_total",
                "Upstream messages about a task after it was recorded cancelled.",
                &["upstream"],
            ),
            upgraded_calls_total: counter(
                "taskgate_upgraded_calls_total",
                "Plain tools/call upgraded to tasks by taskgate, by outcome.",
                &["upstream", "outcome"],
            ),
            cancelled_notifications_dropped_total: counter(
                "taskgate_cancelled_notifications_dropped_total",
                "Client notifications/cancelled not forwarded upstream, by reason.",
                &["upstream", "reason"],
            ),
            upstream_oversize_total: counter(
                "taskgate_upstream_oversize_total",
                "Upstream answers cut off for exceeding max_message_bytes (kind: json, sse_event).",
                &["upstream", "kind"],
            ),
            registry,
        };
        for reason in [
            "parse",
            "batch",
            "invalid",
            "accept",
            "content_type",
            "body_too_large",
            "body_timeout",
            "host",
            "origin",
            "auth",
            "route",
            "method",
        ] {
            m.http_rejections_total.with_label_values(&[reason]);
        }
        for up in upstreams {
            let up = up.as_str();
            for (from, to) in [
                ("working", "input_required"),
                ("working", "completed"),
                ("working", "failed"),
                ("working", "cancelled"),
                ("input_required", "working"),
                ("input_required", "cancelled"),
            ] {
                m.task_status_transitions_total
                    .with_label_values(&[up, from, to]);
            }
            for kind in ["connect", "timeout", "protocol"] {
                m.upstream_errors_total.with_label_values(&[up, kind]);
            }
            for kind in ["post", "get"] {
                m.sse_streams_open.with_label_values(&[up, kind]);
            }
            for status in TASK_STATUSES {
                m.tasks.with_label_values(&[up, status]);
            }
            for origin in ["client", "upgraded"] {
                m.tasks_created_total.with_label_values(&[up, origin]);
            }
            for reason in ["owner_limit", "store"] {
                m.task_creation_refused_total
                    .with_label_values(&[up, reason]);
            }
            for outcome in CANCEL_OUTCOMES {
                m.cancel_requests_total.with_label_values(&[up, outcome]);
            }
            m.tasks_cancelled_total.with_label_values(&[up]);
            for outcome in [
                "completed",
                "failed",
                "cancelled",
                "orphaned",
                "upstream_error",
            ] {
                m.upgraded_calls_total.with_label_values(&[up, outcome]);
            }
            m.task_late_results_total.with_label_values(&[up]);
            m.task_activity_after_cancel_total.with_label_values(&[up]);
            m.task_terminal_rewrites_total.with_label_values(&[up]);
            m.tasks_expired_total.with_label_values(&[up]);
            m.task_resources_released_total
                .with_label_values(&[up, "quiet"]);
            m.requests_total
                .with_label_values(&[up, "tools/call", "ok"]);
            m.request_duration_seconds
                .with_label_values(&[up, "tools/call"]);
            for kind in ["json", "sse_event"] {
                m.upstream_oversize_total.with_label_values(&[up, kind]);
            }
        }
        m
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into a Vec cannot fail");
        buf
    }
}

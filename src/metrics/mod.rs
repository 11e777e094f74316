//! Prometheus registry and metric handles, exposed in the text format on the admin `/metrics`.
//!
//! Names follow Prometheus conventions (`_total` counters, `_seconds` base units). Labels are
//! bounded: upstream names come from the config, every other label is one of the enums below
//! (a [`Label`]: `as_str()` is the label value, `ALL` every value it can take). A task id, session
//! id or principal is never a label.
//!
//! This module is the one place metric names and label values live. Callers record through the
//! typed methods of [`Metrics`] (`metrics.cancel_request(upstream, CancelOutcome::Forwarded)`), and
//! [`Metrics::new`] pre-creates every series those methods can record, from the same `ALL`s, for
//! every configured upstream, so each exists (at 0) before the first event.

mod labels;
mod series;
mod task_facts;

pub use labels::*;
pub use series::RequestSeries;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Name, help and label names of one metric.
struct Spec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

const fn spec(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Spec {
    Spec { name, help, labels }
}

const UP: &[&str] = &["upstream"];
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const STORE_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
];
const AUDIT_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

const REQUESTS_TOTAL: Spec = spec(
    "taskgate_requests_total",
    "Client requests by upstream, MCP method and outcome.",
    &["upstream", "method", "outcome"],
);
const REQUEST_DURATION_SECONDS: Spec = spec(
    "taskgate_request_duration_seconds",
    "Time from a client request to the reply's headers, in seconds.",
    &["upstream", "method"],
);
const UPSTREAM_ERRORS_TOTAL: Spec = spec(
    "taskgate_upstream_errors_total",
    "Failed exchanges with an upstream by kind (connect, timeout, protocol, stream_reset: a stream cut before its end, auth: the upstream refused taskgate's credentials).",
    &["upstream", "kind"],
);
const SSE_STREAMS_OPEN: Spec = spec(
    "taskgate_sse_streams_open",
    "SSE streams being relayed to clients (kind: post, get).",
    &["upstream", "kind"],
);
const HTTP_REJECTIONS_TOTAL: Spec = spec(
    "taskgate_http_rejections_total",
    "Requests refused at the HTTP edge, by reason.",
    &["reason"],
);
const TASKS: Spec = spec(
    "taskgate_tasks",
    "Task records in the registry by upstream and status (a tier on PostgreSQL: exported by one replica, counted in the database).",
    &["upstream", "status"],
);
const TASKS_CREATED_TOTAL: Spec = spec(
    "taskgate_tasks_created_total",
    "Tasks recorded, by origin (client: the client asked for a task; upgraded: taskgate made a plain call one; bridged: a 2025-11-25 client's task on a 2026-07-28 upstream; gateway: a task taskgate runs itself).",
    &["upstream", "origin"],
);
const TASK_CREATION_REFUSED_TOTAL: Spec = spec(
    "taskgate_task_creation_refused_total",
    "Task creations not recorded, by reason (owner_limit: over max_live_tasks_per_owner; store: the record's write failed; duplicate: the upstream's taskId was already recorded).",
    &["upstream", "reason"],
);
const STORE_WRITE_FAILURES_TOTAL: Spec = spec(
    "taskgate_store_write_failures_total",
    "Task store calls that failed (writes, and the reads a request depends on).",
    &[],
);
const STORE_FAILED: Spec = spec(
    "taskgate_store_failed",
    "1 while the task store has failed for good in this process (sled after an I/O error or a commit past its deadline; restart taskgate), else 0.",
    &[],
);
const TRACE_EXPORT_FAILURES_TOTAL: Spec = spec(
    "taskgate_trace_export_failures_total",
    "Spans whose OTLP export failed ([telemetry]).",
    &[],
);
const TRACE_SPANS_DROPPED_TOTAL: Spec = spec(
    "taskgate_trace_spans_dropped_total",
    "Spans dropped before export because the export queue was full or export had stopped ([telemetry]).",
    &[],
);
const STORE_WRITE_DURATION_SECONDS: Spec = spec(
    "taskgate_store_write_duration_seconds",
    "Duration of one durable registry commit, in seconds: a group commit (apply, flush, fdatasync) of the sled store; a task write's transaction (from taking a pooled connection to its commit) of the PostgreSQL store.",
    &[],
);
const TASK_STATUS_TRANSITIONS_TOTAL: Spec = spec(
    "taskgate_task_status_transitions_total",
    "Task status transitions recorded in the registry.",
    &["upstream", "from", "to"],
);
const TASK_TERMINAL_REWRITES_TOTAL: Spec = spec(
    "taskgate_task_terminal_rewrites_total",
    "Upstream replies that reported another status for a terminal task; the recorded status was shown instead.",
    UP,
);
const TASKS_EXPIRED_TOTAL: Spec = spec(
    "taskgate_tasks_expired_total",
    "Task records removed after their ttl.",
    UP,
);
const TASK_LOOKUPS_REJECTED_TOTAL: Spec = spec(
    "taskgate_task_lookups_rejected_total",
    "tasks/* requests answered -32602 because the task is unknown, expired or another principal's.",
    &["upstream", "method"],
);
const CANCEL_REQUESTS_TOTAL: Spec = spec(
    "taskgate_cancel_requests_total",
    "tasks/cancel requests by outcome.",
    &["upstream", "outcome"],
);
const TASKS_CANCELLED_TOTAL: Spec = spec(
    "taskgate_tasks_cancelled_total",
    "Audit fact 'status cancelled': tasks first seen cancelled.",
    UP,
);
const TASK_RESOURCES_RELEASED_TOTAL: Spec = spec(
    "taskgate_task_resources_released_total",
    "Audit fact 'resources released' for cancelled tasks, by reason.",
    &["upstream", "reason"],
);
const TASKS_CANCELLED_UNRELEASED: Spec = spec(
    "taskgate_tasks_cancelled_unreleased",
    "Tasks whose status is cancelled but whose resources are not yet released.",
    &[],
);
const CANCEL_TO_CANCELLED_SECONDS: Spec = spec(
    "taskgate_cancel_to_cancelled_seconds",
    "Time from the first tasks/cancel to the status cancelled, in seconds.",
    &[],
);
const CANCELLED_TO_RELEASED_SECONDS: Spec = spec(
    "taskgate_cancelled_to_released_seconds",
    "Time from the status cancelled to the resources released, in seconds.",
    &[],
);
const TASK_LATE_RESULTS_TOTAL: Spec = spec(
    "taskgate_task_late_results_total",
    "Terminal statuses reported after a different terminal status was recorded.",
    UP,
);
const TASK_ACTIVITY_AFTER_CANCEL_TOTAL: Spec = spec(
    "taskgate_task_activity_after_cancel_total",
    "Upstream messages about a task after it was recorded cancelled.",
    UP,
);
const UPGRADED_CALLS_TOTAL: Spec = spec(
    "taskgate_upgraded_calls_total",
    "Plain tools/call upgraded to tasks by taskgate, by outcome.",
    &["upstream", "outcome"],
);
const UPGRADE_KEPT_FOLLOWERS: Spec = spec(
    "taskgate_upgrade_kept_followers",
    "Upgraded calls whose client went away followed in the background (upgrade.on_client_disconnect = \"keep\"; at most 1024 per upstream).",
    UP,
);
const BRIDGE_INPUT_REFUSED_TOTAL: Spec = spec(
    "taskgate_bridge_input_refused_total",
    "Input requests not relayed to the client, by reason: capability, too_many_keys, client_error (a bridged task's: the task is cancelled; a 2025-11-25 client's request a 2026-07-28 upstream asked input for within it, MRTR: the request is answered with an error, also counted in taskgate_bridge_mrtr_total); undeclared (a 2025-11-25 server's request during a 2026-07-28 client's call, answered -32601 upstream).",
    &["upstream", "reason"],
);
const BRIDGE_MRTR_TOTAL: Spec = spec(
    "taskgate_bridge_mrtr_total",
    "Requests of 2025-11-25 clients a 2026-07-28 upstream asked input for within the request (MRTR), by outcome.",
    &["upstream", "outcome"],
);
const BRIDGE_MRTR_ROUNDS_TOTAL: Spec = spec(
    "taskgate_bridge_mrtr_rounds_total",
    "MRTR rounds relayed to 2025-11-25 clients (input requests sent, then the request retried).",
    UP,
);
const CANCELLED_NOTIFICATIONS_DROPPED_TOTAL: Spec = spec(
    "taskgate_cancelled_notifications_dropped_total",
    "Client notifications/cancelled not forwarded upstream, by reason.",
    &["upstream", "reason"],
);
const UNRECORDED_TASK_CANCELS_TOTAL: Spec = spec(
    "taskgate_unrecorded_task_cancels_total",
    "tasks/cancel sent upstream for a task the upstream created that taskgate did not record (the store failed: the client got -32603; a 2026 task over tasks.max_live_tasks_per_owner: -32029), by outcome.",
    &["upstream", "outcome"],
);
const UPSTREAM_OVERSIZE_TOTAL: Spec = spec(
    "taskgate_upstream_oversize_total",
    "Upstream answers cut off for exceeding max_message_bytes (kind: json, sse_event).",
    &["upstream", "kind"],
);

const UPSTREAM_RESTARTS_TOTAL: Spec = spec(
    "taskgate_upstream_restarts_total",
    "Restarts of a stdio upstream's child process (every start after the first).",
    &["upstream"],
);

const LOCAL_ANSWERS_TOTAL: Spec = spec(
    "taskgate_local_answers_total",
    "Requests taskgate answered itself without the upstream, by reason.",
    &["upstream", "reason"],
);

/// Creates metrics from their [`Spec`] and registers them.
struct Builder(Registry);

impl Builder {
    fn register<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.0.register(Box::new(c.clone())).expect("unique metric");
        c
    }
    fn opts(s: &Spec) -> Opts {
        Opts::new(s.name, s.help)
    }
    fn hopts(s: &Spec, buckets: &[f64]) -> HistogramOpts {
        HistogramOpts::new(s.name, s.help).buckets(buckets.to_vec())
    }
    fn counter(&self, s: &Spec) -> IntCounter {
        self.register(IntCounter::with_opts(Self::opts(s)).expect("valid metric"))
    }
    fn counter_vec(&self, s: &Spec) -> IntCounterVec {
        self.register(IntCounterVec::new(Self::opts(s), s.labels).expect("valid metric"))
    }
    fn gauge(&self, s: &Spec) -> IntGauge {
        self.register(IntGauge::with_opts(Self::opts(s)).expect("valid metric"))
    }
    fn gauge_vec(&self, s: &Spec) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Self::opts(s), s.labels).expect("valid metric"))
    }
    fn histogram(&self, s: &Spec, buckets: &[f64]) -> Histogram {
        self.register(Histogram::with_opts(Self::hopts(s, buckets)).expect("valid metric"))
    }
    fn histogram_vec(&self, s: &Spec, buckets: &[f64]) -> HistogramVec {
        let h = HistogramVec::new(Self::hopts(s, buckets), s.labels).expect("valid metric");
        self.register(h)
    }
}

/// Creates the series `{upstream=up, <label>=v}` for every `v` of `L`.
fn touch<T: MetricVecBuilder, L: Label>(vec: &MetricVec<T>, up: &str) {
    for v in L::ALL {
        vec.with_label_values(&[up, v.as_str()]);
    }
}

/// Increments a gauge for as long as it lives (an SSE stream being relayed).
pub struct GaugeGuard(IntGauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every metric handle taskgate records into. Built once per process and shared by `Arc`.
///
/// Record through the typed methods below. The public fields remain for callers not yet
/// converted; their label values must be `as_str()` of the label enums.
pub struct Metrics {
    registry: Registry,
    /// `taskgate_requests_total{upstream,method,outcome}`: client requests by [`RequestOutcome`]
    /// (`ok`, `upstream_status` (upstream answered non-2xx), `unreachable`, `timeout`,
    /// `upstream_invalid`, `rejected` (taskgate refused it)). Answers taskgate gives itself are
    /// 2xx and count as `ok`.
    pub requests_total: IntCounterVec,
    /// `taskgate_request_duration_seconds{upstream,method}`: time from the request to the reply's
    /// headers (for SSE replies: to the start of the stream), in seconds.
    pub request_duration_seconds: HistogramVec,
    /// `taskgate_upstream_errors_total{upstream,kind}`: [`UpstreamErrorKind`].
    pub upstream_errors_total: IntCounterVec,
    /// `taskgate_sse_streams_open{upstream,kind}`: SSE streams being relayed now ([`SseKind`]).
    pub sse_streams_open: IntGaugeVec,
    /// `taskgate_http_rejections_total{reason}`: requests refused at the edge ([`RejectReason`]).
    pub http_rejections_total: IntCounterVec,
    /// `taskgate_tasks{upstream,status}`: task records in the registry by [`TaskStatus`].
    pub tasks: IntGaugeVec,
    /// `taskgate_tasks_created_total{upstream,origin}` ([`Origin`]: `client`, `upgraded`).
    pub tasks_created_total: IntCounterVec,
    /// `taskgate_task_creation_refused_total{upstream,reason}` ([`CreationRefusal`]).
    pub task_creation_refused_total: IntCounterVec,
    /// `taskgate_store_write_failures_total`: failed registry writes (each also logged).
    pub store_write_failures_total: IntCounter,
    /// `taskgate_store_failed`: 1 while the task store has failed for good in this process
    /// ([`crate::store::TaskStore::failed`]), set at each scrape; else 0.
    pub store_failed: IntGauge,
    /// `taskgate_trace_export_failures_total`: spans `[telemetry]` did not deliver because
    /// their batch's OTLP export failed (the collector unreachable, a non-2xx answer, a timeout;
    /// `src/telemetry/`).
    pub trace_export_failures_total: IntCounter,
    /// `taskgate_trace_spans_dropped_total`: spans `[telemetry]` dropped before any export
    /// because its queue (2048 spans) was full, the collector or the export thread being behind,
    /// or export had stopped (`src/telemetry/batch.rs`).
    pub trace_spans_dropped_total: IntCounter,
    /// `taskgate_store_write_duration_seconds`: one group commit (apply + flush + fdatasync) of
    /// sled, one task write's transaction of PostgreSQL.
    pub store_write_duration_seconds: Histogram,
    /// `taskgate_task_status_transitions_total{upstream,from,to}` ([`TaskStatus`] twice).
    pub task_status_transitions_total: IntCounterVec,
    /// `taskgate_task_terminal_rewrites_total{upstream}`: replies where the upstream reported a
    /// different status for a task the registry holds as terminal (the reply shows the recorded one).
    pub task_terminal_rewrites_total: IntCounterVec,
    /// `taskgate_tasks_expired_total{upstream}`: records removed by the TTL sweeper.
    pub tasks_expired_total: IntCounterVec,
    /// `taskgate_task_lookups_rejected_total{upstream,method}` ([`TaskMethod`]): tasks/get|result|cancel
    /// refused with -32602 because the task is unknown, expired or another principal's.
    pub task_lookups_rejected_total: IntCounterVec,
    /// `taskgate_cancel_requests_total{upstream,outcome}` ([`CancelOutcome`]).
    pub cancel_requests_total: IntCounterVec,
    /// `taskgate_tasks_cancelled_total{upstream}`: "status cancelled" audit facts.
    pub tasks_cancelled_total: IntCounterVec,
    /// `taskgate_task_resources_released_total{upstream,reason}` ([`ReleaseReason`]): "resources
    /// released" audit facts.
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
    /// [`UpgradeOutcome`] (see `layers::upgrade`).
    pub upgraded_calls_total: IntCounterVec,
    /// `taskgate_upgrade_kept_followers{upstream}`: kept upgraded calls (client gone,
    /// `upgrade.on_client_disconnect = "keep"`) followed in the background now (see
    /// [`Metrics::kept_follower_started`]).
    pub upgrade_kept_followers: IntGaugeVec,
    /// `taskgate_bridge_input_refused_total{upstream,reason}`: input requests not relayed to the
    /// client, by [`InputRefusal`]: a bridged task's (see `layers::bridge::input`), an MRTR
    /// exchange's (`layers::relay::mrtr`, counted in `bridge_mrtr_total` too), the reverse
    /// bridge's `undeclared`.
    pub bridge_input_refused_total: IntCounterVec,
    /// `taskgate_bridge_mrtr_total{upstream,outcome}`: requests of 2025 clients answered
    /// `input_required` by a 2026 upstream (MRTR), by [`MrtrOutcome`] (see `layers::bridge::mrtr`).
    pub bridge_mrtr_total: IntCounterVec,
    /// `taskgate_bridge_mrtr_rounds_total{upstream}`: MRTR rounds relayed to 2025 clients.
    pub bridge_mrtr_rounds_total: IntCounterVec,
    /// `taskgate_cancelled_notifications_dropped_total{upstream,reason}`: client
    /// `notifications/cancelled` not forwarded ([`DropReason`]).
    pub cancelled_notifications_dropped_total: IntCounterVec,
    /// `taskgate_unrecorded_task_cancels_total{upstream,outcome}`: `tasks/cancel` taskgate sent
    /// for a task the upstream created but the registry could not record, or refused over
    /// `tasks.max_live_tasks_per_owner` ([`UndoOutcome`]).
    pub unrecorded_task_cancels_total: IntCounterVec,
    /// `taskgate_upstream_oversize_total{upstream,kind}`: upstream answers cut off because they
    /// exceeded the upstream's `max_message_bytes` ([`OversizeKind`]).
    pub upstream_oversize_total: IntCounterVec,
    /// `taskgate_local_answers_total{upstream,reason}`: requests taskgate answered itself, without
    /// the upstream ([`LocalReason`]); counted in `taskgate_requests_total` as `outcome="local"`.
    pub local_answers_total: IntCounterVec,
    /// `taskgate_upstream_restarts_total{upstream}`: a stdio upstream's child started again
    /// after it exited or failed to start (`upstream::stdio`).
    pub upstream_restarts_total: IntCounterVec,
    /// The upstream names given to [`Metrics::new`] (their series are pre-created).
    upstreams: Vec<String>,
}

impl Metrics {
    /// Creates and registers every metric, and pre-creates every labelled series for each
    /// upstream name in `upstreams`.
    pub fn new(upstreams: &[String]) -> Metrics {
        let b = Builder(Registry::new());
        let m = Metrics {
            requests_total: b.counter_vec(&REQUESTS_TOTAL),
            request_duration_seconds: b.histogram_vec(&REQUEST_DURATION_SECONDS, LATENCY_BUCKETS),
            upstream_errors_total: b.counter_vec(&UPSTREAM_ERRORS_TOTAL),
            sse_streams_open: b.gauge_vec(&SSE_STREAMS_OPEN),
            http_rejections_total: b.counter_vec(&HTTP_REJECTIONS_TOTAL),
            tasks: b.gauge_vec(&TASKS),
            tasks_created_total: b.counter_vec(&TASKS_CREATED_TOTAL),
            task_creation_refused_total: b.counter_vec(&TASK_CREATION_REFUSED_TOTAL),
            store_write_failures_total: b.counter(&STORE_WRITE_FAILURES_TOTAL),
            store_failed: b.gauge(&STORE_FAILED),
            trace_export_failures_total: b.counter(&TRACE_EXPORT_FAILURES_TOTAL),
            trace_spans_dropped_total: b.counter(&TRACE_SPANS_DROPPED_TOTAL),
            store_write_duration_seconds: b.histogram(&STORE_WRITE_DURATION_SECONDS, STORE_BUCKETS),
            task_status_transitions_total: b.counter_vec(&TASK_STATUS_TRANSITIONS_TOTAL),
            task_terminal_rewrites_total: b.counter_vec(&TASK_TERMINAL_REWRITES_TOTAL),
            tasks_expired_total: b.counter_vec(&TASKS_EXPIRED_TOTAL),
            task_lookups_rejected_total: b.counter_vec(&TASK_LOOKUPS_REJECTED_TOTAL),
            cancel_requests_total: b.counter_vec(&CANCEL_REQUESTS_TOTAL),
            tasks_cancelled_total: b.counter_vec(&TASKS_CANCELLED_TOTAL),
            task_resources_released_total: b.counter_vec(&TASK_RESOURCES_RELEASED_TOTAL),
            tasks_cancelled_unreleased: b.gauge(&TASKS_CANCELLED_UNRELEASED),
            cancel_to_cancelled_seconds: b.histogram(&CANCEL_TO_CANCELLED_SECONDS, AUDIT_BUCKETS),
            cancelled_to_released_seconds: b
                .histogram(&CANCELLED_TO_RELEASED_SECONDS, AUDIT_BUCKETS),
            task_late_results_total: b.counter_vec(&TASK_LATE_RESULTS_TOTAL),
            task_activity_after_cancel_total: b.counter_vec(&TASK_ACTIVITY_AFTER_CANCEL_TOTAL),
            upgraded_calls_total: b.counter_vec(&UPGRADED_CALLS_TOTAL),
            upgrade_kept_followers: b.gauge_vec(&UPGRADE_KEPT_FOLLOWERS),
            bridge_input_refused_total: b.counter_vec(&BRIDGE_INPUT_REFUSED_TOTAL),
            bridge_mrtr_total: b.counter_vec(&BRIDGE_MRTR_TOTAL),
            bridge_mrtr_rounds_total: b.counter_vec(&BRIDGE_MRTR_ROUNDS_TOTAL),
            cancelled_notifications_dropped_total: b
                .counter_vec(&CANCELLED_NOTIFICATIONS_DROPPED_TOTAL),
            unrecorded_task_cancels_total: b.counter_vec(&UNRECORDED_TASK_CANCELS_TOTAL),
            upstream_oversize_total: b.counter_vec(&UPSTREAM_OVERSIZE_TOTAL),
            local_answers_total: b.counter_vec(&LOCAL_ANSWERS_TOTAL),
            upstream_restarts_total: b.counter_vec(&UPSTREAM_RESTARTS_TOTAL),
            registry: b.0,
            upstreams: upstreams.to_vec(),
        };
        for reason in RejectReason::ALL {
            m.http_rejections_total
                .with_label_values(&[reason.as_str()]);
        }
        for up in upstreams {
            m.precreate(up);
        }
        m
    }

    /// The configured upstreams' names, whose series exist from start-up.
    pub fn upstreams(&self) -> &[String] {
        &self.upstreams
    }

    /// Creates, at 0, every series with `upstream=up` that the recording methods can record.
    fn precreate(&self, up: &str) {
        // Per-method series for `tools/call` only, the method alerts and dashboards watch: every
        // method × outcome, with the duration histogram's 18 series each, would be ~650 series per
        // upstream at start-up; the other methods' series appear with their first request.
        let method = McpMethod::ToolsCall.as_str();
        self.request_duration_seconds
            .with_label_values(&[up, method]);
        for outcome in RequestOutcome::ALL {
            self.requests_total
                .with_label_values(&[up, method, outcome.as_str()]);
        }
        for &from in TaskStatus::ALL {
            for &to in TaskStatus::ALL {
                if from != to && from.can_become(to) {
                    self.task_status_transitions_total.with_label_values(&[
                        up,
                        from.as_str(),
                        to.as_str(),
                    ]);
                }
            }
        }
        touch::<_, UpstreamErrorKind>(&self.upstream_errors_total, up);
        self.upstream_restarts_total.with_label_values(&[up]);
        touch::<_, SseKind>(&self.sse_streams_open, up);
        touch::<_, TaskStatus>(&self.tasks, up);
        touch::<_, Origin>(&self.tasks_created_total, up);
        touch::<_, CreationRefusal>(&self.task_creation_refused_total, up);
        touch::<_, TaskMethod>(&self.task_lookups_rejected_total, up);
        touch::<_, CancelOutcome>(&self.cancel_requests_total, up);
        touch::<_, ReleaseReason>(&self.task_resources_released_total, up);
        touch::<_, UpgradeOutcome>(&self.upgraded_calls_total, up);
        touch::<_, InputRefusal>(&self.bridge_input_refused_total, up);
        touch::<_, MrtrOutcome>(&self.bridge_mrtr_total, up);
        touch::<_, DropReason>(&self.cancelled_notifications_dropped_total, up);
        touch::<_, OversizeKind>(&self.upstream_oversize_total, up);
        touch::<_, UndoOutcome>(&self.unrecorded_task_cancels_total, up);
        touch::<_, LocalReason>(&self.local_answers_total, up);
        for vec in [
            &self.task_terminal_rewrites_total,
            &self.tasks_expired_total,
            &self.tasks_cancelled_total,
            &self.task_late_results_total,
            &self.task_activity_after_cancel_total,
            &self.bridge_mrtr_rounds_total,
        ] {
            vec.with_label_values(&[up]);
        }
        self.upgrade_kept_followers.with_label_values(&[up]);
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into a Vec cannot fail");
        buf
    }

    // ---- recording: the edge and the upstream client ----

    // Client requests and their durations: [`RequestSeries`] (resolved per upstream).
    /// A request refused at the edge (`taskgate_http_rejections_total`).
    pub fn http_rejection(&self, reason: RejectReason) {
        self.http_rejections_total
            .with_label_values(&[reason.as_str()])
            .inc();
    }
    /// An SSE stream starts being relayed; it counts in `taskgate_sse_streams_open` until the
    /// returned guard is dropped.
    pub fn sse_stream_opened(&self, upstream: &str, kind: SseKind) -> GaugeGuard {
        let gauge = self
            .sse_streams_open
            .with_label_values(&[upstream, kind.as_str()]);
        gauge.inc();
        GaugeGuard(gauge)
    }
    /// A kept upgraded call's background follower starts; it counts in
    /// `taskgate_upgrade_kept_followers` until the returned guard is dropped.
    pub fn kept_follower_started(&self, upstream: &str) -> GaugeGuard {
        let gauge = self.upgrade_kept_followers.with_label_values(&[upstream]);
        gauge.inc();
        GaugeGuard(gauge)
    }
    /// A failed exchange with an upstream (`taskgate_upstream_errors_total`).
    pub fn upstream_error(&self, upstream: &str, kind: UpstreamErrorKind) {
        self.upstream_errors_total
            .with_label_values(&[upstream, kind.as_str()])
            .inc();
    }
    /// A stdio upstream's child started again (`taskgate_upstream_restarts_total`).
    pub fn upstream_restart(&self, upstream: &str) {
        self.upstream_restarts_total
            .with_label_values(&[upstream])
            .inc();
    }

    /// An upstream answer cut off at `max_message_bytes` (`taskgate_upstream_oversize_total`).
    pub fn upstream_oversize(&self, upstream: &str, kind: OversizeKind) {
        self.upstream_oversize_total
            .with_label_values(&[upstream, kind.as_str()])
            .inc();
    }

    /// One durable registry commit took `seconds` (`taskgate_store_write_duration_seconds`);
    /// a failed one also counts in `taskgate_store_write_failures_total`.
    pub fn store_commit(&self, seconds: f64, ok: bool) {
        self.store_write_duration_seconds.observe(seconds);
        if !ok {
            self.store_write_failures_total.inc();
        }
    }
    /// A registry write that failed (`taskgate_store_write_failures_total`).
    pub fn store_write_failed(&self) {
        self.store_write_failures_total.inc();
    }

    // ---- recording: tasks (registry, tasks, cancel and upgrade layers) ----

    /// Sets the number of task records with `status` (`taskgate_tasks`).
    pub fn tasks_set(&self, upstream: &str, status: TaskStatus, n: i64) {
        self.tasks
            .with_label_values(&[upstream, status.as_str()])
            .set(n);
    }
    /// One more task record with `status` (`taskgate_tasks`).
    pub fn tasks_inc(&self, upstream: &str, status: TaskStatus) {
        self.tasks
            .with_label_values(&[upstream, status.as_str()])
            .inc();
    }
    /// One task record fewer with `status` (`taskgate_tasks`).
    pub fn tasks_dec(&self, upstream: &str, status: TaskStatus) {
        self.tasks
            .with_label_values(&[upstream, status.as_str()])
            .dec();
    }
    /// A task recorded (`taskgate_tasks_created_total`).
    pub fn task_created(&self, upstream: &str, origin: Origin) {
        self.tasks_created_total
            .with_label_values(&[upstream, origin.as_str()])
            .inc();
    }
    /// A task-augmented request refused (`taskgate_task_creation_refused_total`).
    pub fn task_creation_refused(&self, upstream: &str, reason: CreationRefusal) {
        self.task_creation_refused_total
            .with_label_values(&[upstream, reason.as_str()])
            .inc();
    }
    /// A recorded status change (`taskgate_task_status_transitions_total`).
    pub fn task_transition(&self, upstream: &str, from: TaskStatus, to: TaskStatus) {
        self.task_status_transitions_total
            .with_label_values(&[upstream, from.as_str(), to.as_str()])
            .inc();
    }
    /// `taskgate_task_terminal_rewrites_total`.
    pub fn task_terminal_rewrite(&self, upstream: &str) {
        self.task_terminal_rewrites_total
            .with_label_values(&[upstream])
            .inc();
    }
    /// `taskgate_tasks_expired_total`.
    pub fn task_expired(&self, upstream: &str) {
        self.tasks_expired_total
            .with_label_values(&[upstream])
            .inc();
    }
    /// `taskgate_task_lookups_rejected_total`.
    pub fn task_lookup_rejected(&self, upstream: &str, method: TaskMethod) {
        self.task_lookups_rejected_total
            .with_label_values(&[upstream, method.as_str()])
            .inc();
    }
    /// A `tasks/cancel` taskgate sent for a task it could not record
    /// (`taskgate_unrecorded_task_cancels_total`).
    pub fn unrecorded_task_cancel(&self, upstream: &str, outcome: UndoOutcome) {
        self.unrecorded_task_cancels_total
            .with_label_values(&[upstream, outcome.as_str()])
            .inc();
    }
    /// A request taskgate answered itself (`taskgate_local_answers_total`).
    pub fn local_answer(&self, upstream: &str, reason: LocalReason) {
        self.local_answers_total
            .with_label_values(&[upstream, reason.as_str()])
            .inc();
    }
}

/// The sled store's group commits, counted (`store_commit`), and the PostgreSQL store's writes
/// (their failures are counted where they are seen).
impl crate::store::CommitObserver for Metrics {
    fn commit(&self, seconds: f64, ok: bool) {
        self.store_commit(seconds, ok);
    }
    fn write(&self, seconds: f64) {
        self.store_write_duration_seconds.observe(seconds);
    }
}

#[cfg(test)]
mod tests;

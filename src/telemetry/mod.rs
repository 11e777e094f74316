//! OpenTelemetry traces (issue 34; DESIGN.md "Traces"): a SERVER span per MCP request made at
//! the edge, a CLIENT span per upstream exchange made by the upstream client, W3C Trace Context
//! in and out ([`propagation`]), the creating span of a task kept in its record and linked from
//! the task's later spans and audit facts. Attribute names are the semantic conventions'
//! ([`semconv`]).
//!
//! Off unless an OTLP endpoint is configured ([`Settings::resolve`]): then no [`Telemetry`]
//! exists, and the data path checks one `Option` per request. On, spans go to the SDK's batch
//! span processor: a bounded queue (2048 spans; a full queue drops, never waits) emptied by its
//! own thread, which posts OTLP/HTTP protobuf to `<endpoint>/v1/traces` (`export`); a failed
//! export is counted in `taskgate_trace_export_failures_total` and never reaches a request.
//!
//! A leaf: the edge, the layers and the upstream client import it; it imports only the config
//! and the JSON-RPC ground floor.

mod export;
pub mod propagation;
pub mod semconv;

pub use opentelemetry::trace::SpanContext;
pub use opentelemetry::KeyValue;

use crate::config::{check_endpoint, ConfigError, TelemetryConfig};
use crate::jsonrpc::{splice, Message};
use opentelemetry::trace::{
    Link, Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use parking_lot::Mutex;
use propagation::Incoming;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// Spans waiting for export at most; past it new spans are dropped (the SDK's default).
const MAX_QUEUE_SPANS: usize = 2048;
/// One export's deadline (connect, answer, body).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for the last export.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// What `[telemetry]` and the `OTEL_*` variables resolve to when export is on.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Where spans are posted: the full `…/v1/traces` URL.
    pub traces_endpoint: String,
    /// `service.name` of the resource.
    pub service_name: String,
    /// The parent-based sampler's ratio for root spans, 0.0 to 1.0.
    pub sample_ratio: f64,
}

impl Settings {
    /// The export settings, or `None` when no endpoint is set anywhere (export off). `env`
    /// reads an environment variable (`std::env::var` in production).
    ///
    /// Precedence, key by key: the `[telemetry]` key when set, else the standard variable,
    /// else the default. Endpoint: `telemetry.otlp_endpoint` + `/v1/traces`, else
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else `OTEL_EXPORTER_OTLP_ENDPOINT` +
    /// `/v1/traces`. Service name: `telemetry.service_name`, `OTEL_SERVICE_NAME`, `taskgate`.
    /// Ratio: `telemetry.sample_ratio`, else `OTEL_TRACES_SAMPLER` (`always_on`, `always_off`,
    /// `traceidratio` and their `parentbased_` forms; the sampler is always parent-based) with
    /// `OTEL_TRACES_SAMPLER_ARG`, else 1.0. `OTEL_SDK_DISABLED=true` turns export off.
    ///
    /// Errors: [`ConfigError::Invalid`] naming the variable whose value is not usable.
    pub fn resolve(
        config: &TelemetryConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, ConfigError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let traces = |base: &str| format!("{}/v1/traces", base.trim_end_matches('/'));
        let traces_endpoint = match (
            &config.otlp_endpoint,
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            var("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(base), _, _) => traces(base),
            (None, Some(full), _) => {
                check_endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &full)?;
                full
            }
            (None, None, Some(base)) => {
                check_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", &base)?;
                traces(&base)
            }
            (None, None, None) => return Ok(None),
        };
        let service_name = config
            .service_name
            .clone()
            .or_else(|| var("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "taskgate".to_string());
        let sample_ratio = match config.sample_ratio {
            Some(r) => r,
            None => sampler_ratio(var("OTEL_TRACES_SAMPLER"), var("OTEL_TRACES_SAMPLER_ARG"))?,
        };
        Ok(Some(Settings {
            traces_endpoint,
            service_name,
            sample_ratio,
        }))
    }
}

/// The ratio `OTEL_TRACES_SAMPLER` and its argument name.
fn sampler_ratio(sampler: Option<String>, arg: Option<String>) -> Result<f64, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(m);
    let ratio = || -> Result<f64, ConfigError> {
        match arg.as_deref().map(str::trim) {
            None => Ok(1.0),
            Some(a) => a
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    invalid(format!(
                        "OTEL_TRACES_SAMPLER_ARG {a:?} must be a number between 0.0 and 1.0"
                    ))
                }),
        }
    };
    match sampler.as_deref().map(str::trim) {
        None | Some("always_on" | "parentbased_always_on") => Ok(1.0),
        Some("always_off" | "parentbased_always_off") => Ok(0.0),
        Some("traceidratio" | "parentbased_traceidratio") => ratio(),
        Some(other) => Err(invalid(format!(
            "OTEL_TRACES_SAMPLER {other:?}: taskgate supports always_on, always_off, traceidratio and their parentbased_ forms"
        ))),
    }
}

/// The trace pipeline of one running gateway: its tracer and its exporter. Cloning shares it.
#[derive(Clone)]
pub struct Telemetry(Arc<Inner>);

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
    }
}

impl Telemetry {
    /// Starts the export (its thread and bounded queue) to `settings`' endpoint; spans whose
    /// export fails are counted in `failures`. Errors: the exporter could not be built (the
    /// message says why).
    pub fn start(
        settings: &Settings,
        failures: prometheus::IntCounter,
    ) -> Result<Telemetry, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(export::ExportClient::new(EXPORT_TIMEOUT))
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(settings.traces_endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("the OTLP exporter: {e}"))?;
        let exporter = export::Counted {
            inner: exporter,
            failures: export::Failures(failures),
        };
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(MAX_QUEUE_SPANS)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("taskgate");
        Ok(Telemetry(Arc::new(Inner { provider, tracer })))
    }

    /// Exports what is queued and stops the export thread. Blocks (at most a few seconds):
    /// call it off the serving threads.
    pub fn shutdown(&self) {
        let _ = self.0.provider.force_flush();
        let _ = self.0.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
    }

    /// Starts the SERVER span of one MCP request named `name`, as `incoming` says (its parent,
    /// and a link to the HTTP header's span when `_meta` named another).
    pub fn request_span(
        &self,
        name: String,
        incoming: Incoming,
        attributes: Vec<KeyValue>,
    ) -> RequestTrace {
        let links = incoming
            .link
            .map(|c| vec![Link::with_context(c)])
            .unwrap_or_default();
        let span = self.begin(
            name,
            SpanKind::Server,
            incoming.parent.as_ref(),
            links,
            attributes,
        );
        RequestTrace::new(span)
    }

    /// Starts the CLIENT span of one upstream exchange: a child of `parent` (the request's
    /// SERVER span), or a root linked to `links` (a task's creating span) for a request taskgate
    /// makes itself.
    pub fn exchange_span(
        &self,
        name: String,
        parent: Option<&SpanContext>,
        links: &[SpanContext],
        attributes: Vec<KeyValue>,
    ) -> RequestTrace {
        let links = links.iter().cloned().map(Link::with_context).collect();
        RequestTrace::new(self.begin(name, SpanKind::Client, parent, links, attributes))
    }

    /// Records one of a task's audit facts (`event`: [`semconv::EVENT_STATUS_CANCELLED`] or
    /// [`semconv::EVENT_RESOURCES_RELEASED`]) as a span of its own carrying that event, linked
    /// to the task's creating span `creating` (in its trace, when known).
    pub fn task_fact(&self, event: &'static str, task_id: &str, creating: Option<&SpanContext>) {
        let attributes = vec![KeyValue::new(semconv::MCP_TASK_ID, task_id.to_string())];
        let links = creating
            .map(|c| vec![Link::with_context(c.clone())])
            .unwrap_or_default();
        let mut span = self.begin(
            Cow::Borrowed(event),
            SpanKind::Internal,
            creating,
            links,
            attributes.clone(),
        );
        span.add_event(event, attributes);
        span.end();
    }

    fn begin(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        parent: Option<&SpanContext>,
        links: Vec<Link>,
        attributes: Vec<KeyValue>,
    ) -> opentelemetry_sdk::trace::Span {
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(p.clone()),
            None => Context::new(),
        };
        self.0
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .with_links(links)
            .start_with_context(&self.0.tracer, &cx)
    }
}

/// A started span shared by the code that adds to it: the edge's SERVER span (the layers set
/// `mcp.task.id` and links on it, the upstream client the upstream's address), or an upstream
/// exchange's CLIENT span. Travels down as a request extension. Ends once, at [`RequestTrace::end`]
/// or when the last clone is dropped.
#[derive(Clone)]
pub struct RequestTrace(Arc<Shared>);

struct Shared {
    context: SpanContext,
    span: Mutex<opentelemetry_sdk::trace::Span>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.span.get_mut().end();
    }
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RequestTrace({})",
            propagation::traceparent(&self.0.context)
        )
    }
}

impl RequestTrace {
    fn new(span: opentelemetry_sdk::trace::Span) -> RequestTrace {
        RequestTrace(Arc::new(Shared {
            context: span.span_context().clone(),
            span: Mutex::new(span),
        }))
    }

    /// The span's context (its trace and span ids, sampled flag, trace state).
    pub fn context(&self) -> &SpanContext {
        &self.0.context
    }

    /// Sets one attribute (a later value for the same key replaces the earlier).
    pub fn set(&self, attribute: KeyValue) {
        self.0.span.lock().set_attribute(attribute);
    }

    /// Adds a link to `context` (a task's creating span).
    pub fn link(&self, context: &SpanContext) {
        self.0.span.lock().add_link(context.clone(), Vec::new());
    }

    /// Adds an event named `name`.
    pub fn event(&self, name: &'static str, attributes: Vec<KeyValue>) {
        self.0.span.lock().add_event(name, attributes);
    }

    /// Records the JSON-RPC outcome of `message` (an answer): `error.type` is the error's code,
    /// or [`semconv::TOOL_ERROR`] for a result with `isError: true`.
    pub fn answer(&self, message: &[u8]) {
        if let Some(kind) = error_type(message) {
            self.set(KeyValue::new(semconv::ERROR_TYPE, kind));
        }
    }

    /// Ends the span now (later calls and drops do nothing).
    pub fn end(&self) {
        self.0.span.lock().end();
    }
}

/// `error.type` of a JSON-RPC answer: the code of an error, [`semconv::TOOL_ERROR`] for a
/// result with `isError: true`, `None` otherwise (or when `message` is not JSON).
pub fn error_type(message: &[u8]) -> Option<String> {
    // Most answers are neither: two substring scans instead of two walks of the JSON (a key
    // written with escapes is read as written here: `error.type` is a hint, not a decision).
    let has = |needle: &[u8]| crate::jsonrpc::contains(message, needle);
    if !has(b"\"error\"") && !has(b"\"isError\"") {
        return None;
    }
    if let Ok(Some(code)) = splice::raw_at(message, &["error", "code"]) {
        return Some(code.get().to_string());
    }
    match splice::raw_at(message, &["result", "isError"]) {
        Ok(Some(v)) if v.get() == "true" => Some(semconv::TOOL_ERROR.to_string()),
        _ => None,
    }
}

/// `msg` with `params._meta.traceparent` set to `traceparent` by splicing (every other byte as
/// it was): the value replaced where the client put one, else the member added to `_meta`, else
/// `_meta` added to `params`, else `params` added. `None` when `msg` is not a request or
/// notification or its `params` is not an object (it then goes as it was).
pub fn with_meta_traceparent(msg: &Message, traceparent: &str) -> Option<Message> {
    msg.method()?;
    let value = format!("\"{traceparent}\"");
    let bytes = msg.bytes();
    let spliced = match msg.param("_meta") {
        Some(meta) if meta.starts_with('{') => {
            match splice::replace(bytes, &["params", "_meta", semconv::TRACEPARENT], &value) {
                Ok(Some(b)) => b,
                _ => splice::insert_first(
                    bytes,
                    meta,
                    &format!("\"{}\":{value}", semconv::TRACEPARENT),
                )?,
            }
        }
        Some(_) => return None,
        None => match msg.params() {
            Some(params) if params.starts_with('{') => splice::insert_first(
                bytes,
                params,
                &format!("\"_meta\":{{\"{}\":{value}}}", semconv::TRACEPARENT),
            )?,
            Some(_) => return None,
            None => {
                // A request without `params` (the message is an object: it has a method).
                let at = bytes.iter().position(|&b| b == b'{')? + 1;
                let member = format!(
                    "\"params\":{{\"_meta\":{{\"{}\":{value}}}}},",
                    semconv::TRACEPARENT
                );
                splice::splice(bytes, at..at, member.as_bytes())
            }
        },
    };
    Message::parse(spliced).ok()
}

/// The creating span of the task a request concerns: set as a request extension by the layer
/// that authorised the request against the task's record, linked from the request's spans.
#[derive(Debug, Clone)]
pub struct TaskLink(pub SpanContext);

/// Copies the trace facts of a client's request (its [`RequestTrace`], its [`TaskLink`]) to a
/// request a layer makes for it (the bridge's polls of a `tasks/result`), so that request's
/// CLIENT span is a child of the client's SERVER span and links to the task's creation.
pub fn carry(from: &http::Extensions, to: &mut http::Extensions) {
    if let Some(trace) = from.get::<RequestTrace>() {
        to.insert(trace.clone());
    }
    if let Some(link) = from.get::<TaskLink>() {
        to.insert(link.clone());
    }
}

/// A task's creating span as its record keeps it (a `traceparent`).
pub fn stored(context: &SpanContext) -> String {
    propagation::traceparent(context)
}

/// The creating span of a task from its record's `trace_parent`.
pub fn restored(traceparent: &str) -> Option<SpanContext> {
    propagation::parse(traceparent, None)
}

#[cfg(test)]
mod tests;

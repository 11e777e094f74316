//! OpenTelemetry traces (issue 34; DESIGN.md "Traces"): a SERVER span per MCP request made at
//! the edge, a CLIENT span per upstream exchange made by the upstream client, W3C Trace Context
//! in and out ([`propagation`]), the creating span of a task kept in its record and linked from
//! the task's later spans and audit facts. Attribute names are the semantic conventions'
//! ([`semconv`]).
//!
//! Off unless an OTLP endpoint is configured ([`Settings::resolve`]): then no [`Telemetry`]
//! exists, and the data path checks one `Option` per request. On, a span is a compact record
//! (`span`) kept by the serving threads while it is open (a request's SERVER span and its first
//! upstream exchange's CLIENT span share one); ended, it goes to a bounded queue (2048 spans; a
//! full queue drops, never waits) emptied by the export thread (`batch`), which encodes the
//! records as OTLP/HTTP protobuf (`otlp`) and posts them to `<endpoint>/v1/traces` with the
//! gateway's own HTTP client (`export`); a failed export is counted
//! in `taskgate_trace_export_failures_total` and never reaches a request. Sampling is
//! parent-based: a span with a parent follows its sampled flag, a root is sampled by the SDK's
//! ratio sampler on its trace id.
//!
//! A leaf: the edge, the layers and the upstream client import it; it imports only the config
//! and the JSON-RPC ground floor.

mod batch;
mod export;
mod otlp;
pub mod propagation;
pub mod semconv;
mod span;

pub use opentelemetry::trace::SpanContext;
pub use opentelemetry::KeyValue;

pub use span::{protocol_version, shared_json_name, shared_name, Peer, RequestValues, Target};

use crate::config::{check_endpoint, ConfigError, TelemetryConfig};
use crate::jsonrpc::splice;
use bytes::Bytes;
use memchr::memmem::Finder;
use opentelemetry::trace::{Event, SpanId, SpanKind, TraceFlags, TraceId, TraceState};
use parking_lot::Mutex;
use propagation::Incoming;
use span::{ExchangeName, JsonString, Record, SpanName};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

/// One export's deadline (connect, answer, body) unless `OTEL_EXPORTER_OTLP_*TIMEOUT` says
/// otherwise (the specification's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for the last export.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// What `[telemetry]` and the `OTEL_*` variables resolve to when export is on. `Debug` hides
/// the headers' values (a collector's API key) and the endpoint's credentials.
#[derive(Clone, PartialEq)]
pub struct Settings {
    /// Where spans are posted: the full `…/v1/traces` URL.
    pub traces_endpoint: String,
    /// `service.name` of the resource.
    pub service_name: String,
    /// The parent-based sampler's ratio for root spans, 0.0 to 1.0.
    pub sample_ratio: f64,
    /// Header fields sent with every export (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else
    /// `OTEL_EXPORTER_OTLP_HEADERS`: `name=value` pairs, comma-separated, values
    /// percent-decoded), in order.
    pub headers: Vec<(String, String)>,
    /// One export's deadline: connect, answer and body (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`,
    /// else `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds; default 10 s).
    pub timeout: Duration,
    /// How export bodies are compressed (`OTEL_EXPORTER_OTLP_TRACES_COMPRESSION`, else
    /// `OTEL_EXPORTER_OTLP_COMPRESSION`: `gzip` or `none`; default none).
    pub compression: Compression,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::config::redact::{Redacted, Url};
        let Settings {
            traces_endpoint,
            service_name,
            sample_ratio,
            headers,
            timeout,
            compression,
        } = self;
        let names: Vec<_> = headers.iter().map(|(name, _)| (name, Redacted)).collect();
        f.debug_struct("Settings")
            .field("traces_endpoint", &Url(traces_endpoint))
            .field("service_name", service_name)
            .field("sample_ratio", sample_ratio)
            .field("headers", &names)
            .field("timeout", timeout)
            .field("compression", compression)
            .finish()
    }
}

/// The compression of the OTLP/HTTP export bodies (the exporter specification's `gzip` and
/// `none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Sent as encoded.
    #[default]
    None,
    /// gzip, with `Content-Encoding: gzip`.
    Gzip,
}

/// The traces URL of an OTLP base endpoint: `/v1/traces` appended to its path, its query (if
/// any) kept after it (`http://c:4318/base?x=1` → `http://c:4318/base/v1/traces?x=1`; it was put
/// after the query).
fn traces_url(base: &str) -> String {
    let (before, query) = match base.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (base, None),
    };
    let path = format!("{}/v1/traces", before.trim_end_matches('/'));
    match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    }
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
    /// `OTEL_TRACES_SAMPLER_ARG`, else 1.0. Header fields: `OTEL_EXPORTER_OTLP_TRACES_HEADERS`,
    /// else `OTEL_EXPORTER_OTLP_HEADERS`. Export deadline: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`,
    /// else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else 10 s. Compression:
    /// `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION`, else `OTEL_EXPORTER_OTLP_COMPRESSION` (`gzip`
    /// or `none`), else none. `OTEL_SDK_DISABLED=true` turns export off.
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
        let traces = |base: &str| traces_url(base);
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
        let headers = match var("OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
            Some(h) => headers("OTEL_EXPORTER_OTLP_TRACES_HEADERS", &h)?,
            None => match var("OTEL_EXPORTER_OTLP_HEADERS") {
                Some(h) => headers("OTEL_EXPORTER_OTLP_HEADERS", &h)?,
                None => Vec::new(),
            },
        };
        let either = |traces: &'static str, general: &'static str| match var(traces) {
            Some(v) => Some((traces, v)),
            None => var(general).map(|v| (general, v)),
        };
        let timeout = match either(
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ) {
            None => EXPORT_TIMEOUT,
            Some((name, v)) => match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "{name} {v:?} must be a whole number of milliseconds above 0"
                    )))
                }
            },
        };
        let compression = match either(
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ) {
            None => Compression::None,
            Some((name, v)) => match v.trim() {
                c if c.eq_ignore_ascii_case("gzip") => Compression::Gzip,
                c if c.eq_ignore_ascii_case("none") => Compression::None,
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "{name} {v:?}: taskgate supports gzip and none"
                    )))
                }
            },
        };
        Ok(Some(Settings {
            traces_endpoint,
            service_name,
            sample_ratio,
            headers,
            timeout,
            compression,
        }))
    }
}

/// The header fields of `value`, the variable `name`'s: `name=value` pairs, comma-separated,
/// each value percent-decoded (the OTLP exporter specification's format). Errors:
/// [`ConfigError::Invalid`] naming the variable when a pair has no `=`, or is not a valid
/// HTTP header field.
fn headers(name: &str, value: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let invalid = |why: &str| ConfigError::Invalid(format!("{name}: {pair:?} {why}"));
        let (key, v) = pair
            .split_once('=')
            .ok_or_else(|| invalid("is not name=value"))?;
        let (key, v) = (key.trim(), v.trim());
        let v = percent_encoding::percent_decode_str(v)
            .decode_utf8()
            .map_err(|_| invalid("is not UTF-8 once percent-decoded"))?;
        if http::HeaderName::from_bytes(key.as_bytes()).is_err()
            || http::HeaderValue::from_str(&v).is_err()
        {
            return Err(invalid("is not a valid HTTP header field"));
        }
        out.push((key.to_string(), v.into_owned()));
    }
    Ok(out)
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

/// The trace pipeline of one running gateway: the sampler, the id generator and the queue of
/// the export thread. Cloning shares it.
#[derive(Clone)]
pub struct Telemetry(Arc<Inner>);

struct Inner {
    /// The ratio sampler for spans without a parent; a span with one follows its parent's
    /// sampled flag (parent-based).
    root_sampler: RootSampler,
    ids: Ids,
    queue: Arc<batch::Queue>,
}

/// The ids of new spans and traces: random, from `fastrand`'s generator per thread (wyrand,
/// seeded per thread from a hash of the monotonic clock and the thread id: ids must be unique,
/// not secret), never all zero (W3C Trace Context: an all-zero id is invalid). The SDK's `RandomIdGenerator` (a call, a
/// thread-local `RefCell` and Xoshiro256++ per id) cost a traced small `tools/call` ~160
/// instructions for its three ids (callgrind, issue 34); this is inlined where a span starts.
#[derive(Debug, Default, Clone, Copy)]
struct Ids;

impl Ids {
    #[inline]
    fn new_span_id(self) -> SpanId {
        loop {
            let id = fastrand::u64(..);
            if id != 0 {
                return SpanId::from(id);
            }
        }
    }

    #[inline]
    fn new_trace_id(self) -> TraceId {
        loop {
            let id = fastrand::u128(..);
            if id != 0 {
                return TraceId::from(id);
            }
        }
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
    }
}

impl Telemetry {
    /// Starts the export (its thread and bounded queue) to `settings`' endpoint; spans whose
    /// export fails are counted in `failures`, spans dropped at a full queue in `dropped`.
    /// Errors: the exporter or its thread could not be made (the message says why).
    pub fn start(
        settings: &Settings,
        failures: prometheus::IntCounter,
        dropped: prometheus::IntCounter,
    ) -> Result<Telemetry, String> {
        let exporter = export::Exporter::new(
            &settings.traces_endpoint,
            &settings.headers,
            settings.timeout,
            settings.compression,
            failures,
        )?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(settings.service_name.clone())
            .build();
        let queue = Arc::new(batch::Queue::new(dropped));
        batch::start(queue.clone(), exporter, &resource)?;
        Ok(Telemetry(Arc::new(Inner {
            root_sampler: RootSampler::new(settings.sample_ratio),
            ids: Ids,
            queue,
        })))
    }

    /// Exports what is queued and stops the export thread. Blocks (at most a few seconds):
    /// call it off the serving threads. Spans ended later are dropped.
    pub fn shutdown(&self) {
        self.0.queue.shutdown(SHUTDOWN_TIMEOUT);
    }

    /// Starts the SERVER span of one MCP request for `method`, as `incoming` says (its parent,
    /// and a link to the HTTP header's span when `_meta` named another). `details` gives its
    /// tool or prompt, the request's id, protocol version and session, and its other
    /// attributes (`mcp.method.name` and the GenAI ones are added from `method` and the
    /// target); it is called only for a span that is sampled (one that is not carries only its
    /// context: nothing of the request is copied for it).
    pub fn request_span(
        &self,
        method: &str,
        incoming: Incoming,
        details: impl FnOnce(&mut RequestValues) -> (Target, Vec<KeyValue>),
    ) -> RequestTrace {
        let Incoming { parent, link } = incoming;
        self.begin(SpanKind::Server, parent.as_ref(), |r| {
            // The request's values written in the record in place (issue 34: returned with
            // the rest and moved into the record, they and the span's name were copied three
            // times, ~135 instructions per traced request, `trace::start` 1,805 → 1,670,
            // callgrind).
            let (target, attributes) = details(&mut r.request);
            r.name = SpanName::Method {
                method: span::method(method),
                target,
            };
            r.attributes = attributes;
            if let Some(link) = link {
                r.rare = span::Rare::of(vec![link], Vec::new());
            }
        })
    }

    /// Starts the CLIENT span of one upstream exchange to `peer` for `method`: a child of
    /// `server` (the request's SERVER span), or a root linked to `links` (a task's creating
    /// span) for a request taskgate makes itself. `details` (the tool a `tools/call` names and
    /// the exchange's own attributes) is called only for a span that is sampled. The first
    /// exchange of a sampled SERVER span is kept in the SERVER span's record (`span::Exchange`),
    /// named after it when it has the same method and tool. `server` gets `peer` as its
    /// upstream's attributes too ([`RequestTrace::set_peer`]), under the same lock when the
    /// exchange is kept in its record.
    pub fn exchange_span<'t>(
        &self,
        method: &str,
        server: Option<&RequestTrace>,
        links: &[SpanContext],
        peer: &Peer,
        details: impl FnOnce() -> (Option<&'t [u8]>, Vec<KeyValue>),
    ) -> RequestTrace {
        let target = |tool: Option<&JsonString<'_>>| match (method, tool) {
            ("tools/call", Some(tool)) => tool.shared().map_or(Target::None, Target::Tool),
            _ => Target::None,
        };
        if let Some(server) = server.filter(|s| s.part == Part::Own) {
            let shared = &server.shared;
            let mut record = shared.record.lock();
            let kept = shared.exchange.as_ref().map(SpanContext::span_id);
            if let Some((r, span_id)) = record
                .as_mut()
                .filter(|r| r.open && r.exchange.is_none())
                .zip(kept)
            {
                r.peer = Some(peer.clone());
                let (tool, attributes) = details();
                // Compared as bytes with the SERVER span's tool, not decoded and checked again.
                let tool = tool
                    .filter(|_| method == "tools/call")
                    .and_then(JsonString::of);
                let same = match &r.name {
                    SpanName::Method { method: m, target } => {
                        m == method
                            && match (target, tool.as_ref()) {
                                (Target::Tool(a), Some(b)) => a.as_bytes() == b.bytes(),
                                (_, Some(_)) | (Target::Tool(_), None) => false,
                                (_, None) => true,
                            }
                    }
                    SpanName::Fixed(_) => false,
                };
                r.exchange = Some(span::Exchange {
                    span_id,
                    open: true,
                    name: match same {
                        true => ExchangeName::AsServer,
                        false => ExchangeName::Own(SpanName::Method {
                            method: span::method(method),
                            target: target(tool.as_ref()),
                        }),
                    },
                    start: now_nanos(),
                    end: 0,
                    attributes,
                    peer: Some(peer.clone()),
                    // Not `links.to_vec()` for none (~30 instructions, callgrind).
                    rare: match links {
                        [] => None,
                        _ => span::Rare::of(links.to_vec(), Vec::new()),
                    },
                });
                drop(record);
                shared.exchange_handles.fetch_add(1, Ordering::Relaxed);
                return RequestTrace {
                    shared: shared.clone(),
                    part: Part::Exchange,
                };
            }
        }
        if let Some(server) = server {
            server.set_peer(peer);
        }
        self.begin(SpanKind::Client, server.map(RequestTrace::context), |r| {
            let (tool, attributes) = details();
            r.name = SpanName::Method {
                method: span::method(method),
                target: target(tool.and_then(JsonString::of).as_ref()),
            };
            r.attributes = attributes;
            r.peer = Some(peer.clone());
            if !links.is_empty() {
                r.rare = span::Rare::of(links.to_vec(), Vec::new());
            }
        })
    }

    /// Records one of a task's audit facts (`event`: [`semconv::EVENT_STATUS_CANCELLED`] or
    /// [`semconv::EVENT_RESOURCES_RELEASED`]) as a span of its own carrying that event, linked
    /// to the task's creating span `creating` (in its trace, when known).
    pub fn task_fact(&self, event: &'static str, task_id: &str, creating: Option<&SpanContext>) {
        let attributes = || vec![task_id_attribute(task_id.into())];
        let span = self.begin(SpanKind::Internal, creating, |r| {
            r.name = SpanName::Fixed(event);
            r.attributes = attributes();
            r.rare = span::Rare::of(creating.into_iter().cloned().collect(), Vec::new());
        });
        if span.is_recording() {
            span.event(event, attributes());
        }
        span.end();
    }

    /// A new span: its ids, its sampling decision (parent-based: a parent's sampled flag, else
    /// the ratio on the trace id) and, when sampled, its open record, whose name, request
    /// values, attributes, peer and links `details` writes in place (not called for a span not
    /// sampled).
    fn begin(
        &self,
        kind: SpanKind,
        parent: Option<&SpanContext>,
        details: impl FnOnce(&mut Record),
    ) -> RequestTrace {
        let parent = parent.filter(|p| p.is_valid());
        let span_id = self.0.ids.new_span_id();
        let (trace_id, sampled, state) = match parent {
            Some(p) => (p.trace_id(), p.is_sampled(), p.trace_state().clone()),
            None => {
                let trace_id = self.0.ids.new_trace_id();
                let sampled = self.0.root_sampler.samples(trace_id);
                (trace_id, sampled, TraceState::default())
            }
        };
        let flags = match sampled {
            true => TraceFlags::SAMPLED,
            false => TraceFlags::default(),
        };
        let context = SpanContext::new(trace_id, span_id, flags, false, state);
        let own = sampled.then(|| (context.clone(), now_nanos()));
        // The context of the first exchange a sampled SERVER span's record will hold, made
        // now with the span's own: set when the exchange began (a `OnceLock`), it cost each
        // traced request ~120 instructions more (`exchange_span` 537 → 381, this ~30;
        // callgrind, issue 34).
        let exchange = (sampled && kind == SpanKind::Server).then(|| {
            SpanContext::new(
                trace_id,
                self.0.ids.new_span_id(),
                flags,
                false,
                context.trace_state().clone(),
            )
        });
        let make = || Shared {
            context,
            exchange,
            exchange_handles: AtomicUsize::new(0),
            record: Mutex::new(None),
            queue: self.0.queue.clone(),
        };
        // Written into its allocation in place: `Arc::new` built it (~600 bytes with the room
        // of its record) beside the allocation and copied it in (~88 instructions per traced
        // request, callgrind, issue 34).
        let mut uninit = Arc::<Shared>::new_uninit();
        let mut shared = match Arc::get_mut(&mut uninit) {
            Some(slot) => {
                slot.write(make());
                // SAFETY: written on the line above (the `Arc` is this function's alone).
                unsafe { uninit.assume_init() }
            }
            None => Arc::new(make()),
        };
        if let Some((context, start)) = own {
            // Written into the new `Arc` in place, then completed there by `details`: built
            // beside it and moved in, the record (~460 bytes) was copied once more (~35
            // instructions per SERVER span, callgrind, issue 34). The `Arc` is this
            // function's alone.
            if let Some(s) = Arc::get_mut(&mut shared) {
                let record = s.record.get_mut().insert(Record {
                    open: true,
                    exchange: None,
                    context,
                    parent: parent.map(|p| (p.span_id(), p.is_remote())),
                    kind,
                    // Named by `details`.
                    name: SpanName::Fixed(""),
                    start,
                    end: 0,
                    request: RequestValues::default(),
                    attributes: Vec::new(),
                    peer: None,
                    // Links and events, which few spans have ([`span::Rare`]).
                    rare: None,
                    answer: None,
                });
                details(record);
            }
        }
        RequestTrace {
            shared,
            part: Part::Own,
        }
    }
}

/// The SDK's ratio sampler (`Sampler::TraceIdRatioBased`) deciding for a root span, its
/// decision worked out here: its `should_sample` also builds a `SamplingResult` (attributes,
/// the parent's trace state) that a root span throws away (~45 instructions per traced request,
/// callgrind, issue 34). The same decisions (a test compares them): every root at a ratio of
/// 1.0 or more, else those whose trace id's low 63 bits are below the ratio's share of 2^63.
#[derive(Debug, Clone, Copy)]
struct RootSampler {
    /// The bound of the trace id's low 63 bits; `None`: every root is sampled.
    bound: Option<u64>,
}

impl RootSampler {
    fn new(ratio: f64) -> RootSampler {
        RootSampler {
            bound: (!(ratio >= 1.0)).then(|| (ratio.max(0.0) * (1u64 << 63) as f64) as u64),
        }
    }

    /// Whether a root span of `trace_id` is sampled.
    fn samples(&self, trace_id: TraceId) -> bool {
        match self.bound {
            None => true,
            Some(bound) => {
                let id = trace_id.to_bytes();
                let low = u64::from_be_bytes([
                    id[8], id[9], id[10], id[11], id[12], id[13], id[14], id[15],
                ]);
                (low >> 1) < bound
            }
        }
    }
}

/// A started span shared by the code that adds to it: the edge's SERVER span (the layers set
/// `mcp.task.id` and links on it, the upstream client the upstream's address), or an upstream
/// exchange's CLIENT span. Travels down as the request's `trace` (a field of
/// [`crate::exchange::RequestParts`]). Ends once, at [`RequestTrace::end`] or when the last
/// clone is dropped; a span not sampled only carries its context.
pub struct RequestTrace {
    shared: Arc<Shared>,
    part: Part,
}

/// Which span of its record a [`RequestTrace`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The record's own span (`Shared::context`).
    Own,
    /// The exchange the record holds (`Shared::exchange`, `span::Exchange`).
    Exchange,
}

struct Shared {
    context: SpanContext,
    /// The context of the CLIENT span of the first exchange the record holds (a sampled
    /// SERVER span's; [`Telemetry::exchange_span`]), made with the span: used once it has one.
    exchange: Option<SpanContext>,
    /// The exchange's handles ([`Part::Exchange`]) alive: the last one dropped ends it.
    exchange_handles: AtomicUsize,
    /// The open span(s); `None` once all ended (queued), or when not sampled.
    record: Mutex<Option<Record>>,
    queue: Arc<batch::Queue>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let slot = self.record.get_mut();
        if let Some(record) = slot.as_mut() {
            let now = now_nanos();
            if record.open {
                record.end = now;
            }
            if let Some(e) = record.exchange.as_mut().filter(|e| e.open) {
                e.end = now;
            }
            record.answer = None;
            self.queue.push(slot);
        }
    }
}

impl Clone for RequestTrace {
    fn clone(&self) -> RequestTrace {
        if self.part == Part::Exchange {
            self.shared.exchange_handles.fetch_add(1, Ordering::Relaxed);
        }
        RequestTrace {
            shared: self.shared.clone(),
            part: self.part,
        }
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        if self.part == Part::Exchange
            && self.shared.exchange_handles.fetch_sub(1, Ordering::AcqRel) == 1
        {
            self.end();
        }
    }
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RequestTrace({})",
            propagation::traceparent(self.context())
        )
    }
}

impl RequestTrace {
    /// The span's context (its trace and span ids, sampled flag, trace state).
    pub fn context(&self) -> &SpanContext {
        match self.part {
            Part::Own => &self.shared.context,
            // Set before any handle of the exchange exists.
            Part::Exchange => self
                .shared
                .exchange
                .as_ref()
                .unwrap_or(&self.shared.context),
        }
    }

    /// Runs `f` on this span's open parts (its attributes, peer, links and events); `None`
    /// when it is not sampled or has ended.
    fn with<T>(&self, f: impl FnOnce(Open<'_>) -> T) -> Option<T> {
        let mut record = self.shared.record.lock();
        let r = record.as_mut()?;
        match self.part {
            Part::Own if r.open => Some(f(Open {
                request: Some(&mut r.request),
                attributes: &mut r.attributes,
                peer: &mut r.peer,
                rare: &mut r.rare,
            })),
            Part::Exchange => {
                let e = r.exchange.as_mut().filter(|e| e.open)?;
                Some(f(Open {
                    request: None,
                    attributes: &mut e.attributes,
                    peer: &mut e.peer,
                    rare: &mut e.rare,
                }))
            }
            Part::Own => None,
        }
    }

    /// Sets one attribute (a later value for the same key replaces the earlier).
    pub fn set(&self, attribute: KeyValue) {
        self.with(|o| {
            if let Some(request) = o.request {
                request.forget(attribute.key.as_str());
            }
            span::set(o.attributes, attribute)
        });
    }

    /// Sets the upstream's attributes (`server.address`, `server.port`, `network.transport`).
    pub fn set_peer(&self, peer: &Peer) {
        self.with(|o| *o.peer = Some(peer.clone()));
    }

    /// Adds a link to `context` (a task's creating span).
    pub fn link(&self, context: &SpanContext) {
        self.with(|o| {
            o.rare
                .get_or_insert_with(Default::default)
                .links
                .push(context.clone())
        });
    }

    /// Adds an event named `name`, now.
    pub fn event(&self, name: &'static str, attributes: Vec<KeyValue>) {
        self.with(|o| {
            o.rare
                .get_or_insert_with(Default::default)
                .events
                .push(Event::new(name, SystemTime::now(), attributes, 0))
        });
    }

    /// Records the JSON-RPC outcome of `message` (an answer): `error.type` is the error's code,
    /// or [`semconv::TOOL_ERROR`] for a result with `isError: true`. A span not sampled reads
    /// nothing.
    pub fn answer(&self, message: &[u8]) {
        if !self.is_recording() {
            return;
        }
        if let Some(kind) = error_type(message) {
            self.set(KeyValue::new(semconv::ERROR_TYPE, kind));
        }
    }

    /// The SERVER span `server` (the request's) as this span, an exchange's CLIENT span, keeps
    /// it for its answer ([`RequestTrace::answer_json`]): none when this is the exchange that
    /// span's record holds, reached through this span's own handle (a handle of it kept too,
    /// its reference count taken and let go, cost each traced request ~10 instructions,
    /// callgrind, issue 34).
    pub fn server_kept(&self, server: Option<&RequestTrace>) -> Option<RequestTrace> {
        match self.part {
            Part::Exchange => None,
            Part::Own => server.cloned(),
        }
    }

    /// Whether this span is sampled and still open (attributes set on it are exported).
    pub fn is_recording(&self) -> bool {
        self.with(|_| ()).is_some()
    }

    /// Records the outcome of a JSON reply whose body is `body`: `error.type` is the JSON-RPC
    /// error's code, [`semconv::TOOL_ERROR`] for a result with `isError: true`, else `status`
    /// (the HTTP status of a non-2xx reply). With `server` (the request's SERVER span, when this
    /// is an exchange's CLIENT span; the exchange a SERVER span's record holds reaches that
    /// span through its own handle, and `server` is then not read) the outcome of a body that had to be searched
    /// ([`error_type`]) is noted there too, so the SERVER span, ending on the same bytes (no
    /// layer changed them: the common case), reads nothing again (issue 34: searching each
    /// answer twice cost a small `tools/call` ~1,300 instructions). One read at its ends is
    /// noted only by the exchange the SERVER span's record holds, under the lock it holds
    /// anyway; for another exchange reading it again costs less than taking the SERVER span's
    /// lock to keep the bytes. A span not sampled reads nothing.
    pub fn answer_json(&self, body: &Bytes, status: Option<String>, server: Option<&RequestTrace>) {
        // Whether it was read at its ends already (and is not a tool result of that shape).
        let mut ends_read = false;
        let kind = {
            let mut record = self.shared.record.lock();
            match (record.as_mut(), self.part) {
                (Some(r), Part::Own) if r.open => Some(r.noted(body)),
                // An exchange's span has no answer noted. Read at its ends here, under the
                // lock already held, the outcome is noted for the record's own SERVER span
                // while it is open, which then reads the bytes no more when it ends on them
                // (read twice, ~105 instructions per traced small `tools/call`, callgrind,
                // issue 34).
                (Some(r), Part::Exchange) if r.exchange.as_ref().is_some_and(|e| e.open) => {
                    match tool_result_at_ends(body) {
                        Some(kind) => {
                            if r.open {
                                // Set once (the first exchange's), without dropping a `None`.
                                r.answer.get_or_insert_with(|| (body.clone(), kind.clone()));
                            }
                            Some(Some(kind))
                        }
                        None => {
                            ends_read = true;
                            Some(None)
                        }
                    }
                }
                _ => None,
            }
        };
        // Whether `server` is still open is asked only when this span is not (it is asked
        // again where the answer is noted): asked first, its lock cost every exchange's answer
        // ~30 instructions (callgrind, issue 34).
        // The SERVER span's record: this span's own when this is the exchange it holds (its
        // CLIENT span keeps no handle of the SERVER span for it, `RequestTrace::server_kept`),
        // else `server`'s.
        let server = || match self.part {
            Part::Exchange => Some(&*self.shared),
            Part::Own => server.filter(|s| s.part == Part::Own).map(|s| &*s.shared),
        };
        let open = |shared: &Shared| shared.record.lock().as_ref().is_some_and(|r| r.open);
        let kind = match kind {
            Some(kind) => kind,
            None if server().is_some_and(open) => None,
            None => return,
        };
        let kind = match kind {
            Some(kind) => kind,
            None => match (!ends_read).then(|| tool_result_at_ends(body)).flatten() {
                // Read at its ends: the SERVER span reads it so too, at less than the cost
                // of keeping a copy of the answer (an allocation, its reference counts).
                Some(kind) => kind,
                None => {
                    let kind = error_type_searched(body);
                    if let Some(server) = server() {
                        let mut record = server.record.lock();
                        if let Some(record) = record.as_mut().filter(|r| r.open) {
                            record.answer = Some((body.clone(), kind.clone()));
                        }
                    }
                    kind
                }
            },
        };
        if let Some(kind) = kind.or(status) {
            self.set(KeyValue::new(semconv::ERROR_TYPE, kind));
        }
    }

    /// [`RequestTrace::end`], this handle let go: an exchange's last handle, dropped after its
    /// span ended, does not end it again (its record's lock taken again for nothing cost each
    /// traced request ~33 instructions, callgrind, issue 34).
    pub fn finish(mut self) {
        self.end();
        if self.part == Part::Exchange {
            self.shared.exchange_handles.fetch_sub(1, Ordering::AcqRel);
            // Its count let go here; dropped as the record's own span's handle, which ends
            // nothing when dropped.
            self.part = Part::Own;
        }
    }

    /// Ends the span now; once no span of its record is open, queues the record for export
    /// (later calls and drops do nothing). The answer noted for a SERVER span is let go here,
    /// on the serving thread (freed on the export thread, the last copy of an answer's bytes
    /// cost ~750 instructions).
    pub fn end(&self) {
        // Queued from under the record's lock (the queue's lock is taken under it, never the
        // reverse), so the record is moved once.
        let mut record = self.shared.record.lock();
        {
            let Some(r) = record.as_mut() else {
                return;
            };
            match self.part {
                Part::Own if r.open => {
                    r.open = false;
                    r.end = now_nanos();
                    r.answer = None;
                }
                Part::Exchange => match r.exchange.as_mut().filter(|e| e.open) {
                    Some(e) => {
                        e.open = false;
                        e.end = now_nanos();
                    }
                    None => return,
                },
                Part::Own => return,
            }
            if !r.closed() {
                return;
            }
        }
        self.shared.queue.push(&mut record);
    }
}

/// Now, in nanoseconds since the Unix epoch (0 before it), as a span's times are exported.
/// Read with `clock_gettime(CLOCK_REALTIME)` itself (rustix's safe call): `SystemTime::now()`,
/// turned into nanoseconds by `duration_since(UNIX_EPOCH)` on the export thread, cost ~85
/// instructions per time, four per traced small `tools/call`, this ~15 (callgrind, issue 34).
fn now_nanos() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    match (u64::try_from(now.tv_sec), u64::try_from(now.tv_nsec)) {
        (Ok(secs), Ok(nanos)) => secs.saturating_mul(1_000_000_000).saturating_add(nanos),
        _ => 0,
    }
}

/// An open span's parts [`RequestTrace::with`] lends.
struct Open<'a> {
    /// A record's own span's request values (an exchange has none).
    request: Option<&'a mut RequestValues>,
    attributes: &'a mut Vec<KeyValue>,
    peer: &'a mut Option<Peer>,
    /// Its links and events ([`span::Rare`]).
    rare: &'a mut Option<Box<span::Rare>>,
}

/// `mcp.task.id = task_id`, cut to 256 bytes (`span::bounded`: a client's `taskId` is any
/// string it sends).
pub fn task_id_attribute(task_id: std::borrow::Cow<'_, str>) -> KeyValue {
    KeyValue::new(semconv::MCP_TASK_ID, span::bounded_string(task_id))
}

/// `error.type` of a JSON-RPC answer: the code of an error, [`semconv::TOOL_ERROR`] for a
/// result with `isError: true`, `None` otherwise (or when `message` is not JSON).
pub fn error_type(message: &[u8]) -> Option<String> {
    tool_result_at_ends(message).unwrap_or_else(|| error_type_searched(message))
}

/// `error.type` of a tool result read at the message's two ends, when it has the shape the
/// answers of the Python SDK, of serde and of `JSON.stringify` have: compact,
/// `{"jsonrpc":"2.0","id":<id>,"result":{…` at its start and `"isError":<bool>}}` at its end,
/// `isError` the last member of `result` (after a comma or its opening brace). `None` for any
/// other shape (an error, `isError` elsewhere or absent, white space, an id with escapes): the
/// message is then searched ([`error_type_searched`]). (Searched, a small `tools/call`'s ~1 KiB
/// answer cost ~900 instructions per span; read at its ends ~140; callgrind, issue 34.)
/// A known limit: the ends are trusted, not the whole message; an answer that is not valid
/// JSON-RPC (a member after `result` ending in `"isError":true}}`, bytes between that are not
/// JSON) can be labelled from its ends. It only sets the span's `error.type`, a hint.
fn tool_result_at_ends(message: &[u8]) -> Option<Option<String>> {
    let id = message.strip_prefix(br#"{"jsonrpc":"2.0","id":"#)?;
    let id_len = match id.first()? {
        b'"' => {
            let inner = id.get(1..)?;
            let end = inner.iter().position(|&c| c == b'"' || c == b'\\')?;
            (inner[end] == b'"').then_some(end + 2)?
        }
        _ => id
            .iter()
            .position(|c| !(c.is_ascii_digit() || *c == b'-'))
            .filter(|&n| n > 0)?,
    };
    let result = id.get(id_len..)?.strip_prefix(br#","result":"#)?;
    if result.first() != Some(&b'{') {
        return None;
    }
    let result = message.len() - result.len();
    let (end, is_error) = match message.strip_suffix(br#""isError":false}}"#) {
        Some(end) => (end, false),
        None => (message.strip_suffix(br#""isError":true}}"#)?, true),
    };
    let before = end.len().checked_sub(1)?;
    if before < result || !matches!(end[before], b',' | b'{') {
        return None;
    }
    Some(is_error.then(|| semconv::TOOL_ERROR.to_string()))
}

/// [`error_type`] of any answer, searched for its `error` and `isError` keys.
fn error_type_searched(message: &[u8]) -> Option<String> {
    // Called for every answer read for a span: most answers are neither, and a tool result
    // often says `"isError": false`. One search, for the end both keys share (`rror"`), with a
    // prebuilt finder, decides those without reading the JSON (two searches, one per key, cost
    // a small `tools/call` ~1,300 instructions); it is read only for an `"error"` member or an
    // `"isError"` followed by `true`. (Measured, callgrind, issue 34: reading a small
    // `tools/call` answer whole for `result.isError` cost 13,000 instructions per span.) A key
    // written with escapes is read as written here: `error.type` is a hint, not a decision.
    static RROR: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"rror\""));
    let (mut error, mut says_true) = (false, false);
    for at in RROR.find_iter(message) {
        let before = &message[..at];
        if before.ends_with(b"\"e") {
            error = true;
        } else if before.ends_with(b"\"isE") {
            let rest = message[at + b"rror\"".len()..].trim_ascii_start();
            says_true |= rest
                .strip_prefix(b":")
                .is_some_and(|v| v.trim_ascii_start().starts_with(b"true"));
        }
    }
    if error {
        if let Ok(Some(code)) = splice::raw_at(message, &["error", "code"]) {
            // An upstream's `code` is any JSON value it sends: cut like every other text a
            // span takes (review of tester 5 #1's fix: a 4 MB `code` was kept whole).
            return Some(span::bounded(code.get()).to_string());
        }
    }
    if !says_true {
        return None;
    }
    match splice::raw_at(message, &["result", "isError"]) {
        Ok(Some(v)) if v.get() == "true" => Some(semconv::TOOL_ERROR.to_string()),
        _ => None,
    }
}

/// `msg` with `params._meta.traceparent` set to `traceparent` by splicing (every other byte as
/// it was; [`crate::jsonrpc::Message::with_meta_member`]): the value replaced where the client put one, else the
/// member added to `_meta`, else `_meta` added to `params`, else `params` added. `None` when
/// `msg` is not a request or notification or its `params` is not an object (it then goes as it
/// was).
/// (The upstream client splices the quoted value itself, made once for `_meta` and the header:
/// [`crate::jsonrpc::Message::with_meta_member`]; this form stays for the tests that pin the
/// splice.)
#[cfg(test)]
pub fn with_meta_traceparent(
    msg: &crate::jsonrpc::Message,
    traceparent: &str,
) -> Option<crate::jsonrpc::Message> {
    let mut value = Vec::with_capacity(traceparent.len() + 2);
    value.push(b'"');
    value.extend_from_slice(traceparent.as_bytes());
    value.push(b'"');
    msg.with_meta_member(semconv::TRACEPARENT, &value)
}

/// The creating span of the task a request concerns: set as a request extension by the layer
/// that authorised the request against the task's record, linked from the request's spans.
#[derive(Debug, Clone)]
pub struct TaskLink(pub SpanContext);

/// Copies the task link of a client's request ([`TaskLink`]) to a request a layer makes for it
/// (the bridge's polls of a `tasks/result`), so that request's CLIENT span links to the task's
/// creation; the request's [`RequestTrace`] goes with it as the new request's `trace` (a field
/// of [`crate::exchange::RequestParts`]), making that CLIENT span a child of the client's
/// SERVER span.
pub fn carry(from: &http::Extensions, to: &mut http::Extensions) {
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

//! The OTLP/HTTP protobuf body of one export (`ExportTraceServiceRequest`,
//! opentelemetry-proto `opentelemetry/proto/collector/trace/v1/trace_service.proto` and
//! `trace/v1/trace.proto`), written straight from the records with prost's wire-format
//! primitives.
//!
//! Why not `opentelemetry-otlp`'s exporter: measured with callgrind (`TOOL=callgrind bash
//! benches/telemetry.sh`, issue 34), it cost about 20,000 instructions per span on the export
//! thread, a third of what the whole small `tools/call` costs without traces: each span is
//! copied into SDK `SpanData`, then into the generated proto structs (every attribute key and
//! string value allocated again, a hash map per batch), and prost computes each nested message's
//! length once per enclosing message (`encoded_len` at every level of six). Here every length
//! is computed once, from the strings' lengths, the resource and the scope are encoded once per
//! exporter, and a span is one pass over its record into a reused buffer. The tests decode the
//! body with the generated `opentelemetry-proto` types.

use super::semconv;
use super::span::{self, ExchangeName, Peer, Record, RequestValues, SpanName, Target};
use bytes::Bytes;
use opentelemetry::trace::{Event, SpanContext, SpanId, SpanKind, TraceFlags, TraceId};
use opentelemetry::{KeyValue, Value};
use parking_lot::Mutex;
use prost::encoding::{encoded_len_varint, WireType};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

/// `SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`: the next bit says whether it is remote.
const HAS_IS_REMOTE: u32 = 0x100;
/// `SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
const IS_REMOTE: u32 = 0x200;

/// Encodes batches for one resource (`service.name` and what the SDK's resource detectors add)
/// and the instrumentation scope `taskgate`.
pub(super) struct Encoder {
    /// `ResourceSpans.resource` and `.schema_url`, encoded.
    resource: Vec<u8>,
    /// `ScopeSpans.scope`, encoded.
    scope: Vec<u8>,
    /// The buffer of the last body, given back when hyper drops the body ([`Pooled`]).
    spare: Arc<Mutex<Vec<u8>>>,
    /// The span names met last, encoded ([`Names`]).
    names: Names,
}

/// The largest body buffer kept for the next export, in bytes (a full batch of small
/// `tools/call` spans takes ~180 KiB).
const KEPT_BODY_BYTES: usize = 4 << 20;

/// An export body's buffer: the body is `buf[start..]`; dropped (when the export that posted it,
/// or gzipped it, returns), the buffer goes back to the encoder's `spare`, so the next export writes into pages
/// already mapped (a fresh ~200 KiB `Vec` per export is a fresh `mmap` or a trimmed heap top:
/// its pages faulted in and cleared by the kernel again on every export, issue 34).
struct Pooled {
    buf: Vec<u8>,
    start: usize,
    pool: Arc<Mutex<Vec<u8>>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if self.buf.capacity() <= KEPT_BODY_BYTES {
            let mut spare = self.pool.lock();
            if spare.capacity() < self.buf.capacity() {
                *spare = std::mem::take(&mut self.buf);
            }
        }
    }
}

impl Encoder {
    pub(super) fn new(resource: &opentelemetry_sdk::Resource) -> Encoder {
        let mut attributes = Vec::new();
        for (key, value) in resource.iter() {
            key_value(&mut attributes, key.as_str(), value);
        }
        let mut out = Vec::new();
        message(&mut out, 1, &attributes);
        if let Some(url) = resource.schema_url() {
            string(&mut out, 3, url);
        }
        let mut scope = Vec::new();
        let mut name = Vec::new();
        string(&mut name, 1, "taskgate");
        message(&mut scope, 1, &name);
        Encoder {
            resource: out,
            scope,
            spare: Arc::default(),
            names: Names::default(),
        }
    }

    /// The bytes the encoder holds for span names, kept and made for one record (tests).
    #[cfg(test)]
    pub(super) fn name_bytes_held(&self) -> usize {
        let kept = self.names.kept.iter().map(|(_, n)| n.bytes.capacity());
        let scratch = self.names.scratch.iter().map(|n| n.bytes.capacity());
        kept.chain(scratch).sum()
    }

    /// The `ExportTraceServiceRequest` of `records` (one resource, one scope) and how many
    /// spans it holds (a record may hold two: [`Record::exchange`]), read in place
    /// (moving each record out of its batch, ~350 bytes, twice, cost the export ~450
    /// instructions per request, callgrind, issue 34).
    pub(super) fn body(&mut self, records: &[Record]) -> (Bytes, usize) {
        // The spans are written after a gap that the message's head (the `ResourceSpans` key
        // and length, the resource, the `ScopeSpans` key and length) fills once their length
        // is known, so the body is never copied whole.
        let gap = self.resource.len() + 2 * (1 + 10);
        // A small `tools/call`'s two spans take ~700 bytes: grown from 64 KiB, the buffer
        // of a full batch was copied twice (~450 instructions per request, issue 34).
        let mut out = std::mem::take(&mut *self.spare.lock());
        out.clear();
        out.reserve(gap + self.scope.len() + records.len() * 768);
        out.resize(gap, 0);
        out.extend_from_slice(&self.scope);
        let mut spans = 0;
        for record in records {
            spans += write_record(&mut out, record, &mut self.names);
        }
        let scope_spans_len = out.len() - gap;
        let resource_spans_len = self.resource.len() + field_len(2, scope_spans_len);
        let mut head = Vec::with_capacity(gap);
        encode_key(1, WireType::LengthDelimited, &mut head);
        encode_varint(resource_spans_len as u64, &mut head);
        head.extend_from_slice(&self.resource);
        encode_key(2, WireType::LengthDelimited, &mut head);
        encode_varint(scope_spans_len as u64, &mut head);
        let start = gap - head.len();
        out[start..gap].copy_from_slice(&head);
        let body = Pooled {
            buf: out,
            start,
            pool: self.spare.clone(),
        };
        (Bytes::from_owner(body), spans)
    }
}

/// One span as [`write_span`] reads it: a record's own, or the exchange it holds.
struct View<'a> {
    trace_id: TraceId,
    span_id: SpanId,
    /// The `tracestate` header (empty: none).
    state: &'a str,
    flags: TraceFlags,
    parent: Option<(SpanId, bool)>,
    kind: SpanKind,
    name: Name<'a>,
    /// Nanoseconds since the Unix epoch.
    start: u64,
    end: u64,
    /// A SERVER span's request's id, protocol version and session.
    request: Option<&'a RequestValues>,
    attributes: &'a [KeyValue],
    peer: Option<&'a Peer>,
    links: &'a [SpanContext],
    events: &'a [Event],
}

/// The `Span` messages of `r` (its own, then its exchange's) appended to `out` as `ScopeSpans`
/// fields, each written in place after a length field filled once it is known ([`open_span`],
/// [`close_span`]: written in a buffer of its own first and copied, a small `tools/call`'s two
/// spans cost ~400 instructions more, callgrind, issue 34); their names and name attributes
/// copied from `names`; returns how many.
fn write_record(out: &mut Vec<u8>, r: &Record, names: &mut Names) -> usize {
    let spans = write_spans(out, r, names);
    // A name too long to keep was made for this record only: its bytes go now.
    names.scratch.clear();
    spans
}

/// [`write_record`]'s spans, their names found (or made) in `names`.
fn write_spans(out: &mut Vec<u8>, r: &Record, names: &mut Names) -> usize {
    let own_name = names.find(&r.name, false, None);
    // Named as the SERVER span with its tool (not a prompt, which is the SERVER span's only):
    // the same encoded name, not looked up again.
    let exchange_name = r.exchange.as_ref().map(|e| match (&e.name, &r.name) {
        (
            ExchangeName::AsServer,
            SpanName::Method {
                target: Target::None | Target::Tool(_),
                ..
            },
        ) => own_name,
        (ExchangeName::AsServer, name) => names.find(name, true, own_name),
        (ExchangeName::Own(name), _) => names.find(name, false, own_name),
    });
    let context = &r.context;
    let state = super::propagation::tracestate(context).unwrap_or_default();
    let own = View {
        trace_id: context.trace_id(),
        span_id: context.span_id(),
        state: &state,
        flags: context.trace_flags(),
        parent: r.parent,
        kind: r.kind.clone(),
        name: names.name(&r.name, own_name),
        start: r.start,
        end: r.end,
        request: Some(&r.request),
        attributes: &r.attributes,
        peer: r.peer.as_ref(),
        links: span::links(&r.rare),
        events: span::events(&r.rare),
    };
    let at = open_span(out);
    write_span(out, &own);
    close_span(out, at);
    let (Some(e), Some(exchange_name)) = (&r.exchange, exchange_name) else {
        return 1;
    };
    let name = match &e.name {
        ExchangeName::AsServer => &r.name,
        ExchangeName::Own(name) => name,
    };
    let exchange = View {
        span_id: e.span_id,
        parent: Some((context.span_id(), false)),
        kind: SpanKind::Client,
        name: names.name(name, exchange_name),
        start: e.start,
        end: e.end,
        request: None,
        attributes: &e.attributes,
        peer: e.peer.as_ref(),
        links: span::links(&e.rare),
        events: span::events(&e.rare),
        ..own
    };
    let at = open_span(out);
    write_span(out, &exchange);
    close_span(out, at);
    2
}

/// The encoded names of the spans named after a method (and a tool or prompt) that the encoder
/// met last: the `Span.name` field, the `mcp.method.name` attribute and the target's `gen_ai.*`
/// attributes of each, encoded once and copied into each span of that name (issue 34: encoded
/// again for every request's SERVER span, they cost the export thread ~90 instructions per
/// request, callgrind). At most [`KEPT_SPAN_NAMES`], the oldest replaced: a gateway's spans are
/// named after a few methods and tools; a client naming tools at random costs one encoding
/// each, as before, a look through the kept names and, on the export thread, an allocation and
/// a free per name replaced.
#[derive(Default)]
struct Names {
    /// Each name's method, its target (a prompt only when it is the span's) and its bytes.
    kept: Vec<(NameKey, NameBytes)>,
    /// The slot the next name not kept takes once `kept` is full.
    next: usize,
    /// The slot found last: looked at first (a gateway's spans come in runs of one name).
    last: usize,
    /// The names of the record being written that are too long to keep
    /// ([`LONGEST_KEPT_SPAN_NAME`]), slots `KEPT_SPAN_NAMES..`; emptied after each record.
    scratch: Vec<NameBytes>,
}

/// A kept name: its method and target (the tool's or prompt's name shared: compared by pointer
/// first, then as text).
struct NameKey {
    method: Cow<'static, str>,
    target: Target,
}

/// How many span names [`Names`] keeps.
const KEPT_SPAN_NAMES: usize = 16;
/// The longest method and tool or prompt name [`Names`] keeps, in bytes together (as the
/// serving threads' `shared_name`): a longer one is the client's to choose (up to
/// `gateway.max_body_bytes`), and kept it would stay in the export thread's memory until 16
/// other names replaced it (cold review: 16 names of 4 MiB pinned ~256 MiB). It is encoded
/// for its record alone, as every name was before.
const LONGEST_KEPT_SPAN_NAME: usize = 128;

impl Names {
    /// The slot in `kept` of `name`'s bytes (its target a prompt only when `tool_only` is
    /// false), encoded now when not kept (in a slot other than `keep`); `None` for a fixed
    /// name (encoded in place, rare).
    fn find(&mut self, name: &SpanName, tool_only: bool, keep: Option<usize>) -> Option<usize> {
        let SpanName::Method { method, target } = name else {
            return None;
        };
        let target = match target {
            Target::Prompt(_) if tool_only => &Target::None,
            t => t,
        };
        let same = |k: &NameKey| {
            k.method == *method
                && match (&k.target, target) {
                    (Target::None, Target::None) => true,
                    (Target::Tool(a), Target::Tool(b)) | (Target::Prompt(a), Target::Prompt(b)) => {
                        Arc::ptr_eq(a, b) || a == b
                    }
                    _ => false,
                }
        };
        // The name found last, looked at first: a look through the names kept cost ~138
        // instructions per traced small `tools/call` with a few names kept, this ~95
        // (callgrind, issue 34).
        if self.kept.get(self.last).is_some_and(|(k, _)| same(k)) {
            return Some(self.last);
        }
        if let Some(at) = self.kept.iter().position(|(k, _)| same(k)) {
            self.last = at;
            return Some(at);
        }
        let target_len = match target {
            Target::None => 0,
            Target::Tool(t) | Target::Prompt(t) => t.len(),
        };
        if method.len() + target_len > LONGEST_KEPT_SPAN_NAME {
            self.scratch.push(NameBytes::of(method, target));
            return Some(KEPT_SPAN_NAMES + self.scratch.len() - 1);
        }
        let entry = (
            NameKey {
                method: method.clone(),
                target: target.clone(),
            },
            NameBytes::of(method, target),
        );
        if self.kept.len() < KEPT_SPAN_NAMES {
            self.kept.push(entry);
            return Some(self.kept.len() - 1);
        }
        let mut at = self.next % KEPT_SPAN_NAMES;
        if keep == Some(at) {
            at = (at + 1) % KEPT_SPAN_NAMES;
        }
        self.next = at + 1;
        self.kept[at] = entry;
        Some(at)
    }

    /// How a span named `name` is written: from the bytes in slot `found` ([`Names::find`]'s
    /// answer for it).
    fn name<'a>(&'a self, name: &'a SpanName, found: Option<usize>) -> Name<'a> {
        let bytes = found.and_then(|at| match at.checked_sub(KEPT_SPAN_NAMES) {
            None => self.kept.get(at).map(|(_, bytes)| bytes),
            Some(at) => self.scratch.get(at),
        });
        match (name, bytes) {
            (_, Some(bytes)) => Name::Encoded(bytes),
            (SpanName::Fixed(name), None) => Name::Fixed(name),
            // `find` keeps every name after a method: not reached.
            (SpanName::Method { method, .. }, None) => Name::Fixed(method),
        }
    }
}

/// A span's name as [`write_span`] writes it.
#[derive(Clone, Copy)]
enum Name<'a> {
    /// A fixed name (no name attributes).
    Fixed(&'a str),
    /// A name after a method: its fields encoded ([`Names`]).
    Encoded(&'a NameBytes),
}

/// A span name's encoded fields: `bytes[..method]` the `Span.name` field and the
/// `mcp.method.name` attribute (copied at once), `bytes[method..]` the target's attributes
/// (none, `gen_ai.tool.name` and `gen_ai.operation.name`, or `gen_ai.prompt.name`).
struct NameBytes {
    bytes: Vec<u8>,
    method: usize,
}

impl NameBytes {
    /// The fields of a span named after `method` and `target`.
    fn of(method: &str, target: &Target) -> NameBytes {
        let mut out = Vec::with_capacity(128);
        match target {
            Target::None => string(&mut out, 5, method),
            Target::Tool(t) | Target::Prompt(t) => {
                encode_key(5, WireType::LengthDelimited, &mut out);
                encode_varint((method.len() + 1 + t.len()) as u64, &mut out);
                out.extend_from_slice(method.as_bytes());
                out.push(b' ');
                out.extend_from_slice(t.as_bytes());
            }
        }
        keyed(&mut out, &key!(MCP_METHOD_NAME), method.as_bytes());
        let method = out.len();
        match target {
            Target::None => {}
            Target::Tool(tool) => {
                keyed(&mut out, &key!(GEN_AI_TOOL_NAME), tool.as_bytes());
                attribute_str(
                    &mut out,
                    9,
                    semconv::GEN_AI_OPERATION_NAME,
                    semconv::EXECUTE_TOOL,
                );
            }
            Target::Prompt(prompt) => keyed(&mut out, &key!(GEN_AI_PROMPT_NAME), prompt.as_bytes()),
        }
        NameBytes { bytes: out, method }
    }
}

/// A `ScopeSpans.spans` field's key and room for a two-byte length (a span of 128 bytes to
/// 16 KiB: nearly every span); returns where the length goes ([`close_span`]).
fn open_span(out: &mut Vec<u8>) -> usize {
    out.extend_from_slice(&[(2 << 3) | WireType::LengthDelimited as u8, 0, 0]);
    out.len() - 2
}

/// Writes the length of the span written since [`open_span`] returned `at` (a length of one
/// byte or of three moves its bytes).
fn close_span(out: &mut Vec<u8>, at: usize) {
    let len = out.len() - at - 2;
    if (128..16384).contains(&len) {
        out[at] = len as u8 | 0x80;
        out[at + 1] = (len >> 7) as u8;
        return;
    }
    let mut varint = Vec::with_capacity(10);
    encode_varint(len as u64, &mut varint);
    out.splice(at..at + 2, varint.iter().copied());
}

/// A `Span` message's fields; a name after a method and its attributes copied as encoded
/// ([`Names`]).
fn write_span(out: &mut Vec<u8>, r: &View<'_>) {
    // The fields of a known size, the ids, the parent's id, the kind, the two times and the
    // flags, written at once (a protobuf message's fields may come in any order; the name
    // goes after them, so the encoded name and its `mcp.method.name` attribute are one copy):
    // written apart, four copies and two for the name cost a small `tools/call`'s two spans
    // ~100 instructions more (`write_span` 812 → 714, callgrind, issue 34).
    let mut head = [0u8; 2 + 16 + 2 + 8 + 10 + 3 + 8 + 1 + 8 + 6];
    head[..2].copy_from_slice(&[(1 << 3) | WireType::LengthDelimited as u8, 16]);
    head[2..18].copy_from_slice(&r.trace_id.to_bytes());
    head[18..20].copy_from_slice(&[(2 << 3) | WireType::LengthDelimited as u8, 8]);
    head[20..28].copy_from_slice(&r.span_id.to_bytes());
    let mut at = 28;
    if let Some((parent, _)) = r.parent {
        head[28..30].copy_from_slice(&[(4 << 3) | WireType::LengthDelimited as u8, 8]);
        head[30..38].copy_from_slice(&parent.to_bytes());
        at = 38;
    }
    let kind = match r.kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    let remote = r.parent.is_some_and(|(_, remote)| remote);
    let flags = u32::from(r.flags.to_u8()) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 };
    let fixed = &mut head[at..at + 26];
    fixed[..3].copy_from_slice(&[
        (6 << 3) | WireType::Varint as u8,
        kind,
        (7 << 3) | WireType::SixtyFourBit as u8,
    ]);
    fixed[3..11].copy_from_slice(&r.start.to_le_bytes());
    fixed[11] = (8 << 3) | WireType::SixtyFourBit as u8;
    fixed[12..20].copy_from_slice(&r.end.to_le_bytes());
    fixed[20..22].copy_from_slice(&FLAGS_KEY);
    fixed[22..26].copy_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&head[..at + 26]);
    if !r.state.is_empty() {
        string(out, 3, r.state);
    }
    let named = match r.name {
        Name::Encoded(n) => {
            out.extend_from_slice(&n.bytes[..n.method]);
            Some(n)
        }
        Name::Fixed(name) => {
            string(out, 5, name);
            None
        }
    };
    if let Some(request) = r.request {
        if let Some(id) = request.id_bytes() {
            keyed(out, &key!(JSONRPC_REQUEST_ID), id);
        }
        if let Some(version) = request.version() {
            keyed(out, &key!(MCP_PROTOCOL_VERSION), version.as_bytes());
        }
        if let Some(session) = request.session_bytes() {
            keyed(out, &key!(MCP_SESSION_ID), session);
        }
    }
    let mut failed = false;
    for kv in r.attributes {
        let key = kv.key.as_str();
        failed |= key == semconv::ERROR_TYPE;
        attribute_field(out, 9, key, &kv.value);
    }
    if let Some(peer) = r.peer {
        let peer_attributes = peer.attributes();
        let replaced = |kv: &KeyValue| r.attributes.iter().any(|a| a.key == kv.key);
        match !r.attributes.is_empty() && peer_attributes.iter().any(replaced) {
            // Encoded once per upstream (the common case: no request attribute replaces one).
            false => out.extend_from_slice(peer.encoded(span_attributes)),
            true => {
                for kv in peer_attributes.iter().filter(|kv| !replaced(kv)) {
                    attribute_field(out, 9, kv.key.as_str(), &kv.value);
                }
            }
        }
    }
    if let Some(n) = named {
        out.extend_from_slice(&n.bytes[n.method..]);
    }
    if failed {
        // `Span.status` (field 15): `Status.code` (field 3) `STATUS_CODE_ERROR` (2), as the
        // conventions ask of a span with `error.type` (a JSON-RPC error, or `tool_error`).
        out.extend_from_slice(&ERROR_STATUS);
    }
    for event in r.events {
        let mut fields = Vec::new();
        fixed64(&mut fields, 1, nanos(event.timestamp));
        string(&mut fields, 2, &event.name);
        for kv in &event.attributes {
            attribute_field(&mut fields, 3, kv.key.as_str(), &kv.value);
        }
        message(out, 11, &fields);
    }
    for link in r.links {
        let mut fields = Vec::with_capacity(64);
        link_fields(&mut fields, link);
        message(out, 13, &fields);
    }
}

/// `Span.status` (field 15) `{code: STATUS_CODE_ERROR}`: the key, the length, `Status.code`'s
/// key (field 3, varint) and 2.
const ERROR_STATUS: [u8; 4] = [(15 << 3) | WireType::LengthDelimited as u8, 2, 3 << 3, 2];

/// The key of `Span.flags` (field 16, fixed32): two bytes.
const FLAGS_KEY: [u8; 2] = [
    0x80 | ((16 << 3) & 0x7f) | WireType::ThirtyTwoBit as u8,
    16 >> 4,
];

/// `attributes` as `Span.attributes` fields.
pub(super) fn span_attributes(attributes: &[KeyValue]) -> Vec<u8> {
    let mut out = Vec::new();
    for kv in attributes {
        attribute_field(&mut out, 9, kv.key.as_str(), &kv.value);
    }
    out
}

/// A `Span.Link` message's fields.
fn link_fields(out: &mut Vec<u8>, link: &SpanContext) {
    bytes(out, 1, &link.trace_id().to_bytes());
    bytes(out, 2, &link.span_id().to_bytes());
    let state = link.trace_state().header();
    if !state.is_empty() {
        string(out, 3, &state);
    }
    let flags = u32::from(link.trace_flags().to_u8())
        | HAS_IS_REMOTE
        | if link.is_remote() { IS_REMOTE } else { 0 };
    encode_key(6, WireType::ThirtyTwoBit, out);
    out.extend_from_slice(&flags.to_le_bytes());
}

/// A varint pushed straight onto the `Vec` (prost's `encode_varint` goes through `BufMut`, a
/// capacity check per byte: measured, callgrind, a quarter of the encoder's instructions).
fn encode_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A field's key: its tag and wire type.
fn encode_key(tag: u32, wire: WireType, out: &mut Vec<u8>) {
    encode_varint(u64::from(tag) << 3 | wire as u64, out);
}

fn nanos(t: SystemTime) -> u64 {
    // In u64 arithmetic (`as_nanos` is a u128, converted back: ~40 instructions more per
    // timestamp, four per request, callgrind, issue 34).
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| {
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
    })
}

/// The length of a length-delimited field `tag` of `len` bytes, key and length included.
fn field_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + encoded_len_varint(len as u64) + len
}

fn bytes(out: &mut Vec<u8>, tag: u32, value: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

fn string(out: &mut Vec<u8>, tag: u32, value: &str) {
    bytes(out, tag, value.as_bytes());
}

/// An embedded message `tag` whose encoded fields are `fields`.
fn message(out: &mut Vec<u8>, tag: u32, fields: &[u8]) {
    bytes(out, tag, fields);
}

fn fixed64(out: &mut Vec<u8>, tag: u32, value: u64) {
    encode_key(tag, WireType::SixtyFourBit, out);
    out.extend_from_slice(&value.to_le_bytes());
}

/// The `KeyValue.key` field of the semantic-convention name `semconv::$name` (its key byte,
/// its length, its bytes), made at compile time ([`key_field`]).
macro_rules! key {
    ($name:ident) => {{
        const NAME: &str = semconv::$name;
        const FIELD: [u8; NAME.len() + 2] = key_field(NAME);
        FIELD
    }};
}
use key;

/// `name` as a `KeyValue.key` field: `N` is its length and 2 (a name under 128 bytes).
const fn key_field<const N: usize>(name: &str) -> [u8; N] {
    let name = name.as_bytes();
    assert!(N == name.len() + 2 && name.len() < 128);
    let mut out = [0u8; N];
    out[0] = 0x0a;
    out[1] = name.len() as u8;
    let mut i = 0;
    while i < name.len() {
        out[i + 2] = name[i];
        i += 1;
    }
    out
}

/// The room [`keyed`] writes a field's head in: a key field of up to 58 bytes.
const KEYED_HEAD: usize = 64;

/// A `Span.attributes` field (9) whose key field is `key` ([`key!`]) and whose value is the
/// string `value`: the same bytes as [`attribute_str`]'s, the key copied whole as a constant
/// (encoding it with its lengths and copying it by `memcpy` cost ~35 instructions of the
/// ~130 an attribute took, five per small `tools/call`; callgrind, issue 34).
#[inline]
fn keyed<const N: usize>(out: &mut Vec<u8>, key: &[u8; N], value: &[u8]) {
    let any = field_len(1, value.len());
    let kv = N + field_len(2, any);
    if kv < 128 {
        // The field's head, the key and the value's head copied at once, a length known at
        // compile time (copied apart, ~15 instructions more per attribute, three per SERVER
        // span; callgrind, issue 34).
        const { assert!(N + 6 <= KEYED_HEAD) };
        let mut head = [0u8; KEYED_HEAD];
        head[0] = (9 << 3) | WireType::LengthDelimited as u8;
        head[1] = kv as u8;
        head[2..N + 2].copy_from_slice(key);
        head[N + 2..N + 6].copy_from_slice(&[0x12, any as u8, 0x0a, value.len() as u8]);
        out.reserve(2 + kv);
        out.extend_from_slice(&head[..N + 6]);
        out.extend_from_slice(value);
        return;
    }
    encode_key(9, WireType::LengthDelimited, out);
    encode_varint(kv as u64, out);
    out.extend_from_slice(key);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(any as u64, out);
    bytes(out, 1, value);
}

/// A `KeyValue` field `tag` whose value is the string `value`.
fn attribute_str(out: &mut Vec<u8>, tag: u32, key: &str, value: &str) {
    let any = field_len(1, value.len());
    let kv = field_len(1, key.len()) + field_len(2, any);
    if tag < 16 && kv < 128 {
        // Every key and length one byte (nearly every attribute): the field's head written
        // at once, the key and the value copied (writing each byte as a varint cost ~50
        // instructions of the ~130 an attribute took, callgrind, issue 34).
        out.reserve(2 + kv);
        let tag = (tag << 3) as u8 | WireType::LengthDelimited as u8;
        out.extend_from_slice(&[tag, kv as u8, 0x0a, key.len() as u8]);
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&[0x12, any as u8, 0x0a, value.len() as u8]);
        out.extend_from_slice(value.as_bytes());
        return;
    }
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(kv as u64, out);
    string(out, 1, key);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(any as u64, out);
    string(out, 1, value);
}

/// A `KeyValue` field `tag`: a string, an integer, a boolean or a double as such, anything
/// else (arrays, which taskgate does not set) as its text.
fn attribute_field(out: &mut Vec<u8>, tag: u32, key: &str, value: &Value) {
    let (any_tag, wire, scalar) = match value {
        Value::Bool(b) => (2, WireType::Varint, u64::from(*b)),
        Value::I64(i) => (3, WireType::Varint, *i as u64),
        Value::F64(f) => (4, WireType::SixtyFourBit, f.to_bits()),
        _ => return attribute_str(out, tag, key, &value.as_str()),
    };
    let scalar_len = match wire {
        WireType::Varint => encoded_len_varint(scalar),
        _ => 8,
    };
    let any = prost::encoding::key_len(any_tag) + scalar_len;
    let kv = field_len(1, key.len()) + field_len(2, any);
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(kv as u64, out);
    string(out, 1, key);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(any as u64, out);
    encode_key(any_tag, wire, out);
    match wire {
        WireType::Varint => encode_varint(scalar, out),
        _ => out.extend_from_slice(&scalar.to_le_bytes()),
    }
}

/// A resource attribute (`Resource.attributes`, field 1).
fn key_value(out: &mut Vec<u8>, key: &str, value: &Value) {
    attribute_field(out, 1, key, value);
}

#[cfg(test)]
mod keyed_tests {
    use super::*;

    /// A constant key field writes the very bytes `attribute_str` writes, short or long.
    #[test]
    fn keyed_attributes_are_the_bytes_of_attribute_str() {
        let long = "v".repeat(300);
        for value in ["", "tools/call", "x".repeat(100).as_str(), long.as_str()] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            attribute_str(&mut a, 9, semconv::MCP_METHOD_NAME, value);
            keyed(&mut b, &key!(MCP_METHOD_NAME), value.as_bytes());
            assert_eq!(a, b, "{} bytes", value.len());
        }
        assert_eq!(key!(MCP_SESSION_ID)[..2], [0x0a, 14]);
        let mut flags = Vec::new();
        encode_key(16, WireType::ThirtyTwoBit, &mut flags);
        assert_eq!(flags, FLAGS_KEY);
    }

    /// A span name's fields encoded once ([`NameBytes`]) are the bytes of the general
    /// primitives: the name as a string field, each attribute as [`attribute_str`] writes it,
    /// for names short and long (lengths of one byte and of two), tools, prompts and none.
    #[test]
    fn kept_names_are_the_bytes_of_the_primitives() {
        let long = "n".repeat(200);
        for method in ["tools/call", "prompts/get", "x/not-mcp", ""] {
            for name in ["echo", "", "é", long.as_str()] {
                let targets = [
                    Target::None,
                    Target::Tool(name.into()),
                    Target::Prompt(name.into()),
                ];
                for target in targets {
                    let mut expected = Vec::new();
                    let full = match &target {
                        Target::None => method.to_string(),
                        Target::Tool(t) | Target::Prompt(t) => format!("{method} {t}"),
                    };
                    string(&mut expected, 5, &full);
                    attribute_str(&mut expected, 9, semconv::MCP_METHOD_NAME, method);
                    let method_end = expected.len();
                    match &target {
                        Target::None => {}
                        Target::Tool(t) => {
                            attribute_str(&mut expected, 9, semconv::GEN_AI_TOOL_NAME, t);
                            attribute_str(
                                &mut expected,
                                9,
                                semconv::GEN_AI_OPERATION_NAME,
                                semconv::EXECUTE_TOOL,
                            );
                        }
                        Target::Prompt(p) => {
                            attribute_str(&mut expected, 9, semconv::GEN_AI_PROMPT_NAME, p)
                        }
                    }
                    let made = NameBytes::of(method, &target);
                    assert_eq!(made.bytes, expected, "{full}");
                    assert_eq!(made.method, method_end, "{full}");
                }
            }
        }
    }
}

//! The compact record of one span as the serving threads keep it until the export thread
//! encodes it (`otlp`).
//!
//! Why not the SDK's own `Span`: measured with `benches/telemetry.sh` (issue 34), SDK spans made
//! on the serving threads cost a small `tools/call` at c=16 +16 µs of serving-thread CPU (30.9 →
//! 46.8 µs): their name, attribute keys and values, links and events are allocated there one by
//! one and freed on the export thread (glibc then locks the serving thread's arena), and the
//! whole `SpanData` is moved through the processor's channel. A [`Record`] holds the ids, the
//! times and a few values: the names of the semantic conventions and the values every request
//! shares (the method, the protocol version, the upstream's address) are `&'static str` or a
//! shared [`Peer`], the span name and the GenAI attributes are made from [`Target`] on the
//! export thread, so a request's SERVER span allocates only the values that are the request's
//! own (its id and its session, in one `String`; its tool's name is shared, [`shared_name`]).

use super::semconv;
use bytes::Bytes;
use opentelemetry::trace::{Event, SpanContext, SpanId, SpanKind};
use opentelemetry::KeyValue;
use std::borrow::Cow;
use std::sync::Arc;

/// What a span is named after: an MCP request's method and, for `tools/call` and `prompts/get`,
/// its tool or prompt (`{mcp.method.name} {target}`), or a fixed name (an audit fact's).
#[derive(Debug, Clone, PartialEq)]
pub enum SpanName {
    /// `{method}`, `{method} {tool}` or `{method} {prompt}`; `mcp.method.name` is the method.
    Method {
        /// The JSON-RPC method, `&'static` for the methods MCP defines ([`method`]).
        method: Cow<'static, str>,
        /// The tool or prompt the request names.
        target: Target,
    },
    /// A name of taskgate's own, no `mcp.method.name`.
    Fixed(&'static str),
}

/// The tool or prompt of a request: the span name's second word and the GenAI attributes
/// (`gen_ai.tool.name` and `gen_ai.operation.name = execute_tool`, or `gen_ai.prompt.name`).
/// The name is shared ([`shared_name`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Neither.
    None,
    /// The tool of a `tools/call`.
    Tool(Arc<str>),
    /// The prompt of a `prompts/get`.
    Prompt(Arc<str>),
}

/// `name` (a tool's or a prompt's) shared: the one this thread made last time when it is one of
/// the last `KEPT_NAMES` it made (at most `LONGEST_KEPT_NAME` bytes), else made now and kept
/// in place of the oldest. A span's target is then a reference count, where a `String` of its
/// own was an allocation on the serving thread freed on the export thread (~300 instructions per
/// small `tools/call`, callgrind, issue 34); a client naming tools at random costs what it did.
pub fn shared_name(name: &str) -> Arc<str> {
    let name = bounded(name);
    shared(name.as_bytes(), || Some(name)).unwrap_or_else(|| Arc::from(name))
}

/// The longest text a span keeps from a request or an answer (a method, a tool's or a prompt's
/// name, a request id, a session id, a task id), in bytes; a longer one is cut ([`bounded`]).
/// A span is then at most a few KiB, and the export queue (`batch::QUEUE` spans) a bounded
/// number of MiB. Tester 5 #1: 4 MB tool names kept whole took a sidecar to 940 MB RSS through
/// the queue, and made one 24 MiB export body that a collector refused (its default limit is
/// 20 MiB), losing every other client's spans in it. MCP's tool names are 1–128 characters
/// (2025-11-25, "Tool names"), its ids and session ids far shorter.
pub const MAX_TEXT: usize = 256;

/// `text` cut to at most [`MAX_TEXT`] bytes at a character boundary.
pub fn bounded(text: &str) -> &str {
    crate::text::prefix(text, MAX_TEXT)
}

/// [`bounded`] of UTF-8 bytes (not checked here).
fn bounded_bytes(text: &[u8]) -> &[u8] {
    crate::text::prefix_bytes(text, MAX_TEXT)
}

/// [`bounded`] of an owned or borrowed text, as a `String` (an owned one within the bound is
/// moved, not copied).
pub fn bounded_string(text: Cow<'_, str>) -> String {
    match text {
        Cow::Owned(s) if s.len() <= MAX_TEXT => s,
        text => bounded(&text).to_string(),
    }
}

/// [`shared_name`] of `raw`, the raw JSON value of a request's tool or prompt (`params.name`),
/// when it is a string: without escapes its bytes between the quotes are compared with the
/// names kept, checked as UTF-8 only when none is it (issue 34: decoding and checking the name
/// first cost a traced small `tools/call` ~100 instructions per span); with escapes decoded.
pub fn shared_json_name(raw: &[u8]) -> Option<Arc<str>> {
    JsonString::of(raw)?.shared()
}

/// A JSON string value: its bytes between the quotes when it has no escape, else decoded.
pub(super) enum JsonString<'a> {
    Plain(&'a [u8]),
    Decoded(String),
}

impl<'a> JsonString<'a> {
    /// `raw` (one JSON value) as a string; `None` for any other value (or a string that does
    /// not decode).
    pub(super) fn of(raw: &'a [u8]) -> Option<JsonString<'a>> {
        let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        if !inner.contains(&b'\\') {
            return Some(JsonString::Plain(inner));
        }
        serde_json::from_slice::<String>(raw)
            .ok()
            .map(JsonString::Decoded)
    }

    /// [`shared_name`] of the string (`None`: not UTF-8).
    pub(super) fn shared(&self) -> Option<Arc<str>> {
        match self {
            JsonString::Plain(name) => {
                let name = bounded_bytes(name);
                shared(name, || std::str::from_utf8(name).ok())
            }
            JsonString::Decoded(name) => Some(shared_name(name)),
        }
    }

    /// The string's bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            JsonString::Plain(b) => b,
            JsonString::Decoded(s) => s.as_bytes(),
        }
    }
}

/// [`shared_name`] of `name`'s bytes; `text` gives them as text for a name not kept (`None`:
/// not UTF-8, nothing made).
fn shared<'n>(name: &[u8], text: impl FnOnce() -> Option<&'n str>) -> Option<Arc<str>> {
    type Kept = (usize, [Option<Arc<str>>; KEPT_NAMES]);
    thread_local! {
        static NAMES: std::cell::RefCell<Kept> = const {
            std::cell::RefCell::new((0, [const { None }; KEPT_NAMES]))
        };
    }
    if name.len() > LONGEST_KEPT_NAME {
        return text().map(Arc::from);
    }
    NAMES.with(|kept| {
        let Ok(mut kept) = kept.try_borrow_mut() else {
            return text().map(Arc::from);
        };
        let (oldest, names) = &mut *kept;
        if let Some(found) = names.iter().flatten().find(|n| n.as_bytes() == name) {
            return Some(found.clone());
        }
        let made: Arc<str> = Arc::from(text()?);
        if let Some(slot) = names.get_mut(*oldest) {
            *slot = Some(made.clone());
        }
        *oldest = (*oldest + 1) % KEPT_NAMES;
        Some(made)
    })
}

/// How many names [`shared_name`] keeps per thread.
const KEPT_NAMES: usize = 8;
/// The longest name [`shared_name`] keeps, in bytes.
const LONGEST_KEPT_NAME: usize = 128;

/// One upstream's `server.address`, `server.port`, `network.transport` (and
/// `network.protocol.name`), made once per upstream and shared by its spans, with their OTLP
/// encoding (`Span.attributes` fields), also made once: a span's copy of them is one copy of
/// bytes on the export thread (issue 34: encoding them again for each span's two or four
/// attributes cost a small `tools/call` ~1,700 instructions with both its spans).
#[derive(Debug, Clone)]
pub struct Peer(Arc<PeerAttributes>);

#[derive(Debug)]
struct PeerAttributes {
    attributes: Vec<KeyValue>,
    /// Made by the encoder the first time it meets this peer (so the span records stand
    /// below the encoder: `otlp` imports `span`, never the reverse).
    encoded: std::sync::OnceLock<Vec<u8>>,
}

impl Peer {
    /// The peer of these attributes.
    pub fn new(attributes: Vec<KeyValue>) -> Peer {
        Peer(Arc::new(PeerAttributes {
            attributes,
            encoded: std::sync::OnceLock::new(),
        }))
    }

    /// The attributes.
    pub fn attributes(&self) -> &[KeyValue] {
        &self.0.attributes
    }

    /// The attributes as encoded `Span.attributes` fields, made with `encode` once per peer.
    pub(super) fn encoded(&self, encode: fn(&[KeyValue]) -> Vec<u8>) -> &[u8] {
        self.0.encoded.get_or_init(|| encode(&self.0.attributes))
    }
}

/// `method` as a `'static` string when it is one MCP defines (no allocation per span), else
/// owned, cut to 256 bytes (`bounded`).
pub fn method(method: &str) -> Cow<'static, str> {
    const KNOWN: &[&str] = &[
        "tools/call",
        "tools/list",
        "tasks/get",
        "tasks/result",
        "tasks/cancel",
        "tasks/list",
        "tasks/update",
        "initialize",
        "ping",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "server/discover",
        "sampling/createMessage",
        "elicitation/create",
        "roots/list",
    ];
    match KNOWN.iter().find(|k| **k == method) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(bounded(method).to_string()),
    }
}

/// `version` as a `'static` string when it is a revision of MCP, else owned, cut to 256 bytes (`bounded`).
pub fn protocol_version(version: &str) -> Cow<'static, str> {
    const KNOWN: &[&str] = &[
        "2026-07-28",
        "2025-11-25",
        "2025-06-18",
        "2025-03-26",
        "2024-11-05",
    ];
    match KNOWN.iter().find(|k| **k == version) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(bounded(version).to_string()),
    }
}

/// A request's own values on its SERVER span, `jsonrpc.request.id`, `mcp.protocol.version` and
/// `mcp.session.id`, exported in that order before the span's other attributes: the id's and
/// the session's text in one `Text`, in place when short (issue 34: as three `KeyValue`s in a
/// `Vec`, two of them owned strings, they cost a small `tools/call` three allocations on the
/// serving thread and three frees on the export thread; in one `String`, one of each, ~250
/// instructions with the free on the other thread).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestValues {
    /// The id's text, then the session's.
    text: Text,
    /// Where the id ends in `text`, when there is one (it starts at 0).
    id: Option<usize>,
    /// Whether `text` holds a session after the id.
    session: bool,
    version: Option<Cow<'static, str>>,
}

/// The id's and the session's text: in place up to [`INLINE_TEXT`] bytes, on the heap past it
/// (`smallvec`, already in the tree). Made of whole UTF-8 texts (an `Id`'s, a `&str`) and cut
/// only where one ended, so it is always UTF-8.
type Text = smallvec::SmallVec<[u8; INLINE_TEXT]>;

/// The longest [`Text`] kept in place: a request id and a session id of 36 characters (a UUID)
/// or of taskgate's own (`tgs-` and 32 hex digits) with room to spare.
const INLINE_TEXT: usize = 62;

impl RequestValues {
    /// The values of a request with `id` (the id's text: a string id decoded, a number as
    /// written), `version` and `session`.
    pub fn new(
        id: Option<&str>,
        version: Option<Cow<'static, str>>,
        session: Option<&str>,
    ) -> RequestValues {
        let mut values = RequestValues::default();
        values.set(id.map(str::as_bytes), version, session);
        values
    }

    /// Sets these values to [`RequestValues::new`]'s of `id`, `version` and `session`, in
    /// place (a span's record's: made apart and moved into the record with the rest of the
    /// span, they were copied three times, issue 34). `id` is the id's text as bytes, UTF-8 (a
    /// `jsonrpc::Id`'s, UTF-8 when made; not checked again here, issue 34).
    pub fn set(
        &mut self,
        id: Option<&[u8]>,
        version: Option<Cow<'static, str>>,
        session: Option<&str>,
    ) {
        let id = id.map(bounded_bytes);
        let id_bytes = id.unwrap_or_default();
        let session_bytes = bounded(session.unwrap_or_default()).as_bytes();
        let len = id_bytes.len() + session_bytes.len();
        self.text = match len <= INLINE_TEXT {
            // Copied into an array made in place: with `SmallVec::extend_from_slice`'s
            // general insertion, twice, making the values cost ~240 instructions per SERVER
            // span, so ~115 (callgrind, issue 34).
            true => {
                let mut inline = [0u8; INLINE_TEXT];
                inline[..id_bytes.len()].copy_from_slice(id_bytes);
                inline[id_bytes.len()..len].copy_from_slice(session_bytes);
                Text::from_buf_and_len(inline, len)
            }
            false => {
                let mut text = Text::with_capacity(len);
                text.extend_from_slice(id_bytes);
                text.extend_from_slice(session_bytes);
                text
            }
        };
        self.id = id.map(<[u8]>::len);
        self.session = session.is_some();
        self.version = version;
    }

    /// `jsonrpc.request.id`.
    #[cfg(test)]
    pub(super) fn id(&self) -> Option<&str> {
        self.id
            .and_then(|end| std::str::from_utf8(self.text.get(..end)?).ok())
    }

    /// [`RequestValues::id`]'s bytes, for the encoder (read as they were put in, unchecked).
    pub(super) fn id_bytes(&self) -> Option<&[u8]> {
        self.id.and_then(|end| self.text.as_slice().get(..end))
    }

    /// `mcp.protocol.version`.
    pub(super) fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// `mcp.session.id`.
    #[cfg(test)]
    pub(super) fn session(&self) -> Option<&str> {
        match self.session {
            true => std::str::from_utf8(self.text.get(self.id.unwrap_or(0)..)?).ok(),
            false => None,
        }
    }

    /// [`RequestValues::session`]'s bytes, for the encoder.
    pub(super) fn session_bytes(&self) -> Option<&[u8]> {
        match self.session {
            true => self.text.as_slice().get(self.id.unwrap_or(0)..),
            false => None,
        }
    }

    /// Forgets the value of `key` (a later value of it is set as an attribute).
    pub(super) fn forget(&mut self, key: &str) {
        match key {
            semconv::JSONRPC_REQUEST_ID => {
                if let Some(end) = self.id.take() {
                    self.text.drain(..end.min(self.text.len()));
                }
            }
            semconv::MCP_SESSION_ID => self.session = false,
            semconv::MCP_PROTOCOL_VERSION => self.version = None,
            _ => {}
        }
    }
}

/// One sampled span while it is open and until the export thread encodes it: the span name,
/// `mcp.method.name` and the GenAI attributes come from `name`, the upstream's from `peer`.
/// A request's SERVER span also holds the CLIENT span of the request's first upstream
/// exchange ([`Exchange`]): the two are queued and exported together, once both ended.
#[derive(Debug)]
pub(super) struct Record {
    /// Whether the span of `context` is still open (it may have ended while its exchange's
    /// span is open).
    pub(super) open: bool,
    /// The CLIENT span of the request's first upstream exchange, when sampled.
    pub(super) exchange: Option<Exchange>,
    pub(super) context: SpanContext,
    /// The parent's span id and whether the parent is remote; `None`: a root.
    pub(super) parent: Option<(SpanId, bool)>,
    pub(super) kind: SpanKind,
    pub(super) name: SpanName,
    /// Nanoseconds since the Unix epoch ([`super::now_nanos`]); `end` 0 until it ends.
    pub(super) start: u64,
    pub(super) end: u64,
    /// A SERVER span's request's id, protocol version and session.
    pub(super) request: RequestValues,
    /// The request's own attributes (a later value for a key replaces the earlier).
    pub(super) attributes: Vec<KeyValue>,
    /// The upstream's attributes, shared.
    pub(super) peer: Option<Peer>,
    /// Its links and events, which few spans have ([`Rare`]).
    pub(super) rare: Option<Box<Rare>>,
    /// The JSON answer whose `error.type` was worked out already (by the CLIENT span of the
    /// exchange that brought it) and that outcome, kept until the span ends
    /// (`RequestTrace::answer_json`; a record's own span only). In the record, not in
    /// [`Rare`]: noted for most traced requests (a tool result read at its ends), its box
    /// would cost an allocation each (issue 34).
    pub(super) answer: Option<(Bytes, Option<String>)>,
}

/// What few spans have, kept apart behind one pointer (issue 34: as three fields of every
/// record they made it larger to move through the queue and slower to drop, on every traced
/// request).
#[derive(Debug, Default)]
pub(super) struct Rare {
    pub(super) links: Vec<SpanContext>,
    pub(super) events: Vec<Event>,
}

impl Rare {
    /// `links` and `events` kept apart, `None` when both are empty.
    pub(super) fn of(links: Vec<SpanContext>, events: Vec<Event>) -> Option<Box<Rare>> {
        (!links.is_empty() || !events.is_empty()).then(|| Box::new(Rare { links, events }))
    }
}

/// The links of `rare`.
pub(super) fn links(rare: &Option<Box<Rare>>) -> &[SpanContext] {
    rare.as_ref().map_or(&[], |r| &r.links)
}

/// The events of `rare`.
pub(super) fn events(rare: &Option<Box<Rare>>) -> &[Event] {
    rare.as_ref().map_or(&[], |r| &r.events)
}

impl Record {
    /// The `error.type` noted for `body` when it is the very answer noted (the same bytes, not
    /// a copy); `None` when it must be read.
    pub(super) fn noted(&self, body: &Bytes) -> Option<Option<String>> {
        let (noted, kind) = self.answer.as_ref()?;
        (noted.as_ptr() == body.as_ptr() && noted.len() == body.len()).then(|| kind.clone())
    }

    /// How many spans this record holds: its own and its exchange's.
    pub(super) fn spans(&self) -> usize {
        1 + usize::from(self.exchange.is_some())
    }

    /// Whether no span of this record is open (it is then queued).
    pub(super) fn closed(&self) -> bool {
        !self.open && self.exchange.as_ref().is_none_or(|e| !e.open)
    }
}

/// Sets `attribute` in `attributes`, replacing an earlier value of its key.
pub(super) fn set(attributes: &mut Vec<KeyValue>, attribute: KeyValue) {
    match attributes.iter_mut().find(|a| a.key == attribute.key) {
        Some(old) => *old = attribute,
        None => attributes.push(attribute),
    }
}

/// The CLIENT span of a request's first upstream exchange, kept in the request's SERVER span's
/// [`Record`]: a child of it in its trace (its trace id, trace state and flags), named after
/// the exchange's method and tool, usually the SERVER span's own (issue 34: a record of its
/// own, queued, encoded and freed apart, with the tool's name copied again, cost a small
/// `tools/call` ~2,000 instructions). The shared record is queued for export once both spans
/// have ended, so a SERVER span whose exchange streams for minutes (a long SSE answer) is
/// exported when the stream ends, not when the request's own span does; one record per request
/// in flight, so this holds no more than the requests do.
#[derive(Debug)]
pub(super) struct Exchange {
    pub(super) span_id: SpanId,
    pub(super) open: bool,
    pub(super) name: ExchangeName,
    /// As [`Record::start`] and [`Record::end`].
    pub(super) start: u64,
    pub(super) end: u64,
    /// The exchange's own attributes (`mcp.task.id`, `error.type`).
    pub(super) attributes: Vec<KeyValue>,
    pub(super) peer: Option<Peer>,
    /// Its links and events, which few exchanges have (never an answer).
    pub(super) rare: Option<Box<Rare>>,
}

/// What an exchange's span is named after.
#[derive(Debug)]
pub(super) enum ExchangeName {
    /// The SERVER span's method, and its tool when it names one (a prompt is not the CLIENT
    /// span's target).
    AsServer,
    /// Its own.
    Own(SpanName),
}

#[cfg(test)]
mod text_tests {
    use super::*;

    /// A tool's raw JSON name is shared as its decoded string, and only a string is a name:
    /// compared as bytes without escapes, decoded with them, as `serde_json` reads it.
    #[test]
    fn a_json_name_is_shared_as_its_decoded_string() {
        let raws: [&[u8]; 10] = [
            br#""echo""#,
            br#""e\u0063ho""#,
            br#""a\"b""#,
            br#""""#,
            br#"""#,
            b"42",
            b"null",
            br#""\ud800""#,
            "\"é\"".as_bytes(),
            br#"["echo"]"#,
        ];
        for _ in 0..2 {
            for raw in raws {
                let expected = serde_json::from_slice::<String>(raw).ok();
                assert_eq!(
                    shared_json_name(raw).as_deref(),
                    expected.as_deref(),
                    "{}",
                    String::from_utf8_lossy(raw)
                );
            }
        }
        assert!(Arc::ptr_eq(
            &shared_json_name(br#""echo""#).unwrap(),
            &shared_name("echo")
        ));
    }

    /// Values too long to keep in place read as short ones do, and forget the same way.
    #[test]
    fn long_request_values_read_and_forget_as_short_ones() {
        let session = "s".repeat(INLINE_TEXT);
        for (id, session) in [("7", "s-1"), ("7", session.as_str()), ("", "")] {
            let mut v = RequestValues::new(Some(id), None, Some(session));
            assert_eq!((v.id(), v.session()), (Some(id), Some(session)));
            assert_eq!(v.id_bytes(), Some(id.as_bytes()));
            assert_eq!(v.session_bytes(), Some(session.as_bytes()));
            assert_eq!(v, v.clone());
            v.forget(semconv::JSONRPC_REQUEST_ID);
            assert_eq!((v.id(), v.session()), (None, Some(session)));
            assert_eq!(v, RequestValues::new(None, None, Some(session)));
        }
    }

    /// Texts past [`MAX_TEXT`] bytes are cut at a character boundary, in every place a span
    /// takes one from a request (tester 5 #1); shorter ones are kept as they are.
    #[test]
    fn texts_past_the_bound_are_cut_at_a_character_boundary() {
        let huge = format!("x{}", "é".repeat(1_000));
        let cut = format!("x{}", "é".repeat(127));
        assert_eq!((bounded(&huge), bounded("echo")), (cut.as_str(), "echo"));
        assert_eq!(bounded_bytes(huge.as_bytes()), cut.as_bytes());
        assert_eq!(&*shared_name(&huge), cut);
        let raw = format!("\"{huge}\"");
        assert_eq!(
            shared_json_name(raw.as_bytes()).as_deref(),
            Some(cut.as_str())
        );
        let escaped = format!("\"\\n{huge}\"");
        assert_eq!(shared_json_name(escaped.as_bytes()).unwrap().len(), 256);
        assert_eq!(method(&huge), cut);
        assert_eq!(protocol_version(&huge), cut);
        let v = RequestValues::new(Some(&huge), None, Some(&huge));
        assert_eq!(
            (v.id(), v.session()),
            (Some(cut.as_str()), Some(cut.as_str()))
        );
        assert_eq!(bounded_string(huge.clone().into()), cut);
        assert_eq!(bounded_string("t-1".into()), "t-1");
    }
}

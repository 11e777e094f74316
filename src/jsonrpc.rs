//! JSON-RPC 2.0 envelope, ids and error codes, as MCP uses them.
//!
//! taskgate parses only the envelope of a message (`jsonrpc`, `id`, `method`, and whether it
//! carries `result` or `error`) and keeps the bytes that arrived. A message that no layer changes
//! is forwarded as those bytes. Ids are kept as their raw JSON text, so `0` stays the number `0`
//! and `"0"` stays the string `"0"` (2025-11-25 basic: "Requests": ids are strings or integers).

mod envelope;
pub(crate) mod lex;
pub mod splice;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;
use std::ops::Range;

/// `-32700` Parse error: the body is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// `-32600` Invalid Request: JSON, but not one JSON-RPC 2.0 message (for example a batch array).
pub const INVALID_REQUEST: i64 = -32600;
/// `-32601` Method not found.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// `-32602` Invalid params: also unknown, expired or foreign `taskId` (2025-11-25 tasks: Error Handling).
pub const INVALID_PARAMS: i64 = -32602;
/// `-32603` Internal error: also used for upstream failures (unreachable, timeout) taskgate reports.
pub const INTERNAL_ERROR: i64 = -32603;

/// A JSON-RPC request id, kept as its raw JSON text (`0`, `"0"`, `"abc"`).
///
/// Equality is textual: `1` and `"1"` are different ids, as JSON-RPC requires.
///
/// A short id (what clients send: a counter, a UUID-less string) is kept inline, so a parsed
/// request allocates nothing for it and a clone is a copy of a few words; a longer one is shared
/// (`Arc`): a request's id is kept by several layers (the reply's splice, observe's expectation,
/// the upstream client's error answers), and a clone is then a count, not a copy. (The `Arc` of
/// every id cost an allocation and a free per request: ~280 instructions, benches/profile.sh small.)
#[derive(Clone)]
pub struct Id(IdText);

/// How many bytes of JSON text an [`Id`] holds inline.
const INLINE_ID: usize = 22;

#[derive(Clone)]
enum IdText {
    /// At most [`INLINE_ID`] bytes: `len` and the text (UTF-8, checked when built).
    Inline { len: u8, text: [u8; INLINE_ID] },
    /// Longer ids.
    Shared(std::sync::Arc<str>),
}

// Compared and hashed as bytes: the text is UTF-8 by construction, and `as_json`'s check of
// it (twice per comparison, once per hash) cost ~300 instructions per request in the `ids`
// layer's table (benches/profile.sh small, issue 36).
impl PartialEq for Id {
    fn eq(&self, other: &Id) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Id {}

impl std::hash::Hash for Id {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl Id {
    /// The id's JSON text as bytes (no UTF-8 check: what equality and hashing compare).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            IdText::Inline { len, text } => text.get(..usize::from(*len)).unwrap_or_default(),
            IdText::Shared(text) => text.as_bytes(),
        }
    }

    /// The id's JSON text, ready to splice into a message.
    pub fn as_json(&self) -> &str {
        match &self.0 {
            // Always UTF-8 (built from a `&str` cut at its end); "" cannot happen.
            IdText::Inline { len, text } => {
                std::str::from_utf8(&text[..usize::from(*len)]).unwrap_or_default()
            }
            IdText::Shared(text) => text,
        }
    }

    /// The id of JSON text already checked to be one.
    fn of_text(text: &str) -> Id {
        if text.len() <= INLINE_ID {
            let mut inline = [0u8; INLINE_ID];
            inline[..text.len()].copy_from_slice(text.as_bytes());
            Id(IdText::Inline {
                len: text.len() as u8,
                text: inline,
            })
        } else {
            Id(IdText::Shared(text.into()))
        }
    }

    /// Builds an id from its JSON text. Returns `None` unless the text is a JSON string or integer.
    ///
    /// A string id with escapes is kept in serde_json's canonical spelling, so `"\u0061"` and
    /// `"a"` (the same string) are the same id when an upstream echoes it differently.
    pub fn from_json(text: &str) -> Option<Id> {
        // The ids clients send (a plain string, a small integer) are recognised without a parse
        // (on every request); anything else takes serde_json's word.
        if is_plain_string(text) || is_small_integer(text) {
            return Some(Id::of_text(text));
        }
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        match v {
            serde_json::Value::String(s) if text.contains('\\') => {
                Some(Id::of_text(&serde_json::to_string(&s).ok()?))
            }
            serde_json::Value::String(_) => Some(Id::of_text(text)),
            serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(Id::of_text(text)),
            _ => None,
        }
    }

    /// An id from a `serde_json::Value` (string or integer), for ids taskgate reads out of params.
    pub fn from_value(v: &serde_json::Value) -> Option<Id> {
        match v {
            serde_json::Value::String(_) | serde_json::Value::Number(_) => {
                Id::from_json(&v.to_string())
            }
            _ => None,
        }
    }
}

/// A JSON string with no escape, quote or control character inside (so its text is canonical).
fn is_plain_string(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() >= 2
        && b[0] == b'"'
        && b[b.len() - 1] == b'"'
        && b[1..b.len() - 1]
            .iter()
            .all(|&c| c != b'"' && c != b'\\' && c >= 0x20)
}

/// A JSON integer (`0|-?[1-9][0-9]*`) of at most 18 digits, so within `i64` (serde_json reads
/// `-0` as a float: not an id).
fn is_small_integer(text: &str) -> bool {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest.as_bytes()),
        None => (false, text.as_bytes()),
    };
    !digits.is_empty()
        && digits.len() <= 18
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || (digits.len() == 1 && !negative))
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_json())
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_json())
    }
}

/// What kind of JSON-RPC message a [`Message`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and `id`.
    Request,
    /// Has `method`, no `id`.
    Notification,
    /// Has `id` and `result`.
    Response,
    /// Has `error` (and usually `id`).
    Error,
}

/// Why bytes are not one JSON-RPC message. Each maps to one JSON-RPC code.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// Not JSON at all (`-32700`).
    #[error("parse error: body is not valid JSON: {0}")]
    Parse(String),
    /// A JSON array: batches were removed in 2025-06-18 (`-32600`).
    #[error("invalid request: JSON-RPC batches are not supported (MCP 2025-06-18 removed batching); send one message per POST")]
    Batch,
    /// JSON, but not a JSON-RPC 2.0 message (`-32600`).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl EnvelopeError {
    /// The JSON-RPC error code for this error.
    pub fn code(&self) -> i64 {
        match self {
            EnvelopeError::Parse(_) => PARSE_ERROR,
            EnvelopeError::Batch | EnvelopeError::Invalid(_) => INVALID_REQUEST,
        }
    }
}

/// Keeps a present JSON `null` as `Some("null")` (serde's `Option` would make it `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

/// How many members of `params` the envelope parse notes the places of ([`Params`]); a message
/// with more is looked up by a walk of its `params` text. Four hold the members of the common
/// messages (`tools/call`: `name`, `arguments`, `task`, `_meta`; `tasks/*`: `taskId`, `_meta`;
/// `notifications/cancelled`: `requestId`, `reason`); each is 6 bytes of every message.
pub(crate) const PARAMS: usize = 4;

/// What the envelope parse knows of `params` (JSON-RPC 2.0 section 4.2: by-name params are an
/// object).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParamsState {
    /// No `params` member.
    Absent,
    /// `params` is not an object (an array, `null`, ...): it has no named members.
    NotAnObject,
    /// `params` is an object whose members are all in [`Params::members`].
    Indexed,
    /// Not indexed (more than [`PARAMS`] members, `params` longer than 64 KiB, or a message the
    /// one-pass reader handed back to serde_json): a lookup walks the message with
    /// [`splice::raw_at`].
    Walk,
}

/// The members of `params` the layers look up (`mcp::classify`: `task`, `taskId`, `name`,
/// `_meta`, `requestId`), whose places the envelope pass notes by name ([`Params::known`]), so
/// finding one, or knowing it is absent, is an index rather than a comparison of every key
/// (issue 36: `tasks` looking for `params.task` of a plain call cost ~150 instructions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Task = 0,
    TaskId = 1,
    Name = 2,
    Meta = 3,
    RequestId = 4,
}

impl Known {
    /// The known member a key names. (Byte patterns: a length test and byte comparisons,
    /// where a `match` on byte-string literals called `memcmp` for each.)
    #[inline(always)]
    fn of_key(key: &[u8]) -> Option<Known> {
        match key {
            [b't', b'a', b's', b'k'] => Some(Known::Task),
            [b't', b'a', b's', b'k', b'I', b'd'] => Some(Known::TaskId),
            [b'n', b'a', b'm', b'e'] => Some(Known::Name),
            [b'_', b'm', b'e', b't', b'a'] => Some(Known::Meta),
            [b'r', b'e', b'q', b'u', b'e', b's', b't', b'I', b'd'] => Some(Known::RequestId),
            _ => None,
        }
    }

    /// Where this member's slot is in [`Params::known`] (3 bits each).
    fn shift(self) -> u32 {
        3 * self as u32
    }
}

/// Where a message's `params` and its members are in its bytes, noted by the one envelope pass
/// (`envelope::read`) so that [`Message::param`] finds a member without reading `params` again.
/// Keys noted here hold no escape and no quote (the reader hands such messages back) and occur
/// once (a duplicate key is handed back too), so a lookup compares bytes, and a [`Known`] one
/// is found by its slot. Small (36 bytes: it is moved with every request): places are offsets
/// from `params`' start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    /// Where the value of `params` starts; meaningful unless [`ParamsState::Absent`] or
    /// [`ParamsState::Walk`].
    at: u32,
    /// Its length.
    len: u16,
    /// Per member, from `at`: where its key starts (after the quote), where its value starts
    /// and ends.
    members: [[u16; 3]; PARAMS],
    count: u8,
    state: ParamsState,
    /// Per [`Known`] member (3 bits each, at [`Known::shift`]): 0 when `params` has no such
    /// member, else its index in `members` plus one. Meaningful when [`ParamsState::Indexed`].
    known: u16,
}

impl Params {
    /// No `params`.
    pub(crate) const ABSENT: Params = Params {
        at: 0,
        len: 0,
        members: [[0; 3]; PARAMS],
        count: 0,
        state: ParamsState::Absent,
        known: 0,
    };

    /// Notes one member of `params` (which starts at `at`: already set); past [`PARAMS`]
    /// members, or 64 KiB, lookups walk instead.
    fn note(&mut self, key: usize, value: usize, end: usize, name: &[u8]) {
        if self.state != ParamsState::Indexed {
            return;
        }
        let from = |n: usize| {
            n.checked_sub(self.at as usize)
                .and_then(|n| u16::try_from(n).ok())
        };
        match (
            self.members.get_mut(usize::from(self.count)),
            from(key),
            from(value),
            from(end),
        ) {
            (Some(slot), Some(k), Some(v), Some(e)) => {
                *slot = [k, v, e];
                self.count += 1;
                if let Some(known) = Known::of_key(name) {
                    self.known |= u16::from(self.count) << known.shift();
                }
            }
            _ => self.state = ParamsState::Walk,
        }
    }

    /// Sets where `params` ends (`end`); past 64 KiB lookups walk.
    fn end(&mut self, end: usize) {
        match end
            .checked_sub(self.at as usize)
            .and_then(|n| u16::try_from(n).ok())
        {
            Some(len) => self.len = len,
            None => self.state = ParamsState::Walk,
        }
    }
}

/// One JSON-RPC message: the bytes as they arrived plus the parsed envelope, and where the
/// members of `params` are ([`Message::param`]).
///
/// Cloning is cheap (the bytes are reference-counted).
#[derive(Clone)]
pub struct Message {
    raw: Bytes,
    kind: Kind,
    id: Option<Id>,
    /// Borrowed for the common method names (no allocation per message), owned otherwise.
    method: Option<std::borrow::Cow<'static, str>>,
    params: Params,
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("kind", &self.kind)
            .field("id", &self.id)
            .field("method", &self.method)
            .field("bytes", &self.raw.len())
            .finish()
    }
}

impl Message {
    /// Parses the envelope of `raw` and keeps `raw` for forwarding.
    ///
    /// Errors: [`EnvelopeError::Parse`] for invalid JSON, [`EnvelopeError::Batch`] for an array,
    /// [`EnvelopeError::Invalid`] for anything else that is not one JSON-RPC 2.0 message.
    pub fn parse(raw: Bytes) -> Result<Message, EnvelopeError> {
        let first = raw.iter().find(|b| !b.is_ascii_whitespace()).copied();
        match first {
            Some(b'[') => {
                // Distinguish a batch from an array that is not even JSON.
                return match serde_json::from_slice::<serde::de::IgnoredAny>(&raw) {
                    Ok(_) => Err(EnvelopeError::Batch),
                    Err(e) => Err(EnvelopeError::Parse(e.to_string())),
                };
            }
            Some(b'{') => {
                // The common shape in one pass, as `parse_checked` reads it (the reader accepts
                // only what serde_json accepts with the same envelope; a duplicate key or
                // anything else it is not sure of goes to serde_json below, as before).
                if let Ok(text) = std::str::from_utf8(&raw) {
                    if let Some(mut members) = envelope::read(text) {
                        let method = members.method.take().map(std::borrow::Cow::Borrowed);
                        return Message::of_members(&raw, members, method);
                    }
                }
            }
            None => return Err(EnvelopeError::Parse("empty body".into())),
            Some(_) => {
                return match serde_json::from_slice::<serde::de::IgnoredAny>(&raw) {
                    Ok(_) => Err(EnvelopeError::Invalid(
                        "a JSON-RPC message must be a JSON object".into(),
                    )),
                    Err(e) => Err(EnvelopeError::Parse(e.to_string())),
                };
            }
        }
        Message::parse_object(&raw, None)
    }

    /// The envelope parse of a message that starts with `{`; `text` is `raw` when it is already
    /// known to be UTF-8 (serde_json then does not check each string it reads again).
    fn parse_object(raw: &Bytes, text: Option<&str>) -> Result<Message, EnvelopeError> {
        let env: Result<Envelope<'_>, _> = match text {
            Some(text) => serde_json::from_str(text),
            None => serde_json::from_slice(raw),
        };
        let env = env.map_err(|e| {
            if e.is_syntax() || e.is_eof() {
                EnvelopeError::Parse(e.to_string())
            } else {
                EnvelopeError::Invalid(e.to_string())
            }
        })?;
        Message::of_members(
            raw,
            envelope::Members {
                jsonrpc: env.jsonrpc.map(RawValue::get),
                id: env.id.map(RawValue::get),
                method: None,
                result: env.result.is_some(),
                error: env.error.is_some(),
                // Not read here (the envelope keeps serde_json's treatment of `params`):
                // lookups walk the message.
                params: Params {
                    state: ParamsState::Walk,
                    ..Params::ABSENT
                },
            },
            env.method,
        )
    }

    /// The message of an envelope's members (`method` apart: borrowed or decoded by serde).
    fn of_members(
        raw: &Bytes,
        members: envelope::Members<'_>,
        method: Option<std::borrow::Cow<'_, str>>,
    ) -> Result<Message, EnvelopeError> {
        match members.jsonrpc {
            Some("\"2.0\"") => {}
            _ => return Err(EnvelopeError::Invalid("`jsonrpc` must be \"2.0\"".into())),
        }
        let id = match members.id {
            None => None,
            Some(raw_id) => match Id::from_json(raw_id) {
                Some(id) => Some(id),
                None if raw_id == "null" && members.error => None,
                None if raw_id == "null" => {
                    return Err(EnvelopeError::Invalid(
                        "`id` must not be null (MCP: request ids are strings or integers; a notification has no id)".into(),
                    ))
                }
                // serde_json reads it as a float: refused as such, not as "out of range".
                None if raw_id == "-0" => {
                    return Err(EnvelopeError::Invalid(
                        "`id` -0 is read as a float (negative zero): send 0".into(),
                    ))
                }
                None if is_integer_literal(raw_id) => {
                    return Err(EnvelopeError::Invalid(format!(
                        "`id` {raw_id} is an integer out of range: ids are taken from -9223372036854775808 to 18446744073709551615 (64 bits)"
                    )))
                }
                None => {
                    return Err(EnvelopeError::Invalid(format!(
                        "`id` must be a string or an integer, got {raw_id}"
                    )))
                }
            },
        };
        let kind = match (&method, &id, members.result, members.error) {
            (Some(_), Some(_), false, false) => Kind::Request,
            (Some(_), None, false, false) => Kind::Notification,
            (None, Some(_), true, false) => Kind::Response,
            (None, _, false, true) => Kind::Error,
            _ => {
                return Err(EnvelopeError::Invalid(
                    "not a JSON-RPC request, notification, result or error".into(),
                ))
            }
        };
        let method = method.map(|m| match common_method(&m) {
            Some(name) => std::borrow::Cow::Borrowed(name),
            None => std::borrow::Cow::Owned(m.into_owned()),
        });
        Ok(Message {
            raw: raw.clone(),
            kind,
            id,
            method,
            params: members.params,
        })
    }

    /// [`Message::parse`] after [`check_json`]: valid UTF-8 everywhere (inside `params` too) and
    /// nested at most [`MAX_DEPTH`] levels, then the envelope parse, which checks the syntax of
    /// the whole text (serde_json's skip of unread fields validates grammar). No DOM is built, so
    /// a client's body that is not JSON is refused with `-32700` instead of being forwarded.
    ///
    /// A key that occurs twice in one object, anywhere in the message, is refused with
    /// [`EnvelopeError::Invalid`] (`-32600`) naming it ([`duplicate_key`]): JSON parsers differ
    /// on which of two members they keep (serde_json the last, many others the first), so
    /// taskgate and the upstream could act on different values (a `params.taskId` taskgate
    /// authorised and another one the upstream serves).
    pub fn parse_checked(raw: Bytes) -> Result<Message, EnvelopeError> {
        Message::checked(&raw)
    }

    /// [`Message::parse_checked`] for a client's body, whose refusal names the request it
    /// answers: with an [`EnvelopeError::Invalid`] (JSON, but not a message taskgate takes: a
    /// duplicate key, a `method` that is not a string) comes the message's `id` when it could
    /// be read as one ([`readable_id`]; JSON-RPC 2.0 section 5: the id is `null` only when it
    /// could not be read). Costs what `parse_checked` does until it fails.
    pub fn parse_checked_with_id(raw: Bytes) -> Result<Message, (EnvelopeError, Option<Id>)> {
        Message::checked(&raw).map_err(|e| {
            let id = match e {
                EnvelopeError::Invalid(_) => readable_id(&raw),
                EnvelopeError::Parse(_) | EnvelopeError::Batch => None,
            };
            (e, id)
        })
    }

    /// What [`Message::parse_checked`] does, on borrowed bytes (the message keeps a clone).
    fn checked(raw: &Bytes) -> Result<Message, EnvelopeError> {
        // The common shape in one pass (`envelope`: it checks the grammar and the nesting the
        // rest does; anything it is not sure of goes the way below, which decides as before).
        if let Ok(text) = std::str::from_utf8(&raw) {
            if let Some(mut members) = envelope::read(text) {
                let method = members.method.take().map(std::borrow::Cow::Borrowed);
                return Message::of_members(&raw, members, method);
            }
        }
        let text = check_json(raw)?;
        if text.trim_start().starts_with('{') {
            // What the one-pass reader handed back is read for duplicate keys here (the reader
            // hands back every message that has one).
            if let Some(at) = duplicate_key(text) {
                return Err(EnvelopeError::Invalid(format!(
                    "duplicate key {at}: a key may occur only once in a JSON object (parsers differ on which member they keep)"
                )));
            }
            // Read as text: serde_json does not check each string's UTF-8 again (about 400
            // instructions less per small request: benches/profile.sh small).
            return Message::parse_object(raw, Some(text));
        }
        // Not an object: always refused (a batch, a scalar), so the clone costs no request.
        Message::parse(raw.clone())
    }

    /// The bytes of the message, exactly as they arrived (or as a layer rewrote them).
    pub fn bytes(&self) -> &Bytes {
        &self.raw
    }

    /// Consumes the message, returning its bytes.
    pub fn into_bytes(self) -> Bytes {
        self.raw
    }

    /// Request, notification, result or error.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The id of a request, result or error.
    pub fn id(&self) -> Option<&Id> {
        self.id.as_ref()
    }

    /// The method of a request or notification (`tools/call`, `tasks/get`, ...).
    pub fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// The raw JSON text of the member `name` of `params` (by-name params, JSON-RPC 2.0 section
    /// 4.2), borrowed from the message; `None` when `params` is absent, not an object, or has no
    /// such member. Keys compare as the strings they spell (`"t\u0061sk"` is `task`), and of a
    /// repeated key the last counts, as for `serde_json::Value`.
    ///
    /// The places were noted by the envelope parse, so for the common message this is a few
    /// comparisons of short keys; a message it did not index (more than four members (`PARAMS`), escapes in
    /// keys, a repeated key) is walked ([`splice::raw_at`]).
    ///
    /// Inlined so that a literal `name` is matched to its `Known` member when compiled: the
    /// comparison cost ~25 instructions a look-up, six per small `tools/call` with traces on
    /// (callgrind, issue 34).
    #[inline]
    pub fn param(&self, name: &str) -> Option<&str> {
        match Known::of_key(name.as_bytes()) {
            Some(known) if self.params.state == ParamsState::Indexed => self.known_param(known),
            _ => self.param_by_name(name),
        }
    }

    /// [`Message::param`]'s bytes, not checked as UTF-8 again (the reader checked the whole
    /// text): for a caller that compares them with a name it has (the tool of a traced
    /// request's CLIENT span, `telemetry::shared_json_name`; the check cost ~60 instructions a
    /// look-up, callgrind, issue 34).
    #[inline]
    pub fn param_bytes(&self, name: &str) -> Option<&[u8]> {
        match Known::of_key(name.as_bytes()) {
            Some(known) if self.params.state == ParamsState::Indexed => {
                self.known_param_bytes(known)
            }
            _ => self.param_by_name(name).map(str::as_bytes),
        }
    }

    /// [`Message::param`] of a [`Known`] member of an indexed `params`: its noted slot.
    fn known_param(&self, known: Known) -> Option<&str> {
        // The reader checked the whole text is UTF-8.
        std::str::from_utf8(self.known_param_bytes(known)?).ok()
    }

    /// [`Message::known_param`]'s bytes.
    fn known_param_bytes(&self, known: Known) -> Option<&[u8]> {
        let p = &self.params;
        let at = p.at as usize;
        let raw = self.raw.get(at..at + usize::from(p.len))?;
        let slot = usize::from((p.known >> known.shift()) & 0b111);
        let [_, v, e] = *p.members.get(slot.checked_sub(1)?)?;
        raw.get(usize::from(v)..usize::from(e))
    }

    /// [`Message::param`] of any other member (a [`Known`] one of indexed `params` is
    /// [`Message::known_param`]'s).
    fn param_by_name(&self, name: &str) -> Option<&str> {
        let p = &self.params;
        match p.state {
            ParamsState::Absent | ParamsState::NotAnObject => None,
            ParamsState::Indexed => {
                let at = p.at as usize;
                let raw = self.raw.get(at..at + usize::from(p.len))?;
                let name = name.as_bytes();
                p.members[..usize::from(p.count)]
                    .iter()
                    .find_map(|&[k, v, e]| {
                        // The key holds no quote: `name` and then its closing quote.
                        let k = usize::from(k);
                        let key = raw.get(k..k + name.len() + 1)?;
                        if key.get(..name.len())? != name || key.last() != Some(&b'"') {
                            return None;
                        }
                        // The reader checked the whole text is UTF-8.
                        std::str::from_utf8(raw.get(usize::from(v)..usize::from(e))?).ok()
                    })
            }
            ParamsState::Walk => splice::raw_at(&self.raw, &["params", name])
                .ok()
                .flatten()
                .map(RawValue::get),
        }
    }

    /// The raw JSON text of `params`, borrowed from the message; `None` without one.
    pub fn params(&self) -> Option<&str> {
        let p = &self.params;
        match p.state {
            ParamsState::Absent => None,
            ParamsState::NotAnObject | ParamsState::Indexed => {
                let at = p.at as usize;
                std::str::from_utf8(self.raw.get(at..at + usize::from(p.len))?).ok()
            }
            ParamsState::Walk => splice::raw_at(&self.raw, &["params"])
                .ok()
                .flatten()
                .map(RawValue::get),
        }
    }

    /// This request or notification with `params._meta.<key>` set to `value` (JSON text, put in
    /// as it is) by splicing, every other byte as it was: the value replaced where `_meta` has the
    /// key already (the last copy, as [`splice::replace`] finds it), else the member added first
    /// to `_meta`, else `_meta` added first to `params`, else `params` added first to the
    /// message. `None` when this is not a request or notification, or its `params` or `_meta` is
    /// not an object. `key` needs no escaping; `value` is UTF-8 (its bytes are taken as they are:
    /// the trace context's are made as bytes, and a check of them cost ~100 instructions per
    /// traced upstream request, issue 34).
    ///
    /// The envelope is kept, not parsed again: the edit lies inside `params` (or adds it), so
    /// the kind, id and method are the message's (issue 34: parsing the spliced
    /// `_meta.traceparent` request again cost a small `tools/call` ~5,000 instructions). The
    /// places of `params`' members are not noted again: a look-up in the new message walks its
    /// `params` (`ParamsState::Walk`). (The message goes upstream as its bytes, its `params`
    /// not looked at again; moving the places noted, for a `_meta` added, cost each traced
    /// request ~110 instructions, callgrind, issue 34.)
    pub fn with_meta_member(&self, key: &str, value: &[u8]) -> Option<Message> {
        let member = format!("\"{key}\":");
        self.with_meta_member_at(member.as_bytes(), value)
            .map(|(message, _)| message)
    }

    /// [`Message::with_meta_member`] of the member whose key and colon are `member` (JSON text,
    /// `"traceparent":`: made once by the caller, put in as one piece with `value`), and where
    /// `value` starts in the new message's bytes ([`Message::bytes`]). A message of at most
    /// [`CARVED_MESSAGE`] bytes is carved from a buffer this thread keeps ([`MESSAGE_BUFFER`]
    /// bytes, shared by the messages carved from it), so a slice of it (the upstream client's
    /// `traceparent` header field, the value's inside) is a reference count, not a copy (issue
    /// 34: with an allocation of its own, freed once written upstream, and the header value
    /// carved apart, a traced small `tools/call` cost ~150 instructions more, the allocator's
    /// share most of it; two pairs of runs, 60 and 245, callgrind). A carved message keeps its
    /// whole buffer alive while it lives: made for a request on its way upstream, whose bytes
    /// are let go once written. `member` is put in as it is (read for its key only where
    /// `_meta` is there to look in: `None` then when it is not a key and a colon).
    pub fn with_meta_member_at(&self, member: &[u8], value: &[u8]) -> Option<(Message, usize)> {
        self.method()?;
        let raw = &self.raw[..];
        // Whether the object `object` has members: a comma then follows the one put first.
        let has_members = |object: &[u8]| {
            object
                .get(1..object.len().saturating_sub(1))
                .unwrap_or_default()
                .iter()
                .any(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        };
        // What is put in is copied straight into the spliced message ([`Parts`]), in as few
        // pieces as its shape allows (a comma after a closing brace in one; the key and its
        // colon in one, `member`: with the key, the quotes and the colon apart, and the places
        // noted again, this function cost each traced request 849 instructions, so 537,
        // callgrind, issue 34). `value` is the piece `value_part`.
        let (range, with, value_part) = match self.params.state {
            ParamsState::NotAnObject => return None,
            ParamsState::Absent => {
                // The message is an object with members (it has a method).
                let at = raw.iter().position(|&b| b == b'{')? + 1;
                let with = Parts::of([b"\"params\":{\"_meta\":{", member, value, b"}},"]);
                (at..at, with, 2)
            }
            ParamsState::Walk | ParamsState::Indexed => {
                // `params` and where it starts: noted by the envelope parse (read as bytes: its
                // UTF-8 check cost ~130 instructions per traced upstream request, issue 34), else
                // walked to.
                let (params, params_at) = match self.params.state {
                    ParamsState::Indexed => {
                        let at = self.params.at as usize;
                        (raw.get(at..at + usize::from(self.params.len))?, at)
                    }
                    _ => {
                        let params = self.params()?;
                        (params.as_bytes(), splice::span_of_str(raw, params)?.start)
                    }
                };
                if !params.starts_with(b"{") {
                    return None;
                }
                match self.param("_meta") {
                    Some(meta) if meta.starts_with('{') => {
                        let open = splice::span_of_str(raw, meta)?.start;
                        let key = member
                            .strip_prefix(b"\"")
                            .and_then(|m| m.strip_suffix(b"\":"))
                            .and_then(|k| std::str::from_utf8(k).ok())?;
                        match splice::raw_at(meta.as_bytes(), &[key]).ok()? {
                            Some(old) => {
                                let at = open + splice::span_of(meta.as_bytes(), old)?.start;
                                (at..at + old.get().len(), Parts::of([value]), 0)
                            }
                            None => {
                                let mut with = Parts::of([member, value]);
                                if has_members(meta.as_bytes()) {
                                    with.push(b",");
                                }
                                (open + 1..open + 1, with, 1)
                            }
                        }
                    }
                    Some(_) => return None,
                    None => {
                        let end: &[u8] = match has_members(params) {
                            true => b"},",
                            false => b"}",
                        };
                        let with = Parts::of([b"\"_meta\":{", member, value, end]);
                        (params_at + 1..params_at + 1, with, 2)
                    }
                }
            }
        };
        let value_at = range.start + with.before(value_part);
        let message = Message {
            raw: with.spliced(raw, range),
            kind: self.kind,
            id: self.id.clone(),
            method: self.method.clone(),
            params: Params {
                state: ParamsState::Walk,
                ..Params::ABSENT
            },
        };
        Some((message, value_at))
    }

    /// True for requests and notifications, which get 202 (notifications) or an answer (requests).
    pub fn expects_response(&self) -> bool {
        self.kind == Kind::Request
    }

    /// Deserialises the whole message into `T` (for layers that need fields beyond the envelope).
    pub fn parse_as<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.raw)
    }
}

/// The text [`Message::with_meta_member`] puts in, in at most six pieces, copied straight into
/// the spliced message (joined in a `Vec` first, they cost an allocation per upstream request
/// when traces are on, issue 34).
#[derive(Default)]
struct Parts<'a> {
    parts: [&'a [u8]; 6],
    count: usize,
}

impl<'a> Parts<'a> {
    /// The `N` parts (at most six), copied in at once: pushed one by one, checked each time,
    /// they cost each traced upstream request ~75 instructions more (callgrind, issue 34).
    fn of<const N: usize>(parts: [&'a [u8]; N]) -> Parts<'a> {
        const { assert!(N <= 6, "at most six parts") };
        let mut out = Parts {
            parts: [&[]; 6],
            count: N,
        };
        out.parts[..N].copy_from_slice(&parts);
        out
    }

    fn push(&mut self, part: &'a [u8]) {
        debug_assert!(self.count < self.parts.len(), "at most six parts");
        if let Some(slot) = self.parts.get_mut(self.count) {
            *slot = part;
            self.count += 1;
        }
    }

    fn len(&self) -> usize {
        self.parts[..self.count].iter().map(|p| p.len()).sum()
    }

    /// The length of the parts before part `i`.
    fn before(&self, i: usize) -> usize {
        self.parts[..i.min(self.count)]
            .iter()
            .map(|p| p.len())
            .sum()
    }

    /// `bytes` with `range` replaced by the parts: carved from this thread's buffer when at
    /// most [`CARVED_MESSAGE`] bytes long ([`Message::with_meta_member_at`]), else in a `Vec`
    /// of its own.
    fn spliced(&self, bytes: &[u8], range: Range<usize>) -> Bytes {
        use std::cell::RefCell;
        thread_local! {
            static BUFFER: RefCell<bytes::BytesMut> = RefCell::new(bytes::BytesMut::new());
        }
        let len = bytes.len() - range.len() + self.len();
        let (head, parts, tail) = (
            &bytes[..range.start],
            &self.parts[..self.count],
            &bytes[range.end..],
        );
        if len <= CARVED_MESSAGE {
            let carved = BUFFER.with(|buffer| {
                let mut buffer = buffer.try_borrow_mut().ok()?;
                if buffer.capacity() - buffer.len() < len {
                    *buffer = bytes::BytesMut::with_capacity(MESSAGE_BUFFER);
                }
                buffer.extend_from_slice(head);
                parts.iter().for_each(|p| buffer.extend_from_slice(p));
                buffer.extend_from_slice(tail);
                Some(buffer.split().freeze())
            });
            if let Some(carved) = carved {
                return carved;
            }
        }
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(head);
        parts.iter().for_each(|p| out.extend_from_slice(p));
        out.extend_from_slice(tail);
        Bytes::from(out)
    }
}

/// The longest message [`Message::with_meta_member_at`] carves from its thread's buffer, in
/// bytes.
pub const CARVED_MESSAGE: usize = MESSAGE_BUFFER / 8;

/// The size of the buffer each thread carves short spliced messages from, in bytes.
pub const MESSAGE_BUFFER: usize = 8 * 1024;

/// Whether `text` is a JSON-RPC result or error answering `id` (how a reply that streams other
/// messages first is searched for its answer).
pub fn is_answer_to(text: &[u8], id: &Id) -> bool {
    Message::parse(Bytes::copy_from_slice(text))
        .is_ok_and(|m| m.id() == Some(id) && matches!(m.kind(), Kind::Response | Kind::Error))
}

/// The method names most messages carry, as `'static` strings, so a parsed message does not
/// allocate its method name (one allocation and free per request otherwise).
fn common_method(name: &str) -> Option<&'static str> {
    Some(match name {
        "tools/call" => "tools/call",
        "tools/list" => "tools/list",
        "tasks/get" => "tasks/get",
        "tasks/result" => "tasks/result",
        "tasks/list" => "tasks/list",
        "tasks/cancel" => "tasks/cancel",
        "tasks/update" => "tasks/update",
        "initialize" => "initialize",
        "ping" => "ping",
        "notifications/initialized" => "notifications/initialized",
        "notifications/progress" => "notifications/progress",
        "notifications/cancelled" => "notifications/cancelled",
        "notifications/tasks/status" => "notifications/tasks/status",
        "notifications/tasks" => "notifications/tasks",
        "resources/read" => "resources/read",
        "prompts/get" => "prompts/get",
        _ => return None,
    })
}

/// Where `text` (JSON, nested at most [`MAX_DEPTH`] levels) has a key twice in one object: the
/// key and the JSON Pointer of its object, as `"taskId" in /params`; `None` when no key repeats
/// (or `text` is not JSON: the parse that follows words that). Keys are compared as the
/// strings they spell (`"a\/b"` is `"a/b"`). A full parse (it allocates a set per object with
/// more than a few keys): made only for what `envelope::read` hands back.
pub fn duplicate_key(text: &str) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::borrow::Cow;
    use std::cell::RefCell;

    /// One value; `path` the keys leading to it (for the answer), `found` the answer.
    struct Walk<'p> {
        path: &'p RefCell<Vec<String>>,
        found: &'p RefCell<Option<String>>,
    }
    /// A key as the string it spells, borrowed when it has no escape.
    struct Key<'de>(Cow<'de, str>);
    impl<'de> serde::Deserialize<'de> for Key<'de> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Key<'de>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a key")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                    Ok(Key(Cow::Borrowed(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                    Ok(Key(Cow::Owned(v.to_string())))
                }
                fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                    Ok(Key(Cow::Owned(v)))
                }
            }
            d.deserialize_str(V)
        }
    }
    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut i = 0usize;
            loop {
                self.path.borrow_mut().push(i.to_string());
                let more = seq.next_element_seed(Walk { ..self })?;
                self.path.borrow_mut().pop();
                if more.is_none() {
                    return Ok(());
                }
                i += 1;
            }
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            // A few keys are compared with each other; more go into a set.
            let mut few: Vec<Cow<'de, str>> = Vec::new();
            let mut many: std::collections::HashSet<Cow<'de, str>> = Default::default();
            while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                let seen = if many.is_empty() && few.len() < 16 {
                    few.contains(&key)
                } else {
                    if many.is_empty() {
                        many.extend(few.drain(..));
                    }
                    many.contains(&key)
                };
                if seen {
                    let path = self.path.borrow();
                    let pointer: String = path
                        .iter()
                        .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
                        .collect();
                    let key = serde_json::to_string(&key).unwrap_or_default();
                    *self.found.borrow_mut() = Some(if pointer.is_empty() {
                        format!("{key} in the message")
                    } else {
                        format!("{key} in {pointer}")
                    });
                    return Err(serde::de::Error::custom("duplicate key"));
                }
                self.path.borrow_mut().push(key.to_string());
                map.next_value_seed(Walk { ..self })?;
                self.path.borrow_mut().pop();
                if many.is_empty() && few.len() < 16 {
                    few.push(key);
                } else {
                    many.insert(key);
                }
            }
            Ok(())
        }
    }

    let (path, found) = (RefCell::new(Vec::new()), RefCell::new(None));
    let mut de = serde_json::Deserializer::from_str(text);
    let _ = Walk {
        path: &path,
        found: &found,
    }
    .deserialize(&mut de);
    found.into_inner()
}

/// Whether `raw` is a JSON integer (an optional `-`, digits, no fraction or exponent).
fn is_integer_literal(raw: &str) -> bool {
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Deepest nesting of arrays and objects accepted in a client's message (serde_json's own
/// recursion limit, which every later parse of the message applies too).
pub const MAX_DEPTH: usize = 128;

/// The `id` of a JSON object `raw` when it is one JSON-RPC id (a string or an integer in
/// range), read on its own: other members are skipped unread, so a message refused for
/// something else (a duplicate key elsewhere, a `method` that is not a string) still names
/// its request. `None` when `raw` is not a JSON object, has no `id`, has two, or its `id` is
/// no id.
pub fn readable_id(raw: &[u8]) -> Option<Id> {
    #[derive(Deserialize)]
    struct OnlyId<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    let only: OnlyId<'_> = serde_json::from_slice(raw).ok()?;
    Id::from_json(only.id?.get())
}

/// Checks what the envelope parse does not: that all of `raw` is UTF-8 (serde_json skips the
/// fields it does not read, `params` included, without checking their strings) and nested at
/// most [`MAX_DEPTH`] levels (its skipping has no depth limit). Syntax is the envelope
/// parse's. Returns `raw` as text; [`EnvelopeError::Parse`] naming what is wrong.
pub fn check_json(raw: &[u8]) -> Result<&str, EnvelopeError> {
    let text = std::str::from_utf8(raw)
        .map_err(|e| EnvelopeError::Parse(format!("invalid UTF-8 at byte {}", e.valid_up_to())))?;
    match nesting_over(raw, MAX_DEPTH) {
        Some(at) => Err(EnvelopeError::Parse(format!(
            "nested deeper than {MAX_DEPTH} levels (at byte {at})"
        ))),
        None => Ok(text),
    }
}

/// The offset where arrays and objects outside strings nest deeper than `max`, if they do:
/// one pass over the body.
fn nesting_over(raw: &[u8], max: usize) -> Option<usize> {
    let (mut depth, mut pos) = (0usize, 0usize);
    while pos < raw.len() {
        // Between strings (structure, numbers, literals): byte by byte. Inside strings, where
        // large bodies spend their bytes: memchr.
        let off = raw[pos..]
            .iter()
            .position(|b| matches!(b, b'"' | b'[' | b'{' | b']' | b'}'))?;
        pos += off;
        match raw[pos] {
            b'"' => {
                // Skip the string: to the next quote not escaped.
                pos += 1;
                loop {
                    // `get`: an escape at the very end (`"\`) steps past the body; that is an
                    // unterminated string, which the parse refuses (found by fuzz/envelope).
                    let q = raw
                        .get(pos..)
                        .and_then(|r| memchr::memchr2(b'"', b'\\', r))?;
                    pos += q;
                    if raw[pos] == b'\\' {
                        pos += 2;
                    } else {
                        break;
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Some(pos);
                }
            }
            _ => depth = depth.saturating_sub(1),
        }
        pos += 1;
    }
    None
}

/// What kind of JSON value the (valid) JSON text `raw` is, for an error message: `an object`,
/// `an array`, `a string`, `a boolean`, `null` or `a number`.
pub fn kind_of(raw: &str) -> &'static str {
    match raw.trim_start().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Builds the bytes of a JSON-RPC error response.
///
/// `id` is `None` when the request's id could not be read (the error then carries `"id": null`).
pub fn error_response(id: Option<&Id>, code: i64, message: &str) -> Bytes {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "error": { "code": code, "message": message },
    });
    let mut text = String::with_capacity(96 + message.len());
    text.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    text.push_str(id.map(Id::as_json).unwrap_or("null"));
    text.push_str(",\"error\":");
    text.push_str(&body["error"].to_string());
    text.push('}');
    Bytes::from(text)
}

/// Builds the bytes of a JSON-RPC error response with an `error.data` member.
pub fn error_response_with_data(
    id: Option<&Id>,
    code: i64,
    message: &str,
    data: &serde_json::Value,
) -> Bytes {
    let error = serde_json::json!({ "code": code, "message": message, "data": data });
    let mut text = String::with_capacity(64 + message.len());
    text.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    text.push_str(id.map(Id::as_json).unwrap_or("null"));
    text.push_str(",\"error\":");
    text.push_str(&error.to_string());
    text.push('}');
    Bytes::from(text)
}

/// Builds the bytes of a JSON-RPC result response from a result's JSON text.
pub fn result_response(id: &Id, result_json: &str) -> Bytes {
    let mut text = String::with_capacity(40 + result_json.len());
    text.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    text.push_str(id.as_json());
    text.push_str(",\"result\":");
    text.push_str(result_json);
    text.push('}');
    Bytes::from(text)
}

/// Whether `needle` occurs in `haystack` (SIMD search; layers use it to skip parsing messages
/// that cannot concern them). It builds its searcher on every call (about 400 instructions for a
/// short needle): a search made on every request uses a prebuilt one from [`crate::mcp::needles`].
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests;

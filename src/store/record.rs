//! The task record: one per `(upstream, taskId)`, with what was last seen of the task and the
//! audit event appended for the two cancellation facts.

use crate::jsonrpc::lex::plain_len;
use crate::mcp::task::{Task, TaskStatus};
use memchr::memmem;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::sync::LazyLock;

/// Finds the `status` member, the first of [`TaskRecord::json_body`], in a record's JSON (built
/// once: a finder made per search cost more than the search).
static STATUS: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b",\"status\":"));

/// Who owns a task: the caller that created it (see [`crate::exchange::Caller::owner`]).
///
/// Stored as the same strings taskgate always wrote (`principal:<name>`, `session:<id>`,
/// `anonymous`), so stores written before the type existed read unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// An authenticated principal (bearer or OAuth auth).
    Principal(String),
    /// Without auth: the client's own `Mcp-Session-Id` as it arrived (whoever holds the session
    /// id is the owner).
    Session(String),
    /// Without auth and without a session: no binding at all (task ids are the only key).
    Anonymous,
}

impl Owner {
    /// Parses the stored form; `None` for anything else.
    pub fn parse(s: &str) -> Option<Owner> {
        if let Some(p) = s.strip_prefix("principal:") {
            Some(Owner::Principal(p.to_string()))
        } else if let Some(id) = s.strip_prefix("session:") {
            Some(Owner::Session(id.to_string()))
        } else if s == "anonymous" {
            Some(Owner::Anonymous)
        } else {
            None
        }
    }

    /// True when `s` is an owner's stored form ([`Owner::parse`] would take it), without
    /// allocating.
    pub fn is_stored_form(s: &str) -> bool {
        s.starts_with("principal:") || s.starts_with("session:") || s == "anonymous"
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Principal(p) => write!(f, "principal:{p}"),
            Owner::Session(s) => write!(f, "session:{s}"),
            Owner::Anonymous => f.write_str("anonymous"),
        }
    }
}

impl Serialize for Owner {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Owner {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Owner, D::Error> {
        let s = String::deserialize(d)?;
        Owner::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("not an owner: {s:?}")))
    }
}

impl PartialEq<str> for Owner {
    fn eq(&self, other: &str) -> bool {
        match self {
            Owner::Principal(p) => other.strip_prefix("principal:") == Some(p.as_str()),
            Owner::Session(s) => other.strip_prefix("session:") == Some(s.as_str()),
            Owner::Anonymous => other == "anonymous",
        }
    }
}

impl PartialEq<&str> for Owner {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

/// Who made a call a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The client sent `params.task`.
    Client,
    /// taskgate turned a plain `tools/call` into a task.
    Upgraded,
    /// A 2025-11-25 client's task-augmented `tools/call`, bridged to a 2026-07-28 upstream
    /// (`layers::bridge`).
    Bridged,
    /// A task taskgate runs itself for an upstream without task support (`upstream.tasks =
    /// "gateway"`, `layers::gateway_tasks`): the upstream got a plain `tools/call` that taskgate
    /// holds; the `taskId` is taskgate's.
    Gateway,
}

impl Origin {
    /// Every origin.
    pub const ALL: &'static [Origin] = &[
        Origin::Client,
        Origin::Upgraded,
        Origin::Bridged,
        Origin::Gateway,
    ];

    /// The label value (`client`, `upgraded`, `bridged`, `gateway`).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Client => "client",
            Origin::Upgraded => "upgraded",
            Origin::Bridged => "bridged",
            Origin::Gateway => "gateway",
        }
    }
}

/// Longest `taskId` taskgate records, in bytes (an upstream's choice: ids are UUIDs and the
/// like, tens of bytes; a 2026-07-28 client repeats the id in its `Mcp-Name` header field).
pub const MAX_TASK_ID_BYTES: usize = 1024;

/// Whether `task_id` can name a recorded task: not empty (an empty id names nothing a client
/// could tell apart), at most [`MAX_TASK_ID_BYTES`] (a 100 KB id was recorded, logged whole,
/// and answered 431 when a 2026 client sent it back in `Mcp-Name`), and without control
/// characters (PostgreSQL's `text` cannot hold NUL: a lookup of such an id was a database
/// error, counted as a store failure; a header field cannot carry the others). A creation
/// naming another is refused (`MalformedCreateTaskResult`); a lookup of one finds nothing
/// (`-32602`), on either backend.
pub fn recordable_task_id(task_id: &str) -> bool {
    let bytes = task_id.as_bytes();
    // On bytes (every lookup asks): C0 and DEL are single bytes; C1 (U+0080 to U+009F) is
    // 0xC2 followed by 0x80 to 0x9F.
    !bytes.is_empty()
        && bytes.len() <= MAX_TASK_ID_BYTES
        && !bytes.iter().enumerate().any(|(i, &b)| {
            b < 0x20
                || b == 0x7f
                || (b == 0xc2 && bytes.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n)))
        })
}

/// One task as taskgate knows it. Times named `*_at` without a string type are milliseconds since
/// the Unix epoch on taskgate's clock; `created_at` / `last_updated_at` are the upstream's strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The upstream's configured name.
    pub upstream: String,
    /// The upstream's `taskId`, never rewritten.
    pub task_id: String,
    /// Who created it (stored as `principal:<name>`, `session:<Mcp-Session-Id>` or `anonymous`).
    pub owner: Owner,
    /// The `Mcp-Session-Id` the task was created on; `tasks/*` for it go out on that session.
    pub upstream_session: Option<String>,
    /// `client`, `upgraded`, `bridged` or `gateway` (see [`Origin`]).
    pub origin: Origin,
    /// The tool called (`params.name`).
    pub tool: Option<String>,
    /// The client's `MCP-Protocol-Version` at creation.
    pub protocol_version: Option<String>,
    /// The last status seen.
    pub status: TaskStatus,
    /// The last `statusMessage` seen.
    pub status_message: Option<String>,
    /// The upstream's `createdAt` (RFC 3339).
    pub created_at: String,
    /// The upstream's `lastUpdatedAt` (RFC 3339).
    pub last_updated_at: String,
    /// The task's ttl in ms: the upstream's, capped at `tasks.max_ttl_ms`, or the cap when the
    /// upstream gave `null` (unlimited) or none. `None` only in records written before taskgate
    /// recorded the cap (they expire at `expires_at` all the same).
    pub ttl_ms: Option<u64>,
    /// The upstream's `pollInterval` in ms.
    pub poll_interval_ms: Option<u64>,
    /// When taskgate recorded the task (orders `tasks/list`, newest first).
    pub recorded_at: u64,
    /// First `tasks/cancel` taskgate forwarded for it.
    pub cancel_requested_at: Option<u64>,
    /// Audit fact "status cancelled": first time taskgate saw `cancelled`.
    pub cancelled_at: Option<u64>,
    /// Audit fact "resources released" (see `registry::releases`).
    pub released_at: Option<u64>,
    /// When the status became terminal.
    pub terminal_at: Option<u64>,
    /// First time the upstream reported another terminal status after this one was recorded.
    #[serde(default)]
    pub late_result_at: Option<u64>,
    /// When the record expires: `createdAt + ttl`, or `createdAt + tasks.max_ttl_ms` when the
    /// upstream gave no ttl.
    pub expires_at: u64,
    /// The protocol era the task was created under (`legacy` for records written before eras).
    #[serde(default)]
    pub era: crate::mcp::era::Era,
    /// A terminal task's result as it passed through, JSON text: under 2026-07-28 the whole
    /// `result` of the terminal `tasks/get` (`DetailedTask` with `result` / `error` inline).
    /// At most `tasks.max_stored_result_bytes`; later `tasks/get` calls are answered from it.
    /// Stored at rest with the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_result: Option<String>,
    /// The JSON-RPC `error` object (JSON text) a 2025-11-25 gateway task `failed` with (issue
    /// 32: `tasks/result` answers exactly that error, also after a restart), or that taskgate
    /// failed a bridged task with (issue 33: its input request was lost when taskgate
    /// restarted; the 2026-07-28 `tasks/get` shows it as `error`). At most
    /// `tasks.max_stored_result_bytes`. Absent in every other record, and in records written
    /// before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_error: Option<String>,
    /// A 2026-07-28 task that ended `completed` with `result.isError: true` (a tool error;
    /// SEP-2663: `completed` includes tool errors). `status` keeps the 2026 `completed`; the
    /// 2025-11-25 form ([`TaskRecord::to_task`]) shows it `failed`, as the bridge's `tasks/get`
    /// does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_error: bool,
    /// The W3C `traceparent` of the span that created the task (the creating request's SERVER
    /// span, `[telemetry]` on; issue 34): its later requests, taskgate's own polls and its audit
    /// facts link to it. Absent in records written without traces (and before them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
    /// A bridged 2025-11-25 task's input requests not yet answered (issue 33,
    /// `layers::bridge::reverse::input`), JSON text: an object from each request's key (its
    /// JSON-RPC id as `inputRequests` shows it) to `{id, method, params}` as the upstream sent
    /// them (`params` without the 2025 related-task `_meta`). Written by the replica that
    /// captured them, so a `tasks/get` / `tasks/update` on any replica, or after a restart, can
    /// show and answer them; a key is removed when answered. At most
    /// `input::MAX_KEYS` keys and `tasks.max_stored_result_bytes` bytes. Absent in every other
    /// record, and in records written before it existed (PostgreSQL keeps it in the `record`
    /// column's JSON, like every optional field, so no migration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_requests: Option<String>,
    /// A 2026-07-28 task whose `tasks/cancel` the upstream acknowledged (a non-terminal ack):
    /// every later cancel gets the ack from taskgate, one upstream cancel per task, also after
    /// a restart (held in memory alone, a restart forgot it and the next cancel went upstream
    /// again). Absent (false) in every other record, and in records written before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_acked: bool,
}

/// What start-up counting needs of a record ([`super::TaskStore::scan_heads`]): the key, the
/// owner in its stored form (`principal:<name>`, `session:<id>`, `anonymous`; parse it with
/// [`Owner::parse`]), the status and the two cancellation facts. Strings borrow from the stored
/// bytes when they hold no JSON escape.
///
/// Why it exists: a restart counts every record once (live tasks per owner, records per status,
/// cancelled tasks without their "released" fact) before taskgate is ready. Decoding whole
/// records made that ~half of the start-up CPU at 100,000 records (`perf`, issue 15: serde
/// string parsing and allocation); the other fields (results, timestamps, tool names) are
/// skipped here without being allocated.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RecordHead<'a> {
    /// The upstream's configured name.
    #[serde(borrow)]
    pub upstream: std::borrow::Cow<'a, str>,
    /// The upstream's `taskId`.
    #[serde(borrow)]
    pub task_id: std::borrow::Cow<'a, str>,
    /// [`TaskRecord::owner`] in its stored form.
    #[serde(borrow)]
    pub owner: std::borrow::Cow<'a, str>,
    /// [`TaskRecord::status`].
    pub status: TaskStatus,
    /// [`TaskRecord::cancelled_at`].
    pub cancelled_at: Option<u64>,
    /// [`TaskRecord::released_at`].
    pub released_at: Option<u64>,
}

impl<'a> RecordHead<'a> {
    /// The head of a decoded record (the owner is formatted: only the stored form is borrowed).
    pub fn of(r: &'a TaskRecord) -> RecordHead<'a> {
        RecordHead {
            upstream: r.upstream.as_str().into(),
            task_id: r.task_id.as_str().into(),
            owner: r.owner.to_string().into(),
            status: r.status,
            cancelled_at: r.cancelled_at,
            released_at: r.released_at,
        }
    }
}

impl TaskRecord {
    /// Bytes this record holds on the heap beyond its own size (its strings' capacities), for
    /// the record cache's byte bound (`registry::cache`).
    pub fn heap_bytes(&self) -> usize {
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        let owner = match &self.owner {
            Owner::Principal(s) | Owner::Session(s) => s.capacity(),
            Owner::Anonymous => 0,
        };
        self.upstream.capacity()
            + self.task_id.capacity()
            + owner
            + opt(&self.upstream_session)
            + opt(&self.tool)
            + opt(&self.protocol_version)
            + opt(&self.status_message)
            + self.created_at.capacity()
            + self.last_updated_at.capacity()
            + opt(&self.terminal_result)
            + opt(&self.terminal_error)
            + opt(&self.input_requests)
    }
}

impl TaskRecord {
    /// The record as the store keeps it: exactly the JSON `serde_json::to_vec` writes for it
    /// (the derived `Serialize`, which stays the reference: `the_hand_written_encoding_is_serdes`
    /// compares them), written without serde's per-field machinery: the member names are
    /// written as they are (serde escapes each one, byte by byte), and a string needing no
    /// escape is copied whole.
    ///
    /// Why: encoding a record through serde took about 13,000 instructions, three times per task
    /// in the task lifecycle (its creation and two updates; issue 36, `benches/profile.sh`).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.to_json_into(&mut out);
        out
    }

    /// [`TaskRecord::to_json`] appended to `out` (a buffer the caller reuses).
    pub fn to_json_into(&self, out: &mut Vec<u8>) {
        self.reserve_json(out);
        self.json_head(out);
        self.json_body(out);
        self.json_tail(out);
    }

    /// Room in `out` for this record's JSON (its long strings and about 1 KiB for the rest).
    fn reserve_json(&self, out: &mut Vec<u8>) {
        let opt_len = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        out.reserve(
            1024 + opt_len(&self.terminal_result)
                + opt_len(&self.terminal_error)
                + opt_len(&self.input_requests)
                + opt_len(&self.status_message),
        );
    }

    /// [`TaskRecord::to_json_into`] for a record that is `before` changed, where `before_json`
    /// is exactly `before.to_json()`: the same bytes, but the members before the first part
    /// that differs (the head, `upstream` to `protocol_version`, set at the creation; the body,
    /// `status` to `era`) are copied from `before_json` instead of being encoded again.
    ///
    /// Why: an update changes the status fields or adds the result, never the head; encoding
    /// the whole record again was ~2,800 instructions per update (and the kept result's
    /// update ~7,800), two updates per task in the lifecycle benchmark (callgrind, issue 36).
    ///
    /// A member is found in `before_json` by its name: `,"status":` and `,"era":` cannot occur
    /// inside a string value (a quote there is escaped), and no value is an object or an array.
    /// When one is not found (`before_json` is not `before`'s: never, by the contract), the
    /// whole record is encoded.
    pub fn to_json_after(&self, before: &TaskRecord, before_json: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        self.reserve_json(out);
        if self.same_head(before) {
            if self.same_body(before) {
                // The body ends with `era`'s value: a word needing no escape, then its quote.
                // Without optional members, just before the closing brace.
                const ERA: &[u8] = b",\"era\":\"";
                static ERA_FROM_END: LazyLock<memmem::FinderRev<'static>> =
                    LazyLock::new(|| memmem::FinderRev::new(ERA));
                let era = before.era.as_str().as_bytes();
                let at = if before.has_no_optional_member() {
                    before_json.len().checked_sub(ERA.len() + era.len() + 2)
                } else {
                    ERA_FROM_END.rfind(before_json)
                };
                let end = at.and_then(|at| {
                    let end = at + ERA.len() + era.len() + 1;
                    let held = before_json.get(at..end)?;
                    let value = &held[ERA.len()..];
                    let whole = held.starts_with(ERA) && value.starts_with(era);
                    (whole && value.ends_with(b"\"")).then_some(end)
                });
                if let Some(end) = end {
                    out.extend_from_slice(&before_json[..end]);
                    self.json_tail(out);
                    return;
                }
            } else if let Some(at) = STATUS.find(before_json) {
                out.extend_from_slice(&before_json[..at]);
                self.json_body(out);
                self.json_tail(out);
                return;
            }
        }
        out.truncate(start);
        self.to_json_into(out);
    }

    /// Whether [`TaskRecord::json_tail`] writes no member, only the closing brace.
    fn has_no_optional_member(&self) -> bool {
        self.terminal_result.is_none()
            && self.terminal_error.is_none()
            && !self.tool_error
            && self.trace_parent.is_none()
            && self.input_requests.is_none()
            && !self.cancel_acked
    }

    /// Whether the members [`TaskRecord::json_head`] writes are the same in `other`.
    fn same_head(&self, other: &TaskRecord) -> bool {
        self.upstream == other.upstream
            && self.task_id == other.task_id
            && self.owner == other.owner
            && self.upstream_session == other.upstream_session
            && self.origin == other.origin
            && self.tool == other.tool
            && self.protocol_version == other.protocol_version
    }

    /// Whether the members [`TaskRecord::json_body`] writes are the same in `other`.
    fn same_body(&self, other: &TaskRecord) -> bool {
        self.status == other.status
            && self.status_message == other.status_message
            && self.created_at == other.created_at
            && self.last_updated_at == other.last_updated_at
            && self.ttl_ms == other.ttl_ms
            && self.poll_interval_ms == other.poll_interval_ms
            && self.recorded_at == other.recorded_at
            && self.cancel_requested_at == other.cancel_requested_at
            && self.cancelled_at == other.cancelled_at
            && self.released_at == other.released_at
            && self.terminal_at == other.terminal_at
            && self.late_result_at == other.late_result_at
            && self.expires_at == other.expires_at
            && self.era == other.era
    }

    /// The JSON's opening brace and its members `upstream` to `protocol_version`.
    fn json_head(&self, o: &mut Vec<u8>) {
        o.extend_from_slice(b"{\"upstream\":");
        json_str(o, &self.upstream);
        o.extend_from_slice(b",\"task_id\":");
        json_str(o, &self.task_id);
        o.extend_from_slice(b",\"owner\":");
        match &self.owner {
            Owner::Principal(p) => json_str_with(o, "principal:", p),
            Owner::Session(id) => json_str_with(o, "session:", id),
            Owner::Anonymous => o.extend_from_slice(b"\"anonymous\""),
        }
        o.extend_from_slice(b",\"upstream_session\":");
        json_opt_str(o, &self.upstream_session);
        o.extend_from_slice(b",\"origin\":");
        json_str(o, self.origin.as_str());
        o.extend_from_slice(b",\"tool\":");
        json_opt_str(o, &self.tool);
        o.extend_from_slice(b",\"protocol_version\":");
        json_opt_str(o, &self.protocol_version);
    }

    /// The JSON's members `status` to `era`.
    fn json_body(&self, o: &mut Vec<u8>) {
        o.extend_from_slice(b",\"status\":");
        json_str(o, self.status.as_str());
        o.extend_from_slice(b",\"status_message\":");
        json_opt_str(o, &self.status_message);
        o.extend_from_slice(b",\"created_at\":");
        json_str(o, &self.created_at);
        o.extend_from_slice(b",\"last_updated_at\":");
        json_str(o, &self.last_updated_at);
        o.extend_from_slice(b",\"ttl_ms\":");
        json_opt_u64(o, self.ttl_ms);
        o.extend_from_slice(b",\"poll_interval_ms\":");
        json_opt_u64(o, self.poll_interval_ms);
        o.extend_from_slice(b",\"recorded_at\":");
        json_u64(o, self.recorded_at);
        o.extend_from_slice(b",\"cancel_requested_at\":");
        json_opt_u64(o, self.cancel_requested_at);
        o.extend_from_slice(b",\"cancelled_at\":");
        json_opt_u64(o, self.cancelled_at);
        o.extend_from_slice(b",\"released_at\":");
        json_opt_u64(o, self.released_at);
        o.extend_from_slice(b",\"terminal_at\":");
        json_opt_u64(o, self.terminal_at);
        o.extend_from_slice(b",\"late_result_at\":");
        json_opt_u64(o, self.late_result_at);
        o.extend_from_slice(b",\"expires_at\":");
        json_u64(o, self.expires_at);
        o.extend_from_slice(b",\"era\":");
        json_str(o, self.era.as_str());
    }

    /// The JSON's optional members (those present) and its closing brace.
    fn json_tail(&self, o: &mut Vec<u8>) {
        if let Some(v) = &self.terminal_result {
            o.extend_from_slice(b",\"terminal_result\":");
            json_str(o, v);
        }
        if let Some(v) = &self.terminal_error {
            o.extend_from_slice(b",\"terminal_error\":");
            json_str(o, v);
        }
        if self.tool_error {
            o.extend_from_slice(b",\"tool_error\":true");
        }
        if let Some(v) = &self.trace_parent {
            o.extend_from_slice(b",\"trace_parent\":");
            json_str(o, v);
        }
        if let Some(v) = &self.input_requests {
            o.extend_from_slice(b",\"input_requests\":");
            json_str(o, v);
        }
        if self.cancel_acked {
            o.extend_from_slice(b",\"cancel_acked\":true");
        }
        o.push(b'}');
    }

    /// The `Task` object as the 2025-11-25 spec shapes it (for `tasks/list` and rewrites): a
    /// 2026 tool error ([`TaskRecord::tool_error`]) is `failed`, as 2025-11-25 has it.
    pub fn to_task(&self) -> Task {
        Task {
            task_id: self.task_id.clone(),
            status: self.legacy_status(),
            status_message: self.status_message.clone(),
            created_at: self.created_at.clone(),
            last_updated_at: self.last_updated_at.clone(),
            ttl: self.ttl_ms,
            poll_interval: self.poll_interval_ms,
        }
    }

    /// The status a 2025-11-25 client is shown: `failed` for a 2026 `completed` tool error,
    /// else [`TaskRecord::status`].
    pub fn legacy_status(&self) -> TaskStatus {
        if self.tool_error && self.status == TaskStatus::Completed {
            TaskStatus::Failed
        } else {
            self.status
        }
    }

    /// True when the record's time is up at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at <= now_ms
    }
}

/// `s` as a JSON string, as serde_json writes it.
fn json_str(out: &mut Vec<u8>, s: &str) {
    json_str_with(out, "", s);
}

/// `prefix` (needing no escape) and `s` as one JSON string, as serde_json writes it: the runs
/// of plain bytes copied whole ([`plain_len`]), each byte between them escaped as
/// serde_json escapes it (`\"`, `\\`, the short escapes of five control characters, `\u00xx`
/// with lowercase digits for the others).
///
/// Why: the stored terminal result (JSON text, full of quotes) went through serde_json's
/// byte-by-byte escaping, about 11,700 instructions for the benchmark's small result (issue 36).
fn json_str_with(out: &mut Vec<u8>, prefix: &str, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    out.extend_from_slice(prefix.as_bytes());
    let mut rest = s.as_bytes();
    loop {
        let (plain, tail) = rest.split_at(plain_len(rest).min(rest.len()));
        out.extend_from_slice(plain);
        let Some((&c, tail)) = tail.split_first() else {
            break;
        };
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 0xf)],
            ]),
        }
        rest = tail;
    }
    out.push(b'"');
}

fn json_opt_str(out: &mut Vec<u8>, s: &Option<String>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn json_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn json_opt_u64(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        Some(n) => json_u64(out, n),
        None => out.extend_from_slice(b"null"),
    }
}

/// One append-only audit event (`tasks show`, `/admin/tasks/<upstream>/<taskId>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Milliseconds since the Unix epoch.
    pub time: u64,
    /// The upstream's name.
    pub upstream: String,
    /// The task.
    #[serde(rename = "taskId")]
    pub task_id: String,
    /// The task's owner.
    pub owner: Owner,
    /// `created`, `cancel_requested`, `status_cancelled`, `resources_released`, `late_result`,
    /// `terminal_rewrite`, `expired`.
    pub event: String,
    /// Free-form detail.
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Task ids taskgate records: bounded and printable (tester 3 F19: a 100 KB id and ids
    /// with control characters were recorded).
    #[test]
    fn recordable_task_ids_are_bounded_and_printable() {
        for ok in ["t1", "3f2a-é-😀", "a b", &"x".repeat(MAX_TASK_ID_BYTES)] {
            assert!(recordable_task_id(ok), "{ok:?}");
        }
        let long = "x".repeat(MAX_TASK_ID_BYTES + 1);
        for bad in [
            "", "a\0b", "a\nb", "\u{1}", "a\u{7f}", "a\u{85}b", "\u{9f}", &long,
        ] {
            assert!(!recordable_task_id(bad), "{bad:?}");
        }
    }

    /// [`TaskRecord::to_json`] writes exactly what the derived `Serialize` writes, for every
    /// field set or not, strings needing escapes or not, each owner form and extreme numbers.
    #[test]
    fn the_hand_written_encoding_is_serdes() {
        let base: TaskRecord = serde_json::from_str(
            r#"{"upstream":"up","task_id":"t1","owner":"session:s-1","upstream_session":null,"origin":"client","tool":null,"protocol_version":null,"status":"working","status_message":null,"created_at":"2026-01-01T00:00:00Z","last_updated_at":"2026-01-01T00:00:00Z","ttl_ms":null,"poll_interval_ms":null,"recorded_at":0,"cancel_requested_at":null,"cancelled_at":null,"released_at":null,"terminal_at":null,"expires_at":0}"#,
        )
        .unwrap();
        let odd = "q\"b\\s\n\u{1}\u{7f}é\u{2028}😀/";
        let mut records = vec![base.clone()];
        for (i, owner) in [
            Owner::Principal("alice".into()),
            Owner::Principal(odd.into()),
            Owner::Session(odd.into()),
            Owner::Anonymous,
        ]
        .into_iter()
        .enumerate()
        {
            let mut r = base.clone();
            r.owner = owner;
            r.upstream = format!("{odd}{i}");
            r.task_id = odd.into();
            r.upstream_session = Some("sess".into());
            r.origin = Origin::ALL[i % Origin::ALL.len()];
            r.tool = Some(odd.into());
            r.protocol_version = Some("2025-11-25".into());
            r.status = [
                TaskStatus::InputRequired,
                TaskStatus::Completed,
                TaskStatus::Failed,
                TaskStatus::Cancelled,
            ][i];
            r.status_message = Some(odd.into());
            r.created_at = odd.into();
            r.ttl_ms = Some(u64::MAX);
            r.poll_interval_ms = Some(0);
            r.recorded_at = u64::MAX;
            r.cancel_requested_at = Some(1);
            r.cancelled_at = Some(10);
            r.released_at = Some(100);
            r.terminal_at = Some(1000);
            r.late_result_at = Some(123_456_789);
            r.expires_at = 9_999_999_999_999;
            r.era = crate::mcp::era::Era::Modern;
            r.terminal_result = Some(r#"{"content":[{"type":"text","text":"a\"b"}]}"#.into());
            r.terminal_error = Some(String::new());
            r.tool_error = true;
            r.trace_parent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
            r.input_requests = Some(odd.into());
            records.push(r);
        }
        for r in &records {
            let serde = serde_json::to_vec(r).unwrap();
            assert_eq!(
                String::from_utf8(r.to_json()).unwrap(),
                String::from_utf8(serde).unwrap()
            );
            assert_eq!(
                &serde_json::from_slice::<TaskRecord>(&r.to_json()).unwrap(),
                r
            );
        }
    }

    /// [`TaskRecord::to_json_after`] writes exactly what [`TaskRecord::to_json`] writes, for
    /// changes in the head, in the body, in the optional members and in several at once, from
    /// records with and without optional members and with strings needing escapes (the
    /// members it copies are found by name in the bytes before).
    #[test]
    fn the_encoding_after_a_change_is_the_whole_encoding() {
        let base: TaskRecord = serde_json::from_str(
            r#"{"upstream":"up","task_id":"t1","owner":"session:s-1","upstream_session":"s-1","origin":"client","tool":"slow","protocol_version":"2025-11-25","status":"working","status_message":null,"created_at":"2026-01-01T00:00:00Z","last_updated_at":"2026-01-01T00:00:00Z","ttl_ms":60000,"poll_interval_ms":null,"recorded_at":5,"cancel_requested_at":null,"cancelled_at":null,"released_at":null,"terminal_at":null,"expires_at":60005}"#,
        )
        .unwrap();
        // Values that look like the members searched for, escaped in the JSON.
        let tricky = r#"x","status":"y","era":"legacy"}"#;
        let mut befores = vec![base.clone()];
        let mut odd = base.clone();
        odd.tool = Some(tricky.into());
        odd.status_message = Some(tricky.into());
        odd.trace_parent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        odd.input_requests = Some(tricky.into());
        odd.era = crate::mcp::era::Era::Modern;
        befores.push(odd);
        type Change = fn(&mut TaskRecord);
        let changes: &[Change] = &[
            |r| r.status = TaskStatus::Completed,
            |r| {
                r.status = TaskStatus::Failed;
                r.last_updated_at = "2026-01-01T00:00:09Z".into();
                r.terminal_at = Some(9);
                r.status_message = Some("it \"broke\"".into());
            },
            |r| r.terminal_result = Some(r#"{"content":[{"type":"text","text":"a\"b"}]}"#.into()),
            |r| r.terminal_error = Some(r#"{"code":-1}"#.into()),
            |r| r.tool_error = true,
            |r| r.input_requests = None,
            |r| r.trace_parent = Some("00-1-2-01".into()),
            |r| r.released_at = Some(7),
            |r| r.era = crate::mcp::era::Era::Legacy,
            |r| r.tool = Some("other".into()),
            |r| r.owner = Owner::Anonymous,
            |r| r.upstream_session = None,
            |r| {
                r.protocol_version = None;
                r.expires_at = 1;
                r.terminal_result = Some("x".into());
            },
            |_| {},
        ];
        for before in &befores {
            let before_json = before.to_json();
            for (i, change) in changes.iter().enumerate() {
                let mut after = before.clone();
                change(&mut after);
                let mut out = b"kept".to_vec();
                after.to_json_after(before, &before_json, &mut out);
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    format!("kept{}", String::from_utf8(after.to_json()).unwrap()),
                    "change {i}"
                );
            }
        }
    }

    /// Every ASCII character, alone, between plain text, and in runs, is written as serde_json
    /// writes it (the control characters' short and `\u00xx` escapes included).
    #[test]
    fn every_ascii_character_is_escaped_as_serde_does() {
        for c in 0u8..0x80 {
            let c = char::from(c);
            for s in [
                c.to_string(),
                format!("ab{c}cd"),
                format!("{c}{c}0123456789{c}"),
                format!("é{c}😀"),
            ] {
                let mut out = Vec::new();
                json_str(&mut out, &s);
                assert_eq!(out, serde_json::to_vec(&s).unwrap(), "{s:?}");
                let mut out = Vec::new();
                json_str_with(&mut out, "session:", &s);
                assert_eq!(
                    out,
                    serde_json::to_vec(&format!("session:{s}")).unwrap(),
                    "{s:?}"
                );
            }
        }
    }

    /// Records written before `Owner` existed (owner as a prefixed string) read unchanged, and
    /// write back the same bytes.
    #[test]
    fn owner_round_trips_the_old_strings() {
        for (old, owner) in [
            ("principal:alice", Owner::Principal("alice".into())),
            ("principal:a:b", Owner::Principal("a:b".into())),
            ("session:sess-1", Owner::Session("sess-1".into())),
            ("anonymous", Owner::Anonymous),
        ] {
            let json = format!("{old:?}");
            let parsed: Owner = serde_json::from_str(&json).unwrap();
            assert_eq!(parsed, owner);
            assert_eq!(serde_json::to_string(&parsed).unwrap(), json);
            assert!(parsed == old);
        }
        assert!(serde_json::from_str::<Owner>("\"alice\"").is_err());
        let old_record = br#"{"upstream":"up","task_id":"t1","owner":"session:sess-1","upstream_session":"sess-1","origin":"client","tool":"slow","protocol_version":"2025-11-25","status":"working","status_message":null,"created_at":"2026-01-01T00:00:00Z","last_updated_at":"2026-01-01T00:00:00Z","ttl_ms":60000,"poll_interval_ms":null,"recorded_at":1,"cancel_requested_at":null,"cancelled_at":null,"released_at":null,"terminal_at":null,"expires_at":60001}"#;
        let r: TaskRecord = serde_json::from_slice(old_record).unwrap();
        assert_eq!(r.owner, Owner::Session("sess-1".into()));
        let again = serde_json::to_vec(&r).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&again).unwrap();
        assert_eq!(v["owner"], "session:sess-1");
        // Without traces (issue 34) there is no creating span, and none is written back.
        assert_eq!(r.trace_parent, None);
        assert!(v.get("trace_parent").is_none());
    }
}

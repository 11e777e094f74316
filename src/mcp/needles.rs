//! Substring searches built once, for the needles layers look for in every relayed message.

use memchr::memmem::Finder;
use std::sync::LazyLock;

/// `notifications/tasks/status`.
pub static TASK_STATUS: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("notifications/tasks/status"));
/// `"notifications/tasks"`, quoted: the 2026-07-28 tasks extension's notification (not
/// `notifications/tasks/status`).
pub static TASKS_NOTIFICATION: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("\"notifications/tasks\""));
/// `notifications/tasks`, unquoted: found in every message that [`TASK_STATUS`] or
/// [`TASKS_NOTIFICATION`] is found in (one search instead of two where neither is expected).
pub static TASKS_METHODS: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("notifications/tasks"));
/// `notifications/progress`.
pub static PROGRESS: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("notifications/progress"));
/// `notifications/tools/list_changed`.
pub static TOOLS_LIST_CHANGED: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("notifications/tools/list_changed"));
/// `"task"`, quoted: the key of a task-augmented request (`params.task`) and of a
/// `CreateTaskResult`'s task.
pub static TASK_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"task\""));
/// `\u`: a JSON escape that may spell any key, so a message holding one is parsed whatever
/// the other needles say.
pub static UNICODE_ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\\u"));
/// `"tools"`, quoted: the capability key of an `initialize` result.
pub static TOOLS_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"tools\""));
/// `/protocolVersion":`: the end of the `_meta` key a 2026-07-28 request names its version
/// under (`"io.modelcontextprotocol/protocolVersion":` as a compact writer spells it; the
/// whole key is a longer needle, which `memmem` searches with its slower two-way path:
/// about 500 instructions a search, callgrind).
pub static PROTOCOL_VERSION_KEY: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("/protocolVersion\":"));
/// `/clientCapabilities":`: the end of the `_meta` key a 2026-07-28 request declares its
/// capabilities under (`"io.modelcontextprotocol/clientCapabilities":`), for the same reason
/// as [`PROTOCOL_VERSION_KEY`].
pub static CLIENT_CAPABILITIES_KEY: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("/clientCapabilities\":"));
/// `"error"`, quoted: the member of a JSON-RPC error answer (`layers::lost_task::error_code`,
/// read for every forwarded `tasks/*` answer about a recorded task: `memmem::find` built its
/// searcher per call, ~390 instructions, callgrind, benches/profile.sh lifecycle).
pub static ERROR_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"error\""));
/// `"taskgate-`: the start of a request id in taskgate's own form
/// (`crate::exchange::in_own_form`).
pub static OWN_ID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"taskgate-"));
/// The related-task `_meta` key.
pub static RELATED_TASK: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(crate::mcp::task::RELATED_TASK_META));

/// Whether `haystack` holds an escape that can spell a method name's characters (`\/` or
/// `\uXXXX`): valid JSON may write `notifications\/tasks\/status` (PHP's `json_encode` does
/// by default), which no plain-text needle finds. A message with one is read whatever the
/// needles say; a false positive (`\\u`, an escaped backslash) only costs that read.
pub fn may_hide_names(haystack: &[u8]) -> bool {
    memchr::memchr_iter(b'\\', haystack).any(|i| matches!(haystack.get(i + 1), Some(b'/' | b'u')))
}

/// [`found`], or a name `finder` looks for may be spelled with escapes
/// ([`may_hide_names`]): a superset, for a pre-check whose caller then reads the message.
pub fn may_name(finder: &LazyLock<Finder<'static>>, haystack: &[u8]) -> bool {
    found(finder, haystack) || may_hide_names(haystack)
}

/// Whether `finder`'s needle occurs in `haystack`.
pub fn found(finder: &LazyLock<Finder<'static>>, haystack: &[u8]) -> bool {
    finder.find(haystack).is_some()
}

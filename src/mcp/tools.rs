//! Tools (2025-11-25 server/tools): what a tool says of running as a task.

use serde_json::Value;

/// `execution.taskSupport` of a tool (absent means `forbidden`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Must not be called as a task.
    Forbidden,
    /// May be called either way.
    Optional,
    /// Must be called as a task.
    Required,
}

impl TaskSupport {
    /// The `execution.taskSupport` of `tool` (a `Tool` object of a `tools/list` result).
    pub fn of(tool: &Value) -> TaskSupport {
        match tool
            .pointer("/execution/taskSupport")
            .and_then(Value::as_str)
        {
            Some("required") => TaskSupport::Required,
            Some("optional") => TaskSupport::Optional,
            _ => TaskSupport::Forbidden,
        }
    }
}

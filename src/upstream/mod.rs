//! Upstream clients: the innermost service of the stack, which sends an [`McpRequest`] to an MCP
//! server and turns its answer into an [`McpReply`].
//!
//! [`McpRequest`]: crate::exchange::McpRequest
//! [`McpReply`]: crate::exchange::McpReply

pub(crate) mod chunked;
mod gate;
pub mod http;
pub mod pool;

pub use self::http::HttpUpstream;

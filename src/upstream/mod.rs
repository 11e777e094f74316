//! Upstream clients: the innermost service of the stack, which sends an [`McpRequest`] to an MCP
//! server and turns its answer into an [`McpReply`].
//!
//! [`McpRequest`]: crate::exchange::McpRequest
//! [`McpReply`]: crate::exchange::McpReply

pub mod h1;
pub mod http;

pub use self::h1::pin_thread;
pub use self::http::HttpUpstream;

//! The HTTP edge: the MCP endpoint (Streamable HTTP decoding), the admin endpoints, and the
//! accept loop they share.

pub mod admin;
pub mod client_addr;
mod gate;
mod head_io;
pub mod listen;
mod response;
pub mod server;
mod session_streams;
pub mod streamable;
mod trace;

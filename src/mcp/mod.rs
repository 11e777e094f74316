//! MCP protocol vocabulary (2025-11-25), no I/O: tasks and their status machine.

pub mod routing_headers;
pub mod task;

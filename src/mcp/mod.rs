//! MCP protocol vocabulary, both eras, no I/O: eras and versions, capabilities, error codes,
//! tools, tasks and their status machine, the 2026-07-28 routing headers. It imports nothing of
//! taskgate but `jsonrpc`; the store, the registry, the layers and the edge take their words
//! from here.

pub mod capabilities;
pub mod classify;
pub mod era;
pub mod errors;
pub mod modern;
pub mod needles;
pub mod routing_headers;
pub mod task;
pub mod tools;

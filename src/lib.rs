//! taskgate: a tasks-aware transparent gateway for the Model Context Protocol (MCP 2025-11-25
//! and the 2026-07-28 tasks extension).
//!
//! The data path, outermost first (see `gateway`):
//! [`http::streamable`] (edge) → the `McpService` stack → [`upstream::Upstream`] (a transport).
//! Messages travel as [`exchange::McpRequest`] / [`exchange::McpReply`]; only the JSON-RPC
//! envelope is parsed ([`jsonrpc::Message`]), bytes nobody changes are forwarded as they came.

#![warn(missing_docs)]

#[cfg(test)]
mod architecture_tests;
pub mod auth;
pub mod config;
pub mod exchange;
pub mod gateway;
pub mod headers;
pub mod http;
pub mod jsonrpc;
pub mod layers;
pub mod limits;
pub mod mcp;
pub mod metrics;
#[doc(hidden)]
pub mod props;
pub mod registry;
pub mod sse;
pub mod store;
pub mod telemetry;
#[cfg(test)]
mod test_log;
pub mod text;
pub mod tls;
pub mod upstream;

//! taskgate's own HTTP/1.1 client for Streamable HTTP upstreams: a keep-alive pool per serving
//! thread whose connections are driven by the request that uses them, and a chunked-body
//! takeover under hyper. Everything hand-written about HTTP/1 stays behind this boundary; the
//! Streamable HTTP transport ([`super::http`]) sees only [`Pool::send`], its [`PooledBody`] and
//! [`PoolError`].
//!
//! - [`pool`]: the pool (limits, idle checks, TCP keepalive, the per-thread idle lists of
//!   [`pin_thread`]). hyper writes each request and reads each response head.
//! - [`proxy`]: a new connection through an HTTP proxy's `CONNECT` tunnel (`upstream.proxy`).
//! - `gate`: the connection's I/O as hyper sees it, stopping at the end of each response head so
//!   the pool can take a chunked body over at a known place in the byte stream.
//! - `chunked`: the chunked body decoder that then reads the body (one frame per chunk, sliced
//!   off the read buffer; an SSE event is a chunk).
//!
//! Why these are hand-written, measured (callgrind and CPU per request, interleaved A/B runs,
//! medians), so a change here is measured the same way:
//!
//! - `benches/RESULTS.md`, "Where every goal stands" and "2026-12-03 (morning): one read per
//!   SSE event" (a chunked body's read waits for readiness after a short read);
//! - `benches/history/2026-12-03-night-chunked-body.md`: the takeover (SSE answer of 100
//!   events: −30.6 % instructions against hyper's own chunked decoder);
//! - `benches/history/2026-12-01-redesign.md`, "Upstream HTTP/1 client A/B" (issue 10): the pool against
//!   `hyper_util`'s pooled client (the per-event task hand-over it avoids), and
//!   `benches/history/2026-12-02-thread-per-core.md` for the per-thread pool.
//!
//! Re-run with `bash benches/profile.sh small|sse|sse-apart` (instructions per request) and
//! `benches/run.sh` before and after any change under this module. Tests: `pool_tests.rs`,
//! `pool_wire_tests.rs` (scripted upstream sockets), `chunked_tests.rs` and the
//! `props::chunked_framing` property and fuzz target.

pub(crate) mod chunked;
mod gate;
mod io;
pub mod pool;
pub mod proxy;

pub use io::Tls;
pub use pool::{pin_thread, Pool, PoolError, PoolLimits, PooledBody};
pub use proxy::Proxy;

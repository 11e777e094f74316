//! The one harness of taskgate's integration tests, a module of each tier's crate (`tests/core.rs`,
//! `tests/full.rs`), which its test modules reach as `use crate::common::*;`.
//!
//! - [`fake_upstream`]: [`Upstream`], a scripted HTTP upstream that records every request
//!   ([`RecordedRequest`]) and answers what the test's handler returns ([`ScriptedResponse`]).
//! - [`task_server`]: stateful scripted MCP servers on top of it: [`TaskServer`] (tasks) and
//!   [`UpServer`] (tools and tasks, for upgraded calls).
//! - [`harness`]: taskgate in process ([`GatewayBuilder`], [`TgConfig`], [`UgConfig`]) or as the
//!   real binary ([`TaskgateProcess`]).
//! - [`client`]: [`Req`] / [`Resp`] / [`SseReader`] and the JSON-RPC [`Client`].
//! - [`metrics`]: admin API and `/metrics` readers.
//! - [`blip`]: [`Blip`], a TCP proxy whose upstream a test makes unreachable for a while.
//! - Here: timing constants, [`free_port`], [`eventually`].
// Each test crate uses a different part of the harness.
#![allow(dead_code)]

pub mod balancer;
pub mod blip;
pub mod client;
pub mod fake_upstream;
pub mod harness;
pub mod idp;
pub mod metrics;
pub mod modern_server;
pub mod pg;
pub mod task_server;
pub mod tier;

// A crate that uses nothing of one part would warn about its re-export.
#[allow(unused_imports)]
pub use {
    balancer::*,
    blip::*,
    client::*,
    fake_upstream::*,
    harness::*,
    metrics::*,
    modern_server::*,
    pg::*,
    task_server::*,
    taskgate::mcp::task::{format_rfc3339_ms, now_ms},
    tier::*,
};

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

/// The longest any single step of a test waits before it fails (network answers, events).
pub const STEP: Duration = Duration::from_secs(10);

/// Body type used on both the scripted upstream and the test client.
pub type TestBody = UnsyncBoxBody<Bytes, Infallible>;

pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";
pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// A TCP port on 127.0.0.1 that was free a moment ago (bound, read, released), for a process
/// that must be told its port before it starts (a replica nginx routes to, a PostgreSQL).
///
/// The port is taken below the system's ephemeral range (`ip_local_port_range`), and never
/// twice in one test process. A port from `bind(127.0.0.1:0)` is an ephemeral one: between its
/// release and the child's bind, an outgoing connection of a parallel test could take it as its
/// local port, which is how a replica once failed with "Address already in use" under 500
/// concurrent cancels.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let span = u32::from(high - low);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let seed = std::process::id().wrapping_mul(2_654_435_761) ^ (given.len() as u32 * 7_919);
    for i in 0..span {
        let port = low + ((seed.wrapping_add(i) % span) as u16);
        if given.contains(&port) {
            continue;
        }
        if StdTcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    let l = StdTcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// An MCP URL on which nothing listens (connection refused).
pub fn dead_url() -> String {
    format!("http://127.0.0.1:{}/mcp", free_port())
}

/// Polls `f` every 20 ms until it returns Some, for at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A JSON-RPC error message with `id_json` inserted verbatim.
fn rpc_error_json(id: &str, code: i64, message: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"error":{}}}"#,
        json!({"code": code, "message": message})
    )
}

fn full_body(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).boxed_unsync()
}

fn empty_body() -> TestBody {
    Empty::<Bytes>::new().boxed_unsync()
}

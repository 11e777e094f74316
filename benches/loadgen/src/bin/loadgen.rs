//! taskgate's load generator (hyper 1 client, one keep-alive connection per concurrent worker).
//!
//! ```text
//! loadgen run (--url URL | --stdio CMD) --scenario S --target NAME --case TEXT [--concurrency N]
//!             [--duration SECS --warmup SECS | --count N] [--cpu-pid PID[,PID..]]
//!             [--stats-url URL] [--session-file F] [--interval-ms N] [--json-out F]
//!             [--rep N] [--bench-pids PID[,PID..]] [--open-first] [--close-sessions]
//! loadgen spawn-ready --stdout F --stderr F [--label L] [--json-out F] -- CMD ARGS..
//! loadgen mem --pid PID --label L [--json-out F]
//! loadgen free-port
//! loadgen report --in F
//! ```
//!
//! Scenarios (`--scenario`):
//! - `small`: `tools/call` answered with ~1 KiB JSON; `big`: ~1 MiB JSON;
//! - `sse`: `tools/call {name:"progress"}` answered as SSE, 100 progress events then the result
//!   (`--interval-ms` between events, default 0): time to the first event and to the last;
//! - `lifecycle`: per task: task-augmented `tools/call`, 10 × `tasks/get`, `tasks/result`;
//! - `modern-lifecycle`: the same under MCP 2026-07-28 (tasks extension, SEP-2663; no session):
//!   per task a `tools/call` declaring the extension in `_meta` (answered with a flat
//!   `CreateTaskResult`), then 10 × `tasks/get` (a `DetailedTask`; once `completed` it carries the
//!   tool's result inline), with `MCP-Protocol-Version: 2026-07-28`, `Mcp-Method` and `Mcp-Name`;
//! - `cancel`: creates one long-running task, opens `--concurrency` connections, then sends one
//!   identical `tasks/cancel` on each at once; with `--stats-url` reports how many cancels the
//!   upstream received;
//! - `create`: task creations, all on one MCP session (written to `--session-file`);
//! - `list`: `tasks/list` first page on the session read from `--session-file`;
//!   `list-walk`: follows `nextCursor` to the end once.
//!
//! Every worker of `small`, `big`, `sse` and `lifecycle` opens its own MCP session (initialize)
//! before measuring. Timed runs measure requests that start after the warm-up and end before the
//! deadline; the CPU time of `--cpu-pid` (utime + stime from /proc/PID/stat, summed over the
//! PIDs) is sampled at the same two instants. Each run appends one JSON line to `--json-out`.
//!
//! With `--bench-pids` (every process of the benchmark: upstream, proxies) a run also records
//! the CPU time used by the rest of the machine while it ran, from its start to its end:
//! busy time in /proc/stat minus the bench PIDs' and this process's utime + stime
//! (`others_cpu_ms`, `others_core_pct` = percent of one core), and the 1-minute load average at
//! its end. `--rep` is recorded as is (the repetition number of the case).
//!
//! `--stdio CMD` (scenario 11's floor): no HTTP; CMD (split on spaces) is started as a stdio MCP
//! server, initialized once, and every worker's requests go over its stdin/stdout (`small`,
//! `lifecycle`, `create`). `--open-first`: every worker opens its connection and session before
//! the clock starts (a proxy that starts a child per session does that outside the measured
//! window). `--close-sessions`: each worker's MCP session is ended with `DELETE` after the run
//! (after the CPU samples).
//!
//! `LOADGEN_AUTHORIZATION` (environment), when set, is sent as the `Authorization` header of
//! every POST (scenario 7: a JWT on every request).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Http = SendRequest<Full<Bytes>>;

/// One client connection: an HTTP/1.1 keep-alive connection, or (`--stdio`) a share of the one
/// stdio connection to the server child.
enum Sender {
    Http(Http),
    Stdio(Arc<StdioClient>),
}

// ---------------------------------------------------------------------------------------------
// Arguments

/// `LOADGEN_AUTHORIZATION`, read once.
fn authorization() -> Option<&'static str> {
    static VALUE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    VALUE
        .get_or_init(|| std::env::var("LOADGEN_AUTHORIZATION").ok())
        .as_deref()
}

struct Args(Vec<String>);

impl Args {
    fn get(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .position(|a| a == name)
            .and_then(|i| self.0.get(i + 1).cloned())
    }
    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.get(name) {
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| die(&format!("{name}: not a number: {v}"))),
            None => default,
        }
    }
    fn need(&self, name: &str) -> String {
        self.get(name)
            .unwrap_or_else(|| die(&format!("missing {name}")))
    }
}

fn die(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    std::process::exit(2)
}

// ---------------------------------------------------------------------------------------------
// HTTP client

#[derive(Clone)]
struct Target {
    addr: String,
    path: String,
    /// `--stdio CMD`: every request goes to this child's stdin, not to `addr`.
    stdio: Option<Arc<StdioClient>>,
}

impl Target {
    fn parse(url: &str) -> Target {
        let rest = url
            .strip_prefix("http://")
            .unwrap_or_else(|| die(&format!("only http:// URLs: {url}")));
        let (addr, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        Target {
            addr: addr.to_string(),
            path: path.to_string(),
            stdio: None,
        }
    }

    async fn connect(&self) -> Result<Sender, Error> {
        if let Some(c) = &self.stdio {
            return Ok(Sender::Stdio(c.clone()));
        }
        Ok(Sender::Http(self.connect_http().await?))
    }

    async fn connect_http(&self) -> Result<Http, Error> {
        let stream = TcpStream::connect(&self.addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn post(
        &self,
        sender: &mut Sender,
        session: Option<&str>,
        body: String,
    ) -> Result<Response<hyper::body::Incoming>, Error> {
        self.post_as(sender, session, body, None).await
    }

    /// POST; `modern`: a 2026-07-28 request (`Mcp-Method`, `Mcp-Name`), else 2025-11-25.
    async fn post_as(
        &self,
        sender: &mut Sender,
        session: Option<&str>,
        body: String,
        modern: Option<(&str, &str)>,
    ) -> Result<Response<hyper::body::Incoming>, Error> {
        let mut b = Request::post(self.path.as_str())
            .header("host", self.addr.as_str())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        b = match modern {
            Some((method, name)) => b
                .header("mcp-protocol-version", MODERN_VERSION)
                .header("mcp-method", method)
                .header("mcp-name", name),
            None => b.header("mcp-protocol-version", "2025-11-25"),
        };
        if let Some(s) = session {
            b = b.header("mcp-session-id", s);
        }
        if let Some(a) = authorization() {
            b = b.header("authorization", a);
        }
        let req = b.body(Full::new(Bytes::from(body)))?;
        let Sender::Http(sender) = sender else {
            return Err("this scenario does not run over stdio".into());
        };
        sender.ready().await?;
        Ok(sender.send_request(req).await?)
    }

    /// POST and read the whole (JSON) answer.
    async fn call(
        &self,
        sender: &mut Sender,
        session: Option<&str>,
        body: String,
    ) -> Result<Bytes, Error> {
        self.call_as(sender, session, body, None).await
    }

    /// POST and read the whole (JSON) answer; `modern` as in [`Target::post_as`]. An answer sent
    /// as SSE (a server that streams every answer, as supergateway's) counts as its last event's
    /// `data`. Over stdio: the answer line with this request's id.
    async fn call_as(
        &self,
        sender: &mut Sender,
        session: Option<&str>,
        body: String,
        modern: Option<(&str, &str)>,
    ) -> Result<Bytes, Error> {
        if let Sender::Stdio(c) = sender {
            return c.call(body).await;
        }
        let resp = self.post_as(sender, session, body, modern).await?;
        let status = resp.status();
        let sse = resp
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)).into());
        }
        if sse {
            return sse_last_data(&bytes).ok_or_else(|| {
                format!(
                    "SSE answer without data: {}",
                    String::from_utf8_lossy(&bytes)
                )
                .into()
            });
        }
        Ok(bytes)
    }

    /// `DELETE` of an MCP session (`--close-sessions`: a proxy that keeps a child per session).
    async fn delete(&self, sender: &mut Sender, session: &str) -> Result<(), Error> {
        let Sender::Http(sender) = sender else {
            return Ok(());
        };
        let req = Request::delete(self.path.as_str())
            .header("host", self.addr.as_str())
            .header("mcp-protocol-version", "2025-11-25")
            .header("mcp-session-id", session)
            .body(Full::new(Bytes::new()))?;
        sender.ready().await?;
        let _ = sender
            .send_request(req)
            .await?
            .into_body()
            .collect()
            .await?;
        Ok(())
    }

    async fn get(&self, path: &str) -> Result<(u16, Bytes), Error> {
        let mut sender = self.connect_http().await?;
        let req = Request::get(path)
            .header("host", self.addr.as_str())
            .body(Full::new(Bytes::new()))?;
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        Ok((status, resp.into_body().collect().await?.to_bytes()))
    }

    /// `initialize`; returns the session id the server gave, if any. Over stdio the connection
    /// was initialized once, when the child started.
    async fn initialize(&self, sender: &mut Sender) -> Result<Option<String>, Error> {
        if matches!(sender, Sender::Stdio(_)) {
            return Ok(None);
        }
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},
            "clientInfo":{"name":"taskgate-loadgen","version":"0.1.0"}}})
        .to_string();
        let resp = self.post(sender, None, body).await?;
        let session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() || !contains(&bytes, b"\"result\"") {
            return Err(format!("initialize failed: HTTP {status}").into());
        }
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string();
        let resp = self.post(sender, session.as_deref(), note).await?;
        let _ = resp.into_body().collect().await?;
        Ok(session)
    }
}

/// The `data` of an SSE body's last event (the JSON-RPC answer; progress events come before it).
fn sse_last_data(body: &[u8]) -> Option<Bytes> {
    body.rsplit(|&b| b == b'\n')
        .filter_map(|l| l.strip_prefix(b"data:"))
        .map(|d| d.strip_prefix(b" ").unwrap_or(d))
        .map(|d| d.strip_suffix(b"\r").unwrap_or(d))
        .find(|d| !d.is_empty())
        .map(Bytes::copy_from_slice)
}

// ---------------------------------------------------------------------------------------------
// stdio client (`--stdio CMD`: the server driven over its own stdin/stdout, no HTTP)

/// One child speaking MCP over stdio (newline-delimited JSON-RPC), shared by every worker: a
/// writer task sends the queued lines in one `write`, a reader task hands each answer line to the
/// request with its id. Request ids are the client's own (a worker's id is replaced), so workers
/// never collide.
struct StdioClient {
    pid: u32,
    lines: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    waiting: std::sync::Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Bytes>>>,
    next_id: AtomicU64,
    _child: tokio::process::Child,
}

impl StdioClient {
    /// Starts `cmd` (split on spaces), initializes it (2025-11-25) and sends `initialized`.
    async fn spawn(cmd: &str) -> Result<Arc<StdioClient>, Error> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let (program, args) = words.split_first().ok_or("--stdio: empty command")?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("--stdio {program}: {e}"))?;
        let pid = child.id().ok_or("stdio child already gone")?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(64 * 1024);
            while let Some(line) = rx.recv().await {
                buf.clear();
                buf.extend_from_slice(&line);
                while let Ok(more) = rx.try_recv() {
                    buf.extend_from_slice(&more);
                }
                if stdin.write_all(&buf).await.is_err() {
                    return;
                }
            }
        });
        let client = Arc::new(StdioClient {
            pid,
            lines: tx,
            waiting: std::sync::Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            _child: child,
        });
        let weak = Arc::downgrade(&client);
        tokio::spawn(async move {
            let mut out = tokio::io::BufReader::with_capacity(256 * 1024, stdout);
            let mut line = Vec::with_capacity(4096);
            loop {
                line.clear();
                match out.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let Some(client) = weak.upgrade() else { return };
                let Some(id) = answer_id(&line) else { continue }; // a notification
                let tx = client.waiting.lock().expect("waiting").remove(&id);
                if let Some(tx) = tx {
                    let _ = tx.send(Bytes::copy_from_slice(line.trim_ascii_end()));
                }
            }
        });
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},
            "clientInfo":{"name":"taskgate-loadgen","version":"0.1.0"}}})
        .to_string();
        let answer = client.call(init).await?;
        if !contains(&answer, b"\"result\"") {
            return Err(format!("stdio initialize: {}", String::from_utf8_lossy(&answer)).into());
        }
        let _ = client
            .lines
            .send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n".to_vec());
        Ok(client)
    }

    /// Sends one request (`{"id":N,...` as [`rpc`] writes it, or `{"jsonrpc":..,"id":N,..`) under
    /// an id of the client's own and waits for its answer line.
    async fn call(&self, body: String) -> Result<Bytes, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = match body
            .strip_prefix("{\"id\":")
            .map(|rest| rest.trim_start_matches(|c: char| c.is_ascii_digit()))
        {
            // The usual case, `rpc`'s output: splice the id in without parsing.
            Some(rest) if rest.starts_with(',') => format!("{{\"id\":{id}{rest}").into_bytes(),
            _ => {
                let mut v: Value = serde_json::from_str(&body)?;
                v["id"] = json!(id);
                serde_json::to_vec(&v)?
            }
        };
        line.push(b'\n');
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiting.lock().expect("waiting").insert(id, tx);
        self.lines.send(line).map_err(|_| "stdio child gone")?;
        Ok(rx.await.map_err(|_| "stdio child gone")?)
    }
}

/// The numeric `id` of a JSON-RPC answer line (none for a notification or a request).
fn answer_id(line: &[u8]) -> Option<u64> {
    // The usual case (the bench upstream writes its answers so): no parse.
    if let Some(rest) = line.strip_prefix(b"{\"jsonrpc\":\"2.0\",\"id\":") {
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 && rest.get(digits) == Some(&b',') {
            return std::str::from_utf8(&rest[..digits]).ok()?.parse().ok();
        }
    }
    let v: Value = serde_json::from_slice(line).ok()?;
    if v.get("method").is_some() {
        return None;
    }
    v.get("id")?.as_u64()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn parse_json(bytes: &[u8]) -> Result<Value, Error> {
    Ok(serde_json::from_slice(bytes)?)
}

const MODERN_VERSION: &str = "2026-07-28";

/// The `_meta` every 2026-07-28 request carries: its version and its capabilities, here the
/// tasks extension (`io.modelcontextprotocol/tasks`).
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "taskgate-loadgen", "version": "0.1.0"}
    })
}

fn rpc(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string()
}

// ---------------------------------------------------------------------------------------------
// CPU and memory of other processes

fn clk_tck() -> f64 {
    std::env::var("CLK_TCK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100.0)
}

/// Busy CPU time of the whole machine since boot, in µs (/proc/stat `cpu` line: user, nice,
/// system, irq, softirq, steal; guest time is part of user).
fn machine_busy_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    let ticks = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    ticks as f64 * 1e6 / clk_tck()
}

/// CPU used by processes other than `bench` and this one, between two [`Others::sample`]s.
/// Their descendants count as theirs (a stdio child of taskgate or of this process, the children
/// a proxy starts per session, nginx's workers), each by its own CPU between the two samples (one
/// started meanwhile from zero; one that ended meanwhile is lost, counted as other processes').
struct Others {
    bench: Vec<u32>,
    at: Instant,
    busy: f64,
    own: HashMap<u32, f64>,
}

impl Others {
    fn sample(bench: Vec<u32>) -> Others {
        let mut roots = bench.clone();
        roots.push(std::process::id());
        Others {
            at: Instant::now(),
            busy: machine_busy_us(),
            own: with_descendants(&roots)
                .into_iter()
                .map(|p| (p, cpu_us(&[p])))
                .collect(),
            bench,
        }
    }

    /// Adds `others_cpu_ms`, `others_core_pct`, `window_s` and `load1` to `v`.
    fn finish(self, v: &mut Value) {
        let end = Others::sample(self.bench.clone());
        let secs = (end.at - self.at).as_secs_f64();
        let own_us: f64 = end
            .own
            .iter()
            .map(|(p, us)| us - self.own.get(p).copied().unwrap_or(0.0))
            .sum();
        let others_us = (end.busy - self.busy) - own_us;
        v["others_cpu_ms"] = num(others_us / 1000.0);
        v["others_core_pct"] = num(others_us / 1e4 / secs);
        v["window_s"] = num(secs);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        v["load1"] = num(load
            .split_whitespace()
            .next()
            .and_then(|l| l.parse().ok())
            .unwrap_or(f64::NAN));
    }
}

fn pid_list(args: &Args, name: &str) -> Vec<u32> {
    args.get(name)
        .map(|s| {
            s.split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse()
                        .unwrap_or_else(|_| die(&format!("{name} PID[,PID]")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The PIDs and every live descendant of theirs (from /proc/*/stat's ppid), each once.
fn with_descendants(roots: &[u32]) -> Vec<u32> {
    let mut parent: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // After "pid (comm)": state, ppid.
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse().ok());
            if let Some(ppid) = ppid {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out: Vec<u32> = Vec::new();
    let mut todo: Vec<u32> = roots.to_vec();
    while let Some(p) = todo.pop() {
        if out.contains(&p) {
            continue;
        }
        out.push(p);
        todo.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
    }
    out
}

/// utime + stime of the PIDs, in µs (summed; a PID that vanished counts 0).
fn cpu_us(pids: &[u32]) -> f64 {
    let mut ticks = 0u64;
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After "pid (comm)": state=0 … utime=11, stime=12.
        let u: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
        let s: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        ticks += u + s;
    }
    ticks as f64 * 1e6 / clk_tck()
}

fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------------------------
// Runs

#[derive(Clone, Copy, PartialEq, Debug)]
enum Scenario {
    Small,
    Big,
    Sse,
    Lifecycle,
    ModernLifecycle,
    Cancel,
    Create,
    List,
    ListWalk,
}

impl Scenario {
    fn parse(s: &str) -> Scenario {
        match s {
            "small" => Scenario::Small,
            "big" => Scenario::Big,
            "sse" => Scenario::Sse,
            "lifecycle" => Scenario::Lifecycle,
            "modern-lifecycle" => Scenario::ModernLifecycle,
            "cancel" => Scenario::Cancel,
            "create" => Scenario::Create,
            "list" => Scenario::List,
            "list-walk" => Scenario::ListWalk,
            other => die(&format!("unknown scenario {other}")),
        }
    }
    fn name(self) -> &'static str {
        match self {
            Scenario::Small => "small",
            Scenario::Big => "big",
            Scenario::Sse => "sse",
            Scenario::Lifecycle => "lifecycle",
            Scenario::ModernLifecycle => "modern-lifecycle",
            Scenario::Cancel => "cancel",
            Scenario::Create => "create",
            Scenario::List => "list",
            Scenario::ListWalk => "list-walk",
        }
    }
    /// Whether each worker opens its own MCP session (2026-07-28 has none).
    fn own_session(self) -> bool {
        matches!(
            self,
            Scenario::Small | Scenario::Big | Scenario::Sse | Scenario::Lifecycle
        )
    }
}

struct Ctx {
    target: Target,
    scenario: Scenario,
    session: Option<String>,
    interval_ms: u64,
    /// Count-based runs: ops claimed so far, and the total.
    claimed: AtomicU64,
    count: u64,
    warm_end: Instant,
    end: Instant,
}

#[derive(Default)]
struct WorkerOut {
    /// Latency of each measured op (ns): request, lifecycle, or stream to its last event.
    lat: Vec<u64>,
    /// SSE: time to the first event (ns).
    first: Vec<u64>,
    /// HTTP requests behind the measured ops.
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    /// list / list-walk: tasks seen.
    items: u64,
    /// The connection and MCP session at the end (`--close-sessions` ends the session).
    conn: Option<(Sender, Option<String>)>,
}

/// What one op did: HTTP requests made, tasks seen, time to the first SSE event.
struct OpDone {
    requests: u64,
    items: u64,
    first: Option<Instant>,
}

impl Ctx {
    fn next_op(&self) -> bool {
        if self.count > 0 {
            self.claimed.fetch_add(1, Ordering::Relaxed) < self.count
        } else {
            Instant::now() < self.end
        }
    }

    async fn op(
        &self,
        sender: &mut Sender,
        session: Option<&str>,
        ids: &mut u64,
        worker: usize,
    ) -> Result<OpDone, Error> {
        let t = &self.target;
        let mut next_id = || {
            *ids += 1;
            *ids
        };
        let one = OpDone {
            requests: 1,
            items: 0,
            first: None,
        };
        match self.scenario {
            Scenario::Small => {
                let b = t
                    .call(
                        sender,
                        session,
                        rpc(
                            next_id(),
                            "tools/call",
                            json!({"name":"echo","arguments":{"text":"hello"}}),
                        ),
                    )
                    .await?;
                if b.len() < 1000 || !contains(&b[..64.min(b.len())], b"\"result\"") {
                    return Err(format!("bad small answer: {}", String::from_utf8_lossy(&b)).into());
                }
                Ok(one)
            }
            Scenario::Big => {
                let b = t
                    .call(
                        sender,
                        session,
                        rpc(
                            next_id(),
                            "tools/call",
                            json!({"name":"big","arguments":{}}),
                        ),
                    )
                    .await?;
                if b.len() < 1024 * 1024 {
                    return Err(format!("short big answer: {} bytes", b.len()).into());
                }
                Ok(one)
            }
            Scenario::Sse => {
                let id = next_id();
                let body = rpc(
                    id,
                    "tools/call",
                    json!({"name":"progress","arguments":{"count":100,"interval_ms":self.interval_ms},
                           "_meta":{"progressToken":format!("p-{worker}-{id}")}}),
                );
                let resp = t.post(sender, session, body).await?;
                if !resp.status().is_success() {
                    return Err(format!("HTTP {}", resp.status()).into());
                }
                let mut body = resp.into_body();
                let mut buf: Vec<u8> = Vec::with_capacity(32 * 1024);
                let mut scanned = 0usize;
                let mut events = 0u32;
                let mut first = None;
                let mut saw_result = false;
                while let Some(frame) = body.frame().await {
                    let Ok(data) = frame?.into_data() else {
                        continue;
                    };
                    buf.extend_from_slice(&data);
                    while let Some(pos) = find(&buf[scanned..], b"\n\n") {
                        let ev = &buf[scanned..scanned + pos];
                        scanned += pos + 2;
                        if !contains(ev, b"data:") {
                            continue; // a comment (keep-alive) or an empty event
                        }
                        events += 1;
                        if first.is_none() {
                            first = Some(Instant::now());
                        }
                        if contains(ev, b"\"result\"") {
                            saw_result = true;
                        }
                    }
                }
                if events != 101 || !saw_result {
                    return Err(format!("SSE: {events} events, result seen: {saw_result}").into());
                }
                Ok(OpDone {
                    requests: 1,
                    items: 0,
                    first,
                })
            }
            Scenario::Lifecycle => self.lifecycle(sender, session, &mut next_id, false).await,
            Scenario::ModernLifecycle => self.lifecycle(sender, session, &mut next_id, true).await,
            Scenario::Create => {
                let b = t
                    .call(
                        sender,
                        session,
                        rpc(
                            next_id(),
                            "tools/call",
                            json!({"name":"echo","arguments":{"text":"hello"},"task":{"ttl":3600000}}),
                        ),
                    )
                    .await?;
                if !contains(&b, b"\"taskId\"") {
                    return Err(format!("create: {}", String::from_utf8_lossy(&b)).into());
                }
                Ok(one)
            }
            Scenario::List => {
                let b = t
                    .call(sender, session, rpc(next_id(), "tasks/list", json!({})))
                    .await?;
                let v = parse_json(&b)?;
                let n = v
                    .pointer("/result/tasks")
                    .and_then(Value::as_array)
                    .map(Vec::len)
                    .ok_or_else(|| format!("tasks/list: {v}"))?;
                Ok(OpDone {
                    requests: 1,
                    items: n as u64,
                    first: None,
                })
            }
            Scenario::ListWalk | Scenario::Cancel => unreachable!("not a loop scenario"),
        }
    }
}

impl Ctx {
    /// One task's lifecycle. 2025-11-25 (`modern` false): task-augmented `tools/call` (nested
    /// `CreateTaskResult`), 10 × `tasks/get`, `tasks/result`: 12 requests. 2026-07-28: `tools/call`
    /// declaring the tasks extension (flat `CreateTaskResult`, `resultType:"task"`), 10 ×
    /// `tasks/get` (`DetailedTask`, `resultType:"complete"`; the last must be `completed` with the
    /// result inline): 11 requests, each with the 2026 headers and `_meta`.
    async fn lifecycle(
        &self,
        sender: &mut Sender,
        session: Option<&str>,
        next_id: &mut impl FnMut() -> u64,
        modern: bool,
    ) -> Result<OpDone, Error> {
        let t = &self.target;
        let (params, headers) = if modern {
            (
                json!({"name":"echo","arguments":{"text":"hello"},"_meta":modern_meta()}),
                Some(("tools/call", "echo")),
            )
        } else {
            (
                json!({"name":"echo","arguments":{"text":"hello"},"task":{"ttl":600000}}),
                None,
            )
        };
        let b = t
            .call_as(
                sender,
                session,
                rpc(next_id(), "tools/call", params),
                headers,
            )
            .await?;
        let v = parse_json(&b)?;
        let created = if modern {
            v.get("result")
                .filter(|r| r["resultType"] == "task" && r["status"].is_string())
                .and_then(|r| r["taskId"].as_str())
        } else {
            v.pointer("/result/task/taskId").and_then(Value::as_str)
        };
        let Some(task_id) = created else {
            return Err(format!("no CreateTaskResult: {v}").into());
        };
        let get_params = if modern {
            json!({ "taskId": task_id, "_meta": modern_meta() })
        } else {
            json!({ "taskId": task_id })
        };
        let get_headers = modern.then_some(("tasks/get", task_id));
        for i in 0..10 {
            let b = t
                .call_as(
                    sender,
                    session,
                    rpc(next_id(), "tasks/get", get_params.clone()),
                    get_headers,
                )
                .await?;
            if !modern {
                if !contains(&b, b"\"status\"") {
                    return Err(format!("tasks/get: {}", String::from_utf8_lossy(&b)).into());
                }
                continue;
            }
            let v = parse_json(&b)?;
            let r = &v["result"];
            let completed = r["status"] == "completed";
            let ok = r["resultType"] == "complete"
                && r["taskId"] == task_id
                && matches!(
                    r["status"].as_str(),
                    Some("working" | "input_required" | "completed")
                )
                && (!completed || r.pointer("/result/content").is_some_and(Value::is_array))
                && (i < 9 || completed);
            if !ok {
                return Err(format!("tasks/get ({}): {v}", i + 1).into());
            }
        }
        if !modern {
            let b = t
                .call(
                    sender,
                    session,
                    rpc(next_id(), "tasks/result", json!({ "taskId": task_id })),
                )
                .await?;
            if !contains(&b, b"\"content\"") {
                return Err(format!("tasks/result: {}", String::from_utf8_lossy(&b)).into());
            }
        }
        Ok(OpDone {
            requests: if modern { 11 } else { 12 },
            items: 1,
            first: None,
        })
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A worker's connection and, when the scenario has one per worker, its MCP session.
async fn open(ctx: &Ctx) -> Result<(Sender, Option<String>), Error> {
    let mut s = ctx.target.connect().await?;
    let session = if ctx.scenario.own_session() {
        ctx.target.initialize(&mut s).await?
    } else {
        ctx.session.clone()
    };
    Ok((s, session))
}

async fn worker(
    ctx: Arc<Ctx>,
    index: usize,
    mut conn: Option<(Sender, Option<String>)>,
) -> WorkerOut {
    let mut out = WorkerOut::default();
    // Workers that share one MCP session (`create`, `list`) number their requests apart: taskgate
    // refuses an id already in flight on the session (issue 29), so ids are worker << 32 + n.
    let mut ids = if ctx.scenario.own_session() {
        0
    } else {
        (index as u64) << 32
    };
    while ctx.next_op() {
        if conn.is_none() {
            match open(&ctx).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    out.errors += 1;
                    out.first_error.get_or_insert_with(|| e.to_string());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            }
        }
        let (sender, session) = conn.as_mut().expect("connected");
        let t0 = Instant::now();
        let result = ctx.op(sender, session.as_deref(), &mut ids, index).await;
        let t1 = Instant::now();
        match result {
            Ok(done) => {
                if ctx.count > 0 || (t0 >= ctx.warm_end && t1 <= ctx.end) {
                    out.lat.push((t1 - t0).as_nanos() as u64);
                    if let Some(f) = done.first {
                        out.first.push((f - t0).as_nanos() as u64);
                    }
                    out.requests += done.requests;
                    out.items += done.items;
                }
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert_with(|| e.to_string());
                conn = None;
            }
        }
    }
    out.conn = conn;
    out
}

/// Awaits every future, concurrently (a join_all without the futures crate).
async fn futures_join<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

fn num(v: f64) -> Value {
    if v.is_finite() {
        json!((v * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

struct Common {
    case: String,
    target_name: String,
    concurrency: usize,
    cpu_pids: Vec<u32>,
}

fn record(common: &Common, scenario: Scenario, fields: Value) -> Value {
    let mut v = json!({
        "kind": "run",
        "case": common.case,
        "scenario": scenario.name(),
        "target": common.target_name,
        "concurrency": common.concurrency,
    });
    if let (Value::Object(a), Value::Object(b)) = (&mut v, fields) {
        a.extend(b);
    }
    v
}

/// Connections whose MCP session a run leaves open (ended after the run by `--close-sessions`).
type Open = Vec<(Target, Sender, String)>;

fn open_sessions(target: &Target, outs: &mut [WorkerOut]) -> Open {
    outs.iter_mut()
        .filter_map(|o| o.conn.take())
        .filter_map(|(s, session)| Some((target.clone(), s, session?)))
        .collect()
}

async fn run_loop(
    args: &Args,
    common: &Common,
    scenario: Scenario,
    target: Target,
) -> (Value, Open) {
    let warmup = args.num("--warmup", 0.5f64);
    let duration = args.num("--duration", 3.0f64);
    let count = args.num("--count", 0u64);
    let session = match args.get("--session-file") {
        Some(f) if scenario == Scenario::List => Some(
            std::fs::read_to_string(&f)
                .unwrap_or_else(|e| die(&format!("{f}: {e}")))
                .trim()
                .to_string(),
        ),
        Some(f) if scenario == Scenario::Create => {
            let mut s = target
                .connect()
                .await
                .unwrap_or_else(|e| die(&e.to_string()));
            let sid = target
                .initialize(&mut s)
                .await
                .unwrap_or_else(|e| die(&e.to_string()))
                .unwrap_or_else(|| die("the server gave no Mcp-Session-Id"));
            std::fs::write(&f, &sid).unwrap_or_else(|e| die(&format!("{f}: {e}")));
            Some(sid)
        }
        _ => None,
    };
    let mut ctx = Ctx {
        target,
        scenario,
        session,
        interval_ms: args.num("--interval-ms", 0u64),
        claimed: AtomicU64::new(0),
        count,
        warm_end: Instant::now(),
        end: Instant::now(),
    };
    // `--open-first`: every worker's connection and session are opened before the clock starts
    // (a proxy that starts a child per session does so outside the measured window).
    let mut first: Vec<Option<(Sender, Option<String>)>> = Vec::new();
    if args.0.iter().any(|a| a == "--open-first") {
        let opened = futures_join(
            (0..common.concurrency)
                .map(|_| open(&ctx))
                .collect::<Vec<_>>(),
        )
        .await;
        first = opened.into_iter().map(Result::ok).collect();
    }
    first.resize_with(common.concurrency, || None);
    let start = Instant::now();
    let (warm_end, end) = if count > 0 {
        (start, start + Duration::from_secs(3600))
    } else {
        let w = start + Duration::from_secs_f64(warmup);
        (w, w + Duration::from_secs_f64(duration))
    };
    ctx.warm_end = warm_end;
    ctx.end = end;
    let ctx = Arc::new(ctx);
    let cpu_before_count = cpu_us(&common.cpu_pids);
    let handles: Vec<_> = first
        .into_iter()
        .enumerate()
        .map(|(i, c)| tokio::spawn(worker(ctx.clone(), i, c)))
        .collect();
    let (cpu0, cpu1, measured_from, measured_to);
    if count > 0 {
        cpu0 = cpu_before_count;
        measured_from = start;
        let mut outs = Vec::new();
        for h in handles {
            outs.push(h.await.expect("worker"));
        }
        measured_to = Instant::now();
        cpu1 = cpu_us(&common.cpu_pids);
        let open = open_sessions(&ctx.target, &mut outs);
        let v = summarize(
            common,
            scenario,
            outs,
            measured_to - measured_from,
            cpu1 - cpu0,
        );
        return (v, open);
    }
    tokio::time::sleep_until(warm_end.into()).await;
    cpu0 = cpu_us(&common.cpu_pids);
    tokio::time::sleep_until(end.into()).await;
    cpu1 = cpu_us(&common.cpu_pids);
    let mut outs = Vec::new();
    for h in handles {
        outs.push(h.await.expect("worker"));
    }
    let open = open_sessions(&ctx.target, &mut outs);
    (
        summarize(common, scenario, outs, end - warm_end, cpu1 - cpu0),
        open,
    )
}

fn summarize(
    common: &Common,
    scenario: Scenario,
    outs: Vec<WorkerOut>,
    elapsed: Duration,
    cpu: f64,
) -> Value {
    let mut lat: Vec<u64> = outs.iter().flat_map(|o| o.lat.iter().copied()).collect();
    let mut first: Vec<u64> = outs.iter().flat_map(|o| o.first.iter().copied()).collect();
    lat.sort_unstable();
    first.sort_unstable();
    let requests: u64 = outs.iter().map(|o| o.requests).sum();
    let errors: u64 = outs.iter().map(|o| o.errors).sum();
    let items: u64 = outs.iter().map(|o| o.items).sum();
    let first_error = outs.iter().find_map(|o| o.first_error.clone());
    let secs = elapsed.as_secs_f64();
    let ops = lat.len() as f64;
    let cpu_per_req = if common.cpu_pids.is_empty() || requests == 0 {
        f64::NAN
    } else {
        cpu / requests as f64
    };
    let mut fields = json!({
        "ops": lat.len(),
        "requests": requests,
        "seconds": num(secs),
        "ops_per_s": num(ops / secs),
        "req_per_s": num(requests as f64 / secs),
        "p50_us": num(pct(&lat, 0.5)),
        "p99_us": num(pct(&lat, 0.99)),
        "cpu_us_per_req": num(cpu_per_req),
        "cpu_ms": num(cpu / 1000.0),
        "errors": errors,
    });
    if scenario == Scenario::Sse {
        fields["first_p50_us"] = num(pct(&first, 0.5));
        fields["first_p99_us"] = num(pct(&first, 0.99));
    }
    if matches!(scenario, Scenario::List | Scenario::ListWalk) {
        fields["items"] = json!(items);
    }
    if let Some(e) = first_error {
        fields["first_error"] = json!(e);
    }
    record(common, scenario, fields)
}

async fn upstream_cancels(stats: &Option<Target>) -> Option<u64> {
    let t = stats.as_ref()?;
    let (status, body) = t.get(&t.path).await.ok()?;
    if status != 200 {
        return None;
    }
    parse_json(&body).ok()?.get("cancels")?.as_u64()
}

async fn run_cancel(args: &Args, common: &Common, target: Target) -> Value {
    let stats = args.get("--stats-url").map(|u| Target::parse(&u));
    let n = common.concurrency;
    // One task that stays `working` until cancelled, on one session.
    let mut s = target
        .connect()
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    let session = target
        .initialize(&mut s)
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    let created = target
        .call(
            &mut s,
            session.as_deref(),
            rpc(
                1,
                "tools/call",
                json!({"name":"slow","arguments":{},"task":{"ttl":600000}}),
            ),
        )
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    let task_id = parse_json(&created)
        .ok()
        .and_then(|v| {
            v.pointer("/result/task/taskId")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| {
            die(&format!(
                "no task created: {}",
                String::from_utf8_lossy(&created)
            ))
        });
    // Open every connection first, then fire all cancels at once.
    let mut senders = Vec::with_capacity(n);
    for _ in 0..n {
        senders.push(
            target
                .connect()
                .await
                .unwrap_or_else(|e| die(&format!("connect: {e}"))),
        );
    }
    let before = upstream_cancels(&stats).await;
    let cpu0 = cpu_us(&common.cpu_pids);
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let start = Instant::now();
    let handles: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(i, mut sender)| {
            let target = target.clone();
            let session = session.clone();
            let task_id = task_id.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let body = rpc(100 + i as u64, "tasks/cancel", json!({ "taskId": task_id }));
                barrier.wait().await;
                let t0 = Instant::now();
                let r = target.call(&mut sender, session.as_deref(), body).await;
                let lat = t0.elapsed().as_nanos() as u64;
                (r, lat)
            })
        })
        .collect();
    let (mut results, mut rpc_errors, mut failures) = (0u64, 0u64, 0u64);
    let mut first_error = None;
    let mut lat = Vec::with_capacity(n);
    for h in handles {
        let (r, l) = h.await.expect("cancel task");
        lat.push(l);
        match r {
            Ok(b) => match parse_json(&b) {
                Ok(v) if v.get("result").is_some() => results += 1,
                Ok(v) if v.get("error").is_some() => {
                    rpc_errors += 1;
                    if first_error.is_none() {
                        first_error = v.pointer("/error/message").map(|m| m.to_string());
                    }
                }
                _ => failures += 1,
            },
            Err(e) => {
                failures += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let elapsed = start.elapsed();
    let cpu = cpu_us(&common.cpu_pids) - cpu0;
    let after = upstream_cancels(&stats).await;
    lat.sort_unstable();
    let cpu_per_req = if common.cpu_pids.is_empty() {
        f64::NAN
    } else {
        cpu / n as f64
    };
    let mut fields = json!({
        "ops": n,
        "requests": n,
        "seconds": num(elapsed.as_secs_f64()),
        "ops_per_s": num(n as f64 / elapsed.as_secs_f64()),
        "req_per_s": num(n as f64 / elapsed.as_secs_f64()),
        "p50_us": num(pct(&lat, 0.5)),
        "p99_us": num(pct(&lat, 0.99)),
        "cpu_us_per_req": num(cpu_per_req),
        "cpu_ms": num(cpu / 1000.0),
        "results": results,
        "rpc_errors": rpc_errors,
        "errors": failures,
        "upstream_cancels": match (before, after) { (Some(b), Some(a)) => json!(a - b), _ => Value::Null },
    });
    if let Some(e) = first_error {
        fields["first_error"] = json!(e);
    }
    record(common, Scenario::Cancel, fields)
}

async fn run_list_walk(args: &Args, common: &Common, target: Target) -> Value {
    let f = args.need("--session-file");
    let session = std::fs::read_to_string(&f)
        .unwrap_or_else(|e| die(&format!("{f}: {e}")))
        .trim()
        .to_string();
    let mut s = target
        .connect()
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    let cpu0 = cpu_us(&common.cpu_pids);
    let start = Instant::now();
    let mut cursor: Option<String> = None;
    let mut lat = Vec::new();
    let mut items = 0u64;
    let mut error = None;
    let mut id = 0;
    loop {
        id += 1;
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let t0 = Instant::now();
        let r = target
            .call(&mut s, Some(&session), rpc(id, "tasks/list", params))
            .await;
        lat.push(t0.elapsed().as_nanos() as u64);
        let v = match r.and_then(|b| parse_json(&b)) {
            Ok(v) => v,
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        };
        let Some(tasks) = v.pointer("/result/tasks").and_then(Value::as_array) else {
            error = Some(v.to_string());
            break;
        };
        items += tasks.len() as u64;
        match v.pointer("/result/nextCursor").and_then(Value::as_str) {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let elapsed = start.elapsed();
    let cpu = cpu_us(&common.cpu_pids) - cpu0;
    let pages = lat.len();
    lat.sort_unstable();
    let mut fields = json!({
        "ops": pages,
        "requests": pages,
        "items": items,
        "seconds": num(elapsed.as_secs_f64()),
        "ops_per_s": num(pages as f64 / elapsed.as_secs_f64()),
        "req_per_s": num(pages as f64 / elapsed.as_secs_f64()),
        "p50_us": num(pct(&lat, 0.5)),
        "p99_us": num(pct(&lat, 0.99)),
        "cpu_us_per_req": num(if common.cpu_pids.is_empty() { f64::NAN } else { cpu / pages as f64 }),
        "cpu_ms": num(cpu / 1000.0),
        "errors": if error.is_some() { 1 } else { 0 },
    });
    if let Some(e) = error {
        fields["first_error"] = json!(e);
    }
    record(common, Scenario::ListWalk, fields)
}

fn append_json(args: &Args, v: &Value) {
    println!("{v}");
    if let Some(f) = args.get("--json-out") {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&f)
            .unwrap_or_else(|e| die(&format!("{f}: {e}")));
        writeln!(file, "{v}").unwrap_or_else(|e| die(&format!("{f}: {e}")));
    }
}

fn cmd_run(args: &Args) {
    let scenario = Scenario::parse(&args.need("--scenario"));
    let stdio_cmd = args.get("--stdio");
    let mut target = match &stdio_cmd {
        Some(_) => Target::parse("http://stdio/"),
        None => Target::parse(&args.need("--url")),
    };
    let common = Common {
        case: args
            .get("--case")
            .unwrap_or_else(|| scenario.name().to_string()),
        target_name: args.get("--target").unwrap_or_else(|| "target".into()),
        concurrency: args.num("--concurrency", 1usize).max(1),
        cpu_pids: pid_list(args, "--cpu-pid"),
    };
    let bench = pid_list(args, "--bench-pids");
    let others = (!bench.is_empty()).then(|| Others::sample(bench));
    let threads = args.num("--threads", 1usize);
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    if let Some(cmd) = &stdio_cmd {
        if !matches!(
            scenario,
            Scenario::Small | Scenario::Lifecycle | Scenario::Create
        ) {
            die("--stdio runs the scenarios small, lifecycle and create");
        }
        let client = runtime
            .block_on(StdioClient::spawn(cmd))
            .unwrap_or_else(|e| die(&e.to_string()));
        eprintln!("loadgen: stdio child {} (pid {})", cmd, client.pid);
        target.stdio = Some(client);
    }
    let (mut v, open) = runtime.block_on(async {
        match scenario {
            Scenario::Cancel => (run_cancel(args, &common, target.clone()).await, Vec::new()),
            Scenario::ListWalk => (
                run_list_walk(args, &common, target.clone()).await,
                Vec::new(),
            ),
            _ => run_loop(args, &common, scenario, target.clone()).await,
        }
    });
    // Before the connections close: a stdio child (this process's) and the children a proxy
    // keeps per session are still there to be counted as the benchmark's own.
    if let Some(others) = others {
        others.finish(&mut v);
    }
    if args.0.iter().any(|a| a == "--close-sessions") {
        runtime.block_on(async {
            for (t, mut sender, session) in open {
                let _ = t.delete(&mut sender, &session).await;
            }
        });
    } else {
        drop(open);
    }
    drop(target);
    drop(runtime);
    if let Some(rep) = args.get("--rep") {
        v["rep"] = json!(rep.parse::<u64>().unwrap_or(0));
    }
    append_json(args, &v);
}

// ---------------------------------------------------------------------------------------------
// Process helpers

/// Spawns CMD (stdout and stderr to files), waits for its `{"listening":…}` line and, when it
/// names an admin address, for `/readyz` to answer 200. Leaves the process running.
fn cmd_spawn_ready(args: &Args) {
    let dash = args
        .0
        .iter()
        .position(|a| a == "--")
        .unwrap_or_else(|| die("spawn-ready: -- CMD ARGS.. missing"));
    let cmd = &args.0[dash + 1..];
    if cmd.is_empty() {
        die("spawn-ready: empty command");
    }
    let out_path = args.need("--stdout");
    let err_path = args.need("--stderr");
    let timeout = Duration::from_secs_f64(args.num("--timeout", 60.0f64));
    let stdout = std::fs::File::create(&out_path).unwrap_or_else(|e| die(&e.to_string()));
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&err_path)
        .unwrap_or_else(|e| die(&e.to_string()));
    let start = Instant::now();
    let child = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| die(&format!("spawn {}: {e}", cmd[0])));
    let pid = child.id();
    let exited = |child_pid: u32| {
        std::fs::read_to_string(format!("/proc/{child_pid}/stat"))
            .map(|s| s.contains(") Z"))
            .unwrap_or(true)
    };
    let listening: Value = loop {
        if start.elapsed() > timeout {
            die(&format!("{}: no listening line after {timeout:?}", cmd[0]));
        }
        if exited(pid) {
            die(&format!(
                "{} exited before listening; see {err_path}",
                cmd[0]
            ));
        }
        if let Ok(text) = std::fs::read_to_string(&out_path) {
            if let Some(line) = text.lines().find(|l| l.contains("\"listening\"")) {
                if let Ok(v) = serde_json::from_str::<Value>(line) {
                    break v["listening"].clone();
                }
            }
        }
        std::thread::sleep(Duration::from_micros(500));
    };
    let listening_ms = start.elapsed().as_secs_f64() * 1000.0;
    let mut out = json!({
        "kind": "ready",
        "label": args.get("--label").unwrap_or_default(),
        "pid": pid,
        "listening_ms": num(listening_ms),
    });
    match &listening {
        Value::String(addr) => out["addr"] = json!(addr),
        Value::Object(o) => {
            out["gateway"] = o.get("gateway").cloned().unwrap_or(Value::Null);
            out["admin"] = o.get("admin").cloned().unwrap_or(Value::Null);
        }
        _ => {}
    }
    if let Some(admin) = out["admin"].as_str().map(str::to_string) {
        let t = Target::parse(&format!("http://{admin}/readyz"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let ready_ms = rt.block_on(async {
            loop {
                if let Ok((200, _)) = t.get("/readyz").await {
                    return start.elapsed().as_secs_f64() * 1000.0;
                }
                if start.elapsed() > timeout {
                    die("readyz did not answer 200 in time");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        out["ready_ms"] = num(ready_ms);
    }
    // The child is deliberately left running (the caller kills it by pid).
    std::mem::forget(child);
    append_json(args, &out);
}

fn cmd_mem(args: &Args) {
    let pid: u32 = args.num("--pid", 0);
    let v = json!({
        "kind": "mem",
        "label": args.get("--label").unwrap_or_default(),
        "pid": pid,
        "vm_rss_kib": proc_status_kib(pid, "VmRSS:"),
        "vm_hwm_kib": proc_status_kib(pid, "VmHWM:"),
        "rss_anon_kib": proc_status_kib(pid, "RssAnon:"),
        "rss_file_kib": proc_status_kib(pid, "RssFile:"),
    });
    append_json(args, &v);
}

fn cmd_free_port() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    println!("{}", l.local_addr().expect("addr").port());
}

// ---------------------------------------------------------------------------------------------
// Report

fn f(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn fmt(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "–".into()
    }
}

fn signed(x: f64) -> String {
    if x.is_finite() {
        format!("{x:+.0}")
    } else {
        "–".into()
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b != 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}

/// The paths of a case, in table order.
const TARGETS: [&str; 15] = [
    "direct",
    "nginx",
    "nginx-https",
    "hyper",
    "taskgate",
    "taskgate-https",
    "tier",
    "taskgate-oauth",
    "taskgate-bridged",
    "taskgate-reverse",
    "taskgate-gateway",
    "taskgate-traced",
    "taskgate-sled",
    "taskgate-pg",
    "supergateway",
];

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// The runs of one (case, path) as one record: each numeric field's median, with its min and
/// max as `FIELD__lo` and `FIELD__hi`; `errors` summed; `_n` the number of runs; other fields
/// from the last run.
fn aggregate(runs: &[&Value]) -> Option<Value> {
    let last = (*runs.last()?).clone();
    let mut out = last.clone();
    let Value::Object(fields) = &last else {
        return Some(out);
    };
    for (key, value) in fields {
        if !value.is_number() || key == "rep" {
            continue;
        }
        let mut xs: Vec<f64> = runs.iter().filter_map(|r| r[key].as_f64()).collect();
        if key == "errors" {
            out[key] = json!(xs.iter().sum::<f64>() as u64);
            continue;
        }
        let (lo, hi) = xs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        out[key] = num(median(&mut xs));
        out[format!("{key}__lo")] = num(lo);
        out[format!("{key}__hi")] = num(hi);
    }
    out["_n"] = json!(runs.len());
    Some(out)
}

/// `median (min–max)` of an aggregated field; the median alone when there is one run.
fn sp(r: &Value, key: &str, digits: usize) -> String {
    let (m, lo, hi) = (
        f(r, key),
        f(r, &format!("{key}__lo")),
        f(r, &format!("{key}__hi")),
    );
    if r["_n"].as_u64().unwrap_or(1) > 1 && lo.is_finite() && hi.is_finite() {
        format!(
            "{} ({}–{})",
            fmt(m, digits),
            fmt(lo, digits),
            fmt(hi, digits)
        )
    } else {
        fmt(m, digits)
    }
}

fn cmd_report(args: &Args) {
    let path = args.need("--in");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| die(&format!("{path}: {e}")));
    let all: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let runs: Vec<&Value> = all.iter().filter(|v| v["kind"] == "run").collect();
    let mut cases: Vec<String> = Vec::new();
    for r in &runs {
        let c = r["case"].as_str().unwrap_or("").to_string();
        if !c.starts_with('6') && !cases.contains(&c) {
            cases.push(c);
        }
    }
    // Every run of (case, path) folded into one: medians, with each numeric field's min and max
    // as `FIELD__lo` / `FIELD__hi`; errors summed; `_n` the number of runs.
    let find = |case: &str, target: &str| -> Option<Value> {
        let these: Vec<&Value> = runs
            .iter()
            .filter(|r| r["case"] == case && r["target"] == target)
            .copied()
            .collect();
        aggregate(&these)
    };
    let mut md = String::new();
    for case in &cases {
        let scenario = runs
            .iter()
            .find(|r| r["case"] == case.as_str())
            .map(|r| r["scenario"].as_str().unwrap_or("").to_string())
            .unwrap_or_default();
        let direct = find(case, "direct");
        md.push_str(&format!("\n### {case}\n\n"));
        let d = |k: &str| direct.as_ref().map(|v| f(v, k)).unwrap_or(f64::NAN);
        match scenario.as_str() {
            "sse" => {
                md.push_str("| path | streams/s | ×direct | first event p50 µs | p99 µs | first p50 − direct µs | last event p50 µs | p99 µs | ×direct p50 | proxy CPU µs/stream | errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
                for t in TARGETS {
                    let Some(r) = find(case, t) else { continue };
                    md.push_str(&format!(
                        "| {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        sp(&r, "ops_per_s", 0),
                        ratio(f(&r, "ops_per_s"), d("ops_per_s")),
                        sp(&r, "first_p50_us", 0),
                        sp(&r, "first_p99_us", 0),
                        fmt(f(&r, "first_p50_us") - d("first_p50_us"), 0),
                        sp(&r, "p50_us", 0),
                        sp(&r, "p99_us", 0),
                        ratio(f(&r, "p50_us"), d("p50_us")),
                        sp(&r, "cpu_us_per_req", 1),
                        r["errors"],
                    ));
                }
            }
            "cancel" => {
                md.push_str("| path | cancels sent | upstream cancels received | results | JSON-RPC errors | p50 µs | p99 µs | all done ms | proxy CPU µs/req | failures |\n|---|---|---|---|---|---|---|---|---|---|\n");
                for t in TARGETS {
                    let Some(r) = find(case, t) else { continue };
                    md.push_str(&format!(
                        "| {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        sp(&r, "requests", 0),
                        sp(&r, "upstream_cancels", 0),
                        sp(&r, "results", 0),
                        sp(&r, "rpc_errors", 0),
                        sp(&r, "p50_us", 0),
                        sp(&r, "p99_us", 0),
                        fmt(f(&r, "seconds") * 1000.0, 1),
                        sp(&r, "cpu_us_per_req", 1),
                        r["errors"],
                    ));
                }
            }
            "lifecycle" | "modern-lifecycle" => {
                md.push_str("| path | tasks/s | ×direct | requests/s | lifecycle p50 µs | p99 µs | ×direct p50 | added p50 µs | proxy CPU µs/req | errors |\n|---|---|---|---|---|---|---|---|---|---|\n");
                for t in TARGETS {
                    let Some(r) = find(case, t) else { continue };
                    md.push_str(&format!(
                        "| {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        sp(&r, "ops_per_s", 0),
                        ratio(f(&r, "ops_per_s"), d("ops_per_s")),
                        sp(&r, "req_per_s", 0),
                        sp(&r, "p50_us", 0),
                        sp(&r, "p99_us", 0),
                        ratio(f(&r, "p50_us"), d("p50_us")),
                        fmt(f(&r, "p50_us") - d("p50_us"), 0),
                        sp(&r, "cpu_us_per_req", 1),
                        r["errors"],
                    ));
                }
            }
            _ => {
                md.push_str("| path | req/s | ×direct | p50 µs | p99 µs | ×direct p50 | ×direct p99 | added p50 µs | proxy CPU µs/req | errors |\n|---|---|---|---|---|---|---|---|---|---|\n");
                for t in TARGETS {
                    let Some(r) = find(case, t) else { continue };
                    md.push_str(&format!(
                        "| {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        sp(&r, "req_per_s", 0),
                        ratio(f(&r, "req_per_s"), d("req_per_s")),
                        sp(&r, "p50_us", 0),
                        sp(&r, "p99_us", 0),
                        ratio(f(&r, "p50_us"), d("p50_us")),
                        ratio(f(&r, "p99_us"), d("p99_us")),
                        fmt(f(&r, "p50_us") - d("p50_us"), 0),
                        sp(&r, "cpu_us_per_req", 1),
                        r["errors"],
                    ));
                }
            }
        }
        // Scenario 15: what trace export costs, on ÷ off (issue 34's goal: at most +10 %).
        if case.starts_with("15.") {
            if let (Some(off), Some(on)) = (find(case, "taskgate"), find(case, "taskgate-traced")) {
                let nginx = find(case, "nginx").map(|n| f(&n, "cpu_us_per_req"));
                let (off, on) = (f(&off, "cpu_us_per_req"), f(&on, "cpu_us_per_req"));
                let of_nginx = |x: f64| nginx.map(|n| ratio(x, n)).unwrap_or_else(|| "–".into());
                md.push_str(&format!(
                    "\nProxy CPU per request, medians: trace export on ÷ off {}; off ÷ nginx {}, on ÷ nginx {}\n",
                    ratio(on, off),
                    of_nginx(off),
                    of_nginx(on),
                ));
            }
        }
        // Scenario 16: an https:// upstream, each proxy against its own plain-HTTP path and
        // taskgate against nginx, both speaking TLS upstream.
        if case.starts_with("16.") {
            let cpu = |t: &str| find(case, t).map(|r| f(&r, "cpu_us_per_req"));
            if let (Some(tg), Some(tgs)) = (cpu("taskgate"), cpu("taskgate-https")) {
                let to_nginx = match (cpu("nginx"), cpu("nginx-https")) {
                    (Some(ng), Some(ngs)) => format!(
                        "; nginx https ÷ http {}; taskgate ÷ nginx, both https {}",
                        ratio(ngs, ng),
                        ratio(tgs, ngs)
                    ),
                    _ => String::new(),
                };
                md.push_str(&format!(
                    "\nProxy CPU per request, medians: taskgate https ÷ http {}{to_nginx}\n",
                    ratio(tgs, tg),
                ));
            }
        }
        // Scenarios 7, 9, 10, 12, 13 and 14 compare taskgates with one another (14's tier has an
        // nginx of its own, in its path), 11 stdio paths; nginx takes no part there.
        let taskgates_only = ["7.", "9.", "10.", "11.", "12.", "13.", "14."]
            .iter()
            .any(|p| case.starts_with(p));
        if find(case, "nginx").is_none() && !taskgates_only {
            md.push_str("\n(nginx skipped: not installed)\n");
        }
    }
    // Scenario 6: taskgate only.
    let s6: Vec<&Value> = all
        .iter()
        .filter(|v| {
            v["case"].as_str().is_some_and(|c| c.starts_with('6'))
                || v["label"].as_str().is_some_and(|l| l.starts_with('6'))
        })
        .collect();
    let mut rss_mib = f64::NAN;
    let mut ready_ms = f64::NAN;
    if !s6.is_empty() {
        md.push_str("\n### 6. registry scale (taskgate only: direct and nginx keep no registry)\n\n| measurement | value |\n|---|---|\n");
        for v in &s6 {
            match v["kind"].as_str() {
                Some("run") => {
                    let name = v["case"].as_str().unwrap_or("");
                    md.push_str(&format!(
                        "| {name}: {} requests at c={} | {} req/s, p50 {} µs, p99 {} µs, {} taskgate CPU µs/req, {} errors{} |\n",
                        v["requests"],
                        v["concurrency"],
                        fmt(f(v, "req_per_s"), 0),
                        fmt(f(v, "p50_us"), 0),
                        fmt(f(v, "p99_us"), 0),
                        fmt(f(v, "cpu_us_per_req"), 1),
                        v["errors"],
                        match (v.get("items").and_then(Value::as_u64), v["scenario"].as_str()) {
                            (Some(i), Some("list")) => format!(
                                ", {} tasks per page",
                                fmt(i as f64 / f(v, "requests"), 0)
                            ),
                            (Some(i), _) => format!(", {i} tasks in all pages"),
                            _ => String::new(),
                        },
                    ));
                }
                Some("mem") => {
                    let rss = f(v, "vm_rss_kib") / 1024.0;
                    if !(rss <= rss_mib) {
                        rss_mib = rss;
                    }
                    md.push_str(&format!(
                        "| {}: RSS | {} MiB (peak {} MiB; anon {} MiB, file {} MiB) |\n",
                        v["label"].as_str().unwrap_or(""),
                        fmt(rss, 1),
                        fmt(f(v, "vm_hwm_kib") / 1024.0, 1),
                        fmt(f(v, "rss_anon_kib") / 1024.0, 1),
                        fmt(f(v, "rss_file_kib") / 1024.0, 1),
                    ));
                }
                Some("ready") => {
                    ready_ms = f(v, "ready_ms");
                    md.push_str(&format!(
                        "| {}: restart to listening / to /readyz 200 | {} ms / {} ms |\n",
                        v["label"].as_str().unwrap_or(""),
                        fmt(f(v, "listening_ms"), 1),
                        fmt(ready_ms, 1),
                    ));
                }
                _ => {}
            }
        }
    }
    // The hyper floor (issue 15): what a proxy on hyper and tokio alone costs (`hyperproxy`),
    // beside nginx and taskgate, when the run had that path (FLOOR=1).
    let floored: Vec<&String> = cases
        .iter()
        .filter(|c| find(c, "hyper").is_some())
        .collect();
    if !floored.is_empty() {
        md.push_str("\n### The hyper floor: CPU per request (per stream for SSE), medians\n\n");
        md.push_str("`hyper` is benches/loadgen's `hyperproxy`: a reverse proxy built like taskgate's data path (a current-thread runtime per core on `SO_REUSEPORT` sockets, hyper's HTTP/1 server and client, a connection pool per thread) doing nothing else. taskgate ÷ hyper is what taskgate's own work costs; hyper ÷ nginx is what the HTTP library and the runtime cost.\n\n");
        md.push_str("| case | nginx µs | hyper µs | taskgate µs | hyper ÷ nginx | taskgate ÷ hyper | taskgate ÷ nginx |\n|---|---|---|---|---|---|---|\n");
        for c in floored {
            let cpu = |t: &str| find(c, t).map_or(f64::NAN, |v| f(&v, "cpu_us_per_req"));
            let (n, h, t) = (cpu("nginx"), cpu("hyper"), cpu("taskgate"));
            md.push_str(&format!(
                "| {c} | {} | {} | {} | {} | {} | {} |\n",
                fmt(n, 1),
                fmt(h, 1),
                fmt(t, 1),
                ratio(h, n),
                ratio(t, h),
                ratio(t, n)
            ));
        }
    }
    // Scenario 11 (issue 31): the stdio paths side by side.
    let stdio: Vec<&String> = cases.iter().filter(|c| c.starts_with("11.")).collect();
    if !stdio.is_empty() {
        md.push_str("\n### 11. stdio upstream: taskgate beside supergateway and the direct stdio client (medians)\n\n");
        md.push_str("Requests per second (lifecycle: of its 12 requests) and proxy CPU per request; `direct` is loadgen driving the server's stdio itself (no HTTP, no proxy).\n\n");
        md.push_str("| case | direct req/s | taskgate req/s | supergateway req/s | taskgate ÷ direct | taskgate ÷ supergateway | taskgate CPU µs/req | supergateway CPU µs/req | taskgate ÷ supergateway CPU |\n|---|---|---|---|---|---|---|---|---|\n");
        for c in stdio {
            let get = |t: &str, k: &str| find(c, t).map_or(f64::NAN, |v| f(&v, k));
            let (d, t, s) = (
                get("direct", "req_per_s"),
                get("taskgate", "req_per_s"),
                get("supergateway", "req_per_s"),
            );
            let (tc, sc) = (
                get("taskgate", "cpu_us_per_req"),
                get("supergateway", "cpu_us_per_req"),
            );
            md.push_str(&format!(
                "| {c} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                fmt(d, 0),
                fmt(t, 0),
                fmt(s, 0),
                ratio(t, d),
                ratio(t, s),
                fmt(tc, 1),
                fmt(sc, 1),
                ratio(tc, sc),
            ));
        }
    }
    // Goals (issue 15: throughput and CPU against nginx; the SSE and lifecycle bounds).
    // The goal rows go to `md` after this header; a run without any (scenario 11 alone) drops it.
    let goals_header = "\n### Goals\n\n| goal | measured | met |\n|---|---|---|\n";
    md.push_str(goals_header);
    let goals_at = md.len();
    let yes = |ok: bool| if ok { "yes" } else { "**no**" };
    for c in cases.iter().filter(|c| c.starts_with("1. small")) {
        let conc = c.rsplit("c=").next().unwrap_or("?");
        let (n, t) = (find(c, "nginx"), find(c, "taskgate"));
        let (Some(n), Some(t)) = (n, t) else {
            md.push_str(&format!(
                "| 1, c={conc} | nginx or taskgate missing | – |\n"
            ));
            continue;
        };
        let thr = f(&t, "req_per_s") / f(&n, "req_per_s");
        let cpu = f(&t, "cpu_us_per_req") / f(&n, "cpu_us_per_req");
        md.push_str(&format!(
            "| 1, c={conc}: throughput ≥ 0.9 × nginx | {:.2} × nginx ({} vs {} req/s) | {} |\n",
            thr,
            fmt(f(&t, "req_per_s"), 0),
            fmt(f(&n, "req_per_s"), 0),
            yes(thr >= 0.9)
        ));
        md.push_str(&format!(
            "| 1, c={conc}: CPU/request ≤ 1.2 × nginx's | taskgate {} µs, nginx {} µs ({:.2}×) | {} |\n",
            fmt(f(&t, "cpu_us_per_req"), 1),
            fmt(f(&n, "cpu_us_per_req"), 1),
            cpu,
            yes(cpu <= 1.2)
        ));
    }
    for c in cases.iter().filter(|c| c.starts_with('3')) {
        if let (Some(d), Some(t)) = (find(c, "direct"), find(c, "taskgate")) {
            let gap = f(&t, "first_p50_us") - f(&d, "first_p50_us");
            md.push_str(&format!(
                "| 3 ({c}): first event within 1 ms of direct (p50) | {} µs (p99 {} µs) | {} |\n",
                signed(gap),
                signed(f(&t, "first_p99_us") - f(&d, "first_p99_us")),
                yes(gap <= 1000.0)
            ));
        }
        if c.contains("at once") {
            if let (Some(n), Some(t)) = (find(c, "nginx"), find(c, "taskgate")) {
                let cpu = f(&t, "cpu_us_per_req") / f(&n, "cpu_us_per_req");
                md.push_str(&format!(
                    "| 3 ({c}): CPU/stream ≤ 1.2 × nginx's | taskgate {} µs, nginx {} µs ({:.2}×) | {} |\n",
                    fmt(f(&t, "cpu_us_per_req"), 1),
                    fmt(f(&n, "cpu_us_per_req"), 1),
                    cpu,
                    yes(cpu <= 1.2)
                ));
            }
        }
    }
    for c in cases.iter().filter(|c| c.starts_with("4.")) {
        if let (Some(n), Some(t)) = (find(c, "nginx"), find(c, "taskgate")) {
            let cpu = f(&t, "cpu_us_per_req") / f(&n, "cpu_us_per_req");
            md.push_str(&format!(
                "| 4: lifecycle CPU/request ≤ 3 × nginx's plain-proxy CPU/request | taskgate {} µs, nginx {} µs ({:.2}×) | {} |\n",
                fmt(f(&t, "cpu_us_per_req"), 1),
                fmt(f(&n, "cpu_us_per_req"), 1),
                cpu,
                yes(cpu <= 3.0)
            ));
        }
    }
    for c in cases.iter().filter(|c| c.starts_with('5')) {
        if let Some(t) = find(c, "taskgate") {
            let (lo, hi) = (f(&t, "upstream_cancels__lo"), f(&t, "upstream_cancels__hi"));
            let lo = if lo.is_finite() {
                lo
            } else {
                f(&t, "upstream_cancels")
            };
            let hi = if hi.is_finite() { hi } else { lo };
            md.push_str(&format!(
                "| 5 (taskgate): exactly one upstream cancel (every run) | {} | {} |\n",
                sp(&t, "upstream_cancels", 0),
                yes(lo == 1.0 && hi == 1.0)
            ));
        }
    }
    if !s6.is_empty() {
        md.push_str(&format!(
            "| 6: ≤ 100 MiB RSS with 100,000 records (largest sample) | {} MiB | {} |\n| 6: ready ≤ 1 s after restart | {} ms | {} |\n",
            fmt(rss_mib, 1),
            yes(rss_mib <= 100.0),
            fmt(ready_ms, 1),
            yes(ready_ms <= 1000.0)
        ));
    }
    if md.len() == goals_at {
        md.truncate(goals_at - goals_header.len());
    }
    // Issue 15: how quiet the machine was.
    let quiet_pct = args.num("--quiet-pct", 10.0f64);
    let measured: Vec<&&Value> = runs
        .iter()
        .filter(|r| r.get("others_core_pct").is_some())
        .collect();
    if !measured.is_empty() {
        let mut pcts: Vec<f64> = measured.iter().map(|r| f(r, "others_core_pct")).collect();
        let total_ms: f64 = measured.iter().map(|r| f(r, "others_cpu_ms")).sum();
        let total_s: f64 = measured.iter().map(|r| f(r, "window_s")).sum();
        let overall = total_ms / 10.0 / total_s;
        let noisy: Vec<String> = measured
            .iter()
            .filter(|r| f(r, "others_core_pct") > quiet_pct)
            .map(|r| {
                format!(
                    "{} / {} / run {}",
                    r["case"].as_str().unwrap_or(""),
                    r["target"].as_str().unwrap_or(""),
                    r["rep"]
                )
            })
            .collect();
        let max = pcts.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let med = median(&mut pcts);
        md.push_str("\n### Machine quietness\n\n");
        md.push_str(&format!(
            "CPU used by processes other than the benchmark's own (upstream, proxies, load generator) while each run ran, from /proc/stat: {} % of one core over all {} runs ({} ms in {} s); per run median {} %, max {} %. Threshold: {} % of one core.\n\n",
            fmt(overall, 1), measured.len(), fmt(total_ms, 0), fmt(total_s, 1), fmt(med, 1), fmt(max, 1), fmt(quiet_pct, 0)
        ));
        if overall > quiet_pct || !noisy.is_empty() {
            md.push_str(&format!(
                "**Warning: machine not quiet**: other processes used {} % of a core overall; {} of {} runs above {} %: {}. The figures of those runs are suspect.\n",
                fmt(overall, 1), noisy.len(), measured.len(), fmt(quiet_pct, 0),
                match noisy.len() {
                    0 => "none".to_string(),
                    1..=5 => noisy.join("; "),
                    n => format!("{}; and {} more (see *others % core* under Raw runs)", noisy[..5].join("; "), n - 5),
                }
            ));
        } else {
            md.push_str("The machine was quiet: no run above the threshold.\n");
        }
    }
    // Every run as measured.
    md.push_str("\n### Raw runs\n\n| case | path | run | ops/s | req/s | p50 µs | p99 µs | first event p50 µs | proxy CPU µs/req | errors | others % core | load1 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &runs {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["case"].as_str().unwrap_or(""),
            r["target"].as_str().unwrap_or(""),
            r.get("rep").map(|v| v.to_string()).unwrap_or("–".into()),
            fmt(f(r, "ops_per_s"), 0),
            fmt(f(r, "req_per_s"), 0),
            fmt(f(r, "p50_us"), 0),
            fmt(f(r, "p99_us"), 0),
            fmt(f(r, "first_p50_us"), 0),
            fmt(f(r, "cpu_us_per_req"), 1),
            r["errors"],
            fmt(f(r, "others_core_pct"), 1),
            fmt(f(r, "load1"), 2),
        ));
    }
    print!("{md}");
}

fn main() {
    let all: Vec<String> = std::env::args().collect();
    let args = Args(all.clone());
    match all.get(1).map(String::as_str) {
        Some("run") => cmd_run(&args),
        Some("spawn-ready") => cmd_spawn_ready(&args),
        Some("mem") => cmd_mem(&args),
        Some("free-port") => cmd_free_port(),
        Some("report") => cmd_report(&args),
        _ => die("usage: loadgen run|spawn-ready|mem|free-port|report … (see the source header)"),
    }
}

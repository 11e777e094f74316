//! Starting taskgate: in this process ([`GatewayBuilder`] / [`Gateway`] for edge and routing
//! tests, [`TgConfig`] / [`UgConfig`] / [`Tg`] for `[auth]`, `[tasks]` and `[upgrade]`), or as the
//! real binary ([`TaskgateProcess`], [`run_taskgate`], [`ConfigFile`]). Every in-process start uses
//! a fresh temporary store.

use super::*;

// ---------------------------------------------------------------------------------------------
// taskgate in process
// ---------------------------------------------------------------------------------------------

/// taskgate started in this process, with the temporary directory that holds its store.
struct InProcess {
    running: taskgate::gateway::Running,
    dir: tempfile::TempDir,
    toml: String,
}

/// Writes `toml_for(store path)` with a store in a fresh temporary directory, parses it and
/// starts taskgate in this process. The one in-process start of every builder here.
async fn start_in_process(toml_for: impl FnOnce(&str) -> String) -> Result<InProcess, String> {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let toml = toml_for(store.to_str().unwrap());
    let config =
        taskgate::config::Config::from_toml_str(&toml).map_err(|e| format!("config error: {e}"))?;
    let running = taskgate::gateway::start(config)
        .await
        .map_err(|e| format!("start error: {e}"))?;
    Ok(InProcess { running, dir, toml })
}

/// Writes `toml_for(store path)` into `dir` (store at `dir/store`) for the real binary; returns
/// the config path.
fn write_for_binary(dir: &std::path::Path, toml_for: impl FnOnce(&str) -> String) -> String {
    let store = dir.join("store");
    let path = dir.join("taskgate.toml");
    std::fs::write(&path, toml_for(store.to_str().unwrap())).unwrap();
    path.to_str().unwrap().to_string()
}

struct UpstreamToml {
    name: String,
    url: String,
    lines: Vec<String>,
}

/// Writes a taskgate TOML config: listeners on port 0, a temporary store, the given upstreams.
#[derive(Default)]
pub struct GatewayBuilder {
    gateway_lines: Vec<String>,
    admin_lines: Vec<String>,
    upstreams: Vec<UpstreamToml>,
}

impl GatewayBuilder {
    pub fn new() -> Self {
        Self::default()
    }
    /// One upstream named `default` at `url`.
    pub fn single(url: &str) -> Self {
        Self::new().upstream("default", url)
    }
    /// An extra `key = value` line in `[gateway]`.
    pub fn gateway_opt(mut self, line: &str) -> Self {
        self.gateway_lines.push(line.into());
        self
    }
    /// An extra `key = value` line in `[admin]`.
    pub fn admin_opt(mut self, line: &str) -> Self {
        self.admin_lines.push(line.into());
        self
    }
    pub fn upstream(mut self, name: &str, url: &str) -> Self {
        self.upstreams.push(UpstreamToml {
            name: name.into(),
            url: url.into(),
            lines: vec![],
        });
        self
    }
    /// An extra `key = value` line in the last `[[upstream]]`.
    pub fn upstream_opt(mut self, line: &str) -> Self {
        self.upstreams
            .last_mut()
            .expect("upstream() first")
            .lines
            .push(line.into());
        self
    }
    pub fn to_toml(&self, store_path: &str, gateway_listen: &str, admin_listen: &str) -> String {
        let mut s = format!("[gateway]\nlisten = \"{gateway_listen}\"\n");
        for l in &self.gateway_lines {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str(&format!("\n[admin]\nlisten = \"{admin_listen}\"\n"));
        for l in &self.admin_lines {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str(&format!("\n[store]\npath = {store_path:?}\n"));
        s.push_str("\n[auth]\nmode = \"none\"\n\n[upgrade]\nenabled = false\n");
        for u in &self.upstreams {
            s.push_str(&format!(
                "\n[[upstream]]\nname = \"{}\"\nurl = \"{}\"\n",
                u.name, u.url
            ));
            for l in &u.lines {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }
    /// Parses the config and starts taskgate; Err carries the error's Display text.
    pub async fn try_start(self) -> Result<Gateway, String> {
        #[allow(unused_mut)]
        let InProcess {
            mut running,
            dir,
            toml,
        } = start_in_process(|store| self.to_toml(store, "127.0.0.1:0", "127.0.0.1:0")).await?;
        let addr: SocketAddr = running.gateway_addr;
        let admin: SocketAddr = running.admin_addr;
        let shutdown: ShutdownFn = Box::new(move || {
            Box::pin(async move {
                #[allow(clippy::let_unit_value)]
                let _ = running.shutdown().await;
            })
        });
        Ok(Gateway {
            shutdown: Some(shutdown),
            addr,
            admin,
            toml,
            _dir: dir,
        })
    }
    pub async fn start(self) -> Gateway {
        match self.try_start().await {
            Ok(g) => g,
            Err(e) => panic!("taskgate did not start: {e}"),
        }
    }
}

type ShutdownFn = Box<dyn FnOnce() -> Pin<Box<dyn std::future::Future<Output = ()>>>>;

/// taskgate running in this process.
pub struct Gateway {
    shutdown: Option<ShutdownFn>,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub toml: String,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// `http://127.0.0.1:PORT{path}` on the gateway listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    /// `http://127.0.0.1:PORT{path}` on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
    /// Graceful stop (`running.shutdown().await`).
    pub async fn shutdown(mut self) {
        if let Some(f) = self.shutdown.take() {
            f().await
        }
    }
    /// The shutdown future, to be raced against other work.
    pub fn shutdown_future(&mut self) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        (self.shutdown.take().expect("shutdown already taken"))()
    }
}

pub async fn initialize(gw: &Gateway, path: &str) -> String {
    let r = Req::mcp_post(&gw.url(path), initialize_body("1"))
        .send()
        .await;
    assert_eq!(r.status(), 200, "initialize through the gateway");
    let sid = r
        .header("mcp-session-id")
        .expect("initialize answer carries Mcp-Session-Id");
    let _ = r.bytes().await;
    sid
}

/// Asserts a normal request on `session` still goes through to `up` with the session header.
pub async fn assert_session_works(gw: &Gateway, up: &Upstream, session: &str) {
    let before = up.count();
    let body = rpc("\"after-bad\"", "tools/list", "{}");
    let r = Req::mcp_post(&gw.url("/mcp"), body.clone())
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(
        r.status(),
        200,
        "session must keep working after a bad request"
    );
    let got = r.json().await;
    assert_eq!(got["id"], Value::from("after-bad"));
    assert_eq!(got["result"]["echo"], Value::from("tools/list"));
    assert_eq!(up.count(), before + 1, "exactly one more upstream request");
    let last = up.last();
    assert_eq!(last.body_str(), body);
    assert_eq!(last.header("mcp-session-id").as_deref(), Some(session));
}

/// GETs an admin path and returns (status, body text).
pub async fn admin_get(gw: &Gateway, path: &str) -> (u16, String) {
    let r = Req::get(&gw.admin_url(path)).send().await;
    let s = r.status();
    (s, r.text().await)
}

// ---------------------------------------------------------------------------------------------
// The real binary
// ---------------------------------------------------------------------------------------------

/// The binary the tests run: this build's, or `TASKGATE_TEST_BIN` when set (to show that a
/// regression test fails on an older build).
pub fn taskgate_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("TASKGATE_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_taskgate").into())
    })
}

/// The result of running the binary to completion.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `taskgate ARGS` to completion (killed after `STEP` * 2).
pub fn run_taskgate(args: &[&str], envs: &[(&str, &str)]) -> Ran {
    let mut p = TaskgateProcess::spawn(args, envs);
    let status = p
        .wait_exit(STEP * 2)
        .unwrap_or_else(|| panic!("taskgate {args:?} did not exit"));
    let stdout = p.drain_stdout().join("\n");
    Ran {
        status,
        stdout,
        stderr: p.stderr(),
    }
}

/// `taskgate` as a child process; killed (SIGKILL) and reaped on drop.
pub struct TaskgateProcess {
    child: Child,
    stdout_rx: std::sync::mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
    stdout_thread: Option<std::thread::JoinHandle<()>>,
    exited: Option<ExitStatus>,
    /// The raw `{"listening":...}` line, once [`TaskgateProcess::listening`] read it.
    pub listening_line: Option<String>,
}

impl TaskgateProcess {
    pub fn spawn(args: &[&str], envs: &[(&str, &str)]) -> TaskgateProcess {
        let mut cmd = Command::new(taskgate_bin());
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn taskgate");
        let (tx, stdout_rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let stderr_thread = {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(err);
                let mut buf = [0u8; 4096];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => stderr
                            .lock()
                            .unwrap()
                            .push_str(&String::from_utf8_lossy(&buf[..n])),
                    }
                }
            })
        };
        TaskgateProcess {
            child,
            stdout_rx,
            stderr,
            stderr_thread: Some(stderr_thread),
            stdout_thread: Some(stdout_thread),
            exited: None,
            listening_line: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line, or None when stdout closed or `within` passed.
    pub fn stdout_line(&self, within: Duration) -> Option<String> {
        self.stdout_rx.recv_timeout(within).ok()
    }

    /// Stdout lines not read yet (after exit: everything left).
    pub fn drain_stdout(&mut self) -> Vec<String> {
        if self.exited.is_some() {
            if let Some(t) = self.stdout_thread.take() {
                let _ = t.join();
            }
        }
        self.stdout_rx.try_iter().collect()
    }

    /// Everything written to stderr so far (complete after exit).
    pub fn stderr(&mut self) -> String {
        if self.exited.is_some() {
            if let Some(t) = self.stderr_thread.take() {
                let _ = t.join();
            }
        }
        self.stderr.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: i32) {
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM)
    }

    /// Waits for exit; None on timeout.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited {
            return Some(s);
        }
        let until = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(s);
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Reads the `{"listening":{...}}` line: (gateway, admin).
    pub fn listening(&mut self) -> (SocketAddr, SocketAddr) {
        let line = self.stdout_line(STEP * 2).unwrap_or_else(|| {
            let _ = self.wait_exit(Duration::from_millis(200));
            panic!("no listening line on stdout; stderr: {}", self.stderr())
        });
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("listening line is not JSON ({e}): {line:?}"));
        let g = v["listening"]["gateway"]
            .as_str()
            .expect("listening.gateway")
            .parse()
            .unwrap();
        let a = v["listening"]["admin"]
            .as_str()
            .expect("listening.admin")
            .parse()
            .unwrap();
        self.listening_line = Some(line);
        (g, a)
    }
}

impl Drop for TaskgateProcess {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A config file for the binary: listeners on port 0, a store in the temp dir.
pub struct ConfigFile {
    pub dir: tempfile::TempDir,
    pub path: std::path::PathBuf,
}

impl ConfigFile {
    /// Writes `text` to `taskgate.toml` in a fresh temporary directory.
    pub fn write(text: &str) -> ConfigFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taskgate.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { dir, path }
    }
    /// A complete config built from `b` with listeners on port 0.
    pub fn from_builder(b: &GatewayBuilder) -> ConfigFile {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let text = b.to_toml(store.to_str().unwrap(), "127.0.0.1:0", "127.0.0.1:0");
        let path = dir.path().join("taskgate.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { dir, path }
    }
    pub fn path_str(&self) -> &str {
        self.path.to_str().unwrap()
    }
    pub fn store_path(&self) -> String {
        self.dir.path().join("store").to_str().unwrap().to_string()
    }
}

// =============================================================================================
// taskgate in process / config for the binary
// =============================================================================================

/// A taskgate configuration: one upstream `default`, optional bearer tokens, `[tasks]` lines.
#[derive(Clone)]
pub struct TgConfig {
    pub upstream_url: String,
    /// (principal, token): `[auth] mode = "bearer"` when not empty.
    pub tokens: Vec<(String, String)>,
    /// `key = value` lines of `[tasks]`.
    pub tasks: Vec<String>,
    /// `key = value` lines of `[gateway]`.
    pub gateway: Vec<String>,
}

impl TgConfig {
    pub fn new(upstream_url: &str) -> TgConfig {
        TgConfig {
            upstream_url: upstream_url.into(),
            tokens: vec![],
            tasks: vec![],
            gateway: vec![],
        }
    }
    pub fn token(mut self, principal: &str, token: &str) -> Self {
        self.tokens.push((principal.into(), token.into()));
        self
    }
    pub fn tasks(mut self, line: &str) -> Self {
        self.tasks.push(line.into());
        self
    }
    pub fn gateway(mut self, line: &str) -> Self {
        self.gateway.push(line.into());
        self
    }
    pub fn to_toml(&self, store: &str) -> String {
        let mut s = String::from("[gateway]\nlisten = \"127.0.0.1:0\"\n");
        for l in &self.gateway {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("\n[admin]\nlisten = \"127.0.0.1:0\"\n");
        s.push_str(&format!("\n[store]\npath = {store:?}\n"));
        if self.tokens.is_empty() {
            s.push_str("\n[auth]\nmode = \"none\"\n");
        } else {
            s.push_str("\n[auth]\nmode = \"bearer\"\n");
            for (p, t) in &self.tokens {
                let h = hex::encode(Sha256::digest(t.as_bytes()));
                s.push_str(&format!(
                    "\n[[auth.token]]\nprincipal = {p:?}\nsha256 = {h:?}\n"
                ));
            }
        }
        s.push_str("\n[tasks]\n");
        for l in &self.tasks {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str(&format!(
            "\n[[upstream]]\nname = \"default\"\nurl = {:?}\n",
            self.upstream_url
        ));
        s
    }
    /// Starts taskgate in this process on a fresh temporary store.
    pub async fn start(&self) -> Tg {
        Tg::start(|store| self.to_toml(store)).await
    }
    /// Writes the TOML for the binary into `dir` (store at `dir/store`); returns the config path.
    pub fn write_for_binary(&self, dir: &std::path::Path) -> String {
        write_for_binary(dir, |store| self.to_toml(store))
    }
}

/// taskgate running in this process.
pub struct Tg {
    pub gw: SocketAddr,
    pub admin: SocketAddr,
    pub metrics: Arc<taskgate::metrics::Metrics>,
    pub registry: Arc<taskgate::registry::Registry>,
    pub running: Option<taskgate::gateway::Running>,
    pub dir: tempfile::TempDir,
}

impl Tg {
    /// Starts taskgate in this process with the TOML `toml_for(store path)`.
    pub async fn start(toml_for: impl FnOnce(&str) -> String) -> Tg {
        let InProcess { running, dir, .. } = start_in_process(toml_for)
            .await
            .unwrap_or_else(|e| panic!("taskgate did not start: {e}"));
        Tg {
            gw: running.gateway_addr,
            admin: running.admin_addr,
            metrics: running.metrics.clone(),
            registry: running.registry.clone(),
            running: Some(running),
            dir,
        }
    }
    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.gw)
    }
    pub fn client(&self) -> Client {
        Client::new(&self.mcp_url())
    }
    /// The record as the store holds it now.
    pub fn record(&self, task_id: &str) -> Option<taskgate::store::TaskRecord> {
        self.registry.store().get("default", task_id).unwrap()
    }
    pub async fn admin(&self, path: &str) -> (u16, Value) {
        admin_json(self.admin, path).await
    }
    pub async fn metrics_text(&self) -> String {
        scrape(self.admin).await
    }
}

// =============================================================================================
// taskgate with [upgrade]
// =============================================================================================

/// A [`TgConfig`] plus `[upgrade]` lines (default `enabled = true`).
#[derive(Clone)]
pub struct UgConfig {
    pub tg: TgConfig,
    pub upgrade: Vec<String>,
    /// Extra lines in the `[[upstream]]` table (`timeout_ms = 300`).
    pub upstream: Vec<String>,
}

impl UgConfig {
    pub fn new(upstream_url: &str) -> UgConfig {
        UgConfig {
            tg: TgConfig::new(upstream_url),
            upgrade: vec!["enabled = true".into()],
            upstream: Vec::new(),
        }
    }
    /// Replaces the `[upgrade]` lines.
    pub fn upgrade(mut self, lines: &[&str]) -> Self {
        self.upgrade = lines.iter().map(|l| l.to_string()).collect();
        self
    }
    /// An extra line in `[upgrade]`.
    pub fn with(mut self, line: &str) -> Self {
        self.upgrade.push(line.into());
        self
    }
    pub fn gateway(mut self, line: &str) -> Self {
        self.tg = self.tg.gateway(line);
        self
    }
    pub fn tasks(mut self, line: &str) -> Self {
        self.tg = self.tg.tasks(line);
        self
    }
    /// An extra line in the `[[upstream]]` table (`timeout_ms = 300`).
    pub fn upstream_line(mut self, line: &str) -> Self {
        self.upstream.push(line.into());
        self
    }
    pub fn to_toml(&self, store: &str) -> String {
        let mut s = self.tg.to_toml(store);
        for l in &self.upstream {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("\n[upgrade]\n");
        for l in &self.upgrade {
            s.push_str(l);
            s.push('\n');
        }
        s
    }
    /// Starts taskgate in this process on a fresh temporary store.
    pub async fn start(&self) -> Tg {
        Tg::start(|store| self.to_toml(store)).await
    }
    /// Writes the TOML for the binary into `dir` (store at `dir/store`); returns the config path.
    pub fn write_for_binary(&self, dir: &std::path::Path) -> String {
        write_for_binary(dir, |store| self.to_toml(store))
    }
}

/// Runs blocking work (the real binary's pipes, `taskgate tasks` runs) from a multi-thread test.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Starts the real binary with `config`; returns it and its (gateway, admin) addresses.
pub fn spawn_binary(config: &str) -> (TaskgateProcess, SocketAddr, SocketAddr) {
    blocking(|| {
        let mut p = TaskgateProcess::spawn(&["serve", "--config", config], &[]);
        let (g, a) = p.listening();
        (p, g, a)
    })
}

/// `kill -9` and wait for the exit.
pub fn sigkill(p: &mut TaskgateProcess) {
    blocking(|| {
        p.signal(libc::SIGKILL);
        p.wait_exit(STEP).expect("taskgate did not die on SIGKILL");
    })
}

/// `(taskId, status)` of every record in a store, in `taskgate tasks list` order (newest first).
pub fn records_in_store(store: &str) -> Vec<(String, String)> {
    let ran = blocking(|| {
        run_taskgate(
            &["tasks", "list", "--store", store, "--limit", "10000000"],
            &[],
        )
    });
    assert!(ran.status.success(), "tasks list failed: {}", ran.stderr);
    ran.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v = parse_json(l.as_bytes());
            (
                v["task_id"].as_str().unwrap().to_string(),
                v["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// taskgate in front of the upstream at `url` with bearer tokens for `alice` and `bob`
/// (`alice-token`, `bob-token`), and a client of each, initialized: `(gateway, alice, bob)`.
pub async fn alice_and_bob_at(url: &str) -> (Tg, Client, Client) {
    let tg = TgConfig::new(url)
        .token("alice", "alice-token")
        .token("bob", "bob-token")
        .start()
        .await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let mut bob = tg.client().with_token("bob-token");
    bob.initialize().await;
    (tg, alice, bob)
}

/// A scripted task server behind taskgate with bearer principals `alice` and `bob`, each with an
/// initialized session of its own: `(upstream, gateway, alice, bob)`.
pub async fn bearer_pair() -> (TaskServer, Tg, Client, Client) {
    let up = TaskServer::default().await;
    let (tg, alice, bob) = alice_and_bob_at(&up.url()).await;
    assert_ne!(
        alice.session, bob.session,
        "the upstream issues one id per session"
    );
    (up, tg, alice, bob)
}

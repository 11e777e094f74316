//! One struct per TOML section (`[gateway]`, `[admin]`, `[auth]`, `[tasks]`,
//! `[upgrade]`, `[[upstream]]`), with its defaults and its `validate()` (ranges in
//! `config/REFERENCE.md`). `[store]` is in `store`.

use super::check::*;
use super::redact::{Command, Names, Redacted, Url};
use super::ConfigError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Smallest `gateway.max_body_bytes`: an `initialize` with client info and capabilities, or a
/// small `tools/call`, must fit.
const MIN_BODY_BYTES: u64 = 1024;

pub(super) fn default_gateway_listen() -> SocketAddr {
    "127.0.0.1:8080".parse().expect("literal address")
}
pub(super) fn default_admin_listen() -> SocketAddr {
    "127.0.0.1:9090".parse().expect("literal address")
}
pub(super) fn default_max_body_bytes() -> usize {
    4 * 1024 * 1024
}
pub(super) fn default_drain_timeout_ms() -> u64 {
    10_000
}
pub(super) fn default_sse_keepalive_ms() -> u64 {
    15_000
}
pub(super) fn default_max_connections() -> usize {
    10_000
}
pub(super) fn default_request_timeout_ms() -> u64 {
    30_000
}
pub(super) fn default_max_sessions() -> usize {
    100_000
}
pub(super) fn default_session_idle_ms() -> u64 {
    3_600_000
}

/// `[gateway]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address the MCP endpoint listens on (default `127.0.0.1:8080`; port 0 picks a free port).
    #[serde(default = "default_gateway_listen")]
    pub listen: SocketAddr,
    /// Extra `Host` header values accepted (the listen address, `localhost` and `127.0.0.1`, with or
    /// without the port, are always accepted). `"*"` accepts any Host.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Extra `Origin` values accepted (`http://localhost[:port]` and `http://127.0.0.1[:port]` always are).
    /// Requests without `Origin` (non-browser clients) are accepted. `"*"` accepts any Origin.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Largest POST body accepted, in bytes (default 4 MiB); larger bodies get HTTP 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// On SIGTERM/SIGINT, how long in-flight requests and streams may take to finish, in ms.
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// Interval of SSE keep-alive comments on idle streams, in ms (default 15000).
    #[serde(default = "default_sse_keepalive_ms")]
    pub sse_keepalive_ms: u64,
    /// Open client connections at most; beyond it new connections wait to be accepted
    /// (default 10000). The admin listener has its own budget.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Time a client has to send a request's headers and its whole body, in ms (default 30000);
    /// a slower body gets 408.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Sessions taskgate keeps state for at most (default 100000); when full, sessions idle for
    /// `session_idle_ms` are reclaimed, else a new `initialize` gets 503.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Idle time after which a session's entry may be reclaimed for a new session when the table
    /// is full, in ms (default 3600000).
    #[serde(default = "default_session_idle_ms")]
    pub session_idle_ms: u64,
    /// Threads serving the MCP endpoint (default 0: one per CPU the process may use). Each runs
    /// its own single-threaded runtime with its own listening socket (`SO_REUSEPORT`), so a
    /// client connection and its upstream exchanges stay on one thread (see `http::listen`).
    #[serde(default)]
    pub threads: usize,
    /// Reverse proxies (CIDRs such as `10.0.0.0/8` or `fd00::/8`, or single addresses) whose
    /// `X-Forwarded-For` / RFC 7239 `Forwarded` headers give the client's address (default
    /// none: the TCP peer is the client). See `http::client_addr`.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
}

impl GatewayConfig {
    /// Checks every numeric key against its range in `config/REFERENCE.md`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_ranges(&[
            (
                "gateway.max_body_bytes",
                self.max_body_bytes as u64,
                MIN_BODY_BYTES,
                1 << 30,
            ),
            (
                "gateway.drain_timeout_ms",
                self.drain_timeout_ms,
                1,
                HOUR_MS,
            ),
            (
                "gateway.sse_keepalive_ms",
                self.sse_keepalive_ms,
                10,
                HOUR_MS,
            ),
            (
                "gateway.max_connections",
                self.max_connections as u64,
                1,
                1_000_000,
            ),
            (
                "gateway.request_timeout_ms",
                self.request_timeout_ms,
                100,
                HOUR_MS,
            ),
            (
                "gateway.max_sessions",
                self.max_sessions as u64,
                1,
                10_000_000,
            ),
            (
                "gateway.session_idle_ms",
                self.session_idle_ms,
                1_000,
                30 * 24 * HOUR_MS,
            ),
            ("gateway.threads", self.threads as u64, 0, 1_024),
        ])?;
        self.trusted_proxy_nets().map(|_| ())
    }

    /// `trusted_proxies` as networks (a single address as its /32 or /128); an entry that is
    /// neither a CIDR nor an IP address is refused, naming the key.
    pub fn trusted_proxy_nets(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        self.trusted_proxies
            .iter()
            .map(|entry| {
                let text = entry.trim();
                text.parse::<ipnet::IpNet>()
                    .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| {
                        ConfigError::Invalid(format!(
                            "`gateway.trusted_proxies` entry {entry:?} is not a CIDR (like \"10.0.0.0/8\") or an IP address"
                        ))
                    })
            })
            .collect()
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: default_gateway_listen(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: default_max_body_bytes(),
            drain_timeout_ms: default_drain_timeout_ms(),
            sse_keepalive_ms: default_sse_keepalive_ms(),
            max_connections: default_max_connections(),
            request_timeout_ms: default_request_timeout_ms(),
            max_sessions: default_max_sessions(),
            session_idle_ms: default_session_idle_ms(),
            threads: 0,
            trusted_proxies: Vec::new(),
        }
    }
}

/// `[admin]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of `/healthz`, `/readyz`, `/metrics` and `/admin/*` (default `127.0.0.1:9090`).
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// Name of an environment variable holding a bearer token that `/admin/*` requires
    /// (`/healthz`, `/readyz` and `/metrics` stay open). Unset: no token (bind to loopback).
    #[serde(default)]
    pub token_env: Option<String>,
}

impl AdminConfig {
    /// `token_env`, when given, must name a set, non-empty environment variable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.token_env {
            Some(var) if std::env::var(var).map(|v| v.is_empty()).unwrap_or(true) => {
                Err(ConfigError::Invalid(format!(
                    "admin.token_env: environment variable {var} is not set or empty"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The SHA-256 of the admin token, when one is configured.
    pub fn token_sha256(&self) -> Option<[u8; 32]> {
        use sha2::Digest;
        let token = std::env::var(self.token_env.as_ref()?).ok()?;
        Some(sha2::Sha256::digest(token.as_bytes()).into())
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
            token_env: None,
        }
    }
}

/// `[auth] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication: a task's owner is the client's `Mcp-Session-Id`.
    #[default]
    None,
    /// `Authorization: Bearer <token>` must match a configured token; the owner is its principal.
    Bearer,
    /// OAuth 2.1 resource server: a JWT access token checked against `[auth.oauth]`; the owner is
    /// its issuer + subject (see `src/auth/oauth.rs`).
    Oauth,
}

impl AuthMode {
    /// Whether callers carry principals (`bearer` and `oauth`; not `none`). Every decision that
    /// depends on telling callers apart keys on this, never on one mode by name.
    pub fn identifies_callers(self) -> bool {
        self != AuthMode::None
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `"none"` (default), `"bearer"` or `"oauth"`.
    #[serde(default)]
    pub mode: AuthMode,
    /// `[[auth.token]]`: accepted bearer tokens.
    #[serde(default)]
    pub token: Vec<TokenConfig>,
    /// `[auth.oauth]`: the authorization server whose tokens are accepted (`mode = "oauth"`).
    #[serde(default)]
    pub oauth: Option<super::OAuthConfig>,
}

/// `[[auth.token]]`: one accepted bearer token and the principal it stands for. `Debug` hides
/// the hash (`super::redact`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The principal name (the task owner) this token authenticates.
    pub principal: String,
    /// Lowercase hex SHA-256 of the token.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Name of an environment variable holding the token itself.
    #[serde(default)]
    pub token_env: Option<String>,
}

impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let TokenConfig {
            principal,
            sha256,
            token_env,
        } = self;
        f.debug_struct("TokenConfig")
            .field("principal", principal)
            .field("sha256", &sha256.as_ref().map(|_| Redacted))
            .field("token_env", token_env)
            .finish()
    }
}

pub(super) fn default_max_ttl_ms() -> u64 {
    24 * 60 * 60 * 1000
}
pub(super) fn default_max_live_tasks_per_owner() -> usize {
    100
}
pub(super) fn default_sweep_interval_ms() -> u64 {
    30_000
}
pub(super) fn default_list_page_size() -> usize {
    50
}
pub(super) fn default_release_quiet_ms() -> u64 {
    2_000
}
pub(super) fn default_max_stored_result_bytes() -> u64 {
    1024 * 1024
}

/// `[tasks]`: limits the spec asks receivers to set and document (2025-11-25 tasks: Security).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TasksConfig {
    /// Cap on `params.task.ttl`, in ms: a larger requested ttl is lowered to this before it goes
    /// upstream; a task without ttl, or with ttl `null`, is recorded as expiring after it (default 24 h).
    #[serde(default = "default_max_ttl_ms")]
    pub max_ttl_ms: u64,
    /// Live (non-terminal) tasks one owner may have per upstream; over it creation is refused (default 100).
    /// A live task a 2026-07-28 server makes of a plain `tools/call` over it cannot be refused
    /// before it exists: it is cancelled upstream and the client gets the same `-32029`.
    #[serde(default = "default_max_live_tasks_per_owner")]
    pub max_live_tasks_per_owner: usize,
    /// How often the sweeper removes expired records, in ms (default 30000).
    #[serde(default = "default_sweep_interval_ms")]
    pub sweep_interval_ms: u64,
    /// Tasks per `tasks/list` page (default 50).
    #[serde(default = "default_list_page_size")]
    pub list_page_size: usize,
    /// Quiet window after which a cancelled task's resources count as released, in ms (default 2000).
    #[serde(default = "default_release_quiet_ms")]
    pub release_quiet_ms: u64,
    /// Most task records kept in memory for authorising reads (default 65536; 0 turns the
    /// cache off). See `src/registry/cache.rs`.
    #[serde(default = "default_record_cache_entries")]
    pub record_cache_entries: usize,
    /// Most heap those cached records may hold, in bytes, their stored terminal results included
    /// and, for a record without its result yet, the bytes sled holds for it (default 8 MiB; 0
    /// turns the cache off). See `src/registry/cache.rs`.
    #[serde(default = "default_record_cache_bytes")]
    pub record_cache_bytes: u64,
    /// Largest terminal result kept in a task's record, in bytes of JSON text (default 1 MiB;
    /// 0 turns it off): once a 2026-07-28 `tasks/get` reply of a terminal task passed through,
    /// later `tasks/get` calls for it are answered from the record (stored at rest).
    #[serde(default = "default_max_stored_result_bytes")]
    pub max_stored_result_bytes: u64,
}

impl TasksConfig {
    /// Checks every key against its range in `config/REFERENCE.md` (a zero window or interval
    /// would make the sweeper or the release tracker spin).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let live = self.max_live_tasks_per_owner as u64;
        check_ranges(&[
            ("tasks.max_ttl_ms", self.max_ttl_ms, 1, 365 * 24 * HOUR_MS),
            ("tasks.max_live_tasks_per_owner", live, 1, UNBOUNDED),
            (
                "tasks.sweep_interval_ms",
                self.sweep_interval_ms,
                10,
                24 * HOUR_MS,
            ),
            ("tasks.list_page_size", self.list_page_size as u64, 1, 1000),
            ("tasks.release_quiet_ms", self.release_quiet_ms, 1, HOUR_MS),
            (
                "tasks.record_cache_entries",
                self.record_cache_entries as u64,
                0,
                10_000_000,
            ),
            (
                "tasks.record_cache_bytes",
                self.record_cache_bytes,
                0,
                16 * 1024 * 1024 * 1024,
            ),
            (
                "tasks.max_stored_result_bytes",
                self.max_stored_result_bytes,
                0,
                64 * 1024 * 1024,
            ),
        ])
    }
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            max_ttl_ms: default_max_ttl_ms(),
            max_live_tasks_per_owner: default_max_live_tasks_per_owner(),
            sweep_interval_ms: default_sweep_interval_ms(),
            list_page_size: default_list_page_size(),
            release_quiet_ms: default_release_quiet_ms(),
            record_cache_entries: default_record_cache_entries(),
            record_cache_bytes: default_record_cache_bytes(),
            max_stored_result_bytes: default_max_stored_result_bytes(),
        }
    }
}

fn default_record_cache_entries() -> usize {
    65_536
}

fn default_record_cache_bytes() -> u64 {
    8 * 1024 * 1024
}

pub(super) fn default_upgrade_ttl_ms() -> u64 {
    600_000
}
pub(super) fn default_disconnect_grace_ms() -> u64 {
    5_000
}

/// `[upgrade] on_client_disconnect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnDisconnect {
    /// Cancel the upstream task (after `disconnect_grace_ms`).
    #[default]
    Cancel,
    /// Let the task run to its end upstream; taskgate stops following it.
    Keep,
}

/// `[upgrade]`: plain `tools/call` to a `taskSupport: "required"` tool becomes a task upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeConfig {
    /// Turn plain `tools/call` to `required` tools into tasks (default false).
    #[serde(default)]
    pub enabled: bool,
    /// `params.task.ttl` of upgraded calls, in ms (default 600000).
    #[serde(default = "default_upgrade_ttl_ms")]
    pub ttl_ms: u64,
    /// What happens to the task when the client's stream goes away: `"cancel"` (default) or `"keep"`.
    #[serde(default)]
    pub on_client_disconnect: OnDisconnect,
    /// With `"cancel"`: how long after the disconnect the task is cancelled, in ms (default 5000).
    #[serde(default = "default_disconnect_grace_ms")]
    pub disconnect_grace_ms: u64,
}

impl UpgradeConfig {
    /// Checks every numeric key against its range in `config/REFERENCE.md`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // A grace of 0 is meaningful: cancel as soon as the client is gone.
        check_ranges(&[
            ("upgrade.ttl_ms", self.ttl_ms, 1_000, 365 * 24 * HOUR_MS),
            (
                "upgrade.disconnect_grace_ms",
                self.disconnect_grace_ms,
                0,
                HOUR_MS,
            ),
        ])
    }
}

impl Default for UpgradeConfig {
    fn default() -> Self {
        UpgradeConfig {
            enabled: false,
            ttl_ms: default_upgrade_ttl_ms(),
            on_client_disconnect: OnDisconnect::Cancel,
            disconnect_grace_ms: default_disconnect_grace_ms(),
        }
    }
}

pub(super) fn default_timeout_ms() -> u64 {
    30_000
}
pub(super) fn default_connect_timeout_ms() -> u64 {
    5_000
}
pub(super) fn default_startup_timeout_ms() -> u64 {
    60_000
}
pub(super) fn default_max_message_bytes() -> usize {
    16 * 1024 * 1024
}

/// `[[upstream]]`: one MCP server reached over Streamable HTTP (`url`) or started as a
/// supervised child process speaking JSON-RPC on its stdio (`command`; `src/upstream/stdio/`).
/// `Debug` hides `proxy`'s credentials and the values of `headers` and `env` (`super::redact`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Route name: requests to `/mcp/<name>` go here. Letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// The upstream's MCP endpoint, `http://host[:port]/path` or `https://host[:port]/path`
    /// (TLS, the certificate chain and host name verified; port 80 or 443 when not given);
    /// empty for a `command` upstream (exactly one of the two is set).
    #[serde(default)]
    pub url: String,
    /// For an `https://` `url`: a PEM file of the CA certificate(s) the upstream's certificate
    /// must chain to, trusted instead of the Mozilla roots (a private CA, a self-signed
    /// server's own certificate when it is not a CA certificate: `basicConstraints` `CA:FALSE`).
    /// Absent: the Mozilla roots.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// For an `https://` `url`: the named set of root CAs trusted (`"mozilla"`, the compiled-in
    /// Mozilla roots, or `"system"`, the platform's trust store; see `crate::tls`). Absent:
    /// `"mozilla"` without `ca_file`, none beside it (the file alone); with both, the file's
    /// CAs are trusted beside the set.
    #[serde(default)]
    pub ca_roots: Option<crate::tls::CaRoots>,
    /// For an `https://` `url`: the PEM certificate chain taskgate presents when the upstream
    /// asks for a client certificate (mTLS); set with `client_key_file`.
    #[serde(default)]
    pub client_cert_file: Option<std::path::PathBuf>,
    /// The PEM private key of `client_cert_file`.
    #[serde(default)]
    pub client_key_file: Option<std::path::PathBuf>,
    /// An HTTP proxy every connection to this `url` goes through (`http://[user:password@]host:port`;
    /// a `CONNECT` tunnel; `${VAR}` expands from the environment). Absent: direct (the
    /// `HTTPS_PROXY` family of variables is not read).
    #[serde(default)]
    pub proxy: Option<String>,
    /// A stdio server: the program and its arguments (`["npx", "-y", "pkg"]`), started without
    /// a shell; the program is a path or a name found on `PATH`.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Variables added to a `command` child's environment (`${VAR}` expands from taskgate's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The `command` child's working directory (default: taskgate's).
    #[serde(default)]
    pub cwd: Option<std::path::PathBuf>,
    /// One child for every client (`shared`, the default) or one per client session.
    #[serde(default)]
    pub process: ProcessMode,
    /// Requests in flight on one `command` child at once (default 64); more wait for a slot
    /// within `timeout_ms`. `tasks/cancel`, `notifications/cancelled` and `tasks/result` take none.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Time to the upstream's response headers (and a JSON body), in ms (default 30000). Not applied
    /// to `tasks/result`, to GET streams, or to an SSE response once it has started, except an SSE
    /// answer to `tasks/cancel`, whose whole exchange it bounds (others share that single flight).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// TCP connect timeout, in ms (default 5000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// A `command` child's start-up budget, in ms (default 60000): how long each new child
    /// (first start, restart, a `per_session` child) has to answer its `initialize` (taskgate's,
    /// or a client's forwarded one), instead of `timeout_ms` (a cold `npx -y` or `uv run`
    /// resolves packages first).
    #[serde(default = "default_startup_timeout_ms")]
    pub startup_timeout_ms: u64,
    /// Headers added to every request sent upstream; `${VAR}` expands from the environment.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Forward the client's `Authorization` header upstream (default false: it is taskgate's).
    #[serde(default)]
    pub forward_authorization: bool,
    /// A header that carries the caller's principal upstream (a client's own header of that name
    /// is always removed first); absent: the principal is not sent.
    #[serde(default)]
    pub principal_header: Option<String>,
    /// Largest upstream answer taskgate reads, in bytes (default 16 MiB, at least 1024): a whole
    /// JSON body, or one SSE line or event. A larger one ends that exchange with a JSON-RPC error.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// The protocol era the upstream serves tasks in (default `auto`): see [`UpstreamProtocol`]
    /// and `src/layers/bridge/mod.rs`.
    #[serde(default)]
    pub protocol: UpstreamProtocol,
    /// Who runs a task-augmented `tools/call` (default `upstream`): see [`TaskOwnership`] and
    /// `src/layers/gateway_tasks/mod.rs` (issue 32).
    #[serde(default)]
    pub tasks: TaskOwnership,
}

impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let UpstreamConfig {
            name,
            url,
            ca_file,
            ca_roots,
            client_cert_file,
            client_key_file,
            proxy,
            command,
            env,
            cwd,
            process,
            max_in_flight,
            timeout_ms,
            connect_timeout_ms,
            startup_timeout_ms,
            headers,
            forward_authorization,
            principal_header,
            max_message_bytes,
            protocol,
            tasks,
        } = self;
        f.debug_struct("UpstreamConfig")
            .field("name", name)
            .field("url", &Url(url))
            .field("ca_file", ca_file)
            .field("ca_roots", ca_roots)
            .field("client_cert_file", client_cert_file)
            .field("client_key_file", client_key_file)
            .field("proxy", &proxy.as_deref().map(Url))
            .field("command", &command.as_deref().map(Command))
            .field("env", &Names(env))
            .field("cwd", cwd)
            .field("process", process)
            .field("max_in_flight", max_in_flight)
            .field("timeout_ms", timeout_ms)
            .field("connect_timeout_ms", connect_timeout_ms)
            .field("startup_timeout_ms", startup_timeout_ms)
            .field("headers", &Names(headers))
            .field("forward_authorization", forward_authorization)
            .field("principal_header", principal_header)
            .field("max_message_bytes", max_message_bytes)
            .field("protocol", protocol)
            .field("tasks", tasks)
            .finish()
    }
}

impl UpstreamConfig {
    /// What an `https://` upstream's certificate must chain to (`ca_file`, `ca_roots`).
    pub fn trust(&self) -> crate::tls::Trust<'_> {
        crate::tls::Trust {
            ca_file: self.ca_file.as_deref(),
            ca_roots: self.ca_roots,
        }
    }

    /// The client certificate an `https://` upstream is offered (both files set; the config
    /// check refuses one without the other).
    pub fn client_auth(&self) -> Option<crate::tls::ClientAuth<'_>> {
        crate::tls::ClientAuth::of(
            self.client_cert_file.as_deref(),
            self.client_key_file.as_deref(),
        )
    }
}

/// `upstream.tasks`: who runs the tasks of an upstream's task-augmented `tools/call`s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskOwnership {
    /// The server's own tasks (2025-11-25 `params.task`, 2026-07-28 tasks extension), as
    /// they come: taskgate records, binds, cancels once and audits them.
    #[default]
    Upstream,
    /// taskgate runs them itself for a server without task support (`layers::gateway_tasks`):
    /// it advertises tasks to clients, answers the `CreateTaskResult`, sends the server a plain
    /// `tools/call` and holds it. A server that declares tasks itself keeps its own.
    Gateway,
}

/// `upstream.process`: how many children a `command` upstream runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessMode {
    /// One long-lived child for every client; taskgate maps the ids it writes to it.
    #[default]
    Shared,
    /// One child per client session: started on `initialize`, ended on `DELETE`.
    PerSession,
}

pub(super) fn default_max_in_flight() -> usize {
    64
}

/// `upstream.protocol`: which MCP revision's tasks the upstream speaks, which decides whether
/// 2025-11-25 task requests are bridged to the 2026-07-28 tasks extension (`layers::bridge`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum UpstreamProtocol {
    /// Learned: an `InitializeResult` with `capabilities.tasks` means 2025-11-25; otherwise one
    /// `server/discover` (2026-07-28 server/discover) decides: a result advertising
    /// `capabilities.extensions["io.modelcontextprotocol/tasks"]` means 2026-07-28.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// 2025-11-25: never bridged, never probed.
    #[serde(rename = "2025-11-25")]
    Legacy,
    /// 2026-07-28 with the tasks extension: 2025-11-25 task requests are always bridged.
    #[serde(rename = "2026-07-28")]
    Modern,
}

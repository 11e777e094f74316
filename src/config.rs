//! TOML configuration: schema, defaults and validation.
//!
//! The key names are taskgate's public interface. Unknown keys are rejected with the key and the
//! line named. `${VAR}` in an upstream's `headers` values expands from the environment at load time;
//! a missing variable is an error. `config/REFERENCE.md` documents every key.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The embedded default configuration (`config/taskgate.toml`), used by `serve` without `--config`.
pub const DEFAULT_TOML: &str = include_str!("../config/taskgate.toml");

/// Why a configuration could not be loaded. The message names the file, key and line where known.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax error, unknown key or wrong type (the message carries line and column).
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// A value that parses but is not acceptable (names the key).
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// A number outside its accepted range (`config/REFERENCE.md`): names the key (`section.key`,
    /// or `upstream[i].key`) and, when it is written in the text, its line.
    #[error("invalid configuration: `{key}` = {value}{}: must be {expected}", at_line(.line))]
    OutOfRange {
        /// `section.key`, or `upstream[i].key` for the i-th `[[upstream]]` (from 0).
        key: String,
        /// The value given.
        value: u64,
        /// The accepted range, in words.
        expected: String,
        /// 1-based line of the key in the TOML text, where found.
        line: Option<usize>,
    },
}

fn at_line(line: &Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

/// No upper bound for [`check_range`].
const UNBOUNDED: u64 = u64::MAX;
/// One hour, the upper bound of most intervals and timeouts, in ms.
const HOUR_MS: u64 = 3_600_000;

/// `min <= value <= max` (`max` [`UNBOUNDED`]: no upper bound), else [`ConfigError::OutOfRange`]
/// naming `key` (the line is filled in by [`Config::from_toml_str`]).
fn check_range(key: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    let expected = if max == UNBOUNDED {
        format!("at least {min}")
    } else {
        format!("between {min} and {max}")
    };
    Err(ConfigError::OutOfRange {
        key: key.to_string(),
        value,
        expected,
        line: None,
    })
}

/// [`check_range`] over `(key, value, min, max)` rows, in order.
fn check_ranges(rows: &[(&str, u64, u64, u64)]) -> Result<(), ConfigError> {
    rows.iter()
        .try_for_each(|&(key, value, min, max)| check_range(key, value, min, max))
}

/// The 1-based line where `key` (`section.field` or `upstream[i].field`) is assigned as
/// `field = ...` under its `[section]` (the i-th `[[upstream]]`) header, if it is.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let (section, field) = key.rsplit_once('.')?;
    let (name, index) = match section.split_once('[') {
        Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()?),
        None => (section, 0),
    };
    let (mut inside, mut seen) = (false, 0);
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with('[') {
            let header = t.split('#').next().unwrap_or_default().trim();
            let header = header.trim_matches(|c| c == '[' || c == ']').trim();
            inside = header == name && seen == index;
            seen += usize::from(header == name);
        } else if inside {
            let rest = t.strip_prefix(field).map(str::trim_start);
            if rest.is_some_and(|r| r.starts_with('=')) {
                return Some(n + 1);
            }
        }
    }
    None
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[gateway]`: the MCP listener clients connect to.
    pub gateway: GatewayConfig,
    /// `[admin]`: health, readiness, metrics and the admin API.
    #[serde(default)]
    pub admin: AdminConfig,
    /// `[store]`: where the task registry lives.
    #[serde(default)]
    pub store: StoreConfig,
    /// `[auth]`: who a caller is (the spec's authorization context).
    #[serde(default)]
    pub auth: AuthConfig,
    /// `[tasks]`: limits on task records.
    #[serde(default)]
    pub tasks: TasksConfig,
    /// `[upgrade]`: turning plain `tools/call` into tasks.
    #[serde(default)]
    pub upgrade: UpgradeConfig,
    /// `[[upstream]]`: the MCP servers behind taskgate; the first is the default route `/mcp`.
    #[serde(default)]
    pub upstream: Vec<UpstreamConfig>,
}

fn default_gateway_listen() -> SocketAddr {
    "127.0.0.1:8080".parse().expect("literal address")
}
fn default_admin_listen() -> SocketAddr {
    "127.0.0.1:9090".parse().expect("literal address")
}
fn default_max_body_bytes() -> usize {
    4 * 1024 * 1024
}
fn default_drain_timeout_ms() -> u64 {
    10_000
}
fn default_sse_keepalive_ms() -> u64 {
    15_000
}
fn default_max_connections() -> usize {
    10_000
}
fn default_request_timeout_ms() -> u64 {
    30_000
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
}

impl GatewayConfig {
    /// Checks every numeric key against its range in `config/REFERENCE.md`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_ranges(&[
            (
                "gateway.max_body_bytes",
                self.max_body_bytes as u64,
                1,
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
                1,
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
                1,
                HOUR_MS,
            ),
        ])
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
}

impl AdminConfig {
    /// `[admin]` has no numeric keys; `listen` is checked by parsing.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
        }
    }
}

fn default_store_path() -> PathBuf {
    PathBuf::from("data/taskgate")
}
fn default_cache_capacity_bytes() -> u64 {
    16 * 1024 * 1024
}

/// `[store]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// Directory of the sled database (created if missing; default `data/taskgate`).
    #[serde(default = "default_store_path")]
    pub path: PathBuf,
    /// sled page cache size in bytes (default 16 MiB; bounds the store's share of RSS).
    #[serde(default = "default_cache_capacity_bytes")]
    pub cache_capacity_bytes: u64,
}

impl StoreConfig {
    /// Checks every numeric key against its range in `config/REFERENCE.md`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "store.cache_capacity_bytes",
            self.cache_capacity_bytes,
            1,
            UNBOUNDED,
        )
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: default_store_path(),
            cache_capacity_bytes: default_cache_capacity_bytes(),
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
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `"none"` (default) or `"bearer"`.
    #[serde(default)]
    pub mode: AuthMode,
    /// `[[auth.token]]`: accepted bearer tokens.
    #[serde(default)]
    pub token: Vec<TokenConfig>,
}

/// `[[auth.token]]`: one accepted bearer token and the principal it stands for.
#[derive(Debug, Clone, Deserialize)]
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

fn default_max_ttl_ms() -> u64 {
    24 * 60 * 60 * 1000
}
fn default_max_live_tasks_per_owner() -> usize {
    100
}
fn default_sweep_interval_ms() -> u64 {
    30_000
}
fn default_list_page_size() -> usize {
    50
}
fn default_release_quiet_ms() -> u64 {
    2_000
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
                1,
                24 * HOUR_MS,
            ),
            ("tasks.list_page_size", self.list_page_size as u64, 1, 1000),
            ("tasks.release_quiet_ms", self.release_quiet_ms, 1, HOUR_MS),
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
        }
    }
}

fn default_upgrade_ttl_ms() -> u64 {
    600_000
}
fn default_disconnect_grace_ms() -> u64 {
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
            ("upgrade.ttl_ms", self.ttl_ms, 1, 365 * 24 * HOUR_MS),
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

fn default_timeout_ms() -> u64 {
    30_000
}
fn default_connect_timeout_ms() -> u64 {
    5_000
}
fn default_max_message_bytes() -> usize {
    16 * 1024 * 1024
}

/// `[[upstream]]`: one MCP server reached over Streamable HTTP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Route name: requests to `/mcp/<name>` go here. Letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// The upstream's MCP endpoint, `http://host:port/path`.
    pub url: String,
    /// Time to the upstream's response headers (and a JSON body), in ms (default 30000). Not applied
    /// to `tasks/result`, to GET streams, or to an SSE response once it has started, except an SSE
    /// answer to `tasks/cancel`, whose whole exchange it bounds (others share that single flight).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// TCP connect timeout, in ms (default 5000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Headers added to every request sent upstream; `${VAR}` expands from the environment.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Forward the client's `Authorization` header upstream (default false: it is taskgate's).
    #[serde(default)]
    pub forward_authorization: bool,
    /// Largest upstream answer taskgate reads, in bytes (default 16 MiB, at least 1024): a whole
    /// JSON body, or one SSE line or event. A larger one ends that exchange with a JSON-RPC error.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
}

impl Config {
    /// Parses and validates a configuration from TOML text.
    ///
    /// Errors: [`ConfigError::Toml`] (syntax, unknown key, wrong type; with line and column) or
    /// [`ConfigError::Invalid`] (names the offending key).
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text)?;
        config.validate_and_expand().map_err(|e| match e {
            ConfigError::OutOfRange {
                key,
                value,
                expected,
                line: None,
            } => ConfigError::OutOfRange {
                line: line_of(text, &key),
                key,
                value,
                expected,
            },
            other => other,
        })?;
        Ok(config)
    }

    /// Reads, parses and validates the file at `path`.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml_str(&text).map_err(|e| match e {
            ConfigError::Toml(t) => ConfigError::Invalid(format!("{}: {t}", path.display())),
            other => other,
        })
    }

    /// The embedded default configuration.
    pub fn embedded_default() -> Config {
        Config::from_toml_str(DEFAULT_TOML).expect("the embedded default config is valid")
    }

    fn validate_and_expand(&mut self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.upstream.is_empty() {
            return invalid("at least one [[upstream]] is required".into());
        }
        self.gateway.validate()?;
        self.admin.validate()?;
        self.store.validate()?;
        self.tasks.validate()?;
        self.upgrade.validate()?;
        if self.auth.mode == AuthMode::Bearer {
            if self.auth.token.is_empty() {
                return invalid("auth.mode = \"bearer\" needs at least one [[auth.token]]".into());
            }
            for (i, t) in self.auth.token.iter().enumerate() {
                match (&t.sha256, &t.token_env) {
                    (Some(h), None) => {
                        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                            return invalid(format!(
                                "auth.token[{i}].sha256 must be 64 hex digits (the SHA-256 of the token)"
                            ));
                        }
                    }
                    (None, Some(var)) => {
                        if std::env::var(var).map(|v| v.is_empty()).unwrap_or(true) {
                            return invalid(format!(
                                "auth.token[{i}].token_env: environment variable {var} is not set or empty"
                            ));
                        }
                    }
                    _ => {
                        return invalid(format!(
                            "auth.token[{i}] needs exactly one of sha256 or token_env"
                        ))
                    }
                }
            }
        } else if !self.auth.token.is_empty() {
            return invalid("[[auth.token]] is set but auth.mode is \"none\"".into());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, up) in self.upstream.iter_mut().enumerate() {
            if up.name.is_empty()
                || !up
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return invalid(format!(
                    "upstream[{i}].name {:?} must be non-empty and use only letters, digits, '-', '_', '.'",
                    up.name
                ));
            }
            if !seen.insert(up.name.clone()) {
                return invalid(format!("upstream name {:?} is used twice", up.name));
            }
            let uri: http::Uri = up.url.parse().map_err(|e| {
                ConfigError::Invalid(format!("upstream {:?}: url {:?}: {e}", up.name, up.url))
            })?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                return invalid(format!(
                    "upstream {:?}: url {:?} must be http://host:port/path (https is not supported yet; terminate TLS in front of a sidecar)",
                    up.name, up.url
                ));
            }
            check_range(
                &format!("upstream[{i}].timeout_ms"),
                up.timeout_ms,
                1,
                HOUR_MS,
            )?;
            let key = format!("upstream[{i}].connect_timeout_ms");
            check_range(&key, up.connect_timeout_ms, 1, 5 * 60_000)?;
            let key = format!("upstream[{i}].max_message_bytes");
            check_range(&key, up.max_message_bytes as u64, 1024, 1 << 30)?;
            for (k, v) in up.headers.iter_mut() {
                http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                    ConfigError::Invalid(format!(
                        "upstream {:?}: header name {k:?} is not a valid HTTP header name",
                        up.name
                    ))
                })?;
                *v = expand_env(v).map_err(|var| {
                    ConfigError::Invalid(format!(
                        "upstream {:?}: header {k:?} uses ${{{var}}}, but environment variable {var} is not set",
                        up.name
                    ))
                })?;
                http::HeaderValue::from_str(v).map_err(|_| {
                    ConfigError::Invalid(format!(
                        "upstream {:?}: header {k:?} has a value that is not a valid HTTP header value",
                        up.name
                    ))
                })?;
            }
        }
        Ok(())
    }
}

/// Expands `${VAR}` from the environment. `$$` is a literal `$`. Returns the missing variable's name.
fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('{') {
            let Some(end) = inner.find('}') else {
                return Err(format!("unterminated ${{ in {text:?}"));
            };
            let name = &inner[..end];
            let value = std::env::var(name).map_err(|_| name.to_string())?;
            out.push_str(&value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[gateway]\nlisten = \"127.0.0.1:0\"\n[[upstream]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n";

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded_default();
        assert_eq!(c.upstream[0].name, "default");
        assert_eq!(c.gateway.max_body_bytes, 4 * 1024 * 1024);
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let text = format!("{MINIMAL}bogus = 1\n");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
        assert!(err.contains("line 6"), "{err}");
    }

    #[test]
    fn env_expansion_and_missing_variable() {
        std::env::set_var("TASKGATE_TEST_TOKEN_X", "s3cret");
        assert_eq!(
            expand_env("Bearer ${TASKGATE_TEST_TOKEN_X}").unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(expand_env("a$$b").unwrap(), "a$b");
        let text = format!("{MINIMAL}headers = {{ X-Key = \"${{TASKGATE_TEST_UNSET_Y}}\" }}\n");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains("TASKGATE_TEST_UNSET_Y"), "{err}");
    }

    #[test]
    fn upgrade_section() {
        let text = format!("{MINIMAL}[upgrade]\nenabled = true\non_client_disconnect = \"keep\"\n");
        let c = Config::from_toml_str(&text).unwrap();
        assert!(c.upgrade.enabled);
        assert_eq!(c.upgrade.on_client_disconnect, OnDisconnect::Keep);
        assert_eq!(c.upgrade.ttl_ms, 600_000);
        let text = format!("{MINIMAL}[upgrade]\non_client_disconnect = \"maybe\"\n");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains("maybe"), "{err}");
    }

    /// The field names serde expects in a section, read from its unknown-field error.
    fn fields_of(section_header: &str) -> Vec<String> {
        let text = format!("{section_header}\nzz_not_a_key = 1\n");
        let err = toml::from_str::<Config>(&text).unwrap_err().to_string();
        let expected = err
            .split("expected one of ")
            .nth(1)
            .or_else(|| err.split("expected ").nth(1))
            .unwrap_or_else(|| panic!("no field list in: {err}"));
        expected
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, f)| f.to_string())
            .collect()
    }

    #[test]
    fn reference_lists_every_key() {
        let reference = include_str!("../config/REFERENCE.md");
        let readme = include_str!("../README.md");
        let mut keys = Vec::new();
        for section in fields_of("") {
            let header = match section.as_str() {
                "upstream" => "[[upstream]]".to_string(),
                s => format!("[{s}]"),
            };
            for field in fields_of(&header) {
                keys.push(format!("{section}.{field}"));
            }
        }
        for field in fields_of("[[auth.token]]") {
            keys.push(format!("auth.token.{field}"));
        }
        assert!(keys.len() > 20, "too few keys found: {keys:?}");
        assert!(
            readme.contains("config/REFERENCE.md"),
            "README.md must link the reference"
        );
        for key in &keys {
            assert!(
                reference.contains(&format!("`{key}`")),
                "config/REFERENCE.md does not document `{key}`"
            );
        }
        // And the other way: every documented key exists.
        for line in reference.lines().filter(|l| l.starts_with("| `")) {
            let key = line.split('`').nth(1).unwrap();
            assert!(
                keys.iter().any(|k| k == key) || ["auth.token", "upstream"].contains(&key),
                "config/REFERENCE.md documents `{key}`, which the config does not have"
            );
        }
    }

    #[test]
    fn out_of_range_value_names_its_key_and_line() {
        let text = format!(
            "{MINIMAL}[tasks]\nlist_page_size = 10\n[[upstream]]\nname = \"b\"\nurl = \"http://127.0.0.1:2/mcp\"\ntimeout_ms = 0\n"
        );
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(
            err.contains("`upstream[1].timeout_ms` = 0 (line 11)"),
            "{err}"
        );
        let text = format!("{MINIMAL}[tasks]\nrelease_quiet_ms = 0 # spin\n");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(
            err.contains("`tasks.release_quiet_ms` = 0 (line 7)"),
            "{err}"
        );
        // A key not written as `key = value` under its header is still named, without a line.
        let text = format!("{MINIMAL}[tasks]\n\"list_page_size\" = 1001\n");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains("`tasks.list_page_size` = 1001"), "{err}");
    }

    #[test]
    fn upstream_url_must_be_http() {
        let text = MINIMAL.replace("http://127.0.0.1:1/mcp", "ftp://x/mcp");
        assert!(Config::from_toml_str(&text).is_err());
    }
}

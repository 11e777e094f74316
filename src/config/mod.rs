//! TOML configuration: schema, defaults and validation.
//!
//! The key names are taskgate's public interface. Unknown keys are rejected with the key and the
//! line named. `${VAR}` in an upstream's `headers` values expands from the environment at load time;
//! a missing variable is an error. `config/REFERENCE.md` documents every key.

use serde::Deserialize;
use std::path::{Path, PathBuf};

mod auth;
mod check;
mod proxy;
pub(crate) mod redact;
mod sections;
mod store;
mod telemetry;

pub use auth::*;
use check::*;
pub use proxy::ProxyUrl;
pub use sections::*;
pub use store::*;
pub use telemetry::*;

/// The embedded default configuration (`config/taskgate.toml`), used by `serve` without `--config`.
pub const DEFAULT_TOML: &str = include_str!("../../config/taskgate.toml");

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

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[gateway]`: the MCP listener clients connect to.
    #[serde(default)]
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
    /// `[limits]`: per-principal request rate and concurrency.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `[telemetry]`: OpenTelemetry traces over OTLP/HTTP (off unless an endpoint is set).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[[upstream]]`: the MCP servers behind taskgate; the first is the default route `/mcp`.
    #[serde(default)]
    pub upstream: Vec<UpstreamConfig>,
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
        if listens_overlap(self.gateway.listen, self.admin.listen) {
            return invalid(format!(
                "admin.listen ({}) and gateway.listen ({}) are the same port on the same address: give the admin listener a port of its own",
                self.admin.listen, self.gateway.listen
            ));
        }
        self.store.validate()?;
        self.tasks.validate()?;
        self.upgrade.validate()?;
        self.limits.validate()?;
        self.telemetry.validate()?;
        validate_oauth(&self.auth)?;
        if self.auth.mode == AuthMode::Bearer {
            if self.auth.token.is_empty() {
                return invalid("auth.mode = \"bearer\" needs at least one [[auth.token]]".into());
            }
            let mut hashes = std::collections::HashMap::new();
            for (i, t) in self.auth.token.iter().enumerate() {
                // The principal owns tasks and counts against limits: an empty one (or one a
                // log line or a store key could not hold as it is) names nobody.
                if t.principal.trim().is_empty() || t.principal.chars().any(char::is_control) {
                    return invalid(format!(
                        "auth.token[{i}].principal must be a non-empty name without control characters"
                    ));
                }
                match (&t.sha256, &t.token_env) {
                    (Some(h), None) => {
                        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                            return invalid(format!(
                                "auth.token[{i}].sha256 must be 64 hex digits (the SHA-256 of the token)"
                            ));
                        }
                        // One token, two principals: which one a caller is would depend on
                        // the order of the file.
                        if let Some(first) = hashes.insert(h.to_ascii_lowercase(), i) {
                            return invalid(format!(
                                "auth.token[{i}].sha256 is auth.token[{first}]'s too: one token can name one principal only"
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
            return invalid("[[auth.token]] is set but auth.mode is not \"bearer\"".into());
        }
        let mut seen = std::collections::HashSet::new();
        let keeps_results = self.tasks.max_stored_result_bytes > 0;
        for (i, up) in self.upstream.iter_mut().enumerate() {
            if up.tasks == sections::TaskOwnership::Gateway && !keeps_results {
                // A gateway task's result lives only in its record: with none kept, every
                // task with a result would end `failed` (break-tasks M4, review 17 #8).
                return invalid(format!(
                    "upstream {:?}: tasks = \"gateway\" keeps each task's result in its record, but tasks.max_stored_result_bytes = 0 keeps none (every such task would fail): raise it, or remove tasks = \"gateway\"",
                    up.name
                ));
            }
            // `.` and `..` are path segments clients' URL handling removes (`/mcp/..`), so
            // such an upstream could not be reached at `/mcp/<name>`.
            if up.name.is_empty()
                || up.name.bytes().all(|b| b == b'.')
                || !up
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return invalid(format!(
                    "upstream[{i}].name {:?} must use only letters, digits, '-', '_', '.', and not only dots",
                    up.name
                ));
            }
            if !seen.insert(up.name.clone()) {
                return invalid(format!("upstream name {:?} is used twice", up.name));
            }
            if up.command.is_some() {
                validate_command(i, up)?;
            } else {
                let uri: http::Uri = up.url.parse().map_err(|e| {
                    ConfigError::Invalid(format!(
                        "upstream {:?}: url {:?}: {e}",
                        up.name,
                        redact_userinfo(&up.url)
                    ))
                })?;
                let https = uri.scheme_str() == Some("https");
                if !(https || uri.scheme_str() == Some("http")) || uri.authority().is_none() {
                    return invalid(format!(
                        "upstream {:?}: url {:?} must be http://host[:port]/path or https://host[:port]/path",
                        up.name, redact_userinfo(&up.url)
                    ));
                }
                // `user:password@` would go up in `Host` (the authority as written) and sit in
                // the file: credentials belong in `headers`, read from the environment.
                if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
                    return invalid(format!(
                        "upstream {:?}: url {:?} has credentials (user:password@) in it; send them in a header instead: [upstream.headers] Authorization = \"Basic ${{UPSTREAM_BASIC}}\" (or Bearer), read from the environment",
                        up.name, redact_userinfo(&up.url)
                    ));
                }
                if let Some(proxy) = up.proxy.as_mut() {
                    check_proxy(&up.name, proxy)?;
                }
                if uri.port_u16() == Some(0) {
                    return invalid(format!(
                        "upstream {:?}: url {:?} has port 0, which no server listens on",
                        up.name,
                        redact_userinfo(&up.url)
                    ));
                }
                if https {
                    check_upstream_tls(i, up, &uri)?;
                } else if let Some(key) = tls_key_set(up) {
                    return invalid(format!(
                        "upstream {:?}: {key} is for an https:// url",
                        up.name
                    ));
                }
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
            if let Some(h) = &up.principal_header {
                http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                    ConfigError::Invalid(format!(
                        "upstream {:?}: principal_header {h:?} is not a valid HTTP header name",
                        up.name
                    ))
                })?;
            }
            for (k, v) in up.headers.iter_mut() {
                let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                    ConfigError::Invalid(format!(
                        "upstream {:?}: header name {k:?} is not a valid HTTP header name",
                        up.name
                    ))
                })?;
                if RESERVED_UPSTREAM_HEADERS.contains(&name.as_str()) {
                    return invalid(format!(
                        "upstream {:?}: header {k:?} is set by taskgate itself (the message's framing, the connection, or the session it routes) and cannot be configured",
                        up.name
                    ));
                }
                *v = expand_env(v).map_err(|e| {
                    ConfigError::Invalid(format!("upstream {:?}: header {k:?} {e}", up.name))
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

/// Header fields `upstream.headers` may not set: each request's own framing, the connection's
/// (hop-by-hop, RFC 9110 §7.6.1) and the `Mcp-Session-Id` taskgate routes; one configured would
/// be dropped or would break every exchange.
const RESERVED_UPSTREAM_HEADERS: [&str; 9] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "mcp-session-id",
];

/// `url` with the user information of its authority (`user:password@`) replaced by `***@`, so an
/// error that quotes the url does not print the password.
fn redact_userinfo(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    match url[start..end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    }
}

/// `upstream.proxy`: `${VAR}` expanded in place, then a usable `http://[user:password@]host:port`
/// ([`ProxyUrl`]). Errors never quote the value: it may hold a password.
fn check_proxy(name: &str, proxy: &mut String) -> Result<(), ConfigError> {
    *proxy = expand_env(proxy)
        .map_err(|e| ConfigError::Invalid(format!("upstream {name:?}: proxy {e}")))?;
    ProxyUrl::parse(proxy)
        .map(|_| ())
        .map_err(|e| ConfigError::Invalid(format!("upstream {name:?}: proxy {e}")))
}

/// The first TLS key an upstream sets (`ca_file`, `ca_roots`, `client_cert_file`,
/// `client_key_file`): none is for an `http://` url or a `command`.
fn tls_key_set(up: &UpstreamConfig) -> Option<&'static str> {
    [
        ("ca_file", up.ca_file.is_some()),
        ("ca_roots", up.ca_roots.is_some()),
        ("client_cert_file", up.client_cert_file.is_some()),
        ("client_key_file", up.client_key_file.is_some()),
    ]
    .into_iter()
    .find_map(|(key, set)| set.then_some(key))
}

/// An `https://` upstream's TLS settings: its host can be checked against a certificate (a DNS
/// name or an IP address); its roots (`ca_file`, `ca_roots = "system"`: the platform's store
/// must yield a certificate) and its client certificate, when set, load into rustls; a client
/// certificate comes with its key and a key with its certificate.
fn check_upstream_tls(i: usize, up: &UpstreamConfig, uri: &http::Uri) -> Result<(), ConfigError> {
    let host = upstream_host(uri);
    rustls_pki_types::ServerName::try_from(host).map_err(|e| {
        ConfigError::Invalid(format!(
            "upstream {:?}: host {host:?} of an https:// url cannot be checked against a certificate: {e}",
            up.name
        ))
    })?;
    match (&up.client_cert_file, &up.client_key_file) {
        (Some(_), None) => {
            return Err(ConfigError::Invalid(format!(
                "upstream {:?}: client_cert_file needs client_key_file (its private key)",
                up.name
            )))
        }
        (None, Some(_)) => {
            return Err(ConfigError::Invalid(format!(
                "upstream {:?}: client_key_file needs client_cert_file (the certificate it is the key of)",
                up.name
            )))
        }
        _ => {}
    }
    // Only what reads files or the system store: the Mozilla roots alone need no check.
    if up.ca_file.is_some() || up.ca_roots.is_some() || up.client_cert_file.is_some() {
        crate::tls::client_config(&format!("upstream[{i}]"), up.trust(), up.client_auth(), &[])
            .map_err(ConfigError::Invalid)?;
    }
    Ok(())
}

/// The host of an upstream's `url` as a certificate names it: without an IPv6 address's
/// brackets.
pub fn upstream_host(uri: &http::Uri) -> &str {
    uri.host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
}

/// The port an upstream's `url` connects to: its own, else 443 for `https://` and 80 for
/// `http://`.
pub fn upstream_port(uri: &http::Uri) -> u16 {
    uri.port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        })
}

/// The `host:port` an upstream's `url` connects to ([`upstream_port`]).
pub fn upstream_authority(uri: &http::Uri) -> String {
    let port = upstream_port(uri);
    match uri.host() {
        Some(host) => format!("{host}:{port}"),
        None => format!(":{port}"),
    }
}

/// A `command` upstream (`src/upstream/stdio/`): no `url`, TLS key or `proxy` beside it, a program
/// that exists and is executable (a path, or a name found on `PATH`), `env` expanded, `cwd` a
/// directory, `startup_timeout_ms` and `max_in_flight` in range.
fn validate_command(i: usize, up: &mut UpstreamConfig) -> Result<(), ConfigError> {
    let name = up.name.clone();
    let invalid = |m: String| ConfigError::Invalid(format!("upstream {name:?}: {m}"));
    if !up.url.is_empty() {
        return Err(invalid("set either url or command, not both".into()));
    }
    if let Some(key) = tls_key_set(up) {
        return Err(invalid(format!("{key} is for an https:// url")));
    }
    if up.proxy.is_some() {
        return Err(invalid(
            "proxy is for a url upstream (a command's child makes its own connections)".into(),
        ));
    }
    let Some(program) = up.command.as_ref().and_then(|c| c.first()) else {
        return Err(invalid(
            "command must name a program: command = [\"program\", \"arg\", ...]".into(),
        ));
    };
    // A relative path is the child's: against its `cwd` (the transport starts it so).
    let located = match &up.cwd {
        Some(cwd) if program.contains('/') && Path::new(program).is_relative() => {
            cwd.join(program).to_string_lossy().into_owned()
        }
        _ => program.clone(),
    };
    if let Err(why) = find_program(&located) {
        return Err(invalid(format!("command {program:?}: {why}")));
    }
    for (k, v) in up.env.iter_mut() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(invalid(format!(
                "env name {k:?} is not a valid variable name"
            )));
        }
        *v = expand_env(v).map_err(|e| invalid(format!("env {k:?} {e}")))?;
    }
    if let Some(cwd) = &up.cwd {
        if !cwd.is_dir() {
            return Err(invalid(format!("cwd {} is not a directory", cwd.display())));
        }
    }
    check_range(
        &format!("upstream[{i}].startup_timeout_ms"),
        up.startup_timeout_ms,
        1,
        HOUR_MS,
    )?;
    check_range(
        &format!("upstream[{i}].max_in_flight"),
        up.max_in_flight as u64,
        1,
        65_536,
    )
}

/// The executable `program` names: a path (with a `/`) that is an executable file, or the
/// first executable file of that name in a `PATH` directory. Errors say why not.
pub fn find_program(program: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if !path.exists() {
            Err("no such file".into())
        } else if executable(&path) {
            Ok(path)
        } else {
            Err("not an executable file".into())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| "not found on PATH (or not executable)".into())
}

/// Whether two listen addresses would take the same socket: the same port (not 0: each 0 is
/// a port of its own), on the same address or where either is the unspecified one
/// (`0.0.0.0`, `[::]`: every address).
fn listens_overlap(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Why a value's `${VAR}` could not be expanded ([`expand_env`]); shown after the key it is
/// in ("header \"X\" uses ${A}, but …"). Never quotes the value: it may hold a secret.
#[derive(Debug, PartialEq)]
enum EnvError {
    /// `${NAME}` names a variable that is not set (or not UTF-8).
    Unset(String),
    /// A `${` without its `}`.
    Unterminated,
    /// `${}`.
    EmptyName,
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvError::Unset(var) => write!(
                f,
                "uses ${{{var}}}, but environment variable {var} is not set"
            ),
            EnvError::Unterminated => {
                f.write_str("has a `${` without its `}` (write `$$` for a literal `$`)")
            }
            EnvError::EmptyName => f.write_str("has `${}`: a variable name is missing"),
        }
    }
}

/// Expands `${VAR}` from the environment. `$$` is a literal `$`.
fn expand_env(text: &str) -> Result<String, EnvError> {
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
                return Err(EnvError::Unterminated);
            };
            let name = &inner[..end];
            if name.is_empty() {
                return Err(EnvError::EmptyName);
            }
            let value = std::env::var(name).map_err(|_| EnvError::Unset(name.to_string()))?;
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
mod tests;

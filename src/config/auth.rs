//! `[auth.oauth]` (taskgate as an OAuth 2.1 resource server) and `[limits]` (per-principal
//! request rate and concurrency), with their checks. `config/REFERENCE.md` documents each key.

use super::check::*;
use super::{AuthConfig, AuthMode, ConfigError};
use serde::Deserialize;

/// Signature algorithms accepted by default: every asymmetric one `jsonwebtoken` verifies.
/// HMAC (`HS*`) is never accepted (a resource server has no shared secret with the issuer) and
/// `none` is not an algorithm at all.
pub const DEFAULT_ALGORITHMS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

fn default_principal_claim() -> String {
    "sub".into()
}
fn default_algorithms() -> Vec<String> {
    DEFAULT_ALGORITHMS.iter().map(|a| a.to_string()).collect()
}
fn default_leeway_s() -> u64 {
    30
}
fn default_jwks_cache_ms() -> u64 {
    5 * 60_000
}
fn default_jwks_min_refresh_ms() -> u64 {
    10_000
}
fn default_fetch_timeout_ms() -> u64 {
    5_000
}
fn default_token_types() -> Vec<String> {
    vec!["at+jwt".into(), "application/at+jwt".into()]
}

/// Least `auth.oauth.jwks_min_refresh_ms`: tokens with unknown key ids (anyone can mint them)
/// make taskgate fetch the issuer's key set at most this often.
pub const MIN_JWKS_REFRESH_MS: u64 = 1_000;

/// `[auth.oauth]`: whose access tokens are accepted and for which resource (MCP 2025-11-25
/// basic/authorization; RFC 9068 JWT access tokens; RFC 8707 audience).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The authorization server's issuer identifier: a token's `iss` must equal it; its metadata
    /// (RFC 8414, else OpenID Connect Discovery) is found from it. `https://`, or `http://` on a
    /// loopback host.
    pub issuer: String,
    /// This resource's identifier (RFC 8707, RFC 9728 `resource`): a token's `aud` must contain it.
    /// An absolute `http(s)://` URL, e.g. `https://mcp.example.com/mcp`.
    pub audience: String,
    /// The issuer's JWK Set URL; when absent it is discovered from the issuer's metadata.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// Scopes every token must carry (`scope`, space-separated, or `scp`); else 403.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// The claim naming the caller; the principal is `<issuer>#<claim value>`.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// Accepted JWS `alg` values (a subset of [`DEFAULT_ALGORITHMS`]).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds (0 to 300).
    #[serde(default = "default_leeway_s")]
    pub leeway_s: u64,
    /// How long a fetched key set is used before it is fetched again, in ms.
    #[serde(default = "default_jwks_cache_ms")]
    pub jwks_cache_ms: u64,
    /// Least time between two fetches of the key set (a token with an unknown `kid` triggers one
    /// at most this often), in ms.
    #[serde(default = "default_jwks_min_refresh_ms")]
    pub jwks_min_refresh_ms: u64,
    /// Time limit of one metadata or key-set fetch, in ms.
    #[serde(default = "default_fetch_timeout_ms")]
    pub fetch_timeout_ms: u64,
    /// Accepted JOSE `typ` header values, compared case-insensitively (default `at+jwt` and
    /// `application/at+jwt`, RFC 9068 §4). Add `"JWT"` for an authorization server that does not
    /// mark its access tokens (a token without `typ` counts as `JWT`); that also accepts its
    /// ID tokens when their `aud` names this resource.
    #[serde(default = "default_token_types")]
    pub token_types: Vec<String>,
}

/// Default of `limits.max_get_streams`: GET streams one principal may hold open at once. Well
/// below an upstream's 1,024 pooled connections and `gateway.max_connections`, well above what
/// one client needs (one stream per session).
pub const DEFAULT_MAX_GET_STREAMS: u32 = 64;
/// Default of `limits.max_sessions_per_principal`, as a share of `gateway.max_sessions`: one
/// principal holds at most this fraction (1/10) of the session table, but at least
/// [`MIN_DEFAULT_SESSIONS_PER_PRINCIPAL`] sessions (or the whole table when it is smaller).
pub const DEFAULT_SESSION_SHARE: usize = 10;
/// Least default of `limits.max_sessions_per_principal`, in sessions.
pub const MIN_DEFAULT_SESSIONS_PER_PRINCIPAL: usize = 100;
/// Default of `limits.auth_failures_per_minute`: failed authentications per client address.
pub const DEFAULT_AUTH_FAILURES_PER_MINUTE: u32 = 60;
/// Default of `limits.auth_failures_burst`.
pub const DEFAULT_AUTH_FAILURES_BURST: u32 = 20;

/// `[limits]`: per-principal limits, in every `[auth] mode`. Without a principal (`mode =
/// "none"`) the request rate and in-flight limits key on one shared principal, and the GET
/// stream and session caps on the client's address ([`crate::exchange::Tenant`]). The rate and
/// in-flight limits are off when absent; the others have defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Sustained requests per second per principal (a token bucket refilled at this rate).
    #[serde(default)]
    pub requests_per_second: Option<u32>,
    /// Bucket size: requests a principal may make at once (default: `requests_per_second`).
    #[serde(default)]
    pub burst: Option<u32>,
    /// POST requests one principal may have in flight at once.
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    /// GET streams (the standalone SSE stream of 2025-11-25 basic/transports) one principal may
    /// hold open at once, over all upstreams (default [`DEFAULT_MAX_GET_STREAMS`]); one more is
    /// refused 429 before it reaches the upstream.
    #[serde(default)]
    pub max_get_streams: Option<u32>,
    /// Sessions one principal may hold in the session table (default: a tenth of
    /// `gateway.max_sessions`, at least 100 or the whole table); a new one past it reclaims that principal's own
    /// least recently used session, never another principal's.
    #[serde(default)]
    pub max_sessions_per_principal: Option<u32>,
    /// Failed authentications (an invalid token) one client address may cause per minute,
    /// sustained (default [`DEFAULT_AUTH_FAILURES_PER_MINUTE`]; `0` turns the limit off); past
    /// it and `auth_failures_burst`, the address's requests are answered 429 without a token
    /// check until the bucket refills.
    #[serde(default)]
    pub auth_failures_per_minute: Option<u32>,
    /// Failed authentications one client address may cause at once (default
    /// [`DEFAULT_AUTH_FAILURES_BURST`]).
    #[serde(default)]
    pub auth_failures_burst: Option<u32>,
}

impl LimitsConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let rows = [
            ("limits.requests_per_second", self.requests_per_second, 1),
            ("limits.burst", self.burst, 1),
            ("limits.max_in_flight", self.max_in_flight, 1),
            ("limits.max_get_streams", self.max_get_streams, 1),
            (
                "limits.auth_failures_per_minute",
                self.auth_failures_per_minute,
                0,
            ),
            ("limits.auth_failures_burst", self.auth_failures_burst, 1),
        ];
        for (key, v, min) in rows {
            if let Some(v) = v {
                check_range(key, v.into(), min, 1_000_000)?;
            }
        }
        if let Some(v) = self.max_sessions_per_principal {
            check_range("limits.max_sessions_per_principal", v.into(), 1, 10_000_000)?;
        }
        if self.burst.is_some() && self.requests_per_second.is_none() {
            return Err(ConfigError::Invalid(
                "limits.burst needs limits.requests_per_second".into(),
            ));
        }
        Ok(())
    }

    /// `limits.max_sessions_per_principal`, or its default for a table of `max_sessions`.
    pub fn sessions_per_principal(&self, max_sessions: usize) -> usize {
        match self.max_sessions_per_principal {
            Some(n) => n as usize,
            None => (max_sessions / DEFAULT_SESSION_SHARE)
                .max(MIN_DEFAULT_SESSIONS_PER_PRINCIPAL)
                .min(max_sessions)
                .max(1),
        }
    }
}

/// `Ok` for an `https://` URL, or an `http://` one whose host is loopback (`localhost`,
/// `127.0.0.0/8`, `[::1]`); else why not.
pub fn https_or_loopback(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let Some(host) = uri.host() else {
        return Err(format!("{url:?} has no host"));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if loopback => Ok(uri),
        Some("http") => Err(format!(
            "{url:?} must use https:// (http:// only on a loopback host)"
        )),
        _ => Err(format!("{url:?} must be an https:// URL")),
    }
}

/// Checks `[auth.oauth]` against `[auth] mode`.
pub(super) fn validate_oauth(auth: &AuthConfig) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    let Some(o) = &auth.oauth else {
        if auth.mode == AuthMode::Oauth {
            return invalid("auth.mode = \"oauth\" needs an [auth.oauth] section".into());
        }
        return Ok(());
    };
    if auth.mode != AuthMode::Oauth {
        return invalid("[auth.oauth] is set but auth.mode is not \"oauth\"".into());
    }
    let issuer = https_or_loopback(&o.issuer)
        .map_err(|e| ConfigError::Invalid(format!("auth.oauth.issuer: {e}")))?;
    if issuer.query().is_some() || o.issuer.contains('#') {
        return invalid("auth.oauth.issuer must have no query or fragment (RFC 8414)".into());
    }
    let aud: http::Uri = o
        .audience
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("auth.oauth.audience {:?}: {e}", o.audience)))?;
    if !matches!(aud.scheme_str(), Some("http" | "https")) || aud.host().is_none() {
        return invalid(format!(
            "auth.oauth.audience {:?} must be an absolute http(s):// URL (this resource's identifier)",
            o.audience
        ));
    }
    if let Some(j) = &o.jwks_url {
        https_or_loopback(j)
            .map_err(|e| ConfigError::Invalid(format!("auth.oauth.jwks_url: {e}")))?;
    }
    if o.algorithms.is_empty() {
        return invalid("auth.oauth.algorithms must name at least one algorithm".into());
    }
    for a in &o.algorithms {
        if !DEFAULT_ALGORITHMS.contains(&a.as_str()) {
            return invalid(format!(
                "auth.oauth.algorithms: {a:?} is not accepted; use some of {DEFAULT_ALGORITHMS:?} (never HS* or none)"
            ));
        }
    }
    if o.token_types.is_empty() || o.token_types.iter().any(|t| t.trim().is_empty()) {
        return invalid(
            "auth.oauth.token_types must name at least one JOSE typ, none empty (e.g. [\"at+jwt\"])"
                .into(),
        );
    }
    if o.principal_claim.is_empty() {
        return invalid("auth.oauth.principal_claim must not be empty".into());
    }
    if let Some(s) = o
        .required_scopes
        .iter()
        .find(|s| s.is_empty() || s.contains([' ', '"', '\\']))
    {
        return invalid(format!(
            "auth.oauth.required_scopes: {s:?} is not a scope token"
        ));
    }
    check_ranges(&[
        ("auth.oauth.leeway_s", o.leeway_s, 0, 300),
        (
            "auth.oauth.jwks_cache_ms",
            o.jwks_cache_ms,
            1_000,
            24 * HOUR_MS,
        ),
        (
            "auth.oauth.jwks_min_refresh_ms",
            o.jwks_min_refresh_ms,
            MIN_JWKS_REFRESH_MS,
            HOUR_MS,
        ),
        ("auth.oauth.fetch_timeout_ms", o.fetch_timeout_ms, 1, 60_000),
    ])
}

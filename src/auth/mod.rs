//! Who a caller is: `[auth]` turns request headers into a [`Principal`], the spec's
//! "authorization context" that tasks are bound to (2025-11-25 tasks: Security Considerations).
//!
//! - `mode = "none"`: every caller is [`Principal::Anonymous`]; tasks are then bound to the
//!   client's `Mcp-Session-Id`, which is weaker: anyone holding a session id acts as its owner.
//! - `mode = "bearer"` ([`bearer`]): `Authorization: Bearer <token>` must match a configured token
//!   (compared by SHA-256 digest); the principal is that token's `principal`.
//! - `mode = "oauth"` ([`oauth`]): the bearer token is a JWT access token from `auth.oauth.issuer`
//!   for `auth.oauth.audience`; the principal is `<iss>#<sub>`. taskgate serves its RFC 9728
//!   protected-resource metadata ([`Authenticator::metadata`]) and names it in every 401.
//!
//! A refusal ([`Refusal`]) is HTTP 401 (no or bad credentials) or 403 (missing scope) with a
//! `WWW-Authenticate` challenge (RFC 6750 §3), answered before any other check of the request.

pub mod bearer;
mod fetch;
mod jwks;
pub mod oauth;

use crate::config::{AuthConfig, AuthMode};
use crate::exchange::Principal;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use http::StatusCode;
use std::sync::Arc;

/// The path of the protected-resource metadata (RFC 9728 §3); also served with a route's path
/// appended (`/.well-known/oauth-protected-resource/mcp/<name>`, RFC 9728 §3.1).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Why a request's credentials were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalKind {
    /// No `Authorization: Bearer` credentials: 401 without an error code (RFC 6750 §3.1).
    Missing,
    /// A token that is not valid (malformed, unknown, expired, wrong issuer, audience or
    /// signature): 401 `error="invalid_token"`.
    InvalidToken,
    /// A valid token without a required scope: 403 `error="insufficient_scope"` naming the
    /// scopes needed (space-separated).
    InsufficientScope(String),
    /// The token could not be checked because the issuer's signing keys cannot be fetched
    /// (JWKS outage): 503 with `Retry-After`, not the caller's fault (issue 29 #18).
    Unavailable,
}

/// A refused request: what kind of refusal and a message for the JSON-RPC error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The kind (decides status and challenge).
    pub kind: RefusalKind,
    /// A one-line explanation, starting with `Unauthorized:` or `Forbidden:`.
    pub message: String,
}

impl Refusal {
    /// HTTP 401, 403 for [`RefusalKind::InsufficientScope`], 503 for
    /// [`RefusalKind::Unavailable`].
    pub fn status(&self) -> StatusCode {
        match self.kind {
            RefusalKind::InsufficientScope(_) => StatusCode::FORBIDDEN,
            RefusalKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::UNAUTHORIZED,
        }
    }
}

enum Mode {
    None,
    Bearer(bearer::StaticTokens),
    OAuth(Arc<oauth::OAuth>),
}

/// Checks credentials against `[auth]`.
pub struct Authenticator {
    mode: Mode,
}

impl Authenticator {
    /// Builds the checker from a validated `[auth]` section (reads `token_env` variables now).
    /// Errors only for `oauth` when its HTTPS client cannot be set up.
    pub fn new(config: &AuthConfig) -> Result<Authenticator, String> {
        let mode = match config.mode {
            AuthMode::None => Mode::None,
            AuthMode::Bearer => Mode::Bearer(bearer::StaticTokens::new(&config.token)),
            AuthMode::Oauth => {
                let o = config
                    .oauth
                    .as_ref()
                    .ok_or("auth.mode = \"oauth\" needs [auth.oauth]")?;
                Mode::OAuth(Arc::new(oauth::OAuth::new(o)?))
            }
        };
        Ok(Authenticator { mode })
    }

    /// In `oauth` mode, starts fetching the issuer's keys in the background (needs a runtime).
    pub fn warm_up(&self) {
        if let Mode::OAuth(o) = &self.mode {
            let o = o.clone();
            tokio::spawn(async move { o.warm_up().await });
        }
    }

    /// The caller's principal for a request to `path`, or why the request is refused. In
    /// `oauth` mode a token is for this resource when its `aud` holds `auth.oauth.audience` or
    /// the resource identifier of the route `path` names ([`resource_of`]; RFC 8707, RFC 9728
    /// §3.3: a client that read `/mcp/<name>`'s metadata asks for a token for that resource).
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<Principal, Refusal> {
        let token = match &self.mode {
            Mode::None => return Ok(Principal::Anonymous),
            _ => bearer_token(headers)?,
        };
        match &self.mode {
            Mode::None => Ok(Principal::Anonymous),
            Mode::Bearer(tokens) => tokens.check(token),
            Mode::OAuth(o) => {
                o.verify(
                    token,
                    route_path(path)
                        .map(|r| resource_of(o.audience(), r))
                        .as_deref(),
                )
                .await
            }
        }
    }

    /// The `WWW-Authenticate` challenge of `refusal` for a request to `path` (RFC 6750 §3; in
    /// `oauth` mode with `resource_metadata`, RFC 9728 §5.1).
    pub fn challenge(&self, refusal: &Refusal, path: &str) -> HeaderValue {
        let mut v = match &self.mode {
            Mode::OAuth(o) => {
                let mut v = format!(
                    "Bearer resource_metadata=\"{}\"",
                    metadata_url(o.audience(), path)
                );
                // The scopes to ask for (MCP 2025-11-25 authorization: scope selection).
                if !o.required_scopes().is_empty()
                    && !matches!(refusal.kind, RefusalKind::InsufficientScope(_))
                {
                    v.push_str(&format!(
                        ", scope=\"{}\"",
                        quotable(&o.required_scopes().join(" "))
                    ));
                }
                v
            }
            _ => "Bearer realm=\"taskgate\"".to_string(),
        };
        match &refusal.kind {
            RefusalKind::Missing | RefusalKind::Unavailable => {}
            RefusalKind::InvalidToken => v.push_str(&format!(
                ", error=\"invalid_token\", error_description=\"{}\"",
                quotable(&refusal.message)
            )),
            RefusalKind::InsufficientScope(scope) => v.push_str(&format!(
                ", error=\"insufficient_scope\", scope=\"{}\"",
                quotable(scope)
            )),
        }
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    /// The protected-resource metadata document (RFC 9728 §2) when `mode = "oauth"`, for the
    /// metadata URL's `suffix` (what follows [`METADATA_PATH`]: empty, `/mcp` or `/mcp/<name>`):
    /// `{"resource", "authorization_servers", "scopes_supported"?, "bearer_methods_supported"}`.
    /// `resource` is the identifier the URL was built from (RFC 9728 §3.3 requires them to
    /// match): `auth.oauth.audience` for the bare URL, [`resource_of`] the route otherwise.
    pub fn metadata(&self, suffix: &str) -> Option<Bytes> {
        let Mode::OAuth(o) = &self.mode else {
            return None;
        };
        let resource = match route_path(suffix) {
            Some(route) => resource_of(o.audience(), route),
            None => o.audience().to_string(),
        };
        let mut doc = serde_json::json!({
            "resource": resource,
            "authorization_servers": [o.issuer()],
            "bearer_methods_supported": ["header"],
            "resource_name": "taskgate",
        });
        if !o.required_scopes().is_empty() {
            doc["scopes_supported"] = serde_json::json!(o.required_scopes());
        }
        Some(Bytes::from(doc.to_string()))
    }
}

/// The token of `Authorization: Bearer <token>` (RFC 6750 §2.1).
fn bearer_token(headers: &HeaderMap) -> Result<&str, Refusal> {
    let missing = |m: &str| Refusal {
        kind: RefusalKind::Missing,
        message: m.to_string(),
    };
    let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return Err(missing(
            "Unauthorized: an Authorization: Bearer <token> header is required",
        ));
    };
    let value = value.trim();
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(missing(
            "Unauthorized: the Authorization header must use the Bearer scheme",
        ));
    }
    match token.trim() {
        "" => Err(missing(
            "Unauthorized: the Authorization: Bearer header carries no token",
        )),
        token => Ok(token),
    }
}

/// `<origin of audience>/.well-known/oauth-protected-resource<route path>` for a request to
/// `path` (`/mcp` or `/mcp/<name>` are kept; any other path gives the bare metadata URL; RFC
/// 9728 §3.1: the well-known segment goes between the host and the resource's path).
pub fn metadata_url(audience: &str, path: &str) -> String {
    format!(
        "{}{METADATA_PATH}{}",
        origin_of(audience),
        route_path(path).unwrap_or("")
    )
}

/// The resource identifier of the route `route` (`/mcp` or `/mcp/<name>`): the origin of
/// `audience` followed by the route, e.g. `https://mcp.example.com/mcp/files`.
pub fn resource_of(audience: &str, route: &str) -> String {
    format!("{}{route}", origin_of(audience))
}

/// `path` without a trailing `/` when it names an MCP route (`/mcp`, `/mcp/<name>` with a name
/// of ASCII letters, digits, `-`, `_` and `.`); `None` for any other path.
fn route_path(path: &str) -> Option<&str> {
    let path = path.trim_end_matches('/');
    let route = path == "/mcp"
        || path.strip_prefix("/mcp/").is_some_and(|n| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        });
    route.then_some(path)
}

/// `scheme://authority` of `url` (all of it when it has no path).
fn origin_of(url: &str) -> &str {
    match url.find("://").map(|i| i + 3) {
        Some(start) => match url[start..].find('/') {
            Some(p) => &url[..start + p],
            None => url,
        },
        None => url,
    }
}

/// Text safe inside a quoted-string of a challenge (no `"`, `\` or control characters).
fn quotable(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            c if c.is_ascii_graphic() || c == ' ' => c,
            _ => '?',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_header_without_a_token_says_so() {
        let token = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, v.parse().unwrap());
            bearer_token(&h).map(str::to_string).map_err(|r| r.message)
        };
        assert_eq!(token("Bearer abc"), Ok("abc".to_string()));
        assert_eq!(token("bearer  abc "), Ok("abc".to_string()));
        for empty in ["Bearer", "Bearer ", "bearer   "] {
            let why = token(empty).unwrap_err();
            assert!(why.contains("carries no token"), "{empty:?}: {why}");
        }
        for other in ["Basic YWxhZGRpbjpvcGVu", "Token abc", "abc"] {
            let why = token(other).unwrap_err();
            assert!(
                why.contains("must use the Bearer scheme"),
                "{other:?}: {why}"
            );
        }
    }

    #[test]
    fn metadata_url_keeps_only_route_paths() {
        let aud = "https://mcp.example.com/base/mcp";
        let at = |p| metadata_url(aud, p);
        assert_eq!(
            at("/mcp"),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            at("/mcp/files/"),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp/files"
        );
        assert_eq!(
            at("/other"),
            "https://mcp.example.com/.well-known/oauth-protected-resource"
        );
        assert_eq!(
            at("/mcp/a\"b"),
            "https://mcp.example.com/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn challenge_text_is_always_a_valid_quoted_string() {
        assert_eq!(quotable("a \"b\" \\ c\n"), "a 'b' ' c?");
        let auth = Authenticator::new(&AuthConfig::default()).unwrap();
        let r = Refusal {
            kind: RefusalKind::InsufficientScope("mcp tools".into()),
            message: "Forbidden".into(),
        };
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            auth.challenge(&r, "/mcp"),
            "Bearer realm=\"taskgate\", error=\"insufficient_scope\", scope=\"mcp tools\""
        );
    }
}

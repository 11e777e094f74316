//! `[auth] mode = "oauth"`: taskgate as an OAuth 2.1 resource server (MCP 2025-11-25
//! basic/authorization, "Access Token Usage" and "Token Audience Binding and Validation").
//!
//! A request's `Authorization: Bearer <JWT>` (RFC 6750 §2.1; RFC 9068 access token) is accepted
//! when, in this order:
//! 1. its JOSE header parses and its `alg` is in `auth.oauth.algorithms` (asymmetric only: `none`
//!    and `HS*` never are);
//! 2. the issuer's key named by `kid` is known (see `super::jwks`) and of that algorithm's family
//!    (and, if the JWK names an `alg`, exactly it);
//!    The header's `typ` is one of `auth.oauth.token_types` (default `at+jwt`,
//!    `application/at+jwt`: RFC 9068 §4, so an ID token is never taken for an access token)
//!    and it lists no `crit` extension (RFC 7515 §4.1.11);
//! 3. the signature verifies (`jsonwebtoken`), `iss` equals `auth.oauth.issuer`, `aud` contains
//!    `auth.oauth.audience` or the identifier of the route the request names
//!    (`<origin>/mcp/<name>`, RFC 8707 and RFC 9728 §3.3), `exp` is present and not past and
//!    `nbf`, if present, is reached (both with `leeway_s`);
//! 4. the principal claim (`sub` by default) is a non-empty string;
//! 5. `scope` (space-separated, RFC 9068 §2.2.3) or `scp` carries every `required_scopes` entry.
//!
//! Failing 1–4 is HTTP 401 `error="invalid_token"`, failing 5 is HTTP 403
//! `error="insufficient_scope"` (RFC 6750 §3.1); a key set that cannot be fetched is HTTP 503
//! (the detail is logged, not sent). The principal is `<iss>#<claim>`: an issuer
//! identifier has no fragment (RFC 8414 §2), so the `#` is unambiguous.

use super::jwks::{CachePolicy, KeyCache, KeyError};
use super::{Refusal, RefusalKind};
use crate::config::OAuthConfig;
use crate::exchange::Principal;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, AlgorithmFamily, Validation};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Longest principal claim value accepted, in bytes.
const MAX_PRINCIPAL_BYTES: usize = 1024;
/// Most `aud` values of one token taskgate looks at (RFC 8707 tokens name one or a few).
const MAX_AUDIENCES: usize = 16;
/// Most accepted tokens remembered (the table is emptied when full).
pub const MAX_VERIFIED: usize = 10_000;

/// An accepted token: who it names, its validity window (seconds since the epoch, leeway
/// included) and the key-set generation it was verified under.
struct Verified {
    principal: Principal,
    /// The token's `aud` values (at most [`MAX_AUDIENCES`]), checked against each request's
    /// resource.
    audiences: Box<[String]>,
    not_after: u64,
    not_before: u64,
    generation: u64,
}

/// The access-token checker of `mode = "oauth"`.
pub struct OAuth {
    issuer: String,
    audience: String,
    principal_claim: String,
    required_scopes: Vec<String>,
    validations: HashMap<Algorithm, Validation>,
    keys: KeyCache,
    leeway: u64,
    /// Accepted JOSE `typ` values, lower-case (`auth.oauth.token_types`).
    token_types: Vec<String>,
    verified: parking_lot::Mutex<HashMap<[u8; 32], Verified>>,
}

impl OAuth {
    /// Builds the checker from a validated `[auth.oauth]`; nothing is fetched yet.
    pub fn new(config: &OAuthConfig) -> Result<OAuth, String> {
        let fetcher = super::fetch::Fetcher::new(Duration::from_millis(config.fetch_timeout_ms))?;
        let jwks = match &config.jwks_url {
            Some(u) => Some(u.parse().map_err(|e| format!("auth.oauth.jwks_url: {e}"))?),
            None => None,
        };
        let policy = CachePolicy {
            max_age: Duration::from_millis(config.jwks_cache_ms),
            min_refresh: Duration::from_millis(config.jwks_min_refresh_ms),
        };
        let mut validations = HashMap::new();
        for name in &config.algorithms {
            let alg: Algorithm = name
                .parse()
                .map_err(|_| format!("auth.oauth.algorithms: unknown {name:?}"))?;
            let mut v = Validation::new(alg);
            v.leeway = config.leeway_s;
            v.validate_nbf = true;
            v.set_issuer(&[&config.issuer]);
            // `aud` is checked per request against this resource and the route's own
            // identifier (see `Authenticator::authenticate`).
            v.validate_aud = false;
            v.set_required_spec_claims(&["exp", "iss", "aud"]);
            validations.insert(alg, v);
        }
        Ok(OAuth {
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            principal_claim: config.principal_claim.clone(),
            required_scopes: config.required_scopes.clone(),
            validations,
            keys: KeyCache::new(fetcher, &config.issuer, jwks, policy),
            leeway: config.leeway_s,
            token_types: config
                .token_types
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
            verified: parking_lot::Mutex::new(HashMap::new()),
        })
    }

    /// The configured issuer (`authorization_servers` of the metadata).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The resource identifier (`resource` of the metadata).
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The scopes every token must carry (`scopes_supported` of the metadata).
    pub fn required_scopes(&self) -> &[String] {
        &self.required_scopes
    }

    /// Fetches the key set ahead of the first request (errors are logged and retried later).
    pub async fn warm_up(&self) {
        let _ = self.keys.key(Some("")).await;
    }

    /// Checks one access token for a request to the resource `route_resource` (the route's own
    /// identifier, when the request names a route): its `aud` must hold `auth.oauth.audience`
    /// or `route_resource`. The principal, or why it is refused.
    pub async fn verify(
        &self,
        token: &str,
        route_resource: Option<&str>,
    ) -> Result<Principal, Refusal> {
        use sha2::{Digest, Sha256};
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let generation = self.keys.fresh_generation();
        let now = jsonwebtoken::get_current_timestamp();
        if let Some(g) = generation {
            let table = self.verified.lock();
            if let Some(v) = table.get(&digest).filter(|v| v.generation == g) {
                if v.not_before <= now && now < v.not_after {
                    self.check_audience(&v.audiences, route_resource)?;
                    return Ok(v.principal.clone());
                }
            }
        }
        let (principal, claims) = self.verify_fully(token).await?;
        let audiences: Box<[String]> = match claims.get("aud") {
            Some(serde_json::Value::String(a)) => Box::new([a.clone()]),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .take(MAX_AUDIENCES)
                .collect(),
            _ => Box::new([]),
        };
        self.check_audience(&audiences, route_resource)?;
        let seconds = |name: &str| claims.get(name).and_then(|v| v.as_f64()).map(|f| f as u64);
        if let (Some(g), Some(exp)) = (generation, seconds("exp")) {
            let mut table = self.verified.lock();
            if table.len() >= MAX_VERIFIED {
                table.clear();
            }
            table.insert(
                digest,
                Verified {
                    principal: principal.clone(),
                    audiences,
                    not_after: exp.saturating_add(self.leeway),
                    not_before: seconds("nbf").unwrap_or(0).saturating_sub(self.leeway),
                    generation: g,
                },
            );
        }
        Ok(principal)
    }

    /// RFC 8707: the token was issued for this resource (`auth.oauth.audience`) or for the
    /// route the request names (`route_resource`).
    fn check_audience(
        &self,
        audiences: &[String],
        route_resource: Option<&str>,
    ) -> Result<(), Refusal> {
        let ours = |a: &String| a == &self.audience || Some(a.as_str()) == route_resource;
        if audiences.iter().any(ours) {
            return Ok(());
        }
        Err(invalid(describe(&ErrorKind::InvalidAudience)))
    }

    /// The JOSE header checks of RFC 9068 §4 and RFC 7515 §4.1.11: `typ` is one of
    /// `auth.oauth.token_types` (an absent one counts as `JWT`, RFC 7519 §5.1), and no `crit`
    /// extension is listed (taskgate understands none, so it must refuse any).
    fn check_header(&self, token: &str, typ: Option<&str>) -> Result<(), Refusal> {
        let typ = typ.unwrap_or("JWT").to_ascii_lowercase();
        if !self.token_types.contains(&typ) {
            return Err(invalid(format!(
                "the token's type (typ {typ:?}) is not an access token type taskgate accepts (auth.oauth.token_types; RFC 9068 access tokens are \"at+jwt\")"
            )));
        }
        use base64::Engine;
        let segment = token.split('.').next().unwrap_or("");
        let has_crit = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(segment.trim_end_matches('='))
            .ok()
            .and_then(|b| {
                serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&b).ok()
            })
            .is_some_and(|h| h.contains_key("crit"));
        if has_crit {
            return Err(invalid(
                "the token's header lists critical extensions (crit) taskgate does not understand"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Every check of the module docs; the principal and the token's claims.
    async fn verify_fully(
        &self,
        token: &str,
    ) -> Result<(Principal, serde_json::Map<String, serde_json::Value>), Refusal> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| invalid(format!("the access token is not a valid JWT ({e})")))?;
        let validation = self.validations.get(&header.alg).ok_or_else(|| {
            invalid(format!(
                "the token's algorithm {:?} is not accepted (auth.oauth.algorithms)",
                header.alg
            ))
        })?;
        self.check_header(token, header.typ.as_deref())?;
        let key = self
            .keys
            .key(header.kid.as_deref())
            .await
            .map_err(|e| match e {
                KeyError::UnknownKid(k) => invalid(format!(
                    "the token's key id {k:?} is not in the issuer's key set"
                )),
                KeyError::NoKid => invalid("the token names no key id (kid)".into()),
                KeyError::Unavailable(why) => {
                    // Not the caller's fault: 503, and the detail goes to the log only.
                    tracing::warn!(error = %why, "the issuer's signing keys are unavailable");
                    Refusal {
                        kind: RefusalKind::Unavailable,
                        message: "Service Unavailable: the authorization server's signing keys cannot be fetched; try again later".into(),
                    }
                }
            })?;
        if key.decoding.family() != family(header.alg) || key.alg.is_some_and(|a| a != header.alg) {
            return Err(invalid(format!(
                "the token's algorithm {:?} does not match its key",
                header.alg
            )));
        }
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &key.decoding,
            validation,
        )
        .map_err(|e| invalid(describe_refusal(e.kind(), token)))?;
        let claims = data.claims;
        let subject = claims
            .get(&self.principal_claim)
            .and_then(|v| v.as_str())
            // No control character: the principal owns task records (PostgreSQL's `text`
            // cannot hold a NUL) and goes into logs and `upstream.principal_header`.
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= MAX_PRINCIPAL_BYTES
                    && !s.chars().any(|c| c.is_ascii_control())
            })
            .ok_or_else(|| {
                invalid(format!(
                    "the token has no usable {:?} claim (a string of 1 to {MAX_PRINCIPAL_BYTES} bytes without control characters)",
                    self.principal_claim
                ))
            })?;
        let missing: Vec<&str> = self
            .required_scopes
            .iter()
            .filter(|s| !has_scope(&claims, s))
            .map(|s| s.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(Refusal {
                kind: RefusalKind::InsufficientScope(self.required_scopes.join(" ")),
                message: format!(
                    "Forbidden: the token lacks the scope(s) {}",
                    missing.join(" ")
                ),
            });
        }
        let principal = Principal::Token(Arc::from(format!("{}#{subject}", self.issuer)));
        Ok((principal, claims))
    }
}

/// The key family of an algorithm (RFC 7518 §3.1).
fn family(alg: Algorithm) -> AlgorithmFamily {
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => AlgorithmFamily::Hmac,
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => AlgorithmFamily::Rsa,
        Algorithm::ES256 | Algorithm::ES384 => AlgorithmFamily::Ec,
        Algorithm::EdDSA => AlgorithmFamily::Ed,
    }
}

fn invalid(message: String) -> Refusal {
    Refusal {
        kind: RefusalKind::InvalidToken,
        message: format!("Unauthorized: {message}"),
    }
}

/// Whether the `scope` string (RFC 9068 §2.2.3) or the `scp` array/string names `scope`.
fn has_scope(claims: &serde_json::Map<String, serde_json::Value>, scope: &str) -> bool {
    let in_str =
        |v: &serde_json::Value| v.as_str().is_some_and(|s| s.split(' ').any(|x| x == scope));
    claims.get("scope").is_some_and(in_str)
        || claims.get("scp").is_some_and(|v| {
            in_str(v)
                || v.as_array()
                    .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(scope)))
        })
}

/// Why `jsonwebtoken::decode` refused `token`, in words. It reports a required claim of the
/// wrong JSON type (an `exp` string) as missing; such a claim is named as present but not of
/// its type. Its claims are checked after its signature, so the payload read here is the one
/// the issuer signed.
fn describe_refusal(kind: &ErrorKind, token: &str) -> String {
    match kind {
        ErrorKind::InvalidClaimFormat(c) => wrong_type(c),
        ErrorKind::MissingRequiredClaim(c) if has_claim(token, c) => wrong_type(c),
        _ => describe(kind),
    }
}

/// Whether `token`'s payload (its second base64url segment) holds the claim `name`, of any type.
fn has_claim(token: &str, name: &str) -> bool {
    use base64::Engine;
    let Some(payload) = token.split('.').nth(1) else {
        return false;
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Map<_, _>>(&bytes).ok())
        .is_some_and(|claims| claims.contains_key(name))
}

/// The message for a claim present in the token with a JSON type it must not have.
fn wrong_type(claim: &str) -> String {
    let expected = match claim {
        "exp" | "nbf" | "iat" => "a number (a NumericDate: seconds since the epoch, RFC 7519 §2)",
        "aud" => "a string or an array of strings (RFC 7519 §4.1.3)",
        _ => "a string",
    };
    format!("the token's {claim:?} claim is not {expected}")
}

fn describe(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidIssuer => "the token's issuer (iss) is not the configured one".into(),
        ErrorKind::InvalidAudience => {
            "the token was not issued for this resource (aud, RFC 8707)".into()
        }
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(c) => format!("the token has no {c:?} claim"),
        ErrorKind::InvalidAlgorithm => "the token's algorithm does not match its key".into(),
        other => format!("the token is not valid ({other:?})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    /// An unsigned token with these claims (the message does not look at the signature).
    fn token(claims: serde_json::Value) -> String {
        let b64 = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let header = serde_json::json!({"alg": "ES256", "typ": "at+jwt"});
        format!("{}.{}.c2ln", b64(&header), b64(&claims))
    }

    #[test]
    fn a_time_claim_of_the_wrong_type_is_named_as_such() {
        let missing = |c: &str| ErrorKind::MissingRequiredClaim(c.into());
        let t = token(serde_json::json!({"exp": "1796000000", "iss": "i", "aud": "a"}));
        let message = describe_refusal(&missing("exp"), &t);
        assert!(
            message.contains("\"exp\" claim is not a number"),
            "{message}"
        );
        assert!(!message.contains("has no"), "{message}");
        let t = token(serde_json::json!({"nbf": "1796000000"}));
        let message = describe_refusal(&ErrorKind::InvalidClaimFormat("nbf".into()), &t);
        assert!(
            message.contains("\"nbf\" claim is not a number"),
            "{message}"
        );
        // A claim really absent is still said to be.
        let t = token(serde_json::json!({"iss": "i", "aud": "a"}));
        assert_eq!(
            describe_refusal(&missing("exp"), &t),
            "the token has no \"exp\" claim"
        );
        // `aud` of the wrong type.
        let t = token(serde_json::json!({"exp": 1, "iss": "i", "aud": 5}));
        let message = describe_refusal(&missing("aud"), &t);
        assert!(message.contains("\"aud\" claim is not"), "{message}");
    }
}

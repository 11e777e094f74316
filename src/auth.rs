//! Who a caller is: `[auth]` turns request headers into a [`Principal`], the spec's
//! "authorization context" that tasks are bound to (2025-11-25 tasks: Security Considerations).
//!
//! - `mode = "none"`: every caller is [`Principal::Anonymous`]; tasks are then bound to the
//!   client's `Mcp-Session-Id`, which is weaker: anyone holding a session id acts as its owner.
//! - `mode = "bearer"`: `Authorization: Bearer <token>` must match a configured token (compared by
//!   SHA-256 digest); the principal is that token's `principal`. Otherwise HTTP 401.

use crate::config::{AuthConfig, AuthMode};
use crate::exchange::Principal;
use http::header::{HeaderMap, AUTHORIZATION};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Checks credentials against `[auth]`.
pub struct Authenticator {
    mode: AuthMode,
    /// (sha256 of token, principal)
    tokens: Vec<([u8; 32], Arc<str>)>,
}

impl Authenticator {
    /// Builds the checker from a validated `[auth]` section (reads `token_env` variables now).
    pub fn new(config: &AuthConfig) -> Authenticator {
        let tokens = config
            .token
            .iter()
            .map(|t| {
                let digest: [u8; 32] = match (&t.sha256, &t.token_env) {
                    (Some(hexed), _) => {
                        let mut d = [0u8; 32];
                        hex::decode_to_slice(hexed, &mut d).expect("validated sha256");
                        d
                    }
                    (None, Some(var)) => {
                        Sha256::digest(std::env::var(var).unwrap_or_default().as_bytes()).into()
                    }
                    (None, None) => unreachable!("validated: one of sha256 or token_env"),
                };
                (digest, Arc::from(t.principal.as_str()))
            })
            .collect();
        Authenticator {
            mode: config.mode,
            tokens,
        }
    }

    /// The caller's principal, or the reason the request is refused (HTTP 401).
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, &'static str> {
        if self.mode == AuthMode::None {
            return Ok(Principal::Anonymous);
        }
        let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
            return Err("Unauthorized: an Authorization: Bearer <token> header is required");
        };
        let Some(token) = value
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
        else {
            return Err("Unauthorized: the Authorization header must use the Bearer scheme");
        };
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.tokens
            .iter()
            .find(|(d, _)| constant_time_eq(d, &digest))
            .map(|(_, p)| Principal::Token(p.clone()))
            .ok_or("Unauthorized: the bearer token is not valid")
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenConfig;

    #[test]
    fn bearer_tokens_map_to_principals() {
        let hash = hex::encode(Sha256::digest(b"alice-token"));
        let auth = Authenticator::new(&AuthConfig {
            mode: AuthMode::Bearer,
            token: vec![TokenConfig {
                principal: "alice".into(),
                sha256: Some(hash),
                token_env: None,
            }],
        });
        let mut h = HeaderMap::new();
        assert!(auth.authenticate(&h).is_err());
        h.insert(AUTHORIZATION, "Bearer alice-token".parse().unwrap());
        assert_eq!(auth.authenticate(&h), Ok(Principal::Token("alice".into())));
        h.insert(AUTHORIZATION, "Bearer wrong".parse().unwrap());
        assert!(auth.authenticate(&h).is_err());
        h.insert(AUTHORIZATION, "Basic YWxpY2U=".parse().unwrap());
        assert!(auth.authenticate(&h).is_err());
    }
}

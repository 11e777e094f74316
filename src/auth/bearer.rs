//! `[auth] mode = "bearer"`: static tokens. `Authorization: Bearer <token>` (RFC 6750 §2.1) must
//! match a configured `[[auth.token]]`, compared by SHA-256 digest in constant time; the
//! principal is that token's `principal`.

use super::{Refusal, RefusalKind};
use crate::config::TokenConfig;
use crate::exchange::Principal;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// The configured tokens: (SHA-256 of the token, principal).
pub struct StaticTokens {
    tokens: Vec<([u8; 32], Arc<str>)>,
}

impl StaticTokens {
    /// From validated `[[auth.token]]` entries (reads `token_env` variables now).
    pub fn new(config: &[TokenConfig]) -> StaticTokens {
        let tokens = config
            .iter()
            .map(|t| {
                let digest: [u8; 32] = match (&t.sha256, &t.token_env) {
                    (Some(hexed), _) => {
                        let mut d = [0u8; 32];
                        // Validated as 64 hex digits; a bad one matches no token.
                        let _ = hex::decode_to_slice(hexed, &mut d);
                        d
                    }
                    (None, Some(var)) => {
                        Sha256::digest(std::env::var(var).unwrap_or_default().as_bytes()).into()
                    }
                    // Validated: one of sha256 or token_env. Matches no token.
                    (None, None) => Sha256::digest(b"").into(),
                };
                (digest, Arc::from(t.principal.as_str()))
            })
            .collect();
        StaticTokens { tokens }
    }

    /// The principal of `token`, or a 401 `invalid_token` refusal.
    pub fn check(&self, token: &str) -> Result<Principal, Refusal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.tokens
            .iter()
            .find(|(d, _)| constant_time_eq(d, &digest))
            .map(|(_, p)| Principal::Token(p.clone()))
            .ok_or_else(|| Refusal {
                kind: RefusalKind::InvalidToken,
                message: "Unauthorized: the bearer token is not valid".into(),
            })
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::super::Authenticator;
    use super::*;
    use crate::config::{AuthConfig, AuthMode};
    use http::header::{HeaderMap, AUTHORIZATION};

    #[tokio::test]
    async fn bearer_tokens_map_to_principals() {
        let hash = hex::encode(Sha256::digest(b"alice-token"));
        let auth = Authenticator::new(&AuthConfig {
            mode: AuthMode::Bearer,
            token: vec![TokenConfig {
                principal: "alice".into(),
                sha256: Some(hash),
                token_env: None,
            }],
            oauth: None,
        })
        .unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(
            auth.authenticate(&h, "/mcp").await.unwrap_err().kind,
            RefusalKind::Missing
        );
        h.insert(AUTHORIZATION, "Bearer alice-token".parse().unwrap());
        assert_eq!(
            auth.authenticate(&h, "/mcp").await,
            Ok(Principal::Token("alice".into()))
        );
        h.insert(AUTHORIZATION, "Bearer wrong".parse().unwrap());
        let refused = auth.authenticate(&h, "/mcp").await.unwrap_err();
        assert_eq!(refused.kind, RefusalKind::InvalidToken);
        h.insert(AUTHORIZATION, "Basic YWxpY2U=".parse().unwrap());
        assert!(auth.authenticate(&h, "/mcp").await.is_err());
    }
}

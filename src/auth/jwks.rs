//! The issuer's signing keys: discovered, fetched, cached and refreshed.
//!
//! - Where: `auth.oauth.jwks_url`, else the `jwks_uri` of the issuer's metadata, looked up at
//!   `/.well-known/oauth-authorization-server` (RFC 8414 §3, inserted before the issuer's path)
//!   and then `<issuer>/.well-known/openid-configuration` (OpenID Connect Discovery 1.0 §4). The
//!   metadata's `issuer` must equal the configured one (RFC 8414 §3.3); `jwks_uri` must be
//!   `https://` (or loopback `http://`).
//! - When: the set is used for `jwks_cache_ms`; a token whose `kid` is not in it, or a set past
//!   that age, triggers a fetch, at most one every `jwks_min_refresh_ms` and one at a time. A failed
//!   fetch keeps the cached keys (they keep working); a fetched set replaces the cached one whole,
//!   so a key the issuer removed is refused from then on.
//! - Which keys: only asymmetric ones (`RSA`, `EC`, `OKP`) not marked `"use": "enc"`; `oct` keys
//!   are ignored (never HMAC with key material anyone may read).

use super::fetch::Fetcher;
use crate::config::https_or_loopback;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most keys kept from one set (the rest are ignored).
const MAX_KEYS: usize = 64;

/// One usable verification key.
pub struct Key {
    /// The key, ready for `jsonwebtoken::decode`.
    pub decoding: DecodingKey,
    /// The JWK's `alg`, when it names one: a token must then use exactly it.
    pub alg: Option<Algorithm>,
}

#[derive(Default)]
struct KeySet {
    by_kid: HashMap<String, Arc<Key>>,
    /// Keys without a `kid` (usable only when the set holds exactly one key).
    anonymous: Vec<Arc<Key>>,
    fetched_at: Option<Instant>,
    attempted_at: Option<Instant>,
}

/// Why no key was found for a token.
#[derive(Debug)]
pub enum KeyError {
    /// The token's `kid` is not in the (possibly just refreshed) set.
    UnknownKid(String),
    /// The token names no `kid` and the set has more than one key, or none.
    NoKid,
    /// The set could never be fetched, or its last fetch failed and the key was not in the
    /// set kept: the reason.
    Unavailable(String),
}

/// Timing of [`KeyCache`], from `[auth.oauth]`.
pub struct CachePolicy {
    /// `jwks_cache_ms`.
    pub max_age: Duration,
    /// `jwks_min_refresh_ms`.
    pub min_refresh: Duration,
}

/// The cached key set of one issuer.
pub struct KeyCache {
    fetcher: Fetcher,
    issuer: String,
    configured_jwks: Option<http::Uri>,
    discovered_jwks: RwLock<Option<http::Uri>>,
    policy: CachePolicy,
    set: RwLock<Arc<KeySet>>,
    /// One refresh at a time; the others wait for it (bounded by the fetch deadline).
    refresh: tokio::sync::Mutex<String>,
    /// Counts successful fetches: what was verified under an older generation is checked again.
    generation: std::sync::atomic::AtomicU64,
}

impl KeyCache {
    /// A cache for `issuer`'s keys; `jwks_url` skips discovery. Nothing is fetched yet.
    pub fn new(
        fetcher: Fetcher,
        issuer: &str,
        jwks_url: Option<http::Uri>,
        policy: CachePolicy,
    ) -> KeyCache {
        KeyCache {
            fetcher,
            issuer: issuer.to_string(),
            configured_jwks: jwks_url,
            discovered_jwks: RwLock::new(None),
            policy,
            set: RwLock::new(Arc::new(KeySet::default())),
            refresh: tokio::sync::Mutex::new(String::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The current key-set generation, when the set is fresh (younger than `jwks_cache_ms`);
    /// `None` when it is stale or was never fetched (a caller then goes through [`KeyCache::key`]).
    pub fn fresh_generation(&self) -> Option<u64> {
        let set = self.set.read();
        set.fetched_at
            .is_some_and(|t| t.elapsed() < self.policy.max_age)
            .then(|| self.generation.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The key for a token's `kid`: from the cache, else after one (rate-limited) refresh.
    pub async fn key(&self, kid: Option<&str>) -> Result<Arc<Key>, KeyError> {
        let set = self.set.read().clone();
        let fresh = set
            .fetched_at
            .is_some_and(|t| t.elapsed() < self.policy.max_age);
        if let (true, Some(k)) = (fresh, find(&set, kid)) {
            return Ok(k);
        }
        if let Some(k) = find(&set, kid) {
            // Stale but known: refresh unless another caller already is; use the cached key if
            // the refresh fails or is not due.
            if let Ok(last_error) = self.refresh.try_lock() {
                self.refresh_locked(last_error).await;
            }
            return Ok(find(&self.set.read(), kid).unwrap_or(k));
        }
        let last_error = self.refresh.lock().await;
        let last_error = self.refresh_locked(last_error).await;
        let set = self.set.read().clone();
        match find(&set, kid) {
            Some(k) => Ok(k),
            // Never fetched; or the last fetch failed, so a key the issuer rotated in since
            // cannot be known (cold test: a rotation during a JWKS outage was a 401
            // `invalid_token`, telling the client to throw a valid token away): 503.
            None if set.fetched_at.is_none() || !last_error.is_empty() => {
                Err(KeyError::Unavailable(last_error))
            }
            None => Err(match kid {
                Some(k) => KeyError::UnknownKid(k.to_string()),
                None => KeyError::NoKid,
            }),
        }
    }

    /// Fetches the set if the last attempt is older than `min_refresh`; returns the last error.
    async fn refresh_locked(&self, mut last_error: tokio::sync::MutexGuard<'_, String>) -> String {
        let due = self
            .set
            .read()
            .attempted_at
            .is_none_or(|t| t.elapsed() >= self.policy.min_refresh);
        if !due {
            return last_error.clone();
        }
        let result = self.fetch().await;
        let mut set = self.set.write();
        match result {
            Ok(mut fresh) => {
                fresh.attempted_at = fresh.fetched_at;
                *set = Arc::new(fresh);
                self.generation
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                last_error.clear();
            }
            Err(e) => {
                tracing::warn!(issuer = %self.issuer, error = %e, "fetching the issuer's signing keys failed; cached keys stay in use");
                let kept = KeySet {
                    by_kid: set.by_kid.clone(),
                    anonymous: set.anonymous.clone(),
                    fetched_at: set.fetched_at,
                    attempted_at: Some(Instant::now()),
                };
                *set = Arc::new(kept);
                *last_error = e;
            }
        }
        last_error.clone()
    }

    async fn fetch(&self) -> Result<KeySet, String> {
        let uri = match &self.configured_jwks {
            Some(u) => u.clone(),
            None => self.jwks_uri().await?,
        };
        let doc = self.fetcher.get_json(&uri).await?;
        let keys = doc
            .get("keys")
            .and_then(|k| k.as_array())
            .ok_or_else(|| format!("GET {uri}: not a JWK Set (no \"keys\" array)"))?;
        let mut set = KeySet {
            fetched_at: Some(Instant::now()),
            ..KeySet::default()
        };
        for raw in keys.iter().take(MAX_KEYS) {
            let Ok(jwk) = serde_json::from_value::<Jwk>(raw.clone()) else {
                continue;
            };
            let Some(key) = usable(&jwk) else { continue };
            match jwk.common.key_id {
                Some(kid) => {
                    set.by_kid.insert(kid, Arc::new(key));
                }
                None => set.anonymous.push(Arc::new(key)),
            }
        }
        tracing::info!(issuer = %self.issuer, jwks = %uri, keys = set.by_kid.len() + set.anonymous.len(), "fetched the issuer's signing keys");
        Ok(set)
    }

    /// The discovered `jwks_uri` (cached once found).
    async fn jwks_uri(&self) -> Result<http::Uri, String> {
        if let Some(u) = self.discovered_jwks.read().clone() {
            return Ok(u);
        }
        let mut errors = Vec::new();
        for candidate in metadata_urls(&self.issuer) {
            match self.discover_at(&candidate).await {
                Ok(u) => {
                    *self.discovered_jwks.write() = Some(u.clone());
                    return Ok(u);
                }
                Err(e) => errors.push(e),
            }
        }
        Err(format!("discovery failed: {}", errors.join("; ")))
    }

    async fn discover_at(&self, url: &str) -> Result<http::Uri, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let doc = self.fetcher.get_json(&uri).await?;
        let issuer = doc.get("issuer").and_then(|v| v.as_str());
        if issuer != Some(self.issuer.as_str()) {
            return Err(format!(
                "{url}: metadata issuer {issuer:?} is not {:?} (RFC 8414 §3.3)",
                self.issuer
            ));
        }
        let jwks = doc
            .get("jwks_uri")
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("{url}: metadata has no jwks_uri"))?;
        https_or_loopback(jwks).map_err(|e| format!("{url}: jwks_uri: {e}"))
    }
}

/// The metadata URLs tried for `issuer`, in order (RFC 8414 §3.1, then OpenID Discovery §4).
pub fn metadata_urls(issuer: &str) -> Vec<String> {
    let trimmed = issuer.trim_end_matches('/');
    let (origin, path) = match trimmed.find("://").map(|i| i + 3) {
        Some(start) => match trimmed[start..].find('/') {
            Some(p) => trimmed.split_at(start + p),
            None => (trimmed, ""),
        },
        None => (trimmed, ""),
    };
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{trimmed}/.well-known/openid-configuration"),
    ]
}

fn find(set: &KeySet, kid: Option<&str>) -> Option<Arc<Key>> {
    match kid {
        Some(k) => set.by_kid.get(k).cloned(),
        None if set.by_kid.len() + set.anonymous.len() == 1 => set
            .anonymous
            .first()
            .or_else(|| set.by_kid.values().next())
            .cloned(),
        None => None,
    }
}

/// The verification key of a JWK, if it is an asymmetric signing key `jsonwebtoken` can use.
fn usable(jwk: &Jwk) -> Option<Key> {
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        return None;
    }
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        // Display is the JWA name (`RS256`, ...); encryption algorithms do not parse.
        Some(a) => Some(a.to_string().parse::<Algorithm>().ok()?),
        None => None,
    };
    let decoding = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key { decoding, alg })
}

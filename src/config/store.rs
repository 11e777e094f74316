//! `[store]`: where the task registry lives (sled or PostgreSQL), with its defaults and its
//! `validate()` (ranges in `config/REFERENCE.md`).

use super::check::*;
use super::ConfigError;
use serde::Deserialize;
use std::path::PathBuf;

/// Smallest `store.cache_capacity_bytes`: sled panics below 256 bytes, and a cache of less
/// than 1 MiB makes every store read a disk read.
const MIN_CACHE_BYTES: u64 = 1024 * 1024;

pub(super) fn default_store_path() -> PathBuf {
    PathBuf::from("data/taskgate")
}
/// 8 MiB: sled holds about 1.6 times its capacity in node memory (its accounting is by the
/// pages' size on disk, rounded up, and per shard), and 16 MiB put taskgate over 80 MiB of RSS
/// with 100,000 records (`benches/run.sh` scenario 6, profiling build, medians of 3: peak RSS
/// after 100,000 creations 87.1 → 79.3 MiB). The task lifecycle does not notice (`benches/profile.sh lifecycle`: 101,929 →
/// 101,853 instructions per request, medians of 3): its records are recent and the registry's
/// record cache serves its authorising reads. A larger working set of records pulls more pages
/// back from the OS's file cache (a read and a decode each).
pub(super) fn default_cache_capacity_bytes() -> u64 {
    8 * 1024 * 1024
}

/// `[store] backend`: where the task registry lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// Embedded sled database at `store.path` (one taskgate per directory).
    #[default]
    Sled,
    /// A PostgreSQL database shared by a tier of taskgate replicas (`store.url_env` / `store.url`).
    Postgres,
}

pub(super) fn default_pool_size() -> u64 {
    16
}
pub(super) fn default_lease_ms() -> u64 {
    15_000
}
pub(super) fn default_lease_poll_ms() -> u64 {
    250
}

/// `[store]`. `Debug` hides a password in `url` (`super::redact`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sled` (default) or `postgres`.
    #[serde(default)]
    pub backend: StoreBackend,
    /// Directory of the sled database (created if missing; default `data/taskgate`).
    #[serde(default = "default_store_path")]
    pub path: PathBuf,
    /// sled page cache size in bytes (default 8 MiB; bounds the store's share of RSS).
    #[serde(default = "default_cache_capacity_bytes")]
    pub cache_capacity_bytes: u64,
    /// `postgres`: name of the environment variable holding the database URL (the way to pass
    /// a password).
    #[serde(default)]
    pub url_env: Option<String>,
    /// `postgres`: the database URL itself, without a password (refused if it has one).
    #[serde(default)]
    pub url: Option<String>,
    /// `postgres`: connections in the pool (default 16).
    #[serde(default = "default_pool_size")]
    pub pool_size: u64,
    /// `postgres`: PEM file of the CA certificate(s) the database's TLS certificate must chain
    /// to (default: the Mozilla roots). TLS is used with the URL's `sslmode=require`, and then
    /// the certificate and the host name are always verified.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// `postgres` with `sslmode=require`: the named set of root CAs trusted, `"mozilla"` or
    /// `"system"` (the platform's trust store), as `upstream.ca_roots` (`crate::tls`).
    #[serde(default)]
    pub ca_roots: Option<crate::tls::CaRoots>,
    /// `postgres` with `sslmode=require`: a PEM certificate chain (the client's own first)
    /// presented when the database asks for one (mTLS: `pg_hba.conf`'s `cert` method or
    /// `clientcert=verify-full`); set with `client_key_file`.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// The PEM private key of `client_cert_file` (PKCS#8, PKCS#1 or SEC1).
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// `postgres`: the lapse of a call lease, in ms (default 15000; see `store::lease`): a
    /// replica renews its leases every third of it, and one not renewed for this long is taken
    /// over by another replica (a gateway task's held call `failed`, an upgraded call followed).
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// `postgres`: how often a replica reads the cancels asked of its leases and looks for
    /// lapsed ones, in ms (default 250): the longest a `tasks/cancel` answered by another
    /// replica waits before the holding replica acts on it.
    #[serde(default = "default_lease_poll_ms")]
    pub lease_poll_ms: u64,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let StoreConfig {
            backend,
            path,
            cache_capacity_bytes,
            url_env,
            url,
            pool_size,
            ca_file,
            ca_roots,
            client_cert_file,
            client_key_file,
            lease_ms,
            lease_poll_ms,
        } = self;
        f.debug_struct("StoreConfig")
            .field("backend", backend)
            .field("path", path)
            .field("cache_capacity_bytes", cache_capacity_bytes)
            .field("url_env", url_env)
            .field("url", &url.as_deref().map(super::redact::Url))
            .field("pool_size", pool_size)
            .field("ca_file", ca_file)
            .field("ca_roots", ca_roots)
            .field("client_cert_file", client_cert_file)
            .field("client_key_file", client_key_file)
            .field("lease_ms", lease_ms)
            .field("lease_poll_ms", lease_poll_ms)
            .finish()
    }
}

/// Whether a PostgreSQL URL or key/value string carries a password.
fn has_password(url: &str) -> bool {
    if let Some(rest) = url.split_once("://").map(|(_, r)| r) {
        let userinfo = rest.split(['/', '?']).next().unwrap_or("");
        if let Some((user, _)) = userinfo.rsplit_once('@') {
            if user.contains(':') {
                return true;
            }
        }
    }
    url.contains("password=")
}

impl StoreConfig {
    /// Checks every numeric key against its range in `config/REFERENCE.md`, and the
    /// `postgres` keys: exactly one of `url_env` (naming a set variable) and `url` (without a
    /// password), and none of them with `sled`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "store.cache_capacity_bytes",
            self.cache_capacity_bytes,
            MIN_CACHE_BYTES,
            UNBOUNDED,
        )?;
        check_range("store.pool_size", self.pool_size, 1, 1000)?;
        check_range("store.lease_ms", self.lease_ms, 300, 3_600_000)?;
        check_range("store.lease_poll_ms", self.lease_poll_ms, 10, 60_000)?;
        if self.lease_poll_ms * 3 > self.lease_ms {
            return Err(ConfigError::Invalid(format!(
                "store.lease_poll_ms ({}) must be at most a third of store.lease_ms ({}): leases are renewed every third of their lapse",
                self.lease_poll_ms, self.lease_ms
            )));
        }
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        match (self.backend, &self.url_env, &self.url) {
            (StoreBackend::Sled, None, None) if self.ca_file.is_some() => invalid(
                "store.ca_file is for backend = \"postgres\" (TLS to the database)".into(),
            ),
            (StoreBackend::Sled, None, None) if self.ca_roots.is_some() => invalid(
                "store.ca_roots is for backend = \"postgres\" (TLS to the database)".into(),
            ),
            (StoreBackend::Sled, None, None)
                if self.client_cert_file.is_some() || self.client_key_file.is_some() =>
            {
                invalid(
                    "store.client_cert_file / store.client_key_file are for backend = \"postgres\" (TLS to the database)"
                        .into(),
                )
            }
            (StoreBackend::Sled, None, None) => Ok(()),
            (StoreBackend::Sled, _, _) => invalid(
                "store.url_env / store.url are for backend = \"postgres\" (the sled store uses store.path)".into(),
            ),
            (StoreBackend::Postgres, Some(_), Some(_)) => {
                invalid("store: give url_env or url, not both".into())
            }
            (StoreBackend::Postgres, None, None) => invalid(
                "store: backend = \"postgres\" needs url_env (the variable holding the database URL) or url".into(),
            ),
            (StoreBackend::Postgres, None, Some(url)) if has_password(url) => invalid(
                "store.url holds a password: a password never sits in the config file; put the URL in an environment variable named by store.url_env".into(),
            ),
            (StoreBackend::Postgres, Some(var), None)
                if std::env::var(var).map(|v| v.is_empty()).unwrap_or(true) =>
            {
                invalid(format!(
                    "store.url_env: environment variable {var} is not set or empty"
                ))
            }
            (StoreBackend::Postgres, _, _) => match (&self.client_cert_file, &self.client_key_file) {
                (Some(_), None) => invalid(
                    "store.client_cert_file needs store.client_key_file (its private key)".into(),
                ),
                (None, Some(_)) => invalid(
                    "store.client_key_file needs store.client_cert_file (the certificate it is the key of)"
                        .into(),
                ),
                _ => Ok(()),
            },
        }
    }

    /// What TLS to the database trusts (`ca_file`, `ca_roots`).
    pub fn trust(&self) -> crate::tls::Trust<'_> {
        crate::tls::Trust {
            ca_file: self.ca_file.as_deref(),
            ca_roots: self.ca_roots,
        }
    }

    /// TLS to the database: what it trusts and the client certificate it presents
    /// (`client_cert_file`, `client_key_file`; both set, as [`StoreConfig::validate`] checks).
    pub fn tls(&self) -> crate::tls::ClientTls<'_> {
        crate::tls::ClientTls {
            trust: self.trust(),
            client_auth: crate::tls::ClientAuth::of(
                self.client_cert_file.as_deref(),
                self.client_key_file.as_deref(),
            ),
        }
    }

    /// `postgres`: the database URL (from `url_env` or `url`); `None` for sled or when the
    /// variable is unset.
    pub fn database_url(&self) -> Option<String> {
        match (&self.url_env, &self.url) {
            (Some(var), _) => std::env::var(var).ok().filter(|v| !v.is_empty()),
            (None, Some(url)) => Some(url.clone()),
            (None, None) => None,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackend::Sled,
            path: default_store_path(),
            cache_capacity_bytes: default_cache_capacity_bytes(),
            url_env: None,
            url: None,
            pool_size: default_pool_size(),
            ca_file: None,
            ca_roots: None,
            client_cert_file: None,
            client_key_file: None,
            lease_ms: default_lease_ms(),
            lease_poll_ms: default_lease_poll_ms(),
        }
    }
}

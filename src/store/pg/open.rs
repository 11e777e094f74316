//! Connecting: [`PgStore::open`] (migrates), [`PgStore::open_read_only`], [`PgStore::probe`].

use super::names::{parse, redact, replica_name};
use super::{migrations, pg_err, PgStore, POOL_TIMEOUT};
use crate::store::StoreError;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::sync::Arc;
use std::time::Duration;

/// Sets the URL's `connect_timeout` to [`POOL_TIMEOUT`] and its `tcp_user_timeout` to the
/// `connect_timeout` where the URL sets none (see `bounded`); returns the query timeout (the
/// `connect_timeout`).
fn bound(config: &mut tokio_postgres::Config) -> Duration {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(POOL_TIMEOUT);
    }
    let limit = *config.get_connect_timeout().unwrap_or(&POOL_TIMEOUT);
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(limit);
    }
    limit
}

impl PgStore {
    /// Connects to the database at `url` (a libpq URL or key/value string) with a pool of
    /// `pool_size` connections, and applies the embedded migrations (one replica at a time, under
    /// an advisory lock). With `sslmode=require` in the URL the connections use TLS, trusting the
    /// CA certificates of `tls` (`store.ca_file`, `store.ca_roots`; without either the
    /// Mozilla roots, see `tls`) and presenting its client certificate when the server asks
    /// (`store.client_cert_file`); otherwise `tls` is not read. A bare `Trust` will do.
    ///
    /// Errors: [`StoreError::Open`] (with `path` the URL without its password) when the URL does
    /// not parse, the database cannot be reached within the URL's `connect_timeout` (5 s by
    /// default), its schema is newer than this taskgate knows, or (TLS) `ca_file` cannot be read or holds no certificate, the system trust store none, or
    /// the client certificate or its key cannot be read or used; a server certificate that does
    /// not verify fails the connection, as does a server that refuses the client certificate.
    pub async fn open<'a>(
        url: &str,
        pool_size: usize,
        tls: impl Into<crate::tls::ClientTls<'a>>,
    ) -> Result<Arc<PgStore>, StoreError> {
        PgStore::connect(url, pool_size, true, tls.into()).await
    }

    /// Connects like [`PgStore::open`] without changing the schema, for `taskgate tasks` (a
    /// read-only role will do).
    ///
    /// Errors: those of [`PgStore::open`], and a database whose taskgate schema is missing or
    /// of another version than this taskgate's (start `taskgate serve` on it first).
    pub async fn open_read_only<'a>(
        url: &str,
        pool_size: usize,
        tls: impl Into<crate::tls::ClientTls<'a>>,
    ) -> Result<Arc<PgStore>, StoreError> {
        PgStore::connect(url, pool_size, false, tls.into()).await
    }

    async fn connect(
        url: &str,
        pool_size: usize,
        migrate: bool,
        tls: crate::tls::ClientTls<'_>,
    ) -> Result<Arc<PgStore>, StoreError> {
        let shown = redact(url);
        let open_err = |detail: String| StoreError::Open {
            path: shown.clone(),
            detail,
        };
        let mut config = parse(url).map_err(open_err)?;
        super::tls::check_client_auth(&config, &tls).map_err(open_err)?;
        let query_timeout = bound(&mut config);
        if config.get_application_name().is_none() {
            // `pg_stat_activity` shows taskgate's connections; a URL's own name wins (replicas
            // can be told apart).
            config.application_name("taskgate");
        }
        // The connector and the pool before the runtime: an error of theirs returns without
        // dropping one (a runtime dropped in an asynchronous context panics, and `serve` opens
        // the store in one).
        let connector = if super::tls::wanted(&config) {
            Some(super::tls::connector(tls).map_err(open_err)?)
        } else {
            None
        };
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match connector {
            Some(tls) => Manager::from_config(config, tls, manager_config),
            None => Manager::from_config(config, tokio_postgres::NoTls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            // The pool's waits follow the URL's `connect_timeout` too (see `bounded`).
            .wait_timeout(Some(query_timeout))
            .create_timeout(Some(query_timeout))
            .recycle_timeout(Some(query_timeout))
            .build()
            .map_err(|e| open_err(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("taskgate-pg")
            .enable_all()
            .build()
            .map_err(|e| open_err(e.to_string()))?;
        let handle = runtime.handle().clone();
        let store = Arc::new(PgStore {
            pool,
            runtime: Some(runtime),
            handle,
            replica: replica_name(),
            sweep_holder: Default::default(),
            query_timeout,
            writes: Default::default(),
        });
        let pool = store.pool.clone();
        let check = async move {
            if migrate {
                migrations::apply(&pool).await
            } else {
                migrations::check(&pool).await
            }
        };
        store
            .spawn_job(check)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        Ok(store)
    }

    /// Checks, without changing anything, that the database at `url` answers: for
    /// `taskgate check-config`. Returns a line naming the server version and the schema
    /// version found (0 before taskgate's first start on it).
    ///
    /// Errors: [`StoreError::Open`] with the reason (URL, connection, authentication).
    pub async fn probe<'a>(
        url: &str,
        tls: impl Into<crate::tls::ClientTls<'a>>,
    ) -> Result<String, StoreError> {
        let tls = tls.into();
        let shown = redact(url);
        let open_err = |detail: String| StoreError::Open {
            path: shown.clone(),
            detail,
        };
        let mut config = parse(url).map_err(open_err)?;
        super::tls::check_client_auth(&config, &tls).map_err(open_err)?;
        // Every step gets its answer within the query timeout (see `bounded`): a database that
        // accepts the connection but does not answer (a stopped server) fails the probe in
        // time; the connection's start-up gets twice that (its TCP connect has the first).
        let limit = bound(&mut config);
        let (client, driver) = if super::tls::wanted(&config) {
            let tls = super::tls::connector(tls).map_err(open_err)?;
            let (client, conn) =
                within(2 * limit, "the connection's start-up", config.connect(tls))
                    .await
                    .map_err(open_err)?;
            (client, tokio::spawn(async move { conn.await.map(drop) }))
        } else {
            let connect = config.connect(tokio_postgres::NoTls);
            let (client, conn) = within(2 * limit, "the connection's start-up", connect)
                .await
                .map_err(open_err)?;
            (client, tokio::spawn(async move { conn.await.map(drop) }))
        };
        let ask = |sql: &'static str| within(limit, sql, client.query_one(sql, &[]));
        let version: String = ask("SHOW server_version").await.map_err(open_err)?.get(0);
        let exists: bool = ask("SELECT to_regclass('taskgate_schema') IS NOT NULL")
            .await
            .map_err(open_err)?
            .get(0);
        let schema: i32 = if exists {
            ask("SELECT coalesce(max(version), 0) FROM taskgate_schema")
                .await
                .map_err(open_err)?
                .get(0)
        } else {
            0
        };
        drop(client);
        driver.abort();
        Ok(format!(
            "PostgreSQL {version} at {shown} reachable; taskgate schema version {schema} (this taskgate: {})",
            migrations::MIGRATIONS.last().map_or(0, |m| m.0)
        ))
    }
}

/// `step` of [`PgStore::probe`], `what` it asks, answered within `limit`: its result, its error
/// as text, or past `limit` "postgres: no answer within N ms to …".
async fn within<T>(
    limit: Duration,
    what: &str,
    step: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, step).await {
        Ok(answer) => answer.map_err(|e| pg_err(e).to_string()),
        Err(_) => Err(format!(
            "postgres: no answer within {} ms to {what} (the URL's connect_timeout)",
            limit.as_millis()
        )),
    }
}

//! Assembles taskgate: the edge, the `McpService` stack per upstream, the upstream clients and the
//! admin listener. The only module that knows all the parts.
//!
//! ```text
//! client ─HTTP─▶ http::streamable (edge) ─▶ [layers] ─▶ upstream::HttpUpstream ─HTTP─▶ MCP server
//! ```

use crate::auth::Authenticator;
use crate::config::Config;

use crate::http::admin::{Admin, UpstreamTarget};
use crate::http::server::{connection_budget, serve, Limits};
use crate::http::streamable::{Edge, EdgeSettings, Route};
use crate::layers::bridge::{BridgeLayer, BridgeState};
use crate::layers::cancel::{CancelLayer, CancelState};
use crate::layers::ids::IdsLayer;
use crate::layers::observe::ObserveLayer;
use crate::layers::session::{SessionLayer, Sessions};
use crate::layers::session_guard::SessionGuardLayer;
use crate::layers::tasks::TasksLayer;
use crate::layers::upgrade::{cancel_orphans, UpgradeLayer, UpgradeState};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::store::{PgStore, SledStore, StoreError, TaskStore};
use crate::upstream::HttpUpstream;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use crate::exchange::McpStack;

/// Why taskgate could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not bind its address.
    #[error("cannot listen on {addr} ({which}): {source}")]
    Bind {
        /// `gateway` or `admin`.
        which: &'static str,
        /// The configured address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The task store could not be opened (another taskgate may hold its lock).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `[auth]` could not be set up (the HTTPS client of `mode = "oauth"`).
    #[error("auth: {0}")]
    Auth(String),
}

/// A started taskgate: its bound addresses and the handle that stops it.
pub struct Running {
    /// Where the MCP endpoint listens (port resolved when the config said 0).
    pub gateway_addr: SocketAddr,
    /// Where the admin endpoints listen.
    pub admin_addr: SocketAddr,
    /// The metrics registry (for tests and embedding).
    pub metrics: Arc<Metrics>,
    /// The task registry.
    pub registry: Arc<Registry>,
    /// The sled store, closed (flushed, committer joined) on shutdown; `None` on PostgreSQL.
    sled: Option<Arc<SledStore>>,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    sweeper: JoinHandle<()>,
}

impl Running {
    /// Stops accepting connections, lets in-flight exchanges finish within the drain timeout,
    /// ends GET streams, and returns when both listeners are closed.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for s in self.servers {
            let _ = s.await;
        }
        self.sweeper.abort();
        // Flushes and joins the committer thread: not on a runtime worker.
        if let Some(store) = self.sled {
            let _ = tokio::task::spawn_blocking(move || store.close()).await;
        }
    }
}

/// Binds both listeners and starts serving. Returns once the listeners are bound.
///
/// Errors: [`StartError::Bind`] when an address is taken or not allowed.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let upstream_names: Vec<String> = config.upstream.iter().map(|u| u.name.clone()).collect();
    let metrics = Arc::new(Metrics::new(&upstream_names));
    let (store, sled) = open_store(&config, &metrics).await?;
    // Counting what the store holds scans it: on the blocking pool, like every store call.
    let registry = {
        let (store, metrics, tasks) = (store.clone(), metrics.clone(), config.tasks.clone());
        tokio::task::spawn_blocking(move || Registry::new(store, metrics, tasks))
            .await
            .map_err(|e| StoreError::Db(format!("counting the store failed: {e}")))??
    };
    // Callers carry principals in every mode but `none` (bearer tokens and OAuth access tokens
    // alike): a session id taskgate does not hold is then refused, never forwarded, since it
    // cannot tell whose it is (issue 29 #1: `mode == bearer` let OAuth callers through).
    let authenticated = config.auth.mode.identifies_callers();
    let sessions = Sessions::with_caps(
        config.gateway.max_sessions,
        Duration::from_millis(config.gateway.session_idle_ms),
        config
            .limits
            .sessions_per_principal(config.gateway.max_sessions),
    );
    // Held sessions (the bridge's, for an upstream without 2025 sessions) are written to the
    // store before their id goes out: the session table gets its store handle here.
    sessions.keep_held_in(store.clone());
    let mut orphan_jobs = Vec::new();

    let bind_error = |source| StartError::Bind {
        which: "gateway",
        addr: config.gateway.listen,
        source,
    };
    let threads = crate::http::listen::serving_threads(config.gateway.threads);
    let mut gateway_sockets =
        crate::http::listen::bind_group(config.gateway.listen, threads).map_err(bind_error)?;
    let gateway_listener = TcpListener::from_std(gateway_sockets.remove(0)).map_err(bind_error)?;
    // The other serving threads' runtimes, built here so that a failure is a start error.
    let runtimes = gateway_sockets
        .into_iter()
        .map(|socket| Ok((socket, ServingRuntime::new()?)))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(bind_error)?;
    let admin_listener = TcpListener::bind(config.admin.listen)
        .await
        .map_err(|source| StartError::Bind {
            which: "admin",
            addr: config.admin.listen,
            source,
        })?;
    let gateway_addr = gateway_listener.local_addr().expect("bound socket");
    let admin_addr = admin_listener.local_addr().expect("bound socket");

    let mut routes: Vec<Route> = Vec::new();
    for u in &config.upstream {
        let upstream = HttpUpstream::new(u, metrics.clone());
        let name = upstream.name().clone();
        // Outermost first; see `layers` for why this order. Each stack has its own upgrade and
        // cancel state.
        let upgrade_state = UpgradeState::new(
            sessions.clone(),
            registry.clone(),
            config.upgrade.clone(),
            Duration::from_millis(u.timeout_ms),
        );
        let cancel_state = CancelState::new(registry.clone(), Duration::from_millis(u.timeout_ms));
        let inner = tower::ServiceBuilder::new()
            .layer(SessionLayer::new(sessions.clone()))
            .layer(TasksLayer::new(registry.clone(), authenticated))
            .layer(CancelLayer::new(cancel_state.clone()))
            .layer(BridgeLayer::new(BridgeState::new(
                registry.clone(),
                u.protocol,
                Duration::from_millis(u.timeout_ms),
                sessions.clone(),
                cancel_state,
            )))
            .layer(ObserveLayer::new(registry.clone()))
            .layer(IdsLayer::new(metrics.clone()))
            .service(upstream);
        // On a shared store another live replica may be waiting on an upgraded task: orphans
        // are not guessed there (see ARCHITECTURE.md, "A tier on PostgreSQL").
        if config.upgrade.enabled && !store.shared() {
            orphan_jobs.push((name.clone(), upgrade_state.clone(), inner.clone()));
        }
        let stack = tower::ServiceBuilder::new()
            .layer(
                SessionGuardLayer::new(sessions.clone(), authenticated)
                    .defer_deletes(registry.clone()),
            )
            .layer(UpgradeLayer::new(upgrade_state.clone()))
            .service(inner);
        routes.push(Route {
            name,
            stack: McpStack::new(stack),
        });
    }
    for (name, state, inner) in orphan_jobs {
        tokio::spawn(async move {
            let done = cancel_orphans(&state, &name, inner).await;
            if done.found > 0 {
                tracing::info!(
                    upstream = %name,
                    found = done.found,
                    cancelled = done.cancelled,
                    "upgraded tasks orphaned by a restart: cancel sent upstream"
                );
            }
        });
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let settings = EdgeSettings {
        allowed_hosts: allowed_hosts(&config.gateway.allowed_hosts, gateway_addr),
        allowed_origins: allowed_origins(&config.gateway.allowed_origins, gateway_addr),
        max_body_bytes: config.gateway.max_body_bytes,
        body_timeout: Duration::from_millis(config.gateway.request_timeout_ms),
        sse_keepalive: Duration::from_millis(config.gateway.sse_keepalive_ms),
        limits: crate::limits::Limiter::new(&config.limits),
    };
    let auth = Authenticator::new(&config.auth).map_err(StartError::Auth)?;
    auth.warm_up();
    let edge = Arc::new(Edge::new(
        routes,
        settings,
        auth,
        metrics.clone(),
        shutdown_rx.clone(),
    ));
    let targets = config
        .upstream
        .iter()
        .map(|u| {
            let uri: http::Uri = u.url.parse().expect("validated url");
            let authority = uri.authority().expect("validated url");
            UpstreamTarget {
                name: u.name.clone(),
                authority: format!(
                    "{}:{}",
                    authority.host(),
                    authority.port_u16().unwrap_or(80)
                ),
            }
        })
        .collect();
    let admin = Arc::new(
        Admin::new(metrics.clone(), targets, store.clone()).with_token(config.admin.token_sha256()),
    );
    let sweep_every = Duration::from_millis(config.tasks.sweep_interval_ms);
    let sweeper = {
        let registry = registry.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(sweep_every);
            loop {
                tick.tick().await;
                registry.sweep().await;
            }
        })
    };
    let drain = Duration::from_millis(config.gateway.drain_timeout_ms);
    let gateway_limits = Limits {
        connections: connection_budget(config.gateway.max_connections),
        header_timeout: Duration::from_millis(config.gateway.request_timeout_ms),
    };
    let admin_limits = Limits {
        connections: connection_budget(256),
        header_timeout: Duration::from_secs(10),
    };
    let mut servers = Vec::with_capacity(runtimes.len() + 2);
    for (index, (socket, runtime)) in runtimes.into_iter().enumerate() {
        let (edge, shutdown, limits) = (edge.clone(), shutdown_rx.clone(), gateway_limits.clone());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            // Linux keeps 15 bytes of a thread's name: `tg-serve-1023` fits.
            .name(format!("tg-serve-{}", index + 1))
            .spawn(move || {
                crate::upstream::pool::pin_thread(index + 1);
                let runtime = runtime.into_inner();
                runtime.block_on(async move {
                    match TcpListener::from_std(socket) {
                        Ok(listener) => serve(listener, edge, shutdown, drain, limits).await,
                        Err(e) => tracing::error!(error = %e, "a serving thread could not listen"),
                    }
                });
                // Dropping the runtime ends what its connections left running (as at exit).
                drop(runtime);
                let _ = done_tx.send(());
            })
            .map_err(bind_error)?;
        servers.push(tokio::spawn(async move {
            let _ = done_rx.await;
        }));
    }
    servers.extend([
        tokio::spawn(serve(
            gateway_listener,
            edge,
            shutdown_rx.clone(),
            drain,
            gateway_limits,
        )),
        tokio::spawn(serve(
            admin_listener,
            admin,
            shutdown_rx,
            drain,
            admin_limits,
        )),
    ]);
    tracing::info!(%gateway_addr, %admin_addr, threads, upstreams = ?upstream_names, "taskgate listening");
    Ok(Running {
        gateway_addr,
        admin_addr,
        metrics,
        registry,
        sled,
        shutdown: shutdown_tx,
        servers,
        sweeper,
    })
}

/// The single-threaded runtime of one extra serving thread (`gateway.threads`), until its
/// thread takes it. Dropped before that (a later start error inside `start`, which runs on a
/// runtime), it is shut down in the background: dropping a runtime in an async context panics.
struct ServingRuntime(Option<tokio::runtime::Runtime>);

impl ServingRuntime {
    fn new() -> std::io::Result<ServingRuntime> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(ServingRuntime(Some(runtime)))
    }

    fn into_inner(mut self) -> tokio::runtime::Runtime {
        self.0.take().expect("taken once")
    }
}

impl Drop for ServingRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Opens the configured task store: sled at `store.path`, or PostgreSQL at the URL of
/// `store.url_env` / `store.url` (migrated at start).
async fn open_store(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<dyn TaskStore>, Option<Arc<SledStore>>), StoreError> {
    match config.store.backend {
        crate::config::StoreBackend::Sled => {
            let store = SledStore::open(
                &config.store.path,
                config.store.cache_capacity_bytes,
                Some(metrics.clone()),
            )?;
            Ok((store.clone(), Some(store)))
        }
        crate::config::StoreBackend::Postgres => {
            let url = config
                .store
                .database_url()
                .ok_or_else(|| StoreError::Open {
                    path: config.store.url_env.clone().unwrap_or_default(),
                    detail: "the database URL variable is not set".into(),
                })?;
            let store = PgStore::open(
                &url,
                config.store.pool_size as usize,
                config.store.ca_file.as_deref(),
            )
            .await?;
            Ok((store, None))
        }
    }
}

fn loopback_names(port: u16) -> Vec<String> {
    let mut v = Vec::new();
    for host in ["localhost", "127.0.0.1", "[::1]"] {
        v.push(host.to_string());
        v.push(format!("{host}:{port}"));
    }
    v
}

/// Accepted `Host` values: the listen address, `localhost`, `127.0.0.1`, `[::1]` (with or without
/// the port) and the configured extras; `None` (any) if the extras contain `"*"`.
fn allowed_hosts(extra: &[String], listen: SocketAddr) -> Option<Vec<String>> {
    if extra.iter().any(|h| h == "*") {
        return None;
    }
    let mut v = loopback_names(listen.port());
    v.push(listen.to_string());
    v.push(listen.ip().to_string());
    v.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
    Some(v)
}

/// Accepted `Origin` values: `http://` + the loopback names, plus the configured extras; `None`
/// (any) if the extras contain `"*"`.
fn allowed_origins(extra: &[String], listen: SocketAddr) -> Option<Vec<String>> {
    if extra.iter().any(|h| h == "*") {
        return None;
    }
    let mut v: Vec<String> = loopback_names(listen.port())
        .into_iter()
        .map(|h| format!("http://{h}"))
        .collect();
    v.extend(
        extra
            .iter()
            .map(|o| o.trim_end_matches('/').to_ascii_lowercase()),
    );
    Some(v)
}

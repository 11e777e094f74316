//! Assembles taskgate: the edge, the `McpService` stack per upstream, the upstream clients and the
//! admin listener. The only module that knows all the parts.
//!
//! ```text
//! client ─HTTP─▶ http::streamable (edge) ─▶ [layers] ─▶ upstream::Upstream ─▶ MCP server
//! ```

use crate::auth::Authenticator;
use crate::config::{Config, TaskOwnership, UpgradeConfig, UpstreamConfig};

use crate::http::admin::{Admin, UpstreamCheck, UpstreamTarget};
use crate::http::server::{connection_budget, serve, Drain, Limits};
use crate::http::streamable::{Edge, EdgeSettings, Route};
use crate::layers::bridge::reverse::{ReverseLayer, ReverseState};
use crate::layers::bridge::{BridgeLayer, BridgeState, Discovery};
use crate::layers::cancel::{CancelLayer, CancelState};
use crate::layers::gateway_tasks::{GatewayTasksLayer, GatewayTasksState};
use crate::layers::held_sessions::{
    HeldSessions, HeldSessionsLayer, HeldUpstream, HeldUpstreamLayer,
};
use crate::layers::ids::IdsLayer;
use crate::layers::observe::ObserveLayer;
use crate::layers::relay::{OwnIds, Relay};
use crate::layers::session::{HandDown, SessionLayer, Sessions};
use crate::layers::session_guard::SessionGuardLayer;
use crate::layers::tasks::TasksLayer;
use crate::layers::upgrade::{cancel_orphans, follow_adopted, UpgradeLayer, UpgradeState};
use crate::metrics::{Metrics, UpgradeOutcome};
use crate::registry::Registry;
use crate::store::{PgStore, SledStore, StoreError, TaskStore};
use crate::telemetry::{Settings, Telemetry};
use crate::upstream::stdio::{ChildGone, StdioHandle, StdioTransport};
use crate::upstream::Upstream;
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
    /// `[telemetry]` or an `OTEL_*` variable is not usable, or the exporter could not be built.
    #[error("telemetry: {0}")]
    Telemetry(String),
    /// An upstream's client could not be built (an `https://` one's `ca_file` became unreadable
    /// after the config was checked).
    #[error("upstream {name:?}: {why}")]
    Upstream {
        /// The upstream's name.
        name: String,
        /// What failed.
        why: String,
    },
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
    /// The stdio upstreams, whose children are ended on shutdown.
    stdio: Vec<StdioHandle>,
    /// The held calls of gateway tasks a graceful stop lets finish within the drain.
    linger: Arc<Linger>,
    /// `gateway.drain_timeout_ms`.
    drain: Duration,
    /// The trace export (`[telemetry]`), flushed on shutdown.
    telemetry: Option<Telemetry>,
    shutdown: watch::Sender<bool>,
    /// Turns true to end the drain at once ([`DrainCut`]).
    cut: Arc<watch::Sender<bool>>,
    /// Held while the store is closed; a forced exit waits for it ([`ForcedExit`]).
    closing: Arc<tokio::sync::Mutex<()>>,
    /// Stops the admin listener, once the drain has ended.
    admin_stop: watch::Sender<bool>,
    /// The gateway's serving threads (one handle each, done when drained).
    servers: Vec<JoinHandle<()>>,
    /// The admin listener: it serves through the drain (`/readyz` 503, `/metrics` answering).
    admin: JoinHandle<()>,
    sweeper: JoinHandle<()>,
}

/// Ends a stop's drain at once (a second SIGTERM/SIGINT): the connections still in flight and
/// the held calls of gateway tasks are not waited for any longer; the rest of the stop (stdio
/// children, trace export, the store's flush) goes on.
#[derive(Clone)]
pub struct DrainCut(Arc<watch::Sender<bool>>);

impl DrainCut {
    /// Ends the drain now (again: nothing more).
    pub fn cut(&self) {
        self.0.send_replace(true);
    }
}

/// Ends the process at once, skipping what is left of a stop (a third SIGTERM/SIGINT): the
/// stdio children (they die with it: `PR_SET_PDEATHSIG`), the last spans' export, the store's
/// close.
///
/// Why that is safe for the store: every write taskgate waited for before answering (a
/// task's record before its `CreateTaskResult`, and every other write a request waits on) is
/// durable already (sled: group commit + `fdatasync`; PostgreSQL: a committed transaction), so
/// the process ending here is, for the store, `kill -9`, which sled's log recovers from (the
/// full tier's durability tests kill taskgate mid-load over and over). What is lost is what
/// no one waited for: a change still waiting for its group commit (at most
/// `store::sled_store::SOON`, 10 ms, for one no request waits on: a non-terminal status, a
/// stored result, a sweep), as with `kill -9`. The one step it cuts last is the store's
/// close: once the stop has begun it (flush, committer joined), the exit waits for its end, a
/// few ms, but at most [`FORCED_EXIT_CLOSE_WAIT`]: a store whose close does not end (sled's
/// flush after an I/O error, tester4 #1) never keeps the process up after a third signal.
#[derive(Clone)]
pub struct ForcedExit(Arc<tokio::sync::Mutex<()>>);

impl ForcedExit {
    /// Exits the process with `code` now, or, while the store is being closed, as soon as it
    /// is (no close starts after this is called).
    pub async fn exit(&self, code: i32) -> ! {
        if !self.wait_for_close(FORCED_EXIT_CLOSE_WAIT).await {
            tracing::error!(
                wait_ms = FORCED_EXIT_CLOSE_WAIT.as_millis() as u64,
                "the task store's close did not end; exiting without it"
            );
        }
        std::process::exit(code)
    }

    /// Waits until no store close is under way (then none starts), at most `bound`: true when
    /// none is, false when one was still running at `bound`.
    async fn wait_for_close(&self, bound: Duration) -> bool {
        match tokio::time::timeout(bound, self.no_close()).await {
            Ok(guard) => {
                // Held until the process ends: no close starts after a forced exit.
                std::mem::forget(guard);
                true
            }
            Err(_) => false,
        }
    }

    /// Once no store close is under way: held, none starts.
    async fn no_close(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.0.clone().lock_owned().await
    }
}

/// How long a forced exit (the third signal) waits for a store close under way.
pub const FORCED_EXIT_CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How long the stop waits for the store's close (a flush and the committer's last commit,
/// a few ms) before it ends without it: twice a group commit's deadline.
pub const STORE_CLOSE_WAIT: Duration = Duration::from_secs(20);

/// Runs the store's `close` off the runtime (it flushes and joins the committer thread), holding
/// `closing` ([`ForcedExit`]) until it has returned, and waits for it at most `bound` (then
/// logs it and returns: the close's thread ends with the process). The guard is the close
/// thread's, not this future's: after a third signal `main` polls the stop no more, and a guard
/// kept here would never be released (the forced exit waiting for it). A thread of its own, not
/// the runtime's blocking pool: the runtime's drop would wait for a close that never ends.
async fn close_store(
    closing: &Arc<tokio::sync::Mutex<()>>,
    bound: Duration,
    close: impl FnOnce() + Send + 'static,
) {
    let closing = closing.clone().lock_owned().await;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("taskgate-store-close".into())
        .spawn(move || {
            close();
            drop(closing);
            let _ = done_tx.send(());
        });
    if spawned.is_err() {
        tracing::error!("could not start the task store's close; stopping without it");
        return;
    }
    if tokio::time::timeout(bound, done_rx).await.is_err() {
        tracing::error!(
            wait_ms = bound.as_millis() as u64,
            "the task store's close did not end; stopping without it"
        );
    }
}

impl Running {
    /// The handle that ends a stop's drain at once (see [`DrainCut`]); take it before
    /// [`Running::shutdown`].
    pub fn drain_cut(&self) -> DrainCut {
        DrainCut(self.cut.clone())
    }

    /// The handle that ends the process during a stop (see [`ForcedExit`]); take it before
    /// [`Running::shutdown`].
    pub fn forced_exit(&self) -> ForcedExit {
        ForcedExit(self.closing.clone())
    }

    /// Stops accepting connections, lets in-flight exchanges, the held calls of gateway
    /// tasks and the bridge's background cancels finish within the drain timeout
    /// (`gateway.drain_timeout_ms`, counted from the stop) or until the drain is cut
    /// ([`Running::drain_cut`]), ends GET streams, and returns when both listeners are closed.
    /// The admin listener serves until the drain has ended (`/readyz` answers 503 "draining"
    /// meanwhile, `/metrics` the drain's counts). A held call still running at the drain's end
    /// stops with the process; its task is failed at the next start ("taskgate restarted"), or
    /// in a tier by the replica that adopts its lease. A background cancel still running then is
    /// dropped (logged at warn with their number, as the held calls are).
    pub async fn shutdown(self) {
        let _ = self
            .linger
            .deadline
            .set(tokio::time::Instant::now() + self.drain);
        let _ = self.shutdown.send(true);
        // Each serving thread keeps its runtime (where the held calls it started run) until
        // they ended or the drain did (`Linger`); serving thread 0's run on this runtime.
        for s in self.servers {
            let _ = s.await;
        }
        self.linger.wait().await;
        // The drain has ended: the admin listener (the probes, `/metrics`) closes now.
        let _ = self.admin_stop.send(true);
        let _ = self.admin.await;
        self.sweeper.abort();
        // Every child process and its group: close stdin, SIGTERM, SIGKILL (upstream::stdio).
        futures_util::future::join_all(self.stdio.iter().map(StdioHandle::shutdown)).await;
        // The last spans: the export thread flushes them, off the runtime.
        if let Some(telemetry) = self.telemetry {
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        }
        // Flushes and joins the committer thread: not on a runtime worker. A forced exit
        // waits for it (`ForcedExit`).
        if let Some(store) = self.sled {
            close_store(&self.closing, STORE_CLOSE_WAIT, move || store.close()).await;
        }
    }
}

/// Binds both listeners and starts serving. Returns once the listeners are bound.
///
/// Errors: [`StartError::Bind`] when an address is taken or not allowed, [`StartError::Store`]
/// when the task store cannot be opened or counted, [`StartError::Auth`] when `[auth]` cannot be
/// set up.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let upstream_names: Vec<String> = config.upstream.iter().map(|u| u.name.clone()).collect();
    let metrics = Arc::new(Metrics::new(&upstream_names));
    let telemetry = start_telemetry(&config, &metrics)?;
    let (store, sled) = open_store(&config, &metrics).await?;
    let registry = open_registry(&config, &store, &metrics).await?;
    if let Some(telemetry) = &telemetry {
        registry.trace_with(telemetry.clone());
    }
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (cut_tx, cut_rx) = watch::channel(false);
    let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
    let shared = Shared {
        shutdown: shutdown_rx.clone(),
        sessions: session_table(&config, &store, registry.store_threads(), &metrics),
        registry: registry.clone(),
        metrics: metrics.clone(),
        authenticated: config.auth.mode.identifies_callers(),
        upgrade: config.upgrade.clone(),
        // On a shared store another live replica may be waiting on an upgraded task: orphans
        // are not guessed there (see ARCHITECTURE.md, "A tier on PostgreSQL").
        cancel_orphans: config.upgrade.enabled && !store.shared(),
        telemetry: telemetry.clone(),
    };
    fail_gateway_tasks_of_previous_run(&config, &registry).await;
    // A tier: this replica's call leases (held gateway-task calls, followed upgraded calls).
    registry.keep_leases(
        Duration::from_millis(config.store.lease_ms),
        Duration::from_millis(config.store.lease_poll_ms),
    );
    // A tier: terminal statuses the store refused (an outage) written again once it answers.
    registry.retry_refused_reports();
    let listeners = Listeners::bind(&config).await?;
    let (gateway_addr, admin_addr) = (listeners.gateway_addr, listeners.admin_addr);

    let mut routes: Vec<Route> = Vec::with_capacity(config.upstream.len());
    let mut stdio = Vec::new();
    let mut linger = Linger {
        registry: Some(registry.clone()),
        ..Linger::default()
    };
    let mut ready = Vec::new();
    for u in &config.upstream {
        let built = build_stack(u, &shared, &config)?;
        linger.gateway_tasks.extend(built.gateway_tasks);
        linger.bridges.push(built.bridge);
        linger.upgrades.push(built.upgrade);
        ready.extend(built.ready);
        if let Some(orphans) = built.orphans {
            orphans.spawn();
        }
        if let Some(handle) = built.stdio {
            spawn_fail_dead_tasks(handle.clone(), registry.clone());
            spawn_observe_unseen_statuses(&handle, registry.clone());
            stdio.push(handle);
        }
        routes.push(built.route);
    }
    let linger = Arc::new(linger);

    let auth = Authenticator::new(&config.auth).map_err(StartError::Auth)?;
    auth.warm_up();
    let edge = Arc::new(
        Edge::new(
            routes,
            edge_settings(&config, gateway_addr),
            auth,
            metrics.clone(),
            shutdown_rx.clone(),
        )
        .with_telemetry(telemetry.clone()),
    );
    let admin = Arc::new(
        Admin::new(metrics.clone(), ready, store.clone())
            .with_token(config.admin.token_sha256())
            .with_probes(stdio_probes(&stdio))
            .with_draining(shutdown_rx.clone()),
    );
    let sweeper = spawn_sweeper(
        registry.clone(),
        Duration::from_millis(config.tasks.sweep_interval_ms),
    );
    let serving = Serving {
        edge,
        admin,
        shutdown: shutdown_rx,
        admin_stop: admin_stop_rx,
        drain: Drain {
            timeout: Duration::from_millis(config.gateway.drain_timeout_ms),
            cut: cut_rx,
        },
        linger: linger.clone(),
        gateway_limits: Limits {
            connections: connection_budget(config.gateway.max_connections),
            header_timeout: Duration::from_millis(config.gateway.request_timeout_ms),
        },
    };
    let threads = listeners.threads;
    let (servers, admin) = serving
        .spawn(listeners)
        .map_err(|source| StartError::Bind {
            which: "gateway",
            addr: config.gateway.listen,
            source,
        })?;
    tracing::info!(%gateway_addr, %admin_addr, threads, upstreams = ?upstream_names, "taskgate listening");
    Ok(Running {
        gateway_addr,
        admin_addr,
        metrics,
        registry,
        sled,
        stdio,
        linger,
        drain: Duration::from_millis(config.gateway.drain_timeout_ms),
        telemetry,
        shutdown: shutdown_tx,
        cut: Arc::new(cut_tx),
        closing: Arc::default(),
        admin_stop: admin_stop_tx,
        servers,
        admin,
        sweeper,
    })
}

/// The trace export `[telemetry]` and the `OTEL_*` variables ask for (`telemetry::Settings`),
/// or `None` when no endpoint is set (no span is made then). Errors: [`StartError::Telemetry`].
fn start_telemetry(config: &Config, metrics: &Metrics) -> Result<Option<Telemetry>, StartError> {
    let settings = Settings::resolve(&config.telemetry, |name| std::env::var(name).ok())
        .map_err(|e| StartError::Telemetry(e.to_string()))?;
    let Some(settings) = settings else {
        return Ok(None);
    };
    let telemetry = Telemetry::start(
        &settings,
        metrics.trace_export_failures_total.clone(),
        metrics.trace_spans_dropped_total.clone(),
    )
    .map_err(StartError::Telemetry)?;
    tracing::info!(endpoint = %settings.traces_endpoint, service = %settings.service_name, ratio = settings.sample_ratio, "exporting traces (OTLP/HTTP)");
    Ok(Some(telemetry))
}

/// The registry over `store`. Counting what the store holds scans it: on the blocking pool,
/// like every store call.
async fn open_registry(
    config: &Config,
    store: &Arc<dyn TaskStore>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<Registry>, StoreError> {
    let (store, metrics, tasks) = (store.clone(), metrics.clone(), config.tasks.clone());
    tokio::task::spawn_blocking(move || Registry::new(store, metrics, tasks))
        .await
        .map_err(|e| StoreError::Db(format!("counting the store failed: {e}")))?
}

/// The session table every upstream stack shares, bounded by `gateway.max_sessions`,
/// `gateway.session_idle_ms` and `[limits]`'s sessions per principal.
fn session_table(
    config: &Config,
    store: &Arc<dyn TaskStore>,
    threads: crate::registry::StoreThreads,
    metrics: &Metrics,
) -> Arc<Sessions> {
    let sessions = Sessions::with_caps(
        config.gateway.max_sessions,
        Duration::from_millis(config.gateway.session_idle_ms),
        config
            .limits
            .sessions_per_principal(config.gateway.max_sessions),
    );
    // Held sessions (the bridge's, for an upstream without 2025 sessions) are written to the
    // store before their id goes out: the session table gets its store handle here, and runs
    // its store calls on the registry's store threads.
    sessions.keep_held_in(store.clone(), threads);
    sessions.count_store_failures(metrics.store_write_failures_total.clone());
    sessions
}

/// What every upstream's stack shares: the handles its layers get in their constructors.
struct Shared {
    sessions: Arc<Sessions>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    /// Callers carry principals in every mode but `none` (bearer tokens and OAuth access
    /// tokens alike): a session id taskgate does not hold is then refused, never forwarded,
    /// since it cannot tell whose it is (issue 29 #1: `mode == bearer` let OAuth callers
    /// through).
    authenticated: bool,
    upgrade: UpgradeConfig,
    /// Whether upgraded tasks a restart orphaned are cancelled at start.
    cancel_orphans: bool,
    /// The trace export, when `[telemetry]` is on: a CLIENT span per upstream exchange.
    telemetry: Option<Telemetry>,
    /// taskgate's shutdown signal (`true`: stopping): what runs in the background stops on it.
    shutdown: watch::Receiver<bool>,
}

/// One upstream's stack, the start-up job that cancels its orphaned upgraded tasks, and for a
/// stdio upstream the handle on its children.
struct BuiltStack {
    route: Route,
    orphans: Option<OrphanSweep>,
    stdio: Option<StdioHandle>,
    /// The gateway tasks' state (`upstream.tasks = "gateway"`), whose held calls a graceful
    /// stop waits for.
    gateway_tasks: Option<Arc<GatewayTasksState>>,
    /// The bridge's state, whose background cancels a graceful stop waits for.
    bridge: Arc<BridgeState>,
    /// The upgrade layer's state, whose refused final writes a graceful stop waits for.
    upgrade: Arc<UpgradeState>,
    /// An HTTP upstream's `/readyz` check.
    ready: Option<UpstreamTarget>,
}

/// Builds the stack in front of upstream `u`: the layers, outermost first (see `layers` for
/// why this order), over its upstream client: the session stage (`session_guard`, `session`),
/// `upgrade`, then the rest. Each stack has its own upgrade and cancel state.
fn build_stack(
    u: &UpstreamConfig,
    shared: &Shared,
    config: &Config,
) -> Result<BuiltStack, StartError> {
    // A `command` upstream is a supervised child process (upstream::stdio); a `url` one
    // Streamable HTTP.
    let idle = Duration::from_millis(config.gateway.session_idle_ms);
    // A principal's per_session children count against its share of sessions too.
    let caps =
        crate::upstream::stdio::ChildCaps::for_config(&config.limits, config.gateway.max_sessions);
    // An HTTP upstream's `/readyz` check (a stdio one's is its supervisor's probe).
    let mut ready = None;
    let (upstream, stdio) =
        match StdioTransport::with_caps(u, shared.metrics.clone(), idle, caps) {
            Some(t) => {
                let handle = t.handle();
                (Upstream::new(t), Some(handle))
            }
            None => {
                let http = crate::upstream::StreamableHttp::new(u, shared.metrics.clone())
                    .map_err(|why| StartError::Upstream {
                        name: u.name.clone(),
                        why,
                    })?;
                let readiness = http.readiness();
                let check: UpstreamCheck = Arc::new(move || {
                    let readiness = readiness.clone();
                    Box::pin(async move { readiness.check().await })
                });
                ready = Some(UpstreamTarget {
                    name: u.name.clone(),
                    check,
                });
                let upstream = Upstream::new(http);
                (upstream, None)
            }
        };
    let upstream = upstream.traced(shared.telemetry.as_ref(), u);
    let name = upstream.name().clone();
    let timeout = Duration::from_millis(u.timeout_ms);
    let upgrade_state = UpgradeState::new(shared.registry.clone(), shared.upgrade.clone(), timeout);
    let cancel_state =
        CancelState::stopping_with(shared.registry.clone(), timeout, shared.shutdown.clone());
    let gateway_tasks =
        GatewayTasksState::new(shared.registry.clone(), u.tasks == TaskOwnership::Gateway);
    // The upstream's era: one fact both bridges read (learned once, issue 30).
    let era = Discovery::new(u.protocol, timeout);
    // taskgate's own request ids and the input relay, shared by the bridge and the held
    // sessions' upstream stage below it (issue 30).
    let ids = Arc::new(OwnIds::default());
    let relay = Arc::new(Relay::new(
        ids.clone(),
        timeout,
        shared.registry.metrics().clone(),
    ));
    let bridge = BridgeState::new(
        shared.registry.clone(),
        era.clone(),
        cancel_state.clone(),
        ids.clone(),
        relay.clone(),
    );
    // Below `upgrade`: what its own requests (and the orphan sweep's) go through.
    let inner = tower::ServiceBuilder::new()
        .layer(TasksLayer::new(
            shared.registry.clone(),
            shared.authenticated,
        ))
        .layer(CancelLayer::new(cancel_state.clone()))
        .layer(GatewayTasksLayer::new(gateway_tasks.clone()))
        .layer(HeldSessionsLayer::new(HeldSessions::new(
            shared.sessions.clone(),
        )))
        .layer(BridgeLayer::new(bridge.clone()))
        // Where a held session's requests go: stateless 2026-07-28 requests (issue 30).
        .layer(HeldUpstreamLayer::new(HeldUpstream::new(
            ids,
            relay,
            era.clone(),
            timeout,
        )))
        // 2026-07-28 clients on a 2025-11-25-only upstream (issue 33): below the bridge, which
        // passes every 2026-07-28 request on.
        .layer(ReverseLayer::new(ReverseState::new(
            shared.registry.clone(),
            era,
            timeout,
            idle,
        )))
        .layer(ObserveLayer::new(shared.registry.clone()))
        .layer(IdsLayer::new(shared.metrics.clone()))
        .service(upstream);
    let orphans = shared.cancel_orphans.then(|| OrphanSweep {
        name: name.clone(),
        state: upgrade_state.clone(),
        stack: McpStack::new(inner.clone()),
    });
    // A tier: an upgraded call a lost replica was following is adopted and followed here.
    if let Some(keeper) = shared
        .upgrade
        .enabled
        .then(|| shared.registry.leases())
        .flatten()
    {
        let (state, stack, up, metrics) = (
            upgrade_state.clone(),
            McpStack::new(inner.clone()),
            name.clone(),
            shared.metrics.clone(),
        );
        keeper.on_adopt(
            &name,
            crate::store::LeaseKind::Followed,
            Arc::new(move |task_id: String| {
                let (state, stack, up) = (state.clone(), stack.clone(), up.clone());
                let metrics = metrics.clone();
                Box::pin(async move {
                    match follow_adopted(&state, &up, stack, &task_id).await {
                        Ok(ended) => {
                            if ended.is_some() {
                                metrics.upgraded_call(&up, UpgradeOutcome::Adopted);
                            }
                            true
                        }
                        Err(e) => {
                            tracing::warn!(upstream = %up, task_id, error = %e, "an adopted upgraded call could not be followed");
                            false
                        }
                    }
                })
            }),
        );
    }
    // What is known of a session goes down on every request `upgrade` or a layer below reads.
    let hand_down = if shared.upgrade.enabled {
        HandDown::Every
    } else {
        HandDown::AllButPlainCalls
    };
    let stack = tower::ServiceBuilder::new()
        .layer(
            SessionGuardLayer::new(shared.sessions.clone(), shared.authenticated)
                .defer_deletes(shared.registry.clone())
                .hand_down(hand_down),
        )
        .layer(SessionLayer::new(shared.sessions.clone()).hand_down(hand_down))
        .layer(UpgradeLayer::new(upgrade_state.clone()))
        .service(inner);
    Ok(BuiltStack {
        route: Route {
            name,
            stack: McpStack::new(stack),
        },
        orphans,
        stdio,
        gateway_tasks: (u.tasks == TaskOwnership::Gateway).then_some(gateway_tasks),
        bridge,
        upgrade: upgrade_state,
        ready,
    })
}

/// A stdio upstream's task status notifications that no client's GET stream took (none open:
/// a client that never polls) are applied to the registry here, as the `observe` layer applies
/// those it passes: the record ends, and its owner's live-task slot is freed (tester 3 F17).
fn spawn_observe_unseen_statuses(handle: &StdioHandle, registry: Arc<Registry>) {
    let Some(mut statuses) = handle.unseen_statuses() else {
        return;
    };
    let upstream = handle.name().clone();
    tokio::spawn(async move {
        while let Some(bytes) = statuses.recv().await {
            let params = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|mut v| v.get_mut("params").map(serde_json::Value::take));
            if let Some(task) = params.filter(serde_json::Value::is_object) {
                registry
                    .observe_task(&upstream, task, "notifications/tasks/status")
                    .await;
            }
        }
    });
}

/// A stdio upstream's dead child took its tasks with it: the registry fails the ones that were
/// not terminal and records them released (`registry::gone`), for as long as taskgate runs.
/// At start, every task of the upstream recorded before is dead already: taskgate's previous
/// run took its children with it (a restart, a `kill -9`).
///
/// On a store replicas share (a tier), other replicas' children serve the same upstream name:
/// there only the tasks the dead child created are failed, and nothing at start.
fn spawn_fail_dead_tasks(handle: StdioHandle, registry: Arc<Registry>) {
    let Some(mut gone) = handle.deaths() else {
        return;
    };
    let started_ms = crate::mcp::task::now_ms();
    let tier = registry.store().shared();
    tokio::spawn(async move {
        let upstream = handle.name().clone();
        if !tier {
            let message = format!("upstream `{upstream}`: taskgate restarted, and the child process that ran the task with it; the task's state was lost");
            let failed = registry
                .fail_tasks_of_dead_process(&upstream, None, started_ms, &message)
                .await;
            if failed > 0 {
                tracing::warn!(upstream = %upstream, failed, "tasks of a previous run's stdio child marked failed");
            }
        }
        loop {
            let ChildGone {
                upstream,
                session,
                tasks,
                held,
                at_ms,
                why,
            } = match gone.recv().await {
                Some(event) => event,
                None => return,
            };
            let message = match &session {
                None => format!("upstream `{upstream}` restarted: {why}; the task's state was lost"),
                Some(_) => format!("upstream `{upstream}`: the session's process ended: {why}; the task's state was lost"),
            };
            // A shared child on a store of its own gateway: every task of the upstream was its.
            let only = (tier || session.is_some()).then_some(tasks);
            let mut failed = registry
                .fail_tasks_of_dead_process(&upstream, only, at_ms, &message)
                .await;
            // The gateway tasks whose held calls died with it (the child never knew them).
            failed += registry
                .release_held_of_dead_process(&upstream, held, &message)
                .await;
            if failed > 0 {
                tracing::warn!(upstream = %upstream, failed, "tasks of a dead stdio child marked failed");
            }
        }
    });
}

/// The gateway-owned tasks (`upstream.tasks = "gateway"`) a previous run left `working`: the
/// upstream calls taskgate held for them died with that run, so each is `failed` with a
/// `statusMessage` saying so (never `working` for ever) and released, before the listeners
/// open. Not on a store replicas share: another live replica may hold the call.
async fn fail_gateway_tasks_of_previous_run(config: &Config, registry: &Arc<Registry>) {
    if registry.store().shared() {
        return;
    }
    let started_ms = crate::mcp::task::now_ms();
    for u in config
        .upstream
        .iter()
        .filter(|u| u.tasks == TaskOwnership::Gateway)
    {
        let message = format!("taskgate restarted while it held this task's call to upstream `{}`; the call's result was lost", u.name);
        let failed = registry
            .fail_tasks_of_previous_run(
                &u.name,
                crate::store::Origin::Gateway,
                started_ms,
                &message,
            )
            .await;
        if failed > 0 {
            tracing::warn!(upstream = %u.name, failed, "gateway tasks of a previous run marked failed");
        }
    }
}

/// `/readyz` of the stdio upstreams: a live child.
fn stdio_probes(stdio: &[StdioHandle]) -> Vec<(String, crate::http::admin::ReadinessProbe)> {
    stdio
        .iter()
        .map(|h| {
            let handle = h.clone();
            let probe: crate::http::admin::ReadinessProbe = Arc::new(move || handle.readiness());
            (h.name().to_string(), probe)
        })
        .collect()
}

/// Cancels, upstream, the upgraded tasks a restart left without a follower: through the
/// stack below `upgrade`, so the cancels are authorised, single-flighted and recorded.
struct OrphanSweep {
    name: Arc<str>,
    state: Arc<UpgradeState>,
    stack: McpStack,
}

impl OrphanSweep {
    /// Runs in the background; logs what it found.
    fn spawn(self) {
        tokio::spawn(async move {
            let done = cancel_orphans(&self.state, &self.name, self.stack).await;
            if done.found > 0 {
                tracing::info!(
                    upstream = %self.name,
                    found = done.found,
                    cancelled = done.cancelled,
                    "upgraded tasks orphaned by a restart: cancel sent upstream"
                );
            }
        });
    }
}

/// The edge's settings from `[gateway]` and `[limits]`, with the bound address for the
/// `Host`/`Origin` checks.
fn edge_settings(config: &Config, gateway_addr: SocketAddr) -> EdgeSettings {
    EdgeSettings {
        allowed_hosts: allowed_hosts(&config.gateway.allowed_hosts, gateway_addr),
        allowed_origins: allowed_origins(&config.gateway.allowed_origins, gateway_addr),
        max_body_bytes: config.gateway.max_body_bytes,
        body_timeout: Duration::from_millis(config.gateway.request_timeout_ms),
        sse_keepalive: Duration::from_millis(config.gateway.sse_keepalive_ms),
        limits: crate::limits::Limiter::new(&config.limits),
        trusted_proxies: crate::http::client_addr::TrustedProxies::new(
            config.gateway.trusted_proxy_nets().unwrap_or_default(),
        ),
    }
}

/// Sweeps the registry (TTLs, expired held sessions) every `every`, until aborted.
fn spawn_sweeper(registry: Arc<Registry>, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        // A sweep that took longer than `every` is followed by one sweep, not by one per
        // period it missed.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            registry.sweep().await;
        }
    })
}

/// The bound listeners: serving thread 0's gateway socket and the admin socket (both served
/// on the calling runtime), and the other serving threads' sockets with their runtimes.
struct Listeners {
    gateway: TcpListener,
    gateway_addr: SocketAddr,
    admin: TcpListener,
    admin_addr: SocketAddr,
    /// `gateway.threads` resolved: one per CPU by default.
    threads: usize,
    /// Serving threads 1.. : each one's socket of the `SO_REUSEPORT` group and its runtime.
    others: Vec<(std::net::TcpListener, ServingRuntime)>,
}

impl Listeners {
    /// Binds the gateway's socket group (one per serving thread) and the admin socket, and
    /// builds the other serving threads' runtimes, so that any failure is a start error.
    async fn bind(config: &Config) -> Result<Listeners, StartError> {
        let bind_error = |source| StartError::Bind {
            which: "gateway",
            addr: config.gateway.listen,
            source,
        };
        let threads = crate::http::listen::serving_threads(config.gateway.threads);
        let mut sockets =
            crate::http::listen::bind_group(config.gateway.listen, threads).map_err(bind_error)?;
        let gateway = TcpListener::from_std(sockets.remove(0)).map_err(bind_error)?;
        let others = sockets
            .into_iter()
            .map(|socket| Ok((socket, ServingRuntime::new()?)))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(bind_error)?;
        let admin = TcpListener::bind(config.admin.listen)
            .await
            .map_err(|source| StartError::Bind {
                which: "admin",
                addr: config.admin.listen,
                source,
            })?;
        let gateway_addr = gateway.local_addr().expect("bound socket");
        let admin_addr = admin.local_addr().expect("bound socket");
        Ok(Listeners {
            gateway,
            gateway_addr,
            admin,
            admin_addr,
            threads,
            others,
        })
    }
}

/// What the serving loops share: the two handlers, the shutdown signal and the limits.
struct Serving {
    edge: Arc<Edge>,
    admin: Arc<Admin>,
    shutdown: watch::Receiver<bool>,
    /// Stops the admin listener (after the drain: it serves through it).
    admin_stop: watch::Receiver<bool>,
    drain: Drain,
    /// What a serving thread waits for after its drain, before it drops its runtime.
    linger: Arc<Linger>,
    gateway_limits: Limits,
}

/// How long the admin listener's own in-flight requests (a scrape, a probe, an `/admin/tasks`
/// page) get once the gateway's drain has ended and it stops.
const ADMIN_DRAIN: Duration = Duration::from_secs(2);

/// What a graceful stop lets finish beyond the requests in flight: the held calls of gateway
/// tasks (`upstream.tasks = "gateway"`: `layers::gateway_tasks`), the bridge's background
/// cancels (a task cancelled because its client answered a relayed `sampling/createMessage`
/// with an error, after that answer's 202: `layers::bridge::follow::send_update`), the
/// upgraded calls' final writes the task store refused (`layers::upgrade`), and the terminal
/// statuses it refused that the registry writes again (`registry::refused`: its task runs on
/// the gateway's runtime). Each of the others runs on the runtime of the serving thread whose
/// request started it, which ends it when it is dropped, so each serving thread waits here
/// after its drain, until all of them ended or the drain's deadline passed (or the drain was
/// cut); what is left then is logged at warn.
#[derive(Default)]
struct Linger {
    /// Each gateway-task upstream's state.
    gateway_tasks: Vec<Arc<GatewayTasksState>>,
    /// Each upstream's bridge state (its background cancels).
    bridges: Vec<Arc<BridgeState>>,
    /// Each upstream's upgrade state (its ended calls' final writes the task store refused).
    upgrades: Vec<Arc<UpgradeState>>,
    /// The registry (the terminal statuses the task store refused, `registry::refused`).
    registry: Option<Arc<Registry>>,
    /// The drain's end: set when the stop begins (`gateway.drain_timeout_ms` from then).
    deadline: std::sync::OnceLock<tokio::time::Instant>,
    /// The drain cut short ([`DrainCut`]): set once the serving loops exist.
    cut: std::sync::OnceLock<Drain>,
    /// What was left at the drain's end was logged ([`Linger::wait`]).
    warned: std::sync::atomic::AtomicBool,
}

impl Linger {
    /// Waits until no call of a gateway task is held, at most until the deadline; true when
    /// none is left (at once when no stop has begun, or there is no gateway-task upstream).
    async fn held_calls_ended(&self) -> bool {
        let Some(deadline) = self.deadline.get() else {
            return true;
        };
        let calls =
            futures_util::future::join_all(self.gateway_tasks.iter().map(|g| g.held_calls_ended()));
        let cancels = futures_util::future::join_all(
            self.bridges.iter().map(|b| b.background_cancels_ended()),
        );
        let upgraded =
            futures_util::future::join_all(self.upgrades.iter().map(|u| u.final_writes_ended()));
        let refused = async {
            if let Some(registry) = &self.registry {
                registry.refused_reports_written().await;
            }
        };
        let held = futures_util::future::join4(calls, cancels, upgraded, refused);
        let cut = async {
            match self.cut.get() {
                Some(drain) => drain.cut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ended = tokio::time::timeout_at(*deadline, held) => ended.is_ok(),
            () = cut => {
                self.held_calls() == 0
                    && self.background_cancels() == 0
                    && self.upgraded_final_writes() == 0
                    && self.refused_reports() == 0
            }
        }
    }

    /// Waits as [`Linger::held_calls_ended`]; what is still running when the wait ends (the
    /// drain's deadline passed, or it was cut) is dropped with its runtime: logged at warn, once
    /// per stop (by the first waiter to see it: serving threads drop their runtimes one by one).
    async fn wait(&self) {
        if self.held_calls_ended().await
            || self.warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let (held_calls, background_cancels) = (self.held_calls(), self.background_cancels());
        let pending_final_writes: usize = self
            .gateway_tasks
            .iter()
            .map(|g| g.pending_final_writes())
            .sum();
        // A call whose final write is retried is still held (its live entry): counted once, as
        // a pending write (review).
        let held_calls = held_calls.saturating_sub(pending_final_writes);
        if held_calls > 0 {
            tracing::warn!(
                held_calls,
                "the drain ended with gateway tasks' calls still held; their tasks are failed at the next start"
            );
        }
        if pending_final_writes > 0 {
            tracing::warn!(
                pending_final_writes,
                "the drain ended with gateway tasks' final writes still refused by the task store (their calls ended, their outcomes held in memory): their outcomes are lost, and their tasks failed at the next start (or by another replica once their leases lapse)"
            );
        }
        let upgraded_final_writes = self.upgraded_final_writes();
        if upgraded_final_writes > 0 {
            tracing::warn!(
                upgraded_final_writes,
                "the drain ended with upgraded calls' final statuses still refused by the task store (their clients were answered): their records stay working until another replica adopts them once their leases lapse, or their ttl ends"
            );
        }
        let refused_reports = self.refused_reports();
        if refused_reports > 0 {
            tracing::warn!(
                refused_reports,
                "the drain ended with terminal statuses still refused by the task store (tasks their upstreams ran, whose clients were told they ended): their records stay as they were until their ttl, unless a client's poll reports the end again"
            );
        }
        if background_cancels > 0 {
            tracing::warn!(
                background_cancels,
                "the drain ended with the bridge's background cancels still running: they are dropped (their cancels may not have reached the upstream; their records stay as they were)"
            );
        }
    }

    /// How many of the bridge's cancels run in the background now.
    fn background_cancels(&self) -> usize {
        self.bridges.iter().map(|b| b.background_cancels()).sum()
    }

    /// How many terminal statuses the task store refused wait to be written again.
    fn refused_reports(&self) -> usize {
        self.registry
            .as_ref()
            .map_or(0, |r| r.refused_reports_kept())
    }

    /// How many ended upgraded calls wait for the task store to take their final status.
    fn upgraded_final_writes(&self) -> usize {
        self.upgrades.iter().map(|u| u.pending_final_writes()).sum()
    }

    /// How many calls of gateway tasks are held now.
    fn held_calls(&self) -> usize {
        self.gateway_tasks.iter().map(|g| g.held_calls()).sum()
    }
}

impl Serving {
    /// Starts the serving threads 1.. (each on its own runtime and socket, see
    /// `http::listen`) and, on the calling runtime, serving thread 0 and the admin listener.
    /// Returns one handle per serving thread and the admin listener's, each done when that
    /// listener is closed and drained.
    ///
    /// Errors: the OS refused a thread.
    fn spawn(self, listeners: Listeners) -> std::io::Result<(Vec<JoinHandle<()>>, JoinHandle<()>)> {
        let _ = self.linger.cut.set(self.drain.clone());
        let mut servers = Vec::with_capacity(listeners.others.len() + 1);
        for (index, (socket, runtime)) in listeners.others.into_iter().enumerate() {
            servers.push(self.spawn_serving_thread(index + 1, socket, runtime)?);
        }
        let admin_limits = Limits {
            connections: connection_budget(256),
            header_timeout: Duration::from_secs(10),
        };
        servers.push(tokio::spawn(serve(
            listeners.gateway,
            self.edge,
            self.shutdown,
            self.drain.clone(),
            self.gateway_limits,
        )));
        // Stopped after the gateway's drain; its own in-flight requests (a scrape, a probe)
        // then get a short drain of their own.
        let admin_drain = Drain {
            timeout: ADMIN_DRAIN,
            cut: self.drain.cut,
        };
        let admin = tokio::spawn(serve(
            listeners.admin,
            self.admin,
            self.admin_stop,
            admin_drain,
            admin_limits,
        ));
        Ok((servers, admin))
    }

    /// Serving thread `index` (1..): its runtime serves `socket` until shutdown. The handle
    /// (a task on the calling runtime) is done once the thread has dropped its runtime.
    fn spawn_serving_thread(
        &self,
        index: usize,
        socket: std::net::TcpListener,
        runtime: ServingRuntime,
    ) -> std::io::Result<JoinHandle<()>> {
        let (edge, shutdown) = (self.edge.clone(), self.shutdown.clone());
        let (drain, limits) = (self.drain.clone(), self.gateway_limits.clone());
        let linger = self.linger.clone();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            // Linux keeps 15 bytes of a thread's name: `tg-serve-1023` fits.
            .name(format!("tg-serve-{index}"))
            .spawn(move || {
                crate::upstream::pin_thread(index);
                let runtime = runtime.into_inner();
                runtime.block_on(async move {
                    match TcpListener::from_std(socket) {
                        Ok(listener) => serve(listener, edge, shutdown, drain, limits).await,
                        Err(e) => tracing::error!(error = %e, "a serving thread could not listen"),
                    }
                    // The held calls and background cancels this runtime runs end with it:
                    // they get the drain.
                    linger.wait().await;
                });
                // Dropping the runtime ends what its connections left running (as at exit).
                drop(runtime);
                let _ = done_tx.send(());
            })?;
        Ok(tokio::spawn(async move {
            let _ = done_rx.await;
        }))
    }
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
            let store =
                PgStore::open(&url, config.store.pool_size as usize, config.store.tls()).await?;
            // Its task writes' durations, as sled's group commits
            // (`taskgate_store_write_duration_seconds`).
            store.observe_writes(metrics.clone());
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// A third signal during the store's close: `main` stops polling the stop (the future that
    /// runs the close) and waits in [`ForcedExit::exit`] for the close to end. That wait ends
    /// when the close returns, though no one polls the stop any more. Before: the stop's future
    /// held the lock across the close, so it was released only when that future was polled
    /// again, which it never was: the process hung until `kill -9` (the signal handlers being
    /// installed, further SIGTERMs did nothing).
    #[tokio::test]
    async fn a_forced_exit_sees_the_close_end_though_the_stop_is_not_polled() {
        let closing = Arc::new(tokio::sync::Mutex::new(()));
        let forced = ForcedExit(closing.clone());
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let stop = close_store(&closing, Duration::from_secs(60), move || {
            let _ = started_tx.send(());
            let _ = release_rx.recv();
        });
        tokio::pin!(stop);
        // The stop runs until its close has begun, then is polled no more (kept, not dropped).
        tokio::select! {
            () = &mut stop => panic!("the close returned before it was released"),
            _ = started_rx => {}
        }
        let exit = forced.no_close();
        tokio::pin!(exit);
        assert!(
            (&mut exit).now_or_never().is_none(),
            "the exit waits for the close under way"
        );
        release_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), exit)
            .await
            .expect("the forced exit still waits, 10 s after the close returned");
    }

    /// tester4 #1: a store close that never ends (sled's flush after an I/O error) kept the
    /// process up after the third signal ("exiting now" logged, only `kill -9` ended it) and
    /// the graceful stop forever. Now the stop waits for the close at most its bound, and the
    /// forced exit at most its own.
    #[tokio::test]
    async fn a_close_that_never_ends_holds_neither_the_stop_nor_a_forced_exit() {
        let closing = Arc::new(tokio::sync::Mutex::new(()));
        let forced = ForcedExit(closing.clone());
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let stop = close_store(&closing, Duration::from_millis(200), move || {
            let _ = started_tx.send(());
            let _ = release_rx.recv();
        });
        tokio::time::timeout(Duration::from_secs(10), stop)
            .await
            .expect("the stop waits for a stuck close no longer than its bound");
        started_rx.await.unwrap();
        let waited = tokio::time::timeout(
            Duration::from_secs(10),
            forced.wait_for_close(Duration::from_millis(200)),
        )
        .await
        .expect("a forced exit waits for a stuck close no longer than its bound");
        assert!(!waited, "the close is still under way");
        drop(release_tx);
    }
}

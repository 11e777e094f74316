//! The `taskgate` command line: `serve`, `check-config`, `tasks list|show`.

use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use taskgate::config::Config;

/// A tasks-aware transparent gateway for the Model Context Protocol (MCP 2025-11-25 and the
/// 2026-07-28 tasks extension).
#[derive(Parser)]
#[command(name = "taskgate", version, about)]
struct Cli {
    /// Log format on stderr (filter with RUST_LOG, default "info").
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway. Prints `{"listening":{"gateway":ADDR,"admin":ADDR}}` on stdout when ready.
    Serve {
        /// TOML config file; without it the embedded default (config/taskgate.toml) is used.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Validate a config file without starting (exit 0 when valid, 1 with the error otherwise).
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Inspect the task registry: a sled store while the gateway is stopped (it is locked while
    /// taskgate runs; use the admin endpoint /admin/tasks then), a PostgreSQL one at any time.
    Tasks {
        #[command(subcommand)]
        command: TasksCommand,
    },
}

#[derive(Subcommand)]
enum TasksCommand {
    /// List task records as JSON lines, newest first.
    List {
        /// Store directory ([store] path of a sled store).
        #[arg(long, required_unless_present = "config", conflicts_with = "config")]
        store: Option<PathBuf>,
        /// A taskgate config file: its [store] (sled path, or PostgreSQL URL from url_env/url).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Only this owner (principal:<name>, session:<id>, anonymous).
        #[arg(long)]
        owner: Option<String>,
        /// Only this status (working, input_required, completed, failed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Only this upstream.
        #[arg(long)]
        upstream: Option<String>,
        /// At most this many records.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Show one task record with its audit events, as JSON.
    Show {
        /// Store directory ([store] path of a sled store).
        #[arg(long, required_unless_present = "config", conflicts_with = "config")]
        store: Option<PathBuf>,
        /// A taskgate config file: its [store] (sled path, or PostgreSQL URL from url_env/url).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The upstream's name.
        upstream: String,
        /// The taskId.
        task_id: String,
    },
}

fn main() -> ExitCode {
    // A stdio child's shim (`upstream::stdio::shim`), started by `serve` itself: nothing else
    // of the command line applies to it.
    let mut args = std::env::args_os();
    if args
        .nth(1)
        .is_some_and(|a| a == taskgate::upstream::stdio::shim::MODE)
    {
        taskgate::upstream::stdio::shim::run(args.collect());
    }
    limit_malloc_arenas();
    fix_mmap_threshold();
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::CheckConfig { file } => match Config::from_file(&file) {
            Ok(c) => {
                // The `OTEL_*` variables `serve` reads where `[telemetry]` leaves a key out: a
                // value `serve` would refuse at its start is refused here too (issue 34).
                let env = |name: &str| std::env::var(name).ok();
                if let Err(e) = taskgate::telemetry::Settings::resolve(&c.telemetry, env) {
                    eprintln!("{}: {e}", file.display());
                    return ExitCode::FAILURE;
                }
                // The verdict only after every check: a failure prints only the failure.
                let store = match check_database(&c) {
                    Ok(line) => line,
                    Err(e) => {
                        eprintln!("store: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                println!(
                    "{}: valid ({} upstream{})",
                    file.display(),
                    c.upstream.len(),
                    if c.upstream.len() == 1 { "" } else { "s" }
                );
                if let Some(line) = store {
                    println!("store: {line}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Tasks { command } => tasks_command(command),
        Command::Serve { config } => {
            let config = match config {
                Some(path) => Config::from_file(&path),
                None => Ok(Config::embedded_default()),
            };
            let config = match config {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("taskgate: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // Each stdio child starts through this binary's shim: no process of its outlives a
            // `kill -9` of taskgate (`upstream::stdio::shim`).
            taskgate::upstream::stdio::child::launch_through("/proc/self/exe".into());
            // The main thread serves too (with the admin listener and the sweeper); the other
            // serving threads get runtimes of their own (`gateway.threads`, `http::listen`).
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("taskgate: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            runtime.block_on(serve(config))
        }
    }
}

/// `check-config`'s store check: with `[store] backend = "postgres"` the database must answer
/// (read only: nothing is created or migrated here); a sled store's path must be a directory
/// taskgate can write in, or one it can create (`SledStore::check_path`: nothing is left
/// behind). `Ok(Some(line))` says what was found; `Err` why it failed.
fn check_database(config: &Config) -> Result<Option<String>, String> {
    if config.store.backend != taskgate::config::StoreBackend::Postgres {
        return taskgate::store::SledStore::check_path(&config.store.path).map(Some);
    }
    let Some(url) = config.store.database_url() else {
        return Err("the database URL is not set".into());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime
        .block_on(taskgate::store::PgStore::probe(&url, config.store.tls()))
        .map(Some)
        .map_err(|e| format!("the PostgreSQL database is unreachable: {e}"))
}

fn tasks_command(command: TasksCommand) -> ExitCode {
    use taskgate::http::admin::{task_detail, TaskFilter};
    let (store, config) = match &command {
        TasksCommand::List { store, config, .. } | TasksCommand::Show { store, config, .. } => {
            (store.clone(), config.clone())
        }
    };
    let store = match open_store_for_cli(store, config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("taskgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    match command {
        TasksCommand::List {
            owner,
            status,
            upstream,
            limit,
            ..
        } => {
            let status = match status
                .as_deref()
                .map(taskgate::mcp::task::TaskStatus::parse)
            {
                Some(None) => {
                    eprintln!("taskgate: unknown status; one of working, input_required, completed, failed, cancelled");
                    return ExitCode::FAILURE;
                }
                Some(s) => s,
                None => None,
            };
            let filter = TaskFilter {
                owner,
                upstream,
                status,
                limit,
            };
            match filter.collect(store.as_ref()) {
                Ok(records) => {
                    let mut out = std::io::stdout().lock();
                    for r in records {
                        let _ =
                            writeln!(out, "{}", serde_json::to_string(&r).expect("record json"));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("taskgate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        TasksCommand::Show {
            upstream, task_id, ..
        } => match task_detail(store.as_ref(), &upstream, &task_id) {
            Ok(Some(v)) => {
                println!("{}", serde_json::to_string_pretty(&v).expect("json"));
                ExitCode::SUCCESS
            }
            Ok(None) => {
                eprintln!("taskgate: no task {task_id:?} on upstream {upstream:?}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("taskgate: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// The store `taskgate tasks` reads: the sled directory `--store`, or the `[store]` of the config
/// file `--config` (sled at its path; PostgreSQL at its URL, opened without changing the schema).
fn open_store_for_cli(
    store: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<std::sync::Arc<dyn taskgate::store::TaskStore>, String> {
    use taskgate::config::{StoreBackend, StoreConfig};
    use taskgate::store::{PgStore, SledStore};
    // sled's page cache: the config's `store.cache_capacity_bytes`, else the gateway's default.
    let mut cache_capacity_bytes = StoreConfig::default().cache_capacity_bytes;
    let path = match (store, config) {
        (Some(path), _) => path,
        (None, Some(file)) => {
            let config = Config::from_file(&file).map_err(|e| e.to_string())?;
            if config.store.backend == StoreBackend::Postgres {
                let url = config
                    .store
                    .database_url()
                    .ok_or("the database URL is not set (store.url_env names an unset variable)")?;
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let store = runtime
                    .block_on(PgStore::open_read_only(&url, 2, config.store.tls()))
                    .map_err(|e| e.to_string())?;
                return Ok(store as std::sync::Arc<dyn taskgate::store::TaskStore>);
            }
            cache_capacity_bytes = config.store.cache_capacity_bytes;
            config.store.path
        }
        (None, None) => return Err("give --store DIR or --config FILE".into()),
    };
    if !path.join("db").exists() {
        return Err(format!("no task store at {}", path.display()));
    }
    let store = SledStore::open(&path, cache_capacity_bytes, None).map_err(|e| {
        format!("{e} (is taskgate running on this store? use the admin endpoint /admin/tasks)")
    })?;
    Ok(store as std::sync::Arc<dyn taskgate::store::TaskStore>)
}

async fn serve(config: Config) -> ExitCode {
    let running = match taskgate::gateway::start(config).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("taskgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Handlers first: a signal right after the listening line must drain, not kill.
    let mut signals = Signals::install();
    let line = format!(
        "{{\"listening\":{{\"gateway\":\"{}\",\"admin\":\"{}\"}}}}",
        running.gateway_addr, running.admin_addr
    );
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
    drop(stdout);

    signals.wait().await;
    tracing::info!("shutdown signal received; draining");
    // A second signal ends the drain at once (what is still in flight is cut); the rest of
    // the stop (stdio children, trace export, the store's flush) still runs. A third ends the
    // process at once, with 128 + its number as most servers do (`gateway::ForcedExit` says
    // why the store is safe with it).
    let cut = running.drain_cut();
    let forced = running.forced_exit();
    let stopping = running.shutdown();
    tokio::pin!(stopping);
    tokio::select! {
        () = &mut stopping => {}
        _ = signals.wait() => {
            tracing::warn!("second shutdown signal received; ending the drain now");
            cut.cut();
            tokio::select! {
                () = &mut stopping => {}
                signal = signals.wait() => {
                    let code = 128 + signal;
                    tracing::warn!(code, "third shutdown signal received; exiting now, without the rest of the stop (stdio children die with the process; every acknowledged task write is on disk already)");
                    forced.exit(code).await
                }
            }
        }
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        Signals {
            term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
        }
    }

    /// The next SIGTERM or SIGINT: its number.
    async fn wait(&mut self) -> i32 {
        tokio::select! {
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.int.recv() => libc::SIGINT,
        }
    }
}

/// glibc gives each thread that allocates its own arena and keeps freed memory there: measured
/// with 100,000 task records, RSS after paging through them grew 76 → 101 MiB with the default,
/// and stayed flat with one arena. Two arenas keep that bound with less contention. (mimalloc was
/// measured too: 145 MiB after creating the records, worse.) `MALLOC_ARENA_MAX` still wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// glibc serves an allocation of 128 KiB or more with a mapping of its own, returned to the
/// system when freed, but raises that threshold to the size of every such block freed (up to
/// 32 MiB): after sled's first 512 KiB log buffer (one per 512 KiB of log written) was freed,
/// the next ones came from the heap, between long-lived small blocks, and their holes stayed
/// resident. Measured on `benches/run.sh` scenario 6 (100,000 creations at c=64, profiling
/// build, medians of 3): peak RSS 122.8 → 87.1 MiB; `malloc_trim` on the process after the
/// creations had given back 35 MiB before. A fixed threshold (the default 128 KiB) turns the
/// raise off. `MALLOC_MMAP_THRESHOLD_` still wins.
fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only on a terminal: a file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

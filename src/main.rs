//! The `taskgate` command line: `serve`, `check-config`.

use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use taskgate::config::Config;

/// A tasks-aware transparent gateway for the Model Context Protocol (MCP 2025-11-25).
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::CheckConfig { file } => match Config::from_file(&file) {
            Ok(c) => {
                println!(
                    "{}: valid ({} upstream{})",
                    file.display(),
                    c.upstream.len(),
                    if c.upstream.len() == 1 { "" } else { "s" }
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
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
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(serve(config))
        }
    }
}

async fn serve(config: Config) -> ExitCode {
    let running = match taskgate::gateway::start(config).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("taskgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    let line = serde_json::json!({"listening": {
        "gateway": running.gateway_addr.to_string(),
        "admin": running.admin_addr.to_string(),
    }});
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
    drop(stdout);

    wait_for_signal().await;
    tracing::info!("shutdown signal received; draining");
    running.shutdown().await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

//! The `spillway` binary: arguments, logging, start, signals. Everything else is the library.

use anyhow::Context as _;
use clap::Parser as _;
use spillway::cli::{Cli, Command, load_config};
use spillway::monitor::ConfigSource;

fn main() -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let overrides = cli.knobs.overrides(|k| std::env::var(k).ok());

    match &cli.command {
        Some(Command::CheckConfig { file }) => {
            let config = load_config(Some(file), &overrides)
                .with_context(|| format!("{} is not valid", file.display()))?;
            print!("{}", config.to_toml());
            eprintln!("{}: configuration OK", file.display());
            return Ok(());
        }
        Some(Command::MockEngine(args)) => {
            let mock =
                spillway::mock::start(args.config()).context("cannot start the mock engine")?;
            wait_for_stop_signal()?;
            mock.shutdown();
            return Ok(());
        }
        None => {}
    }

    let config = load_config(cli.config.as_deref(), &overrides).context("invalid configuration")?;
    match &cli.config {
        Some(path) => tracing::info!(config = %path.display(), "configuration loaded"),
        None => {
            tracing::info!("no --config given: running the embedded default (tuning/spillway.toml)")
        }
    }
    let source = ConfigSource {
        path: cli.config.clone(),
        overrides,
    };
    let server = spillway::start(config, source).context("cannot start")?;
    tracing::info!(listen = %server.data_addr, admin = %server.admin_addr, "spillway is serving");

    wait_for_stop_signal()?;
    server.shutdown();
    Ok(())
}

/// Blocks until SIGTERM or SIGINT.
fn wait_for_stop_signal() -> anyhow::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .context("cannot install signal handlers")?;
    if let Some(sig) = signals.forever().next() {
        tracing::info!(signal = sig, "stopping");
    }
    Ok(())
}

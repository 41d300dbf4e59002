//! The `spillway` binary: arguments, logging, start, signals; with `cli.rs` (the command
//! line) and `demo.rs` (the no-argument demo). Everything else is the library.

mod cli;
mod demo;

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use cli::{Cli, Command};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
use spillway::runtime::{clock, resolve};
use spillway::{Config, ConfigSource, Overrides};

/// mimalloc: memory freed by connections that went idle (their request loop's state and
/// buffers) goes back to the system, where the system allocator keeps it as holes between
/// the parked connections' small allocations (bench/results/connections.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay`, by its number in `mi_option_e` (mimalloc.h, v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed pages go back to the system at once: the data path allocates nothing per request,
/// so a purge delayed to a later allocator call could wait indefinitely. (Arenas commit
/// memory as it is used: a build-time default, set in .cargo/config.toml, because the
/// first arena exists before `main`.)
#[allow(unsafe_code)]
fn tune_allocator() {
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table, which is read
    // atomically by every purge; the option exists in the bundled mimalloc (v3,
    // libmimalloc-sys 0.1.49); this runs first in `main`, before any thread of ours starts.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

fn main() {
    tune_allocator();
    if let Err(e) = run() {
        eprintln!("spillway: {e:#}");
        std::process::exit(2);
    }
}

fn run() -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let overrides = cli
        .knobs
        .overrides(|k| std::env::var(k).ok())
        .map_err(|e| anyhow::anyhow!("invalid environment variable {e}"))?;

    match (&cli.command, &cli.config) {
        (Some(Command::CheckConfig { file }), _) => check_config(file, &overrides),
        (Some(Command::MockEngine(args)), _) => mock_engine(args),
        (None, Some(path)) => serve_file(path, overrides),
        (None, None) => serve_demo(overrides),
    }
}

/// `spillway check-config FILE`: validates, resolves the names, prints the effective
/// configuration (like `nginx -t`).
fn check_config(file: &Path, overrides: &Overrides) -> anyhow::Result<()> {
    let invalid = || format!("{} is not valid", file.display());
    let config = Config::load(file, overrides).with_context(invalid)?;
    resolve::resolve(&config).with_context(invalid)?;
    print!("{}", config.to_toml());
    eprintln!("{}: configuration OK", file.display());
    Ok(())
}

/// `spillway mock-engine`: the simulated engine alone, until SIGTERM or SIGINT.
fn mock_engine(args: &cli::MockArgs) -> anyhow::Result<()> {
    // Handlers first: a signal sent as soon as the ready line shows must not kill it.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let mock = spillway_mock::start(args.config()).context("cannot start the mock engine")?;
    tracing::info!(listen = %mock.addr, "mock engine serving");
    let _ = signals.forever().next();
    mock.shutdown();
    Ok(())
}

/// `spillway --config FILE`.
fn serve_file(path: &Path, overrides: Overrides) -> anyhow::Result<()> {
    let signals = install_signals()?;
    let config = Config::load(path, &overrides)
        .with_context(|| format!("{} is not valid", path.display()))?;
    tracing::info!(config = %path.display(), "configuration loaded");
    let source = ConfigSource {
        path: Some(path.to_path_buf()),
        overrides,
    };
    let server = spillway::start(config, source).context("cannot start")?;
    let tls = server.shared.snapshot.load().config.tls.listener.is_some();
    tracing::info!(listen = %server.data_addr, admin = %server.admin_addr, tls, tls_listen = ?server.tls_addr, "spillway is serving");
    serve_until_stopped(server, signals, None)
}

/// `spillway` alone: the demo, with a status line every second.
fn serve_demo(overrides: Overrides) -> anyhow::Result<()> {
    let signals = install_signals()?;
    let running = demo::start(demo::LISTEN, demo::ADMIN_LISTEN, overrides)
        .context("cannot start the demo (is port 8000 or 9090 taken? run with --config FILE)")?;
    tracing::info!(
        listen = %running.server.data_addr,
        admin = %running.server.admin_addr,
        engines = ?running.engines.iter().map(|e| e.addr).collect::<Vec<_>>(),
        model = demo::MODEL,
        decode_threshold = demo::DECODE_THRESHOLD,
        engine_request_limit = demo::ENGINE_REQUEST_LIMIT,
        request_queue_limit = demo::REQUEST_QUEUE_LIMIT,
        "demo: no --config given, so Spillway runs in front of two in-process mock engines \
         with shedding on; `spillway --config FILE` runs the real thing"
    );
    tracing::info!("try: {}", running.curl());
    let demo::Demo { server, engines } = running;
    let result = serve_until_stopped(server, signals, Some(Duration::from_secs(1)));
    drop(engines);
    result
}

/// The signals `serve_until_stopped` answers, caught from before the server starts: one
/// sent as soon as "spillway is serving" shows is handled, never the default action
/// (SIGUSR1's and SIGHUP's would end the process).
fn install_signals() -> anyhow::Result<signal_hook::iterator::Signals> {
    signal_hook::iterator::Signals::new([SIGHUP, SIGUSR1, SIGUSR2, SIGTERM, SIGINT])
        .context("cannot install signal handlers")
}

/// Runs until drained: SIGHUP reloads, SIGUSR1 dumps state, SIGUSR2 reopens the access
/// log, SIGTERM/SIGINT drain (a second one exits at once). With `status`, logs a one-line
/// status that often.
fn serve_until_stopped(
    server: spillway::ServerHandle,
    mut signals: signal_hook::iterator::Signals,
    status: Option<Duration>,
) -> anyhow::Result<()> {
    let mut draining = false;
    let mut last_status = clock::now();
    loop {
        for sig in signals.pending() {
            match sig {
                SIGHUP => server.reload(),
                SIGUSR1 => server.dump_state(),
                SIGUSR2 => server.reopen_access_log(),
                _ if draining => {
                    tracing::warn!(signal = sig, "second stop signal: exiting now");
                    std::process::exit(1);
                }
                _ => {
                    tracing::info!(signal = sig, "stop signal: draining");
                    server.begin_drain().context("cannot start draining")?;
                    draining = true;
                }
            }
        }
        if draining && server.drained() {
            server.finish();
            tracing::info!("drained; exiting");
            return Ok(());
        }
        if let Some(every) = status.filter(|e| clock::since(last_status) >= *e) {
            tracing::info!("{}", server.shared.stats());
            last_status += every;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

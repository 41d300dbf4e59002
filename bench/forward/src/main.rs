//! The io_uring floor for `bench/proxy`: a bare HTTP/1.1 forwarder on one thread, pinned
//! to one CPU, on a monoio runtime built as Spillway builds its cores' (the same ring
//! entries and flags, the same fusion driver with its timer; `MONOIO_FORCE_LEGACY_DRIVER=1`
//! runs it on epoll as it does Spillway).
//!
//! Each client connection gets its own kept-alive connection to the one origin; requests
//! and responses pass byte for byte, framed by their Content-Length or chunks. No routing,
//! no admission, no timeouts, no metrics, no logs: what any proxy on this ring pays at least.
//!
//!   spillway-bench-forward --listen 127.0.0.1:8080 --upstream 127.0.0.1:9000 [--cpu 0]

mod conn;
mod framing;

use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use monoio::net::{ListenerOpts, TcpListener};

/// Spillway's runtime type (src/runtime/mod.rs): io_uring, or epoll when the kernel has none.
type Runtime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

struct Args {
    listen: SocketAddr,
    upstream: SocketAddr,
    cpu: Option<usize>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut listen, mut upstream, mut cpu) = (None, None, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--listen" => listen = Some(value.parse().map_err(|e| bad(&e))?),
            "--upstream" => upstream = Some(value.parse().map_err(|e| bad(&e))?),
            "--cpu" => cpu = Some(value.parse().map_err(|e| bad(&e))?),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen ADDR is required")?,
        upstream: upstream.ok_or("--upstream ADDR is required")?,
        cpu,
    })
}

/// The ring as Spillway sets it up: 2,048 entries, COOP_TASKRUN and SINGLE_ISSUER where
/// the kernel takes them, the timer on; epoll when io_uring cannot start.
fn runtime() -> io::Result<Runtime> {
    let fusion = |tuned: bool| {
        let mut ring = io_uring::IoUring::builder();
        if tuned {
            ring.setup_coop_taskrun().setup_single_issuer();
        }
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .uring_builder(ring)
            .with_entries(2048)
            .enable_timer()
            .build()
    };
    fusion(true).or_else(|_| fusion(false)).or_else(|_| {
        let legacy = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer();
        Ok(legacy.build()?.into())
    })
}

async fn accept_loop(args: Args) -> io::Result<()> {
    let opts = ListenerOpts::new().backlog(4096);
    let listener = TcpListener::bind_with_config(args.listen, &opts)?;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                monoio::spawn(conn::serve(stream, args.upstream));
            }
            Err(e) => {
                eprintln!("accept: {e}");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\nusage: spillway-bench-forward --listen ADDR --upstream ADDR [--cpu N]");
            return ExitCode::from(2);
        }
    };
    if let Some(Err(e)) = args.cpu.map(|c| monoio::utils::bind_to_cpu_set([c])) {
        eprintln!("cannot pin to CPU {:?}: {e:?}", args.cpu);
    }
    let result = runtime().and_then(|mut rt| rt.block_on(accept_loop(args)));
    if let Err(e) = result {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

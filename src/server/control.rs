//! The control thread: the monitor (its timers and the busy-set publication), the admin
//! listener, and the commands the process sends (stop, reload, dump), on one runtime.
//! Reloads read files and resolve names on its blocking pool, never in its loop.

use std::cell::RefCell;
use std::io;
use std::net::TcpListener as StdListener;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;

use monoio::io::AsyncReadRent;

use crate::config::{Addrs, ConfigSource};
use crate::monitor::{Command, Control, reload, supervise, tasks};
use crate::runtime::listen::{accept_until_stopped, stop_channel};
use crate::runtime::{self};
use crate::state::{Registry, Shared};

/// What the control thread starts from.
pub(super) struct Parts {
    pub shared: Arc<Shared>,
    pub registry: Registry,
    pub source: ConfigSource,
    /// The addresses the first generation was built with.
    pub addrs: Addrs,
    pub admin: StdListener,
    pub commands: StdUnixStream,
}

/// Threads of the control thread's blocking pool (reloads: file reads, DNS).
const BLOCKING_THREADS: usize = 1;

pub(super) fn spawn(cpu: Option<usize>, parts: Parts) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("spillway-monitor".into())
        .spawn(move || run(cpu, parts))
}

fn run(cpu: Option<usize>, parts: Parts) {
    runtime::pin_current(cpu, "monitor");
    let mut rt = match runtime::build(BLOCKING_THREADS) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the control thread's runtime");
            return;
        }
    };
    rt.block_on(serve(parts));
}

async fn serve(parts: Parts) {
    let Parts {
        shared,
        registry,
        source,
        addrs,
        admin,
        commands,
    } = parts;
    let base = (shared.snapshot.load().config.clone(), addrs);
    let control = Rc::new(RefCell::new(Control::new(shared, registry, source, base)));
    control.borrow_mut().republish();
    monoio::spawn(tasks::tick(control.clone()));
    monoio::spawn(tasks::scrape_loop(control.clone()));
    monoio::spawn(crate::monitor::checks::check_loop(control.clone()));
    monoio::spawn(supervise(control.clone()));
    let listener = match monoio::net::TcpListener::from_std(admin) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "cannot adopt the admin listener"),
    };
    let (stop_admin, stop) = match stop_channel() {
        Ok(pair) => pair,
        Err(e) => return tracing::error!(error = %e, "cannot create the admin stop channel"),
    };
    monoio::spawn(serve_commands(control.clone(), commands, stop_admin));
    let open = crate::admin::Connections::default();
    accept_until_stopped(&listener, stop, "admin", |stream, peer| {
        crate::admin::accepted(&control, &open, stream, peer);
    })
    .await;
}

/// Reads [`Command`]s from the process (signals arrive here as bytes); `Stop` ends the
/// admin listener, and with it the thread.
async fn serve_commands(
    control: Rc<RefCell<Control>>,
    commands: StdUnixStream,
    stop_admin: StdUnixStream,
) {
    use std::io::Write;
    let stop = |mut s: &StdUnixStream| {
        let _ = s.write_all(b"x");
    };
    let mut rx = match monoio::net::UnixStream::from_std(commands) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot adopt the command channel");
            return stop(&stop_admin);
        }
    };
    let mut buf = vec![0u8; 64];
    loop {
        let (res, b) = rx.read(buf).await;
        buf = b;
        let n = match res {
            Ok(n) if n > 0 => n,
            _ => return stop(&stop_admin),
        };
        for &byte in &buf[..n] {
            match Command::from_byte(byte) {
                Some(Command::Stop) => return stop(&stop_admin),
                Some(Command::Reload) => {
                    let control = control.clone();
                    monoio::spawn(async move {
                        let _ = reload(&control).await;
                    });
                }
                Some(Command::Dump) => control.borrow().dump(),
                None => {}
            }
        }
    }
}

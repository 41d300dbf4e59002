//! A data-path core's thread: pinned, its own runtime, its own listener, the proxy.

use std::io;
use std::net::TcpListener as StdListener;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use monoio::net::TcpListener;

use crate::accesslog::CoreLog;
use crate::proxy::{self, CoreCtx};
use crate::runtime::{self, clock};
use crate::state::Shared;

/// A core's listener before its runtime adopts it: socket, stop channel, TLS or not.
pub(super) type StdListenerParts = (StdListener, StdUnixStream, bool);

/// What a core's thread starts with.
pub(super) struct Core {
    pub id: usize,
    pub cpu: Option<usize>,
    pub listeners: Vec<StdListenerParts>,
    pub shared: Arc<Shared>,
    pub log: CoreLog,
}

pub(super) fn spawn(core: Core) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("spillway-core-{}", core.id))
        .spawn(move || run(core))
}

fn run(core: Core) {
    let Core {
        id,
        cpu,
        listeners,
        shared,
        log,
    } = core;
    runtime::pin_current(cpu, "core");
    let mut rt = match runtime::build(0) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(core = id, error = %e, "cannot start a runtime on this core");
            return;
        }
    };
    rt.block_on(async move {
        let legacy = monoio::utils::is_legacy();
        shared.legacy_driver[id].store(legacy, Ordering::Relaxed);
        let driver = if legacy { "epoll" } else { "io_uring" };
        tracing::info!(core = id, cpu = ?cpu, driver, "core started");
        let mut adopted = Vec::with_capacity(listeners.len());
        for (socket, stop, tls) in listeners {
            match TcpListener::from_std(socket) {
                Ok(socket) => adopted.push(proxy::Listener { socket, stop, tls }),
                Err(e) => {
                    tracing::error!(core = id, error = %e, "cannot adopt listener");
                    return;
                }
            }
        }
        let seed = clock::now_ms()
            ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ u64::from(std::process::id());
        let ctx = Rc::new(CoreCtx::new(id, shared, seed));
        *ctx.log.borrow_mut() = Some(log);
        proxy::run(ctx, adopted).await;
    });
}

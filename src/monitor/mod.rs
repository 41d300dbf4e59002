//! The monitor: a dedicated thread that owns all load state, evaluates the busy rule and
//! publishes the busy set to every core's replica. It also hosts the admin listener, so
//! admin calls act on monitor state directly, without locks or cross-thread hops.

use std::net::TcpListener as StdListener;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use monoio::io::AsyncReadRent;

use crate::config::Overrides;
use crate::config::snapshot::Registry;
use crate::core::Shared;

/// The busy set as published: immutable, one per publish, read lock-free by the cores.
#[derive(Debug, Default)]
pub struct BusySet {
    pub generation: u64,
    /// Bit per model id: a threshold is configured, so busy members are excluded.
    enabled: Vec<u64>,
    /// Bit per member id: the (model, worker) pair is busy.
    busy: Vec<u64>,
    /// Per member id: load in permille of the fullest known signal (least-loaded ties).
    load: Vec<u16>,
}

fn bit(words: &[u64], i: u32) -> bool {
    words
        .get((i / 64) as usize)
        .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
}

fn set_bit(words: &mut Vec<u64>, i: u32) {
    let w = (i / 64) as usize;
    if words.len() <= w {
        words.resize(w + 1, 0);
    }
    words[w] |= 1u64 << (i % 64);
}

impl BusySet {
    #[inline]
    pub fn enabled(&self, model_id: u32) -> bool {
        bit(&self.enabled, model_id)
    }

    #[inline]
    pub fn is_busy(&self, member_id: u32) -> bool {
        bit(&self.busy, member_id)
    }

    #[inline]
    pub fn load(&self, member_id: u32) -> u16 {
        self.load.get(member_id as usize).copied().unwrap_or(0)
    }

    pub fn set_enabled(&mut self, model_id: u32) {
        set_bit(&mut self.enabled, model_id);
    }

    pub fn set_busy(&mut self, member_id: u32) {
        set_bit(&mut self.busy, member_id);
    }

    pub fn set_load(&mut self, member_id: u32, permille: u16) {
        let i = member_id as usize;
        if self.load.len() <= i {
            self.load.resize(i + 1, 0);
        }
        self.load[i] = permille;
    }

    pub fn busy_count(&self) -> u32 {
        self.busy.iter().map(|w| w.count_ones()).sum()
    }
}

/// Where the configuration comes from, kept for reloads.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
}

/// Control-thread state shared by the monitor tasks and admin handlers.
#[derive(Debug)]
pub struct Control {
    pub shared: Arc<Shared>,
    pub registry: Registry,
    pub source: ConfigSource,
}

/// Runs the monitor thread: admin listener plus monitor tasks, until stopped.
pub fn run(
    cpu: Option<usize>,
    admin: StdListener,
    stop: StdUnixStream,
    shared: Arc<Shared>,
    registry: Registry,
    source: ConfigSource,
) {
    crate::core::pin_current(cpu, "monitor");
    let mut rt = match crate::core::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the monitor runtime");
            return;
        }
    };
    rt.block_on(async move {
        let control = Rc::new(std::cell::RefCell::new(Control {
            shared,
            registry,
            source,
        }));
        let listener = match monoio::net::TcpListener::from_std(admin) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot adopt the admin listener");
                return;
            }
        };
        let mut stop = match monoio::net::UnixStream::from_std(stop) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot adopt stop channel");
                return;
            }
        };
        let mut stopped = std::pin::pin!(stop.read(vec![0u8; 1]));
        loop {
            let accepted = monoio::select! {
                _ = &mut stopped => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => {
                    monoio::spawn(crate::admin::serve(control.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    monoio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    });
}

//! The access log: each core formats lines into a reused buffer and hands full buffers to
//! one writer thread; the writer writes them and hands them back. Nothing on a core waits
//! for the disk: a core with no free buffer drops the line and counts it
//! (`spillway_access_log_dropped_total`), so memory stays bounded by the buffers made at
//! start (`BUFFERS_PER_CORE` × `BUFFER_BYTES` per core).
//!
//! ```text
//!  core 0 ─ CoreLog: line → buffer ──full──▶ ┐ one bounded channel  ┌─▶ file / stdout
//!  core n ─ CoreLog: line → buffer ──full──▶ ┴──────────────────────▶ writer thread
//!        ◀──────────── empty buffers, one bounded channel per core ──┘
//! ```
//!
//! The channels are std's bounded channels (`sync_channel`, a lock-free array queue
//! inside): a core only ever uses `try_send`/`try_recv`, once per buffer, never blocking.
//! The writer reopens its file when asked (SIGUSR2, for logrotate) and when a reload
//! changes the path.

pub mod format;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::access_log::{AccessLogConfig, Destination};
use crate::runtime::clock;
use crate::state::CoreCounters;
use crate::state::counters::add;
pub use format::Record;

/// Buffers each core owns (one being filled, the rest with the writer or free).
pub const BUFFERS_PER_CORE: usize = 4;
pub const BUFFER_BYTES: usize = 64 * 1024;
/// A buffer is handed over once it holds this much (a line is well under 4 KiB).
const FLUSH_AT: usize = BUFFER_BYTES - 4096;

/// One core's end of the handoff.
#[derive(Debug)]
pub struct CoreLog {
    core: usize,
    cur: Vec<u8>,
    full: SyncSender<(usize, Vec<u8>)>,
    free: Receiver<Vec<u8>>,
    successes: u64,
}

impl CoreLog {
    /// Writes one line for `r`, unless sampled out; drops and counts it when the writer
    /// holds every buffer.
    pub fn line(&mut self, cfg: &AccessLogConfig, r: &Record<'_>, counters: &CoreCounters) {
        if cfg.destination == Destination::Off {
            return;
        }
        if r.status < 400 && r.closed.is_none() {
            self.successes = self.successes.wrapping_add(1);
            if !self.successes.is_multiple_of(u64::from(cfg.sample)) {
                return;
            }
        }
        if self.cur.capacity() == 0 {
            match self.free.try_recv() {
                Ok(b) => self.cur = b,
                Err(_) => {
                    add(&counters.access_log_dropped, 1);
                    return;
                }
            }
        }
        format::write_line(&mut self.cur, &cfg.format, r);
        add(&counters.access_log_lines, 1);
        if self.cur.len() >= FLUSH_AT {
            self.flush();
        }
    }

    /// Hands the current buffer to the writer (the cores call it a few times a second so
    /// that quiet traffic is written too).
    pub fn flush(&mut self) {
        if self.cur.is_empty() {
            return;
        }
        let buf = std::mem::take(&mut self.cur);
        // Never full: the channel holds every buffer there is. Disconnected: no writer,
        // the lines are lost (the process is stopping).
        let _ = self.full.try_send((self.core, buf));
    }
}

/// The writer's side, and how to ask it to reopen.
pub struct Writer {
    pub reopen: Arc<AtomicBool>,
    pub thread: JoinHandle<()>,
}

/// Starts the writer thread for `cores` cores; `dest` says where lines go when that
/// differs from its argument (asked each second; without allocating when unchanged).
/// Returns each core's end.
pub fn start(
    cores: usize,
    dest: impl Fn(&Destination) -> Option<Destination> + Send + 'static,
) -> io::Result<(Vec<CoreLog>, Writer)> {
    let (full_tx, full_rx) = sync_channel(cores * BUFFERS_PER_CORE);
    let mut logs = Vec::with_capacity(cores);
    let mut frees = Vec::with_capacity(cores);
    for core in 0..cores {
        let (tx, rx) = sync_channel(BUFFERS_PER_CORE);
        for _ in 0..BUFFERS_PER_CORE {
            let _ = tx.try_send(Vec::with_capacity(BUFFER_BYTES));
        }
        frees.push(tx);
        logs.push(CoreLog {
            core,
            cur: Vec::new(),
            full: full_tx.clone(),
            free: rx,
            successes: 0,
        });
    }
    let reopen = Arc::new(AtomicBool::new(false));
    let flag = reopen.clone();
    let thread = std::thread::Builder::new()
        .name("spillway-access-log".into())
        .spawn(move || run(full_rx, frees, dest, &flag))?;
    Ok((logs, Writer { reopen, thread }))
}

enum Sink {
    Off,
    Stdout,
    File(File),
}

fn open(dest: &Destination) -> Sink {
    match dest {
        Destination::Off => Sink::Off,
        Destination::Stdout => Sink::Stdout,
        Destination::File(path) => match OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => Sink::File(f),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot open the access log");
                Sink::Off
            }
        },
    }
}

impl Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Sink::Off => Ok(()),
            Sink::Stdout => io::stdout().lock().write_all(buf),
            Sink::File(f) => f.write_all(buf),
        }
    }
}

fn run(
    full: Receiver<(usize, Vec<u8>)>,
    frees: Vec<SyncSender<Vec<u8>>>,
    dest: impl Fn(&Destination) -> Option<Destination>,
    reopen: &AtomicBool,
) {
    let mut current = dest(&Destination::Off).unwrap_or(Destination::Off);
    let mut sink = open(&current);
    let mut failing = false;
    let mut checked_ms = clock::now_ms();
    loop {
        match full.recv_timeout(Duration::from_secs(1)) {
            Ok((core, mut buf)) => {
                match sink.write(&buf) {
                    Ok(()) => failing = false,
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "cannot write the access log");
                    }
                    Err(_) => {}
                }
                buf.clear();
                if let Some(tx) = frees.get(core) {
                    let _ = tx.try_send(buf);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // A reload may have changed the destination: look once a second.
        let now = clock::now_ms();
        if now.saturating_sub(checked_ms) >= 1000 {
            checked_ms = now;
            if let Some(dest) = dest(&current) {
                current = dest;
                sink = open(&current);
                tracing::info!(destination = ?current, "access log destination changed");
            }
        }
        if reopen.swap(false, Ordering::AcqRel) {
            if let Some(now) = dest(&current) {
                current = now;
            }
            sink = open(&current);
            tracing::info!(destination = ?current, "access log reopened");
        }
    }
}

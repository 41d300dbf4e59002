//! The upstream side: per-core keep-alive pools per worker, connects with timeouts and
//! down-marking, router-side load tracking, and (in [`forward`]) sending a request and
//! streaming its response back.

pub mod forward;

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use monoio::net::TcpStream;

use crate::config::snapshot::WorkerState;
use crate::core::{CoreCtx, clock};
use crate::metrics::{add, sub};

/// Pooled connections idle at least this long are checked with a peek before reuse.
pub const PEEK_AFTER_IDLE_MS: u64 = 200;

/// Idle keep-alive connections of one core, per worker slot (newest last).
#[derive(Debug, Default)]
pub struct Pools {
    idle: Vec<Vec<(TcpStream, u64)>>,
}

impl Pools {
    pub fn new() -> Pools {
        Pools::default()
    }

    /// The newest idle connection to `slot` that is still open, if any. Stale or closed
    /// ones are dropped on the way.
    pub fn take(&mut self, slot: u32, now_ms: u64, idle_timeout_ms: u64) -> Option<TcpStream> {
        let list = self.idle.get_mut(slot as usize)?;
        while let Some((stream, since)) = list.pop() {
            let idle = now_ms.saturating_sub(since);
            if idle >= idle_timeout_ms {
                // Newest is stale, so all are.
                list.clear();
                return None;
            }
            // A connection back from a response moments ago is open: servers that close
            // after a response say `Connection: close` (never pooled), and keep-alive
            // timeouts are seconds. Peek (one syscall) only after a real idle spell.
            if idle < PEEK_AFTER_IDLE_MS || is_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    pub fn put(&mut self, slot: u32, stream: TcpStream, now_ms: u64, max_idle: usize) {
        let slot = slot as usize;
        if self.idle.len() <= slot {
            self.idle.resize_with(slot + 1, Vec::new);
        }
        let list = &mut self.idle[slot];
        if list.len() < max_idle {
            list.push((stream, now_ms));
        }
    }

    /// Closes connections idle for longer than the timeout.
    pub fn sweep(&mut self, now_ms: u64, idle_timeout_ms: u64) {
        for list in &mut self.idle {
            let stale = list
                .iter()
                .take_while(|(_, since)| now_ms.saturating_sub(*since) >= idle_timeout_ms)
                .count();
            list.drain(..stale);
        }
    }

    pub fn idle_count(&self, slot: u32) -> usize {
        self.idle.get(slot as usize).map_or(0, Vec::len)
    }
}

/// A pooled connection is usable only if the peer has not closed it and sent nothing
/// unsolicited: a non-blocking peek must find no data (EAGAIN).
fn is_open(stream: &TcpStream) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    let mut byte = [0u8; 1];
    matches!(
        recv(
            stream.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Err(nix::errno::Errno::EAGAIN)
    )
}

/// Closes idle pooled connections past their timeout, once a second.
pub async fn sweep_pools(ctx: Rc<CoreCtx>) {
    loop {
        monoio::time::sleep(Duration::from_secs(1)).await;
        let timeout = ctx
            .shared
            .snapshot
            .load()
            .config
            .limits
            .pool_idle_timeout_ms;
        ctx.pools.borrow_mut().sweep(clock::now_ms(), timeout);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect timed out")]
    Timeout,
    #[error("connect failed: {0}")]
    Io(#[from] io::Error),
}

pub async fn connect(addr: SocketAddr, timeout_ms: u64) -> Result<TcpStream, ConnectError> {
    let stream = monoio::time::timeout(
        Duration::from_millis(timeout_ms),
        TcpStream::connect_addr(addr),
    )
    .await
    .map_err(|_| ConnectError::Timeout)??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Router-side accounting of one request on one worker (semantics §2, `tracked`): prefill
/// tokens until the first response byte, KV blocks until the end. Released on drop, so
/// every path (completion, disconnect, error) gives the load back.
#[derive(Debug)]
pub struct Tracked<'a> {
    state: &'a WorkerState,
    core: usize,
    prompt_tokens: u64,
    block_size: u64,
    prefill: u64,
    blocks: u64,
    generated: u64,
}

impl<'a> Tracked<'a> {
    pub fn start(
        state: &'a WorkerState,
        core: usize,
        prompt_tokens: u64,
        block_size: u32,
    ) -> Tracked<'a> {
        let block_size = u64::from(block_size.max(1));
        let blocks = prompt_tokens.div_ceil(block_size);
        let cell = &state.tracked[core];
        add(&cell.inflight, 1);
        add(&cell.prefill_tokens, prompt_tokens);
        add(&cell.decode_blocks, blocks);
        Tracked {
            state,
            core,
            prompt_tokens,
            block_size,
            prefill: prompt_tokens,
            blocks,
            generated: 0,
        }
    }

    /// The first response byte arrived: prefill is over.
    pub fn first_byte(&mut self) {
        if self.prefill > 0 {
            sub(&self.state.tracked[self.core].prefill_tokens, self.prefill);
            self.prefill = 0;
        }
    }

    /// `n` more generated tokens (with `track_output_blocks`).
    pub fn generated(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.generated += n;
        let blocks = (self.prompt_tokens + self.generated).div_ceil(self.block_size);
        if blocks > self.blocks {
            add(
                &self.state.tracked[self.core].decode_blocks,
                blocks - self.blocks,
            );
            self.blocks = blocks;
        }
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        let cell = &self.state.tracked[self.core];
        sub(&cell.inflight, 1);
        sub(&cell.prefill_tokens, self.prefill);
        sub(&cell.decode_blocks, self.blocks);
    }
}

/// This core's in-flight count to a worker (for power-of-two and least-loaded).
#[inline]
pub fn inflight_here(state: &WorkerState, core: usize) -> u32 {
    state.tracked[core].inflight.load(Relaxed) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::snapshot::Registry;
    use crate::config::{Config, Overrides};

    #[test]
    fn tracked_load_returns_to_zero() {
        let cfg = Config::parse(
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            &Overrides::default(),
        )
        .unwrap();
        let snap = Registry::new(2).build(cfg);
        let state = &snap.workers[0].state;
        {
            let mut t = Tracked::start(state, 1, 100, 16);
            assert_eq!(state.tracked[1].prefill_tokens.load(Relaxed), 100);
            assert_eq!(state.tracked[1].decode_blocks.load(Relaxed), 7);
            t.first_byte();
            assert_eq!(state.tracked[1].prefill_tokens.load(Relaxed), 0);
            t.generated(13);
            assert_eq!(state.tracked[1].decode_blocks.load(Relaxed), 8);
            assert_eq!(state.inflight_total(), 1);
        }
        assert_eq!(state.inflight_total(), 0);
        assert_eq!(state.tracked[1].decode_blocks.load(Relaxed), 0);
        assert_eq!(state.tracked[0].decode_blocks.load(Relaxed), 0);
    }
}

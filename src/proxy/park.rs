//! Stage, between bursts of requests: a keep-alive connection with nothing to read for
//! `buffer_release_ms` parks. It holds no buffer and no request state, only its halves,
//! its peer and a 32-byte probe read in flight for the first bytes of its next request.
//! Parked connections have no timer of their own: the core's sweep (once a second) cancels
//! the probes of those idle past `idle_timeout_ms`, and they close.

use std::time::Instant;

use monoio::io::{CancelableAsyncReadRent, Canceller};

use std::cell::RefCell;

use super::peer::PeerIp;
use crate::http::limits::IDLE_PROBE_LEN;
use crate::runtime::clock;
use crate::runtime::stream::{ClientRead, ClientWrite};

/// What a connection keeps between bursts.
pub(super) struct Parked {
    pub half: ClientRead,
    pub writer: ClientWrite,
    pub peer: PeerIp,
    /// Cancels the connection's read in flight (the burst's, or the probe).
    pub canceller: Canceller,
    pub probe: Box<[u8; IDLE_PROBE_LEN]>,
    /// Bytes of the next request in `probe`.
    pub probed: usize,
}

/// The idle deadlines of a core's parked connections, with what cancels their probes.
#[derive(Default)]
pub struct ParkedConns {
    deadlines: slab::Slab<(u64, Option<Canceller>)>,
}

impl std::fmt::Debug for ParkedConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkedConns")
            .field("parked", &self.deadlines.len())
            .finish()
    }
}

impl ParkedConns {
    /// Cancels the probes of connections idle past their deadline (they close).
    pub fn expire(&mut self, now_ms: u64) {
        for (_, (deadline, canceller)) in self.deadlines.iter_mut() {
            if *deadline <= now_ms
                && let Some(c) = canceller.take()
            {
                drop(c.cancel());
            }
        }
    }

    /// Connections parked now.
    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deadlines.is_empty()
    }
}

/// A connection's place in [`ParkedConns`]; gives it back on every path.
struct Place<'a> {
    parked: &'a RefCell<ParkedConns>,
    key: usize,
}

impl Place<'_> {
    /// The canceller back, unless the sweep used it (the connection idled out).
    fn leave(self) -> Option<Canceller> {
        let left = self.parked.borrow_mut().deadlines.try_remove(self.key);
        // Already removed: nothing left for `Drop` to do.
        std::mem::forget(self);
        left.and_then(|(_, canceller)| canceller)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.parked.borrow_mut().deadlines.try_remove(self.key);
    }
}

/// Waits, without a buffer, for the first bytes of the next request, until `idle_ms`
/// counted from `since` (among the core's `parked` connections, whose sweep ends the
/// wait). None: the client closed or idled out.
pub(super) async fn park(
    parked: &RefCell<ParkedConns>,
    conn: Parked,
    idle_ms: u64,
    since: Instant,
) -> Option<Parked> {
    let Parked {
        mut half,
        mut writer,
        peer,
        canceller,
        probe,
        ..
    } = conn;
    let idled_ms = clock::since(since).as_millis() as u64;
    let deadline = clock::now_ms().saturating_add(idle_ms.saturating_sub(idled_ms));
    let handle = canceller.handle();
    let key = (parked.borrow_mut().deadlines).insert((deadline, Some(canceller)));
    let place = Place { parked, key };
    half.park();
    writer.park();
    let (res, probe) = half.tcp().cancelable_read(probe, handle).await;
    // A request that beat the sweep's cancel is served (with a fresh canceller).
    let canceller = place.leave();
    match res {
        Ok(probed) if probed > 0 => Some(Parked {
            half,
            writer,
            peer,
            canceller: canceller.unwrap_or_default(),
            probe,
            probed,
        }),
        _ => None,
    }
}

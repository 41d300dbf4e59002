//! Stage, between bursts of requests: a keep-alive connection with nothing to read for
//! `buffer_release_ms` parks. It holds no buffer, no request state and no canceller, only
//! its halves, its peer's address and a 32-byte probe read in flight for the first bytes
//! of its next request. Parked connections have no timer of their own: the core's sweep
//! (once a second) shuts the reading side of those idle past `idle_timeout_ms` down, their
//! probes end, and they close.

use std::cell::RefCell;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::time::Instant;

use monoio::io::{AsyncReadRent, Canceller};

use crate::runtime::clock;
use crate::runtime::stream::{ClientRead, ClientWrite};

/// What a connection keeps between bursts (and hands to each burst).
pub(super) struct Parked {
    pub half: ClientRead,
    pub writer: ClientWrite,
    /// The socket, for the sweep's shutdown.
    pub fd: RawFd,
    pub peer: IpAddr,
    /// [`IDLE_PROBE_LEN`](crate::http::limits::IDLE_PROBE_LEN) bytes, allocated once per
    /// connection.
    pub probe: Box<[u8]>,
    /// Bytes of the next request in `probe`.
    pub probed: usize,
}

impl Parked {
    /// A connection's halves, its socket and its peer, before its first burst.
    pub fn new(halves: (ClientRead, ClientWrite), fd: RawFd, peer: IpAddr) -> Parked {
        Parked {
            half: halves.0,
            writer: halves.1,
            fd,
            peer,
            probe: vec![0; crate::http::limits::IDLE_PROBE_LEN].into_boxed_slice(),
            probed: 0,
        }
    }
}

/// The idle deadlines of a core's parked connections, with their sockets; and the
/// cancellers of the bursts that ended, for the next ones (a parked connection holds none).
#[derive(Default)]
pub struct ParkedConns {
    deadlines: slab::Slab<(u64, RawFd)>,
    cancellers: Vec<Canceller>,
}

impl std::fmt::Debug for ParkedConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkedConns")
            .field("parked", &self.deadlines.len())
            .field("cancellers", &self.cancellers.len())
            .finish()
    }
}

impl ParkedConns {
    /// Ends the probes of connections idle past their deadline (they close): their sockets'
    /// reading sides are shut down, so the probe reads the end of the stream. The entry
    /// stays (marked, so that it is shut down once) until the connection's park ends and
    /// takes it out, so a socket in the table is open and a key is never reused early.
    pub fn expire(&mut self, now_ms: u64) {
        for (_, (deadline, fd)) in self.deadlines.iter_mut() {
            if *deadline <= now_ms {
                *deadline = u64::MAX;
                let _ = nix::sys::socket::shutdown(*fd, nix::sys::socket::Shutdown::Read);
            }
        }
    }

    /// A canceller for a burst's reads: one that an ended burst gave back, else a new one.
    pub(super) fn take_canceller(&mut self) -> Canceller {
        self.cancellers.pop().unwrap_or_default()
    }

    /// An ended burst's canceller, none of whose reads is in flight.
    pub(super) fn give_canceller(&mut self, canceller: Canceller) {
        self.cancellers.push(canceller);
    }

    /// Frees the cancellers kept beyond `keep`; once a second.
    pub fn trim_cancellers(&mut self, keep: usize) {
        self.cancellers.truncate(keep);
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

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.parked.borrow_mut().deadlines.try_remove(self.key);
    }
}

/// Waits, without a buffer, for the first bytes of the next request, until `idle_ms`
/// counted from `since` (among the core's `parked` connections, whose sweep ends the
/// wait). True: `conn.probe` holds `conn.probed` bytes of it; false: the client closed or
/// idled out.
pub(super) async fn park(
    parked: &RefCell<ParkedConns>,
    conn: &mut Parked,
    idle_ms: u64,
    since: Instant,
) -> bool {
    let idled_ms = clock::since(since).as_millis() as u64;
    let deadline = clock::now_ms().saturating_add(idle_ms.saturating_sub(idled_ms));
    let key = (parked.borrow_mut().deadlines).insert((deadline, conn.fd));
    let place = Place { parked, key };
    conn.half.park();
    conn.writer.park();
    // A request that beat the sweep's shutdown is served (its answer can still be written;
    // the next read sees the end of the stream).
    let probe = std::mem::take(&mut conn.probe);
    let (res, probe) = conn.half.tcp().read(probe).await;
    drop(place);
    conn.probe = probe;
    conn.probed = res.unwrap_or(0);
    conn.probed > 0
}

//! Replica sync (`[nats] replica_sync`): what the other front-door replicas routed to each
//! worker and have not finished, as they publish it. Without it every replica's tracked
//! load is its own share only, so a worker fed by R replicas reaches R times a tracked
//! threshold before any of them sees it busy (the problem Dynamo's
//! `--router-replica-sync` exists for). A peer's message is its whole routed load and
//! replaces its previous one, so a lost message costs one interval and nothing
//! accumulates; a peer that falls silent is forgotten. Pure: `now` is passed in.

use std::borrow::Cow;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::state::{KvLoad, SlotMap};

/// A peer is forgotten after this many of its publish intervals without a message.
pub const PEER_SILENCE_INTERVALS: u64 = 10;

fn plus(a: KvLoad, b: KvLoad) -> KvLoad {
    KvLoad {
        prefill_tokens: a.prefill_tokens.saturating_add(b.prefill_tokens),
        decode_blocks: a.decode_blocks.saturating_add(b.decode_blocks),
    }
}

fn minus(a: KvLoad, b: KvLoad) -> KvLoad {
    KvLoad {
        prefill_tokens: a.prefill_tokens.saturating_sub(b.prefill_tokens),
        decode_blocks: a.decode_blocks.saturating_sub(b.decode_blocks),
    }
}

fn is_zero(l: KvLoad) -> bool {
    l == KvLoad::default()
}

/// One worker's entry in a replica's message.
#[derive(Debug, Serialize, Deserialize)]
pub struct RoutedEntry<'a> {
    #[serde(borrow)]
    pub worker_id: Cow<'a, str>,
    #[serde(default)]
    pub active_prefill_tokens: u64,
    #[serde(default)]
    pub active_decode_blocks: u64,
}

impl<'a> RoutedEntry<'a> {
    pub fn new(worker_id: &'a str, load: KvLoad) -> RoutedEntry<'a> {
        RoutedEntry {
            worker_id: Cow::Borrowed(worker_id),
            active_prefill_tokens: load.prefill_tokens,
            active_decode_blocks: load.decode_blocks,
        }
    }

    pub fn load(&self) -> KvLoad {
        KvLoad {
            prefill_tokens: self.active_prefill_tokens,
            decode_blocks: self.active_decode_blocks,
        }
    }
}

/// A replica's message: `{"replica": id, "routed": [{"worker_id", "active_prefill_tokens",
/// "active_decode_blocks"}, ...]}`, its workers with routed load (absent: none).
#[derive(Debug, Serialize, Deserialize)]
pub struct RoutedMessage<'a> {
    #[serde(borrow)]
    pub replica: Cow<'a, str>,
    #[serde(borrow)]
    pub routed: Vec<RoutedEntry<'a>>,
}

impl RoutedMessage<'_> {
    pub fn parse(payload: &[u8]) -> Result<RoutedMessage<'_>, serde_json::Error> {
        serde_json::from_slice(payload)
    }
}

#[derive(Debug)]
struct Peer {
    /// Forgotten at this time unless it speaks again.
    until: u64,
    /// Per worker slot, what its last message said (non-zero entries only).
    routed: Vec<(u32, KvLoad)>,
}

/// Every live peer's last message, and their sum per worker.
#[derive(Debug, Default)]
pub struct PeerLoads {
    peers: FxHashMap<Box<str>, Peer>,
    sum: SlotMap<KvLoad>,
}

impl PeerLoads {
    /// Replaces what `peer` routed with `routed` (worker slot, load), heard at `now`;
    /// it is forgotten at `until` unless it speaks again.
    pub fn replace(
        &mut self,
        peer: &str,
        routed: impl IntoIterator<Item = (u32, KvLoad)>,
        until: u64,
    ) {
        let p = match self.peers.get_mut(peer) {
            Some(p) => p,
            None => self.peers.entry(peer.into()).or_insert(Peer {
                until,
                routed: Vec::new(),
            }),
        };
        p.until = until;
        for &(slot, load) in &p.routed {
            subtract(&mut self.sum, slot, load);
        }
        p.routed.clear();
        for (slot, load) in routed {
            if !is_zero(load) {
                p.routed.push((slot, load));
                let s = self.sum.entry(slot).or_default();
                *s = plus(*s, load);
            }
        }
    }

    /// Forgets the peers silent until `now`; returns how many.
    pub fn expire(&mut self, now: u64) -> usize {
        let before = self.peers.len();
        let sum = &mut self.sum;
        self.peers.retain(|_, p| {
            let live = p.until > now;
            if !live {
                for &(slot, load) in &p.routed {
                    subtract(sum, slot, load);
                }
            }
            live
        });
        before - self.peers.len()
    }

    /// What the live peers routed to the worker in `slot`, summed.
    pub fn of(&self, slot: u32) -> KvLoad {
        self.sum.get(&slot).copied().unwrap_or_default()
    }

    /// Peers heard from and not yet forgotten.
    pub fn peers(&self) -> usize {
        self.peers.len()
    }
}

fn subtract(sum: &mut SlotMap<KvLoad>, slot: u32, load: KvLoad) {
    if let Some(s) = sum.get_mut(&slot) {
        *s = minus(*s, load);
        if is_zero(*s) {
            sum.remove(&slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(prefill_tokens: u64, decode_blocks: u64) -> KvLoad {
        KvLoad {
            prefill_tokens,
            decode_blocks,
        }
    }

    #[test]
    fn each_message_replaces_the_peers_last_and_peers_add_up() {
        let mut p = PeerLoads::default();
        p.replace("a", [(1, r(100, 10)), (2, r(5, 0))], 1000);
        p.replace("b", [(1, r(50, 4))], 1000);
        assert_eq!(
            (p.of(1), p.of(2), p.of(3), p.peers()),
            (r(150, 14), r(5, 0), KvLoad::default(), 2)
        );
        // a's next message no longer has worker 2 and less on worker 1.
        p.replace("a", [(1, r(20, 1))], 1100);
        assert_eq!((p.of(1), p.of(2)), (r(70, 5), KvLoad::default()));
        assert!(!p.sum.contains_key(&2), "a zero sum keeps no entry");
        // An empty message: a peer that routes nothing now.
        p.replace("b", [], 1100);
        assert_eq!(p.of(1), r(20, 1));
    }

    #[test]
    fn a_silent_peer_is_forgotten_with_its_load() {
        let mut p = PeerLoads::default();
        p.replace("a", [(1, r(100, 10))], 1000);
        p.replace("b", [(1, r(1, 1))], 1500);
        assert_eq!(p.expire(999), 0);
        assert_eq!(p.expire(1000), 1);
        assert_eq!((p.of(1), p.peers()), (r(1, 1), 1));
        // Speaking again keeps a peer alive.
        p.replace("b", [(1, r(2, 2))], 2500);
        assert_eq!((p.expire(2000), p.of(1)), (0, r(2, 2)));
        assert_eq!(
            (p.expire(2500), p.of(1), p.peers()),
            (1, KvLoad::default(), 0)
        );
    }

    #[test]
    fn messages_read_and_write_the_same_shape() {
        let text = br#"{"replica":"r1","routed":[{"worker_id":"w\u0031","active_prefill_tokens":7},{"worker_id":"w2","active_decode_blocks":3,"other":1}]}"#;
        let m = RoutedMessage::parse(text).unwrap();
        assert_eq!(m.replica, "r1");
        let got: Vec<(&str, KvLoad)> = m.routed.iter().map(|e| (&*e.worker_id, e.load())).collect();
        assert_eq!(got, [("w1", r(7, 0)), ("w2", r(0, 3))]);
        let out = serde_json::to_string(&m).unwrap();
        assert_eq!(
            out,
            r#"{"replica":"r1","routed":[{"worker_id":"w1","active_prefill_tokens":7,"active_decode_blocks":0},{"worker_id":"w2","active_prefill_tokens":0,"active_decode_blocks":3}]}"#
        );
        for bad in [
            &b"{}"[..],
            b"[]",
            b"{\"replica\":1,\"routed\":[]}",
            b"{\"replica\":\"x\"}",
        ] {
            assert!(
                RoutedMessage::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

//! The busy set: what the monitor publishes to every core (per model: shedding enabled,
//! and the adaptive mode's cap on queue waits while the model is overloaded; per member
//! and request class: busy and why; per member a load figure for least-loaded, and the
//! headroom (the prefill room) a core checks its own routing against; per worker whether health took it
//! out of rotation, per model whether it is below its healthy share and routes over all).
//! Immutable once published; each core reads its replica with one atomic load.

use super::cow_chunks::CowChunks;
use crate::shed::{Class, Headroom, Why};

/// A member's entry.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemberEntry {
    /// Per class: busy (and why, when known) or not.
    pub busy: [Option<Option<Why>>; 3],
    /// In permille of the fullest known signal.
    pub load: u16,
    pub headroom: Headroom,
}

/// The busy set as published: immutable, one per publish, read lock-free by the cores.
#[derive(Debug, Default, Clone)]
pub struct BusySet {
    pub generation: u64,
    /// Bit per model id: a threshold is configured, so busy members are excluded.
    enabled: Vec<u64>,
    /// Per model id: the longest a request may wait in a worker's queue, in ms (0: as
    /// each worker's `request_queue_timeout_ms` says).
    queue_cap_ms: Vec<u32>,
    /// Per class, bit per member id: the (model, worker) pair is busy for that class.
    busy: [Vec<u64>; 3],
    /// Per member id: load in permille of the fullest known signal (least-loaded ties).
    load: Vec<u16>,
    /// Per class and member id, for busy members: which threshold made it busy, and by
    /// how much. In shared chunks: a publication copies only the chunks it changed.
    why: [CowChunks<Option<Why>>; 3],
    /// Per member id: its worker's prefill room (default: nothing to check).
    headroom: CowChunks<Headroom>,
    /// Bit per worker slot: out of rotation by health (ejected, or its checks failing).
    /// The health pass's, kept by [`BusySet::clear`].
    unhealthy: Vec<u64>,
    /// Bit per model id: fewer workers healthy than its share, so health is ignored.
    panic: Vec<u64>,
}

impl PartialEq for BusySet {
    /// Same content (the generation is not content).
    fn eq(&self, other: &Self) -> bool {
        /// Without its trailing defaults (storage grown past the entries in use).
        fn trimmed<T: Default + PartialEq>(v: &[T]) -> &[T] {
            let n = v
                .iter()
                .rposition(|x| *x != T::default())
                .map_or(0, |i| i + 1);
            &v[..n]
        }
        trimmed(&self.enabled) == trimmed(&other.enabled)
            && trimmed(&self.queue_cap_ms) == trimmed(&other.queue_cap_ms)
            && (0..3).all(|c| {
                trimmed(&self.busy[c]) == trimmed(&other.busy[c]) && self.why[c] == other.why[c]
            })
            && trimmed(&self.load) == trimmed(&other.load)
            && self.headroom == other.headroom
            && trimmed(&self.unhealthy) == trimmed(&other.unhealthy)
            && trimmed(&self.panic) == trimmed(&other.panic)
    }
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

/// Sets or clears bit `i`; returns whether it changed.
fn put_bit(words: &mut Vec<u64>, i: u32, on: bool) -> bool {
    if bit(words, i) == on {
        return false;
    }
    if on {
        set_bit(words, i);
    } else if let Some(w) = words.get_mut((i / 64) as usize) {
        *w &= !(1u64 << (i % 64));
    }
    true
}

impl BusySet {
    #[inline]
    pub fn enabled(&self, model_id: u32) -> bool {
        bit(&self.enabled, model_id)
    }

    /// Whether the member is busy for requests of `class`.
    #[inline]
    pub fn is_busy(&self, class: Class, member_id: u32) -> bool {
        bit(&self.busy[class.index()], member_id)
    }

    /// Whether health took the worker in `slot` out of rotation.
    #[inline]
    pub fn is_unhealthy(&self, slot: u32) -> bool {
        bit(&self.unhealthy, slot)
    }

    /// Whether the model routes over all its workers, health aside (the panic rule).
    #[inline]
    pub fn panics(&self, model_id: u32) -> bool {
        bit(&self.panic, model_id)
    }

    /// Returns whether it changed.
    pub fn set_unhealthy(&mut self, slot: u32, unhealthy: bool) -> bool {
        put_bit(&mut self.unhealthy, slot, unhealthy)
    }

    /// Returns whether it changed.
    pub fn set_panic(&mut self, model_id: u32, panic: bool) -> bool {
        put_bit(&mut self.panic, model_id, panic)
    }

    #[inline]
    pub fn load(&self, member_id: u32) -> u16 {
        self.load.get(member_id as usize).copied().unwrap_or(0)
    }

    pub fn set_enabled(&mut self, model_id: u32) {
        set_bit(&mut self.enabled, model_id);
    }

    /// The cap on a request's wait in a worker's queue for `model_id`, in ms, if any.
    #[inline]
    pub fn queue_cap_ms(&self, model_id: u32) -> Option<u64> {
        let cap = self.queue_cap_ms.get(model_id as usize).copied();
        cap.filter(|&c| c != 0).map(u64::from)
    }

    /// Sets (or with `None` lifts) the model's cap on queue waits; returns whether it
    /// changed.
    pub fn set_queue_cap_ms(&mut self, model_id: u32, cap_ms: Option<u64>) -> bool {
        let cap = cap_ms.map_or(0, |c| c.clamp(1, u64::from(u32::MAX)) as u32);
        let i = model_id as usize;
        if self.queue_cap_ms.get(i).copied().unwrap_or(0) == cap {
            return false;
        }
        if self.queue_cap_ms.len() <= i {
            self.queue_cap_ms.resize(i + 1, 0);
        }
        self.queue_cap_ms[i] = cap;
        true
    }

    /// Why a busy member is busy for `class` (`None` for members that are not).
    #[inline]
    pub fn why(&self, class: Class, member_id: u32) -> Option<Why> {
        self.why[class.index()].get(member_id as usize)
    }

    pub fn set_busy(&mut self, class: Class, member_id: u32, why: Option<Why>) {
        set_bit(&mut self.busy[class.index()], member_id);
        self.why[class.index()].set(member_id as usize, why);
    }

    pub fn set_load(&mut self, member_id: u32, permille: u16) {
        let i = member_id as usize;
        if self.load.len() <= i {
            self.load.resize(i + 1, 0);
        }
        self.load[i] = permille;
    }

    /// The prefill room of the member's worker (see [`Headroom`]).
    #[inline]
    pub fn headroom(&self, member_id: u32) -> Headroom {
        self.headroom.get(member_id as usize)
    }

    /// A member's whole entry.
    pub fn member(&self, member_id: u32) -> MemberEntry {
        let busy = Class::ALL.map(|c| self.is_busy(c, member_id).then(|| self.why(c, member_id)));
        MemberEntry {
            busy,
            load: self.load(member_id),
            headroom: self.headroom(member_id),
        }
    }

    /// Replaces a member's entry, writing only what differs (a `why` chunk shared with
    /// a published set is copied only when its entry changes); returns whether it did.
    pub fn set_member(&mut self, member_id: u32, entry: MemberEntry) -> bool {
        if self.member(member_id) == entry {
            return false;
        }
        let MemberEntry {
            busy,
            load,
            headroom,
        } = entry;
        let (w, bit) = ((member_id / 64) as usize, 1u64 << (member_id % 64));
        for c in Class::ALL {
            match busy[c.index()] {
                Some(why) => self.set_busy(c, member_id, why),
                None => {
                    if let Some(word) = self.busy[c.index()].get_mut(w) {
                        *word &= !bit;
                    }
                    self.why[c.index()].set(member_id as usize, None);
                }
            }
        }
        self.set_load(member_id, load);
        self.headroom.set(member_id as usize, headroom);
        true
    }

    /// Clears a member's entry (not busy for any class, load 0, no headroom to check).
    pub fn clear_member(&mut self, member_id: u32) {
        self.set_member(member_id, MemberEntry::default());
    }

    /// Empties the busy rule's part of the set, keeping its storage. Health is the health
    /// pass's and stays.
    pub fn clear(&mut self) {
        self.enabled.iter_mut().for_each(|w| *w = 0);
        self.queue_cap_ms.iter_mut().for_each(|c| *c = 0);
        self.busy.iter_mut().flatten().for_each(|w| *w = 0);
        self.load.iter_mut().for_each(|l| *l = 0);
        self.why.iter_mut().for_each(CowChunks::clear);
        self.headroom.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_bits_are_content_and_survive_the_busy_rules_clear() {
        let (mut a, b) = (BusySet::default(), BusySet::default());
        assert!(a.set_unhealthy(70, true));
        assert!(!a.set_unhealthy(70, true), "unchanged");
        assert!(a.set_panic(2, true));
        assert!(a.is_unhealthy(70) && !a.is_unhealthy(69) && a.panics(2) && !a.panics(1));
        assert_ne!(a, b);
        a.clear();
        assert!(a.is_unhealthy(70) && a.panics(2));
        assert!(a.set_unhealthy(70, false) && a.set_panic(2, false));
        assert_eq!(a, b, "cleared bits compare equal to storage never grown");
    }

    #[test]
    fn a_queue_cap_is_set_lifted_and_part_of_the_content() {
        let (mut a, b) = (BusySet::default(), BusySet::default());
        assert_eq!(a.queue_cap_ms(3), None);
        assert!(a.set_queue_cap_ms(3, Some(6)));
        assert!(!a.set_queue_cap_ms(3, Some(6)), "unchanged");
        assert_eq!((a.queue_cap_ms(3), a.queue_cap_ms(2)), (Some(6), None));
        assert_ne!(a, b, "a cap is content: the set is published again");
        assert!(
            a.set_queue_cap_ms(3, Some(0)),
            "a cap of 0 ms is 1 ms, never none"
        );
        assert_eq!(a.queue_cap_ms(3), Some(1));
        assert!(a.set_queue_cap_ms(3, None));
        assert_eq!(a.queue_cap_ms(3), None);
        assert_eq!(a, b);
        a.set_queue_cap_ms(1, Some(6));
        a.clear();
        assert_eq!(a.queue_cap_ms(1), None);
    }
}

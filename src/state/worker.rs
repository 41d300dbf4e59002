//! Per-worker state shared by every core: down marks and refusal holds, and the router-side
//! load each core has sent to the worker. Atomics only; kept across reloads while the
//! worker is unchanged.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Maps and sets keyed by worker slot, as the monitor keeps them (a slot is a small
/// integer the registry hands out, so a multiply hash serves where SipHash cost a
/// lookup's worth of time).
pub type SlotMap<V> = rustc_hash::FxHashMap<u32, V>;
pub type SlotSet = rustc_hash::FxHashSet<u32>;

/// Per-worker state shared by all cores, kept across reloads while the worker is unchanged.
#[derive(Debug)]
pub struct WorkerState {
    /// Stable id: index of the worker's pools and per-core slots on every core.
    pub slot: u32,
    pub name: Box<str>,
    /// Monotonic ms (the process clock) until which the worker is skipped.
    down_until_ms: AtomicU64,
    failures: AtomicU32,
    /// Monotonic ms until which the worker is skipped after refusing a request (at
    /// capacity, queue timeout, upstream overload), whatever the monitor publishes, unless
    /// a load report arrives first.
    held_until_ms: AtomicU64,
    /// When the latest refusal hold began (monotonic ms).
    held_since_ms: AtomicU64,
    /// Failed attempts in a row, over all cores (a success resets it).
    in_a_row: AtomicU32,
    /// Set by the core whose failure made `in_a_row` reach the ejection threshold: out of
    /// rotation at once, until the monitor's next pass ejects it or says no.
    provisional: AtomicBool,
    /// Since when (monotonic ms, 0: not) the worker is suspect: set by a core whose
    /// request waited a check interval for a head while the worker answered nothing;
    /// cleared by the monitor when a check passes. New requests avoid it.
    suspect_since_ms: AtomicU64,
    /// When a check last passed (written by the monitor).
    check_passed_ms: AtomicU64,
    /// The monitor opened its trial after an ejection; the core whose request takes the
    /// trial closes it.
    trial_open: AtomicBool,
    /// One entry per core, written only by that core: what it routed and has not finished.
    pub tracked: Box<[CachePadded<TrackedLoad>]>,
    /// `kv` routing's cost inputs, as the monitor last published them: the load the engine
    /// reported (summed over ranks) and the tracked load summed over cores.
    engine_prefill_tokens: AtomicU64,
    engine_decode_blocks: AtomicU64,
    tracked_prefill_tokens: AtomicU64,
    tracked_decode_blocks: AtomicU64,
}

/// A worker's load as `kv` routing weighs it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvLoad {
    pub prefill_tokens: u64,
    pub decode_blocks: u64,
}

/// Router-side load one core has sent to one worker.
#[derive(Debug, Default)]
pub struct TrackedLoad {
    pub inflight: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub decode_blocks: AtomicU64,
    /// Time to first token of the requests it routed, summed (µs), and how many: the
    /// adaptive mode's measurement.
    pub ttft_us: AtomicU64,
    pub first_tokens: AtomicU64,
    /// `kv` routing: blocks of the requests it routed here, and how many of them were
    /// predicted cached here.
    pub kv_blocks: AtomicU64,
    pub kv_hit_blocks: AtomicU64,
    /// Attempts this core saw succeed and fail (of those, failed connects): passive
    /// outlier detection's input.
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub connect_failed: AtomicU64,
    /// When this core last got a response head from the worker (monotonic ms).
    pub answered_ms: AtomicU64,
    /// This core's prefill tokens and decode blocks when the monitor last folded them
    /// (written by the monitor).
    folded_prefill_tokens: AtomicU64,
    folded_decode_blocks: AtomicU64,
}

impl WorkerState {
    pub(super) fn new(slot: u32, name: &str, cores: usize) -> WorkerState {
        WorkerState {
            slot,
            name: name.into(),
            down_until_ms: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            held_until_ms: AtomicU64::new(0),
            held_since_ms: AtomicU64::new(0),
            in_a_row: AtomicU32::new(0),
            provisional: AtomicBool::new(false),
            suspect_since_ms: AtomicU64::new(0),
            check_passed_ms: AtomicU64::new(0),
            trial_open: AtomicBool::new(false),
            tracked: (0..cores)
                .map(|_| CachePadded::new(TrackedLoad::default()))
                .collect(),
            engine_prefill_tokens: AtomicU64::new(0),
            engine_decode_blocks: AtomicU64::new(0),
            tracked_prefill_tokens: AtomicU64::new(0),
            tracked_decode_blocks: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn is_down(&self, now_ms: u64) -> bool {
        self.down_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// Records a failed connect: down for `base << (failures-1)` ms, capped at `max`.
    pub fn mark_down(&self, now_ms: u64, base_ms: u64, max_ms: u64) -> u64 {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let backoff = base_ms
            .saturating_mul(1u64 << (failures - 1).min(20))
            .min(max_ms);
        self.down_until_ms
            .store(now_ms + backoff, Ordering::Relaxed);
        backoff
    }

    /// Keeps a worker that refused a request out of rotation for `hold_ms`, or until its
    /// next load report ([`WorkerState::load_reported`]).
    pub fn hold(&self, now_ms: u64, hold_ms: u64) {
        self.held_since_ms.fetch_max(now_ms, Ordering::Relaxed);
        self.held_until_ms
            .fetch_max(now_ms.saturating_add(hold_ms), Ordering::Relaxed);
    }

    /// A load report for the worker was applied at `now_ms` (by the monitor): it ends a
    /// refusal hold that began before it, since the busy rule now judges the worker on
    /// fresh load (docs/behaviour.md §8.6).
    /// A hold renewed meanwhile by a core stays.
    pub fn load_reported(&self, now_ms: u64) {
        let until = self.held_until_ms.load(Ordering::Relaxed);
        if until <= now_ms || self.held_since_ms.load(Ordering::Relaxed) >= now_ms {
            return;
        }
        // Fails, keeping the hold, if a core extended it since the load above.
        let _ = self
            .held_until_ms
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    #[inline]
    pub fn is_held(&self, now_ms: u64) -> bool {
        self.held_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// Inhibits a worker that answered 503 for `ms` (it is skipped like a down worker).
    pub fn inhibit(&self, now_ms: u64, ms: u64) {
        self.down_until_ms.fetch_max(now_ms + ms, Ordering::Relaxed);
    }

    /// A successful connect clears the backoff.
    #[inline]
    pub fn mark_up(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
            self.down_until_ms.store(0, Ordering::Relaxed);
        }
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Whether new requests avoid the worker until a check passes.
    #[inline]
    pub fn is_suspect(&self) -> bool {
        self.suspect_since_ms.load(Ordering::Relaxed) != 0
    }

    /// Since when the worker is suspect, if it is.
    #[inline]
    pub fn suspect_since(&self) -> Option<u64> {
        Some(self.suspect_since_ms.load(Ordering::Relaxed)).filter(|&ms| ms != 0)
    }

    /// A request waited `interval_ms` for a head at `now_ms`: the worker is suspect when
    /// no core got a head from it and no check passed in that time. Returns whether it
    /// became suspect now.
    pub fn stalled(&self, now_ms: u64, interval_ms: u64) -> bool {
        let since = now_ms.saturating_sub(interval_ms);
        let answered = self
            .tracked
            .iter()
            .map(|t| t.answered_ms.load(Ordering::Relaxed))
            .max();
        if answered.unwrap_or(0) > since || self.check_passed_ms.load(Ordering::Relaxed) > since {
            return false;
        }
        let now_ms = now_ms.max(1);
        (self.suspect_since_ms)
            .compare_exchange(0, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// A check passed at `now_ms` (the monitor): the worker is not suspect.
    pub fn check_passed(&self, now_ms: u64) {
        self.check_passed_ms.fetch_max(now_ms, Ordering::Relaxed);
        self.suspect_since_ms.store(0, Ordering::Relaxed);
    }

    /// The monitor opens (or closes) the worker's trial after an ejection.
    pub fn set_trial(&self, open: bool) {
        self.trial_open.store(open, Ordering::Relaxed);
    }

    #[inline]
    pub fn trial_open(&self) -> bool {
        self.trial_open.load(Ordering::Relaxed)
    }

    /// Takes the open trial for one request; false when another core took it first.
    pub fn claim_trial(&self) -> bool {
        self.trial_open
            .compare_exchange(true, false, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Counts an attempt's outcome on core `core`: `Some(connect)` a failure (a failed
    /// connect or not), `None` a success. Returns the failures in a row so far.
    #[inline]
    pub fn outcome(&self, core: usize, failure: Option<bool>) -> u32 {
        let t = &self.tracked[core];
        match failure {
            None => {
                crate::state::counters::add(&t.ok, 1);
                if self.in_a_row.load(Ordering::Relaxed) != 0 {
                    self.in_a_row.store(0, Ordering::Relaxed);
                }
                0
            }
            Some(connect) => {
                crate::state::counters::add(&t.failed, 1);
                if connect {
                    crate::state::counters::add(&t.connect_failed, 1);
                }
                self.in_a_row
                    .fetch_add(1, Ordering::Relaxed)
                    .saturating_add(1)
            }
        }
    }

    /// Out of rotation until the monitor's next pass decides (see `provisional`).
    pub fn set_provisional(&self) {
        self.provisional.store(true, Ordering::Relaxed);
    }

    #[inline]
    pub fn is_provisional(&self) -> bool {
        self.provisional.load(Ordering::Relaxed)
    }

    /// The monitor takes the mark to decide on it.
    pub fn take_provisional(&self) -> bool {
        self.provisional.swap(false, Ordering::Relaxed)
    }

    /// Sum over cores of the attempts' outcomes so far.
    pub fn outcomes(&self) -> crate::health::Outcomes {
        let mut o = crate::health::Outcomes::default();
        for t in self.tracked.iter() {
            o.ok = o.ok.wrapping_add(t.ok.load(Ordering::Relaxed));
            o.failed = o.failed.wrapping_add(t.failed.load(Ordering::Relaxed));
            o.connect_failed = o
                .connect_failed
                .wrapping_add(t.connect_failed.load(Ordering::Relaxed));
        }
        o
    }

    /// Requests core `core` has in flight to the worker (power-of-two, least-loaded).
    #[inline]
    pub fn inflight_on(&self, core: usize) -> u32 {
        self.tracked[core].inflight.load(Ordering::Relaxed) as u32
    }

    /// `kv` routing's view of the worker's load from core `core`: what the engine last
    /// reported, or the tracked load if more. The tracked load is the monitor's last sum
    /// over cores with this core's part replaced by its live cells, so what this core
    /// routed (or finished) since counts at once, without waiting for a publish.
    #[inline]
    pub fn kv_load(&self, core: usize) -> KvLoad {
        let t = &self.tracked[core];
        let live = |total: &AtomicU64, folded: &AtomicU64, now: &AtomicU64| {
            let others = total
                .load(Ordering::Relaxed)
                .saturating_sub(folded.load(Ordering::Relaxed));
            others.saturating_add(now.load(Ordering::Relaxed))
        };
        let prefill = live(
            &self.tracked_prefill_tokens,
            &t.folded_prefill_tokens,
            &t.prefill_tokens,
        );
        let decode = live(
            &self.tracked_decode_blocks,
            &t.folded_decode_blocks,
            &t.decode_blocks,
        );
        KvLoad {
            prefill_tokens: prefill.max(self.engine_prefill_tokens.load(Ordering::Relaxed)),
            decode_blocks: decode.max(self.engine_decode_blocks.load(Ordering::Relaxed)),
        }
    }

    /// The monitor's side of [`Self::kv_load`]: `engine` as reported; the tracked load
    /// summed over cores now, each core's part remembered, plus what peer replicas
    /// routed (`peers`).
    pub fn publish_load(&self, engine: KvLoad, peers: KvLoad) {
        let (mut prefill, mut decode) = (peers.prefill_tokens, peers.decode_blocks);
        for t in self.tracked.iter() {
            let (p, d) = (
                t.prefill_tokens.load(Ordering::Relaxed),
                t.decode_blocks.load(Ordering::Relaxed),
            );
            t.folded_prefill_tokens.store(p, Ordering::Relaxed);
            t.folded_decode_blocks.store(d, Ordering::Relaxed);
            prefill = prefill.wrapping_add(p);
            decode = decode.wrapping_add(d);
        }
        self.tracked_prefill_tokens
            .store(prefill, Ordering::Relaxed);
        self.tracked_decode_blocks.store(decode, Ordering::Relaxed);
        self.engine_prefill_tokens
            .store(engine.prefill_tokens, Ordering::Relaxed);
        self.engine_decode_blocks
            .store(engine.decode_blocks, Ordering::Relaxed);
    }

    /// Counts a `kv`-routed request of `blocks` blocks, `hit` of them predicted cached here.
    #[inline]
    pub fn kv_hit(&self, core: usize, hit: u64, blocks: u64) {
        let t = &self.tracked[core];
        crate::state::counters::add(&t.kv_blocks, blocks);
        crate::state::counters::add(&t.kv_hit_blocks, hit);
    }

    /// Sum over cores of (blocks routed, blocks predicted cached) in `kv` mode.
    pub fn kv_totals(&self) -> (u64, u64) {
        self.tracked.iter().fold((0u64, 0u64), |(b, h), t| {
            (
                b.wrapping_add(t.kv_blocks.load(Ordering::Relaxed)),
                h.wrapping_add(t.kv_hit_blocks.load(Ordering::Relaxed)),
            )
        })
    }

    /// Sum over cores of (TTFT µs, first tokens) so far.
    pub fn ttft_totals(&self) -> (u64, u64) {
        self.tracked.iter().fold((0u64, 0u64), |(us, n), t| {
            (
                us.wrapping_add(t.ttft_us.load(Ordering::Relaxed)),
                n.wrapping_add(t.first_tokens.load(Ordering::Relaxed)),
            )
        })
    }

    /// Sum over cores of the load routed here and not finished (the `tracked` source).
    pub fn routed_totals(&self) -> KvLoad {
        self.tracked.iter().fold(KvLoad::default(), |l, t| KvLoad {
            prefill_tokens: l
                .prefill_tokens
                .wrapping_add(t.prefill_tokens.load(Ordering::Relaxed)),
            decode_blocks: l
                .decode_blocks
                .wrapping_add(t.decode_blocks.load(Ordering::Relaxed)),
        })
    }

    /// Sum over cores of requests in flight.
    pub fn inflight_total(&self) -> u64 {
        self.tracked
            .iter()
            .map(|t| t.inflight.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_backoff_doubles_and_caps() {
        let w = WorkerState::new(0, "w", 1);
        assert_eq!(w.mark_down(100, 1000, 5000), 1000);
        assert!(w.is_down(1099) && !w.is_down(1100));
        assert_eq!(w.mark_down(100, 1000, 5000), 2000);
        assert_eq!(w.mark_down(100, 1000, 5000), 4000);
        assert_eq!(w.mark_down(100, 1000, 5000), 5000);
        w.mark_up();
        assert!(!w.is_down(100));
        assert_eq!(w.mark_down(100, 1000, 5000), 1000);
    }

    #[test]
    fn a_stalled_request_makes_a_silent_worker_suspect_until_a_check_passes() {
        let w = WorkerState::new(0, "w", 2);
        w.tracked[1].answered_ms.store(9_000, Ordering::Relaxed);
        assert!(!w.stalled(10_000, 2_000), "core 1 got a head 1 s ago");
        assert!(w.stalled(11_500, 2_000));
        assert!(w.is_suspect() && !w.stalled(11_600, 2_000), "once");
        assert_eq!(
            w.suspect_since(),
            Some(11_500),
            "the first one says since when"
        );
        w.check_passed(11_700);
        assert!(!w.is_suspect());
        assert!(
            !w.stalled(12_000, 2_000),
            "a check passed within the interval"
        );
        assert!(w.stalled(13_800, 2_000));
    }

    #[test]
    fn one_request_takes_a_trial() {
        let w = WorkerState::new(0, "w", 1);
        assert!(!w.claim_trial());
        w.set_trial(true);
        assert!(w.trial_open() && w.claim_trial() && !w.claim_trial());
    }

    #[test]
    fn outcomes_sum_over_cores() {
        let w = WorkerState::new(0, "w", 2);
        w.outcome(0, None);
        w.outcome(1, Some(true));
        w.outcome(1, Some(false));
        let o = w.outcomes();
        assert_eq!((o.ok, o.failed, o.connect_failed), (1, 2, 1));
    }

    #[test]
    fn a_refusal_holds_for_its_time_and_a_shorter_one_never_shortens_it() {
        let w = WorkerState::new(0, "w", 1);
        assert!(!w.is_held(0));
        w.hold(100, 1000);
        assert!(w.is_held(1099) && !w.is_held(1100));
        w.hold(200, 10);
        assert!(w.is_held(1099));
    }

    #[test]
    fn a_load_report_after_a_refusal_ends_its_hold_and_an_earlier_one_does_not() {
        let w = WorkerState::new(0, "w", 1);
        w.hold(100, 1000);
        w.load_reported(100);
        assert!(
            w.is_held(500),
            "a report of the refusal's own ms is not after it"
        );
        w.load_reported(101);
        assert!(!w.is_held(101));
        w.hold(200, 1000);
        w.load_reported(1300);
        assert!(!w.is_held(1300), "nothing to end past the hold");
        w.hold(1400, 1000);
        assert!(w.is_held(1500), "a new refusal holds again");
    }

    #[test]
    fn kv_load_sees_this_cores_changes_at_once_and_others_at_the_next_publish() {
        let w = WorkerState::new(0, "w", 2);
        let set = |core: usize, prefill: u64, decode: u64| {
            w.tracked[core]
                .prefill_tokens
                .store(prefill, Ordering::Relaxed);
            w.tracked[core]
                .decode_blocks
                .store(decode, Ordering::Relaxed);
        };
        set(0, 100, 10);
        set(1, 50, 5);
        let load = |core| {
            let l = w.kv_load(core);
            (l.prefill_tokens, l.decode_blocks)
        };
        assert_eq!(load(0), (100, 10), "before any publish: this core's own");
        w.publish_load(KvLoad::default(), KvLoad::default());
        assert_eq!((load(0), load(1)), ((150, 15), (150, 15)));
        set(0, 0, 0);
        assert_eq!(load(0), (50, 5), "core 0 finished: at once for core 0");
        assert_eq!(load(1), (150, 15), "for core 1 at the next publish");
        let engine = KvLoad {
            prefill_tokens: 0,
            decode_blocks: 40,
        };
        w.publish_load(engine, KvLoad::default());
        assert_eq!(load(1), (50, 40), "the engine's report when it says more");
        let peers = KvLoad {
            prefill_tokens: 30,
            decode_blocks: 3,
        };
        w.publish_load(engine, peers);
        assert_eq!(
            load(1),
            (80, 40),
            "peer replicas' routed load adds to the tracked"
        );
    }
}

//! How fast each capped worker's engine slots come back while requests wait at its gate
//! (docs/behaviour.md §8.11): a waiter's predicted wait is its place in the queue over that
//! rate. The monitor takes each gate's release count once a tick; only intervals with
//! requests waiting at both ends count (a gate with free slots gives slots back as slowly
//! as requests come, which says nothing of how fast it serves). Releases and that time are
//! both averaged with the same exponential decay, so old intervals fade together.

use crate::state::Snapshot;

/// How fast old intervals fade (ms): several long generations' worth.
const DECAY_MS: f64 = 5_000.0;
/// Waited time (decayed, ms) below which the rate stays unknown.
const MIN_OBSERVED_MS: f64 = 250.0;

/// One gate's measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReleaseRate {
    /// The gate's release count and waiters at the last tick, and its time (ms).
    last: Option<(u64, u64, u64)>,
    /// Decayed releases and decayed time (ms) over intervals with requests waiting.
    releases: f64,
    observed_ms: f64,
}

impl ReleaseRate {
    /// Takes the gate's `released` count and `waiting` requests at `now_ms`; returns the
    /// rate, per second (0: not measured yet). With no release over the time measured the
    /// rate is one release over that time, never 0: a queue that does not move predicts
    /// a long wait, and one release more than seen errs toward admitting.
    pub fn step(&mut self, released: u64, waiting: u64, now_ms: u64) -> f64 {
        if let Some((r0, w0, t0)) = self.last {
            let dt = now_ms.saturating_sub(t0) as f64;
            let fade = (-dt / DECAY_MS).exp();
            self.releases *= fade;
            self.observed_ms *= fade;
            // A count that went back is a new gate (a reload changed the limits).
            if w0 > 0 && waiting > 0 && released >= r0 {
                self.releases += (released - r0) as f64;
                self.observed_ms += dt;
            }
        }
        self.last = Some((released, waiting, now_ms));
        if self.observed_ms < MIN_OBSERVED_MS {
            return 0.0;
        }
        self.releases.max(1.0) * 1_000.0 / self.observed_ms
    }
}

/// Every capped worker's measurement, by worker slot, and every waiting room's (the
/// releases of its model's gates while requests wait in it), by model id.
#[derive(Debug, Default)]
pub struct ReleaseRates {
    gates: Vec<ReleaseRate>,
    rooms: Vec<ReleaseRate>,
}

/// The entry at `i`, grown as ids appear.
fn entry(v: &mut Vec<ReleaseRate>, i: usize) -> &mut ReleaseRate {
    if v.len() <= i {
        v.resize(i + 1, ReleaseRate::default());
    }
    &mut v[i]
}

impl ReleaseRates {
    /// One tick: measures every gate and room of `snap` and publishes its rate to it.
    pub fn observe(&mut self, snap: &Snapshot, now_ms: u64) {
        for w in &snap.workers {
            let Some(gate) = &w.gate else {
                continue;
            };
            let (_, waiting) = gate.occupancy();
            let rate = entry(&mut self.gates, w.state.slot as usize);
            gate.pace().set(rate.step(gate.released(), waiting, now_ms));
        }
        for m in &snap.models {
            let Some(room) = m.room.as_ref().map(|r| &r.room) else {
                continue;
            };
            let released = (m.members.iter())
                .filter_map(|p| snap.workers[p.worker as usize].gate.as_ref())
                .map(|g| g.released())
                .sum();
            let rate = entry(&mut self.rooms, m.id as usize);
            room.pace().set(rate.step(released, room.waiting(), now_ms));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tick every 20 ms; `releases_every` ticks one slot comes back; `waiting` at each.
    fn run(
        r: &mut ReleaseRate,
        ticks: u64,
        start_ms: u64,
        releases_every: u64,
        waiting: u64,
    ) -> f64 {
        let mut rate = 0.0;
        let base = r.last.map_or(0, |(n, _, _)| n);
        for i in 0..=ticks {
            let released = base + i / releases_every;
            rate = r.step(released, waiting, start_ms + i * 20);
        }
        rate
    }

    #[test]
    fn a_busy_gate_measures_its_release_rate() {
        let mut r = ReleaseRate::default();
        // Three releases a second (one every 333 ms, ~17 ticks) while requests wait.
        let rate = run(&mut r, 500, 0, 17, 3);
        assert!((rate - 1000.0 / 340.0).abs() < 0.2, "{rate}");
    }

    #[test]
    fn unknown_until_enough_time_with_waiters() {
        let mut r = ReleaseRate::default();
        assert_eq!(run(&mut r, 10, 0, 1, 3), 0.0, "200 ms measured");
        // Free slots (nobody waits): the time does not count.
        let mut idle = ReleaseRate::default();
        assert_eq!(run(&mut idle, 500, 0, 5, 0), 0.0);
    }

    #[test]
    fn a_queue_that_does_not_move_predicts_a_long_wait() {
        let mut r = ReleaseRate::default();
        let rate = run(&mut r, 100, 0, u64::MAX, 2);
        // One release over about 2 s.
        assert!(rate > 0.0 && rate < 0.7, "{rate}");
    }

    #[test]
    fn the_rate_follows_a_change() {
        let mut r = ReleaseRate::default();
        run(&mut r, 500, 0, 2, 4);
        let slower = run(&mut r, 2_000, 10_020, 20, 4);
        assert!((slower - 2.5).abs() < 0.3, "{slower}");
    }

    #[test]
    fn a_count_that_goes_back_is_a_new_gate() {
        let mut r = ReleaseRate::default();
        r.step(1_000, 3, 0);
        r.step(5, 3, 20);
        assert_eq!(r.releases, 0.0);
    }
}

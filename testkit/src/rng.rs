//! Seeded randomness for tests that shuffle their workload: a failure prints its seed and
//! `SPILLWAY_TEST_SEED=<seed>` replays it.

/// xorshift64*: enough randomness to shuffle a test, and replayable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The test's seed: `SPILLWAY_TEST_SEED` when set, else the clock; printed either way.
pub fn seed() -> u64 {
    let seed = std::env::var("SPILLWAY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (replay with SPILLWAY_TEST_SEED={seed})");
    seed
}

//! A small, fast PRNG (xorshift64*): filler words and seeded test workloads need spread,
//! not secrecy.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_below_and_repeats_per_seed() {
        let draw = |seed| {
            let mut r = Rng::new(seed);
            (0..64).map(|_| r.below(10)).collect::<Vec<_>>()
        };
        assert!(draw(3).iter().all(|&v| v < 10));
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }
}

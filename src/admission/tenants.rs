//! Tenants (docs/behaviour.md §8.13): a request's tenant is a hash of its
//! `tenant_header` value, told apart over [`TENANTS`] buckets. The waiting room serves
//! tenants in turn by bucket (`room.rs`); [`InFlight`] counts a model's requests per
//! bucket, so the busy rule can spare the tenants below the mean (`light`).
//!
//! Every count here is a std atomic in every build: a reading for a decision, never a
//! bound, so the loom models leave it out.

use std::sync::atomic::{AtomicU64, Ordering};

/// Tenants are told apart by their hash modulo this: tenants in one bucket share a turn,
/// a share and a count.
pub const TENANTS: usize = 64;

/// The bucket of a tenant hash: its top bits after a multiplicative mix, so any hash
/// spreads.
pub(super) fn bucket(tenant: u64) -> usize {
    (tenant.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - TENANTS.trailing_zeros())) as usize
}

/// A model's requests in flight per tenant bucket, across all cores: counted from the
/// start of forwarding (a wait in the room included) to the answer.
#[derive(Debug)]
pub struct InFlight {
    by_bucket: Box<[AtomicU64]>,
    /// The sum of `by_bucket`.
    total: AtomicU64,
    /// Buckets with a request in flight.
    active: AtomicU64,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            by_bucket: (0..TENANTS).map(|_| AtomicU64::new(0)).collect(),
            total: AtomicU64::new(0),
            active: AtomicU64::new(0),
        }
    }
}

impl InFlight {
    /// Counts one request of `tenant` until the guard drops.
    pub fn enter(&self, tenant: u64) -> Counted<'_> {
        let bucket = bucket(tenant);
        if self.by_bucket[bucket].fetch_add(1, Ordering::Relaxed) == 0 {
            self.active.fetch_add(1, Ordering::Relaxed);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        Counted { of: self, bucket }
    }

    /// Whether `tenant` has fewer requests in flight than the mean of the tenants with
    /// any (its own counted): c × active < total. A lone tenant is never light; of two
    /// with equal counts, neither is.
    pub fn light(&self, tenant: u64) -> bool {
        let mine = self.by_bucket[bucket(tenant)].load(Ordering::Relaxed);
        let active = self.active.load(Ordering::Relaxed);
        mine.saturating_mul(active) < self.total.load(Ordering::Relaxed)
    }

    /// Requests in flight per bucket, by bucket number (for metrics).
    pub fn by_bucket(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_bucket.iter().map(|c| c.load(Ordering::Relaxed))
    }
}

/// One request counted in an [`InFlight`]; dropping it uncounts it.
#[derive(Debug)]
pub struct Counted<'a> {
    of: &'a InFlight,
    bucket: usize,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.of.total.fetch_sub(1, Ordering::Relaxed);
        if self.of.by_bucket[self.bucket].fetch_sub(1, Ordering::Relaxed) == 1 {
            self.of.active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tenant hashes in different buckets.
    fn two() -> (u64, u64) {
        let a = 1;
        let b = (2..).find(|&t| bucket(t) != bucket(a)).unwrap_or(2);
        (a, b)
    }

    #[test]
    fn a_tenant_below_the_mean_is_light() {
        let f = InFlight::default();
        let (heavy, light) = two();
        assert!(
            !f.light(heavy),
            "nobody in flight: nobody is below the mean"
        );
        let held: Vec<_> = (0..10).map(|_| f.enter(heavy)).collect();
        assert!(!f.light(heavy), "a lone tenant is the mean");
        let mine = f.enter(light);
        assert!(f.light(light), "1 of 11 in flight against a mean of 5.5");
        assert!(!f.light(heavy));
        let more: Vec<_> = (0..9).map(|_| f.enter(light)).collect();
        assert!(
            !f.light(light) && !f.light(heavy),
            "10 and 10: neither below"
        );
        drop(held);
        assert!(!f.light(light), "alone again");
        assert!(
            f.light(heavy),
            "a tenant with nothing in flight is below any mean"
        );
        drop((mine, more));
        assert_eq!(f.by_bucket().sum::<u64>(), 0);
        assert_eq!(f.active.load(Ordering::Relaxed), 0);
        assert_eq!(f.total.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn tenants_spread_over_the_buckets() {
        let used: std::collections::HashSet<usize> = (0..1000u64).map(bucket).collect();
        assert_eq!(used.len(), TENANTS);
    }
}

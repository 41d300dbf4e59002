//! Routing decisions: which endpoint a path is, and which worker of a model's pool gets a
//! request in each router mode. Pure: the caller supplies each member's state (down, busy,
//! in flight, load) as read from its replica, and the per-core counter and RNG.

pub mod cache;
pub mod handoff;
mod kv;
pub mod peek;
pub mod prefix;

pub use kv::{KvDecision, KvSettings, decide_kv, pick_kv, record_kv};

/// How a model's pool picks a worker (docs/behaviour.md §4.4–§4.5); busy and down workers are skipped in
/// every mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterMode {
    RoundRobin,
    Random,
    PowerOfTwo,
    LeastLoaded,
    Direct,
    /// KV-prefix-aware (Dynamo's `kv`): [`pick_kv`].
    Kv,
}

impl RouterMode {
    pub const NAMES: &str = "round-robin, random, power-of-two, least-loaded, direct, kv";

    pub fn parse(s: &str) -> Option<RouterMode> {
        Some(match s {
            "round-robin" => RouterMode::RoundRobin,
            "random" => RouterMode::Random,
            "power-of-two" => RouterMode::PowerOfTwo,
            "least-loaded" => RouterMode::LeastLoaded,
            "direct" => RouterMode::Direct,
            "kv" => RouterMode::Kv,
            _ => return None,
        })
    }
}

/// The OpenAI endpoint of a proxied path; a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    Responses,
    Other,
}

impl Endpoint {
    pub const ALL: [Endpoint; 5] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::Other,
    ];

    pub fn from_path(path: &[u8]) -> Endpoint {
        match path {
            b"/v1/chat/completions" => Endpoint::ChatCompletions,
            b"/v1/completions" => Endpoint::Completions,
            b"/v1/embeddings" => Endpoint::Embeddings,
            b"/v1/responses" => Endpoint::Responses,
            _ => Endpoint::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Responses => "responses",
            Endpoint::Other => "other",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// What the router needs to know about one member of a model's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemberState {
    /// Down (failed connects), or already tried and failed for this request.
    pub unreachable: bool,
    /// Busy per the published busy set (only when a threshold is set), marked overloaded
    /// since the last publish, or refused this request already.
    pub busy: bool,
    /// Requests this core has in flight to the worker.
    pub inflight: u32,
    /// Published load, 0..=1000 (permille of the fullest signal); ties after in-flight.
    pub load: u16,
    /// Active prefill tokens and decode blocks (`kv` mode's cost): the published load or
    /// what this core has routed there since, whichever is more.
    pub prefill_tokens: u64,
    pub decode_blocks: u64,
}

impl MemberState {
    fn eligible(&self) -> bool {
        !self.unreachable && !self.busy
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Position in the model's member list.
    Member(usize),
    /// Reachable members exist but every one is busy → overload status.
    Overloaded,
    /// No member can serve at all → 503.
    Unavailable,
}

/// A small, fast per-core PRNG (xorshift64*); routing needs spread, not secrecy.
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

    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
}

/// Picks a member in `mode` (not `Direct`, see [`pick_direct`]). `state(i)` reads member i.
pub fn pick(
    mode: RouterMode,
    n: usize,
    state: impl Fn(usize) -> MemberState,
    rr: &mut u64,
    rng: &mut Rng,
) -> Pick {
    let mut reachable = 0usize;
    let mut eligible = 0usize;
    for i in 0..n {
        let s = state(i);
        reachable += usize::from(!s.unreachable);
        eligible += usize::from(s.eligible());
    }
    if reachable == 0 {
        return Pick::Unavailable;
    }
    if eligible == 0 {
        return Pick::Overloaded;
    }
    let nth_eligible = |k: usize| {
        (0..n)
            .filter(|&i| state(i).eligible())
            .nth(k)
            .unwrap_or_default()
    };
    let start = (*rr % n as u64) as usize;
    *rr = rr.wrapping_add(1);
    let chosen = match mode {
        // `kv` is `pick_kv`'s; without its inputs it falls back to round-robin.
        RouterMode::RoundRobin | RouterMode::Direct | RouterMode::Kv => (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| state(i).eligible())
            .unwrap_or_default(),
        RouterMode::Random => nth_eligible(rng.below(eligible)),
        RouterMode::PowerOfTwo => {
            let a = nth_eligible(rng.below(eligible));
            if eligible == 1 {
                a
            } else {
                let mut k = rng.below(eligible - 1);
                let b0 = nth_eligible(k);
                if b0 == a {
                    k += 1;
                }
                let b = if b0 == a { nth_eligible(k) } else { b0 };
                let (sa, sb) = (state(a), state(b));
                if (sb.inflight, sb.load) < (sa.inflight, sa.load) {
                    b
                } else {
                    a
                }
            }
        }
        RouterMode::LeastLoaded => (0..n)
            .map(|k| (start + k) % n)
            .filter_map(|i| {
                let s = state(i);
                s.eligible().then_some((i, (s.inflight, s.load)))
            })
            .min_by_key(|&(_, key)| key)
            .map_or(0, |(i, _)| i),
    };
    Pick::Member(chosen)
}

/// Why a direct (`x-worker-id`) request cannot go to its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectRefusal {
    MissingHeader,
    UnknownWorker,
    /// The named member (its position) is busy.
    Busy(usize),
    Unreachable,
}

/// Direct mode: the member whose name is `worker_id`.
pub fn pick_direct<'a>(
    worker_id: Option<&[u8]>,
    n: usize,
    name: impl Fn(usize) -> &'a [u8],
    state: impl Fn(usize) -> MemberState,
) -> Result<usize, DirectRefusal> {
    let id = worker_id.ok_or(DirectRefusal::MissingHeader)?.trim_ascii();
    let i = (0..n)
        .find(|&i| name(i) == id)
        .ok_or(DirectRefusal::UnknownWorker)?;
    let s = state(i);
    if s.unreachable {
        Err(DirectRefusal::Unreachable)
    } else if s.busy {
        Err(DirectRefusal::Busy(i))
    } else {
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn st(unreachable: bool, busy: bool, inflight: u32) -> MemberState {
        MemberState {
            unreachable,
            busy,
            inflight,
            ..MemberState::default()
        }
    }

    #[test]
    fn empty_and_all_down_is_unavailable_all_busy_is_overloaded() {
        let mut rr = 0;
        let mut rng = super::Rng::new(1);
        for mode in [
            RouterMode::RoundRobin,
            RouterMode::Random,
            RouterMode::PowerOfTwo,
            RouterMode::LeastLoaded,
        ] {
            assert_eq!(
                pick(mode, 0, |_| st(false, false, 0), &mut rr, &mut rng),
                Pick::Unavailable
            );
            assert_eq!(
                pick(mode, 3, |_| st(true, false, 0), &mut rr, &mut rng),
                Pick::Unavailable
            );
            assert_eq!(
                pick(mode, 3, |_| st(false, true, 0), &mut rr, &mut rng),
                Pick::Overloaded
            );
            // Busy plus down, nothing eligible: overloaded (reachable workers exist).
            assert_eq!(
                pick(mode, 2, |i| st(i == 0, i == 1, 0), &mut rr, &mut rng),
                Pick::Overloaded
            );
        }
    }

    #[test]
    fn round_robin_rotates_and_skips_busy() {
        let mut rr = 0;
        let mut rng = super::Rng::new(1);
        let got: Vec<_> = (0..6)
            .map(|_| {
                pick(
                    RouterMode::RoundRobin,
                    3,
                    |_| st(false, false, 0),
                    &mut rr,
                    &mut rng,
                )
            })
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2].map(Pick::Member));
        let got: Vec<_> = (0..4)
            .map(|_| {
                pick(
                    RouterMode::RoundRobin,
                    3,
                    |i| st(false, i == 1, 0),
                    &mut rr,
                    &mut rng,
                )
            })
            .collect();
        assert!(got.iter().all(|p| *p != Pick::Member(1)));
    }

    #[test]
    fn least_loaded_prefers_fewest_inflight_then_load() {
        let mut rr = 0;
        let mut rng = super::Rng::new(1);
        let loads = [(3, 0), (1, 900), (1, 100), (2, 0)];
        let p = pick(
            RouterMode::LeastLoaded,
            4,
            |i| MemberState {
                inflight: loads[i].0,
                load: loads[i].1,
                ..MemberState::default()
            },
            &mut rr,
            &mut rng,
        );
        assert_eq!(p, Pick::Member(2));
    }

    #[test]
    fn direct() {
        let names: [&'static [u8]; 2] = [b"w1", b"w2"];
        let ok = |_| st(false, false, 0);
        assert_eq!(pick_direct(Some(b"w2"), 2, |i| names[i], ok), Ok(1));
        assert_eq!(pick_direct(Some(b" w1 "), 2, |i| names[i], ok), Ok(0));
        assert_eq!(
            pick_direct(None, 2, |i| names[i], ok),
            Err(DirectRefusal::MissingHeader)
        );
        assert_eq!(
            pick_direct(Some(b"w3"), 2, |i| names[i], ok),
            Err(DirectRefusal::UnknownWorker)
        );
        assert_eq!(
            pick_direct(Some(b"w1"), 2, |i| names[i], |_| st(false, true, 0)),
            Err(DirectRefusal::Busy(0))
        );
        assert_eq!(
            pick_direct(Some(b"w1"), 2, |i| names[i], |_| st(true, false, 0)),
            Err(DirectRefusal::Unreachable)
        );
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            Endpoint::from_path(b"/v1/chat/completions"),
            Endpoint::ChatCompletions
        );
        assert_eq!(
            Endpoint::from_path(b"/v1/completions"),
            Endpoint::Completions
        );
        assert_eq!(Endpoint::from_path(b"/v1/rerank"), Endpoint::Other);
        for (i, e) in Endpoint::ALL.iter().enumerate() {
            assert_eq!(e.index(), i);
        }
    }

    proptest! {
        /// Every mode picks an eligible member whenever one exists, and only then.
        #[test]
        fn picks_only_eligible(states in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u32..5, 0u16..1000), 1..20),
                               seed in any::<u64>(), rr0 in any::<u64>()) {
            let view = |i: usize| { let (u, b, f, l) = states[i]; MemberState { unreachable: u, busy: b, inflight: f, load: l, ..MemberState::default() } };
            for mode in [RouterMode::RoundRobin, RouterMode::Random, RouterMode::PowerOfTwo, RouterMode::LeastLoaded] {
                let mut rr = rr0;
                let mut rng = super::Rng::new(seed);
                match pick(mode, states.len(), view, &mut rr, &mut rng) {
                    Pick::Member(i) => prop_assert!(view(i).eligible()),
                    Pick::Overloaded => prop_assert!(states.iter().all(|s| s.0 || s.1) && states.iter().any(|s| !s.0)),
                    Pick::Unavailable => prop_assert!(states.iter().all(|s| s.0)),
                }
            }
        }

        /// Random and power-of-two reach every eligible member eventually.
        #[test]
        fn spread(n in 2usize..8, seed in any::<u64>()) {
            let mut rng = super::Rng::new(seed);
            let mut rr = 0;
            for mode in [RouterMode::Random, RouterMode::PowerOfTwo] {
                let mut seen = vec![false; n];
                for _ in 0..400 {
                    if let Pick::Member(i) = pick(mode, n, |_| MemberState::default(), &mut rr, &mut rng) { seen[i] = true; }
                }
                prop_assert!(seen.iter().all(|s| *s), "{:?} {:?}", mode, seen);
            }
        }
    }
}

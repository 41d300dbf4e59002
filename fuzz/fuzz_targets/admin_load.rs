//! `POST /load` as the admin handler runs it, on arbitrary bytes: `parse_events`, then
//! the batch pushed into a load table of a two-model, three-worker fleet (one worker with
//! two data-parallel ranks) and the busy set evaluated. A batch is applied whole or not
//! at all, a worker never holds more ranks than a configured one may, and the monitor
//! tick's partial pass always agrees with a full pass.
#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spillway::http::limits::MAX_DP_SIZE;
use spillway::monitor::Adaptivity;
use spillway::monitor::evaluate::{Latches, Rule, evaluate, evaluate_due};
use spillway::monitor::load::{LoadTable, PushError, parse_events};
use spillway::shed::Thresholds;
use spillway::state::{BusySet, Snapshot};
use spillway::{Config, Overrides};

const FLEET: &str = r#"
load_staleness_ms = 1000
[[models]]
name = "m"
active_decode_blocks_threshold = 0.5
active_prefill_tokens_threshold = 1000
[[models.workers]]
url = "http://127.0.0.1:1"
name = "a"
kv_total_blocks = 100
dp_size = 2
[[models.workers]]
url = "http://127.0.0.1:2"
name = "7"
[[models]]
name = "n"
[[models.workers]]
url = "http://127.0.0.1:3"
name = "b"
max_num_batched_tokens = 512
"#;

fn fleet() -> &'static Snapshot {
    static SNAP: OnceLock<Snapshot> = OnceLock::new();
    SNAP.get_or_init(|| {
        let config = Config::parse(FLEET, &Overrides::default()).expect("the fleet parses");
        Snapshot::standalone(config, 1).expect("IP literals only")
    })
}

fuzz_target!(|body: &[u8]| {
    let Ok(events) = parse_events(body) else {
        return;
    };
    let snap = fleet();
    let mut table = LoadTable::default();
    let now = 10_000;
    match table.push(snap, &events, now) {
        Ok(n) => {
            assert_eq!(n, events.len());
            for w in table.workers.values() {
                assert!(
                    w.ranks.len() <= MAX_DP_SIZE as usize,
                    "{} ranks",
                    w.ranks.len()
                );
                assert!(w.dp_size.is_none_or(|d| (1..=MAX_DP_SIZE).contains(&d)));
            }
        }
        Err(e) => {
            assert!(matches!(
                e,
                PushError::Invalid(_) | PushError::UnknownWorker(_)
            ));
            assert!(
                table.workers.is_empty(),
                "a refused batch was applied in part"
            );
            return;
        }
    }
    let thresholds: HashMap<String, Thresholds> = snap
        .config
        .models
        .iter()
        .map(|m| (m.name.clone(), m.thresholds))
        .collect();
    // A full pass at `now`, then the tick's partial passes: each must agree with a full
    // pass at the same instant (the tick evaluates only entries that can change by
    // themselves).
    let mut latches = Latches::default();
    let mut recheck = Vec::new();
    let adaptivity = Adaptivity::default();
    let mut set = BusySet::default();
    let t = (&thresholds, &adaptivity);
    evaluate(snap, &table, rule(t, &mut latches, &mut recheck), now, &mut set);
    for at in [now + 500, now + 999, now + 1_000, now + 5_000] {
        evaluate_due(snap, &table, rule(t, &mut latches, &mut recheck), at, &mut set);
        let (mut l, mut r, mut full) = (Latches::default(), Vec::new(), BusySet::default());
        evaluate(snap, &table, rule(t, &mut l, &mut r), at, &mut full);
        assert!(set == full, "the tick's pass disagrees with a full pass at {at}");
    }
});

fn rule<'a>(
    (thresholds, adaptivity): (&'a HashMap<String, Thresholds>, &'a Adaptivity),
    latches: &'a mut Latches,
    recheck: &'a mut Vec<u64>,
) -> Rule<'a> {
    Rule {
        thresholds,
        adaptivity,
        latches,
        recheck,
    }
}

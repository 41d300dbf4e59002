use super::*;
use crate::rng::Rng;

const MS: Micros = 1000;

fn cfg() -> EngineConfig {
    EngineConfig {
        kv_blocks: 64,
        block_size: 16,
        max_num_seqs: 4,
        max_num_batched_tokens: 256,
        prefill_tokens_per_s: 10_000.0,
        decode_step_base_ms: 8.0,
        decode_step_per_seq_ms: 0.25,
        enable_prefix_caching: false,
    }
}

/// Drives the engine until it idles, returning every token.
fn run(e: &mut Engine) -> Vec<Token> {
    let mut out = Vec::new();
    e.advance(e.clock, &mut out);
    while let Some(d) = e.next_deadline() {
        e.advance(d, &mut out);
    }
    out
}

fn first_token_at(tokens: &[Token], id: SeqId) -> Micros {
    tokens
        .iter()
        .find(|t| t.id == id && t.index == 0)
        .map(|t| t.at)
        .unwrap()
}

#[test]
fn one_sequence_follows_the_time_model_exactly() {
    let mut e = Engine::new(cfg());
    let id = e.submit(5 * MS, 100, 3).unwrap();
    let mut out = Vec::new();
    e.advance(7 * MS, &mut out);
    // Prefill of 100 tokens at 10k tok/s = 10 ms, plus 8 + 0.25 ms: the first token.
    assert_eq!(e.next_deadline(), Some(5 * MS + 18_250));
    assert_eq!(e.load().running, 1);
    assert_eq!(e.load().used_blocks, 7); // ceil(101 / 16)
    let tokens = run(&mut e);
    let at: Vec<_> = tokens.iter().map(|t| t.at).collect();
    assert_eq!(
        at,
        [5 * MS + 18_250, 5 * MS + 26_500, 5 * MS + 34_750],
        "decode steps of 8.25 ms each"
    );
    assert!(tokens.iter().all(|t| t.id == id));
    assert_eq!(tokens.iter().filter(|t| t.last).count(), 1);
    assert!(tokens[2].last);
    let load = e.load();
    assert_eq!((load.running, load.used_blocks), (0, 0));
    assert_eq!(load.prompt_tokens_total, 100);
    assert_eq!(load.generation_tokens_total, 3);
    assert_eq!(e.next_deadline(), None);
}

#[test]
fn long_prompts_are_prefilled_in_chunks_of_the_token_budget() {
    let mut e = Engine::new(cfg());
    e.submit(0, 600, 1).unwrap();
    let mut out = Vec::new();
    e.advance(0, &mut out);
    // 256 + 256 + 88 tokens: three steps, the first token after the last chunk.
    assert_eq!(e.load().prefill_tokens, 600);
    e.advance(e.next_deadline().unwrap(), &mut out);
    assert_eq!(e.load().prefill_tokens, 344);
    let tokens = run(&mut e);
    let expected = 3 * 8_250 + 60_000;
    assert_eq!(tokens[0].at, expected);
}

#[test]
fn admission_is_fifo_and_limited_by_max_num_seqs() {
    let mut c = cfg();
    c.max_num_seqs = 1;
    let mut e = Engine::new(c);
    let a = e.submit(0, 16, 4).unwrap();
    let b = e.submit(0, 16, 4).unwrap();
    let d = e.submit(0, 16, 4).unwrap();
    let mut out = Vec::new();
    e.advance(0, &mut out);
    assert_eq!((e.load().running, e.load().waiting), (1, 2));
    let tokens = run(&mut e);
    let order: Vec<_> = tokens.iter().map(|t| t.id).collect();
    assert_eq!(order, [a, a, a, a, b, b, b, b, d, d, d, d]);
}

#[test]
fn a_head_that_does_not_fit_blocks_the_queue() {
    let mut c = cfg();
    c.kv_blocks = 10;
    let mut e = Engine::new(c);
    let big = e.submit(0, 100, 40).unwrap(); // 7 blocks at admission
    let blocked = e.submit(0, 100, 1).unwrap(); // needs 7: waits
    let small = e.submit(0, 1, 1).unwrap(); // would fit, but FIFO
    let mut out = Vec::new();
    e.advance(0, &mut out);
    assert_eq!((e.load().running, e.load().waiting), (1, 2));
    let tokens = run(&mut e);
    let last_big = tokens.iter().rfind(|t| t.id == big).unwrap().at;
    assert!(first_token_at(&tokens, blocked) > last_big);
    assert!(first_token_at(&tokens, small) > last_big);
}

#[test]
fn ttft_grows_with_queue_length() {
    let mut c = cfg();
    c.max_num_seqs = 2;
    let mut e = Engine::new(c);
    let ids: Vec<_> = (0..8).map(|_| e.submit(0, 64, 10).unwrap()).collect();
    let tokens = run(&mut e);
    let ttft: Vec<_> = ids.iter().map(|&id| first_token_at(&tokens, id)).collect();
    for pair in ttft.chunks(2).collect::<Vec<_>>().windows(2) {
        assert!(
            pair[1][0] > pair[0][1] + 10 * 8 * MS,
            "each wave waits for the previous one: {ttft:?}"
        );
    }
}

#[test]
fn decode_slows_as_the_batch_grows() {
    let gap = |n: usize| {
        let mut e = Engine::new(cfg());
        for _ in 0..n {
            e.submit(0, 1, 3).unwrap();
        }
        let tokens = run(&mut e);
        tokens[n].at - tokens[0].at
    };
    assert_eq!(gap(1), 8_250);
    assert_eq!(gap(4), 9_000);
}

#[test]
fn full_cache_preempts_the_newest_sequence_and_it_recovers() {
    let mut c = cfg();
    c.kv_blocks = 4;
    c.block_size = 4;
    let mut e = Engine::new(c);
    // Each needs 2 blocks at admission (context 4 + 1) and grows to 3 by its end.
    let old = e.submit(0, 4, 8).unwrap();
    let new = e.submit(0, 4, 8).unwrap();
    let mut out = Vec::new();
    e.advance(0, &mut out);
    assert_eq!(e.load().running, 2);
    assert_eq!(e.load().used_blocks, 4);
    let tokens = run(&mut e);
    assert!(e.load().preemptions_total >= 1);
    // The older one never waits; both still get every token, in order.
    for id in [old, new] {
        let idx: Vec<_> = tokens
            .iter()
            .filter(|t| t.id == id)
            .map(|t| t.index)
            .collect();
        assert_eq!(idx, (0..8).collect::<Vec<_>>());
    }
    let old_done = tokens.iter().rfind(|t| t.id == old).unwrap().at;
    let new_done = tokens.iter().rfind(|t| t.id == new).unwrap().at;
    assert!(old_done < new_done);
    // Recompute counts the context again as prefill work.
    assert!(e.load().prompt_tokens_total > 8);
    assert_eq!(e.load().used_blocks, 0);
}

#[test]
fn abort_frees_blocks_at_once_wherever_the_sequence_is() {
    let mut c = cfg();
    c.max_num_seqs = 1;
    let mut e = Engine::new(c);
    let running = e.submit(0, 100, 50).unwrap();
    let waiting = e.submit(0, 100, 50).unwrap();
    let mut out = Vec::new();
    e.advance(0, &mut out);
    e.advance(e.next_deadline().unwrap(), &mut out);
    assert!(e.load().used_blocks > 0);
    assert!(e.abort(waiting));
    assert_eq!(e.load().waiting, 0);
    assert!(e.abort(running));
    assert!(!e.abort(running));
    let load = e.load();
    assert_eq!(
        (load.running, load.used_blocks, load.prefill_tokens),
        (0, 0, 0)
    );
    // The step under way ends without tokens; then the engine idles.
    out.clear();
    e.advance(Micros::MAX, &mut out);
    assert!(out.is_empty());
    assert_eq!(e.next_deadline(), None);
}

#[test]
fn rejects_what_can_never_fit() {
    let mut e = Engine::new(cfg());
    assert_eq!(e.submit(0, 10, 0), Err(SubmitError::ZeroMaxTokens));
    assert!(matches!(
        e.submit(0, 1000, 25),
        Err(SubmitError::TooLong { max: 1024, .. })
    ));
    assert!(e.submit(0, 1000, 24).is_ok());
}

#[test]
fn arrivals_during_a_step_join_at_the_next_boundary() {
    let mut e = Engine::new(cfg());
    e.submit(0, 1, 100).unwrap();
    let mut out = Vec::new();
    e.advance(0, &mut out);
    let b = e.submit(3 * MS, 1, 1).unwrap();
    e.advance(3 * MS, &mut out);
    assert_eq!(e.load().waiting, 1, "not admitted mid-step");
    let tokens = run(&mut e);
    // Admitted when the first step ends (8.25 ms + 0.1 ms for one prompt token), its
    // first token one step of two sequences later.
    assert_eq!(first_token_at(&tokens, b), 8_350 + 8_600);
}

/// Submits at `now` into an idle engine and runs it: the time to the first token, and
/// the cached tokens it reports.
fn alone(e: &mut Engine, now: Micros, prompt: u32, blocks: &[u64]) -> (Micros, u32) {
    e.clock = now;
    let id = e.submit_prefixed(now, prompt, 1, blocks.to_vec()).unwrap();
    let tokens = run(e);
    let first = tokens.iter().find(|t| t.id == id).unwrap();
    (first.at - now, first.cached)
}

#[test]
fn cached_prefix_blocks_skip_prefill() {
    let mut c = cfg();
    c.enable_prefix_caching = true;
    let mut e = Engine::new(c);
    // 6 full blocks of 16 tokens (64 bytes each) and a partial one: 100 tokens.
    let text = [b'a'; 400];
    let blocks = prefix::block_hashes(&text, e.cfg.block_bytes());
    assert_eq!(blocks.len(), 6);
    // Cold: 100 tokens at 10k tok/s + 8.25 ms.
    assert_eq!(alone(&mut e, 0, 100, &blocks), (18_250, 0));
    // Warm: 96 tokens cached, 4 prefilled.
    assert_eq!(alone(&mut e, 100 * MS, 100, &blocks), (8_650, 96));
    // A prompt all in cache still computes its last token.
    assert_eq!(alone(&mut e, 200 * MS, 96, &blocks), (8_350, 95));
    // A different first block: nothing is cached.
    let other = prefix::block_hashes(&[b'b'; 400], 64);
    assert_eq!(alone(&mut e, 300 * MS, 100, &other), (18_250, 0));
    let load = e.load();
    assert_eq!(load.prefix_cache_queries_total, 396);
    assert_eq!(load.prefix_cache_hits_total, 191);
    assert_eq!(
        load.prompt_tokens_total, 396,
        "every prompt token, cached or computed"
    );

    // Off (the default), the same blocks change nothing.
    let mut e = Engine::new(cfg());
    assert_eq!(alone(&mut e, 0, 100, &blocks), (18_250, 0));
    assert_eq!(alone(&mut e, 100 * MS, 100, &blocks), (18_250, 0));
    assert_eq!(e.load().prefix_cache_queries_total, 0);
}

#[test]
fn a_received_prompt_waits_for_its_transfer_then_skips_prefill() {
    let mut e = Engine::new(cfg());
    let id = e.submit_remote(0, 100, 3, 5 * MS).unwrap();
    let mut out = Vec::new();
    e.advance(0, &mut out);
    // Idle until the KV lands; it counts as waiting and holds nothing yet.
    assert_eq!(e.next_deadline(), Some(5 * MS));
    let load = e.load();
    assert_eq!((load.waiting, load.running, load.used_blocks), (1, 0, 0));
    assert_eq!(
        load.prefill_tokens, 1,
        "only the last prompt token is computed"
    );
    e.advance(5 * MS, &mut out);
    assert_eq!((e.load().running, e.load().used_blocks), (1, 7));
    let tokens = run(&mut e);
    // One step of 8.25 ms plus 0.1 ms for the last prompt token, not 10 ms of prefill.
    assert_eq!(first_token_at(&tokens, id), 5 * MS + 8_350);
    assert_eq!(tokens.len(), 3);
    let load = e.load();
    assert_eq!(
        load.prompt_tokens_total, 100,
        "received tokens count as prompt"
    );
    assert_eq!((load.used_blocks, load.waiting), (0, 0));
}

#[test]
fn a_transfer_blocks_nobody_and_lands_at_a_step_boundary() {
    let mut e = Engine::new(cfg());
    let busy = e.submit(0, 1, 100).unwrap();
    // Submitted first, but its KV lands at 20 ms: the later local request goes ahead.
    let remote = e.submit_remote(0, 100, 1, 20 * MS).unwrap();
    let local = e.submit(1, 1, 1).unwrap();
    let tokens = run(&mut e);
    // Steps: 8.35 ms (busy's prefill), 8.6 ms (with local's), 8.25 ms (busy alone).
    assert_eq!(first_token_at(&tokens, local), 8_350 + 8_600);
    // The transfer lands during the third step and joins when it ends; its first token
    // comes from the step it joins: two sequences and one prompt token.
    let boundary = 8_350 + 8_600 + 8_250;
    assert!(tokens.iter().any(|t| t.id == busy && t.at == boundary));
    assert_eq!(first_token_at(&tokens, remote), boundary + 8_600);

    // An aborted transfer is forgotten.
    let mut e = Engine::new(cfg());
    let id = e.submit_remote(0, 100, 1, 5 * MS).unwrap();
    assert!(e.abort(id));
    assert_eq!(e.load().waiting, 0);
    assert_eq!(e.next_deadline(), None);
    assert!(run(&mut e).is_empty());
}

/// A seeded random workload: the block pool is never overdrawn, every sequence gets
/// exactly its tokens, and the same arrivals give the same schedule; with prefix caching
/// too (prompts drawn from a few shared texts).
#[test]
fn random_workload_keeps_invariants_and_is_deterministic() {
    let trace = |seed: u64, caching: bool| {
        let mut c = cfg();
        c.enable_prefix_caching = caching;
        c.kv_blocks = 40;
        c.block_size = 8;
        c.max_num_seqs = 6;
        let mut e = Engine::new(c.clone());
        let mut rng = Rng::new(seed);
        let mut expected = HashMap::new();
        let mut out = Vec::new();
        let mut aborted = Vec::new();
        let mut now = 0;
        for _ in 0..400 {
            now += rng.below(6_000) as Micros;
            e.advance(now, &mut out);
            match rng.below(10) {
                0..=3 => {
                    let (p, m) = (1 + rng.below(120) as u32, 1 + rng.below(60) as u32);
                    let text = vec![b'a' + rng.below(3) as u8; p as usize * 4];
                    let blocks = prefix::block_hashes(&text, c.block_bytes());
                    if let Ok(id) = e.submit_prefixed(now, p, m, blocks) {
                        expected.insert(id, m);
                    }
                }
                4 => {
                    let (p, m) = (1 + rng.below(120) as u32, 1 + rng.below(60) as u32);
                    let landing = now + rng.below(20_000) as Micros;
                    if let Ok(id) = e.submit_remote(now, p, m, landing) {
                        expected.insert(id, m);
                    }
                }
                5 if !expected.is_empty() => {
                    let id = rng.below(expected.len() * 2) as SeqId;
                    if e.abort(id) {
                        aborted.push(id);
                    }
                }
                _ => {}
            }
            let load = e.load();
            assert!(load.used_blocks <= c.kv_blocks);
            assert!(load.running <= u64::from(c.max_num_seqs));
            let held: u64 = e.seqs.values().map(|s| s.blocks).sum();
            assert_eq!(held, load.used_blocks);
            for s in e.seqs.values().filter(|s| s.running) {
                assert!(s.blocks >= c.blocks_for(s.context()));
            }
        }
        out.extend(run(&mut e));
        assert_eq!(e.load().used_blocks, 0);
        for (id, m) in &expected {
            let n = out.iter().filter(|t| t.id == *id).count() as u32;
            if !aborted.contains(id) {
                assert_eq!(n, *m, "sequence {id}");
            }
        }
        (out, e.load())
    };
    let (a, load) = trace(7, false);
    assert!(
        load.preemptions_total > 0,
        "the workload should overflow the cache"
    );
    assert_eq!(trace(7, false), (a, load));
    let (b, load) = trace(7, true);
    assert!(load.prefix_cache_hits_total > 0);
    assert!(load.prefix_cache_hits_total < load.prefix_cache_queries_total);
    assert_eq!(trace(7, true), (b, load));
}

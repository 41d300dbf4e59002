//! A generated fleet shared by the benches (included with `#[path]`): one model, N workers of
//! `dp_size` ranks, every threshold set, and load batches whose busy set differs per variant.
#![allow(dead_code)]

pub const MODEL: &str = "Qwen/Qwen3-0.6B";
pub const KV_TOTAL_BLOCKS: u64 = 4096;
pub const MAX_BATCHED_TOKENS: u64 = 8192;
/// Decode busy above 0.85 × 4096 = 3481.6 blocks; prefill busy above 8192 tokens, or above
/// 1.5 × 8192 = 12288 (the absolute check is the tighter one here).
pub const THRESHOLDS: &str = "active_decode_blocks_threshold = 0.85\n\
                              active_prefill_tokens_threshold = 8192\n\
                              active_prefill_tokens_threshold_frac = 1.5\n";

/// Worker `i`'s name in the config and in load events.
pub fn worker_name(i: usize) -> String {
    format!("w{i:04}")
}

/// The `[[models]]` block of the fleet (no top-level keys, so callers can prepend theirs).
/// Worker `i` points at `127.0.0.1:{base_port + i}`.
pub fn model_toml(workers: usize, dp_size: u32, router_mode: &str, base_port: u16) -> String {
    let mut s =
        format!("[[models]]\nname = \"{MODEL}\"\nrouter_mode = \"{router_mode}\"\n{THRESHOLDS}");
    for i in 0..workers {
        s.push_str(&format!(
            "[[models.workers]]\nurl = \"http://127.0.0.1:{}\"\nname = \"{}\"\n\
             load_sources = [\"push\"]\nkv_total_blocks = {KV_TOTAL_BLOCKS}\n\
             max_num_batched_tokens = {MAX_BATCHED_TOKENS}\ndp_size = {dp_size}\n",
            usize::from(base_port) + i,
            worker_name(i)
        ));
    }
    s
}

/// splitmix64: a fixed, seedable stream of values.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One rank's pushed values in `variant`: about one worker in five has every rank over the
/// decode threshold (busy); the others stay below both thresholds with varied values, so
/// each variant has a different busy set and different loads.
pub fn rank_values(variant: u64, worker: usize, rank: u32) -> (u64, u64) {
    let w = mix((variant << 32) ^ worker as u64);
    let r = mix(w ^ u64::from(rank));
    if w.is_multiple_of(5) {
        (3500 + r % 500, r % 4096)
    } else {
        (r % 3400, r % 8000)
    }
}

/// The load batch of `variant` as Dynamo `ActiveLoad` JSON: every worker, every rank,
/// in `parts` arrays of about equal size.
pub fn load_batches(variant: u64, workers: usize, dp_size: u32, parts: usize) -> Vec<String> {
    let events: Vec<String> = (0..workers)
        .flat_map(|w| (0..dp_size).map(move |r| (w, r)))
        .map(|(w, r)| {
            let (decode, prefill) = rank_values(variant, w, r);
            format!(
                r#"{{"worker_id":"{}","dp_rank":{r},"active_decode_blocks":{decode},"active_prefill_tokens":{prefill}}}"#,
                worker_name(w)
            )
        })
        .collect();
    let per = events.len().div_ceil(parts.max(1));
    events
        .chunks(per.max(1))
        .map(|c| format!("[{}]", c.join(",")))
        .collect()
}

/// The monitor thread's id (its comm is cut to 15 bytes: `spillway-monito`).
pub fn monitor_tid() -> u32 {
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = entry.unwrap().path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if "spillway-monitor".starts_with(comm.trim()) && comm.trim().len() >= 15 {
            return path.file_name().unwrap().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("no spillway-monitor thread");
}

/// (utime + stime) in seconds, and schedstat run time in seconds, of one thread.
pub fn thread_cpu(tid: u32, ticks_per_sec: f64) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // Fields after the parenthesised comm start at field 3 (state).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f[11].parse().unwrap(), f[12].parse().unwrap());
    let sched = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    ((utime + stime) as f64 / ticks_per_sec, sched as f64 / 1e9)
}

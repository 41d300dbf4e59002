#!/usr/bin/env python3
"""The replica-sync bench's table (bench/fleet/replicas.sh): per load and setup, what the
clients saw (spillbench.analysis of spillbench.loadgen's records) and how deep the
engines' own queue got (the 100 ms samples of running + waiting over both engines, within
the measured window)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import results  # noqa: E402
from spillbench.analysis import analyse  # noqa: E402
from spillbench.markdown import ms  # noqa: E402
from spillbench.results import load_run  # noqa: E402
from spillbench.stats import pct  # noqa: E402

SETUP_NAMES = {
    "single": "one door",
    "nosync": "two doors, no sharing",
    "sync": "two doors, replica_sync",
}


def queue_stats(path, warmup, duration):
    """(p50, p99, max) of running + waiting, and p99 of waiting alone, in the window."""
    total, waiting = [], []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                continue
            t, r, w = float(parts[0]), int(parts[1]), int(parts[2])
            if warmup <= t < duration:
                total.append(r + w)
                waiting.append(w)
    if not total:
        return None
    return pct(total, 50), pct(total, 99), max(total), pct(waiting, 99)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--summary", required=True)
    p.add_argument("--header", required=True)
    p.add_argument("--warmup", type=float, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--clk-tck", type=int, default=100)
    p.add_argument("--out-md", required=True)
    a = p.parse_args()
    rows = results.read_jsonl(a.summary)
    out = results.header(a.header)
    out += [
        "| load | setup | offered req/s | completed req/s | refused | TTFT p50 ms | TTFT p99 ms "
        "| engines' queue p50 / p99 / max | waiting p99 | door CPU s | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        meta, recs = load_run(row["file"])
        r = analyse(meta, recs, a.warmup, a.duration, a.max_tokens)
        q = queue_stats(row["queue"], a.warmup, a.duration)
        queue = f"{q[0]} / {q[1]} / {q[2]}" if q else "–"
        wait = str(q[3]) if q else "–"
        cpu = row["door_ticks"] / a.clk_tck
        out.append(
            f"| {row['load']}×C | {SETUP_NAMES.get(row['setup'], row['setup'])} "
            f"| {r['offered_rps']:.1f} | {r['completed_rps']:.1f} "
            f"| {100 * r['rejected_share']:.1f} % | {ms(r['ttft_p50'])} "
            f"| {ms(r['ttft_p99'], r['ttft_bound'])} | {queue} | {wait} | {cpu:.1f} "
            f"| {r['errors']} |"
        )
    out += [
        "",
        "Engines' queue: requests running + waiting in both mock engines together (their "
        "`vllm:num_requests_running` and `_waiting`), sampled every 100 ms while arrivals "
        "last, after the warm-up. Refused: 529 answers (every worker busy). TTFT over "
        "admitted requests, from each request's scheduled arrival.",
    ]
    results.write_md(a.out_md, out)


if __name__ == "__main__":
    main()

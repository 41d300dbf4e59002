#!/usr/bin/env python3
"""Prefix-reuse benchmark: the reports (bench/prefix/run.sh, dynamo.sh).

  report.py report --summary S ...                writes prefix.md/.png/-summary.json (run.sh)
  report.py dynamo --summary S ...                writes prefix-dynamo.md/-summary.json (dynamo.sh)
  report.py tables --summary-json J [--dynamo]    prints the tables of prefix.md (or
                                                  prefix-dynamo.md) from its committed summary

Statistics per run come from spillbench.analysis (bench/lib: requests that arrived in
[warmup, duration), TTFT from the scheduled arrival); this file adds the engines' prefix-cache
hit rate, Spillway's CPU per request and the comparison with the perfect-affinity oracle.
The capacity without reuse is `python3 -m spillbench capacity --mean-prompt-tokens P`.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import metrics, plot as plots, results  # noqa: E402
from spillbench.analysis import analyse, capacity_measured, health_notes  # noqa: E402
from spillbench.markdown import fmt, ms, row  # noqa: E402
from spillbench.metrics import counter_sum  # noqa: E402
from spillbench.mockmodel import add_args as add_engine_args, model_capacity as engine_capacity  # noqa: E402
from spillbench.results import load_run  # noqa: E402
from spillbench.stats import pct  # noqa: E402

SETUP_NAMES = {
    "kv": "Spillway kv (prefix-aware)",
    "kv-default": "Spillway kv, Dynamo's default prefill load scale 1.0",
    "round-robin": "Spillway round-robin",
    "power-of-two": "Spillway power-of-two",
    "least-loaded": "Spillway least-loaded",
    "oracle": "oracle: direct, conversation mod engines",
}
ORDER = ["kv", "kv-default", "round-robin", "power-of-two", "least-loaded", "oracle"]
COLORS = {"kv": "tab:red", "kv-default": "tab:orange", "round-robin": "tab:blue", "power-of-two": "tab:green",
          "least-loaded": "tab:purple", "oracle": "black"}
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


# --- capacity without prefix reuse -------------------------------------------------------
def model_capacity(a):
    """bench/overload's time model (spillbench.mockmodel) with this workload's mean prompt:
    every request prefills its whole prompt (no reuse). Returns (C per engine, batch B,
    step seconds)."""
    ns = argparse.Namespace(**vars(a))
    ns.prompt_bytes = int(round(4 * a.mean_prompt_tokens))
    return engine_capacity(ns)


# --- per-run figures ----------------------------------------------------------------------
def hit_rate(meta, names=(HITS, QUERIES)):
    """(hits, queries) in prefix-cache tokens over the window: the counters at the window's
    end minus at its start, summed over the scraped endpoints; None when not exported."""
    scrapes = meta.get("scrapes") or []
    if len(scrapes) < 2:
        return None
    first, last = scrapes[0]["lines"], scrapes[-1]["lines"]
    hits = queries = 0.0
    for e0, e1 in zip(first, last):
        h0, h1 = counter_sum(e0, names[0]), counter_sum(e1, names[0])
        q0, q1 = counter_sum(e0, names[1]), counter_sum(e1, names[1])
        if None in (h0, h1, q0, q1):
            return None
        hits += h1 - h0
        queries += q1 - q0
    return hits, queries


def engine_imbalance(meta):
    """Generated tokens per engine over the window: the busiest engine's ÷ the mean (1.0 =
    even); None when not scraped."""
    scrapes = meta.get("scrapes") or []
    if len(scrapes) < 2:
        return None
    name = "vllm:generation_tokens_total"
    per = []
    for e0, e1 in zip(scrapes[0]["lines"], scrapes[-1]["lines"]):
        g0, g1 = counter_sum(e0, name), counter_sum(e1, name)
        if g0 is None or g1 is None:
            return None
        per.append(g1 - g0)
    mean = sum(per) / len(per) if per else 0
    return max(per) / mean if mean > 0 else None


def run_stats(a, run, hit_names=(HITS, QUERIES)):
    meta, recs = load_run(run["file"])
    s = analyse(meta, recs, a.warmup, a.duration, a.max_tokens)
    s.update(setup=run["setup"], load=run["load"], rate=run["rate"])
    started = [r for r in recs if "lag" in r]
    s["started"] = len(started)
    ticks = run.get("proxy_ticks")
    s["proxy_cpu_s"] = ticks / a.clk_tck if ticks is not None else None
    s["proxy_us_per_req"] = (1e6 * s["proxy_cpu_s"] / len(started)
                             if started and s["proxy_cpu_s"] is not None else None)
    win = [r for r in recs if a.warmup <= r["sched"] < a.duration]
    waits = [r.get("ready_wait", 0.0) for r in win if "ready_wait" in r]
    s["ready_wait_p99"] = pct(waits, 99)
    s["ready_waited_share"] = (sum(1 for r in win if r.get("queued")) / len(win)) if win else 0.0
    s["never_started"] = sum(1 for r in win if "lag" not in r)
    s["cold_in_window"] = sum(1 for r in win if r.get("cold"))
    hq = hit_rate(meta, hit_names)
    s["hits"], s["queries"] = (hq if hq else (None, None))
    s["hit_rate"] = (hq[0] / hq[1]) if hq and hq[1] > 0 else None
    s["engine_imbalance"] = engine_imbalance(meta)
    s["prompt_tokens_mean"] = (sum(r["ptok"] for r in win if "ptok" in r) / max(1, len(win)))
    s["conversations"] = (meta.get("workload") or {}).get("conversations")
    s["proxy_alive"] = run.get("proxy_alive", "yes")
    s["spillway_statuses"] = metrics.requests_by_outcome(run.get("metrics"))
    s["log_problems"] = metrics.log_problems(run.get("log", ""))[:5]
    return s


def wait_cell(r):
    return f"{ms(r['ready_wait_p99'])} ({100 * r['ready_waited_share']:.0f} %)"


def rows_by(rows):
    by = {(r["setup"], r["load"]): r for r in rows}
    loads = sorted({r["load"] for r in rows})
    return by, loads


def acceptance(by, ratio_setups, one=1.0):
    """kv ÷ round-robin TTFT p50 and kv ÷ oracle hit rate at 1×C."""
    kv, rr, orc = (by.get((s, one)) for s in ratio_setups)
    out = {"load": one, "ttft_p50_ratio": None, "hit_ratio": None,
           "ttft_target": 0.5, "hit_target": 0.8}
    if kv and rr and kv["ttft_p50"] and rr["ttft_p50"]:
        out["ttft_p50_ratio"] = kv["ttft_p50"] / rr["ttft_p50"]
        out["ttft_holds"] = out["ttft_p50_ratio"] <= 0.5
    if kv and orc and kv["hit_rate"] is not None and orc["hit_rate"]:
        out["hit_ratio"] = kv["hit_rate"] / orc["hit_rate"]
        out["hit_holds"] = out["hit_ratio"] >= 0.8
    if orc and rr and orc["ttft_p50"] and rr["ttft_p50"]:
        out["oracle_ttft_p50_ratio"] = orc["ttft_p50"] / rr["ttft_p50"]
    return out


# --- the Spillway report ------------------------------------------------------------------
def capacity_section(a, c1, b, step_s, c_model, cap):
    """How C was found: measured through round-robin (the default) or the no-reuse model."""
    model = (f"the time model (spillbench.mockmodel's `model_capacity` with this workload's mean prompt "
             f"of {a.mean_prompt_tokens:.0f} tokens, every prompt prefilled in full: batch B = {b}, "
             f"step ≈ {step_s * 1000:.1f} ms) gives **{c1:.2f} req/s per engine, {c_model:.1f} req/s "
             f"for {a.engines}** without any prefix reuse")
    if a.capacity_basis == "round-robin" and cap:
        return [
            "## Capacity C (round-robin, measured)", "",
            f"- C is the fleet's capacity as a cache-blind router finds it: a closed loop of "
            f"{cap[2]['closed']} conversations back to back through Spillway in round-robin mode, "
            f"engines with their prefix cache, completions in [{a.capacity_warmup:.0f} s, "
            f"{cap[2]['duration']:.0f} s): **C = {cap[0]:.1f} req/s**. That is what an operator "
            "measures before turning `kv` on; the offered loads are multiples of it, so at 1×C "
            "round-robin is at its limit, and a router that keeps more of the prefix reuse has "
            "headroom there.",
            f"- For reference, {model} ({100 * cap[0] / c_model:.0f} % of which round-robin reaches "
            "with the reuse it finds by chance).", "",
        ]
    out = ["## Capacity C (no prefix reuse)", "",
           f"- C: {model}. The offered loads are multiples of this C."]
    if cap:
        out.append(
            f"- Measured (closed loop, {cap[2]['closed']} streams of these conversations straight "
            f"to the engines, prefix caching off, completions in [{a.capacity_warmup:.0f} s, "
            f"{cap[2]['duration']:.0f} s)): **{cap[0]:.1f} req/s**, {100 * cap[0] / c_model:.0f} % "
            "of the model's figure.")
    out += ["- With prefix reuse the engines' real capacity is higher (a cached prefix skips "
            "prefill), so 1.5×C is an overload only for a router that loses the reuse.", ""]
    return out


def results_table(by, setups, loads, dynamo=False):
    """The results table of prefix.md, or (dynamo) of prefix-dynamo.md."""
    head = ("| setup | load | offered req/s | completed req/s | TTFT p50 ms | TTFT p99 ms | refused | "
            + ("errors | prefix hit rate | frontend CPU µs/req | " if dynamo else
               "errors | engines' prefix hit rate | % of oracle | busiest engine ÷ mean | "
               "Spillway CPU µs/req | ")
            + "ready wait p99 ms (share waited) | loadgen CPU |")
    md = [head, "|" + "---|" * (head.count("|") - 1)]
    names = DYN_NAMES if dynamo else SETUP_NAMES
    for s in setups:
        for k in loads:
            r = by.get((s, k))
            if not r:
                continue
            cells = [names[s], f"{k:g}×C", f"{r['offered_rps']:.1f}", f"{r['completed_rps']:.1f}",
                     ms(r["ttft_p50"], r["ttft_bound"]), ms(r["ttft_p99"], r["ttft_bound"]),
                     f"{100 * r['rejected_share']:.1f} %", r["errors"],
                     fmt(None if r["hit_rate"] is None else 100 * r["hit_rate"], ".1f", " %")]
            if dynamo:
                cells.append(fmt(r["frontend_us_per_req"], ".0f"))
            else:
                cells += [fmt(None if r["hit_of_oracle"] is None else 100 * r["hit_of_oracle"],
                              ".0f", " %"),
                          fmt(r["engine_imbalance"], ".2f"), fmt(r["proxy_us_per_req"], ".0f")]
            md.append(row(cells + [wait_cell(r), f"{100 * r['loadgen_cpu']:.0f} %"]))
    return md


def report(a):
    c1, b, step_s = model_capacity(a)
    c_model = a.engines * c1
    cap = None
    if a.capacity:
        cap = capacity_measured(a.capacity, a.capacity_warmup)
    rows = [run_stats(a, run) for run in results.read_jsonl(a.summary)]
    by, loads = rows_by(rows)
    setups = [s for s in ORDER if any(r["setup"] == s for r in rows)]
    for r in rows:
        o = by.get(("oracle", r["load"]))
        r["hit_of_oracle"] = (r["hit_rate"] / o["hit_rate"]
                              if o and r["hit_rate"] is not None and o["hit_rate"] else None)
    d = json.loads(a.describe)

    md = results.header(a.header)
    md += [
        "## Workload", "",
        f"- {d['turns']}-turn conversations, a pool of {rows[0]['conversations'] if rows else '?'} "
        "(a finished one is replaced by a new one); turn t resends a "
        f"{d['system_tokens']}-token system prompt shared by all conversations, the "
        f"conversation's earlier turns ({d['user_tokens']}-token user message + "
        f"{d['assistant_tokens']}-token assistant reply each) and a new {d['user_tokens']}-token "
        f"user message; streaming chat completions with max_tokens {a.max_tokens}. Prompt "
        "tokens by turn (bytes of `messages` / 4, the mock's count): "
        + ", ".join(str(x) for x in d["prompt_tokens_by_turn"])
        + f"; mean {d['mean_prompt_tokens']:.0f}.",
        "- Contents are seeded words, distinct per conversation, turn and role: conversations share "
        "only the system prompt. The assistant text resent in the history comes from the seed, not "
        "from the engine's reply, so every setup sends byte-identical requests.",
        "- Arrivals: Poisson at the offered rate (open loop, seeded). An arrival goes to the "
        "conversation that has been ready (previous turn completed) longest; a conversation never "
        "has two turns in flight; with none ready the arrival waits, and its latencies still count "
        "from its scheduled time (the `ready wait` column). The first conversations start at "
        "staggered turns (conversation k at turn k mod turns) so the turn mix is uniform from the "
        "start; their first requests carry history never sent before (a miss everywhere) and fall "
        "in the warm-up. A finished conversation is replaced by a new one at turn 0.",
        "",
    ] + capacity_section(a, c1, b, step_s, c_model, cap) + [
        "## Results", "",
        f"Window: requests that arrived in [{a.warmup:.0f} s, {a.duration:.0f} s) (completions: "
        f"those that ended in it); TTFT from the scheduled arrival, over admitted requests (`≥`: "
        f"some had no first token by the run's end, {a.duration:.0f} s + {a.drain:.0f} s). Hit rate: "
        f"the engines' `{HITS}` ÷ `{QUERIES}` (tokens), summed over the {a.engines} engines, "
        "read by the load generator at the window's start and end. Busiest engine ÷ mean: tokens "
        "generated in the window by the busiest engine ÷ the engines' mean (1.00 = even load). "
        "Spillway CPU: its utime + stime over the run ÷ requests sent. Ready wait: how long an "
        "arrival waited for a conversation whose previous turn had completed (inside its TTFT; the "
        "share of arrivals that waited at all in brackets): a router that makes turns slower "
        "leaves fewer conversations ready.", "",
    ]
    md += results_table(by, setups, loads)
    md.append("")

    acc = acceptance(by, ("kv", "round-robin", "oracle"))
    md += acceptance_md(acc, by, skipped=a.skipped_setups())
    md += configs_md(a, setups)
    md += health_md(rows)
    md += [
        "## Caveats", "",
        "- Shared machine: 2 vCPUs that other engineers' builds also used (load average in the "
        "header); processes at nice −10. The engines' schedule follows a virtual clock, so CPU "
        "contention delays delivery but not what the engines do.",
        "- The engines are `spillway mock-engine`'s time model; its prefix cache is an LRU of "
        "hashed 64-byte blocks of the prompt text (block_size × 4 bytes), whose capacity is the "
        "KV block count. Spillway's kv mode predicts that cache from its own routing decisions; "
        "neither sees the other's hashes.",
        "- One TCP connection per request (loopback connect ≈ 0.1 ms, inside every latency).",
        "- The oracle pins by conversation id, which Spillway's kv mode cannot see; it is the "
        "hit-rate ceiling for this workload, not a router to deploy (it ignores load).", "",
    ]
    results.write_md(a.out_md, md)
    results.write_json(a.out_json, {"c_model": c_model, "c_model_per_engine": c1,
                                    "c_measured": cap[0] if cap else None,
                                    "mean_prompt_tokens": a.mean_prompt_tokens, "engines": a.engines,
                                    "acceptance": acc, "skipped": a.skipped_setups(), "rows": rows})
    plot(a, rows, setups, loads)
    print("\n".join(md))
    return 0


def acceptance_md(acc, by, skipped=(), names=("kv", "round-robin", "oracle"), who="Spillway"):
    md = [f"## Acceptance at {acc['load']:g}×C", ""]
    kv, rr, orc = (by.get((s, acc["load"])) for s in names)
    if acc["ttft_p50_ratio"] is not None:
        md.append(
            f"- TTFT p50, {who} kv ÷ round-robin: {ms(kv['ttft_p50'])} ÷ {ms(rr['ttft_p50'])} ms = "
            f"**{acc['ttft_p50_ratio']:.2f}** (target ≤ {acc['ttft_target']}) → "
            f"**{'holds' if acc['ttft_holds'] else 'does NOT hold'}**.")
    else:
        md.append(f"- TTFT p50 kv ÷ round-robin: not measured ({'kv' if not kv else 'round-robin'} "
                  f"not run at {acc['load']:g}×C" + ("; " + "; ".join(skipped) if skipped else "") + ").")
    if acc["hit_ratio"] is not None:
        md.append(
            f"- Engines' prefix hit rate, kv ÷ oracle: {100 * kv['hit_rate']:.1f} % ÷ "
            f"{100 * orc['hit_rate']:.1f} % = **{acc['hit_ratio']:.2f}** (target ≥ "
            f"{acc['hit_target']}) → **{'holds' if acc['hit_holds'] else 'does NOT hold'}**.")
    elif orc is not None or kv is not None:
        md.append("- Hit rate kv ÷ oracle: not measured (" + (
            "kv or oracle not run" if not (kv and orc) else
            "the engines export no prefix-cache counters") + ").")
    if acc.get("oracle_ttft_p50_ratio") is not None:
        md.append(
            f"- For reference, what perfect affinity gives on this workload: oracle TTFT p50 ÷ "
            f"round-robin's = {ms(orc['ttft_p50'])} ÷ {ms(rr['ttft_p50'])} ms = "
            f"**{acc['oracle_ttft_p50_ratio']:.2f}** (round-robin already finds the shared system "
            "prompt cached on every engine; only the conversations' own history is at stake).")
    md.append("")
    return md


def configs_md(a, setups):
    md = ["## Configurations", ""]
    for s in setups:
        path = os.path.join(a.config_dir, f"spillway-{s}.toml")
        if s in ("kv", "oracle") and os.path.exists(path):
            md += [f"{SETUP_NAMES[s]} (`spillway-{s}.toml`, ports as run):", "", "```toml",
                   open(path).read().rstrip(), "```", ""]
    others = [s for s in setups if s not in ("kv", "oracle")]
    if others:
        md += ["The other setups: the same file with `router_mode` = " + ", ".join(
            f"`\"{s}\"`" for s in others) + " and no kv keys. No busy thresholds, no admission "
               "limits: this benchmark is about where requests go, not about refusing them.", ""]
    return md


def health_md(rows, names=SETUP_NAMES, proxy="Spillway"):
    md = [f"## {proxy} health during the runs", ""]
    problems = False
    for r in rows:
        notes = health_notes(r)
        if r.get("cold_in_window"):
            notes.append(f"{r['cold_in_window']} cold requests (a staggered conversation's first "
                         "turn, history never sent) fell in the window: WARMUP < conversations / rate")
        if r.get("never_started"):
            notes.append(f"{r['never_started']} arrivals in the window found no ready "
                         "conversation before the end")
        if notes:
            problems = True
            md.append(f"- {names[r['setup']]} at {r['load']:g}×C: " + "; ".join(notes))
    if not problems:
        md.append("- No errors, no unexpected statuses, no warnings in the logs, no crashes.")
    md.append("")
    return md


def plot(a, rows, setups, loads):
    plt = plots.pyplot()
    by, _ = rows_by(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for s in setups:
        pts = [(k, by[(s, k)]) for k in loads if (s, k) in by]
        tp = [(k, r) for k, r in pts if r["ttft_p50"]]
        style = "--" if s == "oracle" else "-"
        ax1.plot([k for k, _ in tp], [1000 * r["ttft_p50"] for _, r in tp], style, marker="o",
                 color=COLORS.get(s), label=SETUP_NAMES[s])
        hp = [(k, r) for k, r in pts if r["hit_rate"] is not None]
        if hp:
            ax2.plot([k for k, _ in hp], [100 * r["hit_rate"] for _, r in hp], style, marker="o",
                     color=COLORS.get(s), label=SETUP_NAMES[s])
    ax1.set_yscale("log")
    ax1.set_xlabel("offered load (× C, round-robin's measured capacity)"
                   if a.capacity_basis == "round-robin"
                   else "offered load (× C, capacity without prefix reuse)")
    ax1.set_ylabel("TTFT p50 (ms, log)")
    ax1.set_title("TTFT p50 vs offered load")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("offered load (× C)")
    ax2.set_ylabel("engines' prefix-cache hit rate (% of prompt tokens)")
    ax2.set_title("Prefix hit rate vs offered load")
    ax2.set_ylim(0, 100)
    ax2.grid(True, alpha=0.3)
    if ax2.lines:
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "engines export no prefix-cache counters", ha="center",
                 transform=ax2.transAxes)
    plots.save(fig, a.out_png)


# --- the Dynamo report --------------------------------------------------------------------
# Dynamo's frontend: prompt tokens the engines reported cached (usage.prompt_tokens_details,
# a histogram's sum) ÷ prompt tokens it tokenized.
DYN_HITS = ("dynamo_frontend_cached_tokens_sum", "dynamo_frontend_input_sequence_tokens_sum")
# Startup lines of every frontend run, not problems: its multimodal probe of the model folder
# and the KV router registering workers.
DYN_BENIGN = ("image-placeholder", "Adding worker", "self_host_metadata")
DYN_NAMES = {"kv": "Dynamo kv (KV events)", "kv-approx": "Dynamo kv, no KV events (predicted)",
             "round-robin": "Dynamo round-robin"}


def dynamo_report(a):
    cap_rps, _, cap_meta = capacity_measured(a.capacity, a.capacity_warmup)
    rows = []
    for run in results.read_jsonl(a.summary):
        s = run_stats(a, run, DYN_HITS)
        s["log_problems"] = [l for l in s["log_problems"] if not any(b in l for b in DYN_BENIGN)]
        s["frontend_us_per_req"] = s.pop("proxy_us_per_req")
        s["mocker_cpu_s"] = run.get("mocker_ticks", 0) / a.clk_tck
        rows.append(s)
    by, loads = rows_by(rows)
    setups = [s for s in DYN_NAMES if any(r["setup"] == s for r in rows)]
    d = json.loads(a.describe)
    md = results.header(a.header)
    md += [
        "## Workload and capacity", "",
        f"- The workload of `run.sh` in tokens of the word-level tokenizer "
        f"(`--unit word`): a pool of {rows[0]['conversations'] if rows else '?'} "
        f"{d['turns']}-turn conversations (pool ÷ C as in `run.sh`), a {d['system_tokens']}-token shared "
        f"system prompt, {d['user_tokens']}-token user messages, {d['assistant_tokens']}-token "
        f"assistant replies, max_tokens {a.max_tokens}; prompt tokens by turn as Dynamo counts "
        "them (chat template included): " + ", ".join(str(x) for x in d["prompt_tokens_by_turn"])
        + (f" (checked: turn 0 of conversation 0 = {a.probe_tokens} tokens in Dynamo's usage)"
           if a.probe_tokens else "") + ".",
        f"- C is measured (Dynamo's mocker has its own time model): closed loop, "
        f"{cap_meta['closed']} streams of these conversations through a round-robin frontend, "
        f"mocker prefix caching on (as `run.sh` measures it), completions in [{a.capacity_warmup:.0f} s, "
        f"{cap_meta['duration']:.0f} s): **C = {cap_rps:.1f} req/s** (frontend CPU "
        f"{fmt(a.capacity_ticks / a.clk_tck / max(1, cap_meta['requests']) * 1e6 if a.capacity_ticks else None, '.0f')} µs "
        "per request). Loads are multiples of it.", "",
        "## Results", "",
        "Same window and definitions as `prefix.md`. Hit rate: the frontend's "
        f"`{DYN_HITS[0]}` (prompt tokens the mocker reported cached, per response) ÷ "
        f"`{DYN_HITS[1]}`, deltas over the window. Frontend CPU: utime + stime of the frontend "
        "process over the run ÷ requests sent.", "",
    ]
    md += results_table(by, setups, loads, dynamo=True)
    md.append("")
    md += ["## kv ÷ round-robin", ""]
    ratios = {}
    for k in loads:
        kv, rr = by.get(("kv", k)), by.get(("round-robin", k))
        if kv and rr and kv["ttft_p50"] and rr["ttft_p50"]:
            ratios[k] = kv["ttft_p50"] / rr["ttft_p50"]
            md.append(f"- {k:g}×C: TTFT p50 {ms(kv['ttft_p50'])} ÷ {ms(rr['ttft_p50'])} ms = "
                      f"**{ratios[k]:.2f}**; frontend CPU {fmt(kv['frontend_us_per_req'], '.0f')} "
                      f"(kv) and {fmt(rr['frontend_us_per_req'], '.0f')} (round-robin) µs per request.")
    if not ratios:
        md.append("- Not measured (kv and round-robin were not both run at one load).")
    spill = None
    if a.spillway_summary and os.path.exists(a.spillway_summary):
        spill = results.read_json(a.spillway_summary)
        acc = spill.get("acceptance") or {}
        if acc.get("ttft_p50_ratio") is not None:
            md.append(f"- Spillway (`prefix.md`, its own mock and C) at {acc['load']:g}×C: kv ÷ "
                      f"round-robin TTFT p50 = {acc['ttft_p50_ratio']:.2f}.")
        cpu = {r["setup"]: r.get("proxy_us_per_req") for r in spill.get("rows", [])
               if r.get("load") == 1.0}
        if cpu.get("kv") is not None:
            md.append(f"- Spillway's CPU per request at 1×C: {cpu['kv']:.0f} µs (kv), "
                      f"{fmt(cpu.get('round-robin'), '.0f')} µs (round-robin).")
    md += ["", "## Caveats", "",
           "- Dynamo's frontend tokenizes every prompt and detokenizes every output token (it is "
           "an OpenAI front end, not a byte proxy); its kv router hashes token blocks and, in "
           "`kv`, learns the workers' caches from their KV events. Spillway forwards bytes and "
           "predicts the cache from its own decisions (as Dynamo's `kv-approx` setup does). "
           "Compare its ratio, not its CPU, with a byte proxy's.",
           "- Different engines: Dynamo's mocker and `spillway mock-engine` share the engine "
           "parameters but not their time models; each system's loads are multiples of its "
           "own measured C.",
           "- Shared machine: 2 vCPUs used by other engineers' builds too; processes at nice −10.",
           ""]
    md += health_md(rows, DYN_NAMES, "Frontend")
    results.write_md(a.out_md, md)
    results.write_json(a.out_json, {"c_measured": cap_rps, "ttft_p50_ratio_kv_rr": ratios,
                                    "rows": rows})
    print("\n".join(md))
    return 0


def tables(a):
    """The tables report() (or, with --dynamo, dynamo_report()) writes, from a summary it
    wrote (results/prefix-summary.json, prefix-dynamo-summary.json)."""
    rows = results.read_json(a.summary_json)["rows"]
    by, loads = rows_by(rows)
    order = DYN_NAMES if a.dynamo else ORDER
    md = results_table(by, [s for s in order if any(r["setup"] == s for r in rows)], loads,
                       a.dynamo)
    print("\n".join(md))
    return 0


def main():
    p = argparse.ArgumentParser(prog="report.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("report", "dynamo"):
        q = sub.add_parser(name)
        q.add_argument("--summary", required=True)
        q.add_argument("--capacity", default="")
        q.add_argument("--capacity-warmup", type=float, default=10)
        q.add_argument("--header", required=True)
        q.add_argument("--describe", required=True, help="loadgen.py --describe output")
        q.add_argument("--warmup", type=float, required=True)
        q.add_argument("--duration", type=float, required=True)
        q.add_argument("--drain", type=float, required=True)
        q.add_argument("--clk-tck", type=float, default=100)
        q.add_argument("--out-md", required=True)
        q.add_argument("--out-json", required=True)
    r = sub.choices["report"]
    r.add_argument("--mean-prompt-tokens", type=float, required=True)
    add_engine_args(r, kv_blocks=8192)
    r.add_argument("--c-model-per-engine", type=float, default=0)
    r.add_argument("--capacity-basis", choices=["round-robin", "model"], default="model")
    r.add_argument("--c-total", type=float, default=0)
    r.add_argument("--engines", type=int, default=4)
    r.add_argument("--config-dir", required=True)
    r.add_argument("--out-png", required=True)
    y = sub.choices["dynamo"]
    y.add_argument("--max-tokens", type=int, default=64)
    y.add_argument("--capacity-ticks", type=float, default=0)
    y.add_argument("--probe-tokens", default="")
    y.add_argument("--spillway-summary", default="")
    t = sub.add_parser("tables")
    t.add_argument("--summary-json", required=True)
    t.add_argument("--dynamo", action="store_true", help="the summary is prefix-dynamo's")
    a = p.parse_args()
    if a.cmd == "tables":
        return tables(a)

    def skipped_setups():
        try:
            return [l.split("**Skipped** setup ", 1)[1].strip()
                    for l in open(a.header) if "**Skipped** setup " in l]
        except OSError:
            return []

    a.skipped_setups = skipped_setups
    if a.cmd == "dynamo":
        return dynamo_report(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())

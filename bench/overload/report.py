#!/usr/bin/env python3
"""Overload benchmark: the report (bench/overload/run.sh, dynamo.sh, classes.sh).

  report.py report --summary S --capacity F ...     writes overload.md/.png/-summary.json
  report.py dynamo --summary S --capacity F ...     writes overload-dynamo.md/-summary.json
  report.py isolation --mix M --alone A --out-md F  appends the class-isolation section
  report.py tables --summary-json J                 prints the tables of overload.md (or a
                                                    variant) from its committed summary
  report.py dynamo-tables --summary-json J --spillway-summary S
                                                    the same for overload-dynamo.md

The statistics per run are spillbench.analysis's (bench/lib); C from the mock's time model
is spillbench.mockmodel's (`python3 -m spillbench capacity`).
"""

import argparse
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import metrics, plot as plots, results  # noqa: E402
from spillbench.analysis import analyse, capacity_measured, class_stats, health_notes  # noqa: E402
from spillbench.markdown import ms  # noqa: E402
from spillbench.mockmodel import add_args as add_engine_args, model_capacity  # noqa: E402
from spillbench.results import load_run  # noqa: E402


def result_head(goodput=True):
    """The columns every results table starts with, up to and including `errors`
    (summaries written before goodput existed have no goodput column)."""
    return ("| setup | load | offered req/s | " + ("goodput req/s | " if goodput else "")
            + "completed req/s | completed tok/s | TTFT ≤ 1 s req/s | "
            "TTFT p50 ms | TTFT p99 ms | rejected | reject p99 ms | errors |")


def result_cells(name, load, r):
    """The cells every results table starts with, up to and including `errors`."""
    rej = f"{100 * r['rejected_share']:.1f} %"
    if r["reject_statuses"]:
        rej += " (" + ", ".join(f"{v}×{c}" for c, v in sorted(r["reject_statuses"].items())) + ")"
    if r["pending_no_status"]:
        rej += f"; {r['pending_no_status']} still queued at end"
    goodput = f"{r['goodput_rps']:.1f} | " if "goodput_rps" in r else ""
    return (
        f"| {name} | {load:g}×C | {r['offered_rps']:.1f} | {goodput}"
        f"{r['completed_rps']:.1f} | "
        f"{r['completed_tps']:.0f} | {r['slo_rps']:.1f} | "
        f"{ms(r['ttft_p50'], r['ttft_bound'])} | {ms(r['ttft_p99'], r['ttft_bound'])} | "
        f"{rej} | {ms(r['reject_p99'])} | {r['errors']} |"
    )

SETUP_NAMES = {
    "shed": "Spillway, shedding on",
    "adaptive": "Spillway, adaptive mode",
    "room": "Spillway, adaptive + waiting room",
    "noshed": "Spillway, shedding off",
    "haproxy": "HAProxy maxconn + queue",
}


def room_section(by, loads, setups):
    """Issue 31's targets for the waiting-room setup against HAProxy in the same run: goodput
    at least HAProxy's at every load, TTFT p99 at 1×C at most HAProxy's, TTFT p99 at the
    highest load at most 1.2× its lowest-load value."""
    if "room" not in setups or "haproxy" not in setups:
        return []
    md = ["## Waiting room against HAProxy (issue 31)", "",
          "| load | goodput room | goodput HAProxy | goodput holds | TTFT p99 room ms | TTFT p99 HAProxy ms |",
          "|---|---|---|---|---|---|"]
    held = []
    for k in loads:
        r, h = by.get(("room", k)), by.get(("haproxy", k))
        if not (r and h):
            continue
        ok = r["goodput_rps"] >= h["goodput_rps"]
        held.append(ok)
        md.append(f"| {k:g}×C | {r['goodput_rps']:.1f} | {h['goodput_rps']:.1f} | "
                  f"{'yes' if ok else 'no'} | {ms(r['ttft_p99'], r['ttft_bound'])} | "
                  f"{ms(h['ttft_p99'], h['ttft_bound'])} |")
    md.append("")
    lo, hi = min(loads), max(loads)
    r1, h1 = by.get(("room", 1.0)) or by.get(("room", 1)), by.get(("haproxy", 1.0)) or by.get(("haproxy", 1))
    rlo, rhi = by.get(("room", lo)), by.get(("room", hi))
    if held:
        md.append(f"- Goodput at least HAProxy's at every load: **{'holds' if all(held) else 'does not hold'}** "
                  f"({sum(held)} of {len(held)} loads).")
    if r1 and h1 and r1["ttft_p99"] and h1["ttft_p99"]:
        ok = r1["ttft_p99"] <= h1["ttft_p99"]
        md.append(f"- TTFT p99 at 1×C: {ms(r1['ttft_p99'])} ms against HAProxy's {ms(h1['ttft_p99'])} ms: "
                  f"**{'holds' if ok else 'does not hold'}**.")
    if rlo and rhi and rlo["ttft_p99"] and rhi["ttft_p99"]:
        ratio = rhi["ttft_p99"] / rlo["ttft_p99"]
        md.append(f"- TTFT p99 at {hi:g}×C ÷ {lo:g}×C: **{ratio:.2f}×** (target ≤ 1.2×): "
                  f"**{'holds' if ratio <= 1.2 and not rhi['ttft_bound'] else 'does not hold'}**.")
    md.append("")
    return md


def near_capacity_section(by, loads, setups):
    """Issue 10's near-capacity target: goodput at 1×C at least HAProxy's, with the admitted
    TTFT p99 at the top load at most 1.5× its value at the lowest load."""
    hp = by.get(("haproxy", 1.0))
    if not hp or "goodput_rps" not in hp:  # summaries from before goodput: no such section
        return []
    lo, hi = min(loads), max(loads)
    md = ["## Near capacity (issue 10)", "",
          f"Target: goodput at 1×C at least HAProxy's ({hp['goodput_rps']:.1f} req/s), with "
          f"admitted TTFT p99 at {hi:g}×C at most 1.5× its {lo:g}×C value. Goodput counts the "
          "window's arrivals that completed. Completions that ended in the window also count "
          "requests that arrived before it, so that figure moves by about one request per "
          "second for every 15 requests more or fewer in flight when the window opened "
          "(the warm-up's transient, not the steady state); both are shown.", "",
          "| setup | goodput req/s at 1×C | completed req/s at 1×C | in flight when the window "
          f"opened | refused at 1×C | TTFT p99 1×C ms | TTFT p99 {hi:g}×C ÷ {lo:g}×C | target |",
          "|---|---|---|---|---|---|---|---|"]
    for s in setups:
        one, base, top = by.get((s, 1.0)), by.get((s, lo)), by.get((s, hi))
        if not (one and base and top and base["ttft_p99"] and top["ttft_p99"]):
            continue
        ratio = top["ttft_p99"] / base["ttft_p99"]
        held = (one["goodput_rps"] >= hp["goodput_rps"] and ratio <= 1.5
                and not top["ttft_bound"])
        md.append(
            f"| {SETUP_NAMES[s]} | {one['goodput_rps']:.1f} | {one['completed_rps']:.1f} | "
            f"{one['inflight_at_warmup']} | {100 * one['rejected_share']:.1f} % | "
            f"{ms(one['ttft_p99'], one['ttft_bound'])} | {ratio:.2f}× | "
            f"{'holds' if held else 'not met'} |")
    md.append("")
    return md


def spillway_rows(a):
    """The figures of every run in the summary (run.sh's summary.jsonl: one line per run)."""
    rows = []
    for run in results.read_jsonl(a.summary):
        meta, recs = load_run(run["file"])
        s = analyse(meta, recs, a.warmup, a.duration, a.max_tokens)
        s.update(setup=run["setup"], load=run["load"], rate=run["rate"])
        s["proxy_cpu"] = run["proxy_ticks"] / a.clk_tck / max(meta["wall_s"], 1e-9)
        s["proxy_alive"] = run["proxy_alive"]
        s["spillway_statuses"] = metrics.requests_by_outcome(run.get("metrics"))
        s["log_problems"] = metrics.log_problems(run.get("log", ""))[:5]
        s["backlog"] = metrics.engine_backlog(run.get("engine_metrics"))
        classes = class_stats(meta, recs, a.warmup, a.duration, a.max_tokens)
        if classes:
            s["classes"] = classes
            s["class_mix"] = meta.get("class_mix")
        rows.append(s)
    return rows


def layout(rows, order):
    """Rows by (setup, load), the loads in order, the setups of `order` that ran."""
    by = {(r["setup"], r["load"]): r for r in rows}
    loads = sorted({r["load"] for r in rows})
    setups = [s for s in order if any(r["setup"] == s for r in rows)]
    return by, loads, setups


def results_table(by, setups, loads, names, more_head, more_cells):
    """A results table: every setup at every load (rows of analyse() and the run's own), the
    common columns, then `more_head` (" name | ... |") and `more_cells(row)` (" x | ... |")."""
    goodput = all("goodput_rps" in r for r in by.values())
    md = [result_head(goodput) + more_head, "|" + "---|" * (11 + goodput + more_head.count("|"))]
    for s in setups:
        for k in loads:
            r = by.get((s, k))
            if r:
                md.append(result_cells(names[s], k, r) + more_cells(r))
    return md


def spillway_table(by, setups, loads):
    return results_table(
        by, setups, loads, SETUP_NAMES,
        " engines running + waiting at end of arrivals | proxy CPU | loadgen CPU |",
        lambda r: f" {'%d + %d' % tuple(r['backlog']) if r['backlog'] else '–'} | "
                  f"{100 * r['proxy_cpu']:.0f} % | {100 * r['loadgen_cpu']:.0f} % |")


def report(a):
    c_per_engine = a.c_model_per_engine
    c_model = 2 * c_per_engine
    cap_rps, cap_tps, cap_meta = capacity_measured(a.capacity, a.capacity_warmup)
    rows = spillway_rows(a)
    by, loads, setups = layout(rows, SETUP_NAMES)

    md = results.header(a.header)
    md += [
        "## Capacity C",
        "",
        f"- Time model (see `bench/lib/spillbench/mockmodel.py`): batch B = {a.b} sequences, step ≈ "
        f"{a.step_s * 1000:.1f} ms (base + per-sequence cost + the prefill of the B/M requests that "
        f"start each step), so C = (B/M)/step = **{c_per_engine:.1f} req/s per engine, "
        f"{c_model:.1f} req/s for two** ({c_model * a.max_tokens:.0f} tokens/s).",
        f"- Measured (closed loop, {cap_meta['closed']} concurrent streams straight to the two "
        f"engines, completions in [{a.capacity_warmup:.0f} s, {cap_meta['duration']:.0f} s)): "
        f"**{cap_rps:.1f} req/s** ({cap_tps:.0f} tokens/s), "
        f"{100 * cap_rps / c_model:.0f} % of the model's figure.",
        f"- Offered loads below are multiples of the model's C ({c_model:.1f} req/s); the model is "
        "deterministic, so runs are comparable across machines.",
        "",
        "## Results",
        "",
        f"Window: requests that arrived in [{a.warmup:.0f} s, {a.duration:.0f} s) of each run "
        f"(goodput: those of them that completed; completed req/s: the completions that ended "
        f"in that window, whatever their arrival, so it moves with the number of requests "
        f"in flight when the window opened). Latencies are measured from each "
        f"request's scheduled arrival. A `≥` marks a lower bound: some admitted requests had no "
        f"first token by the run's hard end ({a.duration:.0f} s + {a.drain:.0f} s drain) and count "
        f"with their wait so far.",
        "",
    ]
    md += spillway_table(by, setups, loads)
    md.append("")
    if a.classes:
        md += classes_section(rows, setups, loads)

    # Acceptance.
    md += ["## Acceptance (issue 5)", ""]
    verdict = None
    lo, hi = min(loads), max(loads)
    base = by.get(("shed", lo))
    top = by.get(("shed", hi))
    if base and top and base["ttft_p99"] and top["ttft_p99"]:
        ratio = top["ttft_p99"] / base["ttft_p99"]
        verdict = ratio <= 2.0 and not top["ttft_bound"]
        md.append(
            f"- Shedding on: admitted TTFT p99 at {hi:g}×C = {ms(top['ttft_p99'], top['ttft_bound'])} ms vs "
            f"{ms(base['ttft_p99'])} ms at {lo:g}×C: **{ratio:.2f}×** (target ≤ 2×) → "
            f"**{'holds' if verdict else 'does NOT hold'}**. It sheds {100 * top['rejected_share']:.0f} % "
            f"of the offered load and completes {top['completed_rps']:.1f} req/s "
            f"({100 * top['completed_rps'] / cap_rps:.0f} % of the measured capacity)."
        )
    if base and base["ttft_p99"]:
        parts = []
        for k in loads:
            r = by.get(("shed", k))
            if r and r["ttft_p99"]:
                parts.append(f"{k:g}×C {r['ttft_p99'] / base['ttft_p99']:.2f}×")
        md.append("- Shedding on, p99 ratio to its lowest-load value at every load: " + ", ".join(parts)
                  + ". Run-to-run noise on this shared machine is about ±10 % on a p99.")
    nb = by.get(("noshed", hi))
    nlo = by.get(("noshed", lo))
    if nb and nlo:
        waiting = nb["backlog"][1] if nb["backlog"] else None
        md.append(
            f"- Shedding off: admitted TTFT p99 {ms(nlo['ttft_p99'], nlo['ttft_bound'])} ms at {lo:g}×C, "
            f"{ms(nb['ttft_p99'], nb['ttft_bound'])} ms at {hi:g}×C"
            + (f"; when arrivals stopped ({a.duration:.0f} s) the engines held {waiting} waiting "
               f"requests, {waiting / cap_rps:.0f} s of work at the measured capacity, growing by "
               f"about {nb['offered_rps'] - cap_rps:.0f} requests every second of overload"
               if waiting is not None else "")
            + ". The queue lives inside the engines, where nothing sheds it: TTFT grows with the "
            "length of the overload, without bound."
        )
    hb = by.get(("haproxy", hi))
    if hb:
        md.append(
            f"- HAProxy at {hi:g}×C: TTFT p99 {ms(hb['ttft_p99'], hb['ttft_bound'])} ms, "
            f"{100 * hb['rejected_share']:.0f} % rejected with 503, rejection p99 "
            f"{ms(hb['reject_p99'])} ms (every refusal waits out `timeout queue`)."
        )
    md.append("")
    md += near_capacity_section(by, loads, setups)

    md += room_section(by, loads, setups)
    md += why_section(a, c_per_engine, "adaptive" in setups)

    # Configurations.
    md += ["## Configurations", "", "Spillway, shedding on (`spillway-shed.toml`, ports as run):",
           "", "```toml", open(a.shed_config).read().rstrip(), "```", ""]
    if "adaptive" in setups and a.adaptive_knobs:
        knobs = f"`{a.adaptive_knobs}` in the model"
        if a.adaptive_worker_knobs:
            knobs += f" and `{a.adaptive_worker_knobs}` in each worker"
        md += [f"Spillway, adaptive mode: the same file with {knobs}.", ""]
    if "room" in setups and a.room_knobs:
        md += [f"Spillway, adaptive + waiting room: the adaptive mode's model keys with "
               f"`{a.room_knobs}` in the model (its requests never queue at a worker).", ""]
    if "noshed" in setups:
        md += ["Spillway, shedding off: the same file without `monitor_interval_ms`, the two "
               "thresholds, `load_sources`, `engine_request_limit`, `request_queue_limit` and "
               "`request_queue_timeout_ms`; the engines do not push load.", ""]
    if a.shed_knobs:
        md += [f"Knobs of this run: `{a.shed_knobs}`.", ""]
    if os.path.exists(a.haproxy_config):
        md += ["HAProxy:", "", "```", open(a.haproxy_config).read().rstrip(), "```", ""]

    # Health of the proxies.
    md += ["## Proxy health during the runs", ""]
    problems = False
    for r in rows:
        notes = health_notes(r, odd="Spillway counted unexpected outcomes")
        if notes:
            problems = True
            md.append(f"- {SETUP_NAMES[r['setup']]} at {r['load']:g}×C: " + "; ".join(notes))
    if not problems:
        md.append("- No errors, no unexpected statuses, no warnings in the proxies' logs, no crashes.")
    md.append("")
    md.append("Spillway's own outcome counters (`dynamo_frontend_requests_total`, whole run incl. "
              "warm-up and drain; `cancelled` = clients cut at the run's hard end):")
    md.append("")
    for r in rows:
        if r["spillway_statuses"]:
            md.append(f"- {SETUP_NAMES[r['setup']]} at {r['load']:g}×C: " + ", ".join(
                f"{k} {v:.0f}" for k, v in sorted(r["spillway_statuses"].items())))
    md.append("")
    md.append(
        f"Load generator: CPU at most {100 * max(r['loadgen_cpu'] for r in rows):.0f} % of one core "
        f"(its start lag p99 at most {1000 * max((r['lag_p99'] or 0) for r in rows):.1f} ms), "
        "so it was not the bottleneck."
    )
    md.append("")

    md += [
        "## Caveats",
        "",
        "- Shared machine: 2 vCPUs that other engineers' builds and tests also used during the "
        "run (load average in the header). The benchmark's processes ran at nice −10; a TTFT p99 "
        "still moves by about ±10 % from run to run. The engines' schedule follows a virtual "
        "clock, so CPU contention delays delivery but never changes what the engines do.",
        "- The engines are `spillway mock-engine`, a time model of continuous batching, not GPUs. "
        "Every request has the same prompt and max_tokens, so completions come in cohorts: the "
        "hardest case for TTFT at saturation. Real output lengths vary and smooth that out.",
        "- One TCP connection per request (loopback connect ≈ 0.1 ms, inside every latency).",
        "- Runs are bounded: under shedding off the figures marked `≥` are lower bounds, and the "
        "backlog column shows how far the queue had grown when arrivals stopped.",
        "- HAProxy's figures depend on its two knobs; `maxconn` = the engines' batch size and "
        "`timeout queue` = 50 ms are one reasonable choice, not the only one.",
        "",
    ]
    results.write_md(a.out_md, md)
    results.write_json(a.out_json, {"c_model": c_model, "c_measured": cap_rps, "rows": rows})
    if a.classes:
        plot_classes(a, rows, setups, loads)
    else:
        plot(a, rows, setups, loads, c_model, cap_tps)
    print("\n".join(md))
    return 0


def classes_section(rows, setups, loads):
    """Per request class: what each class saw (run.sh with CLASS_MIX)."""
    md = ["## Per request class", ""]
    if not any(r.get("classes") for r in rows):
        return md + ["(No request carried a class.)", ""]
    mix = next((r.get("class_mix") for r in rows if r.get("class_mix")), None)
    md += [
        "Each request carried a class in a header, drawn at random with the mix's weights"
        + (f" ({mix})" if mix else "") + "; same window and definitions as above, per class.",
        "",
        "| setup | load | class | offered req/s | completed req/s | TTFT p50 ms | TTFT p99 ms | "
        "refused | reject p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["setup"], r["load"]): r for r in rows}
    for s in setups:
        for k in loads:
            r = by.get((s, k))
            if not r or not r.get("classes"):
                continue
            for c, x in r["classes"].items():
                md.append(
                    f"| {SETUP_NAMES[s]} | {k:g}×C | {c} | {x['offered_rps']:.1f} | "
                    f"{x['completed_rps']:.1f} | {ms(x['ttft_p50'], x['ttft_bound'])} | "
                    f"{ms(x['ttft_p99'], x['ttft_bound'])} | {100 * x['rejected_share']:.1f} % | "
                    f"{ms(x['reject_p99'])} | {x['errors']} |")
    md.append("")
    return md


def plot_classes(a, rows, setups, loads):
    """Per class: refused share and admitted TTFT p99 against offered load."""
    plt = plots.pyplot()
    by = {(r["setup"], r["load"]): r for r in rows}
    classes = []
    for r in rows:
        for c in r.get("classes") or {}:
            if c not in classes:
                classes.append(c)
    colors = {"critical": "tab:red", "standard": "tab:blue", "sheddable": "tab:grey"}
    dashes = {"shed": "-", "adaptive": "-.", "room": "-", "noshed": ":", "haproxy": "--"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for s in setups:
        for i, c in enumerate(classes):
            color = colors.get(c, f"C{i}")
            pts = [(k, by[(s, k)]["classes"][c]) for k in loads
                   if (s, k) in by and c in (by[(s, k)].get("classes") or {})]
            if not pts:
                continue
            label = f"{c} ({SETUP_NAMES[s]})" if len(setups) > 1 else c
            ax1.plot([k for k, _ in pts], [100 * x["rejected_share"] for _, x in pts], color=color,
                     linestyle=dashes.get(s, "-"), marker="o", label=label)
            tp = [(k, x) for k, x in pts if x["ttft_p99"]]
            ax2.plot([k for k, _ in tp], [1000 * x["ttft_p99"] for _, x in tp], color=color,
                     linestyle=dashes.get(s, "-"), marker="o", label=label)
            for k, x in tp:
                if x["ttft_bound"]:
                    ax2.annotate("≥", (k, 1000 * x["ttft_p99"]), textcoords="offset points",
                                 xytext=(6, 4), color=color)
    ax1.set_xlabel("offered load (× C)")
    ax1.set_ylabel("refused share (%)")
    ax1.set_title("Refused share per class vs offered load")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_yscale("log")
    ax2.set_xlabel("offered load (× C)")
    ax2.set_ylabel("admitted TTFT p99 (ms, log)")
    ax2.set_title("TTFT p99 per class vs offered load")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    plots.save(fig, a.out_png)


def why_section(a, c_per_engine, adaptive):
    """Why the shedding knobs have their values, from the time model and the knobs
    (`adaptive`: the adaptive setup ran, so its queue is explained too)."""
    k = dict(kv.split("=", 1) for kv in a.shed_knobs.split()) if a.shed_knobs else {}
    p = a.prompt_bytes // 4
    prefill_ms = p / a.prefill_tps * 1000
    decode_ms = a.step_ms + a.step_per_seq_ms * a.b
    kv_peak = a.b * math.ceil((p + a.max_tokens + 1) / a.block_size) / a.kv_blocks
    out = ["## Why this shedding configuration", ""]
    out.append(
        f"- `engine_request_limit = {k.get('N', '?')}` per worker = the engine's `max_num_seqs`"
        f" ({a.max_num_seqs}), its batch. Anything beyond it waits in the engine's own FIFO, where "
        "nothing can shed it (the shedding-off rows show where that leads); fewer would leave "
        "batch slots idle at saturation.")
    out.append(
        f"- `request_queue_limit = {k.get('Q', '?')}` (the least Spillway accepts) and "
        f"`request_queue_timeout_ms = {k.get('QT', '?')}`: a wait in Spillway's queue adds "
        f"straight to TTFT, and above 1×C a freed slot is refilled within milliseconds by new "
        f"arrivals anyway; {k.get('QT', '?')} ms is a small fraction of a saturated engine step "
        f"({a.step_s * 1000:.0f} ms). Refusals stay fast (see the reject p99 column).")
    if adaptive and a.adaptive_worker_knobs:
        out.append(
            f"- The adaptive mode's workers queue longer (`{a.adaptive_worker_knobs}`): its "
            "controller counts the queue wait in the TTFT it holds, so a longer queue cannot "
            "let TTFT run away under overload, and near capacity it keeps the requests that "
            "arrive while every slot is taken (slots free in cohorts here, see below) instead "
            "of refusing them. A request that times out at one worker may wait again at the "
            "other: two waits at most, each as long as HAProxy's `timeout queue` by default.")
    if k.get("PREFILL"):
        out.append(
            f"- `active_prefill_tokens_threshold = {k['PREFILL']}`: one prompt here is {p} tokens, "
            f"whose prefill costs {prefill_ms:.1f} ms of step time; a saturated step lasts "
            f"{decode_ms:.0f} ms + {prefill_ms:.1f} ms per prompt admitted into it. At capacity an "
            f"engine admits B/M = {a.b / a.max_tokens:.1f} prompt per step. Being busy while more "
            f"than {int(k['PREFILL']) // p} prompt(s) wait for prefill keeps admissions close to "
            f"that rate, so steps stay near {a.step_s * 1000:.0f} ms and TTFT within a few steps. Without "
            "it the cap alone lets cohorts through: every request has the same max_tokens, so "
            "requests admitted in one step finish in one step, their replacements arrive together "
            "and are admitted together, and that step grows by "
            f"{prefill_ms:.1f} ms per prompt (compare `overload-caponly.md`).")
    if k.get("DECODE"):
        out.append(
            f"- `active_decode_blocks_threshold = {k['DECODE']}`: the KV-cache guard. This workload "
            f"peaks at {a.b} × ceil(({p} + {a.max_tokens} + 1) / {a.block_size}) blocks = "
            f"{100 * kv_peak:.0f} % of the cache, so it never fires here; with longer outputs it "
            "stops admissions before the engine starts preempting.")
    if k.get("PUSH"):
        out.append(
            f"- Load freshness: the engines push their load every {k['PUSH']} ms and Spillway folds "
            f"its own tracked load (prompt tokens of routed requests without a first token yet) "
            f"into the busy set every {k.get('MONITOR', '?')} ms (`monitor_interval_ms`). The "
            "prefill signal changes every step, so the busy flag is kept about a step old or "
            "fresher; `overload-fresh20.md` repeats the runs with 20 ms for both.")
    if k.get("PREFILL"):
        out.append(
            "- The price: near capacity the pacing also refuses requests the engines could have "
            "served (the 1×C row's rejected share and completed req/s against the other setups). "
            "The threshold is a dial between the two: 256 (busy from two waiting prompts) "
            "refuses about twice as many near capacity and some at 0.5×C, for a lower TTFT "
            "below capacity and about the same under overload (`overload-prefill256.md`); 512 "
            "is the default: the 2× target held in every run with it, with half the refusals.")
    out.append("")
    return out


def plot(a, rows, setups, loads, c_model, cap_tps):
    plt = plots.pyplot()
    by = {(r["setup"], r["load"]): r for r in rows}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    style = {"shed": ("tab:green", "o"), "adaptive": ("tab:purple", "D"), "room": ("tab:orange", "P"),
             "noshed": ("tab:red", "s"), "haproxy": ("tab:blue", "^")}
    for s in setups:
        color, marker = style[s]
        xs = [k for k in loads if (s, k) in by and by[(s, k)]["ttft_p99"]]
        ys = [by[(s, k)]["ttft_p99"] * 1000 for k in xs]
        ax1.plot(xs, ys, color=color, marker=marker, label=SETUP_NAMES[s])
        for k, y in zip(xs, ys):
            if by[(s, k)]["ttft_bound"]:
                ax1.annotate("≥", (k, y), textcoords="offset points", xytext=(6, 4), color=color)
        xs2 = [k for k in loads if (s, k) in by]
        ax2.plot(xs2, [by[(s, k)]["completed_tps"] for k in xs2], color=color, marker=marker,
                 label=SETUP_NAMES[s] + " (completed)")
        ax2.plot(xs2, [by[(s, k)]["slo_rps"] * a.max_tokens for k in xs2], color=color,
                 marker=marker, linestyle=":", alpha=0.7, label=SETUP_NAMES[s] + " (TTFT ≤ 1 s)")
    if ("shed", min(loads)) in by and by[("shed", min(loads))]["ttft_p99"]:
        ax1.axhline(2000 * by[("shed", min(loads))]["ttft_p99"], color="tab:green", linestyle="--",
                    linewidth=0.8, label="2 × shed p99 at lowest load")
    ax1.set_yscale("log")
    ax1.set_xlabel("offered load (× C)")
    ax1.set_ylabel("admitted TTFT p99 (ms, log)")
    ax1.set_title("TTFT p99 vs offered load")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.axhline(cap_tps, color="grey", linestyle="--", linewidth=0.8, label="measured capacity")
    ax2.set_xlabel("offered load (× C)")
    ax2.set_ylabel("tokens/s")
    ax2.set_title("Goodput vs offered load")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7)
    plots.save(fig, a.out_png)


# --- Dynamo as a peer (bench/overload/dynamo.sh) -----------------------------------------
DYN_NAMES = {
    "dynamo": "Dynamo frontend, busy thresholds",
    "dynamo-cap": "Dynamo frontend, thresholds + worker cap",
}


def frontend_counts(metrics_path):
    """Dynamo frontend counters from a /metrics dump: requests by status, rejections."""
    out = metrics.requests_by_outcome(metrics_path)
    for line in metrics.read(metrics_path).splitlines():
        if line.startswith("dynamo_frontend_model_rejection_total{"):
            out["model_rejection_total"] = out.get("model_rejection_total", 0) + metrics.value(line)
    return out


def ratio_row(name, rows, c_meas, note=""):
    """One line of the side-by-side table from one setup's rows (dicts of analyse())."""
    by = {r["load"]: r for r in rows}
    lo, hi = by.get(0.5), by.get(3) or by.get(3.0)
    one = by.get(1) or by.get(1.0)
    cells = [name + note, f"{c_meas:.1f}"]
    if lo and hi and lo["ttft_p99"] and hi["ttft_p99"]:
        cells += [ms(lo["ttft_p99"], lo["ttft_bound"]), ms(hi["ttft_p99"], hi["ttft_bound"]),
                  ("≥ " if hi["ttft_bound"] else "") + f"**{hi['ttft_p99'] / lo['ttft_p99']:.2f}×**"]
    else:
        cells += ["–", "–", "–"]
    cells.append(f"{one['completed_rps'] / c_meas:.2f}" if one else "–")
    cells.append(f"{100 * one['rejected_share']:.1f} %" if one else "–")
    cells.append(f"{100 * hi['rejected_share']:.1f} %" if hi else "–")
    cells.append(ms(hi["reject_p99"]) if hi else "–")
    if hi:
        handled = hi["offered_rps"]
        cells.append(f"{100 * hi['proxy_cpu']:.0f} %")
        cells.append(f"{1000 * hi['proxy_cpu'] / max(handled, 1e-9):.2f}")
    else:
        cells += ["–", "–"]
    return "| " + " | ".join(cells) + " |"


def dynamo_rows(a):
    """The figures of every Dynamo run in the summary (dynamo.sh's summary.jsonl)."""
    rows = []
    for run in results.read_jsonl(a.summary):
        meta, recs = load_run(run["file"])
        s = analyse(meta, recs, a.warmup, a.duration, a.max_tokens)
        s.update(setup=run["setup"], load=run["load"], rate=run["rate"])
        s["proxy_cpu"] = run["proxy_ticks"] / a.clk_tck / max(meta["wall_s"], 1e-9)
        s["mocker_cpu"] = run["mocker_ticks"] / a.clk_tck / max(meta["wall_s"], 1e-9)
        s["proxy_alive"] = run["proxy_alive"]
        s["frontend_counts"] = frontend_counts(run.get("metrics"))
        # Dynamo logs every refusal at ERROR (three lines, in the request's span) and WARN;
        # anything else at ERROR, or a panic, is a problem.
        flog = metrics.log_lines(run.get("log", ""))
        s["log_problems"] = [l for l in flog if re.search(r"\bERROR\b|panic", l)
                             and not ("http-request:" in l and ("529" in l or "overload" in l))][:5]
        s["frontend_log_lines"] = len(flog)
        s["worker_cap_rejections"] = sum("Worker at capacity" in l
                                         for l in metrics.log_lines(run.get("mocker_log", "")))
        rows.append(s)
    return rows


def dynamo_results_table(by, setups, loads):
    return results_table(
        by, setups, loads, DYN_NAMES,
        " frontend CPU | frontend CPU ms / request | mocker CPU | loadgen CPU |",
        lambda r: f" {100 * r['proxy_cpu']:.0f} % | "
                  f"{1000 * r['proxy_cpu'] / max(r['offered_rps'], 1e-9):.2f} | "
                  f"{100 * r['mocker_cpu']:.0f} % | {100 * r['loadgen_cpu']:.0f} % |")


def side_by_side_table(peer, rows, setups, cap_rps):
    """Spillway's and HAProxy's setups (peer: overload-summary.json) and Dynamo's, each on
    the ratios to its own C; and the peer's rows by setup (for the reading)."""
    md = ["| setup | C req/s | TTFT p99 0.5×C | TTFT p99 3×C | ratio 3×C / 0.5×C | goodput 1×C ÷ C "
          "| refused 1×C | refused 3×C | reject p99 ms 3×C | proxy CPU 3×C | CPU ms / request 3×C |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    side = {}
    if peer:
        pc = peer["c_measured"]
        side["_c_measured"] = pc
        for s in ("shed", "adaptive", "room", "haproxy", "noshed"):
            prow = [r for r in peer["rows"] if r["setup"] == s]
            if prow:
                md.append(ratio_row(SETUP_NAMES[s], prow, pc))
                side[s] = prow
    for s in setups:
        md.append(ratio_row(DYN_NAMES[s], [r for r in rows if r["setup"] == s], cap_rps))
    return md, side


def dynamo_report(a):
    cap_rps, cap_tps, cap_meta = capacity_measured(a.capacity, a.capacity_warmup)
    rows = dynamo_rows(a)
    by, loads, setups = layout(rows, DYN_NAMES)
    cap_cpu = a.capacity_ticks / a.clk_tck / max(cap_meta["wall_s"], 1e-9)

    md = results.header(a.header)
    md += [
        "## Capacity C (measured)",
        "",
        f"- Closed loop, {cap_meta['closed']} concurrent streams through a frontend without "
        f"thresholds to the mocker's two workers, completions in [{a.capacity_warmup:.0f} s, "
        f"{cap_meta['duration']:.0f} s): **C = {cap_rps:.1f} req/s** ({cap_tps:.0f} tokens/s) at "
        f"`--speedup-ratio {a.speedup:g}`. The frontend used {100 * cap_cpu:.0f} % of CPU 0 "
        "meanwhile, so C is the mocker's, not the frontend's.",
        "- The mocker's time model is Dynamo's own (vLLM-style step timings), not `spillway "
        "mock-engine`'s: the engine parameters match, the step costs do not. Offered loads "
        "below are multiples of this measured C, as Spillway's are of its engines' C, so the two "
        "benchmarks compare by ratios to C.",
        "",
        "## Results",
        "",
        f"Window: requests that arrived in [{a.warmup:.0f} s, {a.duration:.0f} s) of each run "
        "(goodput: those of them that completed; completed req/s: the completions that ended "
        "in that window). Latencies from each request's "
        "scheduled arrival; `≥` marks a lower bound (no first token by the run's hard end).",
        "",
    ]
    md += dynamo_results_table(by, setups, loads)
    md.append("")

    # Side by side, from the Spillway/HAProxy summary of run.sh.
    md += ["## Side by side: Dynamo, HAProxy and Spillway on the same ratios", ""]
    peer = None
    try:
        peer = results.read_json(a.spillway_summary)
    except (OSError, ValueError) as e:
        md += [f"(No Spillway/HAProxy summary at `{a.spillway_summary}`: {e}.)", ""]
    md += [
        "Each system is offered 0.5–3 × its own C. Columns: C = its measured capacity (req/s); "
        "admitted TTFT p99 at 0.5×C and 3×C (ms) and their ratio (the overload penalty; "
        "Spillway's acceptance target is ≤ 2×); goodput = completed req/s at 1×C ÷ measured "
        "C; refused = share of arrivals answered 429/503/529; reject p99 = time to the refusal's "
        "status line at 3×C; proxy/frontend CPU at 3×C, as a share of its one CPU and as CPU "
        "ms per arriving request (refusals included).",
        "",
    ]
    table, side = side_by_side_table(peer, rows, setups, cap_rps)
    md += table
    md.append("")
    if peer:
        md += [
            f"Spillway and HAProxy figures: `{os.path.relpath(a.spillway_summary, os.path.dirname(a.out_md))}` "
            f"(bench/overload/run.sh; two `spillway mock-engine`s, measured C = {peer['c_measured']:.1f} "
            f"req/s; its loads are multiples of the time model's C = {peer['c_model']:.1f} req/s, "
            f"{100 * abs(peer['c_model'] / peer['c_measured'] - 1):.0f} % away). That run and this one "
            "were made at different times on the same shared 2-CPU machine.",
            "",
        ]
    md += dynamo_reading(a, rows, setups, by, side, cap_rps)
    md += dynamo_why(a)

    md += ["## Frontend health during the runs", ""]
    problems = False
    for r in rows:
        notes = health_notes(r, gone="frontend process gone after the run", odd=None,
                             log_chars=200)
        if notes:
            problems = True
            md.append(f"- {DYN_NAMES[r['setup']]} at {r['load']:g}×C: " + "; ".join(notes))
    if not problems:
        md.append("- No client-side errors, no ERROR lines or panics in the frontend's log, no crashes.")
    md += ["", "Dynamo's own counters (`dynamo_frontend_requests_total` by status and error type, "
           "`dynamo_frontend_model_rejection_total`; whole run incl. warm-up and drain):", ""]
    for r in rows:
        if r["frontend_counts"]:
            md.append(f"- {DYN_NAMES[r['setup']]} at {r['load']:g}×C: " + ", ".join(
                f"{k} {v:.0f}" for k, v in sorted(r["frontend_counts"].items()))
                + (f"; the workers' own cap refused {r['worker_cap_rejections']} (mocker log: "
                   "`Worker at capacity`)" if r["setup"] == "dynamo-cap" else "")
                + f"; frontend log {r['frontend_log_lines']} lines")
    md += ["", f"Load generator: CPU at most {100 * max(r['loadgen_cpu'] for r in rows):.0f} % of "
           f"one core (its start lag p99 at most {1000 * max((r['lag_p99'] or 0) for r in rows):.1f} ms).",
           ""]
    md += [
        "## Caveats",
        "",
        "- Different engines: Dynamo's mocker and `spillway mock-engine` share the engine "
        "parameters (batch 64, 2048 × 16-token KV blocks, 2048 batched tokens, 256-token prompts, "
        "64 output tokens) but not their step-time models, so absolute TTFTs differ; compare "
        "the ratios to each system's own low-load figure and to its own C.",
        "- Dynamo's frontend tokenizes every prompt and detokenizes every output token (it is "
        "an OpenAI front end, not a byte proxy), in Python-hosted Rust; Spillway and HAProxy "
        "forward bytes. Its CPU column carries that work.",
        "- Dynamo's busy set is fed by the workers' load events over its event plane (ZMQ here) "
        "and the router's own tracking; how often it refreshes is Dynamo's choice, not a knob "
        "here (Spillway's run pushes load every 5 ms).",
        "- Shared machine: 2 vCPUs that other engineers' builds also used (load average in the "
        "header); processes at nice −10; a p99 moves by about ±10 % from run to run.",
        "- One TCP connection per request (loopback connect ≈ 0.1 ms, inside every latency).",
        "- Logging: both Dynamo processes ran with `DYN_LOG=warn` (Spillway ran with "
        "`RUST_LOG=warn`). Dynamo still logs each refusal (three ERROR lines and one WARN) and each "
        "success (one INFO line, its request span) to the frontend's log, a file here; that "
        "work is in the frontend CPU column.",
        "",
    ]
    results.write_md(a.out_md, md)
    results.write_json(a.out_json, {
        "c_measured": cap_rps, "c_tps": cap_tps, "capacity_frontend_cpu": cap_cpu,
        "prompt_tokens": a.prompt_tokens, "speedup": a.speedup,
        "thresholds": {"active_decode_blocks_threshold": float(a.dyn_decode) if a.dyn_decode else None,
                       "active_prefill_tokens_threshold": float(a.dyn_prefill) if a.dyn_prefill else None},
        "rows": rows})
    print("\n".join(md))
    return 0


def dynamo_reading(a, rows, setups, by, side, cap_rps):
    out = ["## Reading", ""]
    for s in setups:
        lo, hi, one = by.get((s, 0.5)), by.get((s, 3)) or by.get((s, 3.0)), by.get((s, 1)) or by.get((s, 1.0))
        if lo and hi and lo["ttft_p99"] and hi["ttft_p99"]:
            out.append(
                f"- {DYN_NAMES[s]}: admitted TTFT p99 {ms(lo['ttft_p99'])} ms at 0.5×C, "
                f"{ms(hi['ttft_p99'], hi['ttft_bound'])} ms at 3×C: **{hi['ttft_p99'] / lo['ttft_p99']:.2f}×**; "
                f"it refuses {100 * hi['rejected_share']:.0f} % at 3×C (reject p99 {ms(hi['reject_p99'])} ms) "
                f"and completes {hi['completed_rps']:.1f} req/s there "
                f"({100 * hi['completed_rps'] / cap_rps:.0f} % of C)"
                + (f"; at 1×C it completes {one['completed_rps']:.1f} req/s "
                   f"({100 * one['completed_rps'] / cap_rps:.0f} % of C) and refuses "
                   f"{100 * one['rejected_share']:.1f} %." if one else "."))
    sh = side.get("shed")
    d = {r["load"]: r for r in rows if r["setup"] == "dynamo"}
    if sh and d.get(0.5) and d.get(3) and d.get(1):
        b = {r["load"]: r for r in sh}
        if b.get(0.5) and b.get(3) and b.get(1):
            out.append(
                f"- Against Spillway's shed setup on the same ratios: the overload penalty (TTFT p99 "
                f"3×C ÷ 0.5×C) is {d[3]['ttft_p99'] / d[0.5]['ttft_p99']:.2f}× for Dynamo's thresholds "
                f"against {b[3]['ttft_p99'] / b[0.5]['ttft_p99']:.2f}×; near capacity (1×C) Dynamo "
                f"refuses {100 * d[1]['rejected_share']:.0f} % and completes "
                f"{d[1]['completed_rps'] / cap_rps:.2f} C, Spillway {100 * b[1]['rejected_share']:.0f} % "
                f"and {b[1]['completed_rps'] / a_c_peer(side):.2f} C. With the same threshold values, "
                "Dynamo both admits requests that then wait in the engines (the TTFT tail) and refuses work the "
                "engines could have taken (the goodput gap). That is consistent with a busy flag "
                "that follows the workers' load less closely than Spillway's (5 ms pushes + tracked "
                "load); this benchmark does not measure Dynamo's flag itself.")
    if sh:
        b = {r["load"]: r for r in sh}
        if b.get(0.5) and b.get(3):
            out.append(
                f"- Spillway, shedding on (from `overload.md`): {b[3]['ttft_p99'] / b[0.5]['ttft_p99']:.2f}× "
                f"with {100 * b[3]['rejected_share']:.0f} % refused at 3×C, reject p99 "
                f"{ms(b[3]['reject_p99'])} ms.")
    hp = side.get("haproxy")
    if hp:
        b = {r["load"]: r for r in hp}
        if b.get(0.5) and b.get(3):
            out.append(
                f"- HAProxy (from `overload.md`): {b[3]['ttft_p99'] / b[0.5]['ttft_p99']:.2f}×, "
                f"{100 * b[3]['rejected_share']:.0f} % refused at 3×C after waiting out its 50 ms "
                f"`timeout queue` (reject p99 {ms(b[3]['reject_p99'])} ms).")
    out.append("")
    return out


def a_c_peer(side):
    return side.get("_c_measured") or 1.0


def dynamo_why(a):
    p, m = a.prompt_tokens, a.max_tokens
    blocks = a.max_num_seqs * math.ceil((p + m) / a.block_size)
    out = ["## Why these thresholds", ""]
    if a.dyn_decode:
        out.append(
            f"- `--active-decode-blocks-threshold {a.dyn_decode}`: Spillway's shed setup uses the "
            f"same 0.9, with the same meaning (busy when active decode blocks / total KV blocks > "
            f"0.9). The guard against KV-cache exhaustion: this workload peaks at {a.max_num_seqs} × "
            f"ceil(({p} + {m}) / {a.block_size}) = {blocks} blocks, {100 * blocks / a.kv_blocks:.0f} % of "
            f"the {a.kv_blocks} blocks, so it does not fire here, for Dynamo as for Spillway. "
            "Decode-block rejection needs the KV router's worker-load path (`--router-mode kv`); "
            "`--router-track-output-blocks` counts generated tokens too (Dynamo's docs), and "
            "`--no-router-assume-kv-reuse` because the mocker runs without a prefix cache, so "
            "identical prompts must not be counted as shared blocks.")
    if a.dyn_prefill:
        out.append(
            f"- `--active-prefill-tokens-threshold {a.dyn_prefill}`: the same absolute value as "
            f"Spillway's `active_prefill_tokens_threshold`, with the same rule (busy while more "
            f"than {a.dyn_prefill} prompt tokens wait for prefill, i.e. more than "
            f"{int(float(a.dyn_prefill)) // max(p, 1)} of these {p}-token prompts). It paces "
            "admissions to the engine's prefill rate, which is what keeps TTFT near its low-load "
            "value under overload. The fractional form (`--active-prefill-tokens-threshold-frac`) "
            f"would be {float(a.dyn_prefill) / a.max_num_batched_tokens:g} × max-num-batched-tokens "
            f"({a.max_num_batched_tokens}), the same point.")
    out.append(
        "- Not matched: Spillway's shed setup also holds an exact per-worker admission cap "
        "(engine_request_limit 64 = the batch, queue 2, 5 ms queue timeout). Dynamo's frontend has "
        "no such cap; its workers have one (`DYN_ENGINE_REQUEST_LIMIT` + "
        f"`DYN_DYNAMO_REQUEST_QUEUE_LIMIT`, setup `dynamo-cap`, {a.dyn_cap})"
        + (" — run here too." if "dynamo-cap" in open(a.summary).read() else
           ", not run by default: `SETUPS=\"dynamo dynamo-cap\" bench/overload/dynamo.sh`."))
    out.append("- Refusal status: Dynamo answers 529 (`DYN_HTTP_OVERLOAD_STATUS_CODE` unset), as Spillway does.")
    out.append("")
    return out


def isolation_report(a):
    """Appends to a class run's report how critical requests fared with the other classes
    present (the mix's loads) and absent (critical alone at its rate in the top load)."""
    mix = results.read_json(a.mix)["rows"]
    alone = results.read_json(a.alone)["rows"][0]
    crit = [(r["load"], r["classes"]["critical"]) for r in mix
            if "critical" in (r.get("classes") or {})]
    lo, hi = min(crit, key=lambda x: x[0]), max(crit, key=lambda x: x[0])
    solo = alone["classes"]["critical"]
    top_row = max(mix, key=lambda r: r["load"])
    refused = {c: x["rejected_share"] for c, x in top_row["classes"].items()}
    p99 = lambda x: x["ttft_p99"] * 1000 if x["ttft_p99"] else float("nan")
    alone_md = os.path.basename(a.alone).replace("-summary.json", ".md")
    md = ["", "## Critical requests with and without the other classes (issue 10)", "",
          f"Critical traffic alone at its rate in the {hi[0]:g}×C mix ({alone['offered_rps']:.1f} "
          f"req/s, `{alone_md}`, same configuration), next to the mix.", "",
          "| critical requests | offered req/s | TTFT p50 ms | TTFT p99 ms | refused |",
          "|---|---|---|---|---|"]
    for name, x in ((f"in the mix at {lo[0]:g}×C", lo[1]), (f"in the mix at {hi[0]:g}×C", hi[1]),
                    ("alone, same rate", solo)):
        md.append(f"| {name} | {x['offered_rps']:.1f} | {x['ttft_p50'] * 1000:.1f} | "
                  f"{p99(x):.1f} | {100 * x['rejected_share']:.1f} % |")
    md += ["",
           f"- Critical admitted TTFT p99 at {hi[0]:g}×C: {p99(hi[1]):.1f} ms = "
           f"**{p99(hi[1]) / p99(solo):.2f}×** its value with no other traffic at the same rate "
           f"(target ≤ 1.2× in issue 10, ≤ 1.1× in issue 31), **{p99(hi[1]) / p99(lo[1]):.2f}×** its value in the {lo[0]:g}×C mix; "
           f"refused {100 * hi[1]['rejected_share']:.1f} % (target < 1 %).",
           "- Refused at " + f"{hi[0]:g}×C by class: " + ", ".join(
               f"{c} {100 * v:.1f} %" for c, v in refused.items()) + ".",
           "- The engines' time model makes TTFT grow with the arrival rate they serve (bigger "
           "batches, longer steps, more prompts prefilled in one step): critical alone at "
           f"{solo['offered_rps']:.1f} req/s is more than the whole {lo[0]:g}×C mix, so no admission "
           f"policy can bring critical's p99 at {hi[0]:g}×C down to its {lo[0]:g}×C value; what the "
           "classes do is keep the other 80 % of the traffic from adding to it.", ""]
    with open(a.out_md, "a") as f:  # md ends with "": the file ends with one newline
        f.write("\n".join(md))
    return 0


def fairness_report(a):
    """Appends to the tenants run's report how the light tenant fared beside a heavy one,
    with the room serving tenants in turn (`--fair`), first come first served (`--fifo`,
    beside HAProxy), and alone at its rate in the mix (`--alone`)."""
    fair = results.read_json(a.fair)["rows"]
    fifo = results.read_json(a.fifo)["rows"]
    solo = results.read_json(a.alone)["rows"][0]["classes"]["light"]
    ms = lambda v: v * 1000 if v else float("nan")
    load = fair[0]["load"]
    md = ["", "## The light tenant beside a heavy one (issue 31)", "",
          f"Two tenants at {load:g}×C in all, the heavy one offering "
          f"{fair[0]['class_mix']['heavy'] / fair[0]['class_mix']['light']:g}× the light one's "
          "rate, next to the light tenant alone at its rate in the mix "
          "(`overload-tenants-light-alone.md`) and the same mix with tenants off "
          "(`overload-tenants-fifo.md`).", "",
          "| setup | tenant | offered req/s | goodput req/s | refused | TTFT p50 ms | TTFT p99 ms |",
          "|---|---|---|---|---|---|---|"]
    rows = [("room, tenants in turn", r) for r in fair] + [
        ("room, first come first served" if r["setup"] == "room" else SETUP_NAMES[r["setup"]], r)
        for r in fifo]
    for name, r in rows:
        for t in ("light", "heavy"):
            x = r["classes"][t]
            md.append(f"| {name} | {t} | {x['offered_rps']:.1f} | {x['completed_rps']:.1f} | "
                      f"{100 * x['rejected_share']:.1f} % | {ms(x['ttft_p50']):.1f} | "
                      f"{ms(x['ttft_p99']):.1f} |")
    md.append(f"| room, light alone | light | {solo['offered_rps']:.1f} | "
              f"{solo['completed_rps']:.1f} | "
              f"{100 * solo['rejected_share']:.1f} % | {ms(solo['ttft_p50']):.1f} | "
              f"{ms(solo['ttft_p99']):.1f} |")
    light = fair[0]["classes"]["light"]
    kept = (light["completed_rps"] / max(1e-9, light["offered_rps"])) / max(
        1e-9, solo["completed_rps"] / max(1e-9, solo["offered_rps"]))
    md += ["",
           f"- The light tenant, tenants in turn: completes {100 * kept:.1f} % of the share of its "
           f"offered requests it completes alone (target ≥ 95 %); TTFT p99 {ms(light['ttft_p99']):.1f} ms = "
           f"**{ms(light['ttft_p99']) / ms(solo['ttft_p99']):.2f}×** its value alone "
           "(target ≤ 1.1×).",
           "- Goodput here is requests completed per second of the run; the per-tenant "
           "figures come from the load generator's class field, which carried the tenant.", ""]
    with open(a.out_md, "a") as f:  # md ends with "": the file ends with one newline
        f.write("\n".join(md))
    return 0


def tables(a):
    """The tables report() writes, from a summary it wrote (results/*-summary.json)."""
    rows = results.read_json(a.summary_json)["rows"]
    by, loads, setups = layout(rows, SETUP_NAMES)
    md = spillway_table(by, setups, loads) + [""]
    if any(r.get("classes") for r in rows):
        md += classes_section(rows, setups, loads)
    md += near_capacity_section(by, loads, setups)
    print("\n".join(md))
    return 0


def dynamo_tables(a):
    """The tables dynamo_report() writes, from its summary and the Spillway/HAProxy summary
    it was made with."""
    rows = results.read_json(a.summary_json)["rows"]
    cap_rps = results.read_json(a.summary_json)["c_measured"]
    by, loads, setups = layout(rows, DYN_NAMES)
    peer = results.read_json(a.spillway_summary)
    md = dynamo_results_table(by, setups, loads) + [""]
    md += side_by_side_table(peer, rows, setups, cap_rps)[0]
    print("\n".join(md))
    return 0


def main():
    p = argparse.ArgumentParser(prog="report.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("isolation")
    for name in ("mix", "alone", "out-md"):
        q.add_argument("--" + name, required=True)
    q = sub.add_parser("fairness")
    for name in ("fair", "fifo", "alone", "out-md"):
        q.add_argument("--" + name, required=True)
    q = sub.add_parser("tables")
    q.add_argument("--summary-json", required=True)
    q = sub.add_parser("dynamo-tables")
    q.add_argument("--summary-json", required=True)
    q.add_argument("--spillway-summary", required=True)

    q = sub.add_parser("dynamo")
    for name in ("summary", "capacity", "header", "spillway-summary", "out-md", "out-json"):
        q.add_argument("--" + name, required=True)
    q.add_argument("--capacity-warmup", type=float, default=8)
    q.add_argument("--capacity-ticks", type=float, default=0)
    q.add_argument("--warmup", type=float, required=True)
    q.add_argument("--duration", type=float, required=True)
    q.add_argument("--drain", type=float, required=True)
    q.add_argument("--max-tokens", type=int, default=64)
    q.add_argument("--prompt-tokens", type=int, default=256)
    q.add_argument("--kv-blocks", type=int, default=2048)
    q.add_argument("--block-size", type=int, default=16)
    q.add_argument("--max-num-seqs", type=int, default=64)
    q.add_argument("--max-num-batched-tokens", type=int, default=2048)
    q.add_argument("--speedup", type=float, default=1)
    q.add_argument("--dyn-decode", default="")
    q.add_argument("--dyn-prefill", default="")
    q.add_argument("--dyn-cap", default="")
    q.add_argument("--clk-tck", type=float, default=100)

    r = sub.add_parser("report")
    r.add_argument("--prompt-bytes", type=int, default=1024)
    add_engine_args(r)
    r.add_argument("--summary", required=True)
    r.add_argument("--capacity", required=True)
    r.add_argument("--capacity-warmup", type=float, default=8)
    r.add_argument("--c-model-per-engine", type=float, required=True)
    r.add_argument("--header", required=True)
    r.add_argument("--warmup", type=float, required=True)
    r.add_argument("--duration", type=float, required=True)
    r.add_argument("--drain", type=float, required=True)
    r.add_argument("--shed-config", required=True)
    r.add_argument("--haproxy-config", required=True)
    r.add_argument("--adaptive-knobs", default="")
    r.add_argument("--adaptive-worker-knobs", default="")
    r.add_argument("--room-knobs", default="")
    r.add_argument("--clk-tck", type=float, default=100)
    r.add_argument("--shed-knobs", default="")
    r.add_argument("--classes", action="store_true",
                   help="a class run (run.sh CLASS_MIX): per-class section, per-class plot")
    r.add_argument("--out-md", required=True)
    r.add_argument("--out-png", required=True)
    r.add_argument("--out-json", required=True)
    a = p.parse_args()
    if a.cmd == "isolation":
        return isolation_report(a)
    if a.cmd == "fairness":
        return fairness_report(a)
    if a.cmd == "tables":
        return tables(a)
    if a.cmd == "dynamo-tables":
        return dynamo_tables(a)
    if a.cmd == "dynamo":
        return dynamo_report(a)
    _, a.b, a.step_s = model_capacity(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Disaggregated serving benchmark: the report (bench/disagg/run.sh).

  report.py report --summary S --header H ...   writes disagg.md, disagg.png, disagg-summary.json
  report.py tables --summary-json J             prints the tables of disagg.md (or a variant)
                                                from its summary

Per run and class (summarise, chat), over the requests that arrived in [warmup, duration)
(spillbench.analysis.analyse: TTFT from the scheduled arrival, a stream with no first token
by the run's end counted at its wait so far, as a lower bound), plus:
  ITL      the inter-token gaps (bench/disagg/loadgen.py) whose token came in [warmup,
           duration) on the run's clock, of every request of the class: the gaps a stream
           saw while the load was offered, whenever it arrived
  refused  the refusals (429/503/529) among the window's arrivals, by the `pool` their body
           names: prefill, decode, or unnamed (no pool, or an empty one)
  goodput  the window's arrivals that completed ok, per second of the window
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import metrics, plot as plots, results  # noqa: E402
from spillbench.analysis import analyse  # noqa: E402
from spillbench.markdown import NONE, ms, row  # noqa: E402
from spillbench.results import load_run  # noqa: E402
from spillbench.stats import pct  # noqa: E402

CLASSES = ("summarise", "chat")
SETUPS = ("disagg", "aggregated")
SETUP_NAMES = {
    "disagg": "disagg (prefill pool p1, p2; decode pool d1, d2)",
    "aggregated": "aggregated (e1–e4 whole)",
}
OUTCOMES = ("remote", "fallback", "local")
ITL_LIMIT = 1.2  # the verdict's bound on chat ITL p99, mix ÷ chat-only
CLASS_FIELDS = ("arrivals", "offered_rps", "goodput_rps", "ttft_p50", "ttft_p99", "ttft_bound",
                "admitted", "rejected", "errors", "error_kinds")


# --- figures from the raw runs ------------------------------------------------------------
def window_gaps(recs, warmup, duration):
    """The inter-token gaps whose token came in [warmup, duration) on the run's clock."""
    out = []
    for r in recs:
        if "ttft" not in r:
            continue
        t = r["sched"] + r["ttft"]
        for g in r.get("gaps", ()):
            t += g
            if warmup <= t < duration:
                out.append(g)
    return out


def class_figures(meta, recs, warmup, duration):
    """One class's figures in one run (its records only)."""
    max_tokens = meta["classes"][recs[0]["class"]]["max_tokens"] if recs else 0
    s = analyse(meta, recs, warmup, duration, max_tokens)
    out = {k: s[k] for k in CLASS_FIELDS}
    out["goodput_share"] = s["goodput_rps"] / s["offered_rps"] if s["offered_rps"] else None
    gaps = window_gaps(recs, warmup, duration)
    out["itl_n"] = len(gaps)
    out["itl_p50"] = pct(gaps, 50)
    out["itl_p99"] = pct(gaps, 99)
    out["itl_max"] = max(gaps) if gaps else None
    refused = {"prefill": 0, "decode": 0, "unnamed": 0}
    for r in recs:
        if warmup <= r["sched"] < duration and r["outcome"] == "rejected":
            pool = r.get("pool") or "unnamed"
            refused[pool if pool in refused else "unnamed"] += 1
    out["refused_by_pool"] = refused
    statuses = {}
    for r in recs:
        if warmup <= r["sched"] < duration and r["outcome"] == "rejected":
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    out["refused_statuses"] = statuses
    return out


def handoffs(path, model="mock-model"):
    """spillway_handoffs_total of `model` by outcome from a /metrics dump; {} when absent."""
    out = {}
    for line in metrics.read(path).splitlines():
        if not line.startswith("spillway_handoffs_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("model") != model:
            continue
        try:
            out[labels.get("outcome", "?")] = int(metrics.value(line))
        except (ValueError, IndexError):
            pass
    return out


def outcomes(path, model="mock-model"):
    """dynamo_frontend_requests_total of `model` (the clients' requests, not the prefill
    pool's stage 1) by status (and error_type) from a /metrics dump."""
    out = {}
    for line in metrics.read(path).splitlines():
        if not line.startswith("dynamo_frontend_requests_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("model") != model:
            continue
        key = labels.get("status", "?")
        if labels.get("error_type"):
            key += f" ({labels['error_type']})"
        out[key] = out.get(key, 0) + metrics.value(line)
    return out


def run_figures(s, a):
    """One run's figures (s: its line of run.sh's summary)."""
    meta, recs = load_run(s["file"])
    whole = analyse(meta, recs, a.warmup, a.duration, 0)
    out = {
        "setup": s["setup"], "workload": s["workload"], "load": s["load"], "rate": s["rate"],
        "sum_share": s["sum_share"], "offered_rps": whole["offered_rps"],
        "goodput_rps": whole["goodput_rps"], "arrivals": whole["arrivals"],
        "errors": whole["errors"], "error_kinds": whole["error_kinds"],
        "loadgen_cpu": whole["loadgen_cpu"], "lag_p99": whole["lag_p99"],
        "wall_s": whole["wall_s"], "proxy_alive": s["proxy_alive"],
        "handoffs": handoffs(s["metrics"]),
        "spillway_outcomes": outcomes(s["metrics"]),
        # Shedding's own warning ("request refused", at most once a second per core) is the
        # bench working; anything else is listed.
        "log_problems": [l for l in metrics.log_problems(s["log"]) if "request refused" not in l],
        "classes": {},
    }
    for c in CLASSES:
        mine = [r for r in recs if r.get("class") == c]
        if mine:
            out["classes"][c] = class_figures(meta, mine, a.warmup, a.duration)
    return out


# --- tables and verdict from the summary --------------------------------------------------
def by_key(runs):
    return {(r["setup"], r["workload"], r["load"]): r for r in runs}


def fig(run, cls, key):
    if not run:
        return None
    return (run["classes"].get(cls) or {}).get(key)


def chat_ratio(by, setup, load):
    """Chat ITL p99 in the mix ÷ in the chat-only run; None when either is missing."""
    mix = fig(by.get((setup, "mix", load)), "chat", "itl_p99")
    alone = fig(by.get((setup, "chat-only", load)), "chat", "itl_p99")
    return mix / alone if (mix is not None and alone) else None


def goodput_cell(c):
    if not c:
        return NONE
    share = f" ({100 * c['goodput_share']:.0f} %)" if c.get("goodput_share") is not None else ""
    return f"{c['goodput_rps']:.1f}{share}"


def refused_cell(c):
    if not c:
        return NONE
    p = c["refused_by_pool"]
    return f"{p['prefill']} / {p['decode']} / {p['unnamed']}"


def handoff_cell(run, setup):
    if setup != "disagg" or not run:
        return NONE
    h = run.get("handoffs") or {}
    if not h:
        return "(no series)"
    return " / ".join(str(h.get(o, 0)) for o in OUTCOMES)


def class_cells(c):
    if not c:
        return [NONE] * 5
    return [c["arrivals"], ms(c["ttft_p99"], c["ttft_bound"]), ms(c["itl_p99"]),
            goodput_cell(c), refused_cell(c)]


def mix_table(by, setup, loads):
    head = ["load", "offered req/s",
            "summarise requests", "summarise TTFT p99 ms", "summarise ITL p99 ms",
            "summarise goodput req/s (share)", "summarise refused prefill / decode / unnamed",
            "chat requests", "chat TTFT p99 ms", "chat ITL p99 ms",
            "chat goodput req/s (share)", "chat refused prefill / decode / unnamed",
            "chat-only run: chat ITL p99 ms", "chat ITL p99 mix ÷ chat-only",
            "handoffs remote / fallback / local", "errors"]
    lines = [row(head), row(["---"] * len(head))]
    for k in loads:
        run = by.get((setup, "mix", k))
        if not run:
            continue
        base = by.get((setup, "chat-only", k))
        ratio = chat_ratio(by, setup, k)
        lines.append(row(
            [f"{k:g}×C", f"{run['offered_rps']:.1f}"]
            + class_cells(run["classes"].get("summarise"))
            + class_cells(run["classes"].get("chat"))
            + [ms(fig(base, "chat", "itl_p99")), NONE if ratio is None else f"{ratio:.2f}",
               handoff_cell(run, setup), run["errors"]]))
    return lines


def chat_only_table(by, setup, loads):
    head = ["load", "offered req/s", "requests", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms",
            "goodput req/s (share)", "refused prefill / decode / unnamed",
            "handoffs remote / fallback / local", "errors"]
    lines = [row(head), row(["---"] * len(head))]
    for k in loads:
        run = by.get((setup, "chat-only", k))
        if not run:
            continue
        c = run["classes"].get("chat")
        cells = ([c["arrivals"], ms(c["ttft_p99"], c["ttft_bound"]), ms(c["itl_p50"]),
                  ms(c["itl_p99"]), goodput_cell(c), refused_cell(c)] if c else [NONE] * 6)
        lines.append(row([f"{k:g}×C", f"{run['offered_rps']:.1f}"] + cells
                         + [handoff_cell(run, setup), run["errors"]]))
    return lines


def runs_table(runs):
    head = ["setup", "run", "load", "load generator CPU", "start lag p99 ms",
            "Spillway outcomes (mock-model)", "client errors", "proxy alive",
            "log warnings/errors (besides refusals)"]
    lines = [row(head), row(["---"] * len(head))]
    for r in runs:
        outcomes = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["spillway_outcomes"].items()))
        errs = str(r["errors"]) + (f" {r['error_kinds']}" if r["errors"] else "")
        lines.append(row([r["setup"], r["workload"], f"{r['load']:g}×C",
                          f"{100 * r['loadgen_cpu']:.0f} %", ms(r["lag_p99"]),
                          outcomes or NONE, errs, r["proxy_alive"], len(r["log_problems"])]))
    problems = [(r, l) for r in runs for l in r["log_problems"][:2]]
    if problems:
        lines += ["", "Log lines besides refusals (at most two a run):", ""]
        lines += [f"- {r['setup']} {r['workload']} {r['load']:g}×C: `{l[-200:]}`"
                  for r, l in problems]
    return lines


def verdict(by, setups, loads):
    lines = ["## Verdict", "",
             f"Does chat's ITL p99 in the mix stay within {ITL_LIMIT}× its chat-only baseline "
             "(the same chat traffic without the long prompts, same setup, same load) at every "
             "load? Computed from the tables above:", ""]
    for setup in setups:
        ratios = [(k, chat_ratio(by, setup, k)) for k in loads if (setup, "mix", k) in by]
        if not ratios:
            continue
        missing = [k for k, r in ratios if r is None]
        over = [k for k, r in ratios if r is not None and r > ITL_LIMIT]
        shown = ", ".join(f"{k:g}×C {NONE if r is None else f'{r:.2f}'}" for k, r in ratios)
        good = ", ".join(
            f"{k:g}×C {100 * g:.0f} %" for k in loads
            if (g := fig(by.get((setup, "mix", k)), "chat", "goodput_share")) is not None)
        if missing:
            answer = ("cannot tell: no chat ITL in the mix or its baseline at "
                      + ", ".join(f"{k:g}×C" for k in missing))
            if over:
                answer += "; above the bound at " + ", ".join(f"{k:g}×C" for k in over)
        elif over:
            answer = "**no**: above the bound at " + ", ".join(f"{k:g}×C" for k in over)
        else:
            answer = "**yes**, at every load"
        lines.append(f"- {SETUP_NAMES.get(setup, setup)}: {answer}. Mix ÷ chat-only chat ITL "
                     f"p99: {shown}. Chat goodput in the mix (share of chat offered): "
                     f"{good or NONE}.")
    lines += ["", "A setup that refuses most chat requests keeps the ITL of the few it admits "
              "low cheaply: read each ratio with the chat goodput beside it."]
    return lines


def tables_md(summary):
    runs = summary["runs"]
    by = by_key(runs)
    loads = sorted({r["load"] for r in runs})
    setups = [s for s in SETUPS if any(r["setup"] == s for r in runs)]
    lines = []
    for setup in setups:
        lines += [f"## {SETUP_NAMES.get(setup, setup)}: the mix", ""]
        lines += mix_table(by, setup, loads)
        lines += ["", f"### {setup}: chat alone (the baseline runs)", ""]
        lines += chat_only_table(by, setup, loads)
        lines.append("")
    lines += verdict(by, setups, loads)
    lines += ["", "## Runs", ""]
    lines += runs_table(runs)
    return lines


def notes_md(a):
    return [
        "## What the columns mean", "",
        f"- Figures over the requests that arrived in [{a.warmup:g} s, {a.duration:g} s) of "
        "each run; latencies from the scheduled arrival (open loop). TTFT p99 with ≥: some "
        "admitted streams had no first token by the run's end (counted at their wait so far).",
        f"- ITL: the gaps between consecutive content events of a stream as the client read "
        f"them, every gap whose token came in [{a.warmup:g} s, {a.duration:g} s), of any "
        "request of the class; events read together count a gap of 0 after the first.",
        "- goodput: the window's arrivals that completed ok (200, every token, `[DONE]`), per "
        "second of the window, and as a share of the class's arrivals.",
        "- refused: 429/503/529 answers among the window's arrivals, by the `pool` their JSON "
        "body names (a disaggregated model's refusals name `prefill` or `decode`; "
        "the aggregated model's carry none: unnamed).",
        "- handoffs: `spillway_handoffs_total{model=\"mock-model\"}` at the end of the run, by "
        "outcome: remote (stage 2 with the prefill engine's kv_transfer_params), fallback "
        "(the decode engine prefilled), local (stage 1 skipped, §23.3).",
        "- chat-only run: the chat class alone at (1 − SUM_SHARE) × the mix's rate, on fresh "
        "engines and a fresh Spillway of the same setup.",
        "",
    ]


def config_md(a):
    out = ["## Configurations", ""]
    for name, path in (("disagg", a.disagg_config), ("aggregated", a.aggregated_config)):
        text = metrics.read(path).rstrip()
        if not text:
            continue
        out += [f"{name} (ports are the run's):", "", "```toml", text, "```", ""]
    return out


def plot(runs, setups, loads, path):
    plt = plots.pyplot()
    by = by_key(runs)
    fig_, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    colour = {"disagg": "tab:blue", "aggregated": "tab:red"}

    def series(setup, workload, cls, key):
        xs, ys = [], []
        for k in loads:
            v = fig(by.get((setup, workload, k)), cls, key)
            if v is not None and v > 0:
                xs.append(k)
                ys.append(v * 1000 if key != "goodput_rps" else v)
        return xs, ys

    ax = axes[0]
    for s in setups:
        ax.plot(*series(s, "mix", "chat", "itl_p99"), "o-", color=colour[s], label=f"{s}, mix")
        ax.plot(*series(s, "chat-only", "chat", "itl_p99"), "s--", color=colour[s],
                alpha=0.7, label=f"{s}, chat alone")
    ax.set_title("chat ITL p99")
    ax.set_ylabel("ms")
    ax = axes[1]
    for s in setups:
        ax.plot(*series(s, "mix", "summarise", "ttft_p99"), "o-", color=colour[s], label=s)
    ax.set_title("summarise TTFT p99 (mix)")
    ax.set_ylabel("ms")
    ax = axes[2]
    for s in setups:
        xs = [k for k in loads if (s, "mix", k) in by]
        ax.plot(xs, [by[(s, "mix", k)]["goodput_rps"] for k in xs], "o-", color=colour[s],
                label=f"{s}, all")
        ax.plot(*series(s, "mix", "chat", "goodput_rps"), "^--", color=colour[s], alpha=0.7,
                label=f"{s}, chat")
        ax.plot(*series(s, "mix", "summarise", "goodput_rps"), "v:", color=colour[s],
                alpha=0.7, label=f"{s}, summarise")
    offered = [(k, by[(s, "mix", k)]["offered_rps"]) for k in loads for s in setups[:1]
               if (s, "mix", k) in by]
    if offered:
        ax.plot([k for k, _ in offered], [o for _, o in offered], "x:", color="grey",
                label="offered")
    ax.set_title("goodput (mix)")
    ax.set_ylabel("ok completions / s")
    for i, ax in enumerate(axes):
        ax.set_xlabel("offered load (× C)")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            if i < 2:
                plots.log_y(ax)
            ax.legend(fontsize=7)
    plots.save(fig_, path)


def report(a):
    summary_lines = results.read_jsonl(a.summary)
    runs = [run_figures(s, a) for s in summary_lines]
    loads = sorted({r["load"] for r in runs})
    setups = [s for s in SETUPS if any(r["setup"] == s for r in runs)]
    summary = {
        "c": a.c, "c_sum_per_engine": a.c_sum, "c_chat_per_engine": a.c_chat,
        "c_mix_per_engine": a.c_mix_per_engine, "warmup": a.warmup, "duration": a.duration,
        "drain": a.drain, "itl_limit": ITL_LIMIT,
        "configs": {"disagg": metrics.read(a.disagg_config),
                    "aggregated": metrics.read(a.aggregated_config)},
        "runs": runs,
    }
    results.write_json(a.out_json, summary)
    lines = results.header(a.header)
    lines += config_md(a)
    lines += tables_md(summary)
    lines += [""] + notes_md(a)
    lines += [f"![chat ITL p99, summarise TTFT p99 and goodput against load]"
              f"({os.path.basename(a.out_png)})", ""]
    results.write_md(a.out_md, lines)
    plot(runs, setups, loads, a.out_png)
    print("\n".join(tables_md(summary)))
    return 0


def tables(a):
    print("\n".join(tables_md(results.read_json(a.summary_json))))
    return 0


def main():
    p = argparse.ArgumentParser(prog="report.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("tables")
    q.add_argument("--summary-json", required=True)
    r = sub.add_parser("report")
    for name in ("summary", "header", "disagg-config", "aggregated-config",
                 "out-md", "out-png", "out-json"):
        r.add_argument("--" + name, required=True)
    for name in ("c", "c-sum", "c-chat", "c-mix-per-engine", "warmup", "duration", "drain"):
        r.add_argument("--" + name, type=float, required=True)
    a = p.parse_args()
    return tables(a) if a.cmd == "tables" else report(a)


if __name__ == "__main__":
    sys.exit(main())

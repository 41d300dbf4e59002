#!/usr/bin/env python3
"""Faults benchmark: the report (bench/faults/run.sh).

  report.py report --summary S --header H ...   writes faults.md, faults.png, faults-summary.json
  report.py tables --summary-json J             prints faults.md's tables from its summary

Per run (one setup, one scenario): every request's outcome from spillbench.loadgen's
records; a client-visible error is anything but a complete stream (an error status, a
broken stream, a connect error, the client's timeout). TTFT is the time from the request's
scheduled start to its first SSE event with content (the mock sends its first data event
with the first token), over every request that got one.
"""

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import metrics, plot as plots, results  # noqa: E402
from spillbench.markdown import NONE, fmt, ms, row  # noqa: E402
from spillbench.stats import pct  # noqa: E402

SETUPS = {"spillway-rr": "Spillway round-robin", "spillway-ll": "Spillway least-loaded",
          "haproxy": "HAProxy"}
SCENARIOS = {"fail": "fail (500 at once)", "hang": "hang", "kill": "killed, restarted",
             "flap": "flap"}
WINDOW_S = 5
SLOW_S = 1.0  # a complete stream that took longer than this counts as slow


def kind(r):
    """What the client got instead of a complete stream."""
    if r["outcome"] in ("timeout", "cut"):
        return "client timeout" if r["outcome"] == "timeout" else "no answer by the end"
    if r.get("status", 200) != 200:
        return str(r["status"])
    why = r.get("why", "?")
    return "broken stream" if why.startswith("done=") else why


def analyse(run):
    """One run's figures, per-second series and 5-second windows (times from the load's t0)."""
    meta, recs = results.load_run(run["file"])
    with open(run["events"]) as f:
        events = [(name, round(float(t) - meta["t0_unix"], 3))
                  for name, t in (line.split() for line in f if line.strip())]
    errors = [r for r in recs if r["outcome"] != "ok"]
    duration = int(meta["duration"])
    problems = metrics.log_problems(run["log"], r"WARN|ERROR|ALERT|panic")

    def started(lo, hi):
        return [r for r in recs if lo <= r["sched"] < hi]

    series = []
    for s in range(duration):
        rs = started(s, s + 1)
        series.append({"t": s, "n": len(rs), "errors": sum(r["outcome"] != "ok" for r in rs),
                       "ttft_p99": pct([r["ttft"] for r in rs if "ttft" in r], 99)})
    return {
        "setup": run["setup"], "scenario": run["scenario"], "events": events,
        "proxy_alive": run["proxy_alive"], "requests": len(recs), "errors": len(errors),
        "error_kinds": dict(Counter(kind(r) for r in errors).most_common()),
        "slow": sum(r["outcome"] == "ok" and r["end"] - r["sched"] > SLOW_S for r in recs),
        "ttft_p50": pct([r["ttft"] for r in recs if "ttft" in r], 50),
        "ttft_p99": pct([r["ttft"] for r in recs if "ttft" in r], 99),
        "longest": max((r.get("end", meta["wall_s"]) - r["sched"] for r in recs), default=None),
        "last_error": max((r["sched"] for r in errors), default=None),
        "windows": [sum(r["outcome"] != "ok" for r in started(lo, lo + WINDOW_S))
                    for lo in range(0, duration, WINDOW_S)],
        "series": series, "loadgen_cpu": meta["cpu_share"],
        "log_lines": len(problems), "log_first": [l if len(l) <= 240 else l[:239] + "…" for l in problems[:3]],
    }


def ordered(runs):
    key = {(s, c): (i, j) for i, c in enumerate(SCENARIOS) for j, s in enumerate(SETUPS)}
    return sorted(runs, key=lambda r: key.get((r["setup"], r["scenario"]), (99, 99)))


def tables(summary):
    """faults.md's tables: errors and latency per run, then errors per 5 s window."""
    runs = ordered(summary["runs"])
    md = ["| scenario | proxy | requests | client-visible errors | what the client got "
          f"| complete but > {SLOW_S:g} s | TTFT p50 ms | TTFT p99 ms | longest request s "
          "| last error at s |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        got = ", ".join(f"{k} ×{n}" for k, n in r["error_kinds"].items()) or NONE
        md.append(row([SCENARIOS[r["scenario"]], SETUPS[r["setup"]], r["requests"],
                       f"{r['errors']} ({100 * r['errors'] / max(r['requests'], 1):.1f} %)",
                       got, r["slow"], ms(r["ttft_p50"]), ms(r["ttft_p99"]),
                       fmt(r["longest"], ".2f"), fmt(r["last_error"], ".1f")]))
    width = summary["window_s"]
    spans = [f"{lo}–{lo + width} s" for lo in range(0, summary["duration"], width)]
    md += ["", "| scenario | proxy | " + " | ".join(spans) + " |",
           "|---|---|" + "---|" * len(spans)]
    for r in runs:
        md.append(row([SCENARIOS[r["scenario"]], SETUPS[r["setup"]]] + r["windows"]))
    return md


def reading(summary):
    """One line per scenario: each proxy's share of errors."""
    out = []
    for c, name in SCENARIOS.items():
        rs = [r for r in ordered(summary["runs"]) if r["scenario"] == c]
        if rs:
            out.append(f"- **{name}**: " + "; ".join(
                f"{SETUPS[r['setup']]} {100 * r['errors'] / max(r['requests'], 1):.1f} % errors"
                + (f" and {r['slow']} complete streams over {SLOW_S:g} s" if r["slow"] else "")
                + f", longest request {fmt(r['longest'], '.1f')} s" for r in rs) + ".")
    return out


def plot(summary, path):
    plt = plots.pyplot()
    scenarios = [c for c in SCENARIOS if any(r["scenario"] == c for r in summary["runs"])]
    fig, axes = plt.subplots(len(scenarios), 2, figsize=(12, 2.6 * len(scenarios)),
                             squeeze=False, sharex=True)
    for (ax_err, ax_ttft), c in zip(axes, scenarios):
        for r in ordered(summary["runs"]):
            if r["scenario"] != c:
                continue
            t = [p["t"] + 0.5 for p in r["series"]]
            ax_err.step(t, [p["errors"] for p in r["series"]], where="mid",
                        label=SETUPS[r["setup"]])
            ax_ttft.plot(t, [1000 * p["ttft_p99"] if p["ttft_p99"] is not None else None
                             for p in r["series"]], label=SETUPS[r["setup"]])
        events = next(r["events"] for r in summary["runs"] if r["scenario"] == c)
        for ax in (ax_err, ax_ttft):
            for _, at in events:
                ax.axvline(at, color="grey", linestyle="--", linewidth=0.8)
        ax_err.set_ylabel("errors / s")
        ax_err.set_title(f"{SCENARIOS[c]}: client-visible errors per second of arrivals",
                         fontsize=9)
        plots.log_y(ax_ttft)
        ax_ttft.set_ylabel("TTFT p99 ms")
        ax_ttft.set_title(f"{SCENARIOS[c]}: TTFT p99 per second of arrivals", fontsize=9)
    axes[0][0].legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("s since the load started (dashed: fault, restart)")
    plots.save(fig, path)


def report(a):
    runs = [analyse(run) for run in results.read_jsonl(a.summary)]
    header = results.header(a.header)
    summary = {"header": header[0], "window_s": WINDOW_S,
               "duration": max(len(r["series"]) for r in runs), "runs": runs}
    results.write_json(a.out_json, summary)
    with open(a.spillway_config) as f, open(a.haproxy_config) as g:
        spillway_toml, haproxy_cfg = f.read().rstrip(), g.read().rstrip()
    md = header + [
        "Four identical mock engines behind each proxy in turn, the same run for each: "
        "open-loop streaming chat completions at a constant rate far under capacity, one "
        "connection per request; engine #1 gets the scenario's fault at FAULT_AT (on the "
        "load's clock: the dashed line in the plot): `fail` (every `/v1/*` request answered "
        "500 at once, `/health` still 200), `hang` (nothing answered, `/health` included), "
        "killed with SIGKILL and restarted on the same port at RESTART_AT (the second dashed "
        "line), `flap` (FLAP_MS healthy, FLAP_MS `fail`, in turn). Each run starts fresh "
        "engines and a fresh proxy.",
        "",
        "A client-visible error is anything but a complete stream: an error status, a broken "
        "stream, a refused or reset connection, or the client's own timeout. TTFT counts from "
        "the request's scheduled start to its first content event, over every request that "
        "got one. \"Last error at\" is the start time of the last request that failed; "
        "windows count the failed requests by start time.",
        "",
        f"![faults]({os.path.basename(a.out_png)})",
        "",
        "## Results",
        "",
    ] + tables(summary) + ["", "## Reading", ""] + reading(summary) + [
        "",
        "## Configurations",
        "",
        "Spillway (round-robin; least-loaded differs in `router_mode` only):",
        "",
        "```toml", spillway_toml, "```",
        "",
        "HAProxy:",
        "",
        "```", haproxy_cfg, "```",
    ]
    md += ["", "## The proxies' logs", "",
           "Warning and error lines each proxy wrote in each run (the first three, shortened):",
           ""]
    for r in ordered(runs):
        md.append(f"- {SCENARIOS[r['scenario']]}, {SETUPS[r['setup']]}: {r['log_lines']}"
                  + "".join(f"\n  - `{l}`" for l in r["log_first"]))
    dead = [f"{r['setup']}/{r['scenario']}" for r in runs if r["proxy_alive"] != "yes"]
    if dead:
        md += ["", f"**The proxy had exited by the end of: {', '.join(dead)}.**"]
    results.write_md(a.out_md, md)
    plot(summary, a.out_png)
    return 0


def main():
    p = argparse.ArgumentParser(prog="report.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("tables")
    q.add_argument("--summary-json", required=True)
    r = sub.add_parser("report")
    for name in ("summary", "header", "spillway-config", "haproxy-config", "out-md", "out-png",
                 "out-json"):
        r.add_argument("--" + name, required=True)
    a = p.parse_args()
    if a.cmd == "tables":
        print("\n".join(tables(results.read_json(a.summary_json))))
        return 0
    return report(a)


if __name__ == "__main__":
    sys.exit(main())

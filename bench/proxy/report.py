#!/usr/bin/env python3
"""Proxy benchmark report: parses wrk / wrk2 / oha outputs, takes medians over rounds,
writes the Markdown table, the raw per-run table and the p99-vs-rate plot.

  report.py --raw RAW --header H ... --out-md proxy.md --out-raw proxy-raw.tsv ...
      (bench/proxy/run.sh: RAW lists the runs and their tools' output files)
  report.py tables --runs results/proxy-raw.tsv
      the tables of proxy.md again, from the per-run table it wrote
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import metrics, plot as plots, results  # noqa: E402
from spillbench.markdown import UNKNOWN, fmt_us  # noqa: E402
from spillbench.stats import median as med  # noqa: E402
from spillbench.wrk import parse  # noqa: E402

TARGETS = ["direct", "spillway", "spillway-base", "forwarder", "nginx", "haproxy"]
# bench/forward: the io_uring floor Spillway's CPU per request is compared with.
FLOOR = "forwarder"
# The per-run table (--out-raw): what the medians are taken over. `elapsed` (the tool's
# own duration) and `wall_s` (the script's) came later, and so did rps to 9 significant
# digits (it had 6): a table without them regenerates every figure but the achieved rates,
# the peak's CPU busy share and a peak rate whose 6 digits end in .5 (its rounding to a
# whole number is not determined).
RAW_COLS = ["round", "target", "kind", "rate", "tool", "requests", "ok", "non2xx", "sock_errors",
            "rps", "p50", "p90", "p99", "p99.9", "ticks", "cpu_us_per_req", "elapsed", "wall_s"]
QUANTILES = ("p50", "p90", "p99", "p99.9")


def cpu_per_request(r, clk_tck):
    return (r["ticks"] / clk_tck / r["ok"] * 1e6) if (r["target"] != "direct" and r["ok"]) else None


def load_runs(path, clk_tck):
    """run.sh's list of runs, each with what its tool's output says."""
    runs = []
    for r in results.read_tsv(path):
        r["round"] = int(r["round"])
        r["rate"] = int(r["rate"])
        r["ticks"] = int(r["ticks"])
        r["wall_s"] = float(r["wall_s"])
        r.update(parse(r["tool"], r["file"]))
        r["cpu_us_per_req"] = cpu_per_request(r, clk_tck)
        runs.append(r)
    return runs


def runs_from_table(path, clk_tck):
    """The runs again, from the per-run table the report wrote (RAW_COLS)."""
    runs = []
    for row in results.read_tsv(path):
        num = lambda k, kind=float: None if row.get(k) in ("", None) else kind(row[k])
        r = {"round": int(row["round"]), "target": row["target"], "kind": row["kind"],
             "rate": int(row["rate"]), "tool": row["tool"], "requests": num("requests", int),
             "ok": num("ok", int), "non2xx": num("non2xx", int),
             "sock_errors": num("sock_errors", int), "rps": num("rps"),
             # 6 significant digits ending in .5: the rate's whole number is not determined.
             "rps_unsure": "elapsed" not in row and row["rps"].endswith(".5"),
             "p": {q: num(q) for q in QUANTILES}, "ticks": int(row["ticks"]),
             "elapsed": num("elapsed") if "elapsed" in row else UNKNOWN,
             "wall_s": num("wall_s") if "wall_s" in row else UNKNOWN}
        r["cpu_us_per_req"] = cpu_per_request(r, clk_tck)
        runs.append(r)
    return runs


def per_second(count, seconds):
    """count / seconds; UNKNOWN when the table does not record the seconds."""
    if seconds is UNKNOWN:
        return UNKNOWN
    return count / seconds if seconds else None


def med_known(xs):
    return UNKNOWN if any(x is UNKNOWN for x in xs) else med(xs)


def summarize(runs, targets, rates, clk_tck):
    def sel(t, kind, rate=0):
        return [r for r in runs if r["target"] == t and r["kind"] == kind and r["rate"] == rate]

    summary = {}
    for t in targets:
        peaks = [r.get("rps") for r in sel(t, "peak") if r.get("rps")]
        unsure = {r["rps"] for r in sel(t, "peak") if r.get("rps_unsure")}
        s = {"peak_rps": med(peaks), "peak_unsure": unsure,
             "peak_range": (min(peaks), max(peaks)) if peaks else None,
             "peak_cpu": med([r["cpu_us_per_req"] for r in sel(t, "peak")]),
             "peak_busy": med_known([per_second(r["ticks"] / clk_tck, r["wall_s"])
                                     for r in sel(t, "peak") if t != "direct"])}
        for rate in rates:
            rs = sel(t, "rate", rate)
            s[rate] = {
                "p": {q: med([r["p"].get(q) for r in rs]) for q in QUANTILES},
                "cpu": med([r["cpu_us_per_req"] for r in rs]),
                "achieved": med_known([per_second(r["ok"], r.get("elapsed")) for r in rs]),
            }
        summary[t] = s
    return summary


def peak_table(summary, targets, rates):
    head = ("| target | peak req/s (wrk, closed loop) | range over rounds | vs nginx | "
            "proxy CPU busy at peak | CPU µs/req at peak |")
    sep = "|---|---|---|---|---|---|"
    for rate in rates:
        head += f" CPU µs/req @ {rate // 1000}k | vs nginx |"
        sep += "---|---|"
    md = [head, sep]
    ng = summary.get("nginx", {})
    for t in targets:
        s = summary[t]
        busy = s["peak_busy"]
        rps = lambda x: UNKNOWN if x in s["peak_unsure"] else f"{x:.0f}"
        line = f"| {t} | {rps(s['peak_rps'])} |" if s["peak_rps"] else f"| {t} | – |"
        lo_hi = s["peak_range"]
        line += (" – |" if not lo_hi else f" {UNKNOWN} |" if set(lo_hi) & s["peak_unsure"]
                 else f" {lo_hi[0]:.0f}–{lo_hi[1]:.0f} |")
        line += (f" {s['peak_rps'] / ng['peak_rps']:.2f} |" if ng.get("peak_rps") and s["peak_rps"] else " – |")
        line += (f" {busy} |" if busy is UNKNOWN else
                 f" {100 * busy:.0f} % |" if busy is not None else " – |")
        line += (f" {s['peak_cpu']:.1f} |" if s["peak_cpu"] is not None else " – |")
        for rate in rates:
            c = s[rate]["cpu"]
            cn = ng.get(rate, {}).get("cpu")
            line += f" {c:.1f} |" if c is not None else " – |"
            line += f" {c / cn:.2f} |" if (c is not None and cn) else " – |"
        md.append(line)
    return md


def floor_table(summary, targets, rates):
    """Spillway's (and spillway-base's) CPU per request over the forwarder's; empty when
    the forwarder did not run."""
    fl = summary.get(FLOOR)
    rows = [t for t in targets if t.startswith("spillway")]
    if not fl or not rows:
        return []
    ratio = lambda c, f: f"{c / f:.2f}" if (c is not None and f) else "–"
    md = ["| CPU per request ÷ forwarder's | at peak |"
          + "".join(f" @ {rate // 1000}k |" for rate in rates),
          "|---|---|" + "---|" * len(rates)]
    for t in rows:
        s = summary[t]
        line = f"| {t} | {ratio(s['peak_cpu'], fl['peak_cpu'])} |"
        line += "".join(f" {ratio(s[rate]['cpu'], fl[rate]['cpu'])} |" for rate in rates)
        md.append(line)
    return md


def latency_table(summary, targets, rates):
    md = ["| target | rate | achieved req/s | p50 | p90 | p99 | p99.9 | p99 vs nginx |",
          "|---|---|---|---|---|---|---|---|"]
    ng = summary.get("nginx", {})
    for rate in rates:
        for t in targets:
            s = summary[t][rate]
            p = s["p"]
            pn = ng.get(rate, {}).get("p", {}).get("p99")
            ratio = f"{p['p99'] / pn:.2f}" if (p["p99"] and pn) else "–"
            ach = s["achieved"] if s["achieved"] is UNKNOWN else (
                f"{s['achieved']:.0f}" if s["achieved"] else "–")
            md.append(f"| {t} | {rate} | {ach} | {fmt_us(p['p50'])} | {fmt_us(p['p90'])} | "
                      f"{fmt_us(p['p99'])} | {fmt_us(p['p99.9'])} | {ratio} |")
    return md


def layout(runs):
    rounds = max(r["round"] for r in runs)
    targets = [t for t in TARGETS if any(r["target"] == t for r in runs)]
    rates = sorted({r["rate"] for r in runs if r["kind"] == "rate"})
    rate_tool = next((r["tool"] for r in runs if r["kind"] == "rate"), "?")
    return rounds, targets, rates, rate_tool


def write_runs(path, runs):
    """The per-run table (RAW_COLS): floats to 6 significant digits, rates and seconds to 9."""
    with open(path, "w") as f:
        f.write("\t".join(RAW_COLS) + "\n")
        for r in runs:
            vals = []
            for c in RAW_COLS:
                v = r["p"].get(c) if c in QUANTILES else r.get(c)
                spec = ".9g" if c in ("rps", "elapsed", "wall_s") else ".6g"
                vals.append("" if v is None else (f"{v:{spec}}" if isinstance(v, float) else str(v)))
            f.write("\t".join(vals) + "\n")


def tables(a):
    runs = runs_from_table(a.runs, a.clk_tck)
    _, targets, rates, _ = layout(runs)
    summary = summarize(runs, targets, rates, a.clk_tck)
    floor = floor_table(summary, targets, rates)
    print("\n".join(peak_table(summary, targets, rates) + [""] + (floor + [""] if floor else [])
                    + latency_table(summary, targets, rates)))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "tables":
        q = argparse.ArgumentParser(prog="report.py tables")
        q.add_argument("--runs", required=True, help="the per-run table (results/proxy-raw.tsv)")
        q.add_argument("--clk-tck", type=float, default=100)
        return tables(q.parse_args(sys.argv[2:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--header", required=True)
    ap.add_argument("--clk-tck", type=float, default=100)
    ap.add_argument("--metrics")
    ap.add_argument("--spillway-log")
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--out-png", required=True)
    ap.add_argument("--out-raw", required=True)
    a = ap.parse_args()

    runs = load_runs(a.raw, a.clk_tck)
    rounds, targets, rates, rate_tool = layout(runs)
    summary = summarize(runs, targets, rates, a.clk_tck)

    md = results.header(a.header)
    md.append(f"Medians over {rounds} rounds; targets interleaved within each round "
              f"({', '.join(targets)}, then the next round).")
    md.append("")
    md.append("## Peak throughput and proxy CPU per request")
    md.append("")
    md += peak_table(summary, targets, rates)
    md.append("")
    md.append(f"CPU µs/req: the proxy's utime+stime (all processes and threads, /proc/PID/stat) over "
              f"a constant-rate run divided by the 200 responses in it (clock tick "
              f"{1e6 / a.clk_tck:.0f} µs). At peak a proxy "
              f"whose busy column (CPU seconds per wall second) is near 100 % is CPU-bound, so "
              f"its figure is its own CPU cost per request at full load; well below that, CPU 1 "
              f"(the origin and wrk) was the limit and the proxy idled between batches. The "
              f"direct row is the ceiling set by CPU 1.")
    md.append("")
    floor = floor_table(summary, targets, rates)
    if floor:
        md.append("Against the io_uring floor (`forwarder`, bench/forward: the same ring, no "
                  "proxy logic), from the medians above:")
        md.append("")
        md += floor + [""]
    md.append(f"## Latency at constant rate ({rate_tool}"
              f"{' -q RATE --latency-correction' if rate_tool == 'oha' else ' -R RATE'}, "
              f"coordinated-omission corrected)")
    md.append("")
    md += latency_table(summary, targets, rates)
    md.append("")
    md.append("Latencies in µs unless marked ms.")
    md.append("")

    # Errors and health.
    md.append("## Errors")
    md.append("")
    bad = [r for r in runs if r.get("non2xx") or r.get("sock_errors") or r.get("error")]
    if bad:
        for r in bad:
            md.append(f"- round {r['round']} {r['target']} {r['kind']} {r['rate'] or ''}: "
                      f"non-2xx {r.get('non2xx')}, socket errors {r.get('sock_errors')}"
                      f"{', ' + r['error'] if r.get('error') else ''}")
    else:
        md.append("- None: every response was a 200, no socket errors.")
    if a.metrics:
        try:
            lines = [l for l in open(a.metrics).read().splitlines()
                     if l.startswith("dynamo_frontend_requests_total{")]
            if lines:
                md.append("- Spillway's own count after the runs: " + "; ".join(
                    re.sub(r"^dynamo_frontend_requests_total", "", l) for l in lines)
                    + ". (`cancelled`: requests in flight when oha's `-z` deadline closed "
                    "its connections; oha reports them as aborted, not as errors.)")
        except OSError:
            pass
    if a.spillway_log:
        md += metrics.log_summary(a.spillway_log)
    md.append("")

    md += [
        "## Caveats",
        "",
        "- Shared machine: 2 vCPUs that other engineers' builds and tests also used during the "
        "run (load average in the header). Every benchmark process ran at nice −10. The CPU time "
        "per request is the stable figure; latency tails (p99.9 near 2 ms for every proxy, nginx "
        "included) carry the scheduler's time slices.",
        f"- Constant-rate client: {rate_tool}" + (" (wrk2 is not installable here)" if rate_tool == "oha" else "")
        + "; it shares CPU 1 with the origin, so the direct row is this setup's floor, not zero.",
        "- One core per proxy. Spillway's monitor thread is pinned to the same CPU and its time "
        "is included in Spillway's CPU figures.",
        f"- CPU times come in clock ticks of {1e6 / a.clk_tck:.0f} µs; a run at 2k req/s "
        "accumulates about 45–60 ticks, so the 2k column is good to a few percent only.",
        "",
    ]
    results.write_md(a.out_md, md)
    write_runs(a.out_raw, runs)  # the medians' inputs

    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for t, style in zip(TARGETS, ["k--o", "g-o", "g:x", "m-.d", "b-s", "r-^"]):
        if t not in summary:
            continue
        ys = [summary[t][r]["p"]["p99"] for r in rates]
        xs = [r for r, y in zip(rates, ys) if y]
        ax.plot(xs, [y * 1e6 for y in ys if y], style, label=t)
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("p99 latency (µs, log)")
    ax.set_yscale("log")
    ax.set_title(f"p99 latency vs rate ({rate_tool}, median of {rounds} rounds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    plots.save(fig, a.out_png)
    print("\n".join(md))


if __name__ == "__main__":
    main()

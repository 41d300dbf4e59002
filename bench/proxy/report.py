#!/usr/bin/env python3
"""Proxy benchmark report: parses wrk / wrk2 / oha outputs, takes medians over rounds,
writes the Markdown table, the raw per-run table and the p99-vs-rate plot."""

import argparse
import json
import re
import statistics

TARGETS = ["direct", "spillway", "spillway-base", "nginx", "haproxy"]
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def dur(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def parse_wrk(text):
    """wrk and wrk2 text output: requests, rps, percentiles, non-2xx and socket errors."""
    out = {"p": {}}
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", text)
    if m:
        out["requests"] = int(m.group(1))
        out["elapsed"] = float(m.group(2)) * UNITS[m.group(3)]
    m = re.search(r"Requests/sec:\s*([\d.]+)", text)
    if m:
        out["rps"] = float(m.group(1))
    # wrk: "     50%    1.23ms"; wrk2: " 50.000%    1.23ms" (the first block is the recorded one).
    for m in re.finditer(r"^\s*(\d+(?:\.\d+)?)%\s+([\d.]+(?:us|ms|s|m))\s*$", text, re.M):
        q = float(m.group(1))
        key = {50.0: "p50", 90.0: "p90", 99.0: "p99", 99.9: "p99.9"}.get(q)
        if key and key not in out["p"]:
            out["p"][key] = dur(m.group(2))
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    out["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["sock_errors"] = sum(int(x) for x in m.groups()) if m else 0
    out["ok"] = out.get("requests", 0) - out["non2xx"]
    return out


def parse_oha(text):
    j = json.loads(text)
    s = j["summary"]
    lp = j.get("latencyPercentiles", {})
    codes = {int(k): v for k, v in j.get("statusCodeDistribution", {}).items()}
    # Requests still in flight when -z ends are aborted by oha itself: not errors.
    errors = sum(v for k, v in j.get("errorDistribution", {}).items() if "deadline" not in k)
    total = sum(codes.values())
    return {
        "requests": total,
        "ok": codes.get(200, 0),
        "non2xx": total - codes.get(200, 0),
        "sock_errors": errors,
        "elapsed": s.get("total"),
        "rps": s.get("requestsPerSec"),
        "p": {k: lp.get(k) for k in ("p50", "p90", "p99", "p99.9")},
    }


def parse(tool, path):
    try:
        text = open(path).read()
        return parse_oha(text) if tool == "oha" else parse_wrk(text)
    except (OSError, ValueError, KeyError) as e:
        return {"error": f"{type(e).__name__}: {e}", "p": {}, "ok": 0, "requests": 0,
                "non2xx": 0, "sock_errors": 0}


def spillway_log_lines(path):
    """The report's line on Spillway's log: how many warning/error lines, and one of them."""
    try:
        probs = [l for l in open(path, errors="replace").read().splitlines()
                 if re.search(r"WARN|ERROR|panic", l)]
    except OSError:
        return []
    return [f"- Spillway log: {len(probs)} warning/error lines"
            + (f", e.g. `{probs[0][-200:]}`" if probs else ".")]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt_us(x):
    return "–" if x is None else (f"{x * 1e6:.0f}" if x < 1e-3 else f"{x * 1e3:.2f} ms")


def main():
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

    runs = []
    with open(a.raw) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(header, line.rstrip("\n").split("\t")))
            r["round"] = int(r["round"])
            r["rate"] = int(r["rate"])
            r["ticks"] = int(r["ticks"])
            r["wall_s"] = float(r["wall_s"])
            r.update(parse(r["tool"], r["file"]))
            cpu_s = r["ticks"] / a.clk_tck
            r["cpu_us_per_req"] = (cpu_s / r["ok"] * 1e6) if (r["target"] != "direct" and r["ok"]) else None
            runs.append(r)
    rounds = max(r["round"] for r in runs)
    targets = [t for t in TARGETS if any(r["target"] == t for r in runs)]
    rates = sorted({r["rate"] for r in runs if r["kind"] == "rate"})
    rate_tool = next((r["tool"] for r in runs if r["kind"] == "rate"), "?")

    def sel(t, kind, rate=0):
        return [r for r in runs if r["target"] == t and r["kind"] == kind and r["rate"] == rate]

    summary = {}
    for t in targets:
        peaks = [r.get("rps") for r in sel(t, "peak") if r.get("rps")]
        s = {"peak_rps": med(peaks),
             "peak_range": (min(peaks), max(peaks)) if peaks else None,
             "peak_cpu": med([r["cpu_us_per_req"] for r in sel(t, "peak")]),
             "peak_busy": med([r["ticks"] / a.clk_tck / r["wall_s"] for r in sel(t, "peak")
                               if t != "direct"])}
        for rate in rates:
            rs = sel(t, "rate", rate)
            s[rate] = {
                "p": {q: med([r["p"].get(q) for r in rs]) for q in ("p50", "p90", "p99", "p99.9")},
                "cpu": med([r["cpu_us_per_req"] for r in rs]),
                "achieved": med([(r["ok"] / r["elapsed"]) if r.get("elapsed") else None for r in rs]),
            }
        summary[t] = s

    md = [open(a.header).read().rstrip(), ""]
    md.append(f"Medians over {rounds} rounds; targets interleaved within each round "
              f"(direct, spillway, nginx, haproxy, then the next round).")
    md.append("")
    md.append("## Peak throughput and proxy CPU per request")
    md.append("")
    head = ("| target | peak req/s (wrk, closed loop) | range over rounds | vs nginx | "
            "proxy CPU busy at peak | CPU µs/req at peak |")
    sep = "|---|---|---|---|---|---|"
    for rate in rates:
        head += f" CPU µs/req @ {rate // 1000}k | vs nginx |"
        sep += "---|---|"
    md += [head, sep]
    ng = summary.get("nginx", {})
    for t in targets:
        s = summary[t]
        line = f"| {t} | {s['peak_rps']:.0f} |" if s["peak_rps"] else f"| {t} | – |"
        line += (f" {s['peak_range'][0]:.0f}–{s['peak_range'][1]:.0f} |" if s["peak_range"] else " – |")
        line += (f" {s['peak_rps'] / ng['peak_rps']:.2f} |" if ng.get("peak_rps") and s["peak_rps"] else " – |")
        line += (f" {100 * s['peak_busy']:.0f} % |" if s["peak_busy"] is not None else " – |")
        line += (f" {s['peak_cpu']:.1f} |" if s["peak_cpu"] is not None else " – |")
        for rate in rates:
            c = s[rate]["cpu"]
            cn = ng.get(rate, {}).get("cpu")
            line += f" {c:.1f} |" if c is not None else " – |"
            line += f" {c / cn:.2f} |" if (c is not None and cn) else " – |"
        md.append(line)
    md.append("")
    md.append(f"CPU µs/req: the proxy's utime+stime (all processes and threads, /proc/PID/stat) over "
              f"a constant-rate run divided by the 200 responses in it (clock tick "
              f"{1e6 / a.clk_tck:.0f} µs). At peak every "
              f"proxy keeps CPU 0 busy (the busy column: CPU seconds per wall second), so its "
              f"peak is its own CPU cost per request at full load; the direct row is the ceiling "
              f"set by CPU 1, which runs the origin and wrk.")
    md.append("")
    md.append(f"## Latency at constant rate ({rate_tool}"
              f"{' -q RATE --latency-correction' if rate_tool == 'oha' else ' -R RATE'}, "
              f"coordinated-omission corrected)")
    md.append("")
    md.append("| target | rate | achieved req/s | p50 | p90 | p99 | p99.9 | p99 vs nginx |")
    md.append("|---|---|---|---|---|---|---|---|")
    for rate in rates:
        for t in targets:
            s = summary[t][rate]
            p = s["p"]
            pn = ng.get(rate, {}).get("p", {}).get("p99")
            ratio = f"{p['p99'] / pn:.2f}" if (p["p99"] and pn) else "–"
            ach = f"{s['achieved']:.0f}" if s["achieved"] else "–"
            md.append(f"| {t} | {rate} | {ach} | {fmt_us(p['p50'])} | {fmt_us(p['p90'])} | "
                      f"{fmt_us(p['p99'])} | {fmt_us(p['p99.9'])} | {ratio} |")
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
        md += spillway_log_lines(a.spillway_log)
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
    with open(a.out_md, "w") as f:
        f.write("\n".join(md) + "\n")

    # Raw per-run table (the medians' inputs).
    cols = ["round", "target", "kind", "rate", "tool", "requests", "ok", "non2xx", "sock_errors",
            "rps", "p50", "p90", "p99", "p99.9", "ticks", "cpu_us_per_req"]
    with open(a.out_raw, "w") as f:
        f.write("\t".join(cols) + "\n")
        for r in runs:
            vals = []
            for c in cols:
                v = r["p"].get(c) if c.startswith("p") and c in ("p50", "p90", "p99", "p99.9") else r.get(c)
                vals.append("" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v)))
            f.write("\t".join(vals) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for t, style in zip(TARGETS, ["k--o", "g-o", "g:x", "b-s", "r-^"]):
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
    fig.tight_layout()
    fig.savefig(a.out_png, dpi=110)
    print("\n".join(md))


if __name__ == "__main__":
    main()

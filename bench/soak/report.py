#!/usr/bin/env python3
"""Soak sampler and report.

  report.py sample --pid PID --admin-port PORT --interval S --out samples.csv
      Every S seconds until PID exits (or SIGTERM): the process's RSS (VmRSS), open fds
      (/proc/PID/fd), threads, CPU ticks (utime + stime) and, from its admin /metrics, the
      requests answered by outcome, open client connections and a few counters.

  report.py report --csv samples.csv --traffic traffic.json ... --out-md soak.md --out-png soak.png
      The table of samples at start, 25 %, 50 %, 75 % and end; RSS and fds after the
      warm-up (least-squares slope, first against last); the plot of RSS, fds and CPU.
"""

import argparse
import csv
import json
import os
import re
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import plot as plots, results  # noqa: E402
from spillbench.stats import slope  # noqa: E402
from spillbench.wrk import parse_wrk  # noqa: E402

COLUMNS = [
    "t_s", "rss_kb", "fds", "threads", "cpu_ticks", "cpu_pct", "conns_active",
    "req_success", "req_overload", "req_unavailable", "req_cancelled", "req_other",
    "client_disconnects", "upstream_connects", "connections_total", "reloads_ok",
]


def proc_stats(pid):
    rss = threads = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the ")" that ends comm: state is field 3 of stat, utime 14, stime 15.
    ticks = int(fields[11]) + int(fields[12])
    return rss, fds, threads, ticks


SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape(port):
    """Sums of the series the soak follows, from the admin /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
    out = {c: 0.0 for c in COLUMNS[6:]}
    simple = {
        "spillway_connections_active": "conns_active",
        "spillway_client_disconnects_total": "client_disconnects",
        "spillway_upstream_connects_total": "upstream_connects",
        "spillway_connections_total": "connections_total",
    }
    for line in text.splitlines():
        m = SERIES.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name in simple:
            out[simple[name]] += value
        elif name == "spillway_config_reloads_total" and 'result="ok"' in labels:
            out["reloads_ok"] += value
        elif name == "dynamo_frontend_requests_total":
            kind = re.search(r'error_type="([^"]*)"', labels).group(1)
            col = {"": "req_success", "overload": "req_overload",
                   "unavailable": "req_unavailable", "cancelled": "req_cancelled"}.get(kind, "req_other")
            out[col] += value
    return out


def sample(args):
    clk = os.sysconf("SC_CLK_TCK")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        t0 = time.monotonic()
        prev = None
        k = 0
        while not stop:
            now = time.monotonic()
            try:
                rss, fds, threads, ticks = proc_stats(args.pid)
            except (OSError, ValueError, IndexError):
                print(f"[sampler] process {args.pid} is gone", file=sys.stderr)
                break
            try:
                m = scrape(args.admin_port)
            except Exception as e:  # noqa: BLE001  (a missed scrape leaves the row's metrics empty)
                print(f"[sampler] /metrics: {e}", file=sys.stderr)
                m = {c: "" for c in COLUMNS[6:]}
            cpu = ""
            if prev is not None:
                cpu = f"{100.0 * (ticks - prev[1]) / clk / max(now - prev[0], 1e-9):.1f}"
            prev = (now, ticks)
            row = [f"{now - t0:.1f}", rss, fds, threads, ticks, cpu]
            row += [("" if m[c] == "" else int(m[c])) for c in COLUMNS[6:]]
            w.writerow(row)
            f.flush()
            k += 1
            delay = t0 + k * args.interval - time.monotonic()
            while delay > 0 and not stop:
                time.sleep(min(delay, 0.2))
                delay = t0 + k * args.interval - time.monotonic()


def load_rows(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append({k: (float(v) if v not in ("", None) else None) for k, v in r.items()})
    return rows


def nearest(rows, t):
    return min(rows, key=lambda r: abs(r["t_s"] - t))


def flatness(rows, key, warm, end, tolerance):
    """Over the samples in [warm, end]: the means of the first and of the last tenth (at
    least 3 samples each, so one busy moment does not decide), min, max, the least-squares
    slope per minute and the drift it makes over the window; flat when both the first-to-
    last change and the drift are within `tolerance(first)`."""
    sel = [r for r in rows if warm <= r["t_s"] <= end and r[key] is not None]
    if len(sel) < 6:
        return None
    xs = [r["t_s"] for r in sel]
    ys = [r[key] for r in sel]
    k = max(3, len(ys) // 10)
    first, last = sum(ys[:k]) / k, sum(ys[-k:]) / k
    per_min = slope(xs, ys) * 60
    drift = per_min * (xs[-1] - xs[0]) / 60
    flat = abs(last - first) <= tolerance(first) and abs(drift) <= tolerance(first)
    return {"first": first, "last": last, "min": min(ys), "max": max(ys), "k": k,
            "per_min": per_min, "drift": drift, "flat": flat}


def fmt_int(x):
    return "–" if x is None else f"{x:,.0f}"


def fmt_pct(x):
    return "–" if x is None else f"{x:.1f}"


def row_line(name, r):
    return (f"| {name} | {r['t_s']:.0f} | {r['rss_kb'] / 1024:.1f} | {fmt_int(r['fds'])} | "
            f"{fmt_int(r['conns_active'])} | {fmt_int(r['threads'])} | {fmt_pct(r['cpu_pct'])} | "
            f"{fmt_int(r['req_success'])} | {fmt_int(r['req_overload'])} | "
            f"{fmt_int(r['req_unavailable'])} | {fmt_int(r['req_cancelled'])} | {fmt_int(r['req_other'])} |")


def table(rows, start, end):
    out = ["| point | t (s) | RSS (MiB) | fds | open client conns | threads | CPU % | "
           "answered 2xx | refused 529 | refused 503 | cancelled | other errors |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out.append(row_line("idle, before traffic", rows[0]))
    # "start": one interval in, the first sample that saw traffic for a whole interval.
    step = rows[1]["t_s"] - rows[0]["t_s"] if len(rows) > 1 else 0.0
    out.append(row_line("start", nearest(rows, start + step)))
    for name, q in (("25 %", 0.25), ("50 %", 0.5), ("75 %", 0.75), ("end", 1.0)):
        out.append(row_line(name, nearest(rows, start + q * (end - start))))
    out.append(row_line("after cool-down", rows[-1]))
    return out


def flat_lines(rows, warm, end):
    out = []
    checks = (
        ("RSS", "rss_kb", "MiB", 1 / 1024, lambda v: max(2048.0, 0.05 * v), "2 MiB or 5 %, whichever is more"),
        ("Open fds", "fds", "fds", 1, lambda v: max(16.0, 0.1 * v), "16 fds or 10 %, whichever is more"),
    )
    for name, key, unit, scale, tolerance, tol in checks:
        res = flatness(rows, key, warm, end, tolerance)
        if res is None:
            out.append(f"- {name}: too few samples between {warm:.0f} s and {end:.0f} s.")
            continue
        out.append(
            f"- **{name}: {'flat' if res['flat'] else 'NOT flat'}** from {warm:.0f} s to {end:.0f} s: "
            f"{res['first'] * scale:,.1f} → {res['last'] * scale:,.1f} {unit} (means of the first and "
            f"last {res['k']} samples; min {res['min'] * scale:,.1f}, max {res['max'] * scale:,.1f}); "
            f"least-squares slope {res['per_min'] * scale:+,.3f} {unit}/min, "
            f"{res['drift'] * scale:+,.1f} {unit} over the window. Flat means both changes are "
            f"within {tol}.")
    idle, cool = rows[0], rows[-1]
    same = abs(cool["fds"] - idle["fds"]) <= 8
    out.append(
        f"- **Idle before against idle after: {'same' if same else 'DIFFERENT'}.** Before the "
        f"traffic {idle['fds']:.0f} fds and {idle['rss_kb'] / 1024:.1f} MiB; after the cool-down "
        f"{cool['fds']:.0f} fds ({fmt_int(cool['conns_active'])} client connections open) and "
        f"{cool['rss_kb'] / 1024:.1f} MiB (same: within 8 fds; RSS is not expected to return, "
        "as buffers and the allocator's arenas stay at their working size).")
    return out


def traffic_lines(traffic, wrk):
    out = ["| kind | rate (/s) | sent | outcomes |", "|---|---:|---:|---|"]
    for kind, counts in traffic["counts"].items():
        rate = traffic["rates"].get(kind, 0)
        if not rate:
            continue
        total = sum(counts.values())
        outcomes = ", ".join(f"{k}: {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        out.append(f"| {kind} | {rate:g} | {total:,} | {outcomes} |")
    if wrk:
        out.append(f"| keep-alive (wrk2) | {wrk['rate']:g} | {wrk.get('requests', 0):,} | "
                   f"non-2xx: {wrk.get('non2xx', 0):,}, socket errors: {wrk.get('sock_errors', 0):,} |")
    return out


def wrk_summary(path, rate):
    """wrk2's requests and errors (its output file), None when there is none."""
    try:
        text = open(path).read()
    except OSError:
        return None
    w = parse_wrk(text)
    return {"rate": rate, "requests": w.get("requests", 0), "non2xx": w["non2xx"],
            "sock_errors": w["sock_errors"]}


def plot(rows, traffic_start, traffic_end, warm, path):
    plt = plots.pyplot()
    t = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    axes[0].plot(t, [r["rss_kb"] / 1024 for r in rows], color="tab:blue")
    axes[0].set_ylabel("RSS (MiB)")
    axes[0].set_ylim(bottom=0)
    axes[1].plot(t, [r["fds"] for r in rows], color="tab:green", label="open fds")
    axes[1].plot(t, [r["conns_active"] if r["conns_active"] is not None else float("nan") for r in rows],
                 color="tab:olive", label="open client connections", linewidth=0.8)
    axes[1].set_ylabel("count")
    axes[1].set_ylim(bottom=0)
    axes[1].legend(loc="upper right", fontsize=8)
    axes[2].plot(t, [r["cpu_pct"] if r["cpu_pct"] is not None else float("nan") for r in rows],
                 color="tab:red")
    axes[2].set_ylabel("CPU (% of one core)")
    axes[2].set_ylim(bottom=0)
    for key, label, color in (("req_success", "2xx", "tab:blue"), ("req_overload", "529", "tab:orange"),
                              ("req_unavailable", "503", "tab:purple"), ("req_cancelled", "cancelled", "tab:gray")):
        rate = [float("nan")]
        for a, b in zip(rows, rows[1:]):
            ok = a[key] is not None and b[key] is not None
            rate.append((b[key] - a[key]) / (b["t_s"] - a["t_s"]) if ok else float("nan"))
        axes[3].plot(t, rate, label=label, color=color, linewidth=0.9)
    axes[3].set_ylabel("answers / s")
    axes[3].set_xlabel("minutes")
    axes[3].legend(loc="upper right", fontsize=8, ncol=4)
    for ax in axes:
        ax.axvline(traffic_start / 60, color="k", linestyle="-", linewidth=0.5)
        ax.axvline(warm / 60, color="k", linestyle=":", linewidth=0.8)
        ax.axvline(traffic_end / 60, color="k", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    axes[0].set_title("Spillway soak (lines: traffic starts, warm-up ends (dotted), traffic stops (dashed))")
    plots.save(fig, path)


def report(args):
    rows = load_rows(args.csv)
    if not rows:
        sys.exit("no samples")
    traffic = json.load(open(args.traffic)) if args.traffic and os.path.exists(args.traffic) else None
    wrk = wrk_summary(args.wrk, args.wrk_rate) if args.wrk else None
    # The flatness window and the table's "end" stop one interval before the arrivals end:
    # the sample nearest to the end may already see the traffic wind down.
    warm, end = args.warmup, args.traffic_end - args.interval
    lines = results.header(args.header)
    lines += ["## Flatness", ""] + flat_lines(rows, warm, end) + [""]
    lines += ["## Samples", "",
              f"Every {args.interval:g} s ({len(rows)} samples in `{args.csv_name}`): the first, the "
              "samples nearest to each fraction of the traffic phase, and the last, after the "
              "cool-down. CPU % is of one core over the interval before the sample. Request counts "
              "are Spillway's own, cumulative (`dynamo_frontend_requests_total` by `error_type`).", ""]
    lines += table(rows, args.traffic_start, end) + [""]
    if traffic:
        lines += ["## Traffic (client side)", "",
                  f"Open loop, Poisson arrivals per kind, one connection per request (bench/soak/traffic.py), "
                  f"max_tokens {traffic['max_tokens']}; the generator used {traffic['cpu_s']:.0f} s of CPU "
                  f"over {traffic['wall_s']:.0f} s.", ""]
        lines += traffic_lines(traffic, wrk) + [""]
    if args.health:
        lines += ["## Health", "", open(args.health).read().rstrip(), ""]
    results.write_md(args.out_md, lines)
    plot(rows, args.traffic_start, args.traffic_end, warm, args.out_png)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--pid", type=int, required=True)
    s.add_argument("--admin-port", type=int, required=True)
    s.add_argument("--interval", type=float, default=5.0)
    s.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--csv", required=True)
    r.add_argument("--csv-name", default="samples.csv")
    r.add_argument("--traffic")
    r.add_argument("--wrk")
    r.add_argument("--wrk-rate", type=float, default=0)
    r.add_argument("--header", required=True)
    r.add_argument("--health")
    r.add_argument("--interval", type=float, default=5.0)
    r.add_argument("--warmup", type=float, required=True)
    r.add_argument("--traffic-start", type=float, required=True, help="seconds from the first sample")
    r.add_argument("--traffic-end", type=float, required=True,
                   help="seconds from the first sample to the end of the arrivals")
    r.add_argument("--out-md", required=True)
    r.add_argument("--out-png", required=True)
    args = p.parse_args()
    sample(args) if args.cmd == "sample" else report(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Prints criterion's latest results (target/criterion) as one Markdown table per group,
rows in the order they ran. Usage: python3 bench/tables.py [target/criterion]"""

import json
import os
import sys


def fmt_time(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}" if ns / scale < 100 else f"{ns / scale:.0f} {unit}"
    return f"{ns:.3g} ns"


def fmt_rate(per_sec, kind):
    if kind == "Bytes":
        for unit, scale in (("GiB/s", 2**30), ("MiB/s", 2**20), ("KiB/s", 2**10)):
            if per_sec >= scale:
                return f"{per_sec / scale:.2f} {unit}"
        return f"{per_sec:.0f} B/s"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if per_sec >= scale:
            return f"{per_sec / scale:.2f} {unit}elem/s"
    return f"{per_sec:.0f} elem/s"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"
    rows = []
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        e = est.get("slope") or est["mean"]
        ran = os.path.getmtime(os.path.join(dirpath, "estimates.json"))
        rows.append((ran, bench, e))
    rows.sort(key=lambda r: r[0])
    groups = {}
    for _, bench, e in rows:
        groups.setdefault(bench["group_id"], []).append((bench, e))
    for group, items in groups.items():
        print(f"### {group}\n")
        print("| benchmark | time | 95% CI | throughput |")
        print("|---|---:|---:|---:|")
        for bench, e in items:
            name = bench["full_id"][len(group) + 1 :]
            ns = e["point_estimate"]
            ci = e["confidence_interval"]
            tp = bench.get("throughput") or {}
            rate = "–"
            for kind, n in tp.items():
                rate = fmt_rate(n * 1e9 / ns, kind)
            print(
                f"| {name} | {fmt_time(ns)} | {fmt_time(ci['lower_bound'])} – "
                f"{fmt_time(ci['upper_bound'])} | {rate} |"
            )
        print()


if __name__ == "__main__":
    main()

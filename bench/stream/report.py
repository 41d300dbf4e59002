#!/usr/bin/env python3
"""Stream benchmark report: medians over rounds of each target's CPU per stream and per
SSE event and of the inter-token latency it adds, per scenario; the Markdown tables, the
per-run table and the plot.

  report.py --raw RAW --header H --clk-tck 100 --out-md stream.md --out-png stream.png \
      --out-raw stream-raw.tsv        (bench/stream/run.sh)
  report.py --raw results/stream-raw.tsv --clk-tck 100 --out-md -   (the tables again)
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench import plot as plots, results  # noqa: E402
from spillbench.stats import median as med  # noqa: E402

TARGETS = ["direct", "spillway", "spillway-shed", "spillway-log", "nginx", "haproxy", "haproxy-delay"]
LABEL = {
    "direct": "direct (no proxy)",
    "spillway": "Spillway",
    "spillway-shed": "Spillway, shedding on",
    "spillway-log": "Spillway, access log on",
    "nginx": "nginx, proxy_buffering off",
    "haproxy": "HAProxy, http-no-delay",
    "haproxy-delay": "HAProxy, default (merges events)",
}
CLIENT_KEYS = ["requests", "errors", "events", "bytes", "rate", "itl_p50_us", "itl_p90_us",
               "itl_p99_us", "itl_p999_us", "ttft_p50_us", "ttft_p99_us"]


def runs(path, clk_tck):
    out = []
    for r in results.read_tsv(path):
        if r["round"] == "0":
            continue  # the warm-up
        fig = dict(kv.split("=", 1) for kv in r["client"].split())
        run = {"scenario": r["scenario"], "round": int(r["round"]), "target": r["target"],
               "ticks": int(r["ticks"]), "client": r["client"]}
        for k in CLIENT_KEYS:
            run[k] = float(fig.get(k, "nan"))
        cpu_s = run["ticks"] / clk_tck
        proxied = run["target"] != "direct" and run["requests"] > 0
        run["cpu_us_stream"] = cpu_s * 1e6 / run["requests"] if proxied else None
        run["cpu_us_event"] = cpu_s * 1e6 / run["events"] if proxied else None
        out.append(run)
    direct = {(r["scenario"], r["round"]): r for r in out if r["target"] == "direct"}
    for r in out:
        d = direct.get((r["scenario"], r["round"]))
        for q in ("p50", "p99", "p999"):
            k = f"itl_{q}_us"
            r[f"added_{q}"] = r[k] - d[k] if d else None
    return out


def fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def ratio(x, y):
    return "—" if x is None or not y else f"{x / y:.2f}"


def scenario_title(sc):
    tokens, fp = sc.split(":")
    size = "default events (~220 B)" if fp == "0" else f"events with a {fp}-byte fingerprint"
    return f"{tokens} tokens a stream, {size}"


def table(rs, sc):
    lines = [f"### {scenario_title(sc)}", "",
             "| target | streams/s | events/s | CPU µs per stream | per event | vs HAProxy | vs nginx | "
             "ITL p50 / p99 / p99.9 (µs) | added p50 / p99 / p99.9 | CPU µs per stream, per round | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|"]
    m = {}
    for t in TARGETS:
        tr = [r for r in rs if r["scenario"] == sc and r["target"] == t]
        if not tr:
            continue
        pick = lambda k: med([r[k] for r in tr if r[k] is not None]) if any(r[k] is not None for r in tr) else None
        m[t] = {k: pick(k) for k in ("rate", "cpu_us_stream", "cpu_us_event", "itl_p50_us", "itl_p99_us",
                                     "itl_p999_us", "added_p50", "added_p99", "added_p999")}
        m[t]["events_s"] = med([r["events"] / (r["requests"] / r["rate"]) if r["rate"] else 0 for r in tr])
        m[t]["per_round"] = ", ".join(fmt(r["cpu_us_stream"], ".0f") for r in sorted(tr, key=lambda r: r["round"]))
        m[t]["errors"] = int(sum(r["errors"] for r in tr))
    hap = m.get("haproxy", {}).get("cpu_us_stream")
    ngx = m.get("nginx", {}).get("cpu_us_stream")
    for t, v in m.items():
        added = "—" if t == "direct" else f"{fmt(v['added_p50'], '+.0f')} / {fmt(v['added_p99'], '+.0f')} / {fmt(v['added_p999'], '+.0f')}"
        lines.append(
            f"| {LABEL[t]} | {fmt(v['rate'])} | {fmt(v['events_s'], '.0f')} | {fmt(v['cpu_us_stream'])} | "
            f"{fmt(v['cpu_us_event'], '.2f')} | {ratio(v['cpu_us_stream'], hap)} | {ratio(v['cpu_us_stream'], ngx)} | "
            f"{fmt(v['itl_p50_us'], '.0f')} / {fmt(v['itl_p99_us'], '.0f')} / {fmt(v['itl_p999_us'], '.0f')} | "
            f"{added} | {v['per_round'] or '—'} | {v['errors']} |")
    lines.append("")
    return lines, m


def plot(medians, path):
    plt = plots.pyplot()
    scs = list(medians)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    proxies = [t for t in TARGETS if t != "direct" and any(t in medians[s] for s in scs)]
    width = 0.8 / max(1, len(proxies))
    for i, t in enumerate(proxies):
        xs = [j + i * width for j in range(len(scs))]
        axes[0].bar(xs, [medians[s].get(t, {}).get("cpu_us_event") or 0 for s in scs], width, label=LABEL[t])
        # Log scale: an added latency at or below 1 µs (or negative: noise) shows as 1.
        axes[1].bar(xs, [max(1.0, medians[s].get(t, {}).get("added_p99") or 0) for s in scs], width)
    for ax, title in ((axes[0], "proxy CPU µs per SSE event"),
                      (axes[1], "added inter-token latency p99, µs (vs direct; log)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(scs))])
        ax.set_xticklabels([scenario_title(s).replace(", ", "\n") for s in scs], fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    plots.log_y(axes[1])
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(proxies), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--raw", required=True)
    p.add_argument("--header")
    p.add_argument("--clk-tck", type=int, default=100)
    p.add_argument("--out-md", default="-")
    p.add_argument("--out-png")
    p.add_argument("--out-raw")
    a = p.parse_args()
    rs = runs(a.raw, a.clk_tck)
    scs = list(dict.fromkeys(r["scenario"] for r in rs))
    lines, medians = [], {}
    for sc in scs:
        t, m = table(rs, sc)
        lines += t
        medians[sc] = m
    body = "\n".join(lines)
    head = open(a.header).read() if a.header else ""
    text = head + "\n## CPU per streamed request, added inter-token latency (medians over rounds)\n\n" + body
    if a.out_md == "-":
        print(body)
    else:
        with open(a.out_md, "w") as f:
            f.write(text + "\n" + NOTES)
    if a.out_raw:
        with open(a.raw) as src, open(a.out_raw, "w") as dst:
            dst.write(src.read())
    if a.out_png:
        plot(medians, a.out_png)


NOTES = """
## How to read it

- CPU is the proxy's own (utime+stime of all its processes and threads) over the client's
  run, divided by the streams, or the SSE events, the client read to their end. The
  proxies run one at a time; the others sit idle.
- ITL is the gap between an event's arrival at the client and the one before it on the
  same stream; an event that arrived in the same read as the one before counts 0.
  "Added" is the target's percentile less the direct run's in the same round: what the
  proxy adds between tokens, with the engine's own jitter (its 2 ms steps on a shared
  CPU) in both.
- Spillway, shedding on: `active_decode_blocks_threshold` and
  `active_prefill_tokens_threshold` on tracked load (never reached here, so every request
  is admitted), `track_output_blocks` (each event counted into the tracked decode
  blocks), `engine_request_limit = 256`, `request_queue_limit = 16`.
- Spillway, access log on: `[access_log]` JSON lines to a file.
- HAProxy, default: no `option http-no-delay`. HAProxy then holds data back to send fuller
  segments, which merges events: its lower CPU is bought with tens of milliseconds of added
  ITL (`stream-profile-30.md`). "HAProxy, http-no-delay" sends each event as it comes.

## Caveats

- The 2 CPUs are shared with other engineers' builds (the load average is in the header):
  single rounds swing by up to 20 % (the per-round column), the medians less. The p99.9
  column catches their preemptions; read p50 and p99.
"""


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Open-loop load generator for bench/disagg: a mix of long-prompt and long-output requests.

    python3 bench/disagg/loadgen.py --port P --model M --rate R --sum-share 0.3 --out run.jsonl

Built on spillbench.loadgen (bench/lib): its arrivals, the run's end (`finish`), its CPU
accounting (`timed`), metadata line and record format (`run_meta`, `write_run`), its
arguments (`add_run_args`) and request bytes (`build_request`). This file adds the two
request classes and a response reader that keeps what the disaggregation question needs.

Workload: each arrival (Poisson, or constant, at --rate from --seed) is a streaming chat
completion of one of two classes, drawn with its own generator seeded from --seed (so the
arrival times are those of the same seed whatever the share):
  summarise  --sum-prompt-bytes of prompt (the mock counts bytes / 4 as tokens), max_tokens
             --sum-max-tokens: a long prefill and a short answer
  chat       --chat-prompt-bytes of prompt, max_tokens --max-tokens: a short prefill and a
             long answer
with probability --sum-share of summarise (0: chat only, the baseline runs). Each request
goes on its own connection to 127.0.0.1:--port.

Per request (one JSON line each, after the metadata line), besides spillbench.loadgen's
fields (i, sched, lag, status, t_status, ttft, end, tokens, outcome, why):
  class  summarise | chat
  gaps   the inter-token gaps, in seconds: the time between consecutive content events as
         the client read them. Events that arrive in one read get a gap of 0 after the
         first. The k-th gap's event came at sched + ttft + gaps[0] + ... + gaps[k] on the
         run's clock, so a report can keep the gaps of a time window.
  pool   for a refusal (429, 503, 529) whose JSON body names it: "prefill" or "decode"
         (Spillway's disaggregated models, docs/behaviour.md §23.4); "" when the body has
         an empty pool; absent when it has none.
Outcomes as spillbench.loadgen's: ok (200, max_tokens content events of its class, and
`data: [DONE]`), rejected (429/503/529), error, timeout, cut.
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench.http import Stream, content_length, is_chunked  # noqa: E402
from spillbench.loadgen import (  # noqa: E402
    add_run_args, arrivals, build_request, finish, run_meta, sleep_until, timed, write_run)

REFUSALS = (429, 503, 529)
BODY_MAX = 65536  # a refusal body longer than this is not read


def find_pool(obj):
    """The first `pool` member of a JSON value (at any depth); None when there is none."""
    if isinstance(obj, dict):
        if isinstance(obj.get("pool"), str):
            return obj["pool"]
        for v in obj.values():
            p = find_pool(v)
            if p is not None:
                return p
    elif isinstance(obj, list):
        for v in obj:
            p = find_pool(v)
            if p is not None:
                return p
    return None


async def refusal_pool(reader, head, rec):
    """Reads a refusal's (small, Content-Length) body and records its `pool`, if any."""
    try:
        n = content_length(head)
    except (IndexError, ValueError):
        return
    if not 0 < n <= BODY_MAX:
        return
    try:
        body = await asyncio.wait_for(reader.readexactly(n), 2)
        pool = find_pool(json.loads(body))
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
        return
    if pool is not None:
        rec["pool"] = pool


async def exchange(host, port, req, sched, t0, rec, max_tokens):
    """One request and its response on a fresh connection; fills `rec` in place (a cut
    request keeps what it saw). Latencies from the scheduled arrival `sched`."""
    loop = asyncio.get_running_loop()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(req)
        head = await reader.readuntil(b"\r\n\r\n")
        now = loop.time() - t0
        rec["status"] = status = int(head[9:12])
        rec["t_status"] = now - sched
        if status != 200:
            rec["outcome"] = "rejected" if status in REFUSALS else "error"
            rec["end"] = now
            if status in REFUSALS:
                await refusal_pool(reader, head, rec)
            return
        s = Stream(is_chunked(head))
        gaps = rec["gaps"] = []
        last = None
        while not s.done:
            data = await reader.read(65536)
            if not data:
                break
            before = s.tokens
            s.feed(data)
            new = s.tokens - before
            if new:
                now = loop.time() - t0
                if last is None:
                    rec["ttft"] = now - sched
                    new -= 1
                else:
                    gaps.append(round(now - last, 6))
                    new -= 1
                gaps.extend([0.0] * new)
                last = now
            rec["tokens"] = s.tokens
        rec["end"] = loop.time() - t0
        rec["tokens"] = s.tokens
        rec["outcome"] = "ok" if (s.done and s.tokens == max_tokens) else "error"
        if rec["outcome"] == "error":
            rec["why"] = f"done={s.done} tokens={s.tokens}"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        rec["outcome"] = "error"
        rec["why"] = type(e).__name__
        rec["end"] = loop.time() - t0
    finally:
        if writer is not None:
            writer.close()


async def one(a, rec, t0):
    """A request of rec's class, with the client's timeout (a.timeout; 0: none)."""
    loop = asyncio.get_running_loop()
    req, max_tokens = a.req[rec["class"]]
    rec["lag"] = loop.time() - t0 - rec["sched"]
    work = exchange(a.host, a.port, req, rec["sched"], t0, rec, max_tokens)
    if not a.timeout:
        return await work
    try:
        await asyncio.wait_for(work, a.timeout)
    except asyncio.TimeoutError:
        rec["outcome"] = rec["why"] = "timeout"
        rec["end"] = loop.time() - t0


async def open_loop(a):
    loop = asyncio.get_running_loop()
    times = arrivals(random.Random(a.seed), a.rate, a.duration, a.arrivals)
    # Its own generator: the arrival times stay those of the seed whatever the share.
    pick = random.Random(f"class-{a.seed}")
    recs = [{"i": i, "sched": t, "outcome": "cut",
             "class": "summarise" if pick.random() < a.sum_share else "chat"}
            for i, t in enumerate(times)]
    tasks = []
    t0, a.t0_unix = loop.time(), time.time()
    for rec in recs:
        await sleep_until(t0 + rec["sched"])
        tasks.append(asyncio.create_task(one(a, rec, t0)))
    await finish(tasks, t0 + a.duration + a.drain)
    return recs, loop.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p)  # --max-tokens: the chat class's
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sum-share", type=float, default=0.3,
                   help="the share of requests that are summarise (0: chat only)")
    p.add_argument("--sum-prompt-bytes", type=int, default=16000)
    p.add_argument("--sum-max-tokens", type=int, default=8)
    p.add_argument("--chat-prompt-bytes", type=int, default=400)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if not 0 <= a.sum_share <= 1:
        p.error("--sum-share must be in [0, 1]")
    a.closed = 0
    a.req = {
        "summarise": (build_request(a.host, a.port, a.model, a.sum_prompt_bytes,
                                    a.sum_max_tokens), a.sum_max_tokens),
        "chat": (build_request(a.host, a.port, a.model, a.chat_prompt_bytes, a.max_tokens),
                 a.max_tokens),
    }
    (recs, wall), cpu, elapsed = timed(open_loop(a))
    meta = run_meta(a, recs, wall, cpu, elapsed) | {
        "port": a.port, "sum_share": a.sum_share,
        "classes": {
            "summarise": {"prompt_bytes": a.sum_prompt_bytes, "max_tokens": a.sum_max_tokens},
            "chat": {"prompt_bytes": a.chat_prompt_bytes, "max_tokens": a.max_tokens},
        },
    }
    write_run(a.out, meta, recs)
    print(json.dumps(meta), file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Open-loop load generator for streaming chat completions (stdlib asyncio, raw streams).

    python3 -m spillbench.loadgen --ports P1,P2 --model M --rate R --out run.jsonl ...

The runner (`fetch`, `arrivals`, `finish`, `write_run`) is shared: bench/prefix/loadgen.py
builds its conversations on it. This module's own workload is one fixed prompt, used by
bench/overload (run.sh, dynamo.sh) and bench/fleet/replicas.sh.

Open loop: requests start at fixed arrival times (Poisson or constant rate) whatever the
server does, each on its own connection, so a slow server cannot slow the offered load.
Every latency is measured from the request's scheduled arrival, so a late start of the
generator itself counts against the server, never in its favour (and the lag is reported).

Per request it records: scheduled arrival, start lag, HTTP status and the time to the
status line, TTFT (time to the first SSE `data:` event whose delta has non-empty content),
end time, content events received, and the outcome:
  ok        200, `data: [DONE]` received, and max_tokens content events
  rejected  429, 503 or 529 (the time to the status line is the rejection latency)
  error     any other status, a broken or short stream, a connect/read error
  timeout   not finished within --timeout seconds of its start (then closed by the client)
  cut       still running when the run's hard end (duration + drain) came

`--closed N` instead runs N concurrent request loops (closed loop), for measuring an
engine's capacity at saturation.

`--class-mix critical:0.2,standard:0.3,sheddable:0.5` gives each request a class drawn at
random with those weights (its own seeded generator, so the arrival times are those of a
run without classes), sent as the header `--class-header` (default x-spillway-class) and
recorded as "class" in the request's line.

Output: one JSON object per line, for the reports (spillbench.analysis): first the run's
metadata (including the generator's own CPU time, to show it was not the bottleneck), then
one per request.
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time

from spillbench.http import Stream, chat_post, is_chunked


# --- the runner ---------------------------------------------------------------------------
async def fetch(host, port, req, sched, t0, rec, max_tokens, timeout=None):
    """One request on its own connection; fills `rec` in place (so a cut request keeps what
    it saw). Times are from t0 (loop time); latencies from the scheduled arrival `sched`.
    With `timeout` (seconds), the client gives up on it that long after it started."""
    loop = asyncio.get_running_loop()
    rec["lag"] = loop.time() - t0 - sched
    if not timeout:
        return await exchange(host, port, req, sched, t0, rec, max_tokens)
    try:
        await asyncio.wait_for(exchange(host, port, req, sched, t0, rec, max_tokens), timeout)
    except asyncio.TimeoutError:
        rec["outcome"] = rec["why"] = "timeout"
        rec["end"] = loop.time() - t0


async def exchange(host, port, req, sched, t0, rec, max_tokens):
    """fetch's request and response."""
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
            rec["outcome"] = "rejected" if status in (429, 503, 529) else "error"
            rec["end"] = now
            return
        s = Stream(is_chunked(head))
        while not s.done:
            data = await reader.read(65536)
            if not data:
                break
            if s.feed(data):
                rec["ttft"] = loop.time() - t0 - sched
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


def arrivals(rng, rate, duration, kind="poisson"):
    """Arrival times in [0, duration): Poisson (exponential gaps drawn from rng) or constant."""
    t = 0.0
    while True:
        t += rng.expovariate(rate) if kind == "poisson" else 1.0 / rate
        if t >= duration:
            return
        yield t


async def sleep_until(t):
    """Sleeps until loop time t (no-op when it has passed)."""
    delay = t - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


async def finish(tasks, hard_end):
    """Waits for `tasks` (a list that may grow while waiting) until none is pending or loop
    time `hard_end`, then cancels whatever is left."""
    loop = asyncio.get_running_loop()
    while True:
        pending = [t for t in tasks if not t.done()]
        left = hard_end - loop.time()
        if not pending or left <= 0:
            break
        await asyncio.wait(pending, timeout=left)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def timed(coro):
    """asyncio.run(coro) and the process's CPU seconds and wall seconds it took."""
    c0 = os.times()
    w0 = time.monotonic()
    result = asyncio.run(coro)
    c1 = os.times()
    return result, (c1.user - c0.user) + (c1.system - c0.system), time.monotonic() - w0


def run_meta(a, recs, wall, cpu, elapsed):
    """The metadata line's common fields (a: the parsed arguments; a.t0_unix, when the runner
    set it, is the wall-clock time of its t0, to place outside events on the run's clock)."""
    return {
        "meta": True, "label": a.label, "rate": a.rate, "closed": a.closed,
        "arrivals": a.arrivals, "duration": a.duration, "drain": a.drain,
        "max_tokens": a.max_tokens, "seed": a.seed, "requests": len(recs),
        "wall_s": wall, "cpu_s": cpu, "cpu_share": cpu / max(wall, 1e-9), "elapsed_s": elapsed,
        "timeout": getattr(a, "timeout", None), "t0_unix": getattr(a, "t0_unix", None),
    }


def write_run(path, meta, recs):
    with open(path, "w") as f:
        f.write(json.dumps(meta) + "\n")
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def add_run_args(p):
    """The arguments every load generator takes (this one and bench/prefix/loadgen.py)."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", required=True)
    p.add_argument("--rate", type=float, default=10.0, help="arrivals per second (open loop)")
    p.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    p.add_argument("--drain", type=float, default=5.0, help="seconds to let requests finish")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--label", default="")
    p.add_argument("--timeout", type=float, default=0,
                   help="seconds a request may take before the client gives up (0: no limit)")


# --- the single-prompt workload -----------------------------------------------------------
def build_request(host, port, model, prompt_bytes, max_tokens, extra_headers=()):
    # The mock estimates prompt tokens as bytes of the `messages` JSON / 4.
    filler = ("lorem ipsum dolor sit amet consectetur " * (prompt_bytes // 8 + 2))
    skeleton = json.dumps([{"role": "user", "content": ""}], separators=(",", ":"))
    content = filler[: max(1, prompt_bytes - len(skeleton))]
    messages = [{"role": "user", "content": content}]
    body = json.dumps(
        {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "stream": True,
        },
        separators=(",", ":"),
    ).encode()
    return chat_post(host, port, body, extra="".join(f"{k}: {v}\r\n" for k, v in extra_headers))


def parse_class_mix(text):
    """'critical:0.2,standard:0.3' -> [('critical', 0.2), ('standard', 0.3)]."""
    mix = []
    for part in text.split(","):
        name, sep, weight = part.strip().partition(":")
        if not sep or not name or float(weight) < 0:
            raise ValueError(f"--class-mix: expected NAME:WEIGHT, got {part!r}")
        mix.append((name, float(weight)))
    if not mix or sum(w for _, w in mix) <= 0:
        raise ValueError("--class-mix: weights must add up to more than 0")
    return mix


def req_for(args, req, rec):
    """The request bytes for `rec`: with a class mix, draws its class and records it."""
    if not args.class_mix:
        return req
    names, weights = zip(*args.class_mix)
    cls = args.class_rng.choices(names, weights)[0]
    rec["class"] = cls
    return req[cls]


def one(args, req, rec, t0):
    return fetch(args.host, args.port_for(rec["i"]), req_for(args, req, rec), rec["sched"], t0,
                 rec, args.max_tokens, args.timeout)


async def open_loop(args, req):
    loop = asyncio.get_running_loop()
    times = arrivals(random.Random(args.seed), args.rate, args.duration, args.arrivals)
    recs = [{"i": i, "sched": a, "outcome": "cut"} for i, a in enumerate(times)]
    tasks = []
    t0, args.t0_unix = loop.time(), time.time()
    for rec in recs:
        await sleep_until(t0 + rec["sched"])
        tasks.append(asyncio.create_task(one(args, req, rec, t0)))
    await finish(tasks, t0 + args.duration + args.drain)
    return recs, loop.time() - t0


async def closed_loop(args, req):
    loop = asyncio.get_running_loop()
    t0, args.t0_unix = loop.time(), time.time()
    recs = []

    async def runner(k):
        n = 0
        while loop.time() - t0 < args.duration:
            rec = {"i": k + n * args.closed, "sched": loop.time() - t0, "outcome": "cut"}
            recs.append(rec)
            await one(args, req, rec, t0)
            n += 1

    tasks = [asyncio.create_task(runner(k)) for k in range(args.closed)]
    await finish(tasks, t0 + args.duration + args.drain)
    return recs, loop.time() - t0


def main():
    p = argparse.ArgumentParser(prog="python3 -m spillbench.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p)
    p.add_argument("--ports", required=True, help="comma-separated; requests go round-robin")
    p.add_argument("--closed", type=int, default=0, help="N concurrent loops instead of open loop")
    p.add_argument("--prompt-bytes", type=int, default=1024)
    p.add_argument("--class-mix", default="",
                   help="NAME:WEIGHT,...: a request class per request, drawn with these weights")
    p.add_argument("--class-header", default="x-spillway-class",
                   help="the header that carries the class (with --class-mix)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    ports = [int(x) for x in args.ports.split(",")]
    args.port_for = lambda i: ports[i % len(ports)]
    args.class_mix = parse_class_mix(args.class_mix) if args.class_mix else []
    # Its own generator: the arrival times stay those of the same seed without classes.
    args.class_rng = random.Random(f"class-{args.seed}")
    if args.class_mix:
        req = {name: build_request(args.host, ports[0], args.model, args.prompt_bytes,
                                   args.max_tokens, [(args.class_header, name)])
               for name, _ in args.class_mix}
    else:
        req = build_request(args.host, ports[0], args.model, args.prompt_bytes, args.max_tokens)

    runner = closed_loop if args.closed else open_loop
    (recs, wall), cpu, elapsed = timed(runner(args, req))
    meta = run_meta(args, recs, wall, cpu, elapsed)
    meta["prompt_bytes"] = args.prompt_bytes
    if args.class_mix:
        meta["class_mix"] = dict(args.class_mix)
        meta["class_header"] = args.class_header
    write_run(args.out, meta, recs)
    print(json.dumps(meta), file=sys.stderr)


if __name__ == "__main__":
    main()

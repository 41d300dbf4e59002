#!/usr/bin/env python3
"""Open-loop load generator for streaming chat completions (stdlib asyncio, raw streams).

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
  cut       still running when the run's hard end (duration + drain) came

`--closed N` instead runs N concurrent request loops (closed loop), for measuring an
engine's capacity at saturation.

`--class-mix critical:0.2,standard:0.3,sheddable:0.5` gives each request a class drawn at
random with those weights (its own seeded generator, so the arrival times are those of a
run without classes), sent as the header `--class-header` (default x-spillway-class) and
recorded as "class" in the request's line.

Output: one JSON object per line, for report.py: first the run's metadata (including the
generator's own CPU time, to show it was not the bottleneck), then one per request.
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time


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
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\naccept: text/event-stream\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in extra_headers)
        + f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


class Stream:
    """De-chunks an HTTP/1.1 body and splits it into SSE events."""

    __slots__ = ("chunked", "raw", "left", "crlf", "payload", "done", "tokens", "first", "ended")

    def __init__(self, chunked):
        self.chunked = chunked
        self.raw = bytearray()
        self.left = 0  # bytes left in the current chunk
        self.crlf = False  # a chunk's trailing CRLF is still to skip
        self.payload = bytearray()
        self.done = False  # data: [DONE] seen
        self.ended = False  # the terminal chunk seen
        self.tokens = 0
        self.first = False

    def feed(self, data):
        """Returns True when this read carried the first content event."""
        if self.chunked:
            self.raw += data
            raw = self.raw
            pos = 0
            while True:
                if self.crlf:
                    if len(raw) - pos < 2:
                        break
                    pos += 2
                    self.crlf = False
                if self.left == 0:
                    eol = raw.find(b"\r\n", pos)
                    if eol < 0:
                        break
                    size = int(bytes(raw[pos:eol]).split(b";")[0], 16)
                    pos = eol + 2
                    if size == 0:
                        self.ended = True
                        break
                    self.left = size
                take = min(self.left, len(raw) - pos)
                if take <= 0:
                    break
                self.payload += raw[pos : pos + take]
                pos += take
                self.left -= take
                if self.left == 0:
                    self.crlf = True
            del raw[:pos]
        else:
            self.payload += data
        return self._events()

    def _events(self):
        first_now = False
        payload = self.payload
        start = 0
        while True:
            end = payload.find(b"\n\n", start)
            if end < 0:
                break
            ev = payload[start:end]
            start = end + 2
            if ev.startswith(b"data: [DONE]"):
                self.done = True
                continue
            i = ev.find(b'"content":"')
            if i >= 0 and ev[i + 11 : i + 12] != b'"':
                self.tokens += 1
                if not self.first:
                    self.first = True
                    first_now = True
        if start:
            del payload[:start]
        return first_now


async def one(args, req, sched, t0, rec):
    """One request; fills `rec` in place (so a cut request keeps what it saw)."""
    loop = asyncio.get_running_loop()
    rec["lag"] = loop.time() - t0 - sched
    writer = None
    try:
        reader, writer = await asyncio.open_connection(args.host, args.port_for(rec["i"]))
        writer.write(req)
        head = await reader.readuntil(b"\r\n\r\n")
        now = loop.time() - t0
        rec["status"] = status = int(head[9:12])
        rec["t_status"] = now - sched
        lower = head.lower()
        chunked = b"transfer-encoding: chunked" in lower
        if status != 200:
            rec["outcome"] = "rejected" if status in (429, 503, 529) else "error"
            rec["end"] = now
            return
        s = Stream(chunked)
        while not s.done:
            data = await reader.read(65536)
            if not data:
                break
            if s.feed(data):
                rec["ttft"] = loop.time() - t0 - sched
            rec["tokens"] = s.tokens
        rec["end"] = loop.time() - t0
        rec["tokens"] = s.tokens
        rec["outcome"] = "ok" if (s.done and s.tokens == args.max_tokens) else "error"
        if rec["outcome"] == "error":
            rec["why"] = f"done={s.done} tokens={s.tokens}"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        rec["outcome"] = "error"
        rec["why"] = type(e).__name__
        rec["end"] = loop.time() - t0
    finally:
        if writer is not None:
            writer.close()


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


async def open_loop(args, req):
    loop = asyncio.get_running_loop()
    rng = random.Random(args.seed)
    arrivals = []
    t = 0.0
    while True:
        t += rng.expovariate(args.rate) if args.arrivals == "poisson" else 1.0 / args.rate
        if t >= args.duration:
            break
        arrivals.append(t)
    recs = [{"i": i, "sched": a, "outcome": "cut"} for i, a in enumerate(arrivals)]
    tasks = []
    t0 = loop.time()
    for rec in recs:
        delay = t0 + rec["sched"] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(args, req_for(args, req, rec), rec["sched"], t0, rec)))
    hard_end = t0 + args.duration + args.drain
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=max(0.0, hard_end - loop.time()))
    for task in tasks:
        if not task.done():
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return recs, loop.time() - t0


async def closed_loop(args, req):
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    recs = []

    async def runner(k):
        n = 0
        while loop.time() - t0 < args.duration:
            rec = {"i": k + n * args.closed, "sched": loop.time() - t0, "outcome": "cut"}
            recs.append(rec)
            await one(args, req_for(args, req, rec), rec["sched"], t0, rec)
            n += 1

    tasks = [asyncio.create_task(runner(k)) for k in range(args.closed)]
    await asyncio.wait(tasks, timeout=args.duration + args.drain)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return recs, loop.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--ports", required=True, help="comma-separated; requests go round-robin")
    p.add_argument("--model", required=True)
    p.add_argument("--rate", type=float, default=10.0, help="arrivals per second (open loop)")
    p.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
    p.add_argument("--closed", type=int, default=0, help="N concurrent loops instead of open loop")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    p.add_argument("--drain", type=float, default=5.0, help="seconds to let requests finish")
    p.add_argument("--prompt-bytes", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--label", default="")
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

    c0 = os.times()
    w0 = time.monotonic()
    runner = closed_loop if args.closed else open_loop
    recs, wall = asyncio.run(runner(args, req))
    c1 = os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    meta = {
        "meta": True,
        "label": args.label,
        "rate": args.rate,
        "closed": args.closed,
        "arrivals": args.arrivals,
        "duration": args.duration,
        "drain": args.drain,
        "prompt_bytes": args.prompt_bytes,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "requests": len(recs),
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_share": cpu / max(wall, 1e-9),
        "elapsed_s": time.monotonic() - w0,
    }
    if args.class_mix:
        meta["class_mix"] = dict(args.class_mix)
        meta["class_header"] = args.class_header
    with open(args.out, "w") as f:
        f.write(json.dumps(meta) + "\n")
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    print(json.dumps(meta), file=sys.stderr)


if __name__ == "__main__":
    main()

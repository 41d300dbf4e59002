#!/usr/bin/env python3
"""Mixed open-loop traffic for the soak (stdlib asyncio, raw streams, one connection per
request). Each kind has its own Poisson arrivals; requests start on time whatever the
proxy does, and every one is bounded by --request-timeout.

Kinds (rate per second each, 0 turns a kind off):
  stream   streaming chat completion, read to `data: [DONE]`
  plain    non-streaming chat completion, read whole
  abort    streaming, then the client leaves: right after sending, after the first
           content event, or after a few events; half of them with a reset (SO_LINGER 0)
  tight    streaming to a model whose one worker admits one request and queues one:
           mostly refused (529)
  gone     a model whose only worker is not listening (503)
  bad      a body that is not JSON (400) or names no served model (404), alternately

Writes one JSON object with, per kind, the count of each outcome (`200`, `529`, ...,
`aborted`, `error:<why>`) and prints a progress line every --progress seconds."""

import argparse
import asyncio
import json
import os
import random
import socket
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench.http import Stream, chat_post, is_chunked  # noqa: E402
from spillbench.loadgen import arrivals, sleep_until, timed  # noqa: E402

KINDS = ("stream", "plain", "abort", "tight", "gone", "bad")


def request(host, port, model, stream, max_tokens, body=None):
    if body is None:
        body = json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": "soak " * 40}],
                "max_tokens": max_tokens,
                "stream": stream,
            },
            separators=(",", ":"),
        ).encode()
    return chat_post(host, port, body, stream)


def requests_by_kind(args):
    h, p = args.host, args.port
    return {
        "stream": [request(h, p, args.model, True, args.max_tokens)],
        "plain": [request(h, p, args.model, False, args.max_tokens)],
        "abort": [request(h, p, args.model, True, args.max_tokens)],
        "tight": [request(h, p, args.tight_model, True, args.max_tokens)],
        "gone": [request(h, p, args.gone_model, False, 8)],
        "bad": [
            request(h, p, "", False, 0, body=b'{"model": "mock-model", "messages": [oops'),
            request(h, p, "no-such-model", False, 8),
        ],
    }


async def read_response(reader):
    """Status and, for a 200, the stream state after reading the whole body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    s = Stream(is_chunked(head))
    length = None
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    if length is not None:
        s.feed(await reader.readexactly(length))
        s.ended = True
    while not s.ended:
        data = await reader.read(65536)
        if not data:
            break
        s.feed(data)
    return status, s


async def abort_after(reader, writer, how):
    """Leaves mid-request: `how` is 0 (right after sending), 1 (after the first content
    event) or 4 (after four)."""
    if how > 0:
        head = await reader.readuntil(b"\r\n\r\n")
        if int(head[9:12]) != 200:
            return str(int(head[9:12]))
        s = Stream(is_chunked(head))
        while s.tokens < how and not s.done:
            data = await reader.read(65536)
            if not data:
                return "error:closed"
            s.feed(data)
    return "aborted"


async def exchange(args, kind, req, n, conn):
    """Sends `req` and reads what `kind` reads; the outcome."""
    reader, writer = await asyncio.open_connection(args.host, args.port)
    conn.append(writer)
    writer.write(req)
    if kind == "abort":
        outcome = await abort_after(reader, writer, (0, 1, 4)[n % 3])
        if n % 2 == 0:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return outcome
    status, s = await read_response(reader)
    if status == 200 and kind in ("stream", "tight") and not s.done:
        return "error:short-stream"
    return str(status)


async def one(args, kind, req, n, counts):
    conn = []
    try:
        outcome = await asyncio.wait_for(exchange(args, kind, req, n, conn), args.request_timeout)
    except asyncio.TimeoutError:
        outcome = "error:timeout"
    except Exception as e:  # noqa: BLE001  (counted, never fatal)
        outcome = f"error:{type(e).__name__}"
    finally:
        for writer in conn:
            writer.close()
    c = counts[kind]
    c[outcome] = c.get(outcome, 0) + 1


async def kind_loop(args, kind, rate, reqs, counts, tasks, t0):
    rng = random.Random(f"{args.seed}-{kind}")
    for n, t in enumerate(arrivals(rng, rate, args.duration)):
        await sleep_until(t0 + t)
        req = reqs[n % len(reqs)]
        task = asyncio.create_task(one(args, kind, req, n, counts))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def progress(args, counts, t0):
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(args.progress)
        line = " ".join(f"{k}={sum(v.values())}" for k, v in counts.items() if v)
        print(f"[traffic {loop.time() - t0:.0f}s] {line}", file=sys.stderr, flush=True)


async def run(args):
    loop = asyncio.get_running_loop()
    counts = {k: {} for k in KINDS}
    reqs = requests_by_kind(args)
    tasks = set()
    t0 = loop.time()
    rates = {k: getattr(args, f"{k}_rate") for k in KINDS}
    loops = [kind_loop(args, k, r, reqs[k], counts, tasks, t0) for k, r in rates.items() if r > 0]
    ticker = asyncio.create_task(progress(args, counts, t0)) if args.progress > 0 else None
    await asyncio.gather(*loops)
    if tasks:
        await asyncio.wait(set(tasks), timeout=args.request_timeout + 1)
    if ticker:
        ticker.cancel()
    return counts, rates, loop.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="mock-model")
    p.add_argument("--tight-model", default="tight-model")
    p.add_argument("--gone-model", default="gone-model")
    p.add_argument("--duration", type=float, required=True, help="seconds of arrivals")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--progress", type=float, default=60.0)
    for k, default in (("stream", 15), ("plain", 15), ("abort", 5), ("tight", 10), ("gone", 1), ("bad", 1)):
        p.add_argument(f"--{k}-rate", type=float, default=default)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    (counts, rates, wall), cpu, _ = timed(run(args))
    summary = {
        "duration_s": args.duration,
        "wall_s": wall,
        "rates": rates,
        "max_tokens": args.max_tokens,
        "counts": counts,
        "cpu_s": cpu,
    }
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary), file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Multi-turn chat load generator: conversations that resend their growing history.

Built on spillbench.loadgen (bench/lib: its request runner, SSE de-chunker and record
format); this file adds the conversations and the way arrivals are given to them.

Workload (deterministic from --seed; every setup gets byte-identical requests):
  - One system prompt shared by all conversations (--system-tokens).
  - A pool of --conversations conversations of --turns turns. Turn t sends the system
    prompt, the conversation's earlier turns (user message + assistant reply each) and a
    new user message (--user-tokens), as a streaming chat completion with max_tokens
    --max-tokens. The assistant reply resent in the history is text generated from the
    seed (--assistant-tokens), not what the engine answered: the requests do not depend on
    the engine's output, and a prefix cache over prompts sees the same thing either way
    (the reply was never part of an earlier prompt). Its length is a chat reply's (256
    tokens by default) while the engine streams only max_tokens (64 by default): the
    history is what prefix reuse is about, and a short decode keeps runs short.
  - Contents are words `wN` drawn per conversation, turn and role, so two conversations
    share nothing but the system prompt.
  - The first --conversations conversations start staggered: conversation k starts at turn
    k mod --turns (its earlier turns are in its first request but were never sent, so that
    request finds nothing cached, in every setup alike, and is marked `cold`), so the mix of
    turns is uniform from the start. With FIFO arrivals (below) the cold requests are the
    first --conversations arrivals: a warm-up of at least conversations / rate leaves them
    out of the statistics. A conversation that finishes its last turn is replaced by a new one (next
    id) that starts at turn 0.
  - Token units (--unit): `bytes4` for `spillway mock-engine`, which counts bytes of the
    `messages` JSON / 4 (a content of N tokens is 4N bytes of words), `word` for Dynamo's
    mocker with the word-level tokenizer of spillbench.dynamo_model (N words).

Open loop (--rate): arrival times are Poisson (or constant) at the rate, from the seed.
Each arrival goes to the conversation that has been ready (its previous turn completed)
the longest, FIFO. A conversation never has two turns in flight. When no conversation is
ready, the arrival waits in a FIFO until one is; its latencies still count from its
scheduled arrival, and the wait is recorded as `ready_wait` (so a slow system cannot lower
the offered load unseen). A turn that is refused or fails still moves its conversation on
(the history is the seed's, not the engine's), so refusals do not stall the workload.

Closed loop (--closed K, for the capacity measurement): K streams, each running
conversations back to back (stream k: conversations k, k+K, ...; the first staggered as
above), every request straight after the previous one.

Routing helpers: with several --ports a conversation always goes to port
(conversation mod ports); --pin-header H --pin-names a,b,c,d adds `H: names[conv mod n]` to
every request (Spillway's direct mode: the perfect-affinity oracle).

--scrape-at T1,T2 --scrape URL,...: at those times since the first arrival, GET each URL
(e.g. the engines' /metrics) and keep the lines that start with --scrape-keep prefixes in
the metadata, so counters are read at the exact edges of the measurement window.

Per request (one JSON line each, after the metadata line): i, conv, turn, ptok (prompt
tokens as the mock counts them), sched, lag, ready_wait (queued: true when it waited), cold, status, t_status, ttft, end,
tokens, outcome (ok / rejected / error / cut), as spillbench.loadgen records them.
(ptok: bytes of `messages` / 4 with --unit bytes4; words + chat template with --unit word.)

--describe prints the workload's prompt sizes (mean, by turn) as JSON and exits; --print-body
TURN prints one request body (non-streaming), for a probe of the engine's own token count.
"""

import argparse
import asyncio
import collections
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench.http import chat_post, get_text  # noqa: E402
from spillbench.loadgen import (  # noqa: E402
    add_run_args, arrivals, fetch, finish, run_meta, sleep_until, timed, write_run)

VOCAB = [f"w{i}" for i in range(4000)]  # inside spillbench.dynamo_model's vocabulary (w0 … w4081)


class Workload:
    """The conversations' contents; pure functions of the seed."""

    def __init__(self, a):
        self.a = a
        self.system = self.text("system", a.system_tokens)
        self.cache = {}

    def text(self, tag, tokens):
        rng = random.Random(f"{self.a.seed}/{tag}")
        if self.a.unit == "word":
            return " ".join(rng.choice(VOCAB) for _ in range(tokens))
        want = 4 * tokens
        out, n = [], 0
        while n < want:
            w = rng.choice(VOCAB)
            out.append(w)
            n += len(w) + 1
        return " ".join(out)[:want]

    def turn_messages(self, conv, turn):
        """(user, assistant) of one turn, memoised for the conversation's life."""
        key = (conv, turn)
        m = self.cache.get(key)
        if m is None:
            m = (self.text(f"c{conv}/t{turn}/user", self.a.user_tokens),
                 self.text(f"c{conv}/t{turn}/assistant", self.a.assistant_tokens))
            self.cache[key] = m
        return m

    def forget(self, conv):
        for t in range(self.a.turns):
            self.cache.pop((conv, t), None)

    def body(self, conv, turn):
        """The request body of turn `turn` (0-based) and its prompt tokens: bytes of `messages`
        / 4 (unit bytes4, the Spillway mock's count) or words with spillbench.dynamo_model's
        chat template (unit word)."""
        messages = [{"role": "system", "content": self.system}]
        for t in range(turn):
            user, assistant = self.turn_messages(conv, t)
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        messages.append({"role": "user", "content": self.turn_messages(conv, turn)[0]})
        msgs = json.dumps(messages, separators=(",", ":"))
        body = ('{"model":' + json.dumps(self.a.model) + ',"messages":' + msgs
                + f',"max_tokens":{self.a.max_tokens},"stream":true}}').encode()
        if self.a.unit == "word":  # dynamo_model's template: "role : content " per message
            return body, sum(len(m["content"].split()) + 2 for m in messages) + 2
        return body, max(1, len(msgs.encode()) // 4)

    def request(self, conv, turn, port):
        body, ptok = self.body(conv, turn)
        extra = ""
        if self.a.pin_header:
            extra = f"{self.a.pin_header}: {self.a.pin_names[conv % len(self.a.pin_names)]}\r\n"
        return chat_post(self.a.host, port, body, extra=extra), ptok


class Conv:
    __slots__ = ("id", "turn")

    def __init__(self, cid, turn):
        self.id = cid
        self.turn = turn


async def scraper(a, t0, out):
    loop = asyncio.get_running_loop()
    for at in a.scrape_at:
        await sleep_until(t0 + at)
        t = loop.time() - t0
        texts = await asyncio.gather(*(get_text(u) for u in a.scrape))
        keep = []
        for text in texts:
            keep.append([l for l in text.splitlines()
                         if any(l.startswith(p) for p in a.scrape_keep)])
        out.append({"at": at, "t": t, "lines": keep})


def run(a, rec, req, port, t0):
    return fetch(a.host, port, req, rec["sched"], t0, rec, a.max_tokens)


async def open_loop(a, wl, ports):
    loop = asyncio.get_running_loop()
    times = arrivals(random.Random(a.seed), a.rate, a.duration, a.arrivals)
    recs = [{"i": i, "sched": s, "outcome": "cut"} for i, s in enumerate(times)]
    ready = collections.deque(Conv(k, k % a.turns) for k in range(a.conversations))
    next_id = a.conversations
    waiting = collections.deque()  # arrivals with no ready conversation yet
    tasks, scrapes = [], []
    t0 = loop.time()

    def start(conv, rec):
        rec["conv"], rec["turn"] = conv.id, conv.turn
        if conv.id < a.conversations and conv.turn == conv.id % a.turns and conv.turn:
            rec["cold"] = True  # a staggered conversation's first request
        # Only an arrival that found no ready conversation waited (not the loop's own lag).
        rec["ready_wait"] = max(0.0, loop.time() - t0 - rec["sched"]) if rec.get("queued") else 0.0
        port = ports[conv.id % len(ports)]
        req, rec["ptok"] = wl.request(conv.id, conv.turn, port)
        tasks.append(asyncio.create_task(turn_task(conv, rec, req, port)))

    async def turn_task(conv, rec, req, port):
        nonlocal next_id
        await run(a, rec, req, port, t0)
        conv.turn += 1
        if conv.turn >= a.turns:
            wl.forget(conv.id)
            conv = Conv(next_id, 0)
            next_id += 1
        if waiting:
            start(conv, waiting.popleft())
        else:
            ready.append(conv)

    scr = asyncio.create_task(scraper(a, t0, scrapes)) if a.scrape else None
    for rec in recs:
        await sleep_until(t0 + rec["sched"])
        if ready:
            start(ready.popleft(), rec)
        else:
            rec["queued"] = True
            waiting.append(rec)
    hard_end = t0 + a.duration + a.drain
    await finish(tasks, hard_end)  # tasks spawn successors: finish waits for those too
    if scr:
        await asyncio.wait([scr], timeout=max(0.0, hard_end + 5 - loop.time()))
        scr.cancel()
    for rec in waiting:
        rec["why"] = "no ready conversation by the end"
    return recs, loop.time() - t0, scrapes, next_id


async def closed_loop(a, wl, ports):
    loop = asyncio.get_running_loop()
    recs, scrapes = [], []
    t0 = loop.time()
    counter = [0]

    async def stream(k):
        conv, j = Conv(k, k % a.turns), 0
        while loop.time() - t0 < a.duration:
            rec = {"i": counter[0], "sched": loop.time() - t0, "outcome": "cut",
                   "conv": conv.id, "turn": conv.turn, "ready_wait": 0.0}
            if conv.id == k and conv.turn == k % a.turns and conv.turn:
                rec["cold"] = True
            counter[0] += 1
            recs.append(rec)
            port = ports[conv.id % len(ports)]
            req, rec["ptok"] = wl.request(conv.id, conv.turn, port)
            await run(a, rec, req, port, t0)
            conv.turn += 1
            if conv.turn >= a.turns:
                wl.forget(conv.id)
                j += 1
                conv = Conv(k + j * a.closed, 0)

    scr = asyncio.create_task(scraper(a, t0, scrapes)) if a.scrape else None
    tasks = [asyncio.create_task(stream(k)) for k in range(a.closed)]
    await finish(tasks, t0 + a.duration + a.drain)
    if scr:
        scr.cancel()
    return recs, loop.time() - t0, scrapes, None


def describe(a, wl):
    by_turn = [wl.body(0, t)[1] for t in range(a.turns)]
    return {"prompt_tokens_by_turn": by_turn,
            "mean_prompt_tokens": sum(by_turn) / len(by_turn),
            "system_tokens": a.system_tokens, "user_tokens": a.user_tokens,
            "assistant_tokens": a.assistant_tokens, "turns": a.turns,
            "request_bytes_mean": sum(len(wl.body(0, t)[0]) for t in range(a.turns)) / a.turns}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p)
    p.add_argument("--ports", default="0", help="comma-separated; conversation c goes to port c mod n")
    p.add_argument("--closed", type=int, default=0, help="K concurrent streams instead of open loop")
    p.add_argument("--conversations", type=int, default=160)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=768)
    p.add_argument("--user-tokens", type=int, default=128)
    p.add_argument("--assistant-tokens", type=int, default=256)
    p.add_argument("--unit", choices=["bytes4", "word"], default="bytes4")
    p.add_argument("--pin-header", default="")
    p.add_argument("--pin-names", default="")
    p.add_argument("--scrape", default="", help="comma-separated URLs to GET at --scrape-at times")
    p.add_argument("--scrape-at", default="")
    p.add_argument("--scrape-keep", default="vllm:prefix_cache_,vllm:num_requests_,vllm:generation_tokens_total")
    p.add_argument("--describe", action="store_true")
    p.add_argument("--print-body", type=int, default=None, metavar="TURN",
                   help="print the body of conversation 0's turn TURN (non-streaming) and exit")
    p.add_argument("--out", default="")
    a = p.parse_args()
    a.pin_names = [x for x in a.pin_names.split(",") if x]
    if a.pin_header and not a.pin_names:
        p.error("--pin-header needs --pin-names")
    a.scrape = [x for x in a.scrape.split(",") if x]
    a.scrape_at = [float(x) for x in a.scrape_at.split(",") if x]
    a.scrape_keep = [x for x in a.scrape_keep.split(",") if x]
    wl = Workload(a)
    if a.describe:
        print(json.dumps(describe(a, wl)))
        return
    if a.print_body is not None:
        print(wl.body(0, a.print_body)[0].decode().replace('"stream":true', '"stream":false'))
        return
    if not a.out:
        p.error("--out is required")
    ports = [int(x) for x in a.ports.split(",")]

    runner = closed_loop if a.closed else open_loop
    (recs, wall, scrapes, conversations_used), cpu, elapsed = timed(runner(a, wl, ports))
    meta = run_meta(a, recs, wall, cpu, elapsed) | {
        "workload": describe(a, wl) | {"conversations": a.conversations, "unit": a.unit,
                                       "conversations_used": conversations_used},
        "pin": {"header": a.pin_header, "names": a.pin_names} if a.pin_header else None,
        "scrapes": scrapes, "scrape_urls": a.scrape,
    }
    write_run(a.out, meta, recs)
    print(json.dumps({k: v for k, v in meta.items() if k not in ("scrapes", "workload")}), file=sys.stderr)


if __name__ == "__main__":
    main()

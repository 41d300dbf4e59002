"""Idle keep-alive clients for bench/connections/run.sh.

    hold.py HOST PORT N

Opens N connections (500 at a time), sends one chat-completions POST on each, reads its
answer whole (Content-Length, must be 200), then keeps every connection open and idle.
Prints "held N" once all are idle, and closes them all when stdin closes."""

import asyncio
import os
import resource
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench.http import BENCH_REQUEST as REQUEST, content_length  # noqa: E402


async def one(host, port):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head[:80]!r}")
    await reader.readexactly(content_length(head))
    return writer


async def main(host, port, n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if n + 64 > hard:
        sys.exit(f"{n} connections need more than the fd limit {hard}")
    writers = []
    for start in range(0, n, 500):
        batch = [one(host, port) for _ in range(min(500, n - start))]
        writers += await asyncio.gather(*batch)
    print(f"held {len(writers)}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for w in writers:
        w.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

"""Idle keep-alive clients for bench/connections/run.sh.

    hold.py HOST PORT N [stream]

Opens N connections (500 at a time), sends one chat-completions POST on each, reads its
answer whole (must be 200: a Content-Length body, or with `stream` a streamed request's
chunked SSE body to its last chunk), then keeps every connection open and idle. Prints
"held N" once all are idle, and closes them all when stdin closes."""

import asyncio
import os
import resource
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench.http import BENCH_BODY, BENCH_REQUEST, Stream, chat_post, content_length, is_chunked  # noqa: E402

STREAM_BODY = BENCH_BODY.replace(b'"max_tokens":8}', b'"max_tokens":16,"stream":true}')


async def one(host, port, request):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head[:80]!r}")
    if is_chunked(head):
        stream = Stream(True)
        while not stream.ended:
            data = await reader.read(65536)
            if not data:
                raise RuntimeError("the stream ended before its last chunk")
            stream.feed(data)
    else:
        await reader.readexactly(content_length(head))
    return writer


async def main(host, port, n, streamed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if n + 64 > hard:
        sys.exit(f"{n} connections need more than the fd limit {hard}")
    request = chat_post(host, port, STREAM_BODY) if streamed else BENCH_REQUEST
    writers = []
    for start in range(0, n, 500):
        batch = [one(host, port, request) for _ in range(min(500, n - start))]
        writers += await asyncio.gather(*batch)
    print(f"held {len(writers)}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for w in writers:
        w.close()


if __name__ == "__main__":
    streamed = len(sys.argv) > 4 and sys.argv[4] == "stream"
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), streamed))

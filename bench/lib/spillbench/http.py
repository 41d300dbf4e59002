"""Raw HTTP/1.1 for the load generators: request bytes, the SSE de-chunker, a small GET."""

import asyncio

# One small keep-alive chat completion (bench/proxy/client.py, bench/connections/hold.py;
# the same body as bench/proxy/post.lua), answered with a Content-Length.
BENCH_BODY = (b'{"model":"bench-model","messages":[{"role":"user","content":'
              b'"Say hello in one word."}],"max_tokens":8}')
BENCH_REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(BENCH_BODY), BENCH_BODY))


def chat_post(host, port, body, stream=True, extra=""):
    """A POST /v1/chat/completions carrying `body` (bytes); `extra`: more header lines,
    each ending in CRLF, before Content-Length."""
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        "content-type: application/json\r\n"
        + ("accept: text/event-stream\r\n" if stream else "")
        + f"{extra}content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def content_length(head):
    """The Content-Length of a response head (bytes), which must have one."""
    return int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])


def is_chunked(head):
    return b"transfer-encoding: chunked" in head.lower()


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


async def get_text(url):
    """GET url (http://host:port/path); the body's text, '' on failure."""
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port or 80)), 2)
        writer.write(f"GET /{path} HTTP/1.1\r\nhost: {hostport}\r\nconnection: close\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        length = None
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        if length is not None:
            body = await asyncio.wait_for(reader.readexactly(length), 3)
        else:
            body = await asyncio.wait_for(reader.read(), 3)
            if is_chunked(head):
                s = Stream(True)
                s.feed(body)
                body = bytes(s.payload)
        writer.close()
        return body.decode(errors="replace")
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
        return ""

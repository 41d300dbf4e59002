"""Sequential keep-alive client for bench/proxy/instructions.sh: N chat-completions POSTs
on one connection, each answer read whole (Content-Length) and checked to be a 200."""

import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from spillbench.http import BENCH_REQUEST as request, content_length  # noqa: E402

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sock = socket.create_connection((host, port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""
for _ in range(n):
    sock.sendall(request)
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            length = content_length(buf[:end])
            if len(buf) >= end + 4 + length:
                if not buf.startswith(b"HTTP/1.1 200"):
                    sys.exit(f"unexpected response: {buf[:120]!r}")
                buf = buf[end + 4 + length:]
                break
        data = sock.recv(65536)
        if not data:
            sys.exit("connection closed")
        buf += data

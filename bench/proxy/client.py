"""Sequential keep-alive client for bench/proxy/instructions.sh: N chat-completions POSTs
on one connection, each answer read whole (Content-Length) and checked to be a 200."""

import socket
import sys

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = (b'{"model":"bench-model","messages":[{"role":"user","content":'
        b'"Say hello in one word."}],"max_tokens":8}')
request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
sock = socket.create_connection((host, port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""
for _ in range(n):
    sock.sendall(request)
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].lower()
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            if len(buf) >= end + 4 + length:
                if not buf.startswith(b"HTTP/1.1 200"):
                    sys.exit(f"unexpected response: {buf[:120]!r}")
                buf = buf[end + 4 + length:]
                break
        data = sock.recv(65536)
        if not data:
            sys.exit("connection closed")
        buf += data

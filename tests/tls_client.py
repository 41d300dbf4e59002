"""A kept-alive TLS client for tests/alloc.rs: sends the request on stdin's first line
(hex) over one TLS session, 500 times ("warm"), waits for a line, then 5,000 more
("done"), and keeps the session open until stdin closes (its end frees the proxy's
connection buffers, which the test must not count). Each response is read whole (head,
then Content-Length bytes)."""
import socket
import ssl
import sys

host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
request = bytes.fromhex(sys.stdin.readline().strip())
ctx = ssl.create_default_context(cafile=ca)
s = ctx.wrap_socket(socket.create_connection((host, port)), server_hostname="localhost")
buf = b""


def round_trip():
    global buf
    s.sendall(request)
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += s.recv(65536)
    buf = rest[length:]


for _ in range(500):
    round_trip()
print("warm", flush=True)
sys.stdin.readline()
for _ in range(5000):
    round_trip()
print("done", flush=True)
sys.stdin.read()
s.close()

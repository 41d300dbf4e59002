#!/usr/bin/env python3
"""Replays tests/framing/cases.json against proxies and tabulates what each did.

    probe.py CASES OUT_MD TARGET=PROXY_PORT:UPSTREAM_PORT...

For every target it runs a tiny recording upstream on UPSTREAM_PORT (the port the proxy
forwards to), then writes each case in one go on a fresh connection to PROXY_PORT and
records what the client read (statuses in order, close, or nothing: hung) and what the
upstream received (requests, their bodies, whether a head carried both Content-Length and
Transfer-Encoding). Targets run in parallel, cases one after another. Appends a Markdown
table to OUT_MD and prints a one-line summary per target.
"""

import json
import socket
import sys
import threading
import time

HANG_S = 2.0  # no answer and no close within this: hung
EXTRA_S = 0.25  # after the expected answers: how long to watch for more, or a close
QUIET_S = 0.15  # the upstream is done with a case after this long without a new request


def recv_into(sock, buf):
    try:
        data = sock.recv(65536)
    except (socket.timeout, BlockingIOError):
        return None
    except OSError:
        return b""
    buf.extend(data)
    return data


class Upstream:
    """A recording HTTP/1.1 origin: answers every request 200 {"ok":true}."""

    def __init__(self, port):
        self.records = []
        self.lock = threading.Lock()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", port))
        self.srv.listen(256)
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            conn, _ = self.srv.accept()
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def count(self):
        with self.lock:
            return len(self.records)

    def since(self, n):
        with self.lock:
            return self.records[n:]

    def serve(self, conn):
        conn.settimeout(30)
        buf = bytearray()
        try:
            while True:
                try:
                    req = read_request(conn, buf)
                except (ValueError, IndexError):
                    req = {"line": "", "ambiguous": False, "body": b"", "complete": False}
                if req is None:
                    return
                with self.lock:
                    self.records.append(req)
                if not req["complete"]:
                    return
                body = b'{"ok":true}'
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
        except OSError:
            return
        finally:
            conn.close()


def read_until(conn, buf, pred):
    while not pred():
        if not recv_into(conn, buf):
            return False
    return True


def read_request(conn, buf):
    """One request from conn (leniently: LF or CRLF lines); None at EOF."""
    def head_end():
        for sep in (b"\r\n\r\n", b"\n\n"):
            i = buf.find(sep)
            if i >= 0:
                return i + len(sep)
        return -1
    if not read_until(conn, buf, lambda: head_end() >= 0):
        return {"line": "", "ambiguous": False, "body": b"", "complete": False} if buf else None
    n = head_end()
    head = bytes(buf[:n])
    del buf[:n]
    lines = [l.rstrip(b"\r") for l in head.split(b"\n")]
    headers = [l.split(b":", 1) for l in lines[1:] if b":" in l]
    get = lambda k: [v.strip() for (h, v) in headers if h.strip().lower() == k]
    te, cl = get(b"transfer-encoding"), get(b"content-length")
    req = {"line": lines[0].decode("latin-1"), "ambiguous": bool(te and cl), "body": b"",
           "complete": True}
    cut = {**req, "complete": False}
    if te and te[-1].lower().endswith(b"chunked"):
        body = bytearray()
        while True:
            if not read_until(conn, buf, lambda: b"\n" in buf):
                return cut
            i = buf.index(b"\n")
            size = int(buf[:i].split(b";")[0].strip() or b"0", 16)
            del buf[:i + 1]
            if size == 0:
                if not read_until(conn, buf, lambda: buf.startswith(b"\r\n") or b"\r\n\r\n" in buf):
                    return cut
                end = 2 if buf.startswith(b"\r\n") else buf.index(b"\r\n\r\n") + 4
                del buf[:end]
                break
            if not read_until(conn, buf, lambda: len(buf) >= size + 2):
                return cut
            body += buf[:size]
            del buf[:size + 2]
        req["body"] = bytes(body)
    elif cl:
        length = int(cl[0].split(b",")[0])
        if not read_until(conn, buf, lambda: len(buf) >= length):
            return cut
        req["body"] = bytes(buf[:length])
        del buf[:length]
    return req


def responses(buf, closed):
    """Statuses of the whole responses at the start of buf (1xx skipped) and the bytes used."""
    statuses, at = [], 0
    while True:
        i = buf.find(b"\r\n\r\n", at)
        if i < 0:
            return statuses, at
        head = bytes(buf[at:i]).split(b"\r\n")
        try:
            status = int(head[0].split()[1])
        except (IndexError, ValueError):
            return statuses, at
        fields = {l.split(b":", 1)[0].strip().lower(): l.split(b":", 1)[1].strip()
                  for l in head[1:] if b":" in l}
        end = i + 4
        if b"content-length" in fields:
            end += int(fields[b"content-length"])
        elif b"chunked" in fields.get(b"transfer-encoding", b"").lower():
            j = buf.find(b"\r\n0\r\n\r\n", end - 2)
            if j < 0:
                return statuses, at
            end = j + 7
        elif status >= 200 and status not in (204, 304):
            if not closed:
                return statuses, at
            end = len(buf)
        if len(buf) < end:
            return statuses, at
        if status >= 200:
            statuses.append(status)
        at = end


def probe(port, raw, want):
    """Writes raw; returns (statuses, closed, hung)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(0.05)
    try:
        s.sendall(raw)
    except OSError:
        pass
    buf, closed = bytearray(), False
    last = time.monotonic()
    statuses = []
    extra_until = None
    while True:
        data = recv_into(s, buf)
        now = time.monotonic()
        if data == b"":
            closed = True
        elif data:
            last = now
        statuses, _ = responses(buf, closed)
        if closed:
            break
        if len(statuses) >= want and extra_until is None:
            extra_until = now + EXTRA_S
        if extra_until is not None and now >= extra_until:
            break
        if now - last >= HANG_S:
            break
    s.close()
    hung = not closed and len(statuses) < want
    return statuses, closed, hung


def run_target(name, port, up, cases, results):
    for c in cases:
        raw = c["request"].encode("latin-1")
        want = max(1, len(c["expect"]["statuses"]))
        before = up.count()
        try:
            statuses, closed, hung = probe(port, raw, want)
        except OSError:
            statuses, closed, hung = [], True, False
        # Let the upstream finish with this case before the next one starts.
        quiet_since, seen = time.monotonic(), up.count()
        while time.monotonic() - quiet_since < QUIET_S:
            time.sleep(0.02)
            if up.count() != seen:
                seen, quiet_since = up.count(), time.monotonic()
        results[(name, c["name"])] = {
            "statuses": statuses, "closed": closed, "hung": hung, "upstream": up.since(before),
        }


def cell(r, expect):
    if r["statuses"]:
        text = " ".join(map(str, r["statuses"]))
        if r["hung"]:
            text += ", then hung"
    else:
        text = "hung" if r["hung"] else "closed"
    ups = r["upstream"]
    if ups:
        text += f" · fwd {len(ups)}"
        want = [b.encode("latin-1") for b in expect["upstream"]]
        if any(u["ambiguous"] for u in ups):
            text += " (CL+TE)"
        elif not all(u["complete"] for u in ups):
            text += " (incomplete)"
        elif want and [u["body"] for u in ups] != want:
            text += " (other body)"
    if smuggled(r):
        text += " ⚠"
    return text


def smuggled(r):
    """The worker got more whole requests than the client got 2xx answers."""
    whole = sum(1 for u in r["upstream"] if u["complete"])
    return whole > sum(1 for s in r["statuses"] if 200 <= s < 300)


def kind(r):
    """For the summary: forwarded, refused (an error status, nothing forwarded), answered
    (a 2xx of its own, nothing forwarded), hung."""
    if r["upstream"]:
        return "forwarded"
    if r["hung"] and not r["statuses"]:
        return "hung"
    if r["statuses"] and all(200 <= s < 300 for s in r["statuses"]):
        return "answered"
    return "refused"


def main():
    cases_path, out_md, *targets = sys.argv[1:]
    cases = json.load(open(cases_path, encoding="utf-8"))["cases"]
    parsed = []
    for t in targets:
        name, ports = t.split("=")
        proxy_port, up_port = (int(p) for p in ports.split(":"))
        parsed.append((name, proxy_port, Upstream(up_port)))
    results = {}
    threads = [threading.Thread(target=run_target, args=(n, p, u, cases, results))
               for (n, p, u) in parsed]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    names = [n for (n, _, _) in parsed]
    lines = ["", f"## Summary ({len(cases)} cases, {time.monotonic() - t0:.0f} s)", "",
             "| | refused | forwarded | answered itself | hung | not as Spillway's expectation | ⚠ |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for n in names:
        rs = [results[(n, c["name"])] for c in cases]
        kinds = [kind(r) for r in rs]
        differ = sum(1 for c, r in zip(cases, rs) if r["statuses"] != c["expect"]["statuses"]
                     or len(r["upstream"]) != len(c["expect"]["upstream"]))
        warn = sum(1 for r in rs if smuggled(r))
        counts = [kinds.count(k) for k in ("refused", "forwarded", "answered", "hung")]
        lines.append(f"| {n} | " + " | ".join(map(str, counts)) + f" | {differ} | {warn} |")
        print(f"{n}: refused {counts[0]}, forwarded {counts[1]}, answered {counts[2]}, "
              f"hung {counts[3]}, not as expected {differ}, ⚠ {warn}")
    lines += ["", "## Per case", "",
              "Cell: the statuses the client read in order (`hung`: nothing within "
              f"{HANG_S:.0f} s; `closed`: closed without an answer), then `fwd N` when the "
              "worker received N requests: `(other body)` when the case forwards in Spillway "
              "and the bodies differ from the intended ones, `(incomplete)` when a forwarded "
              "request never ended, `(CL+TE)` when a forwarded head carried both; ⚠ when the "
              "worker received more whole requests than the client got 2xx answers (what a "
              "smuggled request looks like from outside).",
              "",
              "| case | family | expected (Spillway) | " + " | ".join(names) + " |",
              "|---|---|---|" + "---|" * len(names)]
    for c in cases:
        e = c["expect"]
        want = " ".join(map(str, e["statuses"])) + (f" · fwd {len(e['upstream'])}" if e["upstream"] else "")
        row = [f"`{c['name']}`", c["family"], want]
        row += [cell(results[(n, c["name"])], e) for n in names]
        lines.append("| " + " | ".join(row) + " |")
    with open(out_md, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

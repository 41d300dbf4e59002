#!/usr/bin/env bash
# Framing probes side by side: the request-smuggling and malformed-framing corpus of
# tests/framing.rs (tests/framing/cases.json) replayed against Spillway, HAProxy and nginx.
#
#   bench/framing/run.sh          # about a minute; writes bench/results/framing.md
#
# Each proxy forwards to its own tiny recording upstream (bench/framing/probe.py, Python);
# each case is written in one go on a fresh connection, and the table says what the client
# read (statuses, a close, or nothing for 2 s: hung) and how many requests the upstream
# received. The proxies run with the configurations of bench/proxy/run.sh, plus 1 s
# head and body read timeouts for all three (and HAProxy reading bodies whole before
# forwarding, as Spillway and nginx do), all on loopback. Spillway's expectations are the
# ones tests/framing.rs checks.
#
# Knobs (environment): MAX_SECONDS=240 (watchdog, after installs), SPILLWAY_BIN.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

MAX_SECONDS=${MAX_SECONDS:-240}
HERE="$BENCH_DIR/framing"
CASES="$REPO_DIR/tests/framing/cases.json"
OUT="$RESULTS_DIR/framing.md"

bench_init framing
need python3 python3
need nginx nginx-light
need haproxy haproxy
need ss iproute2
ensure_spillway
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
read -r P_SPILLWAY P_ADMIN P_NGINX P_HAPROXY U_SPILLWAY U_NGINX U_HAPROXY <<<"$(free_ports 7)"

cat >"$T/spillway.toml" <<CONF
listen = "127.0.0.1:$P_SPILLWAY"
admin_listen = "127.0.0.1:$P_ADMIN"
cores = 1
pin_cores = false

[limits]
header_read_timeout_ms = 1000
body_read_timeout_ms = 1000

[[models]]
name = "m"

[[models.workers]]
url = "http://127.0.0.1:$U_SPILLWAY"
name = "probe"
CONF

mkdir -p "$T/nginx"
cat >"$T/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log crit;
events { worker_connections 1024; }
http {
  access_log off;
  client_header_timeout 1s;
  client_body_timeout 1s;
  client_body_temp_path $T/nginx; proxy_temp_path $T/nginx; fastcgi_temp_path $T/nginx;
  uwsgi_temp_path $T/nginx; scgi_temp_path $T/nginx;
  upstream origin {
    server 127.0.0.1:$U_NGINX;
    keepalive 16;
  }
  server {
    listen 127.0.0.1:$P_NGINX;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
CONF

cat >"$T/haproxy.cfg" <<CONF
global
    nbthread 1
    maxconn 1000
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    timeout http-request 1s
    option http-keep-alive
    option http-buffer-request
    http-reuse always
frontend fe
    bind 127.0.0.1:$P_HAPROXY
    default_backend be
backend be
    server origin 127.0.0.1:$U_HAPROXY
CONF

"$SPILLWAY" check-config "$T/spillway.toml" >/dev/null 2>&1 || die "spillway config invalid"
haproxy -c -q -f "$T/haproxy.cfg" || die "haproxy config invalid"
nginx -t -q -c "$T/nginx.conf" -p "$T/nginx" 2>/dev/null || die "nginx config invalid"

RUST_LOG=error spawn 0 spillway "$SPILLWAY" --config "$T/spillway.toml"
wait_port "$P_SPILLWAY" "$SPAWNED"
spawn 0 nginx nginx -c "$T/nginx.conf" -p "$T/nginx"
wait_port "$P_NGINX" "$SPAWNED"
spawn 0 haproxy haproxy -db -f "$T/haproxy.cfg"
wait_port "$P_HAPROXY" "$SPAWNED"

{
  echo "# Framing probes: Spillway, HAProxy and nginx side by side"
  echo
  echo "The $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["cases"]))' "$CASES")"\
       "request-smuggling and malformed-framing cases of \`tests/framing/cases.json\` (the corpus"
  echo "\`tests/framing.rs\` checks Spillway against), each written in one go on a fresh connection to"
  echo "each proxy, every proxy in front of its own recording upstream. Produced by"
  echo "\`bench/framing/run.sh\`; the proxies run with the configurations of \`bench/proxy/run.sh\`"
  echo "plus 1 s head and body read timeouts for all three (HAProxy: \`timeout http-request 1s\` with"
  echo "\`option http-buffer-request\`; nginx: \`client_header_timeout\`, \`client_body_timeout\`),"
  echo "otherwise defaults (body limits: Spillway 45 MiB, nginx 1 MiB, HAProxy none)."
  echo
  machine_header
  echo "- HAProxy: $(haproxy -v | head -1 | cut -d' ' -f1-3); nginx: $(nginx -v 2>&1 | cut -d' ' -f3)"
} >"$OUT.tmp"

log "probing (up to ~2 min)"
python3 "$HERE/probe.py" "$CASES" "$OUT.tmp" \
  "Spillway=$P_SPILLWAY:$U_SPILLWAY" "HAProxy=$P_HAPROXY:$U_HAPROXY" "nginx=$P_NGINX:$U_NGINX" \
  || die "probe.py failed"
cat >>"$OUT.tmp" <<'MD'

## Caveats

- Outcomes, not timings: the shared machine's load does not change them, except that a
  proxy answering after more than 2 s would read as `hung`.
- "Not as Spillway's expectation" counts where a proxy did something else than Spillway
  does; many such differences are allowed by RFC 9112 (accepting obs-fold or CL+TE and
  forwarding a normalized message, 501 versus 400 for unknown codings, accepting
  HTTP/1.2). What matters for smuggling is whether the worker gets requests the client
  did not send as requests: ⚠ marks that signature.
- The recording upstream is lenient (LF or CRLF lines, chunked or Content-Length bodies), so
  it parses whatever a proxy forwards; `(CL+TE)` flags a forwarded head that carried both.
MD
mv "$OUT.tmp" "$OUT"
log "wrote $OUT"

#!/usr/bin/env bash
# TLS termination: Spillway vs nginx vs HAProxy (both with OpenSSL), each terminating TLS
# in front of the same plain-HTTP origin, in one run.
#
#   bench/tls/run.sh            # ~8.5 min; writes bench/results/tls.md and tls.png
#
# All three serve one ECDSA P-256 certificate (a test CA made here with `openssl`), and
# every client negotiates TLS 1.3 (checked with `openssl s_client` before measuring: the
# protocol, suite, key exchange and signature of each go into the report). Placement as in
# bench/proxy: the proxy under test on CPU 0, the origin (nginx, a fixed JSON answer) and
# the load generator on CPU 1. Every request is POST /v1/chat/completions (bench/proxy's
# post.lua).
#
# Per round, targets in turn (spillway, nginx, haproxy):
#   - handshakes: wrk, HS_CONNS connections, each request with `Connection: close`, so the
#     proxy answers and closes and wrk opens a new TCP connection and makes a new full
#     handshake for the next one (wrk never offers a session to resume; each proxy's own
#     count of handshakes or accepted connections is checked against the requests);
#     figures: new connections (= full handshakes + one proxied request) per second, and
#     the proxy's CPU time per new connection;
#   - for each RATE: wrk2 -R RATE on CONNS kept-alive TLS connections for DURATION
#     seconds: the proxy's CPU time (utime+stime of all its processes and threads,
#     /proc/PID/stat) divided by the 200 responses, and the latency percentiles.
# The report takes medians over ROUNDS rounds.
#
# Knobs (environment): ROUNDS=5 DURATION=10 RATES="2000 5000" CONNS=64 HS_CONNS=32
# TARGETS="spillway nginx haproxy" MAX_SECONDS=570 (watchdog, after installs)
# BENCH_NICE=-10 RESULT_NAME=tls. wrk2 is required (PATH or /opt/wrk2bin/wrk2).

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

HS_CLIENT=${HS_CLIENT:-rustls}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
RATES=${RATES:-"2000 5000"}
CONNS=${CONNS:-64}
HS_CONNS=${HS_CONNS:-32}
TARGETS=${TARGETS:-"spillway nginx haproxy"}
MAX_SECONDS=${MAX_SECONDS:-570}
RESULT_NAME=${RESULT_NAME:-tls}
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/tls"
POST_LUA="$BENCH_DIR/proxy/post.lua"
BODY='{"model":"bench-model","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":8}'

bench_init tls
START=$SECONDS

need python3 python3
need curl curl
need wrk wrk
need nginx nginx-light
need haproxy haproxy
need openssl openssl
need taskset util-linux
need ss iproute2
find_wrk2
[[ -n $WRK2 ]] || die "wrk2 not found (PATH, /opt/wrk2bin): build it as bench/README.md says"
ensure_venv
ensure_spillway
TLS_CONNECT="$REPO_DIR/target/release/examples/tls_connect"
if [[ $HS_CLIENT == rustls ]] && { [[ ! -x $TLS_CONNECT ]] \
    || [[ -n "$(find "$HERE/connect.rs" "$REPO_DIR/Cargo.lock" -newer "$TLS_CONNECT" -print -quit)" ]]; }; then
  log "building the new-connection client (cargo build --release --example tls_connect)"
  (cd "$REPO_DIR" && cargo build --release --quiet --example tls_connect) \
    || die "cargo build --example tls_connect failed"
fi
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
read -r P_ORIGIN P_SPILLWAY P_ADMIN P_NGINX P_NGINX_STATUS P_HAPROXY <<<"$(free_ports 6)"

# --- test CA and the servers' certificate (ECDSA P-256) --------------------------------
PKI="$T/pki"
mkdir -p "$PKI"
(
  cd "$PKI"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
  openssl req -x509 -new -key ca.key -sha256 -days 2 -subj "/CN=Spillway bench CA" -out ca.pem
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out leaf.key
  openssl req -new -key leaf.key -subj "/CN=localhost" -out leaf.csr
  printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=CA:FALSE" \
    "keyUsage=digitalSignature" "extendedKeyUsage=serverAuth" >leaf.ext
  openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -sha256 \
    -extfile leaf.ext -out leaf.pem
  cat leaf.pem leaf.key >haproxy.pem # HAProxy's crt: certificate and key in one file
) >"$T/pki.log" 2>&1 || { cat "$T/pki.log" >&2; die "openssl could not make the certificates"; }

# --- configurations --------------------------------------------------------------------
origin_conf "$T/origin" "$P_ORIGIN" 10 >"$T/origin.conf"
spillway_proxy_toml "$PROXY_CPU" "$P_SPILLWAY" "$P_ADMIN" "$P_ORIGIN" "[tls]
cert = \"$PKI/leaf.pem\"
key = \"$PKI/leaf.key\"" >"$T/spillway.toml"
# nginx: its accepted-connection count on a separate plain status port (same worker).
nginx_proxy_conf "$T/nginx" "$PROXY_CPU" "$P_ORIGIN" "127.0.0.1:$P_NGINX ssl" "\
  ssl_certificate $PKI/leaf.pem;
  ssl_certificate_key $PKI/leaf.key;
  ssl_protocols TLSv1.3;
  server {
    listen 127.0.0.1:$P_NGINX_STATUS;
    location = /status { stub_status; }
  }" >"$T/nginx.conf"
haproxy_proxy_cfg "$PROXY_CPU" "$P_ORIGIN" \
  "127.0.0.1:$P_HAPROXY ssl crt $PKI/haproxy.pem ssl-min-ver TLSv1.3 alpn http/1.1" \
  "    stats socket $T/haproxy.sock mode 600 level user" >"$T/haproxy.cfg"

# --- processes ------------------------------------------------------------------------
start_origin_and_proxies

port_of() {
  case $1 in
    spillway) echo "$P_SPILLWAY" ;; nginx) echo "$P_NGINX" ;; haproxy) echo "$P_HAPROXY" ;;
  esac
}
pids_of() {
  case $1 in
    spillway) echo "$PID_SPILLWAY" ;;
    nginx) with_children "$PID_NGINX" ;;
    haproxy) echo "$PID_HAPROXY" ;;
  esac
}
# handshakes TARGET: the proxy's own count so far: Spillway's completed TLS handshakes,
# nginx's accepted connections (its status port's own included), HAProxy's CumSslConns.
handshakes() {
  case $1 in
    spillway) curl -s -m 5 "http://127.0.0.1:$P_ADMIN/metrics" \
      | awk '$1 == "spillway_tls_handshakes_total" { print $2 }' ;;
    nginx) curl -s -m 5 "http://127.0.0.1:$P_NGINX_STATUS/status" | awk 'NR == 3 { print $1 }' ;;
    haproxy) haproxy_info CumSslConns ;;
  esac
}
# haproxy_info FIELD: one field of HAProxy's `show info`.
haproxy_info() {
  python3 - "$T/haproxy.sock" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(b"show info\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
for line in data.decode().splitlines():
    k, _, v = line.partition(": ")
    if k == sys.argv[2]:
        print(v)
PY
}

# Every target answers 200 with the origin's body over TLS, verified against the test CA;
# what each negotiates with an OpenSSL client goes into the report.
NEGOTIATED="$T/negotiated.tsv"
printf 'target\tprotocol\tcipher\tgroup\tsignature\ttickets\tverify\n' >"$NEGOTIATED"
for tgt in $TARGETS; do
  port=$(port_of "$tgt")
  out=$(curl -s -m 5 --cacert "$PKI/ca.pem" -X POST -H 'content-type: application/json' \
    -d "$BODY" "https://127.0.0.1:$port/v1/chat/completions") || die "$tgt: TLS request failed"
  [[ "$out" == *chatcmpl-bench* ]] || die "$tgt: unexpected answer: $out"
  # stdin stays open a moment so s_client reads the session tickets sent after the handshake.
  sleep 1 | timeout 10 openssl s_client -connect "127.0.0.1:$port" -servername localhost \
    -CAfile "$PKI/ca.pem" >"$T/s_client-$tgt.txt" 2>&1 || true
  "$PY" "$HERE/report.py" s_client "$tgt" "$T/s_client-$tgt.txt" >>"$NEGOTIATED"
done

machine_header >"$T/machine.md" # the load average before the runs, not after
RAW="$T/raw.tsv"
printf 'round\ttarget\tkind\trate\ttool\tticks\twall_s\tload_ticks\tclient_ticks\thandshakes\tfile\n' >"$RAW"
CLK_TCK=$(getconf CLK_TCK)

# measure ROUND TARGET KIND RATE: one run (KIND hs: new connections; rate: kept-alive at
# RATE); appends a line to $RAW.
measure() {
  local round=$1 tgt=$2 kind=$3 rate=$4
  local url="https://127.0.0.1:$(port_of "$tgt")/v1/chat/completions"
  local file="$T/r$round-$tgt-$kind-$rate.out" tool pids t0 t1 w0 w1 l0 l1 c0 c1 h0 h1
  read -r -a pids <<<"$(pids_of "$tgt")"
  h0=$(handshakes "$tgt")
  t0=$(cpu_ticks "${pids[@]}")
  l0=$(cpu_busy_ticks $LOAD_CPU)
  c0=$(children_ticks)
  w0=$(date +%s.%N)
  if [[ $kind == hs && $HS_CLIENT == rustls ]]; then
    tool=tls_connect
    run_pinned $LOAD_CPU timeout $((DURATION + 20)) "$TLS_CONNECT" "127.0.0.1:$(port_of "$tgt")" \
      "$DURATION" "$HS_CONNS" >"$file" 2>&1 || log "$tgt handshakes: tls_connect exited $?"
  elif [[ $kind == hs ]]; then
    tool=wrk
    run_pinned $LOAD_CPU timeout $((DURATION + 20)) wrk -t1 -c"$HS_CONNS" -d"${DURATION}s" \
      --latency -H 'Connection: close' -s "$POST_LUA" "$url" >"$file" 2>&1 \
      || log "$tgt handshakes: wrk exited $?"
  else
    tool=wrk2
    run_pinned $LOAD_CPU timeout $((DURATION + 20)) "$WRK2" -t1 -c"$CONNS" -d"${DURATION}s" \
      -R"$rate" --latency -s "$POST_LUA" "$url" >"$file" 2>&1 \
      || log "$tgt $rate: wrk2 exited $?"
  fi
  w1=$(date +%s.%N)
  c1=$(children_ticks)
  l1=$(cpu_busy_ticks $LOAD_CPU)
  t1=$(cpu_ticks "${pids[@]}")
  h1=$(handshakes "$tgt")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$tgt" "$kind" "$rate" \
    "$tool" "$((t1 - t0))" "$(awk -v a="$w0" -v b="$w1" 'BEGIN{printf "%.3f", b-a}')" \
    "$((l1 - l0))" "$((c1 - c0))" "$((h1 - h0))" "$file" >>"$RAW"
}

# Warm-up: a second per target of each kind (the CA-verified client once, as a check).
for tgt in $TARGETS; do
  url="https://127.0.0.1:$(port_of "$tgt")/v1/chat/completions"
  if [[ $HS_CLIENT == rustls ]]; then
    out=$(run_pinned $LOAD_CPU timeout 10 "$TLS_CONNECT" "127.0.0.1:$(port_of "$tgt")" 1 \
      "$HS_CONNS" --ca "$PKI/ca.pem") || die "$tgt: tls_connect failed: $out"
    [[ $out == *"errors=0 "* ]] || die "$tgt: tls_connect: $out"
  else
    run_pinned $LOAD_CPU timeout 10 wrk -t1 -c"$HS_CONNS" -d1s -H 'Connection: close' \
      -s "$POST_LUA" "$url" >/dev/null 2>&1 || true
  fi
  run_pinned $LOAD_CPU timeout 10 wrk -t1 -c"$CONNS" -d1s -s "$POST_LUA" "$url" \
    >/dev/null 2>&1 || true
done

for round in $(seq 1 "$ROUNDS"); do
  for tgt in $TARGETS; do
    log "round $round/$ROUNDS: $tgt"
    measure "$round" "$tgt" hs 0
    for rate in $RATES; do measure "$round" "$tgt" rate "$rate"; done
  done
done

# Health after the runs: Spillway's counters and log, HAProxy's session reuse.
curl -s -m 5 "http://127.0.0.1:$P_ADMIN/metrics" >"$T/spillway-metrics.txt" || true
HAPROXY_REUSE=$(haproxy_info SslFrontendSessionReuse_pct || true)
for tgt in $TARGETS; do
  pid=$(pids_of "$tgt" | awk '{print $1}')
  kill -0 "$pid" 2>/dev/null || log "warning: $tgt (pid $pid) is gone"
done

ELAPSED=$((SECONDS - START))
{
  echo "# TLS termination: Spillway vs nginx vs HAProxy"
  echo
  echo "Generated by \`bench/tls/run.sh\` (ROUNDS=$ROUNDS DURATION=${DURATION}s RATES=\"$RATES\" CONNS=$CONNS HS_CONNS=$HS_CONNS); run time ${ELAPSED}s."
  echo
  cat "$T/machine.md"
  echo "- Tools: $(if [[ $HS_CLIENT == rustls ]]; then echo "bench/tls/connect.rs (\`tls_connect\`, rustls + ring: new connections), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2) (warm-up)"; else echo "$(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2) (new connections)"; fi), wrk2 ($WRK2, constant rate), $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v | head -1 | cut -d' ' -f1-3), both with $(haproxy -vv | sed -n 's/^Running on OpenSSL version : //p'); Spillway with rustls $(awk '/^name = "rustls"$/ { getline; gsub(/"/, "", $3); print $3 }' "$REPO_DIR/Cargo.lock") (ring) for the handshake and its own record layer (ring AEAD) after it; wrk and wrk2 link $(openssl version | cut -d' ' -f1-2)"
  echo "- Placement: proxy under test on CPU $PROXY_CPU (Spillway cores=1 cpus=[0] monitor_cpu=0; nginx worker_processes 1 + worker_cpu_affinity 01; HAProxy nbthread 1 + cpu-map 1/1 0; all also under taskset -c 0); origin nginx (plain HTTP) and the load generator on CPU $LOAD_CPU."
  echo "- Certificate: one ECDSA P-256 leaf (SAN localhost, 127.0.0.1) signed by a P-256 test CA made by the script; each server sends the leaf alone. nginx \`ssl_protocols TLSv1.3\`, HAProxy \`ssl-min-ver TLSv1.3 alpn http/1.1\`, Spillway \`[tls] cert, key\` (rustls offers 1.3 and 1.2; it has no setting to refuse 1.2); otherwise each server's defaults (session tickets included)."
} >"$T/header.md"

# The run's raw outputs stay in the git-ignored bench/work/tls-last/, and the report is made
# from there (its rerun.sh makes it again, e.g. after a change to report.py).
LAST="$WORK_DIR/tls-last"
rm -rf "$LAST" && mkdir -p "$LAST"
cp "$T"/*.out "$T"/*.txt "$T"/*.md "$T"/*.log "$NEGOTIATED" "$LAST"/ 2>/dev/null || true
sed "s#$T/#$LAST/#" "$RAW" >"$LAST/raw.tsv"
REPORT=("$PY" "$HERE/report.py" report --raw "$LAST/raw.tsv" --header "$LAST/header.md"
  --clk-tck "$CLK_TCK" --negotiated "$LAST/negotiated.tsv"
  --metrics "$LAST/spillway-metrics.txt" --spillway-log "$LAST/spillway.log"
  --haproxy-reuse "${HAPROXY_REUSE:-}" --conns "$CONNS" --hs-conns "$HS_CONNS"
  --duration "$DURATION" --out-md "$RESULTS_DIR/$RESULT_NAME.md"
  --out-png "$RESULTS_DIR/$RESULT_NAME.png")
printf '%q ' "${REPORT[@]}" >"$LAST/rerun.sh"
"${REPORT[@]}"
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

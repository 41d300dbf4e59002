#!/usr/bin/env bash
# Memory per idle keep-alive client connection: Spillway, nginx and HAProxy.
#
#   bench/connections/run.sh        # ~2 min; writes bench/results/connections.md
#
# For each target and each count N in COUNTS: a fresh proxy process (one core / worker /
# thread, in front of the same nginx origin), warmed up with three requests; its RSS; then
# N clients (bench/connections/hold.py, 500 connecting at a time, as fast as one client
# can) each send one chat-completions POST, read the answer and stay connected, idle;
# after SETTLE seconds, its RSS again. The figure is the RSS growth divided by N. RSS is
# the sum of VmRSS over the proxy's processes (nginx: master and worker). This machine's
# hard fd limit is 20,000 per process, hence N ≤ 10,000.
#
# Target `spillway-stream` is issue 30's pattern: Spillway in front of `spillway
# mock-engine` (on CPU 1, 1 ms decode steps), each client's request streamed (16 SSE
# token events, chunked).
#
# Knobs (environment): COUNTS="1000 10000" TARGETS="spillway spillway-stream nginx haproxy"
# SETTLE=3 MAX_SECONDS=600 (watchdog) BENCH_NICE=0.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

COUNTS=${COUNTS:-"1000 10000"}
TARGETS=${TARGETS:-"spillway spillway-stream nginx haproxy"}
SETTLE=${SETTLE:-3}
MAX_SECONDS=${MAX_SECONDS:-600}
BENCH_NICE=${BENCH_NICE:-0}
HERE="$BENCH_DIR/connections"

bench_init connections
need python3 python3
need curl curl
need nginx nginx-light
need haproxy haproxy
need taskset util-linux
need ss iproute2
ensure_spillway
watchdog "$MAX_SECONDS"
ulimit -n "$(ulimit -Hn)"

T=$BENCH_TMP
read -r P_ORIGIN P_PROXY P_ADMIN P_MOCK <<<"$(free_ports 4)"
origin_conf "$T/origin" "$P_ORIGIN" >"$T/origin.conf"
mkdir -p "$T/nginx"

cat >"$T/spillway.toml" <<EOF2
listen = "127.0.0.1:$P_PROXY"
admin_listen = "127.0.0.1:$P_ADMIN"
cores = 1

[[models]]
name = "bench-model"

[[models.workers]]
url = "http://127.0.0.1:$P_ORIGIN"
name = "origin"
EOF2

sed "s|127.0.0.1:$P_ORIGIN|127.0.0.1:$P_MOCK|" "$T/spillway.toml" >"$T/spillway-stream.toml"

cat >"$T/nginx.conf" <<EOF2
worker_processes 1;
worker_rlimit_nofile 20000;
daemon off;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log warn;
events { worker_connections 19000; }
http {
  access_log off;
  client_body_temp_path $T/nginx; proxy_temp_path $T/nginx; fastcgi_temp_path $T/nginx;
  uwsgi_temp_path $T/nginx; scgi_temp_path $T/nginx;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  upstream origin { server 127.0.0.1:$P_ORIGIN; keepalive 128; }
  server {
    listen 127.0.0.1:$P_PROXY backlog=4096;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF2

cat >"$T/haproxy.cfg" <<EOF2
global
    nbthread 1
    maxconn 12000
    ulimit-n 19999
    # 10,000 idle clients need one fd each; the default check assumes two per connection.
    no strict-limits
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 60s
    timeout http-keep-alive 120s
    option http-keep-alive
    http-reuse always
frontend fe
    bind 127.0.0.1:$P_PROXY
    default_backend be
backend be
    server origin 127.0.0.1:$P_ORIGIN
EOF2

spawn 1 origin nginx -c "$T/origin.conf" -p "$T/origin"
wait_port "$P_ORIGIN" "$SPAWNED"
if [[ " $TARGETS " == *" spillway-stream "* ]]; then
  spawn 1 mock "$SPILLWAY" mock-engine --listen "127.0.0.1:$P_MOCK" --model bench-model \
    --decode-step-ms 1 --decode-step-per-seq-ms 0 --max-num-seqs 512
  wait_port "$P_MOCK" "$SPAWNED"
fi

# rss_kb PID...: the summed VmRSS of the processes, in KiB.
rss_kb() {
  local total=0 pid v
  for pid in "$@"; do
    v=$(awk '/^VmRSS:/{print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

start_target() {
  port_unused "$P_PROXY"
  case $1 in
    spillway) RUST_LOG=warn spawn 0 spillway "$SPILLWAY" --config "$T/spillway.toml" ;;
    spillway-stream)
      RUST_LOG=warn spawn 0 spillway "$SPILLWAY" --config "$T/spillway-stream.toml" ;;
    nginx) spawn 0 nginx nginx -c "$T/nginx.conf" -p "$T/nginx" ;;
    haproxy) spawn 0 haproxy haproxy -db -f "$T/haproxy.cfg" ;;
  esac
  TARGET_PID=$SPAWNED
  wait_port "$P_PROXY" "$TARGET_PID"
  TARGET_PIDS=("$TARGET_PID")
  if [[ $1 == nginx ]]; then
    sleep 0.2
    TARGET_PIDS+=($(pgrep -P "$TARGET_PID"))
  fi
}

ROWS="$T/rows.tsv"
: >"$ROWS"
for tgt in $TARGETS; do
  for n in $COUNTS; do
    start_target "$tgt"
    for _ in 1 2 3; do
      curl -s -m 5 -o /dev/null -X POST -H 'content-type: application/json' \
        -d '{"model":"bench-model","messages":[]}' "http://127.0.0.1:$P_PROXY/v1/chat/completions" \
        || die "$tgt: warm-up request failed"
    done
    sleep 1
    before=$(rss_kb "${TARGET_PIDS[@]}")
    mode=unary
    [[ $tgt == spillway-stream ]] && mode=stream
    coproc HOLD { taskset -c 1 python3 "$HERE/hold.py" 127.0.0.1 "$P_PROXY" "$n" "$mode" 2>&1; }
    read -r -t 120 line <&"${HOLD[0]}" || die "$tgt: $n clients did not connect"
    [[ $line == "held $n" ]] || die "$tgt: client says: $line"
    sleep "$SETTLE"
    after=$(rss_kb "${TARGET_PIDS[@]}")
    exec {HOLD[1]}>&-
    wait "$HOLD_PID" 2>/dev/null || true
    per=$(awk -v a="$before" -v b="$after" -v n="$n" 'BEGIN{printf "%.2f", (b-a)*1.024/n}')
    log "$tgt N=$n: RSS $before → $after KiB, $per KB per connection"
    printf '%s\t%s\t%s\t%s\t%s\n' "$tgt" "$n" "$before" "$after" "$per" >>"$ROWS"
    stop_pid "$TARGET_PID"
  done
done

OUT="$RESULTS_DIR/connections.md"
{
  echo "# Memory per idle keep-alive client connection"
  echo
  echo "Produced by \`bench/connections/run.sh\`; N clients (500 connecting at a time, as fast"
  echo "as one client can) each send one chat-completions POST through the proxy (one core /"
  echo "worker / thread, the same nginx origin), read the answer, and stay connected and idle."
  echo "\`spillway-stream\` is issue 30's pattern: Spillway in front of \`spillway mock-engine\`,"
  echo "each request streamed (16 SSE events, chunked). RSS is read before the clients connect"
  echo "and ${SETTLE} s after the last one went idle; the figure is the growth divided by N"
  echo "(1 KB = 1,000 bytes). Kernel socket buffers are not in RSS and are the same for all."
  echo
  machine_header
  echo "- nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), HAProxy $(haproxy -v | head -1 | awk '{print $3}')"
  echo
  echo "| proxy | idle clients | RSS before (KiB) | RSS after (KiB) | per connection (KB) |"
  echo "|---|---:|---:|---:|---:|"
  awk -F'\t' '{printf "| %s | %\047d | %\047d | %\047d | %s |\n", $1, $2, $3, $4, $5}' "$ROWS"
  echo
  echo "## What one parked Spillway connection holds"
  echo
  cat "$HERE/findings.md"
  echo
  echo "## Caveats"
  echo
  echo "- Shared 2-CPU machine; RSS does not depend on the load, so the figures repeat to a few"
  echo "  percent. At 1,000 clients the fixed costs of the first connections (a proxy's pools"
  echo "  and tables growing) weigh more: read the 10,000 row as the cost per connection."
  echo "- Spillway parks a connection after \`buffer_release_ms\` (1 s by default) with nothing"
  echo "  to read; the ${SETTLE} s wait covers it. Before that a connection holds its buffers."
  echo "- Spillway's pool keeps up to 128 idle upstream connections for 4 s"
  echo "  (\`pool_idle_timeout_ms\`), about 0.05 KB per client at 10,000 in this figure."
} >"$OUT"
log "wrote $OUT"

#!/usr/bin/env bash
# Proxy overhead: direct vs Spillway vs the io_uring floor vs nginx vs HAProxy in front of
# one fast origin.
#
#   bench/proxy/run.sh            # ~7 min; writes bench/results/proxy.md and proxy.png
#
# Placement (2-CPU machine): the proxy under test on CPU 0; the origin (nginx returning a
# fixed JSON body) and the load generator on CPU 1. Every request is a keep-alive
# POST /v1/chat/completions with a small JSON body.
#
# Targets: direct (the origin itself), spillway, forwarder (bench/forward: a bare monoio
# forwarder with Spillway's ring settings, one upstream connection per client connection,
# bytes passed as they are; what a proxy on this ring pays at least), nginx, haproxy.
#
# Per round, targets in turn:
#   - peak: wrk closed loop, CONNS connections, 1 thread, DURATION seconds;
#   - for each RATE: constant rate for DURATION seconds with coordinated-omission
#     correction (wrk2 -R when wrk2 is on PATH, else oha -q RATE --latency-correction),
#     latency percentiles and the proxy's CPU time per request (utime+stime of all its
#     processes and threads from /proc/PID/stat, divided by the requests answered).
# The report takes the median over ROUNDS rounds, the ratio to nginx, and Spillway's ratio
# to the forwarder.
#
# Knobs (environment): ROUNDS=3 DURATION=8 RATES="2000 5000 10000" CONNS=64
# TARGETS="direct spillway forwarder nginx haproxy" MAX_SECONDS=690 (watchdog, after
# installs)
# BENCH_NICE=-10. SPILLWAY_BASELINE=/path/to/an/older/spillway adds the target
# `spillway-base`: that binary with the same configuration, measured in the same rounds
# (what a change costs, beside nginx and HAProxy).

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
RATES=${RATES:-"2000 5000 10000"}
CONNS=${CONNS:-64}
BASELINE=${SPILLWAY_BASELINE:-}
if [[ -n $BASELINE ]]; then
  TARGETS=${TARGETS:-"direct spillway spillway-base forwarder nginx haproxy"}
else
  TARGETS=${TARGETS:-"direct spillway forwarder nginx haproxy"}
fi
MAX_SECONDS=${MAX_SECONDS:-690}
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/proxy"
BODY='{"model":"bench-model","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":8}'

bench_init proxy
START=$SECONDS

need python3 python3
need curl curl
need wrk wrk
need nginx nginx-light
need haproxy haproxy
need taskset util-linux
need ss iproute2
if command -v wrk2 >/dev/null 2>&1; then RATE_TOOL=wrk2; else RATE_TOOL=oha; ensure_oha; fi
ensure_venv
ensure_spillway
[[ " $TARGETS " != *" forwarder "* ]] || ensure_forwarder
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
read -r P_ORIGIN P_SPILLWAY P_ADMIN P_NGINX P_HAPROXY P_BASE A_BASE P_FORWARD <<<"$(free_ports 8)"

# --- configurations -------------------------------------------------------------------
origin_conf "$T/origin" "$P_ORIGIN" 10 >"$T/origin.conf"

spillway_proxy_toml "$PROXY_CPU" "$P_SPILLWAY" "$P_ADMIN" "$P_ORIGIN" >"$T/spillway.toml"
nginx_proxy_conf "$T/nginx" "$PROXY_CPU" "$P_ORIGIN" "127.0.0.1:$P_NGINX" >"$T/nginx.conf"
haproxy_proxy_cfg "$PROXY_CPU" "$P_ORIGIN" "127.0.0.1:$P_HAPROXY" >"$T/haproxy.cfg"

# --- processes ------------------------------------------------------------------------
start_origin_and_proxies
PID_BASE=""
if [[ -n $BASELINE ]]; then
  [[ -x $BASELINE ]] || die "SPILLWAY_BASELINE=$BASELINE is not an executable"
  spillway_proxy_toml "$PROXY_CPU" "$P_BASE" "$A_BASE" "$P_ORIGIN" >"$T/spillway-base.toml"
  RUST_LOG=warn spawn $PROXY_CPU spillway-base "$BASELINE" --config "$T/spillway-base.toml"
  PID_BASE=$SPAWNED
  wait_port "$P_BASE" "$PID_BASE"
fi
PID_FORWARD=""
if [[ " $TARGETS " == *" forwarder "* ]]; then
  spawn $PROXY_CPU forwarder "$FORWARDER" --listen "127.0.0.1:$P_FORWARD" \
    --upstream "127.0.0.1:$P_ORIGIN" --cpu $PROXY_CPU
  PID_FORWARD=$SPAWNED
  wait_port "$P_FORWARD" "$PID_FORWARD"
fi

port_of() {
  case $1 in
    direct) echo "$P_ORIGIN" ;; spillway) echo "$P_SPILLWAY" ;;
    spillway-base) echo "$P_BASE" ;;
    forwarder) echo "$P_FORWARD" ;;
    nginx) echo "$P_NGINX" ;; haproxy) echo "$P_HAPROXY" ;;
  esac
}
# The proxy's processes: Spillway (all threads), nginx master + worker, HAProxy.
pids_of() {
  case $1 in
    direct) ;;
    spillway) echo "$PID_SPILLWAY" ;;
    spillway-base) echo "$PID_BASE" ;;
    forwarder) echo "$PID_FORWARD" ;;
    nginx) with_children "$PID_NGINX" ;;
    haproxy) echo "$PID_HAPROXY" ;;
  esac
}

# Every target must answer 200 with the origin's body before measuring.
for tgt in $TARGETS; do
  out=$(curl -s -m 5 -X POST -H 'content-type: application/json' -d "$BODY" \
    "http://127.0.0.1:$(port_of "$tgt")/v1/chat/completions") || die "$tgt: request failed"
  [[ "$out" == *chatcmpl-bench* ]] || die "$tgt: unexpected answer: $out"
done

RAW="$T/raw.tsv"
printf 'round\ttarget\tkind\trate\ttool\tticks\twall_s\tfile\n' >"$RAW"
CLK_TCK=$(getconf CLK_TCK)

# measure ROUND TARGET KIND RATE: one run; appends a line to $RAW.
measure() {
  local round=$1 tgt=$2 kind=$3 rate=$4
  local url="http://127.0.0.1:$(port_of "$tgt")/v1/chat/completions"
  local file="$T/r$round-$tgt-$kind-$rate.out" tool pids t0 t1 w0 w1
  read -r -a pids <<<"$(pids_of "$tgt")"
  t0=0; ((${#pids[@]})) && t0=$(cpu_ticks "${pids[@]}")
  w0=$(date +%s.%N)
  if [[ $kind == peak ]]; then
    tool=wrk
    run_pinned $LOAD_CPU timeout $((DURATION + 20)) wrk -t1 -c"$CONNS" -d"${DURATION}s" \
      --latency -s "$HERE/post.lua" "$url" >"$file" 2>&1 || log "$tgt peak: wrk exited $?"
  elif [[ $RATE_TOOL == wrk2 ]]; then
    tool=wrk2
    run_pinned $LOAD_CPU timeout $((DURATION + 20)) wrk2 -t1 -c"$CONNS" -d"${DURATION}s" \
      -R"$rate" --latency -s "$HERE/post.lua" "$url" >"$file" 2>&1 || log "$tgt $rate: wrk2 exited $?"
  else
    tool=oha
    run_pinned $LOAD_CPU timeout $((DURATION + 20)) oha --no-tui --output-format json \
      -z "${DURATION}s" -q "$rate" --latency-correction -c "$CONNS" -m POST \
      -H 'content-type: application/json' -d "$BODY" "$url" >"$file" 2>"$file.err" \
      || log "$tgt $rate: oha exited $?"
  fi
  w1=$(date +%s.%N)
  t1=0; ((${#pids[@]})) && t1=$(cpu_ticks "${pids[@]}")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$tgt" "$kind" "$rate" "$tool" \
    "$((t1 - t0))" "$(awk -v a="$w0" -v b="$w1" 'BEGIN{printf "%.3f", b-a}')" "$file" >>"$RAW"
}

# Warm-up: a few seconds per target (pools, caches, the origin's connections).
for tgt in $TARGETS; do
  run_pinned $LOAD_CPU timeout 10 wrk -t1 -c"$CONNS" -d2s -s "$HERE/post.lua" \
    "http://127.0.0.1:$(port_of "$tgt")/v1/chat/completions" >/dev/null 2>&1 || true
done

for round in $(seq 1 "$ROUNDS"); do
  for tgt in $TARGETS; do
    log "round $round/$ROUNDS: $tgt"
    measure "$round" "$tgt" peak 0
    for rate in $RATES; do measure "$round" "$tgt" rate "$rate"; done
  done
done

# Spillway's health after the runs: its own error counters and logs go into the report.
curl -s -m 5 "http://127.0.0.1:$P_ADMIN/metrics" >"$T/spillway-metrics.txt" || true
for tgt in $TARGETS; do
  [[ $tgt == direct ]] && continue
  pid=$(pids_of "$tgt" | awk '{print $1}')
  kill -0 "$pid" 2>/dev/null || log "warning: $tgt (pid $pid) is gone"
done

ELAPSED=$((SECONDS - START))
{
  echo "# Proxy overhead: direct vs Spillway vs the io_uring floor vs nginx vs HAProxy"
  echo
  echo "Generated by \`bench/proxy/run.sh\` (ROUNDS=$ROUNDS DURATION=${DURATION}s RATES=\"$RATES\" CONNS=$CONNS); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- Tools: $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), $(if [[ $RATE_TOOL == wrk2 ]]; then echo "wrk2 ($(command -v wrk2))"; else oha --version; fi), $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v | head -1 | cut -d' ' -f1-3), Python $(python3 -c 'import platform; print(platform.python_version())')"
  if [[ -n $BASELINE ]]; then
    echo "- \`spillway-base\`: $("$BASELINE" --version 2>/dev/null | head -1) ($BASELINE), the same configuration, in the same rounds"
  fi
  if [[ -n $PID_FORWARD ]]; then
    echo "- \`forwarder\`: bench/forward (crate spillway-bench-forward), one thread on monoio with Spillway's ring settings (2,048 entries, COOP_TASKRUN + SINGLE_ISSUER, fusion driver with its timer); each client connection has its own kept-alive upstream connection, requests and responses pass byte for byte. The floor a proxy on this ring reaches."
  fi
  echo "- Placement: proxy under test on CPU $PROXY_CPU (Spillway cores=1 cpus=[0] monitor_cpu=0; forwarder --cpu 0; nginx worker_processes 1 + worker_cpu_affinity 01; HAProxy nbthread 1 + cpu-map 1/1 0; all also under taskset -c 0); origin nginx and the load generator on CPU $LOAD_CPU."
} >"$T/header.md"
cp "$T/spillway.log" "$T/spillway-stderr.txt" 2>/dev/null || true

"$PY" "$HERE/report.py" --raw "$RAW" --header "$T/header.md" --clk-tck "$CLK_TCK" \
  --metrics "$T/spillway-metrics.txt" --spillway-log "$T/spillway.log" \
  --out-md "$RESULTS_DIR/proxy.md" --out-png "$RESULTS_DIR/proxy.png" \
  --out-raw "$RESULTS_DIR/proxy-raw.tsv"
log "done in ${ELAPSED}s: $RESULTS_DIR/proxy.md"

#!/usr/bin/env bash
# Where a proxy's CPU goes at saturation: Spillway and the io_uring floor (bench/forward)
# under bench/proxy/run.sh's peak load (wrk closed loop, CONNS connections, proxy alone on
# CPU 0, origin and wrk on CPU 1), each in four runs of DURATION seconds:
#
#   1. plain: CPU µs per request (utime and stime apart, /proc/PID/stat);
#   2. perf stat: syscalls, io_uring_enter calls, SQEs submitted and CQEs posted (by
#      opcode, from the io_uring tracepoints), context switches, per request;
#   3. perf record -e cpu-clock -g (this VM has no hardware counters): top symbols, user
#      against kernel;
#   4. plain again (a check that 1 was not a moment of the shared machine).
#
#   flock /tmp/bench.lock bench/proxy/peak.sh        # ~2.5 min; writes bench/work/peak/
#
# Knobs: DURATION=8 CONNS=64 TARGETS="spillway forwarder" BENCH_NICE=-10;
# SPILLWAY_BIN / FORWARDER_BIN as in every script. The summary (stdout and
# bench/work/peak/summary.md) is what bench/results/proxy-peak-30.md quotes.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
TARGETS=${TARGETS:-"spillway forwarder"}
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/proxy"
OUT="$WORK_DIR/peak"

bench_init peak
need wrk wrk
need nginx nginx-light
need perf linux-perf
ensure_spillway
ensure_forwarder
watchdog 400
mkdir -p "$OUT"
T=$BENCH_TMP
read -r P_ORIGIN P_SPILLWAY P_ADMIN P_FORWARD <<<"$(free_ports 4)"
origin_conf "$T/origin" "$P_ORIGIN" 10 >"$T/origin.conf"
spillway_proxy_toml "$PROXY_CPU" "$P_SPILLWAY" "$P_ADMIN" "$P_ORIGIN" >"$T/spillway.toml"
spawn $LOAD_CPU origin nginx -c "$T/origin.conf" -p "$T/origin"
wait_port "$P_ORIGIN" "$SPAWNED"
RUST_LOG=warn spawn $PROXY_CPU spillway "$SPILLWAY" --config "$T/spillway.toml"
PID_SPILLWAY=$SPAWNED
spawn $PROXY_CPU forwarder "$FORWARDER" --listen "127.0.0.1:$P_FORWARD" \
  --upstream "127.0.0.1:$P_ORIGIN" --cpu $PROXY_CPU
PID_FORWARD=$SPAWNED
wait_port "$P_SPILLWAY" "$PID_SPILLWAY"
wait_port "$P_FORWARD" "$PID_FORWARD"

port_of() { case $1 in spillway) echo "$P_SPILLWAY" ;; forwarder) echo "$P_FORWARD" ;; esac; }
pid_of() { case $1 in spillway) echo "$PID_SPILLWAY" ;; forwarder) echo "$PID_FORWARD" ;; esac; }
CLK_TCK=$(getconf CLK_TCK)
EVENTS=raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,io_uring:io_uring_submit_req
EVENTS+=,io_uring:io_uring_complete,io_uring:io_uring_task_work_run,context-switches

# load TARGET FILE: wrk at peak for DURATION seconds; prints the requests it counted.
load() {
  run_pinned $LOAD_CPU timeout $((DURATION + 20)) wrk -t1 -c"$CONNS" -d"${DURATION}s" \
    -s "$HERE/post.lua" "http://127.0.0.1:$(port_of "$1")/v1/chat/completions" >"$2" 2>&1 || true
  awk '/requests in/ {print $1}' "$2"
}

# utime stime of PID, in ticks.
times_of() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12, $13}'; }

# plain TARGET N: one run without perf; prints "µs/req user-µs/req kernel-µs/req req/s".
plain() {
  local pid u0 s0 u1 s1 n
  pid=$(pid_of "$1")
  read -r u0 s0 <<<"$(times_of "$pid")"
  n=$(load "$1" "$OUT/$1-plain$2.wrk")
  read -r u1 s1 <<<"$(times_of "$pid")"
  awk -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v n="$n" -v t="$CLK_TCK" -v d="$DURATION" \
    'BEGIN { printf "%.2f %.2f %.2f %.0f", (u + s) / t / n * 1e6, u / t / n * 1e6, s / t / n * 1e6, n / d }'
}

# Warm-up.
for tgt in $TARGETS; do load "$tgt" "$T/warm.wrk" >/dev/null; done

declare -A FIRST SECOND
for tgt in $TARGETS; do
  log "$tgt: plain"
  FIRST[$tgt]=$(plain "$tgt" 1)
  log "$tgt: perf stat"
  pid=$(pid_of "$tgt")
  perf stat -x, -e "$EVENTS" -p "$pid" -o "$OUT/$tgt.stat" -- sleep $((DURATION + 1)) &
  sp=$!
  sleep 0.5
  load "$tgt" "$OUT/$tgt-stat.wrk" >"$OUT/$tgt-stat.n"
  wait "$sp" || true
  log "$tgt: perf record (opcodes)"
  perf record -q -e io_uring:io_uring_submit_req -p "$pid" -o "$OUT/$tgt-ops.data" \
    -- sleep 2 >/dev/null 2>&1 &
  sp=$!
  load "$tgt" "$OUT/$tgt-ops.wrk" >"$OUT/$tgt-ops.n"
  wait "$sp" || true
  log "$tgt: perf record cpu-clock"
  perf record -q -e cpu-clock -g -p "$pid" -o "$OUT/$tgt.data" -- sleep $((DURATION - 1)) \
    >/dev/null 2>&1 &
  sp=$!
  load "$tgt" "$OUT/$tgt-record.wrk" >/dev/null
  wait "$sp" || true
  SECOND[$tgt]=$(plain "$tgt" 2)
done

{
  echo "| figure (per request at peak) | ${TARGETS// / | } |"
  echo "|---|$(for _ in $TARGETS; do printf -- '---|'; done)"
  for i in 1 2 3 4; do
    case $i in 1) name="CPU µs (run 1, run 2)" ;; 2) name="user µs" ;; 3) name="kernel µs" ;;
      4) name="req/s" ;; esac
    printf '| %s |' "$name"
    for tgt in $TARGETS; do
      a=$(cut -d' ' -f$i <<<"${FIRST[$tgt]}"); b=$(cut -d' ' -f$i <<<"${SECOND[$tgt]}")
      printf ' %s, %s |' "$a" "$b"
    done
    echo
  done
  for ev in ${EVENTS//,/ }; do
    printf '| %s |' "$ev"
    for tgt in $TARGETS; do
      n=$(cat "$OUT/$tgt-stat.n")
      awk -F, -v e="$ev" -v n="$n" '$3 == e { printf " %.2f |", $1 / n }' "$OUT/$tgt.stat"
    done
    echo
  done
  echo
  # The opcodes' shares (2 s of tracepoint records) applied to the SQEs per request above.
  for tgt in $TARGETS; do
    echo "SQE opcodes per request, $tgt:"
    sqes=$(awk -F, -v n="$(cat "$OUT/$tgt-stat.n")" \
      '$3 == "io_uring:io_uring_submit_req" { print $1 / n }' "$OUT/$tgt.stat")
    perf script -i "$OUT/$tgt-ops.data" -F trace 2>/dev/null \
      | grep -o 'opcode [A-Z_]*' | sort | uniq -c | sort -rn \
      | awk -v s="$sqes" '{ c[$3] = $1; t += $1 } END { for (o in c) printf "  %-22s %.2f\n", o, c[o] / t * s }' \
      || true
  done
} | tee "$OUT/summary.md"
# Flat profiles (the proxies are built without frame pointers: call chains are partial).
for tgt in $TARGETS; do
  perf report -i "$OUT/$tgt.data" --no-children --sort dso --stdio -g none 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | head -8 >"$OUT/$tgt-dso.txt" || true
  perf report -i "$OUT/$tgt.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | head -60 >"$OUT/$tgt-sym.txt" || true
done
log "done: $OUT/summary.md, $OUT/*-dso.txt, $OUT/*-sym.txt"

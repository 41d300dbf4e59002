#!/usr/bin/env bash
# Soak: does Spillway's memory, fd count or CPU creep under long mixed traffic?
#
#   bench/soak/run.sh             # ~11 min; writes bench/results/soak.md and soak.png
#   DURATION=60 bench/soak/run.sh # a short try
#
# Spillway (release build, cores = 2, unpinned) in front of three mock engines
# (`spillway mock-engine`): two serve `mock-model` (pushing their load to the admin port,
# busy thresholds and an admission cap of ENGINE_N + ENGINE_Q per engine), one serves
# `tight-model` (scraped; one slot, two queue places: most of its traffic is refused with
# 529); `gone-model`'s only worker is a port nothing listens on (503). For DURATION seconds
# bench/soak/traffic.py sends open-loop mixed traffic, one connection per request:
# streaming and non-streaming chat, clients that leave (right after sending, after the
# first event, after four; half with a reset), the tight and gone models, and malformed
# or unknown-model requests; wrk2 (when found) adds keep-alive non-streaming requests at
# WRK_RATE; every RELOAD_EVERY seconds the proxy gets a SIGHUP (a reload of the same file).
# Every INTERVAL seconds the sampler records Spillway's RSS (VmRSS), open fds, threads,
# CPU (utime + stime) and, from its /metrics, requests answered by outcome; it goes on for
# COOLDOWN seconds after the traffic stops.
#
# Output: bench/results/soak.md (samples at start, 25/50/75 %, end; RSS and fds after the
# WARMUP: slope and first against last) and soak.png (RSS, fds, CPU, answers/s over time);
# the raw samples, traffic counts, wrk2 output, final /metrics and Spillway's log in
# bench/work/soak/ (git-ignored).
#
# Knobs (environment, defaults below): DURATION INTERVAL WARMUP COOLDOWN CORES
# STREAM_RATE PLAIN_RATE ABORT_RATE TIGHT_RATE GONE_RATE BAD_RATE MAX_TOKENS WRK_RATE
# WRK_CONNS RELOAD_EVERY ENGINE_N ENGINE_Q MAX_SECONDS (watchdog) BENCH_NICE SPILLWAY_BIN.
#
# It measures memory and fds, not latency: everything runs at normal priority
# (BENCH_NICE=0) and unpinned, beside whatever else the machine runs.

BENCH_NICE=${BENCH_NICE:-0}
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

DURATION=${DURATION:-600}
INTERVAL=${INTERVAL:-5}
COOLDOWN=${COOLDOWN:-20}
# Warm-up excluded from the flatness check: pools, buffers and the allocator's arenas
# reach their working size in the first minute (a quarter of a shorter run).
WARMUP=${WARMUP:-$(( DURATION / 4 < 60 ? DURATION / 4 : 60 ))}
CORES=${CORES:-2}
STREAM_RATE=${STREAM_RATE:-20}
PLAIN_RATE=${PLAIN_RATE:-20}
ABORT_RATE=${ABORT_RATE:-10}
TIGHT_RATE=${TIGHT_RATE:-10}
GONE_RATE=${GONE_RATE:-2}
BAD_RATE=${BAD_RATE:-2}
MAX_TOKENS=${MAX_TOKENS:-32}
WRK_RATE=${WRK_RATE:-300}
WRK_CONNS=${WRK_CONNS:-48}
RELOAD_EVERY=${RELOAD_EVERY:-60}
ENGINE_N=${ENGINE_N:-48}
ENGINE_Q=${ENGINE_Q:-8}
MAX_SECONDS=${MAX_SECONDS:-$((DURATION + COOLDOWN + 240))}
HERE="$BENCH_DIR/soak"
OUT="$WORK_DIR/soak"
CPUS="0-$(($(nproc) - 1))"
MODEL=mock-model

bench_init soak
START=$SECONDS
need python3 python3
need taskset util-linux
need ss iproute2
need curl curl
WRK2=$(command -v wrk2 || true)
[[ -z $WRK2 && -x /opt/wrk2bin/wrk2 ]] && WRK2=/opt/wrk2bin/wrk2
[[ -z $WRK2 ]] && log "wrk2 not found (PATH, /opt/wrk2bin): no keep-alive traffic (see bench/README.md)"
ensure_venv
ensure_spillway
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
rm -rf "$OUT" && mkdir -p "$OUT"
read -r P_PROXY P_ADMIN P_E1 P_E2 P_E3 P_GONE <<<"$(free_ports 6)"

# --- engines --------------------------------------------------------------------------
engine() { # name port model [extra args...]
  local name=$1 port=$2 model=$3; shift 3
  port_unused "$port"
  spawn "$CPUS" "$name" "$SPILLWAY" mock-engine --listen "127.0.0.1:$port" --model "$model" \
    --default-max-tokens "$MAX_TOKENS" "$@"
  wait_port "$port" "$SPAWNED"
}
push=(--push-load "http://127.0.0.1:$P_ADMIN" --push-interval-ms 50)
engine e1 "$P_E1" $MODEL "${push[@]}" --worker-name e1
engine e2 "$P_E2" $MODEL "${push[@]}" --worker-name e2
engine t1 "$P_E3" tight-model

# --- Spillway -------------------------------------------------------------------------
cat >"$T/spillway.toml" <<EOF
listen = "127.0.0.1:$P_PROXY"
admin_listen = "127.0.0.1:$P_ADMIN"
cores = $CORES
pin_cores = false
monitor_interval_ms = 20
scrape_interval_ms = 200

[[models]]
name = "$MODEL"
router_mode = "least-loaded"
active_prefill_tokens_threshold = 1024
active_decode_blocks_threshold = 0.9

[[models.workers]]
url = "http://127.0.0.1:$P_E1"
name = "e1"
load_sources = ["push", "tracked"]
engine_request_limit = $ENGINE_N
request_queue_limit = $ENGINE_Q
request_queue_timeout_ms = 100

[[models.workers]]
url = "http://127.0.0.1:$P_E2"
name = "e2"
load_sources = ["push", "tracked"]
engine_request_limit = $ENGINE_N
request_queue_limit = $ENGINE_Q
request_queue_timeout_ms = 100

[[models]]
name = "tight-model"

[[models.workers]]
url = "http://127.0.0.1:$P_E3"
name = "t1"
load_sources = ["scrape", "tracked"]
engine_request_limit = 1
request_queue_limit = 2
request_queue_timeout_ms = 50

[[models]]
name = "gone-model"

[[models.workers]]
url = "http://127.0.0.1:$P_GONE"
name = "gone"
EOF
"$SPILLWAY" check-config "$T/spillway.toml" >/dev/null 2>"$T/check.err" \
  || { cat "$T/check.err" >&2; die "spillway config invalid"; }
port_unused "$P_PROXY"
RUST_LOG=warn spawn "$CPUS" spillway "$SPILLWAY" --config "$T/spillway.toml"
PID_SPILLWAY=$SPAWNED
wait_port "$P_PROXY" "$PID_SPILLWAY"
wait_port "$P_ADMIN" "$PID_SPILLWAY"
out=$(curl -s -m 5 -H 'content-type: application/json' \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}" \
  "http://127.0.0.1:$P_PROXY/v1/chat/completions") || die "first request failed"
[[ $out == *chat.completion* ]] || die "unexpected answer: $out"

# --- sampler, then traffic ------------------------------------------------------------
spawn "$CPUS" sampler "$PY" "$HERE/report.py" sample --pid "$PID_SPILLWAY" \
  --admin-port "$P_ADMIN" --interval "$INTERVAL" --out "$OUT/samples.csv"
PID_SAMPLER=$SPAWNED
sleep "$INTERVAL" # one idle sample first
log "traffic for ${DURATION}s (sampling every ${INTERVAL}s; results when done, ~$(((DURATION + COOLDOWN) / 60 + 1)) min)"
TRAFFIC_START=$SECONDS
spawn "$CPUS" traffic timeout $((DURATION + 60)) "$PY" "$HERE/traffic.py" --port "$P_PROXY" \
  --duration "$DURATION" --max-tokens "$MAX_TOKENS" --progress 60 \
  --stream-rate "$STREAM_RATE" --plain-rate "$PLAIN_RATE" --abort-rate "$ABORT_RATE" \
  --tight-rate "$TIGHT_RATE" --gone-rate "$GONE_RATE" --bad-rate "$BAD_RATE" \
  --out "$OUT/traffic.json"
PID_TRAFFIC=$SPAWNED
PID_WRK=""
if [[ -n $WRK2 && $WRK_RATE != 0 ]]; then
  cat >"$T/chat.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"$MODEL","messages":[{"role":"user","content":"keep-alive soak"}],"max_tokens":8}'
EOF
  spawn "$CPUS" wrk2 timeout $((DURATION + 30)) "$WRK2" -t1 -c"$WRK_CONNS" -d"${DURATION}s" \
    -R"$WRK_RATE" --latency -s "$T/chat.lua" "http://127.0.0.1:$P_PROXY/v1/chat/completions"
  PID_WRK=$SPAWNED
fi
RELOADS=0
while kill -0 "$PID_TRAFFIC" 2>/dev/null; do
  sleep 1
  kill -0 "$PID_SPILLWAY" 2>/dev/null || die "spillway exited during the soak: $(tail -5 "$T/spillway.log")"
  if ((RELOAD_EVERY > 0 && SECONDS - TRAFFIC_START >= (RELOADS + 1) * RELOAD_EVERY)); then
    kill -HUP "$PID_SPILLWAY" && RELOADS=$((RELOADS + 1))
  fi
done
wait "$PID_TRAFFIC" 2>/dev/null || log "traffic generator exited with an error: $(tail -3 "$T/traffic.log")"
[[ -n $PID_WRK ]] && { wait "$PID_WRK" 2>/dev/null || true; cp "$T/wrk2.log" "$OUT/wrk2.txt"; }
TRAFFIC_END=$((INTERVAL + DURATION)) # the arrivals end, in the sampler's seconds
log "traffic done; cool-down ${COOLDOWN}s"
sleep "$COOLDOWN"
stop_pid "$PID_SAMPLER"

# --- health, then the report ----------------------------------------------------------
alive=yes; kill -0 "$PID_SPILLWAY" 2>/dev/null || alive=no
curl -s -m 5 "http://127.0.0.1:$P_ADMIN/metrics" >"$OUT/metrics-end.txt" || true
stop_pid "$PID_SPILLWAY"
cp "$T/spillway.log" "$OUT/spillway.log"
cp "$T/traffic.log" "$OUT/traffic.log"
cp "$T/spillway.toml" "$OUT/spillway.toml"
metric() { awk -v s="$1" '$1 == s {print $2}' "$OUT/metrics-end.txt"; }
warns=$(grep -E ' (WARN|ERROR) ' "$OUT/spillway.log" || true)
{
  echo "- Spillway still running at the end: $alive; SIGHUP reloads sent: $RELOADS, applied: $(metric 'spillway_config_reloads_total{result="ok"}'), failed: $(metric 'spillway_config_reloads_total{result="error"}')."
  if [[ -z $warns ]]; then
    echo "- Log lines at warn or above (RUST_LOG=warn): none."
  else
    echo "- Log lines at warn or above (RUST_LOG=warn): $(wc -l <<<"$warns"), by message (first five):"
    sed -E 's/^[^ ]+ +//; s/ [a-z_.]+=.*$//' <<<"$warns" | cut -c1-140 | sort | uniq -c | sort -rn | head -5 \
      | sed -E 's/^ *([0-9]+) (.*)$/  - \1 × `\2`/'
  fi
  echo "- Spillway's counters at the end: client connections $(metric spillway_connections_total), refused over max_connections $(metric spillway_connections_refused_total), bad requests $(metric spillway_bad_requests_total), clients gone mid-request $(metric spillway_client_disconnects_total), upstream connects $(metric spillway_upstream_connects_total) (failed: $(metric spillway_upstream_connect_failures_total)), busy-set publishes $(metric spillway_busy_publish_total)."
} >"$T/health.md"

ELAPSED=$((SECONDS - START))
{
  echo "# Soak: Spillway under ${DURATION} s of mixed traffic"
  echo
  echo "Generated by \`bench/soak/run.sh\` (DURATION=${DURATION}s INTERVAL=${INTERVAL}s WARMUP=${WARMUP}s COOLDOWN=${COOLDOWN}s CORES=$CORES RELOAD_EVERY=${RELOAD_EVERY}s); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- Tools: Python $("$PY" -c 'import platform; print(platform.python_version())') asyncio traffic (bench/soak/traffic.py)$([[ -n $PID_WRK ]] && echo ", wrk2 ($WRK2) -t1 -c$WRK_CONNS -R$WRK_RATE"), matplotlib $("$PY" -c 'import matplotlib; print(matplotlib.__version__)')"
  echo "- Setup: Spillway cores = $CORES (unpinned), monitor_interval_ms = 20, scrape_interval_ms = 200; \`mock-model\` on two mock engines (push every 50 ms, busy thresholds prefill 1024 / decode 0.9, admission $ENGINE_N + $ENGINE_Q each), \`tight-model\` on one (scraped, admission 1 + 2), \`gone-model\` on a closed port; everything on CPUs $CPUS at nice $BENCH_NICE. The config is in bench/work/soak/spillway.toml."
} >"$T/header.md"
"$PY" "$HERE/report.py" report --csv "$OUT/samples.csv" --csv-name bench/work/soak/samples.csv \
  --traffic "$OUT/traffic.json" ${PID_WRK:+--wrk "$OUT/wrk2.txt" --wrk-rate "$WRK_RATE"} \
  --header "$T/header.md" --health "$T/health.md" --interval "$INTERVAL" \
  --warmup $((INTERVAL + WARMUP)) --traffic-start "$INTERVAL" --traffic-end "$TRAFFIC_END" \
  --out-md "$RESULTS_DIR/soak.md" --out-png "$RESULTS_DIR/soak.png"
log "done in ${ELAPSED}s: $RESULTS_DIR/soak.md, $RESULTS_DIR/soak.png (raw: $OUT/)"

#!/usr/bin/env bash
# Replica sync: does sharing routed load between front-door replicas (`[nats] replica_sync`)
# help, and how much?
#
#   bench/fleet/replicas.sh      # ~4 min; writes bench/results/replicas.md
#
# Two mock engines (the overload bench's, capacity C each, C from the mock's time model)
# whose load only the front doors know: `load_sources = ["tracked"]`, busy above
# SHED_PREFILL prefill tokens or SHED_DECODE of the KV blocks, least-loaded routing, no
# engine_request_limit (the busy view alone decides). Open-loop streaming chat
# completions (bench/lib/spillbench/loadgen.py) at LOADS × C in total, for three setups:
#   single   one front door takes all of it (what the thresholds were set for)
#   nosync   two front doors, requests alternating between them; each sees only what it
#            routed, so an engine fed by both reaches up to twice the threshold
#   sync     the same two doors sharing their routed load over NATS every PUBLISH_MS
# Per run: completed req/s, refused share, admitted TTFT p50/p99, and the engines' own
# queue (running + waiting, summed over both, sampled every 100 ms while arrivals last).
# Placement: the doors (cores=1 each) and nats-server on CPU 0; engines, load generator
# and sampler on CPU 1. Runs are interleaved per load; every run starts fresh processes.
#
# Knobs (environment): LOADS DURATION WARMUP DRAIN PROMPT_BYTES MAX_TOKENS SHED_PREFILL
# SHED_DECODE MONITOR_MS PUBLISH_MS SETUPS RESULT_NAME MAX_SECONDS.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

LOADS=${LOADS:-"1 3"}
SETUPS=${SETUPS:-"single nosync sync"}
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-5}
DRAIN=${DRAIN:-4}
PROMPT_BYTES=${PROMPT_BYTES:-1024}
MAX_TOKENS=${MAX_TOKENS:-64}
SHED_PREFILL=${SHED_PREFILL:-512}
SHED_DECODE=${SHED_DECODE:-0.9}
MONITOR_MS=${MONITOR_MS:-5}
PUBLISH_MS=${PUBLISH_MS:-10}
RESULT_NAME=${RESULT_NAME:-replicas}
MAX_SECONDS=${MAX_SECONDS:-600}
KV_BLOCKS=2048; BLOCK_SIZE=16; MAX_NUM_SEQS=64; MAX_NUM_BATCHED_TOKENS=2048
PREFILL_TPS=20000; STEP_MS=8; STEP_PER_SEQ_MS=0.25
MODEL=mock-model
NATS_SERVER=${NATS_SERVER:-/usr/sbin/nats-server}
DOOR_CPU=0
LOAD_CPU=1

bench_init replicas
START=$SECONDS
need python3 python3
need taskset util-linux
need ss iproute2
need curl curl
[[ -x $NATS_SERVER ]] || need nats-server nats-server
ensure_venv
ensure_spillway
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
mkdir -p "$T/runs"
read -r P_D1 P_A1 P_D2 P_A2 P_E1 P_E2 P_NATS <<<"$(free_ports 7)"

read -r C_1 <<<"$("$PY" -m spillbench capacity --prompt-bytes "$PROMPT_BYTES" \
  --max-tokens "$MAX_TOKENS" --max-num-seqs $MAX_NUM_SEQS --kv-blocks $KV_BLOCKS \
  --block-size $BLOCK_SIZE --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS \
  --prefill-tps $PREFILL_TPS --step-ms $STEP_MS --step-per-seq-ms $STEP_PER_SEQ_MS)"
C=$(awk -v c="$C_1" 'BEGIN{printf "%.2f", 2*c}')
log "capacity from the time model: $C_1 req/s per engine, C = $C req/s for two"

spawn $DOOR_CPU nats "$NATS_SERVER" -a 127.0.0.1 -p "$P_NATS"
NATS_PID=$SPAWNED
wait_port "$P_NATS" "$NATS_PID"

start_engines() {
  local e
  for e in 1 2; do
    local port_var="P_E$e"
    port_unused "${!port_var}"
    spawn_mock_engine $LOAD_CPU "engine$e" "${!port_var}"
    eval "PID_E$e=$SPAWNED"
  done
  wait_port "$P_E1" "$PID_E1"; wait_port "$P_E2" "$PID_E2"
}
stop_engines() { stop_pid "$PID_E1"; stop_pid "$PID_E2"; }

door_config() { # door setup
  local dp="P_D$1" ap="P_A$1"
  cat <<EOF
listen = "127.0.0.1:${!dp}"
admin_listen = "127.0.0.1:${!ap}"
cores = 1
cpus = [$DOOR_CPU]
monitor_cpu = $DOOR_CPU
monitor_interval_ms = $MONITOR_MS
EOF
  if [[ $2 == sync ]]; then
    printf '\n[nats]\nurl = "nats://127.0.0.1:%s"\nreplica_sync = "spillway.bench.routed"\npublish_interval_ms = %s\n' \
      "$P_NATS" "$PUBLISH_MS"
  fi
  cat <<EOF

[[models]]
name = "$MODEL"
router_mode = "least-loaded"
active_prefill_tokens_threshold = $SHED_PREFILL
active_decode_blocks_threshold = $SHED_DECODE
EOF
  local e
  for e in 1 2; do
    local port_var="P_E$e"
    printf '\n[[models.workers]]\nurl = "http://127.0.0.1:%s"\nname = "e%s"\nkv_total_blocks = %s\nmax_num_batched_tokens = %s\nload_sources = ["tracked"]\n' \
      "${!port_var}" "$e" "$KV_BLOCKS" "$MAX_NUM_BATCHED_TOKENS"
  done
}

DOOR_PIDS=()
start_doors() { # setup tag
  local n=2 d
  [[ $1 == single ]] && n=1
  DOOR_PIDS=()
  for ((d = 1; d <= n; d++)); do
    local dp="P_D$d"
    port_unused "${!dp}"
    door_config "$d" "$1" >"$T/door$d-$1.toml"
    "$SPILLWAY" check-config "$T/door$d-$1.toml" >/dev/null 2>"$T/check.err" \
      || { cat "$T/check.err" >&2; die "spillway config invalid"; }
    RUST_LOG=warn spawn $DOOR_CPU "door$d-$2" "$SPILLWAY" --config "$T/door$d-$1.toml"
    DOOR_PIDS+=("$SPAWNED")
    wait_port "${!dp}" "$SPAWNED"
  done
  if [[ $1 == sync ]]; then
    # Both doors hear each other before the load starts.
    local deadline=$((SECONDS + 10)) a
    for a in "$P_A1" "$P_A2"; do
      until curl -s -m 1 "http://127.0.0.1:$a/metrics" | grep -q '^spillway_nats_replica_peers 1$'; do
        ((SECONDS < deadline)) || die "door on admin port $a never heard its peer"
        sleep 0.1
      done
    done
  fi
}
stop_doors() { local p; for p in "${DOOR_PIDS[@]}"; do stop_pid "$p"; done; }

# sample OUT SECONDS: every 100 ms, "t running waiting" summed over both engines.
sample() {
  local out=$1 secs=$2 t0=$EPOCHREALTIME
  : >"$out"
  while awk -v a="$EPOCHREALTIME" -v b="$t0" -v s="$secs" 'BEGIN{exit !(a - b < s)}'; do
    local r=0 w=0 e
    for e in "$P_E1" "$P_E2"; do
      read -r rr ww < <(curl -s -m 1 "http://127.0.0.1:$e/metrics" | awk '
        /^vllm:num_requests_running\{/ {r += $NF} /^vllm:num_requests_waiting\{/ {w += $NF}
        END {printf "%d %d\n", r, w}') || true
      r=$((r + ${rr:-0})); w=$((w + ${ww:-0}))
    done
    echo "$(awk -v a="$EPOCHREALTIME" -v b="$t0" 'BEGIN{printf "%.2f", a - b}') $r $w" >>"$out"
    sleep 0.1
  done
}

SUMMARY="$T/summary.jsonl"
: >"$SUMMARY"
for k in $LOADS; do
  rate=$(awk -v k="$k" -v c="$C" 'BEGIN{printf "%.2f", k*c}')
  for setup in $SETUPS; do
    log "load ${k}×C = $rate req/s: $setup"
    tag="$setup-$k"
    start_engines
    start_doors "$setup" "$k"
    ports=$P_D1
    [[ $setup != single ]] && ports="$P_D1,$P_D2"
    spawn $LOAD_CPU "sampler-$tag" bash -c "$(declare -f sample); P_E1=$P_E1 P_E2=$P_E2 sample '$T/runs/$tag.queue' $DURATION"
    SAMPLER=$SPAWNED
    c0=$(cpu_ticks "${DOOR_PIDS[@]}")
    run_pinned $LOAD_CPU timeout $((DURATION + DRAIN + 60)) "$PY" -m spillbench.loadgen \
      --model $MODEL --prompt-bytes "$PROMPT_BYTES" --max-tokens "$MAX_TOKENS" \
      --label "$tag" --out "$T/runs/$tag.jsonl" --ports "$ports" --rate "$rate" \
      --duration "$DURATION" --drain "$DRAIN" --seed 7 2>>"$T/loadgen.err" \
      || die "load generator failed: $(tail -5 "$T/loadgen.err")"
    c1=$(cpu_ticks "${DOOR_PIDS[@]}")
    stop_pid "$SAMPLER"
    printf '{"setup":"%s","load":%s,"rate":%s,"file":"%s","queue":"%s","door_ticks":%s}\n' \
      "$setup" "$k" "$rate" "$T/runs/$tag.jsonl" "$T/runs/$tag.queue" "$((c1 - c0))" >>"$SUMMARY"
    stop_doors
    stop_engines
  done
done

ELAPSED=$((SECONDS - START))
{
  echo "# Replica sync: two front doors sharing their routed load over NATS, or not"
  echo
  echo "Generated by \`bench/fleet/replicas.sh\` (LOADS=\"$LOADS\" DURATION=${DURATION}s WARMUP=${WARMUP}s DRAIN=${DRAIN}s PROMPT_BYTES=$PROMPT_BYTES MAX_TOKENS=$MAX_TOKENS SHED_PREFILL=$SHED_PREFILL SHED_DECODE=$SHED_DECODE MONITOR_MS=$MONITOR_MS PUBLISH_MS=$PUBLISH_MS); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- $("$NATS_SERVER" --version 2>&1 | head -1); placement: front doors (cores=1 each, monitor on the same CPU) and nats-server on CPU $DOOR_CPU; both mock engines, the load generator and the queue sampler on CPU $LOAD_CPU."
  echo "- Engines (each): \`spillway mock-engine $(mock_engine_flags)\`; C = $C req/s for both (the mock's time model)."
  echo "- Doors: least-loaded, \`load_sources = [\"tracked\"]\`, active_prefill_tokens_threshold = $SHED_PREFILL, active_decode_blocks_threshold = $SHED_DECODE, no engine_request_limit; requests alternate between the two doors (nosync, sync)."
} >"$T/header.md"

"$PY" "$BENCH_DIR/fleet/replicas_report.py" --summary "$SUMMARY" --header "$T/header.md" \
  --warmup "$WARMUP" --duration "$DURATION" --max-tokens "$MAX_TOKENS" \
  --clk-tck "$(getconf CLK_TCK)" --out-md "$RESULTS_DIR/$RESULT_NAME.md"
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

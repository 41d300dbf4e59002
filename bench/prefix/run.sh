#!/usr/bin/env bash
# Prefix reuse: does KV-aware routing send a conversation's next turn to the engine that
# still holds its history, and what does that do to TTFT?
#
#   bench/prefix/run.sh    # ~11 min; writes bench/results/prefix.md, prefix.png, prefix-summary.json
#
# ENGINES mock engines (`spillway mock-engine --enable-prefix-caching`, identical settings)
# behind one Spillway. Multi-turn chat (bench/prefix/loadgen.py): CONVERSATIONS conversations
# of TURNS turns, each turn resending a shared system prompt, the conversation's earlier turns
# and a new user message; open loop (Poisson arrivals at LOADS × C), an arrival goes to the
# conversation that has been ready longest, a conversation's next turn only after its
# previous one completed. Setups (each run: fresh engines, fresh proxy; interleaved per load):
#   kv            router_mode = "kv" (prefix-aware, Spillway's predicted-cache index), with
#                 router_prefill_load_scale = PREFILL_LOAD_SCALE (8 here: on this engine a block
#                 of prefill, 16 tokens at 20k tokens/s, costs 0.8 ms of step time, so reusing a
#                 block outweighs more of the decode-load difference than Dynamo's default 1.0
#                 lets it; see the report)
#   kv-default    the same with Dynamo's default router_prefill_load_scale = 1.0
#   round-robin   router_mode = "round-robin"
#   power-of-two  router_mode = "power-of-two"
#   least-loaded  router_mode = "least-loaded"
#   oracle        router_mode = "direct", conversation c pinned to engine c mod ENGINES through
#                 the x-worker-id header: perfect affinity; its measured hit rate is the
#                 reference the others are compared with
# A setup the binary does not accept (`spillway check-config` refuses its config, e.g.
# router_mode = "kv" before it exists) is skipped with a log line; engines without
# --enable-prefix-caching run without it (hit rates then read "–", with a warning).
#
# C, the loads' unit (CAPACITY):
#   round-robin (default)  the fleet's capacity as a cache-blind router finds it: the
#                          throughput of a closed loop (CAP_STREAMS conversations back to
#                          back) through Spillway in round-robin mode, engines with their
#                          prefix cache: what an operator measures before turning kv on.
#                          At 1×C round-robin is at its limit; a router that keeps more of the
#                          reuse has headroom there.
#   model                  the engines' capacity WITHOUT prefix reuse, from the mock's time
#                          model (`python3 -m spillbench capacity`, with the
#                          workload's mean prompt), checked by a closed loop with caching
#                          off straight to the engines. Every router has headroom at 1×C.
# Placement: Spillway (cores = 1) on CPU 0; the engines and the load generator on CPU 1.
#
# Knobs (environment, defaults below): LOADS SETUPS DURATION WARMUP DRAIN ENGINES
# CONVERSATIONS TURNS SYSTEM_TOKENS USER_TOKENS ASSISTANT_TOKENS MAX_TOKENS KV_BLOCKS
# PREFIX_CACHING (0: engines without the prefix cache) CAPACITY CAP_DURATION (0: no
# measurement; CAPACITY=model only)
# CAP_WARMUP CAP_STREAMS KV_BLOCK_SIZE ROUTER_TEMPERATURE PREFILL_LOAD_SCALE ROUTER_TTL_SECS
# PUSH_MS (empty: engines do not push load; Spillway tracks its own) SPILLWAY_EXTRA_TOML
# (appended to every Spillway config's [[models]] section) SEED RESULT_NAME NOTE
# MAX_SECONDS (watchdog, after installs) BENCH_NICE KEEP_RAW=1 (raw data in bench/work)
# SPILLWAY_BIN (a binary to use as is, e.g. one with router_mode = "kv").

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

LOADS=${LOADS:-"0.5 1 1.5"}
SETUPS=${SETUPS:-"kv kv-default round-robin power-of-two least-loaded oracle"}
DURATION=${DURATION:-34}
WARMUP=${WARMUP:-14}     # ≥ CONVERSATIONS / lowest rate: the cold first turns (see loadgen.py)
DRAIN=${DRAIN:-4}
ENGINES=${ENGINES:-4}
CONVERSATIONS=${CONVERSATIONS:-160}
TURNS=${TURNS:-8}
SYSTEM_TOKENS=${SYSTEM_TOKENS:-768}      # 3 KB shared by every conversation
USER_TOKENS=${USER_TOKENS:-128}
MAX_TOKENS=${MAX_TOKENS:-64}
ASSISTANT_TOKENS=${ASSISTANT_TOKENS:-256} # reply length in the history (see loadgen.py)
PREFIX_CACHING=${PREFIX_CACHING:-1}
CAPACITY=${CAPACITY:-round-robin}        # the loads' unit C: round-robin | model (above)
CAP_DURATION=${CAP_DURATION:-30}         # capacity measurement: closed loop
CAP_WARMUP=${CAP_WARMUP:-12}
MAX_SECONDS=${MAX_SECONDS:-900}
SEED=${SEED:-7}
# The mock engine: bench/overload's settings, except the KV cache (see the report's
# "Engines" line): prompts here are ~9× longer, and the prefix cache holds this many blocks.
KV_BLOCKS=${KV_BLOCKS:-16384}
BLOCK_SIZE=16; MAX_NUM_SEQS=64; MAX_NUM_BATCHED_TOKENS=2048
PREFILL_TPS=20000; STEP_MS=8; STEP_PER_SEQ_MS=0.25
CAP_STREAMS=${CAP_STREAMS:-$((ENGINES * MAX_NUM_SEQS * 5 / 4))}
MODEL=mock-model
# router_mode = "kv" keys (Spillway's defaults, spelled out, but the prefill load scale).
KV_BLOCK_SIZE=${KV_BLOCK_SIZE:-16}
ROUTER_TEMPERATURE=${ROUTER_TEMPERATURE:-0.0}
PREFILL_LOAD_SCALE=${PREFILL_LOAD_SCALE:-8}   # setup kv; kv-default uses 1.0
ROUTER_TTL_SECS=${ROUTER_TTL_SECS:-120}
PUSH_MS=${PUSH_MS:-}
SPILLWAY_EXTRA_TOML=${SPILLWAY_EXTRA_TOML:-}
RESULT_NAME=${RESULT_NAME:-prefix}
PIN_HEADER=x-worker-id
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/prefix"

bench_init prefix
START=$SECONDS
need python3 python3
need taskset util-linux
need ss iproute2
need curl curl
ensure_venv
ensure_spillway
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
mkdir -p "$T/runs"
read -r -a PORTS <<<"$(free_ports $((ENGINES + 2)))"
P_PROXY=${PORTS[0]}
P_ADMIN=${PORTS[1]}
P_ENG=("${PORTS[@]:2}")
NAMES=()
for ((e = 0; e < ENGINES; e++)); do NAMES+=("e$e"); done
PIN_NAMES=$(IFS=,; echo "${NAMES[*]}")
ENGINE_PORTS=$(IFS=,; echo "${P_ENG[*]}")
ENGINE_METRICS=$(for p in "${P_ENG[@]}"; do printf 'http://127.0.0.1:%s/metrics,' "$p"; done)
ENGINE_METRICS=${ENGINE_METRICS%,}
WORKLOAD=(--model "$MODEL" --conversations "$CONVERSATIONS" --turns "$TURNS"
  --system-tokens "$SYSTEM_TOKENS" --user-tokens "$USER_TOKENS"
  --assistant-tokens "$ASSISTANT_TOKENS" --max-tokens "$MAX_TOKENS" --seed "$SEED")

# The engines' support for the prefix cache (a newer mock has the flag).
CACHE_ARGS=()
CACHE_NOTE=""
if [[ $PREFIX_CACHING == 1 ]]; then
  if "$SPILLWAY" mock-engine --help 2>/dev/null | grep -q -- '--enable-prefix-caching'; then
    CACHE_ARGS=(--enable-prefix-caching)
  else
    CACHE_NOTE="the mock engine of $SPILLWAY has no --enable-prefix-caching: engines run without a prefix cache, hit rates are not measured"
    log "warning: $CACHE_NOTE"
  fi
else
  CACHE_NOTE="PREFIX_CACHING=0: engines run without a prefix cache"
fi

# The workload's prompt sizes and the time model's capacity without prefix reuse.
DESCRIBE=$("$PY" "$HERE/loadgen.py" "${WORKLOAD[@]}" --describe)
MEAN_PTOK=$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["mean_prompt_tokens"])' "$DESCRIBE")
read -r C_MODEL_1 <<<"$("$PY" -m spillbench capacity --mean-prompt-tokens "$MEAN_PTOK" \
  --max-tokens "$MAX_TOKENS" --max-num-seqs $MAX_NUM_SEQS --kv-blocks "$KV_BLOCKS" \
  --block-size $BLOCK_SIZE --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS \
  --prefill-tps $PREFILL_TPS --step-ms $STEP_MS --step-per-seq-ms $STEP_PER_SEQ_MS)"
C_MODEL=$(awk -v c="$C_MODEL_1" -v n="$ENGINES" 'BEGIN{printf "%.2f", n*c}')
log "workload: mean prompt $MEAN_PTOK tokens; C (time model, no reuse) = $C_MODEL_1 req/s per engine, $C_MODEL for $ENGINES"

PID_ENG=()
start_engines() { # tag cache(yes|no)
  local e push=() cache=()
  [[ $2 == yes ]] && cache=("${CACHE_ARGS[@]}")
  PID_ENG=()
  for ((e = 0; e < ENGINES; e++)); do
    port_unused "${P_ENG[e]}"
    [[ -n $PUSH_MS ]] && push=(--push-load "http://127.0.0.1:$P_ADMIN" --worker-name "${NAMES[e]}"
      --push-interval-ms "$PUSH_MS")
    spawn_mock_engine $LOAD_CPU "engine$e-$1" "${P_ENG[e]}" "${cache[@]}" "${push[@]}"
    PID_ENG+=("$SPAWNED")
  done
  for ((e = 0; e < ENGINES; e++)); do wait_port "${P_ENG[e]}" "${PID_ENG[e]}"; done
}
stop_engines() { local p; for p in "${PID_ENG[@]}"; do stop_pid "$p"; done; }

spillway_config() { # setup
  local mode=$1 e scale=$PREFILL_LOAD_SCALE
  [[ $1 == oracle ]] && mode=direct
  [[ $1 == kv-default ]] && mode=kv && scale=1.0
  cat <<EOF
listen = "127.0.0.1:$P_PROXY"
admin_listen = "127.0.0.1:$P_ADMIN"
cores = 1
cpus = [$PROXY_CPU]
monitor_cpu = $PROXY_CPU

[[models]]
name = "$MODEL"
router_mode = "$mode"
EOF
  if [[ $mode == kv ]]; then
    echo "kv_cache_block_size = $KV_BLOCK_SIZE"
    echo "router_temperature = $ROUTER_TEMPERATURE"
    echo "router_prefill_load_scale = $scale"
    echo "router_ttl_secs = $ROUTER_TTL_SECS"
  fi
  if [[ -n $SPILLWAY_EXTRA_TOML ]]; then printf '%s\n' "$SPILLWAY_EXTRA_TOML"; fi
  for ((e = 0; e < ENGINES; e++)); do
    echo
    echo "[[models.workers]]"
    echo "url = \"http://127.0.0.1:${P_ENG[e]}\""
    echo "name = \"${NAMES[e]}\""
    echo "kv_total_blocks = $KV_BLOCKS"
    echo "max_num_batched_tokens = $MAX_NUM_BATCHED_TOKENS"
  done
}

# Which setups this binary accepts.
RUN_SETUPS=()
SKIPPED=()
for setup in $SETUPS; do
  case $setup in
    kv | kv-default | round-robin | power-of-two | least-loaded | oracle) ;;
    *) die "unknown setup $setup (kv kv-default round-robin power-of-two least-loaded oracle)" ;;
  esac
  spillway_config "$setup" >"$T/spillway-$setup.toml"
  if "$SPILLWAY" check-config "$T/spillway-$setup.toml" >/dev/null 2>"$T/check-$setup.err"; then
    RUN_SETUPS+=("$setup")
  else
    why=$(grep -v '^\s*$' "$T/check-$setup.err" | head -1 | sed 's/^.* is not valid: //' | cut -c1-160)
    log "skipped setup $setup: $SPILLWAY does not accept its config ($why)"
    SKIPPED+=("$setup: $why")
  fi
done
((${#RUN_SETUPS[@]})) || die "no setup to run"

PROXY_PID=""
start_proxy() { # setup load
  port_unused "$P_PROXY"
  RUST_LOG=warn spawn $PROXY_CPU "spillway-$1-$2" "$SPILLWAY" --config "$T/spillway-$1.toml"
  PROXY_PID=$SPAWNED
  wait_port "$P_PROXY" "$PROXY_PID"
}

loadgen() { # out label extra-args...
  local out=$1 label=$2; shift 2
  run_pinned $LOAD_CPU timeout $((DURATION + DRAIN + 60)) "$PY" "$HERE/loadgen.py" \
    "${WORKLOAD[@]}" --label "$label" --out "$out" "$@" 2>>"$T/loadgen.err" \
    || die "load generator failed: $(tail -5 "$T/loadgen.err")"
}

# --- 1. capacity: closed loop, through round-robin with caching on (CAPACITY=round-robin)
# or straight to the engines with caching off (CAPACITY=model, a check of the time model).
case $CAPACITY in
  round-robin)
    ((CAP_DURATION > 0)) || die "CAPACITY=round-robin measures C: CAP_DURATION must be > 0"
    log "measuring capacity through round-robin: closed loop, $CAP_STREAMS streams, ${CAP_DURATION}s"
    spillway_config round-robin >"$T/spillway-capacity.toml"
    start_engines capacity yes
    port_unused "$P_PROXY"
    RUST_LOG=warn spawn $PROXY_CPU spillway-capacity "$SPILLWAY" --config "$T/spillway-capacity.toml"
    CAP_PID=$SPAWNED
    wait_port "$P_PROXY" "$CAP_PID"
    loadgen "$T/runs/capacity.jsonl" capacity --ports "$P_PROXY" \
      --closed "$CAP_STREAMS" --duration "$CAP_DURATION" --drain 3
    stop_pid "$CAP_PID"
    stop_engines
    C_MODEL=$("$PY" -m spillbench measured --capacity "$T/runs/capacity.jsonl" \
      --capacity-warmup "$CAP_WARMUP")
    log "C (round-robin, measured) = $C_MODEL req/s for $ENGINES"
    ;;
  model)
    if ((CAP_DURATION > 0)); then
      log "measuring capacity without reuse: closed loop, $CAP_STREAMS streams, ${CAP_DURATION}s"
      start_engines capacity no
      loadgen "$T/runs/capacity.jsonl" capacity --ports "$ENGINE_PORTS" \
        --closed "$CAP_STREAMS" --duration "$CAP_DURATION" --drain 3
      stop_engines
    fi
    ;;
  *) die "CAPACITY must be round-robin or model, not $CAPACITY" ;;
esac

# --- 2. the runs: for each load, each setup.
SUMMARY="$T/summary.jsonl"
: >"$SUMMARY"
for k in $LOADS; do
  rate=$(awk -v k="$k" -v c="$C_MODEL" 'BEGIN{printf "%.2f", k*c}')
  for setup in "${RUN_SETUPS[@]}"; do
    log "load ${k}×C = $rate req/s: $setup"
    tag="$setup-$k"
    start_engines "$tag" yes
    start_proxy "$setup" "$k"
    pin=()
    [[ $setup == oracle ]] && pin=(--pin-header "$PIN_HEADER" --pin-names "$PIN_NAMES")
    c0=$(cpu_ticks "$PROXY_PID")
    loadgen "$T/runs/$tag.jsonl" "$tag" --ports "$P_PROXY" --rate "$rate" \
      --duration "$DURATION" --drain "$DRAIN" "${pin[@]}" \
      --scrape "$ENGINE_METRICS" --scrape-at "$WARMUP,$DURATION"
    c1=$(cpu_ticks "$PROXY_PID")
    alive=yes; kill -0 "$PROXY_PID" 2>/dev/null || alive=no
    curl -s -m 3 "http://127.0.0.1:$P_ADMIN/metrics" >"$T/runs/$tag.metrics" || true
    printf '{"setup":"%s","load":%s,"rate":%s,"file":"%s","proxy_ticks":%s,"proxy_alive":"%s","metrics":"%s","log":"%s"}\n' \
      "$setup" "$k" "$rate" "$T/runs/$tag.jsonl" "$((c1 - c0))" "$alive" \
      "$T/runs/$tag.metrics" "$T/spillway-$setup-$k.log" >>"$SUMMARY"
    stop_pid "$PROXY_PID"
    stop_engines
  done
done

ELAPSED=$((SECONDS - START))
{
  echo "# Prefix reuse: KV-aware routing against load-only routing and a perfect-affinity oracle, multi-turn chat at 0.5–1.5 × C"
  echo
  if [[ -n ${NOTE:-} ]]; then echo "**Variant:** $NOTE"; echo; fi
  echo "Generated by \`bench/prefix/run.sh\` (LOADS=\"$LOADS\" SETUPS=\"$SETUPS\" CAPACITY=$CAPACITY DURATION=${DURATION}s WARMUP=${WARMUP}s DRAIN=${DRAIN}s CONVERSATIONS=$CONVERSATIONS TURNS=$TURNS SYSTEM_TOKENS=$SYSTEM_TOKENS USER_TOKENS=$USER_TOKENS ASSISTANT_TOKENS=$ASSISTANT_TOKENS MAX_TOKENS=$MAX_TOKENS KV_BLOCKS=$KV_BLOCKS SEED=$SEED${PUSH_MS:+ PUSH_MS=$PUSH_MS}); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- Tools: Python $("$PY" -c 'import platform; print(platform.python_version())') asyncio load generator (bench/prefix/loadgen.py on bench/lib/spillbench/loadgen.py), matplotlib $("$PY" -c 'import matplotlib; print(matplotlib.__version__)')"
  echo "- Placement: Spillway on CPU $PROXY_CPU (cores = 1, cpus = [0], monitor_cpu = 0, under taskset -c 0); the $ENGINES mock engines and the load generator on CPU $LOAD_CPU."
  echo "- Engines (each): \`spillway mock-engine $(mock_engine_flags)${CACHE_ARGS[*]:+ ${CACHE_ARGS[*]}}\`${PUSH_MS:+ --push-load (every $PUSH_MS ms)}: bench/overload's engine with 8× its KV blocks ($((KV_BLOCKS * BLOCK_SIZE / 1024))k tokens, an 8B model's KV cache on an 80 GB GPU): prompts here are ~9× longer, a full batch of them needs ~9,500 blocks, and the prefix cache is an LRU of that many block hashes."
  if [[ -n $CACHE_NOTE ]]; then echo "- **Warning:** $CACHE_NOTE."; fi
  for s in "${SKIPPED[@]}"; do echo "- **Skipped** setup $s"; done
} >"$T/header.md"

CAP_ARGS=()
((CAP_DURATION > 0)) && CAP_ARGS=(--capacity "$T/runs/capacity.jsonl" --capacity-warmup "$CAP_WARMUP")
"$PY" "$HERE/report.py" report --summary "$SUMMARY" "${CAP_ARGS[@]}" \
  --c-model-per-engine "$C_MODEL_1" --engines "$ENGINES" --header "$T/header.md" \
  --describe "$DESCRIBE" --warmup "$WARMUP" --duration "$DURATION" --drain "$DRAIN" \
  --max-tokens "$MAX_TOKENS" --max-num-seqs $MAX_NUM_SEQS --kv-blocks "$KV_BLOCKS" \
  --block-size $BLOCK_SIZE --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS \
  --prefill-tps $PREFILL_TPS --step-ms $STEP_MS --step-per-seq-ms $STEP_PER_SEQ_MS \
  --mean-prompt-tokens "$MEAN_PTOK" --config-dir "$T" --clk-tck "$(getconf CLK_TCK)" \
  --capacity-basis "$CAPACITY" --c-total "$C_MODEL" \
  --out-md "$RESULTS_DIR/$RESULT_NAME.md" --out-png "$RESULTS_DIR/$RESULT_NAME.png" \
  --out-json "$RESULTS_DIR/$RESULT_NAME-summary.json"
if [[ -n ${KEEP_RAW:-} ]]; then
  rm -rf "$WORK_DIR/prefix-raw" && cp -r "$T" "$WORK_DIR/prefix-raw"
  log "raw data kept in $WORK_DIR/prefix-raw"
fi
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

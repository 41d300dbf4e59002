#!/usr/bin/env bash
# Disaggregated serving: do long prompts stop slowing everyone's tokens when prefill runs on
# its own engines?
#
#   bench/disagg/run.sh    # ~6.5 min; writes bench/results/disagg.md, disagg.png, disagg-summary.json
#
# Workload (bench/disagg/loadgen.py): streaming chat completions, open loop (Poisson
# arrivals), each on its own connection, each drawn at random (its own seeded generator) from
# two classes:
#   summarise  SUM_PROMPT_BYTES of prompt (≈ /4 tokens), max_tokens SUM_MAX_TOKENS: a long
#              prefill, a short answer; SUM_SHARE of the requests
#   chat       CHAT_PROMPT_BYTES of prompt, max_tokens CHAT_MAX_TOKENS: a short prefill, a long
#              answer; the rest
# On the mock engine a step lasts decode_step_ms + per_seq_ms × sequences + prefill tokens /
# prefill_tps, so a summarise prompt's prefill chunk (up to max_num_batched_tokens a step)
# stretches the step every stream decoding on that engine waits on: on a whole engine, long
# prompts raise everyone's inter-token latency (ITL).
#
# Setups, four mock engines each (fresh engines and a fresh Spillway every run):
#   disagg      engines 1–2 `--role prefill` (pool "mock-model-prefill", role = "prefill",
#               active_prefill_tokens_threshold = PREFILL_THRESHOLD), engines 3–4 `--role
#               decode` (model "mock-model", prefill = "mock-model-prefill",
#               active_decode_blocks_threshold = DECODE_THRESHOLD): a request is
#               prefilled on a prefill engine (stage 1, vLLM's kv_transfer_params handoff)
#               and decoded on a decode engine (docs/behaviour.md §23), but for prompts under
#               MAX_LOCAL_PREFILL tokens (chat's), prefilled where they decode (§23.3)
#   aggregated  the same four engines whole (`--role both`), one model with all four as its
#               workers and both thresholds
# Both: router_mode least-loaded, no engine_request_limit, no queues, no waiting room (the
# busy rule alone), kv_total_blocks and max_num_batched_tokens on every worker, load from
# the engines' pushes (every PUSH_MS) and Spillway's own tracking.
#
# C: the aggregated setup's capacity for the mix, from the mock's time model
# (`python3 -m spillbench capacity`): per engine c_sum and c_chat for each class alone, the
# mix's 1 / (SUM_SHARE / c_sum + (1 − SUM_SHARE) / c_chat), times four engines. For each load
# in LOADS (× C) and each setup, two runs: `mix` (the workload above at LOAD × C) and
# `chat-only` (the chat class alone at (1 − SUM_SHARE) × LOAD × C: the chat traffic of the
# mix without the long prompts, the baseline of chat ITL). Each run: DURATION seconds of
# arrivals, at most DRAIN more to finish; figures over [WARMUP, DURATION).
# Placement: Spillway (cores = 1, cpus = [0], monitor_cpu = 0) on CPU 0; the engines and the
# load generator on CPU 1.
#
# Knobs (environment, defaults below): LOADS SETUPS DURATION WARMUP DRAIN SUM_SHARE
# SUM_PROMPT_BYTES SUM_MAX_TOKENS CHAT_PROMPT_BYTES CHAT_MAX_TOKENS PREFILL_THRESHOLD
# DECODE_THRESHOLD PUSH_MS MONITOR_MS KV_TRANSFER_MS (the decode engines'
# --kv-transfer-ms-per-block; empty: the mock's default) MAX_LOCAL_PREFILL (the disagg
# model's max_local_prefill_tokens, §23.3: shorter prompts skip stage 1 and are prefilled
# on the decode engine; default 512: chat prompts do, summaries do not; empty: unset, every
# request runs both stages) SEED RESULT_NAME NOTE MAX_SECONDS
# (watchdog, after installs) BENCH_NICE KEEP_RAW=1 (raw data kept in bench/work/disagg-raw)
# SPILLWAY_BIN (a binary to use as is).

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

LOADS=${LOADS:-"0.5 1 2 3"}
SETUPS=${SETUPS:-"disagg aggregated"}
DURATION=${DURATION:-15}
WARMUP=${WARMUP:-3}
DRAIN=${DRAIN:-5}
SUM_SHARE=${SUM_SHARE:-0.3}
SUM_PROMPT_BYTES=${SUM_PROMPT_BYTES:-16000}   # ≈ 4000 prompt tokens (the mock counts bytes / 4)
SUM_MAX_TOKENS=${SUM_MAX_TOKENS:-8}
CHAT_PROMPT_BYTES=${CHAT_PROMPT_BYTES:-400}   # ≈ 100 prompt tokens
CHAT_MAX_TOKENS=${CHAT_MAX_TOKENS:-128}
PREFILL_THRESHOLD=${PREFILL_THRESHOLD:-16384}  # active_prefill_tokens_threshold
DECODE_THRESHOLD=${DECODE_THRESHOLD:-0.9}      # active_decode_blocks_threshold
PUSH_MS=${PUSH_MS:-5}                          # how often the engines push their load
MONITOR_MS=${MONITOR_MS:-5}                    # how often Spillway folds tracked load into busy
KV_TRANSFER_MS=${KV_TRANSFER_MS:-}             # decode engines' --kv-transfer-ms-per-block
MAX_LOCAL_PREFILL=${MAX_LOCAL_PREFILL-512}     # disagg: max_local_prefill_tokens (empty: unset)
SEED=${SEED:-7}
MAX_SECONDS=${MAX_SECONDS:-900}
RESULT_NAME=${RESULT_NAME:-disagg}             # bench/results/$RESULT_NAME.md, .png, -summary.json
# The mock engine: bench/overload's settings (the mock's defaults, spelled out).
KV_BLOCKS=2048; BLOCK_SIZE=16; MAX_NUM_SEQS=64; MAX_NUM_BATCHED_TOKENS=2048
PREFILL_TPS=20000; STEP_MS=8; STEP_PER_SEQ_MS=0.25
MAX_TOKENS=$CHAT_MAX_TOKENS                    # the engines' --default-max-tokens
MODEL=mock-model
PREFILL_POOL=mock-model-prefill
ROUTER_MODE=least-loaded
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/disagg"

for s in $SETUPS; do
  [[ $s == disagg || $s == aggregated ]] || die "unknown setup '$s' (SETUPS: disagg aggregated)"
done

bench_init disagg
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
read -r P_PROXY P_ADMIN P_E1 P_E2 P_E3 P_E4 <<<"$(free_ports 6)"

# --- C from the time model: each class alone per engine, then the mix over four engines.
capacity() { # PROMPT_BYTES MAX_TOKENS
  "$PY" -m spillbench capacity --prompt-bytes "$1" --max-tokens "$2" \
    --max-num-seqs $MAX_NUM_SEQS --kv-blocks $KV_BLOCKS --block-size $BLOCK_SIZE \
    --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS --prefill-tps $PREFILL_TPS \
    --step-ms $STEP_MS --step-per-seq-ms $STEP_PER_SEQ_MS
}
C_SUM=$(capacity "$SUM_PROMPT_BYTES" "$SUM_MAX_TOKENS")
C_CHAT=$(capacity "$CHAT_PROMPT_BYTES" "$CHAT_MAX_TOKENS")
C_MIX_1=$(awk -v s="$SUM_SHARE" -v a="$C_SUM" -v b="$C_CHAT" \
  'BEGIN { printf "%.3f", 1 / (s / a + (1 - s) / b) }')
C=$(awk -v c="$C_MIX_1" 'BEGIN { printf "%.2f", 4 * c }')
log "capacity from the time model, per engine: summarise $C_SUM req/s, chat $C_CHAT req/s, the mix $C_MIX_1 req/s; C = $C req/s for four"

# Engine k's name and role in a setup.
engine_name() { # setup k
  if [[ $1 == disagg ]]; then (($2 <= 2)) && echo "p$2" || echo "d$(($2 - 2))"; else echo "e$2"; fi
}
engine_role() { # setup k
  if [[ $1 == disagg ]]; then (($2 <= 2)) && echo prefill || echo decode; else echo both; fi
}

start_engines() { # setup
  local e port_var name role extra
  for e in 1 2 3 4; do
    port_var="P_E$e"
    port_unused "${!port_var}"
    name=$(engine_name "$1" $e)
    role=$(engine_role "$1" $e)
    extra=()
    [[ $role == decode && -n $KV_TRANSFER_MS ]] && extra=(--kv-transfer-ms-per-block "$KV_TRANSFER_MS")
    spawn_mock_engine $LOAD_CPU "engine-$name-$RUN_TAG" "${!port_var}" --role "$role" \
      --push-load "http://127.0.0.1:$P_ADMIN" --worker-name "$name" \
      --push-interval-ms "$PUSH_MS" "${extra[@]}"
    eval "PID_E$e=$SPAWNED"
  done
  for e in 1 2 3 4; do
    port_var="P_E$e"; pid_var="PID_E$e"
    wait_port "${!port_var}" "${!pid_var}"
  done
}
stop_engines() { stop_pid "$PID_E1"; stop_pid "$PID_E2"; stop_pid "$PID_E3"; stop_pid "$PID_E4"; }

worker_toml() { # setup k
  local port_var="P_E$2"
  cat <<EOF

[[models.workers]]
url = "http://127.0.0.1:${!port_var}"
name = "$(engine_name "$1" "$2")"
kv_total_blocks = $KV_BLOCKS
max_num_batched_tokens = $MAX_NUM_BATCHED_TOKENS
load_sources = ["push", "tracked"]
EOF
}

spillway_config() { # setup
  cat <<EOF
listen = "127.0.0.1:$P_PROXY"
admin_listen = "127.0.0.1:$P_ADMIN"
cores = 1
cpus = [$PROXY_CPU]
monitor_cpu = $PROXY_CPU
monitor_interval_ms = $MONITOR_MS

[[models]]
name = "$MODEL"
router_mode = "$ROUTER_MODE"
EOF
  if [[ $1 == disagg ]]; then
    echo "prefill = \"$PREFILL_POOL\""
    [[ -z $MAX_LOCAL_PREFILL ]] || echo "max_local_prefill_tokens = $MAX_LOCAL_PREFILL"
    echo "active_decode_blocks_threshold = $DECODE_THRESHOLD"
    worker_toml "$1" 3
    worker_toml "$1" 4
    cat <<EOF

[[models]]
name = "$PREFILL_POOL"
role = "prefill"
router_mode = "$ROUTER_MODE"
active_prefill_tokens_threshold = $PREFILL_THRESHOLD
EOF
    worker_toml "$1" 1
    worker_toml "$1" 2
  else
    echo "active_prefill_tokens_threshold = $PREFILL_THRESHOLD"
    echo "active_decode_blocks_threshold = $DECODE_THRESHOLD"
    local e
    for e in 1 2 3 4; do worker_toml "$1" $e; done
  fi
}

PROXY_PID=""
start_proxy() { # setup
  port_unused "$P_PROXY"
  port_unused "$P_ADMIN"
  spillway_config "$1" >"$T/spillway-$1.toml"
  "$SPILLWAY" check-config "$T/spillway-$1.toml" >/dev/null 2>"$T/check.err" \
    || { cat "$T/check.err" >&2; die "spillway config for setup $1 invalid"; }
  RUST_LOG=warn spawn $PROXY_CPU "spillway-$RUN_TAG" "$SPILLWAY" --config "$T/spillway-$1.toml"
  PROXY_PID=$SPAWNED
  wait_port "$P_PROXY" "$PROXY_PID"
  wait_port "$P_ADMIN" "$PROXY_PID"
}

loadgen() { # out label rate sum-share
  run_pinned $LOAD_CPU timeout $((DURATION + DRAIN + 60)) "$PY" "$HERE/loadgen.py" \
    --port "$P_PROXY" --model $MODEL --rate "$3" --sum-share "$4" \
    --duration "$DURATION" --drain "$DRAIN" --seed "$SEED" --label "$2" \
    --sum-prompt-bytes "$SUM_PROMPT_BYTES" --sum-max-tokens "$SUM_MAX_TOKENS" \
    --chat-prompt-bytes "$CHAT_PROMPT_BYTES" --max-tokens "$CHAT_MAX_TOKENS" \
    --out "$1" 2>>"$T/loadgen.err" \
    || die "load generator failed: $(tail -5 "$T/loadgen.err")"
}

# --- the runs: for each load, each setup, the mix then chat alone.
SUMMARY="$T/summary.jsonl"
: >"$SUMMARY"
n_loads=$(wc -w <<<"$LOADS"); n_setups=$(wc -w <<<"$SETUPS")
total=$((n_loads * n_setups * 2)); done_runs=0
for k in $LOADS; do
  rate=$(awk -v k="$k" -v c="$C" 'BEGIN { printf "%.2f", k * c }')
  for setup in $SETUPS; do
    for workload in mix chat-only; do
      if [[ $workload == mix ]]; then
        share=$SUM_SHARE; r=$rate
      else
        share=0; r=$(awk -v s="$SUM_SHARE" -v r="$rate" 'BEGIN { printf "%.2f", (1 - s) * r }')
      fi
      done_runs=$((done_runs + 1))
      log "run $done_runs/$total: load ${k}×C, $setup, $workload at $r req/s"
      RUN_TAG="$setup-$workload-$k"
      start_engines "$setup"
      start_proxy "$setup"
      loadgen "$T/runs/$RUN_TAG.jsonl" "$RUN_TAG" "$r" "$share"
      alive=yes; kill -0 "$PROXY_PID" 2>/dev/null || alive=no
      curl -s -m 3 "http://127.0.0.1:$P_ADMIN/metrics" >"$T/runs/$RUN_TAG.metrics" || true
      printf '{"setup":"%s","workload":"%s","load":%s,"rate":%s,"sum_share":%s,"file":"%s","metrics":"%s","log":"%s","proxy_alive":"%s"}\n' \
        "$setup" "$workload" "$k" "$r" "$share" "$T/runs/$RUN_TAG.jsonl" \
        "$T/runs/$RUN_TAG.metrics" "$T/spillway-$RUN_TAG.log" "$alive" >>"$SUMMARY"
      stop_pid "$PROXY_PID"
      stop_engines
    done
  done
done

ELAPSED=$((SECONDS - START))
{
  echo "# Disaggregated serving: long prompts and everyone's inter-token latency, 4 engines, offered load ${LOADS// /, } × C"
  echo
  if [[ -n ${NOTE:-} ]]; then echo "**Variant:** $NOTE"; echo; fi
  echo "Generated by \`bench/disagg/run.sh\` (LOADS=\"$LOADS\" SETUPS=\"$SETUPS\" DURATION=${DURATION}s WARMUP=${WARMUP}s DRAIN=${DRAIN}s SUM_SHARE=$SUM_SHARE SUM_PROMPT_BYTES=$SUM_PROMPT_BYTES SUM_MAX_TOKENS=$SUM_MAX_TOKENS CHAT_PROMPT_BYTES=$CHAT_PROMPT_BYTES CHAT_MAX_TOKENS=$CHAT_MAX_TOKENS PREFILL_THRESHOLD=$PREFILL_THRESHOLD DECODE_THRESHOLD=$DECODE_THRESHOLD PUSH_MS=$PUSH_MS MONITOR_MS=$MONITOR_MS SEED=$SEED${KV_TRANSFER_MS:+ KV_TRANSFER_MS=$KV_TRANSFER_MS}${MAX_LOCAL_PREFILL:+ MAX_LOCAL_PREFILL=$MAX_LOCAL_PREFILL}); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- Tools: Python $("$PY" -c 'import platform; print(platform.python_version())') asyncio load generator (bench/disagg/loadgen.py on bench/lib/spillbench), matplotlib $("$PY" -c 'import matplotlib; print(matplotlib.__version__)')"
  echo "- Placement: Spillway on CPU $PROXY_CPU (cores = 1, cpus = [0], monitor_cpu = 0, under taskset -c 0); the four mock engines and the load generator on CPU $LOAD_CPU."
  echo "- Engines (each): \`spillway mock-engine $(mock_engine_flags) --default-max-tokens $MAX_TOKENS --push-load http://127.0.0.1:ADMIN --worker-name NAME --push-interval-ms $PUSH_MS\` plus \`--role prefill\` (p1, p2) or \`--role decode\`${KV_TRANSFER_MS:+ \`--kv-transfer-ms-per-block $KV_TRANSFER_MS\`} (d1, d2) in the disagg setup, \`--role both\` (e1–e4) in the aggregated one."
  echo "- Requests: streaming chat completions, each on its own connection; summarise: $SUM_PROMPT_BYTES bytes of messages (≈ $((SUM_PROMPT_BYTES / 4)) prompt tokens by the mock's estimate), max_tokens $SUM_MAX_TOKENS, $SUM_SHARE of the mix's requests; chat: $CHAT_PROMPT_BYTES bytes (≈ $((CHAT_PROMPT_BYTES / 4)) tokens), max_tokens $CHAT_MAX_TOKENS. Poisson arrivals (seed $SEED), the class drawn per request from its own seeded generator."
  echo "- C = $C req/s: the aggregated setup's capacity for the mix from the mock's time model (\`python3 -m spillbench capacity\` with the engine flags above): per engine c_sum = $C_SUM req/s (summarise alone), c_chat = $C_CHAT req/s (chat alone), the mix 1 / ($SUM_SHARE / c_sum + $(awk -v s="$SUM_SHARE" 'BEGIN { print 1 - s }') / c_chat) = $C_MIX_1 req/s, × 4 engines. A chat-only run offers (1 − $SUM_SHARE) × the mix's rate."
} >"$T/header.md"

"$PY" "$HERE/report.py" report --summary "$SUMMARY" --header "$T/header.md" \
  --disagg-config "$T/spillway-disagg.toml" --aggregated-config "$T/spillway-aggregated.toml" \
  --c "$C" --c-sum "$C_SUM" --c-chat "$C_CHAT" --c-mix-per-engine "$C_MIX_1" \
  --warmup "$WARMUP" --duration "$DURATION" --drain "$DRAIN" \
  --out-md "$RESULTS_DIR/$RESULT_NAME.md" --out-png "$RESULTS_DIR/$RESULT_NAME.png" \
  --out-json "$RESULTS_DIR/$RESULT_NAME-summary.json"
if [[ -n ${KEEP_RAW:-} ]]; then
  rm -rf "$WORK_DIR/disagg-raw" && cp -r "$T" "$WORK_DIR/disagg-raw"
  log "raw data kept in $WORK_DIR/disagg-raw"
fi
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

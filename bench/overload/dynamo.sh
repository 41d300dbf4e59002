#!/usr/bin/env bash
# Overload, NVIDIA Dynamo as a peer: Dynamo's own frontend with its busy thresholds in front
# of Dynamo's own mocker, offered the same multiples of ITS OWN measured capacity as
# bench/overload/run.sh offers Spillway and HAProxy, with the same load generator.
#
#   bench/overload/dynamo.sh     # ~4.5 min; writes bench/results/overload-dynamo.md and
#                                # overload-dynamo-summary.json (side by side with the
#                                # Spillway/HAProxy figures of results/overload-summary.json)
#
# Engines: one `python -m dynamo.mocker --num-workers 2` process (two workers, like run.sh's
# two mock engines), vLLM-style settings as close as practical to `spillway mock-engine`'s:
# max-num-seqs 64, 2048 KV blocks of 16 tokens, max-num-batched-tokens 2048, prefix caching
# off (every prompt is identical; Spillway's mock has no prefix cache). Its time model is
# Dynamo's own, so its capacity C is measured: closed loop, 4 × max-num-seqs streams through
# a frontend without thresholds. Offered loads are LOADS × C, open loop (Poisson).
# Setups (each run starts a fresh mocker and a fresh frontend, with fresh discovery state):
#   dynamo      frontend busy thresholds (KV router; --active-decode-blocks-threshold,
#               --active-prefill-tokens-threshold): 529 when every worker is busy
#   dynamo-cap  the same plus the workers' hard cap (DYN_ENGINE_REQUEST_LIMIT N,
#               DYN_DYNAMO_REQUEST_QUEUE_LIMIT Q), the analogue of Spillway's
#               engine_request_limit/request_queue_limit
# Both run without etcd or NATS: file discovery, TCP request plane, ZMQ event plane, all on
# 127.0.0.1. The mocker and frontend need a model folder with a tokenizer: built here
# (bench/lib/spillbench/dynamo_model.py, word-level). Placement as in run.sh: the frontend
# on CPU 0; the mocker and the load generator on CPU 1.
#
# Dynamo is installed into bench/work/dynamo-venv when missing (pip: ai-dynamo and
# ai-dynamo-runtime $DYNAMO_VERSION with --no-deps, plus the dependencies the frontend and
# mocker import; bench/lib/common.sh ensure_dynamo). Without PyPI, or when pip fails, the
# script says so and exits 0 (skipped).
#
# Knobs (environment, defaults below): LOADS SETUPS DURATION WARMUP DRAIN PROMPT_BYTES
# MAX_TOKENS CAP_DURATION CAP_WARMUP SPEEDUP DYN_DECODE DYN_PREFILL DYN_CAP_N DYN_CAP_Q
# SPILLWAY_SUMMARY RESULT_NAME NOTE MAX_SECONDS BENCH_NICE KEEP_RAW=1 DYNAMO_VERSION.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

LOADS=${LOADS:-"0.5 1 1.5 2 3"}
SETUPS=${SETUPS:-"dynamo dynamo-cap"}
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-5}
DRAIN=${DRAIN:-4}
# ≈ 256 prompt tokens with this tokenizer (one token per word of loadgen's filler), the
# same prompt length the Spillway mock sees with PROMPT_BYTES=1024 (it counts bytes / 4).
# The script checks the count Dynamo reports and prints it in the report.
PROMPT_BYTES=${PROMPT_BYTES:-1660}
MAX_TOKENS=${MAX_TOKENS:-64}
CAP_DURATION=${CAP_DURATION:-20}
CAP_WARMUP=${CAP_WARMUP:-8}
MAX_SECONDS=${MAX_SECONDS:-600}
DYNAMO_VERSION=${DYNAMO_VERSION:-1.6.1}
# The mocker: the Spillway mock's engine parameters (see run.sh).
KV_BLOCKS=2048; BLOCK_SIZE=16; MAX_NUM_SEQS=64; MAX_NUM_BATCHED_TOKENS=2048; WORKERS=2
SPEEDUP=${SPEEDUP:-1}                    # 1: C ≈ 55-60 req/s for two workers, like Spillway's mock
MODEL=mock-model
# Busy thresholds, the values of Spillway's shed setup (see the report for why).
DYN_DECODE=${DYN_DECODE-0.9}             # empty: not set
DYN_PREFILL=${DYN_PREFILL-512}           # empty: not set
DYN_CAP_N=${DYN_CAP_N:-64}               # setup dynamo-cap: engine slots per worker
DYN_CAP_Q=${DYN_CAP_Q:-2}                # setup dynamo-cap: Dynamo's overflow queue (min 2)
RESULT_NAME=${RESULT_NAME:-overload-dynamo}
SPILLWAY_SUMMARY=${SPILLWAY_SUMMARY:-$RESULTS_DIR/overload-summary.json}
FRONTEND_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/overload"
DYN_VENV="$WORK_DIR/dynamo-venv"

bench_init dynamo
START=$SECONDS
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
need python3 python3
need taskset util-linux
need ss iproute2
need curl curl
# The load generator and the report need only the standard library (no plot here).
PY=$(command -v python3)

ensure_dynamo
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
mkdir -p "$T/runs"
MODEL_DIR="$T/model"
"$DPY" -m spillbench.dynamo_model "$MODEL_DIR" || die "could not build the tokenizer folder"
read -r P_FE <<<"$(free_ports 1)"

# Both processes: no etcd, no NATS; everything on loopback; no Hugging Face downloads.
dynamo_env
MOCKER_ARGS=(--model-path "$MODEL_DIR" --model-name $MODEL --num-workers $WORKERS
  --num-gpu-blocks-override $KV_BLOCKS --block-size $BLOCK_SIZE --max-num-seqs $MAX_NUM_SEQS
  --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS --no-enable-prefix-caching
  --speedup-ratio "$SPEEDUP")

PID_MOCKER="" PID_FE=""
start_dynamo() { # setup tag   (setup: plain = no thresholds, for the capacity measurement)
  local setup=$1 tag=$2 fe=(--http-host 127.0.0.1 --http-port "$P_FE" --router-mode kv
    --router-track-output-blocks --no-router-assume-kv-reuse)
  port_unused "$P_FE"
  # Fresh discovery state every run: a dead worker's leftover record would be routed to.
  export DYN_FILE_KV="$T/kv-$tag"
  mkdir -p "$DYN_FILE_KV"
  local cap=()
  [[ $setup == dynamo-cap ]] && cap=(DYN_ENGINE_REQUEST_LIMIT=$DYN_CAP_N DYN_DYNAMO_REQUEST_QUEUE_LIMIT=$DYN_CAP_Q)
  # `env` execs too, so $SPAWNED is still the mocker's own pid.
  spawn $LOAD_CPU "mocker-$tag" env "${cap[@]}" "$DPY" -m dynamo.mocker "${MOCKER_ARGS[@]}" "${PLANES[@]}"
  PID_MOCKER=$SPAWNED
  if [[ $setup != plain ]]; then
    [[ -n $DYN_DECODE ]] && fe+=(--active-decode-blocks-threshold "$DYN_DECODE")
    [[ -n $DYN_PREFILL ]] && fe+=(--active-prefill-tokens-threshold "$DYN_PREFILL")
  fi
  FE_ARGS="${fe[*]} ${PLANES[*]}"
  spawn $FRONTEND_CPU "frontend-$tag" "$DPY" -m dynamo.frontend "${fe[@]}" "${PLANES[@]}"
  PID_FE=$SPAWNED
  # Ready: the model is listed and both workers are registered and answer.
  local deadline=$((SECONDS + 60)) probe
  while ((SECONDS < deadline)); do
    kill -0 "$PID_MOCKER" 2>/dev/null || die "mocker exited: $(tail -5 "$T/mocker-$tag.log")"
    kill -0 "$PID_FE" 2>/dev/null || die "frontend exited: $(tail -5 "$T/frontend-$tag.log")"
    if [[ $(ls "$DYN_FILE_KV"/v1/instances/ 2>/dev/null | wc -l) -ge $WORKERS ]] \
        && curl -s -m 1 "http://127.0.0.1:$P_FE/v1/models" | grep -q "\"$MODEL\""; then
      probe=$(curl -s -m 5 "http://127.0.0.1:$P_FE/v1/chat/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"lorem ipsum\"}],\"max_tokens\":2}" || true)
      [[ $probe == *'"completion_tokens":2'* ]] && { sleep 1; return 0; }
    fi
    sleep 0.3
  done
  die "Dynamo not ready after 60 s: $(tail -3 "$T/frontend-$tag.log")"
}
stop_dynamo() { stop_pid "$PID_FE"; stop_pid "$PID_MOCKER"; }

loadgen() { # out label extra-args...
  local out=$1 label=$2; shift 2
  run_pinned $LOAD_CPU timeout $((DURATION + DRAIN + 60)) "$PY" -m spillbench.loadgen \
    --model $MODEL --prompt-bytes "$PROMPT_BYTES" --max-tokens "$MAX_TOKENS" \
    --label "$label" --out "$out" "$@" 2>>"$T/loadgen.err" \
    || die "load generator failed: $(tail -5 "$T/loadgen.err")"
}

# --- 1. capacity at saturation: closed loop, 4 × max_num_seqs streams, no thresholds.
log "measuring capacity: Dynamo mocker ($WORKERS workers, speedup $SPEEDUP), closed loop, $((4 * MAX_NUM_SEQS)) streams, ${CAP_DURATION}s"
start_dynamo plain capacity
# The prompt length Dynamo's tokenizer sees for loadgen's request.
PROMPT_TOKENS=$("$PY" - "$P_FE" "$MODEL" "$PROMPT_BYTES" <<'PY'
import json, sys, urllib.request
from spillbench import loadgen
port, model, pb = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = json.loads(loadgen.build_request("127.0.0.1", port, model, pb, 1).split(b"\r\n\r\n", 1)[1])
body["stream"] = False
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                             json.dumps(body).encode(), {"content-type": "application/json"})
print(json.loads(urllib.request.urlopen(req, timeout=10).read())["usage"]["prompt_tokens"])
PY
) || die "prompt probe failed"
log "prompt: $PROMPT_BYTES bytes of messages = $PROMPT_TOKENS tokens for Dynamo"
c0=$(cpu_ticks "$PID_FE")
loadgen "$T/runs/capacity.jsonl" capacity --ports "$P_FE" \
  --closed $((4 * MAX_NUM_SEQS)) --duration "$CAP_DURATION" --drain 3
CAP_TICKS=$(($(cpu_ticks "$PID_FE") - c0))
stop_dynamo
C_MEAS=$("$PY" -m spillbench measured --capacity "$T/runs/capacity.jsonl" --capacity-warmup "$CAP_WARMUP")
awk -v c="$C_MEAS" 'BEGIN{exit !(c > 1)}' || die "measured capacity $C_MEAS req/s: Dynamo did not serve"
log "measured capacity C = $C_MEAS req/s"

# --- 2. the runs: for each load, each setup.
SUMMARY="$T/summary.jsonl"
: >"$SUMMARY"
for k in $LOADS; do
  rate=$(awk -v k="$k" -v c="$C_MEAS" 'BEGIN{printf "%.2f", k*c}')
  for setup in $SETUPS; do
    log "load ${k}×C = $rate req/s: $setup"
    tag="$setup-$k"
    start_dynamo "$setup" "$tag"
    c0=$(cpu_ticks "$PID_FE"); m0=$(cpu_ticks "$PID_MOCKER")
    loadgen "$T/runs/$tag.jsonl" "$tag" --ports "$P_FE" --rate "$rate" \
      --duration "$DURATION" --drain "$DRAIN" --seed 7
    c1=$(cpu_ticks "$PID_FE"); m1=$(cpu_ticks "$PID_MOCKER")
    alive=yes; kill -0 "$PID_FE" 2>/dev/null || alive=no
    curl -s -m 3 "http://127.0.0.1:$P_FE/metrics" >"$T/runs/$tag.metrics" || true
    # The logs as they were before the stop (a stopped mocker makes the frontend log errors).
    cp "$T/frontend-$tag.log" "$T/runs/frontend-$tag.log"; cp "$T/mocker-$tag.log" "$T/runs/mocker-$tag.log"
    printf '{"setup":"%s","load":%s,"rate":%s,"file":"%s","proxy_ticks":%s,"mocker_ticks":%s,"proxy_alive":"%s","metrics":"%s","log":"%s","mocker_log":"%s"}\n' \
      "$setup" "$k" "$rate" "$T/runs/$tag.jsonl" "$((c1 - c0))" "$((m1 - m0))" "$alive" \
      "$T/runs/$tag.metrics" "$T/runs/frontend-$tag.log" "$T/runs/mocker-$tag.log" >>"$SUMMARY"
    stop_dynamo
  done
done

ELAPSED=$((SECONDS - START))
{
  echo "# Overload: NVIDIA Dynamo $DYNAMO_VERSION (frontend busy thresholds + mocker) next to Spillway and HAProxy"
  echo
  if [[ -n ${NOTE:-} ]]; then echo "**Variant:** $NOTE"; echo; fi
  echo "Generated by \`bench/overload/dynamo.sh\` (LOADS=\"$LOADS\" SETUPS=\"$SETUPS\" DURATION=${DURATION}s WARMUP=${WARMUP}s DRAIN=${DRAIN}s PROMPT_BYTES=$PROMPT_BYTES MAX_TOKENS=$MAX_TOKENS SPEEDUP=$SPEEDUP); run time ${ELAPSED}s."
  echo
  dynamo_header "$LOAD_START"
  echo "- Tools: the same load generator as \`run.sh\` (bench/lib/spillbench/loadgen.py: open loop, Poisson arrivals, one connection per streaming chat completion)."
  echo "- Placement: Dynamo's frontend (\`python -m dynamo.frontend\`, one process, all its threads) under \`taskset -c $FRONTEND_CPU\`; the mocker (\`python -m dynamo.mocker\`, one process, $WORKERS workers) and the load generator under \`taskset -c $LOAD_CPU\`; all at nice $BENCH_NICE."
  echo "- Mocker: \`python -m dynamo.mocker ${MOCKER_ARGS[*]/$MODEL_DIR/MODEL_DIR} ${PLANES[*]}\` (MODEL_DIR: a word-level tokenizer built by \`spillbench.dynamo_model\`, no weights)."
  echo "- Frontend: \`python -m dynamo.frontend $FE_ARGS\`$([[ $SETUPS == *dynamo-cap* ]] && echo "; setup dynamo-cap also starts the mocker with DYN_ENGINE_REQUEST_LIMIT=$DYN_CAP_N DYN_DYNAMO_REQUEST_QUEUE_LIMIT=$DYN_CAP_Q")."
  dynamo_env_line
  echo "- Requests: streaming chat completions, prompt $PROMPT_BYTES bytes of messages = **$PROMPT_TOKENS prompt tokens** as Dynamo counts them (usage.prompt_tokens of the same request, chat template included), max_tokens $MAX_TOKENS."
} >"$T/header.md"

"$PY" "$HERE/report.py" dynamo --summary "$SUMMARY" --capacity "$T/runs/capacity.jsonl" \
  --capacity-warmup "$CAP_WARMUP" --capacity-ticks "$CAP_TICKS" --header "$T/header.md" \
  --warmup "$WARMUP" --duration "$DURATION" --drain "$DRAIN" --max-tokens "$MAX_TOKENS" \
  --prompt-tokens "$PROMPT_TOKENS" --kv-blocks $KV_BLOCKS --block-size $BLOCK_SIZE \
  --max-num-seqs $MAX_NUM_SEQS --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS \
  --speedup "$SPEEDUP" --dyn-decode "$DYN_DECODE" --dyn-prefill "$DYN_PREFILL" \
  --dyn-cap "N=$DYN_CAP_N Q=$DYN_CAP_Q" --clk-tck "$(getconf CLK_TCK)" \
  --spillway-summary "$SPILLWAY_SUMMARY" \
  --out-md "$RESULTS_DIR/$RESULT_NAME.md" --out-json "$RESULTS_DIR/$RESULT_NAME-summary.json"
if [[ -n ${KEEP_RAW:-} ]]; then
  rm -rf "$WORK_DIR/dynamo-raw" && cp -r "$T" "$WORK_DIR/dynamo-raw"
  log "raw data kept in $WORK_DIR/dynamo-raw"
fi
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

#!/usr/bin/env bash
# Prefix reuse, NVIDIA Dynamo as a peer: Dynamo's frontend with its KV router and with
# round-robin, in front of Dynamo's mocker with prefix caching on, offered the multi-turn
# workload of bench/prefix/run.sh at multiples of ITS OWN measured capacity.
#
#   bench/prefix/dynamo.sh     # ~5.5 min; writes bench/results/prefix-dynamo.md and
#                              # prefix-dynamo-summary.json (next to prefix-summary.json's ratio)
#
# Engines: one `python -m dynamo.mocker --num-workers ENGINES` process with run.sh's engine
# parameters (max-num-seqs 64, KV_BLOCKS blocks of 16 tokens, max-num-batched-tokens 2048),
# prefix caching on. The workload is run.sh's in tokens of a word-level tokenizer
# (bench/lib/spillbench/dynamo_model.py; loadgen.py --unit word): the same conversations,
# system prompt, message and reply lengths. C is measured as run.sh measures it by default:
# closed loop, CAP_STREAMS conversation streams through a round-robin frontend, mocker prefix
# caching on (the capacity a cache-blind router finds).
# Setups (each run: a fresh mocker, a fresh frontend, fresh discovery state):
#   kv            --router-mode kv (Dynamo's defaults: KV events from the workers, overlap
#                 credit 1, prefill load scale 1, temperature 0)
#   round-robin   --router-mode round-robin
#   kv-approx     --router-mode kv --no-router-kv-events: the router predicts the caches from
#                 its own decisions (TTL), as Spillway's kv mode does (not run by default)
# No etcd, no NATS: file discovery, TCP request plane, ZMQ event plane, all on 127.0.0.1.
# Placement as in run.sh: the frontend on CPU 0; the mocker and the load generator on CPU 1.
#
# Dynamo is installed into DYN_VENV (default bench/work/dynamo-venv) when missing. When it
# cannot be installed or does not start, the script says why and exits 0 (skipped).
#
# Knobs (environment, defaults below): LOADS SETUPS DURATION WARMUP DRAIN ENGINES
# CONVERSATIONS (default: POOL_SECONDS × the measured C, so turns of a conversation are as far
# apart as in run.sh; Dynamo's mocker serves about twice the Spillway mock's rate) TURNS SYSTEM_TOKENS USER_TOKENS ASSISTANT_TOKENS MAX_TOKENS KV_BLOCKS SPEEDUP
# CAP_DURATION CAP_WARMUP CAP_STREAMS SEED SPILLWAY_SUMMARY RESULT_NAME NOTE MAX_SECONDS
# BENCH_NICE KEEP_RAW=1 DYNAMO_VERSION DYN_VENV.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

LOADS=${LOADS:-"0.5 1 1.5"}
SETUPS=${SETUPS:-"kv round-robin"}
DURATION=${DURATION:-34}
WARMUP=${WARMUP:-14}     # ≥ CONVERSATIONS / lowest rate: the cold first turns (see loadgen.py)
DRAIN=${DRAIN:-4}
ENGINES=${ENGINES:-4}
CONVERSATIONS=${CONVERSATIONS:-}        # empty: ceil(POOL_SECONDS × C), see below
POOL_SECONDS=${POOL_SECONDS:-5.6}       # run.sh's 160 conversations ÷ its C of 28.7 req/s
TURNS=${TURNS:-8}
SYSTEM_TOKENS=${SYSTEM_TOKENS:-768}
USER_TOKENS=${USER_TOKENS:-128}
MAX_TOKENS=${MAX_TOKENS:-64}
ASSISTANT_TOKENS=${ASSISTANT_TOKENS:-256} # reply length in the history (see loadgen.py)
KV_BLOCKS=${KV_BLOCKS:-16384}
BLOCK_SIZE=16; MAX_NUM_SEQS=64; MAX_NUM_BATCHED_TOKENS=2048
SPEEDUP=${SPEEDUP:-1}
CAP_DURATION=${CAP_DURATION:-30}
CAP_WARMUP=${CAP_WARMUP:-12}
CAP_STREAMS=${CAP_STREAMS:-$((ENGINES * MAX_NUM_SEQS * 5 / 4))}
SEED=${SEED:-7}
MAX_SECONDS=${MAX_SECONDS:-600}
DYNAMO_VERSION=${DYNAMO_VERSION:-1.6.1}
DYN_VENV=${DYN_VENV:-$WORK_DIR/dynamo-venv}
RESULT_NAME=${RESULT_NAME:-prefix-dynamo}
SPILLWAY_SUMMARY=${SPILLWAY_SUMMARY:-$RESULTS_DIR/prefix-summary.json}
MODEL=mock-model
FRONTEND_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/prefix"

bench_init prefix-dynamo
START=$SECONDS
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
need python3 python3
need taskset util-linux
need ss iproute2
need curl curl
PY=$(command -v python3)   # the load generator and the report need only the standard library
for setup in $SETUPS; do
  case $setup in kv | kv-approx | round-robin) ;; *) die "unknown setup $setup (kv kv-approx round-robin)" ;; esac
done
ensure_dynamo
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
mkdir -p "$T/runs"
MODEL_DIR="$T/model"
"$DPY" -m spillbench.dynamo_model "$MODEL_DIR" \
  || { log "skipped: could not build the tokenizer folder"; exit 0; }
read -r P_FE <<<"$(free_ports 1)"
WORKLOAD=(--model "$MODEL" --unit word --turns "$TURNS"
  --system-tokens "$SYSTEM_TOKENS" --user-tokens "$USER_TOKENS"
  --assistant-tokens "$ASSISTANT_TOKENS" --max-tokens "$MAX_TOKENS" --seed "$SEED")
DESCRIBE=$("$PY" "$HERE/loadgen.py" "${WORKLOAD[@]}" --describe)

dynamo_env
MOCKER_ARGS=(--model-path "$MODEL_DIR" --model-name "$MODEL" --num-workers "$ENGINES"
  --num-gpu-blocks-override "$KV_BLOCKS" --block-size "$BLOCK_SIZE" --max-num-seqs "$MAX_NUM_SEQS"
  --max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS" --speedup-ratio "$SPEEDUP")

PID_MOCKER="" PID_FE="" FE_ARGS=()
# start_dynamo SETUP TAG: SETUP capacity = round-robin frontend (mocker with its prefix cache).
# Returns 1 (after logging why) when Dynamo does not come up.
start_dynamo() {
  local setup=$1 tag=$2 cache=(--enable-prefix-caching)
  local fe=(--http-host 127.0.0.1 --http-port "$P_FE")
  case $setup in
    capacity) fe+=(--router-mode round-robin) ;;
    kv) fe+=(--router-mode kv) ;;
    kv-approx) fe+=(--router-mode kv --no-router-kv-events) ;;
    round-robin) fe+=(--router-mode round-robin) ;;
  esac
  port_unused "$P_FE"
  export DYN_FILE_KV="$T/kv-$tag"   # fresh discovery state: no dead worker's record
  mkdir -p "$DYN_FILE_KV"
  spawn $LOAD_CPU "mocker-$tag" "$DPY" -m dynamo.mocker "${MOCKER_ARGS[@]}" "${cache[@]}" "${PLANES[@]}"
  PID_MOCKER=$SPAWNED
  FE_ARGS=("${fe[@]}")
  spawn $FRONTEND_CPU "frontend-$tag" "$DPY" -m dynamo.frontend "${fe[@]}" "${PLANES[@]}"
  PID_FE=$SPAWNED
  local deadline=$((SECONDS + 90)) probe inst
  while ((SECONDS < deadline)); do
    kill -0 "$PID_MOCKER" 2>/dev/null || { log "mocker exited: $(tail -5 "$T/mocker-$tag.log")"; return 1; }
    kill -0 "$PID_FE" 2>/dev/null || { log "frontend exited: $(tail -5 "$T/frontend-$tag.log")"; return 1; }
    # Ready: every worker registered (one generate instance each), the model listed, a reply.
    inst=$(compgen -G "$DYN_FILE_KV/v1/instances/*generate*" | wc -l)
    if ((inst >= ENGINES)) && curl -s -m 1 "http://127.0.0.1:$P_FE/v1/models" | grep -q "\"$MODEL\""; then
      probe=$(curl -s -m 5 "http://127.0.0.1:$P_FE/v1/chat/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"lorem ipsum\"}],\"max_tokens\":2}" || true)
      [[ $probe == *'"completion_tokens":2'* ]] && { sleep 1; return 0; }
    fi
    sleep 0.3
  done
  log "Dynamo not ready after 90 s: $(tail -3 "$T/frontend-$tag.log")"
  return 1
}
stop_dynamo() { stop_pid "$PID_FE"; stop_pid "$PID_MOCKER"; }

loadgen() { # out label extra-args...
  local out=$1 label=$2; shift 2
  run_pinned $LOAD_CPU timeout $((DURATION + DRAIN + 60)) "$PY" "$HERE/loadgen.py" \
    "${WORKLOAD[@]}" --label "$label" --out "$out" "$@" 2>>"$T/loadgen.err" \
    || die "load generator failed: $(tail -5 "$T/loadgen.err")"
}

# --- 1. capacity as round-robin finds it: closed loop, round-robin, mocker caching on.
log "measuring capacity: Dynamo mocker ($ENGINES workers, speedup $SPEEDUP, prefix caching on), round-robin, closed loop, $CAP_STREAMS streams, ${CAP_DURATION}s"
start_dynamo capacity capacity || { log "skipped: Dynamo does not start here (see above)"; exit 0; }
# Dynamo's own count of turn 0's prompt (chat template included), against the workload's.
PROBE_TOKENS=$("$PY" - "$P_FE" "$HERE" "${WORKLOAD[@]}" <<'PY'
import json, subprocess, sys, urllib.request
port, here, wl = sys.argv[1], sys.argv[2], sys.argv[3:]
body = subprocess.check_output([sys.executable, f"{here}/loadgen.py", *wl, "--print-body", "0"])
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                             {"content-type": "application/json"})
print(json.loads(urllib.request.urlopen(req, timeout=20).read())["usage"]["prompt_tokens"])
PY
) || PROBE_TOKENS=""
log "turn 0 prompt: ${PROBE_TOKENS:-?} tokens for Dynamo (workload: $("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["prompt_tokens_by_turn"][0])' "$DESCRIBE"))"
c0=$(cpu_ticks "$PID_FE")
loadgen "$T/runs/capacity.jsonl" capacity --ports "$P_FE" \
  --closed "$CAP_STREAMS" --duration "$CAP_DURATION" --drain 3
CAP_TICKS=$(($(cpu_ticks "$PID_FE") - c0))
stop_dynamo
C_MEAS=$("$PY" -m spillbench measured --capacity "$T/runs/capacity.jsonl" --capacity-warmup "$CAP_WARMUP")
awk -v c="$C_MEAS" 'BEGIN{exit !(c > 1)}' || { log "skipped: measured capacity $C_MEAS req/s, Dynamo did not serve"; exit 0; }
log "measured capacity C = $C_MEAS req/s"
# The conversation pool scales with C, so the time between a conversation's turns (pool ÷
# rate) is run.sh's at the same multiple of C.
[[ -n $CONVERSATIONS ]] || CONVERSATIONS=$(awk -v c="$C_MEAS" -v s="$POOL_SECONDS" 'BEGIN{printf "%d", c * s + 0.999}')
log "conversations: $CONVERSATIONS"

# --- 2. the runs: for each load, each setup.
SUMMARY="$T/summary.jsonl"
: >"$SUMMARY"
FE_LINES=()
for k in $LOADS; do
  rate=$(awk -v k="$k" -v c="$C_MEAS" 'BEGIN{printf "%.2f", k*c}')
  for setup in $SETUPS; do
    log "load ${k}×C = $rate req/s: $setup"
    tag="$setup-$k"
    start_dynamo "$setup" "$tag" || die "Dynamo did not start for $tag"
    FE_LINES+=("- \`$setup\`: \`python -m dynamo.frontend ${FE_ARGS[*]/$P_FE/PORT} ${PLANES[*]}\`")
    c0=$(cpu_ticks "$PID_FE"); m0=$(cpu_ticks "$PID_MOCKER")
    loadgen "$T/runs/$tag.jsonl" "$tag" --ports "$P_FE" --rate "$rate" \
      --conversations "$CONVERSATIONS" --duration "$DURATION" --drain "$DRAIN" --scrape "http://127.0.0.1:$P_FE/metrics" \
      --scrape-at "$WARMUP,$DURATION" \
      --scrape-keep dynamo_frontend_cached_tokens_sum,dynamo_frontend_input_sequence_tokens_sum
    c1=$(cpu_ticks "$PID_FE"); m1=$(cpu_ticks "$PID_MOCKER")
    alive=yes; kill -0 "$PID_FE" 2>/dev/null || alive=no
    curl -s -m 3 "http://127.0.0.1:$P_FE/metrics" >"$T/runs/$tag.metrics" || true
    cp "$T/frontend-$tag.log" "$T/runs/frontend-$tag.log"
    printf '{"setup":"%s","load":%s,"rate":%s,"file":"%s","proxy_ticks":%s,"mocker_ticks":%s,"proxy_alive":"%s","metrics":"%s","log":"%s"}\n' \
      "$setup" "$k" "$rate" "$T/runs/$tag.jsonl" "$((c1 - c0))" "$((m1 - m0))" "$alive" \
      "$T/runs/$tag.metrics" "$T/runs/frontend-$tag.log" >>"$SUMMARY"
    stop_dynamo
  done
done

ELAPSED=$((SECONDS - START))
{
  echo "# Prefix reuse: NVIDIA Dynamo $DYNAMO_VERSION, KV router against round-robin (frontend + mocker with prefix caching)"
  echo
  if [[ -n ${NOTE:-} ]]; then echo "**Variant:** $NOTE"; echo; fi
  echo "Generated by \`bench/prefix/dynamo.sh\` (LOADS=\"$LOADS\" SETUPS=\"$SETUPS\" DURATION=${DURATION}s WARMUP=${WARMUP}s DRAIN=${DRAIN}s CONVERSATIONS=$CONVERSATIONS (POOL_SECONDS=$POOL_SECONDS) TURNS=$TURNS SYSTEM_TOKENS=$SYSTEM_TOKENS USER_TOKENS=$USER_TOKENS ASSISTANT_TOKENS=$ASSISTANT_TOKENS MAX_TOKENS=$MAX_TOKENS KV_BLOCKS=$KV_BLOCKS SPEEDUP=$SPEEDUP SEED=$SEED); run time ${ELAPSED}s."
  echo
  dynamo_header "$LOAD_START"
  echo "- Placement: Dynamo's frontend under \`taskset -c $FRONTEND_CPU\`; the mocker ($ENGINES workers in one process) and the load generator under \`taskset -c $LOAD_CPU\`; all at nice $BENCH_NICE."
  echo "- Mocker: \`python -m dynamo.mocker ${MOCKER_ARGS[*]/$MODEL_DIR/MODEL_DIR} --enable-prefix-caching ${PLANES[*]}\` (MODEL_DIR: bench/lib/spillbench/dynamo_model.py's word-level tokenizer)."
  echo "- Frontends (capacity run: \`--router-mode round-robin\`):"
  printf '%s\n' "${FE_LINES[@]}" | sort -u | sed 's/^/  /'
  dynamo_env_line
} >"$T/header.md"

"$PY" "$HERE/report.py" dynamo --summary "$SUMMARY" --capacity "$T/runs/capacity.jsonl" \
  --capacity-warmup "$CAP_WARMUP" --capacity-ticks "$CAP_TICKS" --header "$T/header.md" \
  --describe "$DESCRIBE" --probe-tokens "$PROBE_TOKENS" --warmup "$WARMUP" \
  --duration "$DURATION" --drain "$DRAIN" --max-tokens "$MAX_TOKENS" \
  --clk-tck "$(getconf CLK_TCK)" --spillway-summary "$SPILLWAY_SUMMARY" \
  --out-md "$RESULTS_DIR/$RESULT_NAME.md" --out-json "$RESULTS_DIR/$RESULT_NAME-summary.json"
if [[ -n ${KEEP_RAW:-} ]]; then
  rm -rf "$WORK_DIR/prefix-dynamo-raw" && cp -r "$T" "$WORK_DIR/prefix-dynamo-raw"
  log "raw data kept in $WORK_DIR/prefix-dynamo-raw"
fi
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

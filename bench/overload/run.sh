#!/usr/bin/env bash
# Overload: what a client sees when offered load exceeds the engines' capacity C.
#
#   bench/overload/run.sh         # ~6 min; writes bench/results/overload.md and overload.png
#
# Two mock engines (`spillway mock-engine`, identical settings) of capacity C each; C
# comes from the mock's time model and is measured (closed loop at saturation). Offered
# load LOADS × C_total, open loop (Poisson arrivals), streaming chat completions with a
# fixed prompt size and max_tokens, each run DURATION seconds of arrivals plus at most
# DRAIN seconds to finish. Three setups in front of the same engines:
#   shed     Spillway with shedding: busy thresholds fed by the engines' pushed load and
#            the router's tracked load, plus an exact per-worker admission cap
#            (engine_request_limit N, request_queue_limit Q, request_queue_timeout_ms)
#   adaptive the shed setup in adaptive mode: the same thresholds, scaled per worker to hold
#            the admitted requests' mean TTFT at ADAPTIVE_TTFT_MS (bounds ADAPTIVE_MIN/MAX)
#   room     the adaptive setup with a waiting room per model instead of worker queues: a
#            request that finds both workers' N slots full waits for the first slot either
#            frees (ROOM_SIZE places, ROOM_TIMEOUT_MS; docs/behaviour.md §8.12)
#   noshed   Spillway with no thresholds and no engine limits
#   haproxy  HAProxy, maxconn N per server, queue bounded by `timeout queue` (503)
# Runs are interleaved (for each load: shed, noshed, haproxy); every run starts fresh
# engines and a fresh proxy. Placement: proxy on CPU 0; engines and load generator on CPU 1.
#
# Knobs (environment, defaults below): LOADS DURATION WARMUP DRAIN PROMPT_BYTES MAX_TOKENS
# SHED_N SHED_Q SHED_QTIMEOUT_MS SHED_PREFILL SHED_DECODE PUSH_MS MONITOR_MS HAPROXY_N HAPROXY_QTIMEOUT_MS
# ADAPTIVE_TTFT_MS ADAPTIVE_MIN ADAPTIVE_MAX ADAPTIVE_Q ADAPTIVE_QTIMEOUT_MS (setup adaptive)
# ROOM_SIZE ROOM_TIMEOUT_MS (setup room)
# SETUPS RESULT_NAME NOTE MAX_SECONDS (watchdog, after installs) BENCH_NICE KEEP_RAW=1 (keep raw data in bench/work).
# ROUTER_MODE (default least-loaded): the router_mode of every Spillway setup's model, e.g.
#   ROUTER_MODE=kv RESULT_NAME=overload-kv bench/overload/run.sh
# (the kv mode's other keys keep their defaults; SHED_EXTRA_TOML can set them for the shed setup).
#
# Request classes: CLASS_MIX=critical:0.2,standard:0.3,sheddable:0.5 gives each request of the
# load runs a class drawn with those weights, sent in the header CLASS_HEADER (default
# x-spillway-class); the report then adds per-class figures and the plot shows refused share
# and TTFT p99 per class. SHED_EXTRA_TOP (top-level TOML, e.g. a `[classes]` table) and
# SHED_EXTRA_TOML (keys appended to the `[[models]]` section) add to the shed setup's config:
#   SETUPS=shed CLASS_MIX=critical:0.2,standard:0.3,sheddable:0.5 RESULT_NAME=overload-classes \
#     LOADS="0.5 1 3" SHED_EXTRA_TOP=$'[classes]\n...' bench/overload/run.sh
# With CLASS_MIX empty (the default) nothing changes.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

LOADS=${LOADS:-"0.5 1 1.5 2 3"}
SETUPS=${SETUPS:-"shed noshed haproxy"}
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-5}
DRAIN=${DRAIN:-4}
PROMPT_BYTES=${PROMPT_BYTES:-1024}       # ≈ 256 prompt tokens (the mock counts bytes / 4)
MAX_TOKENS=${MAX_TOKENS:-64}
CAP_DURATION=${CAP_DURATION:-20}         # capacity measurement: closed loop
CAP_WARMUP=${CAP_WARMUP:-8}
MAX_SECONDS=${MAX_SECONDS:-585}
# The mock engine: its defaults, spelled out (a small GPU; see mock/src/lib.rs).
KV_BLOCKS=2048; BLOCK_SIZE=16; MAX_NUM_SEQS=64; MAX_NUM_BATCHED_TOKENS=2048
PREFILL_TPS=20000; STEP_MS=8; STEP_PER_SEQ_MS=0.25
MODEL=mock-model
ROUTER_MODE=${ROUTER_MODE:-least-loaded} # Spillway setups' router_mode
# Shedding (setup "shed"); the reasoning is in the report (report.py) and bench/README.md.
SHED_N=${SHED_N:-64}
SHED_Q=${SHED_Q:-2}
SHED_QTIMEOUT_MS=${SHED_QTIMEOUT_MS:-5}
SHED_PREFILL=${SHED_PREFILL-512}        # empty: no prefill threshold
SHED_DECODE=${SHED_DECODE-0.9}          # empty: no decode threshold
PUSH_MS=${PUSH_MS:-5}                    # how often the engines push load (setup shed only)
MONITOR_MS=${MONITOR_MS:-5}              # how often Spillway folds tracked load into busy
RESULT_NAME=${RESULT_NAME:-overload}     # bench/results/$RESULT_NAME.md, .png, -summary.json
HAPROXY_N=${HAPROXY_N:-$SHED_N}
HAPROXY_QTIMEOUT_MS=${HAPROXY_QTIMEOUT_MS:-50}
ADAPTIVE_TTFT_MS=${ADAPTIVE_TTFT_MS:-55}  # setup "adaptive": the TTFT target
ADAPTIVE_MIN=${ADAPTIVE_MIN:-0.25}
ADAPTIVE_MAX=${ADAPTIVE_MAX:-4}
# The adaptive setup's queue: its controller counts queue waits in the TTFT it holds, so it
# may queue as long as HAProxy's `timeout queue` (at each of two workers at most: one
# migration).
ADAPTIVE_Q=${ADAPTIVE_Q:-16}
ADAPTIVE_QTIMEOUT_MS=${ADAPTIVE_QTIMEOUT_MS:-$HAPROXY_QTIMEOUT_MS}
# The room setup's waiting room: HAProxy's queue wait, over both workers at once.
ROOM_SIZE=${ROOM_SIZE:-64}
ROOM_TIMEOUT_MS=${ROOM_TIMEOUT_MS:-$HAPROXY_QTIMEOUT_MS}
CLASS_MIX=${CLASS_MIX:-}                 # NAME:WEIGHT,...; empty: requests carry no class
CLASS_HEADER=${CLASS_HEADER:-x-spillway-class}
SHED_EXTRA_TOP=${SHED_EXTRA_TOP:-}       # appended to the shed config's top level
SHED_EXTRA_TOML=${SHED_EXTRA_TOML:-}     # appended to the shed config's [[models]] section
CLASS_ARGS=()
[[ -n $CLASS_MIX ]] && CLASS_ARGS=(--class-mix "$CLASS_MIX" --class-header "$CLASS_HEADER")
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/overload"

bench_init overload
START=$SECONDS
need python3 python3
need haproxy haproxy
need taskset util-linux
need ss iproute2
need curl curl
ensure_venv
ensure_spillway
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
mkdir -p "$T/runs"
read -r P_PROXY P_ADMIN P_E1 P_E2 <<<"$(free_ports 4)"

# The model's capacity per engine, and the loads in requests/s.
read -r C_MODEL_1 <<<"$("$PY" -m spillbench capacity --prompt-bytes "$PROMPT_BYTES" \
  --max-tokens "$MAX_TOKENS" --max-num-seqs $MAX_NUM_SEQS --kv-blocks $KV_BLOCKS \
  --block-size $BLOCK_SIZE --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS \
  --prefill-tps $PREFILL_TPS --step-ms $STEP_MS --step-per-seq-ms $STEP_PER_SEQ_MS)"
C_MODEL=$(awk -v c="$C_MODEL_1" 'BEGIN{printf "%.2f", 2*c}')
log "capacity from the time model: $C_MODEL_1 req/s per engine, C = $C_MODEL req/s for two"

start_engines() { # [push]
  local push=() e
  for e in 1 2; do
    local port_var="P_E$e"
    port_unused "${!port_var}"
    [[ ${1:-} == push ]] && push=(--push-load "http://127.0.0.1:$P_ADMIN" --worker-name "e$e"
      --push-interval-ms $PUSH_MS)
    spawn_mock_engine $LOAD_CPU "engine$e" "${!port_var}" "${push[@]}"
    eval "PID_E$e=$SPAWNED"
  done
  wait_port "$P_E1" "$PID_E1"; wait_port "$P_E2" "$PID_E2"
}
stop_engines() { stop_pid "$PID_E1"; stop_pid "$PID_E2"; }

spillway_config() { # shed|adaptive|room|noshed
  local shed=$1
  [[ $1 == adaptive || $1 == room ]] && shed=shed
  cat <<EOF
listen = "127.0.0.1:$P_PROXY"
admin_listen = "127.0.0.1:$P_ADMIN"
cores = 1
cpus = [$PROXY_CPU]
monitor_cpu = $PROXY_CPU
EOF
  if [[ $shed == shed ]]; then
    echo "monitor_interval_ms = $MONITOR_MS"
    if [[ -n $SHED_EXTRA_TOP ]]; then echo; printf '%s\n' "$SHED_EXTRA_TOP"; fi
  fi
  cat <<EOF

[[models]]
name = "$MODEL"
router_mode = "$ROUTER_MODE"
EOF
  if [[ $shed == shed ]]; then
    if [[ -n $SHED_PREFILL ]]; then echo "active_prefill_tokens_threshold = $SHED_PREFILL"; fi
    if [[ -n $SHED_DECODE ]]; then echo "active_decode_blocks_threshold = $SHED_DECODE"; fi
    if [[ -n $SHED_EXTRA_TOML ]]; then printf '%s\n' "$SHED_EXTRA_TOML"; fi
  fi
  if [[ $1 == room ]]; then
    echo "waiting_room_size = $ROOM_SIZE"
    echo "waiting_room_timeout_ms = $ROOM_TIMEOUT_MS"
  fi
  if [[ $1 == adaptive || $1 == room ]]; then
    echo "adaptive_ttft_ms = $ADAPTIVE_TTFT_MS"
    echo "adaptive_min_scale = $ADAPTIVE_MIN"
    echo "adaptive_max_scale = $ADAPTIVE_MAX"
  fi
  local e
  for e in 1 2; do
    local port_var="P_E$e"
    echo
    echo "[[models.workers]]"
    echo "url = \"http://127.0.0.1:${!port_var}\""
    echo "name = \"e$e\""
    echo "kv_total_blocks = $KV_BLOCKS"
    echo "max_num_batched_tokens = $MAX_NUM_BATCHED_TOKENS"
    if [[ $shed == shed ]]; then
      echo 'load_sources = ["push", "tracked"]'
      echo "engine_request_limit = $SHED_N"
      if [[ $1 == adaptive ]]; then
        echo "request_queue_limit = $ADAPTIVE_Q"
        echo "request_queue_timeout_ms = $ADAPTIVE_QTIMEOUT_MS"
      else
        echo "request_queue_limit = $SHED_Q"
        echo "request_queue_timeout_ms = $SHED_QTIMEOUT_MS"
      fi
    fi
  done
}

haproxy_config() {
  cat <<EOF
global
    nbthread 1
    cpu-map 1/1 $PROXY_CPU
    maxconn 8000
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout queue ${HAPROXY_QTIMEOUT_MS}ms
    option http-keep-alive
    # SSE: forward each event at once (no MSG_MORE batching, which delays streams ~200 ms).
    option http-no-delay
    http-reuse safe
frontend fe
    bind 127.0.0.1:$P_PROXY
    default_backend engines
backend engines
    balance leastconn
    server e1 127.0.0.1:$P_E1 maxconn $HAPROXY_N
    server e2 127.0.0.1:$P_E2 maxconn $HAPROXY_N
EOF
}

PROXY_PID=""
start_proxy() { # setup
  port_unused "$P_PROXY"
  case $1 in
    shed | adaptive | room | noshed)
      spillway_config "$1" >"$T/spillway-$1.toml"
      "$SPILLWAY" check-config "$T/spillway-$1.toml" >/dev/null 2>"$T/check.err" \
        || { cat "$T/check.err" >&2; die "spillway config invalid"; }
      RUST_LOG=warn spawn $PROXY_CPU "spillway-$1-$2" "$SPILLWAY" --config "$T/spillway-$1.toml"
      ;;
    haproxy)
      haproxy_config >"$T/haproxy.cfg"
      haproxy -c -q -f "$T/haproxy.cfg" || die "haproxy config invalid"
      spawn $PROXY_CPU "haproxy-$2" haproxy -db -f "$T/haproxy.cfg"
      ;;
  esac
  PROXY_PID=$SPAWNED
  wait_port "$P_PROXY" "$PROXY_PID"
}

loadgen() { # out label extra-args...
  local out=$1 label=$2; shift 2
  run_pinned $LOAD_CPU timeout $((DURATION + DRAIN + 60)) "$PY" -m spillbench.loadgen \
    --model $MODEL --prompt-bytes "$PROMPT_BYTES" --max-tokens "$MAX_TOKENS" \
    --label "$label" --out "$out" "$@" 2>>"$T/loadgen.err" \
    || die "load generator failed: $(tail -5 "$T/loadgen.err")"
}

# --- 1. capacity at saturation: closed loop, 2 × max_num_seqs streams per engine, direct.
log "measuring capacity: closed loop, $((4 * MAX_NUM_SEQS)) streams, ${CAP_DURATION}s"
start_engines
loadgen "$T/runs/capacity.jsonl" capacity --ports "$P_E1,$P_E2" \
  --closed $((4 * MAX_NUM_SEQS)) --duration "$CAP_DURATION" --drain 3
stop_engines

# --- 2. the runs: for each load, each setup.
SUMMARY="$T/summary.jsonl"
: >"$SUMMARY"
for k in $LOADS; do
  rate=$(awk -v k="$k" -v c="$C_MODEL" 'BEGIN{printf "%.2f", k*c}')
  for setup in $SETUPS; do
    log "load ${k}×C = $rate req/s: $setup"
    tag="$setup-$k"
    if [[ $setup == shed || $setup == adaptive || $setup == room ]]; then start_engines push; else start_engines; fi
    start_proxy "$setup" "$k"
    c0=$(cpu_ticks "$PROXY_PID")
    # The engines' backlog when arrivals stop: what a new request would queue behind.
    (
      trap 'kill $sp 2>/dev/null; exit 0' TERM
      sleep "$DURATION" &
      sp=$!
      wait "$sp"
      for e in 1 2; do
        port_var="P_E$e"
        curl -s -m 2 "http://127.0.0.1:${!port_var}/metrics" >"$T/runs/$tag.e$e.metrics" || true
      done
    ) &
    SCRAPER=$!
    BENCH_PIDS+=("$SCRAPER")
    loadgen "$T/runs/$tag.jsonl" "$tag" --ports "$P_PROXY" --rate "$rate" \
      --duration "$DURATION" --drain "$DRAIN" --seed 7 "${CLASS_ARGS[@]}"
    c1=$(cpu_ticks "$PROXY_PID")
    wait "$SCRAPER" 2>/dev/null || true
    stop_pid "$SCRAPER"
    alive=yes; kill -0 "$PROXY_PID" 2>/dev/null || alive=no
    metrics=""
    if [[ $setup != haproxy ]]; then
      curl -s -m 3 "http://127.0.0.1:$P_ADMIN/metrics" >"$T/runs/$tag.metrics" || true
      metrics="$T/runs/$tag.metrics"
    fi
    printf '{"setup":"%s","load":%s,"rate":%s,"file":"%s","proxy_ticks":%s,"proxy_alive":"%s","metrics":"%s","engine_metrics":["%s","%s"],"log":"%s"}\n' \
      "$setup" "$k" "$rate" "$T/runs/$tag.jsonl" "$((c1 - c0))" "$alive" "$metrics" \
      "$T/runs/$tag.e1.metrics" "$T/runs/$tag.e2.metrics" \
      "$T/$( [[ $setup == haproxy ]] && echo "haproxy-$k" || echo "spillway-$setup-$k").log" >>"$SUMMARY"
    stop_pid "$PROXY_PID"
    stop_engines
  done
done

ELAPSED=$((SECONDS - START))
{
  echo "# Overload: Spillway with and without shedding vs HAProxy, offered load 0.5–3 × C"
  echo
  if [[ -n ${NOTE:-} ]]; then echo "**Variant:** $NOTE"; echo; fi
  echo "Generated by \`bench/overload/run.sh\` (LOADS=\"$LOADS\" DURATION=${DURATION}s WARMUP=${WARMUP}s DRAIN=${DRAIN}s PROMPT_BYTES=$PROMPT_BYTES MAX_TOKENS=$MAX_TOKENS${CLASS_MIX:+ CLASS_MIX=$CLASS_MIX CLASS_HEADER=$CLASS_HEADER}$([[ $ROUTER_MODE != least-loaded ]] && echo " ROUTER_MODE=$ROUTER_MODE")); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- Tools: Python $("$PY" -c 'import platform; print(platform.python_version())') asyncio load generator (bench/lib/spillbench/loadgen.py), $(haproxy -v | head -1 | cut -d' ' -f1-3), matplotlib $("$PY" -c 'import matplotlib; print(matplotlib.__version__)')"
  echo "- Placement: proxy on CPU $PROXY_CPU (Spillway cores=1 cpus=[0] monitor_cpu=0; HAProxy nbthread 1 + cpu-map 1/1 0, all under taskset -c 0); both mock engines and the load generator on CPU $LOAD_CPU."
  echo "- Engines (each): \`spillway mock-engine $(mock_engine_flags)\`; requests: streaming chat completions, prompt $PROMPT_BYTES bytes of messages (≈ $((PROMPT_BYTES / 4)) tokens by the mock's estimate), max_tokens $MAX_TOKENS."
} >"$T/header.md"
# A run without the shed setup shows the adaptive (or room) setup's file as the shedding
# configuration.
for f in adaptive room; do
  [[ -f $T/spillway-shed.toml ]] || cp "$T/spillway-$f.toml" "$T/spillway-shed.toml" 2>/dev/null || true
done
cp "$T/spillway-shed.toml" "$T/shed.toml" 2>/dev/null || true

"$PY" "$HERE/report.py" report --summary "$SUMMARY" --capacity "$T/runs/capacity.jsonl" \
  --capacity-warmup "$CAP_WARMUP" --c-model-per-engine "$C_MODEL_1" --header "$T/header.md" \
  --warmup "$WARMUP" --duration "$DURATION" --drain "$DRAIN" --max-tokens "$MAX_TOKENS" \
  --shed-config "$T/spillway-shed.toml" --haproxy-config "$T/haproxy.cfg" \
  --adaptive-knobs "adaptive_ttft_ms = $ADAPTIVE_TTFT_MS, adaptive_min_scale = $ADAPTIVE_MIN, adaptive_max_scale = $ADAPTIVE_MAX" \
  --adaptive-worker-knobs "request_queue_limit = $ADAPTIVE_Q, request_queue_timeout_ms = $ADAPTIVE_QTIMEOUT_MS" \
  --room-knobs "waiting_room_size = $ROOM_SIZE, waiting_room_timeout_ms = $ROOM_TIMEOUT_MS" \
  --clk-tck "$(getconf CLK_TCK)" ${CLASS_MIX:+--classes} \
  --shed-knobs "N=$SHED_N Q=$SHED_Q QT=$SHED_QTIMEOUT_MS PREFILL=$SHED_PREFILL DECODE=$SHED_DECODE PUSH=$PUSH_MS MONITOR=$MONITOR_MS HAPROXY_QT=$HAPROXY_QTIMEOUT_MS" \
  --out-md "$RESULTS_DIR/$RESULT_NAME.md" --out-png "$RESULTS_DIR/$RESULT_NAME.png" \
  --out-json "$RESULTS_DIR/$RESULT_NAME-summary.json"
if [[ -n ${KEEP_RAW:-} ]]; then
  rm -rf "$WORK_DIR/overload-raw" && cp -r "$T" "$WORK_DIR/overload-raw"
  log "raw data kept in $WORK_DIR/overload-raw"
fi
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

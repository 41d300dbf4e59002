#!/usr/bin/env bash
# Streamed completions through a proxy: CPU per streamed request and per SSE event, and the
# inter-token latency a proxy adds, for Spillway (plain, shedding on, access log on), nginx
# (`proxy_buffering off`) and HAProxy, beside the engine reached directly.
#
#   bench/stream/run.sh        # ~9 min; writes bench/results/stream.md and stream.png
#
# Placement (2-CPU machine): every proxy on CPU 0, alone there while it is measured (the
# others are idle); the origin (`spillway mock-engine`: one SSE event per token, one write
# per event, STEP_MS between tokens) and the client (bench/stream/client.rs: CONNS
# keep-alive connections in a closed loop on one io_uring thread, timing every event) on
# CPU 1. Per scenario (TOKENS:FINGERPRINT: max_tokens of each request, and the bytes of a
# `system_fingerprint` string that makes every event larger, as logprobs do), fresh
# processes, then ROUNDS rounds with the targets interleaved, DURATION seconds each.
# CPU is the proxy's utime+stime over the client's run (all its processes and threads,
# /proc/PID/stat) divided by the streams (or events) the client completed. ITL is each
# event's arrival after the one before at the client; "added" is the target's percentile
# less the direct run's of the same round.
#
# Knobs (environment): ROUNDS=3 DURATION=8 CONNS=64 STEP_MS=2
# SCENARIOS="64:0 256:0 64:1000" TARGETS="direct spillway spillway-shed spillway-log nginx
# haproxy haproxy-delay" MAX_SECONDS=900 (watchdog) BENCH_NICE=-10 RESULT_NAME=stream.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
STEP_MS=${STEP_MS:-2}
SCENARIOS=${SCENARIOS:-"64:0 256:0 64:1000"}
TARGETS=${TARGETS:-"direct spillway spillway-shed spillway-log nginx haproxy haproxy-delay"}
MAX_SECONDS=${MAX_SECONDS:-900}
RESULT_NAME=${RESULT_NAME:-stream}
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/stream"
CLIENT="$REPO_DIR/target/release/examples/stream_client"

bench_init stream
START=$SECONDS

need python3 python3
need curl curl
need nginx nginx-light
need haproxy haproxy
need taskset util-linux
need ss iproute2
ensure_venv
ensure_spillway
if [[ ! -x $CLIENT ]] || [[ $HERE/client.rs -nt $CLIENT ]]; then
  log "building the stream client (cargo build --release --example stream_client)"
  (cd "$REPO_DIR" && cargo build --release --quiet --example stream_client) || die "build failed"
fi
watchdog "$MAX_SECONDS"
T=$BENCH_TMP
RAW="$T/raw.tsv"
printf 'scenario\tround\ttarget\tticks\twall_s\tclient\n' >"$RAW"
CLK_TCK=$(getconf CLK_TCK)

# The Spillway variants: plain; shedding on (decode and prefill thresholds on tracked load,
# generated tokens counted into it per event, N = 256); the JSON access log to a file.
spillway_variant() { # NAME PORT ADMIN ORIGIN
  local name=$1 model_extra="" worker_extra="" top=""
  case $name in
    spillway-shed)
      model_extra='active_decode_blocks_threshold = 0.99
active_prefill_tokens_threshold = 1000000
track_output_blocks = true'
      worker_extra='load_sources = ["tracked"]
kv_total_blocks = 1000000
block_size = 16
engine_request_limit = 256
request_queue_limit = 16' ;;
    spillway-log) top="[access_log]
path = \"$T/$name-access.log\"" ;;
  esac
  spillway_proxy_toml "$PROXY_CPU" "$2" "$3" "$4" "$top" "$model_extra" "$worker_extra"
}

# start_scenario FINGERPRINT: the engine and every proxy, fresh; sets PORT_* and PIDS_*.
declare -A PORT PIDS
start_scenario() {
  local fp=$1 ports i=0 tgt
  read -r -a ports <<<"$(free_ports 12)"
  P_ORIGIN=${ports[0]}
  spawn $LOAD_CPU "origin-$fp" "$SPILLWAY" mock-engine --listen "127.0.0.1:$P_ORIGIN" \
    --model bench-model --decode-step-ms "$STEP_MS" --decode-step-per-seq-ms 0 \
    --max-num-seqs 1024 --kv-blocks 1000000 --fingerprint-bytes "$fp"
  wait_port "$P_ORIGIN" "$SPAWNED"
  PID_ORIGIN=$SPAWNED
  PORT[direct]=$P_ORIGIN; PIDS[direct]=""
  for tgt in $TARGETS; do
    i=$((i + 1))
    case $tgt in
      direct) ;;
      spillway*)
        spillway_variant "$tgt" "${ports[i]}" "${ports[i + 6]}" "$P_ORIGIN" >"$T/$tgt.toml"
        "$SPILLWAY" check-config "$T/$tgt.toml" >/dev/null || die "$tgt: config invalid"
        RUST_LOG=warn spawn $PROXY_CPU "$tgt-$fp" "$SPILLWAY" --config "$T/$tgt.toml"
        PORT[$tgt]=${ports[i]}; PIDS[$tgt]=$SPAWNED ;;
      nginx)
        nginx_proxy_conf "$T/nginx" "$PROXY_CPU" "$P_ORIGIN" "127.0.0.1:${ports[i]}" \
          | sed 's/proxy_set_header Connection "";/&\n      proxy_buffering off;/' >"$T/nginx.conf"
        grep -q 'proxy_buffering off' "$T/nginx.conf" || die "nginx: proxy_buffering not set"
        nginx -t -q -c "$T/nginx.conf" -p "$T/nginx" 2>/dev/null || die "nginx config invalid"
        spawn $PROXY_CPU "nginx-$fp" nginx -c "$T/nginx.conf" -p "$T/nginx"
        PORT[$tgt]=${ports[i]}; PIDS[$tgt]=$SPAWNED ;;
      haproxy | haproxy-delay)
        # `option http-no-delay`: each event goes out as it comes. Without it (haproxy-delay,
        # HAProxy's default) HAProxy holds data back to send fuller segments, which merges
        # events and delays tokens by tens of milliseconds (see the results' notes).
        haproxy_proxy_cfg "$PROXY_CPU" "$P_ORIGIN" "127.0.0.1:${ports[i]}" >"$T/$tgt.cfg"
        [[ $tgt == haproxy ]] && sed -i 's/^    option http-keep-alive$/&\n    option http-no-delay/' "$T/$tgt.cfg"
        [[ $tgt == haproxy-delay ]] || grep -q 'http-no-delay' "$T/$tgt.cfg" || die "haproxy: no http-no-delay"
        haproxy -c -q -f "$T/$tgt.cfg" || die "haproxy config invalid"
        spawn $PROXY_CPU "$tgt-$fp" haproxy -db -f "$T/$tgt.cfg"
        PORT[$tgt]=${ports[i]}; PIDS[$tgt]=$SPAWNED ;;
      *) die "unknown target $tgt" ;;
    esac
  done
  for tgt in $TARGETS; do wait_port "${PORT[$tgt]}"; done
}

# The proxy's processes: nginx's master and worker, the others one process.
pids_of() {
  [[ -z ${PIDS[$1]} ]] && return 0
  if [[ $1 == nginx ]]; then with_children "${PIDS[nginx]}"; else echo "${PIDS[$1]}"; fi
}

stop_scenario() {
  local tgt
  for tgt in $TARGETS; do [[ -n ${PIDS[$tgt]} ]] && stop_pid "${PIDS[$tgt]}"; done
  stop_pid "$PID_ORIGIN"
}

# measure SCENARIO ROUND TARGET SECONDS: one client run; appends a line to $RAW.
measure() {
  local sc=$1 round=$2 tgt=$3 secs=$4 pids t0=0 t1=0 w0 w1 line
  read -r -a pids <<<"$(pids_of "$tgt")"
  ((${#pids[@]})) && t0=$(cpu_ticks "${pids[@]}")
  w0=$(date +%s.%N)
  line=$(run_pinned $LOAD_CPU timeout $((secs + 30)) "$CLIENT" "127.0.0.1:${PORT[$tgt]}" \
    "$secs" "$CONNS" "$T/body.json") || log "$tgt: client exited $?"
  w1=$(date +%s.%N)
  ((${#pids[@]})) && t1=$(cpu_ticks "${pids[@]}")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$sc" "$round" "$tgt" "$((t1 - t0))" \
    "$(awk -v a="$w0" -v b="$w1" 'BEGIN{printf "%.3f", b-a}')" "$line" >>"$RAW"
}

for sc in $SCENARIOS; do
  tokens=${sc%%:*}; fp=${sc##*:}
  printf '{"model":"bench-model","messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":%s,"stream":true}' \
    "$tokens" >"$T/body.json"
  start_scenario "$fp"
  for tgt in $TARGETS; do
    out=$(curl -s -m 10 -N -X POST -H 'content-type: application/json' -d @"$T/body.json" \
      "http://127.0.0.1:${PORT[$tgt]}/v1/chat/completions") || die "$tgt: request failed"
    [[ $out == *"data: [DONE]"* ]] || die "$tgt: no [DONE] in the stream: ${out:0:300}"
    measure "$sc" 0 "$tgt" 2 # warm-up (pools, caches), not reported
  done
  for round in $(seq 1 "$ROUNDS"); do
    for tgt in $TARGETS; do
      log "scenario $sc round $round/$ROUNDS: $tgt"
      measure "$sc" "$round" "$tgt" "$DURATION"
    done
  done
  for tgt in $TARGETS; do
    [[ $tgt == spillway* ]] || continue
    kill -0 "${PIDS[$tgt]}" 2>/dev/null || log "warning: $tgt is gone"
  done
  stop_scenario
done

ELAPSED=$((SECONDS - START))
{
  echo "# Streamed completions through a proxy: CPU per stream and per event, added inter-token latency"
  echo
  echo "Generated by \`bench/stream/run.sh\` (ROUNDS=$ROUNDS DURATION=${DURATION}s CONNS=$CONNS STEP_MS=$STEP_MS SCENARIOS=\"$SCENARIOS\"); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- Tools: $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v | head -1 | cut -d' ' -f1-3), client \`bench/stream/client.rs\` (one monoio thread)"
  echo "- Placement: each proxy on CPU $PROXY_CPU (Spillway cores=1 cpus=[0] monitor_cpu=0; nginx one worker, \`proxy_buffering off\`; HAProxy nbthread 1), only the measured one under load; \`spillway mock-engine\` (--decode-step-ms $STEP_MS, one event per token, one write per event) and the client on CPU $LOAD_CPU."
} >"$T/header.md"

"$PY" "$HERE/report.py" --raw "$RAW" --header "$T/header.md" --clk-tck "$CLK_TCK" \
  --out-md "$RESULTS_DIR/$RESULT_NAME.md" --out-png "$RESULTS_DIR/$RESULT_NAME.png" \
  --out-raw "$RESULTS_DIR/$RESULT_NAME-raw.tsv"
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

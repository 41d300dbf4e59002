#!/usr/bin/env bash
# Faults: what a client sees when one engine of four fails, hangs, dies or flaps, with
# Spillway and with HAProxy in front.
#
#   bench/faults/run.sh      # ~7 min; writes bench/results/faults.md, faults.png, faults-summary.json
#
# Four mock engines (`spillway mock-engine`, identical) behind each setup in turn, the same
# run for each: open-loop streaming chat completions at RATE req/s (constant arrivals, one
# connection per request, max_tokens MAX_TOKENS: ~70 ms a request, far under capacity) for
# DURATION seconds; at FAULT_AT seconds engine #1 gets the scenario's fault:
#   fail   POST /fault {"mode":"fail"}: every /v1/* request answered 500 at once, /health 200
#   hang   POST /fault {"mode":"hang"}: nothing answered, /health included
#   kill   SIGKILL, and a fresh engine on the same port at RESTART_AT seconds
#   flap   POST /fault {"mode":"flap"}: FLAP_MS healthy, FLAP_MS failing, in turn
# Every run starts fresh engines and a fresh proxy. The client gives up on a request after
# TIMEOUT seconds. Setups:
#   spillway-rr  Spillway, router_mode round-robin, with [health_check] (below) when the
#                binary accepts it (else without, and the report says so)
#   spillway-ll  the same with least-loaded
#   haproxy      HAProxy with active and passive checks, L7 retries and redispatch
# Both proxies give an engine the same SERVER_TIMEOUT_S for its response head and between
# two reads of its body. Placement: proxy on CPU 0; engines and load generator on CPU 1.
#
# Knobs (environment, defaults below): SETUPS SCENARIOS DURATION FAULT_AT RESTART_AT RATE
# MAX_TOKENS PROMPT_BYTES TIMEOUT SERVER_TIMEOUT_S FLAP_MS RESULT_NAME MAX_SECONDS (watchdog)
# BENCH_NICE SPILLWAY_BIN KEEP_RAW=1 (keep the per-request records in bench/work/faults-raw/).

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

SETUPS=${SETUPS:-"spillway-rr spillway-ll haproxy"}
SCENARIOS=${SCENARIOS:-"fail hang kill flap"}
DURATION=${DURATION:-30}
FAULT_AT=${FAULT_AT:-5}
RESTART_AT=${RESTART_AT:-15}
RATE=${RATE:-40}
MAX_TOKENS=${MAX_TOKENS:-8}
PROMPT_BYTES=${PROMPT_BYTES:-256}
TIMEOUT=${TIMEOUT:-15}
SERVER_TIMEOUT_S=${SERVER_TIMEOUT_S:-10}
FLAP_MS=${FLAP_MS:-2000}
RESULT_NAME=${RESULT_NAME:-faults}
MAX_SECONDS=${MAX_SECONDS:-600}
# The mock engine: its defaults, spelled out (a small GPU; see mock/src/lib.rs).
KV_BLOCKS=2048; BLOCK_SIZE=16; MAX_NUM_SEQS=64; MAX_NUM_BATCHED_TOKENS=2048
PREFILL_TPS=20000; STEP_MS=8; STEP_PER_SEQ_MS=0.25
MODEL=mock-model
PROXY_CPU=0
LOAD_CPU=1
ENGINES="1 2 3 4"
HERE="$BENCH_DIR/faults"

bench_init faults
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
read -r P_PROXY P_ADMIN P_E1 P_E2 P_E3 P_E4 <<<"$(free_ports 6)"

start_engine() { # N
  local port_var="P_E$1"
  port_unused "${!port_var}"
  spawn_mock_engine $LOAD_CPU "engine$1" "${!port_var}" --seed "$1"
  eval "PID_E$1=$SPAWNED"
  wait_port "${!port_var}" "$SPAWNED"
}
start_engines() { local e; for e in $ENGINES; do start_engine "$e"; done; }
stop_engines() { local e v; for e in $ENGINES; do v="PID_E$e"; stop_pid "${!v}"; done; }

HEALTH_CHECK='[health_check]
kind = "http"
path = "/health"
interval_ms = 2000
timeout_ms = 1000
rise = 2
fall = 3
# [outlier] is on by default: 5 consecutive failures eject for 30 s, doubling.'

spillway_config() { # router_mode with-health-check(yes|no)
  cat <<EOF
listen = "127.0.0.1:$P_PROXY"
admin_listen = "127.0.0.1:$P_ADMIN"
cores = 1
cpus = [$PROXY_CPU]
monitor_cpu = $PROXY_CPU

[limits]
upstream_first_byte_timeout_ms = $((SERVER_TIMEOUT_S * 1000))
upstream_stream_idle_timeout_ms = $((SERVER_TIMEOUT_S * 1000))
EOF
  [[ $2 == yes ]] && printf '\n%s\n' "$HEALTH_CHECK"
  cat <<EOF

[[models]]
name = "$MODEL"
router_mode = "$1"
EOF
  local e v
  for e in $ENGINES; do
    v="P_E$e"
    printf '\n[[models.workers]]\nurl = "http://127.0.0.1:%s"\nname = "e%s"\n' "${!v}" "$e"
  done
}

# Does this binary take [health_check]? (The keys are being added; until then the bench
# runs Spillway without them and the report says so.)
spillway_config round-robin yes >"$T/probe.toml"
if "$SPILLWAY" check-config "$T/probe.toml" >/dev/null 2>"$T/probe-hc.err"; then
  SPILLWAY_HC=yes
else
  SPILLWAY_HC=no
  HC_REFUSAL=$(grep -o -m1 'unknown field `[a-z_]*`' "$T/probe-hc.err" || head -c 200 "$T/probe-hc.err")
  log "this spillway refuses [health_check] ($HC_REFUSAL): running without it"
  spillway_config round-robin no >"$T/probe.toml"
  "$SPILLWAY" check-config "$T/probe.toml" >/dev/null 2>"$T/probe.err" \
    || { cat "$T/probe.err" >&2; die "spillway config invalid"; }
fi

haproxy_config() { # retry-on list
  cat <<EOF
global
    nbthread 1
    cpu-map 1/1 $PROXY_CPU
    maxconn 4000
defaults
    mode http
    option http-keep-alive
    # SSE: forward each event at once (no MSG_MORE batching).
    option http-no-delay
    http-reuse safe
    timeout connect 1s
    timeout client 60s
    timeout http-request 10s
    # The response head and each pause of the body (the same bound Spillway gets).
    timeout server ${SERVER_TIMEOUT_S}s
    timeout check 1s
    # L7 retries: the request is kept to be sent again, on another server each time.
    option http-buffer-request
    retries 2
    option redispatch 1
    retry-on $1
frontend fe
    bind 127.0.0.1:$P_PROXY
    default_backend engines
backend engines
    balance roundrobin
    option httpchk GET /health
    default-server check inter 2s rise 2 fall 3 observe layer7 error-limit 5 on-error mark-down
EOF
  local e v
  for e in $ENGINES; do v="P_E$e"; echo "    server e$e 127.0.0.1:${!v}"; done
}
# Status codes in retry-on where this HAProxy takes them.
HAPROXY_RETRY_ON="all-retryable-errors 500 502 504"
haproxy_config "$HAPROXY_RETRY_ON" >"$T/haproxy.cfg"
if ! haproxy -c -q -f "$T/haproxy.cfg" 2>/dev/null; then
  HAPROXY_RETRY_ON="all-retryable-errors"
  log "this haproxy refuses status codes in retry-on: retry-on $HAPROXY_RETRY_ON"
  haproxy_config "$HAPROXY_RETRY_ON" >"$T/haproxy.cfg"
  haproxy -c -q -f "$T/haproxy.cfg" || die "haproxy config invalid"
fi

PROXY_PID=""
start_proxy() { # setup tag
  port_unused "$P_PROXY"
  case $1 in
    spillway-rr | spillway-ll)
      local mode=round-robin
      [[ $1 == spillway-ll ]] && mode=least-loaded
      spillway_config "$mode" "$SPILLWAY_HC" >"$T/$1.toml"
      RUST_LOG=warn spawn $PROXY_CPU "proxy-$2" "$SPILLWAY" --config "$T/$1.toml"
      ;;
    haproxy) spawn $PROXY_CPU "proxy-$2" haproxy -db -f "$T/haproxy.cfg" ;;
    *) die "unknown setup $1" ;;
  esac
  PROXY_PID=$SPAWNED
  wait_port "$P_PROXY" "$PROXY_PID"
}

now() { date +%s.%N; }
# sleep_until UNIX_TIME
sleep_until() { sleep "$(awk -v t="$1" -v n="$(now)" 'BEGIN { d = t - n; print (d > 0 ? d : 0) }')"; }
# set_fault MODE [FLAP_MS]: engine #1's fault mode, by its own /fault.
set_fault() {
  local body="{\"mode\":\"$1\"${2:+,\"flap_period_ms\":$2}}"
  curl -s -m 2 -o /dev/null -X POST -H 'content-type: application/json' -d "$body" \
    "http://127.0.0.1:$P_E1/fault" || log "warning: POST /fault $body failed"
}

# run_scenario SETUP SCENARIO: fresh engines and proxy, the load, the fault on its schedule.
# The events file has the wall-clock time of each fault action, put on the load
# generator's clock by the report.
run_scenario() {
  local setup=$1 scenario=$2 tag="$1-$2"
  local events="$T/runs/$tag.events"
  : >"$events"
  start_engines
  start_proxy "$setup" "$tag"
  sleep 1 # the proxy's first health checks
  spawn $LOAD_CPU "loadgen-$tag" "$PY" -m spillbench.loadgen --ports "$P_PROXY" \
    --model $MODEL --prompt-bytes "$PROMPT_BYTES" --max-tokens "$MAX_TOKENS" \
    --rate "$RATE" --arrivals constant --duration "$DURATION" --drain $((TIMEOUT + 1)) \
    --timeout "$TIMEOUT" --seed 7 --label "$tag" --out "$T/runs/$tag.jsonl"
  local load=$SPAWNED launched
  launched=$(now)
  sleep_until "$(awk -v a="$launched" -v b="$FAULT_AT" 'BEGIN { printf "%.3f", a + b }')"
  case $scenario in
    fail | hang) set_fault "$scenario" ;;
    flap) set_fault flap "$FLAP_MS" ;;
    kill) kill -KILL "$PID_E1" ;;
  esac
  echo "$scenario $(now)" >>"$events"
  if [[ $scenario == kill ]]; then
    wait "$PID_E1" 2>/dev/null || true
    stop_pid "$PID_E1"
    sleep_until "$(awk -v a="$launched" -v b="$RESTART_AT" 'BEGIN { printf "%.3f", a + b }')"
    start_engine 1
    echo "restart $(now)" >>"$events"
  fi
  local rc=0
  wait "$load" || rc=$?
  stop_pid "$load"
  ((rc == 0)) || die "load generator failed: $(tail -5 "$T/loadgen-$tag.log")"
  local alive=yes
  kill -0 "$PROXY_PID" 2>/dev/null || alive=no
  stop_pid "$PROXY_PID"
  stop_engines
  printf '{"setup":"%s","scenario":"%s","file":"%s","events":"%s","proxy_alive":"%s","log":"%s"}\n' \
    "$setup" "$scenario" "$T/runs/$tag.jsonl" "$events" "$alive" "$T/proxy-$tag.log" >>"$SUMMARY"
}

SUMMARY="$T/summary.jsonl"
: >"$SUMMARY"
for scenario in $SCENARIOS; do
  for setup in $SETUPS; do
    log "$scenario: $setup"
    run_scenario "$setup" "$scenario"
  done
done

ELAPSED=$((SECONDS - START))
{
  echo "# Faults: one engine of four fails, hangs, dies or flaps, behind Spillway and HAProxy"
  echo
  echo "Generated by \`bench/faults/run.sh\` (SETUPS=\"$SETUPS\" SCENARIOS=\"$SCENARIOS\" DURATION=${DURATION}s FAULT_AT=${FAULT_AT}s RESTART_AT=${RESTART_AT}s RATE=$RATE MAX_TOKENS=$MAX_TOKENS PROMPT_BYTES=$PROMPT_BYTES TIMEOUT=${TIMEOUT}s SERVER_TIMEOUT_S=$SERVER_TIMEOUT_S FLAP_MS=$FLAP_MS); run time ${ELAPSED}s."
  echo
  machine_header
  echo "- Tools: Python $("$PY" -c 'import platform; print(platform.python_version())') asyncio load generator (bench/lib/spillbench/loadgen.py), $(haproxy -v | head -1 | cut -d' ' -f1-3), matplotlib $("$PY" -c 'import matplotlib; print(matplotlib.__version__)')"
  echo "- Placement: proxy on CPU $PROXY_CPU (Spillway cores=1 cpus=[0] monitor_cpu=0; HAProxy nbthread 1 + cpu-map 1/1 0, all under taskset -c 0); the four mock engines and the load generator on CPU $LOAD_CPU."
  echo "- Engines (each): \`spillway mock-engine $(mock_engine_flags)\`; requests: streaming chat completions, prompt $PROMPT_BYTES bytes of messages (≈ $((PROMPT_BYTES / 4)) tokens by the mock's estimate), max_tokens $MAX_TOKENS."
  if [[ $SPILLWAY_HC == yes ]]; then
    echo "- Spillway's [health_check]: in the configuration (this binary accepts it)."
  else
    echo "- Spillway's [health_check]: **not in the configuration**: this binary refuses the table (\`spillway check-config\`: $HC_REFUSAL), so Spillway ran without it; the other keys are the same."
  fi
} >"$T/header.md"

spillway_config round-robin "$SPILLWAY_HC" >"$T/spillway.toml"
"$PY" "$HERE/report.py" report --summary "$SUMMARY" --header "$T/header.md" \
  --spillway-config "$T/spillway.toml" --haproxy-config "$T/haproxy.cfg" \
  --out-md "$RESULTS_DIR/$RESULT_NAME.md" --out-png "$RESULTS_DIR/$RESULT_NAME.png" \
  --out-json "$RESULTS_DIR/$RESULT_NAME-summary.json"
if [[ -n ${KEEP_RAW:-} ]]; then
  rm -rf "$WORK_DIR/faults-raw" && cp -r "$T" "$WORK_DIR/faults-raw"
  log "raw data kept in $WORK_DIR/faults-raw"
fi
log "done in ${ELAPSED}s: $RESULTS_DIR/$RESULT_NAME.md"

# Shared helpers for the load benchmarks (sourced by bench/*/run.sh; bash only).
#
# Every script: installs what it lacks, works on loopback, keeps each step under a
# `timeout`, arms a watchdog for the whole run, and on exit (normal, error, Ctrl-C or
# watchdog) stops every process it started and deletes its temp directory.

set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
WORK_DIR="$BENCH_DIR/work"          # git-ignored: the Python venv and nothing else
RESULTS_DIR="$BENCH_DIR/results"
# The benches' Python package (bench/lib/spillbench): `"$PY" -m spillbench ...`,
# `"$PY" -m spillbench.loadgen ...`. Their own scripts find it by their path.
export PYTHONPATH="$BENCH_DIR/lib${PYTHONPATH:+:$PYTHONPATH}"
# SPILLWAY_BIN: use that binary as is (no build), e.g. one built in another checkout.
SPILLWAY="${SPILLWAY_BIN:-$REPO_DIR/target/release/spillway}"
# bench/proxy's io_uring floor (bench/forward); FORWARDER_BIN: that binary as is.
FORWARDER="${FORWARDER_BIN:-$REPO_DIR/target/release/spillway-bench-forward}"
mkdir -p "$WORK_DIR" "$RESULTS_DIR"

BENCH_PIDS=()
BENCH_TMP=""
WATCHDOG_PID=""

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Stops every process started with `spawn` (TERM, then KILL after 3 s) and removes the
# temp dir. Runs once, on EXIT.
bench_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -n "$WATCHDOG_PID" ]] && kill "$WATCHDOG_PID" 2>/dev/null || true
  local pid
  for pid in "${BENCH_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  local deadline=$((SECONDS + 3))
  for pid in "${BENCH_PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  [[ -n "$BENCH_TMP" && -d "$BENCH_TMP" ]] && rm -rf "$BENCH_TMP"
  exit "$rc"
}

# bench_init NAME: temp dir and traps. Call first.
bench_init() {
  BENCH_TMP="$(mktemp -d "/tmp/spillway-bench-$1.XXXXXX")"
  trap bench_cleanup EXIT
  trap 'log "interrupted"; exit 130' INT TERM
}

# watchdog SECONDS: ends the run (through the EXIT trap) when it lasts longer. Armed after
# the tool installs, which can take minutes once. It kills its own sleep when stopped, so
# nothing outlives the run.
watchdog() {
  local max=$1
  (
    sleep "$max" &
    sp=$!
    trap 'kill $sp 2>/dev/null; exit 0' TERM
    wait "$sp" && { log "watchdog: ran past ${max}s, stopping"; kill -TERM $$; }
  ) &
  WATCHDOG_PID=$!
}

# Priority of everything a benchmark starts (servers and clients alike): other people's
# builds share these CPUs, and a higher weight keeps their time slices out of our tails.
BENCH_NICE=${BENCH_NICE:--10}

# run_pinned CPU CMD...: runs CMD pinned to CPU and waits for it, but as a background job, so an
# INT/TERM (or the watchdog) is handled at once and the cleanup stops CMD too. Returns
# CMD's status.
run_pinned() {
  local cpu=$1; shift
  nice -n "$BENCH_NICE" taskset -c "$cpu" "$@" &
  local pid=$! rc=0
  BENCH_PIDS+=("$pid")
  wait "$pid" || rc=$?
  local keep=() p
  for p in "${BENCH_PIDS[@]}"; do [[ "$p" != "$pid" ]] && keep+=("$p"); done
  BENCH_PIDS=("${keep[@]}")
  return "$rc"
}

# spawn CPU LOGNAME CMD...: runs CMD pinned to CPU in the background, remembers its pid.
# A plain command line (nice execs taskset execs CMD), so $! is CMD's own pid: the one to
# signal and to read CPU times from.
SPAWNED=""
spawn() {
  local cpu=$1 logname=$2; shift 2
  nice -n "$BENCH_NICE" taskset -c "$cpu" "$@" >"$BENCH_TMP/$logname.log" 2>&1 &
  SPAWNED=$!
  BENCH_PIDS+=("$SPAWNED")
}

# stop_pid PID: TERM, wait up to 3 s, KILL; forgets it.
stop_pid() {
  local pid=$1 deadline=$((SECONDS + 3))
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local keep=() p
  for p in "${BENCH_PIDS[@]}"; do [[ "$p" != "$pid" ]] && keep+=("$p"); done
  BENCH_PIDS=("${keep[@]}")
}

# listening PORT: whether a TCP socket listens on 127.0.0.1:PORT (asks the kernel, so no
# probe connection: a connect to a free port in the ephemeral range can connect to itself).
listening() {
  [[ -n $(ss -Hltn "sport = :$1" 2>/dev/null) ]]
}

# wait_port PORT [PID]: until something listens on 127.0.0.1:PORT (10 s at most); with PID,
# fails as soon as that process has exited (say, it could not bind).
wait_port() {
  local port=$1 pid=${2:-} deadline=$((SECONDS + 10))
  while ((SECONDS < deadline)); do
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      die "process $pid exited before listening on port $port"
    fi
    listening "$port" && return 0
    sleep 0.05
  done
  die "nothing listens on 127.0.0.1:$port after 10 s"
}

# port_unused PORT: fails when something already listens there (a leftover listener would
# share an SO_REUSEPORT port silently).
port_unused() {
  # A process just stopped may take a moment to let its listener go: wait up to 3 s.
  local deadline=$((SECONDS + 3))
  while listening "$1" && ((SECONDS < deadline)); do sleep 0.05; done
  if listening "$1"; then
    die "port $1 is already in use: $(ss -Hltnp "sport = :$1" 2>/dev/null | head -3)"
  fi
}

# free_ports N: N distinct unused loopback TCP ports (the kernel's picks, all held at once).
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# need CMD DEBIAN_PACKAGE: apt-get install the package when CMD is missing.
need() {
  local cmd=$1 pkg=$2
  command -v "$cmd" >/dev/null 2>&1 && return 0
  log "installing $pkg (apt-get)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null \
      || die "cannot install $pkg"
  fi
}

# ensure_oha: oha from crates.io (the constant-rate client when wrk2 is absent; ~5 min).
ensure_oha() {
  export PATH="$HOME/.cargo/bin:$PATH"
  command -v oha >/dev/null 2>&1 && return 0
  log "installing oha (cargo install oha --locked, takes minutes)"
  timeout 1200 cargo install oha --locked >"$BENCH_TMP/oha-install.log" 2>&1 \
    || { tail -20 "$BENCH_TMP/oha-install.log" >&2; die "cargo install oha failed"; }
}

# ensure_venv: bench/work/venv with matplotlib; sets PY to its python.
ensure_venv() {
  local venv="$WORK_DIR/venv"
  if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "creating $venv with matplotlib (pip)"
    python3 -m venv "$venv" || { need python3 python3-venv; python3 -m venv "$venv"; }
    "$venv/bin/pip" install -q --disable-pip-version-check matplotlib \
      || die "pip install matplotlib failed"
  fi
  PY="$venv/bin/python"
}

# ensure_spillway: the release binary, built when missing or older than the sources
# (SPILLWAY_BIN set: that binary, never built).
ensure_spillway() {
  if [[ -n ${SPILLWAY_BIN:-} ]]; then
    [[ -x $SPILLWAY ]] || die "SPILLWAY_BIN=$SPILLWAY is not an executable"
    return 0
  fi
  if [[ ! -x "$SPILLWAY" ]] || [[ -n "$(find "$REPO_DIR/src" "$REPO_DIR/Cargo.toml" \
      -newer "$SPILLWAY" -print -quit)" ]]; then
    log "building spillway (cargo build --release)"
    (cd "$REPO_DIR" && cargo build --release --quiet) || die "cargo build failed"
  fi
}

# ensure_forwarder: bench/forward's release binary, built when missing or older than its
# sources (FORWARDER_BIN set: that binary, never built).
ensure_forwarder() {
  if [[ -n ${FORWARDER_BIN:-} ]]; then
    [[ -x $FORWARDER ]] || die "FORWARDER_BIN=$FORWARDER is not an executable"
    return 0
  fi
  if [[ ! -x "$FORWARDER" ]] || [[ -n "$(find "$REPO_DIR/bench/forward" "$REPO_DIR/Cargo.lock" \
      -newer "$FORWARDER" -print -quit)" ]]; then
    log "building the forwarder (cargo build --release -p spillway-bench-forward)"
    (cd "$REPO_DIR" && cargo build --release --quiet -p spillway-bench-forward) \
      || die "cargo build of bench/forward failed"
  fi
}

# origin_conf DIR PORT [AFFINITY]: an nginx config (printed) for the proxy benchmarks'
# origin, a fast fixed JSON answer to POST /v1/chat/completions on 127.0.0.1:PORT; its pid,
# logs and temp files go to DIR (created). AFFINITY is nginx's worker_cpu_affinity mask
# (none: unpinned).
origin_conf() {
  local dir=$1 port=$2 affinity=${3:-}
  mkdir -p "$dir"
  cat <<EOF
# The origin: a fast fixed answer to POST /v1/chat/completions.
worker_processes 1;
${affinity:+worker_cpu_affinity $affinity;}
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir;
  uwsgi_temp_path $dir; scgi_temp_path $dir;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  server {
    listen 127.0.0.1:$port backlog=4096;
    location = /v1/chat/completions {
      default_type application/json;
      return 200 '{"id":"chatcmpl-bench","object":"chat.completion","model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}';
    }
  }
}
EOF
}

# The proxies under test as keep-alive reverse proxies to the origin on 127.0.0.1:ORIGIN, one
# core each on CPU (bench/proxy, bench/tls). Each prints its configuration.

# spillway_proxy_toml CPU PORT ADMIN_PORT ORIGIN [EXTRA [MODEL_EXTRA [WORKER_EXTRA]]]: EXTRA
# is appended (a [tls] table); MODEL_EXTRA and WORKER_EXTRA are lines of the model's and
# the worker's tables (thresholds, admission).
spillway_proxy_toml() {
  local cpu=$1 port=$2 admin=$3 origin=$4 extra=${5:-} model_extra=${6:-} worker_extra=${7:-}
  cat <<EOF
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
cores = 1
cpus = [$cpu]
monitor_cpu = $cpu

[[models]]
name = "bench-model"
$model_extra

[[models.workers]]
url = "http://127.0.0.1:$origin"
name = "origin"
$worker_extra
EOF
  [[ -z $extra ]] || printf '\n%s\n' "$extra"
}

# nginx_proxy_conf DIR CPU ORIGIN LISTEN [EXTRA]: one worker on CPU; pid, logs and temp
# files in DIR (created). LISTEN: the listen directive's address and flags
# ("127.0.0.1:PORT", "127.0.0.1:PORT ssl"); EXTRA: more lines for the http block (a TLS
# certificate, a status server).
nginx_proxy_conf() {
  local dir=$1 cpu=$2 origin=$3 listen=$4 extra=${5:-} mask
  mask="1$(printf '%*s' "$cpu" '' | tr ' ' 0)"
  ((${#mask} > 1)) || mask="0$mask"
  mkdir -p "$dir"
  cat <<EOF
# nginx as the equivalent keep-alive reverse proxy: one worker on CPU $cpu.
worker_processes 1;
worker_cpu_affinity $mask;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir;
  uwsgi_temp_path $dir; scgi_temp_path $dir;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  upstream origin {
    server 127.0.0.1:$origin;
    keepalive 128;
    keepalive_requests 100000000;
  }
  server {
    listen $listen backlog=4096;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
EOF
  [[ -z $extra ]] || printf '%s\n' "$extra"
  echo "}"
}

# haproxy_proxy_cfg CPU ORIGIN BIND [GLOBAL]: one thread on CPU. BIND: the bind line's
# arguments ("127.0.0.1:PORT", or with "ssl crt FILE ..."); GLOBAL: more global lines.
haproxy_proxy_cfg() {
  local cpu=$1 origin=$2 bind=$3 global=${4:-}
  cat <<EOF
# HAProxy as the equivalent keep-alive reverse proxy: one thread on CPU $cpu.
global
    nbthread 1
    cpu-map 1/1 $cpu
    maxconn 8000
EOF
  [[ -z $global ]] || printf '%s\n' "$global"
  cat <<EOF
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    option http-keep-alive
    http-reuse always
frontend fe
    bind $bind
    default_backend be
backend be
    server origin 127.0.0.1:$origin
EOF
}

# start_origin_and_proxies: checks $T/spillway.toml, $T/haproxy.cfg and $T/nginx.conf,
# starts the nginx origin ($T/origin.conf, on LOAD_CPU) and the three proxies (on
# PROXY_CPU), and waits for their ports (P_ORIGIN, P_SPILLWAY, P_NGINX, P_HAPROXY). Sets
# PID_SPILLWAY, PID_NGINX and PID_HAPROXY.
start_origin_and_proxies() {
  "$SPILLWAY" check-config "$T/spillway.toml" >/dev/null 2>&1 || die "spillway config invalid"
  haproxy -c -q -f "$T/haproxy.cfg" || die "haproxy config invalid"
  nginx -t -q -c "$T/nginx.conf" -p "$T/nginx" 2>/dev/null || die "nginx config invalid"
  spawn $LOAD_CPU origin nginx -c "$T/origin.conf" -p "$T/origin"
  wait_port "$P_ORIGIN" "$SPAWNED"
  RUST_LOG=warn spawn $PROXY_CPU spillway "$SPILLWAY" --config "$T/spillway.toml"
  PID_SPILLWAY=$SPAWNED
  spawn $PROXY_CPU nginx nginx -c "$T/nginx.conf" -p "$T/nginx"
  PID_NGINX=$SPAWNED
  spawn $PROXY_CPU haproxy haproxy -db -f "$T/haproxy.cfg"
  PID_HAPROXY=$SPAWNED
  wait_port "$P_SPILLWAY" "$PID_SPILLWAY"
  wait_port "$P_NGINX" "$PID_NGINX"
  wait_port "$P_HAPROXY" "$PID_HAPROXY"
}

# with_children PID: PID and its direct children (nginx's master and its worker).
with_children() {
  echo "$1 $(pgrep -P "$1" | tr '\n' ' ')"
}

# find_wrk2: sets WRK2 to wrk2 on PATH, else /opt/wrk2bin/wrk2, else empty (see
# bench/README.md for building it).
find_wrk2() {
  WRK2=$(command -v wrk2 || true)
  if [[ -z $WRK2 && -x /opt/wrk2bin/wrk2 ]]; then WRK2=/opt/wrk2bin/wrk2; fi
}

# cpu_busy_ticks CPU: clock ticks that CPU has spent not idle since boot (/proc/stat).
cpu_busy_ticks() {
  awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

# cpu_ticks PID...: utime+stime of the processes (all their threads), in clock ticks.
cpu_ticks() {
  local total=0 pid f
  for pid in "$@"; do
    # After the ")" that ends comm: state is field 3 of stat, utime 14, stime 15.
    read -r -a f <<<"$(sed 's/^.*) //' "/proc/$pid/stat")"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

# children_ticks: utime+stime of this script's waited-for children so far (cutime+cstime of
# $$), in clock ticks: around one run_pinned, the load generator's own CPU time.
children_ticks() {
  local f
  read -r -a f <<<"$(sed 's/^.*) //' "/proc/$$/stat")"
  echo $((f[13] + f[14]))
}

# machine_header: Markdown lines describing the machine and the moment.
machine_header() {
  local model cores kernel
  model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
  cores=$(nproc)
  kernel=$(uname -r)
  echo "- Machine: $model, $cores CPUs ($(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -1 | sed 's/^./VM: &/')), $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $kernel, $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "- Load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (the 2 CPUs are shared with other engineers' builds and tests; see Caveats)"
  echo "- Date: $(date -u +%Y-%m-%dT%H:%MZ); Spillway $(git -C "$REPO_DIR" describe --always --dirty 2>/dev/null) ($("$SPILLWAY" --version))"
}

# The simulated engines of bench/overload, bench/prefix and bench/fleet/replicas.sh, from the
# calling script's knobs: MODEL KV_BLOCKS BLOCK_SIZE MAX_NUM_SEQS MAX_NUM_BATCHED_TOKENS
# PREFILL_TPS STEP_MS STEP_PER_SEQ_MS MAX_TOKENS.

# mock_engine_flags: the engine's time-model flags (also what the result header shows).
mock_engine_flags() {
  echo "--kv-blocks $KV_BLOCKS --block-size $BLOCK_SIZE --max-num-seqs $MAX_NUM_SEQS --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS --prefill-tokens-per-s $PREFILL_TPS --decode-step-ms $STEP_MS --decode-step-per-seq-ms $STEP_PER_SEQ_MS"
}

# spawn_mock_engine CPU LOGNAME PORT [ARGS...]: `spillway mock-engine` serving MODEL on
# 127.0.0.1:PORT with those flags and ARGS, through spawn (sets SPAWNED).
spawn_mock_engine() {
  local cpu=$1 logname=$2 port=$3 flags
  shift 3
  read -r -a flags <<<"$(mock_engine_flags)"
  spawn "$cpu" "$logname" "$SPILLWAY" mock-engine --listen "127.0.0.1:$port" --model "$MODEL" \
    "${flags[@]}" --default-max-tokens "$MAX_TOKENS" "$@"
}

# dynamo_env: the environment both Dynamo benches run its frontend and mocker in (no etcd, no
# NATS, loopback only, no Hugging Face downloads); sets PLANES, their plane flags.
dynamo_env() {
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DYN_TCP_RPC_HOST=127.0.0.1 \
    DYN_EVENT_PLANE_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_LOG=warn
  PLANES=(--discovery-backend file --request-plane tcp --event-plane zmq)
}

# dynamo_header LOAD_START: a Dynamo run's header lines: machine_header with the load
# average at the start (LOAD_START) and now, then the date and Dynamo's versions ($DPY).
dynamo_header() {
  machine_header 2>/dev/null | grep -v '^- Date' \
    | sed "s|^- Load average at start: [0-9. ]*|- Load average at start: $1, at the end: $(cut -d' ' -f1-3 /proc/loadavg) |"
  echo "- Date: $(date -u +%Y-%m-%dT%H:%MZ); Dynamo: ai-dynamo $("$DPY" -c 'import importlib.metadata as m; print(m.version("ai-dynamo"))'), ai-dynamo-runtime $("$DPY" -c 'import importlib.metadata as m; print(m.version("ai-dynamo-runtime"))') (PyPI), Python $("$DPY" -c 'import platform; print(platform.python_version())'), tokenizers $("$DPY" -c 'import tokenizers; print(tokenizers.__version__)')"
}

# dynamo_env_line: the header line that says what dynamo_env set.
dynamo_env_line() {
  echo "- Environment of both: HF_HUB_OFFLINE=1, DYN_FILE_KV=<fresh folder per run>, DYN_TCP_RPC_HOST, DYN_EVENT_PLANE_HOST and DYN_TCP_RESPONSE_STREAM_HOST = 127.0.0.1, DYN_LOG=warn; no etcd, no NATS."
}

# ensure_dynamo: NVIDIA Dynamo's frontend and mocker (ai-dynamo and ai-dynamo-runtime
# $DYNAMO_VERSION) in the venv $DYN_VENV; sets DPY to its python. When they are missing and
# cannot be installed (no package index, pip fails), says why and exits 0: the peer is
# skipped, not failed (bench/overload/dynamo.sh, bench/prefix/dynamo.sh).
ensure_dynamo() {
  DPY="$DYN_VENV/bin/python"
  local probe='import importlib.metadata as m, dynamo.frontend, dynamo.mocker, tokenizers
assert m.version("ai-dynamo") == m.version("ai-dynamo-runtime") == "'"$DYNAMO_VERSION"'"'
  if "$DPY" -c "$probe" 2>/dev/null; then return 0; fi
  local index=${PIP_INDEX_URL:-https://pypi.org/simple}
  if ! python3 -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1].rstrip("/") + "/ai-dynamo/", timeout=15)' "$index" 2>/dev/null; then
    log "skipped: the package index ($index) cannot be reached, and Dynamo is not installed in $DYN_VENV"
    exit 0
  fi
  log "installing NVIDIA Dynamo $DYNAMO_VERSION into $DYN_VENV (pip, a minute or two once)"
  [[ -x $DPY ]] || python3 -m venv "$DYN_VENV" || { need python3 python3-venv; python3 -m venv "$DYN_VENV"; }
  # --no-deps: ai-dynamo depends on `aisimulate`, which downloads from an index that cannot be
  # reached; the frontend and the mocker never import it. These are the ones they do import.
  # (pip's resolver then reports an ERROR about the missing aisimulate: expected, harmless.)
  if ! { nice -n 10 "$DYN_VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
      "ai-dynamo==$DYNAMO_VERSION" "ai-dynamo-runtime==$DYNAMO_VERSION" \
    && nice -n 10 "$DYN_VENV/bin/pip" install -q --disable-pip-version-check aiohttp certifi \
      'kubernetes<33' msgspec prometheus-client pyzmq redis tqdm transformers tokenizers \
      zstandard 'pydantic<=2.13.5' uvloop; }; then
    log "skipped: pip install of Dynamo $DYNAMO_VERSION failed (see above)"
    exit 0
  fi
  "$DPY" -c "$probe" || { log "skipped: Dynamo $DYNAMO_VERSION installed but does not import"; exit 0; }
}

# Shared by instructions.sh and cachesim.sh (sourced after bench/lib/common.sh and
# bench_init): an nginx origin, one Spillway config in front of it, and one run of a
# Spillway binary under callgrind.

# callgrind_origin: starts the origin and writes "$T/spillway.toml"; sets P_PROXY.
# The monitor's tick is slowed down so that its work does not depend on how long a run
# lasts.
callgrind_origin() {
  local p_origin p_admin
  read -r p_origin P_PROXY p_admin <<<"$(free_ports 3)"
  origin_conf "$T/origin" "$p_origin" >"$T/origin.conf"
  cat >"$T/spillway.toml" <<C
listen = "127.0.0.1:$P_PROXY"
admin_listen = "127.0.0.1:$p_admin"
cores = 1
pin_cores = false
monitor_interval_ms = 1000000

[[models]]
name = "bench-model"

[[models.workers]]
url = "http://127.0.0.1:$p_origin"
name = "origin"
C
  spawn 1 origin nginx -c "$T/origin.conf" -p "$T/origin"
  wait_port "$p_origin" "$SPAWNED"
}

# callgrind_serve OUT BINARY WARMUP REQUESTS [VALGRIND_FLAGS...]: BINARY under callgrind
# (epoll driver) serves WARMUP, then REQUESTS sequential keep-alive POSTs (two
# connections); its profile goes to OUT.
callgrind_serve() {
  local out=$1 bin=$2 warmup=$3 requests=$4
  shift 4
  MONOIO_FORCE_LEGACY_DRIVER=1 RUST_LOG=error spawn 0 callgrind \
    valgrind --tool=callgrind "$@" --callgrind-out-file="$out" "$bin" --config "$T/spillway.toml"
  local pid=$SPAWNED
  wait_port "$P_PROXY" "$pid"
  if ((warmup > 0)); then
    timeout 120 python3 "$HERE/client.py" 127.0.0.1 "$P_PROXY" "$warmup"
  fi
  timeout 300 python3 "$HERE/client.py" 127.0.0.1 "$P_PROXY" "$requests"
  kill -INT "$pid"
  sleep 1
  kill -INT "$pid" 2>/dev/null || true
  stop_pid "$pid"
}

#!/usr/bin/env bash
# Access log cost: Spillway's CPU per request at a constant rate with its access log off
# and on (JSON lines to a file), beside nginx with its access log off and on (the default
# `combined` format, unbuffered, to a file), in one run, interleaved.
#
#   bench/proxy/access_log.sh     # ~2.5 min; appends its table to bench/results/proxy.md
#
# Placement as in run.sh: the proxies on CPU 0, the origin (nginx) and wrk2 on CPU 1.
# Per round and target: RATE req/s for DURATION s (wrk2 -R, CONNS connections); the
# proxy's utime+stime over the run (/proc/PID/stat, all threads and processes) divided by
# the requests answered. The table gives the median over ROUNDS rounds.
#
# Knobs: ROUNDS=5 DURATION=8 RATE=5000 CONNS=64 MAX_SECONDS=400 BENCH_NICE=-10.

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-8}
RATE=${RATE:-5000}
CONNS=${CONNS:-64}
MAX_SECONDS=${MAX_SECONDS:-400}
PROXY_CPU=0
LOAD_CPU=1
HERE="$BENCH_DIR/proxy"
TARGETS="spillway spillway-log nginx nginx-log"
WRK2=${WRK2:-$(command -v wrk2 || echo /opt/wrk2bin/wrk2)}

bench_init access-log
START=$SECONDS
need nginx nginx-light
need taskset util-linux
[[ -x $WRK2 ]] || die "wrk2 not found (WRK2=path)"
ensure_spillway
watchdog "$MAX_SECONDS"

T=$BENCH_TMP
read -r P_ORIGIN P_S P_SA P_SL P_SLA P_N P_NL <<<"$(free_ports 7)"
origin_conf "$T/origin" "$P_ORIGIN" 10 >"$T/origin.conf"

spillway_conf() { # PORT ADMIN_PORT [access log table]
  cat <<EOF
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$2"
cores = 1
cpus = [$PROXY_CPU]
monitor_cpu = $PROXY_CPU
$3

[[models]]
name = "bench-model"

[[models.workers]]
url = "http://127.0.0.1:$P_ORIGIN"
name = "origin"
EOF
}
spillway_conf "$P_S" "$P_SA" "" >"$T/spillway.toml"
spillway_conf "$P_SL" "$P_SLA" "[access_log]
path = \"$T/spillway-access.log\"" >"$T/spillway-log.toml"

nginx_conf() { # NAME PORT ACCESS_LOG_LINE
  mkdir -p "$T/$1"
  cat <<EOF
worker_processes 1;
worker_cpu_affinity 01;
daemon off;
pid $T/$1/nginx.pid;
error_log $T/$1/error.log warn;
events { worker_connections 8192; }
http {
  $3
  client_body_temp_path $T/$1; proxy_temp_path $T/$1; fastcgi_temp_path $T/$1;
  uwsgi_temp_path $T/$1; scgi_temp_path $T/$1;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  upstream origin { server 127.0.0.1:$P_ORIGIN; keepalive 128; keepalive_requests 100000000; }
  server {
    listen 127.0.0.1:$2 backlog=4096;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
}
nginx_conf nginx "$P_N" "access_log off;" >"$T/nginx.conf"
nginx_conf nginx-log "$P_NL" "access_log $T/nginx-access.log combined;" >"$T/nginx-log.conf"

spawn $LOAD_CPU origin nginx -c "$T/origin.conf" -p "$T/origin"
wait_port "$P_ORIGIN" "$SPAWNED"
RUST_LOG=warn spawn $PROXY_CPU spillway "$SPILLWAY" --config "$T/spillway.toml"; PID_S=$SPAWNED
RUST_LOG=warn spawn $PROXY_CPU spillway-log "$SPILLWAY" --config "$T/spillway-log.toml"; PID_SL=$SPAWNED
spawn $PROXY_CPU nginx nginx -c "$T/nginx.conf" -p "$T/nginx"; PID_N=$SPAWNED
spawn $PROXY_CPU nginx-log nginx -c "$T/nginx-log.conf" -p "$T/nginx-log"; PID_NL=$SPAWNED
for p in "$P_S:$PID_S" "$P_SL:$PID_SL" "$P_N:$PID_N" "$P_NL:$PID_NL"; do wait_port "${p%%:*}" "${p##*:}"; done

port_of() { case $1 in spillway) echo "$P_S";; spillway-log) echo "$P_SL";; nginx) echo "$P_N";; nginx-log) echo "$P_NL";; esac; }
pids_of() {
  case $1 in
    spillway) echo "$PID_S" ;; spillway-log) echo "$PID_SL" ;;
    nginx) echo "$PID_N $(pgrep -P "$PID_N" | tr '\n' ' ')" ;;
    nginx-log) echo "$PID_NL $(pgrep -P "$PID_NL" | tr '\n' ' ')" ;;
  esac
}

RAW="$T/raw.tsv"
CLK_TCK=$(getconf CLK_TCK)
for tgt in $TARGETS; do # warm-up
  run_pinned $LOAD_CPU timeout 10 "$WRK2" -t1 -c"$CONNS" -d2s -R"$RATE" -s "$HERE/post.lua" \
    "http://127.0.0.1:$(port_of "$tgt")/v1/chat/completions" >/dev/null 2>&1 || true
done
for round in $(seq 1 "$ROUNDS"); do
  for tgt in $TARGETS; do
    log "round $round/$ROUNDS: $tgt"
    read -r -a pids <<<"$(pids_of "$tgt")"
    out="$T/r$round-$tgt.out"
    t0=$(cpu_ticks "${pids[@]}")
    run_pinned $LOAD_CPU timeout $((DURATION + 20)) "$WRK2" -t1 -c"$CONNS" -d"${DURATION}s" \
      -R"$RATE" -s "$HERE/post.lua" "http://127.0.0.1:$(port_of "$tgt")/v1/chat/completions" \
      >"$out" 2>&1 || log "$tgt: wrk2 exited $?"
    t1=$(cpu_ticks "${pids[@]}")
    reqs=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$out")
    non2xx=$(sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$out")
    printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$tgt" "$((t1 - t0))" "${reqs:-0}" "${non2xx:-0}" >>"$RAW"
  done
done
SL_LINES=$(wc -l <"$T/spillway-access.log" 2>/dev/null || echo 0)
NL_LINES=$(wc -l <"$T/nginx-access.log" 2>/dev/null || echo 0)
DROPPED=$(curl -s -m 5 "http://127.0.0.1:$P_SLA/metrics" | sed -n 's/^spillway_access_log_dropped_total \(.*\)/\1/p')

python3 - "$RAW" "$CLK_TCK" "$ROUNDS" "$DURATION" "$RATE" "$CONNS" "$SL_LINES" "$NL_LINES" "${DROPPED:-?}" \
  "$(machine_header)" "$((SECONDS - START))" >"$T/table.md" <<'PY'
import sys, statistics
raw, tck, rounds, dur, rate, conns, sl, nl, dropped, header, elapsed = sys.argv[1:]
tck = int(tck)
rows = {}
for line in open(raw):
    r, tgt, ticks, reqs, bad = line.split("\t")
    if int(reqs) > 0:
        rows.setdefault(tgt, []).append((int(ticks) * 1e6 / tck / int(reqs), int(bad)))
med = {t: statistics.median(v for v, _ in rows[t]) for t in rows}
print("## Access log cost (`bench/proxy/access_log.sh`)\n")
print(f"Generated by `bench/proxy/access_log.sh` (ROUNDS={rounds} DURATION={dur}s RATE={rate} CONNS={conns}); run time {elapsed}s.\n")
print(header + "\n")
print("Proxy CPU µs per request at a constant rate (wrk2 -R), median over rounds; targets interleaved in each round. "
      "Spillway's log: JSON lines to a file (`[access_log] path = ...`); nginx's: `access_log FILE combined` (unbuffered, one write(2) a request).\n")
print("| target | CPU µs/req (median) | per round | non-2xx | vs Spillway log off | vs nginx log on |")
print("|---|---|---|---|---|---|")
for t in ["spillway", "spillway-log", "nginx", "nginx-log"]:
    if t not in med: continue
    per = ", ".join(f"{v:.1f}" for v, _ in rows[t])
    bad = sum(b for _, b in rows[t])
    print(f"| {t} | {med[t]:.1f} | {per} | {bad} | {med[t]/med['spillway']:.2f} | {med[t]/med['nginx-log']:.2f} |")
print()
ok1 = med["spillway-log"] <= 1.1 * med["spillway"]
ok2 = med["spillway-log"] <= med["nginx-log"]
print(f"- Log on / log off (Spillway): **{med['spillway-log']/med['spillway']:.2f}×** (acceptance ≤ 1.10: {'met' if ok1 else 'NOT met'}).")
print(f"- Spillway log on / nginx log on: **{med['spillway-log']/med['nginx-log']:.2f}×** (acceptance ≤ 1.00: {'met' if ok2 else 'NOT met'}).")
print(f"- Lines written: Spillway {sl}, nginx {nl}; `spillway_access_log_dropped_total` = {dropped}.")
print(f"- Resolution: one clock tick is {1e6/tck:.0f} µs of CPU; a run of {int(rate)*int(dur)} requests at ~25 µs each is ~{int(rate)*int(dur)*25e-6*tck:.0f} ticks, so ±1 tick ≈ ±{100/(int(rate)*int(dur)*25e-6*tck):.1f} %.")
PY
cat "$T/table.md"
{
  echo
  cat "$T/table.md"
} >>"$RESULTS_DIR/proxy.md"
log "done in $((SECONDS - START))s: appended to $RESULTS_DIR/proxy.md"

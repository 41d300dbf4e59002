#!/usr/bin/env bash
# Runs `fleet_scale` with the contention of other processes on the VM taken out: once its
# monitor thread exists, the bench process (every thread, and the threads it starts later,
# which inherit the policy) and its children (etcd, nats-server) get SCHED_FIFO priority 5.
# Needs root (or CAP_SYS_NICE). The kernel's RT throttling (sched_rt_runtime_us) still
# leaves 5 % to everyone else. Environment as for the bench (SPILLWAY_BENCH_*).
# Usage: bench/fleet/fifo.sh   (from the repository root, after `cargo bench --bench
# fleet_scale --no-run`)
# A watchdog ends the run (bench, etcd, nats-server) if it has not finished 120 s after its
# SPILLWAY_BENCH_SECS: at FIFO priority, threads that spin (Go's scheduler in etcd and
# nats-server does) are never preempted by the bench's equal-priority threads, and once,
# on 2026-12-01, etcd and nats-server spun on both vCPUs for minutes while the bench got
# no CPU.
set -euo pipefail
bin=
for f in target/release/deps/fleet_scale-*; do
    [[ $f == *.d ]] && continue
    [[ -z $bin || $f -nt $bin ]] && bin=$f
done
"$bin" --bench &
bench=$!
for _ in $(seq 1 600); do
    grep -qs spillway-monito /proc/"$bench"/task/*/comm && break
    sleep 0.1
done
for pid in "$bench" $(pgrep -P "$bench"); do
    chrt -f -a -p 5 "$pid" >/dev/null
done
limit=$(( ${SPILLWAY_BENCH_SECS:-20} + 120 ))
(
    sleep "$limit"
    if kill -0 "$bench" 2>/dev/null; then
        echo "fifo.sh: no result after ${limit}s (FIFO livelock?); stopping the run" >&2
        pkill -9 -P "$bench" || true
        kill -9 "$bench" || true
    fi
) &
watchdog=$!
status=0
wait "$bench" || status=$?
pkill -P "$watchdog" 2>/dev/null || true
kill "$watchdog" 2>/dev/null || true
exit "$status"

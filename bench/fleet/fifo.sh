#!/usr/bin/env bash
# Runs `fleet_scale` with the contention of other processes on the VM taken out: once its
# monitor thread exists, the bench process (every thread, and the threads it starts later,
# which inherit the policy) and its children (etcd, nats-server) get SCHED_FIFO priority 5.
# Needs root (or CAP_SYS_NICE). The kernel's RT throttling (sched_rt_runtime_us) still
# leaves 5 % to everyone else. Environment as for the bench (SPILLWAY_BENCH_*).
# Usage: bench/fleet/fifo.sh   (from the repository root, after `cargo bench --bench
# fleet_scale --no-run`)
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
wait "$bench"

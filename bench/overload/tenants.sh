#!/usr/bin/env bash
# Fair tenants in the waiting room (issue 31): bench/overload/run.sh's room setup with two
# tenants, one offering TENANT_RATIO times the other's rate, LOAD × C in all; with the room
# serving tenants in turn (`tenant_header`, `tenant_room_share`), then without (first come,
# first served, beside HAProxy), then the light tenant alone at its rate in the mix.
#
#   bench/overload/tenants.sh     # ~5 min; writes bench/results/overload-tenants.md (+ .png,
#                                 # -summary.json), overload-tenants-fifo.* and
#                                 # overload-tenants-light-alone.*
#
# The tenant rides in the load generator's class header (CLASS_MIX, CLASS_HEADER=x-tenant),
# so the reports' per-class figures are per tenant; every request is of the model's default
# class. Knobs: LOAD (default 2), TENANT_RATIO (default 10), TENANT_SHARE (default 0.5),
# plus run.sh's own.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RESULTS="$HERE/../results"

LOAD=${LOAD:-2}
TENANT_RATIO=${TENANT_RATIO:-10}
TENANT_SHARE=${TENANT_SHARE:-0.5}
MIX="heavy:$TENANT_RATIO,light:1"
TENANTS_TOML=$'tenant_header = "x-tenant"\n'"tenant_room_share = $TENANT_SHARE"

SETUPS=room CLASS_MIX="$MIX" CLASS_HEADER=x-tenant RESULT_NAME=overload-tenants LOADS="$LOAD" \
  SHED_EXTRA_TOP="$TENANTS_TOML" "$HERE/run.sh"
SETUPS="room haproxy" CLASS_MIX="$MIX" CLASS_HEADER=x-tenant RESULT_NAME=overload-tenants-fifo \
  LOADS="$LOAD" "$HERE/run.sh"
alone=$(awk -v l="$LOAD" -v r="$TENANT_RATIO" 'BEGIN { printf "%.3f", l / (r + 1) }')
SETUPS=room CLASS_MIX=light:1 CLASS_HEADER=x-tenant RESULT_NAME=overload-tenants-light-alone \
  LOADS="$alone" SHED_EXTRA_TOP="$TENANTS_TOML" "$HERE/run.sh"

python3 "$HERE/report.py" fairness \
  --fair "$RESULTS/overload-tenants-summary.json" \
  --fifo "$RESULTS/overload-tenants-fifo-summary.json" \
  --alone "$RESULTS/overload-tenants-light-alone-summary.json" \
  --out-md "$RESULTS/overload-tenants.md"

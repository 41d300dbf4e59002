#!/usr/bin/env bash
# Request classes under overload (issue 10): bench/overload/run.sh with a class mix, then
# critical traffic alone at the rate it has in the mix's top load, so critical's TTFT can be
# compared with the other classes present and absent.
#
#   bench/overload/classes.sh     # ~2.5 min; writes bench/results/overload-classes.md (+ .png,
#                                 # -summary.json) and overload-classes-critical-alone.*
#   SETUP=room bench/overload/classes.sh   # the same behind run.sh's room setup (adaptive
#                                 # mode + waiting room); writes overload-classes-room*
#
# Knobs: SETUP (one of run.sh's Spillway setups; default shed), CLASS_MIX (default
# critical:0.2,standard:0.3,sheddable:0.5), LOADS (default "0.5 1 3"), CLASSES_TOML (the
# [classes] tables; default below), plus run.sh's own.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RESULTS="$HERE/../results"

CLASS_MIX=${CLASS_MIX:-critical:0.2,standard:0.3,sheddable:0.5}
LOADS=${LOADS:-"0.5 1 3"}
# Critical sees the model's thresholds and may fill every slot; standard sees them at a
# quarter and fills a quarter of the slots; sheddable an eighth and a tenth.
CLASSES_TOML=${CLASSES_TOML:-$'[classes.standard]\nbusy_threshold_scale = 0.25\nslot_share = 0.25\n[classes.sheddable]\nbusy_threshold_scale = 0.125\nslot_share = 0.1'}

SETUP=${SETUP:-shed}
case "$SETUP" in
  shed) NAME=overload-classes ;;
  adaptive | room) NAME=overload-classes-$SETUP ;;
  *) echo "SETUP must be shed, adaptive or room, got $SETUP" >&2; exit 2 ;;
esac

SETUPS=$SETUP CLASS_MIX="$CLASS_MIX" RESULT_NAME=$NAME LOADS="$LOADS" \
  SHED_EXTRA_TOP="$CLASSES_TOML" "$HERE/run.sh"

# Critical alone, at its rate in the top load of the mix.
top=$(tr ' ' '\n' <<<"$LOADS" | sort -g | tail -1)
share=$(tr ',' '\n' <<<"$CLASS_MIX" | awk -F: '$1 == "critical" { w = $2 } { t += $2 } END { print w / t }')
alone=$(awk -v t="$top" -v s="$share" 'BEGIN { printf "%.3f", t * s }')
SETUPS=$SETUP CLASS_MIX=critical:1 RESULT_NAME=$NAME-critical-alone LOADS="$alone" \
  SHED_EXTRA_TOP="$CLASSES_TOML" "$HERE/run.sh"

python3 "$HERE/report.py" isolation \
  --mix "$RESULTS/$NAME-summary.json" \
  --alone "$RESULTS/$NAME-critical-alone-summary.json" \
  --out-md "$RESULTS/$NAME.md"

#!/usr/bin/env bash
# Regenerates, into a temp dir, every report table that raw data committed under
# bench/results/ stands behind, and compares each with the table in the committed report,
# line for line (run by hand; not part of CI):
#
#   bench/lib/check_reports.sh
#
# Exits 1 when a regenerated table is not in its committed report. A committed report may
# hold more tables than its report script writes (hand-written notes); those are not
# checked. Which reports have no raw data behind them: bench/README.md, "Regenerating the
# reports". Needs python3 and git; runs no benchmark.

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bench_init check-reports
T=$BENCH_TMP
R=$RESULTS_DIR
PY=python3 # the tables need only the standard library
FAILED=0
CHECKED=0

# check NAME.md REGENERATED: compares; counts a failure instead of stopping.
check() {
  CHECKED=$((CHECKED + 1))
  "$PY" -m spillbench compare "$R/$1" "$2" "$1" || FAILED=$((FAILED + 1))
}

# regenerate NAME.md CMD...: runs the report command (stdout: the tables), then check.
regenerate() {
  local name=$1; shift
  if "$@" >"$T/$name" 2>"$T/$name.err"; then
    check "$name" "$T/$name"
  else
    CHECKED=$((CHECKED + 1)) FAILED=$((FAILED + 1))
    log "$name: the report failed: $(tail -3 "$T/$name.err")"
  fi
}

# bench/overload/run.sh and its variants: the tables from each *-summary.json.
for json in "$R"/overload*-summary.json; do
  name=$(basename "$json" -summary.json)
  [[ $name == overload-dynamo* ]] && continue
  regenerate "$name.md" "$PY" "$BENCH_DIR/overload/report.py" tables --summary-json "$json"
done

# bench/overload/classes.sh's section on critical traffic alone, appended to overload-classes.md.
if "$PY" "$BENCH_DIR/overload/report.py" isolation --mix "$R/overload-classes-summary.json" \
    --alone "$R/overload-classes-critical-alone-summary.json" --out-md "$T/isolation.md"; then
  check overload-classes.md "$T/isolation.md"
else
  CHECKED=$((CHECKED + 1)) FAILED=$((FAILED + 1))
fi

# bench/overload/dynamo.sh: its side-by-side table read results/overload-summary.json as it
# was then, i.e. as committed with the last change to overload-dynamo.md.
at=$(git -C "$REPO_DIR" log -1 --format=%H -- bench/results/overload-dynamo.md)
git -C "$REPO_DIR" show "$at:bench/results/overload-summary.json" >"$T/overload-summary-then.json"
regenerate overload-dynamo.md "$PY" "$BENCH_DIR/overload/report.py" dynamo-tables \
  --summary-json "$R/overload-dynamo-summary.json" --spillway-summary "$T/overload-summary-then.json"

# Its rerun for issue 31, beside overload-31.md's run.
regenerate overload-dynamo-31.md "$PY" "$BENCH_DIR/overload/report.py" dynamo-tables \
  --summary-json "$R/overload-dynamo-31-summary.json" --spillway-summary "$R/overload-31-summary.json"

# bench/prefix/run.sh and dynamo.sh.
regenerate prefix.md "$PY" "$BENCH_DIR/prefix/report.py" tables --summary-json "$R/prefix-summary.json"
regenerate disagg.md "$PY" "$BENCH_DIR/disagg/report.py" tables --summary-json "$R/disagg-summary.json"
regenerate prefix-dynamo.md "$PY" "$BENCH_DIR/prefix/report.py" tables --dynamo \
  --summary-json "$R/prefix-dynamo-summary.json"

# bench/faults/run.sh: from its summary (per-run figures, per-second series).
for json in "$R"/faults*-summary.json; do
  [[ -e $json ]] || continue
  regenerate "$(basename "$json" -summary.json).md" "$PY" "$BENCH_DIR/faults/report.py" tables \
    --summary-json "$json"
done

# bench/proxy/run.sh: from the per-run table it wrote.
regenerate proxy.md "$PY" "$BENCH_DIR/proxy/report.py" tables --runs "$R/proxy-raw.tsv"

# bench/stream/run.sh: from the per-run table it wrote.
regenerate stream.md "$PY" "$BENCH_DIR/stream/report.py" --raw "$R/stream-raw.tsv" --out-md -

if ((FAILED)); then
  log "$FAILED of $CHECKED checks failed"
  exit 1
fi
log "all $CHECKED checks passed: every regenerated table is in its committed report"

#!/usr/bin/env bash
# perftrain diagnose on real torch.profiler traces (issue 37), for
#   MODE=script SCRIPT=bench/diagnose_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT and PY (this script builds nothing). About 4-6 minutes on an H200:
# bench/profile_reference_dit.py records bench/reference_dit.py's DiT-B/2 b256 training step (AdamW fused,
# bf16 autocast) eager, under torch.compile (default) and torch.compile(mode="reduce-overhead"), each in
# its own process (a failure is a row), 3 profiled steps after the warm-up; then `$BIN diagnose` reads each
# trace, as text and as JSON. Where the build laid out the Python package (build-gpu/python, perftrain._C),
# the eager step is recorded once more by perftrain.profile.record_trace (row eager-bf16-perftrain):
# its trace carries the step timed without the profiler and nvidia-smi's samples, so that report takes the
# profiler's cost out of the idle time and can say power-capped.
# DIAG_RUNS: a subset of "eager-bf16 compile reduce-overhead eager-bf16-perftrain" (default all four).
# Output: diagnose-<run>.md and .json (the reports), diagnose-<run>.log (the recording's log, with the
# step time without the profiler), trace-<run>.json.gz, diagnose-table.md (run, unprofiled step, the
# findings in order; also printed).
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${PY:?}"
here="$(cd "$(dirname "$0")" && pwd)"
table="$OUT/diagnose-table.md"
printf '| run | step without the profiler | findings, in order |\n|---|---|---|\n' > "$table"

package="$(cd "$(dirname "$BIN")" && pwd)/python"
# shellcheck disable=SC2206  # DIAG_RUNS splits on purpose
runs=(${DIAG_RUNS:-eager-bf16 compile reduce-overhead eager-bf16-perftrain})
if ! PYTHONPATH="$package" "$PY" -c "import perftrain.profile" 2>/dev/null; then
  runs=("${runs[@]/eager-bf16-perftrain/}")
fi

for run in "${runs[@]}"; do
  [ -n "$run" ] || continue
  mode=${run%-perftrain}
  extra=()
  [ "$run" != "$mode" ] && extra=(--perftrain-profile)
  trace="$OUT/trace-$run.json"
  log="$OUT/diagnose-$run.log"
  PYTHONPATH="$package" timeout "${RECORD_TIMEOUT:-200}" "$PY" "$here/profile_reference_dit.py" \
    --model "${MODEL:-DiT-B/2}" --batch "${BATCH:-256}" --mode "$mode" --out "$trace" "${extra[@]}" > "$log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$trace" ]; then
    echo "| $run | recording failed (rc $rc) | $(tail -1 "$log" | tr '|' '/') |" >> "$table"
    continue
  fi
  "$BIN" diagnose "$trace" --top 20 > "$OUT/diagnose-$run.md" 2>&1
  "$BIN" diagnose "$trace" --json > "$OUT/diagnose-$run.json" 2>&1
  step=$(grep -o '[0-9.]* ms per step without the profiler' "$log" | head -1)
  found=$(grep -o '^[0-9]*\. \*\*[a-z0-9-]*\*\*' "$OUT/diagnose-$run.md" | sed 's/.*\*\*\(.*\)\*\*/\1/' | paste -sd, -)
  echo "| $run | ${step:-see the report} | ${found:-none} |" >> "$table"
  gzip -f "$trace"
done
cat "$table"

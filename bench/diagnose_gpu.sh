#!/usr/bin/env bash
# perftrain diagnose on real torch.profiler traces (issue 37), for
#   MODE=script SCRIPT=bench/diagnose_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT and PY (this script builds nothing). About 4-6 minutes on an H200:
# bench/profile_reference_dit.py records bench/reference_dit.py's DiT-B/2 b256 training step (AdamW fused,
# bf16 autocast) eager, under torch.compile (default) and torch.compile(mode="reduce-overhead"), each in
# its own process (a failure is a row), 3 profiled steps after the warm-up; then `$BIN diagnose` reads each
# trace, as text and as JSON.
# Output: diagnose-<mode>.md and .json (the reports), diagnose-<mode>.log (the recording's log, with the
# step time without the profiler), trace-<mode>.json.gz, diagnose-table.md (mode, unprofiled step, first
# finding of each; also printed).
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${PY:?}"
here="$(cd "$(dirname "$0")" && pwd)"
table="$OUT/diagnose-table.md"
printf '| mode | step without the profiler | findings, in order |\n|---|---|---|\n' > "$table"

for mode in eager-bf16 compile reduce-overhead; do
  trace="$OUT/trace-$mode.json"
  log="$OUT/diagnose-$mode.log"
  timeout "${RECORD_TIMEOUT:-200}" "$PY" "$here/profile_reference_dit.py" --model "${MODEL:-DiT-B/2}" \
    --batch "${BATCH:-256}" --mode "$mode" --out "$trace" > "$log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$trace" ]; then
    echo "| $mode | recording failed (rc $rc) | $(tail -1 "$log" | tr '|' '/') |" >> "$table"
    continue
  fi
  "$BIN" diagnose "$trace" --top 20 > "$OUT/diagnose-$mode.md" 2>&1
  "$BIN" diagnose "$trace" --json > "$OUT/diagnose-$mode.json" 2>&1
  step=$(grep -o '[0-9.]* ms per step without the profiler' "$log" | head -1)
  found=$(grep -o '^[0-9]*\. \*\*[a-z0-9-]*\*\*' "$OUT/diagnose-$mode.md" | sed 's/.*\*\*\(.*\)\*\*/\1/' | paste -sd, -)
  echo "| $mode | ${step:-?} | ${found:-none} |" >> "$table"
  gzip -f "$trace"
done
cat "$table"

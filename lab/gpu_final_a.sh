#!/usr/bin/env bash
# Final pass, call A: every test (CPU and GPU) of the built tree, one log back.
set -uo pipefail
t0=$(date +%s)
timeout 400 ctest --test-dir build-gpu -j 12 --timeout 240 > "$OUT/tests-all.log" 2>&1
echo "ctest rc $? in $(( $(date +%s) - t0 )) s"
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run|SKIPPED" "$OUT/tests-all.log" | tail -40

#!/usr/bin/env bash
# Runs a check with one ordering taken out of its kernels (EMU_SED) and passes when the race
# detector reports the race (README.md). Usage: expect_race.sh 'sed script' check.cpp kernel names...
set -uo pipefail
SED="$1"
shift
CHECK="$1"
shift
out=$(EMU_SED="$SED" bash "$(dirname "$0")/run.sh" "$CHECK" "$@" 2>&1)
rc=$?
[ $rc -eq 77 ] && { echo "$out"; exit 77; }
echo "$out" | grep -v "done, 0 failures so far"
unchanged=$(echo "$out" | grep -c "EMU_SED changed nothing")
[ "$unchanged" -lt $# ] || { echo "FAIL the injection ($SED) no longer matches the kernels' source"; exit 1; }
echo "$out" | grep -q "EMU ERROR: shared-memory race" || { echo "FAIL the race injected by $SED was not reported"; exit 1; }
echo "the race injected by $SED was reported"

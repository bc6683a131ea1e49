#!/usr/bin/env bash
# Final pass, call B: the looped bench table and the Fashion-MNIST runs, everything in one tarball.
set -uo pipefail
R="$OUT/r"; mkdir -p "$R"
OUT="$R" bash bench/looped_gpu.sh 2>&1 | tail -n 30
OUT="$R" LOOPED_STEPS="${LOOPED_STEPS:-1500}" bash bench/looped_fmnist_gpu.sh > "$R/fmnist.log" 2>&1
grep -E "^== |: \{|reconstruction|worst|differ" "$R/fmnist.log" | tail -30
tar czf "$OUT/looped.tgz" -C "$R" . && rm -rf "$R"

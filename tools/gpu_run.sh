#!/usr/bin/env bash
# The one script for the GPU machine (see docs/guide/quickstart.md): builds
# against the PyTorch there with the carried headers (.carry, filled by
# tools/fill_carry.sh), runs the gpu-labelled tests, trains the main job
# (DiT-S/2 on Fashion-MNIST) and prints a summary table last.
#   STEPS=3000 bash tools/gpu_run.sh        (in a device call with carry [".carry"])
#   TESTS=all COMMIT=$(git rev-parse --short HEAD) ...   every test, not only the gpu ones
# Results go to $OUT (or ./gpu-out): samples, metrics, report, logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
STEPS="${STEPS:-3000}"
JOBS="$(nproc)"
log() { echo "[gpu_run $(date +%H:%M:%S)] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
PY="$(command -v python3)"
log "torch $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)')"

t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERFTRAIN_PYTHON="$PY" \
  -DPERFTRAIN_CARRY_DIR="$PWD/.carry" > "$OUT/build.log" 2>&1 &&
  ninja -C build-gpu -j "$JOBS" >> "$OUT/build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - t0 ))
log "build rc=$build_rc in ${build_s}s"
if [ $build_rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi

t0=$(date +%s)
if [ "${TESTS:-gpu}" = all ]; then
  ctest --test-dir build-gpu --output-on-failure -j 8 > "$OUT/gpu_tests.log" 2>&1
else
  ctest --test-dir build-gpu -L gpu --output-on-failure -j 4 > "$OUT/gpu_tests.log" 2>&1
fi
tests_rc=$?
tests_s=$(( $(date +%s) - t0 ))
grep -E "tests passed|Failed|FAILED|Passed|Skipped" "$OUT/gpu_tests.log" | tail -15

RUNS=/tmp/perftrain-runs
rm -rf "$RUNS"
t0=$(date +%s)
./build-gpu/perftrain train --data-path "$PWD/.carry/fashion-mnist" --steps "$STEPS" \
  --runs-dir "$RUNS" --run-name fmnist > "$OUT/train.log" 2>&1
train_rc=$?
train_s=$(( $(date +%s) - t0 ))
tail -8 "$OUT/train.log"
RUN="$RUNS/fmnist"
cp "$RUN/metrics.jsonl" "$RUN/report.md" "$OUT/" 2>/dev/null
last=$(ls "$RUN/samples" 2>/dev/null | tail -1)
first=$(ls "$RUN/samples" 2>/dev/null | head -1)
[ -n "$last" ] && cp "$RUN/samples/$last" "$OUT/samples_final.png"
[ -n "$first" ] && [ "$first" != "$last" ] && cp "$RUN/samples/$first" "$OUT/samples_first.png"

echo
echo "| what | result |"
echo "|---|---|"
echo "| GPU | $(cat "$OUT/gpu.txt") |"
echo "| commit | ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} |"
echo "| build | rc $build_rc, ${build_s} s |"
echo "| tests (${TESTS:-gpu}) | rc $tests_rc, ${tests_s} s: $(grep -E 'tests passed' "$OUT/gpu_tests.log") |"
echo "| train | rc $train_rc, ${train_s} s: $(grep -E '^done:' "$OUT/train.log") |"
echo "| first step | $(grep -E 'first step done' "$OUT/train.log") |"
grep -E '^\| (speed|peak memory|loss) ' "$RUN/report.md" 2>/dev/null

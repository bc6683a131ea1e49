#!/usr/bin/env bash
# Our tiled attention kernels on the GPU (kernels/attention_tiled_{fwd,bwd}_sm90, the [speed] value
# attention = "tiled"), for
#   MODE=script SCRIPT=bench/attention_gpu.sh \
#     BUILD_TARGETS="perftrain tests/test_ops tests/test_ops_gpu attention_tiled_check attention_tiled_bench" \
#     tools/gpu_run.sh
# which exports BIN, RUNS, OUT and PY (the build in build-gpu/). About 5 minutes on an H200 after the build (estimated):
#  1. the float64 checks of forward and backward (T 64, 257, 288, 1024, 1152; head dims 64, 72, 96, 128; no bias, bf16
#     and fp32 key bias; q|k split from v; three runs bit-identical; nothing written past T):
#     kernels.attention_tiled_float64;
#  2. the ops GPU tests of the tiled path and of the attention ops beside it (qkv_attention and
#     projected_attention with "tiled": our tiled backward, or at 256 tokens our whole-head one, against
#     float64, reruns bit-identical), and the CPU tests of the switch and the [speed] key;
#  3. the kernels' time per call and against cuDNN's forward and backward at SS-B/2 b256 (288 tokens), SS-B/2
#     b64 (1152), SS-XL/2 b128 and b32 (head dim 72), DiT-B/2 b64 and XL/2 b32 at 512 px (1024), head dim 128
#     at T 1024 (masked and not) and 4096 and head dim 96 at 1024 ("d128 T1024" etc.), and at 256 tokens beside
#     the whole-head forward (attention_tiled_bench: "ours/cuDNN" below 1 is ours winning);
#  4. the training step with attention = "tiled" against the default at SS-B/2 b256 and b64 and DiT-B/2 b64
#     at 512 px (perftrain bench, the all variant; its report lists the attention path each shape took);
#  5. compute-sanitizer's memcheck and racecheck on two of the checks (skipped without compute-sanitizer).
# PART=check runs 1, 2 and 5 (about 4 minutes), PART=speed 3 and 4 (about 5 minutes); default all, in order
# 1-5 (more than one call's 600 s with a cold build: then one call per PART).
# Output under $OUT/attention/.
set -uo pipefail
B=./build-gpu
A="$OUT/attention"
mkdir -p "$A"
rc=0
PART="${PART:-all}"
case "$PART" in all | check | speed) ;; *) echo "unknown PART=$PART (all, check, speed)"; exit 2 ;; esac
step() { echo "== $*"; }
checking() { [ "$PART" != speed ]; }
timing() { [ "$PART" != check ]; }

if checking; then
  step "1. float64 checks"
  "$B/bench/kernels/attention_tiled_check" checks 2>&1 | tee "$A/float64.log" || rc=1

  step "2. ops tests"
  "$B/tests/test_ops_gpu" --gtest_filter='AttentionTiledGpu.*:QkvAttentionGpu.*:ProjectedAttentionGpu.*' 2>&1 |
    tee "$A/ops-gpu.log" | grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|rel L2|\[attention\]" || true
  grep -q "^\[  PASSED  \]" "$A/ops-gpu.log" && ! grep -q "^\[  FAILED  \]" "$A/ops-gpu.log" || rc=1
  "$B/tests/test_ops" --gtest_filter='AttentionTiled.*:AttentionPaths.*' > "$A/ops-cpu.log" 2>&1 || rc=1
  tail -3 "$A/ops-cpu.log"
fi

if timing; then
  step "3. kernel times"
  "$B/bench/kernels/attention_tiled_bench" 2>&1 | tee "$A/bench.log" || rc=1
  "$B/bench/kernels/attention_tiled_check" time 2>&1 | tee "$A/time.log" || rc=1
fi

timing && step "4. training step, tiled against the default"
timing && for spec in "SS-B/2 256 32 32" "SS-B/2 64 64 128" "DiT-B/2 64 64 0"; do
  set -- $spec
  cond=()
  [ "$4" != 0 ] && cond=(--set "model.cond_tokens=$4" --set model.cond_dim=1024)
  for attention in whole_head tiled; do
    tag="$(echo "$1" | tr '/' '-')-b$2-l$3-$attention"
    timeout 240 "$BIN" bench --model "$1" --batch "$2" --image-size "$3" "${cond[@]}" --variants all \
      --set "speed.attention=$attention" --out "$RUNS/bench-$tag" > "$A/bench-$tag.log" 2>&1
    echo "$tag: rc $? $(grep -E '^ *[0-9]+ +all ' "$A/bench-$tag.log" | head -1)"
    cp "$RUNS/bench-$tag/bench.md" "$A/bench-$tag.md" 2>/dev/null
  done
done
checking && step "5. compute-sanitizer"
CS="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if ! checking; then
  :
elif [ -x "$CS" ]; then
  for tool in memcheck racecheck; do
    timeout 150 "$CS" --tool "$tool" "$B/bench/kernels/attention_tiled_check" few > "$A/sanitize-$tool.log" 2>&1
    echo "$tool: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$A/sanitize-$tool.log" | tail -1)"
  done
else
  echo "no compute-sanitizer"
fi

exit $rc

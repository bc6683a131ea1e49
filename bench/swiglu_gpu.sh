#!/usr/bin/env bash
# SwiGLU in the gate-up product's epilogue (issue 38, lever 2), checked and measured on the GPU:
#   BUILD_TARGETS="perftrain test_ops_gpu test_models_gpu bench_gemm_bias_gelu" \
#     MODE=script SCRIPT=bench/swiglu_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT, RUNS and PY (this script builds nothing). About 7-9 minutes on an H200:
#   1. the GPU tests: gemm_swiglu_sm90 itself against float64 at SS-B/2 and SS-XL/2 widths (gate_up and h,
#      NaN-filled outputs, reruns bit-identical), swiglu_product forward and backward against float64 (fused
#      shapes and odd rows), the fallback bit for bit today's stacked product + swiglu, captured == eager;
#      swiglu's, fc1's and stacked_linear's own GPU tests (the kernel's epilogue is now a template parameter);
#      the single-stream model against the CPU;
#   2. bench_gemm_bias_gelu swiglu: gate_up + h in one kernel against the product then swiglu's kernel, and
#      the product alone, at SS-B/2 b256 (73,728 x 2048 x 768) and SS-XL/2 b128 (36,864 x 3072 x 1152):
#      the fused kernel should take about the product's time (its extra write is F bf16 a row, ~0.1 ms),
#      product + swiglu ~0.25 ms more a call at SS-B/2 (swiglu's pass over 0.9 GB; 12 blocks: ~3 ms a step);
#   3. the SS-B/2 b256 step (256 + 32 tokens, `all`) with speed.gelu_recompute=false (swiglu_product) and
#      =true (swiglu_product_linear; the table's setting in docs/PERFORMANCE.md, 112.15 ms and 26.28 GiB at
#      f76632d before QK-norm + RoPE's q | k change): ms/step and peak of each; the fused kernel runs in both,
#      the peak should not move (the same tensors kept).
# Output: tests-*.log, swiglu-gemm-bench.txt, bench-SS-B-2-b256-{keep,recompute}.json, swiglu-summary.txt.
set -uo pipefail
# shellcheck source=bench/script_steps.sh
source "$(dirname "$0")/script_steps.sh"
summary_start swiglu

summary_step tests-ops 180 "$build/tests/test_ops_gpu" \
  --gtest_filter='SwigluProductGpu.*:SwigluGpu.*:GemmBiasGeluGpu.*:GeluMlpGpu.*:StackedLinearGpu.*'
summary_step tests-models 180 "$build/tests/test_models_gpu" --gtest_filter='SingleStreamGpuModel.*'
summary_step swiglu-gemm-bench 60 "$build/bench/kernels/bench_gemm_bias_gelu" swiglu
cp "$OUT/swiglu-gemm-bench.log" "$OUT/swiglu-gemm-bench.txt"
grep -E '^\|' "$OUT/swiglu-gemm-bench.log" | tee -a "$summary"
for mode in keep recompute; do
  recompute=false
  [ $mode = recompute ] && recompute=true
  summary_step "bench-ss-b2-$mode" 130 "$BIN" bench --model SS-B/2 --batch 256 --image-size 32 \
    --set model.cond_tokens=32 --set model.cond_dim=1024 --variants all --set speed.gelu_recompute=$recompute \
    --out "$RUNS/swiglu-ss-b2-$mode"
  cp "$RUNS/swiglu-ss-b2-$mode/bench.json" "$OUT/bench-SS-B-2-b256-$mode.json" 2>/dev/null
  grep -E '^\|' "$OUT/bench-ss-b2-$mode.log" | tail -4 | tee -a "$summary"
done

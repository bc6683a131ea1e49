#!/usr/bin/env bash
# QK-norm + RoPE writing only q | k, v read in place (issue 38, lever 4), checked and measured on the GPU:
#   BUILD_TARGETS="perftrain test_ops_gpu test_models_gpu qk_norm_rope_bench" \
#     MODE=script SCRIPT=bench/qk_only_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT, RUNS and PY (this script builds nothing). About 6-8 minutes on an H200:
#   1. the GPU tests of the pieces: qk_norm_rope (float64, every element written, vector and pair paths,
#      dq and dk apart, graph capture), qkv_attention's three-tensor form on the block's layout (cuDNN takes
#      q, k with rows 2D apart and v with rows 3D apart: not refused, noted as cuDNN, the packed form's
#      output bit for bit), linear_column_blocks (float64, graph), projected_attention (the shared cuDNN
#      save layout), and the single-stream model against the CPU (no bf16 attention through SDPA);
#   2. bench/kernels/qk_norm_rope_bench: the block layout against the packed one at SS-B/2's rows;
#   3. the SS-B/2 b256 step (256 + 32 tokens, `all`, speed.gelu_recompute=true as in docs/PERFORMANCE.md):
#      ms/step and peak, to set beside the table there (112.15 ms, 26.28 GiB at f76632d): the peak should
#      fall by about 1.27 GiB (v no longer held twice: 108 MiB a block, 12 blocks) and the step by the
#      dq/dk/dv pack and the v copy (about 2 ms of kernel time; less at the power limit).
# Output: tests-*.log, qk-norm-rope-bench.txt, bench-SS-B-2-b256.json, qk-only-summary.txt (also printed).
set -uo pipefail
# shellcheck source=bench/script_steps.sh
source "$(dirname "$0")/script_steps.sh"
summary_start qk-only

summary_step tests-ops 240 "$build/tests/test_ops_gpu" \
  --gtest_filter='QkNormRopeGpu.*:QkvAttentionGpu.*:LinearGpu.ColumnBlocks*:ProjectedAttentionGpu.*'
summary_step tests-models 240 "$build/tests/test_models_gpu" --gtest_filter='SingleStreamGpuModel.*'
summary_step qk-norm-rope-bench 60 "$build/bench/kernels/qk_norm_rope_bench"
cp "$OUT/qk-norm-rope-bench.log" "$OUT/qk-norm-rope-bench.txt"
summary_step bench-ss-b2 150 "$BIN" bench --model SS-B/2 --batch 256 --image-size 32 --set model.cond_tokens=32 \
  --set model.cond_dim=1024 --variants all --set speed.gelu_recompute=true --out "$RUNS/qk-only-ss-b2"
cp "$RUNS/qk-only-ss-b2/bench.json" "$OUT/bench-SS-B-2-b256.json" 2>/dev/null
grep -E '^\|' "$OUT/bench-ss-b2.log" | tail -6 | tee -a "$summary"

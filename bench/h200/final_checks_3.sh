# The H200 checks of this session's multi-GPU work on one GPU (one-rank NCCL groups: captured step, gradient
# buckets, ZeRO-1, bench --nproc-per-node 1), the GradStats capture test's fix, the attention-path notes, then
# DiT at 512 px against torch reduce-overhead; for
#   BUILD_TARGETS="perftrain tests/test_ops_gpu tests/test_dist_gpu tests/test_train_gpu tests/test_cli_gpu" \
#   MODE=script SCRIPT=bench/h200/final_checks_3.sh tools/gpu_run.sh
set -u
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el "gpu tests"
timeout 100 ./build-gpu/tests/test_ops_gpu --gtest_filter='GradStatsGpu.*:QkvAttentionGpu.*' > "$OUT/t-ops.log" 2>&1
echo "ops rc $?"; grep -E "^\[  (PASSED|FAILED) |\[attention\]|Failure" "$OUT/t-ops.log" | head -20
timeout 90 ./build-gpu/tests/test_dist_gpu --gtest_filter='DistGpu.*' > "$OUT/t-dist.log" 2>&1
echo "dist rc $?"; grep -E "^\[  (PASSED|FAILED) |graph:|eager:|captured|NCCL|buckets|Failure" "$OUT/t-dist.log" | head -20
timeout 90 ./build-gpu/tests/test_train_gpu --gtest_filter='Zero1Gpu.*' > "$OUT/t-zero1.log" 2>&1
echo "zero1 rc $?"; grep -E "^\[  (PASSED|FAILED) |ZeRO|NCCL one rank|sharding line|captured|Failure" "$OUT/t-zero1.log" | head -20
timeout 120 ./build-gpu/tests/test_cli_gpu --gtest_filter='BenchDataParallelGpu.*' > "$OUT/t-cli.log" 2>&1
echo "cli rc $?"; grep -E "^\[  (PASSED|FAILED) |Failure" "$OUT/t-cli.log" | head -10
el "bench --nproc-per-node 1"
timeout 100 $BIN bench --nproc-per-node 1 --model DiT-S/2 --batch 256 --variants all --steps 20 --warmup 5 \
  --out /tmp/dpb-s2-np1 > "$OUT/dpb.log" 2>&1; echo "dpb rc $?"; tail -6 "$OUT/dpb.log"
cp /tmp/dpb-s2-np1/bench.* "$OUT/" 2>/dev/null
el "dit-512"
for c in "DiT-B/2 64" "DiT-XL/2 32"; do
  set -- $c; d=/tmp/d512-$(echo $1 | tr -c 'a-zA-Z0-9' _)
  timeout 170 $BIN bench --model $1 --batch $2 --image-size 64 --against-torch --variants all \
    --torch-modes reduce-overhead --out $d > "$OUT/d512-$2.log" 2>&1
  echo "$1 b$2 rc $?"; grep -E "speedup|Attention|ours \(|cuDNN fused" "$OUT/d512-$2.log" | tail -3
  cp $d/bench.json "$OUT/bench-$(echo $1 | tr '/' '-')-$2-l64.json" 2>/dev/null
  cp $d/bench.md "$OUT/bench-$(echo $1 | tr '/' '-')-$2-l64.md" 2>/dev/null
  el "$1 done"
done

#!/usr/bin/env bash
# The GPU checks of the paths written without a GPU and not yet run on one (issues 38 and 39), in one call:
#   DEADLINE=$(( $(date +%s) + 525 )) MODE=script SCRIPT=bench/verify_gpu.sh RUN_TESTS=1 \
#     TEST_REGEX='(Swiglu|SingleStream|Fp8|RmsAdaLN|LoopedFused|AttentionChoice|AttentionTiled|QkvAttention|ProjectedAttention)[A-Za-z]*Gpu' \
#     tools/gpu_run.sh
# (a full build: the test programs, attention_tiled_check and _bench, perftrain), which runs those tests first
# (tests.log) and exports BIN, RUNS, OUT. Then, while DEADLINE (epoch seconds) leaves time:
#  1. cuBLASLt's refusals the tests printed ([gemm] lines), and each failed test's assertion lines;
#  2. the tiled attention kernels against float64 (attention_tiled_check checks) and their time against
#     cuDNN's (attention_tiled_bench);
#  3. every other gpu-labelled test (tests-rest.log);
#  4. perftrain bench DiT-XL/2 b256 (b128 on an H100) in fp8, 20 steps: that the fp8 step runs its products in
#     cuBLASLt.
set -u
DL=${DEADLINE:-$(( $(date +%s) + 300 ))}
left() { echo $(( DL - $(date +%s) )); }
echo "== refusals"
grep -E "\[gemm\]|refus" "$OUT/tests.log" | head -20
echo "== failures"
grep -E "Failed|Exception|tests passed" "$OUT/tests.log" | tail -30
for t in $(grep -E "Test +#[0-9]+: .*\*\*\*(Failed|Exception)" "$OUT/tests.log" | sed -E 's/.*: ([^ ]+) \.+.*/\1/' | head -6); do
  echo "---- $t"
  awk -v t="$t" '$0 ~ "Start.*"t {p=1} p && /Failure|error|Expected|Which is|refus|what\(\)|Actual/ {print; n++} n>12 {exit}' \
    "$OUT/tests.log"
done
echo "== attention against float64 (left $(left) s)"
timeout 150 build-gpu/bench/kernels/attention_tiled_check checks > "$OUT/attention-float64.log" 2>&1
echo "rc $?"
grep -iE "fail|error|mismatch|pass|ok|max" "$OUT/attention-float64.log" | tail -30
echo "== attention kernel times (left $(left) s)"
timeout 100 build-gpu/bench/kernels/attention_tiled_bench > "$OUT/attention-bench.log" 2>&1
echo "rc $?"
tail -40 "$OUT/attention-bench.log"
if [ "$(left)" -gt 240 ]; then
  echo "== the other gpu tests (left $(left) s)"
  timeout $(( $(left) - 150 )) ctest --test-dir build-gpu -L gpu -j 2 --output-on-failure \
    -E '(Swiglu|SingleStream|Fp8|RmsAdaLN|LoopedFused|AttentionChoice|AttentionTiled|QkvAttention|ProjectedAttention)[A-Za-z]*Gpu' \
    > "$OUT/tests-rest.log" 2>&1
  grep -E "Failed|Exception|Timeout|tests passed" "$OUT/tests-rest.log" | tail -25
fi
if [ "$(left)" -gt 100 ]; then
  # b256 needs about 80 GiB: b128 on a GPU of less than 100 GB (an H100).
  xl=256
  [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] && xl=128
  echo "== fp8 step, DiT-XL/2 b$xl (left $(left) s)"
  timeout $(( $(left) - 20 )) "$BIN" bench --model DiT-XL/2 --batch-size "$xl" --variants all --precision fp8 \
    --out "$RUNS/fp8-xl" --steps 20 --warmup 5 2>&1 | tail -n 14
fi

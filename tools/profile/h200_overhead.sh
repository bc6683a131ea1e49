# The profiler's own cost and the breakdown against the profiled step, on the H200, for
# tools/gpu_run.sh MODE=script SCRIPT=tools/profile/h200_overhead.sh (BIN, RUNS, OUT, PY exported).
# Every profile.md / window-<n>.md window prints:
#   "Breakdown against the profiled step: ... within 5%."   the trace's parts against CUDA events around each
#                                                            profiled step (the "done when" check)
#   "Profiler overhead: profiled step X ms vs unprofiled Y ms (+Z%, about N kernels x C us)"
#   "GPU idle between kernels without the profiler's cost: about ..."
set -u
TESTS="$(dirname "$BIN")/tests"
show() {  # the accounting lines and the first finding of each window of a profile.md
  echo "== $1"
  grep -E '^## |^Step: |^Breakdown against|^Profiler overhead|^GPU idle between kernels without|^1\. \*\*' "$1"
}
# 0. The GPU test: eager and captured steps of 1200 short kernels, within 5% of the profiled step.
"$TESTS/test_observe_gpu" --gtest_filter='ProfileGpu.*'
# 1. Launch-bound: DiT-S/2 b8, no graph, no fused kernels.
$BIN profile --model DiT-S/2 --batch 8 --graph off --fused off --out $OUT/overhead-s2-b8-eager
show $OUT/overhead-s2-b8-eager/profile.md
# 2. DiT-S/2 b32, fused and captured, and the same step eagerly (--profile-uncaptured).
$BIN profile --model DiT-S/2 --batch 32 --profile-uncaptured --out $OUT/overhead-s2-b32
show $OUT/overhead-s2-b32/profile.md
# 3. DiT-XL/2 b256, fused and captured: long kernels, little overhead.
$BIN profile --model DiT-XL/2 --batch 256 --timed-steps 10 --out $OUT/overhead-xl2-b256
show $OUT/overhead-xl2-b256/profile.md
# 4. train --profile: the unprofiled steps are the run's own, just before each window's warm-up.
$BIN train --model DiT-S/2 --data synthetic --steps 40 --batch-size 32 --run-name overhead-train --runs-dir $RUNS \
  --set log.every=10 --set log.sample_classes=2 --set log.sample_per_class=2 \
  --profile skip_first=10,wait=4,warmup=2,active=3,repeat=2
for w in $RUNS/overhead-train/profile/window-*.md; do show "$w"; done
cp -r $RUNS/overhead-train/profile $OUT/overhead-train
# 5. --profile-scopes-only (no ATen op events, no per-op CUPTI correlation): the eager overheads against 1 and 2.
$BIN profile --model DiT-S/2 --batch 8 --graph off --fused off --profile-scopes-only \
  --out $OUT/overhead-s2-b8-eager-scopes
show $OUT/overhead-s2-b8-eager-scopes/profile.md
$BIN profile --model DiT-S/2 --batch 32 --profile-uncaptured --profile-scopes-only --out $OUT/overhead-s2-b32-scopes
show $OUT/overhead-s2-b32-scopes/profile.md
# 6. The 5% check over every window above: any "NOT within 5%" is a failure.
echo "== windows within 5%: $(grep -h '^Breakdown against' $OUT/overhead-*/profile.md $OUT/overhead-train/*.md | grep -c ', within 5%')"
echo "== windows NOT within 5%: $(grep -h '^Breakdown against' $OUT/overhead-*/profile.md $OUT/overhead-train/*.md | grep -c 'NOT within 5%')"

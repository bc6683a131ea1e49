# The H200 checks of issue 24 (profiling and diagnosis), for tools/gpu_run.sh MODE=script
# (BIN, RUNS, OUT, PY exported). Each line prints what proves it; the outputs go into $OUT/profile-*.
set -u
P=tools/profile
# 1. A DiT-S/2 step's kernels under the trainer's scopes: the captured step (one graph launch) and the same
#    step eagerly; the eager trace's kernels sit under forward / backward / optimizer / h2d scopes.
$BIN profile --model DiT-S/2 --batch 32 --profile-uncaptured --group-by kernel --top 12 --out $OUT/profile-s2-b32
$PY $P/check_scopes.py $OUT/profile-s2-b32/uncaptured-window-0.json --min-share 0.9
$PY $P/check_scopes.py $OUT/profile-s2-b32/window-0.json --min-share 0.9   # all under perftrain::graph_replay
# 2. Launch-bound: DiT-S/2 batch 8, no graph, no fused kernels.
$BIN profile --model DiT-S/2 --batch 8 --graph off --fused off --out $OUT/profile-s2-b8-eager
grep -A3 -m1 '\*\*launch-bound\*\*' $OUT/profile-s2-b8-eager/profile.md
# 3. Matrix-bound and power-capped: the fused, captured DiT-XL/2 at batch 256.
$BIN profile --model DiT-XL/2 --batch 256 --timed-steps 10 --memory-snapshot --out $OUT/profile-xl2-b256
grep -A3 '\*\*matrix-bound\*\*\|\*\*power-capped\*\*' $OUT/profile-xl2-b256/profile.md
# 4. Data-bound: a loader that takes 100 ms a batch, one batch ahead.
$BIN profile --model DiT-S/2 --batch 256 --slow-data-ms 100 --set data.prefetch=1 --timed-steps 8 \
  --out $OUT/profile-s2-b256-slowdata
grep -A3 -m1 '\*\*data-bound\*\*' $OUT/profile-s2-b256-slowdata/profile.md
# 5. The breakdown against the profiled step (within 5%) and the profiler's overhead: every profile above
#    (tools/profile/h200_overhead.sh looks at them closer).
grep -H '^Breakdown against the profiled step\|^Profiler overhead' $OUT/profile-*/profile.md
# 6. train --profile: windows of a real run (traces and reports in the run's profile/).
$BIN train --model DiT-S/2 --data synthetic --steps 40 --batch-size 64 --run-name profile-train --runs-dir $RUNS \
  --set log.every=10 --set log.sample_classes=2 --set log.sample_per_class=2 \
  --profile skip_first=10,wait=0,warmup=2,active=3,repeat=2
ls $RUNS/profile-train/profile/ && head -30 $RUNS/profile-train/profile/window-0.md
cp -r $RUNS/profile-train/profile $OUT/profile-train

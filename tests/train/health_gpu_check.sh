#!/usr/bin/env bash
# Training health on the H200 (issue 25, docs/guide/health.md): the GPU tests,
# the overhead of gradient monitoring every 50 steps inside the captured step
# (DiT-S/2 and DiT-XL/2 at batch 256, side by side with it off), a healthy run's
# statistics, and runs made to diverge with a high lr, stopped with the first
# non-finite module named. Run with
#   MODE=script SCRIPT=tests/train/health_gpu_check.sh tools/gpu_run.sh
# (BIN, RUNS, OUT exported) or by hand after a build into build-gpu/.
set -u
BIN="${BIN:-./build-gpu/perftrain}"; RUNS="${RUNS:-/tmp/health-runs}"; OUT="${OUT:-/tmp/health-out}"
TESTS="$(dirname "$BIN")/tests/test_train_gpu"
mkdir -p "$RUNS" "$OUT"

echo "== 1. GPU tests"
"$TESTS" --gtest_filter='HealthGpu.*:DeviceOptimizerGpu.*:StepRunnerGpu.*' 2>&1 | tail -25

echo "== 2. overhead: ms_mean of the timed steps (monitored steps included), monitoring off vs every 50"
# The warm-up (60 steps) holds the first monitored step, where the monitored graph
# is captured; the timed steps then hold one monitored step in 50.
mean_ms() { python3 -c "import json,sys; r=[x for x in json.load(open(sys.argv[1]))['rows'] if x['variant']=='all'][0]; print('%.3f %.3f' % (r['ms_mean'], r['ms']))" "$1"; }
for spec in "DiT-S/2 500 2" "DiT-XL/2 200 1"; do
  set -- $spec; m=$1; steps=$2; rounds=$3; tag="${m//\//-}"
  for r in $(seq 1 "$rounds"); do
    for every in 0 50; do
      d="$OUT/bench-$tag-every$every-r$r"
      "$BIN" bench --model "$m" --batch 256 --variants all --warmup 60 --steps "$steps" \
        --set health.monitor_every=$every --out "$d" > "$d.log" 2>&1 || { echo "bench failed: $d.log"; tail -5 "$d.log"; continue; }
      echo "$tag monitor_every=$every round $r: ms_mean ms_median = $(mean_ms "$d/bench.json")"
    done
  done
done

echo "== 3. a healthy run: statistics in metrics.jsonl, no warning"
"$BIN" train --steps 300 --set log.every=50 --set health.monitor_every=50 --set run.dir="$RUNS" \
  --set run.name=healthy > "$OUT/healthy.log" 2>&1; echo "exit $?"
grep -E "warning|monitoring|step:" "$OUT/healthy.log" | head
python3 - "$RUNS/healthy/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
g = [r for r in rows if "grad" in r]
print("log lines", len(rows), "with grad stats", len(g))
if g:
    last = g[-1]
    print("global", {k: last["grad"][k] for k in ("step", "norm", "max_abs", "zero_share", "nonfinite", "update_ratio")})
    for name, s in list(last["grad_modules"].items())[:4] + list(last["grad_modules"].items())[-2:]:
        print(" ", name, "norm %.3g max %.3g zero %.3g ratio %.3g" % (s["norm"], s["max_abs"], s["zero_share"], s["update_ratio"]))
PY
sed -n '/## Training health/,$p' "$RUNS/healthy/report.md"

echo "== 4. diverging runs (stop): exit 1, the first non-finite module named, no checkpoint after it"
for lr in 10 1e4; do
  name="diverge-lr$lr"
  "$BIN" train --steps 400 --set train.lr=$lr --set log.every=10 --set log.checkpoint_every=20 \
    --set log.sample_every=0 --set run.dir="$RUNS" --set run.name="$name" > "$OUT/$name.log" 2>&1
  echo "lr=$lr exit $?"
  grep -A4 "non-finite" "$OUT/$name.log" | head -12
  ls "$RUNS/$name/ckpt" 2>/dev/null | tr '\n' ' '; echo
  sed -n '/## Training health/,$p' "$RUNS/$name/report.md" | head -8
done

echo "== 5. the same divergence with nan_policy = skip: the run goes on to its end"
"$BIN" train --steps 200 --set train.lr=1e4 --set log.every=10 --set log.sample_every=0 \
  --set health.nan_policy=skip --set run.dir="$RUNS" --set run.name=diverge-skip > "$OUT/diverge-skip.log" 2>&1
echo "exit $?"; grep -c "non-finite" "$OUT/diverge-skip.log"; tail -3 "$OUT/diverge-skip.log"

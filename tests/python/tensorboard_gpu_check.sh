# The TensorBoard checks on the GPU machine (tools/gpu_run.sh MODE=script SCRIPT=this file; BIN, FMNIST,
# RUNS, OUT and PY come from there):
#  1. a short DiT-S/2 run on Fashion-MNIST whose tb/ events TensorBoard's EventAccumulator reads back:
#     every metrics.jsonl scalar, a weight histogram per parameter at steps 200/400/600, the grids of 300/600,
#     per-module gradient norms (health.monitor_every = 50) and gradient_flow.svg;
#  2. the writer's cost per step: DiT-S/2 b256, 1000 steps, log.tensorboard on and off, twice each in
#     alternation; images/s of the windows after step 200 side by side.
# Needs the tensorboard package in $PY; without it, PYTHONPATH=.carry/pylib (tensorboard, google/protobuf,
# absl copied from the .venv's site-packages) is tried with protobuf's pure-Python implementation.
set -u
if ! "$PY" -c "import tensorboard" 2>/dev/null; then
  export PYTHONPATH="$PWD/.carry/pylib${PYTHONPATH:+:$PYTHONPATH}" PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
fi
"$PY" -c "import tensorboard; print('tensorboard', tensorboard.__version__)" || echo "NO TENSORBOARD PACKAGE: check 1 cannot run"

$BIN train --data-path "$FMNIST" --runs-dir "$RUNS" --run-name tb-read --steps 600 --set log.every=50 \
  --set log.histogram_every=200 --set log.sample_every=300 > "$OUT/train-tb-read.log" 2>&1 || { tail "$OUT/train-tb-read.log"; echo "FAIL: run"; }
cp -r "$RUNS/tb-read/tb" "$OUT/tb-read-events" 2>/dev/null
cp "$RUNS/tb-read/"*.svg "$OUT/" 2>/dev/null
"$PY" - "$RUNS/tb-read" <<'PYEOF'
import json, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
acc = EventAccumulator(os.path.join(run, "tb"), size_guidance={k: 0 for k in ("scalars", "histograms", "images", "tensors")})
acc.Reload()
tags = acc.Tags()
lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
bad = []
for l in lines:
    for k, v in l.items():
        if k == "step" or not isinstance(v, (int, float)):
            continue
        got = [e.value for e in acc.Scalars("train/" + k) if e.step == l["step"]]
        if len(got) != 1 or abs(got[0] - v) > 1e-6 * max(1, abs(v)):
            bad.append((k, l["step"], got, v))
hist_steps = {t: [h.step for h in acc.Histograms(t)] for t in tags["histograms"]}
img_steps = [i.step for i in acc.Images("samples")]
print("scalar tags", len(tags["scalars"]), "metrics lines", len(lines), "mismatches", len(bad), bad[:3])
print("histogram tags", len(hist_steps), "steps", sorted(set(map(tuple, hist_steps.values()))))
peak = [e.value for e in acc.Scalars("train/peak_memory_gib")][-1:] if "train/peak_memory_gib" in tags["scalars"] else "none"
print("images at", img_steps, "peak memory scalar", peak)
grad_tags = [t for t in tags["scalars"] if t.startswith("grad_norm/")]
flow = os.path.exists(os.path.join(run, "gradient_flow.svg"))
print("per-module gradient-norm tags", len(grad_tags), "points each", len(acc.Scalars(grad_tags[0])) if grad_tags else 0,
      "gradient_flow.svg", flow)
ok = grad_tags and flow and not bad and len(lines) >= 11 and hist_steps and all(s == [200, 400, 600] for s in hist_steps.values()) and img_steps == [300, 600]
print("TENSORBOARD READBACK", "PASS" if ok else "FAIL")
PYEOF

for i in 1 2; do
  for tb in true false; do
    $BIN train --data-path "$FMNIST" --runs-dir "$RUNS" --run-name "tb-$tb-$i" --steps 1000 --set log.every=50 \
      --set log.tensorboard=$tb > "$OUT/train-tb-$tb-$i.log" 2>&1 || echo "FAIL: run tb-$tb-$i"
    cp "$RUNS/tb-$tb-$i/metrics.jsonl" "$OUT/metrics-tb-$tb-$i.jsonl" 2>/dev/null
  done
done
"$PY" - "$RUNS" <<'PYEOF'
import json, statistics, sys
for name in ("tb-true-1", "tb-false-1", "tb-true-2", "tb-false-2"):
    ips = [json.loads(l)["images_per_s"] for l in open(f"{sys.argv[1]}/{name}/metrics.jsonl") if json.loads(l)["step"] > 200]
    print(f"{name}: images/s median {statistics.median(ips):.1f} mean {statistics.mean(ips):.1f} over {len(ips)} windows")
PYEOF

#!/usr/bin/env bash
# A training campaign's pieces on the GPU (docs/guide/training.md), for
#   MODE=script SCRIPT=bench/campaign_costs_gpu.sh tools/gpu_run.sh
# which exports BIN, FMNIST, RUNS, OUT and PY. DiT-S/2 on Fashion-MNIST (the default GPU run), after the feature
# network is trained once (`perftrain eval --train-features`):
#  (a) a run with train.lr_schedule = cosine (COSINE_STEPS, default 4000, 200 warm-up steps) and eval.every =
#      COSINE_EVAL_EVERY (default 500, 1000 samples each): its eval lines as a table (the metric should fall), its
#      metrics.jsonl and TensorBoard events in $OUT/campaign-cosine.tgz;
#  (b) COST_STEPS (default 400) steps each of: batch 256, 128 x train.accumulate 2, 64 x 4 (the same global
#      batch), and batch 256 with eval.every = COST_EVAL_EVERY (default 100): the step time from the trainer's own
#      metrics.jsonl windows (median of steps_per_s after the first two windows, which hold the capture and
#      tuning), and the wall time of the whole process with and without evaluation, per evaluation, against the
#      eval_s the trainer logs.
# The tables go to $OUT/campaign.md and are printed last; every run's log and metrics to $OUT/campaign-logs.tgz.
# Estimated at about 5 minutes on an H200 (a DiT-S/2 b256 step ~26-28 ms, docs/PERFORMANCE.md).
set -uo pipefail
COSINE_STEPS="${COSINE_STEPS:-4000}"
COSINE_EVAL_EVERY="${COSINE_EVAL_EVERY:-500}"
COST_STEPS="${COST_STEPS:-400}"
COST_EVAL_EVERY="${COST_EVAL_EVERY:-100}"
# shellcheck source=bench/script_steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_steps.sh"
workdir campaign

# train NAME FLAGS...: a run of the default GPU config into $W/NAME.
train() {
  local name="$1"
  shift
  step "train $name" "train-$name.log" "$BIN" train --data-path "$FMNIST" --runs-dir "$W" --run-name "$name" \
    --set log.sample_every=0 --set log.checkpoint_every=0 "$@"
}

evaluating=(--set eval.features="$FEATURES" --set eval.samples=1000)
train_features
train cosine --steps "$COSINE_STEPS" --set train.lr_schedule=cosine --set train.warmup_steps=200 \
  --set log.every=100 --set eval.every="$COSINE_EVAL_EVERY" "${evaluating[@]}"
tar czf "$OUT/campaign-cosine.tgz" -C "$W/cosine" metrics.jsonl tb 2>/dev/null || echo "FAILED: no cosine run to pack"

cost=(--steps "$COST_STEPS" --set log.every=20)
train accumulate1 "${cost[@]}" --batch-size 256
train accumulate2 "${cost[@]}" --batch-size 128 --set train.accumulate=2
train accumulate4 "${cost[@]}" --batch-size 64 --set train.accumulate=4
train eval-every "${cost[@]}" --batch-size 256 --set eval.every="$COST_EVAL_EVERY" "${evaluating[@]}"

"$PY" - "$W" "$COST_STEPS" <<'EOF' | tee "$OUT/campaign.md"
import json, os, statistics, sys
w, cost_steps = sys.argv[1], sys.argv[2]
status = {}
if os.path.exists(os.path.join(w, "logs", "status.jsonl")):
    for line in open(os.path.join(w, "logs", "status.jsonl")):
        r = json.loads(line)
        status[r["name"]] = r

def lines(run):
    try:
        return [json.loads(l) for l in open(os.path.join(w, run, "metrics.jsonl")) if l.strip()]
    except (OSError, ValueError):
        return []

def failed(run):
    r = status.get(f"train {run}")
    return "not run" if r is None else (f"failed (rc {r['rc']})" if r["rc"] != 0 else "")

def config(run):
    """The run's config.toml as {key: text} (keys are unique enough here: name is model.name, the first)."""
    out = {}
    try:
        for l in open(os.path.join(w, run, "config.toml")):
            key, sep, value = l.partition("=")
            if sep and key.strip() not in out:
                out[key.strip()] = value.strip().strip("'")
    except OSError:
        pass
    return out

print(f"## (a) {config('cosine').get('name', '?')}, cosine schedule with eval.every: the feature-network "
      "metrics during training")
print()
rows = lines("cosine")
lr = {r["step"]: r["lr"] for r in rows if "lr" in r}
evals = [r for r in rows if "eval" in r]
print("| step | lr | fd_features | class_consistency | eval_s |")
print("|---:|---:|---:|---:|---:|")
for r in evals:
    near = max((s for s in lr if s <= r["step"]), default=None)  # the logging window's lr at or before it
    lr_text = f"{lr[near]:.3g}" if near else "n/a"
    print(f"| {r['step']} | {lr_text} | {r['eval'].get('fd_features', float('nan')):.4f} | "
          f"{r['eval'].get('class_consistency', float('nan')):.4f} | {r['eval_s']:.2f} |")
if len(evals) >= 2:
    fd = [r["eval"]["fd_features"] for r in evals]
    print(f"\nfd_features {fd[0]:.4f} at step {evals[0]['step']} -> {fd[-1]:.4f} at step {evals[-1]['step']}: "
          f"{'falling' if fd[-1] < fd[0] else 'NOT falling'}")
else:
    print(f"\nno evaluations to compare ({failed('cosine') or 'fewer than two eval lines'})")

def step_ms(run):
    """Median step time over the windows after the first two (capture, tuning), in ms; images/s."""
    windows = [r for r in lines(run) if "steps_per_s" in r][2:]
    if not windows:
        return None, None
    return 1000.0 / statistics.median(r["steps_per_s"] for r in windows), statistics.median(
        r["images_per_s"] for r in windows)

model = config("accumulate1").get("name", "?")
print(f"\n## (b) the cost of accumulation and of in-loop evaluation ({cost_steps} steps each, {model})")
print()
print("| run | global batch | micro-batch x accumulate | ms per step | images/s | vs accumulate 1 | note |")
print("|---|---:|---|---:|---:|---:|---|")
base, _ = step_ms("accumulate1")
for run in ("accumulate1", "accumulate2", "accumulate4", "eval-every"):
    c = config(run)
    shape = ([str(int(c["batch_size"]) * int(c["accumulate"])), f"{c['batch_size']} x {c['accumulate']}"]
             if "batch_size" in c and "accumulate" in c else ["n/a"] * 2)
    ms, ips = step_ms(run)
    cells = [f"{ms:.2f}", f"{ips:.0f}", f"{ms / base:.3f}x" if base else "n/a"] if ms else ["n/a"] * 3
    note = failed(run) or ("" if ms else "no timed windows")
    print(f"| {run} | " + " | ".join(shape + cells) + f" | {note} |")
evals = [r for r in lines("eval-every") if "eval" in r]
wall_with, wall_without = status.get("train eval-every"), status.get("train accumulate1")
print()
print("| evaluations | mean eval_s (trainer) | wall s with | wall s without | extra wall s per evaluation |")
print("|---:|---:|---:|---:|---:|")
if evals and wall_with and wall_without:
    extra = (wall_with["seconds"] - wall_without["seconds"]) / len(evals)
    print(f"| {len(evals)} | {statistics.mean(r['eval_s'] for r in evals):.2f} | {wall_with['seconds']:.1f} | "
          f"{wall_without['seconds']:.1f} | {extra:.2f} |")
else:
    print(f"| {len(evals)} | n/a | n/a | n/a | n/a |")
EOF
tar czf "$OUT/campaign-logs.tgz" -C "$W" --exclude='*.safetensors' --exclude=ckpt --exclude=tb . 2>/dev/null

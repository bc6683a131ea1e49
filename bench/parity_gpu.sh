#!/usr/bin/env bash
# Parity with plain PyTorch (docs/guide/training.md, "Parity with plain PyTorch"), for
#   MODE=script SCRIPT=bench/parity_gpu.sh tools/gpu_run.sh
# which exports BIN, FMNIST, RUNS, OUT and PY. For each seed of PARITY_SEEDS (default "0 1 2") one resolved
# config (`perftrain config`: the default GPU run, DiT-S/2 on Fashion-MNIST, PARITY_STEPS steps, default 800)
# is trained by both sides, perftrain (`perftrain train --config`) and plain PyTorch
# (bench/reference_train.py train --config, the same recipe and data order), and both EMA weights are evaluated
# by `perftrain eval` alike: the feature network trained once here (--train-features), PARITY_SAMPLES samples
# (default 2000) with the run's sampler and guidance, noise seed 0 for every model. Prints a markdown table
# (mean +- std over the seeds per side, then every run) after each seed, so a run cut short still reports;
# the table is also $OUT/parity.md (with each perftrain run's loss curve against the band of the reference
# runs', tools/compare_curves.py), the logs and metrics go to $OUT/parity-logs.tgz. PARITY_ARGS: more
# `perftrain config` flags for both sides (e.g. "--model DiT-B/2" or "--set train.lr_schedule=cosine").
# Time on an H200: perftrain's DiT-S/2 b256 step ~26-28 ms (docs/PERFORMANCE.md), plain eager PyTorch's about 2.5x
# that (estimated); with start-up and evaluation about 7 minutes at the defaults, under gpu_run.sh's 540 s.
# shellcheck disable=SC2086  # PARITY_ARGS splits on purpose
set -uo pipefail
STEPS="${PARITY_STEPS:-800}"
SEEDS="${PARITY_SEEDS:-0 1 2}"
SAMPLES="${PARITY_SAMPLES:-2000}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
t_start=$(date +%s)
# shellcheck source=bench/script_steps.sh
source "$HERE/script_steps.sh"
workdir parity

table() {
  "$PY" - "$W" "$LOGS/status.jsonl" "$STEPS" "$SAMPLES" "$SEEDS" <<'EOF'
import json, math, os, statistics, sys
w, status_path, steps, samples, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].split()
status = {}
if os.path.exists(status_path):
    for line in open(status_path):
        r = json.loads(line)
        status[r["name"]] = r
metric_names = ["fd_features", "class_consistency"]

def last_loss(path):
    try:
        rows = [json.loads(l) for l in open(path) if l.strip()]
        rows = [r for r in rows if "loss" in r]
        return rows[-1]["loss"] if rows else None
    except (OSError, ValueError):
        return None

def run(side, seed):
    ev = os.path.join(w, f"eval-{side}-seed{seed}.json")
    metrics_file = (os.path.join(w, f"perftrain-seed{seed}", "metrics.jsonl") if side == "perftrain"
                    else os.path.join(w, f"reference-seed{seed}-metrics.jsonl"))
    out = {"loss": last_loss(metrics_file)}
    try:
        out.update(json.load(open(ev))["metrics"])
    except (OSError, ValueError, KeyError):
        pass
    t = status.get(f"train {side} seed {seed}")
    out["train_s"] = t["seconds"] if t else None
    failed = [n for n, r in status.items() if r["rc"] != 0 and n.endswith(f"{side} seed {seed}")]
    out["note"] = "; ".join(f"{n.split()[0]} failed (rc {status[n]['rc']})" for n in failed)
    if t is None and not failed:
        out["note"] = "not run"
    return out

def fmt(v, digits=4):
    return "n/a" if v is None else f"{v:.{digits}f}"

def mean_std(values):
    v = [x for x in values if x is not None]
    if not v:
        return "n/a"
    m = sum(v) / len(v)
    s = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else float("nan")
    return f"{m:.4f} ± {s:.4f} (n={len(v)})"

def model_name():
    for s in seeds:  # config.toml's first `name = '...'` is model.name
        try:
            return next(l.split("=", 1)[1].strip().strip("'\"") for l in open(os.path.join(w, f"seed{s}.toml"))
                        if l.startswith("name ="))
        except (OSError, StopIteration):
            pass
    return "?"

runs = {(side, s): run(side, s) for side in ("perftrain", "reference") for s in seeds}
print(f"## Parity: {model_name()} on Fashion-MNIST, {steps} steps, seeds {' '.join(seeds)}; "
      f"perftrain eval, {samples} samples each")
print()
print("| side | fd_features (lower) | class_consistency (higher) | last logged loss |")
print("|---|---:|---:|---:|")
for side in ("perftrain", "reference"):
    cells = [mean_std([runs[(side, s)].get(k) for s in seeds]) for k in metric_names + ["loss"]]
    print(f"| {side} | " + " | ".join(cells) + " |")
print()
# perftrain - reference per metric, against the standard error of that difference from the seeds' spread
# (with three seeds a side, equal trainers come out worse by more than twice it in roughly 5-10% of runs).
for k, better in (("fd_features", -1), ("class_consistency", 1)):
    p, r = ([runs[(side, s)].get(k) for s in seeds if runs[(side, s)].get(k) is not None]
            for side in ("perftrain", "reference"))
    if len(p) < 2 or len(r) < 2:
        print(f"{k}: too few runs for a spread")
        continue
    diff = sum(p) / len(p) - sum(r) / len(r)
    se = math.sqrt(statistics.variance(p) / len(p) + statistics.variance(r) / len(r))
    worse = better * diff < -2 * se
    print(f"{k}: perftrain - reference = {diff:+.4f} (standard error {se:.4f}): "
          f"{'perftrain WORSE by more than twice that' if worse else 'perftrain not worse by more than twice that'}")
print()
print("| side | seed | fd_features | class_consistency | last logged loss | train s | note |")
print("|---|---:|---:|---:|---:|---:|---|")
for (side, s), r in runs.items():
    print(f"| {side} | {s} | {fmt(r.get('fd_features'))} | {fmt(r.get('class_consistency'))} | "
          f"{fmt(r.get('loss'))} | {fmt(r.get('train_s'), 0)} | {r['note']} |")
EOF
}

# Each perftrain run's loss curve against the band of the reference runs' (tools/compare_curves.py, whose
# "fp32 runs" are the references here: with three or more, whether perftrain's is no more an outlier among them
# than one of them is), from two reference runs on.
curves() {
  local refs=() seed
  for seed in $SEEDS; do
    [ -s "$W/reference-seed$seed-metrics.jsonl" ] && refs+=("$W/reference-seed$seed-metrics.jsonl")
  done
  [ ${#refs[@]} -lt 2 ] && return
  echo
  for seed in $SEEDS; do
    [ -s "$W/perftrain-seed$seed/metrics.jsonl" ] || continue
    "$PY" "$HERE/../tools/compare_curves.py" "$W/perftrain-seed$seed/metrics.jsonl" "${refs[@]}" \
      > "$LOGS/curve-perftrain-seed$seed.txt" 2>&1
    echo "loss curve of perftrain seed $seed against the ${#refs[@]} reference runs:" \
      "$(tail -n 1 "$LOGS/curve-perftrain-seed$seed.txt")"
  done
}

report() {
  { table; curves; } | tee "$OUT/parity.md"
  tar czf "$OUT/parity-logs.tgz" -C "$W" --exclude='*.safetensors' --exclude=ckpt --exclude=tb . 2>/dev/null
  echo "== parity: $(( $(date +%s) - t_start )) s so far"
}

# The resolved config of seed $1 into $2.
write_config() {
  "$BIN" config --data-path "$FMNIST" --steps "$STEPS" --seed "$1" --runs-dir "$W" --run-name "perftrain-seed$1" \
    --set log.sample_every=0 --set log.checkpoint_every=0 ${PARITY_ARGS:-} > "$2"
}

train_features
for seed in $SEEDS; do
  cfg="$W/seed$seed.toml"
  # One resolved config for both sides: the GPU defaults with the data path, steps and seed; sample grids and
  # checkpoints only at the end.
  step "config seed $seed" "config-seed$seed.log" write_config "$seed" "$cfg" || continue
  step "train perftrain seed $seed" "train-perftrain-seed$seed.log" "$BIN" train --config "$cfg" &&
    step "eval perftrain seed $seed" "eval-perftrain-seed$seed.log" "$BIN" eval --ckpt "$W/perftrain-seed$seed" \
      --features "$FEATURES" --samples "$SAMPLES" --batch-size 500 --out "$W/eval-perftrain-seed$seed.json"
  step "train reference seed $seed" "train-reference-seed$seed.log" "$PY" "$HERE/reference_train.py" train \
      --config "$cfg" --out "$W/reference-seed$seed.safetensors" --metrics "$W/reference-seed$seed-metrics.jsonl" &&
    step "eval reference seed $seed" "eval-reference-seed$seed.log" "$BIN" eval \
      --ckpt "$W/reference-seed$seed.safetensors" --features "$FEATURES" --samples "$SAMPLES" --batch-size 500 \
      --out "$W/eval-reference-seed$seed.json"
  report
done

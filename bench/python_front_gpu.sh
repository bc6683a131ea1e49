#!/usr/bin/env bash
# perftrain from Python (issue 37's targets) against plain PyTorch, torch.compile and the C++ trainer,
# side by side in one call, for
#   MODE=script SCRIPT=bench/python_front_gpu.sh tools/gpu_run.sh
# which builds (the package perftrain lands in the build's python/ folder), then exports BIN, OUT, RUNS
# and PY. Each case is examples/train_dit.py (DiT's training loop shape: AdamW, EMA every step, bf16
# autocast, DDPM noise prediction on 32x32x4 synthetic latents) in its own process, batch BATCH (default 256;
# 128 fits DiT-XL/2's torch.compile cases on an 80 GB card):
#   plain             the loop as DiT writes it (fused torch AdamW, a foreach EMA)
#   compile           torch.compile(model), default mode
#   reduce-overhead   torch.compile(model, mode="reduce-overhead")
#   perftrain         --perftrain: perftrain.nn's DiT, DeviceAdamW (EMA inside), capture_step
#   perftrain+compile --perftrain --compile default: torch.compile(fullgraph=True) on perftrain's modules
#   C++ trainer       $BIN bench --variants all --ema (the same model, batch, EMA and optimizer)
#   first-step        the perftrain case with its first step under torch.profiler: front-<model>-first-step.txt,
#                     its host calls by total time (where the first step's seconds go; not in the table)
# for MODELS (default DiT-B/2 and DiT-XL/2). Cases run cheapest first for both models, the slow compiles
# last; a case past its own timeout, or one that would start after BUDGET seconds (default: gpu_run.sh's
# SCRIPT_TIMEOUT, 540, less 60 for the table), is a row saying so; CASES="perftrain+compile compile" (any
# subset of cpp perftrain first-step plain reduce-overhead perftrain+compile compile max-autotune, and the
# regional ones reduce-overhead-regional max-autotune-regional: each block compiled alone) runs those alone
# in a second call, into the same table when OUT is the same. max-autotune compiles for many minutes:
# bench/python_front_autotune_gpu.sh.
# Output: front-<model>-<case>.json, .out (stdout) and .log (stderr; these two also in front-logs.tgz), a "+" in
# a case's name written "-" (front-DiT-B-2-perftrain-compile.json); front-table.md (also printed).
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${RUNS:?}" "${PY:?}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHONPATH="$(cd "$(dirname "$BIN")" && pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
MODELS="${MODELS:-DiT-B/2 DiT-XL/2}"
BATCH="${BATCH:-256}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-8}"
BUDGET="${BUDGET:-$((${SCRIPT_TIMEOUT:-540} - 60))}"
START=$(date +%s)
status="$OUT/front-status.txt"
: > "$status"

slug() { echo "$1" | tr '/' '-'; }

# case name, time limit (s), model, train_dit.py flags...
py_case() {
  local name=$1 limit=$2 model=$3 file rc t0 left
  shift 3
  file="$OUT/front-$(slug "$model")-${name//+/-}"  # no "+" in a file name: the device tool does not bring it back
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 30 ]; then
    echo "{\"error\": \"not run: past the ${BUDGET} s budget\"}" > "$file.json"
    echo "$model $name skipped (budget)" | tee -a "$status"
    return
  fi
  [ "$limit" -lt "$left" ] || limit=$left
  t0=$(date +%s)
  timeout "$limit" "$PY" "$ROOT/examples/train_dit.py" --model "$model" --batch-size "$BATCH" --steps "$STEPS" \
    --warmup "$WARMUP" --json "$@" > "$file.out" 2> "$file.log"
  rc=$?
  tail -1 "$file.out" > "$file.json"
  [ $rc -eq 0 ] || echo "{\"error\": \"rc $rc after $(($(date +%s) - t0)) s (see $(basename "$file").log)\"}" > "$file.json"
  echo "$model $name rc $rc $(($(date +%s) - t0)) s" | tee -a "$status"
}

cpp_case() {  # model
  local model=$1 file rc t0
  file="$OUT/front-$(slug "$model")-cpp"
  t0=$(date +%s)
  timeout 120 "$BIN" bench --model "$model" --batch-size "$BATCH" --image-size 32 --variants all --ema \
    --steps "$STEPS" --warmup "$WARMUP" --out "$RUNS/front-$(slug "$model")" > "$file.log" 2>&1
  rc=$?
  cp "$RUNS/front-$(slug "$model")/bench.json" "$file.json" 2>/dev/null || echo "{\"error\": \"rc $rc\"}" > "$file.json"
  echo "$model cpp rc $rc $(($(date +%s) - t0)) s" | tee -a "$status"
}

run_case() {  # case, model
  case $1 in
    cpp) cpp_case "$2" ;;
    perftrain) py_case perftrain 90 "$2" --perftrain ;;
    first-step) py_case first-step 90 "$2" --perftrain --first-step-table "$OUT/front-$(slug "$2")-first-step.txt" ;;
    plain) py_case plain 90 "$2" ;;
    reduce-overhead) py_case reduce-overhead 200 "$2" --compile reduce-overhead ;;
    perftrain+compile) py_case perftrain+compile 200 "$2" --perftrain --compile default ;;
    compile) py_case compile 200 "$2" --compile default ;;
    max-autotune) py_case max-autotune 500 "$2" --compile max-autotune ;;
    reduce-overhead-regional) py_case reduce-overhead-regional 200 "$2" --compile reduce-overhead --compile-regions ;;
    max-autotune-regional) py_case max-autotune-regional 400 "$2" --compile max-autotune --compile-regions ;;
    *) echo "unknown case $1" | tee -a "$status" ;;
  esac
}

# Cases in order, each for every model: the quick ones (one process per model) first.
for c in ${CASES:-cpp perftrain plain reduce-overhead perftrain+compile compile}; do
  for m in $MODELS; do run_case "$c" "$m"; done
done

"$PY" - "$OUT" "$BATCH" $MODELS <<'PYEOF' | tee "$OUT/front-table.md"
import json, os, sys
out, batch, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cases = [("plain", "plain PyTorch (eager bf16)"), ("compile", "torch.compile default"),
         ("reduce-overhead", "torch.compile reduce-overhead"), ("max-autotune", "torch.compile max-autotune"),
         ("reduce-overhead-regional", "torch.compile reduce-overhead, each block"),
         ("max-autotune-regional", "torch.compile max-autotune, each block"),
         ("perftrain", "perftrain (nn + DeviceAdamW + capture_step)"),
         ("perftrain+compile", "perftrain + torch.compile(fullgraph)"), ("cpp", "C++ trainer (perftrain bench, all)")]

def load(model, case):
    try:
        with open(os.path.join(out, f"front-{model.replace('/', '-')}-{case.replace('+', '-')}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"error": "no result"}

def ms_of(case, j):
    if case == "cpp":
        rows = [r for r in j.get("rows", []) if r.get("variant") == "all"]
        return (rows[0].get("ms"), rows[0].get("first_step_s")) if rows else (None, None)
    return j.get("ms_median"), j.get("first_step_s")

for model in models:
    res = {c: load(model, c) for c, _ in cases}
    ms = {c: ms_of(c, j) for c, j in res.items()}
    compiled = [ms[c][0] for c in ("compile", "reduce-overhead", "max-autotune", "reduce-overhead-regional",
                                   "max-autotune-regional") if ms[c][0]]
    best = min(compiled) if compiled else None
    print(f"\n### {model}, batch {batch} (32x32x4 latents), ms per training step (median)\n")
    print("| case | ms/step | img/s | vs best torch.compile | vs C++ trainer | first step s | note |")
    print("|---|---|---|---|---|---|---|")
    for c, label in cases:
        m, first = ms[c]
        j = res[c]
        if j.get("error") == "no result" and c in ("max-autotune", "reduce-overhead-regional", "max-autotune-regional"):
            continue  # cases run only on request (CASES), not by default
        if m is None:
            print(f"| {label} | - | - | - | - | - | {j.get('error') or 'no result'} |")
            continue
        vs_best = f"{best / m:.2f}x" if best else "-"
        vs_cpp = f"{ms['cpp'][0] / m:.3f}x" if ms["cpp"][0] else "-"
        note = ""
        if c.startswith("perftrain"):
            note = "captured" if j.get("captured") else f"eager: {j.get('eager_reason')}"
        print(f"| {label} | {m:.2f} | {batch / m * 1e3:.0f} | {vs_best} | {vs_cpp} | "
              f"{first if first is not None else '-'} | {note} |")
PYEOF
tar czf "$OUT/front-logs.tgz" -C "$OUT" $(cd "$OUT" && ls front-*.log front-*.out 2>/dev/null) 2>/dev/null
exit 0

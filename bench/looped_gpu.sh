#!/usr/bin/env bash
# The looped DiT's step time on the GPU (issue 35's targets), side by side in one call, for
#   MODE=script SCRIPT=bench/looped_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT, RUNS and PY (this script builds nothing). About 4-5 minutes on an
# H200: batch 256 of 32x32x4 latents (256 px), the `all` variant (fused kernels, device optimizer, one
# CUDA graph), 20 timed steps after 6 warm-up, each case in its own process (a failure is a row):
#   DiT-B/2 against Looped-B/2 (2 prelude + 1 shared block x 8 + 2 coda: the same FLOPs);
#   Looped-B/2 with loops=1 (the fixed part: stem, prelude, coda, final layer, optimizer);
#   Looped-B/2 with LoRA rank 16 and 64 (attn, mlp) on every loop; route_capacity 0.5 (every loop);
#   LoRA 16 with route_capacity 0.5;
#   Looped-B/2 against bench/reference_looped.py (--against-torch; TORCH_MODES, default eager-bf16 and
#   reduce-overhead, the fastest compile mode so far: 1-2 minutes of compiling), last.
# Output: bench-looped-<case>.json (bench.json of each), bench-looped-table.md (the table, also printed),
# the bench logs in logs.tgz.
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${RUNS:?}" "${PY:?}"
common=(--batch 256 --image-size 32 --variants all --steps "${STEPS:-20}" --warmup "${WARMUP:-6}")
status="$OUT/looped-status.txt"
: > "$status"

bench_run() {  # case, time limit (s), model, more bench flags...
  local name=$1 limit=$2 model=$3 t0 rc
  shift 3
  t0=$(date +%s)
  timeout "$limit" "$BIN" bench --model "$model" "${common[@]}" --out "$RUNS/looped-$name" "$@" \
    > "$OUT/looped-$name.log" 2>&1
  rc=$?
  cp "$RUNS/looped-$name/bench.json" "$OUT/bench-looped-$name.json" 2>/dev/null
  echo "$name rc $rc $(($(date +%s) - t0)) s" | tee -a "$status"
  [ $rc -eq 0 ] || tail -5 "$OUT/looped-$name.log"
}

bench_run dit 90 DiT-B/2
bench_run looped 90 Looped-B/2
bench_run loops1 90 Looped-B/2 --set model.loops=1
bench_run lora16 90 Looped-B/2 --set model.lora_rank=16
bench_run lora64 90 Looped-B/2 --set model.lora_rank=64
bench_run route50 90 Looped-B/2 --set model.route_capacity=0.5
bench_run lora16-route50 90 Looped-B/2 --set model.lora_rank=16 --set model.route_capacity=0.5
bench_run torch 330 Looped-B/2 --against-torch --torch-modes "${TORCH_MODES:-eager-bf16,reduce-overhead}"

"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/bench-looped-table.md"
import json, os, sys
out = sys.argv[1]
cases = [("dit", "DiT-B/2"), ("looped", "Looped-B/2"), ("loops1", "Looped-B/2, loops 1"),
         ("lora16", "Looped-B/2, LoRA 16"), ("lora64", "Looped-B/2, LoRA 64"),
         ("route50", "Looped-B/2, capacity 0.5"), ("lora16-route50", "Looped-B/2, LoRA 16, capacity 0.5"),
         ("torch", "Looped-B/2 (with torch)")]

def load(name):
    try:
        with open(os.path.join(out, f"bench-looped-{name}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def ours(j):  # the `all` row
    for r in (j or {}).get("rows", []):
        if r.get("variant") == "all":
            return r
    return None

def f(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"

ms = {}
print("| case | ms/step | img/s | vs DiT-B/2 | TFLOP/s | peak GiB | first step s | note |")
print("|---|---|---|---|---|---|---|---|")
for name, label in cases:
    r = ours(load(name))
    if r is None or r.get("ms") is None:
        print(f"| {label} | - | - | - | - | - | - | {(r or {}).get('error') or 'no result (see looped-' + name + '.log)'} |")
        continue
    ms[name] = r["ms"]
    rel = f"{ms['dit'] / r['ms']:.3f}x" if "dit" in ms else "-"
    print(f"| {label} | {f(r['ms'], 2)} | {f(r.get('images_per_s'), 0)} | {rel} | {f(r.get('tflops'))} | "
          f"{f(r.get('peak_gib'), 2)} | {f(r.get('first_step_s'), 2)} | {r.get('graph_status') or ''} |")
torch_rows = (load("torch") or {}).get("torch", [])
for t in torch_rows:
    rel = f"{ms['dit'] / t['ms']:.3f}x" if "dit" in ms and t.get("ms") else "-"
    print(f"| torch {t.get('mode')} | {f(t.get('ms'), 2)} | {f(t.get('images_per_s'), 0)} | {rel} | "
          f"{f(t.get('tflops'))} | {f(t.get('peak_gib'), 2)} | {f(t.get('first_step_s'), 2)} | {t.get('error') or ''} |")

print()
def line(what, value, target):
    print(f"- {what}: {value} (target {target})")
if "looped" in ms and "dit" in ms:
    line("Looped-B/2 per image against DiT-B/2", f"{ms['dit'] / ms['looped']:.3f}x as fast", ">= 1x")
if "looped" in ms:
    for r, target in (("lora16", "<= +10%"), ("lora64", "none")):
        if r in ms:
            line(f"{r} step over no LoRA", f"{100 * (ms[r] / ms['looped'] - 1):+.1f}%", target)
if all(k in ms for k in ("looped", "loops1", "route50")):
    per_loop = (ms["looped"] - ms["loops1"]) / 7  # Looped-B/2 has 8 loops
    fixed = ms["loops1"] - per_loop
    cut = 1 - (ms["route50"] - fixed) / (ms["looped"] - fixed)
    line("capacity 0.5 cut of the looped part", f"{100 * cut:.1f}% (looped part {ms['looped'] - fixed:.2f} ms, "
         f"fixed part {fixed:.2f} ms from loops 1)", ">= 35%")
ok_torch = [t for t in torch_rows if t.get("ms")]
best = min((t for t in ok_torch if t.get("mode", "").startswith(("compile", "reduce"))), key=lambda t: t["ms"],
           default=None)
mine = ours(load("torch")) or {}
if best and mine.get("ms"):
    line(f"against torch {best['mode']} ({best['ms']:.2f} ms)", f"{best['ms'] / mine['ms']:.3f}x", ">= 1.2x")
    if best.get("peak_gib") and mine.get("peak_gib"):
        line("peak memory against torch.compile", f"{mine['peak_gib']:.2f} vs {best['peak_gib']:.2f} GiB", "no higher")
if mine.get("first_step_s"):
    line("first step", f"{mine['first_step_s']:.2f} s", "<= 3 s")
PYEOF

#!/usr/bin/env bash
# train.precision = fp8 (issue 39) on the GPU, for
#   MODE=script SCRIPT=bench/fp8_gpu.sh tools/gpu_run.sh
# which exports BIN, FMNIST, RUNS, OUT and PY. About 8 minutes on an H200:
#  1. every test named Fp8: the ops' GPU tests (casts, scaling, products against float64, captured = eager),
#     the step runner's (train's Fp8TrainGpu: the captured fp8 step trains like the eager one, fp8 near bf16,
#     widths not multiples of 16 fall back to bf16 and are named) and the CPU ones (training, resume, monitor);
#  2. DiT-S/2 on Fashion-MNIST, FP8_STEPS steps (default 1000) in bf16 and in fp8 from the same seed: the loss
#     at equal steps side by side (fp8.md), the fp8 run's scaling health (overflow / underflow totals from its
#     monitored steps) and which layers ran bf16 (its log);
#  3. perftrain bench DiT-B/2 b256 and DiT-XL/2 b256, variant all, bf16 then fp8: step time and images/s side
#     by side (bench-*.md/json), the fp8 one profiled (--profile: "fp8 casts and scaling" as a kind).
# PART=fused instead (about 3 minutes): only the fp8 tests (the norms' fused codes among them: Fp8Gpu.Norm*,
# Fp8Gpu.LinearOnNormCodes*, Fp8Gpu.GeluPrologues*, Fp8Gpu.LinearGelu*, Fp8Gpu.SwigluPrologues*, Fp8Gpu.LinearSwiglu*, Fp8Operand.*, Families/Fp8FamilyTest.FusedCasts*) and perftrain bench
# DiT-XL/2 b256 in fp8, profiled (the casts' share under "fp8 casts and scaling": attn.qkv's, mlp.fc1's and mlp.fc2's
# x casts are gone from it), after fp8_gemm_bench's qkv, fc1 and fc2 shapes (its "X from its norm", "X from GELU" and, at SS-XL/2 b128's down shape 36864 x 3072 -> 1152, "X from SwiGLU"
# lines: the unfused and fused ms).
# PART=gateup instead (about 3 minutes): the row-block fp8 tests (Fp8Linear.RowBlocks*, Fp8Gpu.RowBlocks*,
# Fp8SingleStream.*, Fp8Operand.AFusedNorm*) and perftrain bench SS-XL/2 b128 at 256 image tokens + 32 features
# of 1024 channels (gpu_run.sh's BENCH_SET=ss-256 case) in bf16 then fp8: ffn.gate_up's gate and up cast in
# place as the row blocks of one weight (no fp32 concatenation a step), the fp8 one profiled.
# PART=steps instead (a prebuilt perftrain suffices, no dataset): perftrain's own step on STEP_CASES (default
# DiT-B/2 b256, DiT-XL/2 b256, SS-XL/2 b128 at 256 + 32 tokens) in bf16 and fp8 (profiled), and in bf16 with each
# of STEP_SETS (e.g. "speed.attention=auto"): fp8's gain over perftrain's bf16 step, no torch.
# PART=anchor instead (its own call: two torch.compile runs of DiT-XL/2, minutes each): perftrain bench
# DiT-XL/2 b256 (ANCHOR_BATCH) in fp8 against torchao's float8 training under torch.compile (--torch-modes
# float8-tensorwise, float8-rowwise; torchao's wheel carried by tools/fill_carry.sh) and reduce-overhead, in one
# bench.json (ANCHOR_MODES: another list of torch modes).
# PART=quality instead (its own call): issue 39's quality check on Fashion-MNIST. QUALITY_MODEL (default
# DiT-S/2) for QUALITY_STEPS (2000) in each run of QUALITY_RUNS (default "fp8:0 bf16:0 bf16:1 bf16:2",
# precision:seed) at batch QUALITY_BATCH (default 256), each evaluated at its last step through the feature network
# trained first (QUALITY_SAMPLES, 1000: fd_features, class_consistency); then the fp8 seed-0 loss curve against the bf16 seeds' spread
# (tools/compare_curves.py --refs bf16) and the evaluations side by side (quality-<model>.md). About 5 minutes
# for DiT-S/2 on an H200; DiT-B/2's four runs at batch 256 take two calls (QUALITY_BATCH=128: one): QUALITY_RUNS
# splits them, and QUALITY_REFS_DIR (a carried folder of an earlier call's quality-*-metrics.jsonl) brings the
# first call's runs into the check.
set -uo pipefail
mkdir -p "$OUT/fp8"
STEPS="${FP8_STEPS:-1000}"
if [ "${PART:-}" = quality ]; then
  model="${QUALITY_MODEL:-DiT-S/2}"
  qsteps="${QUALITY_STEPS:-2000}"
  tag="${model//\//}"
  feats="$RUNS/fmnist-features.safetensors"
  mkdir -p "$RUNS"
  "$BIN" eval --train-features --features "$feats" --data-path "$FMNIST" > "$OUT/fp8/features.log" 2>&1
  tail -n 3 "$OUT/fp8/features.log"
  for run in ${QUALITY_RUNS:-fp8:0 bf16:0 bf16:1 bf16:2}; do
    p="${run%%:*}" seed="${run##*:}"
    name="quality-$tag-$p-seed$seed"
    "$BIN" train --data-path "$FMNIST" --model "$model" --steps "$qsteps" --precision "$p" --seed "$seed" \
      --batch-size "${QUALITY_BATCH:-256}" --run-name "$name" --runs-dir "$RUNS" --set log.every=50 --set log.checkpoint_every=0 \
      --set log.sample_every=0 --set eval.every="$qsteps" --set eval.samples="${QUALITY_SAMPLES:-1000}" --set eval.features="$feats" \
      > "$OUT/fp8/$name.log" 2>&1
    echo "$name: rc $?; $(grep -h 'first step done' "$OUT/fp8/$name.log")"
    cp "$RUNS/$name/metrics.jsonl" "$OUT/fp8/$name-metrics.jsonl" 2>/dev/null
  done
  metrics() {  # the metrics file of precision $1, seed $2: this call's, else QUALITY_REFS_DIR's
    local f="quality-$tag-$1-seed$2-metrics.jsonl"
    if [ -f "$OUT/fp8/$f" ]; then echo "$OUT/fp8/$f"; else echo "${QUALITY_REFS_DIR:-.}/$f"; fi
  }
  "$PY" tools/compare_curves.py --refs bf16 "$(metrics fp8 0)" "$(metrics bf16 0)" "$(metrics bf16 1)" \
    "$(metrics bf16 2)" | tail -n 4 | tee "$OUT/fp8/quality-$tag-curve.txt"
  "$PY" - "$(metrics fp8 0)" "$(metrics bf16 0)" "$(metrics bf16 1)" "$(metrics bf16 2)" <<'PYEOF' |
import json, os, sys
print("| run | last loss | fd_features | class_consistency | eval s |")
print("|---|---|---|---|---|")
for path in sys.argv[1:]:
    if not os.path.exists(path):
        print("| %s | missing | | | |" % os.path.basename(path))
        continue
    recs = [json.loads(l) for l in open(path) if l.strip()]
    loss = [r["loss"] for r in recs if "loss" in r]
    ev = [r for r in recs if "eval" in r]
    e = ev[-1]["eval"] if ev else {}
    print("| %s | %s | %s | %s | %s |" % (os.path.basename(path).replace("-metrics.jsonl", ""),
          "%.5f" % loss[-1] if loss else "", e.get("fd_features", ""), e.get("class_consistency", ""),
          "%.1f" % ev[-1]["eval_s"] if ev else ""))
PYEOF
    tee "$OUT/fp8/quality-$tag.md"
  exit 0
fi
if [ "${PART:-}" = gateup ]; then
  ctest --test-dir build-gpu -R 'RowBlocks|Fp8SingleStream|AFusedNorm' --output-on-failure 2>&1 | tail -n 30 |
    tee "$OUT/fp8/tests-gateup.log"
  for p in bf16 fp8; do
    name="bench-SSXL2-b128-l32-c32x1024-$p"
    extra=()
    [ "$p" = fp8 ] && extra=(--profile all)
    "$BIN" bench --model SS-XL/2 --batch-size 128 --image-size 32 --set model.cond_tokens=32 \
      --set model.cond_dim=1024 --variants all --precision "$p" --out "$RUNS/$name" "${extra[@]}" 2>&1 |
      tail -n 12 | tee "$OUT/fp8/$name.log"
    cp "$RUNS/$name/bench.md" "$OUT/fp8/$name.md" 2>/dev/null
    cp "$RUNS/$name/bench.json" "$OUT/fp8/$name.json" 2>/dev/null
    cp "$RUNS/$name"/*profile*.md "$OUT/fp8/" 2>/dev/null
  done
  grep -h "| all" "$OUT"/fp8/bench-SSXL2-*.md 2>/dev/null
  exit 0
fi
if [ "${PART:-}" = steps ]; then
  # perftrain's own step, no torch (a prebuilt perftrain suffices): each of STEP_CASES (MODEL:BATCH[:LATENT:
  # COND_TOKENS:COND_DIM]) in bf16 and in fp8 (profiled), and in bf16 with STEP_SETS (e.g. speed.attention=auto).
  for c in ${STEP_CASES:-DiT-B/2:256 DiT-XL/2:256 SS-XL/2:128:32:32:1024}; do
    IFS=: read -r m b l ct cd <<< "$c"
    flags=(--model "$m" --batch-size "$b" --variants all)
    [ -n "${l:-}" ] && flags+=(--image-size "$l")
    [ -n "${ct:-}" ] && flags+=(--set model.cond_tokens="$ct" --set model.cond_dim="$cd")
    runs=("bf16" "fp8")
    for s in ${STEP_SETS:-}; do runs+=("bf16,$s"); done
    for r in "${runs[@]}"; do
      p="${r%%,*}" set=()
      [ "$r" != "$p" ] && set=(--set "${r#*,}")
      name="bench-${m//\//}-b$b${l:+-l$l}-$p${set[1]:+-${set[1]#speed.}}"
      name="${name//=/-}"
      extra=()
      [ "$p" = fp8 ] && extra=(--profile all)
      "$BIN" bench "${flags[@]}" --precision "$p" "${set[@]}" --out "$RUNS/$name" "${extra[@]}" 2>&1 |
        tail -n 12 > "$OUT/fp8/$name.log"
      grep -E "^\S.* all " "$OUT/fp8/$name.log" | head -n 2 | sed "s|^|$name: |"
      cp "$RUNS/$name/bench.md" "$OUT/fp8/$name.md" 2>/dev/null
      cp "$RUNS/$name/bench.json" "$OUT/fp8/$name.json" 2>/dev/null
      for f in "$RUNS/$name"/*profile*.md; do [ -f "$f" ] && cp "$f" "$OUT/fp8/$name-$(basename "$f")"; done
    done
  done
  grep -h "| all" "$OUT"/fp8/bench-*.md 2>/dev/null
  exit 0
fi
if [ "${PART:-}" = anchor ]; then
  ab="${ANCHOR_BATCH:-256}"
  name=bench-DiTXL2-b$ab-fp8-torchao
  # The whole log as it is written, and a limit short of the script's: a torch mode that compiles past it
  # leaves the rows measured before it (each printed when done) and its own log in $OUT.
  limit=$((${SCRIPT_TIMEOUT:-540} - 30))
  timeout "$limit" "$BIN" bench --model DiT-XL/2 --batch-size "$ab" --variants all --precision fp8 --against-torch \
    --torch-modes "${ANCHOR_MODES:-float8-tensorwise,float8-rowwise,reduce-overhead}" --out "$RUNS/$name" \
    > "$OUT/fp8/$name.log" 2>&1
  rc=$?
  tail -n 16 "$OUT/fp8/$name.log"
  [ $rc -eq 0 ] || echo "$name: rc $rc (timeout is 124: stopped at $limit s; the rows above were measured)"
  cp "$RUNS/$name/bench.md" "$RUNS/$name/bench.json" "$RUNS/$name"/torch-*.log "$OUT/fp8/" 2>/dev/null
  exit 0
fi
if [ "${PART:-}" = fused ]; then
  ctest --test-dir build-gpu -R 'Fp8' --output-on-failure 2>&1 | tail -n 30 | tee "$OUT/fp8/tests.log"
  # X of qkv and fc1 from its norm: bf16 h + cast-transpose against the norm's codes + fp8_transpose.
  ./build-gpu/bench/kernels/fp8_gemm_bench 65536 1152 3456 65536 1152 4608 65536 4608 1152 36864 3072 1152 2>&1 | tee "$OUT/fp8/fp8_gemm_bench.log"
  xl=256  # about 80 GiB: b128 on a GPU of less than 100 GB (an H100)
  [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] && xl=128
  name=bench-DiTXL2-b$xl-fp8-fused
  "$BIN" bench --model DiT-XL/2 --batch-size "$xl" --variants all --precision fp8 --out "$RUNS/$name" --profile all \
    2>&1 | tail -n 12 | tee "$OUT/fp8/$name.log"
  cp "$RUNS/$name/bench.md" "$RUNS/$name/bench.json" "$OUT/fp8/" 2>/dev/null
  cp "$RUNS/$name"/*profile*.md "$OUT/fp8/" 2>/dev/null
  exit 0
fi
echo "== fp8 tests"
ctest --test-dir build-gpu -R 'Fp8' --output-on-failure 2>&1 | tail -n 30 | tee "$OUT/fp8/tests.log"

echo "== DiT-S/2 Fashion-MNIST, bf16 against fp8, $STEPS steps"
for p in bf16 fp8; do
  "$BIN" train --data-path "$FMNIST" --model DiT-S/2 --steps "$STEPS" --precision "$p" --seed 0 \
    --run-name "fmnist-$p" --runs-dir "$RUNS" --set log.every=50 --set log.checkpoint_every=0 \
    --set log.sample_every=0 --set health.monitor_every=50 > "$OUT/fp8/fmnist-$p.log" 2>&1
  tail -n 12 "$OUT/fp8/fmnist-$p.log"
  cp "$RUNS/fmnist-$p/metrics.jsonl" "$OUT/fp8/fmnist-$p-metrics.jsonl" 2>/dev/null
  cp "$RUNS/fmnist-$p/report.md" "$OUT/fp8/fmnist-$p-report.md" 2>/dev/null
done
"$PY" - "$OUT/fp8" <<'PYEOF' | tee "$OUT/fp8/fp8.md"
import json, sys, os
d = sys.argv[1]
def lines(p):
    path = os.path.join(d, "fmnist-%s-metrics.jsonl" % p)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
bf, f8 = lines("bf16"), lines("fp8")
by = {r["step"]: r for r in f8 if "loss" in r}
print("| step | bf16 loss | fp8 loss | fp8 images/s | bf16 images/s | fp8 overflows | fp8 underflows |")
print("|---|---|---|---|---|---|---|")
for r in bf:
    if "loss" not in r or r["step"] not in by: continue
    q = by[r["step"]]
    f = q.get("fp8", {})
    print("| %d | %.5f | %.5f | %.0f | %.0f | %s | %s |" % (r["step"], r["loss"], q["loss"], q.get("images_per_s", 0),
          r.get("images_per_s", 0), f.get("overflows", ""), f.get("underflows", "")))
PYEOF
grep -h "fp8 products" "$OUT/fp8/fmnist-fp8.log" | head -n 1

echo "== bench DiT-B/2 b256, DiT-XL/2 b256: bf16 and fp8"
for m in DiT-B/2 DiT-XL/2; do
  for p in bf16 fp8; do
    name="bench-${m//\//}-b256-$p"
    extra=()
    [ "$p" = fp8 ] && extra=(--profile all)
    "$BIN" bench --model "$m" --batch-size 256 --variants all --precision "$p" --out "$RUNS/$name" "${extra[@]}" \
      2>&1 | tail -n 12 | tee "$OUT/fp8/$name.log"
    cp "$RUNS/$name/bench.md" "$OUT/fp8/$name.md" 2>/dev/null
    cp "$RUNS/$name/bench.json" "$OUT/fp8/$name.json" 2>/dev/null
    cp "$RUNS/$name"/*profile*.md "$OUT/fp8/" 2>/dev/null
  done
done
echo "== fp8: bench rows (variant all)"
grep -h "| all" "$OUT"/fp8/bench-*.md 2>/dev/null

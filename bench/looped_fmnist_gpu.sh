#!/usr/bin/env bash
# The looped family trained and converted on the GPU (docs/guide/architectures.md, "Looped"), for
#   MODE=script SCRIPT=bench/looped_fmnist_gpu.sh tools/gpu_run.sh
# which exports BIN, FMNIST, RUNS, OUT and PY. A few minutes on an H200:
#  1. Looped-S/2 (2 prelude + 1 shared block x 8 + 2 coda) with LoRA rank 16 on every loop, from scratch on
#     Fashion-MNIST: the loss falls, a sample grid;
#  2. the same with routing at capacity 0.5 (aux loss logged);
#  3. DiT-S/2 trained on Fashion-MNIST, converted to Looped-S/2 at full rank (attn, mlp, adaLN, bias deltas):
#     samples before any further training; then converted at rank 16 and fine-tuned: the loss reported.
set -uo pipefail
mkdir -p "$OUT/looped"
STEPS="${LOOPED_STEPS:-3000}"
common=(--set log.every=100 --set log.checkpoint_every=0 --set log.sample_every=0 --runs-dir "$RUNS")
run() {  # name, then train flags
  local name="$1"; shift
  "$BIN" train --data-path "$FMNIST" --run-name "$name" "${common[@]}" "$@" 2>&1 | tail -n 25 | tee "$OUT/looped/$name.log"
  cp "$RUNS/$name/metrics.jsonl" "$OUT/looped/$name-metrics.jsonl" 2>/dev/null
  "$BIN" sample --ckpt "$RUNS/$name" --out "$OUT/looped/$name-samples.png" 2>&1 | tail -n 2
}
run looped-lora16 --model Looped-S/2 --steps "$STEPS" --set model.lora_rank=16
run looped-route50 --model Looped-S/2 --steps "$STEPS" --set model.lora_rank=16 --set model.route_capacity=0.5
run dit-s2 --model DiT-S/2 --steps "$STEPS"

# Full rank: every linear of the block (hidden 384 is the smallest side of each), bias deltas on.
"$BIN" convert "$RUNS/dit-s2" --to looped --out "$RUNS/looped-full" --set model.lora_rank=384 \
  --set model.lora_targets=attn,mlp,adaln 2>&1 | tail -n 30 | tee "$OUT/looped/convert-full.log"
"$BIN" sample --ckpt "$RUNS/looped-full/model.safetensors" --out "$OUT/looped/converted-full-samples.png" 2>&1 | tail -n 2
"$BIN" convert "$RUNS/dit-s2" --to looped --out "$RUNS/looped-r16" --set model.lora_rank=16 \
  --set model.lora_targets=attn,mlp,adaln 2>&1 | tail -n 30 | tee "$OUT/looped/convert-r16.log"
"$BIN" sample --ckpt "$RUNS/looped-r16/model.safetensors" --out "$OUT/looped/converted-r16-samples.png" 2>&1 | tail -n 2
run looped-r16-finetune --config "$RUNS/looped-r16/config.toml" --init-from "$RUNS/looped-r16/model.safetensors" --steps $((STEPS / 3))
echo "== looped: last logged loss per run"
for f in "$OUT"/looped/*-metrics.jsonl; do
  printf '%s: %s\n' "$(basename "$f" -metrics.jsonl)" "$(tail -n 1 "$f" | "$PY" -c 'import json,sys; r=json.loads(sys.stdin.read()); print({k: r[k] for k in ("step","loss","aux") if k in r})')"
done

#!/usr/bin/env bash
# The single-stream DiT on the GPU (docs/guide/architectures.md), for
#   MODE=script SCRIPT=bench/single_stream_gpu.sh tools/gpu_run.sh
# which exports BIN, FMNIST, RUNS, OUT and PY. About 3 minutes on an H200:
#  1. SS-S/2 on Fashion-MNIST with class tokens, 600 flow steps: loss falls, step captured, a sample grid;
#  2. SS-S/2 on latent shards with per-sample condition features (written here by Python, masked lengths), 300 steps;
#  3. step time of SS-B/2 at 256 and 1024 image tokens through the generic path in training (perftrain bench times it against torch: tools/gpu_run.sh MODE=bench BENCH_SET=ss-256 or ss-1024).
set -uo pipefail
mkdir -p "$OUT/ss"
common=(--set log.every=50 --set log.checkpoint_every=0 --set diffusion.objective=flow --set model.learn_sigma=false
        --set train.warmup_steps=50 --set train.lr=5e-4 --runs-dir "$RUNS")

"$BIN" train --model SS-S/2 --data-path "$FMNIST" --steps 600 --run-name ss-fmnist --set log.sample_every=0 \
  --set diffusion.sample_steps=25 "${common[@]}" 2>&1 | tee "$OUT/ss/fmnist.log"
cp "$RUNS/ss-fmnist/samples/step_00000600.png" "$OUT/ss/fmnist-samples.png"
cp "$RUNS/ss-fmnist/metrics.jsonl" "$OUT/ss/fmnist-metrics.jsonl"

# Latent shards with cond [N, 32, 64] (a fixed token sequence per class, lengths 1..32, random padding) + cond_len.
"$PY" - "$RUNS/ss-shards" <<'PYEOF'
import os, sys
import numpy as np
from safetensors.numpy import save_file
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
classes, Tc, Dc = 10, 32, 64
proto = rng.standard_normal((classes, Tc, Dc)).astype(np.float32)
h, w = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
for shard in range(2):
    n = 2048
    y = rng.integers(0, classes, n)
    pat = np.stack([np.sqrt(2) * np.sin(2 * np.pi * ((1 + c % 3) * h / 32 + (1 + c // 3 % 3) * w / 32) + 0.7 * c)
                    for c in range(classes)]).astype(np.float32)  # [classes, 32, 32]
    lat = 0.8 * pat[y][:, None].repeat(4, 1) + 0.6 * rng.standard_normal((n, 4, 32, 32)).astype(np.float32)
    cond_len = rng.integers(1, Tc + 1, n)
    cond = proto[y].copy()
    pad = np.arange(Tc)[None, :] >= cond_len[:, None]
    cond[pad] = rng.standard_normal((int(pad.sum()), Dc)).astype(np.float32)
    save_file({"latents": lat.astype(np.float16), "labels": y.astype(np.int64), "cond": cond.astype(np.float16),
               "cond_len": cond_len.astype(np.int32)}, f"{out}/shard_{shard}.safetensors")
print("wrote", out)
PYEOF
"$BIN" train --model SS-S/2 --data latents --data-path "$RUNS/ss-shards" --steps 300 --run-name ss-cond \
  --set model.image_size=32 --set model.in_channels=4 --set model.num_classes=10 --set model.cond_tokens=32 \
  --set model.cond_dim=64 --set diffusion.cfg_scale=1.0 --set log.sample_every=0 "${common[@]}" 2>&1 | tee "$OUT/ss/cond.log"
cp "$RUNS/ss-cond/metrics.jsonl" "$OUT/ss/cond-metrics.jsonl"

# Step time, generic path, bf16, captured: SS-B/2 at 32x32 latents (256 image + 32 condition tokens) and
# 64x64 (1024 + 128), batch 64 and 32, synthetic data with synthetic features.
for spec in "32 32 64" "64 128 32"; do
  set -- $spec
  "$BIN" train --model SS-B/2 --data synthetic --steps 120 --run-name "ss-b2-$1" --batch-size "$3" \
    --set model.image_size="$1" --set model.in_channels=4 --set model.num_classes=1000 --set model.cond_tokens="$2" \
    --set model.cond_dim=256 --set diffusion.cfg_scale=1.0 --set log.every=40 --set log.sample_every=0 \
    --set log.checkpoint_every=0 --set diffusion.sample_steps=2 --set log.sample_per_class=1 --set log.sample_classes=1 \
    --runs-dir "$RUNS" 2>&1 | tee "$OUT/ss/speed-$1.log"
done
grep -h '"step"' "$RUNS"/ss-b2-*/metrics.jsonl > "$OUT/ss/speed-metrics.jsonl"

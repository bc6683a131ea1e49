#!/usr/bin/env bash
# `perftrain extract` on the GPU with an SD-shaped VAE, for
#   MODE=script SCRIPT=bench/extract_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT, RUNS and PY (this script builds nothing). About 2 minutes on an H200:
#  1. diffusers (in PY) builds a randomly initialised AutoencoderKL of SD's shape (block_out_channels
#     128, 256, 512, 512; 2 layers per block; 32 groups) and writes it with save_pretrained (nothing is
#     downloaded), and 512 smooth random 288 x 256 PNGs in 2 class folders;
#  2. extract of them at 256 px in fp32 and in bf16, batch 64: the img/s of each (the last progress line);
#  3. the two runs' latents compared (bf16 against fp32: max and mean difference, and the latents' spread).
# Output: extract-gpu.md (the rows, also printed), the logs. The bf16 VAE against fp32 is also the GPU
# test train.VaeGpu.Bfloat16MatchesFloat32 (MODE=check).
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${RUNS:?}" "${PY:?}"
work="$RUNS/extract-gpu"
mkdir -p "$work"
table="$OUT/extract-gpu.md"
: > "$table"

"$PY" - "$work" <<'PY' > "$OUT/extract-gpu-setup.log" 2>&1
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np, torch
from PIL import Image
from diffusers import AutoencoderKL
work = sys.argv[1]
torch.manual_seed(0)
n = 4
vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
                    block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4,
                    norm_num_groups=32, sample_size=256).eval()
vae.save_pretrained(work + "/vae", safe_serialization=True)
rng = np.random.default_rng(0)
for c in range(2):
    os.makedirs(f"{work}/images/class{c}", exist_ok=True)
    for i in range(256):
        # smooth random images (a few blurred blobs), not white noise
        small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((288, 256), Image.BICUBIC).save(f"{work}/images/class{c}/{i:04d}.png")
print("wrote", work)
PY
echo "setup rc $?" | tee -a "$table"

for precision in fp32 bf16; do
  t0=$(date +%s)
  "$BIN" extract --data-path "$work/images" --vae "$work/vae" --out "$work/latents-$precision" --image-size 256 \
    --batch-size 64 --shard-size 256 --device cuda --precision "$precision" > "$OUT/extract-$precision.log" 2>&1
  rc=$?
  echo "| extract $precision | rc $rc, $(($(date +%s) - t0)) s | $(grep -o '[0-9.]* img/s' "$OUT/extract-$precision.log" | tail -1) |" | tee -a "$table"
done

"$PY" - "$work" <<'PY' 2>&1 | tee -a "$table"
import sys, glob
from safetensors.torch import load_file
work = sys.argv[1]
a = [load_file(f)["latents"] for f in sorted(glob.glob(work + "/latents-fp32/*.safetensors"))]
b = [load_file(f)["latents"] for f in sorted(glob.glob(work + "/latents-bf16/*.safetensors"))]
import torch
a, b = torch.cat(a), torch.cat(b)
d = (a - b).abs()
print(f"| bf16 vs fp32 latents | {a.shape[0]} latents {list(a.shape[1:])} | max |d| {d.max():.4g}, mean |d| {d.mean():.4g}, latent std {a.std():.4g} |")
PY

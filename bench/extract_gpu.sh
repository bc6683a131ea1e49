#!/usr/bin/env bash
# `perftrain extract` on the GPU with an SD-shaped VAE, for
#   MODE=script SCRIPT=bench/extract_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT, RUNS and PY (this script builds nothing). About 2 minutes on an H200:
#  1. a randomly initialised AutoencoderKL of SD's shape (block_out_channels 128, 256, 512, 512; 2 layers
#     per block; 32 groups) from bench/sd_vae_layout.json, written as
#     diffusers' save_pretrained does, and 512 smooth random 288 x 256 PNGs in 2 class folders;
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

"$PY" - "$work" "$(dirname "$0")/sd_vae_layout.json" <<'PY' > "$OUT/extract-gpu-setup.log" 2>&1
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import json
import numpy as np, torch
from PIL import Image
from safetensors.torch import save_file
work = sys.argv[1]
torch.manual_seed(0)
# SD's VAE layout (bench/sd_vae_layout.json: diffusers' config and tensor names and shapes, written from
# diffusers' AutoencoderKL of that config), randomly initialised: the GPU machine has no diffusers.
layout = json.load(open(sys.argv[2]))
state = {}
for name, shape in layout["tensors"]:
    if len(shape) > 1:  # conv and linear weights: variance-preserving
        fan_in = int(np.prod(shape[1:]))
        state[name] = torch.randn(shape) * fan_in ** -0.5
    elif name.endswith("weight"):  # norm scales
        state[name] = 1 + 0.1 * torch.randn(shape)
    else:
        state[name] = 0.02 * torch.randn(shape)
os.makedirs(work + "/vae", exist_ok=True)
save_file(state, work + "/vae/diffusion_pytorch_model.safetensors")
json.dump(layout["config"], open(work + "/vae/config.json", "w"), indent=1)
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

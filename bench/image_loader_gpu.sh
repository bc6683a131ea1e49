#!/usr/bin/env bash
# Whether decoding images keeps the GPU fed (issue 36: "decoding images is never the bottleneck"), for
#   MODE=script SCRIPT=bench/image_loader_gpu.sh tools/gpu_run.sh
# which builds, then exports BIN, OUT, RUNS and PY (this script builds nothing). About 3-4 minutes on an
# H200: 2560 JPEGs of 500x375 (ImageNet's typical size, made with Pillow) in 10 classes; DiT-S/8 in pixel
# space at 256x256 (1024 tokens), batch 256, 80 steps, for data.workers = 1, 4, 8 and 16 (and 8 with
# data.flip off: the flip's cost). Each run's last window (steps 41-80) gives images/s and data_wait_s
# (the seconds the step waited for a batch): with enough workers data_wait_s is about 0 and images/s is
# the step's own speed; too few, and images/s is the decoders' rate.
# WORKERS="2 8" runs those counts only; FLIP_OFF=0 leaves out the run without the flip.
# Output: image-loader-table.md (also printed), the runs' logs and metrics in image-loader-logs.tgz.
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${RUNS:?}" "${PY:?}"
imgs="$RUNS/image-loader-imgs"
"$PY" - "$imgs" <<'PY'
import os, sys
import numpy as np
from PIL import Image
root, rng = sys.argv[1], np.random.default_rng(0)
for c in range(10):
    os.makedirs(f"{root}/class{c}", exist_ok=True)
    base = rng.integers(0, 256, (375 // 8 + 1, 500 // 8 + 1, 3), dtype=np.uint8)
    big = np.kron(base, np.ones((8, 8, 1), np.uint8))[:375, :500]
    for i in range(256):  # blocks with noise: JPEG sizes like photographs'
        noisy = np.clip(big.astype(int) + rng.integers(-30, 31, big.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(f"{root}/class{c}/{i}.jpg", quality=90)
PY
table="$OUT/image-loader-table.md"
printf '| data.workers | data.flip | images/s | data_wait_s (40 steps) | rc |\n|---|---|---|---|---|\n' > "$table"
run() {  # workers, flip
  local name="w$1-flip$2" rc
  timeout 150 "$BIN" train --data images --data-path "$imgs" --image-size 256 --model DiT-S/8 \
    --set model.in_channels=3 --set model.num_classes=10 --batch-size 256 --steps 80 \
    --set log.every=40 --set log.sample_every=0 --set log.checkpoint_every=0 --set data.workers="$1" \
    --set data.flip="$2" --runs-dir "$RUNS" --run-name "image-loader-$name" > "$OUT/image-loader-$name.log" 2>&1
  rc=$?
  "$PY" - "$RUNS/image-loader-$name/metrics.jsonl" "$1" "$2" "$rc" >> "$table" <<'PY'
import json, sys
path, workers, flip, rc = sys.argv[1:]
try:
    last = [json.loads(l) for l in open(path) if l.strip()][-1]
    print(f"| {workers} | {flip} | {last['images_per_s']:.0f} | {last['data_wait_s']:.2f} | {rc} |")
except (OSError, IndexError, KeyError, ValueError):
    print(f"| {workers} | {flip} | - | - | {rc} |")
PY
}
for w in ${WORKERS:-1 4 8 16}; do run "$w" true; done
[ "${FLIP_OFF:-1}" = 1 ] && run 8 false
cat "$table"
tar czf "$OUT/image-loader-logs.tgz" -C "$RUNS" $(cd "$RUNS" && ls -d image-loader-w* 2>/dev/null) -C "$OUT" \
  $(cd "$OUT" && ls image-loader-*.log 2>/dev/null) 2>/dev/null

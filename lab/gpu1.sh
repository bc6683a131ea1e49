#!/usr/bin/env bash
# first looped GPU pass: bench then the Fashion-MNIST runs
set -uo pipefail
CONVERT_LOOPED=convert-looped LOOPED_STEPS=2000 bash bench/looped_fmnist_gpu.sh 2>&1 | tail -n 80 > "$OUT/fmnist.log"
bash bench/looped_gpu.sh

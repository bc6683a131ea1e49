#!/usr/bin/env bash
# first looped GPU pass: the bench table
set -uo pipefail
bash bench/looped_gpu.sh

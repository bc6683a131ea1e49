#!/usr/bin/env bash
# Everything a fresh Debian 12 machine (as root) needs to build perftrain:
# the system libraries from Debian's archive, PyTorch 2.11 (libtorch) in a
# virtual environment .venv, then configure and build into build/.
# On a machine that already has PyTorch 2.x with CUDA, that one is used.
# Needs the CUDA toolkit (nvcc, 13.x) on the machine: libtorch's CMake files
# look for it even where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    build-essential cmake ninja-build python3 python3-venv python3-pip python3-dev \
    libgtest-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libstb-dev zlib1g-dev libgloo-dev \
    dataset-fashion-mnist graphviz >/dev/null
fi

has_cuda_torch() {
  "$1" -c 'import sys, torch; sys.exit(0 if torch.__version__.startswith("2.") and torch.cuda.is_available() else 1)' \
    2>/dev/null
}
if [ -n "${PERFTRAIN_PYTHON:-}" ]; then
  PY="$PERFTRAIN_PYTHON"
elif has_cuda_torch python3; then
  PY="$(command -v python3)"
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check \
    torch==2.11.0 numpy==2.4.6 safetensors==0.8.0 tensorboard==2.21.0 diffusers==0.42.1 \
    torchvision==0.26.0 scipy==1.17.1 pytorch-fid==0.3.0 scikit-build-core==1.1.2 torchao==0.18.0
  PY="$PWD/.venv/bin/python"
fi
# pip install . builds the Python package with scikit-build-core (offline:
# --no-build-isolation takes it from beside torch).
"$PY" -c 'import scikit_build_core' 2>/dev/null ||
  "$PY" -m pip install -q --disable-pip-version-check scikit-build-core==1.1.2

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERFTRAIN_PYTHON="$PY" >/dev/null
cmake --build build
# The Python package as pip builds it (pyproject.toml), from this same build
# folder, so nothing compiles again: build/wheel/perftrain-*.whl, which
# ctest's python.ops.wheel installs and imports.
rm -rf build/wheel
"$PY" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w build/wheel .

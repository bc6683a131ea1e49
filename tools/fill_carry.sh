#!/usr/bin/env bash
# Fills .carry/ (ignored by git) with what the GPU machine lacks and the build
# or the main job needs: header-only libraries, GoogleTest's sources, zlib's
# headers, gloo's headers (libtorch has gloo's code, not its headers), and
# Fashion-MNIST (training and test files). Run here, then name .carry in
# the device call's carry list; tools/gpu_run.sh uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/include/stb .carry/fashion-mnist
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/toml++ .carry/include/
cp /usr/include/stb/stb_image_write.h /usr/include/stb/stb_image.h .carry/include/stb/
cp /usr/include/zlib.h /usr/include/zconf.h .carry/include/
cp -r /usr/include/gloo .carry/include/  # c10d's ProcessGroupGloo.hpp includes them (src/dist)
cp -r /usr/src/googletest .carry/googletest
cp /usr/share/datasets/fashion-mnist/*.gz .carry/fashion-mnist/  # the test set too: eval --train-features reports its accuracy
du -sh .carry

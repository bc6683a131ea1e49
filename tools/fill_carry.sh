#!/usr/bin/env bash
# Fills .carry/ (ignored by git) with what the GPU machine lacks and the build
# or the main job needs: header-only libraries, GoogleTest's sources, zlib's
# headers, gloo's headers (libtorch has gloo's code, not its headers), and
# Fashion-MNIST (training and test files), torchao's wheel. Run here, then name .carry in
# the device call's carry list; tools/gpu_run.sh uses it.
#
#   tools/fill_carry.sh [--prebuilt] [INDUCTOR_CACHE_TGZ]
#
# --prebuilt: the perftrain built here (build/, brought up to date first; the
# kernels are built for sm_90a here as there), stripped and xz-packed into
# .carry/prebuilt/ with the commit it reports, instead of the dataset (the
# carry's 64 MiB hold the program or the data, not both; GoogleTest stays, for
# the build gpu_run.sh falls back to). gpu_run.sh then skips its 3-4 minute build when a call builds only
# perftrain (BUILD_TARGETS=perftrain) at that COMMIT: for bench and profile
# calls, whose BENCH_SET runs do not fit in one call beside a build.
#
# INDUCTOR_CACHE_TGZ: an inductor-cache.tgz that a call with INDUCTOR_CACHE_OUT=1
# brought back (torch.compile's caches); copied to .carry/inductor-cache.tgz,
# which gpu_run.sh unpacks before its runs, so that torch.compile finds what
# that call compiled. The carry travels with the working tree, 64 MiB in all:
# the rest of .carry takes about 37 MiB, so a cache of more than about 25 MiB
# does not fit (this script says so; carry a smaller case's cache, or a call
# with fewer modes).
set -euo pipefail
cd "$(dirname "$0")/.."
prebuilt=0
[ "${1:-}" = --prebuilt ] && { prebuilt=1; shift; }
cache="${1:-}"
if [ -n "$cache" ] && [ ! -f "$cache" ]; then echo "fill_carry.sh: no file $cache" >&2; exit 2; fi
# The prebuilt program names its commit (--version, bench.json): checked before .carry is touched.
if [ "$prebuilt" = 1 ] && ! git diff --quiet HEAD -- src cmake CMakeLists.txt; then
  echo "fill_carry.sh --prebuilt: src/ or the CMake files differ from HEAD; commit first (the program names its commit)" >&2
  exit 2
fi
rm -rf .carry && mkdir -p .carry/include/stb .carry/fashion-mnist
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/toml++ .carry/include/
cp /usr/include/stb/stb_image_write.h /usr/include/stb/stb_image.h .carry/include/stb/
cp /usr/include/zlib.h /usr/include/zconf.h .carry/include/
cp -r /usr/include/gloo .carry/include/  # c10d's ProcessGroupGloo.hpp includes them (src/dist)
cp -r /usr/src/googletest .carry/googletest
if [ "$prebuilt" = 1 ]; then
  # The program names its commit (--version, bench.json): configured with HEAD's for this build, then
  # configured back to git's at configure time (the commit's two files are compiled again).
  trap 'cmake -B build -DPERFTRAIN_BUILD_COMMIT= > /dev/null' EXIT  # also when the build fails
  cmake -B build -DPERFTRAIN_BUILD_COMMIT="$(git rev-parse --short HEAD)" > /dev/null
  ninja -C build perftrain > /dev/null
  mkdir -p .carry/prebuilt
  strip -o .carry/prebuilt/perftrain build/perftrain
  xz -T0 -6 .carry/prebuilt/perftrain
  ./build/perftrain --version | sed -nE 's/.*\(commit ([0-9a-f]+)\).*/\1/p' > .carry/prebuilt/COMMIT
  rmdir .carry/fashion-mnist
else
  cp /usr/share/datasets/fashion-mnist/*.gz .carry/fashion-mnist/  # the test set too: eval --train-features reports its accuracy
fi
# torchao for bench's float8-* torch modes (the anchor of train.precision = "fp8"): the GPU machine has no
# network; gpu_run.sh unpacks the wheel onto PYTHONPATH. The version setup.sh installs.
pip="$(command -v pip3 || echo /opt/venv/bin/pip)"
[ -x .venv/bin/pip ] && pip=.venv/bin/pip
"$pip" download -q --disable-pip-version-check --no-deps -d .carry/wheels torchao==0.18.0
[ -n "$cache" ] && cp "$cache" .carry/inductor-cache.tgz
du -sh .carry
mib=$(( $(du -sk .carry | cut -f1) / 1024 ))
if [ "$mib" -gt 60 ]; then
  echo "fill_carry.sh: .carry holds $mib MiB; with the working tree it may pass the carry's 64 MiB" >&2
fi

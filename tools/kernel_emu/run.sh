#!/usr/bin/env bash
# Runs row kernels' real CUDA source on the CPU (README.md): rewrites src/kernels/<name>.cu and the
# shared *.cuh for the host (launches -> emu::launch, four storage-type sets instead of 27), builds
# them with emu.cpp and a check program, and runs the check. Usage: tools/kernel_emu/run.sh [check.cpp] [kernel names...]
#   default: rms_adaln_check.cpp rms_adaln residual_rms_adaln
# ASAN=1 adds AddressSanitizer (UBSan's alignment check is always on). Work in build/kernel_emu/.
# EMU_SED='sed script' edits the emulated copies only (to show that a check fails on an injected bug).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECK="${1:-rms_adaln_check.cpp}"
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(rms_adaln residual_rms_adaln)
WORK="${EMU_WORK:-build/kernel_emu}"  # EMU_WORK: another folder (ctest gives each check its own)
mkdir -p "$WORK"
CUDA_INC="${CUDA_HOME:-/usr/local/cuda}/include"
[ -f "$CUDA_INC/cuda_bf16.h" ] || { echo "no CUDA headers in $CUDA_INC: skipped"; exit 77; }
SAN="-fsanitize=undefined,alignment -fno-sanitize-recover=alignment"
[ "${ASAN:-0}" = 1 ] && SAN="-fsanitize=address,undefined,alignment -fno-sanitize-recover=alignment"
# The shared device headers (src/kernels/*.cuh) are rewritten too, into $WORK/include, found first.
FLAGS="-std=c++17 -O1 -g $SAN -I$WORK/include -Isrc -I$CUDA_INC -include tools/kernel_emu/shim.h -w"
rewrite() {  # rewrite SRC DST: launches -> emu::launch; a .cu: four storage-type sets, and it must launch something
  python3 - "$1" "$2" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s = s.replace("PERFTRAIN_LAUNCH_CHECK();", ";")
s, k = re.subn(r"([A-Za-z_][\w:]*(?:<[^<>]*>)?)<<<([^,]+),\s*([^,]+),\s*0,\s*stream>>>\(", r"emu::launch(\1, \2, \3, ", s)
if (k == 0 and sys.argv[1].endswith(".cu")) or "<<<" in s:
    sys.exit(f"{sys.argv[1]}: launches not of the form kernel<<<grid, block, 0, stream>>>(...)")
sets = "(float, __nv_bfloat16, __nv_bfloat16) M(float, float, float) M(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16) M(float, __half, __half)"
if sys.argv[1].endswith(".cu"):
    s = re.sub(r"PERFTRAIN_FOR_STORAGE_TYPES3\((\w+)\)", lambda m: m.group(1) + sets.replace("M(", m.group(1) + "("), s)
open(sys.argv[2], "w").write(s)
PY
}
mkdir -p "$WORK/include/kernels"
for h in src/kernels/*.cuh; do rewrite "$h" "$WORK/include/kernels/$(basename "$h")"; done
objs=()
for n in "${NAMES[@]}"; do
  rewrite "src/kernels/$n.cu" "$WORK/${n}_emu.cpp"
  if [ -n "${EMU_SED:-}" ]; then
    cp "$WORK/${n}_emu.cpp" "$WORK/${n}_emu.orig"
    sed -i -e "$EMU_SED" "$WORK/${n}_emu.cpp"
    cmp -s "$WORK/${n}_emu.cpp" "$WORK/${n}_emu.orig" && echo "EMU_SED changed nothing in $n" >&2
  fi
  objs+=("$WORK/${n}_emu.o")
done
srcs=(tools/kernel_emu/emu.cpp "tools/kernel_emu/$CHECK")
for n in "${NAMES[@]}"; do srcs+=("$WORK/${n}_emu.cpp"); done
pids=()
for f in "${srcs[@]}"; do
  o="$WORK/$(basename "${f%.cpp}").o"
  g++ $FLAGS -c "$f" -o "$o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
BIN="$WORK/$(basename "${CHECK%.cpp}")"
g++ $SAN "$WORK"/emu.o "$BIN.o" "${objs[@]}" -o "$BIN" -lpthread
"$BIN" ${EMU_ARGS:-}  # EMU_ARGS: arguments for the check program

#!/usr/bin/env bash
# Runs row kernels' real CUDA source on the CPU (README.md): rewrites src/kernels/<name>.cu and the
# shared *.cuh for the host (launches -> emu::launch, four storage-type sets instead of 27), builds
# them with emu.cpp and a check program, and runs the check. Usage: tools/kernel_emu/run.sh [check.cpp] [kernel names...]
#   default: rms_adaln_check.cpp rms_adaln residual_rms_adaln (another check without names: no kernel of src/)
# ASAN=1 adds AddressSanitizer (UBSan's alignment check is always on). Work in build/kernel_emu/.
# EMU_SED='sed script' edits the emulated copies only (to show that a check fails on an injected bug).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECK="${1:-rms_adaln_check.cpp}"
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && [ "$CHECK" = rms_adaln_check.cpp ] && NAMES=(rms_adaln residual_rms_adaln)
WORK="${EMU_WORK:-build/kernel_emu}"  # EMU_WORK: another folder (ctest gives each check its own)
mkdir -p "$WORK"
CUDA_INC="${CUDA_HOME:-/usr/local/cuda}/include"
[ -f "$CUDA_INC/cuda_bf16.h" ] || { echo "no CUDA headers in $CUDA_INC: skipped"; exit 77; }
SAN="-fsanitize=undefined,alignment -fno-sanitize-recover=alignment"
[ "${ASAN:-0}" = 1 ] && SAN="-fsanitize=address,undefined,alignment -fno-sanitize-recover=alignment"
# The shared device headers (src/kernels/*.cuh) are rewritten too, into $WORK/include, found first.
FLAGS="-std=c++17 -O1 -g $SAN -I$WORK/include -Itools/kernel_emu -Isrc -I$CUDA_INC -include tools/kernel_emu/shim.h -w -Wno-psabi"
rewrite() {  # rewrite SRC DST: launches -> emu::launch, dynamic shared memory -> emu's; a .cu: four storage-type sets, and it must launch something
  python3 - "$1" "$2" <<'PY'
import re, sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
if re.search(r"\b(asm|__asm__)\b", re.sub(r"//[^\n]*", "", s)):
    sys.exit(f"{src}: inline asm outside kernels/sm90.cuh: move it into a wrapper there and give the wrapper "
             "a host version in tools/kernel_emu/sm90_emu.h (README.md)")
s = s.replace("PERFTRAIN_LAUNCH_CHECK();", ";")
def top_level_split(t):  # at the commas outside parentheses and braces
    parts, depth, cur = [], 0, ""
    for ch in t:
        depth += ch in "({[" ; depth -= ch in ")}]"
        if ch == "," and depth == 0: parts.append(cur.strip()); cur = ""
        else: cur += ch
    return parts + [cur.strip()]
out, pos, launches = "", 0, 0
for m in re.finditer(r"([A-Za-z_][\w:]*(?:<[^<>]*>)?)<<<", s):
    if m.start() < pos: continue
    close = s.index(">>>", m.end())
    cfg = top_level_split(s[m.end():close])
    if len(cfg) not in (3, 4) or not s[close + 3:].startswith("("):
        sys.exit(f"{src}: a launch not of the form kernel<<<grid, block, shared_bytes, stream>>>(...)")
    out += s[pos:m.start()] + f"emu::launch({m.group(1)}, {cfg[0]}, {cfg[1]}, {cfg[2] if len(cfg) == 4 else 0}, "
    pos = close + 4
    launches += 1
s = out + s[pos:]
if (launches == 0 and src.endswith(".cu")) or "<<<" in s:
    sys.exit(f"{src}: launches not of the form kernel<<<grid, block, shared_bytes, stream>>>(...)")
s = re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]*?\w)\s+(\w+)\[\];",
           r"\1* const \2 = reinterpret_cast<\1*>(emu::dynamic_smem());", s)
sets = "(float, __nv_bfloat16, __nv_bfloat16) M(float, float, float) M(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16) M(float, __half, __half)"
if src.endswith(".cu"):
    s = re.sub(r"PERFTRAIN_FOR_STORAGE_TYPES3\((\w+)\)", lambda m: m.group(1) + sets.replace("M(", m.group(1) + "("), s)
open(dst, "w").write(s)
PY
}
mkdir -p "$WORK/include/kernels"
# kernels/sm90.cuh, the one home of inline asm, becomes the host version of its instructions.
for h in src/kernels/*.cuh; do
  if [ "$(basename "$h")" = sm90.cuh ]; then printf '#pragma once\n#include "sm90_emu.h"\n' > "$WORK/include/kernels/sm90.cuh"
  else rewrite "$h" "$WORK/include/kernels/$(basename "$h")"; fi
done
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
srcs=(tools/kernel_emu/emu.cpp tools/kernel_emu/sm90_emu.cpp tools/kernel_emu/race.cpp "tools/kernel_emu/$CHECK")
# The TMA kernels' host side: tensor maps through the emulated driver (sm90_emu.cpp).
case " ${NAMES[*]}" in *_sm90*) srcs+=(src/kernels/tensor_map.cpp); objs+=("$WORK/tensor_map.o");; esac
for n in "${NAMES[@]}"; do srcs+=("$WORK/${n}_emu.cpp"); done
pids=()
for f in "${srcs[@]}"; do
  o="$WORK/$(basename "${f%.cpp}").o"
  g++ $FLAGS -c "$f" -o "$o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
BIN="$WORK/$(basename "${CHECK%.cpp}")"
g++ $SAN "$WORK"/emu.o "$WORK"/sm90_emu.o "$WORK"/race.o "$BIN.o" "${objs[@]}" -o "$BIN" -lpthread
"$BIN" ${EMU_ARGS:-}  # EMU_ARGS: arguments for the check program

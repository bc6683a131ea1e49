#!/usr/bin/env bash
# Same-call A/B of two trees on the GPU machine: the tree in hand (built by
# tools/gpu_run.sh into build-gpu/) against an older one carried as a source
# tarball, both timed by `perftrain bench --variants all`, case by case, the
# order of the two alternating between cases so that drift in clock or power
# falls on both. For a refactor that must leave the step's speed unchanged.
#   here:  git archive --format=tar.gz -o .ab/old.tgz <commit> CMakeLists.txt cmake src tests bench/kernels
#          (.ab ignored through .git/info/exclude; name .ab and .carry in the device call's carry list)
#   there: MODE=script SCRIPT=tools/ab_trees.sh BUILD_TARGETS=perftrain tools/gpu_run.sh
# AB_OLD_BIN=<file.xz>: the old tree's perftrain built on the CPU machine (the .carry/prebuilt/perftrain.xz
#   of tools/fill_carry.sh --prebuilt at that commit, copied aside), unpacked instead of built; with a
#   prebuilt new one too (gpu_run.sh's .carry/prebuilt and COMMIT), the A/B builds nothing there. Both
#   programs together take about 54 of the carry's 64 MiB: carry no dataset, GoogleTest or wheels beside.
# AB_CASES: MODEL:BATCH[:LATENT[:COND_TOKENS[:COND_DIM]]] (gpu_run.sh's case format, one batch each);
# AB_ARGS: more bench flags for both trees. Output: $OUT/ab.txt, one line per run.
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${PY:?}"
OLD_SRC=/tmp/ab-old
CASES=${AB_CASES:-"DiT-S/2:32 DiT-S/2:256 DiT-B/2:256 DiT-XL/2:256 SS-B/2:256:32:32:1024 SS-B/2:64:64:128:1024"}
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

OLD_BIN="$OLD_SRC/build/perftrain"
rm -rf "$OLD_SRC" && mkdir -p "$OLD_SRC/build" || exit 1
if [ -n "${AB_OLD_BIN:-}" ]; then
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$AB_OLD_BIN" "$OLD_BIN" && chmod +x "$OLD_BIN" || exit 1
  el "old program: $("$OLD_BIN" --version | head -1)"
else
  tar -xzf "${AB_OLD:-.ab/old.tgz}" -C "$OLD_SRC" || exit 1
  el "building the old tree"
  cmake -S "$OLD_SRC" -B "$OLD_SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERFTRAIN_PYTHON="$PY" \
    -DPERFTRAIN_CARRY_DIR="$PWD/.carry" > "$OUT/ab-old-build.log" 2>&1 &&
    ninja -C "$OLD_SRC/build" -j "$(nproc)" perftrain >> "$OUT/ab-old-build.log" 2>&1 ||
    { tail -20 "$OUT/ab-old-build.log"; exit 1; }
  el "old tree built"
fi

one() {  # tree-name binary case-label flags...
  local name=$1 bin=$2 label=$3; shift 3
  local dir=/tmp/ab-run-$name
  rm -rf "$dir"
  timeout 240 "$bin" bench --variants all --steps 30 --warmup 6 --out "$dir" "$@" ${AB_ARGS:-} > "$dir.log" 2>&1
  local rc=$?
  echo "$name $label rc $rc $(awk '$2 == "all"' "$dir.log" | head -1)" | tee -a "$OUT/ab.txt"
}

flip=0
for c in $CASES; do
  IFS=: read -r model batch latent tc dc <<< "$c"
  flags=(--model "$model" --batch "$batch")
  [ -n "$latent" ] && flags+=(--image-size "$latent")
  [ -n "$tc" ] && flags+=(--set "model.cond_tokens=$tc")
  [ -n "$dc" ] && flags+=(--set "model.cond_dim=$dc")
  if [ $flip = 0 ]; then
    one new "$BIN" "$c" "${flags[@]}"; one old "$OLD_BIN" "$c" "${flags[@]}"
  else
    one old "$OLD_BIN" "$c" "${flags[@]}"; one new "$BIN" "$c" "${flags[@]}"
  fi
  flip=$(( 1 - flip ))
  el "$c done"
done

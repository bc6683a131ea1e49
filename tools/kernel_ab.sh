#!/usr/bin/env bash
# Same-call A/B of one kernel's source file on the GPU machine: the tree's src/kernels/<name>.cu against an
# older version of that one file carried beside it, each compiled by nvcc with the same other sources into
# the same torch-free check program of bench/kernels, then timed in turns (old, new, old, new, ...) so that
# drift in clock or power falls on both. For a kernel change whose output must stay right and whose time
# should drop; ratios from one call, not from two calls on two machines. Only the .cu file differs: the
# headers and the shared .cuh files are the tree's for both.
#   here:  mkdir -p .ab && git show <commit>:src/kernels/<name>.cu > .ab/old.cu
#          (.ab ignored through .git/info/exclude; name .ab and .carry in the device call's carry list)
#   there: MODE=script SCRIPT=tools/kernel_ab.sh AB_KERNEL=src/kernels/<name>.cu \
#            AB_PROGRAM=bench/kernels/<check>.cu AB_SOURCES="<the program's other .cu/.cpp files>" \
#            BUILD_TARGETS=perftrain tools/gpu_run.sh
#          (with gpu_run.sh's prebuilt perftrain and its COMMIT nothing else is built: about a minute of nvcc)
# e.g. the tiled attention forward: AB_KERNEL=src/kernels/attention_tiled_fwd_sm90.cu
#   AB_PROGRAM=bench/kernels/attention_tiled_check.cu
#   AB_SOURCES="src/kernels/attention_tiled_bwd_sm90.cu src/kernels/tensor_map.cpp"
# AB_OLD (default .ab/old.cu); AB_CHECK_ARGS (default "checks"): the new program's correctness run, first
# (rc and its PASS and FAIL lines counted); AB_TIME_ARGS (default "time"): each timing run's arguments;
# AB_ROUNDS (default 2). Output: $OUT/kernel-ab/ (build logs, checks.log, time-old-R.log, time-new-R.log).
set -uo pipefail
: "${OUT:?run through tools/gpu_run.sh MODE=script}" "${AB_KERNEL:?}" "${AB_PROGRAM:?}"
A="$OUT/kernel-ab"
mkdir -p "$A"
OLD="${AB_OLD:-.ab/old.cu}"
[ -f "$OLD" ] || { echo "kernel_ab.sh: no old source $OLD"; exit 2; }
# The old file compiled as if it sat where the new one does (its includes are the tree's).
old_copy="$(dirname "$AB_KERNEL")/ab_old_$(basename "$AB_KERNEL")"
cp "$OLD" "$old_copy" || exit 1
trap 'rm -f "$old_copy"' EXIT
flags=(-std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -Isrc -I"$(dirname "$AB_PROGRAM")")
# shellcheck disable=SC2206  # the source list splits on purpose
others=(${AB_SOURCES:-})
nvcc "${flags[@]}" "$AB_PROGRAM" "${others[@]}" "$AB_KERNEL" -o "$A/new" > "$A/build-new.log" 2>&1 &
nvcc "${flags[@]}" "$AB_PROGRAM" "${others[@]}" "$old_copy" -o "$A/old" > "$A/build-old.log" 2>&1 &
wait
for v in old new; do
  [ -x "$A/$v" ] || { echo "kernel_ab.sh: the $v program did not build"; tail -20 "$A/build-$v.log"; exit 1; }
done
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader > "$A/gpu.txt" 2>/dev/null
"$A/new" ${AB_CHECK_ARGS-checks} > "$A/checks.log" 2>&1
echo "checks (new): rc $?, $(grep -c PASS "$A/checks.log") PASS, $(grep -c FAIL "$A/checks.log") FAIL"
for r in $(seq "${AB_ROUNDS:-2}"); do
  for v in old new; do
    # shellcheck disable=SC2086  # the arguments split on purpose
    "$A/$v" ${AB_TIME_ARGS-time} > "$A/time-$v-$r.log" 2>&1
    echo "== $v, round $r (rc $?)"
    cat "$A/time-$v-$r.log"
  done
done
rm -f "$A/old" "$A/new"

#!/usr/bin/env bash
# The one script for the GPU machine (docs/guide/quickstart.md): builds into build-gpu/ against the PyTorch
# there with the carried headers (.carry, filled here by tools/fill_carry.sh; name ".carry" in the device
# call's carry list), does what MODE says, writes into $OUT (default ./gpu-out) and prints a table last.
#   MODE=check    gpu tests (the kernels' float64 checks among them), a quick bench of DiT-S/2 b32,b256 and a
#                 300-step training run
#   MODE=bench    perftrain bench --against-torch on BENCH_CASES (default: the four target cases), or on the
#                 named list BENCH_SET (below)
#   MODE=curve    500 steps of DiT-S/2 on Fashion-MNIST, the fast path against eager fp32 runs of FP32_SEEDS
#                 (default "0 1 2"); FP32_REFS_DIR=docs/perf/curve-<commit> reuses stored fp32 runs when the
#                 eager fp32 code has not changed; CURVE_ARGS: more train flags for every run
#   MODE=profile  perftrain bench --profile PROFILE_VARIANT (default all) on BENCH_CASES: kernel time by kind and
#                 the top kernels per case (an uncaptured variant also by launching operation); NCU=1 adds
#                 Nsight Compute on the `all` variant's kernels matching NCU_KERNEL (NCU_SKIP default 30)
#   MODE=lab      LAB=<program> of bench/kernels (its README) built alone and run with LAB_ARGS; SANITIZE=1 under
#                 compute-sanitizer's memcheck, NCU=1 under Nsight Compute
#   MODE=script   SCRIPT=<file> run by bash after the build, with BIN, FMNIST, RUNS, OUT and PY exported (a checked-in
#                 or carried list of commands: e.g. the measurements an issue asks for); its output in script.log
# Data parallel: BENCH_NPROC=N (bench and check) runs every bench case with --nproc-per-node N: the trainer's
#   N-rank step on GPUs 0..N-1 beside each variant run by one process, with --against-torch DDP under
#   torch.distributed.run (docs/guide/multi-gpu.md, Benchmark); on one GPU only N=1 (a one-rank NCCL group).
# Settings: SETS="speed.attention=cudnn speed.gemm_tune=0" adds one bench or profile run per setting, by
#   --set (a comma joins keys into one setting: "speed.recompute=true,speed.gemm_tune=0").
# Nsight Compute: NCU_KERNEL (a regex on the function's name alone, not its template arguments: gemm_sm90_pingpong,
#   not DGelu; NCU_SKIP picks the launch), NCU_SKIP and NCU_COUNT (launches skipped and profiled),
#   NCU_ARGS (default "--set full"); the report goes to ncu-<name>.txt.
# Cases: MODEL:BATCHES[:LATENT[:COND_TOKENS[:COND_DIM]]]: --image-size LATENT; a single-stream model's
#   model.cond_tokens (class tokens) and model.cond_dim (features with synthetic lengths), e.g. SS-B/2:64:64:128:1024.
# BENCH_SET (bench and profile; instead of BENCH_CASES; in bench BENCH_ARGS defaults to "--variants all
#   --torch-modes compile,reduce-overhead"), the speed issue's targets; each set about 6-8 minutes on an H200
#   plus the build (most of it torch.compile's first steps, 1-2 minutes per mode and case):
#   dit-256  DiT-S/2 b256, DiT-B/2 b256, DiT-L/2 b128, DiT-XL/2 b256 (32x32x4 latents): four cases, about 10
#            minutes with two torch modes, so one torch mode a call (or BENCH_CASES with two of them)
#   ss-256   SS-B/2 b256, SS-XL/2 b128: 32x32x4 latents (256 image tokens) + 32 features of 1024 channels
#   ss-1024  SS-B/2 b64, SS-XL/2 b32: 64x64x4 latents (1024 image tokens) + 128 features of 1024 channels
#   dit-512  DiT-XL/2 b32, DiT-B/2 b64: 64x64x4 latents (512 px, 1024 tokens)
#   extra    one shape per family outside the issue's list: DiT-L/2 b32 at 512 px (head dim 64, 1024 tokens) and
#            SS-L/2 b128 with 77 features of 768 channels (a CLIP-like condition: a key mask not a multiple of 64)
# torch.compile's caches: the machine is fresh on every call, so Inductor's and Triton's caches (perftrain bench
#   --torch-cache's default folder, TORCH_CACHE below) start empty unless carried: .carry/inductor-cache.tgz,
#   when present, is unpacked there first; INDUCTOR_CACHE_OUT=1 packs the folder into $OUT/inductor-cache.tgz
#   at the end (INDUCTOR_CACHE_OUT=lean without Triton's binaries, triton/: the next call compiles those
#   kernels again from the cached sources, tens of seconds, but autotunes nothing), and shortens the bench runs
#   (bench mode) or the script (script mode) so that this still happens within the call's CALL_LIMIT (default
#   600 s). tools/fill_carry.sh <that file> carries it into the next call (mind the carry's 64 MiB: it says
#   how much .carry holds). A cold max-autotune compile of DiT-B/2 b256 may take more than one call; each call
#   keeps what it compiled (docs/guide/speed.md, The torch cache).
# Prebuilt: with .carry/prebuilt/perftrain.xz (tools/fill_carry.sh --prebuilt: that carry has no dataset) and
#   BUILD_TARGETS=perftrain at its COMMIT, no build: the program built on the CPU machine runs.
# Options: COMMIT=<sha> (pass it: git on the device machine may name an older commit), BENCH_CASES="DiT-S/2:32,256
#   DiT-B/2:256", BENCH_ARGS (more bench flags; profile takes PROFILE_VARIANT, not --variants), TESTS=all (every
#   test, not only gpu ones), TEST_REGEX, RUN_TESTS=1 (the gpu tests in the other modes too), BUILD_TARGETS (ninja
#   targets instead of everything, e.g. "tests/test_ops_gpu" with TEST_REGEX=ops.: a faster build).
# Output: summary.md, gpu.txt, tests.log, bench-<case>[-<setting>].{json,md}, curve.txt,
#   <case>[-<setting>]-profile-b<batch>-<variant>.md, lab-<program>.log, ncu-*.txt, inductor-cache.tgz
#   (INDUCTOR_CACHE_OUT=1); the rest in logs.tgz.
# shellcheck disable=SC2086,SC2206  # the *_ARGS, BUILD_TARGETS and CURVE_ARGS lists split on purpose
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
MODE="${MODE:-check}"
case "$MODE" in check | bench | curve | profile | lab | script) ;; *) echo "unknown MODE=$MODE (check, bench, curve, profile, lab, script)"; exit 2 ;; esac
[ "$MODE" = script ] && [ ! -f "${SCRIPT:-}" ] && { echo "MODE=script needs SCRIPT=<file>"; exit 2; }
[ "$MODE" = lab ] && [ -z "${LAB:-}" ] && { echo "MODE=lab needs LAB=<program> (bench/kernels/README.md)"; exit 2; }
case "${BENCH_SET:-}" in
  "") ;;
  dit-256) BENCH_CASES="DiT-S/2:256 DiT-B/2:256 DiT-L/2:128 DiT-XL/2:256" ;;
  ss-256) BENCH_CASES="SS-B/2:256:32:32:1024 SS-XL/2:128:32:32:1024" ;;
  ss-1024) BENCH_CASES="SS-B/2:64:64:128:1024 SS-XL/2:32:64:128:1024" ;;
  dit-512) BENCH_CASES="DiT-XL/2:32:64 DiT-B/2:64:64" ;;
  extra) BENCH_CASES="DiT-L/2:32:64 SS-L/2:128:32:77:768" ;;
  *) echo "unknown BENCH_SET=$BENCH_SET (dit-256, ss-256, ss-1024, dit-512, extra)"; exit 2 ;;
esac
[ -n "${BENCH_SET:-}" ] && [ "$MODE" = bench ] && BENCH_ARGS="${BENCH_ARGS---variants all --torch-modes compile,reduce-overhead}"
JOBS="$(nproc)"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
row() { echo "| $1 | $2 |" >> "$SUMMARY"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
PY="$(command -v python3)"  # the build's Python (-DPERFTRAIN_PYTHON): bench's --python default
COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"  # built in: bench.json's commit
row GPU "$(cat "$OUT/gpu.txt")"
row commit "$COMMIT"

# torch.compile's caches, where perftrain bench keeps them by default (--torch-cache:
# $XDG_CACHE_HOME/perftrain/inductor, XDG_CACHE_HOME made absolute here), carried in and out.
case "${XDG_CACHE_HOME:-}" in /*) ;; *) XDG_CACHE_HOME="${HOME:-/tmp}/.cache" ;; esac
export XDG_CACHE_HOME
TORCH_CACHE="$XDG_CACHE_HOME/perftrain/inductor"
if [ -f .carry/inductor-cache.tgz ]; then
  mkdir -p "$TORCH_CACHE" && tar xzf .carry/inductor-cache.tgz -C "$TORCH_CACHE"
  row "torch cache in" "rc $?, $(find "$TORCH_CACHE" -type f | wc -l) files from .carry/inductor-cache.tgz"
fi
# Python packages the GPU machine lacks (torchao, for bench's float8-* torch modes): the wheels that
# tools/fill_carry.sh put in .carry/wheels, unpacked (a wheel is a zip) into a folder on PYTHONPATH.
if compgen -G ".carry/wheels/*.whl" > /dev/null; then
  mkdir -p .carry/site && for w in .carry/wheels/*.whl; do "$PY" -m zipfile -e "$w" .carry/site; done
  export PYTHONPATH="$PWD/.carry/site${PYTHONPATH:+:$PYTHONPATH}"
  row "carried wheels" "$(cd .carry/wheels && ls *.whl | tr '\n' ' ')"
fi
# Seconds left for work in this call, 45 kept back for the cache's tarball and the table (INDUCTOR_CACHE_OUT;
# at least 1: a timeout of 0 would be none).
time_left() {
  local left=$(( ${CALL_LIMIT:-600} - ($(date +%s) - T0) - 45 ))
  echo $(( left > 0 ? left : 1 ))
}

# A perftrain built on the CPU machine (tools/fill_carry.sh --prebuilt): taken instead of the build when the
# call builds only perftrain and the program reports COMMIT; torch's libraries are found through
# LD_LIBRARY_PATH (its RUNPATH names the other machine's). Anything else builds as below.
use_prebuilt() {
  [ -f .carry/prebuilt/perftrain.xz ] && [ "${BUILD_TARGETS:-}" = perftrain ] && [ "$MODE" != lab ] || return 1
  local want torch_lib
  want="$(cat .carry/prebuilt/COMMIT)"
  [[ "$COMMIT" == "$want"* || "$want" == "$COMMIT"* ]] || { row prebuilt "not used: it is of $want, COMMIT is $COMMIT"; return 1; }
  mkdir -p build-gpu
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    .carry/prebuilt/perftrain.xz build-gpu/perftrain && chmod +x build-gpu/perftrain || return 1
  torch_lib="$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! ./build-gpu/perftrain --version > "$OUT/build.log" 2>&1; then
    row prebuilt "not used: it does not start here ($(tail -1 "$OUT/build.log"))"
    rm -f build-gpu/perftrain
    return 1
  fi
  row build "prebuilt perftrain of $want: $(grep -E '^GPU' "$OUT/build.log")"
}

# The build: everything, or BUILD_TARGETS; in lab mode only the program (a Python one needs none).
targets="${BUILD_TARGETS:-}"
[ "$MODE" = lab ] && targets="${BUILD_TARGETS:-$LAB}"
if use_prebuilt; then
  :
elif [[ "$MODE" != lab || "$LAB" != *.py ]]; then
  t0=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERFTRAIN_PYTHON="$PY" \
    -DPERFTRAIN_CARRY_DIR="$PWD/.carry" -DPERFTRAIN_BUILD_COMMIT="$COMMIT" > "$OUT/build.log" 2>&1 &&
    ninja -C build-gpu -j "$JOBS" $targets >> "$OUT/build.log" 2>&1
  build_rc=$?
  row build "rc $build_rc, $(( $(date +%s) - t0 )) s"
  if [ $build_rc -ne 0 ]; then grep -E "error|FAILED" "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; fi
fi
BIN=./build-gpu/perftrain
RUNS=/tmp/perftrain-runs
rm -rf "$RUNS"
FMNIST="$PWD/.carry/fashion-mnist"
NCU_BIN="$(command -v ncu)"
for f in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do [ -z "$NCU_BIN" ] && [ -x "$f" ] && NCU_BIN=$f; done

run_tests() {
  local t0
  t0=$(date +%s)
  if [ -n "${TEST_REGEX:-}" ]; then
    ctest --test-dir build-gpu -R "$TEST_REGEX" --output-on-failure -j 2 > "$OUT/tests.log" 2>&1
  elif [ "${TESTS:-gpu}" = all ]; then
    ctest --test-dir build-gpu --output-on-failure -j 8 > "$OUT/tests.log" 2>&1
  else
    ctest --test-dir build-gpu -L gpu --output-on-failure -j 2 > "$OUT/tests.log" 2>&1
  fi
  local rc=$?
  grep -E "^\s*[0-9]+/[0-9]+ Test.*(Failed|Exception|Timeout|Not Run)|tests passed" "$OUT/tests.log" | tail -20
  row "tests (${TESTS:-gpu})" "rc $rc, $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed' "$OUT/tests.log")"
}

train_run() {  # name, extra flags...
  local name=$1 t0; shift
  t0=$(date +%s)
  $BIN train --data-path "$FMNIST" --runs-dir "$RUNS" --run-name "$name" "$@" > "$OUT/train-$name.log" 2>&1
  local rc=$?
  tail -4 "$OUT/train-$name.log"
  cp "$RUNS/$name/metrics.jsonl" "$OUT/metrics-$name.jsonl" 2>/dev/null
  cp "$RUNS/$name/report.md" "$OUT/report-$name.md" 2>/dev/null
  row "train $name" "rc $rc, $(( $(date +%s) - t0 )) s; $(grep -E 'first step done' "$OUT/train-$name.log"); $(grep -E '^step: ' "$OUT/train-$name.log" | head -1); $(grep -E '^\| speed ' "$RUNS/$name/report.md" 2>/dev/null | cut -d'|' -f3)"
}

# A case MODEL:BATCHES[:LATENT[:COND_TOKENS[:COND_DIM]]] into model, batches, case_flags and a file-name tag.
parse_case() {
  local latent tc dc
  IFS=: read -r model batches latent tc dc <<< "$1"
  case_flags=()
  tag=$(echo "$model-$batches" | tr '/,' '-_')
  [ -n "${BENCH_NPROC:-}" ] && tag+="-np$BENCH_NPROC"
  [ -n "$latent" ] && case_flags+=(--image-size "$latent") && tag+="-l$latent"
  [ -n "$tc" ] && case_flags+=(--set "model.cond_tokens=$tc") && tag+="-c$tc"
  [ -n "$dc" ] && case_flags+=(--set "model.cond_dim=$dc") && tag+="x$dc"
  return 0
}

# A setting of SETS as bench flags and as a file-name tag: "speed.a=x,speed.b=y" -> --set ... / "a-x_b-y".
set_flags() { [ "$1" = default ] || for kv in ${1//,/ }; do printf -- '--set\n%s\n' "$kv"; done; }
set_tag() { [ "$1" = default ] || echo "-$(echo "$1" | sed 's/speed\.//g' | tr '=,/' '-_-')"; }
set_label() { [ "$1" = default ] || echo " [$1]"; }

bench_case() {  # "DiT-S/2:32,256" (a case), setting (default or a SETS entry), extra flags...
  local model batches setting=$2 tag t0 sets case_flags label
  parse_case "$1"
  label="$model b$batches${1#"$model:$batches"}"
  shift 2
  tag+=$(set_tag "$setting")
  t0=$(date +%s)
  mapfile -t sets < <(set_flags "$setting")
  local limit=()  # INDUCTOR_CACHE_OUT=1: stopped in time for the cache's tarball (a cold compile may not finish)
  [ "${INDUCTOR_CACHE_OUT:-0}" != 0 ] && limit=(timeout -k 10 "$(time_left)")
  "${limit[@]}" $BIN bench --model "$model" --batch "$batches" --out "$RUNS/bench-$tag" "${case_flags[@]}" \
    "${sets[@]}" "$@" ${BENCH_NPROC:+--nproc-per-node "$BENCH_NPROC"} ${BENCH_ARGS:-} > "$OUT/bench-$tag.log" 2>&1
  local rc=$?
  tail -30 "$OUT/bench-$tag.log"
  cp "$RUNS/bench-$tag/bench.json" "$OUT/bench-$tag.json" 2>/dev/null
  cp "$RUNS/bench-$tag/bench.md" "$OUT/bench-$tag.md" 2>/dev/null
  for f in "$RUNS/bench-$tag"/torch-*.log; do [ -f "$f" ] && cp "$f" "$OUT/bench-$tag-$(basename "$f")"; done  # to logs.tgz
  row "bench $label$(set_label "$setting")${BENCH_NPROC:+ x$BENCH_NPROC ranks}" "rc $rc, $(( $(date +%s) - t0 )) s; $(awk '$2 == "all" { printf "b%s all %s ms; ", $1, $3 }' "$OUT/bench-$tag.log")$(grep -E '^\S.* ranks?: .*scaling efficiency' "$OUT/bench-$tag.log" | sed -E 's/.*batch ([0-9]+) per rank, ([a-z0-9-]+), .*: ([0-9.]+) ms \(alone ([0-9.n/a]+).*img\/s per GPU, ([0-9.]+) img\/s total, scaling efficiency ([0-9.n/a%]+), exposed communication ([0-9.n/a]+) ms/b\1 \2 \3 ms (alone \4), \5 img\/s total, eff \6, exposed \7 ms; /' | tr -d '\n')$(grep -E '^\S.* batch [0-9]+: .*speedup' "$OUT/bench-$tag.log" | sed -E 's/.*batch ([0-9]+):.*best torch ([a-z0-9-]+) ([0-9.]+) ms.*speedup ([0-9.]+x).*/b\1 vs torch \2 \3 ms: \4; /' | tr -d '\n')"
}

ncu_run() {  # name, command...: Nsight Compute on the launches of NCU_KERNEL in the command
  local name=$1; shift
  [ -z "$NCU_BIN" ] && { row "ncu $name" "no ncu on this machine"; return; }
  timeout 600 "$NCU_BIN" ${NCU_KERNEL:+-k "regex:$NCU_KERNEL"} --launch-skip "${NCU_SKIP:-0}" \
    --launch-count "${NCU_COUNT:-1}" ${NCU_ARGS:---set full} "$@" > "$OUT/ncu-$name.txt" 2>&1
  row "ncu $name" "rc $?, $(grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput" "$OUT/ncu-$name.txt" | head -3 | tr -s ' ' | tr '\n' ';')"
}

[ "${RUN_TESTS:-0}" = 1 ] && [ "$MODE" != check ] && run_tests
case "$MODE" in
  check)
    run_tests
    bench_case "DiT-S/2:32,256" default --steps 20 --warmup 5
    train_run fast --steps 300 --set log.sample_every=0 --set log.checkpoint_every=0
    ;;
  bench)  # the four target cases against torch; a setting times the `all` variant alone (or BENCH_ARGS' --variants)
    only_all=(--variants all)
    [[ " ${BENCH_ARGS:-} " == *" --variants "* ]] && only_all=()
    for c in ${BENCH_CASES:-DiT-S/2:32,256 DiT-B/2:256 DiT-XL/2:256}; do
      bench_case "$c" default --against-torch
      for s in ${SETS:-}; do bench_case "$c" "$s" "${only_all[@]}"; done
    done
    ;;
  curve)  # FP32_SEEDS: the eager fp32 references (the first shares the fast run's seed 0); FP32_REFS_DIR: reuse them
    # CURVE_ARGS: more train flags for every run, e.g. "--set model.hidden=432 --set model.heads=6" (head dim 72)
    common=(--steps 500 --set log.every=10 --set log.sample_every=0 --set log.checkpoint_every=0 ${CURVE_ARGS:-})
    train_run fast-seed0 "${common[@]}" --seed 0
    refs=()
    for seed in ${FP32_SEEDS:-0 1 2}; do
      if [ -n "${FP32_REFS_DIR:-}" ]; then  # fp32 runs kept from an earlier curve whose eager fp32 code is unchanged
        refs+=("$FP32_REFS_DIR/metrics-fp32-seed$seed.jsonl")
      else
        train_run "fp32-seed$seed" "${common[@]}" --seed "$seed" --precision fp32 --graph off --fused off
        refs+=("$OUT/metrics-fp32-seed$seed.jsonl")
      fi
    done
    "$PY" tools/compare_curves.py "$OUT/metrics-fast-seed0.jsonl" "${refs[@]}" | tee "$OUT/curve.txt"
    row "loss curve" "$(tail -1 "$OUT/curve.txt")"
    ;;
  profile)  # where the time goes, kernel by kernel, per case and setting
    pv=${PROFILE_VARIANT:-all}
    for c in ${BENCH_CASES:-DiT-S/2:32,256 DiT-B/2:256 DiT-XL/2:256}; do
      for s in default ${SETS:-}; do
        parse_case "$c"
        tag+=$(set_tag "$s")
        mapfile -t sets < <(set_flags "$s")
        $BIN bench --model "$model" --batch "$batches" --variants "$pv" --steps 10 --warmup 4 --profile "$pv" \
          --out "$RUNS/profile-$tag" "${case_flags[@]}" "${sets[@]}" ${BENCH_ARGS:-} > "$OUT/profile-$tag.log" 2>&1
        row "profile $model b$batches$(set_label "$s") ($pv)" "rc $?"
        for f in "$RUNS/profile-$tag"/profile-*.md; do cp "$f" "$OUT/$tag-$(basename "$f")" 2>/dev/null; done
        # Uncaptured variants: each kernel charged to the operation that launched it.
        [ "$pv" != all ] && [ "$pv" != graph ] && for f in "$RUNS/profile-$tag"/trace-*.json; do
          "$PY" tools/trace_kernels.py "$f" > "$OUT/$tag-by-op-$(basename "$f" .json).md" 2>&1
        done
        # NCU=1: NCU_SKIP launches (default 30: the eager warm-up steps) of the `all` variant, then NCU_COUNT.
        [ "${NCU:-0}" = 1 ] && NCU_SKIP=${NCU_SKIP:-30} ncu_run "$tag" $BIN bench --model "$model" \
          --batch "$batches" --variants all --steps 2 --warmup 4 --out "$RUNS/ncu-$tag" "${case_flags[@]}" "${sets[@]}"
      done
    done
    ;;
  script)  # a list of commands after the build
    export BIN FMNIST RUNS OUT PY
    t0=$(date +%s)
    script_limit=${SCRIPT_TIMEOUT:-540}
    [ "${INDUCTOR_CACHE_OUT:-0}" != 0 ] && [ "$(time_left)" -lt "$script_limit" ] && script_limit=$(time_left)
    timeout -k 10 "$script_limit" bash "$SCRIPT" > "$OUT/script.log" 2>&1
    rc=$?
    tail -60 "$OUT/script.log"
    row "script $SCRIPT" "rc $rc, $(( $(date +%s) - t0 )) s"
    ;;
  lab)  # one program of bench/kernels
    name=${LAB%.py}
    if [[ "$LAB" == *.py ]]; then cmd=("$PY" "bench/kernels/$LAB"); else cmd=("./build-gpu/bench/kernels/$LAB"); fi
    sanitizer=()
    [ "${SANITIZE:-0}" = 1 ] && sanitizer=(compute-sanitizer --tool memcheck)
    timeout "${LAB_TIMEOUT:-540}" "${sanitizer[@]}" "${cmd[@]}" ${LAB_ARGS:-} 2>&1 | tee "$OUT/lab-$name.log"
    rc=${PIPESTATUS[0]}
    row "lab $LAB ${LAB_ARGS:-}${sanitizer:+ (memcheck)}" "rc $rc$(grep -q -- '-> \(PASS\|FAIL\)' "$OUT/lab-$name.log" &&
      echo ": $(grep -c -- '-> PASS' "$OUT/lab-$name.log") PASS, $(grep -c -- '-> FAIL' "$OUT/lab-$name.log") FAIL")"
    [ "${NCU:-0}" = 1 ] && ncu_run "$name" "${cmd[@]}" ${LAB_ARGS:-}
    ;;
esac

# INDUCTOR_CACHE_OUT=1 (or lean): what torch.compile cached in this call and before it, for tools/fill_carry.sh.
if [ "${INDUCTOR_CACHE_OUT:-0}" != 0 ]; then
  if [ -d "$TORCH_CACHE" ]; then
    lean=()
    [ "$INDUCTOR_CACHE_OUT" = lean ] && lean=(--exclude=./triton)
    tar czf "$OUT/inductor-cache.tgz" "${lean[@]}" -C "$TORCH_CACHE" .
    row "torch cache out" "rc $?, $(find "$TORCH_CACHE" -type f | wc -l) files, $(du -h "$OUT/inductor-cache.tgz" | cut -f1) in inductor-cache.tgz"
  else
    row "torch cache out" "none: nothing was compiled"
  fi
fi

# Only a few files come back from the device machine: all but the summary, the bench reports, the kernel
# profiles, the lab's and Nsight Compute's output, the curve verdict and the torch cache travel in one tarball.
keep='^(summary\.md|gpu\.txt|tests\.log|script\.log|curve\.txt|logs\.tgz|inductor-cache\.tgz|bench-.*\.(json|md)|.*-profile-b.*\.md|lab-.*\.log|ncu-.*\.txt)$'
rest=()
for f in "$OUT"/*; do [[ "$(basename "$f")" =~ $keep ]] || rest+=("$(basename "$f")"); done
[ ${#rest[@]} -gt 0 ] && tar czf "$OUT/logs.tgz" -C "$OUT" --remove-files "${rest[@]}" 2>/dev/null
echo
echo "| what | result |"
echo "|---|---|"
cat "$SUMMARY"

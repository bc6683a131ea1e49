#!/usr/bin/env bash
# The one script for the GPU machine (docs/guide/quickstart.md): builds
# against the PyTorch there with the carried headers (.carry, filled by
# tools/fill_carry.sh), then does what MODE says and prints a table last.
#   MODE=check  gpu tests, a quick bench of every variant (DiT-S/2 b32, b256), a short default training run
#   MODE=bench  perftrain bench --against-torch on BENCH_CASES (default: the four target cases)
#   MODE=curve  first 500 steps of DiT-S/2 on Fashion-MNIST: the fast path vs eager fp32 seeds (CURVE_ARGS: other shapes)
#               (FP32_SEEDS, default "0 1 2": three for the leave-one-out check; ~70 s of device time each;
#               FP32_REFS_DIR=docs/perf/curve-<sha> reuses stored ones when the eager fp32 code has not changed)
#   MODE=train  the default training run, STEPS steps
#   MODE=gemm-check  only our fc1 product (kernels/gemm_bias_gelu_sm90): nvcc builds the torch-free
#               tools/gemm_bias_gelu_check.cu and runs it (correctness on sampled rows, then times at DiT's
#               shapes); no CMake build, ~30 s. The full comparison with cuBLASLt is
#               build-gpu/tests/bench_gemm_bias_gelu after a build. NCU_SHAPE="fc1 65536 3072 768"
#               (or dgelu ...) adds Nsight Compute's full set on one launch of that shape. PROBES=1 adds the
#               kernel's timing probes as variants (PERFTRAIN_GEMM_SM90_PROBE: 1 no epilogue, 2 no GELU arithmetic).
#               FC1_SCHEDULES="cooperative pingpong" checks fc1 under each PERFTRAIN_FC1_SCHEDULE, compares
#               their outputs to the bit and times them in alternating pairs; GEMM_VARIANTS="-DX=1;-DY=2"
#               rebuilds and times the kernel per set of defines.
#   MODE=attn-check  tools/attention_bwd_check.cu and tools/attention_fwd_check.cu (nvcc only): the whole-head
#               attention backward and forward against float64, under compute-sanitizer first, then plainly with
#               their timings; NCU=1 adds an Nsight Compute report of the backward; then
#               tools/wgmma_n72_probe.cu (what d = 72's n8 tail products cost, one m64n72k16 instead)
#   MODE=write-check  tools/write_bandwidth_check.cu (nvcc only): the rate at which fc1's two outputs can be
#               written with no product around them (memset, streaming, fc1's tile pattern, with A read beside
#               it), on cudaMalloc memory and on cuMemCreate memory with compression off and on; the tile
#               pattern on fewer SMs (the limit of one SM) and fc1's rhythm of work then writes
#   MODE=ncu    Nsight Compute on the kernels matching NCU_KERNEL (a regex) in the `all` variant of
#               BENCH_CASES, once per setting in TUNE_ENVS as in tune: NCU_SKIP launches skipped (the
#               first, eager steps), NCU_COUNT profiled, NCU_ARGS added (e.g. --metrics ...); the
#               report's text goes to ncu-*.txt
#   MODE=tune   gpu tests, then the `all` variant on BENCH_CASES per switch in TUNE_ENVS (e.g.
#               "PERFTRAIN_QKV_GRAD=packed PERFTRAIN_BGRADB=1,PERFTRAIN_GEMM_TUNE=8": a comma joins
#               switches into one setting) and with --recompute, side by side;
#               PROFILE=1 adds a kernel profile per case (of PROFILE_VARIANT, default all; an uncaptured
#               one such as fused also gets its kernels by launching operation); RUN_TESTS=0, RECOMPUTE=0
#               leave those out
# Options: TESTS=all (every test, not only gpu ones), COMMIT=<sha> (pass it literally: git on the device
# machine may see stale metadata and name an older commit), BENCH_CASES="DiT-S/2:32,256 DiT-B/2:256",
# BENCH_ARGS (extra bench flags), BUILD_TARGETS (ninja targets instead of everything, e.g.
# "tests/test_ops_gpu" with TEST_REGEX for a quick kernel check: ~1 min less build). In a device call:
# carry [".carry"]. Results go to $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
MODE="${MODE:-check}"
JOBS="$(nproc)"
log() { echo "[gpu_run $(date +%H:%M:%S)] $*"; }
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
row() { echo "| $1 | $2 |" >> "$SUMMARY"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
PY="$(command -v python3)"
export PERFTRAIN_PYTHON="$PY" PERFTRAIN_SOURCE_DIR="$PWD"
export PERFTRAIN_COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
row GPU "$(cat "$OUT/gpu.txt")"
row commit "$PERFTRAIN_COMMIT"

if [ "$MODE" = write-check ]; then  # how fast fc1's outputs can be written at all (nvcc only, ~20 s)
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/write_bandwidth_check.cu -o "$OUT/write_check" \
    > "$OUT/write-check.log" 2>&1 && timeout 120 "$OUT/write_check" 2>&1 | tee -a "$OUT/write-check.log"
  row "write check" "rc ${PIPESTATUS[0]}"
  rm -f "$OUT/write_check"
  cat "$SUMMARY"
  exit 0
fi

if [ "$MODE" = attn-check ]; then  # the whole-head attention backward alone, nvcc only
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc tools/attention_bwd_check.cu \
    src/kernels/attention_head_bwd_sm90.cu src/kernels/tensor_map.cpp -o "$OUT/attention_check" > "$OUT/attn-check.log" 2>&1 &&
    timeout 240 compute-sanitizer --tool memcheck "$OUT/attention_check" checks 2>&1 | tail -25 | tee -a "$OUT/attn-check.log"
  row "attn check (memcheck)" "rc ${PIPESTATUS[0]}"
  [ -x "$OUT/attention_check" ] && timeout 120 "$OUT/attention_check" 2>&1 | tee -a "$OUT/attn-check.log"
  row "attn check" "rc ${PIPESTATUS[0]}"
  # NCU=1: one launch's speed of light, stalls and sources. NCU_SKIP launches of the kernel come first: 18
  # checks (2 head dims x 3 shapes x 3 runs), then 145 per timed shape (B/2, S/2, XL/2) after 5 warm-up
  # ones: 23 is B/2's first timed launch (the default), 313 XL/2's.
  if [ "${NCU:-0}" = 1 ] && [ -x "$OUT/attention_check" ]; then
    timeout 240 ncu --set full --import-source no -k regex:attention_head_bwd --launch-skip "${NCU_SKIP:-23}" --launch-count 1 \
      -o "$OUT/attn" "$OUT/attention_check" > "$OUT/ncu-attn.txt" 2>&1
    ncu_rc=$?
    ncu -i "$OUT/attn.ncu-rep" --page details >> "$OUT/ncu-attn.txt" 2>&1
    ncu -i "$OUT/attn.ncu-rep" --page raw --csv > "$OUT/ncu-attn-raw.csv" 2>&1
    ncu -i "$OUT/attn.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu-attn-sass.csv" 2>&1
    rm -f "$OUT/attn.ncu-rep"
    row "attn ncu" "rc $ncu_rc, $(grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput" "$OUT/ncu-attn.txt" | head -3 | tr -s ' ' | tr '\n' ';')"
  fi
  rm -f "$OUT/attention_check"
  # The forward (tools/attention_fwd_check.cu): the same, without ncu.
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc tools/attention_fwd_check.cu \
    src/kernels/attention_head_fwd_sm90.cu src/kernels/tensor_map.cpp -o "$OUT/attention_fwd_check" \
    > "$OUT/attn-fwd-check.log" 2>&1 &&
    timeout 240 compute-sanitizer --tool memcheck "$OUT/attention_fwd_check" checks 2>&1 | tail -25 |
    tee -a "$OUT/attn-fwd-check.log"
  row "attn fwd check (memcheck)" "rc ${PIPESTATUS[0]}"
  [ -x "$OUT/attention_fwd_check" ] && timeout 120 "$OUT/attention_fwd_check" 2>&1 | tee -a "$OUT/attn-fwd-check.log"
  row "attn fwd check" "rc ${PIPESTATUS[0]}"
  rm -f "$OUT/attention_fwd_check"
  # The n72 probe (tools/wgmma_n72_probe.cu): the tail products' cost, and one m64n72k16 on an unswizzled operand.
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc tools/wgmma_n72_probe.cu -o "$OUT/n72_probe" \
    > "$OUT/n72-probe.log" 2>&1 && timeout 120 "$OUT/n72_probe" 2>&1 | tee -a "$OUT/n72-probe.log"
  row "wgmma n72 probe" "rc ${PIPESTATUS[0]}, $(grep -c MATCH "$OUT/n72-probe.log") layouts match"
  rm -f "$OUT/n72_probe"
  cat "$SUMMARY"
  exit 0
fi

if [ "$MODE" = gemm-check ]; then
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc tools/gemm_bias_gelu_check.cu \
    src/kernels/gemm_bias_gelu_sm90.cu src/kernels/tensor_map.cpp -o "$OUT/gemm_check" > "$OUT/gemm-check.log" 2>&1 &&
    timeout 120 "$OUT/gemm_check" 2>&1 | tee -a "$OUT/gemm-check.log"
  check_rc=${PIPESTATUS[0]}
  # FC1_SCHEDULES="cooperative pingpong": the checks under each PERFTRAIN_FC1_SCHEDULE, then fc1's timings
  # with the schedules alternating, twice (the clocks drift over a run: alternation keeps that out of the ratio)
  if [ -n "${FC1_SCHEDULES:-}" ]; then
    for sched in $FC1_SCHEDULES; do
      PERFTRAIN_FC1_SCHEDULE=$sched timeout 120 "$OUT/gemm_check" > "$OUT/schedule-check-$sched.log" 2>&1
      echo "[$sched] checks rc $?: $(grep -c PASS "$OUT/schedule-check-$sched.log") PASS, $(grep -c -- '-> FAIL' "$OUT/schedule-check-$sched.log") FAIL" | tee -a "$OUT/gemm-check.log"
      grep -- "-> FAIL" "$OUT/schedule-check-$sched.log" | head -5
    done
    # fc1's outputs to the bit, schedule against schedule (the digests of the check shapes)
    first=${FC1_SCHEDULES%% *}
    for sched in $FC1_SCHEDULES; do
      [ "$sched" = "$first" ] && continue
      if diff <(grep -o "fc1 check m=[0-9]* n=[0-9]* k=[0-9]*\|digest [0-9a-f]*" "$OUT/schedule-check-$first.log") \
              <(grep -o "fc1 check m=[0-9]* n=[0-9]* k=[0-9]*\|digest [0-9a-f]*" "$OUT/schedule-check-$sched.log") > /dev/null; then
        echo "[$sched] fc1 outputs bit-identical to [$first] at every check shape" | tee -a "$OUT/gemm-check.log"
      else
        echo "[$sched] fc1 outputs DIFFER from [$first]" | tee -a "$OUT/gemm-check.log"
      fi
    done
    for rep in 1 2; do
      for shape in "fc1 65536 1536 384" "fc1 65536 3072 768" "fc1 65536 4608 1152"; do
        for sched in $FC1_SCHEDULES; do
          echo "[$sched] $(PERFTRAIN_FC1_SCHEDULE=$sched timeout 60 "$OUT/gemm_check" $shape 2>&1)" | tee -a "$OUT/gemm-check.log"
        done
      done
    done
  fi
  # GEMM_VARIANTS="-DA=1;-DB=2 -DC=3": the checks and timings again per set of defines (';' between sets).
  # PROBES=1 adds the kernel's two timing probes (their checks fail by design: the probes skip work).
  variant_list="${GEMM_VARIANTS:-}"
  [ "${PROBES:-0}" = 1 ] &&
    variant_list="${variant_list:+$variant_list;}-DPERFTRAIN_GEMM_SM90_PROBE=1;-DPERFTRAIN_GEMM_SM90_PROBE=2"
  IFS=';' read -ra variants <<< "$variant_list"
  for defines in "${variants[@]}"; do
    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc $defines \
      tools/gemm_bias_gelu_check.cu src/kernels/gemm_bias_gelu_sm90.cu src/kernels/tensor_map.cpp -o "$OUT/gemm_variant" >> "$OUT/gemm-check.log" 2>&1
    timeout 120 "$OUT/gemm_variant" > "$OUT/variant-check.log" 2>&1
    echo "[$defines] checks: $(grep -c PASS "$OUT/variant-check.log") PASS, $(grep -c -- '-> FAIL' "$OUT/variant-check.log") FAIL" | tee -a "$OUT/gemm-check.log"
    grep "time" "$OUT/variant-check.log" | sed "s/^/[$defines] /" | tee -a "$OUT/gemm-check.log"
    rm -f "$OUT/gemm_variant" "$OUT/variant-check.log"
  done
  if [ -n "${NCU_SHAPE:-}" ]; then  # e.g. NCU_SHAPE="fc1 65536 3072 768": Nsight Compute on one timed launch
    timeout 300 ncu --set full -k regex:gemm_sm90 --launch-skip 3 --launch-count 1 ${NCU_ARGS:-} \
      "$OUT/gemm_check" $NCU_SHAPE > "$OUT/ncu-gemm.txt" 2>&1
    if [ -n "${NCU_METRICS:-}" ]; then  # named metrics on the same launch (a wrong name fails only this run)
      timeout 200 ncu --metrics "$NCU_METRICS" -k regex:gemm_sm90 --launch-skip 3 --launch-count 1 \
        "$OUT/gemm_check" $NCU_SHAPE > "$OUT/ncu-gemm-metrics.txt" 2>&1
      tail -n 30 "$OUT/ncu-gemm-metrics.txt"
    fi
    grep -E "Duration|Throughput|Warp Cycles|Issued|Eligible|Stall|L2 Hit|Registers|Achieved|Executed Ipc|Bank|sectors|Uncoalesced|excessive" \
      "$OUT/ncu-gemm.txt" | head -80
  fi
  row "gemm check" "rc $check_rc: $(grep -c -- "-> PASS" "$OUT/gemm-check.log") PASS, $(grep -c -- "-> FAIL" "$OUT/gemm-check.log") FAIL"
  rm -f "$OUT/gemm_check"
  cat "$SUMMARY"
  exit 0
fi

t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERFTRAIN_PYTHON="$PY" \
  -DPERFTRAIN_CARRY_DIR="$PWD/.carry" > "$OUT/build.log" 2>&1 &&
  ninja -C build-gpu -j "$JOBS" ${BUILD_TARGETS:-} >> "$OUT/build.log" 2>&1
build_rc=$?
row build "rc $build_rc, $(( $(date +%s) - t0 )) s"
if [ $build_rc -ne 0 ]; then grep -E "error|FAILED" "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; fi
BIN=./build-gpu/perftrain
RUNS=/tmp/perftrain-runs
rm -rf "$RUNS"
FMNIST="$PWD/.carry/fashion-mnist"

run_tests() {
  local t0=$(date +%s)
  if [ -n "${TEST_REGEX:-}" ]; then
    ctest --test-dir build-gpu -R "$TEST_REGEX" --output-on-failure -j 2 > "$OUT/tests.log" 2>&1
  elif [ "${TESTS:-gpu}" = all ]; then
    ctest --test-dir build-gpu --output-on-failure -j 8 > "$OUT/tests.log" 2>&1
  else
    ctest --test-dir build-gpu -L gpu --output-on-failure -j 2 > "$OUT/tests.log" 2>&1
  fi
  local rc=$?
  grep -E "^\s*[0-9]+/[0-9]+ Test.*(Failed|Exception|Timeout)|tests passed" "$OUT/tests.log" | tail -20
  row "tests (${TESTS:-gpu})" "rc $rc, $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed' "$OUT/tests.log")"
}

train_run() {  # name, extra flags...
  local name=$1; shift
  local t0=$(date +%s)
  $BIN train --data-path "$FMNIST" --runs-dir "$RUNS" --run-name "$name" "$@" > "$OUT/train-$name.log" 2>&1
  local rc=$?
  tail -4 "$OUT/train-$name.log"
  cp "$RUNS/$name/metrics.jsonl" "$OUT/metrics-$name.jsonl" 2>/dev/null
  cp "$RUNS/$name/report.md" "$OUT/report-$name.md" 2>/dev/null
  row "train $name" "rc $rc, $(( $(date +%s) - t0 )) s; $(grep -E 'first step done' "$OUT/train-$name.log"); $(grep -E '^step: ' "$OUT/train-$name.log" | head -1); $(grep -E '^\| speed ' "$RUNS/$name/report.md" 2>/dev/null | cut -d'|' -f3)"
}

bench_case() {  # "DiT-S/2:32,256", extra flags...
  local model=${1%%:*} batches=${1##*:}; shift
  local tag=$(echo "$model-$batches" | tr '/,' '-_')
  local t0=$(date +%s)
  $BIN bench --model "$model" --batch "$batches" --out "$RUNS/bench-$tag" "$@" ${BENCH_ARGS:-} > "$OUT/bench-$tag.log" 2>&1
  local rc=$?
  cat "$OUT/bench-$tag.log" | tail -30
  cp "$RUNS/bench-$tag/bench.json" "$OUT/bench-$tag.json" 2>/dev/null
  cp "$RUNS/bench-$tag/bench.md" "$OUT/bench-$tag.md" 2>/dev/null
  row "bench $model b$batches" "rc $rc, $(( $(date +%s) - t0 )) s"
}

[ "${RUN_TESTS:-0}" = 1 ] && [ "$MODE" != check ] && [ "$MODE" != debug ] && [ "$MODE" != tune ] && run_tests
case "$MODE" in
  debug)  # TEST_REGEX tests with their output, then BENCH_CASES profiled
    run_tests
    for c in ${BENCH_CASES:-DiT-S/2:32,256}; do
      bench_case "$c" --variants all --steps 20 --warmup 5 --profile all
      for f in "$RUNS"/bench-*/profile-*.md; do
        cp "$f" "$OUT/$(basename "$(dirname "$f")")-$(basename "$f")" 2>/dev/null
      done
    done
    if [ -n "${COMPARE_ENV:-}" ]; then  # the same bench with an environment switch, e.g. PERFTRAIN_BGRAD_EPILOGUE=1
      env $COMPARE_ENV $BIN bench --model DiT-S/2 --batch 32,256 --variants all --steps 20 --warmup 5 \
        --out "$RUNS/bench-compare" 2>&1 | grep -E "^DiT" | sed "s/^/[$COMPARE_ENV] /" | tee -a "$SUMMARY"
    fi
    ;;
  tune)  # gpu tests, then the `all` variant of BENCH_CASES under each switch of TUNE_ENVS and with --recompute
    [ "${RUN_TESTS:-1}" = 1 ] && run_tests
    for c in ${BENCH_CASES:-DiT-S/2:32,256 DiT-XL/2:256}; do
      model=${c%%:*} batches=${c##*:}
      for e in default ${TUNE_ENVS:-}; do
        envs=(); [ "$e" != default ] && envs=(${e//,/ })  # "A=1,B=2": both switches at once
        env "${envs[@]}" $BIN bench --model "$model" --batch "$batches" --variants all --steps 15 --warmup 4 \
          --out "$RUNS/tune-$RANDOM" 2>&1 | grep -E "^  batch |^DiT|^GEMM tuning|^  [A-Z_]+ m=" |
          sed "s|^|[$e] |" | tee -a "$SUMMARY"
      done
      [ "${RECOMPUTE:-1}" = 1 ] && $BIN bench --model "$model" --batch "$batches" --variants all --steps 15 \
        --warmup 4 --recompute --out "$RUNS/tune-$RANDOM" 2>&1 | grep -E "^  batch |^DiT" |
        sed "s|^|[--recompute] |" | tee -a "$SUMMARY"
      if [ "${PROFILE:-0}" = 1 ]; then  # where the time goes now, kernel by kernel
        tag=$(echo "$model-$batches" | tr '/,' '-_')
        pv=${PROFILE_VARIANT:-all}
        $BIN bench --model "$model" --batch "$batches" --variants "$pv" --steps 10 --warmup 4 --profile "$pv" \
          --out "$RUNS/profile-$tag" > "$OUT/profile-$tag.log" 2>&1
        for f in "$RUNS/profile-$tag"/profile-*.md; do cp "$f" "$OUT/$tag-$(basename "$f")" 2>/dev/null; done
        # Uncaptured variants: each kernel charged to the operation that launched it.
        [ "$pv" != all ] && [ "$pv" != graph ] && for f in "$RUNS/profile-$tag"/trace-*.json; do
          python3 tools/trace_kernels.py "$f" > "$OUT/$tag-by-op-$(basename "$f" .json).md" 2>&1
        done
      fi
    done
    ;;
  ncu)
    NCU="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
    [ -z "$NCU" ] && { echo "no ncu on this machine"; row ncu "not found"; }
    [ -n "$NCU" ] && for c in ${BENCH_CASES:-DiT-B/2:256}; do
      model=${c%%:*} batches=${c##*:}
      for e in default ${TUNE_ENVS:-}; do
        envs=(); [ "$e" != default ] && envs=(${e//,/ })
        tag=$(echo "$model-$batches-$e" | tr '/,=' '-_-')
        env "${envs[@]}" "$NCU" --kernel-name "regex:${NCU_KERNEL:-residual_adaln_backward}" \
          --launch-skip "${NCU_SKIP:-30}" --launch-count "${NCU_COUNT:-2}" \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
          --section LaunchStats --section WarpStateStats --section SchedulerStats ${NCU_ARGS:-} \
          $BIN bench --model "$model" --batch "$batches" --variants all --steps 2 --warmup 4 \
          --out "$RUNS/ncu-$RANDOM" > "$OUT/ncu-$tag.txt" 2>&1
        row "ncu $model b$batches [$e]" "rc $?, $(grep -E "Duration|DRAM Throughput" "$OUT/ncu-$tag.txt" | head -4 | tr -s ' ' | tr '\n' ';')"
      done
    done
    ;;
  check)
    run_tests
    bench_case "DiT-S/2:32,256" --steps 20 --warmup 5
    train_run fast --steps 300 --set log.sample_every=0 --set log.checkpoint_every=0
    ;;
  bench)
    for c in ${BENCH_CASES:-DiT-S/2:32,256 DiT-B/2:256 DiT-XL/2:256}; do
      bench_case "$c" --against-torch
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
  train)
    train_run fmnist --steps "${STEPS:-4000}"
    last=$(ls "$RUNS/fmnist/samples" 2>/dev/null | tail -1)
    [ -n "$last" ] && cp "$RUNS/fmnist/samples/$last" "$OUT/samples_final.png"
    ;;
esac

# Only a few files come back from the device machine: all but the summary,
# the bench reports and the curve verdict travel in one tarball.
(cd "$OUT" && keep='^(summary\.md|gpu\.txt|tests\.log|curve\.txt|logs\.tgz|bench-[^/]*\.(json|md))$' &&
  tar czf logs.tgz --remove-files $(ls | grep -Ev "$keep" | grep -v profile) $(ls | grep profile) 2>/dev/null)
echo
echo "| what | result |"
echo "|---|---|"
cat "$SUMMARY"

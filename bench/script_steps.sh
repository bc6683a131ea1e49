# Sourced by the bench/*_gpu.sh scripts that report a table even when a step fails (parity_gpu.sh,
# campaign_costs_gpu.sh): their steps and working directory. step needs LOGS, set by workdir.
# The check-and-measure scripts (qk_only_gpu.sh, swiglu_gpu.sh) take summary_step.
#
# step NAME LOG CMD...: runs CMD into $LOGS/LOG, records its exit status and seconds as a line
# {"name", "rc", "seconds"} of $LOGS/status.jsonl, and says when it failed (with the log's last lines).
step() {
  local name="$1" log="$LOGS/$2" t0 rc ms
  shift 2
  t0=$(date +%s%N)
  "$@" > "$log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '{"name": "%s", "rc": %d, "seconds": %d.%03d}\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) \
    >> "$LOGS/status.jsonl"
  if [ $rc -ne 0 ]; then
    echo "FAILED: $name (rc $rc); the end of $(basename "$log"):"
    tail -n 5 "$log"
  fi
  return $rc
}

# workdir NAME: the script's directory W=$RUNS/NAME, its logs LOGS=$W/logs, the feature network's file
# FEATURES there; makes them and $OUT.
workdir() {
  W="$RUNS/$1"
  LOGS="$W/logs"
  FEATURES="$W/fmnist_features.safetensors"
  mkdir -p "$LOGS" "$OUT"
}

# train_features: perftrain eval's feature network, trained once on Fashion-MNIST into $FEATURES.
train_features() {
  step features features.log "$BIN" eval --train-features --features "$FEATURES" --data-path "$FMNIST"
}

# summary_start NAME: checks that tools/gpu_run.sh exported BIN, OUT, RUNS and PY; sets build (BIN's
# folder) and summary ($OUT/NAME-summary.txt, emptied).
summary_start() {
  : "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${RUNS:?}" "${PY:?}"
  build=$(dirname "$BIN")
  summary="$OUT/$1-summary.txt"
  : > "$summary"
}

# summary_step NAME LIMIT CMD...: runs CMD for at most LIMIT seconds into $OUT/NAME.log and appends
# "NAME: rc, seconds; gtest's PASSED/FAILED lines" to $summary (also printed); on failure, the failures.
summary_step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc $rc, $(($(date +%s) - t0)) s; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$name.log" | tr '\n' ' ')" |
    tee -a "$summary"
  [ $rc -eq 0 ] || grep -E '^\[  FAILED  \]|Failure|error' "$OUT/$name.log" | head -20
}

# Sourced by the bench/*_gpu.sh scripts that report a table even when a step fails (parity_gpu.sh,
# campaign_costs_gpu.sh): their steps and working directory. step needs LOGS, set by workdir.
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

# The H200 checks of the unrun work (grad_stats kernel, qk_norm_rope vector path, gpu tests, monitoring overhead): the first call after a cold build,
#   MODE=script SCRIPT=bench/h200/pending_checks_1.sh SCRIPT_TIMEOUT=590 tools/gpu_run.sh (after tools/fill_carry.sh)
set -u
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el "gpu tests"
ctest --test-dir build-gpu -L gpu --output-on-failure -j 2 --timeout 150 > "$OUT/tests.log" 2>&1
grep -E "tests passed|\(Failed\)|Exception|Timeout" "$OUT/tests.log" | tail -30
el "kernel benches"
timeout 60 ./build-gpu/bench/kernels/qk_norm_rope_bench > "$OUT/qk_norm_rope_bench.log" 2>&1; head -12 "$OUT/qk_norm_rope_bench.log"
timeout 90 ./build-gpu/bench/kernels/grad_stats_bench DiT-XL/2 DiT-S/2 > "$OUT/grad_stats_bench.log" 2>&1; tail -12 "$OUT/grad_stats_bench.log"
el "monitoring overhead"
for M in DiT-S/2 DiT-XL/2; do
  S=400; W=60; [ "$M" = DiT-XL/2 ] && S=100 && W=10
  for SET in "health.monitor_every=0" "health.monitor_every=50 --set health.grad_histograms=false" "health.monitor_every=50"; do
    d=/tmp/ovh-$(echo "$M-$SET" | tr -c 'a-zA-Z0-9' _)
    timeout 80 $BIN bench --model $M --batch 256 --variants all --warmup $W --steps $S --set $SET --out $d > $d.log 2>&1
    echo "$M $SET: $($PY -c "import json,sys; r=[x for x in json.load(open(sys.argv[1]))['rows'] if x['variant']=='all'][0]; print(r['ms_mean'], r['ms'])" $d/bench.json)"
  done
done
el done

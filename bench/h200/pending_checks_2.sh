# The H200 checks of the single-stream fused path after the copy and kernel changes: kernel profile (captured and by op) and the training script,
#   MODE=script SCRIPT=bench/h200/pending_checks_2.sh tools/gpu_run.sh
set -u
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for v in all fused; do
  timeout 120 $BIN bench --model SS-B/2 --batch 256 --image-size 32 --set model.cond_tokens=32 --set model.cond_dim=1024 \
    --profile $v --out /tmp/ssprof-$v > "$OUT/ssprof-$v.log" 2>&1
  cp /tmp/ssprof-$v/*.md "$OUT/" 2>/dev/null
  grep -E "direct_copy|CatArray|qk_norm_rope|^\| [a-z].*\| [0-9.]+ \| [0-9.]+%" "$OUT/ssprof-$v.log" | head -20
done
el "ss training"
timeout 240 bash bench/single_stream_gpu.sh > "$OUT/ss.log" 2>&1; grep -E "done:|first step|rror" "$OUT/ss.log"
el done

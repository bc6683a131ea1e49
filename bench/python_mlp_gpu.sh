#!/usr/bin/env bash
# perftrain's Python DiT step with its linear layers and MLPs on the C++ trainer's paths
# (perftrain.ops.linear, perftrain.ops.gelu_mlp: docs/guide/python.md), for
#   MODE=script SCRIPT=bench/python_mlp_gpu.sh tools/gpu_run.sh
# which builds and exports BIN, OUT, RUNS and PY. About 2 minutes on an H200:
#  1. the step times of DiT-B/2 at batch 256: bench/python_front_gpu.sh's cases cpp (the C++ trainer) and
#     perftrain (perftrain.nn + DeviceAdamW + capture_step), in front-table.md;
#  2. the kernel table of the same Python step run eagerly (uncaptured, so that the profiler sees each
#     launch), per step, in python-step-kernels.md: the kernels by total time, then the count of each
#     family the C++ paths leave out of the step: ATen's GELU backward (GeluBackward), ATen's sum reductions
#     (reduce_kernel: bias gradients), elementwise copies and casts (a bf16 gradient cast to fp32), and the
#     cuBLASLt products with a GELU epilogue.
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${RUNS:?}" "${PY:?}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHONPATH="$(cd "$(dirname "$BIN")" && pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH

CASES="cpp perftrain" MODELS="DiT-B/2" bash "$ROOT/bench/python_front_gpu.sh"

"$PY" - <<'PYEOF' 2>&1 | tee "$OUT/python-step-kernels.md"
import collections
import re

import torch
import torch.nn.functional as F

import perftrain.nn as pnn
from perftrain.optim import DeviceAdamW

STEPS, BATCH = 3, 256
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
with torch.device("cuda"):
    model = pnn.DiT_models["DiT-B/2"](input_size=32, num_classes=1000, learn_sigma=False).train()
    x, t = torch.randn(BATCH, 4, 32, 32), torch.randint(0, 1000, (BATCH,))
    y = torch.randint(0, 1000, (BATCH,))
opt = DeviceAdamW(model, lr=1e-4, weight_decay=0, ema_decay=0.9999, compute_dtype=torch.bfloat16)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x, t, y)
    loss = F.mse_loss(out.float(), x)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


for _ in range(5):
    step()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
rows = sorted(((a.key, a.count / STEPS, a.device_time_total / STEPS / 1e3) for a in prof.key_averages()
               if a.device_time_total > 0), key=lambda r: -r[2])
print(f"### DiT-B/2 b{BATCH}, one eager perftrain step ({torch.cuda.get_device_name()}), per step\n")
print(f"total kernel time {sum(r[2] for r in rows):.2f} ms\n")
print("| kernel | launches | ms |\n|---|---|---|")
for name, n, ms in rows[:40]:
    print(f"| `{name[:110]}` | {n:g} | {ms:.3f} |")
families = {"GELU backward passes (ATen's; ours: gelu_backward_partials)": r"(?i)gelu_?backward",
            "ATen sum reductions": r"reduce_kernel", "elementwise copies and casts": r"(?i)copy",
            "other kernels named gelu (cuBLASLt epilogues)": r"(?i)gelu(?!_?backward)"}
print("\n| family | launches | ms |\n|---|---|---|")
for label, pattern in families.items():
    hit = [r for r in rows if re.search(pattern, r[0])]
    print(f"| {label} | {sum(r[1] for r in hit):g} | {sum(r[2] for r in hit):.3f} |")
PYEOF
exit 0

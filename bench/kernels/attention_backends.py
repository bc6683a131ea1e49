"""Which attention backend and layout is fastest for a DiT's shapes?

Times forward + backward of softmax(q k^T / sqrt(d)) v on the GPU for each
SDPA backend PyTorch offers (cuDNN, flash, memory-efficient), with q, k, v
either as strided views of one packed qkv [B, T, 3, H, D] tensor (what the
qkv projection writes) or as contiguous [B, H, T, D] tensors, and with the
head dimension zero-padded to the next multiple of 16/32 (the result is the
same: padding q and k with zeros leaves q k^T alone, padding v adds zero
columns to the output). Medians of CUDA-event timings after warm-up.

    python3 bench/kernels/attention_backends.py --batch 256 --tokens 256 --heads 16 --head-dim 72

On the GPU machine: tools/gpu_run.sh MODE=lab LAB=attention_backends.py
LAB_ARGS="--batch 256 --heads 16 --head-dim 72". perftrain's own whole-head
kernels against cuDNN's: perftrain bench --set speed.attention=cudnn.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def make_inputs(b, t, h, d, pad_to, layout, gen):
    dp = pad_to or d
    qkv = torch.randn(b, t, 3, h, dp, device="cuda", dtype=torch.bfloat16, generator=gen)
    if dp != d:
        qkv[..., d:] = 0
    if layout == "packed":
        q, k, v = qkv.unbind(2)  # [B, T, H, D] views with row stride 3*H*D
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    else:
        q, k, v = (x.transpose(1, 2).contiguous() for x in qkv.unbind(2))
    for x in (q, k, v):
        x.requires_grad_(True)
    return q, k, v


def time_case(backend, b, t, h, d, pad_to, layout, steps, warmup):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = make_inputs(b, t, h, d, pad_to, layout, gen)
    dout = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1.0 / math.sqrt(d)
    times = []
    with sdpa_kernel([backend]):
        for i in range(warmup + steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = F.scaled_dot_product_attention(q, k, v, scale=scale)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
            end.record()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
    # fwd 4 T^2 D H per sample (two products), backward 2.5x that; counted at the real head dim.
    flops = 3.5 * 4 * b * h * t * t * d
    ms = statistics.median(times)
    return ms, flops / ms / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=72)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    d = a.head_dim
    pads = [None] + sorted({x for x in (((d + 15) // 16) * 16, ((d + 31) // 32) * 32, 128) if x > d})
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    print(f"attention fwd+bwd B={a.batch} T={a.tokens} H={a.heads} D={d} bf16, {torch.cuda.get_device_name()}")
    print("| backend | layout | head dim run | ms | TFLOP/s (at D) |")
    print("|---|---|---|---|---|")
    for name, backend in backends.items():
        for layout in ("packed", "contiguous"):
            for pad in pads:
                try:
                    ms, tf = time_case(backend, a.batch, a.tokens, a.heads, d, pad, layout, a.steps, a.warmup)
                    print(f"| {name} | {layout} | {pad or d} | {ms:.3f} | {tf:.0f} |", flush=True)
                except Exception as e:  # a backend refusing a shape is a result too
                    msg = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
                    print(f"| {name} | {layout} | {pad or d} | refused | {msg} |", flush=True)


if __name__ == "__main__":
    main()

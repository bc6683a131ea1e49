#!/usr/bin/env python3
"""Records a torch.profiler trace of bench/reference_dit.py's training step, as any PyTorch user would:
the reference DiT (facebookresearch/DiT's model), AdamW (fused on a GPU), bf16 autocast unless
--mode eager-fp32, the --mode's torch.compile, one fixed synthetic batch; --warmup steps unprofiled
(torch.compile compiles there), then torch.profiler.profile with schedule(wait=1, warmup=1,
active=--active) and export_chrome_trace(--out). Prints the median of --timed steps without the
profiler (each step synchronized: a step alone) for comparison. For bench/diagnose_gpu.sh (perftrain diagnose on the trace).

  python3 bench/profile_reference_dit.py --model DiT-B/2 --batch 256 --mode compile --out trace.json
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_dit as ref  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="DiT-B/2")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--mode", choices=ref.MODES, default="eager-bf16")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--timed", type=int, default=10, help="steps timed without the profiler")
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test of this script")
    p.add_argument("--perftrain-profile", action="store_true",
                   help="record with perftrain.profile.record_trace instead (the built package on PYTHONPATH): "
                        "the trace then carries the unprofiled step and nvidia-smi's samples")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("profile_reference_dit.py: no CUDA device (--device cpu for a smoke test)")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    depth, hidden, heads, patch = ref.CONFIGS[args.model]
    model = ref.DiT(input_size=32, patch_size=patch, in_channels=4, hidden_size=hidden, depth=depth,
                    num_heads=heads, num_classes=1000, learn_sigma=True).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0, fused=cuda)
    step_model = model
    if args.mode == "compile":
        step_model = torch.compile(model)
    elif args.mode == "reduce-overhead":
        step_model = torch.compile(model, mode="reduce-overhead")
    amp = None if args.mode == "eager-fp32" or not cuda else torch.bfloat16
    ddpm = ref.DDPMLinear(device=dev)
    x0 = torch.randn(args.batch, 4, 32, 32, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)

    def step():
        ref.train_step(step_model, opt, ddpm, x0, y, amp, mark_cudagraph_step=args.mode == "reduce-overhead")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if args.perftrain_profile:
        from perftrain.profile import record_trace
        path = record_trace(step, trace=args.out, steps=args.active, warmup=args.warmup, timed_steps=args.timed)
        print(f"{args.model} b{args.batch} {args.mode}: trace {path} (perftrain.profile.record_trace)")
        return

    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.timed):
        t0 = time.perf_counter()
        step()
        sync()  # a step timed alone: its own launches and kernels, nothing queued behind it
        times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    sched = torch.profiler.schedule(wait=1, warmup=1, active=args.active, repeat=1)
    with torch.profiler.profile(activities=acts, schedule=sched, record_shapes=True) as prof:
        for _ in range(2 + args.active):
            step()
            prof.step()
    sync()
    prof.export_chrome_trace(args.out)
    print(f"{args.model} b{args.batch} {args.mode}: {ms:.3f} ms per step without the profiler; trace {args.out}")


if __name__ == "__main__":
    main()

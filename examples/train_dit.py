#!/usr/bin/env python3
"""A DiT training loop in the shape of facebookresearch/DiT's train.py, and the same loop on perftrain.

Plain: DiT's model (bench/reference_dit.py, its models.py with the same names), torch.optim.AdamW, an EMA
of the weights after every step, bf16 autocast, DDPM noise prediction on latents (synthetic by default,
or --latents FILE.safetensors with `latents` [N, 4, S, S] and `labels` [N]). --compile MODE wraps the
model in torch.compile. --perftrain switches the model, the optimizer and the step to perftrain: the lines
marked `# [perftrain]` (eight) are all that changes.

Prints the step time (CUDA events; median, p10 and p90 after --warmup steps) and the time from the
process start to the end of the first step; --json prints one JSON line instead.

  PYTHONPATH=build/python python examples/train_dit.py --model DiT-B/2 --batch-size 256 --perftrain
  python examples/train_dit.py --model DiT-B/2 --batch-size 256 --compile reduce-overhead
"""
import time

_T_IMPORT = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from copy import deepcopy  # noqa: E402
from functools import partial  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import reference_dit  # noqa: E402 -- facebookresearch/DiT's models.py, written out (same names and maths)

COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Seconds from the process start to each point before the first step (where a first step's time goes).
_MARKS = {}


def mark(name):
    _MARKS[name] = round(time.time() - process_start_time(), 2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="DiT-B/2", choices=sorted(reference_dit.CONFIGS))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=256, choices=[256, 512], help="pixels (latents: 1/8)")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--learn-sigma", action=argparse.BooleanOptionalAction, default=False,
                   help="2x output channels, as DiT's models (the loss reads the noise half only)")
    p.add_argument("--latents", help="safetensors with latents [N, 4, S, S] and labels [N] (default: synthetic)")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (compile and capture happen here)")
    p.add_argument("--compile", default="none", choices=COMPILE_MODES, help="torch.compile the model")
    p.add_argument("--compile-regions", action="store_true",
                   help="with --compile, on DiT's own model: torch.compile each block instead of the whole model "
                        "(PyTorch's regional compilation: one graph for all the blocks, so the cold compile does "
                        "not grow with the depth)")
    p.add_argument("--perftrain", action="store_true", help="perftrain.nn, DeviceAdamW and capture_step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke run (wall-clock times; capture_step falls back to eager)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--first-step-table", metavar="FILE",
                   help="torch.profiler over the first step: its host calls by total time (FILE), where its seconds go")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--batch-size and --steps must be >= 1, --warmup >= 0")
    if args.first_step_table and not os.path.isdir(os.path.dirname(os.path.abspath(args.first_step_table))):
        p.error(f"--first-step-table {args.first_step_table}: its folder does not exist")
    if args.perftrain and args.compile in ("reduce-overhead", "max-autotune"):
        p.error(f"--compile {args.compile} makes CUDA graphs of its own; with --perftrain the whole step is "
                "already one graph: use default or max-autotune-no-cudagraphs")
    if args.compile_regions and (args.compile == "none" or args.perftrain):
        p.error("--compile-regions compiles the blocks of DiT's own model: it needs --compile, and not --perftrain "
                "(perftrain.nn's DiT runs its blocks' fused pieces, not block(x, c))")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available (--device cpu for a smoke run)")
    return args


# DiT's `models` module (its DiT_models registry: name -> constructor) over the reference model.
PLAIN_MODELS = SimpleNamespace(DiT_models={
    name: partial(reference_dit.DiT, depth=d, hidden_size=h, num_heads=n, patch_size=p)
    for name, (d, h, n, p) in reference_dit.CONFIGS.items()})


@torch.no_grad()
def update_ema(ema_model, model, decay=0.9999):
    """DiT's update_ema (ema = decay * ema + (1 - decay) * param), one foreach lerp over the parameters."""
    ema_params = dict(ema_model.named_parameters())
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    torch._foreach_lerp_([ema_params[n] for n in names], [params[n] for n in names], 1 - decay)


def load_batches(args, device, latent, count=4):
    """`count` batches on the device: synthetic latents and labels, or drawn from --latents."""
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    if args.latents is None:
        return [(torch.randn(args.batch_size, 4, latent, latent, generator=g).to(device),
                 torch.randint(0, args.num_classes, (args.batch_size,), generator=g).to(device))
                for _ in range(count)]
    from safetensors.torch import load_file
    data = load_file(args.latents)
    x, y = data["latents"].float(), data["labels"].long()
    idx = [torch.randint(0, x.shape[0], (args.batch_size,), generator=g) for _ in range(count)]
    return [(x[i].to(device), y[i].to(device)) for i in idx]


def main(argv=None):
    mark("torch imported")
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    latent = args.image_size // 8
    models = PLAIN_MODELS
    if args.perftrain:  # [perftrain]
        import perftrain.nn as models  # [perftrain]
        from perftrain.optim import DeviceAdamW  # [perftrain]
        from perftrain.capture import capture_step  # [perftrain]

    with torch.device(device):  # initialised where it trains: seconds less to the first step for DiT-XL
        model = models.DiT_models[args.model](input_size=latent, num_classes=args.num_classes,
                                              learn_sigma=args.learn_sigma).train()
    mark("model built")  # (perftrain imported before it)
    ema = None if args.perftrain else deepcopy(model).requires_grad_(False).eval()  # [perftrain]
    if args.perftrain:  # [perftrain]
        opt = DeviceAdamW(model, lr=1e-4, weight_decay=0, ema_decay=0.9999, compute_dtype=torch.bfloat16)  # [perftrain]
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0, fused=device.type == "cuda")
    forward, mode = model, None if args.compile == "default" else args.compile
    if args.compile_regions:
        reference_dit.compile_regions(model, mode)
    elif args.compile != "none":
        forward = torch.compile(model, mode=mode, fullgraph=args.perftrain)
    diffusion = reference_dit.DDPMLinear(device=device)
    mark("optimizer built")

    def train_step(x, y):
        if args.compile in ("reduce-overhead", "max-autotune"):
            torch.compiler.cudagraph_mark_step_begin()
        t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],), device=device)
        noise = torch.randn_like(x)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = forward(diffusion.q_sample(x, t, noise), t, y)
        loss = F.mse_loss(out[:, :x.shape[1]].float(), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ema is not None:
            update_ema(ema, model)
        return loss.detach()

    batches = load_batches(args, device, latent)
    static = [b.clone() for b in batches[0]]  # the buffers a captured step reads
    step = capture_step(train_step, *static, optimizer=opt) if args.perftrain else train_step  # [perftrain]

    ms, losses, first_step_s = run_steps(args, step, batches, device)
    report(args, ms, first_step_s, losses, step)


def run_steps(args, step, batches, device):
    """--warmup + --steps steps, cycling the batches -> (ms of each timed step, the losses, the seconds from
    the process start to the end of the first step). CUDA: CUDA events; CPU: the wall clock."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times, losses, first_step_s = [], [], None
    for i in range(args.warmup + args.steps):
        start, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (
            None, None)
        c0 = time.perf_counter()
        if cuda:
            start.record()
        if i == 0 and args.first_step_table:
            loss = profiled_first_step(args.first_step_table, step, batches[0], device)
        else:
            loss = step(*batches[i % len(batches)])
        if cuda:
            end.record()
        losses.append(loss.clone())
        if i == 0:
            sync()
            first_step_s = time.time() - process_start_time()
        if i >= args.warmup:
            times.append((start, end) if cuda else (time.perf_counter() - c0) * 1e3)
    sync()
    return [a.elapsed_time(b) for a, b in times] if cuda else times, losses, first_step_s


def profiled_first_step(path, step, batch, device):
    """The first step under torch.profiler (host calls, and the GPU's kernels on CUDA) -> its loss; writes the
    operators and runtime calls by their total host time to `path`."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        loss = step(*batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=60, max_name_column_width=70))
    return loss


def process_start_time():
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _T_IMPORT


def report(args, ms, first_step_s, losses, step):
    q = statistics.quantiles(ms, n=10) if len(ms) > 1 else [ms[0]] * 9
    median = statistics.median(ms)
    r = {"model": args.model, "batch": args.batch_size, "perftrain": args.perftrain, "compile": args.compile,
         "compile_regions": args.compile_regions,
         "ms_median": round(median, 3), "ms_p10": round(q[0], 3), "ms_p90": round(q[-1], 3),
         "images_per_s": round(args.batch_size / (median / 1e3), 1), "first_step_s": round(first_step_s, 2),
         "loss_first": round(losses[0].item(), 4), "loss_last": round(losses[-1].item(), 4),
         "startup_s": _MARKS, "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if args.device == "cuda" else None,
         "captured": getattr(step, "captured", None), "eager_reason": getattr(step, "eager_reason", None),
         "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__}
    if args.json:
        print(json.dumps(r))
        return
    what = ("perftrain" if args.perftrain else "plain") + ("" if args.compile == "none" else f" + compile {args.compile}")
    what += " (each block)" if args.compile_regions else ""
    print(f"{args.model} batch {args.batch_size}, {what}, on {r['device']} (torch {r['torch']})")
    print(f"  step {r['ms_median']:.2f} ms median (p10 {r['ms_p10']:.2f}, p90 {r['ms_p90']:.2f}), "
          f"{r['images_per_s']:.0f} img/s; first step {r['first_step_s']:.2f} s after start; "
          f"loss {r['loss_first']} -> {r['loss_last']}; peak {r['peak_gib']} GiB")
    print("  before the first step: " + ", ".join(f"{k} at {v} s" for k, v in _MARKS.items()))
    if r["eager_reason"]:
        print(f"  perftrain ran eagerly: {r['eager_reason']}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""DiT in plain PyTorch: the reference that perftrain is checked and measured against.

The model reproduces facebookresearch/DiT `models.py` (adaLN-Zero DiT) with the
same state_dict names and the same numerics, written from its description with
no timm: a checkpoint written by perftrain loads here with strict=True, and the
other way round.

Subcommands (model flags are shared: --model, --depth/--hidden/--heads/--patch,
--image-size, --in-channels, --num-classes, --learn-sigma, --class-dropout):
  params [--all] --json        parameter counts and tensor names/shapes (meta device)
  check  --weights W --inputs I --out O
                               fp32 CPU forward+backward, for the C++ cross-check
  init   --out W [--seed S]    write the reference-initialised state_dict
  bench  --batch B [--mode M]  one DDPM training step, timed as in docs/anchors; with --ddp one rank of
                               a DistributedDataParallel run started by
                               python -m torch.distributed.run --nproc-per-node N (--batch per rank).
                               Modes: eager-fp32, eager-bf16, and under torch.compile compile (its
                               default), reduce-overhead, max-autotune, max-autotune-no-cudagraphs,
                               float8-tensorwise, float8-rowwise (torchao), each also as <mode>-regional
                               (each block compiled on its own); a compiled mode reports whether its
                               graphs came from torch.compile's cache (TORCHINDUCTOR_CACHE_DIR) as
                               torch_cache warm / cold / partial
"""
import time

_T_IMPORT = time.time()  # fallback for "process start" where /proc is missing

import argparse
import contextlib
import json
import math
import os
import statistics
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------


def modulate(x, shift, scale):
    # x [B,T,D], shift/scale [B,D]
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def sincos_1d(dim, pos):
    """[M] positions -> [M, dim]: first half sin, second half cos (float64)."""
    assert dim % 2 == 0
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    angles = np.outer(pos.reshape(-1).astype(np.float64), omega)  # [M, dim/2]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_2d(dim, grid_size):
    """[grid_size**2, dim] fixed 2-D embedding as in MAE/DiT get_2d_sincos_pos_embed.

    Token k sits at row k // grid_size, column k % grid_size. The first dim/2
    channels encode the column (meshgrid puts w first), the last dim/2 the row.
    """
    assert dim % 2 == 0
    coords = np.arange(grid_size, dtype=np.float32)
    cols, rows = np.meshgrid(coords, coords)  # both [gs, gs]; cols varies along axis 1
    return np.concatenate([sincos_1d(dim // 2, cols), sincos_1d(dim // 2, rows)], axis=1)


class PatchEmbed(nn.Module):
    def __init__(self, patch, in_channels, hidden):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden, kernel_size=patch, stride=patch, bias=True)

    def forward(self, x):                      # x [B,C,H,W]
        x = self.proj(x)                       # [B,D,H/p,W/p]
        return x.flatten(2).transpose(1, 2)    # [B,T,D]


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden, freq_dim=256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    @staticmethod
    def frequency_embedding(t, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]                       # [B, half]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [B, 2*half]
        if dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb                                                    # [B, dim]

    def forward(self, t):                                        # t [B]
        return self.mlp(self.frequency_embedding(t, self.freq_dim))  # [B,D]


class LabelEmbedder(nn.Module):
    """Class embedding; the extra last row is the "no class" token used for CFG dropout."""

    def __init__(self, num_classes, hidden, dropout_prob):
        super().__init__()
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden)

    def token_drop(self, labels, force_drop_ids=None):
        if force_drop_ids is None:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop = force_drop_ids == 1
        return torch.where(drop, self.num_classes, labels)

    def forward(self, labels, train, force_drop_ids=None):      # labels [B] int64
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)                      # [B,D]


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        assert hidden % heads == 0, f"hidden {hidden} is not divisible by heads {heads}"
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=True)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):                                        # x [B,N,D]
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, D // self.heads)  # [B,N,3,H,Dh]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)           # each [B,H,N,Dh]
        x = F.scaled_dot_product_attention(q, k, v)              # [B,H,N,Dh], scale 1/sqrt(Dh)
        x = x.transpose(1, 2).reshape(B, N, D)                   # [B,N,D]
        return self.proj(x)                                      # [B,N,D]


class Mlp(nn.Module):
    def __init__(self, hidden, mlp_hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, mlp_hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(mlp_hidden, hidden)

    def forward(self, x):                                        # x [B,N,D]
        return self.fc2(self.act(self.fc1(x)))                   # [B,N,4D] -> [B,N,D]


class DiTBlock(nn.Module):
    def __init__(self, hidden, heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden, bias=True))

    def forward(self, x, c):                                     # x [B,T,D], c [B,D]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = \
            self.adaLN_modulation(c).chunk(6, dim=1)             # 6 x [B,D]
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))  # [B,T,D]
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))   # [B,T,D]
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden, patch, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden, bias=True))

    def forward(self, x, c):                                     # x [B,T,D], c [B,D]
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)  # 2 x [B,D]
        return self.linear(modulate(self.norm_final(x), shift, scale))  # [B,T,p*p*Cout]


class DiT(nn.Module):
    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28,
                 num_heads=16, mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=1000, learn_sigma=True):
        super().__init__()
        if input_size % patch_size:
            raise ValueError(f"input size {input_size} is not divisible by patch size {patch_size}")
        self.learn_sigma = learn_sigma
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.num_heads = num_heads
        self.grid = input_size // patch_size
        num_patches = self.grid ** 2

        self.x_embedder = PatchEmbed(patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        # Fixed sin-cos embedding: a parameter (so it is in the state_dict) that is never trained.
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if not self.pos_embed.is_meta:  # meta tensors hold no data to copy into
            pe = sincos_2d(self.pos_embed.shape[-1], self.grid)
            self.pos_embed.data.copy_(torch.from_numpy(pe).float().unsqueeze(0))
        w = self.x_embedder.proj.weight.data  # like a Linear over the flattened patch
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        # adaLN-Zero: every residual branch and the output start at zero.
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def unpatchify(self, x):                                     # x [B,T,p*p*C]
        c, p, h = self.out_channels, self.patch_size, self.grid
        x = x.reshape(x.shape[0], h, h, p, p, c)                 # [B,h,w,p,p,C]
        x = torch.einsum("nhwpqc->nchpwq", x)                    # [B,C,h,p,w,p]
        return x.reshape(x.shape[0], c, h * p, h * p)            # [B,C,H,W]

    def forward(self, x, t, y):                                  # x [B,C,H,W], t [B], y [B]
        x = self.x_embedder(x) + self.pos_embed                  # [B,T,D]
        t = self.t_embedder(t)                                   # [B,D]
        y = self.y_embedder(y, self.training)                    # [B,D]
        c = t + y                                                # [B,D]
        for block in self.blocks:
            x = block(x, c)                                      # [B,T,D]
        x = self.final_layer(x, c)                               # [B,T,p*p*Cout]
        return self.unpatchify(x)                                # [B,Cout,H,W]


# name -> (depth, hidden, heads, patch)
CONFIGS = {}
for _size, (_d, _h, _n) in {"XL": (28, 1152, 16), "L": (24, 1024, 16),
                             "B": (12, 768, 12), "S": (12, 384, 6)}.items():
    for _p in (2, 4, 8):
        CONFIGS[f"DiT-{_size}/{_p}"] = (_d, _h, _n, _p)


def forward_flops_per_image(depth, hidden, patch, input_size=32, in_channels=4,
                            out_channels=4, mlp_ratio=4.0, freq_dim=256):
    """Forward FLOPs (2 per multiply-add) of the matrix products and attention for one image."""
    T, D, M = (input_size // patch) ** 2, hidden, int(hidden * mlp_ratio)
    per_block = (2 * T * D * 3 * D        # qkv
                 + 2 * T * T * D          # Q K^T (all heads)
                 + 2 * T * T * D          # P V
                 + 2 * T * D * D          # proj
                 + 2 * T * D * M * 2      # fc1 + fc2
                 + 2 * D * 6 * D)         # adaLN (once per image)
    return (2 * T * in_channels * patch * patch * D      # patch embedding
            + 2 * (freq_dim * D + D * D)                 # t-embedder MLP
            + depth * per_block
            + 2 * D * 2 * D                              # final adaLN
            + 2 * T * D * patch * patch * out_channels)  # final linear


# ----------------------------------------------------------------------------
# Training step and benchmark
# ----------------------------------------------------------------------------

# The modes under torch.compile (compile: its default mode) with torch.compile's mode argument.
WHOLE_MODEL_COMPILE_MODES = {"compile": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune",
                             "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
                             "float8-tensorwise": None, "float8-rowwise": None}
# Each compiled mode also as "<mode>-regional": PyTorch's regional compilation (its recipe "Reducing torch.compile
# cold start compilation time with regional compilation", as torchtitan compiles its models): torch.compile on each
# transformer block, the rest eager. The blocks share one compiled graph, so the cold compile does not grow with
# the depth: for deep models whose whole-model compile outlasts a device call (max-autotune, torchao's float8 at
# DiT-XL/2).
REGIONAL_SUFFIX = "-regional"
COMPILE_MODES = {**WHOLE_MODEL_COMPILE_MODES,
                 **{m + REGIONAL_SUFFIX: a for m, a in WHOLE_MODEL_COMPILE_MODES.items()}}
MODES = ("eager-fp32", "eager-bf16") + tuple(COMPILE_MODES)
# torchao's float8 training (its recipe by name) under torch.compile's default mode, as torchao's guide runs it:
# the anchor of perftrain's train.precision = "fp8".
FLOAT8_RECIPES = {m: r for base, r in (("float8-tensorwise", "tensorwise"), ("float8-rowwise", "rowwise"))
                  for m in (base, base + REGIONAL_SUFFIX)}
CUDAGRAPH_MODES = tuple(m for m, a in COMPILE_MODES.items() if a in ("reduce-overhead", "max-autotune"))


def float8_linear_filter(module, fqn):
    """The layers perftrain's fp8 precision runs in fp8: the blocks' linears (attention's qkv and out, the MLP's
    or SwiGLU's), not the per-sample adaLN modulation, with both sizes multiples of 16 (the fp8 products' rule)."""
    return (isinstance(module, torch.nn.Linear) and fqn.startswith("blocks.") and "adaLN" not in fqn
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert_float8(model, recipe):
    """model's block linears as torchao's Float8Linear with recipe ("tensorwise" or "rowwise"); returns how many."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        fail(f"mode float8-{recipe} needs torchao ({e}); pip install torchao, or on the GPU machine let "
             "tools/fill_carry.sh carry its wheel")
    before = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=float8_linear_filter)
    return before - sum(type(m) is torch.nn.Linear for m in model.modules())


def compile_regions(model, mode):
    """torch.compile(mode=mode) on each outermost module of model whose class name ends in "Block" (DiT's
    DiTBlock, the single-stream Block; a looped model's prelude, shared and coda blocks), in place, so that the
    state_dict's names stay; returns how many. Fails where the model has none."""
    blocks, inside = [], set()
    for name, m in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        if type(m).__name__.endswith("Block"):
            blocks.append(m)
            inside.add(name)
    if not blocks:
        fail(f"a -regional mode compiles each block, and {type(model).__name__} has no module named *Block")
    for b in blocks:
        b.compile(mode=mode)
    return len(blocks)


def compile_cache_counts():
    """(hits, misses): the graphs torch.compile found in its cache (TORCHINDUCTOR_CACHE_DIR) and those it
    compiled (not found, or not cacheable), in this process so far."""
    from torch._dynamo.utils import counters
    c = counters["inductor"]
    return c["fxgraph_cache_hit"], c["fxgraph_cache_miss"] + c["fxgraph_cache_bypass"]


def cache_state(hits, misses):
    """warm: every graph found in the cache; cold: none; partial: some."""
    return "warm" if misses == 0 and hits > 0 else "cold" if hits == 0 else "partial"


def process_start_time():
    """Wall-clock time at which this process started (Linux /proc), else import time."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _T_IMPORT


class DDPMLinear:
    """DDPM forward process with DiT's linear beta schedule (1e-4 .. 0.02 over 1000 steps)."""

    def __init__(self, num_timesteps=1000, device="cpu"):
        scale = 1000 / num_timesteps
        betas = torch.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=torch.float64)
        acp = torch.cumprod(1 - betas, dim=0)
        self.num_timesteps = num_timesteps
        self.sqrt_acp = acp.sqrt().float().to(device)
        self.sqrt_1m_acp = (1 - acp).sqrt().float().to(device)

    def q_sample(self, x0, t, noise):                            # x0/noise [B,C,H,W], t [B]
        return self.sqrt_acp[t].view(-1, 1, 1, 1) * x0 + self.sqrt_1m_acp[t].view(-1, 1, 1, 1) * noise


def train_step(model, opt, ddpm, x0, y, amp_dtype, mark_cudagraph_step=False, ema=None, cond=()):
    """One step: sample t and noise, forward, MSE against the noise (plus the model's auxiliary loss when it
    returns (out, aux)), backward, AdamW, zero_grad;
    with ema = (ema_params, params, decay) also the EMA update, one foreach lerp. cond: more model
    inputs after y (the single-stream model's condition features and lengths)."""
    if mark_cudagraph_step:
        torch.compiler.cudagraph_mark_step_begin()
    t = torch.randint(0, ddpm.num_timesteps, (x0.shape[0],), device=x0.device)  # [B]
    noise = torch.randn_like(x0)                                                # [B,C,H,W]
    x_t = ddpm.q_sample(x0, t, noise)                                           # [B,C,H,W]
    amp = torch.autocast(x0.device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    with amp:
        out = model(x_t, t, y, *cond)                           # [B,Cout,H,W]
    aux = None
    if isinstance(out, tuple):                                  # (out, aux): a model's own auxiliary loss
        out, aux = out
    loss = F.mse_loss(out[:, :x0.shape[1]].float(), noise)      # the eps part (sigma, if learnt, ignored)
    if aux is not None:
        loss = loss + aux
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if ema is not None:
        ema_params, params, decay = ema
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - decay)
    return loss


def ddp_setup(args):
    """--ddp: this process is one rank of a run started by torch.distributed.run (LOCAL_RANK, RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): the process group (NCCL on CUDA, Gloo on the CPU) and this
    rank's device. Returns (device, rank, world_size)."""
    import datetime
    import torch.distributed as dist
    if "LOCAL_RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        fail("--ddp runs as one rank of python -m torch.distributed.run --nproc-per-node N reference_dit.py "
             "bench ... (LOCAL_RANK and WORLD_SIZE are not set)")
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    local = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.ddp_timeout))
    return (torch.device("cuda", local) if cuda else torch.device("cpu")), dist.get_rank(), dist.get_world_size()


def run_bench(args, name, build, make_inputs, train_flops_per_image):
    """The timing protocol both references share: build() the model (on the CPU, moved to the device), AdamW
    (fused on a GPU), the --ema copy, the --mode's torch.compile; one fixed synthetic batch
    make_inputs(dev) -> (x0, y, cond) (cond: more model inputs, see train_step); --warmup untimed then --steps
    timed steps (CUDA events on a GPU); the first step timed from the start of the process.
    --ddp: the model wrapped in DistributedDataParallel (torch.compile then compiles the wrapped model, as
    DDP users do), --batch images per rank, each rank its own batch; rank 0 alone returns the result
    (its own step times, and every rank's median), the others None."""
    t_start = process_start_time()
    ddp = getattr(args, "ddp", False)
    if ddp:
        dev, rank, world = ddp_setup(args)
    else:
        dev, rank, world = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")), 0, 1
    cuda = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)  # the same initial weights on every rank

    model = build().to(dev).train()
    float8_layers = convert_float8(model, FLOAT8_RECIPES[args.mode]) if args.mode in FLOAT8_RECIPES else None
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0, **({"fused": True} if cuda else {}))
    ema = ([p.detach().clone() for p in params], params, args.ema) if args.ema > 0 else None
    step_model = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        step_model = DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    regions = None
    if args.mode.endswith(REGIONAL_SUFFIX):
        regions = compile_regions(model, COMPILE_MODES[args.mode])
    elif args.mode in COMPILE_MODES:
        step_model = torch.compile(step_model, mode=COMPILE_MODES[args.mode])
    amp_dtype = None if args.mode == "eager-fp32" else torch.bfloat16

    ddpm = DDPMLinear(device=dev)
    B = args.batch
    torch.manual_seed(args.seed + rank)  # each rank its own data
    x0, y, cond = make_inputs(dev)  # synthetic, fixed

    def now_ms():
        return time.perf_counter() * 1e3

    times, first_step_s = [], None
    for i in range(args.warmup + args.steps):
        if cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        else:
            c0 = now_ms()
        train_step(step_model, opt, ddpm, x0, y, amp_dtype, mark_cudagraph_step=args.mode in CUDAGRAPH_MODES,
                   ema=ema, cond=cond)
        if cuda:
            ev1.record()
        if i == 0:
            if cuda:
                torch.cuda.synchronize()
            first_step_s = time.time() - t_start
        if i >= args.warmup:
            times.append((ev0, ev1) if cuda else now_ms() - c0)
    if cuda:
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in times]

    q = np.percentile(times, [10, 90]) if times else [float("nan")] * 2
    ms = statistics.median(times) if times else float("nan")
    rank_ms = [ms]
    if ddp:
        import torch.distributed as dist
        rank_ms = [None] * world
        dist.all_gather_object(rank_ms, ms)
        dist.barrier()  # print_bench ends the process (os._exit): no rank leaves while another still reads
        if rank != 0:
            return None
    flops = train_flops_per_image * B
    hits, misses = compile_cache_counts() if args.mode in COMPILE_MODES else (None, None)
    return {
        "model": name, "batch": B, "mode": args.mode,
        "ms_median": round(ms, 4), "ms_p10": round(float(q[0]), 4), "ms_p90": round(float(q[1]), 4),
        "images_per_s": round(B / (ms / 1e3), 2),
        "tflops": round(flops / (ms / 1e3) / 1e12, 3),
        "peak_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 3) if cuda else None,
        "first_step_s": round(first_step_s, 3),
        # A compiled mode's graphs found in torch.compile's cache and compiled here (rank 0's).
        "torch_cache": cache_state(hits, misses) if hits is not None else None,
        "torch_cache_hits": hits,
        "torch_cache_misses": misses,
        "torch": torch.__version__,
        # float8 modes: torchao's version and the block linears it converted.
        "float8_layers": float8_layers,
        "torchao": __import__("torchao").__version__ if float8_layers is not None else None,
        # -regional modes: the blocks compiled one by one.
        "compiled_regions": regions,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        # DDP: ms_median and images_per_s are rank 0's (per GPU); the total counts every rank's images at the
        # slowest rank's median.
        "world_size": world,
        "rank_ms_median": [round(x, 4) for x in rank_ms],
        "images_per_s_total": round(world * B / (max(rank_ms) / 1e3), 2),
    }


def check_bench_args(args):
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        fail("--batch and --steps must be >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is available")


def print_bench(r, args):
    if getattr(args, "ddp", False):
        # A DDP rank ends here without the interpreter's teardown: Gloo's threads, torn down at exit while the
        # other rank is still closing its connections, abort the process now and then ("terminate called
        # without an active exception") after a successful run.
        if r is not None:
            print_result(r, args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    print_result(r, args)


def print_result(r, args):
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['model']} batch {r['batch']} {r['mode']} on {r['device']} (torch {r['torch']})")
        print(f"  step {r['ms_median']:.2f} ms median (p10 {r['ms_p10']:.2f}, p90 {r['ms_p90']:.2f}), "
              f"{r['images_per_s']:.1f} img/s, {r['tflops']:.1f} TFLOP/s")
        cache = f" (torch.compile's cache {r['torch_cache']})" if r.get("torch_cache") else ""
        print(f"  peak memory {r['peak_gib']} GiB, first step {r['first_step_s']:.2f} s after process start{cache}")


def add_bench_args(s):
    """The bench subcommand's own flags (both references)."""
    s.add_argument("--batch", type=int, required=True)
    s.add_argument("--mode", choices=MODES, default="eager-bf16")
    s.add_argument("--steps", type=int, default=30)
    s.add_argument("--warmup", type=int, default=6)
    s.add_argument("--ema", type=float, default=0.0,
                   help="> 0: an EMA of the weights with this decay, updated after every step (timed)")
    s.add_argument("--objective", choices=["ddpm"], default="ddpm")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda if available")
    s.add_argument("--json", action="store_true")
    s.add_argument("--ddp", action="store_true",
                   help="one rank of DistributedDataParallel, under python -m torch.distributed.run "
                        "--nproc-per-node N (NCCL on CUDA, Gloo on the CPU); --batch per rank; rank 0 prints")
    s.add_argument("--ddp-timeout", type=float, default=300, help="seconds for --ddp's collectives")


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------


def fail(msg):
    print(f"reference_dit.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def resolve_config(args, learn_sigma_default=True):
    """Registry entry of --model, with any explicit --depth/--hidden/--heads/--patch on top."""
    if args.model not in CONFIGS:
        fail(f"unknown model {args.model!r}; known: {', '.join(CONFIGS)}")
    depth, hidden, heads, patch = CONFIGS[args.model]
    overrides = {k: getattr(args, k) for k in ("depth", "hidden", "heads", "patch") if getattr(args, k) is not None}
    depth, hidden = overrides.get("depth", depth), overrides.get("hidden", hidden)
    heads, patch = overrides.get("heads", heads), overrides.get("patch", patch)
    name = args.model if not overrides else f"DiT-d{depth}-h{hidden}-H{heads}/{patch}"
    return dict(name=name, input_size=args.input_size, patch_size=patch, in_channels=args.in_channels,
                hidden_size=hidden, depth=depth, num_heads=heads, mlp_ratio=4.0,
                class_dropout_prob=args.class_dropout, num_classes=args.num_classes,
                learn_sigma=learn_sigma_default if args.learn_sigma is None else args.learn_sigma)


def build_model(cfg):
    try:
        return DiT(**{k: v for k, v in cfg.items() if k != "name"})
    except (ValueError, AssertionError) as e:
        fail(f"bad model config {cfg['name']}: {e}")


def cmd_params(args):
    cfgs = [resolve_config(a) for a in ([argparse.Namespace(**{**vars(args), "model": m, "depth": None,
                                                               "hidden": None, "heads": None, "patch": None})
                                         for m in CONFIGS] if args.all else [args])]
    result = {}
    for cfg in cfgs:
        with torch.device("meta"):
            model = build_model(cfg)
        sd = model.state_dict(keep_vars=True)
        result[cfg["name"]] = {
            "params": sum(p.numel() for p in sd.values()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "tensors": [[k, list(v.shape)] for k, v in sd.items()],
        }
    if args.json:
        print(json.dumps(result))
    else:
        for name, r in result.items():
            print(f"{name:10s} params {r['params']:>12,d}  trainable {r['trainable']:>12,d}  tensors {len(r['tensors'])}")


@contextlib.contextmanager
def strict_fp32():
    """fp32 everywhere (no TF32) and deterministic kernels; restores the previous settings."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])


def cmd_check(args):
    with strict_fp32():
        run_check(args)


def run_check(args):
    from safetensors.torch import load_file, save_file
    cfg = resolve_config(args)
    model = build_model(cfg).float().eval()
    for path in (args.weights, args.inputs):
        if not os.path.isfile(path):
            fail(f"no such file: {path}")
    weights = load_file(args.weights)
    bad = [f"{k} ({v.dtype})" for k, v in weights.items() if v.dtype != torch.float32]
    if bad:
        fail(f"{args.weights}: expected float32 tensors, got: {', '.join(bad)}")
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        fail(f"{args.weights} does not match {cfg['name']}:\n{e}")

    inp = load_file(args.inputs)
    missing = [k for k in ("x", "t", "y", "gout") if k not in inp]
    if missing:
        fail(f"{args.inputs}: missing tensors {missing} (has {sorted(inp)})")
    x, t, y, gout = inp["x"].float(), inp["t"].float(), inp["y"].long(), inp["gout"].float()
    want = (cfg["in_channels"], cfg["input_size"], cfg["input_size"])
    if x.dim() != 4 or tuple(x.shape[1:]) != want:
        fail(f"{args.inputs}: x has shape {list(x.shape)}, expected [B, {', '.join(map(str, want))}]")
    if t.shape != (x.shape[0],) or y.shape != (x.shape[0],):
        fail(f"{args.inputs}: t {list(t.shape)} and y {list(y.shape)} must both be [{x.shape[0]}]")
    x.requires_grad_(True)
    out = model(x, t, y)
    if gout.shape != out.shape:
        fail(f"{args.inputs}: gout has shape {list(gout.shape)}, expected {list(out.shape)}")
    (out * gout).sum().backward()
    result = {"out": out.detach(), "grad.x": x.grad}
    result.update({f"grad.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    save_file({k: v.contiguous() for k, v in result.items()}, args.out)
    print(f"wrote {args.out}: {len(result)} tensors")


def cmd_init(args):
    from safetensors.torch import save_file
    torch.manual_seed(args.seed)
    cfg = resolve_config(args)
    model = build_model(cfg)
    if args.perturb > 0:  # break adaLN-Zero so that a cross-check exercises every path
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p), alpha=args.perturb)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.out)
    print(f"wrote {args.out}: {cfg['name']}, {len(model.state_dict())} tensors")


def cmd_bench(args):
    cfg = resolve_config(args, learn_sigma_default=False)
    check_bench_args(args)
    B, C, S = args.batch, cfg["in_channels"], cfg["input_size"]

    def inputs(dev):
        x0 = torch.randn(B, C, S, S, device=dev)                    # latents
        y = torch.randint(0, cfg["num_classes"], (B,), device=dev)  # labels
        return x0, y, ()

    cout = 2 * C if cfg["learn_sigma"] else C
    flops = 3 * forward_flops_per_image(cfg["depth"], cfg["hidden_size"], cfg["patch_size"], S, C, cout,
                                        cfg["mlp_ratio"])
    print_bench(run_bench(args, cfg["name"], lambda: build_model(cfg), inputs, flops), args)


def make_parser():
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("model")
    g.add_argument("--model", default="DiT-XL/2", help=f"registry name: {', '.join(CONFIGS)}")
    g.add_argument("--depth", type=int, help="override the number of blocks")
    g.add_argument("--hidden", type=int, help="override the hidden size")
    g.add_argument("--heads", type=int, help="override the number of heads")
    g.add_argument("--patch", type=int, help="override the patch size")
    g.add_argument("--image-size", "--input-size", dest="input_size", type=int, default=32,
                   help="side of the (latent) input, DiT's input_size (32 = 256 px images)")
    g.add_argument("--in-channels", type=int, default=4)
    g.add_argument("--num-classes", type=int, default=1000)
    g.add_argument("--learn-sigma", action=argparse.BooleanOptionalAction, default=None,
                   help="output 2*in_channels (default: on, off for bench)")
    g.add_argument("--class-dropout", type=float, default=0.1, help="label dropout probability (CFG)")

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("params", parents=[common], help="parameter counts and state_dict names/shapes")
    s.add_argument("--all", action="store_true", help="all registry configs")
    s.add_argument("--json", action="store_true")
    s.add_argument("--ddp", action="store_true",
                   help="one rank of DistributedDataParallel, under python -m torch.distributed.run "
                        "--nproc-per-node N (NCCL on CUDA, Gloo on the CPU); --batch per rank; rank 0 prints")
    s.add_argument("--ddp-timeout", type=float, default=300, help="seconds for --ddp's collectives")
    s.set_defaults(func=cmd_params)
    s = sub.add_parser("check", parents=[common], help="fp32 forward+backward for the C++ cross-check")
    s.add_argument("--weights", required=True, help="safetensors state_dict")
    s.add_argument("--inputs", required=True, help="safetensors with x, t, y, gout")
    s.add_argument("--out", required=True, help="safetensors to write: out, grad.x, grad.<param>")
    s.set_defaults(func=cmd_check)
    s = sub.add_parser("init", parents=[common], help="write the reference-initialised state_dict")
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--perturb", type=float, default=0.0,
                   help="add N(0, perturb^2) noise to every trainable tensor (0 = exact DiT init)")
    s.set_defaults(func=cmd_init)
    s = sub.add_parser("bench", parents=[common], help="time one DDPM training step")
    add_bench_args(s)
    s.set_defaults(func=cmd_bench)
    return p


def main(argv=None):
    args = make_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()

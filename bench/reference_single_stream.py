#!/usr/bin/env python3
"""The single-stream DiT (src/models/single_stream.h) in plain PyTorch.

Same math, same state_dict names as perftrain's C++ model, so that one
safetensors file loads into both: condition tokens and image tokens in one
sequence through shared blocks; RMSNorm; QK-norm over the head dimension
before a rotary embedding over three position axes (condition token i at
(i, 0, 0), image token at (Tc, row, col)); SwiGLU; sandwich norms; adaLN from
the timestep (scale as 1 + s, tanh gate, no shift); linears without bias; a
final adaLN layer. Conditions: class labels as cond_tokens learned tokens per
class (plus a null class), or features [B, Tc, Dc] with a length per sample
(padded tokens masked out as attention keys).

  reference_single_stream.py check --weights W --inputs I --out O [model flags]
      forward and backward on I's x, t, y (or cond, cond_len) and gout; writes
      out, grad.x and grad.<parameter> (fp32, no TF32)
  reference_single_stream.py params [--all] [--json] [model flags]
      parameter counts (and names/shapes for one config)
  reference_single_stream.py bench --batch B [--mode M] [--json] [model flags]
      one DDPM training step timed exactly as reference_dit.py bench does (same modes, bf16 autocast over
      fp32 weights, fused AdamW, --ema), on synthetic latents and labels, with --cond-dim > 0 synthetic
      features [B, Tc, Dc] and lengths in [1, Tc] (the rest masked)
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_dit as rd  # noqa: E402 -- the bench's timing protocol, shared with the DiT reference

SIZES = {"XL": (28, 1152, 16), "L": (24, 1024, 16), "B": (12, 768, 12), "S": (12, 384, 6), "T": (6, 192, 3)}
CONFIGS = {f"SS-{s}/{p}": dict(depth=d, hidden=h, heads=n, patch=p)
           for s, (d, h, n) in SIZES.items() for p in (2, 1)}


def round_up(v, m):
    return (v + m - 1) // m * m


def swiglu_hidden(hidden, mlp_ratio=4.0):
    """2/3 of the GELU MLP's hidden size (8/3 * hidden at ratio 4), rounded up to 64."""
    return round_up(int(hidden * mlp_ratio * 2.0 / 3.0 + 0.5), 64)


def rms_norm(x, weight=None, eps=1e-6):
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y * weight.to(x.dtype) if weight is not None else y


class RMSNorm(nn.Module):
    def __init__(self, dim, affine=True, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_axes(head_dim):
    spatial = 2 * ((head_dim * 3) // 16)
    return head_dim - 2 * spatial, spatial, spatial


def rope_tables(positions, head_dim, theta=10000.0):
    """positions: [(a0, a1, a2)] per token -> cos, sin [T, head_dim/2] float32 (computed in float64)."""
    pos = torch.tensor(positions, dtype=torch.float64)  # [T, 3]
    angles = []
    for axis, d in enumerate(rope_axes(head_dim)):
        k = torch.arange(d // 2, dtype=torch.float64)
        freqs = theta ** (-2.0 * k / d)
        angles.append(pos[:, axis:axis + 1] * freqs[None, :])
    a = torch.cat(angles, dim=1)
    return a.cos().float(), a.sin().float()


def apply_rope(x, cos, sin):
    """x [..., T, hd]: consecutive pairs (x[2k], x[2k+1]) rotated by the table's angle."""
    pairs = x.float().reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2).to(x.dtype)


class TimestepEmbedder(nn.Module):
    """256 sinusoidal frequencies -> Linear -> SiLU -> Linear, without biases."""

    def __init__(self, hidden, freq_dim=256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden, bias=False), nn.SiLU(),
                                 nn.Linear(hidden, hidden, bias=False))

    def forward(self, t):
        half = self.freq_dim // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * -math.log(10000.0) / half)
        args = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes, width, with_null):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(with_null), width)

    def forward(self, y):
        return self.embedding_table(y)


class ConditionEmbedder(nn.Module):
    def __init__(self, cond_dim, hidden):
        super().__init__()
        self.norm = RMSNorm(cond_dim)
        self.linear = nn.Linear(cond_dim, hidden, bias=False)

    def forward(self, f):
        return self.linear(self.norm(f))


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.q_norm = RMSNorm(hidden // heads)
        self.k_norm = RMSNorm(hidden // heads)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        q = apply_rope(self.q_norm(q), cos, sin)
        k = apply_rope(self.k_norm(k), cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(o.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, hidden, heads, mlp_hidden):
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.attn_post_norm = RMSNorm(hidden)
        self.ffn_norm = RMSNorm(hidden)
        self.ffn = SwiGLU(hidden, mlp_hidden)
        self.ffn_post_norm = RMSNorm(hidden)
        self.adaLN_modulation = nn.Linear(hidden, 4 * hidden, bias=False)

    def forward(self, x, silu_c, cos, sin, mask):
        s1, g1, s2, g2 = self.adaLN_modulation(silu_c).chunk(4, dim=1)
        h = self.attn_norm(x) * (1 + s1[:, None])
        x = x + torch.tanh(g1)[:, None] * self.attn_post_norm(self.attn(h, cos, sin, mask))
        h = self.ffn_norm(x) * (1 + s2[:, None])
        return x + torch.tanh(g2)[:, None] * self.ffn_post_norm(self.ffn(h))


class FinalLayer(nn.Module):
    def __init__(self, hidden, patch, out_channels):
        super().__init__()
        self.adaLN_modulation = nn.Linear(hidden, hidden, bias=False)
        self.linear = nn.Linear(hidden, patch * patch * out_channels, bias=False)

    def forward(self, x, silu_c):
        return self.linear(rms_norm(x) * (1 + self.adaLN_modulation(silu_c)[:, None]))


class SingleStreamDiT(nn.Module):
    def __init__(self, depth=12, hidden=384, heads=6, patch=2, image_size=32, in_channels=4, num_classes=1000,
                 class_dropout=0.1, learn_sigma=True, cond_tokens=1, cond_dim=0, mlp_ratio=4.0):
        super().__init__()
        self.patch, self.image_size, self.in_channels = patch, image_size, in_channels
        self.out_channels = 2 * in_channels if learn_sigma else in_channels
        self.cond_tokens, self.cond_dim, self.hidden = cond_tokens, cond_dim, hidden
        self.x_embedder = nn.Linear(in_channels * patch * patch, hidden, bias=False)
        self.t_embedder = TimestepEmbedder(hidden)
        if cond_dim > 0:
            self.cond_embedder = ConditionEmbedder(cond_dim, hidden)
        else:
            self.y_embedder = LabelEmbedder(num_classes, cond_tokens * hidden, class_dropout > 0)
        self.blocks = nn.ModuleList([Block(hidden, heads, swiglu_hidden(hidden, mlp_ratio)) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden, patch, self.out_channels)
        g = image_size // patch
        positions = [(i, 0, 0) for i in range(cond_tokens)] + [(cond_tokens, r, c) for r in range(g) for c in range(g)]
        cos, sin = rope_tables(positions, hidden // heads)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.initialize_weights()

    def initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
        for m in self.t_embedder.mlp[0], self.t_embedder.mlp[2]:
            nn.init.normal_(m.weight, std=0.02)
        if hasattr(self, "y_embedder"):
            nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        for b in self.blocks:
            nn.init.zeros_(b.adaLN_modulation.weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation.weight)
        nn.init.zeros_(self.final_layer.linear.weight)

    def condition_tokens(self, y, cond, cond_len, B):
        Tc = self.cond_tokens
        if self.cond_dim == 0:
            return self.y_embedder(y).view(B, Tc, self.hidden), None
        if cond_len is None:
            return self.cond_embedder(cond), None
        T = Tc + (self.image_size // self.patch) ** 2
        idx = torch.arange(T, device=cond.device)
        valid = (idx[None, :] < cond_len.long()[:, None]) | (idx >= Tc)[None, :]  # [B, T] keys
        cond = torch.where(valid[:, :Tc, None], cond, torch.zeros_like(cond))
        return self.cond_embedder(cond), valid.view(B, 1, 1, T)

    def forward(self, x, t, y=None, cond=None, cond_len=None):
        B, C, H, W = x.shape
        p, g = self.patch, self.image_size // self.patch
        silu_c = F.silu(self.t_embedder(t))
        patches = x.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p)
        img = self.x_embedder(patches)
        ctok, mask = self.condition_tokens(y, cond, cond_len, B)
        h = torch.cat([ctok.to(img.dtype), img], dim=1)
        for block in self.blocks:
            h = block(h, silu_c, self.rope_cos, self.rope_sin, mask)
        out = self.final_layer(h[:, self.cond_tokens:], silu_c)
        c = self.out_channels
        return out.reshape(B, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(B, c, g * p, g * p)


class ConditionDropout(nn.Module):
    """The training forward: with probability p a sample's condition becomes the null one (the null class;
    with features length 0, every condition token masked), drawn each call, as perftrain's step runner does."""

    def __init__(self, model, num_classes, p):
        super().__init__()
        self.model, self.num_classes, self.p = model, num_classes, p

    def forward(self, x, t, y, cond=None, cond_len=None):
        drop = torch.rand(x.shape[0], device=x.device) < self.p
        if cond is None:
            y = torch.where(drop, self.num_classes, y)
        else:
            if cond_len is None:
                cond_len = torch.full((x.shape[0],), cond.shape[1], dtype=torch.long, device=x.device)
            cond_len = torch.where(drop, torch.zeros_like(cond_len), cond_len)
        return self.model(x, t, y, cond, cond_len)


def forward_flops_per_sample(cfg):
    """Forward FLOPs (2 per multiply-add) of the products and attention for one sample, as perftrain's
    DiTConfig::forward_flops_per_sample counts them: per block qkv, proj, SwiGLU (3 products), attention over
    Tc + image tokens, adaLN; the embeddings, the t-MLP and the final layer."""
    D, P, C = cfg["hidden"], cfg["patch"] ** 2, cfg["in_channels"]
    I = (cfg["image_size"] // cfg["patch"]) ** 2
    T, M = cfg["cond_tokens"] + I, swiglu_hidden(D)
    cout = 2 * C if cfg["learn_sigma"] else C
    per_block = 2 * T * D * (4 * D + 3 * M) + 2 * 2 * T * T * D + 2 * D * 4 * D
    embed = 2 * I * P * C * D + 2 * (256 * D + D * D) + 2 * cfg["cond_tokens"] * cfg["cond_dim"] * D
    return cfg["depth"] * per_block + embed + 2 * I * D * P * cout + 2 * D * D


def cmd_bench(args):
    rd.check_bench_args(args)
    cfg = resolve_config(args)
    B, C, S, Tc, Dc = args.batch, cfg["in_channels"], cfg["image_size"], cfg["cond_tokens"], cfg["cond_dim"]

    def inputs(dev):
        x0 = torch.randn(B, C, S, S, device=dev)                    # latents
        y = torch.randint(0, cfg["num_classes"], (B,), device=dev)  # labels (class tokens; unused with features)
        if Dc == 0:
            return x0, y, ()
        cond = torch.randn(B, Tc, Dc, device=dev)                   # features
        cond_len = torch.randint(1, Tc + 1, (B,), device=dev)       # valid tokens; the rest masked
        return x0, y, (cond, cond_len)

    def build():
        try:
            model = SingleStreamDiT(**cfg)
        except (ValueError, AssertionError) as e:
            fail(f"bad model config {args.model} {cfg}: {e}")
        return ConditionDropout(model, cfg["num_classes"], cfg["class_dropout"]) if cfg["class_dropout"] > 0 else model

    flops = 3 * forward_flops_per_sample(cfg)
    rd.print_bench(rd.run_bench(args, args.model, build, inputs, flops), args)


def fail(msg):
    print(f"reference_single_stream.py: {msg}", file=sys.stderr)
    sys.exit(2)


def resolve_config(args):
    return resolve_registry(args, CONFIGS, ("depth", "hidden", "heads", "patch"), fail)


def resolve_registry(args, configs, overrides, fail):
    """configs[--model] with the given flags over it, and the shared input and condition flags (this
    reference's and reference_looped.py's)."""
    if args.model not in configs:
        fail(f"unknown model {args.model}; known: {', '.join(configs)}")
    cfg = dict(configs[args.model])
    for k in overrides:
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    cfg.update(image_size=args.image_size, in_channels=args.in_channels, num_classes=args.num_classes,
               class_dropout=args.class_dropout, learn_sigma=args.learn_sigma, cond_tokens=args.cond_tokens,
               cond_dim=args.cond_dim)
    return cfg


def check_inputs(path):
    """check's inputs: x (requiring its gradient), t, y, cond, cond_len (None where absent), gout."""
    from safetensors.torch import load_file
    inp = load_file(path)
    x, t, gout = inp["x"].float(), inp["t"].float(), inp["gout"].float()
    y = inp["y"].long() if "y" in inp else None
    cond = inp["cond"].float() if "cond" in inp else None
    cond_len = inp["cond_len"].long() if "cond_len" in inp else None
    return x.requires_grad_(True), t, y, cond, cond_len, gout


def cmd_check(args):
    from safetensors.torch import load_file, save_file
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    cfg = resolve_config(args)
    model = SingleStreamDiT(**cfg).float().eval()
    weights = load_file(args.weights)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        fail(f"{args.weights} does not match {cfg}:\n{e}")
    x, t, y, cond, cond_len, gout = check_inputs(args.inputs)
    if cond is not None:
        cond.requires_grad_(True)
    out = model(x, t, y, cond, cond_len)
    (out * gout).sum().backward()
    result = {"out": out.detach(), "grad.x": x.grad}
    if cond is not None:
        result["grad.cond"] = cond.grad
    result.update({f"grad.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    save_file({k: v.contiguous() for k, v in result.items()}, args.out)
    print(f"wrote {args.out}: {len(result)} tensors")


def cmd_params(args):
    names = list(CONFIGS) if args.all else [args.model]
    out = {}
    for name in names:
        args.model = name
        cfg = resolve_config(args)
        with torch.device("meta"):
            m = SingleStreamDiT(**cfg)
        out[name] = {"params": sum(p.numel() for p in m.parameters()),
                     "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad)}
        if not args.all:
            out[name]["state"] = [[k, list(v.shape)] for k, v in m.state_dict().items()]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for name, v in out.items():
            print(f"{name:10s} {v['params']:>14d}")


def model_flags(default_model, configs, overrides):
    """The model flags (this reference's and reference_looped.py's): -> (parser, its "model" group)."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("model")
    g.add_argument("--model", default=default_model, help=f"registry name: {', '.join(configs)}")
    for k in overrides:
        g.add_argument(f"--{k}", type=int, help=f"override {k}")
    g.add_argument("--image-size", type=int, default=32)
    g.add_argument("--in-channels", type=int, default=4)
    g.add_argument("--num-classes", type=int, default=1000)
    g.add_argument("--class-dropout", type=float, default=0.1)
    g.add_argument("--learn-sigma", action=argparse.BooleanOptionalAction, default=None,
                   help="output 2*in_channels (default: on, off for bench)")
    g.add_argument("--cond-tokens", type=int, default=1, help="class tokens, or the feature length Tc")
    g.add_argument("--cond-dim", type=int, default=0, help="feature width Dc (0: class labels)")
    return common, g


def make_parser():
    common, _ = model_flags("SS-S/2", CONFIGS, ("depth", "hidden", "heads", "patch"))
    return subcommand_parser(__doc__, common, cmd_check, cmd_params, cmd_bench, params_all=True)


def subcommand_parser(doc, common, check, params, bench, params_all):
    """check / params / bench over the `common` model flags (this reference's and reference_looped.py's)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("check", parents=[common], help="forward + backward on given weights and inputs")
    s.add_argument("--weights", required=True)
    s.add_argument("--inputs", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=check)
    s = sub.add_parser("params", parents=[common], help="parameter counts")
    if params_all:
        s.add_argument("--all", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=params)
    s = sub.add_parser("bench", parents=[common], help="time one DDPM training step (reference_dit.py's protocol)")
    rd.add_bench_args(s)
    s.set_defaults(fn=bench)
    return p


def run_main(parser, argv, bench):
    args = parser.parse_args(argv)
    if args.learn_sigma is None:  # on, but off for bench (as in reference_dit.py)
        args.learn_sigma = args.fn is not bench
    args.fn(args)


def main(argv=None):
    run_main(make_parser(), argv, cmd_bench)


if __name__ == "__main__":
    main()

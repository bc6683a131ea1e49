#!/usr/bin/env python3
"""The looped DiT (src/models/looped.h) in plain PyTorch.

Same math, same state_dict names as perftrain's C++ model, so that one
safetensors file loads into both: prelude blocks, a group of K shared blocks
applied L times, coda blocks, of one block kind (--loop-block dit: the blocks
of reference_dit.py; single_stream: those of reference_single_stream.py, with
that family's stem and final layer). Loop l runs with c + loop_embed[l]
(single_stream: the timestep embedding's, before its SiLU), its input
re-injected with the prelude's output (--reinject add: h + e; concat:
reinject(cat[h, e])), and the shared weights merged with its depth-wise LoRA
adapters: W_lk = W_k + (alpha / r) B_lk A_lk (float32), bias b_k + delta_lk.
A routed loop (capacity < 1) runs the group on its router's top-k image tokens
(sorted; condition tokens always) and adds back their gated change, the gate
1 + sigmoid(s) - sigmoid(s).detach(); the routers' auxiliary loss is
router_aux_weight * the mean over routed loops of BCE-with-logits(s, top-k mask).

  reference_looped.py check --weights W --inputs I --out O [model flags]
      forward and backward of (out * gout).sum() + aux on I's x, t, y (or cond,
      cond_len) and gout; writes out, aux (when routed), grad.x and
      grad.<parameter> (fp32, no TF32)
  reference_looped.py params [--json] [model flags]
      parameter count and names/shapes
  reference_looped.py bench --batch B [--mode M] [--json] [model flags]
      one DDPM training step (plus the auxiliary loss) timed as reference_dit.py bench does
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_dit as rd  # noqa: E402 -- DiT's blocks, stem and the bench protocol
import reference_single_stream as rs  # noqa: E402 -- the single-stream blocks and stem

SIZES = {"XL": (28, 1152, 16), "L": (24, 1024, 16), "B": (12, 768, 12), "S": (12, 384, 6), "T": (6, 192, 3)}
# Looped-*: DiT's sizes; prelude 2, one shared block, coda 2, depth - 4 loops.
CONFIGS = {f"Looped-{s}/{p}": dict(hidden=h, heads=n, patch=p, prelude=2, shared_group=1, loops=d - 4, coda=2)
           for s, (d, h, n) in SIZES.items() for p in (2, 4, 8)}

# Each target's linears in a block: (path, in, out) from (D, M).
DIT_LINEARS = {"attn": [("attn.qkv", 1, 3), ("attn.proj", 1, 1)], "mlp": [("mlp.fc1", 1, "M"), ("mlp.fc2", "M", 1)],
               "adaln": [("adaLN_modulation.1", 1, 6)]}
SS_LINEARS = {"attn": [("attn.qkv", 1, 3), ("attn.proj", 1, 1)],
              "mlp": [("ffn.gate", 1, "M"), ("ffn.up", 1, "M"), ("ffn.down", "M", 1)],
              "adaln": [("adaLN_modulation", 1, 4)]}
TARGETS = ("attn", "mlp", "adaln")


def width(v, D, M):
    """A linear's side from the tables above: "M" the MLP width, else a multiple of D."""
    return M if v == "M" else v * D


def parse_targets(text):
    given = [t.strip() for t in text.split(",")]
    for t in given:
        if t not in TARGETS or given.count(t) > 1:
            raise ValueError(f"lora_targets {text!r}: {t!r} is not a target or named twice")
    return [t for t in TARGETS if t in given]


class LoRA(nn.Module):
    """lora_A [r, in] (U(+-1/sqrt(in)), peft's kaiming-uniform), lora_B [out, r] zero, bias [out] zero."""

    def __init__(self, fan_in, fan_out, rank, scale, bias):
        super().__init__()
        self.scale = scale
        self.lora_A = nn.Parameter(torch.empty(rank, fan_in).uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in)))
        self.lora_B = nn.Parameter(torch.zeros(fan_out, rank))
        self.bias = nn.Parameter(torch.zeros(fan_out)) if bias else None

    def merged(self, W, b):
        with torch.autocast(W.device.type, enabled=False):  # the merged weight in float32
            w = torch.addmm(W, self.lora_B, self.lora_A, alpha=self.scale)
        if self.bias is None:
            return w, b
        return w, self.bias if b is None else b + self.bias


class BlockAdapters(nn.Module):
    """A block's adapters at the linears' paths ("attn.qkv" -> attn.qkv.lora_A)."""

    def __init__(self, linears, rank, scale, bias):
        super().__init__()
        self.paths = []
        for path, fan_in, fan_out in linears:
            parent, _, leaf = path.rpartition(".")
            holder = self
            if parent:
                if not hasattr(self, parent):
                    self.add_module(parent, nn.Module())
                holder = getattr(self, parent)
            holder.add_module(leaf, LoRA(fan_in, fan_out, rank, scale, bias))
            self.paths.append(path)

    def adapter(self, path):
        return self.get_submodule(path)


class LoopedDiT(nn.Module):
    def __init__(self, hidden=384, heads=6, patch=2, image_size=32, in_channels=4, num_classes=1000,
                 class_dropout=0.1, learn_sigma=True, cond_tokens=1, cond_dim=0, mlp_ratio=4.0, loop_block="dit",
                 prelude=2, coda=2, shared_group=1, loops=8, reinject="none", lora_rank=0, lora_alpha=16.0,
                 lora_targets="attn,mlp", lora_bias=False, route_capacity=1.0, route_capacity_end=-1.0,
                 router_aux_weight=0.01):
        super().__init__()
        if loop_block not in ("dit", "single_stream"):
            raise ValueError(f"loop_block {loop_block!r}")
        if reinject not in ("none", "add", "concat"):
            raise ValueError(f"reinject {reinject!r}")
        self.ss = loop_block == "single_stream"
        self.hidden, self.loops, self.group, self.reinject_mode = hidden, loops, shared_group, reinject
        self.route_capacity = route_capacity
        self.route_capacity_end = route_capacity if route_capacity_end == -1 else route_capacity_end
        self.router_aux_weight = router_aux_weight
        self.tokens = (image_size // patch) ** 2
        self.cond_tokens = cond_tokens if self.ss else 0
        D = hidden
        if self.ss:
            stem = rs.SingleStreamDiT(depth=0, hidden=hidden, heads=heads, patch=patch, image_size=image_size,
                                      in_channels=in_channels, num_classes=num_classes, class_dropout=class_dropout,
                                      learn_sigma=learn_sigma, cond_tokens=cond_tokens, cond_dim=cond_dim,
                                      mlp_ratio=mlp_ratio)
            M = rs.swiglu_hidden(hidden, mlp_ratio)

            def block():
                b = rs.Block(hidden, heads, M)
                for m in b.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(b.adaLN_modulation.weight)
                return b
            linears = SS_LINEARS
            self.stem = [stem]  # a list: its modules are registered below under their own names
            self.x_embedder, self.t_embedder = stem.x_embedder, stem.t_embedder
            if cond_dim > 0:
                self.cond_embedder = stem.cond_embedder
            else:
                self.y_embedder = stem.y_embedder
            self.register_buffer("rope_cos", stem.rope_cos, persistent=False)
            self.register_buffer("rope_sin", stem.rope_sin, persistent=False)
        else:
            stem = rd.DiT(input_size=image_size, patch_size=patch, in_channels=in_channels, hidden_size=hidden,
                          depth=0, num_heads=heads, mlp_ratio=mlp_ratio, class_dropout_prob=class_dropout,
                          num_classes=num_classes, learn_sigma=learn_sigma)
            M = int(hidden * mlp_ratio)

            def block():
                b = rd.DiTBlock(hidden, heads, mlp_ratio)
                for m in b.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.xavier_uniform_(m.weight)
                        nn.init.zeros_(m.bias)
                nn.init.zeros_(b.adaLN_modulation[-1].weight)
                nn.init.zeros_(b.adaLN_modulation[-1].bias)
                return b
            linears = DIT_LINEARS
            self.stem = [stem]
            self.pos_embed = stem.pos_embed
            self.x_embedder, self.t_embedder, self.y_embedder = stem.x_embedder, stem.t_embedder, stem.y_embedder
        self.prelude = nn.ModuleList([block() for _ in range(prelude)])
        self.shared = nn.ModuleList([block() for _ in range(shared_group)])
        self.coda = nn.ModuleList([block() for _ in range(coda)])
        self.loop_embed = nn.Parameter(torch.zeros(loops, D))
        if reinject == "concat":
            self.reinject = nn.Linear(2 * D, D)
            with torch.no_grad():
                self.reinject.weight.zero_()
                self.reinject.weight[:, :D].copy_(torch.eye(D))
                self.reinject.bias.zero_()
        shapes = [(path, width(i, D, M), width(o, D, M)) for t in parse_targets(lora_targets)
                  for path, i, o in linears[t]]
        if lora_rank > 0:
            scale = lora_alpha / lora_rank
            self.adapters = nn.ModuleList([nn.ModuleList([BlockAdapters(shapes, lora_rank, scale, lora_bias)
                                                          for _ in range(shared_group)]) for _ in range(loops)])
        routed = {str(l): nn.Linear(D, 1) for l in range(loops) if self.routed(l)}
        for r in routed.values():
            nn.init.normal_(r.weight, std=0.02)
            nn.init.zeros_(r.bias)
        if routed:
            self.routers = nn.ModuleDict(routed)
        self.final_layer = stem.final_layer

    # -- loops -----------------------------------------------------------------------------------------------
    def capacity(self, l):
        if self.loops <= 1:
            return self.route_capacity
        return self.route_capacity + (self.route_capacity_end - self.route_capacity) * l / (self.loops - 1)

    def routed(self, l):
        return self.capacity(l) < 1.0

    def loop_tokens(self, l):
        return max(1, int(math.floor(self.capacity(l) * self.tokens + 0.5)))

    def loop_params(self, l, k):
        """The shared block k's parameters with loop l's adapters merged in (only the adapted ones)."""
        block = self.shared[k]
        if not hasattr(self, "adapters"):
            return {}
        adapters = self.adapters[l][k]
        out = {}
        for path in adapters.paths:
            lin = block.get_submodule(path)
            w, b = adapters.adapter(path).merged(lin.weight, lin.bias)
            out[path + ".weight"] = w
            if b is not None:
                out[path + ".bias"] = b
        return out

    def reinjected(self, h, e):
        if self.reinject_mode == "add":
            return h + e
        if self.reinject_mode == "concat":
            return self.reinject(torch.cat([h, e.to(h.dtype)], dim=-1))
        return h

    def route(self, l, image):
        with torch.autocast(image.device.type, enabled=False):
            s = self.routers[str(l)](image.float()).squeeze(-1)  # [B, T]
        idx = torch.topk(s, self.loop_tokens(l), dim=1).indices.sort(dim=1).values
        kept = torch.sigmoid(torch.gather(s, 1, idx))
        gate = 1 + kept - kept.detach()
        mask = torch.zeros_like(s).scatter(1, idx, 1.0)
        return idx, gate, F.binary_cross_entropy_with_logits(s, mask)

    def run_loops(self, h, c, group):
        """group(l, x, c_l, positions) runs the shared blocks; positions [B, n] the tokens' places (None: all)."""
        e, aux, Tc = h, [], self.cond_tokens
        for l in range(self.loops):
            c_l = c + self.loop_embed[l].to(c.dtype)
            u = self.reinjected(h, e)
            if not self.routed(l):
                h = group(l, u, c_l, None)
                continue
            B = u.shape[0]
            idx, gate, a = self.route(l, u[:, Tc:])
            aux.append(a)
            pos = idx
            if Tc > 0:
                pos = torch.cat([torch.arange(Tc, device=u.device).expand(B, Tc), idx + Tc], dim=1)
                gate = torch.cat([torch.ones(B, Tc, device=u.device, dtype=gate.dtype), gate], dim=1)
            ipos = pos[..., None].expand(B, pos.shape[1], u.shape[2])
            before = torch.gather(u, 1, ipos)
            after = group(l, before, c_l, pos)
            h = u.scatter_add(1, ipos, (gate[..., None] * (after - before)).to(u.dtype))
        aux = torch.stack(aux).mean() * self.router_aux_weight if aux else None
        return h, aux

    # -- forward -----------------------------------------------------------------------------------------------
    def forward(self, x, t, y=None, cond=None, cond_len=None):
        """-> (out, aux): aux the weighted routers' loss, or None without routing."""
        return self.forward_single_stream(x, t, y, cond, cond_len) if self.ss else self.forward_dit(x, t, y)

    def forward_dit(self, x, t, y):
        stem = self.stem[0]
        c = self.t_embedder(t) + self.y_embedder(y, self.training)
        h = self.x_embedder(x) + self.pos_embed
        for b in self.prelude:
            h = b(h, c)

        def group(l, g, c_l, pos):
            for k, b in enumerate(self.shared):
                g = functional_call(b, self.loop_params(l, k), (g, c_l), strict=False)
            return g

        h, aux = self.run_loops(h, c, group)
        for b in self.coda:
            h = b(h, c)
        return stem.unpatchify(self.final_layer(h, c)), aux

    def forward_single_stream(self, x, t, y, cond, cond_len):
        stem = self.stem[0]
        B, C = x.shape[:2]
        p, g = stem.patch, stem.image_size // stem.patch
        Tc = self.cond_tokens
        temb = self.t_embedder(t)
        silu_c = F.silu(temb)
        img = self.x_embedder(x.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p))
        ctok, mask = stem.condition_tokens(y, cond, cond_len, B)
        h = torch.cat([ctok.to(img.dtype), img], dim=1)
        cos, sin = self.rope_cos, self.rope_sin
        for b in self.prelude:
            h = b(h, silu_c, cos, sin, mask)

        def group(l, gx, temb_l, pos):
            lcos, lsin, lmask = cos, sin, mask
            if pos is not None:  # the kept tokens' own rotary positions and key mask
                lcos, lsin = cos[pos][:, None], sin[pos][:, None]
                if mask is not None:
                    lmask = torch.gather(mask.view(B, -1), 1, pos).view(B, 1, 1, -1)
            silu_l = F.silu(temb_l)
            for k, b in enumerate(self.shared):
                gx = functional_call(b, self.loop_params(l, k), (gx, silu_l, lcos, lsin, lmask), strict=False)
            return gx

        h, aux = self.run_loops(h, temb, group)
        for b in self.coda:
            h = b(h, silu_c, cos, sin, mask)
        out = self.final_layer(h[:, Tc:], silu_c)
        c = stem.out_channels
        return out.reshape(B, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(B, c, g * p, g * p), aux


class WithAux(nn.Module):
    """The bench's training forward: out with the auxiliary loss folded into its gradient path, as train_step
    takes one output (loss = mse(out) + aux)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, t, y, *cond):
        out, aux = self.model(x, t, y, *cond)
        return out if aux is None else (out, aux)


# -- command line --------------------------------------------------------------------------------------------

def fail(msg):
    print(f"reference_looped.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def resolve_config(args):
    cfg = rs.resolve_registry(args, CONFIGS, ("hidden", "heads", "patch", "prelude", "coda", "shared_group", "loops"),
                              fail)
    cfg.update(loop_block=args.loop_block, reinject=args.reinject, lora_rank=args.lora_rank,
               lora_alpha=args.lora_alpha, lora_targets=args.lora_targets, lora_bias=args.lora_bias,
               route_capacity=args.route_capacity, route_capacity_end=args.route_capacity_end,
               router_aux_weight=args.router_aux_weight)
    return cfg


def build(cfg):
    try:
        return LoopedDiT(**cfg)
    except (ValueError, AssertionError) as e:
        fail(f"bad model config {cfg}: {e}")


def forward_flops_per_sample(cfg, model):
    """As perftrain's DiTConfig::forward_flops_per_sample counts a looped model: every block application at its
    token count (a routed loop at its kept image tokens plus the condition tokens), the routers, concat's
    product, the adapters' merge (2 * out * in * rank per loop and target), the stem and final layer."""
    D, P, C, ss = cfg["hidden"], cfg["patch"] ** 2, cfg["in_channels"], cfg["loop_block"] == "single_stream"
    I, Tc = (cfg["image_size"] // cfg["patch"]) ** 2, (cfg["cond_tokens"] if ss else 0)
    M = rs.swiglu_hidden(D) if ss else 4 * D
    cout = 2 * C if cfg["learn_sigma"] else C

    def block(S):
        if ss:
            return 2 * S * D * (4 * D + 3 * M) + 2 * 2 * S * S * D + 2 * D * 4 * D
        return 2 * S * D * (3 * D + D + 2 * M) + 2 * 2 * S * S * D + 2 * D * 6 * D

    f = (cfg["prelude"] + cfg["coda"]) * block(Tc + I)
    linears = SS_LINEARS if ss else DIT_LINEARS
    for l in range(cfg["loops"]):
        f += cfg["shared_group"] * block(Tc + (model.loop_tokens(l) if model.routed(l) else I))
        f += 2 * I * D if model.routed(l) else 0
        f += 2 * (Tc + I) * 2 * D * D if cfg["reinject"] == "concat" else 0
        if cfg["lora_rank"] > 0:
            for t in parse_targets(cfg["lora_targets"]):
                for _, i, o in linears[t]:
                    f += cfg["shared_group"] * 2 * width(o, D, M) * width(i, D, M) * cfg["lora_rank"]
    if ss:
        return f + 2 * I * P * C * D + 2 * (256 * D + D * D) + 2 * Tc * cfg["cond_dim"] * D + 2 * I * D * P * cout \
            + 2 * D * D
    return f + 2 * I * P * C * D + 2 * (256 * D + D * D) + 2 * I * D * P * cout + 2 * D * 2 * D


def cmd_check(args):
    from safetensors.torch import load_file, save_file
    with rd.strict_fp32():
        cfg = resolve_config(args)
        model = build(cfg).float().eval()
        try:
            model.load_state_dict(load_file(args.weights), strict=True)
        except RuntimeError as e:
            fail(f"{args.weights} does not match {cfg}:\n{e}")
        x, t, y, cond, cond_len, gout = rs.check_inputs(args.inputs)
        out, aux = model(x, t, y, cond, cond_len)
        loss = (out * gout).sum() + (aux if aux is not None else 0)
        loss.backward()
        result = {"out": out.detach(), "grad.x": x.grad}
        if aux is not None:
            result["aux"] = aux.detach().reshape(1)
        result.update({f"grad.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
        save_file({k: v.contiguous() for k, v in result.items()}, args.out)
        print(f"wrote {args.out}: {len(result)} tensors")


def cmd_params(args):
    cfg = resolve_config(args)
    with torch.device("meta"):
        m = build(cfg)
    sd = m.state_dict(keep_vars=True)
    out = {args.model: {"params": sum(v.numel() for v in sd.values()),
                        "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad),
                        "state": [[k, list(v.shape)] for k, v in sd.items()]}}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for name, v in out.items():
            print(f"{name:12s} {v['params']:>14d}")


def cmd_bench(args):
    rd.check_bench_args(args)
    cfg = resolve_config(args)
    B, C, S, Tc, Dc = args.batch, cfg["in_channels"], cfg["image_size"], cfg["cond_tokens"], cfg["cond_dim"]
    ss = cfg["loop_block"] == "single_stream"

    def inputs(dev):
        x0 = torch.randn(B, C, S, S, device=dev)
        y = torch.randint(0, cfg["num_classes"], (B,), device=dev)
        if not ss or Dc == 0:
            return x0, y, ()
        return x0, y, (torch.randn(B, Tc, Dc, device=dev), torch.randint(1, Tc + 1, (B,), device=dev))

    model = build(cfg)
    flops = 3 * forward_flops_per_sample(cfg, model)

    def make():
        m = WithAux(model)
        if ss and cfg["class_dropout"] > 0:  # the single-stream reference drops conditions outside the model
            return rs.ConditionDropout(m, cfg["num_classes"], cfg["class_dropout"])
        return m

    rd.print_bench(rd.run_bench(args, args.model, make, inputs, flops), args)


def make_parser():
    common, g = rs.model_flags("Looped-S/2", CONFIGS,
                               ("hidden", "heads", "patch", "prelude", "coda", "shared-group", "loops"))
    g.add_argument("--loop-block", choices=["dit", "single_stream"], default="dit")
    g.add_argument("--reinject", choices=["none", "add", "concat"], default="none")
    g.add_argument("--lora-rank", type=int, default=0)
    g.add_argument("--lora-alpha", type=float, default=16.0)
    g.add_argument("--lora-targets", default="attn,mlp")
    g.add_argument("--lora-bias", action=argparse.BooleanOptionalAction, default=False)
    g.add_argument("--route-capacity", type=float, default=1.0)
    g.add_argument("--route-capacity-end", type=float, default=-1.0)
    g.add_argument("--router-aux-weight", type=float, default=0.01)
    return rs.subcommand_parser(__doc__, common, cmd_check, cmd_params, cmd_bench, params_all=False)


def main(argv=None):
    rs.run_main(make_parser(), argv, cmd_bench)


if __name__ == "__main__":
    main()

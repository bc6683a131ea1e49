"""Tests of bench/reference_looped.py (the plain-PyTorch looped DiT).

Run with pytest, or without it:  .venv/bin/python tests/python/test_reference_looped.py
"""
import contextlib
import importlib.util
import io
import json
import os

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("reference_looped", os.path.join(ROOT, "bench", "reference_looped.py"))
rl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rl)

SMALL = dict(hidden=32, heads=2, patch=2, image_size=8, in_channels=2, num_classes=5, learn_sigma=False,
             prelude=1, coda=1, shared_group=2, loops=3)


def perturbed(seed=0, **kw):
    torch.manual_seed(seed)
    m = rl.LoopedDiT(**{**SMALL, **kw}).eval()
    for p in m.parameters():  # the zero-initialised layers would hide everything
        p.data += 0.1 * torch.randn_like(p)
    return m


def inputs(B=2):
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, 2, 8, 8, generator=g), torch.rand(B, generator=g) * 999, torch.tensor([1, 4])[:B]


def test_shared_weights_count_once():
    """Parameters do not grow with the loops but by loop_embed (and adapters, routers)."""
    for block in ("dit", "single_stream"):
        def count(**kw):
            return sum(p.numel() for p in rl.LoopedDiT(**{**SMALL, "loop_block": block, **kw}).parameters())
        assert count(loops=7) - count(loops=3) == 4 * 32, block
        lora = count(lora_rank=2, lora_targets="attn") - count()
        assert lora == 3 * 2 * (2 * (32 + 3 * 32) + 2 * (32 + 32)), block  # loops x K x (qkv + proj)
        assert count(route_capacity=0.5) - count() == 3 * (32 + 1), block


def test_fresh_adapters_concat_and_capacity_one_change_nothing():
    for block in ("dit", "single_stream"):
        base = perturbed(loop_block=block)
        x, t, y = inputs()
        out, aux = base(x, t, y)
        assert aux is None
        for kw in (dict(lora_rank=3, lora_targets="attn,mlp,adaln"), dict(reinject="concat"),
                   dict(route_capacity=0.999)):
            m = rl.LoopedDiT(**{**SMALL, "loop_block": block, **kw}).eval()
            m.load_state_dict(base.state_dict(), strict=False)
            o, a = m(x, t, y)
            assert torch.allclose(o, out, atol=1e-5, rtol=1e-5), (block, kw)
            assert (a is not None) == ("route_capacity" in kw), (block, kw)


def test_routing_keeps_the_top_tokens_in_order():
    m = perturbed(route_capacity=0.25, loops=1)
    u = torch.randn(2, 16, 32)
    idx, gate, aux = m.route(0, u)
    assert idx.shape == (2, 4) and bool((idx[:, 1:] > idx[:, :-1]).all())
    assert torch.allclose(gate, torch.ones_like(gate)) and aux > 0


def test_flops_count_the_applications():
    """forward_flops_per_sample = the products torch counts + attention 4*S*S*D per application (no LoRA,
    no routing: the merge and router terms are checked by the C++ tests against perftrain's count)."""
    for block in ("dit", "single_stream"):
        cfg = dict(SMALL, loop_block=block, cond_tokens=1, cond_dim=0, reinject="concat", lora_rank=0,
                   lora_targets="attn,mlp", route_capacity=1.0, class_dropout=0.1)
        m = rl.LoopedDiT(**cfg).eval()
        x, t, y = inputs()
        with FlopCounterMode(display=False) as fc:
            m(x, t, y)
        counts = fc.get_flop_counts()["Global"]
        linears = sum(v for k, v in counts.items() if str(k) in ("aten.mm", "aten.addmm", "aten.convolution"))
        S = 16 + (1 if block == "single_stream" else 0)
        applications = 1 + 2 * 3 + 1
        assert 2 * rl.forward_flops_per_sample(cfg, m) == linears + applications * 2 * 4 * S * S * 32, block


def test_bench_cpu_with_lora_and_routing():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rl.main(["bench", "--model", "Looped-T/2", "--hidden", "32", "--heads", "2", "--image-size", "8",
                 "--num-classes", "5", "--loops", "2", "--lora-rank", "2", "--route-capacity", "0.5",
                 "--batch", "3", "--steps", "2", "--warmup", "1", "--mode", "eager-fp32", "--device", "cpu",
                 "--json"])
    r = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert r["model"] == "Looped-T/2" and r["batch"] == 3 and r["ms_median"] > 0, r


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)

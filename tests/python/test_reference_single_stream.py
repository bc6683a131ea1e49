"""Tests of bench/reference_single_stream.py (the plain-PyTorch single-stream DiT).

Run with pytest, or without it:  .venv/bin/python tests/python/test_reference_single_stream.py
"""
import contextlib
import importlib.util
import io
import json
import os

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("reference_single_stream",
                                               os.path.join(ROOT, "bench", "reference_single_stream.py"))
rs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rs)


def closed_form(depth, h, heads, p, c=4, classes=1000, cond_tokens=1, cond_dim=0, learn_sigma=True):
    """Parameters written out by hand: linears without bias, RMSNorm weights, SwiGLU 8/3 h rounded to 64."""
    m = rs.round_up(int(h * 4 * 2 / 3 + 0.5), 64)
    cout = 2 * c if learn_sigma else c
    block = 4 * h + 2 * (h // heads) + 4 * h * h + 3 * h * m + 4 * h * h
    cond = cond_dim + cond_dim * h if cond_dim else (classes + 1) * cond_tokens * h
    return c * p * p * h + 256 * h + h * h + cond + depth * block + h * h + h * p * p * cout


def test_parameter_counts_match_the_closed_form():
    for name, cfg in rs.CONFIGS.items():
        with torch.device("meta"):
            m = rs.SingleStreamDiT(**cfg)
        assert sum(x.numel() for x in m.parameters()) == closed_form(cfg["depth"], cfg["hidden"], cfg["heads"],
                                                                     cfg["patch"]), name


def test_padding_changes_nothing_and_valid_tokens_do():
    torch.manual_seed(0)
    m = rs.SingleStreamDiT(depth=2, hidden=64, heads=4, patch=1, image_size=3, in_channels=3, cond_tokens=5,
                           cond_dim=7, learn_sigma=False)
    for p in m.parameters():  # the zero-initialised layers would hide everything
        p.data += 0.1 * torch.randn_like(p)
    x, t = torch.randn(2, 3, 3, 3), torch.rand(2) * 999
    cond, lens = torch.randn(2, 5, 7), torch.tensor([3, 1])
    out = m(x, t, None, cond, lens)
    padded = cond.clone()
    padded[0, 3:] = 1e3
    padded[1, 1:] = float("nan")
    assert torch.equal(m(x, t, None, padded, lens), out)
    changed = cond.clone()
    changed[0, 2] += 1
    assert (m(x, t, None, changed, lens) - out)[0].abs().max() > 1e-4


def test_rope_is_a_rotation_and_relative():
    cos, sin = rs.rope_tables([(0, 0, 0), (3, 1, 2), (4, 2, 3)], 16)
    q = torch.randn(3, 16)
    r = rs.apply_rope(q, cos, sin)
    assert torch.allclose(r.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    # Relative: <R(a) q, R(b) k> depends on a - b only, on every axis.
    k = torch.randn(16)

    def dot(pq, pk):
        c, s_ = rs.rope_tables([pq, pk], 16)
        return (rs.apply_rope(q[:1], c[:1], s_[:1]) * rs.apply_rope(k[None], c[1:], s_[1:])).sum()

    assert torch.allclose(dot((1, 1, 1), (0, 0, 0)), dot((3, 2, 5), (2, 1, 4)), atol=1e-4)
    assert not torch.allclose(dot((1, 1, 1), (0, 0, 0)), dot((1, 2, 1), (0, 0, 0)), atol=1e-4)
    assert rs.rope_axes(64) == (16, 24, 24) and rs.rope_axes(72) == (20, 26, 26)


TINY_FLAGS = ["--model", "SS-T/2", "--depth", "2", "--hidden", "64", "--heads", "4", "--image-size", "8",
              "--num-classes", "10"]


def bench(flags):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rs.main(["bench"] + TINY_FLAGS + flags + ["--steps", "2", "--warmup", "1", "--mode", "eager-fp32",
                                                   "--device", "cpu", "--json"])
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def test_bench_cpu_with_features_and_with_class_tokens():
    """reference_dit.py's bench protocol and JSON, on a tiny model: masked features, then class tokens."""
    keys = {"model", "batch", "mode", "ms_median", "ms_p10", "ms_p90", "images_per_s", "tflops",
            "peak_gib", "first_step_s", "torch_cache", "torch_cache_hits", "torch_cache_misses", "torch", "device",
            "float8_layers", "torchao", "compiled_regions",
            "world_size", "rank_ms_median", "images_per_s_total"}
    for flags in (["--cond-tokens", "4", "--cond-dim", "16"], ["--cond-tokens", "2"]):
        r = bench(flags + ["--batch", "3"])
        assert set(r) == keys, set(r) ^ keys
        assert r["model"] == "SS-T/2" and r["batch"] == 3 and r["mode"] == "eager-fp32", r
        assert r["device"] == "cpu" and r["peak_gib"] is None
        # tflops is rounded to 3 decimals: a tiny model on a loaded CPU may show 0.0.
        assert r["ms_median"] > 0 and r["images_per_s"] > 0 and r["tflops"] >= 0 and r["first_step_s"] > 0, r


def test_bench_flops_match_the_products_counted():
    """forward_flops_per_sample (perftrain's count) = the linears torch counts + attention 4*T*T*D per block."""
    for cond_dim in (0, 16):
        cfg = dict(depth=2, hidden=64, heads=4, patch=2, image_size=8, in_channels=4, num_classes=10,
                   class_dropout=0.1, learn_sigma=False, cond_tokens=4, cond_dim=cond_dim)
        m = rs.SingleStreamDiT(**cfg).eval()
        B, T = 3, 4 + 16
        x, t, y = torch.randn(B, 4, 8, 8), torch.rand(B) * 999, torch.randint(0, 10, (B,))
        cond, lens = (torch.randn(B, 4, cond_dim), torch.tensor([1, 4, 2])) if cond_dim else (None, None)
        with FlopCounterMode(display=False) as fc:
            m(x, t, y, cond, lens)
        linears = sum(v for k, v in fc.get_flop_counts()["Global"].items() if str(k) in ("aten.mm", "aten.addmm"))
        assert linears > 0
        assert B * rs.forward_flops_per_sample(cfg) == linears + cfg["depth"] * B * 4 * T * T * 64, cond_dim


def test_condition_dropout_gives_the_null_condition():
    """ConditionDropout at p = 1: every sample gets the null class (class tokens) or length 0 (features);
    at p = 0 the model's own output."""
    torch.manual_seed(0)
    for cond_dim in (0, 7):
        m = rs.SingleStreamDiT(depth=1, hidden=32, heads=2, patch=1, image_size=3, in_channels=2, num_classes=5,
                               class_dropout=0.1, learn_sigma=False, cond_tokens=3, cond_dim=cond_dim)
        for p in m.parameters():
            p.data += 0.1 * torch.randn_like(p)
        x, t, y = torch.randn(2, 2, 3, 3), torch.rand(2) * 999, torch.tensor([1, 4])
        cond, lens = (torch.randn(2, 3, 7), torch.tensor([3, 2])) if cond_dim else (None, None)
        null = m(x, t, torch.full_like(y, 5), cond, torch.zeros_like(lens) if cond_dim else None)
        kept = m(x, t, y, cond, lens)
        assert (kept - null).abs().max() > 1e-4, cond_dim  # the condition matters
        assert torch.equal(rs.ConditionDropout(m, 5, 1.0)(x, t, y, cond, lens), null), cond_dim
        assert torch.equal(rs.ConditionDropout(m, 5, 0.0)(x, t, y, cond, lens), kept), cond_dim


def test_regional_compile_takes_the_single_stream_blocks():
    """The -regional modes find the single-stream model's blocks (class Block) and trace one graph for all of
    them; the compiled model computes what the eager one does (Dynamo's eager backend for Inductor)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    m = rs.SingleStreamDiT(depth=3, hidden=64, heads=4, patch=1, image_size=3, in_channels=3, cond_tokens=5,
                           cond_dim=7, learn_sigma=False)
    for p in m.parameters():
        p.data += 0.1 * torch.randn_like(p)
    x, t = torch.randn(2, 3, 3, 3), torch.rand(2) * 999
    cond, lens = torch.randn(2, 5, 7), torch.tensor([3, 1])
    with torch.no_grad():
        want = m(x, t, None, cond, lens)
    real_module_compile = torch.nn.Module.compile
    torch.nn.Module.compile = lambda self, mode=None: real_module_compile(self, backend="eager")
    torch._dynamo.reset()
    counters.clear()
    try:
        assert rs.rd.compile_regions(m, None) == 3
        with torch.no_grad():
            got = m(x, t, None, cond, lens)
    finally:
        torch.nn.Module.compile = real_module_compile
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch.testing.assert_close(got, want)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)

"""Tests of bench/reference_single_stream.py (the plain-PyTorch single-stream DiT).

Run with pytest, or without it:  .venv/bin/python tests/python/test_reference_single_stream.py
"""
import importlib.util
import os

import torch

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


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)

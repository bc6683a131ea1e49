"""perftrain.nn against the plain-PyTorch references (bench/reference_dit.py: facebookresearch/DiT's
models.py with its names; bench/reference_single_stream.py): state dicts load strictly both ways, and
outputs and gradients agree in fp32 on the CPU, where perftrain.ops runs its reference kernels.

Run by ctest (python.nn.nn, PYTHONPATH=build/python) or: PYTHONPATH=build/python python tests/python/nn/test_nn.py
"""
import importlib.util
import os
import sys

import torch
from run_tests import run_all

from perftrain import nn as pnn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rd = _load("reference_dit")
rss = _load("reference_single_stream")

# Small enough for a second on two cores; odd enough to catch a mixed-up axis (8x8 latents, 3 blocks).
TINY = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=3, num_heads=4, mlp_ratio=4.0,
            class_dropout_prob=0.1, num_classes=10, learn_sigma=True)
TOL = dict(rtol=1e-5, atol=1e-5)


def perturbed(model, seed=1, scale=0.05):
    """Break adaLN-Zero (every branch contributes) so that the comparison covers every path."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def inputs(batch=3, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, TINY["in_channels"], TINY["input_size"], TINY["input_size"], generator=g)
    t = torch.tensor([0.0, 417.0, 999.0][:batch])
    y = torch.tensor([0, 7, TINY["num_classes"]][:batch])  # the last one the "no class" row
    return x, t, y


def forward_backward(model, x, t, y, gout):
    x = x.clone().requires_grad_(True)
    out = model(x, t, y)
    (out * gout).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), x.grad, grads


def assert_close(a, b, what):
    if not torch.allclose(a, b, **TOL):
        raise AssertionError(f"{what}: max difference {(a - b).abs().max().item():.3g}")


# ---------------------------------------------------------------------------


def test_reference_checkpoint_loads_strictly_and_gives_equal_outputs_and_gradients():
    torch.manual_seed(0)
    ref = perturbed(rd.DiT(**TINY)).eval()
    ours = pnn.DiT(**TINY).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x, t, y = inputs()
    gout = torch.randn(3, 8, 8, 8, generator=torch.Generator().manual_seed(3))
    out_r, gx_r, g_r = forward_backward(ref, x, t, y, gout)
    out_o, gx_o, g_o = forward_backward(ours, x, t, y, gout)
    assert out_o.shape == (3, 8, 8, 8)
    assert_close(out_o, out_r, "output")
    assert_close(gx_o, gx_r, "grad x")
    assert sorted(g_o) == sorted(g_r), "the same parameters get gradients"
    for name in g_r:
        assert_close(g_o[name], g_r[name], f"grad {name}")


def test_perftrain_checkpoint_loads_strictly_into_the_reference():
    torch.manual_seed(4)
    ours = perturbed(pnn.DiT(**{**TINY, "learn_sigma": False}), seed=5).eval()
    ref = rd.DiT(**{**TINY, "learn_sigma": False}).eval()
    ref.load_state_dict(ours.state_dict(), strict=True)
    x, t, y = inputs()
    with torch.no_grad():
        assert_close(ours(x, t, y), ref(x, t, y), "output")


def test_every_registry_config_has_the_reference_names_and_shapes():
    assert sorted(pnn.DiT_models) == sorted(rd.CONFIGS)
    for name, (depth, hidden, heads, patch) in rd.CONFIGS.items():
        with torch.device("meta"):
            ours = pnn.DiT_models[name]()
            ref = rd.DiT(depth=depth, hidden_size=hidden, num_heads=heads, patch_size=patch)
        want = [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
        got = [(k, tuple(v.shape)) for k, v in ours.state_dict().items()]
        assert got == want, f"{name}: state dict names/shapes differ"
        assert not ours.pos_embed.requires_grad, "pos_embed is fixed"


def test_initialisation_is_adaln_zero_with_the_fixed_pos_embed():
    torch.manual_seed(0)
    ours, ref = pnn.DiT(**TINY), rd.DiT(**TINY)
    assert torch.equal(ours.pos_embed, ref.pos_embed), "the same sin-cos table"
    for block in ours.blocks:
        assert not block.adaLN_modulation[1].weight.any() and not block.adaLN_modulation[1].bias.any()
    assert not ours.final_layer.linear.weight.any()
    x, t, y = inputs()
    with torch.no_grad():
        assert not ours(x, t, y).any(), "adaLN-Zero: the initial output is zero"


def test_label_dropout_uses_the_last_row_when_training():
    torch.manual_seed(0)
    emb = pnn.LabelEmbedder(10, 16, dropout_prob=1.0)
    assert emb.embedding_table.weight.shape == (11, 16)
    labels = torch.tensor([1, 2, 3])
    assert torch.equal(emb(labels, train=True), emb.embedding_table.weight[[10, 10, 10]])
    assert torch.equal(emb(labels, train=False), emb.embedding_table.weight[[1, 2, 3]])
    forced = emb(labels, train=False, force_drop_ids=torch.tensor([0, 1, 0]))
    assert torch.equal(forced, emb.embedding_table.weight[[1, 10, 3]])
    assert pnn.LabelEmbedder(10, 16, dropout_prob=0.0).embedding_table.weight.shape == (10, 16)


def test_forward_with_cfg_guides_the_first_three_channels_as_dit_does():
    torch.manual_seed(11)
    model = perturbed(pnn.DiT(**TINY)).eval()
    x, t, _ = inputs(batch=2)
    x = torch.cat([x[:1], x[:1]])
    y = torch.tensor([3, TINY["num_classes"]])  # the conditional half, then the "no class" half
    with torch.no_grad():
        out = model.forward_with_cfg(x, t[:1].repeat(2), y, cfg_scale=4.0)
        plain = model(x, t[:1].repeat(2), y)
    cond, uncond = plain[0, :3], plain[1, :3]
    want = uncond + 4.0 * (cond - uncond)
    assert_close(out[0, :3], want, "guided eps")
    assert_close(out[1, :3], want, "both halves guided")
    assert_close(out[:, 3:], plain[:, 3:], "the variance channels untouched")


def test_a_block_alone_and_the_final_layer_alone_match_the_reference():
    torch.manual_seed(6)
    ref_block, ref_final = rd.DiTBlock(64, 4), rd.FinalLayer(64, 2, 8)
    perturbed(ref_block), perturbed(ref_final)
    block, final = pnn.DiTBlock(64, 4), pnn.FinalLayer(64, 2, 8)
    block.load_state_dict(ref_block.state_dict(), strict=True)
    final.load_state_dict(ref_final.state_dict(), strict=True)
    x, c = torch.randn(2, 5, 64), torch.randn(2, 64)
    with torch.no_grad():
        assert_close(block(x, c), ref_block(x, c), "DiTBlock")
        assert_close(final(x, c), ref_final(x, c), "FinalLayer")


def test_the_chained_blocks_equal_the_blocks_one_after_another():
    torch.manual_seed(7)
    blocks = torch.nn.ModuleList([perturbed(pnn.DiTBlock(64, 4), seed=i) for i in range(3)])
    x, c = torch.randn(2, 5, 64), torch.randn(2, 64)
    with torch.no_grad():
        want = x
        for b in blocks:
            want = b(want, c)
        assert_close(pnn.dit_blocks_chained(blocks, x, c), want, "chain without a final layer")


def test_the_dit_forward_fuses_each_residual_with_the_next_norm():
    """One adaln_layernorm opens the chain; every residual after it is a residual_adaln (2 per block, the
    last one with the final layer's norm); no residual is added alone."""
    from perftrain import ops
    counts = {}
    saved = {name: getattr(ops, name) for name in ("adaln_layernorm", "residual_adaln", "gated_residual")}

    def counting(name):
        def call(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return saved[name](*args, **kwargs)
        return call

    try:
        for name in saved:
            setattr(ops, name, counting(name))
        with torch.no_grad():
            pnn.DiT(**TINY).eval()(*inputs())
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)
    assert counts == {"adaln_layernorm": 1, "residual_adaln": 2 * TINY["depth"]}, counts


def test_bf16_autocast_runs_the_products_in_bf16_and_keeps_the_residual_fp32():
    torch.manual_seed(8)
    model = perturbed(pnn.DiT(**TINY)).eval()
    x, t, y = inputs()
    stream, c = torch.randn(3, 16, 64), torch.randn(3, 64)
    with torch.no_grad():
        want = model(x, t, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert pnn.compute_dtype(x) == torch.bfloat16
            got = model(x, t, y)
            residual = pnn.dit_blocks_chained(model.blocks, stream, c)
    assert got.dtype == torch.bfloat16, "the final product in bf16"
    assert residual.dtype == torch.float32, "the residual stream stays fp32"
    assert (got.float() - want).abs().max() < 0.1 * want.abs().max(), "bf16 output near the fp32 one"


def test_bad_configs_are_refused_naming_the_argument():
    for kwargs, word in ((dict(input_size=9), "input_size"), (dict(depth=0), "depth"),
                         (dict(num_heads=5), "num_heads")):
        try:
            pnn.DiT(**{**TINY, **kwargs})
        except ValueError as e:
            assert word in str(e), str(e)
        else:
            raise AssertionError(f"{kwargs} accepted")


def test_compile_fullgraph_traces_the_training_forward_and_backward():
    import torch._dynamo
    torch._dynamo.reset()
    torch.manual_seed(9)
    model = perturbed(pnn.DiT(**{**TINY, "depth": 2})).train()  # two blocks: the chain, traced quickly
    x, t, y = inputs()

    def loss_fn(x, t, y):
        return model(x, t, y).square().mean()

    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    torch.manual_seed(1)
    got = compiled(x, t, y)
    got.backward()
    grad = model.blocks[0].attn.qkv.weight.grad.clone()
    model.zero_grad()
    torch.manual_seed(1)
    want = loss_fn(x, t, y)
    want.backward()
    assert_close(got.detach(), want.detach(), "compiled loss")
    assert_close(grad, model.blocks[0].attn.qkv.weight.grad, "compiled gradient")


# ------------------------------------------------------------- single stream


def single_stream_case(blocks=2, hidden=64, heads=4, tokens=6, with_mask=True):
    torch.manual_seed(10)
    mlp = rss.swiglu_hidden(hidden)
    refs = [perturbed(rss.Block(hidden, heads, mlp), seed=20 + i) for i in range(blocks)]
    ours = torch.nn.ModuleList([pnn.SingleStreamBlock(hidden, heads, mlp) for _ in range(blocks)])
    for o, r in zip(ours, refs):
        o.load_state_dict(r.state_dict(), strict=True)
    positions = [(0, 0, 0)] + [(1, r, c) for r in range(tokens // 2 - 1) for c in range(2)] + [(1, 5, 5)]
    cos, sin = pnn.rope_tables(positions[:tokens], hidden // heads)
    want_cos, want_sin = rss.rope_tables(positions[:tokens], hidden // heads)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    mask = None
    if with_mask:  # sample 1 drops its first (condition) token as a key
        mask = torch.ones(2, 1, 1, tokens, dtype=torch.bool)
        mask[1, ..., 0] = False
    x, c = torch.randn(2, tokens, hidden), torch.randn(2, hidden)
    return refs, ours, x, torch.nn.functional.silu(c), cos, sin, mask


def test_single_stream_blocks_take_the_reference_names_and_match_it_chained():
    refs, ours, x, silu_c, cos, sin, mask = single_stream_case()
    xr, xo = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    want = xr
    for r in refs:
        want = r(want, silu_c, cos, sin, mask)
    got = pnn.single_stream_blocks_chained(ours, xo, silu_c, cos, sin, mask)
    assert_close(got.detach(), want.detach(), "output")
    gout = torch.randn_like(got)
    (want * gout).sum().backward()
    (got * gout).sum().backward()
    assert_close(xo.grad, xr.grad, "grad x")
    for i, (o, r) in enumerate(zip(ours, refs)):
        for (name, po), (_, pr) in zip(o.named_parameters(), r.named_parameters()):
            assert_close(po.grad, pr.grad, f"block {i} grad {name}")


def test_a_single_stream_block_alone_matches_the_reference_without_a_mask():
    refs, ours, x, silu_c, cos, sin, _ = single_stream_case(blocks=1, with_mask=False)
    with torch.no_grad():
        assert_close(ours[0](x, silu_c, cos, sin), refs[0](x, silu_c, cos, sin, None), "block")


if __name__ == "__main__":
    run_all(globals())

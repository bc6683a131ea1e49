"""perftrain.optim.DeviceAdamW against torch.optim.AdamW (fp32, CPU, several steps), with clipping, EMA,
the LR warm-up, parameter groups, the fp16 loss scale, the bf16 weight copies and state_dict round trips.

Run by ctest (python.nn.optim) or: PYTHONPATH=build/python python tests/python/nn/test_optim.py
"""
import math

import torch
from run_tests import run_all
from torch.utils._python_dispatch import TorchDispatchMode

from perftrain import nn as pnn
from perftrain.optim import DeviceAdamW

STEPS = 5
TOL = dict(rtol=1e-5, atol=1e-6)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.GELU(), torch.nn.Linear(13, 3))


def batches(n=STEPS, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 7, generator=g), torch.randn(5, 3, generator=g)) for _ in range(n)]


def train(model, opt, data, before_step=None, loss_scale=None):
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if loss_scale is not None:
            loss = loss * loss_scale()
        loss.backward()
        if before_step is not None:
            before_step()
        opt.step()
        opt.zero_grad(set_to_none=True)


def assert_params_close(a, b, what):
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        if not torch.allclose(pa, pb, **TOL):
            raise AssertionError(f"{what}: {name} differs by {(pa - pb).abs().max().item():.3g}")


# ---------------------------------------------------------------------------


def test_steps_equal_torch_adamw_with_weight_decay():
    ours, theirs = make_model(), make_model()
    train(ours, DeviceAdamW(ours, lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1), batches())
    train(theirs, torch.optim.AdamW(theirs.parameters(), lr=3e-3, betas=(0.8, 0.95), eps=1e-7,
                                    weight_decay=0.1), batches())
    assert_params_close(ours, theirs, "AdamW")


def test_clipping_equals_clip_grad_norm_then_adamw_and_reports_the_norm():
    ours, theirs = make_model(), make_model()
    opt = DeviceAdamW(ours.parameters(), lr=1e-2, grad_clip=0.05)
    norms = []
    train(ours, opt, batches(), before_step=lambda: norms.append(
        torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ours.parameters()]))))
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0)
    train(theirs, ref, batches(), before_step=lambda: torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.05))
    assert_params_close(ours, theirs, "clipped AdamW")
    assert norms[-1] > 0.05, "the test clips"
    assert torch.allclose(opt.grad_norm, norms[-1], rtol=1e-5), "grad_norm: the last step's, before clipping"


def test_ema_follows_every_update_with_the_constant_decay():
    ours = make_model()
    opt = DeviceAdamW(ours, lr=1e-2, ema_decay=0.9)
    ema = [p.detach().clone() for p in ours.parameters()]

    def after_each():
        with torch.no_grad():
            for e, p in zip(ema, ours.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)  # DiT's update_ema, after the step

    for x, y in batches():
        torch.nn.functional.mse_loss(ours(x), y).backward()
        opt.step()
        opt.zero_grad()
        after_each()
    state = opt.ema_state_dict(ours)
    for (name, _), e in zip(ours.named_parameters(), ema):
        assert torch.allclose(state[name], e, **TOL), name
    copy = make_model(seed=5)
    opt.copy_ema_to(copy)
    assert torch.allclose(copy[0].weight, ema[0], **TOL)


def test_a_wrapped_model_is_taken_by_its_own_names():
    """DataParallel and torch.compile's wrapper (not compiled: never called) prefix the parameter names with
    module. and _orig_mod.; the optimizer, its EMA state dict and copy_ema_to use the model's own."""
    model = make_model()
    names = [n for n, _ in model.named_parameters()]
    for wrapped in (torch.nn.DataParallel(model), torch.compile(model), torch.compile(torch.nn.DataParallel(model))):
        opt = DeviceAdamW(wrapped, ema_decay=0.9)
        assert opt.names == names, opt.names
        assert list(opt.ema_state_dict(wrapped)) == list(model.state_dict())
        copy = make_model(seed=5)
        opt.copy_ema_to(torch.compile(copy))
        assert torch.equal(copy[0].weight, model[0].weight)


def test_lr_warmup_is_linear_from_zero_and_read_from_the_device():
    model = make_model()
    opt = DeviceAdamW(model, lr=1e-3, warmup_steps=4)
    lrs = []
    for _ in range(STEPS):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        lrs.append(opt.lr.item())
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(lrs, [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])), lrs
    assert opt.lr.device == model[0].weight.device and opt.lr.dim() == 0


def test_parameter_groups_without_decay_match_torch_groups():
    ours, theirs = make_model(), make_model()

    def groups(m):
        return [{"params": [m[0].weight, m[2].weight], "weight_decay": 0.2},
                {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0}]

    train(ours, DeviceAdamW(groups(ours), lr=5e-3, weight_decay=0.2), batches())
    train(theirs, torch.optim.AdamW(groups(theirs), lr=5e-3), batches())
    assert_params_close(ours, theirs, "groups")


def test_dynamic_loss_scale_unscales_and_skips_an_overflowing_step():
    ours, theirs = make_model(), make_model()
    opt = DeviceAdamW(ours, lr=1e-2, loss_scale="dynamic")
    assert opt.loss_scale.item() == 2.0 ** 16
    train(ours, opt, batches(), loss_scale=lambda: opt.loss_scale)
    train(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0), batches())
    assert_params_close(ours, theirs, "unscaled")
    before = [p.detach().clone() for p in ours.parameters()]
    for p in ours.parameters():
        p.grad = torch.full_like(p, float("inf"))
    opt.step()
    assert opt.loss_scale.item() == 2.0 ** 15, "halved on inf"
    assert opt.steps_skipped.item() == 1 and opt.steps_taken.item() == STEPS
    assert all(torch.equal(a, b) for a, b in zip(before, ours.parameters())), "a skipped step changes nothing"


def test_state_dict_round_trip_continues_exactly_and_in_place():
    a, b = make_model(), make_model()
    opt_a = DeviceAdamW(a, lr=2e-3, ema_decay=0.5, warmup_steps=3)
    train(a, opt_a, batches(3))
    b.load_state_dict(a.state_dict())
    opt_b = DeviceAdamW(b, lr=2e-3, ema_decay=0.5, warmup_steps=3)
    held = opt_b.exp_avgs[0]
    opt_b.load_state_dict(opt_a.state_dict())
    assert opt_b.exp_avgs[0] is held, "loaded in place: a captured step keeps reading the same tensors"
    more = batches(3, seed=9)
    train(a, opt_a, more)
    train(b, opt_b, more)
    assert_params_close(a, b, "resumed")
    assert torch.equal(opt_a.scalars, opt_b.scalars)


def test_bad_arguments_and_states_are_refused_naming_the_key():
    model = make_model()
    for kwargs, key in ((dict(lr=0), "lr"), (dict(lr_schedule="step"), "lr_schedule"),
                        (dict(lr_schedule="cosine"), "total_steps"), (dict(ema_decay=1.0), "ema_decay"),
                        (dict(loss_scale="auto"), "loss_scale"), (dict(grad_clip=-1), "grad_clip")):
        try:
            DeviceAdamW(model, **kwargs)
        except ValueError as e:
            assert key in str(e), str(e)
        else:
            raise AssertionError(f"{kwargs} accepted")
    opt = DeviceAdamW(model)
    try:
        DeviceAdamW(make_model(), ema_decay=0.9).load_state_dict(opt.state_dict())
    except ValueError as e:
        assert "EMA" in str(e), str(e)
    else:
        raise AssertionError("a state without EMA loaded into one with")
    try:
        DeviceAdamW(model.double())
    except ValueError as e:
        assert "float32" in str(e), str(e)
    else:
        raise AssertionError("float64 parameters accepted")


def test_bf16_copies_follow_the_weights_and_feed_the_products():
    torch.manual_seed(3)
    block = pnn.DiTBlock(32, 2)
    opt = DeviceAdamW(block, lr=1e-2, compute_dtype=torch.bfloat16)
    w = block.attn.qkv.weight
    assert w._perftrain_compute_copy.dtype == torch.bfloat16
    x, c = torch.randn(2, 4, 32), torch.randn(2, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        block(x, c).float().square().mean().backward()
    assert w.grad is not None and w.grad.dtype == torch.float32, "the gradient reaches the fp32 master"
    opt.step()
    assert torch.equal(w._perftrain_compute_copy, w.detach().to(torch.bfloat16)), "rewritten by the step"
    other = pnn.DiTBlock(32, 2)
    block.load_state_dict(other.state_dict())
    assert torch.equal(w._perftrain_compute_copy, other.attn.qkv.weight.to(torch.bfloat16)), \
        "the model's load_state_dict refreshes the copies (a stale copy would run the old weights)"


class _OpCalls(TorchDispatchMode):
    """Every operator call below autograd and autocast made inside it: (operator, args)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def test_the_block_products_read_the_copies_and_write_fp32_gradients():
    """Each product of a DiT block is a perftrain op given the fp32 weight and its bf16 copy (the C++
    trainer's linear and gelu_mlp): no ATen product, no separate GELU backward, and no bf16 gradient of a
    parameter cast to fp32 afterwards (the gradients are written in fp32 by the ops)."""
    torch.manual_seed(4)
    block = pnn.DiTBlock(32, 2)
    DeviceAdamW(block, compute_dtype=torch.bfloat16)
    params = dict(block.named_parameters())
    copies = {p._perftrain_compute_copy.data_ptr(): n for n, p in params.items()}
    masters = {p.data_ptr(): n for n, p in params.items()}
    x, c = torch.randn(2, 4, 32), torch.randn(2, 32)
    with _OpCalls() as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        block(x, c).float().square().mean().backward()
    names = [f"{f.namespace}::{f.__name__.split('.')[0]}" for f, _ in rec.calls]
    for op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::gelu_backward"):
        assert op not in names, f"{op} in the block's step: {sorted(set(names))}"
    read = []  # (master, copy) of each product, by parameter name
    for f, args in rec.calls:
        if f.namespace == "perftrain" and f.__name__.split(".")[0] in ("linear", "gelu_mlp"):
            pairs = [(args[1], args[3])] if f.__name__.startswith("linear") else [(args[1], args[5]), (args[3], args[6])]
            read += [(masters.get(w.data_ptr()), copies.get(cp.data_ptr()) if cp is not None else None)
                     for w, cp in pairs]
    want = ["adaLN_modulation.1.weight", "attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight"]
    assert sorted(read) == sorted((n, n) for n in want), read
    shapes = {tuple(p.shape) for p in params.values()}
    for f, args in rec.calls:
        if f.__name__.startswith("_to_copy") and args[0].dtype == torch.bfloat16 and tuple(args[0].shape) in shapes:
            raise AssertionError(f"a bf16 tensor of a parameter's shape {list(args[0].shape)} cast in the step")
    for n, p in params.items():
        assert p.grad is not None and p.grad.dtype == torch.float32, n


def test_the_blocks_modulations_are_one_product_reading_the_copies_in_place():
    """The chained DiT runs every block's adaLN modulation as one stacked_linear (one product of B rows, not
    one per block), reading the optimizer's bf16 copies, which lie back to back (one buffer for each
    parameter shape): the stacked weight is a view, not a concatenation. The gradients reach each block's
    fp32 master."""
    torch.manual_seed(5)
    depth = 3
    model = pnn.DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=depth, num_heads=2,
                    num_classes=10)
    with torch.no_grad():  # adaLN-Zero starts with a zero output, and so zero gradients
        for p in model.parameters():
            p.normal_(0, 0.1) if p.requires_grad else None
    DeviceAdamW(model, compute_dtype=torch.bfloat16)
    layers = [b.adaLN_modulation[1] for b in model.blocks]
    x, t, y = torch.randn(2, 4, 8, 8), torch.randint(0, 1000, (2,)), torch.randint(0, 10, (2,))
    with _OpCalls() as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, t, y).float().square().mean().backward()
    stacked = [args for f, args in rec.calls
               if f.namespace == "perftrain" and f.__name__.split(".")[0] == "stacked_linear"]
    assert len(stacked) == 1, f"{len(stacked)} stacked products"
    _, weights, biases, weight_copies, bias_copies = stacked[0]
    assert [w is l.weight for w, l in zip(weights, layers)] == [True] * depth
    assert [b is l.bias for b, l in zip(biases, layers)] == [True] * depth
    for copies, masters in ((weight_copies, weights), (bias_copies, biases)):
        assert [c is m._perftrain_compute_copy for c, m in zip(copies, masters)] == [True] * depth
        step = copies[0].numel() * copies[0].element_size()
        assert [c.data_ptr() - copies[0].data_ptr() for c in copies] == [i * step for i in range(depth)], \
            "the copies of one shape lie back to back"
    linear_weights = [args[1] for f, args in rec.calls
                      if f.namespace == "perftrain" and f.__name__.split(".")[0] == "linear"]
    assert not any(w is l.weight for w in linear_weights for l in layers), "a modulation ran alone"
    # The embedders too: the patch embedding and the timestep MLP are ops.linear products on the copies.
    names = {f"{f.namespace}::{f.__name__.split('.')[0]}" for f, _ in rec.calls}
    for op in ("aten::convolution", "aten::convolution_backward", "aten::mm", "aten::addmm"):
        assert op not in names, f"{op} in the DiT's step"
    embedder_weights = [model.x_embedder.proj.weight, model.t_embedder.mlp[0].weight, model.t_embedder.mlp[2].weight]
    assert all(any(w._base is e or w is e for w in linear_weights) for e in embedder_weights)
    for l in layers:
        assert l.weight.grad is not None and l.weight.grad.dtype == torch.float32
        assert l.weight.grad.abs().sum() > 0 and l.bias.grad.abs().sum() > 0


def test_the_stacked_modulations_equal_one_product_per_block():
    """Stacked or one block at a time, the chained blocks give the same output and gradients (fp32)."""
    torch.manual_seed(6)
    model = pnn.DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=3, num_heads=2,
                    num_classes=10)
    with torch.no_grad():
        for b in model.blocks:  # adaLN-Zero starts at zero: give the modulations something to carry
            b.adaLN_modulation[1].weight.normal_(0, 0.1), b.adaLN_modulation[1].bias.normal_(0, 0.1)
    x, t, y = torch.randn(2, 4, 8, 8), torch.randint(0, 1000, (2,)), torch.randint(0, 10, (2,))

    def run(stacked):
        model.zero_grad()
        saved = pnn.stacked_modulations
        if not stacked:
            pnn.stacked_modulations = lambda layers, silu_c, pieces: [
                pnn._linear(silu_c, l).chunk(pieces, dim=1) for l in layers]
        try:
            out = model(x, t, y)
        finally:
            pnn.stacked_modulations = saved
        out.square().mean().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    out_s, grads_s = run(True)
    out_p, grads_p = run(False)
    torch.testing.assert_close(out_s, out_p, atol=1e-6, rtol=1e-5)
    assert len(grads_s) == len(grads_p)
    for a, b in zip(grads_s, grads_p):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


if __name__ == "__main__":
    run_all(globals())

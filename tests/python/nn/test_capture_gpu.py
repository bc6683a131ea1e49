"""perftrain.capture_step on a GPU (label gpu; exits 77, skipped, without CUDA): a perftrain.nn DiT with
DeviceAdamW captured in one CUDA graph trains exactly as the same steps run eagerly, new batches copied
in; a host sync inside the step falls back to eager with the reason; DeviceAdamW.step() makes no host sync
(torch.cuda.set_sync_debug_mode("error")); torch.compile(fullgraph=True) of the perftrain modules on CUDA
has no graph break.

Run by ctest (python.nn.capture_gpu) or: PYTHONPATH=build/python python tests/python/nn/test_capture_gpu.py
"""
import io
import sys

import torch
from run_tests import run_all

if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

from perftrain.capture import capture_step  # noqa: E402
from perftrain import nn as pnn  # noqa: E402
from perftrain.optim import DeviceAdamW  # noqa: E402

CFG = dict(input_size=16, patch_size=2, in_channels=4, hidden_size=128, depth=2, num_heads=2, num_classes=10,
           class_dropout_prob=0.0, learn_sigma=False)
STEPS = 6


def setup(seed=0, bf16=True):
    torch.manual_seed(seed)
    model = pnn.DiT(**CFG).cuda().train()
    opt = DeviceAdamW(model, lr=1e-3, grad_clip=1.0, ema_decay=0.99,
                      compute_dtype=torch.bfloat16 if bf16 else None)
    return model, opt


def batches():
    g = torch.Generator(device="cuda").manual_seed(3)
    return [(torch.randn(8, 4, 16, 16, device="cuda", generator=g), torch.randint(0, 10, (8,), device="cuda",
                                                                                  generator=g),
             torch.randint(0, 1000, (8,), device="cuda", generator=g).float(),
             torch.randn(8, 4, 16, 16, device="cuda", generator=g)) for _ in range(STEPS)]


def make_step(model, opt, sync=False, bf16=True):
    def step(x, y, t, noise):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = model(x + noise, t, y)
        loss = torch.nn.functional.mse_loss(out.float(), noise)
        if sync and loss.item() < 0:  # a host sync: not capturable
            pass
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def test_the_captured_steps_equal_the_eager_steps():
    """fp32 (no autocast: no atomics in attention's backward), so the two runs may be compared closely:
    a replay that missed a new batch or a step would be an LR step (1e-3) away."""
    data = batches()
    eager_model, eager_opt = setup(bf16=False)
    eager_step = make_step(eager_model, eager_opt, bf16=False)
    for b in data:
        eager_step(*b)
    model, opt = setup(bf16=False)
    static = [t.clone() for t in data[0]]
    step = capture_step(make_step(model, opt, bf16=False), *static, warmup=2, log=io.StringIO())
    losses = [step(*b).clone() for b in data]
    torch.cuda.synchronize()
    assert step.captured, step.eager_reason
    assert opt.steps_taken.item() == STEPS
    for (name, a), b in zip(model.named_parameters(), eager_model.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=2e-5), f"{name}: {(a - b).abs().max().item()}"
    assert torch.isfinite(torch.stack(losses)).all()


def test_the_first_warmup_step_defers_the_products_algorithm_timing():
    """As the C++ trainer's first step: the products' timing is off in warm-up call 1, on from call 2."""
    model, opt = setup()
    data = batches()
    inner = make_step(model, opt)
    seen = []

    def step(*b):
        seen.append(torch.ops.perftrain.gemm_tuning_open())
        return inner(*b)

    captured = capture_step(step, *[t.clone() for t in data[0]], warmup=3, log=io.StringIO())
    for b in data[:5]:
        captured(*b)
    assert captured.captured, captured.eager_reason
    assert seen == [False, True, True, True], seen  # three warm-up calls and the capture
    assert torch.ops.perftrain.gemm_tuning_open()


def test_the_bf16_step_with_the_weight_copies_is_captured_and_trains():
    model, opt = setup()
    data = batches()
    step = capture_step(make_step(model, opt), *[t.clone() for t in data[0]], warmup=2, log=io.StringIO())
    first = step(*data[0]).item()
    for _ in range(4):
        for b in data:
            last = step(*b).item()
    assert step.captured, step.eager_reason
    assert last < first, (first, last)
    w = model.blocks[0].attn.qkv.weight
    assert torch.equal(w._perftrain_compute_copy, w.detach().to(torch.bfloat16)), "the copies follow the replays"


def test_a_host_sync_in_the_step_falls_back_to_eager_with_the_reason():
    model, opt = setup()
    log = io.StringIO()
    data = batches()
    step = capture_step(make_step(model, opt, sync=True), *[t.clone() for t in data[0]], warmup=1, log=log)
    for b in data[:3]:
        step(*b)
    torch.cuda.synchronize()
    assert not step.captured
    assert opt.steps_taken.item() == 3
    assert "capture failed" in log.getvalue(), log.getvalue()


def test_device_adamw_step_never_syncs_with_the_host():
    model, opt = setup()
    x, y, t, noise = batches()[0]
    make_step(model, opt)(x, y, t, noise)  # the first step makes the launch plan
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.mse_loss(model(x + noise, t, y).float(), noise)
    loss.backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()  # a host sync here raises
        opt.zero_grad()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert opt.steps_taken.item() == 2


def test_compile_fullgraph_of_the_perftrain_dit_on_cuda():
    import torch._dynamo
    torch._dynamo.reset()
    model, _ = setup()
    x, y, t, noise = batches()[0]

    def loss_fn(x, t, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(x, t, y).float().square().mean()

    compiled = torch.compile(loss_fn, fullgraph=True)
    got = compiled(x, t, y)
    got.backward()
    want = loss_fn(x, t, y)
    assert torch.allclose(got, want, rtol=2e-2), (got.item(), want.item())


if __name__ == "__main__":
    run_all(globals())

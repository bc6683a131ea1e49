"""perftrain.optim.DeviceAdamW under torch's DistributedDataParallel: two CPU ranks (gloo, real processes)
each training perftrain.nn.DiT on half the batch take the same steps as one process on the whole batch,
with clipping on the global norm and the EMA; with the bf16 weight copies (the optimizer made from the DDP
wrapper, by the model's own names) the ranks stay bit-identical.

Run by ctest (python.nn.optim_ddp) or: PYTHONPATH=build/python python tests/python/nn/test_optim_ddp.py
"""
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from run_tests import run_all
from torch.nn.parallel import DistributedDataParallel as DDP

from perftrain import nn as pnn
from perftrain.optim import DeviceAdamW

# No class dropout: its draws would differ between the ranks and the single process.
TINY = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4,
            class_dropout_prob=0.0, num_classes=10, learn_sigma=False)
BATCH, STEPS, WORLD = 6, 4, 2
# Clipping that bites (the norm is well above it), so the global norm after the all-reduce matters.
OPTIONS = dict(lr=3e-3, weight_decay=0.05, grad_clip=0.05, ema_decay=0.9, warmup_steps=2)


def make_model(seed=0):
    """adaLN-Zero broken (every branch contributes), the same weights in every process."""
    torch.manual_seed(seed)
    model = pnn.DiT(**TINY).train()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def data():
    """STEPS whole batches (x, t, y, target), the same in every process."""
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, 4, 8, 8, generator=g), torch.randint(0, 1000, (BATCH,), generator=g),
             torch.randint(0, 10, (BATCH,), generator=g), torch.randn(BATCH, 4, 8, 8, generator=g))
            for _ in range(STEPS)]


def train(forward, opt, batches):
    """-> the gradient norm each step reported (a mean loss over the rows given)."""
    norms = []
    for x, t, y, target in batches:
        loss = torch.nn.functional.mse_loss(forward(x, t, y), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        norms.append(float(opt.grad_norm))
    return norms


def result(model, opt, norms):
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
            "ema": {n: e.clone() for n, e in zip(opt.names, opt.emas)}, "norms": norms}


def rank_main(rank, port, out_dir, compute_dtype):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = make_model()
        if compute_dtype is None:  # the optimizer of the model, then the wrapper
            opt = DeviceAdamW(model, **OPTIONS)
            ddp = DDP(model)
        else:  # the optimizer of the wrapper: the model's own names (no "module." prefix)
            ddp = DDP(model)
            opt = DeviceAdamW(ddp, compute_dtype=compute_dtype, **OPTIONS)
            assert list(opt.ema_state_dict(ddp)) == list(model.state_dict())
        share = BATCH // WORLD
        mine = [tuple(v[rank * share:(rank + 1) * share] for v in b) for b in data()]
        torch.save(result(model, opt, train(ddp, opt, mine)), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(compute_dtype=None):
    """-> each rank's result, from real processes."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(rank_main, args=(free_port(), out_dir, compute_dtype), nprocs=WORLD, join=True)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(WORLD)]


def assert_ranks_identical(ranks):
    first = ranks[0]
    for r, other in enumerate(ranks[1:], 1):
        for key in ("params", "ema"):
            for name, value in first[key].items():
                if not torch.equal(value, other[key][name]):
                    diff = (value - other[key][name]).abs().max().item()
                    raise AssertionError(f"rank {r}'s {key} {name} differs from rank 0's by {diff:.3g}")


# ---------------------------------------------------------------------------


def test_two_ranks_take_the_single_process_steps_with_clipping_and_ema():
    ranks = run_ranks()
    assert_ranks_identical(ranks)
    model = make_model()
    opt = DeviceAdamW(model, **OPTIONS)
    alone = result(model, opt, train(model, opt, data()))
    # The norm is the whole batch's (each rank's gradient alone would differ), and clipping was active.
    torch.testing.assert_close(torch.tensor(ranks[0]["norms"]), torch.tensor(alone["norms"]), rtol=1e-5, atol=0)
    assert min(alone["norms"]) > 2 * OPTIONS["grad_clip"], alone["norms"]
    start, moved = make_model().state_dict(), 0
    for key in ("params", "ema"):
        for name, value in alone[key].items():
            ours = ranks[0][key][name]
            if name.endswith("attn.qkv.bias"):
                # k's bias: its gradient is zero but for roundoff (a constant added to a query's scores), which
                # Adam normalises into steps of up to lr, so the two summation orders part by more than q's
                # and v's. Bounded by what Adam can move it, the rest compared as every other tensor.
                is_k = torch.arange(ours.numel()) // TINY["hidden_size"] == 1
                assert (ours[is_k] - value[is_k]).abs().max() <= OPTIONS["lr"] * STEPS, f"{key} {name}: k's bias"
                ours, value = ours[~is_k], value[~is_k]
            torch.testing.assert_close(ours, value, rtol=1e-5, atol=1e-6, msg=f"{key} {name}")
            moved += int(not torch.equal(alone[key][name], start[name]))
    assert moved == 2 * len(opt.names), "every trainable tensor and its EMA moved"


def test_two_ranks_with_bf16_weight_copies_stay_identical():
    ranks = run_ranks(torch.bfloat16)
    assert_ranks_identical(ranks)
    start = make_model().state_dict()
    assert all(not torch.equal(v, start[n]) for n, v in ranks[0]["params"].items()), "every tensor moved"


if __name__ == "__main__":
    run_all(globals())

"""Tests of bench/reference_train.py (perftrain's training recipe in plain PyTorch, the parity reference).

A resolved config from `perftrain config` (DiT-T/4, DDPM with learned variance, two steps of two
micro-batches, a cosine schedule with warm-up, clipping and weight decay) is trained by the reference on a
small generated Fashion-MNIST set on the CPU; its EMA weights are read by `perftrain sample` with the config
from their metadata. The schedules and weight-decay groups against their closed forms and perftrain's rule.
(The data order against perftrain's loader: tests/train/reference_order_test.cpp.)

Run:  .venv/bin/python tests/python/test_reference_train.py [path/to/perftrain]
"""
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "perftrain")
SCRIPT = os.path.join(ROOT, "bench", "reference_train.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
_spec = importlib.util.spec_from_file_location("reference_train", SCRIPT)
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)


def run(*args):
    # One thread: these models are tiny, and on a busy 2-core machine more threads only wait for each other.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def write_fashion_mnist(directory, n=48):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    with open(os.path.join(directory, "train-images-idx3-ubyte"), "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + struct.pack(">3I", n, 28, 28) + pixels.tobytes())
    with open(os.path.join(directory, "train-labels-idx1-ubyte"), "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + struct.pack(">I", n) + labels.tobytes())


def write_config(directory, *extra):
    r = run(BINARY, "config", "--model", "DiT-T/4", "--objective", "ddpm", "--data-path", directory, "--steps", "2",
            "--batch-size", "4", "--lr", "1e-3", "--set", "model.learn_sigma=true", "--set", "train.accumulate=2",
            "--set", "train.lr_schedule=cosine", "--set", "train.warmup_steps=1", "--set", "train.grad_clip=1.0",
            "--set", "train.weight_decay=0.01", "--set", "log.every=1", *extra)
    assert r.returncode == 0, r.stdout
    path = os.path.join(directory, "run.toml")
    with open(path, "w") as f:
        f.write(r.stdout)
    return path


def test_two_steps_on_the_cpu_give_weights_perftrain_samples_from():
    with tempfile.TemporaryDirectory() as d:
        write_fashion_mnist(d)
        cfg = write_config(d)
        out, metrics = os.path.join(d, "ema.safetensors"), os.path.join(d, "metrics.jsonl")
        r = run(sys.executable, SCRIPT, "train", "--config", cfg, "--out", out, "--metrics", metrics, "--device", "cpu")
        assert r.returncode == 0, r.stdout
        rows = [json.loads(line) for line in open(metrics)]
        assert [row["step"] for row in rows] == [1, 2], rows
        assert all(math.isfinite(row["loss"]) and row["vb"] > 0 and row["grad_norm"] > 0 for row in rows), rows
        # Cosine after one warm-up step: the peak at step 1 (t = 0), lr_min = 0 at the last step.
        assert rows[0]["lr"] == 1e-3 and rows[1]["lr"] == 0.0, rows
        grid = os.path.join(d, "grid.png")
        r = run(BINARY, "sample", "--ckpt", out, "--out", grid, "--steps", "2", "--classes", "2", "--per-class", "2",
                "--device", "cpu")
        assert r.returncode == 0, r.stdout
        assert os.path.getsize(grid) > 0
        assert not [f for f in os.listdir(d) if ".tmp" in f]


def test_a_recipe_it_does_not_reproduce_is_refused_by_key():
    with tempfile.TemporaryDirectory() as d:
        write_fashion_mnist(d)
        cfg = write_config(d, "--set", "diffusion.objective=flow", "--set", "model.learn_sigma=false")
        out = os.path.join(d, "ema.safetensors")
        r = run(sys.executable, SCRIPT, "train", "--config", cfg, "--out", out, "--device", "cpu")
        assert r.returncode == 2, r.stdout
        assert "diffusion.objective = 'flow'" in r.stdout and len(r.stdout.strip().splitlines()) == 1, r.stdout
        assert not os.path.exists(out)


def test_hybrid_loss_equals_the_float64_reference():
    """The per-sample MSE and VLB against tests/diffusion/vlb_reference.py (guided-diffusion's formulas in
    float64 numpy, which perftrain's loss is checked against too), t = 0 (the decoder NLL) and pixels at +-1
    (its open-ended bins) included."""
    spec = importlib.util.spec_from_file_location("vlb_reference", os.path.join(ROOT, "tests", "diffusion",
                                                                                "vlb_reference.py"))
    vr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vr)
    rng = np.random.default_rng(1)
    b, c = 6, 2
    x0 = rng.uniform(-1, 1, size=(b, c, 4, 4))
    x0[:, :, 0, 0], x0[:, :, 0, 1] = -1.0, 1.0
    noise, out = rng.standard_normal((b, c, 4, 4)), rng.uniform(-1, 1, size=(b, 2 * c, 4, 4))
    t = np.array([0, 1, 2, 500, 998, 999])
    d = rt.Diffusion("cpu")
    f32 = lambda a: torch.from_numpy(a).float()
    x_t = d.q_sample(f32(x0), torch.from_numpy(t), f32(noise))
    mse, vb = d.terms(f32(out), f32(x0), x_t, f32(noise), torch.from_numpy(t), True)

    s = vr.schedule()
    col = lambda name: s[name][t].reshape(b, 1, 1, 1)
    x_t64 = col("sqrt_ab") * x0 + col("sqrt_1m_ab") * noise
    eps, v = out[:, :c], out[:, c:]
    frac = (v + 1) / 2
    logvar = frac * col("log_betas") + (1 - frac) * col("post_logvar_clipped")
    mean = col("coef1") * (col("sqrt_recip_ab") * x_t64 - col("sqrt_recipm1_ab") * eps) + col("coef2") * x_t64
    true_mean = col("coef1") * x0 + col("coef2") * x_t64
    kl = vr.mean_flat(vr.normal_kl(true_mean, col("post_logvar_clipped"), mean, logvar)) / np.log(2.0)
    nll = -vr.mean_flat(vr.discretized_log_likelihood(x0, mean, 0.5 * logvar)) / np.log(2.0)
    np.testing.assert_allclose(mse.numpy(), vr.mean_flat((noise - eps) ** 2), rtol=1e-5)
    np.testing.assert_allclose(vb.numpy(), np.where(t == 0, nll, kl), rtol=1e-5)


def test_lr_schedules_follow_the_closed_forms():
    tr = dict(lr=1.0, lr_min=0.1, warmup_steps=10, steps=110, decay_fraction=0.2, lr_schedule="constant")
    assert rt.lr_at(tr, 5) == 0.5 and rt.lr_at(tr, 60) == 1.0
    tr["lr_schedule"] = "cosine"
    assert math.isclose(rt.lr_at(tr, 60), 0.55) and math.isclose(rt.lr_at(tr, 110), 0.1)
    tr["lr_schedule"] = "linear"
    assert math.isclose(rt.lr_at(tr, 35), 0.1 + 0.9 * 0.75)
    tr["lr_schedule"] = "wsd"  # stable up to S = 110 - 22 = 88, then 1 - sqrt(u)
    assert rt.lr_at(tr, 88) == 1.0 and math.isclose(rt.lr_at(tr, 93.5), 0.1 + 0.9 * (1 - math.sqrt(0.25)))


def test_ema_decay_schedule():
    tr = dict(ema_decay=0.9999, ema_warmup=True, ema_start=3)
    assert [rt.ema_decay_at(tr, u) for u in (0, 2)] == [0.0, 0.0]
    assert rt.ema_decay_at(tr, 3) == 0.1 and math.isclose(rt.ema_decay_at(tr, 13), 11 / 20)
    assert rt.ema_decay_at(tr, 10 ** 6) == 0.9999
    tr["ema_warmup"] = False
    assert rt.ema_decay_at(tr, 3) == 0.9999


def test_weight_decay_groups_are_perftrains():
    model = rt.DiT(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=1, num_heads=2, num_classes=10)
    decayed = sorted(n for n, p in model.named_parameters() if p.requires_grad and rt.decays(n, p))
    assert decayed == ["blocks.0.attn.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight",
                       "blocks.0.mlp.fc2.weight", "final_layer.linear.weight", "t_embedder.mlp.0.weight",
                       "t_embedder.mlp.2.weight", "x_embedder.proj.weight"], decayed


if __name__ == "__main__":  # an exception ends the run with a traceback and exit status 1
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("PASS", name)

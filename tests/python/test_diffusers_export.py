"""`perftrain convert --to diffusers`, checked with the real diffusers package.

A small DiT in plain PyTorch (bench/reference_dit.py: facebookresearch/DiT's
model and names) with random weights is saved by torch.save, converted by
perftrain to its safetensors (every tensor equal to the source, read back by
the safetensors package) and from there, and straight from the .pt, to a
diffusers directory; DiTTransformer2DModel.from_pretrained loads each, and on
random inputs its output equals the reference's in fp32.

diffusers embeds timesteps with frequencies 10000^(-i/127) (its Timesteps
with downscale_freq_shift=1) where DiT uses 10000^(-i/128), for its own
conversion of the published weights as for ours; the outputs are compared
with that one attribute set to DiT's (without it, the difference is printed:
with these random weights it is large; docs/guide/training.md says how to
load an export so that it computes DiT's function).

Run:  .venv/bin/python tests/python/test_diffusers_export.py [path/to/perftrain]
"""
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory only; never the network

import torch
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "perftrain")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from reference_dit import DiT  # noqa: E402

try:
    from diffusers import DiTTransformer2DModel
except ImportError:
    print("SKIP: the diffusers package is not installed (pip install diffusers)")
    sys.exit(77)


def perftrain(*args):
    r = subprocess.run([BINARY, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    return r.stdout


def reference_model():
    torch.manual_seed(0)
    m = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4, num_classes=10,
            learn_sigma=True, class_dropout_prob=0.1)
    with torch.no_grad():  # adaLN-Zero starts every branch at zero: random weights make each one count
        for name, p in m.named_parameters():
            if p.requires_grad:
                p.normal_(std=0.1)
    return m.eval()


def diffusers_outputs(directory, x, t, y):
    """The loaded model's output as diffusers computes it, then with DiT's timestep frequencies."""
    hf = DiTTransformer2DModel.from_pretrained(directory, low_cpu_mem_usage=False).eval()
    with torch.no_grad():
        as_is = hf(x, timestep=t, class_labels=y).sample
        for block in hf.transformer_blocks:
            block.norm1.emb.time_proj.downscale_freq_shift = 0
        return as_is, hf(x, timestep=t, class_labels=y).sample


def main():
    ref = reference_model()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 8, 8, generator=g)
    t = torch.tensor([3.0, 400.0, 999.0])
    y = torch.tensor([0, 7, 10])  # 10: the null class of guidance
    with torch.no_grad():
        want = ref(x, t, y)
    with tempfile.TemporaryDirectory() as tmp:
        pt, st = os.path.join(tmp, "dit.pt"), os.path.join(tmp, "dit.safetensors")
        torch.save(ref.state_dict(), pt)
        out = perftrain("convert", pt, "--out", st, "--heads", "4")
        assert "heads 4" in out and "(from the shapes)" in out, out
        converted = load_file(st)
        assert set(converted) == set(ref.state_dict()), sorted(set(converted) ^ set(ref.state_dict()))
        for k, v in ref.state_dict().items():
            assert torch.equal(converted[k], v), k
        for source, extra in ((st, []), (pt, ["--heads", "4"])):
            directory = os.path.join(tmp, "hf-" + os.path.basename(source))
            perftrain("convert", source, "--to", "diffusers", "--out", directory, *extra)
            own, got = diffusers_outputs(directory, x, t, y)
            assert got.shape == want.shape, (got.shape, want.shape)
            diff = (got - want).abs().max().item()
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), f"{source}: max difference {diff}"
            as_is = (own - want).abs().max().item()
            scale = want.abs().max().item()
            print(f"ok {os.path.basename(source)} -> diffusers: max difference {diff:.2e} "
                  f"(with diffusers' timestep frequencies {as_is:.2e} of {scale:.2f})")


if __name__ == "__main__":
    main()

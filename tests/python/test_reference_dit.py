"""Tests of bench/reference_dit.py (the plain-PyTorch DiT that perftrain is checked against).

Run with pytest, or without it:  .venv/bin/python tests/python/test_reference_dit.py [build/perftrain]
"""
import contextlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "reference_dit.py")
_spec = importlib.util.spec_from_file_location("reference_dit", SCRIPT)
rd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rd)

# A small config that runs in well under a second on a CPU.
TINY = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4,
            num_classes=10, class_dropout_prob=0.1, learn_sigma=True)
# The trainer's binary, when ctest gives it (python.reference_dit's argument).
PERFTRAIN = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else None
TINY_FLAGS = ["--model", "DiT-S/2", "--depth", "2", "--hidden", "64", "--heads", "4", "--patch", "2",
              "--image-size", "8", "--num-classes", "10"]


def closed_form_params(depth, h, p, input_size=32, c=4, classes=1000, learn_sigma=True, dropout=0.1):
    """Parameter count of DiT written out by hand (pos_embed included, mlp_ratio 4).

    patch embed  c*p*p*h + h          pos_embed  T*h            t-MLP  256*h + h + h*h + h
    labels       (classes + [dropout>0]) * h
    per block    qkv 3h^2+3h, proj h^2+h, fc1 4h^2+4h, fc2 4h^2+h, adaLN 6h^2+6h  = 18h^2 + 15h
    final        h*p*p*cout + p*p*cout + adaLN 2h^2 + 2h
    """
    T = (input_size // p) ** 2
    cout = 2 * c if learn_sigma else c
    return (c * p * p * h + h + T * h + (256 * h + h + h * h + h) + (classes + (dropout > 0)) * h
            + depth * (18 * h * h + 15 * h) + (h * p * p * cout + p * p * cout + 2 * h * h + 2 * h))


def run_main(argv):
    """Run the CLI in-process; returns stdout."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rd.main(argv)
    return buf.getvalue()


def params_json(argv):
    return json.loads(run_main(["params", "--json"] + argv))


# ---------------------------------------------------------------------------


def test_param_counts_known():
    r = params_json(["--all"])
    assert len(r) == 12, sorted(r)
    assert r["DiT-XL/2"]["params"] == 675129632, r["DiT-XL/2"]["params"]
    assert r["DiT-S/2"]["params"] == 32963360, r["DiT-S/2"]["params"]


def test_param_counts_closed_form():
    r = params_json(["--all"])
    for name, (depth, hidden, heads, patch) in rd.CONFIGS.items():
        want = closed_form_params(depth, hidden, patch)
        assert r[name]["params"] == want, (name, r[name]["params"], want)
        assert r[name]["trainable"] == want - (32 // patch) ** 2 * hidden, name  # pos_embed is frozen
        assert sum(math.prod(s) for _, s in r[name]["tensors"]) == want, name
    # options that change the count
    r = params_json(["--model", "DiT-S/2", "--no-learn-sigma", "--class-dropout", "0"])
    (only,) = r.values()
    assert only["params"] == closed_form_params(12, 384, 2, learn_sigma=False, dropout=0), only["params"]


def test_state_dict_names():
    r = params_json(["--model", "DiT-XL/2"])
    shapes = {n: s for n, s in r["DiT-XL/2"]["tensors"]}
    h = 1152
    want = {
        "pos_embed": [1, 256, h],
        "x_embedder.proj.weight": [h, 4, 2, 2], "x_embedder.proj.bias": [h],
        "t_embedder.mlp.0.weight": [h, 256], "t_embedder.mlp.0.bias": [h],
        "t_embedder.mlp.2.weight": [h, h], "t_embedder.mlp.2.bias": [h],
        "y_embedder.embedding_table.weight": [1001, h],
        "final_layer.linear.weight": [32, h], "final_layer.linear.bias": [32],
        "final_layer.adaLN_modulation.1.weight": [2 * h, h], "final_layer.adaLN_modulation.1.bias": [2 * h],
    }
    for i in (0, 27):
        want.update({
            f"blocks.{i}.attn.qkv.weight": [3 * h, h], f"blocks.{i}.attn.qkv.bias": [3 * h],
            f"blocks.{i}.attn.proj.weight": [h, h], f"blocks.{i}.attn.proj.bias": [h],
            f"blocks.{i}.mlp.fc1.weight": [4 * h, h], f"blocks.{i}.mlp.fc1.bias": [4 * h],
            f"blocks.{i}.mlp.fc2.weight": [h, 4 * h], f"blocks.{i}.mlp.fc2.bias": [h],
            f"blocks.{i}.adaLN_modulation.1.weight": [6 * h, h], f"blocks.{i}.adaLN_modulation.1.bias": [6 * h],
        })
    for name, shape in want.items():
        assert shapes.get(name) == shape, (name, shapes.get(name), shape)
    assert len(shapes) == 8 + 28 * 10 + 4, len(shapes)
    assert "blocks.28.attn.qkv.weight" not in shapes


def test_forward_shape():
    torch.manual_seed(0)
    for learn_sigma, cout in ((True, 8), (False, 4)):
        m = rd.DiT(**{**TINY, "learn_sigma": learn_sigma}).eval()
        out = m(torch.randn(3, 4, 8, 8), torch.tensor([0.0, 10.5, 999.0]), torch.tensor([0, 5, 9]))
        assert out.shape == (3, cout, 8, 8), out.shape


def test_zero_init_outputs_zero():
    torch.manual_seed(0)
    m = rd.DiT(**TINY).train()
    out = m(torch.randn(2, 4, 8, 8) * 10, torch.tensor([3, 700]), torch.tensor([1, 2]))
    assert torch.count_nonzero(out) == 0
    sd = m.state_dict()
    for k in ["final_layer.linear.weight", "final_layer.linear.bias", "blocks.1.adaLN_modulation.1.weight",
              "blocks.0.adaLN_modulation.1.bias", "final_layer.adaLN_modulation.1.weight", "x_embedder.proj.bias"]:
        assert torch.count_nonzero(sd[k]) == 0, k
    assert abs(sd["y_embedder.embedding_table.weight"].std().item() - 0.02) < 0.005


def test_pos_embed_sincos():
    g, d = 4, 16
    m = rd.DiT(input_size=g * 2, patch_size=2, hidden_size=d, depth=1, num_heads=2, num_classes=3)
    pe = m.pos_embed
    assert pe.shape == (1, g * g, d) and not pe.requires_grad and pe.dtype == torch.float32
    # Token k is at row k // g, column k % g; channels: [sin(col*w), cos(col*w), sin(row*w), cos(row*w)].
    q = d // 4
    for k in range(g * g):
        row, col = k // g, k % g
        for i in range(q):
            w = 1.0 / 10000 ** (i / q)
            expect = [math.sin(col * w), math.cos(col * w), math.sin(row * w), math.cos(row * w)]
            got = [pe[0, k, j * q + i].item() for j in range(4)]
            assert np.allclose(got, expect, atol=1e-7), (k, i, got, expect)


def test_timestep_embedding():
    t = torch.tensor([0.0, 1.0, 500.0])
    e = rd.TimestepEmbedder.frequency_embedding(t, 256)
    assert e.shape == (3, 256)
    f = torch.exp(-math.log(10000) * torch.arange(128, dtype=torch.float32) / 128)
    assert torch.equal(e[:, :128], torch.cos(t[:, None] * f)) and torch.equal(e[:, 128:], torch.sin(t[:, None] * f))


def test_label_dropout():
    emb = rd.LabelEmbedder(10, 8, 0.5)
    assert emb.embedding_table.num_embeddings == 11
    assert rd.LabelEmbedder(10, 8, 0.0).embedding_table.num_embeddings == 10
    y = torch.arange(10)
    assert torch.equal(emb(y, train=False), emb.embedding_table.weight[:10])
    forced = emb(y, train=False, force_drop_ids=(y % 2))
    assert torch.equal(forced[1::2], emb.embedding_table.weight[10].expand(5, 8))
    assert torch.equal(forced[0::2], emb.embedding_table.weight[0:10:2])
    emb.dropout_prob = 1.0
    assert torch.equal(emb(y, train=True), emb.embedding_table.weight[10].expand(10, 8))


def test_unpatchify_matches_patch_layout():
    m = rd.DiT(**{**TINY, "learn_sigma": False})
    B, g, p, c = 2, 4, 2, 4
    tokens = torch.randn(B, g * g, p * p * c)
    img = m.unpatchify(tokens)
    for k in range(g * g):
        r, col = divmod(k, g)
        patch = tokens[:, k].reshape(B, p, p, c).permute(0, 3, 1, 2)  # [B,c,p,p], feature order (p,q,c)
        assert torch.equal(img[:, :, r * p:(r + 1) * p, col * p:(col + 1) * p], patch), k


def test_flops_xl2():
    f = 3 * rd.forward_flops_per_image(28, 1152, 2)
    assert 705e9 < f < 715e9, f  # the anchors file quotes about 711 GFLOP per image per step


def test_meta_build_is_cheap():
    with torch.device("meta"):
        m = rd.DiT()  # DiT-XL/2
    assert m.pos_embed.is_meta and m.pos_embed.shape == (1, 256, 1152)


def test_init_and_check_roundtrip():
    from safetensors.torch import load_file, save_file
    with tempfile.TemporaryDirectory() as d:
        w, i, o = (os.path.join(d, n) for n in ("w.safetensors", "in.safetensors", "out.safetensors"))
        run_main(["init"] + TINY_FLAGS + ["--out", w, "--seed", "3", "--perturb", "0.05"])
        sd = load_file(w)
        assert torch.count_nonzero(sd["final_layer.linear.weight"]) > 0  # perturbed away from adaLN-Zero
        g = torch.Generator().manual_seed(1)
        x, gout = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 8, 8, 8, generator=g)
        t, y = torch.tensor([5.0, 900.0]), torch.tensor([1, 9])
        save_file({"x": x, "t": t, "y": y, "gout": gout}, i)
        run_main(["check"] + TINY_FLAGS + ["--weights", w, "--inputs", i, "--out", o])
        res = load_file(o)

        m = rd.DiT(**TINY).eval()
        m.load_state_dict(sd)
        xg = x.clone().requires_grad_(True)
        out = m(xg, t, y)
        (out * gout).sum().backward()
        assert torch.allclose(res["out"], out, atol=1e-6, rtol=1e-5)
        assert torch.allclose(res["grad.x"], xg.grad, atol=1e-6, rtol=1e-5)
        trainable = {n for n, p in m.named_parameters() if p.requires_grad}
        assert {k[5:] for k in res if k.startswith("grad.") and k != "grad.x"} == trainable
        assert "grad.pos_embed" not in res
        for n, p in m.named_parameters():
            if p.requires_grad:
                assert torch.allclose(res[f"grad.{n}"], p.grad, atol=1e-5, rtol=1e-4), n
        # an unused "no class" row gets a zero gradient; used rows do not
        assert torch.count_nonzero(res["grad.y_embedder.embedding_table.weight"][10]) == 0
        assert torch.count_nonzero(res["grad.y_embedder.embedding_table.weight"][9]) > 0


def test_check_rejects_bad_weights():
    from safetensors.torch import load_file, save_file
    with tempfile.TemporaryDirectory() as d:
        w, i, o = (os.path.join(d, n) for n in ("w.safetensors", "in.safetensors", "out.safetensors"))
        run_main(["init"] + TINY_FLAGS + ["--out", w])
        save_file({"x": torch.randn(1, 4, 8, 8), "t": torch.zeros(1), "y": torch.zeros(1, dtype=torch.int64),
                   "gout": torch.randn(1, 8, 8, 8)}, i)
        good = load_file(w)
        bad_cases = {
            "missing": {k: v for k, v in good.items() if k != "blocks.1.mlp.fc2.bias"},
            "unexpected": {**good, "blocks.2.mlp.fc2.bias": good["blocks.1.mlp.fc2.bias"].clone()},
            "misshaped": {**good, "final_layer.linear.bias": torch.zeros(31)},
            "bf16": {**good, "pos_embed": good["pos_embed"].bfloat16()},
        }
        for case, sd in bad_cases.items():
            save_file(sd, w)
            r = subprocess.run([sys.executable, SCRIPT, "check"] + TINY_FLAGS + ["--weights", w, "--inputs", i,
                                "--out", o], capture_output=True, text=True)
            assert r.returncode != 0, case
            assert "error" in r.stderr and "Traceback" not in r.stderr, (case, r.stderr)
            assert not os.path.exists(o), case


def test_bench_cpu():
    line = run_main(["bench", "--model", "DiT-S/2", "--batch", "2", "--steps", "2", "--warmup", "0",
                     "--mode", "eager-fp32", "--device", "cpu", "--json"]).strip()
    r = json.loads(line)
    keys = {"model", "batch", "mode", "ms_median", "ms_p10", "ms_p90", "images_per_s", "tflops",
            "peak_gib", "first_step_s", "torch_cache", "torch_cache_hits", "torch_cache_misses", "torch", "device",
            "float8_layers", "torchao", "compiled_regions",
            "world_size", "rank_ms_median", "images_per_s_total"}
    assert set(r) == keys, set(r) ^ keys
    assert r["model"] == "DiT-S/2" and r["batch"] == 2 and r["mode"] == "eager-fp32"
    assert r["device"] == "cpu" and r["peak_gib"] is None
    assert r["ms_median"] > 0 and r["images_per_s"] > 0 and r["tflops"] > 0 and r["first_step_s"] > 0
    assert r["torch_cache"] is None and r["torch_cache_hits"] is None  # eager: nothing compiled
    assert r["compiled_regions"] is None


def test_bench_compiled_modes():
    """Each compiled mode reaches torch.compile with its mode (compile: the default, None), the CUDA-graph
    ones mark their steps, and the JSON says how warm torch.compile's cache was (torch.compile stood in
    for here: a real compile takes minutes on a CPU)."""
    hits, misses = rd.compile_cache_counts()  # torch's own counters, read as they are
    assert isinstance(hits, int) and isinstance(misses, int)
    seen = []
    real_compile, real_counts = rd.torch.compile, rd.compile_cache_counts
    rd.torch.compile = lambda model, mode=None: seen.append(mode) or model
    rd.compile_cache_counts = lambda: (3, 0)
    try:
        for mode in ("compile", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
            line = run_main(["bench"] + TINY_FLAGS + ["--batch", "2", "--steps", "1", "--warmup", "0",
                                                      "--mode", mode, "--device", "cpu", "--json"]).strip()
            r = json.loads(line)
            assert r["mode"] == mode and r["torch_cache"] == "warm", r
            assert r["torch_cache_hits"] == 3 and r["torch_cache_misses"] == 0, r
    finally:
        rd.torch.compile, rd.compile_cache_counts = real_compile, real_counts
    assert seen == [None, "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"], seen
    assert set(rd.COMPILE_MODES) | {"eager-fp32", "eager-bf16"} == set(rd.MODES)
    assert set(rd.FLOAT8_RECIPES) <= set(rd.COMPILE_MODES) and all(rd.COMPILE_MODES[m] is None for m in rd.FLOAT8_RECIPES)
    assert set(rd.CUDAGRAPH_MODES) == {"reduce-overhead", "max-autotune", "reduce-overhead-regional",
                                       "max-autotune-regional"}
    assert all(rd.COMPILE_MODES[m + "-regional"] == a for m, a in rd.WHOLE_MODEL_COMPILE_MODES.items())
    assert [rd.cache_state(*c) for c in ((4, 0), (0, 4), (1, 3), (0, 0))] == ["warm", "cold", "partial", "cold"]


def test_bench_regional_modes_compile_each_block_not_the_model():
    """<mode>-regional: torch.compile with that mode's argument on each DiT block, in place (the state_dict's
    names unchanged), never on the whole model; the JSON counts the regions (torch.compile and Module.compile
    stood in for: a real Inductor compile takes minutes here)."""
    seen_model, seen_blocks = [], []
    real_compile, real_module_compile, real_counts = rd.torch.compile, torch.nn.Module.compile, rd.compile_cache_counts
    rd.torch.compile = lambda model, mode=None: seen_model.append(mode) or model
    torch.nn.Module.compile = lambda self, mode=None: seen_blocks.append((type(self).__name__, mode))
    rd.compile_cache_counts = lambda: (0, 2)
    try:
        for mode in ("compile-regional", "max-autotune-regional"):
            r = json.loads(run_main(["bench"] + TINY_FLAGS + ["--batch", "2", "--steps", "1", "--warmup", "0",
                                                              "--mode", mode, "--device", "cpu", "--json"]).strip())
            assert r["mode"] == mode and r["compiled_regions"] == 2 and r["torch_cache"] == "cold", r
    finally:
        rd.torch.compile, torch.nn.Module.compile, rd.compile_cache_counts = real_compile, real_module_compile, real_counts
    assert seen_model == [], seen_model
    assert seen_blocks == [("DiTBlock", None)] * 2 + [("DiTBlock", "max-autotune")] * 2, seen_blocks
    model = rd.DiT(depth=3, hidden_size=64, patch_size=4, num_heads=4, input_size=16, num_classes=10)
    names = list(model.state_dict())
    assert rd.compile_regions(model, None) == 3 and list(model.state_dict()) == names


def test_regional_compile_shares_one_graph_across_blocks():
    """The point of the -regional modes: Dynamo traces one graph for all the blocks (they differ only in their
    parameters), so the cold compile does not grow with the depth; the compiled model computes what the eager
    one does. Dynamo's eager backend stands in for Inductor (the same tracing, no code generation)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    model = rd.DiT(depth=4, hidden_size=64, patch_size=4, num_heads=4, input_size=16, num_classes=10)
    for p in model.parameters():  # adaLN-Zero starts at zero: random weights, so that every block does something
        torch.nn.init.normal_(p, std=0.05)
    x, t, y = torch.randn(2, 4, 16, 16), torch.randint(0, 1000, (2,)), torch.randint(0, 10, (2,))
    with torch.no_grad():
        want = model(x, t, y)
    real_module_compile = torch.nn.Module.compile
    torch.nn.Module.compile = lambda self, mode=None: real_module_compile(self, backend="eager")
    torch._dynamo.reset()
    counters.clear()
    try:
        assert rd.compile_regions(model, None) == 4
        with torch.no_grad():
            got = model(x, t, y)
    finally:
        torch.nn.Module.compile = real_module_compile
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch.testing.assert_close(got, want)


def test_the_trainers_torch_modes_are_the_ones_this_script_runs():
    """perftrain bench --torch-modes (src/observe/bench/torch_reference.cpp) names exactly this script's MODES,
    read from the trainer's own refusal of an unknown mode (the perftrain binary: this test's first argument)."""
    if PERFTRAIN is None:
        print("skipped: no perftrain binary given (ctest passes it)")
        return
    r = subprocess.run([PERFTRAIN, "bench", "--against-torch", "--torch-modes", "no-such-mode"],
                       capture_output=True, text=True, timeout=120)
    said = r.stdout + r.stderr
    assert r.returncode != 0 and "known modes: " in said, said
    known = said.split("known modes: ", 1)[1].strip().split(", ")
    assert known == list(rd.MODES), (known, rd.MODES)


def test_bench_ddp_cpu():
    """--ddp under torch.distributed.run: 2 ranks over Gloo on the CPU, one JSON line (rank 0's) with both
    ranks' medians; without the launcher's variables a usage error, not a traceback."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
           SCRIPT, "bench"] + TINY_FLAGS + ["--batch", "3", "--steps", "2", "--warmup", "1", "--mode", "eager-fp32",
                                            "--device", "cpu", "--ddp", "--ddp-timeout", "60", "--json"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    said = f"exit {r.returncode}\nstdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert r.returncode == 0, said
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    assert len(lines) == 1, said
    j = json.loads(lines[0])
    assert j["world_size"] == 2 and j["batch"] == 3 and j["mode"] == "eager-fp32" and j["device"] == "cpu", j
    assert len(j["rank_ms_median"]) == 2 and all(x > 0 for x in j["rank_ms_median"]), j
    assert j["rank_ms_median"][0] == j["ms_median"], j
    assert math.isclose(j["images_per_s_total"], 2 * 3 / (max(j["rank_ms_median"]) / 1e3), rel_tol=1e-3), j
    # images_per_s comes from the unrounded median: recomputed from the rounded one it may differ in the last digit.
    assert abs(j["images_per_s"] - 3 / (j["ms_median"] / 1e3)) <= 0.006, j

    r = subprocess.run([sys.executable, SCRIPT, "bench", "--batch", "2", "--device", "cpu", "--ddp"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "torch.distributed.run" in r.stderr and "Traceback" not in r.stderr, \
        f"exit {r.returncode}\nstderr:\n{r.stderr[-3000:]}"


def test_bench_step_learns():
    """A few bf16-autocast steps on a tiny model move the weights and keep the loss finite."""
    torch.manual_seed(0)
    m = rd.DiT(**{**TINY, "learn_sigma": False}).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0)
    ddpm = rd.DDPMLinear()
    x0, y = torch.randn(4, 4, 8, 8), torch.randint(0, 10, (4,))
    before = m.final_layer.linear.weight.detach().clone()
    for _ in range(3):
        loss = rd.train_step(m, opt, ddpm, x0, y, torch.bfloat16)
        assert torch.isfinite(loss)
    assert not torch.equal(before, m.final_layer.linear.weight)
    assert torch.allclose(ddpm.sqrt_acp[0] ** 2, torch.tensor(1 - 1e-4))


def _run_all():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    passed = failed = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print(f"PASS {name}")
        except Exception as e:  # noqa: BLE001 -- report every failure, keep going
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    return failed == 0


def test_bench_float8_modes_convert_the_block_linears():
    """float8-tensorwise and float8-rowwise: torchao's Float8Linear in place of exactly the blocks' qkv, proj,
    fc1 and fc2 (not adaLN, not the embedders or the final layer), under compile's default mode; the JSON
    names torchao's version and the count. torch.compile stood in for (a real one takes minutes here); the
    float8 step itself needs a GPU's fp8 products, so the step is not run."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        print("skipped: no torchao (tools/setup.sh installs it)")
        return
    model = rd.DiT(depth=2, hidden_size=64, patch_size=4, num_heads=4, input_size=16, num_classes=10)
    assert rd.convert_float8(model, "rowwise") == 2 * 4
    names = sorted(n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear")
    assert names == sorted(f"blocks.{i}.{l}" for i in range(2) for l in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")), names
    odd = rd.DiT(depth=1, hidden_size=40, patch_size=4, num_heads=4, input_size=16, num_classes=10)
    assert rd.convert_float8(odd, "tensorwise") == 0  # 40 is no multiple of 16: fp8 products refuse it


def test_bench_float8_mode_without_torchao_says_what_to_do():
    """Without torchao the float8 modes stop with a line naming torchao and how to get it."""
    import builtins
    real_import = builtins.__import__

    def no_torchao(name, *a, **k):
        if name.startswith("torchao"):
            raise ImportError("No module named 'torchao'")
        return real_import(name, *a, **k)
    builtins.__import__ = no_torchao
    try:
        rd.convert_float8(rd.DiT(depth=1, hidden_size=64, patch_size=4, num_heads=4, input_size=16,
                                 num_classes=10), "tensorwise")
        raise AssertionError("no error")
    except SystemExit as e:
        assert e.code != 0
    finally:
        builtins.__import__ = real_import


if __name__ == "__main__":
    sys.exit(0 if _run_all() else 1)

"""examples/train_dit.py on the CPU, as a user runs it: one step plain and one with --perftrain (the marked
lines: perftrain.nn, DeviceAdamW, capture_step falling back to eager with its reason), and the refusal of
--perftrain with a compile mode that makes its own CUDA graphs, and of --compile-regions where it cannot apply.

Run by ctest (python.nn.example) or: PYTHONPATH=build/python python tests/python/nn/test_example.py
"""
import json
import os
import subprocess
import sys

from run_tests import run_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "examples", "train_dit.py")
SMALL = ["--device", "cpu", "--model", "DiT-S/8", "--batch-size", "1", "--num-classes", "10", "--steps", "1",
         "--warmup", "0"]


def run(*flags):
    return subprocess.run([sys.executable, SCRIPT, *flags], capture_output=True, text=True, timeout=300)


def test_one_plain_step_and_one_perftrain_step_report_their_times():
    for flags in ([], ["--perftrain"]):
        r = run(*SMALL, "--json", *flags)
        assert r.returncode == 0, r.stderr[-2000:]
        result = json.loads(r.stdout.strip().splitlines()[-1])
        assert result["perftrain"] == bool(flags) and result["ms_median"] > 0 and result["first_step_s"] > 0
        assert result["loss_first"] > 0
        if flags:
            assert result["captured"] is False and "cpu" in result["eager_reason"], result
            assert "running the step eagerly" in r.stderr, r.stderr


def test_perftrain_with_a_cuda_graph_compile_mode_is_refused_naming_the_option():
    r = run(*SMALL, "--perftrain", "--compile", "reduce-overhead")
    assert r.returncode == 2, r.returncode
    assert "--compile reduce-overhead" in r.stderr, r.stderr


def test_compile_regions_is_refused_without_compile_and_with_perftrain():
    """--compile-regions compiles the plain model's blocks: alone it would compile nothing, and perftrain.nn's DiT
    does not call its blocks as modules."""
    for flags in (["--compile-regions"], ["--compile-regions", "--compile", "default", "--perftrain"]):
        r = run(*SMALL, *flags)
        assert r.returncode == 2, (flags, r.returncode, r.stderr[-1000:])
        assert "--compile-regions" in r.stderr, r.stderr


if __name__ == "__main__":
    run_all(globals())

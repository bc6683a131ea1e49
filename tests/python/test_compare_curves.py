"""Tests of tools/compare_curves.py (the loss-curve check of the speed engine).

Run with pytest, or without it:  .venv/bin/python tests/python/test_compare_curves.py
"""
import contextlib
import importlib.util
import io
import json
import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("compare_curves", os.path.join(ROOT, "tools", "compare_curves.py"))
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


def curve(values):
    return {10 * (i + 1): v for i, v in enumerate(values)}


def write(dirname, name, values):
    path = os.path.join(dirname, name)
    with open(path, "w") as f:
        for step, loss in curve(values).items():
            f.write(json.dumps({"step": step, "loss": loss}) + "\n")
    return path


def test_band_is_the_references_spread_around_all_of_them():
    refs = [curve([9.0, 1.0, 2.0]), curve([9.0, 1.2, 2.0]), curve([9.0, 1.1, 2.1])]
    # Window 2: refs 1.0..1.2, d 0.2 -> band [0.8, 1.4]; window 3: 2.0..2.1 -> [1.9, 2.2].
    _, inside, n, worst, _, _ = cc.compare(curve([0.0, 1.39, 2.25]), refs)
    assert (inside, n) == (1, 2)  # the first window is skipped; 2.25 is outside [1.9, 2.2]
    assert abs(worst - 0.05) < 1e-9
    _, inside, n, worst, _, _ = cc.compare(curve([0.0, 0.81, 2.19]), refs)
    assert (inside, n, worst) == (2, 2, 0.0)


def test_gaps_compare_same_seed_with_between_seeds():
    refs = [curve([5.0, 1.0, 1.0]), curve([5.0, 1.4, 0.6])]
    _, _, _, _, same_seed, seed_gap = cc.compare(curve([5.0, 1.1, 0.9]), refs)
    assert abs(same_seed - 0.1) < 1e-9
    assert abs(seed_gap - 0.4) < 1e-9


def test_command_line_verdict_and_exit_code():
    with tempfile.TemporaryDirectory() as d:
        fast = write(d, "fast.jsonl", [3.0, 1.05, 0.5])
        r0 = write(d, "r0.jsonl", [3.0, 1.0, 0.5])
        r1 = write(d, "r1.jsonl", [3.1, 1.1, 0.52])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main(fast, r0, r1) == 0
        assert "verdict: PASS: 2/2 windows within the 2-seed fp32 band" in out.getvalue()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main(fast, r0) == 2  # one reference is not a spread
        bad = write(d, "bad.jsonl", [3.0, 2.0, 0.5])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main(bad, r0, r1) == 1
        assert "FAIL: 1/2" in out.getvalue()


def test_leave_one_out_uses_bands_of_the_other_references_only():
    # Window 2: the three references 1.0, 1.1, 1.6.
    refs = [curve([9.0, 1.0, 2.0]), curve([9.0, 1.1, 2.0]), curve([9.0, 1.6, 2.0])]
    ref_counts, fast_counts, n = cc.leave_one_out(curve([9.0, 1.05, 2.0]), refs)
    assert n == 2
    # ref0 vs {1.1, 1.6}: [0.6, 2.1] in; ref1 vs {1.0, 1.6}: in; ref2 vs {1.0, 1.1}: [0.9, 1.2] out.
    assert ref_counts == [2, 2, 1]
    # The fast run (1.05) against the same three bands: in, in, in.
    assert fast_counts == [2, 2, 2]


def test_verdict_passes_leave_one_out_when_the_fast_run_is_no_worse_than_a_seed():
    with tempfile.TemporaryDirectory() as d:
        # Window 3: the refs agree exactly (strict band [2.0, 2.0]) and the fast run is 0.001 off;
        # windows 2 and 4 make ref2 an outlier, window 5 ref1 (inside 4, 3, 2 of 4; mean 3).
        r0 = write(d, "r0.jsonl", [9.0, 1.0, 2.0, 3.0, 4.0])
        r1 = write(d, "r1.jsonl", [9.0, 1.01, 2.0, 3.0, 4.3])
        r2 = write(d, "r2.jsonl", [9.0, 1.3, 2.0, 3.2, 4.0])
        fast = write(d, "fast.jsonl", [9.0, 1.0, 2.001, 3.0, 4.0])  # inside 3 of 4 in every band
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main(fast, r0, r1, r2) == 0
        assert "verdict: PASS (leave-one-out" in out.getvalue()
        assert "strict: 3/4 windows" in out.getvalue()
        # Far outside everywhere: more an outlier than any seed.
        bad = write(d, "bad.jsonl", [9.0, 5.0, 7.0, 9.0, 11.0])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main(bad, r0, r1, r2) == 1
        assert "verdict: FAIL (leave-one-out" in out.getvalue()


def test_records_without_a_loss_are_skipped_and_refs_are_named():
    # eval.every writes {"step", "eval", "eval_s"} into the same metrics.jsonl.
    with tempfile.TemporaryDirectory() as d:
        fast = write(d, "fast.jsonl", [3.0, 1.05, 0.5])
        with open(fast, "a") as f:
            f.write(json.dumps({"step": 30, "eval": {"fd_features": 1.5}, "eval_s": 9.0}) + "\n")
        assert cc.load(fast) == curve([3.0, 1.05, 0.5])
        r0 = write(d, "r0.jsonl", [3.0, 1.0, 0.5])
        r1 = write(d, "r1.jsonl", [3.1, 1.1, 0.52])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main("--refs", "bf16", fast, r0, r1) == 0
        assert "verdict: PASS: 2/2 windows within the 2-seed bf16 band" in out.getvalue()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main("--refs", "bf16", fast, r0) == 2
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cc.main("--refs", "bf16", fast, r0, os.path.join(d, "absent.jsonl")) == 2
        assert "no such file: " in out.getvalue()


if __name__ == "__main__":
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("ok", name)

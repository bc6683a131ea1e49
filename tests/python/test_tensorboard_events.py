"""A short CPU `perftrain train` read back by TensorBoard's own reader.

EventAccumulator (tensorboard in .venv, nothing held back: size_guidance 0)
must return every scalar of metrics.jsonl with its value, a weight histogram
per parameter at each histogram step that matches the checkpoint's weights,
the gradient-health scalars the metrics lines record, a gradient histogram per
module at the histogram steps that agrees with them, and each sample grid
as the PNG the run wrote. The run's loss.svg and gradient_flow.svg must be
well-formed XML with one point per metrics line and one bar pair per module.

Run:  .venv/bin/python tests/python/test_tensorboard_events.py [path/to/perftrain]
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import numpy as np
from safetensors.numpy import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "perftrain")
TINY = ["--device", "cpu", "--data", "synthetic", "--set", "data.synthetic_size=64", "--batch-size", "4",
        "--set", "model.depth=2", "--set", "model.hidden=32", "--set", "model.heads=2", "--set", "model.patch=8",
        "--set", "log.sample_per_class=2", "--set", "diffusion.sample_steps=1", "--set", "log.sample_classes=3"]
SVG = "{http://www.w3.org/2000/svg}"


def train(runs, name, *extra):
    cmd = [BINARY, "train", "--runs-dir", runs, "--run-name", name] + TINY + list(extra)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    return os.path.join(runs, name)


def accumulator(tb_dir):
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0,
                                                  "compressedHistograms": 0, "audio": 0})
    acc.Reload()
    return acc


# The gradient histograms' bucket limits (observe::grad_histogram_limits): four a decade over |g| in
# [1e-12, 1e2], both signs, the last the largest double.
LIMITS = ([-10.0 ** (-12 + k / 4) for k in range(56, -1, -1)] + [10.0 ** (-12 + k / 4) for k in range(57)]
          + [sys.float_info.max])


def module_of(name):
    """observe::module_of_parameter: the first name component, with the index of a list."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def close(a, b, rel):
    return abs(a - b) <= rel * max(1.0, abs(b))


def test_scalars_histograms_images_and_plot():
    with tempfile.TemporaryDirectory() as runs:
        run = train(runs, "r", "--steps", "6", "--set", "log.every=2", "--set", "log.histogram_every=3",
                    "--set", "log.sample_every=3", "--set", "health.monitor_every=2")
        files = os.listdir(os.path.join(run, "tb"))
        assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
        acc = accumulator(os.path.join(run, "tb"))
        tags = acc.Tags()

        # Scalars: every numeric field of every metrics line, at its step.
        lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
        assert [l["step"] for l in lines] == [2, 4, 6]
        written = set()
        for line in lines:
            for key, value in line.items():
                if key == "step" or not isinstance(value, (int, float)):
                    continue
                written.add("train/" + key)
                events = [e for e in acc.Scalars("train/" + key) if e.step == line["step"]]
                assert len(events) == 1, (key, line["step"])
                assert close(events[0].value, float(np.float32(value)), 1e-6), (key, events[0].value, value)
        assert {"train/loss", "train/lr", "train/images_per_s"} <= written
        train_tags = {t for t in tags["scalars"] if t.startswith("train/")}
        assert train_tags == written, train_tags ^ written

        # Gradient health (health.monitor_every): the monitored step's global and per-module values,
        # as the metrics line records them.
        monitored = [l for l in lines if "grad" in l]
        assert monitored, "no gradient-health sample in metrics.jsonl"
        modules = list(monitored[-1]["grad_modules"])
        for line in monitored:
            g, at = line["grad"], line["grad"]["step"]
            want = {"grad/global_norm": g["norm"], "grad/global_update_ratio": g["update_ratio"]}
            for m, st in line["grad_modules"].items():
                want.update({"grad_norm/" + m: st["norm"], "grad_max/" + m: st["max_abs"],
                             "grad_zero_share/" + m: st["zero_share"], "update_ratio/" + m: st["update_ratio"]})
            for tag, value in want.items():
                got = [e.value for e in acc.Scalars(tag) if e.step == at]
                assert len(got) == 1 and close(got[0], float(np.float32(value)), 1e-6), (tag, at, got, value)
        assert {"grad_norm/" + m for m in modules} <= set(tags["scalars"])

        # Histograms: one per parameter at steps 3 and 6; step 6's are the checkpoint's weights.
        weights = load_file(os.path.join(run, "ckpt", "step_00000006", "model.safetensors"))
        del weights["pos_embed"]  # a fixed buffer, not a parameter
        assert {t for t in tags["histograms"] if t.startswith("weights/")} == {"weights/" + n for n in weights}, \
            tags["histograms"]
        for name, w in weights.items():
            hs = acc.Histograms("weights/" + name)
            assert [h.step for h in hs] == [3, 6], (name, [h.step for h in hs])
            h = hs[1].histogram_value
            v = w.astype(np.float64).ravel()
            assert h.num == v.size, name
            assert close(h.min, v.min(), 1e-6) and close(h.max, v.max(), 1e-6), name
            assert close(h.sum, v.sum(), 1e-4 * (1 + np.square(v).sum())), (name, h.sum, v.sum())
            assert close(h.sum_squares, np.square(v).sum(), 1e-5), name
            assert len(h.bucket) == len(h.bucket_limit) and sum(h.bucket) == v.size, name
            if v.max() > v.min():
                want, _ = np.histogram(v, bins=len(h.bucket), range=(v.min(), v.max()))
                assert np.abs(np.array(h.bucket) - want).max() <= 1, (name, h.bucket, want)  # edge rounding
                assert close(h.bucket_limit[-1], v.max(), 1e-6), name

        # Gradient histograms (health.grad_histograms): one per module at the first monitored step at or
        # after each multiple of log.histogram_every (steps 4 and 6), over the fixed buckets, every
        # element of the module's gradients counted once, agreeing with that step's statistics.
        numel = {}
        for n, w in weights.items():
            numel[module_of(n)] = numel.get(module_of(n), 0) + w.size
        assert {t for t in tags["histograms"] if t.startswith("grad/")} == {"grad/" + m for m in numel}, \
            tags["histograms"]
        assert set(tags["histograms"]) <= {"grad/" + m for m in numel} | {"weights/" + n for n in weights}
        by_step = {l["grad"]["step"]: l for l in monitored}
        for m in numel:
            hs = acc.Histograms("grad/" + m)
            assert [h.step for h in hs] == [4, 6], (m, [h.step for h in hs])
            for h in hs:
                st, hv = by_step[h.step]["grad_modules"][m], h.histogram_value
                assert hv.num == numel[m] and sum(hv.bucket) == numel[m], (m, h.step, hv.num, sum(hv.bucket))
                assert close(np.sqrt(hv.sum_squares), st["norm"], 1e-5), (m, hv.sum_squares, st["norm"])
                assert close(max(-hv.min, hv.max), st["max_abs"], 1e-6), (m, hv.min, hv.max, st["max_abs"])
                lim = list(hv.bucket_limit)
                first = min(range(len(LIMITS)), key=lambda i: abs(LIMITS[i] - lim[0]))
                assert all(close(a, b, 1e-12) for a, b in zip(lim, LIMITS[first:first + len(lim)])), (m, lim)
                assert len(lim) == len(hv.bucket) and hv.bucket[0] > 0 and hv.bucket[-1] > 0, (m, hv.bucket)
                f32 = np.float32
                assert f32(hv.min) <= f32(lim[0]) and (first == 0 or f32(hv.min) > f32(LIMITS[first - 1])), m
                assert f32(hv.max) <= f32(lim[-1]) and (len(lim) == 1 or f32(hv.max) > f32(lim[-2])), m

        # Images: the sample grids of steps 3 and 6, byte for byte.
        assert tags["images"] == ["samples"]
        images = acc.Images("samples")
        assert [i.step for i in images] == [3, 6]
        for im in images:
            png = open(os.path.join(run, "samples", "step_%08d.png" % im.step), "rb").read()
            assert im.encoded_image_string == png
            assert (im.width, im.height) == (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big"))

        # The loss curve: well-formed SVG, one polyline point per metrics line.
        root = ET.parse(os.path.join(run, "loss.svg")).getroot()
        assert root.tag == SVG + "svg"
        lines_ = [p for p in root.iter(SVG + "polyline") if p.get("class") == "series"]
        assert len(lines_) == 1
        assert len(lines_[0].get("points").split()) == len(lines)

        # The gradient-flow plot of the last monitored step: one mean and one max bar per module.
        root = ET.parse(os.path.join(run, "gradient_flow.svg")).getroot()
        rects = list(root.iter(SVG + "rect"))
        assert len([r for r in rects if r.get("class") == "mean"]) == len(modules)
        assert len([r for r in rects if r.get("class") == "max"]) == len(modules)
        labels = [t.text for t in root.iter(SVG + "text")]
        assert all(m in labels for m in modules), (modules, labels)


def test_tensorboard_off_writes_no_events():
    with tempfile.TemporaryDirectory() as runs:
        run = train(runs, "r", "--steps", "2", "--set", "log.tensorboard=false")
        assert not os.path.exists(os.path.join(run, "tb"))


def test_resumed_run_adds_a_file_tensorboard_reads_as_one_run():
    with tempfile.TemporaryDirectory() as runs:
        run = train(runs, "r", "--steps", "4", "--set", "log.every=2")
        r = subprocess.run([BINARY, "train", "--resume", run, "--steps", "6"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        assert r.returncode == 0, r.stdout
        assert len(os.listdir(os.path.join(run, "tb"))) == 2
        acc = accumulator(os.path.join(run, "tb"))
        assert [e.step for e in acc.Scalars("train/loss")] == [2, 4, 6]


if __name__ == "__main__":
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("ok", name)

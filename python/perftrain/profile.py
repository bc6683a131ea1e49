"""perftrain.profile: where a PyTorch training step's time goes, and what to change.

    import perftrain.profile
    report = perftrain.profile.profile(lambda: train_step(batch), steps=3, warmup=5)

runs `step_fn` (one training step of the user's own loop, eager or compiled) `warmup` times unprofiled
(torch.compile compiles, CUDA graphs are captured, cuDNN and the allocator settle), times `timed_steps` more
without the profiler, then records one profiler warm-up step and `steps` steps under torch.profiler (CPU and
CUDA activity, shapes recorded), writes the Chrome trace (open it in ui.perfetto.dev), and returns the
diagnosis `perftrain diagnose TRACE` gives: the breakdown of the step, the op table and the findings
(launch-bound, data-bound, elementwise, matrix-bound, power-capped, host syncs, fp32 products, ...), each
with the PyTorch-side change to try. The same C++ rules as `perftrain profile` (torch.ops.perftrain.
diagnose_trace).

Besides what torch.profiler writes, the trace gets a top-level "perftrain" object: the unprofiled and the
profiled step as measured here (CUDA events around the steps on a GPU, the host clock on the CPU), so the
report takes the profiler's own cost out of the idle time, and nvidia-smi's samples of the SM clock and
power while the steps were recorded (for the power-capped finding) where nvidia-smi runs.
"""

import datetime
import gzip
import json as _json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

__all__ = ["profile", "record_trace", "diagnose"]

# nvidia-smi's fields, in the order the C++ reader (observe/bench/gpu_sampler.h) expects them.
_GPU_SAMPLE_FIELDS = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"


def _require_positive(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"perftrain.profile: {name} must be a positive int (got {value!r})")


class _Clock:
    """Times steps as the C++ profiler does: CUDA events on the current stream, or the host clock."""

    def __init__(self, cuda):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed_ms(self, a, b):
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


class _GpuSampler:
    """nvidia-smi every 100 ms in the background while the profiled steps run; no samples without it."""

    def __init__(self, cuda):
        self.proc = None
        smi = shutil.which("nvidia-smi") if cuda else None
        if smi is None:
            return
        index = torch.cuda.current_device()
        self.out = tempfile.TemporaryFile(mode="w+")
        try:
            self.proc = subprocess.Popen([smi, f"--query-gpu={_GPU_SAMPLE_FIELDS}", "--format=csv,noheader,nounits",
                                          "-lms", "100", "-i", str(index)], stdout=self.out,
                                         stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def stop(self):
        if self.proc is None:
            return ""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.seek(0)
        text = self.out.read()
        self.out.close()
        return text


def _default_trace_path():
    return os.path.join(os.getcwd(), datetime.datetime.now().strftime("perftrain-profile-%Y%m%d-%H%M%S.json"))


def _add_perftrain_object(path, meta):
    """Writes {"perftrain": meta, ...the trace's own keys} back to path (gzip'd where path ends in .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    brace = text.find("{")
    if brace < 0:
        raise RuntimeError(f"perftrain.profile: {path} is not a Chrome trace")
    text = text[:brace + 1] + '\n  "perftrain": ' + _json.dumps(meta) + "," + text[brace + 1:]
    tmp = path + ".tmp"
    with opener(tmp, "wt") as f:
        f.write(text)
    os.replace(tmp, path)


def record_trace(step_fn, trace=None, steps=3, warmup=2, timed_steps=5, record_shapes=True):
    """Runs step_fn warmup + timed_steps times without the profiler and 1 + steps times under it; writes
    the Chrome trace to `trace` (default: perftrain-profile-<date>.json here; .json.gz is gzip'd) with the
    measured steps and GPU samples in its "perftrain" object. Returns the trace's path."""
    if not callable(step_fn):
        raise TypeError("perftrain.profile: step_fn must be callable (one training step)")
    for name, v in (("steps", steps), ("warmup", warmup), ("timed_steps", timed_steps)):
        _require_positive(name, v)
    path = os.path.abspath(trace or _default_trace_path())
    if not (path.endswith(".json") or path.endswith(".json.gz")):
        raise ValueError(f"perftrain.profile: trace must end in .json or .json.gz (got {path})")
    for _ in range(warmup):
        step_fn()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # the step ran on a GPU
    clock = _Clock(cuda)
    marks = [clock.mark()]
    for _ in range(timed_steps):
        step_fn()
        marks.append(clock.mark())
    unprofiled = statistics.median(clock.elapsed_ms(a, b) for a, b in zip(marks, marks[1:]))

    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    sampler = _GpuSampler(cuda)
    with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=record_shapes) as prof:
        step_fn()  # the profiler's warm-up step: its events are dropped
        prof.step()
        first = clock.mark()
        for i in range(steps):
            step_fn()
            if i == steps - 1:
                last = clock.mark()  # before the profiler's stop, which the trace does not hold either
            prof.step()
    samples = sampler.stop()
    profiled = clock.elapsed_ms(first, last) / steps

    os.makedirs(os.path.dirname(path), exist_ok=True)
    raw = path[:-3] if path.endswith(".gz") else path
    prof.export_chrome_trace(raw)
    if raw != path:  # torch writes plain JSON here; gzip it into place
        with open(raw, "rb") as f, gzip.open(path, "wb") as g:
            shutil.copyfileobj(f, g)
        os.remove(raw)
    meta = {"unprofiled_ms": f"{unprofiled:.6f}", "unprofiled_steps": str(timed_steps),
            "profiled_ms": f"{profiled:.6f}", "profiled_steps": str(steps),
            "recorded_by": "perftrain.profile"}
    if samples.strip():
        meta["gpu_samples"] = samples
    _add_perftrain_object(path, meta)
    return path


def diagnose(trace, json=False):
    """The report of `perftrain diagnose TRACE` for any torch.profiler trace: Markdown, or with json=True
    the JSON report as a dict. RuntimeError naming the file when it is not a trace."""
    import perftrain  # noqa: F401  (loads perftrain._C, which registers torch.ops.perftrain.*)
    text = torch.ops.perftrain.diagnose_trace(os.fspath(trace), json)
    return _json.loads(text) if json else text


def profile(step_fn, steps=3, warmup=2, trace=None, timed_steps=5, json=False, record_shapes=True, quiet=False):
    """Profiles step_fn (record_trace) and returns its diagnosis (diagnose); prints the Markdown report and
    the trace's path unless quiet."""
    path = record_trace(step_fn, trace=trace, steps=steps, warmup=warmup, timed_steps=timed_steps,
                        record_shapes=record_shapes)
    report = diagnose(path, json=json)
    if not quiet:
        print(_json.dumps(report, indent=2) if json else report)
        print(f"perftrain.profile: trace {path} (open it in ui.perfetto.dev)")
    return report

"""Whole-step CUDA-graph capture of a user's training step: `capture_step`.

The C++ trainer replays its whole step (forward, backward, optimizer) as one
CUDA graph, so a step costs one launch from the host. `capture_step` does the
same for a Python step function: a few eager warm-up calls on a side stream
(they allocate the gradients, the optimizer state and autograd's buffers),
then one capture into a `torch.cuda.CUDAGraph` with the static inputs, then a
replay per call. The first warm-up call runs the products on cuBLASLt's first
pick (ops.gemm_tuning_deferred), as the C++ trainer's first step does: their
algorithm timing is in the second, so the first step ends sooner. Every call
is exactly one training step: the warm-up calls run the step eagerly, the
capturing call replays once after the capture.

Where capture cannot run (tensors on the CPU, no CUDA, or any error raised
while capturing: a host sync such as `.item()`, an optimizer that is not
capturable, a CPU tensor made inside the step...) the step runs eagerly from
then on, and the reason is printed once to stderr.
"""
import contextlib
import sys

import torch

from .ops import gemm_tuning_deferred

__all__ = ["capture_step", "CapturedStep"]


def _tensors(values):
    return [v for v in values if isinstance(v, torch.Tensor)]


def _no_capture_reason(static_inputs):
    """Why this step cannot be captured before trying (None: it may be)."""
    devices = {t.device.type for t in _tensors(static_inputs)}
    if devices and devices != {"cuda"}:
        return "the static inputs are on " + ", ".join(sorted(devices)) + ", not all on a CUDA device"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


class CapturedStep:
    """The callable `capture_step` returns (see its docstring).

    Attributes: `static_inputs` (the tensors the graph reads: copy a batch in, or pass it to the call),
    `static_output` (what the captured call of step_fn returned; a replay rewrites those tensors),
    `captured` (True once the graph is replayed), `eager_reason` (why it runs eagerly, else None),
    `steps` (calls so far).
    """

    def __init__(self, step_fn, static_inputs, warmup, pool, stream=None, log=None, capture_error_mode="global",
                 optimizer=None):
        if warmup < 1:
            raise ValueError(f"capture_step: warmup must be >= 1 (it allocates what the graph reuses), got {warmup}")
        self.step_fn = step_fn
        self.static_inputs = tuple(static_inputs)
        self.warmup = warmup
        self.pool = pool
        self.capture_error_mode = capture_error_mode
        self.optimizer = optimizer
        self.graph = None
        self.static_output = None
        self.eager_reason = _no_capture_reason(self.static_inputs)
        self.steps = 0
        self._stream = stream
        self._log = log if log is not None else sys.stderr
        self._reported = False
        if self.eager_reason is not None:
            self._report()

    @property
    def captured(self):
        return self.graph is not None

    def __call__(self, *batch):
        self._copy_in(batch)
        self.steps += 1
        if self.graph is not None:
            self.graph.replay()
            return self.static_output
        if self.eager_reason is not None:
            return self.step_fn(*self.static_inputs)
        if self.steps <= self.warmup:
            return self._warmup_step()
        return self._capture_and_replay()

    def _copy_in(self, batch):
        if not batch:
            return
        if len(batch) != len(self.static_inputs):
            raise ValueError(f"capture_step: the step takes {len(self.static_inputs)} inputs (as captured), "
                             f"got {len(batch)}")
        for i, (dst, src) in enumerate(zip(self.static_inputs, batch)):
            if src is dst:
                continue
            if not isinstance(dst, torch.Tensor):
                raise ValueError(f"capture_step: input {i} is not a tensor; pass it only at capture")
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError(f"capture_step: input {i} has shape {list(src.shape)}, the captured one "
                                 f"{list(dst.shape)} (a graph has fixed shapes)")
            dst.copy_(src, non_blocking=True)

    def _side_stream(self):
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def _warmup_step(self):
        """One eager step on the side stream (the stream the capture then uses), ordered with the current one.
        The first of two or more takes the products' first-pick algorithms: their timing runs in the second."""
        side = self._side_stream()
        side.wait_stream(torch.cuda.current_stream())
        defer = gemm_tuning_deferred() if self.steps == 1 and self.warmup >= 2 else contextlib.nullcontext()
        with torch.cuda.stream(side), defer:
            out = self.step_fn(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _capture_and_replay(self):
        try:
            self.graph, self.static_output = self._record()
        except Exception as e:  # noqa: BLE001 -- any capture failure falls back to eager, with its reason
            self.eager_reason = f"capture failed: {type(e).__name__}: {_first_line(e)}"
            self._report()
            if self.optimizer is not None:  # the capture's backward set .grad to tensors it never computed
                self.optimizer.zero_grad(set_to_none=True)
            return self.step_fn(*self.static_inputs)
        self.graph.replay()  # the capture ran nothing: this call's step
        return self.static_output

    def _record(self):
        """step_fn captured on the side stream -> (graph, its outputs); raises the step's own error where
        capture fails (not the capture_end error that follows it), with the caller's stream current again."""
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        first_error = None
        # No autocast weight cache in the capture (the C++ step runner's rule): an autocast the step enters
        # takes this setting, so each cast is recorded where it is used, not kept across the step.
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self._side_stream(),
                                  capture_error_mode=self.capture_error_mode):
                try:
                    out = self.step_fn(*self.static_inputs)
                except Exception as e:
                    first_error = e
                    raise
        except Exception as e:
            torch.cuda.set_stream(current)  # torch.cuda.graph leaves its stream current when capture_end raises
            raise (first_error or e) from None
        finally:
            torch.set_autocast_cache_enabled(cache)
        return graph, out

    def _report(self):
        if not self._reported:
            self._reported = True
            print(f"perftrain.capture_step: running the step eagerly: {self.eager_reason}", file=self._log)


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def capture_step(step_fn, *static_inputs, warmup=3, pool=None, stream=None, log=None, capture_error_mode="global",
                 optimizer=None):
    """Capture `step_fn(*static_inputs)` (forward, backward and optimizer step) in one CUDA graph.

    step_fn: one whole training step reading its batch from `static_inputs` (device tensors it keeps
    reading: the graph replays on those very tensors); it may return tensors (the loss), which a replay
    rewrites in place. Inside it: `optimizer.zero_grad(set_to_none=True)` (or none at all with
    `DeviceAdamW`), forward under autocast, backward, the optimizer's step; no host sync
    (`.item()`, printing a tensor, `if loss > x`), no new CPU tensors, no changing shapes.
    The optimizer must be capturable: `perftrain.optim.DeviceAdamW`, or torch's with `capturable=True`.

    Returns a `CapturedStep` `step`: `step()` runs one step on what the static inputs hold now;
    `step(*batch)` copies the batch into the static inputs first (same shapes). Calls 1..warmup run eagerly
    on a side stream, call warmup + 1 captures and replays, every later call replays. On the CPU, without
    CUDA, or when capture raises, every call runs step_fn eagerly, and the reason is printed once
    (to `log`, default stderr) and kept in `step.eager_reason`.

    pool: a memory pool handle (torch.cuda.graph_pool_handle()) to share with other graphs;
    stream: the side stream for warm-up and capture (default: a new one); capture_error_mode: as
    torch.cuda.graph's: "global" fails the capture on CUDA calls from any thread, "thread_local" only on
    this thread's (for a DataLoader with pin_memory, whose thread would otherwise break the capture);
    optimizer: after a failed capture its zero_grad(set_to_none=True) clears the gradients the captured
    backward left unwritten (needed when step_fn clears them only after its optimizer step).
    """
    return CapturedStep(step_fn, static_inputs, warmup, pool, stream, log, capture_error_mode, optimizer)

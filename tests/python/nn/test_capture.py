"""perftrain.capture_step on the CPU: every call is one eager step, the reason is printed once, a new batch
is copied into the static inputs, and wrong batches are refused. (The captured path: test_capture_gpu.py.)

Run by ctest (python.nn.capture) or: PYTHONPATH=build/python python tests/python/nn/test_capture.py
"""
import io

import torch
from run_tests import run_all

import perftrain.capture as capture_module
from perftrain.capture import capture_step
from perftrain.optim import DeviceAdamW


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = DeviceAdamW(model, lr=1e-2)
    x, y = torch.randn(3, 4), torch.randn(3, 2)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return model, opt, x, y, step


def test_on_the_cpu_each_call_is_one_eager_step_and_the_reason_is_printed_once():
    model, opt, x, y, step = make_step()
    log = io.StringIO()
    captured = capture_step(step, x, y, warmup=2, log=log)
    losses = [captured().item() for _ in range(4)]
    assert not captured.captured and captured.steps == 4
    assert opt.steps_taken.item() == 4, "one optimizer step per call, warm-up calls included"
    assert losses[-1] < losses[0], "it trains"
    lines = log.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "running the step eagerly" in lines[0] and "cpu" in lines[0], lines[0]
    assert captured.eager_reason in lines[0]


def test_a_batch_passed_to_the_call_is_copied_into_the_static_inputs():
    model, opt, x, y, step = make_step()
    captured = capture_step(step, x, y, log=io.StringIO())
    new_x, new_y = torch.ones(3, 4), torch.zeros(3, 2)
    captured(new_x, new_y)
    assert torch.equal(x, new_x) and torch.equal(y, new_y), "the static tensors hold the new batch"
    assert captured.static_inputs[0] is x


def test_a_batch_of_another_shape_or_count_is_refused():
    _, _, x, y, step = make_step()
    captured = capture_step(step, x, y, log=io.StringIO())
    for batch, word in (((torch.ones(2, 4), torch.zeros(2, 2)), "shape"), ((torch.ones(3, 4),), "inputs")):
        try:
            captured(*batch)
        except ValueError as e:
            assert word in str(e), str(e)
        else:
            raise AssertionError(f"{word}: accepted")
    try:
        capture_step(step, x, y, warmup=0)
    except ValueError as e:
        assert "warmup" in str(e)
    else:
        raise AssertionError("warmup 0 accepted")


def test_a_capture_failure_falls_back_to_eager_with_its_reason():
    """The failure path itself, on the CPU: capture is made to raise as a host sync inside capture does."""
    model, opt, x, y, step = make_step()
    captured = capture_step(step, x, y, warmup=1, log=io.StringIO())
    log = captured._log = io.StringIO()
    captured.eager_reason, captured._reported = None, False  # as if on a GPU: try the capture

    def record(self):  # what a host sync inside the captured step raises
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    saved = capture_module.CapturedStep._record, capture_module.CapturedStep._warmup_step
    try:
        capture_module.CapturedStep._record = record
        capture_module.CapturedStep._warmup_step = lambda self: self.step_fn(*self.static_inputs)
        for _ in range(3):
            captured()
    finally:
        capture_module.CapturedStep._record, capture_module.CapturedStep._warmup_step = saved
    assert not captured.captured
    assert opt.steps_taken.item() == 3, "one step per call: warm-up, the failed capture's eager step, eager"
    text = log.getvalue()
    assert text.count("\n") == 1 and "capture failed: RuntimeError: CUDA error: operation not permitted" in text, text


def test_after_a_failed_capture_the_optimizer_clears_the_gradients_it_left():
    """A step that clears its gradients after the optimizer step: the failed capture's backward left .grad
    tensors it never wrote (here: filled with garbage); capture_step(optimizer=...) clears them, so the
    eager step that follows equals a plain one."""
    plain, _, x, y, plain_step = make_step()  # its step clears the gradients after the optimizer's
    plain_step(x, y)
    model, opt, x, y, step = make_step()
    captured = capture_step(step, x, y, warmup=1, log=io.StringIO(), optimizer=opt)
    captured.eager_reason, captured._reported = None, False  # as if on a GPU: try the capture
    captured.steps = 1  # the warm-up is over

    def record(self):  # the captured backward allocated gradients, then the capture failed
        for p in model.parameters():
            p.grad = torch.full_like(p, 1e9)
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    saved = capture_module.CapturedStep._record
    try:
        capture_module.CapturedStep._record = record
        captured()
    finally:
        capture_module.CapturedStep._record = saved
    assert torch.allclose(model.weight, plain.weight), "the fallback step ran on clean gradients"


if __name__ == "__main__":
    run_all(globals())

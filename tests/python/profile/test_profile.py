"""perftrain.profile on the CPU: a small training step whose DataLoader takes 30 ms a batch is recorded by
record_trace (a Chrome trace with the measured steps in its "perftrain" object) and diagnosed by the C++ rules
through torch.ops.perftrain.diagnose_trace: data-bound first, with PyTorch-side advice, as Markdown and as
JSON; bad arguments and a file that is not a trace are errors naming them.
Run by ctest (python.profile) with PYTHONPATH at the built package; exits 77 (skipped) when perftrain._C
is not built. Usage: test_profile.py"""

import importlib.util
import json
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "..", "..", "python", "perftrain", "profile.py")


def load_profile_module():
    """perftrain.profile from the built package, or from the source tree when _C is not built."""
    try:
        import perftrain  # noqa: F401
        import perftrain.profile as p  # noqa: F401
        return sys.modules["perftrain.profile"], True
    except ImportError as e:
        print(f"perftrain not importable ({e}): record_trace from the source tree only")
        spec = importlib.util.spec_from_file_location("perftrain_profile_source", SOURCE)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        return m, False


class SlowImages(Dataset):
    """Each sample takes the loader about 4 ms (decoding an image, say): 30 ms and more a batch of 8."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.randn(32), torch.randn(8)


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(SlowImages(), batch_size=8)

    def batches():
        while True:
            yield from loader

    it = batches()

    def step():
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    torch.set_num_threads(1)
    prof, built = load_profile_module()
    with tempfile.TemporaryDirectory() as tmp:
        # The trace and what it carries besides torch.profiler's events.
        path = prof.record_trace(make_step(), trace=os.path.join(tmp, "step.json"), steps=2, warmup=1,
                                 timed_steps=2)
        with open(path) as f:
            t = json.load(f)
        check(float(t["perftrain"]["unprofiled_ms"]) > 20, t["perftrain"])  # the loader alone takes 32 ms
        check(float(t["perftrain"]["profiled_ms"]) > 20, t["perftrain"])
        check(t["perftrain"]["profiled_steps"] == "2", t["perftrain"])
        names = [e.get("name", "") for e in t["traceEvents"]]
        check(sum(n.startswith("ProfilerStep#") for n in names) == 2, "two profiled steps")
        check(any(n.startswith("enumerate(DataLoader)#") for n in names), "the DataLoader's range")
        gz = prof.record_trace(make_step(), trace=os.path.join(tmp, "sub", "step.json.gz"), steps=1, warmup=1,
                               timed_steps=1)
        import gzip
        with gzip.open(gz, "rt") as f:
            check("unprofiled_ms" in json.load(f)["perftrain"], "the .gz trace's perftrain object")
        for bad in ({"steps": 0}, {"warmup": -1}, {"timed_steps": 1.5}, {"trace": os.path.join(tmp, "x.txt")}):
            try:
                prof.record_trace(make_step(), **bad)
            except ValueError as e:
                check("perftrain.profile" in str(e), str(e))
            else:
                raise AssertionError(f"{bad} accepted")
        if not built:
            print("perftrain._C is not built: the diagnosis is not tested")
            return 77

        # The diagnosis: data-bound first, in PyTorch's terms.
        report = prof.profile(make_step(), steps=2, warmup=1, timed_steps=2, trace=os.path.join(tmp, "p.json"),
                              quiet=True)
        check("# perftrain diagnose: " in report, report)
        if torch.cuda.is_available():  # Kineto lists the machine's GPUs even in a recording of CPU activity only
            check(f"- device: {torch.cuda.get_device_name(0)} (" in report, report)
        else:
            check("- device: none in the trace (a CPU-only profile)" in report, report)
        check("| host: data wait |" in report, report)
        check("| host: backward |" in report, report)
        check("| host: optimizer |" in report, report)
        check("1. **data-bound**" in report, report)
        check("pin_memory=True" in report, report)
        check("Profiler overhead: profiled step " in report, report)  # from the "perftrain" object
        j = prof.diagnose(path, json=True)
        check(j["program"] == "pytorch" and j["cpu_only"], j)
        check(j["findings"][0]["id"] == "data-bound", j["findings"])
        check(j["breakdown_ms"]["host_data_wait"] > 20, j["breakdown_ms"])
        for text in ("not json at all", '{"traceEvents": []}'):
            bad = os.path.join(tmp, "bad.json")
            with open(bad, "w") as f:
                f.write(text)
            try:
                prof.diagnose(bad)
            except RuntimeError as e:
                check(bad in str(e), str(e))
            else:
                raise AssertionError(f"{text!r} diagnosed")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

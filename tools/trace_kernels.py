#!/usr/bin/env python3
"""Which operation launched each kernel of a `perftrain bench --profile` trace.

The kernel table of profile-b<batch>-<variant>.md says how long each kernel
ran, not who launched it. This reads the Chrome trace written next to it
(trace-b<batch>-<variant>.json) and charges every kernel to the CPU-side
operations open when its launch call ran: the innermost one and its outer
context (an autograd node's evaluate_function, a record_function scope).
Profile an uncaptured variant (e.g. `fused`): a captured graph's replay
launches everything from one call and attributes nothing.

  tools/trace_kernels.py trace-b256-fused.json [--steps 5] [--top 40]
"""
import argparse
import collections
import gzip
import json


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def short(name, n=70):
    name = name.replace("void ", "").replace("at::native::", "").replace("(anonymous namespace)::", "")
    return name if len(name) <= n else name[: n - 1] + "…"


# Bookkeeping calls that sit around real work and name nothing useful.
NOISE = ("aten::empty", "aten::empty_strided", "aten::as_strided", "aten::view", "aten::resize_",
         "aten::detach", "aten::lift", "aten::set_")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=5, help="steps in the trace (the table is per step)")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()

    events = [e for e in load(args.trace) if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}

    # Per thread, the CPU operations open at each launch: one sweep over
    # operations and launches in time order with a stack of open operations.
    context = {}
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation"):
            by_thread[(e["pid"], e["tid"])].append((e["ts"], 0, e))
    for corr, e in launches.items():
        by_thread[(e["pid"], e["tid"])].append((e["ts"], 1, e))
    for items in by_thread.values():
        items.sort(key=lambda t: (t[0], t[1], -t[2].get("dur", 0)))
        stack = []
        for ts, is_launch, e in items:
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) < ts:
                stack.pop()
            if is_launch:
                names = [s["name"] for s in stack if s["name"] not in NOISE]
                context[e["args"]["correlation"]] = names
            else:
                stack.append(e)

    total = collections.Counter()
    count = collections.Counter()
    for k in kernels:
        names = context.get(k.get("args", {}).get("correlation"), [])
        inner = names[-1] if names else "?"
        outer = next((n for n in reversed(names[:-1]) if "evaluate_function" in n or n.startswith("perftrain")),
                     names[0] if len(names) > 1 else "")
        outer = outer.replace("autograd::engine::evaluate_function: ", "bwd ")
        key = (short(k["name"]), inner, outer)
        total[key] += k.get("dur", 0)
        count[key] += 1

    all_us = sum(total.values())
    print(f"# Kernels by launching operation: {args.trace}\n")
    print(f"{all_us / 1000 / args.steps:.3f} ms of kernel time per step over {args.steps} steps\n")
    print("| ms/step | launches/step | kernel | operation | context |")
    print("|---|---|---|---|---|")
    for key, us in total.most_common(args.top):
        kname, inner, outer = key
        print(f"| {us / 1000 / args.steps:.3f} | {count[key] / args.steps:g} | `{kname}` | {inner} | {outer} |")


if __name__ == "__main__":
    main()

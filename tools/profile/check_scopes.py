#!/usr/bin/env python3
"""Which perftrain scope each CUDA kernel of a trace ran under.

usage: check_scopes.py TRACE.json[.gz] [--min-share 0.9]

A kernel belongs to the innermost perftrain:: phase scope (on any host thread)
whose time range holds the call that launched it (matched by the kernel's
correlation id). Prints kernel time per scope and exits 1 when less than
--min-share of the kernel time lies under a phase scope. A captured step's
kernels all sit under perftrain::graph_replay (one launch).
"""
import collections, gzip, json, sys

path = sys.argv[1]
min_share = float(sys.argv[sys.argv.index("--min-share") + 1]) if "--min-share" in sys.argv else 0.9
opener = gzip.open if path.endswith(".gz") else open
events = json.load(opener(path, "rt"))["traceEvents"]
scopes = [e for e in events if e.get("cat") == "user_annotation" and e.get("name", "").startswith("perftrain::")
          and e.get("name") != "perftrain::step"]
launch = {e["args"]["correlation"]: e for e in events
          if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
kernels = [e for e in events if e.get("cat") == "kernel"]
by_scope, total = collections.Counter(), 0.0
for k in kernels:
    total += k["dur"]
    call = launch.get(k.get("args", {}).get("correlation"))
    ts = call["ts"] if call else k["ts"]
    inside = [s for s in scopes if s["ts"] <= ts <= s["ts"] + s["dur"]]
    name = min(inside, key=lambda s: s["dur"])["name"] if inside else "(no scope)"
    if name.startswith("perftrain::block"):
        name = "perftrain::block N (forward)"
    by_scope[name] += k["dur"]
for name, us in by_scope.most_common():
    print(f"{us / 1e3:10.3f} ms  {100 * us / max(total, 1e-9):5.1f}%  {name}")
under = 1 - by_scope["(no scope)"] / max(total, 1e-9)
print(f"{len(kernels)} kernels, {total / 1e3:.3f} ms; {100 * under:.1f}% of kernel time under a perftrain scope")
sys.exit(0 if kernels and under >= min_share else 1)

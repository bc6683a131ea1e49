#!/usr/bin/env python3
"""Is a training run's loss curve within the seed-to-seed spread of two reference runs?

    compare_curves.py fast.jsonl ref_seed0.jsonl ref_seed1.jsonl

Each file is a run's metrics.jsonl (one {"step", "loss", ...} per logging window).
For every window the band is [min(r0, r1) - d, max(r0, r1) + d] with d = |r0 - r1|,
i.e. the two references' spread around both of them; the run passes when every
window after the first (which is dominated by the first steps' noise) lies in it.
Prints one line per window and a verdict last.
"""
import json
import sys


def load(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in (json.loads(line) for line in f if line.strip())}


def main(fast_path, ref0_path, ref1_path):
    fast, r0, r1 = load(fast_path), load(ref0_path), load(ref1_path)
    steps = sorted(set(fast) & set(r0) & set(r1))
    if len(steps) < 2:
        print("verdict: FAIL (fewer than 2 common logging windows)")
        return 1
    inside, worst = 0, 0.0
    print(f"{'step':>6} {'fast':>9} {'ref0':>9} {'ref1':>9} {'band':>21} in")
    for s in steps[1:]:
        lo, hi = min(r0[s], r1[s]), max(r0[s], r1[s])
        d = hi - lo
        ok = lo - d <= fast[s] <= hi + d
        inside += ok
        if not ok:
            worst = max(worst, (lo - d - fast[s]) if fast[s] < lo - d else (fast[s] - hi - d))
        print(f"{s:>6} {fast[s]:9.5f} {r0[s]:9.5f} {r1[s]:9.5f} [{lo - d:9.5f},{hi + d:9.5f}] {'y' if ok else 'n'}")
    n = len(steps) - 1
    verdict = "PASS" if inside == n else "FAIL"
    print(f"verdict: {verdict}: {inside}/{n} windows within the two-seed fp32 band"
          + (f", worst excursion {worst:.5f}" if worst else ""))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))

#!/usr/bin/env python3
"""Is a training run's loss curve within the seed-to-seed spread of reference runs?

    compare_curves.py fast.jsonl ref_seed0.jsonl ref_seed1.jsonl [ref_seed2.jsonl ...]

Each file is a run's metrics.jsonl (one {"step", "loss", ...} per logging window).
The first reference should share the fast run's seed. For every window the band
is [min(refs) - d, max(refs) + d] with d = max(refs) - min(refs), i.e. the
references' spread around all of them; the run passes when every window after
the first (which is dominated by the first steps' noise) lies in it. With two
references a window where they happen to agree closely has a narrow band; more
seeds make the band a better estimate of the seed-to-seed spread.

Prints one line per window, then the mean |fast - ref0| (same seed) against the
mean |ref_i - ref_j| over all reference pairs, and a verdict last.
"""
import itertools
import json
import sys


def load(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in (json.loads(line) for line in f if line.strip())}


def compare(fast, refs):
    """Returns (lines, inside, windows, worst, same_seed_gap, seed_gap)."""
    steps = sorted(set(fast).intersection(*(set(r) for r in refs)))
    lines, inside, worst = [], 0, 0.0
    if len(steps) < 2:
        return lines, 0, 0, 0.0, float("nan"), float("nan")
    for s in steps[1:]:
        vals = [r[s] for r in refs]
        lo, hi = min(vals), max(vals)
        d = hi - lo
        ok = lo - d <= fast[s] <= hi + d
        inside += ok
        if not ok:
            worst = max(worst, (lo - d - fast[s]) if fast[s] < lo - d else (fast[s] - hi - d))
        refs_text = " ".join(f"{v:9.5f}" for v in vals)
        lines.append(f"{s:>6} {fast[s]:9.5f} {refs_text} [{lo - d:9.5f},{hi + d:9.5f}] {'y' if ok else 'n'}")
    windows = steps[1:]
    same_seed = sum(abs(fast[s] - refs[0][s]) for s in windows) / len(windows)
    pairs = list(itertools.combinations(range(len(refs)), 2))
    seed_gap = sum(abs(refs[i][s] - refs[j][s]) for i, j in pairs for s in windows) / (len(pairs) * len(windows))
    return lines, inside, len(windows), worst, same_seed, seed_gap


def main(fast_path, *ref_paths):
    if len(ref_paths) < 2:
        print("usage: compare_curves.py fast.jsonl ref_seed0.jsonl ref_seed1.jsonl [more refs]")
        return 2
    refs = [load(p) for p in ref_paths]
    lines, inside, n, worst, same_seed, seed_gap = compare(load(fast_path), refs)
    if n == 0:
        print("verdict: FAIL (fewer than 2 common logging windows)")
        return 1
    header = " ".join(f"{'ref' + str(i):>9}" for i in range(len(refs)))
    print(f"{'step':>6} {'fast':>9} {header} {'band':>21} in")
    print("\n".join(lines))
    print(f"mean |fast - ref0| {same_seed:.5f} (same seed); mean |ref_i - ref_j| {seed_gap:.5f} "
          f"({len(refs)} seeds)")
    verdict = "PASS" if inside == n else "FAIL"
    print(f"verdict: {verdict}: {inside}/{n} windows within the {len(refs)}-seed fp32 band"
          + (f", worst excursion {worst:.5f}" if worst else ""))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

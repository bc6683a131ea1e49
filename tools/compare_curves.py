#!/usr/bin/env python3
"""Is a training run's loss curve within the seed-to-seed spread of reference runs?

    compare_curves.py [--refs NAME] fast.jsonl ref_seed0.jsonl ref_seed1.jsonl [ref_seed2.jsonl ...]

Each file is a run's metrics.jsonl (one {"step", "loss", ...} per logging window;
records without a loss, such as eval.every's, are skipped). NAME says what the
references are in the verdict (default fp32: the eager fp32 runs of the speed
check; the fp8 quality check passes bf16).
The first reference should share the fast run's seed. For every window the band
is [min(refs) - d, max(refs) + d] with d = max(refs) - min(refs), i.e. the
references' spread around all of them; the run passes when every window after
the first (which is dominated by the first steps' noise) lies in it. With two
references a window where they happen to agree closely has a narrow band; more
seeds make the band a better estimate of the seed-to-seed spread.

That band is strict: a band made from a few runs is narrow wherever they happen
to agree, and fp32 runs with other seeds fall outside such bands too. So with
three or more references the check is also made leave-one-out, with bands of
the same size for every run: each reference against the band of the other
references, and the fast run against each of those same bands (k - 1 runs
each, the fast run in none). The fast run passes when it is inside as often as
the references are on average, i.e. it is no more an outlier among the fp32
runs than one of them (with three references each fp32 seed falls outside
about a third of the other two's bands).

Prints one line per window, then the mean |fast - ref0| (same seed) against the
mean |ref_i - ref_j| over all reference pairs, the leave-one-out counts, and a
verdict last.
"""
import itertools
import json
import os
import sys


def load(path):
    with open(path) as f:
        records = (json.loads(line) for line in f if line.strip())
        return {r["step"]: r["loss"] for r in records if "loss" in r}


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


def inside_count(run, band_runs, steps):
    """Windows (of steps) where run lies in [min - d, max + d] of band_runs."""
    count = 0
    for s in steps:
        vals = [r[s] for r in band_runs]
        lo, hi = min(vals), max(vals)
        d = hi - lo
        count += lo - d <= run[s] <= hi + d
    return count


def leave_one_out(fast, refs):
    """Returns (ref_counts, fast_counts, windows): reference i against the band
    of the other references, and the fast run against that same band."""
    steps = sorted(set(fast).intersection(*(set(r) for r in refs)))[1:]
    ref_counts, fast_counts = [], []
    for i in range(len(refs)):
        others = [r for j, r in enumerate(refs) if j != i]
        ref_counts.append(inside_count(refs[i], others, steps))
        fast_counts.append(inside_count(fast, others, steps))
    return ref_counts, fast_counts, len(steps)


def main(*args):
    name = "fp32"
    if len(args) >= 2 and args[0] == "--refs":
        name, args = args[1], args[2:]
    if len(args) < 3:
        print("usage: compare_curves.py [--refs NAME] fast.jsonl ref_seed0.jsonl ref_seed1.jsonl [more refs]")
        return 2
    fast_path, ref_paths = args[0], args[1:]
    missing = [p for p in args if not os.path.exists(p)]
    if missing:
        print(f"compare_curves.py: no such file: {', '.join(missing)}")
        return 2
    refs = [load(p) for p in ref_paths]
    fast = load(fast_path)
    lines, inside, n, worst, same_seed, seed_gap = compare(fast, refs)
    if n == 0:
        print("verdict: FAIL (fewer than 2 common logging windows)")
        return 1
    header = " ".join(f"{'ref' + str(i):>9}" for i in range(len(refs)))
    print(f"{'step':>6} {'fast':>9} {header} {'band':>21} in")
    print("\n".join(lines))
    print(f"mean |fast - ref0| {same_seed:.5f} (same seed); mean |ref_i - ref_j| {seed_gap:.5f} "
          f"({len(refs)} seeds)")
    strict = f"{inside}/{n} windows within the {len(refs)}-seed {name} band" + (
        f", worst excursion {worst:.5f}" if worst else "")
    if inside == n:
        print(f"verdict: PASS: {strict}")
        return 0
    if len(refs) >= 3:
        ref_counts, fast_counts, _ = leave_one_out(fast, refs)
        ref_mean = sum(ref_counts) / len(ref_counts)
        fast_mean = sum(fast_counts) / len(fast_counts)
        print(f"leave-one-out, bands of {len(refs) - 1} {name} runs: the {name} runs inside "
              f"{', '.join(map(str, ref_counts))} of {n} windows (mean {ref_mean:.1f}); the fast run inside "
              f"{', '.join(map(str, fast_counts))} (mean {fast_mean:.1f})")
        if fast_mean >= ref_mean:
            print(f"verdict: PASS (leave-one-out: no more an outlier than one {name} seed); strict: {strict}")
            return 0
        print(f"verdict: FAIL (leave-one-out: more an outlier than the {name} seeds); strict: {strict}")
        return 1
    print(f"verdict: FAIL: {strict}")
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

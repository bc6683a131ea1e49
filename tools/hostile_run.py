#!/usr/bin/env python3
"""A reproducible hostile run of the perftrain binary on the CPU.

    /opt/venv/bin/python tools/hostile_run.py --bin build/perftrain --work /tmp/hostile \
        [--kill-trials 90] [--jobs 2] [--only A,C] [--match REGEX] [--json out.json] [--list]

Feeds perftrain what a careless or hostile user, disk or scheduler gives it and
checks that every case ends bounded, with a one-line error or a correct result,
and with no run data lost or mixed. Categories:

  A  CLI values for every option of every command (read from --help)
  B  --set section.key=value for every config key (read from `perftrain config`)
  C  checkpoint corruption (truncation, flipped bytes, edited metadata, replaced files)
  D  run-directory manipulations (ckpt/latest, the lock, stray directories, --resume)
  E  data files (a gzip bomb, broken idx files, hostile safetensors shards)
  F  SIGINT / SIGTERM / SIGHUP at seeded moments of a run
  G  kill -9 trials: kill at a seeded moment, verify, resume to the end, compare
     the final weights with an uninterrupted run (exact resume: same CRC32Cs)
  H  environment: a deleted working directory, an unwritable runs directory

Every case fails when the process died by a signal it was not sent, ran past
its timeout, printed a raw allocator or library message (std::bad_alloc,
"terminate called", a C++ stack trace, a number of more than 40 digits, ...)
or echoed control characters; a refusal must be one stderr line starting with
"perftrain:". Run-directory cases also compare checksums of what must not
change. Prints one line per failing case, a table per category, and exits 1 if
any case failed. Standard library only; torch (when importable by
/opt/venv/bin/python) only writes the torch.save file of category C.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import tomllib
import zipfile

# ---------------------------------------------------------------------------
# Limits. Legit work gets generous timeouts (a loaded 2-core machine); the
# cases whose point is boundedness get tight ones.

AS_LIMIT = 8 << 30  # RLIMIT_AS for every process: a runaway allocation fails instead of swapping
QUICK_S = 60        # a command that only parses, refuses or describes
RUN_S = 180         # a tiny training run, bench or profile
BOUND_S = 90        # must end (refuse) fast whatever it was asked: 1e9 batches, gzip bombs
LONG_OK_S = 12      # a legit huge amount of work (e.g. --steps 1000000000): running is fine
A_RUN_S = 60        # category A's tiny bench / profile / train / sample (seconds when legit)
DURATION_S = 20     # --cooldown, --slow-data-ms, --schedule: the legit tiny work is seconds, a huge value hangs
KILL_STEPS = 6      # steps of each kill -9 trial's run
BOMB_AS_LIMIT = 4 << 30  # the gzip bombs: a correct reader needs megabytes
WORK_MARKER = ".hostile_run"

TINY_SETS = [
    "data.synthetic_size=40", "model.depth=1", "model.hidden=32", "model.heads=2", "model.patch=4",
    "model.image_size=8", "model.in_channels=2", "model.num_classes=3", "log.sample_every=0", "log.every=1",
    "log.sample_per_class=1", "log.sample_classes=2", "diffusion.sample_steps=1", "log.tensorboard=false",
]
# The same tiny model on 32x32x1 Fashion-MNIST-like data (category E).
TINY_FASHION_SETS = [
    "model.depth=1", "model.hidden=32", "model.heads=2", "model.patch=8", "log.sample_every=0", "log.every=1",
    "log.sample_per_class=1", "log.sample_classes=2", "diffusion.sample_steps=1", "log.tensorboard=false",
]

# ---------------------------------------------------------------------------
# What no output may contain.

RAW_MESSAGES = [
    (re.compile(rb"bad_alloc"), "std::bad_alloc"),
    (re.compile(rb"terminate called"), "'terminate called'"),
    (re.compile(rb"what\(\):"), "an uncaught exception's what()"),
    (re.compile(rb"Exception raised from"), "a c10 exception's origin"),
    (re.compile(rb"DefaultCPUAllocator"), "a raw DefaultCPUAllocator message"),
    (re.compile(rb"enforce fail at"), "a raw c10 enforce message"),
    (re.compile(rb"MKL FATAL", re.I), "an Intel MKL fatal error"),
    (re.compile(rb"frame #\d+:"), "a C++ stack trace"),
    (re.compile(rb"^\s*#\d+\s+0x[0-9a-f]+", re.M), "a C++ stack trace"),
    (re.compile(rb"\(most recent call first\)"), "a C++ stack trace"),
    (re.compile(rb"\[json\.exception\."), "a raw nlohmann::json message"),
    (re.compile(rb"basic_string::|vector::_M_|std::length_error|std::out_of_range|std::invalid_argument"),
     "a raw C++ library message"),
    (re.compile(rb"(?:^|: )sto(?:i|l|ll|ul|ull|f|d|ld)(?:$|\n)", re.M), "a raw std::sto* message"),
    (re.compile(rb"Segmentation fault|Aborted \(core dumped\)|core dumped"), "a crash message"),
    (re.compile(rb"\d{41,}"), "a number of more than 40 digits"),
]
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")


def show(data, limit=150):
    """Printable, one-line text of bytes or str (control characters escaped)."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "backslashreplace")
    text = data if len(data) <= limit else data[:limit] + "..."
    return ascii(text)[1:-1] if any(ord(c) < 32 or ord(c) == 127 for c in text) else text


# ---------------------------------------------------------------------------
# Processes


class Result:
    def __init__(self, argv, rc, out, err, secs, timed_out, timeout, sent=()):
        self.argv, self.rc, self.out, self.err = argv, rc, out, err
        self.secs, self.timed_out, self.timeout, self.sent = secs, timed_out, timeout, set(sent)

    @property
    def err_lines(self):
        return [l for l in self.err.split(b"\n") if l.strip()]

    def __repr__(self):
        return f"rc={self.rc} err={show(self.err, 200)}"


def signame(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def wrap(argv, as_limit=AS_LIMIT, user=None):
    cmd = [str(a) for a in argv]
    if as_limit and shutil.which("prlimit"):
        cmd = ["prlimit", f"--as={as_limit}", "--"] + cmd
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] + cmd
    return cmd


def base_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRAIN_")}
    # Two jobs share two cores: one intra-op thread each (the reference run
    # of category G runs the same way, so exact-resume comparisons hold).
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra or {})
    return env


def run(argv, timeout, cwd=None, env=None, as_limit=AS_LIMIT, user=None, stdin=b""):
    cmd = wrap(argv, as_limit, user)
    start = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, env=env or base_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    timed_out = False
    try:
        out, err = p.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
    return Result(argv, p.returncode, out, err, time.monotonic() - start, timed_out, timeout)


class Background:
    """A process in the background, its output in files (no pipe to fill)."""

    def __init__(self, argv, out_prefix, cwd=None, env=None, as_limit=AS_LIMIT):
        self.argv = [str(a) for a in argv]
        self.out_path, self.err_path = out_prefix + ".out", out_prefix + ".err"
        self.sent = set()
        with open(self.out_path, "wb") as o, open(self.err_path, "wb") as e:
            self.p = subprocess.Popen(wrap(self.argv, as_limit), cwd=cwd, env=env or base_env(),
                                      stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
        self.start = time.monotonic()

    def signal(self, sig):
        self.sent.add(sig)
        try:
            os.kill(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def running(self):
        return self.p.poll() is None

    def wait(self, timeout):
        timed_out = False
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()
        with open(self.out_path, "rb") as o, open(self.err_path, "rb") as e:
            out, err = o.read(), e.read()
        return Result(self.argv, self.p.returncode, out, err, time.monotonic() - self.start, timed_out, timeout,
                      self.sent)

    def kill(self):
        if self.running():
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()


# ---------------------------------------------------------------------------
# Judging results


def clean(res):
    """What no process may do, whatever it was asked: the failures found."""
    fails = []
    if res.timed_out:
        fails.append(f"ran past its {res.timeout:.0f} s timeout (unbounded)")
    elif res.rc < 0 and -res.rc not in res.sent:
        fails.append(f"died by {signame(-res.rc)}")
    elif res.rc in (134, 137, 139) and (res.rc - 128) not in res.sent:
        fails.append(f"exit {res.rc} ({signame(res.rc - 128)})")
    both = res.out + b"\n" + res.err
    seen = set()
    for pattern, what in RAW_MESSAGES:
        m = pattern.search(both)
        if m and what not in seen:
            seen.add(what)
            end = both.find(b"\n", m.end())
            line = both[both.rfind(b"\n", 0, m.start()) + 1:end if end >= 0 else len(both)]
            fails.append(f"printed {what}: {show(line, 120)}")
    m = CONTROL.search(both)
    if m:
        fails.append(f"echoed control character {ascii(m.group().decode('latin-1'))} raw: "
                     f"{show(both[max(0, m.start() - 40):m.end() + 40], 100)}")
    return fails


def one_line_error(res, names=()):
    """A refusal: exactly one stderr line, starting with 'perftrain:', naming each of names."""
    lines = res.err_lines
    if len(lines) != 1:
        return [f"error is {len(lines)} stderr lines, not one: {show(res.err, 160)}"]
    if not lines[0].startswith(b"perftrain:"):
        return [f"error line does not start with 'perftrain:': {show(lines[0])}"]
    fails = []
    for n in names:  # a name, or a tuple of names any one of which will do
        alternatives = n if isinstance(n, tuple) else (n,)
        if not any(a.encode() in lines[0] for a in alternatives):
            fails.append(f"error line does not name {' or '.join(alternatives)}: {show(lines[0])}")
    return fails


def expect_refused(res, names=()):
    fails = clean(res)
    if fails:
        return fails
    if res.rc == 0:
        last = res.out.strip().split(b"\n")[-1]
        return [f"accepted (exit 0) instead of refusing: {show(last, 100)}"]
    if res.rc not in (1, 2):
        return [f"exit {res.rc}, expected 1 or 2"]
    return one_line_error(res, names)


def expect_any(res):
    """Bounded and clean; a refusal is one line."""
    fails = clean(res)
    if fails or res.rc == 0:
        return fails
    if res.rc not in (1, 2):
        return [f"exit {res.rc}, expected 0, 1 or 2"]
    return one_line_error(res)


def expect_ok(res, what="the command"):
    fails = clean(res)
    if not fails and res.rc != 0:
        fails.append(f"{what} failed (exit {res.rc}): {show(res.err_lines[-1] if res.err_lines else res.out[-200:])}")
    return fails


def long_ok(res):
    """A legit huge amount of work: still running at the timeout is fine, if clean so far."""
    if res.timed_out:  # judged as if the SIGKILL at the timeout were a signal it was sent
        res.timed_out = False
        res.sent.add(signal.SIGKILL)
        fails = clean(res)
        res.timed_out = True
        return fails + ([f"ran past {res.timeout:.0f} s with an error printed: {show(res.err_lines[-1])}"]
                        if any(l.startswith(b"perftrain:") for l in res.err_lines) else [])
    return expect_any(res)


# ---------------------------------------------------------------------------
# Files


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(root, skip=("lock",)):
    """relative path -> ('d',) | ('f', sha256) | ('l', target) for everything under root."""
    out = {}
    if not os.path.lexists(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel in skip:
                continue
            if os.path.islink(full):
                out[rel] = ("l", os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = ("d",)
            else:
                out[rel] = ("f", sha(full))
    return out


def snapshot_diff(before, after, what):
    fails = []
    for rel in sorted(set(before) | set(after)):
        if before.get(rel) != after.get(rel):
            kind = "removed" if rel not in after else "added" if rel not in before else "changed"
            fails.append(f"{what}: {rel} {kind}")
    return fails[:4] + ([f"{what}: {len(fails) - 4} more changes"] if len(fails) > 4 else [])


def read_header(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    return data, n, json.loads(data[8:8 + n])


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def safetensors_bytes(tensors, metadata=None, raw_header=None):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file's bytes."""
    header, offset, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def metrics_steps(run_dir):
    """The steps of metrics.jsonl and the failures (torn lines)."""
    steps, fails = [], []
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return steps, fails
    with open(path, "rb") as f:
        for i, line in enumerate(f.read().split(b"\n")):
            if not line.strip():
                continue
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                fails.append(f"metrics.jsonl line {i + 1} is torn: {show(line, 80)}")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        fails.append(f"metrics.jsonl steps do not increase: {steps[:12]}")
    return steps, fails


STEP_NAME = re.compile(r"step_(\d{8})")
CKPT_FILES = ("model.safetensors", "ema.safetensors", "trainer_state.safetensors")


def latest_step(run_dir):
    """(step ckpt/latest names inside the run, failures); step None when there is no latest."""
    path = os.path.join(run_dir, "ckpt", "latest")
    if not os.path.lexists(path):
        return None, []
    with open(path, "rb") as f:
        name = f.read().strip().decode("utf-8", "replace")
    m = STEP_NAME.fullmatch(name)
    if not m:
        return None, [f"ckpt/latest names {show(name)}, not a step directory of the run"]
    d = os.path.join(run_dir, "ckpt", name)
    missing = [f for f in CKPT_FILES if not os.path.isfile(os.path.join(d, f))]
    if missing:
        return None, [f"ckpt/latest names {name}, which has no {missing[0]}"]
    return int(m.group(1)), []


def leftovers(run_dir):
    out = []
    for dirpath, dirnames, filenames in os.walk(run_dir):
        for name in dirnames + filenames:
            if name.startswith(".") or ".tmp" in name:
                out.append(os.path.relpath(os.path.join(dirpath, name), run_dir))
    return out


def crc_record(run_dir, step):
    d = os.path.join(run_dir, "ckpt", f"step_{step:08d}")
    return {f: read_header(os.path.join(d, f))[2].get("__metadata__", {}).get("perftrain.crc32c") for f in CKPT_FILES}


# ---------------------------------------------------------------------------
# The harness


class Case:
    """heavy: may touch gigabytes of memory before it ends; heavy cases run one at a time."""

    def __init__(self, cat, name, fn, cost=1.0, heavy=False):
        self.cat, self.name, self.fn, self.cost, self.heavy = cat, name, fn, cost, heavy
        self.fails, self.secs, self.notes = [], 0.0, []


class Ctx:
    """What a case gets: the binary, its own empty directory, the shared fixtures."""

    def __init__(self, h, case):
        self.h, self.bin, self.fx = h, h.bin, h.fixtures
        safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", case.name)[:80]
        self.dir = os.path.join(h.work, "cases", f"{case.cat}-{h.index[case.name]:04d}-{safe}")
        os.makedirs(self.dir)
        self.notes = case.notes  # what happened, for the summary (e.g. where a kill -9 landed)

    def p(self, *parts):
        return os.path.join(self.dir, *parts)

    def copy_run(self, name="R", src=None):
        dst = self.p("runs", name)
        shutil.copytree(src or self.fx["src"], dst, symlinks=True)
        return dst

    def run(self, args, timeout=QUICK_S, **kw):
        kw.setdefault("cwd", self.dir)
        return run([self.bin] + list(args), timeout, **kw)

    def spawn(self, args, tag, **kw):
        kw.setdefault("cwd", self.dir)
        return Background([self.bin] + list(args), self.p(tag), **kw)

    def verify(self, path, timeout=RUN_S):
        return self.run(["verify", path], timeout)


def tiny_train(runs_dir, name, steps, sets=(), ckpt_every=None, batch=8):
    args = ["train", "--device", "cpu", "--data", "synthetic", "--runs-dir", runs_dir, "--run-name", name,
            "--steps", str(steps), "--batch-size", str(batch)]
    for s in TINY_SETS + list(sets) + ([f"log.checkpoint_every={ckpt_every}"] if ckpt_every is not None else []):
        args += ["--set", s]
    return args


class Harness:
    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.work = os.path.abspath(args.work)
        self.args = args
        self.fixtures = {}
        self.index = {}
        self.print_lock = threading.Lock()
        self.heavy_lock = threading.Lock()

    # -- fixtures ----------------------------------------------------------
    def build_fixtures(self, cats):
        fx = os.path.join(self.work, "fixtures")
        os.makedirs(fx, exist_ok=True)
        if cats & set("ACDFGH"):
            # The shared source run: 3 steps, a checkpoint each (cases copy it).
            r = run([self.bin] + tiny_train(fx, "src", 3, ckpt_every=1), RUN_S)
            if r.rc != 0:
                sys.exit(f"hostile_run: the tiny source run failed ({r}); is --bin a working perftrain?")
            self.fixtures["src"] = os.path.join(fx, "src")
            self.fixtures["src_snapshot"] = snapshot(self.fixtures["src"])
        if "G" in cats:
            # The uninterrupted run the trials must end equal to, and its timeline:
            # when its directory appeared (training starts) and when it ended.
            ref = os.path.join(fx, "ref")
            p = Background([self.bin] + tiny_train(fx, "ref", KILL_STEPS, ckpt_every=1), os.path.join(fx, "ref"))
            wait_for(lambda: os.path.isdir(ref) or not p.running(), RUN_S, every=0.005)
            self.fixtures["ref_dir_secs"] = time.monotonic() - p.start
            r = p.wait(RUN_S)
            if r.rc != 0:
                sys.exit(f"hostile_run: the kill trials' reference run failed ({r})")
            self.fixtures["ref_run_secs"] = r.secs - self.fixtures["ref_dir_secs"]
            self.fixtures["ref_crc"] = crc_record(ref, KILL_STEPS)
        if "C" in cats:
            self.fixtures["torch_save"] = make_torch_save(os.path.join(fx, "torch_save.pt"))
        if "E" in cats:
            self.fixtures["bomb_member"] = gzip.compress(bytes(64 << 20), compresslevel=9, mtime=0)

    # -- running -----------------------------------------------------------
    def execute(self, cases):
        for i, c in enumerate(cases):
            self.index[c.name] = i
        order = sorted(cases, key=lambda c: -c.cost)
        with concurrent.futures.ThreadPoolExecutor(self.args.jobs) as pool:
            futures = [pool.submit(self.run_case, c) for c in order]
            for f in concurrent.futures.as_completed(futures):
                f.result()

    def run_case(self, case):
        start = time.monotonic()
        try:
            ctx = Ctx(self, case)
            if case.heavy:
                with self.heavy_lock:
                    case.fails = [f for f in (case.fn(ctx) or []) if f]
            else:
                case.fails = [f for f in (case.fn(ctx) or []) if f]
        except Exception as e:  # a harness error is a failing case, named as such
            case.fails = [f"harness error: {type(e).__name__}: {show(str(e), 200)}"]
        case.secs = time.monotonic() - start
        with self.print_lock:
            if case.fails:
                print(f"FAIL {case.cat} {case.name}: {'; '.join(case.fails)}", flush=True)
            elif self.args.verbose:
                print(f"held {case.cat} {case.name} ({case.secs:.1f} s)", flush=True)
        if not case.fails and not self.args.keep:
            shutil.rmtree(ctx.dir, ignore_errors=True)


def make_torch_save(path):
    """A torch.save file (zip format); without torch, the same zip layout by hand."""
    code = ("import sys, torch; torch.save({'pos_embed': torch.zeros(4), 'x.weight': torch.ones(2, 2)}, sys.argv[1])")
    try:
        if subprocess.run([sys.executable, "-c", code, path], capture_output=True, timeout=120).returncode == 0:
            return path
    except (OSError, subprocess.TimeoutExpired):
        pass
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", b"3\n")
    return path


# ---------------------------------------------------------------------------
# A. CLI values for every option of every command

COMMANDS = ["train", "config", "sample", "bench", "profile", "summary", "graph", "verify", "models"]
NUM_VALUES = [("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("-1", "-1"), ("0", "0"), ("1e9", "1e9"),
              ("1e11", "1e11"), ("1e300", "1e300"), ("21-digits", "999999999999999999999"), ("empty", ""),
              ("abc", "abc"), ("newline", "1\n2"), ("ctrl", "\x1b[31m\x07\x08")]
TEXT_VALUES = [("empty", ""), ("abc", "abc"), ("newline", "a\nb"), ("ctrl", "\x1b]0;x\x07\x1b[31m"),
               ("long", "x" * 5000)]
NOT_A_NUMBER = {"nan", "inf", "-inf", "empty", "abc", "newline", "ctrl"}
# Options whose values come from a fixed list: anything else is refused ('' may mean the default).
ENUM_OPTIONS = {"--model", "--data", "--objective", "--device", "--precision", "--weights", "--variant",
                "--variants", "--group-by", "--kind", "--format", "--graph", "--fused", "--save-on-signal",
                "--torch-modes", "model"}
# (command, option): a huge value is legit work, still running at LONG_OK_S is fine.
LONG_WORK = {("train", "--steps"), ("bench", "--steps"), ("bench", "--warmup"), ("bench", "--repeats"),
             ("profile", "--timed-steps"), ("sample", "--steps"), ("sample", "--per-class"),
             ("sample", "--classes")}
# (command, option): a duration; a huge one must be refused, not slept through.
DURATIONS = {("bench", "--cooldown"), ("profile", "--slow-data-ms")}
# train's shortcut flags and the keys they set (config prints them back).
SHORTCUT_KEYS = {"--model": "model.name", "--data": "data.source", "--objective": "diffusion.objective",
                 "--device": "train.device", "--precision": "train.precision", "--steps": "train.steps",
                 "--batch-size": "train.batch_size", "--lr": "train.lr", "--seed": "train.seed",
                 "--run-name": "run.name"}
OPTION_LINE = re.compile(r"^  (?:-\w,)?(--[\w-]+)(?: ([A-Z][A-Z:{},._\-a-z]*))?")
POSITIONAL_LINE = re.compile(r"^  ([a-z]\w*) ([A-Z]+)")


def command_options(binary, command):
    """[(option, kind)] of a command from its --help: kind int | float | bool | text."""
    r = run([binary, command, "--help"], QUICK_S)
    out, section = [], ""
    for line in r.out.decode().splitlines():
        if line and not line.startswith(" "):
            section = line
            continue
        m = OPTION_LINE.match(line)
        pm = POSITIONAL_LINE.match(line) if section.startswith("Positionals") else None
        if m and m.group(1) not in ("--help", "--version") and m.group(2):
            name, typ = m.group(1), m.group(2)
        elif pm:
            name, typ = pm.group(1), pm.group(2)
        else:
            continue
        kind = ("bool" if typ.startswith("BOOLEAN") else "int" if typ.startswith(("INT", "UINT"))
                else "float" if typ.startswith("FLOAT") else "text")
        out.append((name, kind))
    return out


def a_base(ctx, command):
    """(option, value) pairs of a small, fast, legit invocation (a positional by its name)."""
    if command in ("train", "config"):
        base = [("--device", "cpu"), ("--data", "synthetic"), ("--runs-dir", ctx.p("runs")), ("--run-name", "r"),
                ("--steps", "2"), ("--batch-size", "8")]
        return base + [("--set", s) for s in TINY_SETS]
    return {
        "sample": [("--ckpt", ctx.fx["src"]), ("--out", ctx.p("s.png")), ("--device", "cpu"), ("--classes", "2"),
                   ("--per-class", "1"), ("--steps", "1")],
        "bench": [("--device", "cpu"), ("--model", "DiT-T/4"), ("--batch", "2"), ("--steps", "1"), ("--warmup", "0"),
                  ("--repeats", "1"), ("--variants", "eager-fp32"), ("--image-size", "8"), ("--in-channels", "2"),
                  ("--num-classes", "3"), ("--out", ctx.p("bench"))],
        "profile": [("--device", "cpu"), ("--model", "DiT-T/4"), ("--batch", "2"), ("--timed-steps", "1"),
                    ("--schedule", "wait=0,warmup=0,active=1"), ("--variant", "eager-fp32"), ("--image-size", "8"),
                    ("--in-channels", "2"), ("--num-classes", "3"), ("--out", ctx.p("prof")), ("--top", "3")],
        "summary": [("model", "DiT-T/4"), ("--batch", "2"), ("--device", "cpu"), ("--depth", "1"),
                    ("--output", ctx.p("summary.txt"))],
        "graph": [("model", "DiT-T/4"), ("--batch", "1"), ("--output", ctx.p("graph.dot"))],
        "verify": [("path", ctx.fx["src"])],
        "models": [],
    }[command]


def a_argv(ctx, command, option, value, positional_names):
    pairs = [(o, v) for o, v in a_base(ctx, command) if o != option or o == "--set"]
    pairs.append((option, value))
    args = [command]
    for o, v in pairs:
        args += [v] if o in positional_names else [o, v]
    return args


def a_must_refuse(option, kind, vname):
    if kind in ("int", "float") and vname in NOT_A_NUMBER:
        return True
    if kind == "int" and vname in ("1e300", "21-digits"):
        return True  # does not fit 64 bits: refused, never clamped
    if kind == "bool":  # numbers may read as true or false; words and junk may not
        return vname in NOT_A_NUMBER - {"empty"}
    return option in ENUM_OPTIONS and vname != "empty"


def numeric_equal(requested, printed):
    try:
        return float(requested) == float(printed)
    except (TypeError, ValueError):
        return False


def config_value(toml_text, key):
    section, name = key.split(".", 1)
    return tomllib.loads(toml_text).get(section, {}).get(name)


def a_case(command, option, kind, vname, value, positional_names):
    def fn(ctx):
        long_work = (command, option) in LONG_WORK and vname not in NOT_A_NUMBER
        real_work = command not in ("config", "verify", "models")
        timeout = (LONG_OK_S if long_work else DURATION_S if (command, option) in DURATIONS
                   else A_RUN_S if real_work else QUICK_S)
        res = ctx.run(a_argv(ctx, command, option, value, positional_names), timeout)
        if a_must_refuse(option, kind, vname):
            return expect_refused(res)
        fails = long_ok(res) if long_work else expect_any(res)
        if not fails and res.rc == 0 and command == "config" and option in SHORTCUT_KEYS:
            printed = config_value(res.out.decode(), SHORTCUT_KEYS[option])
            if kind in ("int", "float") and not numeric_equal(value, printed):
                fails.append(f"accepted {show(value)} but the config says {printed!r} (clamped or wrapped)")
        return fails
    return fn


def a_cases(h):
    cases = []
    for command in COMMANDS:
        options = command_options(h.bin, command)
        positional_names = {o for o, _ in options if not o.startswith("-")}
        for option, kind in options:
            values = NUM_VALUES if kind in ("int", "float", "bool") else TEXT_VALUES
            for vname, value in values:
                cases.append(Case("A", f"{command} {option}={vname}",
                                  a_case(command, option, kind, vname, value, positional_names),
                                  cost=2 if command in ("bench", "profile", "train") else 1))

    # The values the issue names, beyond the grid.
    def bounded(args, refuse=True, timeout=BOUND_S):
        def fn(ctx):
            res = ctx.run([a.replace("{dir}", ctx.dir) for a in args], timeout)
            return expect_refused(res) if refuse else expect_any(res)
        return fn

    bench = ["bench", "--device", "cpu", "--model", "DiT-T/4", "--steps", "1", "--warmup", "0", "--variants",
             "eager-fp32", "--out", "{dir}/bench"]
    prof = ["profile", "--device", "cpu", "--model", "DiT-T/4", "--variant", "eager-fp32", "--timed-steps", "1",
            "--out", "{dir}/prof"]
    tiny = tiny_train("{dir}/runs", "r", 2)
    extra = [
        ("bench --batch=1000000000", bench + ["--batch", "1000000000"]),
        ("bench --batch=32,nan", bench + ["--batch", "2,nan"]),
        ("bench --batch=0", bench + ["--batch", "0"]),
        ("bench --batch=-2", bench + ["--batch", "-2"]),
        ("bench --batch=9223372036854775807", bench + ["--batch", "9223372036854775807"]),
        ("bench --cooldown=1e12", bench + ["--batch", "2", "--cooldown", "1e12"]),
        ("profile --batch=1000000000", prof + ["--batch", "1000000000"]),
        ("profile --schedule=wait=1000000000", prof + ["--batch", "2", "--schedule", "wait=1000000000,active=1"]),
        ("profile --schedule=active=1000000000", prof + ["--batch", "2", "--schedule", "active=1000000000"]),
        ("profile --schedule=repeat=1e300", prof + ["--batch", "2", "--schedule", "active=1,repeat=1e300"]),
        ("profile --schedule=wait=-1", prof + ["--batch", "2", "--schedule", "wait=-1,active=1"]),
        ("profile --schedule=wait=nan", prof + ["--batch", "2", "--schedule", "wait=nan,active=1"]),
        ("profile --slow-data-ms=1e12", prof + ["--batch", "2", "--slow-data-ms", "1e12"]),
        ("train --batch-size=1000000000", tiny_train("{dir}/runs", "r", 2, batch=1000000000)),
        ("train --profile=wait=1000000000", tiny + ["--profile", "wait=1000000000,active=1"]),
        ("graph --batch=1000000000", ["graph", "DiT-T/4", "--batch", "1000000000", "-o", "{dir}/g.dot"]),
        ("summary --batch=1000000000000", ["summary", "DiT-XL/2", "--batch", "1000000000000", "--device", "cpu"]),
        ("models --image-size=1000000000", ["models", "--image-size", "1000000000"]),
    ]
    for name, args in extra:
        # graph traces without allocating the batch; a schedule past the run's end records nothing.
        refuse = name not in ("models --image-size=1000000000", "summary --batch=1000000000000",
                              "graph --batch=1000000000", "train --profile=wait=1000000000")
        timeout = DURATION_S if "--cooldown" in args or "--slow-data-ms" in args or "--schedule" in args else BOUND_S

        def fn(ctx, fn_args=args, refuse=refuse, timeout=timeout):
            argv = [a.replace("{dir}", ctx.dir).replace("{src}", ctx.fx["src"]) for a in fn_args]
            res = ctx.run(argv, timeout)
            return expect_refused(res) if refuse else expect_any(res)
        cases.append(Case("A", name, fn, cost=2))
    return cases


# ---------------------------------------------------------------------------
# B. --set section.key=value for every config key

B_VALUES = {
    int: [("nan", "nan", True), ("inf", "inf", True), ("-1", "-1", False), ("1e300", "1e300", True),
          ("21-digits", "999999999999999999999", True), ("string", '"abc"', True),
          ("smuggle", "1\n[train]\nsteps=5", True), ("ctrl", "\x1b[31m", True)],
    float: [("nan", "nan", True), ("inf", "inf", True), ("-inf", "-inf", True), ("-1", "-1", False),
            ("1e300", "1e300", False), ("1e309", "1e309", True), ("string", '"abc"', True),
            ("smuggle", "1\n[train]\nsteps=5", True), ("ctrl", "\x1b[31m", True)],
    bool: [("nan", "nan", True), ("2", "2", True), ("yes", "yes", True), ("string", '"true"', True),
           ("smuggle", "true\n[train]\nsteps=5", True), ("ctrl", "\x1b[31m", True)],
    str: [("empty", "", False), ("ctrl", "\x1b[31m\x07", False), ("escaped-ctrl", '"\\u001b[2J"', False),
          ("newline", "a\nb", False), ("smuggle", "x\n[train]\nsteps=5", False), ("long", "x" * 10000, False),
          ("nan", "nan", False)],
}


def config_keys(binary):
    r = run([binary, "config", "--device", "cpu"], QUICK_S)
    if r.rc != 0:
        sys.exit(f"hostile_run: `perftrain config` failed: {r}")
    doc = tomllib.loads(r.out.decode())
    return [(f"{s}.{k}", type(v)) for s, table in doc.items() for k, v in table.items()]


def key_names(key):
    """How an error line may name a key: in full, or its last part ("train.beta1/beta2 must ..."); a
    *.name key also by its section ("unknown model ...")."""
    section, name = key.split(".", 1)
    return (key, name) + ((section,) if name == "name" else ())


def b_case(key, typ, vname, value, refuse):
    def fn(ctx):
        res = ctx.run(["config", "--device", "cpu", "--set", f"{key}={value}"], QUICK_S)
        if res.rc != 0 or refuse and clean(res):
            return expect_refused(res, names=[key_names(key)])
        fails = expect_any(res)
        if fails:
            return fails
        try:
            doc = tomllib.loads(res.out.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            return [f"accepted, but the printed config is not valid TOML: {e}"]
        section, name = key.split(".", 1)
        printed = doc.get(section, {}).get(name)
        if key != "train.steps" and doc.get("train", {}).get("steps") == 5:
            return [f"accepted {show(value)}: the smuggled TOML was applied (train.steps = 5)"]
        if refuse:
            return [f"accepted {show(value)} instead of refusing: the config says {name} = {show(repr(printed))}"]
        if typ in (int, float) and not numeric_equal(value, printed):
            return [f"accepted {show(value)} but the config says {printed!r} (clamped or wrapped)"]
        if typ is str and vname in ("smuggle", "newline") and printed is not None and not str(printed).endswith(value):
            return [f"accepted {show(value)} but the config says {show(str(printed))}"]
        return []
    return fn


def b_real_case(sets, refuse, outside=None):
    """A tiny training run with the sets; outside: a path (relative to the case) it must not create."""
    def fn(ctx):
        args = tiny_train(ctx.p("runs"), "r", 2)
        if any(s.startswith("run.name=") for s in sets):
            i = args.index("--run-name")
            del args[i:i + 2]
        for s in sets:
            args += ["--set", s.replace("{dir}", ctx.dir)]
        res = ctx.run(args, BOUND_S)
        fails = expect_refused(res) if refuse else expect_any(res)
        if outside:
            escaped = os.path.join(ctx.dir, outside)
            if os.path.lexists(escaped):
                fails.append(f"made a run directory outside --runs-dir: {escaped}")
                shutil.rmtree(escaped, ignore_errors=True)
        if not fails and res.rc != 0 and os.path.isdir(ctx.p("runs")) and os.listdir(ctx.p("runs")):
            fails.append(f"refused, but left {show(os.listdir(ctx.p('runs'))[0])} in the runs directory")
        return fails
    return fn


def b_cases(h):
    cases = []
    for key, typ in config_keys(h.bin):
        for vname, value, refuse in B_VALUES[typ]:
            cases.append(Case("B", f"{key}={vname}", b_case(key, typ, vname, value, refuse)))
    real = [
        ("train run.name=ctrl", ["run.name=\x1b[31mred\x07"], False, None),
        ("train run.name=newline", ["run.name=a\nb"], False, None),
        ("train run.name=../escape", ["run.name=../escape"], False, "escape"),
        ("train run.name=/abs", ["run.name={dir}/abs"], False, "abs"),
        ("train run.dir=ctrl", ["run.dir=\x1b[2Jdir"], False, None),
        ("train data.synthetic_size=1e11", ["data.synthetic_size=1e11"], True, None),
        ("train data.synthetic_size=100000000000", ["data.synthetic_size=100000000000"], False, None),
        ("train data.prefetch=1000000000", ["data.prefetch=1000000000"], False, None),
        ("train model.image_size=65536,patch=1", ["model.image_size=65536", "model.patch=1"], True, None),
        ("train model.hidden=1000000000", ["model.hidden=1000000000"], True, None),
        ("train model.depth=1000000000", ["model.depth=1000000000"], True, None),
        ("train model.num_classes=1000000000000", ["model.num_classes=1000000000000"], True, None),
        ("train log.sample_classes=1000000000", ["log.sample_classes=1000000000"], False, None),
        ("train log.sample_per_class=1000000000", ["log.sample_per_class=1000000000"], False, None),
        ("train diffusion.sample_steps=1000000000", ["diffusion.sample_steps=1000000000"], False, None),
        ("train health.median_window=1000000000000", ["health.median_window=1000000000000"], False, None),
    ]
    for name, sets, refuse, outside in real:
        cases.append(Case("B", name, b_real_case(sets, refuse, outside), cost=3))
    return cases


# ---------------------------------------------------------------------------
# C. Checkpoint corruption


def mutations(data, hlen, header, fname, torch_save=None):
    """name -> function(path) that corrupts the file at path (data: its bytes)."""
    size = len(data)
    start = 8 + hlen
    names = [k for k in header if k != "__metadata__"]
    first = names[0]
    pos_name = data.index(b'"' + first.encode() + b'"', 8) + 1
    pos_shape = data.index(b'"shape":[', 8) + len(b'"shape":[')

    def trunc(n):
        return lambda p: write_bytes(p, data[:n])

    def flip(i, mask):
        def f(p):
            b = bytearray(data)
            b[i] ^= mask
            write_bytes(p, bytes(b))
        return f

    def edit(old, new):
        assert len(old) == len(new)

        def f(p):
            i = data.index(old, 8, start)
            write_bytes(p, data[:i] + new + data[i + len(old):])
        return f

    def replace_dir(p):
        os.remove(p)
        os.mkdir(p)

    out = {
        "empty-file": trunc(0), "truncate@4": trunc(4), "truncate@mid-header": trunc(8 + hlen // 2),
        "truncate@data-start": trunc(start), "truncate@mid-data": trunc(start + (size - start) // 2),
        "truncate@last-byte": trunc(size - 1),
        "flip-header-length-byte0": flip(0, 0x01), "flip-header-length-byte7": flip(7, 0x40),
        "flip-json-brace": flip(8, 0x01), "flip-tensor-name": flip(pos_name, 0x01),
        "flip-shape-digit": flip(pos_shape, 0x02),
        "flip-data-first": flip(start, 0xFF), "flip-data-middle": flip(start + (size - start) // 2, 0xFF),
        "flip-data-last": flip(size - 1, 0xFF),
        "torch-save-file": lambda p: shutil.copyfile(torch_save, p),
        "directory": replace_dir,
    }
    meta = header.get("__metadata__", {})
    if fname != "trainer_state.safetensors":
        step = meta["perftrain.step"]
        out["edit-meta-step"] = edit(f'"perftrain.step":"{step}"'.encode(),
                                     f'"perftrain.step":"{int(step) - 1 if int(step) > 1 else 9}"'.encode())
        out["edit-meta-lr"] = edit(b"\\nlr = 0.001\\n", b"\\nlr = 0.009\\n")
    else:
        step = meta["step"]
        out["edit-meta-step"] = edit(f'"step":"{step}"'.encode(), f'"step":"{int(step) - 1}"'.encode())
        index = meta["data.index"]
        out["edit-meta-data-index"] = edit(f'"data.index":"{index}"'.encode(),
                                           f'"data.index":"{(int(index) + 1) % (10 ** len(index))}"'.encode())
    return out


def c_cases(h):
    cases = []
    step_dir = os.path.join("ckpt", "step_00000003")
    src = os.path.join(h.work, "fixtures", "src")
    for fname in CKPT_FILES:
        data, hlen, header = read_header(os.path.join(src, step_dir, fname))
        for mname in mutations(data, hlen, header, fname):
            reads_weights = fname != "trainer_state.safetensors" and not mname.startswith("edit-meta")
            commands = ["verify", "resume"] + (["sample"] if reads_weights else [])
            for command in commands:
                cases.append(Case("C", f"{fname.split('.')[0]} {mname} {command}",
                                  c_case(fname, mname, command, step_dir), cost=2 if command != "verify" else 1))
    return cases


def c_case(fname, mname, command, step_dir):
    def fn(ctx):
        run_dir = ctx.copy_run()
        path = os.path.join(run_dir, step_dir, fname)
        data, hlen, header = read_header(path)
        mutations(data, hlen, header, fname, ctx.fx["torch_save"])[mname](path)
        before = snapshot(run_dir)
        if command == "verify":
            res = ctx.verify(run_dir)
        elif command == "resume":
            res = ctx.run(["train", "--resume", run_dir, "--steps", "5"], RUN_S)
        else:
            weights = "ema" if fname.startswith("ema") else "model"
            res = ctx.run(["sample", "--ckpt", run_dir, "--weights", weights, "--device", "cpu", "--classes", "2",
                           "--per-class", "1", "--steps", "1", "--out", ctx.p("s.png")], RUN_S)
        fails = expect_refused(res, names=[fname])
        if res.rc == 0 and not clean(res):
            fails = [f"silent success with a corrupted {fname} ({mname})"]
        return fails + snapshot_diff(before, snapshot(run_dir), "the run")
    return fn


# ---------------------------------------------------------------------------
# D. Run-directory manipulations


def resume_args(run_dir, steps=5):
    return ["train", "--resume", run_dir, "--steps", str(steps)]


def d_latest_case(kind, command):
    def fn(ctx):
        run_dir = ctx.copy_run("R")
        other = ctx.copy_run("other")
        latest = os.path.join(run_dir, "ckpt", "latest")
        content = {
            "dotdot": b"../../other/ckpt/step_00000003\n",
            "absolute": (os.path.join(other, "ckpt", "step_00000003") + "\n").encode(),
            "missing-step": b"step_00000099\n",
            "garbage": b"\x1b[31m\x00\xff\xfe step_\x07\n\n",
            "empty": b"",
        }[kind]
        write_bytes(latest, content)
        before_r, before_o = snapshot(run_dir), snapshot(other)
        if command == "verify":
            res = ctx.verify(run_dir)
        elif command == "resume":
            res = ctx.run(resume_args(run_dir), RUN_S)
        else:
            res = ctx.run(["sample", "--ckpt", run_dir, "--device", "cpu", "--classes", "2", "--per-class", "1",
                           "--steps", "1", "--out", ctx.p("s.png")], RUN_S)
        fails = expect_refused(res, names=["latest"])
        if res.rc == 0 and not clean(res):
            fails = [f"ckpt/latest ({kind}) resolved: exit 0 instead of naming ckpt/latest"]
        return fails + snapshot_diff(before_r, snapshot(run_dir), "the run") + \
            snapshot_diff(before_o, snapshot(other), "the other run")
    return fn


def d_lock_symlink(ctx):
    run_dir = ctx.copy_run("R")
    precious = ctx.p("precious.txt")
    write_bytes(precious, b"precious data\n")
    os.remove(os.path.join(run_dir, "lock"))
    os.symlink(precious, os.path.join(run_dir, "lock"))
    res = ctx.run(resume_args(run_dir), RUN_S)
    fails = expect_any(res)
    if not os.path.isfile(precious) or os.path.islink(precious):
        fails.append("the lock symlink's target is no longer a regular file")
    elif open(precious, "rb").read() != b"precious data\n":
        fails.append("the lock symlink's target was overwritten")
    return fails


def wait_for(predicate, timeout, every=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def d_lock_deleted(ctx):
    run_dir = ctx.copy_run("R")
    first = ctx.spawn(resume_args(run_dir, 1000000), "first")
    fails = []
    try:
        if not wait_for(lambda: max(metrics_steps(run_dir)[0] or [0]) >= 5, RUN_S):
            return ["the first trainer did not get going"] + clean(first.wait(1))
        os.remove(os.path.join(run_dir, "lock"))
        second = ctx.spawn(resume_args(run_dir, 1000000), "second")
        # The second must refuse while the first runs; still running after 20 s means both train.
        wait_for(lambda: not second.running(), 20)
        if second.running():
            fails.append("a second trainer runs on the run while the first holds it (both write checkpoints)")
            second.signal(signal.SIGKILL)
            r2 = second.wait(30)
        else:
            r2 = second.wait(1)
            if r2.rc == 0:
                fails.append("a second trainer ran to completion on a run in use")
            else:
                fails += expect_refused(r2)
        if not first.running():
            fails.append("the first trainer ended while it should still run")
        first.signal(signal.SIGTERM)
        r1 = first.wait(RUN_S)
        fails += [f"first trainer: {f}" for f in clean(r1)]
        steps, torn = metrics_steps(run_dir)
        fails += torn
        step, bad = latest_step(run_dir)
        fails += bad
        v = ctx.verify(run_dir)
        if v.rc != 0:
            fails.append(f"verify after both: {show(v.err_lines[-1] if v.err_lines else b'')}")
    finally:
        first.kill()
    return fails


def d_stray_case(kind):
    def fn(ctx):
        run_dir = ctx.copy_run("R")
        ckpt = os.path.join(run_dir, "ckpt")
        if kind == "step_60_best":
            d = os.path.join(ckpt, "step_60_best")
            os.mkdir(d)
            shutil.copyfile(os.path.join(ckpt, "step_00000003", "model.safetensors"), os.path.join(d, "model.safetensors"))
            write_bytes(os.path.join(d, "notes.txt"), b"the best one\n")
        elif kind == "step_1-README":
            os.mkdir(os.path.join(ckpt, "step_1"))
            write_bytes(os.path.join(ckpt, "step_1", "README"), b"kept by hand\n")
        else:  # a step directory without trainer state
            d = os.path.join(ckpt, "step_00000900")
            os.mkdir(d)
            for f in ("model.safetensors", "ema.safetensors"):
                shutil.copyfile(os.path.join(ckpt, "step_00000003", f), os.path.join(d, f))
        strays = {k: v for k, v in snapshot(run_dir).items()
                  if k.startswith(os.path.join("ckpt", {"step_60_best": "step_60_best", "step_1-README": "step_1",
                                                        "no-trainer-state": "step_00000900"}[kind]))}
        res = ctx.run(resume_args(run_dir, 7), RUN_S)
        fails = expect_any(res)
        after = snapshot(run_dir)
        for rel, v in strays.items():
            if after.get(rel) != v:
                fails.append(f"{rel} {'removed' if rel not in after else 'changed'} by a resume")
                break
        if res.rc == 0:
            step, bad = latest_step(run_dir)
            fails += bad
            if step != 7:
                fails.append(f"after the resume ckpt/latest is step {step}, not 7")
        return fails
    return fn


def d_resume_empty(ctx):
    res = ctx.run(tiny_train(ctx.p("runs"), "r", 2) + ["--resume", ""], RUN_S)
    fails = expect_refused(res, names=["--resume"])
    if res.rc == 0:
        fails = ["--resume '' started a fresh run instead of refusing"]
    return fails


def d_resume_run_name(ctx):
    run_dir = ctx.copy_run("R")
    before = snapshot(run_dir)
    res = ctx.run(resume_args(run_dir) + ["--run-name", "other"], RUN_S)
    return expect_any(res) + snapshot_diff(before, snapshot(run_dir), "the resumed run (--run-name other)")


def rewrite_config_meta(path, replace):
    data, hlen, header = read_header(path)
    meta = header["__metadata__"]
    text = meta["perftrain.config"]
    for old, new in replace:
        text = re.sub(old, new, text, flags=re.M)
    meta["perftrain.config"] = text
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    write_bytes(path, struct.pack("<Q", len(h)) + h + data[8 + hlen:])


def d_huge_meta(command):
    def fn(ctx):
        run_dir = ctx.copy_run("R")
        for f in ("model.safetensors", "ema.safetensors"):
            rewrite_config_meta(os.path.join(run_dir, "ckpt", "step_00000003", f),
                                [(r"^image_size = \d+$", "image_size = 65536"), (r"^patch = \d+$", "patch = 1")])
        before = snapshot(run_dir)
        if command == "resume":
            res = ctx.run(resume_args(run_dir), BOUND_S)
        else:
            res = ctx.run(["sample", "--ckpt", run_dir, "--device", "cpu", "--classes", "1", "--per-class", "1",
                           "--steps", "1", "--out", ctx.p("s.png")], BOUND_S)
        return expect_refused(res) + snapshot_diff(before, snapshot(run_dir), "the run")
    return fn


def d_cases(h):
    cases = []
    for kind in ("dotdot", "absolute", "missing-step", "garbage", "empty"):
        for command in ("verify", "resume", "sample"):
            cases.append(Case("D", f"latest={kind} {command}", d_latest_case(kind, command), cost=2))
    cases += [
        Case("D", "lock=symlink-to-file resume", d_lock_symlink, cost=3),
        Case("D", "lock deleted under a trainer, second trainer", d_lock_deleted, cost=10),
        Case("D", "--resume ''", d_resume_empty, cost=2),
        Case("D", "--resume R --run-name other", d_resume_run_name, cost=3),
        Case("D", "meta image_size=65536 patch=1 resume", d_huge_meta("resume"), cost=2),
        Case("D", "meta image_size=65536 patch=1 sample", d_huge_meta("sample"), cost=2),
    ]
    for kind in ("step_60_best", "step_1-README", "no-trainer-state"):
        cases.append(Case("D", f"stray {kind} survives a resume", d_stray_case(kind), cost=4))
    return cases


# ---------------------------------------------------------------------------
# E. Data files


def idx_bytes(dims, data=None, magic=b"\x00\x00\x08"):
    n = 1
    for d in dims:
        n *= d
    header = magic + bytes([len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    return header + (data if data is not None else bytes((i * 37) % 256 for i in range(n)))


def labels_bytes(n):
    return idx_bytes([n], bytes(i % 10 for i in range(n)), magic=b"\x00\x00\x08")


def fashion_dir(ctx, images=None, labels=None, n=64, gz_images=None, gz_labels=None):
    d = ctx.p("fashion")
    os.makedirs(d, exist_ok=True)
    for prefix, count in (("train", n), ("t10k", 16)):
        imgs = images if prefix == "train" and images is not None else idx_bytes([count, 28, 28])
        labs = labels if prefix == "train" and labels is not None else labels_bytes(count)
        if prefix == "train" and gz_images is not None:
            write_bytes(os.path.join(d, "train-images-idx3-ubyte.gz"), gz_images)
        else:
            write_bytes(os.path.join(d, f"{prefix}-images-idx3-ubyte"), imgs)
        if prefix == "train" and gz_labels is not None:
            write_bytes(os.path.join(d, "train-labels-idx1-ubyte.gz"), gz_labels)
        else:
            write_bytes(os.path.join(d, f"{prefix}-labels-idx1-ubyte"), labs)
    return d


def fashion_train(ctx, data_dir):
    args = ["train", "--device", "cpu", "--data", "fashion-mnist", "--data-path", data_dir, "--runs-dir",
            ctx.p("runs"), "--run-name", "e", "--steps", "1", "--batch-size", "4"]
    for s in TINY_FASHION_SETS:
        args += ["--set", s]
    return args


def latents_train(ctx, path):
    args = ["train", "--device", "cpu", "--data", "latents", "--data-path", path, "--runs-dir", ctx.p("runs"),
            "--run-name", "e", "--steps", "1", "--batch-size", "4"]
    for s in TINY_SETS:
        if not s.startswith("data."):
            args += ["--set", s]
    return args


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def i64(values):
    return struct.pack(f"<{len(values)}q", *values)


N_LAT = 16
LAT_SHAPE = [N_LAT, 2, 8, 8]
LAT_VALUES = [((i * 7919) % 200) / 100.0 - 1.0 for i in range(N_LAT * 2 * 8 * 8)]
LABELS = [i % 3 for i in range(N_LAT)]


def shard(latents=None, labels=None, meta=None, shape=None, dtype="F32", labels_dtype="I64", raw_header=None):
    return safetensors_bytes([("latents", dtype, shape or LAT_SHAPE, latents if latents is not None else f32(LAT_VALUES)),
                              ("labels", labels_dtype, [N_LAT], labels if labels is not None else i64(LABELS))],
                             meta, raw_header)


def with_header_length(data, n):
    return struct.pack("<Q", n) + data[8:]


def valid_header_json():
    return json.dumps({"latents": {"dtype": "F32", "shape": LAT_SHAPE, "data_offsets": [0, N_LAT * 128 * 4]},
                       "labels": {"dtype": "I64", "shape": [N_LAT], "data_offsets": [N_LAT * 128 * 4,
                                                                                       N_LAT * 128 * 4 + N_LAT * 8]}},
                      separators=(",", ":")).encode()


def shard_cases():
    good = shard()
    blob = f32(LAT_VALUES) + i64(LABELS)
    h = valid_header_json()
    nan_values, inf_values = list(LAT_VALUES), list(LAT_VALUES)
    for i in range(N_LAT):  # one in every sample: found whatever the data order
        nan_values[128 * i + (i * 13) % 128] = float("nan")
        inf_values[128 * i + (i * 29) % 128] = float("inf") if i % 2 else float("-inf")
    deep = b'{"latents":' + b"[" * 200000 + b"]" * 200000 + b"}"
    return {
        "valid": (good, False),
        "name-non-utf8": (shard(raw_header=h.replace(b'"latents"', b'"lat\xffents"')) , True),
        "meta-non-utf8": (shard(raw_header=b'{"__metadata__":{"num_classes":"\xfe\xff3"},' + h[1:]), True),
        "dtype-ctrl": (shard(raw_header=h.replace(b'"F32"', b'"\\u001b[31mF32\\u0007"')), True),
        "meta-ctrl": (shard(meta={"num_classes": "\x1b[2J3"}), True),
        "name-ctrl-only": (shard(raw_header=h.replace(b'"latents"', b'"\\u001b]0;pwned\\u0007"')), True),
        "header-length-2^64-1": (with_header_length(good, 2 ** 64 - 1), True),
        "header-length-2^63": (with_header_length(good, 2 ** 63), True),
        "header-length-100MiB+1": (with_header_length(good, (100 << 20) + 1), True),
        "header-length-past-eof": (with_header_length(good, len(good) - 7), True),
        "header-length-0": (with_header_length(good, 0), True),
        "header-deep-nesting": (safetensors_bytes([], raw_header=deep) + blob, True),
        "nan-value": (shard(latents=f32(nan_values)), True),
        "inf-value": (shard(latents=f32(inf_values)), True),
        "label-out-of-range": (shard(labels=i64([7] + LABELS[1:])), True),
        "label-negative": (shard(labels=i64([-1] + LABELS[1:])), True),
        "label-huge": (shard(labels=i64([2 ** 62] + LABELS[1:])), True),
        "labels-f32": (safetensors_bytes([("latents", "F32", LAT_SHAPE, f32(LAT_VALUES)),
                                          ("labels", "F32", [N_LAT], f32([float(x) for x in LABELS]) * 2)]), True),
        "offsets-overlap": (shard(raw_header=h.replace(b'"data_offsets":[%d,' % (N_LAT * 128 * 4),
                                                       b'"data_offsets":[%d,' % (N_LAT * 128 * 4 - 64))), True),
        "offsets-past-eof": (good[:-40], True),
        "shape-huge": (shard(raw_header=h.replace(b"[%d,2,8,8]" % N_LAT, b"[1099511627776,2,8,8]")), True),
        "shape-negative": (shard(raw_header=h.replace(b"[%d,2,8,8]" % N_LAT, b"[-16,2,8,8]")), True),
        "dtype-unknown": (shard(raw_header=h.replace(b'"F32"', b'"F128"')), True),
        "zero-samples": (safetensors_bytes([("latents", "F32", [0, 2, 8, 8], b""), ("labels", "I64", [0], b"")]), True),
        "wrong-sample-shape": (safetensors_bytes([("latents", "F32", [N_LAT, 2, 8, 7], f32(LAT_VALUES[:N_LAT * 112])),
                                                  ("labels", "I64", [N_LAT], i64(LABELS))]), True),
    }


def e_shard_case(name, data, refuse):
    def fn(ctx):
        path = ctx.p("shard.safetensors")
        write_bytes(path, data)
        res = ctx.run(latents_train(ctx, path), BOUND_S if refuse else RUN_S)
        if not refuse:
            return expect_ok(res, "training on a valid shard (the control case)")
        return expect_refused(res, names=[("shard.safetensors", "num_classes") if name.startswith("label-")
                                          else "shard.safetensors"])
    return fn


def e_shard_dir_mixed(ctx):
    d = ctx.p("shards")
    os.mkdir(d)
    write_bytes(os.path.join(d, "a.safetensors"), shard())
    write_bytes(os.path.join(d, "b.safetensors"),
                safetensors_bytes([("latents", "F32", [N_LAT, 2, 4, 4], f32(LAT_VALUES[:N_LAT * 32])),
                                   ("labels", "I64", [N_LAT], i64(LABELS))]))
    return expect_refused(ctx.run(latents_train(ctx, d), BOUND_S), names=["b.safetensors"])


def e_dev_zero(kind):
    def fn(ctx):
        args = latents_train(ctx, "/dev/zero") if kind == "latents" else fashion_train(ctx, "/dev/zero")
        return expect_refused(ctx.run(args, BOUND_S), names=["/dev/zero"])
    return fn


def bomb(ctx, header, members):
    return gzip.compress(header, mtime=0) + ctx.fx["bomb_member"] * members


def e_bomb_case(kind):
    def fn(ctx):
        if kind == "images-with-header":  # [60000, 28, 28] then 16 GiB of zeros
            d = fashion_dir(ctx, labels=labels_bytes(60000),
                            gz_images=bomb(ctx, idx_bytes([60000, 28, 28], b""), 256))
            name = "train-images-idx3-ubyte.gz"
        elif kind == "images-no-header":  # 16 GiB of zeros: the magic is wrong at byte 0
            d = fashion_dir(ctx, gz_images=bomb(ctx, b"", 256))
            name = "train-images-idx3-ubyte.gz"
        elif kind == "images-claims-10G":  # a header that asks for 10^7 images, then 16 GiB
            d = fashion_dir(ctx, labels=labels_bytes(64),
                            gz_images=bomb(ctx, idx_bytes([10_000_000, 28, 28], b""), 256))
            name = "train-images-idx3-ubyte.gz"
        else:  # labels: [60000] then 16 GiB
            d = fashion_dir(ctx, gz_labels=bomb(ctx, idx_bytes([64], bytes(64)), 256))
            name = "train-labels-idx1-ubyte.gz"
        res = ctx.run(fashion_train(ctx, d), BOUND_S, as_limit=BOMB_AS_LIMIT)
        return expect_refused(res, names=[name])
    return fn


def e_idx_cases():
    good = idx_bytes([64, 28, 28])
    gz_good = gzip.compress(good, mtime=0)
    img = "train-images-idx3-ubyte"
    lab = "train-labels-idx1-ubyte"
    return {
        # name: (images, labels, gz_images, file named, refused)
        "valid": (None, None, None, None, False),
        "valid-gz": (None, None, gz_good, None, False),
        "images-truncated@0": (b"", None, None, img, True),
        "images-truncated@3": (good[:3], None, None, img, True),
        "images-truncated@10": (good[:10], None, None, img, True),
        "images-truncated@mid-data": (good[:16 + 1000], None, None, img, True),
        "images-truncated@last-byte": (good[:-1], None, None, img, True),
        "images-gz-truncated": (None, None, gz_good[:len(gz_good) // 2], img, True),
        "images-gz-corrupt": (None, None, gz_good[:40] + b"\xff" * 64 + gz_good[104:], img, True),
        "images-wrong-magic": (b"PK" + good[2:], None, None, img, True),
        "images-float-type": (b"\x00\x00\x0d" + good[3:], None, None, img, True),
        "images-0-dims": (b"\x00\x00\x08\x00" + good[16:], None, None, img, True),
        "images-255-dims": (b"\x00\x00\x08\xff" + good[4:], None, None, img, True),
        "images-dims-2^31-1": (idx_bytes([0x7FFFFFFF, 28, 28], b""), None, None, img, True),
        "images-dims-2^32-1": (idx_bytes([0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], b""), None, None, img, True),
        "images-28x27": (idx_bytes([64, 28, 27]), None, None, img, True),
        "images-zero": (idx_bytes([0, 28, 28], b""), labels_bytes(0), None, (img, "fashion"), True),
        "images-trailing-garbage": (good + b"garbage", None, None, img, True),
        "labels-count-mismatch": (None, labels_bytes(63), None, lab, True),
        "labels-value-200": (None, idx_bytes([64], bytes([200]) + bytes(63)), None, lab, True),
        "labels-wrong-magic": (None, b"\x1b[31m" + labels_bytes(64)[5:], None, lab, True),
    }


def e_idx_case(images, labels, gz_images, named, refuse):
    def fn(ctx):
        d = fashion_dir(ctx, images=images, labels=labels, gz_images=gz_images)
        res = ctx.run(fashion_train(ctx, d), BOUND_S if refuse else RUN_S)
        if not refuse:
            return expect_ok(res, "training on a valid small idx set (the control case)")
        return expect_refused(res, names=[named])
    return fn


def e_cases(h):
    cases = []
    for name, (data, refuse) in shard_cases().items():
        cases.append(Case("E", f"shard {name}", e_shard_case(name, data, refuse), cost=2))
    cases.append(Case("E", "shard dir with mixed shapes", e_shard_dir_mixed, cost=2))
    cases.append(Case("E", "latents /dev/zero", e_dev_zero("latents"), cost=1))
    cases.append(Case("E", "fashion-mnist /dev/zero", e_dev_zero("fashion"), cost=1))
    for kind in ("images-with-header", "images-no-header", "images-claims-10G", "labels"):
        cases.append(Case("E", f"gzip bomb {kind}", e_bomb_case(kind), cost=8, heavy=True))
    for name, args in e_idx_cases().items():
        cases.append(Case("E", f"idx {name}", e_idx_case(*args), cost=2))
    return cases


# ---------------------------------------------------------------------------
# F. Signals


def check_stopped_run(ctx, run_dir, res, sig):
    """A run stopped by sig after it started training: exit 128+sig, a final checkpoint that verifies."""
    fails = clean(res)
    ok_codes = {128 + sig} | ({128 + signal.SIGTERM} if sig == signal.SIGHUP else set())
    if res.rc not in ok_codes:
        return fails + [f"exit {res.rc if res.rc >= 0 else signame(-res.rc)}, expected "
                        f"{' or '.join(map(str, sorted(ok_codes)))} after saving"]
    steps, torn = metrics_steps(run_dir)
    fails += torn
    step, bad = latest_step(run_dir)
    fails += bad
    if step is None and not bad:
        fails.append("no checkpoint after the stop")
    elif step is not None and steps and step != steps[-1]:
        fails.append(f"the final checkpoint is step {step} but metrics.jsonl ends at step {steps[-1]}")
    report = os.path.join(run_dir, "report.md")
    if not os.path.isfile(report):
        fails.append("no report.md after the stop")
    v = ctx.verify(run_dir)
    if v.rc != 0:
        fails.append(f"verify after the stop: {show(v.err_lines[-1] if v.err_lines else v.out[-200:])}")
    return fails


def f_case(sig, moment, seed, ckpt_every=1000, twice=False):
    def fn(ctx):
        rnd = random.Random(seed)
        run_dir = ctx.p("runs", "r")
        p = ctx.spawn(tiny_train(ctx.p("runs"), "r", 1000000, ckpt_every=ckpt_every), "train")
        try:
            if moment == "early":
                time.sleep(rnd.uniform(0.02, 0.4))
            else:
                if not wait_for(lambda: metrics_steps(run_dir)[0], RUN_S) or not p.running():
                    return ["the run did not start training"] + clean(p.wait(5))
                time.sleep(rnd.uniform(0.0, 1.5))
            started = bool(metrics_steps(run_dir)[0])
            p.signal(sig)
            if twice:
                time.sleep(rnd.uniform(0.0, 0.2))
                p.signal(sig)
            res = p.wait(RUN_S)
        finally:
            p.kill()
        if twice:  # the second signal exits at once: nothing torn, a resume goes on
            fails = clean(res)
            if res.rc not in (128 + sig, -sig):
                fails.append(f"exit {res.rc}, expected {128 + sig}")
            fails += metrics_steps(run_dir)[1] + latest_step(run_dir)[1]
            step = latest_step(run_dir)[0]
            if step is not None:
                r = ctx.run(resume_args(run_dir, step + 2), RUN_S)
                fails += [f"resume after two signals: {f}" for f in expect_ok(r, "the resume")]
                fails += [f"leftover after the resume: {x}" for x in leftovers(run_dir)[:2]]
            return fails
        if not started:
            # Before training started: ending by the signal is fine; nothing half-written.
            fails = clean(res)
            if res.rc not in (-sig, 128 + sig) and not (sig == signal.SIGHUP and res.rc == 143):
                fails.append(f"exit {res.rc} after an early {signame(sig)}")
            if os.path.isdir(run_dir) and latest_step(run_dir)[0] is not None:
                v = ctx.verify(run_dir)
                if v.rc != 0:
                    fails.append(f"verify: {show(v.err_lines[-1] if v.err_lines else b'')}")
            return fails + latest_step(run_dir)[1] + metrics_steps(run_dir)[1]
        return check_stopped_run(ctx, run_dir, res, sig)
    return fn


def f_cases(h, seed):
    cases = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        for k in range(3):
            cases.append(Case("F", f"{sig.name} mid-run #{k + 1}", f_case(sig, "mid", seed * 100 + sig * 10 + k), cost=6))
        cases.append(Case("F", f"{sig.name} during saves", f_case(sig, "mid", seed * 100 + sig * 10 + 5, ckpt_every=1),
                          cost=6))
        cases.append(Case("F", f"{sig.name} at start-up", f_case(sig, "early", seed * 100 + sig * 10 + 7), cost=3))
    for sig in (signal.SIGINT, signal.SIGTERM):
        cases.append(Case("F", f"{sig.name} twice", f_case(sig, "mid", seed * 100 + sig * 10 + 9, ckpt_every=1,
                                                              twice=True), cost=6))
    return cases


# ---------------------------------------------------------------------------
# G. kill -9 trials


# The temporaries of the run's own writers, which its next trainer removes:
# the atomic writer's ".<name>.tmp.<pid>.<n>.<k>" at the top of the run, a save's
# or a prune's "ckpt/.step_<step>.tmp.<pid>" and "ckpt/.step_<step>.old.<pid>".
OWN_TEMP = re.compile(r"^(?:\.[^/]+\.tmp\.\d+\.\d+\.\d+|ckpt/\.step_\d+\.(?:tmp|old)\.\d+)$")


def g_trial(i, seed):
    def fn(ctx):
        rnd = random.Random(seed * 100003 + i)
        runs = ctx.p("runs")
        run_dir = os.path.join(runs, "k")
        args = tiny_train(runs, "k", KILL_STEPS, ckpt_every=1)
        # One trial in eight is killed while starting up; the others at a moment
        # of the run from when its directory appears (where the saves are).
        p = ctx.spawn(args, "first")
        if rnd.random() < 0.125:
            delay = rnd.uniform(0.0, ctx.fx["ref_dir_secs"])
        else:
            wait_for(lambda: os.path.isdir(run_dir) or not p.running(), RUN_S, every=0.005)
            delay = time.monotonic() - p.start + rnd.uniform(0.0, ctx.fx["ref_run_secs"])
        time.sleep(max(0.0, p.start + delay - time.monotonic()))
        p.signal(signal.SIGKILL)
        first = p.wait(RUN_S)
        fails = [f"first run: {f}" for f in clean(first)]
        # After the kill: latest complete and verified, metrics whole.
        step, bad = latest_step(run_dir)
        fails += bad + metrics_steps(run_dir)[1]
        ctx.notes.append("before the run directory" if not os.path.isdir(run_dir)
                         else "mid-save (a leftover)" if leftovers(os.path.join(run_dir, "ckpt"))
                         else "before the first checkpoint" if step is None
                         else "after the last step" if step == KILL_STEPS else "between checkpoints")
        if step is not None:
            v = ctx.verify(run_dir)
            if v.rc != 0:
                fails.append(f"verify after kill -9 at {delay:.2f} s: {show(v.err_lines[-1] if v.err_lines else v.out[-200:])}")
        if fails:
            return fails
        # The next start: resume (or start afresh when no checkpoint was made;
        # nothing to do when the run had finished before the kill).
        if step != KILL_STEPS:
            r = ctx.run(resume_args(run_dir, KILL_STEPS) if step is not None else args, RUN_S)
            fails += [f"{'resume' if step is not None else 'restart'} after kill -9 at {delay:.2f} s: {f}"
                      for f in expect_ok(r, "the next start")]
            if fails:
                return fails
        left = leftovers(run_dir)
        if step == KILL_STEPS:
            # Killed after its last checkpoint, while pruning an older one or
            # writing segments.jsonl or the report: no next start follows, and
            # the temporary the kill left is one the next trainer of the run
            # removes (docs/guide/reliability.md); nothing can remove it sooner.
            left = [x for x in left if not OWN_TEMP.match(x)]
        fails += [f"leftover after the next start: {x}" for x in left[:2]]
        final, bad = latest_step(run_dir)
        fails += bad
        steps, torn = metrics_steps(run_dir)
        fails += torn
        if final != KILL_STEPS:
            fails.append(f"ended at step {final}, not {KILL_STEPS}")
        elif not steps or not set(steps) <= set(range(1, KILL_STEPS + 1)):
            fails.append(f"metrics.jsonl steps {steps}, expected increasing steps within 1..{KILL_STEPS}")
        elif crc_record(run_dir, final) != ctx.fx["ref_crc"]:
            fails.append(f"final weights differ from the uninterrupted run (kill at {delay:.2f} s, "
                         f"resumed from step {step}): data mixed or resume not exact")
        else:
            v = ctx.verify(os.path.join(run_dir, "ckpt", f"step_{final:08d}"))
            if v.rc != 0:
                fails.append(f"verify of the final checkpoint: {show(v.err_lines[-1] if v.err_lines else b'')}")
        return fails
    return fn


def g_cases(h, trials, seed):
    return [Case("G", f"kill -9 trial {i + 1:02d}", g_trial(i, seed), cost=9) for i in range(trials)]


# ---------------------------------------------------------------------------
# H. Environment


def h_deleted_cwd(command_args, expect):
    def fn(ctx):
        gone = ctx.p("gone")
        os.mkdir(gone)
        argv = [a.replace("{dir}", ctx.dir).replace("{src}", ctx.fx["src"]) for a in command_args]
        # cd into it, remove it, then exec perftrain there.
        sh = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
        res = run(["/bin/sh", "-c", sh, "sh", gone, ctx.bin] + argv, RUN_S)
        fails = expect_refused(res) if expect == "refuse" else expect_any(res)
        # libtorch's initialisers (MKL) cannot load without a current
        # directory, so perftrain refuses every command there before they run
        # (docs/guide/reliability.md, "The working directory"): that one
        # line, exit 2, is the documented answer even when no path is relative.
        if expect == "ok" and res.rc == 2 and not fails and CWD_REFUSAL in res.err:
            return fails
        if expect == "ok" and res.rc != 0:
            fails.append(f"failed from a deleted directory although nothing relative was asked: "
                         f"{show(res.err_lines[-1] if res.err_lines else b'')}")
        return fails
    return fn


CWD_REFUSAL = b"perftrain: cannot read the current directory: it was deleted"


def as_nobody_possible():
    return os.geteuid() != 0 or shutil.which("setpriv") is not None


def h_unwritable_runs(ctx):
    runs = ctx.p("ro")
    os.mkdir(runs)
    os.chmod(ctx.dir, 0o755)
    os.chmod(runs, 0o555)
    user = 65534 if os.geteuid() == 0 else None
    res = run([ctx.bin] + tiny_train(runs, "r", 2), RUN_S, cwd="/", user=user)
    fails = expect_refused(res, names=[runs])
    if os.listdir(runs):
        fails.append(f"left {show(os.listdir(runs)[0])} in the unwritable runs directory")
    return fails


def h_readonly_run(ctx):
    run_dir = ctx.copy_run("R")
    for dirpath, dirnames, filenames in os.walk(ctx.dir):
        os.chmod(dirpath, 0o755)
    before = snapshot(run_dir)
    user = 65534 if os.geteuid() == 0 else None
    if user is None:
        for dirpath, dirnames, filenames in os.walk(run_dir):
            os.chmod(dirpath, 0o555)
    res = run([ctx.bin] + resume_args(run_dir), RUN_S, cwd="/", user=user)
    if user is None:
        for dirpath, dirnames, filenames in os.walk(run_dir):
            os.chmod(dirpath, 0o755)
    return expect_refused(res, names=[run_dir]) + snapshot_diff(before, snapshot(run_dir), "the read-only run")


def h_runs_dir_is_file(ctx):
    f = ctx.p("file.txt")
    write_bytes(f, b"not a directory\n")
    res = ctx.run(tiny_train(f, "r", 2), RUN_S)
    fails = expect_refused(res, names=["file.txt"])
    if open(f, "rb").read() != b"not a directory\n":
        fails.append("the file given as --runs-dir changed")
    return fails


def h_env_case(env_extra, drop=()):
    def fn(ctx):
        env = base_env(env_extra)
        for k in drop:
            env.pop(k, None)
        res = run([ctx.bin] + tiny_train(ctx.p("runs"), "r", 2), RUN_S, cwd=ctx.dir, env=env)
        return expect_ok(res, "a tiny run")
    return fn


def h_cases(h):
    tiny_rel = tiny_train("runs", "r", 2)
    tiny_abs = tiny_train("{dir}/runs", "r", 2)
    cases = [
        Case("H", "deleted cwd: train --runs-dir runs (relative)", h_deleted_cwd(tiny_rel, "refuse"), cost=2),
        Case("H", "deleted cwd: train --runs-dir <absolute>", h_deleted_cwd(tiny_abs, "ok"), cost=3),
        Case("H", "deleted cwd: config", h_deleted_cwd(["config", "--device", "cpu"], "any"), cost=1),
        Case("H", "deleted cwd: models", h_deleted_cwd(["models"], "ok"), cost=1),
        Case("H", "deleted cwd: verify relative", h_deleted_cwd(["verify", "runs/r"], "refuse"), cost=1),
        Case("H", "deleted cwd: verify <absolute>", h_deleted_cwd(["verify", "{src}"], "ok"), cost=1),
        Case("H", "deleted cwd: sample --out relative",
             h_deleted_cwd(["sample", "--ckpt", "{src}", "--device", "cpu", "--classes", "1", "--per-class", "1",
                            "--steps", "1", "--out", "s.png"], "refuse"), cost=2),
        Case("H", "deleted cwd: bench (default --out)",
             h_deleted_cwd(["bench", "--device", "cpu", "--model", "DiT-T/4", "--batch", "2", "--steps", "1",
                            "--warmup", "0", "--variants", "eager-fp32", "--image-size", "8"], "refuse"), cost=2),
        Case("H", "runs dir is a regular file", h_runs_dir_is_file, cost=2),
        Case("H", "TMPDIR missing", h_env_case({"TMPDIR": "/nonexistent/tmp"}), cost=3),
        Case("H", "HOME unset", h_env_case({}, drop=("HOME",)), cost=3),
    ]
    if as_nobody_possible():
        cases += [Case("H", "unwritable runs dir", h_unwritable_runs, cost=2),
                  Case("H", "read-only run directory: resume", h_readonly_run, cost=2)]
    return cases


# ---------------------------------------------------------------------------
# Main


def fixture_check(ctx):
    """The shared source run that cases read (sample, verify) is unchanged."""
    return snapshot_diff(ctx.fx["src_snapshot"], snapshot(ctx.fx["src"]), "the shared source run")


def prepare_work(work):
    if os.path.exists(work):
        if os.listdir(work) and not os.path.exists(os.path.join(work, WORK_MARKER)):
            sys.exit(f"hostile_run: {work} exists and was not made by this tool; give an empty or new --work")
        for dirpath, dirnames, filenames in os.walk(work):  # read-only leftovers of an earlier run
            os.chmod(dirpath, 0o755)
        shutil.rmtree(work)
    os.makedirs(os.path.join(work, "cases"))
    write_bytes(os.path.join(work, WORK_MARKER), b"made by tools/hostile_run.py; removed by its next run\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the perftrain binary")
    ap.add_argument("--work", required=True, help="scratch directory (wiped when it holds an earlier run)")
    ap.add_argument("--kill-trials", type=int, default=90)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="ABCDEFGH", help="categories to run, e.g. C or A,B")
    ap.add_argument("--match", default=None, help="only cases whose name matches this regex")
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--json", default=None, help="write every case's result here")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", action="store_true", help="keep the directories of cases that held")
    ap.add_argument("--verbose", action="store_true", help="print a line per case that held too")
    args = ap.parse_args()
    cats = set(args.only.replace(",", "").upper())
    if not cats <= set("ABCDEFGH"):
        ap.error("--only takes letters A to H")
    if not os.access(args.bin, os.X_OK):
        ap.error(f"--bin {args.bin} is not an executable")
    # Every case's process starts with the signals' default actions, whatever
    # this ran under (nohup ignores SIGHUP, a script's background job SIGINT):
    # perftrain keeps a signal that was ignored at its start ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    start = time.monotonic()
    h = Harness(args)
    prepare_work(h.work)
    h.build_fixtures(cats)
    builders = {"A": a_cases, "B": b_cases, "C": c_cases, "D": d_cases, "E": e_cases,
                "F": lambda h: f_cases(h, args.seed), "G": lambda h: g_cases(h, args.kill_trials, args.seed),
                "H": h_cases}
    cases = [c for cat in sorted(cats) for c in builders[cat](h)]
    if args.match:
        cases = [c for c in cases if re.search(args.match, f"{c.cat} {c.name}")]
    if "src" in h.fixtures:
        cases.append(Case("-", "shared source run unchanged", fixture_check, cost=0))
    names = [c.name for c in cases]
    dups = sorted({n for n in names if names.count(n) > 1})
    assert not dups, f"case names must be unique: {dups[:5]}"
    if args.list:
        for c in cases:
            print(f"{c.cat} {c.name}")
        return 0
    fixture = [c for c in cases if c.cat == "-"]
    h.execute([c for c in cases if c.cat != "-"])
    h.execute(fixture)  # after every case that reads the source run
    # The table
    rows = {}
    for c in cases:
        r = rows.setdefault(c.cat, [0, 0, 0])
        r[0] += 1
        r[1 if not c.fails else 2] += 1
    print(f"\n{'category':<40} {'cases':>6} {'held':>6} {'failed':>6}")
    titles = {"A": "A CLI values", "B": "B --set key=value", "C": "C checkpoint corruption",
              "D": "D run-directory manipulations", "E": "E data files", "F": "F signals",
              "G": "G kill -9 trials", "H": "H environment", "-": "- fixture integrity"}
    for cat in sorted(rows, key=lambda k: "Z" if k == "-" else k):
        n, held, failed = rows[cat]
        print(f"{titles[cat]:<40} {n:>6} {held:>6} {failed:>6}")
    total = [sum(r[i] for r in rows.values()) for i in range(3)]
    print(f"{'total':<40} {total[0]:>6} {total[1]:>6} {total[2]:>6}")
    kills = [c.notes[0] for c in cases if c.cat == "G" and c.notes]
    if kills:
        where = {k: kills.count(k) for k in sorted(set(kills))}
        print("kill -9 landed: " + ", ".join(f"{k} {n}" for k, n in where.items()))
    print(f"({time.monotonic() - start:.0f} s, {args.jobs} jobs, seed {args.seed}, {h.bin})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"binary": h.bin, "seed": args.seed, "seconds": round(time.monotonic() - start, 1),
                       "counts": {titles[k]: dict(zip(("cases", "held", "failed"), v)) for k, v in rows.items()},
                       "cases": [{"category": c.cat, "name": c.name, "held": not c.fails, "failures": c.fails,
                                  "notes": c.notes, "seconds": round(c.secs, 2)} for c in cases]}, f, indent=1)
    return 1 if total[2] else 0


if __name__ == "__main__":
    sys.exit(main())

"""A stand-in for the wandb package in the tests of perftrain's W&B sidecar
(tools/wandb_sidecar.py): it records each call as a JSON line in the file
$FAKE_WANDB_CALLS. $FAKE_WANDB_MODE changes what it does:
  missing      importing it fails as a missing package does
  die_on_log   the first wandb.log ends the process (exit status 7)
  stall        the first wandb.log sleeps for an hour (a sidecar that is behind)
"""
import json
import os
import time

MODE = os.environ.get("FAKE_WANDB_MODE", "")
if MODE == "missing":
    raise ImportError("No module named 'wandb'")


def _record(call, **kwargs):
    with open(os.environ["FAKE_WANDB_CALLS"], "a") as f:
        f.write(json.dumps({"call": call, **kwargs}) + "\n")


class Image:
    def __init__(self, path):
        self.path = path


class _Run:
    pass


def init(**kwargs):
    _record("init", **kwargs)
    return _Run()


def log(data, step=None):
    if MODE == "die_on_log":
        os._exit(7)
    if MODE == "stall":
        time.sleep(3600)
    _record("log", data={k: (v.path if isinstance(v, Image) else v) for k, v in data.items()}, step=step)


def finish(exit_code=0):
    _record("finish", exit_code=exit_code)

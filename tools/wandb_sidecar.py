"""The Weights & Biases sidecar of `perftrain train` (log.wandb = offline | online).

The trainer starts it with one end of a Unix socket pair as standard input and
talks to it in JSON lines; the training loop never waits for it (it drops
lines it cannot hand over at once). The sidecar answers once, on the same
socket: "ready" once `import wandb` worked, or "error <why>" and exit status 3.
Then, one object a line:
  {"init": {"mode", "project", "name", "id", "dir", "config", "resume"}}  wandb.init
  {"log": {"step": N, "values": {tag: number}}}                          wandb.log
  {"image": {"step": N, "tag": T, "path": PNG}}                          wandb.log with a wandb.Image
  {"finish": {"exit_code": 0 or 1}}                                      wandb.finish
End of input without "finish" (the trainer died) finishes the run with exit code 1.
From "init" on, its own output goes to <dir>/wandb_sidecar.log. SIGINT and
SIGTERM are ignored: the trainer's stop closes the socket, and the run is
finished in order.
"""
import json
import math
import os
import signal
import sys


def answer(text):
    os.write(0, (text + "\n").encode())


def finite_or_none(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import wandb
    except Exception as e:  # ImportError, or a broken install
        answer("error " + (str(e).splitlines() or ["import failed"])[0])
        return 3
    answer("ready")
    run = None
    with os.fdopen(0, "rb", closefd=False) as lines:
        for raw in lines:
            msg = json.loads(raw)
            if "init" in msg:
                a = msg["init"]
                log = os.open(os.path.join(a["dir"], "wandb_sidecar.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
                os.dup2(log, 1)
                os.dup2(log, 2)
                run = wandb.init(mode=a["mode"], project=a["project"], name=a["name"], id=a["id"], dir=a["dir"],
                                 config=a["config"], resume="allow" if a["resume"] else None)
            elif "log" in msg and run is not None:
                values = {k: finite_or_none(v) for k, v in msg["log"]["values"].items()}
                wandb.log({k: v for k, v in values.items() if v is not None}, step=msg["log"]["step"])
            elif "image" in msg and run is not None:
                a = msg["image"]
                wandb.log({a["tag"]: wandb.Image(a["path"])}, step=a["step"])
            elif "finish" in msg and run is not None:
                wandb.finish(exit_code=msg["finish"]["exit_code"])
                return 0
    if run is not None:
        wandb.finish(exit_code=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

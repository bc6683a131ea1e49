"""The run's loggers read back by the tools teams use (docs/guide/training.md, Logging).

A short CPU `perftrain train` with TensorBoard, MLflow (log.mlflow) and W&B
(log.wandb = offline, the fake wandb module of tests/support/fake_wandb on
PYTHONPATH, recording its calls), then a resume of it:
  - TensorBoard's EventAccumulator finds the resolved config as hparams (the
    hparams plugin's HParamsPluginData: experiment, session_start_info with
    every key of config.toml and its value, session_end_info) and as the text
    summary "config";
  - MLflow: MlflowClient(tracking_uri="file:...") lists the run, its params
    and the metric history of train/loss equal to metrics.jsonl, the resume
    in the same run (where the mlflow package is importable; else the same
    from the files, and the test says so);
  - W&B: wandb.init with the resolved config, wandb.log of every metrics line,
    wandb.finish; the resume's init with the same id; the real wandb package
    in offline mode where it is importable;
  - no wandb package: exit 2, one line naming log.wandb, no run directory.

Run:  .venv/bin/python tests/python/test_loggers.py [path/to/perftrain]
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import tomllib

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "perftrain")
FAKE = os.path.join(ROOT, "tests", "support", "fake_wandb")
TINY = ["--device", "cpu", "--data", "synthetic", "--set", "data.synthetic_size=64", "--batch-size", "4",
        "--set", "model.depth=2", "--set", "model.hidden=32", "--set", "model.heads=2", "--set", "model.patch=8",
        "--set", "log.sample_per_class=2", "--set", "diffusion.sample_steps=1", "--set", "log.sample_classes=3",
        "--set", "log.every=2", "--set", "health.monitor_every=2"]


def perftrain(args, env_extra):
    env = dict(os.environ, **env_extra)
    return subprocess.run([BINARY, "train"] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)


def fake_env(calls, mode=""):
    return {"PYTHONPATH": FAKE, "FAKE_WANDB_CALLS": calls, "FAKE_WANDB_MODE": mode}


def metrics_lines(run):
    return [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]


def check_tensorboard(run):
    acc = EventAccumulator(os.path.join(run, "tb"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    config = tomllib.load(open(os.path.join(run, "config.toml"), "rb"))
    expected = {f"{s}.{k}": v for s, table in config.items() for k, v in table.items()}
    content = acc.PluginTagToContent("hparams")
    assert set(content) == {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"}, content
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert set(start.hparams) == set(expected), set(expected) ^ set(start.hparams)
    for key, want in expected.items():
        got = start.hparams[key]
        kind = got.WhichOneof("kind")
        if isinstance(want, bool):
            assert kind == "bool_value" and got.bool_value == want, (key, got)
        elif isinstance(want, (int, float)):
            assert kind == "number_value" and got.number_value == float(want), (key, got, want)
        else:
            assert kind == "string_value" and got.string_value == want, (key, got, want)
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [h.name for h in experiment.hparam_infos] == list(expected)
    assert [m.name.tag for m in experiment.metric_infos] == ["train/loss"]
    end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"]).session_end_info
    assert end.status == 1, end  # STATUS_SUCCESS
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert acc.SummaryMetadata("config").plugin_data.plugin_name == "text"
    assert text == "".join("    " + l + "\n" for l in open(os.path.join(run, "config.toml")).read().splitlines())
    print("tensorboard: %d hparams, the config text, status success" % len(expected))


def mlflow_client(tracking):
    try:
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 keeps the file store behind this switch
        from mlflow.tracking import MlflowClient
    except ImportError:
        return None
    return MlflowClient(tracking_uri="file:" + tracking)


def check_mlflow(tracking, run, lines):
    config = tomllib.load(open(os.path.join(run, "config.toml"), "rb"))
    losses = [(l["step"], l["loss"]) for l in lines if "loss" in l]
    client = mlflow_client(tracking)
    if client is None:
        print("mlflow: the package is not importable here: checked the files only")
        experiments = [d for d in os.listdir(tracking) if d != "0"]
        assert len(experiments) == 1, experiments
        exp_dir = os.path.join(tracking, experiments[0])
        assert "name: 'tiny'" in open(os.path.join(exp_dir, "meta.yaml")).read()
        runs = [d for d in os.listdir(exp_dir) if d != "meta.yaml"]
        assert len(runs) == 1, runs
        run_dir = os.path.join(exp_dir, runs[0])
        assert float(open(os.path.join(run_dir, "params", "train.lr")).read()) == config["train"]["lr"]
        history = [l.split() for l in open(os.path.join(run_dir, "metrics", "train", "loss"))]
        got = [(int(s), float(v)) for _, v, s in history]
        assert "status: 3" in open(os.path.join(run_dir, "meta.yaml")).read()
    else:
        experiment = client.get_experiment_by_name("tiny")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        assert len(runs) == 1, runs
        r = runs[0]
        assert r.info.status == "FINISHED", r.info
        assert r.info.run_name == os.path.basename(run), r.info
        assert float(r.data.params["train.lr"]) == config["train"]["lr"], r.data.params
        assert r.data.params["model.name"] == config["model"]["name"]
        assert int(r.data.params["train.steps"]) == config["train"]["steps"]
        got = [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "train/loss")]
        print("mlflow: MlflowClient read the run, %d params, %d loss points" % (len(r.data.params), len(got)))
    got.sort()
    assert [s for s, _ in got] == [s for s, _ in losses], (got, losses)
    for (_, a), (_, b) in zip(got, losses):
        assert math.isclose(a, b, rel_tol=1e-12), (a, b)


def check_fake_wandb(calls_path, run, lines, resumed_from=None):
    calls = [json.loads(l) for l in open(calls_path)]
    inits = [c for c in calls if c["call"] == "init"]
    finishes = [c for c in calls if c["call"] == "finish"]
    assert len(inits) == (2 if resumed_from else 1) and len(finishes) == len(inits), calls
    init = inits[-1]
    config = tomllib.load(open(os.path.join(run, "config.toml"), "rb"))
    assert init["mode"] == "offline" and init["project"] == "perftrain" and init["dir"] == run, init
    assert init["config"]["train.lr"] == config["train"]["lr"] and init["config"]["model.name"] == config["model"]["name"]
    assert init["id"] == open(os.path.join(run, "wandb_run_id")).read().strip()
    if resumed_from:
        assert inits[0]["id"] == init["id"] and init["resume"] == "allow", inits
    logged = {(c["step"], c["data"]["train/loss"]) for c in calls if c["call"] == "log" and "train/loss" in c["data"]}
    for l in lines:
        if "loss" in l:
            assert (l["step"], l["loss"]) in logged, (l, logged)
    assert all(c["exit_code"] == 0 for c in finishes), finishes
    print("wandb (fake): init with %d config keys, %d log calls" % (len(init["config"]),
                                                                     sum(c["call"] == "log" for c in calls)))


def test_tensorboard_mlflow_wandb_and_resume():
    with tempfile.TemporaryDirectory() as tmp:
        runs, tracking, calls = os.path.join(tmp, "runs"), os.path.join(tmp, "mlruns"), os.path.join(tmp, "calls.jsonl")
        args = TINY + ["--runs-dir", runs, "--run-name", "r", "--set", "log.mlflow=" + tracking,
                       "--set", "log.mlflow_experiment=tiny", "--set", "log.wandb=offline"]
        r = perftrain(args + ["--steps", "4"], fake_env(calls))
        assert r.returncode == 0, r.stdout
        assert "\nlogging to: metrics.jsonl, tensorboard, mlflow, wandb\n" in r.stdout, r.stdout
        run = os.path.join(runs, "r")
        check_tensorboard(run)
        check_mlflow(tracking, run, metrics_lines(run))
        check_fake_wandb(calls, run, metrics_lines(run))
        r = perftrain(["--resume", run, "--steps", "8"], fake_env(calls))
        assert r.returncode == 0, r.stdout
        lines = metrics_lines(run)
        assert [l["step"] for l in lines if "loss" in l] == [2, 4, 6, 8], lines
        check_mlflow(tracking, run, lines)
        check_fake_wandb(calls, run, lines, resumed_from=run)


def test_no_wandb_package_is_a_start_up_error():
    with tempfile.TemporaryDirectory() as tmp:
        calls = os.path.join(tmp, "calls.jsonl")
        r = perftrain(TINY + ["--runs-dir", os.path.join(tmp, "runs"), "--run-name", "r", "--steps", "2",
                              "--set", "log.wandb=online"], fake_env(calls, "missing"))
        assert r.returncode == 2, r.stdout
        errors = [l for l in r.stdout.splitlines() if "log.wandb" in l]
        assert len(errors) == 1 and "needs the wandb Python package" in errors[0], r.stdout
        assert not os.path.exists(os.path.join(tmp, "runs", "r")), os.listdir(os.path.join(tmp, "runs"))
        print("no wandb:", errors[0])


def test_real_wandb_offline():
    try:
        import wandb  # noqa: F401
    except ImportError:
        print("wandb: the package is not importable here: the real package not run")
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = {"WANDB_SILENT": "true", "WANDB_DIR": tmp}
        r = perftrain(TINY + ["--runs-dir", os.path.join(tmp, "runs"), "--run-name", "r", "--steps", "2",
                              "--set", "log.wandb=offline"], env)
        assert r.returncode == 0, r.stdout
        wandb_dir = os.path.join(tmp, "runs", "r", "wandb")
        offline = [d for d in os.listdir(wandb_dir) if d.startswith("offline-run-")]
        assert len(offline) == 1, os.listdir(wandb_dir)
        run_id = open(os.path.join(tmp, "runs", "r", "wandb_run_id")).read().strip()
        assert offline[0].endswith("-" + run_id), (offline, run_id)
        assert os.path.getsize(os.path.join(wandb_dir, offline[0], "run-%s.wandb" % run_id)) > 0
        print("wandb (real, offline):", offline[0])


if __name__ == "__main__":
    test_no_wandb_package_is_a_start_up_error()
    test_tensorboard_mlflow_wandb_and_resume()
    test_real_wandb_offline()
    print("ok")

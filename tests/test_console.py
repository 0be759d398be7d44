"""A quiet console: a job prints our own lines only; library INFO (orbax / absl /
TensorFlow / XLA) and the gin context of an error go to MODEL_DIR/run.log; `--verbosity=2` brings
library INFO back to the console; the error is the last line printed, exit 1 (2 for bad config)."""
import os
import subprocess
import sys

import pytest
from hf_models import make_t5
from run_utils import gin_file_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = ("INFO", "absl", "I0000", "oneDNN", "cuInit", "cuda", "TPU", "In call to configurable")


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("t5"))
    make_t5(path, "1.1")
    return path


def _job(t5_dir, model_dir, data_dir, *extra):
    cmd = [sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/tiny_t5_nli.gin"), f"--gin.MODEL_PATH='{t5_dir}'",
           f"--gin.MODEL_DIR='{model_dir}'", f"--gin.DATA_DIR='{data_dir}'", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("SENTEMB_TRACEBACK", "TF_CPP_MIN_LOG_LEVEL")}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def test_training_job_is_quiet_and_logs_everything(t5_dir, tmp_path, data_dir):
    run = tmp_path / "run"
    # Dropout off: what the console shows does not depend on it, and it is half of the step's compile.
    no_dropout = "--gin.sentemb_jax.TowerConfig.config_overrides={'dropout_rate': 0.0}"
    proc = _job(t5_dir, run, data_dir, "--gin.sentemb_jax.RunConfig.num_steps=2", no_dropout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert not [n for n in NOISE if n in console], console[-3000:]
    log = (run / "run.log").read_text()
    assert "python -m sentemb_jax.main --gin_file=gin/models/local.gin --gin_file=gin/runs/tiny_t5_nli.gin" in log.splitlines()[0]
    assert "INFO absl:" in log and "Saving checkpoint at step 2" in log  # orbax's chatter kept in the file

    # A rerun with --verbosity=2 resumes: our line and the library INFO lines are on the console.
    proc = _job(t5_dir, run, data_dir, "--gin.sentemb_jax.RunConfig.num_steps=3", no_dropout, "--verbosity=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {run} at step 2" in proc.stderr
    assert "absl: INFO:" in proc.stderr
    log = (run / "run.log").read_text()
    assert log.count("==== ") == 2 and "Saving checkpoint at step 3" in log  # appended, one header per run


def test_error_is_the_last_line_and_gin_context_goes_to_the_log(t5_dir, tmp_path, data_dir):
    run = tmp_path / "run"
    missing = tmp_path / "no_such_model"
    proc = _job(missing, run, data_dir)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {missing}: no such model directory"), proc.stderr[-3000:]
    assert lines[-2].startswith("log: ") and lines[-2].endswith(".log")
    assert not [n for n in NOISE if n in proc.stdout + proc.stderr], proc.stderr[-3000:]
    assert not run.exists()  # refused before any work: no MODEL_DIR created, the log kept beside the cache
    log = open(lines[-2][len("log: "):]).read()
    assert "In call to configurable 'train'" in log and "Traceback (most recent call last)" in log

    # An existing run's directory gets the log of a refused attempt appended (nothing else).
    run.mkdir()
    proc = _job(missing, run, data_dir)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-2] == f"log: {run}/run.log"
    assert os.listdir(run) == ["run.log"] and "In call to configurable 'train'" in (run / "run.log").read_text()


def test_bad_configuration_exit_2_error_last(tmp_path, capsys):
    from sentemb_jax import main as runner

    assert runner.main([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--verbosity=loud"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --verbosity=loud: must be 0")
    assert runner.main([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--gin.sentemb_jax.evaluate_stsb.split=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: gin configuration error: sentemb_jax.evaluate_stsb.split = 3: expected str")


def test_gin_context_is_split_from_the_message():
    from sentemb_jax.main import split_gin_context

    message = "x: no such file\n  In call to configurable 'train' (<function train at 0x1>)\n  In call to configurable 'run' (<f>)"
    assert split_gin_context(message) == ("x: no such file", ["  In call to configurable 'train' (<function train at 0x1>)",
                                                             "  In call to configurable 'run' (<f>)"])

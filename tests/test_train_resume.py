"""The train loop: a run killed with SIGKILL and restarted ends equal to an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hf_models import make_t5
from run_utils import latest_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(model_path, model_dir, data_dir):
    return [sys.executable, "-m", "sentemb_jax.main", "--gin_file=gin/runs/tiny_t5_nli.gin",
            f"--gin.MODEL_PATH='{model_path}'", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.DATA_DIR='{data_dir}'"]


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("t5"))
    make_t5(path, "1.1")
    return path


# Unpacked batches: test_robustness.py kills such a run five times (once mid checkpoint write).
@pytest.mark.parametrize("pack", [True])
def test_sigkill_then_resume_equals_uninterrupted(t5_dir, tmp_path, data_dir, pack):
    cmd = lambda d: _cmd(t5_dir, d, data_dir) + [f"--gin.sentemb_jax.train.pack={pack}"]  # noqa: E731
    full = str(tmp_path / "full")
    subprocess.run(cmd(full), cwd=REPO, check=True, capture_output=True, timeout=600)
    killed = str(tmp_path / "killed")
    proc = subprocess.Popen(cmd(killed), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not os.path.isdir(os.path.join(killed, "checkpoints", "4")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    manager = ocp.CheckpointManager(os.path.join(killed, "checkpoints"))
    assert manager.latest_step() is not None and manager.latest_step() < 8  # it really died mid-run
    subprocess.run(cmd(killed), cwd=REPO, check=True, capture_output=True, timeout=600)
    a, data_a = latest_checkpoint(full, 8)
    b, data_b = latest_checkpoint(killed, 8)
    diffs = [float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
    assert len(diffs) > 10 and max(diffs) <= 1e-6
    assert data_a["input"] == data_b["input"] and data_a["input"]["step_in_epoch"] == 8
    lines = [json.loads(l) for l in open(os.path.join(full, "metrics.jsonl"))]
    assert [l["step"] for l in lines] == list(range(1, 9)) and all(np.isfinite(l["loss"]) for l in lines)
    assert os.listdir(os.path.join(full, "tensorboard"))


def test_unwritable_model_dir_fails_before_training(t5_dir, tmp_path, data_dir):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = subprocess.run(_cmd(t5_dir, str(blocker / "sub"), data_dir), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "not writable" in proc.stderr


def test_time_budget_stops_with_checkpoint_and_counts_training_time(t5_dir, tmp_path, data_dir):
    out = str(tmp_path / "budget")
    # A budget shorter than one step: the run stops after step 1 (not 8), checkpointed.
    subprocess.run(_cmd(t5_dir, out, data_dir) + ["--gin.sentemb_jax.train.time_budget_s=0.001"],
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    params, data = latest_checkpoint(out, 1)
    assert data["train_seconds"] > 0.0
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    assert [l["step"] for l in lines] == [1] and lines[0]["train_seconds"] == data["train_seconds"]
    # Rerunning a run whose budget is spent takes no further step.
    subprocess.run(_cmd(t5_dir, out, data_dir) + ["--gin.sentemb_jax.train.time_budget_s=0.001"],
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    latest_checkpoint(out, 1)

"""The train loop's environment checks and time budget (SIGKILL then exact resume: test_robustness.py)."""
import json
import os
import subprocess
import sys

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

"""The train loop's environment checks and time budget (SIGKILL then exact resume: test_robustness.py)."""
import json
import os
import subprocess
import sys

import pytest
from hf_models import make_t5
from run_utils import gin_file_args, latest_checkpoint

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(model_path, model_dir, data_dir):
    return [sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/tiny_t5_nli.gin"),
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
    subprocess.run(_cmd(t5_dir, out, data_dir) + ["--gin.sentemb_jax.RunConfig.time_budget_s=0.001"],
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    params, data = latest_checkpoint(out, 1)
    assert data["train_seconds"] > 0.0
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    assert [l["step"] for l in lines] == [1] and lines[0]["train_seconds"] == data["train_seconds"]
    # Rerunning a run whose budget is spent takes no further step.
    subprocess.run(_cmd(t5_dir, out, data_dir) + ["--gin.sentemb_jax.RunConfig.time_budget_s=0.001"],
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    latest_checkpoint(out, 1)


def _args(model_path, model_dir, data_dir, *extra):
    return [*gin_file_args("gin/runs/tiny_t5_nli.gin"), f"--gin.MODEL_PATH='{model_path}'", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.DATA_DIR='{data_dir}'", *extra]


def _small_nli_data(data_dir, root, rows):
    """DATA_DIR with nli/triples.tsv cut to `rows` (header kept); the other folders linked."""
    for name in os.listdir(data_dir):
        if name != "nli" and not (root / name).exists():
            os.symlink(os.path.join(data_dir, name), root / name)
    (root / "nli").mkdir(exist_ok=True)
    with open(os.path.join(data_dir, "nli", "triples.tsv"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(rows[1] + 1)]
    (root / "nli" / "triples.tsv").write_text(lines[0] + "".join(lines[1 + rows[0]:]), encoding="utf-8")


def _snapshot(run):
    return {p: (run / p).read_bytes() for p in ("encoder.json", "run_config.json")}, sorted(os.listdir(run / "checkpoints"))


def test_resume_with_another_configuration_or_data_is_refused(t5_dir, tmp_path, data_dir, capsys):
    from sentemb_jax import main as runner

    data = tmp_path / "data"
    data.mkdir()
    _small_nli_data(data_dir, data, (0, 200))
    run = tmp_path / "run"
    assert runner.main(_args(t5_dir, run, data, "--gin.sentemb_jax.RunConfig.num_steps=2")) == 0
    before = _snapshot(run)
    capsys.readouterr()
    changed = ["--gin.sentemb_jax.RunConfig.num_steps=3", "--gin.sentemb_jax.DataConfig.batch_size=8",
               "--gin.sentemb_jax.Contrastive.temperature=0.05", "--gin.sentemb_jax.TowerConfig.init_layers=1"]
    assert runner.main(_args(t5_dir, run, data, *changed)) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: MODEL_DIR {run} was trained with another configuration; it differs in: ")
    for diff in ("batch_size: 16 -> 8", "method.temperature: 0.01 -> 0.05", "model.init_layers: None -> 1",
                 "model.backbone.num_layers: 3 -> 1"):
        assert diff in err, err
    assert "CheckpointConfig.allow_config_change=True" in err
    assert _snapshot(run) == before  # the refused start rewrote nothing (encoder.json, record, checkpoints)

    # Other rows in the same file (the 40-rows-replaced-by-11-others case).
    (data / "nli" / "triples.tsv").unlink()
    _small_nli_data(data_dir, data, (300, 450))
    assert runner.main(_args(t5_dir, run, data, "--gin.sentemb_jax.RunConfig.num_steps=3")) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"data file {data}/nli/triples.tsv: changed (" in err and "bytes)" in err, err
    assert _snapshot(run) == before
    # Said explicitly: it resumes, and the new data's fingerprint is recorded.
    assert runner.main(_args(t5_dir, run, data, "--gin.sentemb_jax.RunConfig.num_steps=3",
                             "--gin.sentemb_jax.CheckpointConfig.allow_config_change=True")) == 0
    assert "resuming" in capsys.readouterr().err and latest_checkpoint(str(run), 3)
    assert runner.main(_args(t5_dir, run, data, "--gin.sentemb_jax.RunConfig.num_steps=4")) == 0  # now the record


@pytest.fixture(scope="module")
def six_steps(t5_dir, data_dir, tmp_path_factory):
    """An uninterrupted 6-step run: the reference a resumed run must equal."""
    from sentemb_jax import main as runner

    full = tmp_path_factory.mktemp("full") / "run"
    assert runner.main(_args(t5_dir, full, data_dir, "--gin.sentemb_jax.RunConfig.num_steps=6")) == 0
    return full


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_damaged_newest_checkpoint_falls_back_to_the_one_before(t5_dir, tmp_path, data_dir, capsys, caplog, damage,
                                                                 six_steps):
    """A truncated chunk (TensorStore error) or an empty step directory (KeyError) blocked resume."""
    import numpy as np

    from sentemb_jax import main as runner

    full, run = six_steps, tmp_path / "run"
    assert runner.main(_args(t5_dir, run, data_dir, "--gin.sentemb_jax.RunConfig.num_steps=4")) == 0
    newest = run / "checkpoints" / "4"
    for dirpath, _, files in os.walk(newest):
        for f in files:
            path = os.path.join(dirpath, f)
            if damage == "empty":
                os.unlink(path)
            elif os.path.getsize(path) > 64:
                with open(path, "r+b") as fh:
                    fh.truncate(os.path.getsize(path) // 2)
    # Loading the run's tower is not blocked either: the newest restorable checkpoint (step 2), and said.
    import logging

    from sentemb_jax.encoder import SentenceEncoder

    with caplog.at_level(logging.WARNING, logger="sentemb_jax"):
        assert SentenceEncoder.from_pretrained(str(run)).params is not None
    assert f"{run}/checkpoints/4 cannot be restored" in caplog.text
    capsys.readouterr()
    assert runner.main(_args(t5_dir, run, data_dir, "--gin.sentemb_jax.RunConfig.num_steps=6")) == 0
    err = capsys.readouterr().err
    assert f"checkpoint step 4 of {run} is damaged" in err and f"moved to {run}/damaged_checkpoints/4" in err, err
    assert f"resumed from {run} at step 2" in err
    a, _ = latest_checkpoint(str(full), 6)
    b, _ = latest_checkpoint(str(run), 6)
    import jax

    assert max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))) <= 1e-6


def test_dev_score_of_a_collapsed_model_is_nan_with_the_reason(caplog, tmp_path):
    """During training an undefined STS-B dev score (every pair the same score) is a warning saying
    why and NaN - never the best - rather than the end of a long run."""
    import logging

    import numpy as np

    from sentemb_jax.training.loop import StsDevEvaluator

    class Collapsed:
        params = None

        def encode(self, texts, **kwargs):
            return np.ones((len(texts), 4), np.float32)

    (tmp_path / "stsb").mkdir()
    (tmp_path / "stsb" / "dev.tsv").write_text("sentence1\tsentence2\tscore\na\td\t1.0\nb\te\t2.0\nc\tf\t3.0\n")
    evaluator = StsDevEvaluator(Collapsed(), str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="sentemb_jax"):
        assert np.isnan(evaluator({"tower": {"w": np.zeros(2)}}))
    assert "the model gives all 3 pairs the same score" in caplog.text


def test_a_run_drawing_dropout_from_rbg_resumes_exactly(t5_dir, tmp_path, data_dir):
    """The GPUs' generator ('rbg', training.setup.PLATFORM_PRNG_IMPLS), named here on the CPU: 2
    steps, then the same command to 4, equals 4 steps uninterrupted (dropout on: tiny_t5_nli's
    dropout rate 0.1)."""
    import jax
    import numpy as np

    from sentemb_jax import main as runner

    rbg = "--gin.sentemb_jax.RunConfig.prng_impl='rbg'"
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert runner.main(_args(t5_dir, full, data_dir, rbg, "--gin.sentemb_jax.RunConfig.num_steps=4")) == 0
    assert runner.main(_args(t5_dir, cut, data_dir, rbg, "--gin.sentemb_jax.RunConfig.num_steps=2")) == 0
    assert runner.main(_args(t5_dir, cut, data_dir, rbg, "--gin.sentemb_jax.RunConfig.num_steps=4",
                             "--gin.sentemb_jax.CheckpointConfig.allow_config_change=True")) == 0
    a, data_a = latest_checkpoint(str(full), 4)
    b, data_b = latest_checkpoint(str(cut), 4)
    assert data_a["input"] == data_b["input"]
    diffs = [float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                                                 jax.tree_util.tree_leaves(b))]
    assert len(diffs) > 10 and max(diffs) <= 1e-6

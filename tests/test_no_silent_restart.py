"""A checkpoint that reads but does not fit the run is a configuration difference, not damage; a
MODEL_DIR whose checkpoints were set aside never starts again from step 0 without being told
(docs/ROBUSTNESS.md, "Found by red-team testing")."""
import os
import subprocess

import pytest
from run_utils import gin_file_args

import gin

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir):
    from hf_models import make_minilm_shaped_bert

    path = tmp_path_factory.mktemp("tiny_minilm")
    make_minilm_shaped_bert(path, minilm_dir, layers=2, hidden=32)
    return str(path)


def _args(model, run, data_dir, steps=3, *extra):
    return [*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{run}'", f"--gin.MODEL_PATH='{model}'",
            f"--gin.DATA_DIR='{data_dir}'", f"--gin.sentemb_jax.RunConfig.num_steps={steps}",
            "--gin.sentemb_jax.DataConfig.batch_size=4", "--gin.sentemb_jax.DataConfig.sequence_length=16",
            "--gin.sentemb_jax.EvalConfig.every=None", "--gin.sentemb_jax.ScheduleConfig.total_steps=8",
            "--gin.sentemb_jax.ScheduleConfig.warmup_steps=0", "--gin.sentemb_jax.CheckpointConfig.every=1", *extra]


def _main(args, capsys):
    from sentemb_jax import main as runner

    gin.clear_config()
    capsys.readouterr()
    rc = runner.main(args)
    gin.clear_config()
    return rc, capsys.readouterr().err


def _tree(run):
    """Every file under MODEL_DIR with its bytes but the console's log."""
    out = {}
    for dirpath, _, files in os.walk(run):
        for f in files:
            path = os.path.join(dirpath, f)
            if os.path.relpath(path, run) != "run.log":
                out[os.path.relpath(path, run)] = open(path, "rb").read()
    return out


LESS_LAYERS = ("--gin.sentemb_jax.TowerConfig.init_layers=1", "--gin.sentemb_jax.CheckpointConfig.allow_config_change=True")


def test_a_checkpoint_of_another_shape_is_refused_not_moved_and_the_run_resumes_after(tiny, tmp_path, data_dir, capsys):
    run = tmp_path / "run"
    assert _main(_args(tiny, run, data_dir), capsys)[0] == 0
    before = _tree(run)
    rc, err = _main(_args(tiny, run, data_dir, 3, *LESS_LAYERS), capsys)
    last = err.strip().splitlines()[-1]
    assert rc == 1, err
    assert last.startswith(f"error: checkpoint {run}/checkpoints/3 does not fit this run's train state: "), last
    assert "array(s) only in the checkpoint (params.tower.backbone.encoder.layers_1." in last, last
    assert "(32, 32) float32" in last and "It reads back (it is not damaged)" in last
    assert "CheckpointConfig.restart_from_scratch=True" in last
    assert "is damaged" not in err and not (run / "damaged_checkpoints").exists()
    assert _tree(run) == before  # nothing moved, nothing rewritten
    # The original command resumes where it was (before: started from step 0 without a word).
    rc, err = _main(_args(tiny, run, data_dir, 4), capsys)
    assert rc == 0 and f"resumed from {run} at step 3" in err, err


def test_checkpoints_copied_into_a_model_dir_without_a_record_are_compared_too(tiny, tmp_path, data_dir, capsys):
    run, copy = tmp_path / "run", tmp_path / "copy"
    assert _main(_args(tiny, run, data_dir, 2), capsys)[0] == 0
    copy.mkdir()
    subprocess.run(["cp", "-r", str(run / "checkpoints"), str(copy / "checkpoints")], check=True)
    before = _tree(copy)
    rc, err = _main(_args(tiny, copy, data_dir, 3, "--gin.sentemb_jax.TowerConfig.init_layers=1"), capsys)
    assert rc == 1 and err.strip().splitlines()[-1].startswith(f"error: checkpoint {copy}/checkpoints/2 does not fit"), err
    assert _tree(copy) == before


def _truncate_all(step_dir):
    for dirpath, _, files in os.walk(step_dir):
        for f in files:
            path = os.path.join(dirpath, f)
            if os.path.getsize(path) > 64:
                with open(path, "r+b") as fh:
                    fh.truncate(os.path.getsize(path) // 2)


def test_all_checkpoints_damaged_then_the_rerun_does_not_start_from_step_0(tiny, tmp_path, data_dir, capsys):
    run = tmp_path / "run"
    assert _main(_args(tiny, run, data_dir, 2), capsys)[0] == 0
    for step in ("1", "2"):
        _truncate_all(run / "checkpoints" / step)
    rc, err = _main(_args(tiny, run, data_dir, 3), capsys)
    assert rc == 1 and "no checkpoint of" in err and "restart_from_scratch=True" in err, err
    assert sorted(os.listdir(run / "damaged_checkpoints")) == ["1", "2"]  # unreadable: set aside
    before = _tree(run)
    rc, err = _main(_args(tiny, run, data_dir, 3), capsys)  # before: started from step 0 without a word
    last = err.strip().splitlines()[-1]
    assert rc == 1 and last == (
        f"error: MODEL_DIR {run} holds damaged_checkpoints/ (steps [1, 2]) but no checkpoint this run can resume from: "
        "it would start again from step 0 over them. Use a new MODEL_DIR, or set "
        f"CheckpointConfig.restart_from_scratch=True to start again here (the old checkpoints moved to {run}/previous_runs)"), last
    assert _tree(run) == before


def test_restart_from_scratch_sets_the_old_run_aside_with_a_warning(tmp_path, caplog):
    """The helpers the flag drives (training.trainer): the refusal without it, the move with it."""
    import logging

    from sentemb_jax.errors import TrainingError
    from sentemb_jax.training import trainer

    run = tmp_path / "run"
    for part in ("checkpoints/3/state", "best/2", "damaged_checkpoints/4", "tensorboard"):
        (run / part).mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "run_config.json").write_text("{}")
    (run / "checkpoints" / "5.orbax-checkpoint-tmp-1").mkdir()  # an unfinished write is no checkpoint
    with pytest.raises(TrainingError, match=r"holds checkpoints/ \(steps \[3\]\), damaged_checkpoints/ \(steps \[4\]\)"):
        trainer._refuse_start_over(str(run))
    with caplog.at_level(logging.WARNING, logger="sentemb_jax"):
        trainer._start_again(str(run))
    (aside,) = os.listdir(run / "previous_runs")
    assert sorted(os.listdir(run / "previous_runs" / aside)) == ["best", "checkpoints", "damaged_checkpoints",
                                                                  "metrics.jsonl", "run_config.json", "tensorboard"]
    assert sorted(os.listdir(run)) == ["previous_runs"]
    assert f"starting MODEL_DIR {run} again from step 0 (CheckpointConfig.restart_from_scratch=True)" in caplog.text
    trainer._refuse_start_over(str(run))  # nothing left to start over


def test_restart_from_scratch_flag_through_the_command_line(tiny, tmp_path, data_dir, capsys):
    from sentemb_jax.training.config import CheckpointConfig

    if not hasattr(CheckpointConfig(), "restart_from_scratch"):
        pytest.skip("CheckpointConfig.restart_from_scratch is not a field yet (training/config.py)")
    run = tmp_path / "run"
    assert _main(_args(tiny, run, data_dir, 2), capsys)[0] == 0
    rc, err = _main(_args(tiny, run, data_dir, 2, *LESS_LAYERS[:1],
                          "--gin.sentemb_jax.CheckpointConfig.restart_from_scratch=True"), capsys)
    assert rc == 0 and "warning: starting MODEL_DIR" in err and "again from step 0" in err, err
    assert "resumed" not in err and sorted(os.listdir(run / "checkpoints")) == ["1", "2"]
    assert len(os.listdir(run / "previous_runs")) == 1


def test_no_private_orbax_api():
    for path in ("sentemb_jax/training/run_record.py", "sentemb_jax/training/trainer.py"):
        assert "orbax.checkpoint._src" not in open(os.path.join(REPO, path), encoding="utf-8").read()

"""Two-stage training: stage 2 starts from stage 1's params, with a fresh optimizer and step count."""
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from hf_models import make_t5

from sentemb_jax import main as runner

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _restore(run_dir):
    manager = ocp.CheckpointManager(os.path.join(run_dir, "checkpoints"))
    step = manager.latest_step()
    return step, manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]


def test_stage_two_restores_params_only(tmp_path, data_dir):
    t5 = str(tmp_path / "t5")
    make_t5(t5, "1.1")
    out = tmp_path / "run"
    cfg = tmp_path / "two_stage.gin"
    cfg.write_text(f"""
include 'gin/models/local.gin'
include 'gin/runs/tiny_t5_nli.gin'
run.job = @sentemb_jax.run_stages
sentemb_jax.run_stages.stages = [@stage1/sentemb_jax.train, @stage2/sentemb_jax.train]
stage1/sentemb_jax.RunConfig.model_dir = '{out}/stage1'
stage1/sentemb_jax.DataConfig.task = 'commqa'
stage1/sentemb_jax.RunConfig.num_steps = 3
stage1/sentemb_jax.Contrastive.negative = None
stage2/sentemb_jax.RunConfig.model_dir = '{out}/stage2'
stage2/sentemb_jax.TowerConfig.params_from = '{out}/stage1'
stage2/sentemb_jax.RunConfig.num_steps = 2
stage2/sentemb_jax.ScheduleConfig.peak = 0.0
""")
    rc = runner.main([f"--gin_file={cfg}", f"--gin.MODEL_PATH='{t5}'", "--gin.MODEL_DIR='unused'", f"--gin.DATA_DIR='{data_dir}'"])
    assert rc == 0
    step1, s1 = _restore(str(out / "stage1"))
    step2, s2 = _restore(str(out / "stage2"))
    assert (step1, step2) == (3, 2)  # steps count within each stage
    a, b = jax.tree_util.tree_leaves(s1["params"]), jax.tree_util.tree_leaves(s2["params"])
    assert len(a) == len(b) > 10
    for x, y in zip(a, b):  # lr 0 in stage 2: its params are exactly stage 1's
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # A fresh optimizer: stage 2's AdamW moments are not stage 1's.
    o1 = [np.asarray(x) for x in jax.tree_util.tree_leaves(s1["opt_state"])]
    o2 = [np.asarray(x) for x in jax.tree_util.tree_leaves(s2["opt_state"])]
    assert any(x.shape == y.shape and not np.array_equal(x, y) for x, y in zip(o1, o2))

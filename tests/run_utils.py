"""Helpers for tests that run training jobs and read their checkpoints."""
import os

import jax
import orbax.checkpoint as ocp


def latest_checkpoint(model_dir: str, step: int):
    """(params, data state) of MODEL_DIR/checkpoints/<step>, which must be the latest, restored onto
    this process's first device whatever topology wrote it (orbax needs the target layout then)."""
    manager = ocp.CheckpointManager(os.path.join(model_dir, "checkpoints"), item_handlers={
        "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})
    assert manager.latest_step() == step
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    meta = manager.item_metadata(step)["state"]
    target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), getattr(meta, "tree", meta))
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                             data=ocp.args.JsonRestore()))
    return restored["state"]["params"], restored["data"]

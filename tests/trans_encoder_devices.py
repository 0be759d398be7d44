"""One tiny Trans-Encoder cycle on whatever devices JAX finds (tests/test_trans_encoder.py runs it
with 1 and with 8 simulated CPU devices); prints RESULT {json}: the cross- and bi-encoder's last
parameters (a fixed sample of entries), how far they moved, and the optimizer-state names of each
phase's checkpoint. argv: model, data_dir, run directory, the bi -> cross phase's optimizer."""
import json
import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.jobs.trans_encoder import trans_encoder
from sentemb_jax.methods import trans_encoder as te
from sentemb_jax.training.config import OptimizerConfig

model, data_dir, run, cross_optimizer = sys.argv[1:5]
rows = open(os.path.join(data_dir, "stsb", "train.tsv"), encoding="utf-8").read().splitlines()[:41]
pairs = os.path.join(os.path.dirname(run), f"pairs_{os.path.basename(run)}.tsv")
with open(pairs, "w", encoding="utf-8") as f:
    f.write("\n".join(rows) + "\n")
optimizer = OptimizerConfig(name=cross_optimizer, clip_norm=1.0, weight_decay=0.01, min_dim_size_to_factor=8)
trans_encoder(model_dir=run, bi_encoders=[model], pair_files=[pairs], cycles=1, checkpoint_every=100,
              dev=te.EvalSet("stsb_dev_head", os.path.join(data_dir, "stsb", "dev.tsv"), "sts", (0, 40)),
              bi_to_cross=te.DistillPhase(learning_rate=1e-3, batch_size=16, epochs=1, max_length=32, relabel="minmax",
                                          optimizer=optimizer),
              cross_to_bi=te.DistillPhase(learning_rate=1e-3, batch_size=16, epochs=1, max_length=32, loss="mse"))


def sample(params):
    leaves = [np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(params)]
    return np.concatenate([x[:: max(1, x.size // 50)] for x in leaves])


def optimizer_names(phase: str) -> list[str]:
    manager = ocp.CheckpointManager(os.path.join(run, "model_0", "cycle_1", phase, "checkpoints"), item_handlers={
        "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})
    tree = manager.item_metadata(manager.latest_step())["state"]
    names = {str(getattr(k, "key", k)) for path, _ in jax.tree_util.tree_flatten_with_path(getattr(tree, "tree", tree))[0]
             for k in path if str(getattr(k, "key", "")).startswith(("v_", "mu", "nu"))}
    return sorted(names)


cross = CrossEncoder.from_pretrained(os.path.join(run, "model_0", "cross_last")).params
bi = SentenceEncoder.from_pretrained(os.path.join(run, "model_0", "bi_last")).params
cross0 = CrossEncoder.from_pretrained(model, pooling="first", max_seq_length=32, seed=0).params
bi0 = SentenceEncoder.from_pretrained(model).params
print("RESULT " + json.dumps({
    "devices": jax.device_count(), "cross": sample(cross).tolist(), "bi": sample(bi).tolist(),
    "cross_moved": (sample(cross) - sample(cross0)).tolist(), "bi_moved": (sample(bi) - sample(bi0)).tolist(),
    "cross_optimizer": optimizer_names("bi_to_cross"), "bi_optimizer": optimizer_names("cross_to_bi")}))

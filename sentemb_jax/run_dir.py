"""The layout of a run directory (MODEL_DIR): the one owner of its names. The train loop writes it,
`SentenceEncoder.from_run` and the jobs read it.

    MODEL_DIR/
      checkpoints/<step>/   orbax: the train state and the input position (last train.keep_checkpoints)
      best/<step>/          orbax: the train state with the best STS-B dev score so far
      damaged_checkpoints/  checkpoints that could not be restored, moved aside on resume
      encoder.json          how to rebuild the tower around a checkpoint (start model, layers, head)
      run_config.json       what the run was made with (model, batch, method, data fingerprints)
      metrics.jsonl         one JSON line per logged step (loss, STS-B dev, train_seconds)
      tensorboard/          TensorBoard event files
      results.json / results.md   the evaluation jobs' scores
      run.log               the console's log (library output, tracebacks)
"""
from __future__ import annotations

import os

from sentemb_jax.paths import is_remote

CHECKPOINTS = "checkpoints"
BEST = "best"
DAMAGED_CHECKPOINTS = "damaged_checkpoints"
ENCODER_JSON = "encoder.json"
RUN_CONFIG_JSON = "run_config.json"
METRICS_JSONL = "metrics.jsonl"
TENSORBOARD = "tensorboard"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RUN_LOG = "run.log"


def run_path(model_dir: str, *parts: str) -> str:
    """A path under MODEL_DIR: absolute when local, the URL as given when remote (a bucket)."""
    if is_remote(model_dir):
        return "/".join([model_dir.rstrip("/"), *parts])
    return os.path.join(os.path.abspath(model_dir), *parts)

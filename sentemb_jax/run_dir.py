"""The layout of a run directory (MODEL_DIR): the one owner of its names. The train loop writes it,
`SentenceEncoder.from_run` and the jobs read it.

    MODEL_DIR/
      checkpoints/<step>/   orbax: the train state and the input position (the last CheckpointConfig.keep)
      best/<step>/          orbax: the train state with the best STS-B dev score so far
      damaged_checkpoints/  checkpoints that could not be restored, moved aside on resume
      encoder.json          how to rebuild the tower around a checkpoint (start model, layers, head)
      run_config.json       what the run was made with (model, batch, method, data fingerprints)
      metrics.jsonl         one JSON line per logged step (loss, STS-B dev, train_seconds)
      tensorboard/          TensorBoard event files
      results.json / results.md   the evaluation jobs' scores
      run.log               the console's log (library output, tracebacks)
      config.gin            the gin configuration the job ran with (as t5x writes it)
"""
from __future__ import annotations

import json
import os

import orbax.checkpoint as ocp
from etils import epath

from sentemb_jax.paths import is_remote, local_path

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
CONFIG_GIN = "config.gin"


def run_path(model_dir: str, *parts: str) -> str:
    """A path under MODEL_DIR: absolute when local, the URL as given when remote (a bucket)."""
    if is_remote(model_dir):
        return "/".join([model_dir.rstrip("/"), *parts])
    return os.path.join(os.path.abspath(local_path(model_dir)), *parts)


def checkpoint_manager(model_dir: str, kind: str = CHECKPOINTS, keep: int | None = None, create: bool = True,
                       **kwargs) -> ocp.CheckpointManager:
    """The orbax manager of MODEL_DIR/<kind> (`checkpoints` or `best`): every module that writes
    or reads a run's checkpoints builds it here (local paths made absolute, buckets as given).
    keep: how many steps to keep (None: all); create=False for a reader."""
    return ocp.CheckpointManager(run_path(model_dir, kind),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create), **kwargs)


def read_results(model_dir: str) -> dict | None:
    """MODEL_DIR/results.json, or None when there is none."""
    path = os.path.join(local_path(model_dir), RESULTS_JSON)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_results(model_dir: str, results: dict, markdown: str | None = None) -> None:
    """Write MODEL_DIR/results.json (and results.md when given) by replacing the old file whole (a
    crash mid-write leaves the old one); the one writer of every job's results."""
    model_dir = local_path(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    for name, text in ((RESULTS_JSON, json.dumps(results, indent=2)), (RESULTS_MD, markdown)):
        if text is not None:
            path = os.path.join(model_dir, name)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)


def write_gin_config(model_dir: str, config_str: str, markdown: str) -> str:
    """MODEL_DIR/config.gin (every binding, after includes and --gin. overrides: rerunnable with
    --gin_file=MODEL_DIR/config.gin) and its markdown form in TensorBoard (tag `gin/config`, step 0),
    as t5x's summarize_gin_config writes them. Returns the file's path."""
    path = epath.Path(run_path(model_dir, CONFIG_GIN))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_str)
    writer = tensorboard_writer(run_path(model_dir, TENSORBOARD))
    writer.add_text("gin/config", markdown, 0)
    writer.close()
    return str(path)


def keep_gin_config(model_dir: str, config_str: str, markdown: str) -> str | None:
    """write_gin_config for a MODEL_DIR that exists and has no config.gin yet; None otherwise."""
    if not epath.Path(local_path(model_dir)).is_dir() or epath.Path(run_path(model_dir, CONFIG_GIN)).exists():
        return None
    return write_gin_config(model_dir, config_str, markdown)


def tensorboard_writer(path: str):
    """A tensorboardX SummaryWriter at `path`, imported on first use: tensorboardX imports torch
    when it is installed (a second or more), which a job that writes no events never pays."""
    from tensorboardX import SummaryWriter  # lazy: imports torch when installed (seconds)

    return SummaryWriter(path)

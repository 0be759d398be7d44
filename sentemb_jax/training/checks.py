"""The train job's checks of what it will read, run before any work: a missing model directory,
DATA_DIR or file is named with the API argument that set it (the command line: its gin binding;
exit 1); a length past the model's position table or a mesh that does not fit the devices is a
ConfigError (exit 2). The numbers themselves are checked when the RunConfig is made. Jobs that
run several trains (distill_report, ensemble_distill) check them all before the first starts."""
from __future__ import annotations

import os
import shutil

import jax
import numpy as np

from sentemb_jax import partitioning
from sentemb_jax import validation as v
from sentemb_jax.checkpoints import config_from_hf, read_hf_config_dict
from sentemb_jax.data.sources import seqio_route_reason, task_specs
from sentemb_jax.dependencies import require_tensorflow
from sentemb_jax.errors import CheckpointError, DataError, TrainingError
from sentemb_jax.models import family_of
from sentemb_jax.paths import default_data_dir, is_remote
from sentemb_jax.preflight import require_dir, require_model_dir
from sentemb_jax.run_dir import BEST, CHECKPOINTS
from sentemb_jax.st_layout import transformer_dir_of
from sentemb_jax.training.config import RunConfig

TOWER, DATA = "sentemb_jax.TowerConfig", "sentemb_jax.DataConfig"


def check_positions(length, model_dir, api: str, param: str) -> None:
    """A length past the position table of `model_dir`'s backbone (its family's limit, from its
    config.json only; no weights read) is refused: those tokens would get NaN embeddings."""
    if not model_dir or not isinstance(model_dir, str) or is_remote(model_dir) or not os.path.isdir(model_dir):
        return  # a missing directory is reported by the preflight checks
    try:
        cfg = config_from_hf(read_hf_config_dict(transformer_dir_of(model_dir)))
    except (CheckpointError, ValueError, TypeError):
        return  # an unreadable or unsupported config: reported when the model loads
    limit = family_of(cfg).position_limit(cfg)
    if limit is not None and v._is_int(length) and length > limit:
        v.fail(length, api, param, f"must be an integer in [2, {limit}]: {model_dir} has {limit} positions "
               "(longer texts would get NaN embeddings)")


def check_inputs(config: RunConfig, method, devices=None) -> None:
    """What a train run of `config` and `method` will read, before it reads any of it: its start
    model / tokenizer directories, another run's directory (params_from), the method's teacher(s),
    DATA_DIR, the files of its own task (only those: a job on NLI needs no QA file) and STS-B dev
    when it scores it; the mesh against the devices; the length against the position table."""
    tower, data = config.model, config.data
    if tower is not None:
        if tower.init_from:
            require_model_dir(tower.init_from, TOWER, "init_from")
        if tower.tokenizer_dir:
            require_model_dir(tower.tokenizer_dir, TOWER, "tokenizer_dir")
        if tower.params_from:
            require_dir(tower.params_from, TOWER, "params_from", what="run directory")
        check_positions(data.sequence_length, tower.init_from, DATA, "sequence_length")
    teachers = getattr(method, "teacher", None)
    for teacher in [teachers] if isinstance(teachers, str) else list(teachers or ()):
        require_model_dir(teacher, f"sentemb_jax.{type(method).__name__}", "teacher")
    cache_dir = getattr(method, "cache_dir", None)
    if isinstance(cache_dir, str) and os.path.exists(cache_dir):  # else created once the teacher has embedded
        require_dir(cache_dir, f"sentemb_jax.{type(method).__name__}", "cache_dir", what="cache directory")
    partitioning.make_mesh(*config.mesh.shape, devices=devices)
    if data.data_dir:
        require_dir(data.data_dir, DATA, "data_dir")
    data_dir = data.data_dir or default_data_dir()
    if not data.data_dir and not os.path.isdir(data_dir):
        raise DataError(f"{data_dir}: no such data directory (DataConfig.data_dir unset: $SENTEMB_DATA_DIR, else "
                        "../shared/data)")
    task_specs(data, data_dir)  # the task's files: they exist (nothing read)
    if data.route == "seqio":
        require_tensorflow(*seqio_route_reason(data))
    if config.evaluation.every:
        dev = os.path.join(data_dir, "stsb", "dev.tsv")
        if not os.path.isfile(dev):
            raise DataError(f"{dev}: no such file (STS-B dev, scored every EvalConfig.every={config.evaluation.every} "
                            "steps; data_dir {where})", api=DATA, param="data_dir", value=data_dir, source=True)


def saved_steps(directory: str) -> int:
    """How many finished orbax checkpoints `directory` holds (`<step>/`; a half-written
    `<step>.orbax-checkpoint-tmp-*` does not count: orbax removes it)."""
    try:
        return sum(1 for name in os.listdir(directory) if name.isdigit() and os.path.isdir(os.path.join(directory, name)))
    except OSError:
        return 0


def checkpoints_to_add(keep: int, present: int, best: bool = False, best_present: int = 0) -> int:
    """How many more train states the disk must hold at the fullest moment of the run, beyond what
    is there already: orbax writes a new checkpoint before it deletes the oldest, so the fullest is
    `keep` kept + the one being written (`max(keep, present) + 1`; a resume that lowered `keep`
    deletes down to it after that write), and with the best state kept (EvalConfig.every) its one
    copy as well - written, like a checkpoint, before the old best is deleted, one save at a time.
    A resume with keep=1 and its one checkpoint present adds 1; a new run with keep=3 adds 4 (5 with best)."""
    add = max(0, keep - present) + 1
    if best:
        add += max(0, 1 - best_present)
    return add


def state_size(abstract_state) -> int:
    """Bytes of one train state (a pytree of arrays or ShapeDtypeStructs; an int is taken as is)."""
    if isinstance(abstract_state, int):
        return abstract_state
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree_util.tree_leaves(abstract_state) if hasattr(x, "shape"))


def check_disk_space(model_dir: str, abstract_state, keep: int, best: bool) -> None:
    """Stop before the first step when MODEL_DIR's disk cannot take what the run's saves add
    (checkpoints_to_add train states, counting the checkpoints already there; `abstract_state`:
    the train state's shapes, or its size in bytes); the message names how many checkpoints, their
    size and the free space. A bucket: no check. The trainer calls it as
    `check_disk_space(model_dir, run.abstract_state, config.checkpoints.keep, bool(config.evaluation.every))`."""
    if is_remote(model_dir):
        return
    each = state_size(abstract_state)
    probe = os.path.abspath(model_dir)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    present = saved_steps(os.path.join(model_dir, CHECKPOINTS))
    best_present = saved_steps(os.path.join(model_dir, BEST)) if best else 0
    add = checkpoints_to_add(keep, present, best, best_present)
    free, need = shutil.disk_usage(probe).free, add * each
    if free < need:
        there = f"CheckpointConfig.keep={keep}, {present} checkpoint(s) there" + (
            f", the best one {'there' if best_present else 'to come'}" if best else "")
        raise TrainingError(f"MODEL_DIR {model_dir}: {free / 2**30:.2f} GiB free, but {add} checkpoints of this train "
                            f"state ({each / 2**30:.2f} GiB each) need {need / 2**30:.2f} GiB ({there}; a new checkpoint "
                            "is written before the oldest is deleted): free space, or lower CheckpointConfig.keep")

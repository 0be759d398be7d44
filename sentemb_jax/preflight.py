"""Checks that a job's inputs exist, run before any work (before a model is loaded, a file read or a
step taken). Each failure names the path and the gin binding that set it, e.g.

    /data/x: no such data directory (set by gin binding sentemb_jax.eval_sts.data_dir = %DATA_DIR)

Missing data is a `DataError`, a missing model directory a `CheckpointError`: the job runner prints
either as `error: ...` and exits 1.
"""
from __future__ import annotations

import os

import gin

from sentemb_jax.data.files import DataError, is_remote as _is_remote  # a bucket path is not checked here


def gin_binding(selector: str, param: str) -> str | None:
    """`selector.param` as gin bound it in the active scope (with the macro it came from:
    `sentemb_jax.eval_sts.data_dir = %DATA_DIR`), or None when gin does not bind it."""
    from gin import config as gin_config

    scopes = gin.current_scope()
    for i in range(len(scopes), -1, -1):  # innermost scope first, as gin resolves it
        key = "/".join([*scopes[:i], f"{selector}.{param}"])
        try:
            value = gin.query_parameter(key)
        except (ValueError, KeyError):
            continue
        if isinstance(value, gin_config.ConfigurableReference) and value.configurable.name == "macro":
            return f"{key} = %{value.scoped_selector.rsplit('/', 1)[0]}"
        return key
    return None


def source(selector: str, param: str) -> str:
    """`set by gin binding X = %MACRO` for an error message; `selector.param` when gin does not bind it."""
    binding = gin_binding(selector, param)
    return f"set by gin binding {binding}" if binding else f"{selector}.{param}"


def via(selector: str, param: str) -> str:
    return f" ({source(selector, param)})"


def require_dir(path: str, selector: str, param: str, what: str = "data directory") -> None:
    """DataError unless `path` is a directory."""
    if path and not _is_remote(path) and not os.path.isdir(path):
        state = "is not a directory" if os.path.exists(path) else f"no such {what}"
        raise DataError(f"{path}: {state}{via(selector, param)}")


def require_file(path: str, selector: str, param: str) -> None:
    """DataError unless `path` is a file."""
    if path and not _is_remote(path) and not os.path.isfile(path):
        state = "is a directory, not a file" if os.path.isdir(path) else "no such file"
        raise DataError(f"{path}: {state}{via(selector, param)}")


def require_model_dir(path: str, selector: str, param: str) -> None:
    """CheckpointError unless `path` is a directory (what SentenceEncoder.from_pretrained reads)."""
    from sentemb_jax.checkpoints import CheckpointError

    if path and not _is_remote(path) and not os.path.isdir(path):
        state = "is not a directory" if os.path.exists(path) else "no such model directory"
        raise CheckpointError(f"{path}: {state}{via(selector, param)}")


def require_some_task(job: str, data_dir: str, present: list[str], omitted: list[str], selector: str | None = None) -> None:
    """DataError when an evaluation would omit every one of its tasks (nothing to score)."""
    if present:
        return
    where = f"{data_dir}{via(selector, 'data_dir')}" if selector else data_dir
    raise DataError(f"{job}: every task omitted, no data for any of them under {where}: " + "; ".join(omitted))


def check_train_inputs(task: str, data_dir: str | None, init_from: str | None, tokenizer_dir: str | None,
                       params_from: str | None, eval_every: int | None, distill) -> None:
    """What `sentemb_jax.train` will read, before it reads any of it: its start model / tokenizer
    directories, another run's directory (params_from), the teacher(s) of `distill`, DATA_DIR, the
    files of its own task (only those: a job on NLI needs no QA file) and STS-B dev when it scores it.
    The gin scope of the call is used (a scoped train, e.g. an ensemble's submodel, gets its own files)."""
    from sentemb_jax.data.files import default_data_dir
    from sentemb_jax.data.tasks import register_tasks
    from sentemb_jax.training.trainer import TrainingError

    train = "sentemb_jax.train"
    if init_from:
        require_model_dir(init_from, train, "init_from")
    if tokenizer_dir:
        require_model_dir(tokenizer_dir, train, "tokenizer_dir")
    if params_from:
        require_dir(params_from, train, "params_from", what="run directory")
    teachers = getattr(distill, "teacher", None)
    for teacher in [teachers] if isinstance(teachers, str) else list(teachers or ()):
        require_model_dir(teacher, "sentemb_jax.QueueDistillConfig", "teacher")
    if data_dir:
        require_dir(data_dir, train, "data_dir")
    else:
        data_dir = default_data_dir()
        if not os.path.isdir(data_dir):
            raise DataError(f"{data_dir}: no such data directory (sentemb_jax.train.data_dir unset: "
                            "$SENTEMB_DATA_DIR, else ../shared/data)")
    names = register_tasks(model_dir=None, data_dir=data_dir)  # the names only: nothing registered or read
    if task not in names:
        raise TrainingError(f"task {task!r} unknown; registered: {sorted(names)}")
    register_tasks(model_dir=None, data_dir=data_dir, require=(task,))
    if eval_every:
        dev = os.path.join(data_dir, "stsb", "dev.tsv")
        if not os.path.isfile(dev):
            raise DataError(f"{dev}: no such file (STS-B dev, scored every train.eval_every={eval_every} steps; "
                            f"data_dir {source(train, 'data_dir')})")

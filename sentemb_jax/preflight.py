"""Checks that a job's inputs exist, run before any work (before a model is loaded, a file read or a
step taken). Each failure names the path and the gin binding that set it, e.g.

    /data/x: no such data directory (set by gin binding sentemb_jax.eval_sts.data_dir = %DATA_DIR)

Missing data is a `DataError`, a missing model directory a `CheckpointError`: the job runner prints
either as `error: ...` and exits 1.
"""
from __future__ import annotations

import os

from sentemb_jax.errors import CheckpointError, DataError
from sentemb_jax.paths import is_remote as _is_remote  # a bucket path is not checked here
from sentemb_jax.validation import gin_binding, source, via  # noqa: F401 - re-exported


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
    if path and not _is_remote(path) and not os.path.isdir(path):
        state = "is not a directory" if os.path.exists(path) else "no such model directory"
        raise CheckpointError(f"{path}: {state}{via(selector, param)}")


def require_some_task(job: str, data_dir: str, present: list[str], omitted: list[str], selector: str | None = None) -> None:
    """DataError when an evaluation would omit every one of its tasks (nothing to score)."""
    if present:
        return
    where = f"{data_dir}{via(selector, 'data_dir')}" if selector else data_dir
    raise DataError(f"{job}: every task omitted, no data for any of them under {where}: " + "; ".join(omitted))



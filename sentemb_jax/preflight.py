"""Checks that a job's inputs exist, run before any work (before a model is loaded, a file read or a
step taken). Each failure names the path and the API argument that set it; the job runner words
that as the gin binding, e.g.

    /data/x: no such data directory (set by gin binding sentemb_jax.eval_sts.data_dir = %DATA_DIR)

Missing data is a `DataError`, a missing model directory a `CheckpointError`: the job runner prints
either as `error: ...` and exits 1.
"""
from __future__ import annotations

import os

from sentemb_jax.errors import CheckpointError, DataError
from sentemb_jax.paths import is_remote as _is_remote  # a bucket path is not checked here


def _where(error, message: str, path: str, api: str, param: str):
    return error(f"{message} ({{where}})", api=api, param=param, value=path, source=True)


def require_dir(path: str, api: str, param: str, what: str = "data directory") -> None:
    """DataError unless `path` is a directory."""
    if path and not _is_remote(path) and not os.path.isdir(path):
        state = "is not a directory" if os.path.exists(path) else f"no such {what}"
        raise _where(DataError, f"{path}: {state}", path, api, param)


def require_file(path: str, api: str, param: str) -> None:
    """DataError unless `path` is a file."""
    if path and not _is_remote(path) and not os.path.isfile(path):
        state = "is a directory, not a file" if os.path.isdir(path) else "no such file"
        raise _where(DataError, f"{path}: {state}", path, api, param)


def require_model_dir(path: str, api: str, param: str) -> None:
    """CheckpointError unless `path` is a directory (what SentenceEncoder.from_pretrained reads)."""
    if path and not _is_remote(path) and not os.path.isdir(path):
        state = "is not a directory" if os.path.exists(path) else "no such model directory"
        raise _where(CheckpointError, f"{path}: {state}", path, api, param)


def require_some_task(job: str, data_dir: str, present: list[str], omitted: list[str], api: str | None = None) -> None:
    """DataError when an evaluation would omit every one of its tasks (nothing to score)."""
    if present:
        return
    message = f"{job}: every task omitted, no data for any of them under {data_dir}"
    omitted_text = ": " + "; ".join(omitted)
    if api:
        raise DataError(f"{message} ({{where}}){omitted_text}", api=api, param="data_dir", value=data_dir, source=True)
    raise DataError(message + omitted_text)

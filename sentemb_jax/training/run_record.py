"""What a training run was started with, kept in MODEL_DIR and compared on every resume.

`MODEL_DIR/run_config.json` holds the run's operative configuration: the model (where it starts,
layers kept, the backbone's sizes, pooling, head), the task, batch size, sequence length, seed,
packing, the method (the contrastive or distillation config) and a fingerprint of every data
file the task reads (size and a hash of its first and last MiB). A rerun of the same MODEL_DIR
whose configuration differs is refused with every difference listed - a changed model, batch,
method or data would otherwise continue silently or fail with a shape traceback - unless
`CheckpointConfig.allow_config_change=True`; then the new configuration is recorded. What may change
between restarts is left out: num_steps, time budget, evaluation and checkpoint intervals.

Damaged checkpoints: `restore_newest_good` restores the newest checkpoint that reads back; each
newer one that does not (a truncated chunk, an empty step directory) is moved to
`MODEL_DIR/damaged_checkpoints/<step>` with a warning naming it. A checkpoint that *reads* but does
not fit the run's train state (other tree paths, shapes or dtypes: another model, optimizer or
method) is not damaged: given its metadata reader and the restore target, `restore_newest_good`
compares them first (`tree_differences`) and refuses the start naming what differs, moving nothing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil

import jax
from etils import epath

from sentemb_jax.paths import is_remote
from sentemb_jax.run_dir import DAMAGED_CHECKPOINTS, RUN_CONFIG_JSON

log = logging.getLogger(__name__)

_EDGE = 1 << 20  # bytes hashed at each end of a data file: cheap on any corpus, catches replaced files


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # configs, at any depth
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return getattr(value, "__name__", None) or str(value)  # a dtype class by its name


def _jsonable(value):
    return json.loads(json.dumps(_plain(value) if dataclasses.is_dataclass(value) else value, default=_plain))


def file_fingerprint(path: str) -> dict:
    """Size and sha256 of the first and last MiB (the whole file when smaller than 2 MiB)."""
    if is_remote(path):
        return {"bytes": epath.Path(path).stat().length}  # a bucket: the size alone (no random reads)
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(_EDGE))
        if size > 2 * _EDGE:
            f.seek(size - _EDGE)
        digest.update(f.read(_EDGE))
    return {"bytes": size, "sha256_ends": digest.hexdigest()}


def operative_config(*, model: dict, data_files: list[str], **settings) -> dict:
    """The record: `model` and `settings` made JSON-able, plus each data file's fingerprint."""
    return {"model": _jsonable(model), **{k: _jsonable(v) for k, v in settings.items()},
            "data": {p: file_fingerprint(p) for p in data_files}}


def _flat(tree, prefix="") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def differences(before: dict, now: dict) -> list[str]:
    """`key: before -> now` for each setting that changed; data files by name."""
    out = []
    for path in sorted(set(before.get("data", {})) | set(now.get("data", {}))):
        a, b = before.get("data", {}).get(path), now.get("data", {}).get(path)
        if a != b:
            what = ("no longer read" if b is None else "newly read" if a is None
                    else f"changed ({a.get('bytes')} -> {b.get('bytes')} bytes)" if a.get("bytes") != b.get("bytes")
                    else "changed (same size, other content)")
            out.append(f"data file {path}: {what}")
    flat_a = _flat({k: v for k, v in before.items() if k != "data"})
    flat_b = _flat({k: v for k, v in now.items() if k != "data"})
    for key in sorted(set(flat_a) | set(flat_b)):
        if flat_a.get(key) != flat_b.get(key):
            out.append(f"{key}: {flat_a.get(key)!r} -> {flat_b.get(key)!r}")
    return out


def check_resume(model_dir: str, now: dict, allow_change: bool, error) -> None:
    """Raise `error(message)` when MODEL_DIR's record differs from `now` (unless allow_change)."""
    path = epath.Path(model_dir) / RUN_CONFIG_JSON
    if not path.exists():
        log.warning("%s has checkpoints but no %s (a run from before it was kept): configuration not compared",
                    model_dir, RUN_CONFIG_JSON)
        return
    changed = differences(json.loads(path.read_text()), now)
    if not changed:
        return
    if allow_change:
        log.warning("resuming %s with a changed configuration (CheckpointConfig.allow_config_change=True): %s",
                    model_dir, "; ".join(changed))
        return
    raise error(f"MODEL_DIR {model_dir} was trained with another configuration; it differs in: "
                + "; ".join(changed) + ". Rerun with the run's configuration, use a new MODEL_DIR, or set "
                "CheckpointConfig.allow_config_change=True to resume anyway")


def write(model_dir: str, now: dict) -> None:
    (epath.Path(model_dir) / RUN_CONFIG_JSON).write_text(json.dumps(now, indent=1, sort_keys=True))


def _key_name(key) -> str:
    for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey / FlattenedIndexKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _leaves(tree) -> dict:
    """{'a.b.0.c': (shape, dtype name)} of a tree of arrays, ShapeDtypeStructs or orbax ArrayMetadata
    (a namedtuple's fields and a dict's keys read alike: orbax stores both as dicts)."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        out[".".join(_key_name(k) for k in path)] = (None if shape is None else tuple(shape),
                                                      None if dtype is None else str(dtype))
    return out


def _show(value) -> str:
    shape, dtype = value
    return f"{shape} {dtype}" if shape is not None else str(dtype)


def tree_differences(saved, target, limit: int = 3) -> list[str]:
    """How a checkpoint's tree (its metadata) differs from the restore target: arrays only in the
    checkpoint, only in the run, or of another shape / dtype - each group counted, the first
    `limit` paths shown. [] when they fit."""
    have, want = _leaves(saved), _leaves(target)
    order = lambda p: (not p.startswith("params"), p)  # noqa: E731 - the params first, the optimizer's copies after
    only_saved = sorted(set(have) - set(want), key=order)
    only_run = sorted(set(want) - set(have), key=order)
    other = [p for p in sorted(set(have) & set(want), key=order) if have[p] != want[p]]
    out = []
    if only_saved:
        out.append(f"{len(only_saved)} array(s) only in the checkpoint ("
                   + ", ".join(f"{p} {_show(have[p])}" for p in only_saved[:limit]) + (", ..." if len(only_saved) > limit else "") + ")")
    if only_run:
        out.append(f"{len(only_run)} array(s) only in this run ("
                   + ", ".join(f"{p} {_show(want[p])}" for p in only_run[:limit]) + (", ..." if len(only_run) > limit else "") + ")")
    if other:
        out.append(f"{len(other)} array(s) of another shape or dtype ("
                   + ", ".join(f"{p}: checkpoint {_show(have[p])}, this run {_show(want[p])}" for p in other[:limit])
                   + (", ..." if len(other) > limit else "") + ")")
    return out


def check_fit(manager, read_metadata, target, model_dir: str, error) -> None:
    """Raise `error` naming what differs when a checkpoint that reads (its metadata does) does not
    fit `target`: a configuration difference, not damage - nothing is moved. A step whose metadata
    cannot be read is left to restore_newest_good (unreadable: set aside)."""
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            saved = read_metadata(step)
        except Exception:  # noqa: BLE001 - unreadable metadata: a damaged step, judged when restored
            continue
        if saved is None or not jax.tree_util.tree_leaves(saved):
            continue  # nothing readable: damaged, not another configuration
        changed = tree_differences(saved, target)
        if changed:
            source = os.path.join(str(manager.directory), str(step))
            raise error(f"checkpoint {source} does not fit this run's train state: " + "; ".join(changed)
                        + ". It reads back (it is not damaged): it was made with another model, optimizer or method, "
                        "which CheckpointConfig.allow_config_change cannot resume. Rerun with the configuration it was "
                        "made with, use a new MODEL_DIR, or set CheckpointConfig.restart_from_scratch=True to start "
                        "again from step 0 (the old checkpoints moved to MODEL_DIR/previous_runs)")


def restore_newest_good(manager, restore, model_dir: str, error):
    """(step, restored) of the newest checkpoint that restores, or (None, None) when there is none.
    A newer one that fails to restore is moved out of the manager's directory (so the run can
    write that step again) to MODEL_DIR/damaged_checkpoints/<step>, with a warning. Call check_fit
    first: a checkpoint of another configuration fails to restore too, and is no damage."""
    damaged = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            return step, restore(step)
        except Exception as e:  # noqa: BLE001 - orbax / TensorStore raise many kinds for a damaged step
            reason = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            source = os.path.join(str(manager.directory), str(step))
            if is_remote(source) or not os.path.isdir(source):
                raise error(f"checkpoint {source} cannot be restored ({reason}); delete that step directory "
                            "to resume from the one before it") from None
            target = os.path.join(model_dir, DAMAGED_CHECKPOINTS, str(step))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.exists(target):
                shutil.rmtree(target)
            shutil.move(source, target)
            damaged.append(step)
            log.warning("checkpoint step %d of %s is damaged (%s); moved to %s, resuming from the one before",
                        step, model_dir, reason, target)
            manager.reload()
    if damaged:
        raise error(f"no checkpoint of {model_dir} can be restored (damaged steps {damaged}, moved to "
                    f"{model_dir}/damaged_checkpoints); use a new MODEL_DIR, or set "
                    "CheckpointConfig.restart_from_scratch=True to start again from step 0 in this one")
    return None, None

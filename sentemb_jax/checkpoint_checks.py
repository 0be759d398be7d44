"""Consistency checks of Hugging Face checkpoint directories, beyond tensor names and shapes.

* `check_hf_config`: the config.json fields our backbones read hold values of the right type and
  range (transformers takes `"12"` for a head count, and `"type_vocab_size": 0` only fails at
  encode time with an IndexError).
* `tensor_dtype_problems`: what `checkpoints.params_from_hf` refuses beside missing, unexpected and
  wrong-shape tensors: integer / bool tensors for floating parameters (a cast would turn them into
  weights silently) and tensors holding NaN or inf.
* `remove_other_weights`: a save removes the weight files of other layouts first, since the
  loader prefers model.safetensors over a shard index and would read an old file instead.
* `staged_save`: a model directory written aside, then moved into place file by file.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import shutil
from typing import Callable, Iterable

import jax.numpy as jnp
import numpy as np

from sentemb_jax.errors import CheckpointError
from sentemb_jax.models import family_for
from sentemb_jax.validation import is_under

log = logging.getLogger(__name__)

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
CONFIG_FILE = "config.json"


# ---------------------------------------------------------------------------------------------
# config.json values

# transformers reads a null num_decoder_layers as "as many as num_layers".
_NULL_MEANS_DEFAULT = ("num_decoder_layers",)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_hf_config(hf, source: str) -> None:
    """CheckpointError `source: field must be ..., got value (type)` naming every field our model of
    hf's model_type reads that has a value of the wrong type or out of range (fields left out keep
    transformers' defaults; a model_type we do not support is config_from_hf's to refuse)."""
    if not isinstance(hf, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    family = family_for(hf.get("model_type"))
    if family is None:
        return
    fields = family.config_fields
    problems = []
    for field in fields.sizes:
        value = hf.get(field)
        if field in hf and not (_is_int(value) and value >= 1) and not (value is None and field in _NULL_MEANS_DEFAULT):
            problems.append(f"{field} must be a positive integer, got {_shown(value)}")
    vocab = hf.get("vocab_size") if _is_int(hf.get("vocab_size")) and hf["vocab_size"] >= 1 else None
    for field in fields.token_ids:
        value = hf.get(field)
        if value is not None and not (_is_int(value) and 0 <= value < (vocab or value + 1)):
            allowed = f"an integer in [0, vocab_size={vocab})" if vocab else "an integer >= 0"
            problems.append(f"{field} must be {allowed}, got {_shown(value)}")
    for field in fields.dropouts:
        if field in hf and not (_is_real(hf[field]) and 0 <= hf[field] < 1):
            problems.append(f"{field} must be a probability in [0, 1), got {_shown(hf[field])}")
    for field in fields.epsilons:
        if field in hf and not (_is_real(hf[field]) and hf[field] > 0):
            problems.append(f"{field} must be a number > 0, got {_shown(hf[field])}")
    if fields.divisible:
        (hidden_field, heads_field), (hidden, heads) = fields.divisible, (hf.get(f) for f in fields.divisible)
        if _is_int(hidden) and _is_int(heads) and hidden >= 1 and heads >= 1 and hidden % heads:
            problems.append(f"{hidden_field} {hidden} must be a multiple of {heads_field} {heads}")
    problems += fields.check(hf)
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# Tensor values


def tensor_dtype_problem(name: str, value: np.ndarray, want_dtype) -> tuple[str, str] | None:
    """('dtype', 'name: int64') for a non-floating tensor meant for a floating parameter,
    ('non-finite', 'name: 3 of 64 values') for one holding NaN or inf; None for a usable one."""
    floating = jnp.issubdtype(value.dtype, jnp.floating)
    if jnp.issubdtype(want_dtype, jnp.floating) and not floating:
        return "dtype", f"{name}: {value.dtype}"
    if floating and not np.isfinite(value).all():
        return "non-finite", f"{name}: {int(np.size(value) - np.count_nonzero(np.isfinite(value)))} of {np.size(value)} values"
    return None


def check_float_tensors(tensors: dict, source: str) -> None:
    """The tensors of a head or a projection (a Dense module, a classifier) that become float32
    parameters: a non-floating dtype or NaN / inf values is a CheckpointError naming each, before
    the cast would hide it."""
    wrong_dtype, non_finite = [], []
    for name, value in tensors.items():
        problem = tensor_dtype_problem(name, np.asarray(value), jnp.float32)
        if problem:
            (wrong_dtype if problem[0] == "dtype" else non_finite).append(problem[1])
    problems = tensor_problems([], [], [], wrong_dtype, non_finite)
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))


def tensor_problems(missing: list[str], unexpected: list[str], wrong_shape: list[str], wrong_dtype: list[str],
                    non_finite: list[str]) -> list[str]:
    """One phrase per kind of problem, each listing its tensors."""
    kinds = ((missing, "missing tensors", ", "), (unexpected, "unexpected tensors", ", "),
             (wrong_shape, "tensors with the wrong shape", "; "),
             (wrong_dtype, "tensors of a non-floating dtype for floating parameters", "; "),
             (non_finite, "tensors holding NaN or inf", "; "))
    return [f"{what} ({len(names)}): {sep.join(sorted(names))}" for names, what, sep in kinds if names]


# ---------------------------------------------------------------------------------------------
# Weight files on save


def _index_shards(model_dir: str, index: str, suffix: str) -> list[str]:
    """The shard files an existing index names that lie inside model_dir and are weight files
    (never, say, a config.json an odd index names); [] for an index that cannot be read."""
    try:
        with open(os.path.join(model_dir, index), encoding="utf-8") as f:
            names = set(json.load(f)["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return sorted(n for n in names if isinstance(n, str) and n.endswith(suffix) and "\0" not in n
                  and not os.path.isabs(n) and is_under(n, model_dir) and os.path.normpath(n) != ".")


def remove_other_weights(model_dir: str, writing: Iterable[str]) -> list[str]:
    """Remove the weight files of model_dir (model.safetensors, pytorch_model.bin, their shard
    indexes and the shards those name) that a save writing the files `writing` would not
    overwrite, with a warning naming them; returns their names."""
    keep = {os.path.normpath(n) for n in writing}
    stale = [SAFETENSORS_FILE, PICKLE_FILE, SAFETENSORS_INDEX, PICKLE_INDEX]
    stale += _index_shards(model_dir, SAFETENSORS_INDEX, ".safetensors") + _index_shards(model_dir, PICKLE_INDEX, ".bin")
    removed = []
    for name in dict.fromkeys(stale):
        path = os.path.join(model_dir, name)
        if os.path.normpath(name) not in keep and (os.path.isfile(path) or os.path.islink(path)):
            os.remove(path)
            removed.append(name)
    if removed:
        log.warning("%s: removed %s (weights of an earlier save that this save does not overwrite, which could "
                    "load instead of it)", model_dir, ", ".join(removed))
    return removed


def staged_save(out_dir: str, save: Callable[[str], None]) -> None:
    """`save(folder)` writes a model directory into a hidden staging folder inside `out_dir`; its
    files then replace `out_dir`'s, one rename each (weight files of another layout removed first,
    as above). An error or a signal (Interrupted) while it writes leaves `out_dir` as it was and no
    staging folder: never an export whose new weights sit beside an old modules.json, or the
    reverse. The caller holds `out_dir`'s lock."""
    staging = os.path.join(out_dir, f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save(staging)
        for root, _, files in os.walk(staging):
            target = os.path.join(out_dir, os.path.relpath(root, staging))
            os.makedirs(target, exist_ok=True)
            remove_other_weights(target, files)
            for name in files:
                os.replace(os.path.join(root, name), os.path.join(target, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""Hugging Face checkpoint directories <-> Flax parameters.

A local directory with `config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json`) becomes (config, params) for our Flax T5 / BERT-family modules,
and params are written back in exactly the same layout (removing the weight files of other layouts
that would load instead). Every problem with a checkpoint is reported at once, by tensor name, in a
`CheckpointError`; config.json values and tensor dtypes are checked too (checkpoint_checks). The
head of a one-logit *ForSequenceClassification checkpoint maps onto the cross-encoder's
(split_sequence_classifier).

Pickle-based checkpoints (`pytorch_model.bin`) can run arbitrary code when loaded, so they are
refused unless the caller passes `allow_pickle=True`; even then they go through torch's
weights-only loader.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Any, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from safetensors import SafetensorError, safe_open
from safetensors.flax import save_file

from sentemb_jax import checkpoint_checks as checks
from sentemb_jax.checkpoint_checks import CONFIG_FILE, PICKLE_FILE, PICKLE_INDEX, SAFETENSORS_FILE, SAFETENSORS_INDEX
from sentemb_jax.errors import CheckpointError
from sentemb_jax.models import FAMILIES, ModelConfig, SequenceClassifier, build_model, family_for, family_of
from sentemb_jax.models.family import strip_base_prefix
from sentemb_jax.validation import is_under

log = logging.getLogger(__name__)

Path = tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Configs


def read_hf_config_dict(model_dir: str) -> dict:
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file (a Hugging Face model directory needs config.json)")
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    checks.check_hf_config(hf, path)  # before any tensor is read
    return hf


def config_from_hf(hf: dict, tensor_names: Iterable[str] = (), source: str = CONFIG_FILE, **overrides) -> ModelConfig:
    """Our backbone config from a config.json dict (and which optional parts the weights hold), by
    the family that reads its model_type (models.family); `source` (the file) names where a bad
    value came from."""
    checks.check_hf_config(hf, source)  # transformers takes "12" for a count, or fails deep inside
    import transformers  # configs only: resolves defaults and legacy field names like HF does  # lazy: slow to import (seconds); only configs and tokenizer files are read with it

    model_type = hf.get("model_type")
    family = family_for(model_type)
    if family is None:
        raise CheckpointError(f"{source}: model_type={model_type!r} is not supported "
                              f"({', '.join(t for f in FAMILIES for t in f.model_types)})")
    c = transformers.CONFIG_MAPPING[model_type](**{k: v for k, v in hf.items() if k != "model_type"})
    cfg = family.config_from_hf(hf, c, frozenset(tensor_names))
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def hf_config_of(cfg: ModelConfig) -> dict:
    """The config.json of a backbone that came from no checkpoint (a tower trained from scratch),
    such that config_from_hf gives `cfg` back (execution settings - dtype, scan, remat - and our
    dropout placement aside)."""
    return family_of(cfg).hf_config_of(cfg)


def hf_name_map(cfg: ModelConfig) -> dict[str, tuple[Path, bool]]:
    """HF tensor name -> (our param path with layers unstacked, transpose?)."""
    return family_of(cfg).hf_name_map(cfg)


def _legacy_rename(name: str) -> str:
    # TF-era BERT checkpoints call LayerNorm parameters gamma / beta.
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


# ---------------------------------------------------------------------------------------------
# Reading and writing tensor files


def read_safetensors_file(path: str) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file, as stored (numpy; bfloat16 as ml_dtypes' type); CheckpointError
    naming the file if unreadable."""
    try:
        out = {}
        with safe_open(path, framework="np") as f:  # not "flax": jax without x64 would narrow int64 to int32
            for k in f.keys():
                out[k] = f.get_tensor(k)
        return out
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read safetensors file ({e})") from None


def _read_pickle_file(path: str) -> dict[str, np.ndarray]:
    import torch  # lazy: optional: only for pickle (.bin) checkpoints the user explicitly allows, and parity checks

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for corrupt / unsafe pickles
        raise CheckpointError(f"{path}: cannot load with torch's weights-only loader ({e})") from None
    out = {}
    for k, t in state.items():
        if t.dtype == torch.bfloat16:
            out[k] = t.float().numpy().astype(jnp.bfloat16)
        else:
            out[k] = t.numpy()
    return out


def index_files(model_dir: str, index_name: str) -> list[str]:
    """The shard files a shard index names (each inside model_dir, else a CheckpointError)."""
    path = os.path.join(model_dir, index_name)
    try:
        with open(path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not a valid shard index ({e})") from None

    for name in sorted(set(map(str, weight_map.values()))):  # each shard a file of this directory, never outside it
        if os.path.isabs(name) or not is_under(name, model_dir):
            raise CheckpointError(f"{path}: weight_map entry {name!r} leaves the model directory {os.path.normpath(model_dir)}")
    return sorted(set(weight_map.values()))


def read_hf_tensors(model_dir: str, allow_pickle: bool = False) -> dict[str, np.ndarray]:
    """All tensors of a HF checkpoint directory, safetensors preferred."""
    join = lambda name: os.path.join(model_dir, name)  # noqa: E731
    if not os.path.isdir(model_dir):
        raise CheckpointError(f"{model_dir}: no such model directory")
    if os.path.isfile(join(SAFETENSORS_FILE)):
        return read_safetensors_file(join(SAFETENSORS_FILE))
    if os.path.isfile(join(SAFETENSORS_INDEX)):
        tensors: dict[str, np.ndarray] = {}
        for shard in index_files(model_dir, SAFETENSORS_INDEX):
            if not os.path.isfile(join(shard)):
                raise CheckpointError(f"{join(shard)}: shard named in {SAFETENSORS_INDEX} is missing")
            tensors.update(read_safetensors_file(join(shard)))
        return tensors
    pickles = [n for n in (PICKLE_FILE, PICKLE_INDEX) if os.path.isfile(join(n))]
    if pickles:
        if not allow_pickle:
            raise CheckpointError(
                f"{join(pickles[0])}: refusing a pickle-based checkpoint (pickle can execute code). "
                "Convert it to safetensors, or pass allow_pickle=True if you trust its source."
            )
        if pickles[0] == PICKLE_FILE:
            return _read_pickle_file(join(PICKLE_FILE))
        tensors = {}
        for shard in index_files(model_dir, PICKLE_INDEX):
            tensors.update(_read_pickle_file(join(shard)))
        return tensors
    raise CheckpointError(
        f"{model_dir}: no weights found (looked for {SAFETENSORS_FILE}, {SAFETENSORS_INDEX}, {PICKLE_FILE}); "
        f"directory holds: {sorted(os.listdir(model_dir))}"
    )


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None):
    """One safetensors file (PyTorch's metadata format by default, as HF and sentence-transformers expect)."""
    save_file({k: jnp.asarray(v) for k, v in tensors.items()}, path, metadata=metadata or {"format": "pt"})


# ---------------------------------------------------------------------------------------------
# Param trees


def abstract_params(cfg: ModelConfig) -> dict:
    """Parameter shapes/dtypes (no allocation), unboxed from logical partitioning metadata."""
    model = build_model(cfg)
    ids = jnp.ones((1, 4), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, ids))
    return nn.meta.unbox(variables["params"])


_LAYER_KEY = re.compile(r"^layers_(\d+)$")


def stack_layers(params: dict) -> dict:
    """`layers_0..layers_{n-1}` subtrees -> one `layers` subtree stacked on axis 0 (for nn.scan)."""
    flat = traverse_util.flatten_dict(params)
    groups: dict[Path, dict[int, Any]] = {}
    out = {}
    for path, value in flat.items():
        idx = next((j for j, k in enumerate(path) if _LAYER_KEY.match(k)), None)
        if idx is None:
            out[path] = value
            continue
        key = path[:idx] + ("layers",) + path[idx + 1:]
        groups.setdefault(key, {})[int(_LAYER_KEY.match(path[idx]).group(1))] = value
    for key, by_layer in groups.items():
        out[key] = np.stack([np.asarray(by_layer[i]) for i in range(len(by_layer))])
    return traverse_util.unflatten_dict(out)


def unstack_layers(params: dict) -> dict:
    flat = traverse_util.flatten_dict(params)
    out = {}
    for path, value in flat.items():
        if "layers" in path:
            idx = path.index("layers")
            for i in range(value.shape[0]):
                out[path[:idx] + (f"layers_{i}",) + path[idx + 1:]] = value[i]
        else:
            out[path] = value
    return traverse_util.unflatten_dict(out)


def sort_hf_names(cfg: ModelConfig, raw_names: Iterable[str], ignore_unexpected: Iterable[str] = ()):
    """(found: our HF name -> the file's name, missing, unexpected, task heads) of a checkpoint's
    tensor names: base-model prefixes stripped and TF-era names renamed, redundant tensors (tied
    copies, buffers) dropped. Shared by this whole-file loader and sharded_load, which sorts the
    names of the file headers before it reads any data."""
    family = family_of(cfg)
    name_map = hf_name_map(cfg)
    redundant = re.compile(family.ignored_tensors(cfg))
    heads_pattern = re.compile(family.head_tensors) if family.head_tensors else None
    extra_ignore = [re.compile(p) for p in ignore_unexpected]
    found: dict[str, str] = {}
    unexpected, heads = [], []
    for raw_name in raw_names:
        name = _legacy_rename(strip_base_prefix(raw_name, family.base_prefixes))
        if name in name_map:
            found[name] = raw_name
        elif redundant.search(name) or any(p.search(raw_name) for p in extra_ignore):
            continue
        elif heads_pattern is not None and heads_pattern.search(name):
            heads.append(raw_name)
        else:
            unexpected.append(raw_name)
    return found, sorted(set(name_map) - set(found)), unexpected, heads


def params_from_hf(cfg: ModelConfig, tensors: dict[str, np.ndarray], source: str = "checkpoint", ignore_unexpected: Iterable[str] = ()) -> dict:
    """Map HF tensors onto our param tree, checking every name, shape, dtype (floating for floating
    parameters) and value (no NaN / inf); errors list them all."""
    name_map = hf_name_map(cfg)
    expected = traverse_util.flatten_dict(abstract_params(dataclasses.replace(cfg, scan_layers=False)))
    names, missing, unexpected, heads = sort_hf_names(cfg, tensors, ignore_unexpected)
    found = {name: tensors[raw] for name, raw in names.items()}
    wrong = {"shape": [], "dtype": [], "non-finite": []}
    flat = {}
    for name, value in found.items():
        path, transpose = name_map[name]
        value = np.asarray(value.T if transpose else value)
        want = expected[path]
        if tuple(value.shape) != tuple(want.shape):
            wrong["shape"].append(f"{name}: file has {tuple(value.shape if not transpose else value.T.shape)}, "
                                  f"config expects {tuple(want.shape[::-1] if transpose else want.shape)}")
            continue
        # astype would turn an integer or bool tensor into weights without a word.
        problem = checks.tensor_dtype_problem(name, value, want.dtype)
        if problem:
            wrong[problem[0]].append(problem[1])
            continue
        flat[path] = value.astype(want.dtype)
    problems = checks.tensor_problems(missing, unexpected, wrong["shape"], wrong["dtype"], wrong["non-finite"])
    if problems:
        raise CheckpointError(f"{source}: " + " | ".join(problems))
    if heads:
        log.warning("%s: ignoring %d task-head tensors not used by the encoder (%s ...)", source, len(heads), heads[0])
    params = traverse_util.unflatten_dict(flat)
    return stack_layers(params) if cfg.scan_layers else params


def params_to_hf(cfg: ModelConfig, params: dict) -> dict[str, np.ndarray]:
    params = unstack_layers(params) if cfg.scan_layers else params
    flat = traverse_util.flatten_dict(nn.meta.unbox(params))
    out = {}
    for name, (path, transpose) in hf_name_map(cfg).items():
        if path not in flat:
            raise CheckpointError(f"cannot export: parameter {'/'.join(path)} (for {name}) is missing")
        value = np.asarray(jax.device_get(flat[path]))
        out[name] = np.ascontiguousarray(value.T if transpose else value)
    return out


# ---------------------------------------------------------------------------------------------
# *ForSequenceClassification heads with one logit <-> the params of models.cross.ClassifierHead
# ({"pooler": {kernel, bias}, "kernel", "bias"}), each family's layouts in its
# `sequence_classifiers` (BERT: bert.pooler.dense (tanh) then `classifier`; RoBERTa and MPNet:
# classifier.dense (tanh) then classifier.out_proj).

SEQUENCE_CLASSIFIERS: dict[str, SequenceClassifier] = {t: c for f in FAMILIES for t, c in f.sequence_classifiers.items()}


def is_sequence_classifier(hf: dict) -> bool:
    return any(str(a).endswith("ForSequenceClassification") for a in hf.get("architectures") or [])


def split_sequence_classifier(hf: dict, tensors: dict[str, np.ndarray], source: str) -> tuple[dict[str, np.ndarray], dict]:
    """(the backbone's tensors, the head's params) of a *ForSequenceClassification checkpoint."""
    model_type = hf.get("model_type")
    if model_type not in SEQUENCE_CLASSIFIERS:
        raise CheckpointError(f"{source}: a sequence-classification head of model_type={model_type!r} is not supported "
                              f"(supported: {', '.join(SEQUENCE_CLASSIFIERS)})")
    layout = SEQUENCE_CLASSIFIERS[model_type]
    dense, out = layout.dense, layout.out
    rest, head, missing = dict(tensors), {}, []
    for name in (f"{dense}.weight", f"{dense}.bias", f"{out}.weight", f"{out}.bias"):
        short = name.removeprefix(layout.prefix)
        key = name if name in rest else short if short in rest else None
        if key is None:
            missing.append(name)
        else:
            head[name] = rest.pop(key)
    if missing:
        raise CheckpointError(f"{source}: sequence-classification head tensors missing: {', '.join(missing)}")
    checks.check_float_tensors(head, source)
    head = {name: np.asarray(value, np.float32) for name, value in head.items()}
    labels, hidden = head[f"{out}.weight"].shape
    if labels != 1:
        raise CheckpointError(f"{source}: a classifier with {labels} labels; CrossEncoder scores a pair with one logit "
                              "(num_labels=1)")
    want = {f"{dense}.weight": (hidden, hidden), f"{dense}.bias": (hidden,), f"{out}.bias": (1,)}
    wrong = [f"{n}: {head[n].shape}, expected {s}" for n, s in want.items() if head[n].shape != s]
    if wrong:
        raise CheckpointError(f"{source}: sequence-classification head tensors with the wrong shape: {'; '.join(wrong)}")
    return rest, {"pooler": {"kernel": head[f"{dense}.weight"].T, "bias": head[f"{dense}.bias"]},
                  "kernel": head[f"{out}.weight"].T, "bias": head[f"{out}.bias"]}


def sequence_classifier_to_hf(model_type: str, cfg: ModelConfig, backbone: dict, head: dict) -> dict[str, np.ndarray]:
    """Every tensor of the *ForSequenceClassification checkpoint of (backbone, head) params."""
    layout = SEQUENCE_CLASSIFIERS[model_type]
    out = {layout.prefix + name: value for name, value in params_to_hf(cfg, backbone).items()}
    dense, linear = layout.dense, layout.out
    f32 = lambda x: np.ascontiguousarray(np.asarray(jax.device_get(x), np.float32))  # noqa: E731
    out.update({f"{dense}.weight": f32(head["pooler"]["kernel"]).T.copy(), f"{dense}.bias": f32(head["pooler"]["bias"]),
                f"{linear}.weight": f32(head["kernel"]).T.copy(), f"{linear}.bias": f32(head["bias"])})
    return out


# ---------------------------------------------------------------------------------------------
# Public entry points


def load_hf_checkpoint(model_dir: str, allow_pickle: bool = False, ignore_unexpected: Iterable[str] = (), **config_overrides):
    """(config, params, hf_config_dict) from a local Hugging Face model directory."""
    if not os.path.isdir(model_dir):
        raise CheckpointError(f"{model_dir}: no such model directory")
    hf = read_hf_config_dict(model_dir)
    tensors = read_hf_tensors(model_dir, allow_pickle=allow_pickle)
    cfg = config_from_hf(hf, tensors.keys(), source=os.path.join(model_dir, CONFIG_FILE), **config_overrides)
    params = params_from_hf(cfg, tensors, source=model_dir, ignore_unexpected=ignore_unexpected)
    return cfg, params, hf


def save_hf_checkpoint(model_dir: str, cfg: ModelConfig, params: dict, hf_config: dict, max_shard_bytes: int | None = None):
    """Write config.json and model.safetensors (or shards + index when max_shard_bytes is set)."""
    os.makedirs(model_dir, exist_ok=True)
    tensors = params_to_hf(cfg, params)
    with open(os.path.join(model_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    total = sum(v.nbytes for v in tensors.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        checks.remove_other_weights(model_dir, [SAFETENSORS_FILE])
        write_safetensors(os.path.join(model_dir, SAFETENSORS_FILE), tensors)
        return
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        if shards[-1] and size + tensors[name].nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += tensors[name].nbytes
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    # An old model.safetensors would load in place of the new shards (the loader prefers it).
    checks.remove_other_weights(model_dir, names + [SAFETENSORS_INDEX])
    weight_map = {}
    for fname, shard in zip(names, shards):
        write_safetensors(os.path.join(model_dir, fname), shard)
        weight_map.update({name: fname for name in shard})
    with open(os.path.join(model_dir, SAFETENSORS_INDEX), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)

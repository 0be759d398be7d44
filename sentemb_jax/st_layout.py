"""A sentence-transformers model directory's layout: modules.json and its modules (Transformer,
Pooling, Dense, Normalize), read into a `Layout`; a Dense module's weights; the JSON files both
SentenceEncoder and CrossEncoder read and write. Module paths never leave the model directory."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from sentemb_jax import checkpoints
from sentemb_jax.checkpoint_checks import check_float_tensors
from sentemb_jax.errors import CheckpointError
from sentemb_jax.pooling import check_pooling_modes
from sentemb_jax.validation import is_under

# sentence-transformers' legacy Pooling keys, in the order it concatenates them.
ST_LEGACY_POOLING = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)
ST_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": None,
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
}

def read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


@dataclasses.dataclass
class Layout:
    """What a model directory holds, after reading modules.json (if any)."""

    transformer_dir: str
    pooling: tuple[str, ...] | None = None
    dense_dirs: list[str] = dataclasses.field(default_factory=list)
    normalize: bool = False
    max_seq_length: int | None = None
    lowercase: bool = False
    include_prompt: bool = True  # the Pooling module pools the prompt's tokens too



def transformer_dir_of(path: str) -> str:
    """The directory of the backbone and its tokenizer files: the Transformer module of a
    sentence-transformers model, else `path` itself."""
    return read_layout(path).transformer_dir


def _is_under(entry: str, root: str) -> bool:
    return "\0" not in entry and is_under(entry, root)


def read_layout(path: str) -> Layout:
    modules_path = os.path.join(path, "modules.json")
    if not os.path.isfile(modules_path):
        return Layout(transformer_dir=path)
    layout = Layout(transformer_dir=path)
    modules = read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{modules_path}: expected a list of module objects")
    for i, module in enumerate(modules):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        entry = module.get("path", "")
        # A module directory is one of this model directory's: never an absolute path or one out of it ('..').
        if not isinstance(entry, str) or os.path.isabs(entry) or not _is_under(entry, path):
            raise CheckpointError(f"{modules_path}: module {i} ({kind or '?'}) has path {entry!r}, which leaves the "
                                  f"model directory {os.path.normpath(path)}; module paths are relative to it")
        mdir = os.path.join(path, entry)
        if kind == "Transformer":
            layout.transformer_dir = mdir
            sb = os.path.join(mdir, "sentence_bert_config.json")
            if os.path.isfile(sb):
                sbc = read_json(sb)
                layout.max_seq_length = sbc.get("max_seq_length")
                layout.lowercase = bool(sbc.get("do_lower_case", False))
        elif kind == "Pooling":
            cfg = read_json(os.path.join(mdir, "config.json"))
            if "pooling_mode" in cfg:
                mode = cfg["pooling_mode"]
                modes = (mode,) if isinstance(mode, str) else tuple(mode)
            else:
                modes = tuple(name for key, name in ST_LEGACY_POOLING if cfg.get(key))
            layout.pooling = check_pooling_modes(modes)
            layout.include_prompt = bool(cfg.get("include_prompt", True))
        elif kind == "Dense":
            layout.dense_dirs.append(mdir)
        elif kind == "Normalize":
            layout.normalize = True
        else:
            raise CheckpointError(f"{modules_path}: module type {module.get('type')!r} is not supported")
    return layout


def read_dense(mdir: str, in_features: int, allow_pickle: bool) -> tuple[dict, int, bool, str | None]:
    cfg = read_json(os.path.join(mdir, "config.json"))
    act_name = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if act_name not in ST_ACTIVATIONS:
        raise CheckpointError(f"{mdir}/config.json: activation_function {act_name!r} is not supported ({sorted(ST_ACTIVATIONS)})")
    tensors = checkpoints.read_hf_tensors(mdir, allow_pickle=allow_pickle)
    use_bias = bool(cfg.get("bias", True))
    want = {"linear.weight"} | ({"linear.bias"} if use_bias else set())
    if set(tensors) != want:
        raise CheckpointError(f"{mdir}: Dense module tensors {sorted(tensors)} != expected {sorted(want)}")
    check_float_tensors(tensors, mdir)
    weight = tensors["linear.weight"]
    out_features = int(cfg.get("out_features", weight.shape[0]))
    if weight.shape != (out_features, in_features):
        raise CheckpointError(f"{mdir}: linear.weight has shape {weight.shape}, expected {(out_features, in_features)}")
    params = {"kernel": np.asarray(weight, np.float32).T}
    if use_bias:
        params["bias"] = np.asarray(tensors["linear.bias"], np.float32)
    return params, out_features, use_bias, ST_ACTIVATIONS[act_name]


def write_json(path: str, obj, sort_keys: bool = False) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=sort_keys)

"""`CrossEncoder`: score sentence pairs with a jointly-encoding model.

    ce = CrossEncoder.from_pretrained("path/to/all-MiniLM-L6-v2")     # backbone weights + a new head
    scores = ce.predict([("A man plays.", "Someone plays music.")])   # sigmoid scores in (0, 1)
    ce.save_pretrained("out/cross")                                   # backbone (HF layout) + head

It loads the same directories as `SentenceEncoder` (Hugging Face or sentence-transformers); the
head lives in `cross_encoder_head.safetensors` + `cross_encoder.json` next to the backbone, and a
directory without them gets a freshly initialised head (seeded).
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sentemb_jax import checkpoints
from sentemb_jax.checkpoints import CheckpointError
from sentemb_jax.data.packing import pack_texts
from sentemb_jax.encoder import _read_json, _read_layout, run_length_sorted
from sentemb_jax.models import ModelConfig, T5Config
from sentemb_jax.models.cross import T5_PAIR_FORMAT, CrossEncoderModule
from sentemb_jax.tokenization import DEFAULT_BUCKETS, Tokenizer, check_texts

HEAD_FILE = "cross_encoder_head.safetensors"
HEAD_CONFIG = "cross_encoder.json"


class CrossEncoder:
    """Tokenizer + Flax CrossEncoderModule + params {"backbone": ..., "head": ...}."""

    def __init__(self, module: CrossEncoderModule, params: dict, tokenizer: Tokenizer, hf_config: dict | None = None):
        self.module, self.params, self.tokenizer, self.hf_config = module, params, tokenizer, hf_config or {}
        self._logits = jax.jit(lambda p, f: module.apply({"params": p}, **f))

    @classmethod
    def from_pretrained(cls, path: str, pooling: str | None = None, max_seq_length: int = 64, seed: int = 0,
                        allow_pickle: bool = False, buckets: Sequence[int] = DEFAULT_BUCKETS, **config_overrides) -> "CrossEncoder":
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: no such model directory")
        layout = _read_layout(path)
        cfg, backbone, hf = checkpoints.load_hf_checkpoint(layout.transformer_dir, allow_pickle=allow_pickle, **config_overrides)
        saved = os.path.join(layout.transformer_dir, HEAD_CONFIG)
        head_cfg = _read_json(saved) if os.path.isfile(saved) else {}
        module = CrossEncoderModule(cfg, pooling=pooling or head_cfg.get("pooling", "first"))
        head_path = os.path.join(layout.transformer_dir, HEAD_FILE)
        head = _read_head(head_path, cfg.hidden_size) if os.path.isfile(head_path) else new_head(module, seed)
        tokenizer = Tokenizer.from_pretrained(layout.transformer_dir, max_length=max_seq_length, buckets=buckets,
                                              lowercase=layout.lowercase)
        return cls(module, {"backbone": backbone, "head": head}, tokenizer, hf)

    @property
    def config(self) -> ModelConfig:
        return self.module.backbone_config

    def features(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> dict[str, np.ndarray]:
        """Padded model inputs for `pairs` (BERT: pair template + token types; T5: T5_PAIR_FORMAT)."""
        ids, types = self.tokenize(pairs)
        return self.tokenizer.pad(ids, batch_size, types)

    def packed_features(self, pairs: Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
        """`features` plus their packed form (whole pairs laid end to end in rows of the max length;
        sentemb_jax.data.packing): training runs over real tokens only, ~2x fewer than padded."""
        f = self.features(pairs)
        extras = {"token_type_ids": [f["token_type_ids"]]} if "token_type_ids" in f else None
        return {**f, **pack_texts([f["input_ids"]], [f["attention_mask"]], self.tokenizer.max_length,
                                  self.tokenizer.pad_id, extras=extras)}

    def tokenize(self, pairs: Sequence[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]] | None]:
        first, second = _split_pairs(pairs)
        if isinstance(self.config, T5Config):
            return self.tokenizer.tokenize([T5_PAIR_FORMAT.format(a, b) for a, b in zip(first, second)]), None
        return self.tokenizer.tokenize_pairs(first, second)

    def predict(self, pairs: Sequence[tuple[str, str]], batch_size: int = 64, activation: str = "sigmoid") -> np.ndarray:
        """Scores [n] float32 in the order of `pairs`: sigmoid(logit) (activation='sigmoid') or the logit ('none')."""
        if activation not in ("sigmoid", "none"):
            raise ValueError(f"CrossEncoder.predict: activation {activation!r} (choose 'sigmoid' or 'none')")
        if batch_size < 1:
            raise ValueError(f"CrossEncoder.predict: batch_size must be >= 1, got {batch_size}")
        pairs = list(pairs)
        if not pairs:
            return np.zeros((0,), np.float32)
        ids, types = self.tokenize(pairs)

        def logits(chunk, rows):
            feats = self.tokenizer.pad([ids[i] for i in chunk], rows, None if types is None else [types[i] for i in chunk])
            return self._logits(self.params, feats)

        out = run_length_sorted([len(x) for x in ids], batch_size, logits, desc="predict")
        return 1.0 / (1.0 + np.exp(-out)) if activation == "sigmoid" else out

    def save_pretrained(self, out_dir: str) -> None:
        params = jax.device_get(self.params)
        checkpoints.save_hf_checkpoint(out_dir, self.config, params["backbone"], self.hf_config)
        checkpoints.write_safetensors(os.path.join(out_dir, HEAD_FILE),
                                       {k: np.asarray(v, np.float32) for k, v in params["head"].items()})
        with open(os.path.join(out_dir, HEAD_CONFIG), "w", encoding="utf-8") as f:
            json.dump({"pooling": self.module.pooling, "t5_pair_format": T5_PAIR_FORMAT}, f, indent=2)
        self.tokenizer.save_pretrained(out_dir)


def new_head(module: CrossEncoderModule, seed: int) -> dict:
    """A fresh head for `module`: Hugging Face's classifier init, kernel normal(0.02), zero bias."""
    d = module.backbone_config.hidden_size
    kernel = jax.random.normal(jax.random.PRNGKey(seed), (d, 1), jnp.float32) * 0.02
    return {"kernel": kernel, "bias": jnp.zeros((1,), jnp.float32)}


def _split_pairs(pairs) -> tuple[list[str], list[str]]:
    pairs = list(pairs)
    for i, p in enumerate(pairs):
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise TypeError(f"CrossEncoder: pair {i} is not a (text, text) pair: {p!r:.80}")
    return check_texts([p[0] for p in pairs], "CrossEncoder"), check_texts([p[1] for p in pairs], "CrossEncoder")


def _read_head(path: str, hidden: int) -> dict:
    tensors = checkpoints.read_safetensors_file(path)
    want = {"kernel": (hidden, 1), "bias": (1,)}
    for name, shape in want.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: missing tensor {name!r}")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)}, expected {shape}")
    return {k: jnp.asarray(tensors[k]) for k in want}

"""`CrossEncoder`: score sentence pairs with a jointly-encoding model.

    ce = CrossEncoder.from_pretrained("path/to/all-MiniLM-L6-v2")     # backbone weights + a new head
    scores = ce.predict([("A man plays.", "Someone plays music.")])   # sigmoid scores in (0, 1)
    ce.save_pretrained("out/cross")       # sentence_transformers.CrossEncoder("out/cross") loads it

The directories it reads and writes (the head kinds are `pooling` in sentemb_jax.models.cross):

- Hugging Face *ForSequenceClassification, one label (BERT / RoBERTa family), saved by transformers
  or sentence-transformers: head `pooler`, which is exactly HF's head (BERT: bert.pooler.dense +
  tanh, dropout, classifier; RoBERTa: classifier.dense + tanh, classifier.out_proj). BERT-family
  models with this head are written so: config.json (architectures, id2label / label2id as
  transformers writes them), model.safetensors (`bert.*` / `roberta.*` + the head), the tokenizer,
  and what sentence-transformers writes beside them (modules.json, sentence_bert_config.json with
  the max length, config_sentence_transformers.json: activation Sigmoid, its default for one label).
  A new head on a BERT-family backbone is this one, starting from the backbone's pooler if it has one.
- sentence-transformers' modular cross-encoder: Transformer, Pooling (cls / mean), Dense to one
  logit (`scores`, identity activation): heads `first` / `mean` (the first token or the mean,
  dropout, one linear). No HF sequence classifier computes that (BERT's always goes through its
  tanh pooler), so BERT-family models with these heads are written in this layout: exact in
  sentence-transformers, not loadable by transformers' AutoModelForSequenceClassification.
- ours: the backbone in HF layout + cross_encoder_head.safetensors + cross_encoder.json. T5
  cross-encoders are written so (their pair is one text, models.t5.PAIR_FORMAT, which neither transformers
  nor sentence-transformers builds; cross_encoder.json and README.md in the directory say so), and
  directories of earlier versions (any backbone) load.

A directory with none of these heads (a bi-encoder, a bare backbone) gets a new head, seeded.
Weights are read from safetensors; pickle checkpoints only with allow_pickle=True.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sentemb_jax import checkpoints
from sentemb_jax.checkpoint_checks import check_float_tensors, remove_other_weights
from sentemb_jax.data.packing import pack_texts
from sentemb_jax.encode_contract import check_batch_size, check_pairs
from sentemb_jax.encoder import _position_limit, _within_positions
from sentemb_jax.errors import CheckpointError, InputTypeError
from sentemb_jax.inference import (
    DeviceParams,
    compile_instead_of_run,
    params_for_compute,
    run_length_sorted,
    run_packed,
    shared_programs,
    warm_up_lengths,
)
from sentemb_jax.models import ModelConfig, family_of
from sentemb_jax.models.cross import CROSS_POOLING, CrossEncoderModule
from sentemb_jax.st_layout import read_dense, read_json, read_layout, write_json
from sentemb_jax.tokenization import DEFAULT_BUCKETS, Tokenizer, check_ids_fit, check_texts

log = logging.getLogger(__name__)

HEAD_FILE = "cross_encoder_head.safetensors"
HEAD_CONFIG = "cross_encoder.json"
DEFAULT_MAX_LENGTH = 64  # a new head's (and an earlier version's directory's) max length

# sentence-transformers 6 files and module types, as it writes them.
MODULES_JSON = "modules.json"
ST_MODULE_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
_ST_TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
_ST_POOLING = "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
_ST_DENSE = "sentence_transformers.base.modules.dense.Dense"
_ST_IDENTITY = "torch.nn.modules.linear.Identity"
_ST_SIGMOID = "torch.nn.modules.activation.Sigmoid"
_ST_POOLING_MODES = {"first": "cls", "mean": "mean"}
_POOLING_DIR, _DENSE_DIR = "1_Pooling", "2_Dense"
_OUR_LAYOUT_NOTE = ("sentemb_jax cross-encoder layout (T5: the pair is one text, t5_pair_format): the backbone in Hugging "
                    "Face layout, the head in cross_encoder_head.safetensors. transformers and sentence-transformers "
                    "would put a new, random head on this backbone: load it with sentemb_jax.CrossEncoder.from_pretrained.")


def _predict_programs(module: CrossEncoderModule) -> tuple:
    """predict's jitted programs: padded batches, packed rows."""
    return (jax.jit(lambda p, f: module.apply({"params": p}, **f)),
            jax.jit(lambda p, a: module.apply({"params": p}, a["input_ids"], None, a.get("token_type_ids"), packing=a["packing"])))


class CrossEncoder:
    """Tokenizer + Flax CrossEncoderModule + params {"backbone": ..., "head": ...}."""

    params = DeviceParams()

    def __init__(self, module: CrossEncoderModule, params: dict, tokenizer: Tokenizer, hf_config: dict | None = None):
        self.module, self.params, self.tokenizer, self.hf_config = module, params, tokenizer, hf_config or {}
        self._logits, self._logits_packed = shared_programs(_predict_programs, module)
        # predict's batching: True (default), whole pairs packed end to end in rows
        # (sentemb_jax.inference): the padded path's scores within 1e-5, fewer token slots; False,
        # length-sorted padded batches.
        self.packed = True

    @classmethod
    def from_pretrained(cls, path: str, pooling: str | None = None, max_seq_length: int | None = None, seed: int = 0,
                        allow_pickle: bool = False, buckets: Sequence[int] = DEFAULT_BUCKETS, **config_overrides) -> "CrossEncoder":
        """Any directory of the module docstring. pooling: a new head's ('pooler' for BERT-family
        backbones, 'first' for T5, by default); a saved head keeps its own. max_seq_length: default
        the saved cross-encoder's (sentence_bert_config.json, else its tokenizer's, capped at the
        positions), 64 for a new head."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: no such model directory")
        layout = read_layout(path)
        tdir = layout.transformer_dir
        hf = checkpoints.read_hf_config_dict(tdir)
        tensors = checkpoints.read_hf_tensors(tdir, allow_pickle=allow_pickle)
        saved = None  # (pooling, head params, max length) of a saved head
        if checkpoints.is_sequence_classifier(hf):
            tensors, head = checkpoints.split_sequence_classifier(hf, tensors, tdir)
            saved = ("pooler", head, layout.max_seq_length)
        cfg = checkpoints.config_from_hf(hf, tensors.keys(), **config_overrides)
        saved = saved or _modular_head(layout, cfg.hidden_size, allow_pickle) or _our_head(tdir, cfg.hidden_size)
        if saved:
            if pooling is not None and pooling != saved[0]:
                log.warning("%s: the saved head pools %r; pooling=%r is ignored", path, saved[0], pooling)
            pooling = saved[0]
        family = family_of(cfg)
        pooling = pooling or family.cross_pooling
        if pooling not in CROSS_POOLING:
            raise ValueError(f"CrossEncoder: pooling {pooling!r} (choose from {CROSS_POOLING})")
        if pooling not in family.cross_poolings:
            raise ValueError(f"CrossEncoder: pooling {pooling!r} (Hugging Face's sequence-classification head) is for "
                             f"BERT-family backbones (BERT, RoBERTa, MPNet); {family.name} takes {' or '.join(map(repr, family.cross_poolings))}")
        backbone = checkpoints.params_from_hf(cfg, tensors, source=tdir)
        pretrained_pooler = None
        if pooling == "pooler" and getattr(cfg, "add_pooling_layer", False):  # the head holds the pooler
            pretrained_pooler = backbone.pop("pooler")
            cfg = dataclasses.replace(cfg, add_pooling_layer=False)
        module = CrossEncoderModule(cfg, pooling=pooling)
        # HF's BertForSequenceClassification starts from the checkpoint's pooler; RoBERTa's head is new.
        classifier = checkpoints.SEQUENCE_CLASSIFIERS.get(hf.get("model_type"))
        from_pooler = classifier is not None and classifier.head_from_pooler
        head = saved[1] if saved else new_head(module, seed, pretrained_pooler if from_pooler else None)
        if max_seq_length is None:
            max_seq_length = saved[2] if saved else DEFAULT_MAX_LENGTH
        tokenizer = Tokenizer.from_pretrained(tdir, max_length=_within_positions(max_seq_length, cfg, path), buckets=buckets,
                                              lowercase=layout.lowercase)
        check_ids_fit(tokenizer, cfg.vocab_size, tdir)
        if tokenizer.max_length > (_position_limit(cfg) or tokenizer.max_length):  # the tokenizer's own default
            tokenizer = Tokenizer(tokenizer.hf, _position_limit(cfg), buckets, tokenizer.lowercase, tokenizer.source_dir)
        head = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), head)
        return cls(module, {"backbone": backbone, "head": head}, tokenizer, hf)

    @property
    def config(self) -> ModelConfig:
        return self.module.backbone_config

    def features(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> dict[str, np.ndarray]:
        """Padded model inputs for `pairs` (BERT: pair template + token types; T5: models.t5.PAIR_FORMAT)."""
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
        pair_format = family_of(self.config).pair_format
        if pair_format is not None:
            return self.tokenizer.tokenize([pair_format.format(a, b) for a, b in zip(first, second)]), None
        return self.tokenizer.tokenize_pairs(first, second)

    def predict(self, pairs: Sequence[tuple[str, str]], batch_size: int = 64, activation: str = "sigmoid") -> np.ndarray:
        """Scores [n] float32 in the order of `pairs`: sigmoid(logit) (activation='sigmoid', as
        sentence_transformers.CrossEncoder.predict for one label) or the logit ('none').

        pairs: as sentence-transformers takes them (`encode_contract.check_pairs`): a list / tuple of
        (text, text) pairs or a numpy array [n, 2] of str gives [n]; one pair (a tuple, a list or a
        1-D array of two texts) gives a scalar; a set, a generator or bytes raise InputTypeError.
        batch_size: an integer >= 1, else ConfigError."""
        where = "CrossEncoder.predict"
        if activation not in ("sigmoid", "none"):
            raise ValueError(f"{where}: activation {activation!r} (choose 'sigmoid' or 'none')")
        batch_size = check_batch_size(batch_size, where)
        pairs, single = check_pairs(pairs, where)
        if not pairs:
            return np.zeros((0,), np.float32)
        out = self._token_list_logits(*self.tokenize(pairs), batch_size)
        out = 1.0 / (1.0 + np.exp(-out)) if activation == "sigmoid" else out
        return out[0] if single else out

    def warm_up(self, batch_size: int = 64, max_length: int | None = None, run: bool = False) -> int:
        """Compile predict's shapes before the first call, as `SentenceEncoder.warm_up` (without
        running them unless `run`): full batches of `batch_size` pairs at every bucket up to
        `max_length` (default: the model's), in the current batching. Returns how many lengths."""
        lengths = warm_up_lengths(self.tokenizer, max_length)
        with_types = self.tokenize([("a", "b")])[1] is not None
        for n in lengths:
            ids = [[self.tokenizer.pad_id] * n] * batch_size
            self._token_list_logits(ids, [[0] * n] * batch_size if with_types else None, batch_size, compile_only=not run)
        return len(lengths)

    def _token_list_logits(self, ids: list[list[int]], types: list[list[int]] | None, batch_size: int,
                           compile_only: bool = False) -> np.ndarray:
        logits_packed, logits_padded = self._logits_packed, self._logits
        if compile_only:
            logits_packed, logits_padded = compile_instead_of_run(logits_packed), compile_instead_of_run(logits_padded)
        params = params_for_compute(self)
        if self.packed and all(ids):
            return run_packed(ids, batch_size, lambda arrays: logits_packed(params, jax.device_put(arrays)), (), self.tokenizer.pad_id,
                              extras=None if types is None else {"token_type_ids": types}, buckets=self.tokenizer.buckets,
                              desc="predict")

        def logits(chunk, rows):
            feats = self.tokenizer.pad([ids[i] for i in chunk], rows, None if types is None else [types[i] for i in chunk])
            return logits_padded(params, jax.device_put(feats))

        return run_length_sorted([len(x) for x in ids], batch_size, logits, desc="predict")

    def save_pretrained(self, out_dir: str) -> None:
        """The layout of the module docstring for this head: HF sequence classifier (BERT family,
        `pooler`), sentence-transformers modules (BERT family, `first` / `mean`), ours (T5)."""
        os.makedirs(out_dir, exist_ok=True)
        params = jax.device_get(self.params)
        if not family_of(self.config).sequence_classifiers:  # no layout of transformers' (T5)
            _remove(out_dir, [MODULES_JSON, ST_MODULE_CONFIG, ST_CONFIG] + _MODULE_FILES)
            self._save_ours(out_dir, params)
        else:
            _remove(out_dir, [HEAD_FILE, HEAD_CONFIG] + (_MODULE_FILES if self.module.pooling == "pooler" else []))
            if self.module.pooling == "pooler":
                self._save_sequence_classifier(out_dir, params)
            else:
                self._save_modules(out_dir, params)
        self.tokenizer.save_pretrained(out_dir)

    def _save_sequence_classifier(self, out_dir: str, params: dict) -> None:
        model_type = self.hf_config.get("model_type") or self.config.model_type
        if model_type not in checkpoints.SEQUENCE_CLASSIFIERS:
            raise CheckpointError(f"cannot save a sequence classifier of model_type={model_type!r}")
        labels = self.hf_config.get("id2label")
        labels = labels if isinstance(labels, dict) and len(labels) == 1 else {"0": "LABEL_0"}
        hf = {**self.hf_config, "architectures": [checkpoints.SEQUENCE_CLASSIFIERS[model_type].architecture],
              "id2label": labels, "label2id": {name: int(i) for i, name in labels.items()}}
        hf.pop("num_labels", None)  # transformers writes id2label, from which it counts the labels
        write_json(os.path.join(out_dir, checkpoints.CONFIG_FILE), hf, sort_keys=True)
        remove_other_weights(out_dir, [checkpoints.SAFETENSORS_FILE])
        checkpoints.write_safetensors(os.path.join(out_dir, checkpoints.SAFETENSORS_FILE),
                                      checkpoints.sequence_classifier_to_hf(model_type, self.config, params["backbone"], params["head"]))
        self._write_st_files(out_dir, "sequence-classification", [("", _ST_TRANSFORMER)])

    def _save_modules(self, out_dir: str, params: dict) -> None:
        checkpoints.save_hf_checkpoint(out_dir, self.config, params["backbone"], self.hf_config)
        d = self.config.hidden_size
        write_json(os.path.join(out_dir, _POOLING_DIR, "config.json"),
                    {"embedding_dimension": d, "pooling_mode": _ST_POOLING_MODES[self.module.pooling], "include_prompt": True})
        write_json(os.path.join(out_dir, _DENSE_DIR, "config.json"),
                    {"in_features": d, "out_features": 1, "bias": True, "activation_function": _ST_IDENTITY,
                     "module_input_name": "sentence_embedding", "module_output_name": "scores"})
        head = params["head"]
        remove_other_weights(os.path.join(out_dir, _DENSE_DIR), [checkpoints.SAFETENSORS_FILE])
        checkpoints.write_safetensors(os.path.join(out_dir, _DENSE_DIR, checkpoints.SAFETENSORS_FILE),
                                      {"linear.weight": np.asarray(head["kernel"], np.float32).T.copy(),
                                       "linear.bias": np.asarray(head["bias"], np.float32)})
        self._write_st_files(out_dir, "feature-extraction",
                             [("", _ST_TRANSFORMER), (_POOLING_DIR, _ST_POOLING), (_DENSE_DIR, _ST_DENSE)])

    def _write_st_files(self, out_dir: str, task: str, modules: list[tuple[str, str]]) -> None:
        """modules.json, sentence_bert_config.json (+ the max length and lowercasing, which
        sentence-transformers' Transformer reads) and config_sentence_transformers.json."""
        output = ("logits", "scores") if task == "sequence-classification" else ("last_hidden_state", "token_embeddings")
        write_json(os.path.join(out_dir, ST_MODULE_CONFIG), {
            "transformer_task": task, "modality_config": {"text": {"method": "forward", "method_output_name": output[0]}},
            "module_output_name": output[1], "max_seq_length": self.tokenizer.max_length,
            "do_lower_case": self.tokenizer.lowercase})
        write_json(os.path.join(out_dir, ST_CONFIG), {"model_type": "CrossEncoder", "activation_fn": _ST_SIGMOID,
                                                       "prompts": {}, "default_prompt_name": None})
        write_json(os.path.join(out_dir, MODULES_JSON),
                    [{"idx": i, "name": str(i), "path": p, "type": t} for i, (p, t) in enumerate(modules)])

    def _save_ours(self, out_dir: str, params: dict) -> None:
        checkpoints.save_hf_checkpoint(out_dir, self.config, params["backbone"], self.hf_config)
        checkpoints.write_safetensors(os.path.join(out_dir, HEAD_FILE),
                                      {k: np.asarray(params["head"][k], np.float32) for k in ("kernel", "bias")})
        write_json(os.path.join(out_dir, HEAD_CONFIG), {
            "pooling": self.module.pooling, "t5_pair_format": family_of(self.config).pair_format, "max_seq_length": self.tokenizer.max_length,
            "layout": _OUR_LAYOUT_NOTE})
        with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
            f.write(f"# Cross-encoder (sentemb_jax)\n\n{_OUR_LAYOUT_NOTE}\n\n```python\nfrom sentemb_jax import CrossEncoder\n"
                    f"scores = CrossEncoder.from_pretrained(path).predict([(\"a sentence\", \"another\")])\n```\n")


def new_head(module: CrossEncoderModule, seed: int, pooler: dict | None = None) -> dict:
    """A fresh head for `module`: Hugging Face's classifier init, kernels normal(0.02), zero biases;
    the `pooler` head's tanh dense is `pooler` when given (a pretrained BERT pooler)."""
    d = module.backbone_config.hidden_size
    key = jax.random.PRNGKey(seed)
    head = {"kernel": jax.random.normal(key, (d, 1), jnp.float32) * 0.02, "bias": jnp.zeros((1,), jnp.float32)}
    if module.pooling == "pooler":
        head["pooler"] = pooler or {"kernel": jax.random.normal(jax.random.fold_in(key, 1), (d, d), jnp.float32) * 0.02,
                                    "bias": jnp.zeros((d,), jnp.float32)}
    return head


def _split_pairs(pairs) -> tuple[list[str], list[str]]:
    pairs = list(pairs)
    for i, p in enumerate(pairs):
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise InputTypeError(f"CrossEncoder: pair {i} is not a (text, text) pair: {p!r:.80}")
    return check_texts([p[0] for p in pairs], "CrossEncoder"), check_texts([p[1] for p in pairs], "CrossEncoder")


def _modular_head(layout, hidden: int, allow_pickle: bool) -> tuple[str, dict, int | None] | None:
    """A sentence-transformers cross-encoder's Pooling + Dense-to-`scores` head, as ours; None without one."""
    scores = [d for d in layout.dense_dirs if read_json(os.path.join(d, "config.json")).get("module_output_name") == "scores"]
    if not scores:
        return None
    inverse = {v: k for k, v in _ST_POOLING_MODES.items()}
    where = scores[0]
    if len(layout.dense_dirs) != 1 or layout.normalize or len(layout.pooling or ()) != 1 or layout.pooling[0] not in inverse:
        raise CheckpointError(f"{where}: a sentence-transformers cross-encoder is read as one Pooling (cls or mean) then "
                              f"one Dense to the score; this one has pooling {layout.pooling}, "
                              f"{len(layout.dense_dirs)} Dense module(s){', Normalize' if layout.normalize else ''}")
    params, out_features, use_bias, act = read_dense(where, hidden, allow_pickle)
    if out_features != 1 or act is not None:
        raise CheckpointError(f"{where}: the score Dense has {out_features} outputs and activation {act!r}; "
                              "CrossEncoder reads one logit with no activation")
    if not use_bias:
        params["bias"] = np.zeros((1,), np.float32)
    return inverse[layout.pooling[0]], params, layout.max_seq_length


def _our_head(tdir: str, hidden: int) -> tuple[str, dict, int] | None:
    """The head of our own layout (T5, and earlier versions' directories); None without one."""
    path = os.path.join(tdir, HEAD_FILE)
    if not os.path.isfile(path):
        return None
    cfg_path = os.path.join(tdir, HEAD_CONFIG)
    head_cfg = read_json(cfg_path) if os.path.isfile(cfg_path) else {}
    tensors = checkpoints.read_safetensors_file(path)
    want = {"kernel": (hidden, 1), "bias": (1,)}
    for name, shape in want.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: missing tensor {name!r}")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)}, expected {shape}")
    head = {k: tensors[k] for k in want}
    check_float_tensors(head, path)
    return head_cfg.get("pooling", "first"), head, head_cfg.get("max_seq_length", DEFAULT_MAX_LENGTH)


# The sentence-transformers module files of the other layouts, removed when a directory is saved over.
_MODULE_FILES = [os.path.join(_POOLING_DIR, "config.json"), os.path.join(_DENSE_DIR, "config.json"),
                 os.path.join(_DENSE_DIR, checkpoints.SAFETENSORS_FILE)]


def _remove(out_dir: str, names: list[str]) -> None:
    """Files an earlier save of another layout left (they would decide how the directory loads)."""
    for name in names:
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.remove(path)
        parent = os.path.dirname(path)
        if os.path.normpath(parent) != os.path.normpath(out_dir) and os.path.isdir(parent) and not os.listdir(parent):
            os.rmdir(parent)


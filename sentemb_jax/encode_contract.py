"""sentence-transformers' `SentenceTransformer.encode` contract (6.2.0), for `SentenceEncoder`.

The keyword checks, prompts, post-processing (truncate, normalise, quantise, output type), the
similarity functions and `config_sentence_transformers.json` (prompts, default_prompt_name,
similarity_fn_name, truncate_dim), with sentence-transformers' semantics, written for numpy / JAX:

* `quantize_embeddings` is `sentence_transformers.quantize_embeddings` (same buckets: per-dimension
  [min, max] cut in 255 steps, `floor`, int8 = uint8 - 128; binary = packed bits of `x > 0`).
  sentence-transformers is a test dependency only (it imports torch), so it is not called here.
* `similarity` / `similarity_pairwise` are `util.cos_sim` / `dot_score` / `euclidean_sim` /
  `manhattan_sim` and their pairwise forms; they return JAX arrays where sentence-transformers
  returns torch tensors, and compute in float64 on the host (exact distances, no matmul shortcut).
"""
from __future__ import annotations

import json
import logging
import numbers
import os
import sys
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from sentemb_jax.errors import CheckpointError, ConfigError, InputTypeError
from sentemb_jax.pooling import l2_normalize_host
from sentemb_jax.tokenization import check_texts

log = logging.getLogger(__name__)

ST_CONFIG = "config_sentence_transformers.json"
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
OUTPUT_VALUES = ("sentence_embedding", "token_embeddings")
SIMILARITY_FN_NAMES = ("cosine", "dot", "euclidean", "manhattan")
# SentenceTransformer's default prompts: these names exist (as "") unless a config or the caller sets them.
DEFAULT_PROMPT_NAMES = ("query", "document")
# MTEB 1.x's custom-model protocol (sentemb_jax.evaluation.encoding) passes these: accepted, ignored.
MTEB_KEYWORDS = ("task_name", "prompt_type")
# sentence-transformers' modality keys of a dict input (base/modality.py, MULTIMODAL_DICT_KEYS); a
# text model takes "text" alone.
MODALITY_KEYS = ("audio", "image", "text", "video")


# ------------------------------------------------------------------------------------------------
# Inputs: sentence-transformers 6.2's rule (SentenceTransformer / CrossEncoder.is_singular_input,
# base/modality.py: infer_modality) of what is one input and what is a batch, for a text model.


def _is_batch(value) -> bool:
    """A list, a tuple, a numpy array (>= 1-D) of str / objects, or a datasets Column (looked up only
    where `datasets` is already imported: a Column exists only then)."""
    column = getattr(sys.modules.get("datasets"), "Column", None)
    if isinstance(value, (list, tuple)) or (isinstance(column, type) and isinstance(value, column)):
        return True
    return isinstance(value, np.ndarray) and value.ndim >= 1 and value.dtype.kind in ("U", "O")


TEXTS_EXPECTED = "pass a str, or a list / tuple / numpy array of str"
PAIRS_EXPECTED = "pass a list / tuple of (text, text) pairs, or a numpy array [n, 2] of str"


def _unsupported(value, name: str, where: str, expected: str = TEXTS_EXPECTED) -> InputTypeError:
    """The error for an input that is neither one input nor a batch (sentence-transformers: ValueError
    `Unsupported input type: <type>`)."""
    kind = type(value).__name__
    if isinstance(value, (set, frozenset)):
        why = f"a {kind} has no order (its items would come back in hash order), pass a list"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        why = "texts are str, decode it first (e.g. .decode('utf-8'))"
    elif isinstance(value, np.ndarray):
        kind = f"numpy array of dtype {value.dtype} and shape {value.shape}"
        why = expected
    else:
        why = f"{expected} (an iterator or other iterable: list(...) it)"
    shown = repr(value)
    shown = "" if " at 0x" in shown else f"; got {shown:.80}"  # a generator's or iterator's repr: its type says it
    return InputTypeError(f"{where}: unsupported input type {kind} for {name}: {why}{shown}")


def _dict_text(value: dict, name: str, where: str) -> str:
    """The text of a dict input: sentence-transformers takes {'text': str} as that text (its
    modality form); any other dict raises there too (other keys, other modalities, chat messages)."""
    if not value:
        raise InputTypeError(f"{where}: {name} is an empty dict; a text is a str or {{'text': str}}")
    unknown = sorted(set(value) - set(MODALITY_KEYS), key=str)
    if unknown:
        raise InputTypeError(f"{where}: {name} is a dict with unrecognized modality key(s) {unknown} (the keys are "
                             f"{', '.join(MODALITY_KEYS)}); a text is a str or {{'text': str}}: {value!r:.80}")
    others = sorted(set(value) - {"text"})
    if others:
        raise InputTypeError(f"{where}: {name} holds modality {'+'.join(others)!r}, which this text model does not "
                             f"support; a text is a str or {{'text': str}}: {value!r:.80}")
    if not isinstance(value["text"], str):
        raise InputTypeError(f"{where}: {name}['text'] is {type(value['text']).__name__}, not str (pre-tokenized or "
                             f"batched text in a dict is not supported): {value['text']!r:.80}")
    return value["text"]


def check_inputs(inputs, where: str, name: str = "sentences") -> tuple[list[str], bool]:
    """(the texts, whether `inputs` was one text) by sentence-transformers 6.2's rule for encode's
    input on a text model: a str, or a dict {'text': str}, is one text; a list, a tuple, a numpy
    array of str / objects or a datasets Column is a batch of them. Anything else raises an
    InputTypeError (a TypeError and a ValueError; sentence-transformers raises ValueError) naming
    `name` and the value: a set (no order), bytes, a generator, a dict of other keys, an item that
    is not a str (tokenization.check_texts: also a lone surrogate, InvalidTextError)."""
    if isinstance(inputs, str):
        return check_texts([inputs], where), True
    if isinstance(inputs, dict):
        return check_texts([_dict_text(inputs, name, where)], where), True
    if inputs is None:
        raise InputTypeError(f"{where}: expected a list of strings, got None")
    if not _is_batch(inputs):
        raise _unsupported(inputs, name, where)
    items = inputs.tolist() if isinstance(inputs, np.ndarray) else list(inputs)
    items_where = where if name == "sentences" else f"{where}: {name}"
    items = [_dict_text(t, f"item {i}", items_where) if isinstance(t, dict) else t for i, t in enumerate(items)]
    return check_texts(items, items_where), False


def check_pairs(pairs, where: str) -> tuple[list, bool]:
    """(the pairs as a list, whether `pairs` was one pair) by sentence-transformers 6.2's
    CrossEncoder.predict rule: a list / tuple / datasets Column whose first item is not a list or
    tuple, or a 1-D numpy array of str, is one pair; a list / tuple / Column of pairs, or a numpy
    array [n, 2] of str / objects (its rows), is a batch. Anything else (a str, a set, a generator,
    bytes) raises an InputTypeError; each pair's texts are checked when tokenised."""
    if pairs is None:
        raise InputTypeError(f"{where}: expected a list of (text, text) pairs, got None")
    if not _is_batch(pairs):
        raise _unsupported(pairs, "pairs", where, PAIRS_EXPECTED)
    if isinstance(pairs, np.ndarray):
        items, single = pairs.tolist(), pairs.size > 0 and pairs.ndim == 1
    else:
        items = list(pairs)
        single = bool(items) and not isinstance(items[0], (list, tuple))
    return ([items] if single else items), single


def check_batch_size(batch_size, where: str) -> int:
    """An integer >= 1 (a bool is not one); ConfigError (a ValueError) naming the value."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise ConfigError(f"{where}: batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size < 1:
        raise ConfigError(f"{where}: batch_size must be >= 1, got {batch_size}")
    return int(batch_size)


# ------------------------------------------------------------------------------------------------
# encode's keywords


def check_keywords(kwargs: dict, pool, chunk_size, where: str) -> None:
    """TypeError for a keyword `encode` does not take (sentence-transformers raises for them too)."""
    unknown = sorted(set(kwargs) - set(MTEB_KEYWORDS))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; it takes "
                        "sentence-transformers' encode keywords (prompt_name, prompt, batch_size, show_progress_bar, "
                        "output_value, precision, convert_to_numpy, convert_to_tensor, device, normalize_embeddings, "
                        f"truncate_dim), normalize= and MTEB's {', '.join(MTEB_KEYWORDS)}")
    if pool is not None or chunk_size is not None:
        raise TypeError(f"{where}(): multi-process encoding (pool=, chunk_size=) is not supported; one process "
                        "encodes on JAX's devices")


def _check_bool(value, name: str, where: str, optional: bool = False) -> None:
    if (value is None and optional) or isinstance(value, (bool, np.bool_)):
        return
    raise ConfigError(f"{where}: {name} must be True or False, got {value!r}")


def resolve_normalize(normalize_embeddings, normalize, where: str) -> bool:
    """normalize_embeddings (sentence-transformers' name, default False) or our older `normalize`
    (the same switch); both given must agree."""
    _check_bool(normalize_embeddings, "normalize_embeddings", where, optional=True)
    _check_bool(normalize, "normalize", where, optional=True)
    if normalize is not None and normalize_embeddings is not None and bool(normalize) != bool(normalize_embeddings):
        raise ConfigError(f"{where}: normalize={normalize} and normalize_embeddings={normalize_embeddings} disagree "
                          "(normalize is the older name of normalize_embeddings); give one of them")
    return bool(normalize if normalize is not None else normalize_embeddings or False)


def check_truncate_dim(truncate_dim, where: str, dim: int | None = None) -> int | None:
    """None or an integer >= 1. Given the embedding dimension `dim` (encode), a truncate_dim above
    it keeps every dimension, as in sentence-transformers, which says nothing: here a warning does."""
    if truncate_dim is None:
        return None
    if isinstance(truncate_dim, bool) or not isinstance(truncate_dim, numbers.Integral) or truncate_dim < 1:
        raise ConfigError(f"{where}: truncate_dim must be None or an integer >= 1, got {truncate_dim!r}")
    if dim is not None and truncate_dim > dim:
        log.warning("%s: truncate_dim=%d is more than the embedding dimension %d; the embeddings keep all %d "
                    "dimensions (as in sentence-transformers)", where, truncate_dim, dim, dim)
    return int(truncate_dim)


def check_options(output_value, precision, convert_to_numpy, convert_to_tensor, show_progress_bar,
                  where: str) -> str:
    """Checks encode's value keywords; returns the precision (None means float32, as in sentence-transformers)."""
    if output_value is None:
        raise ConfigError(f"{where}: output_value=None (every model output per text) is not supported; "
                          f"choose from {OUTPUT_VALUES}")
    if output_value not in OUTPUT_VALUES:
        raise ConfigError(f"{where}: output_value {output_value!r} is not supported; choose from {OUTPUT_VALUES}")
    precision = "float32" if precision is None else precision
    if precision not in PRECISIONS:
        raise ConfigError(f"{where}: precision {precision!r} is not supported; choose from {PRECISIONS}")
    _check_bool(convert_to_numpy, "convert_to_numpy", where)
    _check_bool(convert_to_tensor, "convert_to_tensor", where)
    _check_bool(show_progress_bar, "show_progress_bar", where, optional=True)
    return precision


# ------------------------------------------------------------------------------------------------
# Prompts and config_sentence_transformers.json


def merge_prompts(prompts: dict | None, default_prompt_name: str | None, config: dict,
                  where: str = "SentenceEncoder") -> tuple[dict[str, str], str | None]:
    """SentenceTransformer's rule: the caller's prompts, then the saved ones for names the caller did
    not set, then "" for the default names (query, document) still unset; the caller's default
    prompt name, else the saved one, which must name a prompt."""
    if prompts is not None and (not isinstance(prompts, dict)
                                or not all(isinstance(k, str) and isinstance(v, (str, type(None))) for k, v in prompts.items())):
        raise ConfigError(f"{where}: prompts must be a dict of name -> prompt text, got {prompts!r:.200}")
    merged: dict[str, str | None] = {name: None for name in DEFAULT_PROMPT_NAMES}
    merged.update(prompts or {})
    for name, text in (config.get("prompts") or {}).items():
        if merged.get(name) is None:
            merged[name] = text
    merged = {name: "" if text is None else text for name, text in merged.items()}
    if default_prompt_name is None:
        default_prompt_name = config.get("default_prompt_name")
    if default_prompt_name is not None and default_prompt_name not in merged:
        raise ConfigError(f"{where}: default_prompt_name {default_prompt_name!r} is not one of the prompts "
                          f"{sorted(merged)}")
    return merged, default_prompt_name


def resolve_prompt(prompts: dict[str, str], default_prompt_name: str | None, prompt, prompt_name,
                   where: str) -> str | None:
    """The text put before each sentence: `prompt`; else prompts[prompt_name]; else the default
    prompt name's. `prompt` wins over `prompt_name` (sentence-transformers logs a warning)."""
    if prompt is not None and not isinstance(prompt, str):
        raise ConfigError(f"{where}: prompt must be a str or None, got {prompt!r:.80}")
    if prompt is not None:
        if prompt_name is not None:
            log.warning("%s: both prompt and prompt_name given; prompt_name %r is ignored in favour of prompt",
                        where, prompt_name)
        return prompt
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise ConfigError(f"{where}: prompt_name {prompt_name!r} is not one of this model's prompts "
                              f"{sorted(prompts)} (set them with from_pretrained(prompts=...) or encoder.prompts)")
        return prompts[prompt_name]
    if default_prompt_name is not None:
        return prompts.get(default_prompt_name)
    return None


def with_prompt(texts: list[str], model, prompt, prompt_name, where: str) -> list[str]:
    """`texts` with the resolved prompt (resolve_prompt) put before each."""
    prompt = resolve_prompt(model.prompts, model.default_prompt_name, prompt, prompt_name, where)
    if not prompt:
        return texts
    if not model.include_prompt:
        raise ConfigError(f"{where}: this model's Pooling leaves the prompt's tokens out (include_prompt: false), "
                          "which is not supported; encode without a prompt")
    if getattr(model, "tokenizer", None) is not None:
        warn_if_prompt_fills(model.tokenizer, prompt, where)
    return [prompt + t for t in texts]


# tokenizer -> {prompt: its token count}: each prompt is tokenised once per tokenizer, so an encode
# call with a prompt costs a dict lookup; a tokenizer that is dropped takes its counts with it.
_PROMPT_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def warn_if_prompt_fills(tokenizer, prompt: str, where: str) -> None:
    """A warning (once per tokenizer and prompt) when the prompt alone takes every token the max
    length leaves beside the special tokens: truncation then cuts every text away, and all texts
    embed alike."""
    counts = _PROMPT_TOKENS.setdefault(tokenizer, {})
    if prompt in counts:
        return
    text = prompt.lower() if tokenizer.lowercase else prompt
    # verbose=False: transformers' own warning for a sequence over the model's length is not this one.
    counts[prompt] = n = len(tokenizer.hf.encode(text, add_special_tokens=False, verbose=False))
    room = tokenizer.max_length - tokenizer.hf.num_special_tokens_to_add(pair=False)
    if n >= room:
        log.warning("%s: the prompt is %d tokens and max_seq_length is %d (%d beside the special tokens): no token of "
                    "the text is left after truncation, so every text embeds the same; prompt %r", where, n,
                    tokenizer.max_length, room, prompt if len(prompt) <= 60 else prompt[:57] + "...")


def check_similarity_fn_name(value, where: str = "SentenceEncoder") -> str | None:
    """None (cosine, set on first use) or one of SIMILARITY_FN_NAMES; sentence-transformers'
    SimilarityFunction members are taken by their value."""
    value = getattr(value, "value", value)
    if value is not None and value not in SIMILARITY_FN_NAMES:
        raise ConfigError(f"{where}: similarity_fn_name {value!r} is not supported; choose from {SIMILARITY_FN_NAMES}")
    return value


def read_st_config(model_dir: str) -> dict:
    """The model-level settings of model_dir/config_sentence_transformers.json ({} when absent)."""
    path = os.path.join(model_dir, ST_CONFIG)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, (str, type(None)))
                                                for k, v in prompts.items()):
        raise CheckpointError(f"{path}: prompts must be an object of name -> prompt text")
    default = config.get("default_prompt_name")
    if default is not None and not isinstance(default, str):
        raise CheckpointError(f"{path}: default_prompt_name must be a string or null, got {default!r}")
    similarity = config.get("similarity_fn_name")
    if similarity is not None and similarity not in SIMILARITY_FN_NAMES:
        # sentence-transformers keeps its default (cosine) for a name it does not support, e.g. "maxsim".
        log.warning("%s: similarity_fn_name %r is not one of %s; using cosine", path, similarity, SIMILARITY_FN_NAMES)
        similarity = None
    truncate = config.get("truncate_dim")
    if truncate is not None and (isinstance(truncate, bool) or not isinstance(truncate, int) or truncate < 1):
        raise CheckpointError(f"{path}: truncate_dim must be an integer >= 1 or null, got {truncate!r}")
    return {"prompts": prompts, "default_prompt_name": default, "similarity_fn_name": similarity,
            "truncate_dim": truncate}


class ModelSettings:
    """SentenceTransformer's model-level settings, kept in config_sentence_transformers.json:
    `prompts` (name -> text put before each sentence; "query" and "document" exist, empty, unless
    set), `default_prompt_name`, `similarity_fn_name` (cosine unless set), `truncate_dim` (encode's
    default); `include_prompt`: whether the Pooling module pools the prompt's tokens."""

    def _init_settings(self, prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                       similarity_fn_name: str | None = None, truncate_dim: int | None = None,
                       include_prompt: bool = True, config: dict | None = None) -> None:
        """The caller's settings, else the saved ones (`config`): SentenceTransformer's loading rule."""
        config = config or {}
        where = type(self).__name__
        self.prompts, self.default_prompt_name = merge_prompts(prompts, default_prompt_name, config, where)
        self.similarity_fn_name = similarity_fn_name if similarity_fn_name is not None else config.get("similarity_fn_name")
        self.truncate_dim = check_truncate_dim(truncate_dim if truncate_dim is not None else config.get("truncate_dim"), where)
        self.include_prompt = bool(include_prompt)

    def _settings(self) -> dict:
        """The settings as `_init_settings` takes them: for a copy with other weights or layers, or as
        the saved `config` under a caller's overrides."""
        return {"prompts": dict(self.prompts), "default_prompt_name": self.default_prompt_name,
                "similarity_fn_name": self._similarity_fn_name, "truncate_dim": self.truncate_dim,
                "include_prompt": self.include_prompt}

    def _st_config(self) -> dict:
        """What save_pretrained writes to config_sentence_transformers.json (SentenceTransformer's keys)."""
        config = {"model_type": "SentenceTransformer", "prompts": dict(self.prompts),
                  "default_prompt_name": self.default_prompt_name, "similarity_fn_name": self.similarity_fn_name}
        if self.truncate_dim is not None:
            config["truncate_dim"] = self.truncate_dim
        return config

    @property
    def similarity_fn_name(self) -> str:
        """'cosine', 'dot', 'euclidean' or 'manhattan': what `similarity` computes (cosine unless set)."""
        if self._similarity_fn_name is None:
            self._similarity_fn_name = "cosine"
        return self._similarity_fn_name

    @similarity_fn_name.setter
    def similarity_fn_name(self, value) -> None:
        self._similarity_fn_name = check_similarity_fn_name(value, type(self).__name__)

    def similarity(self, embeddings1, embeddings2):
        """[n1, n2] float32 scores (a JAX array) of every embedding of the first set against every
        one of the second ([dim] counts as one), by `similarity_fn_name` (euclidean / manhattan:
        the negative distance): SentenceTransformer.similarity."""
        return similarity(embeddings1, embeddings2, self.similarity_fn_name)

    def similarity_pairwise(self, embeddings1, embeddings2):
        """[n] float32 scores of embeddings1[i] against embeddings2[i]: SentenceTransformer.similarity_pairwise."""
        return similarity_pairwise(embeddings1, embeddings2, self.similarity_fn_name)


# ------------------------------------------------------------------------------------------------
# Outputs


def finish_sentence_embeddings(out: np.ndarray, *, truncate_dim: int | None, normalize: bool, precision: str,
                               convert_to_numpy: bool, convert_to_tensor: bool, single: bool):
    """[n, dim] float32 from the model -> what encode returns: truncated, then L2-normalised,
    then quantised; a JAX array (convert_to_tensor), a numpy array (convert_to_numpy) or a list of
    JAX rows; one row for a single text."""
    if truncate_dim is not None:
        out = out[:, :truncate_dim]
    if normalize:
        out = l2_normalize_host(out)
    if precision != "float32":
        out = quantize_embeddings(out, precision)
    if convert_to_tensor:
        result = jnp.asarray(out)
    elif convert_to_numpy:
        result = np.asarray(out)
    else:
        result = [jnp.asarray(row) for row in out]
    return result[0] if single else result


def finish_token_embeddings(rows: list[np.ndarray], precision: str, single: bool):
    """Token embeddings [tokens_i, hidden] per text: JAX arrays, or numpy arrays once quantised (with
    ranges shared by all texts' tokens), as sentence-transformers returns them."""
    result = quantize_embeddings(rows, precision) if precision != "float32" else [jax.device_put(r) for r in rows]
    return result[0] if single else result


def _quantization_ranges(embeddings: np.ndarray, precision: str, calibration_embeddings) -> np.ndarray:
    if calibration_embeddings is None:
        if embeddings.ndim == 1 or embeddings.shape[0] == 1:
            raise ConfigError(f"cannot compute {precision} quantization ranges from a single embedding: encode more "
                              "texts at once, or quantize_embeddings(..., ranges= or calibration_embeddings=) from a "
                              "representative set")
        if embeddings.shape[0] < 100:
            log.warning("%s quantization ranges from only %d embeddings; ranges or calibration_embeddings from more "
                        "embeddings are more stable", precision, embeddings.shape[0])
        calibration_embeddings = embeddings
    calibration_embeddings = np.asarray(calibration_embeddings)
    return np.vstack((calibration_embeddings.min(axis=0), calibration_embeddings.max(axis=0)))


def quantize_embeddings(embeddings, precision: str, ranges: np.ndarray | None = None,
                        calibration_embeddings: np.ndarray | None = None):
    """`sentence_transformers.quantize_embeddings`: float embeddings [n, dim] (numpy, JAX, or a list
    of rows or of [tokens, dim] matrices) to `precision`.

    int8 / uint8: per dimension, [min, max] from `ranges` ([2, dim]), else from
    `calibration_embeddings`, else from the embeddings themselves (not from a single one), cut in
    255 equal steps; code = floor((x - min) / step) clipped to [0, 255] (int8: code - 128).
    binary / ubinary: the bits of x > 0 packed 8 to a byte (binary: byte - 128 as int8)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"quantize_embeddings: precision {precision!r} is not supported; choose from {PRECISIONS}")
    if isinstance(embeddings, (list, tuple)):
        if not embeddings:
            return []
        rows = [np.asarray(e) for e in embeddings]
        if rows[0].ndim == 2:  # per-text token matrices: one set of ranges for all
            if precision.endswith("int8") and ranges is None:
                data = np.concatenate(rows, axis=0) if calibration_embeddings is None else calibration_embeddings
                if len(data):
                    ranges = _quantization_ranges(np.asarray(data), precision, calibration_embeddings)
            return [quantize_embeddings(m, precision, ranges, calibration_embeddings) for m in rows]
        embeddings = np.array(rows)
    embeddings = np.asarray(embeddings)
    if not np.issubdtype(embeddings.dtype, np.floating):
        raise ConfigError(f"quantize_embeddings: embeddings must be floats, got {embeddings.dtype}")
    if embeddings.ndim == 2 and embeddings.shape[0] == 0:
        dim = embeddings.shape[1]
        width = dim if precision.endswith("int8") else (dim + 7) // 8
        if precision == "float32":
            return embeddings.astype(np.float32)
        return np.zeros((0, width), np.int8 if precision in ("int8", "binary") else np.uint8)
    if precision == "float32":
        return embeddings.astype(np.float32)
    if precision.endswith("int8"):
        if ranges is None:
            ranges = _quantization_ranges(embeddings, precision, calibration_embeddings)
        ranges = np.asarray(ranges).astype(np.float32, copy=False)
        starts = ranges[0]
        steps = (ranges[1] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        codes = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return codes.astype(np.uint8) if precision == "uint8" else (codes - 128).astype(np.int8)
    bits = np.packbits(embeddings > 0, axis=-1)
    return bits if precision == "ubinary" else (bits.astype(np.int16) - 128).astype(np.int8)


# ------------------------------------------------------------------------------------------------
# Similarity


def _as_array(x, where: str) -> np.ndarray:
    if isinstance(x, (list, tuple)):
        x = np.stack([np.asarray(r) for r in x]) if len(x) else np.zeros((0, 0))
    x = np.asarray(x)
    if x.ndim not in (1, 2):
        raise ValueError(f"{where}: embeddings must be [n, dim] or [dim], got shape {x.shape}")
    return x.astype(np.float64)


def _pairwise_rows(a: np.ndarray, b: np.ndarray, fn) -> np.ndarray:
    """fn(a[i] - b[j] over the last axis) for all i, j, a few rows of a at a time (bounded memory)."""
    rows = max(1, (1 << 24) // max(1, b.shape[0] * b.shape[1]))
    return np.concatenate([fn(a[s : s + rows, None, :] - b[None]) for s in range(0, max(len(a), 1), rows)], axis=0)


def similarity(a, b, name: str):
    """[n, m] scores of every row of `a` against every row of `b` ([dim] inputs count as one row)."""
    a, b = _as_array(a, "similarity"), _as_array(b, "similarity")
    a, b = a.reshape(1, -1) if a.ndim == 1 else a, b.reshape(1, -1) if b.ndim == 1 else b
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"similarity: embeddings of width {a.shape[1]} and {b.shape[1]}")
    if name == "cosine":
        out = l2_normalize_host(a) @ l2_normalize_host(b).T
    elif name == "dot":
        out = a @ b.T
    elif name == "euclidean":
        out = -_pairwise_rows(a, b, lambda d: np.sqrt(np.sum(d * d, axis=-1)))
    elif name == "manhattan":
        out = -_pairwise_rows(a, b, lambda d: np.sum(np.abs(d), axis=-1))
    else:
        raise ConfigError(f"similarity: unknown similarity_fn_name {name!r}; choose from {SIMILARITY_FN_NAMES}")
    return jnp.asarray(out.astype(np.float32))


def similarity_pairwise(a, b, name: str):
    """[n] scores of a[i] against b[i]."""
    a, b = _as_array(a, "similarity_pairwise"), _as_array(b, "similarity_pairwise")
    if a.shape != b.shape:
        raise ValueError(f"similarity_pairwise: embeddings of shapes {a.shape} and {b.shape}; they must match")
    if name == "cosine":
        out = np.sum(l2_normalize_host(a) * l2_normalize_host(b), axis=-1)
    elif name == "dot":
        out = np.sum(a * b, axis=-1)
    elif name == "euclidean":
        out = -np.linalg.norm(a - b, axis=-1)
    elif name == "manhattan":
        out = -np.sum(np.abs(a - b), axis=-1)
    else:
        raise ConfigError(f"similarity_pairwise: unknown similarity_fn_name {name!r}; choose from {SIMILARITY_FN_NAMES}")
    return jnp.asarray(np.asarray(out, np.float32))


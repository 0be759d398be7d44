"""Tokenisation from a local model directory, with bucketed padding.

Batches are padded to the longest sequence in the batch rounded up to one of a few bucket
lengths, so a jitted encoder only ever compiles a handful of shapes.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
import shutil
from typing import Sequence

import numpy as np

from sentemb_jax.errors import CheckpointError, InputTypeError, InvalidTextError, TokenizerError

# Steps of ~12-25%: padding waste stays small (cost is linear in padded length) while a corpus
# compiles at most ~20 shapes. Coarser buckets (8, 16, 32, ...) cost ~25% throughput on STS-B.
DEFAULT_BUCKETS = (8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
TRAIN_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # training: coarse, each shape costs a compile


def bucket_length(length: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """Smallest bucket >= length; beyond the largest bucket, the next multiple of it."""
    i = bisect.bisect_left(buckets, length)
    if i < len(buckets):
        return buckets[i]
    top = buckets[-1]
    return -(-length // top) * top


# Files one of which a Hugging Face tokenizer directory holds (fast: tokenizer.json; WordPiece:
# vocab.txt; SentencePiece: spiece.model / sentencepiece.bpe.model / tokenizer.model; BPE: vocab.json).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model", "vocab.json")


def check_texts(texts, where: str = "encode") -> list[str]:
    """A list of strings, or an InputTypeError (a TypeError) naming the first item that is not one
    (an InvalidTextError for a string holding a lone surrogate, which no tokenizer can encode)."""
    if isinstance(texts, str):
        raise InputTypeError(f"{where}: expected a list of strings, got a single str (wrap it in a list)")
    if texts is None:
        raise InputTypeError(f"{where}: expected a list of strings, got None")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputTypeError(f"{where}: item {i} is {type(t).__name__}, not str: {t!r:.80}")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidTextError(f"{where}: item {i} is not valid Unicode (lone surrogate {t[e.start]!r} at "
                                   f"character {e.start})") from None
    return texts


class Tokenizer:
    """Wraps a Hugging Face tokenizer loaded with AutoTokenizer.from_pretrained(local_dir)."""

    def __init__(self, hf_tokenizer, max_length: int, buckets: Sequence[int] = DEFAULT_BUCKETS, lowercase: bool = False,
                 source_dir: str | None = None):
        self.hf = hf_tokenizer
        self.max_length = int(max_length)
        self.buckets = tuple(sorted(b for b in buckets if b < self.max_length)) + (self.max_length,)
        self.lowercase = lowercase
        self.source_dir = source_dir  # the directory it was loaded from (its vocabulary files)
        pad = hf_tokenizer.pad_token_id
        self.pad_id = 0 if pad is None else int(pad)

    @classmethod
    def from_pretrained(cls, model_dir: str, max_length: int | None = None, buckets: Sequence[int] = DEFAULT_BUCKETS, lowercase: bool = False):
        import transformers  # lazy: slow to import (seconds); only configs and tokenizer files are read with it

        if not os.path.isdir(model_dir):
            raise TokenizerError(f"{model_dir}: no such tokenizer directory")
        if not any(os.path.isfile(os.path.join(model_dir, f)) for f in TOKENIZER_FILES):
            # AutoTokenizer would build a 5-token fallback vocabulary: every word [UNK], no error.
            raise TokenizerError(f"{os.path.normpath(model_dir)}: no tokenizer found (looked for {', '.join(TOKENIZER_FILES)})")
        try:
            hf = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except (OSError, ValueError, TypeError) as e:
            raise TokenizerError(f"{model_dir}: cannot load a tokenizer ({e})") from None
        if max_length is None:
            model_max = getattr(hf, "model_max_length", None)
            max_length = model_max if model_max and model_max < 100_000 else 512
        return cls(hf, max_length, buckets, lowercase, source_dir=model_dir)

    def largest_id(self) -> int:
        """The largest token id this tokenizer can give: the vocabulary's size less one, or an added
        token's id past it."""
        added = getattr(self.hf, "added_tokens_decoder", None) or {}
        return max(len(self.hf) - 1, max(added, default=-1))

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids (with special tokens) of each text, truncated to max_length; no padding."""
        if self.lowercase:
            texts = [t.lower() for t in texts]
        return self.hf(list(texts), add_special_tokens=True, truncation=True, max_length=self.max_length)["input_ids"]

    def tokenize_pairs(self, first: Sequence[str], second: Sequence[str]) -> tuple[list[list[int]], list[list[int]]]:
        """Ids and token type ids of each pair encoded jointly by the tokenizer's pair template
        ("[CLS] a [SEP] b [SEP]" for BERT), truncated longest-first to max_length."""
        first, second = check_texts(first, "tokenize_pairs"), check_texts(second, "tokenize_pairs")
        if len(first) != len(second):
            raise ValueError(f"tokenize_pairs: {len(first)} first texts but {len(second)} second texts")
        if self.lowercase:
            first, second = [t.lower() for t in first], [t.lower() for t in second]
        enc = self.hf(first, second, add_special_tokens=True, truncation=True, max_length=self.max_length,
                      return_token_type_ids=True)
        return enc["input_ids"], enc["token_type_ids"]

    def pad(self, ids: Sequence[Sequence[int]], batch_size: int | None = None,
            token_type_ids: Sequence[Sequence[int]] | None = None) -> dict[str, np.ndarray]:
        """Right-pad to a bucket length (and, when batch_size is given, add empty rows up to it)."""
        longest = max((len(x) for x in ids), default=1)
        length = bucket_length(max(longest, 1), self.buckets)
        rows = max(len(ids), batch_size or 0)
        input_ids = np.full((rows, length), self.pad_id, dtype=np.int32)
        mask = np.zeros((rows, length), dtype=np.int32)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)] = x
            mask[i, : len(x)] = 1
        out = {"input_ids": input_ids, "attention_mask": mask}
        if token_type_ids is not None:
            types = np.zeros((rows, length), dtype=np.int32)
            for i, x in enumerate(token_type_ids):
                types[i, : len(x)] = x
            out["token_type_ids"] = types
        return out

    def __call__(self, texts: Sequence[str], batch_size: int | None = None) -> dict[str, np.ndarray]:
        return self.pad(self.tokenize(check_texts(texts, "tokenize")), batch_size)

    # The vocabularies the TF input pipeline reads (sentemb_jax.data.vocab): HF's fast tokenizers
    # save only tokenizer.json, so a model exported from training could not be trained further.
    VOCAB_FILES = ("vocab.txt", "spiece.model")

    def save_pretrained(self, out_dir: str):
        self.hf.save_pretrained(out_dir)
        if not self.source_dir:
            return
        for name in self.VOCAB_FILES:
            src, dst = os.path.join(self.source_dir, name), os.path.join(out_dir, name)
            if os.path.isfile(src) and not os.path.exists(dst):
                shutil.copyfile(src, dst)


def check_ids_fit(tokenizer: Tokenizer, vocab_size: int, where: str) -> None:
    """CheckpointError naming `where` (the model directory) and both numbers when the tokenizer can
    give a token id the model's embedding table has no row for: JAX's lookup (jnp.take) does not
    fail on one, it embeds it as NaN."""
    top = tokenizer.largest_id()
    if top >= vocab_size:
        raise CheckpointError(f"{where}: the tokenizer's largest token id is {top}, but the model's embedding table has "
                              f"{vocab_size} rows (vocab_size); ids >= {vocab_size} have no embedding")


def tokenizer_fingerprint(model_dir: str) -> str:
    """sha256 of what decides the ids of a text: the vocabulary file, the tokenizer settings and the
    added tokens (a corpus tokenized once, data.prepare, is only read by a model whose tokenizer has
    the same)."""
    digest = hashlib.sha256()
    for name in ("spiece.model", "vocab.txt", "tokenizer_config.json"):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    tokenizer_json = os.path.join(model_dir, "tokenizer.json")
    added = None
    if os.path.isfile(tokenizer_json):
        with open(tokenizer_json, encoding="utf-8") as f:
            entries = json.load(f).get("added_tokens")
        added = None if entries is None else {t["content"]: int(t["id"]) for t in entries}
    digest.update(json.dumps(added, sort_keys=True).encode())
    return digest.hexdigest()

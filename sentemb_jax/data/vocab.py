"""seqio vocabularies for our backbones, tokenising inside the TF graph.

* T5 / mT5: `seqio.SentencePieceVocabulary` on the directory's `spiece.model` (+ EOS).
* BERT / MiniLM: `WordPieceVocabulary`, a seqio vocabulary over `tensorflow_text.BertTokenizer`
  whose ids (with [CLS] ... [SEP]) equal the Hugging Face tokenizer's for the same directory.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import seqio
import tensorflow as tf


class VocabularyError(ValueError):
    """A model directory whose vocabulary cannot be used in the TF input pipeline."""


class WordPieceVocabulary(seqio.Vocabulary):
    """WordPiece (BERT uncased/cased) in the TF graph; `encode` gives pieces without [CLS]/[SEP]."""

    def __init__(self, vocab_file: str, lower_case: bool = True, unk_token: str = "[UNK]",
                 cls_token: str = "[CLS]", sep_token: str = "[SEP]", pad_token: str = "[PAD]"):
        import tensorflow_text as tf_text

        if not os.path.isfile(vocab_file):
            raise VocabularyError(f"{vocab_file}: no such vocabulary file")
        with open(vocab_file, encoding="utf-8") as f:
            self._tokens = [line.rstrip("\n") for line in f]
        self._ids = {t: i for i, t in enumerate(self._tokens)}
        for name, tok in (("unk", unk_token), ("cls", cls_token), ("sep", sep_token), ("pad", pad_token)):
            if tok not in self._ids:
                raise VocabularyError(f"{vocab_file}: {name} token {tok!r} is not in the vocabulary")
        self.vocab_file = vocab_file
        self.lower_case = lower_case
        self.cls_id, self.sep_id = self._ids[cls_token], self._ids[sep_token]
        self._pad_id, self._unk_id = self._ids[pad_token], self._ids[unk_token]
        self.table = table = tf.lookup.StaticVocabularyTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self._tokens), tf.range(len(self._tokens), dtype=tf.int64)), num_oov_buckets=1)
        # HF's default: words longer than 100 characters become [UNK].
        self._tokenizer = tf_text.BertTokenizer(
            table, token_out_type=tf.int64, lower_case=False, unknown_token=unk_token, max_chars_per_token=100,
        )
        super().__init__(extra_ids=0)

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def eos_id(self) -> int:
        return self.sep_id

    @property
    def unk_id(self) -> int:
        return self._unk_id

    @property
    def _base_vocab_size(self) -> int:
        return len(self._tokens)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        s = tf.convert_to_tensor(s)
        pieces = self._tokenizer.tokenize(self.normalize_tf(tf.reshape(s, [-1])))  # [texts, words, pieces]
        pieces = tf.cast(pieces.merge_dims(1, 2), tf.int32)
        if s.shape.rank == 0:
            return pieces.flat_values
        return pieces if s.shape.rank == 1 else pieces.with_values(pieces.values)  # rank-1 batches only

    def normalize_tf(self, s: tf.Tensor) -> tf.Tensor:
        """HF's BertNormalizer: clean text, then (uncased) strip accents and lowercase.

        tensorflow_text's own lower_case path applies ICU NFKC case folding, which differs from
        HF on compatibility characters (e.g. U+00B4) and final sigma, so normalise here instead.
        """
        import tensorflow_text as tf_text

        s = tf.strings.regex_replace(s, r"[\t\n\r\p{Zs}]", " ")  # HF: whitespace -> space
        s = tf.strings.regex_replace(s, r"[\x{0}\x{FFFD}\p{C}]", "")  # HF: drop control chars
        if self.lower_case:
            s = tf.strings.regex_replace(tf_text.normalize_utf8(s, "NFD"), r"\p{Mn}", "")
            s = tf.strings.lower(s, encoding="utf-8")
        return s

    def _encode(self, s: str) -> Sequence[int]:
        return self._encode_tf(tf.constant(s)).numpy().tolist()

    def _decode(self, ids):
        return " ".join(self._tokens[i] for i in ids if 0 <= i < len(self._tokens)).replace(" ##", "")

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        words = tf.gather(tf.constant(self._tokens), ids)
        return tf.strings.regex_replace(tf.strings.reduce_join(words, axis=-1, separator=" "), " ##", "")

    def __eq__(self, other):
        return isinstance(other, WordPieceVocabulary) and (self.vocab_file, self.lower_case) == (other.vocab_file, other.lower_case)

    def __hash__(self):
        return hash((self.vocab_file, self.lower_case))


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """A vocabulary plus the special tokens the model expects around each text."""

    vocabulary: seqio.Vocabulary
    prefix_ids: tuple[int, ...]  # [CLS] for BERT; nothing for T5
    suffix_ids: tuple[int, ...]  # [SEP] for BERT; EOS for T5
    pad_id: int

    def tokenize_tf(self, text: tf.Tensor, max_length: int) -> tf.Tensor:
        """Ids of one text with its special tokens, truncated like HF (specials kept) to max_length."""
        budget = max_length - len(self.prefix_ids) - len(self.suffix_ids)
        if budget < 1:
            raise ValueError(f"max_length {max_length} leaves no room for text between special tokens")
        body = self.vocabulary.encode_tf(text)[:budget]
        return tf.concat([tf.constant(self.prefix_ids, tf.int32), body, tf.constant(self.suffix_ids, tf.int32)], 0)


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def tokenizer_spec_for(model_dir: str) -> TokenizerSpec:
    """The in-graph tokenizer for a HF model directory (or the Transformer dir of an ST model)."""
    spm = os.path.join(model_dir, "spiece.model")
    vocab_txt = os.path.join(model_dir, "vocab.txt")
    tok_cfg = _read_json(os.path.join(model_dir, "tokenizer_config.json"))
    if os.path.isfile(spm):
        extra_ids = int(tok_cfg.get("extra_ids", 100))
        vocab = seqio.SentencePieceVocabulary(spm, extra_ids=extra_ids)
        return TokenizerSpec(vocab, (), (vocab.eos_id,), vocab.pad_id)
    if os.path.isfile(vocab_txt):
        vocab = WordPieceVocabulary(vocab_txt, lower_case=bool(tok_cfg.get("do_lower_case", True)))
        return TokenizerSpec(vocab, (vocab.cls_id,), (vocab.sep_id,), vocab.pad_id)
    raise VocabularyError(
        f"{model_dir}: no spiece.model (T5) or vocab.txt (WordPiece) for the TF input pipeline; "
        "BPE tokenizers (RoBERTa) are not supported in-graph yet"
    )

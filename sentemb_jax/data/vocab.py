"""seqio vocabularies for our backbones, tokenising inside the TF graph.

* T5 / mT5: `seqio.SentencePieceVocabulary` on the directory's `spiece.model` (+ EOS).
* BERT / MiniLM: `WordPieceVocabulary`, a seqio vocabulary: HF's BERT normaliser and
  pre-tokenizer written with RE2 / ICU ops, then `tensorflow_text.WordpieceTokenizer`; its ids
  (with [CLS] ... [SEP]) equal the Hugging Face tokenizer's for the same directory, on every
  Unicode code point (see the notes before WordPieceVocabulary, and _HF_UNICODE_SKEW).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Sequence

import seqio
import tensorflow as tf
import tensorflow_text as tf_text

from sentemb_jax.errors import VocabularyError

# ------------------------------------------------------------------------------------------------
# Hugging Face's BERT tokenizer (the Rust `tokenizers` BertNormalizer, BertPreTokenizer and WordPiece
# model, which AutoTokenizer loads from tokenizer.json), re-created in the TF graph:
#   1. added tokens ([UNK], [CLS], [SEP], [PAD], [MASK]) are matched in the raw text first, case
#      sensitive; each is its own id and the text between them is tokenised on its own;
#   2. clean_text: U+0000, U+FFFD and "other" characters (categories Cc, Cf, Co; \t \n \r excepted)
#      are dropped, then every White_Space character (Zs, U+2028, U+2029, \t \n \r) becomes " ";
#   3. handle_chinese_chars: " c " around each character of HF's CJK ranges (_HF_CJK);
#   4. uncased models: NFD, then nonspacing marks (Mn) are dropped, then lower case;
#   5. split on " " and isolate punctuation (ASCII punctuation or categories Pc Pd Ps Pe Pi Pf Po);
#   6. WordPiece (longest match first, "##" continuations); a word longer than 100 characters, or
#      one with a piece that is not in the vocabulary, is [UNK].
#
# Unicode version skew - the ONE place where the two sides' character tables are reconciled.
# HF classifies characters (steps 2, 4, 5) with the `unicode_categories` Rust crate, whose tables
# are Unicode 8.0's (U+08E3, a mark since 8.0, is stripped; U+08D4, a mark since 9.0, and
# U+08E2, a format character since 9.0, are kept), decomposes (step 4) with an NFD older than
# Unicode 13 (U+11938 stays whole), and lowercases with Rust's own tables (Unicode 16: U+1C89,
# new in 16.0, is lowercased); its whitespace test is Rust's White_Space (U+2028, U+2029 too).
# The TF graph (tensorflow 2.21, tensorflow-text 2.21) classifies with RE2's tables (Unicode 15:
# U+11F00, new in 15.0, is Mn for RE2; U+1E5EE, a mark new in 16.0, is not), decomposes with ICU's
# NFD (Unicode 16: U+16D68, new in 16.0, is decomposed) and lowercases with tables that lack the
# case pairs added in Unicode 14 and 16 (U+2C2F, U+10570 ... stay capital). So a character that
# RE2 calls Mn / Cf / P but Unicode 8.0 did not (assigned later, or moved since) is an ordinary
# letter for HF: it stays in its word, which then becomes [UNK]; a few went the other way; and
# some characters decompose or lowercase on one side only. The lists below are those code points
# (hex, ranges inclusive). They were found by comparing HF's BertNormalizer (clean_text alone,
# strip_accents alone, lowercase alone) and BertPreTokenizer with the steps below on "a<c>b" for
# every code point c in U+0000..U+10FFFF except the surrogates (1,112,064 texts, tokenizers
# 0.23.3): with the lists, every step's output and the ids of all those texts equal HF's.
# tests/test_tokenizer_unicode.py checks a fixed 3,000-character sweep (every whitespace, control,
# format and combining-mark character, then unassigned ones) and these lists against HF on each
# run; if tokenizers, tensorflow or tensorflow-text is upgraded, it names the code points that moved.
# Handled here too, though not table differences: HF's CJK range 0x2B920..0x2CEAF (a typo for
# 0x2B820 in tokenizers' bert.rs) leaves U+2B820..U+2B91F out, so those are letters for HF
# (_HF_CJK keeps the typo); ICU lowercases a word-final capital sigma to "ς" (a context rule),
# Rust always to "σ" (see _AFTER_NFD); and special-token strings written in the text ("[UNK]",
# "[CLS]" ...) are HF added tokens, matched in the raw text first (step 1, `added_tokens`).
_HF_UNICODE_SKEW = {
    # RE2 \p{Mn}, not Mn in Unicode 8.0: HF does not strip them (step 4).
    "marks_kept": (
        "07FD 0898-089F 08CA-08E1 09FE 0AFA-0AFF 0B55 0C04 0C3C 0D00 0D3B-0D3C 0D81 0EBA 0ECE "
        "180F 1885-1886 1ABF-1ACE 1DF6-1DFB A82C A8C5 A8FF A9BD 10D24-10D27 10EAB-10EAC "
        "10EFD-10EFF 10F46-10F50 10F82-10F85 11070 11073-11074 110C2 111C9 111CF 1123E 11241 "
        "1133B 11438-1143F 11442-11444 11446 1145E 1182F-11837 11839-1183A 1193B-1193C 1193E "
        "11943 119D4-119D7 119DA-119DB 119E0 11A01-11A0A 11A33-11A38 11A3B-11A3E 11A47 "
        "11A51-11A56 11A59-11A5B 11A8A-11A96 11A98-11A99 11C30-11C36 11C38-11C3D 11C3F "
        "11C92-11CA7 11CAA-11CB0 11CB2-11CB3 11CB5-11CB6 11D31-11D36 11D3A 11D3C-11D3D "
        "11D3F-11D45 11D47 11D90-11D91 11D95 11D97 11EF3-11EF4 11F00-11F01 11F36-11F3A 11F40 "
        "11F42 13440 13447-13455 16F4F 16FE4 1CF00-1CF2D 1CF30-1CF46 1E000-1E006 1E008-1E018 "
        "1E01B-1E021 1E023-1E024 1E026-1E02A 1E08F 1E130-1E136 1E2AE 1E2EC-1E2EF 1E4EC-1E4EF "
        "1E944-1E94A"),
    # RE2 \p{Cf}, not Cf in Unicode 8.0: HF does not drop them (step 2).
    "format_kept": "0890-0891 08E2 110CD 13430-1343F",
    # RE2 \p{P}, not punctuation in Unicode 8.0: HF does not isolate them (step 5).
    "punctuation_kept": (
        "061D 09FD 0A76 0C77 0C84 1B7D-1B7E 2E43-2E4F 2E52-2E5D 10EAD 10F55-10F59 10F86-10F89 "
        "1144B-1144F 1145A-1145B 1145D 11660-1166C 116B9 1183B 11944-11946 119E2 11A3F-11A46 "
        "11A9A-11A9C 11A9E-11AA2 11B00-11B09 11C41-11C45 11C70-11C71 11EF7-11EF8 11F43-11F4F "
        "11FFF 12FF1-12FF2 16E97-16E9A 16FE2 1E95E-1E95F"),
    # Punctuation (Po) in Unicode 8.0, So (U+166D) / Mn (U+111C9) for RE2: HF isolates them.
    "punctuation_extra": "166D 111C9",
    # Mn in Unicode 8.0, Mc for RE2 (since Unicode 14): HF strips it.
    "marks_extra": "1734",
    # Decomposed by ICU's NFD (Unicode 13 and 16 characters), not by HF's: kept whole in step 4
    # (each is swapped for a private-use stand-in around the NFD; clean_text has dropped every
    # private-use character before).
    "nfd_kept": "105C9 105E4 11383 11385 1138E 11391 113C5 113C7-113C8 11938 16121-16128 16D68-16D6A",
    # Capital letters HF lowercases and TF does not, as capital:small (a range maps onto a range).
    "lower_case": (
        "1C89:1C8A 2C2F:2C5F A7C0:A7C1 A7CB:0264 A7CC:A7CD A7CE:A7CF A7D0:A7D1 A7D2:A7D3 A7D4:A7D5 "
        "A7D6:A7D7 A7D8:A7D9 A7DA:A7DB A7DC:019B 10570-1057A:10597 1057C-1058A:105A3 "
        "1058C-10592:105B3 10594-10595:105BB 10D50-10D65:10D70 16EA0-16EB8:16EBB"),
}
_HF_CJK = ("4E00-9FFF 3400-4DBF 20000-2A6DF 2A700-2B73F 2B740-2B81F 2B920-2CEAF F900-FAFF "
           "2F800-2FA1F")  # tokenizers' is_chinese_char, typo included
_MAX_WORD_CHARS = 100  # HF WordPiece's max_input_chars_per_word
_STAND_IN = 0xF0000  # Supplementary Private Use Area-A


def _re2_ranges(ranges: str) -> str:
    r"""'07FD 0898-089F' -> RE2 class items '\x{07FD}\x{0898}-\x{089F}'."""
    return "".join("-".join(f"\\x{{{p}}}" for p in r.split("-")) for r in ranges.split())


def _code_points(ranges: str) -> list[int]:
    out = []
    for r in ranges.split():
        first, _, last = r.partition("-")
        out.extend(range(int(first, 16), int(last or first, 16) + 1))
    return out


def _case_pairs(pairs: str) -> list[tuple[int, int]]:
    """'A7C0:A7C1 10570-1057A:10597' -> [(0xA7C0, 0xA7C1), (0x10570, 0x10597), ...]."""
    out = []
    for pair in pairs.split():
        capitals, small = pair.split(":")
        out.extend((c, int(small, 16) + i) for i, c in enumerate(_code_points(capitals)))
    return out


def _re2_literal(text: str) -> str:
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def _swap_code_points(s: tf.Tensor, src: Sequence[int], dst: Sequence[int]) -> tf.Tensor:
    """Replaces code point src[i] by dst[i] in every string of s (src sorted ascending). Decoding
    costs; skipped when no string holds any src code point (the usual case)."""

    def swap():
        chars = tf.strings.unicode_decode(s, "UTF-8")
        ragged = isinstance(chars, tf.RaggedTensor)
        cps = chars.flat_values if ragged else chars
        src_t, dst_t = tf.constant(src, tf.int32), tf.constant(dst, tf.int32)
        i = tf.minimum(tf.searchsorted(src_t, cps), len(src) - 1)
        cps = tf.where(tf.gather(src_t, i) == cps, tf.gather(dst_t, i), cps)
        return tf.strings.unicode_encode(chars.with_flat_values(cps) if ragged else cps, "UTF-8")

    present = tf.strings.regex_full_match(s, "(?s).*[" + "".join(f"\\x{{{c:X}}}" for c in src) + "].*")
    return tf.cond(tf.reduce_any(present), swap, lambda: tf.identity(s))


_SKEW = {k: _re2_ranges(v) for k, v in _HF_UNICODE_SKEW.items() if k != "lower_case"}
# Step 2. RE2's \p{C} is Cc Cf Co Cs (not Cn: unassigned code points are kept, as HF keeps them).
_HF_CONTROL = rf"[\x{{0}}\x{{FFFD}}]|[^\P{{C}}\t\n\r{_SKEW['format_kept']}]"
_HF_WHITESPACE = r"[\t\n\r\p{Zs}\x{2028}\x{2029}]"
_HF_CJK_RE = f"[{_re2_ranges(_HF_CJK)}]"
# Step 4.
_HF_ACCENT = rf"[^\P{{Mn}}{_SKEW['marks_kept']}]|[{_SKEW['marks_extra']}]"
_NFD_KEPT = _code_points(_HF_UNICODE_SKEW["nfd_kept"])
_NFD_STAND_INS = list(range(_STAND_IN, _STAND_IN + len(_NFD_KEPT)))
# After the NFD: the stand-ins back, the capitals TF would not lowercase to HF's small letters, and
# capital sigma to "σ": ICU's lower case maps a word-final one to "ς" (its Final_Sigma context
# rule), HF's (Rust char::to_lowercase) is per character.
_AFTER_NFD = sorted([*_case_pairs(_HF_UNICODE_SKEW["lower_case"]), (0x3A3, 0x3C3), *zip(_NFD_STAND_INS, _NFD_KEPT)])
# Step 5.
_HF_PUNCTUATION = rf"[!-/:-@\[-`{{-~{_SKEW['punctuation_extra']}]|[^\P{{P}}{_SKEW['punctuation_kept']}]"


class WordPieceVocabulary(seqio.Vocabulary):
    """WordPiece (BERT uncased/cased) in the TF graph; `encode` gives pieces without [CLS]/[SEP].

    Ids equal the Hugging Face tokenizer's for the same directory (see the notes above)."""

    def __init__(self, vocab_file: str, lower_case: bool = True, unk_token: str = "[UNK]",
                 cls_token: str = "[CLS]", sep_token: str = "[SEP]", pad_token: str = "[PAD]",
                 added_tokens: dict[str, int] | None = None):
        """added_tokens: strings matched in the raw text before normalisation, with their ids (HF's
        added tokens, normalized=False); default: the special tokens of the vocabulary ([MASK] too)."""
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
        self.unk_token = unk_token
        self.cls_id, self.sep_id = self._ids[cls_token], self._ids[sep_token]
        self._pad_id, self._unk_id = self._ids[pad_token], self._ids[unk_token]
        if added_tokens is None:
            added_tokens = {t: self._ids[t] for t in (pad_token, unk_token, cls_token, sep_token, "[MASK]") if t in self._ids}
        self.added_tokens = dict(added_tokens)
        # Longest first, as HF matches them (leftmost-longest).
        self._added_re = "|".join(_re2_literal(t) for t in sorted(self.added_tokens, key=len, reverse=True) if t)
        self.table = table = tf.lookup.StaticVocabularyTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self._tokens), tf.range(len(self._tokens), dtype=tf.int64)), num_oov_buckets=1)
        # 4 bytes per character: the 100-character limit itself is applied in _pieces_tf.
        self._wordpiece = tf_text.WordpieceTokenizer(
            table, suffix_indicator="##", max_bytes_per_word=4 * _MAX_WORD_CHARS, token_out_type=tf.int64,
            unknown_token=unk_token)
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
        pieces = self._ids_tf(tf.reshape(s, [-1]))  # [texts, pieces]
        if s.shape.rank == 0:
            return pieces.flat_values
        return pieces if s.shape.rank == 1 else pieces.with_values(pieces.values)  # rank-1 batches only

    def _ids_tf(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Ragged int32 [texts, pieces] of a rank-1 string tensor (steps 1-6 above)."""
        if not self._added_re:
            return self._pieces_tf(texts)
        # Step 1 only where an added token occurs (splitting costs more than the rest per text).
        present = tf.strings.regex_full_match(texts, f"(?s).*(?:{self._added_re}).*")
        return tf.cond(tf.reduce_any(present), lambda: self._with_added_tokens_tf(texts), lambda: self._pieces_tf(texts))

    def _with_added_tokens_tf(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Step 1: [texts, segments], an added token being a segment of its own (its id), the text
        between them tokenised on its own."""
        # regex_split stops at U+0000; clean_text drops it and U+FFFD alike, so swap first.
        texts = tf.strings.regex_replace(texts, r"\x00", "\uFFFD")
        segments = tf_text.regex_split(texts, self._added_re, self._added_re)
        is_added = tf.strings.regex_full_match(segments.flat_values, self._added_re)
        pieces = self._pieces_tf(tf.where(is_added, "", segments.flat_values))  # [segments, pieces]
        added = tf.boolean_mask(segments.flat_values, is_added)
        names = tf.constant(list(self.added_tokens))
        added_ids = tf.gather(tf.constant(list(self.added_tokens.values()), tf.int32),
                              tf.argmax(tf.cast(tf.equal(added[:, None], names[None, :]), tf.int32), axis=1))
        added_ids = tf.RaggedTensor.from_row_lengths(added_ids, tf.cast(is_added, tf.int64))
        return segments.with_flat_values(tf.concat([pieces, added_ids], axis=1)).merge_dims(1, 2)

    def _pieces_tf(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Steps 2-6: ragged int32 [texts, pieces]."""
        words = self.pretokenize_tf(self.normalize_tf(texts))  # [texts, words]
        too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > _MAX_WORD_CHARS
        words = words.with_flat_values(tf.where(too_long, self.unk_token, words.flat_values))
        return tf.cast(self._wordpiece.tokenize(words).merge_dims(1, 2), tf.int32)

    def normalize_tf(self, s: tf.Tensor) -> tf.Tensor:
        """HF's BertNormalizer (steps 2-4 above) on a string tensor.

        tensorflow_text's own lower_case path applies ICU NFKC case folding, which differs from
        HF on compatibility characters (e.g. U+00B4) and final sigma, so normalise here instead.
        """
        s = tf.strings.regex_replace(s, _HF_CONTROL, "")
        s = tf.strings.regex_replace(s, _HF_WHITESPACE, " ")
        s = tf.strings.regex_replace(s, _HF_CJK_RE, r" \0 ")
        if self.lower_case:
            s = _swap_code_points(s, _NFD_KEPT, _NFD_STAND_INS)
            s = tf.strings.regex_replace(tf_text.normalize_utf8(s, "NFD"), _HF_ACCENT, "")
            s = _swap_code_points(s, *zip(*_AFTER_NFD))
            s = tf.strings.lower(s, encoding="utf-8")
        return s

    def pretokenize_tf(self, s: tf.Tensor) -> tf.RaggedTensor:
        """HF's BertPreTokenizer (step 5) on normalised text: ragged [..., words]."""
        return tf_text.regex_split(s, f" |{_HF_PUNCTUATION}", _HF_PUNCTUATION)

    def _encode(self, s: str) -> Sequence[int]:
        return self._encode_tf(tf.constant(s)).numpy().tolist()

    def _decode(self, ids):
        return " ".join(self._tokens[i] for i in ids if 0 <= i < len(self._tokens)).replace(" ##", "")

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        words = tf.gather(tf.constant(self._tokens), ids)
        return tf.strings.regex_replace(tf.strings.reduce_join(words, axis=-1, separator=" "), " ##", "")

    def __eq__(self, other):
        return isinstance(other, WordPieceVocabulary) and (self.vocab_file, self.lower_case, self.added_tokens) == (
            other.vocab_file, other.lower_case, other.added_tokens)

    def __hash__(self):
        return hash((self.vocab_file, self.lower_case, tuple(self.added_tokens.items())))


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """A vocabulary plus the special tokens the model expects around each text."""

    vocabulary: seqio.Vocabulary
    prefix_ids: tuple[int, ...]  # [CLS] for BERT; nothing for T5
    suffix_ids: tuple[int, ...]  # [SEP] for BERT; EOS for T5
    pad_id: int
    # max_length -> tokenize_batch_tf's graph, built once: some thousand ops, about 1 s to build,
    # otherwise rebuilt for each text feature of each pipeline.
    _batch_graphs: dict = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    def _budget(self, max_length: int) -> int:
        """Pieces of text that fit in max_length beside the special tokens."""
        budget = max_length - len(self.prefix_ids) - len(self.suffix_ids)
        if budget < 1:
            raise ValueError(f"max_length {max_length} leaves no room for text between special tokens")
        return budget

    def tokenize_tf(self, text: tf.Tensor, max_length: int) -> tf.Tensor:
        """Ids of one text with its special tokens, truncated like HF (specials kept) to max_length."""
        body = self.vocabulary.encode_tf(text)[: self._budget(max_length)]
        return tf.concat([tf.constant(self.prefix_ids, tf.int32), body, tf.constant(self.suffix_ids, tf.int32)], 0)

    def tokenize_batch_tf(self, texts: tf.Tensor, max_length: int) -> tf.RaggedTensor:
        """tokenize_tf on a batch of texts [n] -> ids [n, (length)]: the same ids, ~10x faster
        than one text at a time (the in-graph WordPiece / SentencePiece ops work on whole batches)."""
        graph = self._batch_graphs.get(max_length)
        if graph is None:
            self._budget(max_length)  # a bad max_length is refused here, not inside the trace
            graph = self._batch_graphs[max_length] = tf.function(
                functools.partial(self._tokenize_batch, max_length=max_length), autograph=False,
                input_signature=[tf.TensorSpec([None], tf.string)])
        return graph(texts)

    def _tokenize_batch(self, texts: tf.Tensor, max_length: int) -> tf.RaggedTensor:
        body = tf.cast(self.vocabulary.encode_tf(texts), tf.int32)[:, : self._budget(max_length)]
        n = tf.shape(texts)[0]
        ends = [tf.RaggedTensor.from_tensor(tf.tile(tf.constant([ids], tf.int32), [n, 1]), ragged_rank=1)
                for ids in (self.prefix_ids, self.suffix_ids)]
        return tf.concat([ends[0], body, ends[1]], axis=1)


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _added_tokens(tokenizer_json: str) -> dict[str, int] | None:
    """HF's added tokens ({content: id}) from tokenizer.json; None without the file (defaults)."""
    added = _read_json(tokenizer_json).get("added_tokens")
    if added is None:
        return None
    for t in added:
        if t.get("normalized") or t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            raise VocabularyError(
                f"{tokenizer_json}: added token {t.get('content')!r} is matched with normalized / lstrip / rstrip / "
                "single_word, which the in-graph WordPiece tokenizer does not implement (only raw, exact matches)")
    return {t["content"]: int(t["id"]) for t in added}


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
        vocab = WordPieceVocabulary(vocab_txt, lower_case=bool(tok_cfg.get("do_lower_case", True)),
                                    added_tokens=_added_tokens(os.path.join(model_dir, "tokenizer.json")))
        return TokenizerSpec(vocab, (vocab.cls_id,), (vocab.sep_id,), vocab.pad_id)
    raise VocabularyError(
        f"{model_dir}: no spiece.model (T5) or vocab.txt (WordPiece) for the TF input pipeline; "
        "BPE tokenizers (RoBERTa) are not supported in-graph yet"
    )

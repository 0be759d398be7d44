"""The in-graph WordPiece tokenizer (sentemb_jax.data.vocab) gives Hugging Face's ids on a fixed
sweep of 3,000 whitespace / control / format / combining-mark / unassigned characters, on every
code point of vocab._HF_UNICODE_SKEW (the one place for Unicode-version differences between TF's
RE2 / ICU tables and the Rust `tokenizers`' tables), and on special-token strings in the text."""
import json
import shutil
import sys
import unicodedata

import pytest
import tensorflow as tf
import tensorflow_text as tf_text
import transformers
from tokenizers import normalizers, pre_tokenizers

from sentemb_jax.data import vocab
from sentemb_jax.data.vocab import tokenizer_spec_for
from sentemb_jax.errors import VocabularyError

SWEEP_CATEGORIES = ("Zs", "Zl", "Zp", "Cc", "Cf", "Mn", "Mc", "Me")
SWEEP_SIZE = 3000


def unicode_sweep(n: int = SWEEP_SIZE) -> list[int]:
    """The sweep, built one way only: every code point whose category in Python's unicodedata is
    one of SWEEP_CATEGORIES (space, line and paragraph separators, control, format, nonspacing /
    spacing / enclosing marks), in code-point order - 2,655 of them with Python 3.11 (Unicode
    14.0) - then unassigned code points (Cn) in code-point order up to n."""
    chars = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in SWEEP_CATEGORIES]
    unassigned = (c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cn")
    while len(chars) < n:
        chars.append(next(unassigned))
    return chars[:n]


def _hex(c: int) -> str:
    return f"U+{c:04X} ({unicodedata.category(chr(c))})"


@pytest.fixture(scope="module")
def spec(minilm_dir):
    return tokenizer_spec_for(minilm_dir)


@pytest.fixture(scope="module")
def hf(minilm_dir):
    return transformers.AutoTokenizer.from_pretrained(minilm_dir)


def _tf_ids(spec, texts, max_length=64):
    """tokenize_tf on each text, all in one TF call (a tf.data map, one ragged batch)."""
    ds = tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string))
    return ds.map(lambda t: spec.tokenize_tf(t, max_length)).ragged_batch(len(texts)).get_single_element().to_list()


def _differences(spec, hf, texts, labels, max_length=64):
    ours = _tf_ids(spec, texts, max_length)
    ref = hf(texts, truncation=True, max_length=max_length)["input_ids"]
    assert len(ours) == len(ref) == len(texts)
    return [f"{label}: ours {a} HF {b}" for label, a, b in zip(labels, ours, ref) if a != b]


def test_unicode_sweep_is_fixed():
    chars = unicode_sweep()
    assert len(chars) == len(set(chars)) == SWEEP_SIZE
    # The characters a user found diverging (before the fix) are in it.
    assert {0x2028, 0x2029, 0x0890, 0x07FD, 0x00A0, 0x200B, 0x0301, 0x1734} <= set(chars)


def test_unicode_sweep_equals_hf(spec, hf):
    """"a<c>b" for each of the 3,000 characters: exactly HF's ids. Before the fix 400 differed:
    U+2028, U+2029, 13 Cf (U+0890 ...), 384 Mn (U+07FD ...) and U+1734 (Mc)."""
    chars = unicode_sweep()
    diffs = _differences(spec, hf, ["a" + chr(c) + "b" for c in chars], [_hex(c) for c in chars])
    assert not diffs, f"{len(diffs)} of {len(chars)} characters differ from HF:\n" + "\n".join(diffs)


def _skew_code_points() -> dict[str, list[int]]:
    lists = {k: vocab._code_points(v) for k, v in vocab._HF_UNICODE_SKEW.items() if k != "lower_case"}
    lists["lower_case"] = [c for c, _ in vocab._case_pairs(vocab._HF_UNICODE_SKEW["lower_case"])]
    return lists


def test_unicode_skew_lists_are_still_needed_and_right(spec, hf):
    """Every code point of vocab._HF_UNICODE_SKEW: TF's own op does what the entry works around
    (so it is still needed), HF does what the entry says (so it is right), and the ids equal HF's.
    After an upgrade of tokenizers / tensorflow / tensorflow-text this names the entries that moved."""
    lists = _skew_code_points()
    small = dict(vocab._case_pairs(vocab._HF_UNICODE_SKEW["lower_case"]))

    def hf_normalizer(**step):
        kw = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
        return normalizers.BertNormalizer(**{**kw, **step}).normalize_str

    hf_clean, hf_strip, hf_lower = hf_normalizer(clean_text=True), hf_normalizer(strip_accents=True), hf_normalizer(lowercase=True)
    hf_words = pre_tokenizers.BertPreTokenizer().pre_tokenize_str

    def tf_op(op):  # True where op(TF) on the character alone does what the entry works around
        return lambda cps: op(tf.constant([chr(c) for c in cps])).numpy().tolist()

    def tf_class(pattern, matches=True):
        return tf_op(lambda x: tf.strings.regex_full_match(x, pattern) == matches)

    def tf_changes(op, changes=True):
        return lambda cps: [(out.decode() != chr(c)) == changes for c, out in zip(cps, tf_op(op)(cps))]

    def kept(normalize):
        return lambda c: normalize(f"a{chr(c)}b") == f"a{chr(c)}b"

    rules = {  # list: (TF needs the entry, HF does what the entry says)
        "marks_kept": (tf_class(r"\p{Mn}"), kept(hf_strip)),
        "format_kept": (tf_class(r"\p{C}"), kept(hf_clean)),
        "punctuation_kept": (tf_class(r"\p{P}"), lambda c: len(hf_words(f"a{chr(c)}b")) == 1),
        "punctuation_extra": (tf_class(r"\p{P}", False), lambda c: len(hf_words(f"a{chr(c)}b")) == 3),
        "marks_extra": (tf_class(r"\p{Mn}", False), lambda c: hf_strip(f"a{chr(c)}b") == "ab"),
        "nfd_kept": (tf_changes(lambda x: tf_text.normalize_utf8(x, "NFD")), kept(hf_strip)),
        "lower_case": (tf_changes(lambda x: tf.strings.lower(x, encoding="utf-8"), False),
                       lambda c: hf_lower(chr(c)) == chr(small[c])),
    }
    stale = [f"{name}: {_hex(c)} (TF needs the entry: {t}, HF as listed: {hf_rule(c)})"
             for name, (tf_rule, hf_rule) in rules.items()
             for c, t in zip(lists[name], tf_rule(lists[name])) if not (t and hf_rule(c))]
    assert not stale, "stale entries in vocab._HF_UNICODE_SKEW:\n" + "\n".join(stale)
    # The CJK range HF's typo leaves out: still letters for HF (one word "a<c>b").
    cjk_typo = list(range(0x2B820, 0x2B920))
    assert all(len(hf_words(f"a{chr(c)}b")) == 1 for c in cjk_typo)
    every = sorted({c for cps in lists.values() for c in cps} | set(cjk_typo))
    diffs = _differences(spec, hf, ["a" + chr(c) + "b" for c in every], [_hex(c) for c in every])
    assert not diffs, f"{len(diffs)} of {len(every)} listed characters differ from HF:\n" + "\n".join(diffs)


EDGE_TEXTS = [
    # Special-token strings written in the text: HF's added tokens, matched raw and case-sensitive.
    "[UNK]", "a[UNK]b", "[CLS][SEP]", " [MASK] x", "[[PAD]]", "[unk]", "[UNK", "[UN\x00K]", "[\u200bUNK]",
    "x\x00[PAD]\x00y", "\u2028[SEP]\u2029", "Café [MASK] naïve",
    # Word length: HF's limit is 100 characters (not bytes).
    "ж" * 100, "ж" * 101, "a" * 100, "a" * 101,
    # Lower case: HF lowercases capital sigma per character (no final form); Unicode 14 / 16 capitals.
    "ΣΑΣ ΟΔΟΣ.", "\u2c2f\U00010570 \ua7cb",
    # Several marks at once (canonical reordering), and the CJK range HF's typo leaves out.
    "a\u0301\u1dfa\u0316b", "\U0002b820\u4e00\U0002b81f", "", " ", "\x00",
]


def test_special_tokens_and_edge_cases_equal_hf(spec, hf):
    diffs = _differences(spec, hf, EDGE_TEXTS, [repr(t) for t in EDGE_TEXTS])
    assert not diffs, "\n".join(diffs)


def test_added_tokens_without_tokenizer_json_and_unsupported_ones(minilm_dir, hf, tmp_path):
    # Without tokenizer.json: the vocabulary's special tokens, [MASK] included.
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(f"{minilm_dir}/{name}", tmp_path / name)
    texts = ["a [MASK] b[SEP]", "[UNK][PAD]"]
    assert _tf_ids(tokenizer_spec_for(str(tmp_path)), texts) == hf(texts, truncation=True, max_length=64)["input_ids"]
    # An added token matched after normalisation (normalized: true) is refused, not tokenised wrongly.
    with open(f"{minilm_dir}/tokenizer.json", encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens"].append({"id": 30522, "content": "<new>", "special": False, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": True})
    (tmp_path / "tokenizer.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(VocabularyError, match="added token '<new>' is matched with normalized"):
        tokenizer_spec_for(str(tmp_path))

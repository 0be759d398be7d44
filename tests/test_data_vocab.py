"""In-graph vocabularies give the Hugging Face tokenizer's ids."""
import os
import shutil

import pytest
import tensorflow as tf
import transformers
from hf_models import SPM_MODEL

from sentemb_jax.data.files import read_sts_pairs
from sentemb_jax.data.vocab import WordPieceVocabulary, tokenizer_spec_for
from sentemb_jax.errors import VocabularyError


def _tf_ids(spec, texts, max_length):
    ds = tf.data.Dataset.from_tensor_slices(texts).map(lambda t: spec.tokenize_tf(t, max_length))
    return [x.tolist() for x in ds.as_numpy_iterator()]


def test_wordpiece_equals_hf_on_every_stsb_dev_sentence(minilm_dir, data_dir):
    s1, s2, _ = read_sts_pairs(os.path.join(data_dir, "stsb", "dev.tsv"))
    texts = s1 + s2
    spec = tokenizer_spec_for(minilm_dir)
    assert isinstance(spec.vocabulary, WordPieceVocabulary) and spec.vocabulary.lower_case
    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    ours = _tf_ids(spec, texts, 256)
    ref = hf(texts, truncation=True, max_length=256)["input_ids"]
    mismatched = [t for t, a, b in zip(texts, ours, ref) if a != b]
    assert len(texts) == 3000 and not mismatched, mismatched[:3]


def test_wordpiece_hf_edge_cases(minilm_dir):
    """Cases where tensorflow_text's own case folding differs from HF: control chars, U+00B4, final sigma."""
    texts = ["Treasury\x12s plan", "I\u00b4m proud", "δούλος κύριε", "Café  naïve\tTAB", "a" * 150, "中文字 mixed"]
    spec = tokenizer_spec_for(minilm_dir)
    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    assert _tf_ids(spec, texts, 256) == hf(texts, truncation=True, max_length=256)["input_ids"]
    # Truncation keeps [SEP] last, like HF.
    long = ["word " * 300]
    assert _tf_ids(spec, long, 16) == hf(long, truncation=True, max_length=16)["input_ids"]
    assert spec.vocabulary.decode(spec.vocabulary.encode("hello world")) == "hello world"


def test_sentencepiece_equals_hf_t5(tmp_path):
    shutil.copy(SPM_MODEL, tmp_path / "spiece.model")
    (tmp_path / "config.json").write_text('{"model_type": "t5", "vocab_size": 126}')
    spec = tokenizer_spec_for(str(tmp_path))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    texts = ["Hello world.", "the quick brown fox", "a b c d e f g h i j k l"]
    assert _tf_ids(spec, texts, 64) == hf(texts, truncation=True, max_length=64)["input_ids"]
    assert _tf_ids(spec, texts[2:], 5) == hf(texts[2:], truncation=True, max_length=5)["input_ids"]
    assert spec.prefix_ids == () and spec.suffix_ids == (1,)


def test_directory_without_vocabulary(tmp_path):
    with pytest.raises(VocabularyError, match="no spiece.model"):
        tokenizer_spec_for(str(tmp_path))

"""The shipped all-MiniLM-L6-v2 through our stack equals sentence-transformers and the published score."""
import numpy as np
import pytest

from sentemb_jax import SentenceEncoder
from sentemb_jax.evaluation.sts import correlations


@pytest.fixture(scope="module")
def ours(minilm_dir):
    return SentenceEncoder.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def stsb_embeddings(ours, stsb_test):
    s1, s2, gold = stsb_test
    return ours.encode(s1), ours.encode(s2), gold


def test_reads_sentence_transformers_layout(ours):
    assert ours.module.pooling == ("mean",) and ours.module.normalize
    assert ours.max_seq_length == 256 and ours.get_sentence_embedding_dimension() == 384
    assert ours.config.num_hidden_layers == 6 and ours.config.hidden_act == "gelu"


def test_matches_sentence_transformers(minilm_dir, stsb_test, stsb_embeddings):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(minilm_dir, device="cpu")
    s1, _, _ = stsb_test
    ref = st.encode(s1, batch_size=64, convert_to_numpy=True)
    got = stsb_embeddings[0]
    assert got.shape == ref.shape == (1379, 384) and got.dtype == np.float32
    cos = np.sum(got * ref, 1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.99999, cos.min()


def test_stsb_test_spearman_is_published_figure(stsb_embeddings):
    a, b, gold = stsb_embeddings
    result = correlations(np.sum(a * b, 1), gold)
    # MTEB's published STS-B test cosine Spearman for all-MiniLM-L6-v2: 82.03.
    assert abs(result["spearman"] - 82.03) <= 0.10, result


def test_order_restored_and_batch_size_invariant(ours, stsb_test):
    s1 = stsb_test[0][:150]
    full = ours.encode(s1, batch_size=64)
    np.testing.assert_allclose(ours.encode(s1[::-1], batch_size=7)[::-1], full, atol=2e-6)
    np.testing.assert_allclose(ours.encode(s1[5]), full[5], atol=2e-6)
    assert ours.encode(s1[5]).shape == (384,)


def test_encode_input_errors(ours):
    assert ours.encode([]).shape == (0, 384)
    with pytest.raises(TypeError, match="got None"):
        ours.encode(None)
    with pytest.raises(TypeError, match="item 1 is int, not str"):
        ours.encode(["ok", 3])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ours.encode(["ok"], batch_size=0)


def test_long_and_empty_texts(ours):
    out = ours.encode(["", "word " * 5000, "a"])
    assert np.isfinite(out).all() and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)

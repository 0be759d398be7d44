"""SentenceEncoder.encode keeps sentence-transformers' SentenceTransformer.encode contract (6.2.0):
the same calls through sentence-transformers and through us on the shipped all-MiniLM-L6-v2 agree.

Floats: cosine >= 0.99999 per row and the same norms. Quantised: the same codes except at bucket
boundaries, where the two stacks' float32 rounding (~1e-7) can put a value on either side: those
entries are counted, each is one code step off and its float value lies within 1% of a step of a
boundary. Binary: identical.
"""
import json

import jax
import numpy as np
import pytest
import torch

from sentemb_jax import SentenceEncoder
from sentemb_jax.encode_contract import SIMILARITY_FN_NAMES, quantize_embeddings

PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def sentences(stsb_test):
    s1, s2, _ = stsb_test
    return list(s1[:24]) + list(s2[:16]) + ["", "x"]


@pytest.fixture(scope="module")
def calibration_sentences(stsb_test):
    return list(stsb_test[1][40:160])


@pytest.fixture(scope="module")
def st(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_dir, device="cpu")


@pytest.fixture(scope="module")
def ours(minilm_dir):
    return SentenceEncoder.from_pretrained(minilm_dir)


def assert_same_floats(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    norm_got, norm_want = np.linalg.norm(got, axis=-1), np.linalg.norm(want, axis=-1)
    cos = np.sum(got * want, -1) / np.maximum(norm_got * norm_want, 1e-30)
    assert cos.min() >= 0.99999, cos.min()
    np.testing.assert_allclose(norm_got, norm_want, rtol=2e-6, atol=1e-7)


def rounding_ties(got, want, st_float, precision, ranges) -> int:
    """Asserts that int8 / uint8 codes differ only at bucket boundaries, by one step; returns how many differ."""
    got, want = np.asarray(got).astype(np.int64), np.asarray(want).astype(np.int64)
    assert got.shape == want.shape
    ranges = np.asarray(ranges, np.float64)
    steps = (ranges[1] - ranges[0]) / 255
    position = (np.asarray(st_float, np.float64) - ranges[0]) / np.where(steps == 0, 1, steps)  # in steps
    off = got != want
    assert np.all(np.abs(got - want)[off] == 1), np.abs(got - want).max()
    distance = np.abs(position - np.round(position))[off]
    assert distance.size == 0 or distance.max() < 0.01, distance.max()
    assert off.sum() <= max(3, off.size // 200), f"{off.sum()} of {off.size} {precision} codes differ"
    return int(off.sum())


@pytest.mark.parametrize("kwargs", [
    {}, {"normalize_embeddings": False}, {"normalize_embeddings": True}, {"truncate_dim": 128},
    {"truncate_dim": 128, "normalize_embeddings": True}, {"batch_size": 7}, {"device": "cpu"},
])
def test_float_outputs_equal_sentence_transformers(ours, st, sentences, kwargs):
    assert_same_floats(ours.encode(sentences, **kwargs), st.encode(sentences, **kwargs))


def test_truncation_comes_before_normalisation(ours, sentences):
    """MiniLM's Normalize module runs before truncation, so truncated rows are short unless normalize_embeddings."""
    short = np.linalg.norm(ours.encode(sentences, truncate_dim=64), axis=1)
    assert short.max() < 0.9
    np.testing.assert_allclose(np.linalg.norm(ours.encode(sentences, truncate_dim=64, normalize_embeddings=True), axis=1),
                               1.0, atol=1e-6)


def test_model_without_normalize_module(tmp_path, minilm_dir, sentences):
    """No Normalize module: raw embeddings unless normalize_embeddings (or its older name, normalize)."""
    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(minilm_dir)
    st_raw = SentenceTransformer(modules=[word, models.Pooling(word.get_embedding_dimension(), "mean")], device="cpu")
    st_raw.save(str(tmp_path / "raw"))
    ours = SentenceEncoder.from_pretrained(str(tmp_path / "raw"))
    raw = ours.encode(sentences)
    assert_same_floats(raw, st_raw.encode(sentences))
    assert np.linalg.norm(raw, axis=1).min() > 1.5  # not unit vectors
    unit = ours.encode(sentences, normalize_embeddings=True)
    assert_same_floats(unit, st_raw.encode(sentences, normalize_embeddings=True))
    np.testing.assert_array_equal(ours.encode(sentences, normalize=True), unit)
    np.testing.assert_array_equal(ours.encode(sentences, normalize=False), raw)
    np.testing.assert_array_equal(ours.encode(sentences, normalize=True, normalize_embeddings=True), unit)
    with pytest.raises(ValueError, match="normalize=True and normalize_embeddings=False disagree"):
        ours.encode(sentences, normalize=True, normalize_embeddings=False)


@pytest.mark.parametrize("precision", ["float32", "int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("kwargs", [{}, {"truncate_dim": 96, "normalize_embeddings": True}])
def test_precision_equals_sentence_transformers(ours, st, sentences, precision, kwargs):
    """No calibration: as sentence-transformers, int8 / uint8 ranges come from the call's own embeddings."""
    got = ours.encode(sentences, precision=precision, **kwargs)
    want = st.encode(sentences, precision=precision, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    if precision == "float32":
        assert_same_floats(got, want)
    elif precision.endswith("binary"):
        np.testing.assert_array_equal(got, want)
    else:
        st_float = st.encode(sentences, **kwargs)
        ranges = np.vstack([st_float.min(0), st_float.max(0)])
        ties = rounding_ties(got, want, st_float, precision, ranges)
        print(f"{precision} {kwargs}: {ties} of {got.size} codes differ (rounding ties)")


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_calibrated_quantisation(ours, st, sentences, calibration_sentences, precision):
    from sentence_transformers import quantize_embeddings as st_quantize

    ours_float, st_float = ours.encode(sentences), st.encode(sentences)
    ours_cal, st_cal = ours.encode(calibration_sentences), st.encode(calibration_sentences)
    # The same floats in: the same codes out, for each way of giving the ranges.
    for kwargs in ({}, {"calibration_embeddings": st_cal}, {"ranges": np.vstack([st_cal.min(0), st_cal.max(0)])}):
        np.testing.assert_array_equal(quantize_embeddings(st_float, precision, **kwargs),
                                      st_quantize(st_float, precision, **kwargs))
    tokens = [t.numpy() for t in st.encode(sentences[:5], output_value="token_embeddings")]
    for got, want in zip(quantize_embeddings(tokens, precision), st_quantize(tokens, precision)):
        np.testing.assert_array_equal(got, want)
    # Each stack's floats, calibrated on each stack's embeddings of other sentences.
    got = quantize_embeddings(ours_float, precision, calibration_embeddings=ours_cal)
    want = st_quantize(st_float, precision, calibration_embeddings=st_cal)
    if precision.endswith("binary"):
        np.testing.assert_array_equal(got, want)
    else:
        ties = rounding_ties(got, want, st_float, precision, np.vstack([st_cal.min(0), st_cal.max(0)]))
        print(f"calibrated {precision}: {ties} of {got.size} codes differ (rounding ties)")


def test_one_text_cannot_set_int8_ranges(ours, st):
    for model in (ours, st):
        with pytest.raises(ValueError, match="single embedding"):
            model.encode("one sentence", precision="int8")
    # ubinary is the sign of each component: equal wherever the sign is decided. A component within
    # float32 round-off of 0 (all-MiniLM-L6-v2 gives "one sentence" one of -3.3e-9) takes either
    # sign with the machine's summation order, torch's and XLA's alike.
    decided = (np.abs(ours.encode("one sentence")) > 1e-6) & (np.abs(st.encode("one sentence")) > 1e-6)
    assert decided.sum() >= 380
    bits = [np.unpackbits(m.encode("one sentence", precision="ubinary")) for m in (ours, st)]
    np.testing.assert_array_equal(bits[0][decided], bits[1][decided])


def test_prompts(minilm_dir, sentences):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(minilm_dir, device="cpu", prompts=PROMPTS)
    ours = SentenceEncoder.from_pretrained(minilm_dir, prompts=PROMPTS)
    assert ours.prompts == st.prompts == {"query": "query: ", "document": "", "passage": "passage: "}
    texts = sentences[:12]
    for kwargs in ({"prompt_name": "query"}, {"prompt_name": "passage"}, {"prompt_name": "document"},
                   {"prompt": "Represent this sentence: "}):
        assert_same_floats(ours.encode(texts, **kwargs), st.encode(texts, **kwargs))
    by_name = ours.encode(texts, prompt_name="query")
    assert np.abs(by_name - ours.encode(texts)).max() > 1e-2  # the prompt changes the embeddings
    np.testing.assert_array_equal(ours.encode(texts, prompt="query: "), by_name)
    # Both: the prompt wins, as in sentence-transformers.
    both = ours.encode(texts, prompt="Represent this sentence: ", prompt_name="query")
    np.testing.assert_array_equal(both, ours.encode(texts, prompt="Represent this sentence: "))
    assert_same_floats(both, st.encode(texts, prompt="Represent this sentence: ", prompt_name="query"))
    with pytest.raises(ValueError, match=r"prompt_name 'passge' is not one of this model's prompts \['document', 'passage', 'query'\]"):
        ours.encode(texts, prompt_name="passge")
    with pytest.raises(ValueError, match="passge"):
        st.encode(texts, prompt_name="passge")
    # A default prompt name: used unless prompt / prompt_name say otherwise.
    st_default = SentenceTransformer(minilm_dir, device="cpu", prompts=PROMPTS, default_prompt_name="passage")
    ours.default_prompt_name = "passage"  # an attribute, as SentenceTransformer's (the same compiled model)
    for kwargs in ({}, {"prompt_name": "query"}, {"prompt": ""}):
        assert_same_floats(ours.encode(texts, **kwargs), st_default.encode(texts, **kwargs))
    np.testing.assert_array_equal(ours.encode(texts), ours.encode(texts, prompt_name="passage"))
    with pytest.raises(ValueError, match="default_prompt_name 'nope' is not one of the prompts"):
        SentenceEncoder.from_pretrained(minilm_dir, prompts=PROMPTS, default_prompt_name="nope")


def test_output_types(ours, st, sentences):
    tensor = ours.encode(sentences, convert_to_tensor=True)
    assert isinstance(tensor, jax.Array) and tensor.dtype == np.float32 and tensor.shape == (len(sentences), 384)
    assert_same_floats(np.asarray(tensor), st.encode(sentences, convert_to_tensor=True).numpy())
    np.testing.assert_array_equal(np.asarray(tensor), ours.encode(sentences))
    rows = ours.encode(sentences, convert_to_numpy=False)
    want = st.encode(sentences, convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == len(want) == len(sentences)
    assert all(isinstance(r, jax.Array) and r.shape == (384,) for r in rows) and isinstance(want[0], torch.Tensor)
    assert_same_floats(np.stack([np.asarray(r) for r in rows]), torch.stack(want).numpy())
    one = ours.encode(sentences[0], convert_to_tensor=True)
    assert isinstance(one, jax.Array) and one.shape == (384,)
    assert ours.encode(sentences[0], precision="binary").shape == st.encode(sentences[0], precision="binary").shape == (48,)
    codes = ours.encode(sentences, precision="int8", convert_to_tensor=True)
    assert isinstance(codes, jax.Array) and codes.dtype == np.int8
    # An empty list: [0, dim] (sentence-transformers gives a [0] array), in the precision's type and width.
    assert ours.encode([]).shape == (0, 384) and ours.encode([], truncate_dim=10).shape == (0, 10)
    assert ours.encode([], precision="ubinary").shape == (0, 48) and ours.encode([], precision="int8").dtype == np.int8
    assert ours.encode([], convert_to_numpy=False) == [] and ours.encode([], output_value="token_embeddings") == []


def test_token_embeddings(ours, st, sentences):
    texts = sentences[:10] + sentences[-2:]
    got = ours.encode(texts, output_value="token_embeddings", truncate_dim=8, normalize_embeddings=True)
    want = st.encode(texts, output_value="token_embeddings", truncate_dim=8, normalize_embeddings=True)
    assert len(got) == len(want) == len(texts)
    for g, w in zip(got, want):
        assert isinstance(g, jax.Array)
        assert_same_floats(np.asarray(g), w.numpy())
    single = ours.encode(texts[0], output_value="token_embeddings")
    assert_same_floats(np.asarray(single), st.encode(texts[0], output_value="token_embeddings").numpy())
    with pytest.raises(ValueError, match=r"output_value=None .* is not supported"):
        ours.encode(texts, output_value=None)
    with pytest.raises(ValueError, match="output_value 'attention_mask' is not supported"):
        ours.encode(texts, output_value="attention_mask")


@pytest.mark.parametrize("name", SIMILARITY_FN_NAMES)
def test_similarity(minilm_dir, ours, sentences, name):
    """Through sentence-transformers' functions on the same embeddings (<= 25 rows a side: torch.cdist's exact path)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(minilm_dir, device="cpu", similarity_fn_name=name)
    model = SentenceEncoder.from_pretrained(minilm_dir, similarity_fn_name=name)
    assert model.similarity_fn_name == st.similarity_fn_name == name
    emb = ours.encode(sentences, truncate_dim=100)  # not unit vectors: cosine and dot differ
    a, b = emb[:20], emb[20:40]
    got, want = model.similarity(a, b), st.similarity(a, b).numpy()
    assert isinstance(got, jax.Array) and got.shape == want.shape == (20, 20) and got.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(model.similarity(a[0], b)), st.similarity(a[0], b).numpy(), rtol=1e-5, atol=1e-6)
    got = model.similarity_pairwise(a, b)
    assert got.shape == (20,)
    np.testing.assert_allclose(np.asarray(got), st.similarity_pairwise(a, b).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(model.similarity(list(a), jax.numpy.asarray(b))), want, rtol=1e-5, atol=1e-6)


def test_similarity_fn_name_default_and_checks(ours, st):
    assert ours.similarity_fn_name == st.similarity_fn_name == "cosine"
    with pytest.raises(ValueError, match="similarity_fn_name 'maxsim' is not supported"):
        SentenceEncoder.__new__(SentenceEncoder).similarity_fn_name = "maxsim"


def test_keywords_outside_the_contract(ours, sentences):
    with pytest.raises(TypeError, match="'normalise'"):
        ours.encode(sentences, normalise=True)
    with pytest.raises(TypeError, match="'processing_kwargs', 'task'"):
        ours.encode(sentences, task="query", processing_kwargs={})
    with pytest.raises(TypeError, match="multi-process encoding"):
        ours.encode(sentences, pool={"processes": []})
    with pytest.raises(ValueError, match="precision 'int4' is not supported"):
        ours.encode(sentences, precision="int4")
    with pytest.raises(ValueError, match="truncate_dim must be None or an integer >= 1, got 0"):
        ours.encode(sentences, truncate_dim=0)
    with pytest.raises(ValueError, match="convert_to_tensor must be True or False, got 'yes'"):
        ours.encode(sentences, convert_to_tensor="yes")
    # MTEB 1.x's protocol keywords and device: accepted, ignored.
    np.testing.assert_array_equal(ours.encode(sentences[:3], task_name="STSBenchmark", prompt_type=None, device="cuda"),
                                  ours.encode(sentences[:3]))


def test_bad_inputs_keep_their_errors(ours):
    with pytest.raises(TypeError, match="got None"):
        ours.encode(None, precision="int8", prompt_name="query")
    with pytest.raises(TypeError, match="item 1 is int, not str"):
        ours.encode(["ok", 3], convert_to_tensor=True)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ours.encode(["ok"], batch_size=0, output_value="token_embeddings")


def test_settings_saved_and_loaded(tmp_path, minilm_dir, sentences):
    """prompts, default_prompt_name, similarity_fn_name and truncate_dim round-trip through
    config_sentence_transformers.json, between us and sentence-transformers, both ways."""
    from sentence_transformers import SentenceTransformer

    ours = SentenceEncoder.from_pretrained(minilm_dir, prompts=PROMPTS, default_prompt_name="query",
                                           similarity_fn_name="dot", truncate_dim=256).first_layers(1)
    ours.save_pretrained(str(tmp_path / "ours"))
    config = json.loads((tmp_path / "ours" / "config_sentence_transformers.json").read_text())
    assert config["similarity_fn_name"] == "dot" and config["default_prompt_name"] == "query"
    again = SentenceEncoder.from_pretrained(str(tmp_path / "ours"))
    st = SentenceTransformer(str(tmp_path / "ours"), device="cpu")
    for model in (again, st):
        assert (model.prompts, model.default_prompt_name, model.similarity_fn_name, model.truncate_dim) == \
            ({"query": "query: ", "document": "", "passage": "passage: "}, "query", "dot", 256)
    got = again.encode(sentences)
    assert got.shape == (len(sentences), 256)
    assert_same_floats(got, st.encode(sentences))
    np.testing.assert_array_equal(got, ours.encode(sentences, prompt_name="query", truncate_dim=256))
    # The caller's settings win over the saved ones (prompts name by name).
    override = SentenceEncoder.from_pretrained(str(tmp_path / "ours"), prompts={"query": "q: "}, similarity_fn_name="euclidean",
                                               default_prompt_name="passage", truncate_dim=384)
    assert override.prompts == {"query": "q: ", "document": "", "passage": "passage: "}
    assert (override.default_prompt_name, override.similarity_fn_name, override.truncate_dim) == ("passage", "euclidean", 384)
    # sentence-transformers' save, read by us.
    st.prompts = {"query": "search_query: ", "document": "search_document: "}
    st.default_prompt_name, st.similarity_fn_name = None, "manhattan"
    st.save(str(tmp_path / "st"))
    loaded = SentenceEncoder.from_pretrained(str(tmp_path / "st"))
    assert (loaded.prompts, loaded.default_prompt_name, loaded.similarity_fn_name, loaded.truncate_dim) == \
        (st.prompts, None, "manhattan", 256)
    assert_same_floats(loaded.encode(sentences, prompt_name="document"), st.encode(sentences, prompt_name="document"))


# ------------------------------------------------------------------------------------------------
# What encode / predict take as input, and what they refuse: sentence-transformers 6.2's rule
# (is_singular_input, infer_modality), run side by side on the same input.

# (input factory, sentence-transformers' ValueError, ours). A factory: a generator is used up once.
REFUSED_INPUTS = {
    "dict of other keys": (lambda: {"a": "x", "b": "y"}, r"unrecognized modality keys: \['a', 'b'\]",
                           r"sentences is a dict with unrecognized modality key\(s\) \['a', 'b'\]"),
    "dict with an image": (lambda: {"text": "x", "image": "y"}, "Modality 'image\\+text' is not supported",
                           "sentences holds modality 'image', which this text model does not support"),
    "empty dict": (lambda: {}, "Empty dict input", "sentences is an empty dict"),
    "dict text not str": (lambda: {"text": 3}, "text input must be of type `str`", r"sentences\['text'\] is int, not str"),
    "list with a dict": (lambda: ["ok", {"s1": "x"}], r"unrecognized modality keys: \['s1'\]",
                         r"item 1 is a dict with unrecognized modality key\(s\) \['s1'\]"),
    "set": (lambda: {"hello", "world"}, "Unsupported input type: set", "unsupported input type set for sentences: a set has no order"),
    "frozenset": (lambda: frozenset({"a"}), "Unsupported input type: frozenset", "unsupported input type frozenset"),
    "bytes": (lambda: b"hello", "Unsupported input type: bytes", "unsupported input type bytes for sentences: texts are str"),
    "bytearray": (lambda: bytearray(b"hi"), "Unsupported input type: bytearray", "unsupported input type bytearray"),
    "generator": (lambda: (t for t in ["a", "b"]), "Unsupported input type: generator", "unsupported input type generator"),
    "int": (lambda: 3, "Unsupported input type: int", "unsupported input type int for sentences"),
}


@pytest.mark.parametrize("case", REFUSED_INPUTS)
def test_inputs_sentence_transformers_refuses_are_refused(ours, st, case):
    """Both raise; ours an InputTypeError (a TypeError, and a ValueError as sentence-transformers'), one
    line naming the argument and the value, on the sentence-embedding and the token-embedding path."""
    from sentemb_jax.errors import InputTypeError

    make, st_message, our_message = REFUSED_INPUTS[case]
    with pytest.raises(ValueError, match=st_message):
        st.encode(make())
    for output_value in ("sentence_embedding", "token_embeddings"):
        with pytest.raises(InputTypeError, match=our_message) as err:
            ours.encode(make(), output_value=output_value)
        assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)
        assert str(err.value).startswith("SentenceEncoder.encode: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("case", ["dict text", "dict text single", "list of dicts and str", "tuple", "numpy str"])
def test_inputs_sentence_transformers_takes_give_its_embeddings(ours, st, sentences, case):
    texts = sentences[:4]
    inputs = {"dict text": lambda: [{"text": t} for t in texts], "dict text single": lambda: {"text": texts[0]},
              "list of dicts and str": lambda: [{"text": texts[0]}, *texts[1:]], "tuple": lambda: tuple(texts),
              "numpy str": lambda: np.array(texts)}[case]
    got, want = ours.encode(inputs()), st.encode(inputs())
    assert got.shape == want.shape == ((384,) if case == "dict text single" else (4, 384))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_truncate_dim_above_the_dimension_keeps_it_with_a_warning(ours, st, sentences, caplog):
    """sentence-transformers returns all 384 dimensions without a word; we return the same, and say so."""
    texts = sentences[:3]
    with caplog.at_level("WARNING", logger="sentemb_jax.encode_contract"):
        got = ours.encode(texts, truncate_dim=1000)
    want = st.encode(texts, truncate_dim=1000)
    assert got.shape == want.shape == (3, 384)
    np.testing.assert_allclose(got, want, atol=1e-5)
    said = [r.getMessage() for r in caplog.records if r.name == "sentemb_jax.encode_contract"]
    assert said == ["SentenceEncoder.encode: truncate_dim=1000 is more than the embedding dimension 384; the embeddings "
                    "keep all 384 dimensions (as in sentence-transformers)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="sentemb_jax.encode_contract"):
        ours.encode(texts, truncate_dim=384)
        ours.encode(texts[:1], truncate_dim=1000, output_value="token_embeddings")  # truncate_dim does not apply there
    assert not [r for r in caplog.records if r.name == "sentemb_jax.encode_contract"]


@pytest.fixture(scope="module")
def crosses(minilm_dir):
    """(sentence-transformers' CrossEncoder, ours) on MiniLM's backbone, each with a fresh head: the
    scores differ, the argument handling is compared."""
    from sentence_transformers import CrossEncoder as STCrossEncoder

    from sentemb_jax import CrossEncoder

    return STCrossEncoder(minilm_dir, device="cpu"), CrossEncoder.from_pretrained(minilm_dir)


def test_cross_encoder_predict_arguments_as_sentence_transformers(crosses, sentences):
    from sentemb_jax.errors import ConfigError, InputTypeError

    st_cross, ours = crosses
    pairs = list(zip(sentences[:5], sentences[5:10]))
    for bad in (2.5, "8"):  # sentence-transformers: a TypeError from inside (`'float' object cannot be ...`)
        with pytest.raises(TypeError):
            st_cross.predict(pairs, batch_size=bad)
        with pytest.raises(ConfigError, match=f"^CrossEncoder.predict: batch_size must be an integer >= 1, got {bad!r}$"):
            ours.predict(pairs, batch_size=bad)
    # A numpy array [n, 2] of str: n scores, as a list of the same pairs gives them.
    array = np.array(pairs)
    want = st_cross.predict(array)
    got = ours.predict(array)
    assert got.shape == want.shape == (5,) and got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, ours.predict(pairs))
    np.testing.assert_array_equal(ours.predict(np.array(pairs, dtype=object), batch_size=np.int64(64)), got)
    # One pair (a tuple or a 1-D array): one score, a scalar.
    for one in (pairs[0], np.array(pairs[0])):
        assert np.shape(ours.predict(one)) == np.shape(st_cross.predict(one)) == ()
        np.testing.assert_allclose(ours.predict(one), got[0], atol=1e-6)
    assert ours.predict(np.zeros((0, 2), str)).shape == st_cross.predict(np.zeros((0, 2), str)).shape == (0,)
    # Refused by both: a generator, a set, bytes texts, rows of three.
    for make, our_message in ((lambda: (p for p in pairs), "unsupported input type generator for pairs"),
                              (lambda: set(pairs), "unsupported input type set for pairs"),
                              (lambda: [(b"a", b"b")], "item 0 is bytes, not str"),
                              (lambda: np.array([["a", "b", "c"]]), r"pair 0 is not a \(text, text\) pair")):
        with pytest.raises(ValueError, match="Unsupported input type"):
            st_cross.predict(make())
        with pytest.raises(InputTypeError, match=our_message):
            ours.predict(make())


def test_mteb_batch_whose_text_is_one_string_is_one_text(ours, st, sentences):
    """A DataLoader with batch_size=None yields rows ({'text': 'hello'}): one text each, as
    sentence-transformers takes a str (MTEB 2's own SentenceTransformer wrapper iterates the
    characters there: one embedding per character)."""
    import os
    import tempfile

    os.environ.setdefault("MTEB_CACHE", os.path.join(tempfile.gettempdir(), "sentemb_jax_test_mteb_cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    mteb = pytest.importorskip("mteb")
    import datasets
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper
    from torch.utils.data import DataLoader

    from sentemb_jax.errors import InputTypeError
    from sentemb_jax.evaluation.mteb_adapter import MtebEncoder

    texts = ["hello", *sentences[:3]]
    rows = lambda: DataLoader(datasets.Dataset.from_dict({"text": texts}), batch_size=None)  # noqa: E731
    kwargs = dict(task_metadata=mteb.get_task("STSBenchmark").metadata, hf_split="test", hf_subset="default")
    got = MtebEncoder(ours).encode(rows(), **kwargs)
    assert got.shape == (4, 384)
    np.testing.assert_allclose(got, st.encode(texts), atol=1e-5)
    np.testing.assert_allclose(got[0], st.encode("hello"), atol=1e-5)
    assert SentenceTransformerEncoderWrapper(st).encode(rows(), **kwargs).shape == (sum(map(len, texts)), 384)
    with pytest.raises(InputTypeError, match=r"MtebEncoder.encode: unsupported input type set for batch 0\['text'\]"):
        MtebEncoder(ours).encode(iter([{"text": {"a", "b"}}]), **kwargs)

"""Packed inference (sentemb_jax.inference): encode / CrossEncoder.predict with texts laid end to
end in rows give the padded path's results (max |diff| <= 1e-5), on the shipped MiniLM, tiny T5
encoders (mean and encoder-decoder first token) and cross-encoders with token types."""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_models import make_t5
from jax._src.dispatch import BACKEND_COMPILE_EVENT  # the event name jax records per backend compile

from sentemb_jax import SentenceEncoder
from sentemb_jax import cross_encoder as cross_module
from sentemb_jax import encoder as encoder_module
from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.data.packing import fill_rows
from sentemb_jax.inference import clear_shared_programs, pack_blocks, params_for_compute

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

LONG = " ".join(f"word{i} tokens and more" for i in range(60))  # > 128 MiniLM tokens: rows grow to its bucket


def _texts(stsb_test, n=150):
    s1, s2, _ = stsb_test
    return [LONG, ""] + s1[:n] + s2[: n // 2] + ["a", "A man is playing a guitar."]


def test_pack_blocks_places_every_item_once_within_capacity():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 41, 500).tolist() + [64, 64, 1]
    for rows, text_slots in [(6, 40), (6, 9)]:
        blocks = pack_blocks(lengths, row_length=64, rows=rows, text_slots=text_slots)
        placed = [i for b in blocks for row in b for i in row]
        assert sorted(placed) == list(range(len(lengths)))
        for block in blocks:
            assert 1 <= len(block) <= rows and sum(len(r) for r in block) <= text_slots
            assert all(sum(lengths[i] for i in row) <= 64 for row in block)
        if text_slots == 40:  # token-bound: the fixed-shape blocks' slots within 5% of the tokens (last block aside)
            tokens = sum(lengths[i] for b in blocks[:-1] for r in b for i in r)
            assert len(blocks[:-1]) * rows * 64 <= 1.05 * tokens
    with pytest.raises(ValueError, match="item 1 has 65 tokens"):
        pack_blocks([3, 65], row_length=64, rows=2, text_slots=4)


def test_fill_rows_layout():
    tokens = [[5, 6, 7], [8], [9, 10]]
    arrays = fill_rows(tokens, [[0, 1], [2]], row_length=4, rows=3, text_slots=4, width=4, pad_id=0,
                          extras={"token_type_ids": [[0, 1, 1], [1], [0, 0]]})
    np.testing.assert_array_equal(arrays["input_ids"], [[5, 6, 7, 8], [9, 10, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(arrays["token_type_ids"], [[0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    p = arrays["packing"]
    np.testing.assert_array_equal(p["segment_ids"], [[1, 1, 1, 2], [1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(p["positions"], [[0, 1, 2, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(p["token_index"], [[0, 1, 2, 0], [3, 3, 3, 3], [4, 5, 4, 4], [0, 0, 0, 0]])
    np.testing.assert_array_equal(p["token_mask"], [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("batch_size", [8, 64])
def test_minilm_encode_packed_equals_padded(minilm_dir, stsb_test, batch_size):
    model = SentenceEncoder.from_pretrained(minilm_dir)
    texts = _texts(stsb_test)
    assert len(model.tokenizer.tokenize([LONG])[0]) > 128
    assert model.packed  # the default
    model.packed = False
    padded = model.encode(texts, batch_size=batch_size)
    model.packed = True
    packed = model.encode(texts, batch_size=batch_size)
    assert np.abs(packed - padded).max() <= 1e-5
    few = model.encode(texts[:5], batch_size=batch_size)  # fewer texts than a batch: a smaller block
    assert np.abs(few - padded[:5]).max() <= 1e-5


@pytest.mark.parametrize("pooling", ["mean", "encdec_first"])
def test_t5_encode_packed_equals_padded(tmp_path, stsb_test, pooling):
    make_t5(str(tmp_path / "t5"), "1.1")
    model = SentenceEncoder.from_pretrained(str(tmp_path / "t5"), pooling=pooling, max_seq_length=160)
    texts = _texts(stsb_test, 60)
    model.packed = False
    padded = model.encode(texts, batch_size=16)
    model.packed = True
    assert np.abs(model.encode(texts, batch_size=16) - padded).max() <= 1e-5


@pytest.mark.parametrize("kind", ["minilm_first", "minilm_mean", "t5_mean"])
def test_cross_encoder_predict_packed_equals_padded(minilm_dir, tmp_path, stsb_test, kind):
    if kind.startswith("minilm"):
        model = CrossEncoder.from_pretrained(minilm_dir, pooling=kind.split("_")[1], seed=1)
    else:
        make_t5(str(tmp_path / "t5"), "1.1")
        model = CrossEncoder.from_pretrained(str(tmp_path / "t5"), pooling="mean", max_seq_length=160)
    s1, s2, _ = stsb_test
    pairs = [(LONG, "short"), ("", "empty first")] + list(zip(s1[:80], s2[:80]))
    assert model.packed  # the default
    model.packed = False
    padded = model.predict(pairs, batch_size=16, activation="none")
    model.packed = True
    packed = model.predict(pairs, batch_size=16, activation="none")
    assert np.abs(packed - padded).max() <= 1e-5
    assert np.std(padded) > 1e-3  # the scores differ between pairs: the comparison is not of constants


@contextlib.contextmanager
def backend_compiles():
    """A list that collects one entry per XLA backend compile inside the block (jax.monitoring)."""
    seen: list[float] = []

    def listener(event: str, duration: float, **_):
        if event == BACKEND_COMPILE_EVENT:
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@pytest.mark.parametrize("packed", [False, True])
def test_warm_up_compiles_the_shapes_encode_then_uses_without_running_them(minilm_dir, stsb_test, packed, monkeypatch):
    """After warm_up(batch_size) an encode / predict call of that batch size compiles nothing new;
    warm_up compiles one executable per length and runs none (run=True: runs each once)."""
    # Encoders of one architecture share their programs: new ones, as in a process that has
    # compiled none of MiniLM's shapes yet (the tests before this one in the file have).
    clear_shared_programs()
    s1, s2, _ = stsb_test
    encoder = SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=40)
    cross = CrossEncoder.from_pretrained(minilm_dir, seed=1)
    cross.tokenizer.max_length = 40
    lengths = len([b for b in encoder.tokenizer.buckets if b <= 40])
    for model, use in ((encoder, lambda: encoder.encode(s1[:120] + s2[:40] + [LONG], batch_size=8)),  # LONG is cut to 40 tokens
                       (cross, lambda: cross.predict(list(zip(s1[:100], s2[:100])) + [(LONG, "a")], batch_size=8))):
        model.packed = packed
        jitted = ("_embed" if model is encoder else "_logits") + ("_packed" if packed else "")
        runs = []
        with monkeypatch.context() as m:  # warm_up never calls the jitted function, only lowers it
            m.setattr(model, jitted, _counting(getattr(model, jitted), runs))
            with backend_compiles() as compiles:
                assert model.warm_up(batch_size=8) == lengths
        assert runs == [] and len(compiles) == lengths
        with backend_compiles() as compiles:
            use()
        assert compiles == []
        with monkeypatch.context() as m:  # run=True runs every warmed shape
            m.setattr(model, jitted, _counting(getattr(model, jitted), runs))
            with backend_compiles() as compiles:
                model.warm_up(batch_size=8, run=True)
        assert len(runs) >= lengths and compiles == []  # packed: a length may fill several blocks of one shape


def _counting(jitted, calls: list):
    """`jitted`, with its direct calls counted (lower, which warm-up uses, passes through)."""
    class Counting:
        def __call__(self, *args):
            calls.append(1)
            return jitted(*args)

        def __getattr__(self, name):
            return getattr(jitted, name)
    return Counting()


@pytest.mark.parametrize("packed", [False, True])
def test_inference_transfers_only_its_token_arrays(minilm_dir, stsb_test, packed):
    """Params live on the device (inference.DeviceParams): encode and predict send only their token
    arrays, explicitly. A numpy params tree given to a jitted call would be copied on every call;
    with implicit host-to-device transfers disallowed every inference path still runs, with the
    same results."""
    s1, s2, _ = stsb_test
    texts, pairs = s1[:40] + [LONG], list(zip(s1[:30], s2[:30]))
    encoder = SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=40)
    cross = CrossEncoder.from_pretrained(minilm_dir, seed=1)
    encoder.packed = cross.packed = packed
    for model in (encoder, cross):
        assert all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(model.params))
    want = (encoder.encode(texts, batch_size=16), encoder.encode(texts[:9], output_value="token_embeddings"),
            cross.predict(pairs, batch_size=16))
    with jax.transfer_guard_host_to_device("disallow"):
        got = (encoder.encode(texts, batch_size=16), encoder.encode(texts[:9], output_value="token_embeddings"),
               cross.predict(pairs, batch_size=16))
    np.testing.assert_array_equal(got[0], want[0])
    assert all(np.array_equal(g, w) for g, w in zip(got[1], want[1], strict=True))
    np.testing.assert_array_equal(got[2], want[2])


def test_device_params_puts_host_leaves_once_and_keeps_device_ones(minilm_dir):
    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    on_device = encoder.params
    encoder.params = on_device  # already on the device: the very same tree
    assert encoder.params is on_device
    host = jax.device_get(on_device)
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree_util.tree_leaves(host))
    encoder.params = host
    for got, want in zip(jax.tree_util.tree_leaves(encoder.params), jax.tree_util.tree_leaves(host), strict=True):
        assert isinstance(got, jax.Array) and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)
    encoder.params = None  # a tower the train loop initialises
    assert encoder.params is None


def test_bfloat16_inference_casts_the_kernels_once_with_the_same_results(minilm_dir, stsb_test):
    """dtype="bfloat16": the jitted calls take the backbone's Dense kernels already in bfloat16
    (inference.params_for_compute), made once per assignment of `params`, which stay float32 (saving,
    export). The embeddings and scores equal those of the float32 kernels cast inside each call (the
    Dense layers' own cast), bitwise; the compiled program converts no kernel."""
    s1, s2, _ = stsb_test
    texts, pairs = s1[:40] + [LONG], list(zip(s1[:30], s2[:30]))
    encoder = SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=40, dtype="bfloat16")
    cross = CrossEncoder.from_pretrained(minilm_dir, seed=1, dtype="bfloat16")
    for model in (encoder, cross):
        compute = params_for_compute(model)
        assert params_for_compute(model) is compute  # kept
        leaves = jax.tree_util.tree_leaves_with_path(compute["backbone"])
        kernels = [v for p, v in leaves if p[-1].key == "kernel"]
        loaded = [p for p, _ in jax.tree_util.tree_leaves_with_path(model.params["backbone"]) if p[-1].key == "kernel"]
        assert len(kernels) == len(loaded) >= 36 and all(v.dtype == jnp.bfloat16 for v in kernels)  # 6 layers x 6 Dense
        assert all(v.dtype == jnp.float32 for p, v in leaves if p[-1].key != "kernel")  # biases, norms, tables
        assert all(v.dtype == jnp.float32 for v in jax.tree_util.tree_leaves(model.params))
    as_loaded = lambda model: model.params  # noqa: E731  (the float32 tree: each call casts the kernels)
    for packed in (False, True):
        encoder.packed = cross.packed = packed
        got = encoder.encode(texts, batch_size=16), cross.predict(pairs, batch_size=16)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(encoder_module, "params_for_compute", as_loaded)
            m.setattr(cross_module, "params_for_compute", as_loaded)
            want = encoder.encode(texts, batch_size=16), cross.predict(pairs, batch_size=16)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    ids = np.zeros((16, 32), np.int32)
    converts = [encoder._embed.lower(p, ids, ids).compile().as_text().count(" convert(")
                for p in (params_for_compute(encoder), encoder.params)]
    assert converts[1] - converts[0] >= 36  # the 36 kernels' casts left the program
    encoder.params = jax.device_get(encoder.params)  # a new assignment: a new compute copy
    assert params_for_compute(encoder) is not compute

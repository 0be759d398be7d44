"""encode's pipeline (sentemb_jax.inference.run_pipelined): texts tokenised chunk by chunk while the
device runs the chunk before, results fetched one chunk behind, in the input order. On the shipped
all-MiniLM-L6-v2 and STS-B test sentences it gives one padded pass's embeddings over all texts (the
per-batch loop encode ran before it was chunked) within 1e-5, packed and padded; bfloat16 stays
within cosine 0.99 of float32; the default batch size is 64 on the CPU and 1,024 on a GPU."""
from __future__ import annotations

import sys
import threading

import jax
import numpy as np
import pytest

from sentemb_jax import SentenceEncoder, inference
from sentemb_jax.inference import dispatch_length_sorted, dispatch_packed, run_pipelined
from sentemb_jax.tokenization import DEFAULT_BUCKETS, bucket_length

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return SentenceEncoder.from_pretrained(minilm_dir)


def _texts(stsb_test) -> list[str]:
    """~330 texts, shortest first (the reverse of the length sort, so that each chunk's longest come
    after the chunk before has been sorted), an empty text and one cut at max_seq_length."""
    s1, s2, _ = stsb_test
    sample = sorted(s1[:200] + s2[:120], key=len)
    return ["", *sample[:150], " ".join(s1[:40]), *sample[150:], "A man is playing a guitar."]


def _one_padded_pass(model: SentenceEncoder, texts: list[str], batch_size: int) -> np.ndarray:
    """encode as it was before tokenising in chunks: every text tokenised, one sort by token length,
    batches padded to a bucket, each run by the jitted padded forward (float32 params)."""
    ids = model.tokenizer.tokenize(texts)
    order = np.argsort([-len(x) for x in ids], kind="stable")
    rows = batch_size if len(ids) >= batch_size else 1 << (len(ids) - 1).bit_length()
    out = np.empty((len(ids), model.get_sentence_embedding_dimension()), np.float32)
    for start in range(0, len(ids), batch_size):
        chunk = order[start : start + batch_size]
        batch = model.tokenizer.pad([ids[i] for i in chunk], batch_size=rows)
        out[chunk] = np.asarray(model._embed(model.params, batch["input_ids"], batch["attention_mask"]))[: len(chunk)]
    return out


@pytest.mark.parametrize("packed", [True, False])
def test_chunked_encode_equals_one_padded_pass(minilm, stsb_test, packed, monkeypatch):
    texts = _texts(stsb_test)
    assert len(minilm.tokenizer.tokenize([texts[151]])[0]) == minilm.max_seq_length  # cut at 256 tokens
    want = _one_padded_pass(minilm, texts, 16)
    assert np.std(want, axis=0).mean() > 0.01  # the texts' embeddings differ: not a comparison of constants
    tokenized, dispatched = [], []
    tokenize, dispatch = minilm.tokenizer.tokenize, minilm._dispatch
    monkeypatch.setattr(minilm.tokenizer, "tokenize", lambda t: tokenized.append(len(t)) or tokenize(t))
    monkeypatch.setattr(minilm, "_dispatch", lambda ids, *a: dispatched.append(len(ids)) or dispatch(ids, *a))
    minilm.packed = packed
    try:
        minilm.texts_per_chunk = 48
        got = minilm.encode(texts, batch_size=16)
    finally:
        minilm.packed, minilm.texts_per_chunk = True, None
    assert tokenized == [48] * 6 + [len(texts) - 6 * 48]  # seven chunks, tokenised one at a time
    assert len(dispatched) == 7 and max(dispatched) > 48  # a chunk's sort takes what the one before held back
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5
    tokenized.clear()
    assert np.abs(minilm.encode(texts, batch_size=16) - want).max() <= 1e-5  # the default: one chunk
    assert tokenized == [len(texts)]
    one = minilm.encode(texts[-1], batch_size=16)  # a single text: [dim]
    assert one.shape == (384,) and np.abs(one - want[-1]).max() <= 1e-5
    assert np.abs(minilm.encode([""], batch_size=16) - want[:1]).max() <= 1e-5
    assert minilm.encode([], batch_size=16).shape == (0, 384)


def test_bfloat16_encode_is_close_to_float32(minilm_dir, minilm, stsb_test):
    texts = _texts(stsb_test)
    want = minilm.encode(texts, batch_size=16)
    bf16 = SentenceEncoder.from_pretrained(minilm_dir, dtype="bfloat16")
    bf16.texts_per_chunk = 64
    got = bf16.encode(texts, batch_size=16)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.99
    assert np.abs(got - want).max() > 1e-4  # bfloat16 did run: its embeddings are not float32's


class _Fetch:
    """A device result that logs when the host fetches it."""

    def __init__(self, values: np.ndarray, log: list, chunk: int):
        self.values, self.log, self.chunk = values, log, chunk

    def __array__(self, dtype=None, copy=None):
        self.log.append(("fetch", self.chunk))
        return self.values


@pytest.mark.parametrize("packed", [True, False])
def test_run_pipelined_overlaps_tokenising_keeps_order_and_fetches_a_chunk_behind(packed):
    """Text i is tokenised as its own id (1 to 40 tokens); the fake device returns each text's first
    token. Every text comes back at its place; the next chunk is tokenised while the current one is
    dispatched (dispatch waits for that to start); chunk k is fetched only after chunk k+1 is dispatched."""
    texts = [str(i) for i in range(1000)]
    log: list = []
    started = {}

    def tokenize(chunk):
        started.setdefault(int(chunk[0]), threading.Event()).set()
        return [[int(t) + 1] * (1 + int(t) * 7 % 40) for t in chunk]

    def run_batch(tokens, chunk):
        def run(items, rows):
            values = np.zeros((rows, 1), np.float32)
            values[: len(items), 0] = [tokens[i][0] for i in items]
            return _Fetch(values, log, chunk)
        return run

    def run_block(chunk):
        def run(arrays):
            first = arrays["input_ids"].reshape(-1)[arrays["packing"]["token_index"][:, 0]]
            return _Fetch(first[:, None].astype(np.float32), log, chunk)
        return run

    def dispatch(tokens, final):
        chunk = sum(1 for event in log if event[0] == "dispatch")
        log.append(("dispatch", chunk))
        if not final:  # the next chunk (it starts at text 128 (k + 1)) is being tokenised meanwhile
            assert started.setdefault(128 * (chunk + 1), threading.Event()).wait(30)
        if packed:
            return dispatch_packed(tokens, 8, run_block(chunk), 0, final=final)
        return dispatch_length_sorted([len(t) for t in tokens], 8, run_batch(tokens, chunk), few=False, final=final,
                                      buckets=DEFAULT_BUCKETS)

    out = run_pipelined(texts, tokenize, 128, dispatch, (1,))
    np.testing.assert_array_equal(out[:, 0], np.arange(1, 1001))
    chunks = 8
    assert [c for kind, c in log if kind == "dispatch"] == list(range(chunks))
    for k in range(chunks - 1):
        assert log.index(("dispatch", k + 1)) < log.index(("fetch", k))
    fetched = [c for kind, c in log if kind == "fetch"]
    assert fetched == sorted(fetched) and set(fetched) == set(range(chunks))


def test_chunked_batches_take_the_token_slots_of_one_sort(minilm, stsb_test):
    """Padded, batched per bucket: chunk by chunk exactly the token slots of one sort of all the
    texts (a plain sort per chunk takes more). Packed: within 1% of one pack of all the texts."""
    s1, s2, _ = stsb_test
    texts, buckets = s1 + s2, minilm.tokenizer.buckets

    def slots(chunk: int, kind: str) -> int:
        used = [0]

        def dispatch(ids, final):
            if kind == "packed":
                def block(arrays):
                    used[0] += arrays["input_ids"].size
                    return np.zeros((len(arrays["packing"]["token_index"]), 1))
                return dispatch_packed(ids, 64, block, 0, buckets=buckets, final=final)

            def batch(items, rows):
                used[0] += rows * bucket_length(max(len(ids[i]) for i in items), buckets)
                return np.zeros((rows, 1))
            return dispatch_length_sorted([len(x) for x in ids], 64, batch, few=False, final=final,
                                          buckets=buckets if kind == "bucketed" else None)

        run_pipelined(texts, minilm.tokenizer.tokenize, chunk, dispatch, (1,))
        return used[0]

    whole = len(texts)
    assert slots(512, "bucketed") == slots(whole, "bucketed") == slots(whole, "sorted")
    assert slots(512, "sorted") > 1.05 * slots(whole, "sorted")
    assert slots(512, "packed") <= 1.01 * slots(whole, "packed")


@pytest.mark.parametrize("packed", [True, False])
def test_default_batch_size_is_64_on_the_cpu_and_1024_on_a_gpu(minilm, stsb_test, packed, monkeypatch):
    """What the device is given a call, with a stand-in forward: packed, blocks of batch_size x 24 token
    slots (rows of 64) and 4 x batch_size text slots; padded, batch_size rows. An explicit batch_size
    is kept as given, on a GPU too."""
    s1, s2, _ = stsb_test
    texts = s1 + s2  # 2,758 texts: more than a GPU batch
    shapes: list[tuple] = []

    def forward_packed(_params, arrays):
        shapes.append(arrays["input_ids"].shape + arrays["packing"]["token_index"].shape[:1])
        return np.zeros((arrays["packing"]["token_index"].shape[0], 384), np.float32)

    def forward_padded(_params, ids, _mask):
        shapes.append(ids.shape[:1])
        return np.zeros((ids.shape[0], 384), np.float32)

    monkeypatch.setattr(minilm, "_embed_packed", forward_packed)
    monkeypatch.setattr(minilm, "_embed", forward_padded)
    minilm.packed = packed
    try:
        for backend, batch_size, want in (("cpu", None, 64), ("gpu", None, 1024), ("gpu", 7, 7), ("cpu", 100, 100)):
            with monkeypatch.context() as m:
                m.setattr(jax, "default_backend", lambda backend=backend: backend)
                assert inference.default_batch_size() == (64 if backend == "cpu" else 1024)
                if batch_size is None:  # the CPU tokenises a call at once; a GPU 8 batches at a time
                    assert inference.chunk_texts(want) == (sys.maxsize if backend == "cpu" else 8192)
                shapes.clear()
                minilm.encode(texts, batch_size=batch_size)
            if packed:  # rows of 64 slots or more (the chunk's longest text's bucket): batch_size x 24 slots in all
                assert shapes and all(s[1] >= 64 and s == (-(-want * 24 // s[1]), s[1], 4 * want) for s in shapes)
            else:
                assert set(shapes) == {(want,)} and len(shapes) >= len(texts) / want
    finally:
        minilm.packed = True

"""The two input routes (DataConfig.reader): the TensorFlow-free reader (data.reader) and the seqio
pipeline read one source with one seed into the same batches, array for array - every kind, across
epochs, per host, from validated files and from prepared corpora of text and of ids, with bad rows
skipped - and the reader resumes exactly from its state. Augmented views are drawn by numpy on the
one route and by TensorFlow on the other: the same rule (tested here on the rate), other words."""
import dataclasses
import itertools
import json
import os
import re

import numpy as np
import pytest

from sentemb_jax.data import pipeline, reader
from sentemb_jax.data import prepare as prep
from sentemb_jax.data.kinds import file_spec
from sentemb_jax.errors import DataError
from sentemb_jax.tokenization import TRAIN_BUCKETS, Tokenizer
from sentemb_jax.training.config import DataConfig

LENGTH = 32


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return Tokenizer.from_pretrained(minilm_dir, max_length=LENGTH)


def _numpy(data: DataConfig, tokenizer, shard=None) -> reader.NumpyBatches:
    return reader.numpy_batches(data, tokenizer, shard, TRAIN_BUCKETS, data.same_length)


def _seqio(data: DataConfig, model_dir: str, shard=None) -> pipeline.InputPipeline:
    name = pipeline.register_task(data, model_dir)
    return pipeline.InputPipeline(name, batch_size=data.batch_size // (shard[1] if shard else 1), sequence_length=LENGTH,
                                  seed=data.seed, buckets=TRAIN_BUCKETS, same_length=data.same_length,
                                  shard_info=shard)


def _take(source, n: int) -> list[dict]:
    it = iter(source)
    try:
        return list(itertools.islice(it, n))
    finally:
        it.close()


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 0
    for i, (x, y) in enumerate(zip(a, b)):
        assert sorted(x) == sorted(y), i
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"batch {i}, {k}")


@pytest.mark.parametrize("task,options", [
    ("nli_triples", {}), ("nli_pairs", {}), ("commqa", {}), ("sts_pairs", {}),
    ("sentences", {"views": ("none", "neighbour")}), ("nli_triples", {"same_length": False}),
])
def test_every_kind_reads_the_same_batches_on_both_routes(task, options, tokenizer, minilm_dir, data_dir):
    data = DataConfig(task=task, batch_size=16, sequence_length=LENGTH, seed=3, **options)
    _assert_same(_take(_numpy(data, tokenizer), 3), _take(_seqio(data, minilm_dir), 3))


def _small_triples(tmp_path, rows: int = 37, bad_row: int | None = None) -> str:
    path = tmp_path / "triples.tsv"
    lines = ["anchor\tpositive\tnegative"]
    for r in range(rows):
        lines.append(f"sentence {r} about {'x ' * (r % 9)}\tparaphrase {r}\t" + ("" if r == bad_row else f"other {r}"))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_epochs_hosts_and_skipped_rows_are_the_same_on_both_routes(tokenizer, minilm_dir, tmp_path):
    """37 rows (one empty negative, skipped), batches of 8: 4 per epoch, read over 3 epochs; two
    hosts each read 4 rows of every global batch of 8."""
    path = _small_triples(tmp_path, bad_row=5)
    data = DataConfig(task="nli_triples", batch_size=8, sequence_length=LENGTH, seed=7, data_dir=str(tmp_path),
                      files={"nli_triples": path}, on_bad_row="skip")
    a = _take(_numpy(data, tokenizer), 12)
    _assert_same(a, _take(_seqio(data, minilm_dir), 12))
    epoch = [int(i) for batch in a[:4] for i in batch["row_id"]]
    assert len(set(epoch)) == 32 and max(epoch) < 36  # 36 usable rows (ids count them), whole batches only
    assert [int(i) for i in a[4]["row_id"]] != epoch[:8]  # the next epoch is another order
    for host in (0, 1):
        _assert_same(_take(_numpy(data, tokenizer, (host, 2)), 8), _take(_seqio(data, minilm_dir, (host, 2)), 8))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, minilm_dir, data_dir):
    """The first 300 NLI triples prepared as text and as ids (4 shards each)."""
    root = tmp_path_factory.mktemp("routes")
    src = root / "triples.tsv"
    with open(os.path.join(data_dir, "nli", "triples.tsv"), encoding="utf-8") as f:
        src.write_text("".join(itertools.islice(f, 301)))
    out = {}
    for label, tokenizer_dir in (("text", None), ("ids", minilm_dir)):
        prep.prepare(file_spec("nli_triples", ""), [str(src)], str(root / label), 4, kind="nli_triples",
                     prefix="nli", progress=False, tokenizer_dir=tokenizer_dir, max_length=LENGTH)
        out[label] = str(root / label)
    return str(root), out


@pytest.mark.parametrize("kind", ["text", "ids"])
def test_a_prepared_corpus_reads_the_same_batches_on_both_routes(kind, prepared, tokenizer, minilm_dir):
    root, corpora = prepared
    data = DataConfig(task="nli_triples", batch_size=32, sequence_length=LENGTH, seed=1, data_dir=root,
                      files={"nli_triples": corpora[kind]}, window_shards=2)
    _assert_same(_take(_numpy(data, tokenizer), 20), _take(_seqio(data, minilm_dir), 20))  # 9 per epoch
    _assert_same(_take(_numpy(data, tokenizer, (1, 2)), 10), _take(_seqio(data, minilm_dir, (1, 2)), 10))


def test_a_corpus_of_ids_cut_below_the_sequence_length_is_refused_on_both_routes(prepared, tokenizer, minilm_dir):
    """Ids cut at 32 tokens read at sequence_length 64 would train on texts cut short without a word
    (before: 381 tokens for 48 texts where the text route gave 2,169); a shorter length reads them."""
    root, corpora = prepared
    data = DataConfig(task="nli_triples", batch_size=8, sequence_length=2 * LENGTH, data_dir=root,
                      files={"nli_triples": corpora["ids"]})
    message = (f"{corpora['ids']}: the 'nli_triples' corpus holds ids cut at {LENGTH} tokens (prepare_corpus.max_length), "
               f"fewer than DataConfig.sequence_length={2 * LENGTH}: longer texts would train cut short. Prepare it again "
               f"with prepare_corpus.max_length={2 * LENGTH}, or train with sequence_length <= {LENGTH}")
    with pytest.raises(DataError) as e:
        _numpy(data, tokenizer)
    assert str(e.value) == message
    with pytest.raises(DataError, match=re.escape(message.split(": ", 1)[1])):
        pipeline.register_task(data, minilm_dir)
    assert _take(_numpy(dataclasses.replace(data, sequence_length=LENGTH // 2), tokenizer), 1)  # cut further: fine
    assert _take(_numpy(dataclasses.replace(data, files={"nli_triples": corpora["text"]}), tokenizer), 1)  # text


def test_a_corpus_prepared_as_another_kind_is_refused_on_both_routes(prepared, tokenizer, minilm_dir):
    """NLI triples given as the QA task's files would train on rows whose columns mean something
    else (before: a commqa run trained on a corpus prepared as nli_pairs without a word)."""
    root, corpora = prepared
    data = DataConfig(task="nli_pairs", batch_size=8, sequence_length=LENGTH, data_dir=root,
                      files={"nli_pairs": corpora["text"]})
    message = (f"{corpora['text']}: a corpus prepared as 'nli_triples' (prepare_corpus.kind), given here as the "
               "'nli_pairs' task's files: give it as files['nli_triples'], or prepare the 'nli_pairs' rows with "
               "prepare_corpus.kind='nli_pairs'")
    with pytest.raises(DataError) as e:
        _numpy(data, tokenizer)
    assert str(e.value) == message
    with pytest.raises(DataError) as e:
        pipeline.register_task(data, minilm_dir)
    assert str(e.value) == message


def test_the_reader_resumes_exactly_from_its_state_and_across_process_counts(tokenizer, tmp_path):
    path = _small_triples(tmp_path)
    data = DataConfig(task="nli_triples", batch_size=8, sequence_length=LENGTH, seed=2, data_dir=str(tmp_path),
                      files={"nli_triples": path})
    straight = _take(_numpy(data, tokenizer), 11)
    first = _numpy(data, tokenizer)
    _take(first, 6)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    assert (state["epoch"], state["step_in_epoch"]) == (1, 2)
    again = _numpy(data, tokenizer)
    again.load_state_dict(state)
    _assert_same(_take(again, 5), straight[6:])
    # Two processes' state (one global batch of 8) resumes in one, and the other way round.
    half = _numpy(data, tokenizer, (0, 2))
    _take(half, 6)
    one = _numpy(data, tokenizer)
    one.load_state_dict(half.state_dict())
    _assert_same(_take(one, 1), straight[6:7])
    with pytest.raises(ValueError, match="global batch of 8"):
        _numpy(dataclasses.replace(data, batch_size=4), tokenizer).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        _numpy(dataclasses.replace(data, seed=3), tokenizer).load_state_dict(state)


def test_too_few_rows_is_an_error_not_a_hang_and_a_mixture_names_its_route(tokenizer, tmp_path):
    path = _small_triples(tmp_path, rows=5)
    data = DataConfig(task="nli_triples", batch_size=8, sequence_length=LENGTH, data_dir=str(tmp_path),
                      files={"nli_triples": path})
    with pytest.raises(DataError, match="5 usable rows cannot fill one batch of batch_size=8"):
        _take(_numpy(data, tokenizer), 1)
    with pytest.raises(DataError, match="reader='seqio'"):
        _numpy(DataConfig(task="qa_nli_pairs", data_dir=str(tmp_path)), tokenizer)


def test_word_deletion_deletes_at_its_rate_on_the_numpy_route(tokenizer, data_dir):
    """Views drawn anew each epoch are numpy's draws, not TensorFlow's: the rule is the rate. With
    rate 0.3 about 30% of words go (never all of a sentence); the other view is untouched; an epoch
    draws other words than the one before, and the same seed draws the same words."""
    data = DataConfig(task="sentences", batch_size=64, sequence_length=128, seed=0,
                      views=("none", "word_deletion"), augment_rate=0.3)
    batches = _take(_numpy(data, tokenizer), 2)
    again = _take(_numpy(data, tokenizer), 2)
    _assert_same(batches, again)
    kept = [b["view2_attention_mask"].sum() - 2 * len(b["row_id"]) for b in batches]
    whole = [b["view1_attention_mask"].sum() - 2 * len(b["row_id"]) for b in batches]
    ratio = sum(kept) / sum(whole)  # tokens, not words: a close proxy of the word rate
    assert 0.6 < ratio < 0.8, ratio
    assert (batches[0]["view2_attention_mask"].sum(1) > 2).all()

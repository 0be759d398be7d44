"""seqio tasks and the input pipeline: determinism, exact resumption, sharding, views, TFDS."""
import csv
import itertools
import json
import os

import numpy as np
import pytest
import seqio
from run_utils import gin_file_args

from sentemb_jax.data.batching import to_model_batch
from sentemb_jax.data.pipeline import InputPipeline
from sentemb_jax.data.tasks import register_tasks, register_tfds_tasks
from sentemb_jax.errors import DataError


@pytest.fixture(scope="module")
def tasks(minilm_dir, data_dir):
    return register_tasks(tokenizer_dir=minilm_dir, data_dir=data_dir)


def _take(pipe, n):
    return list(itertools.islice(iter(pipe), n))


def _assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_same_seed_same_first_100_batches(tasks):
    make = lambda seed: InputPipeline(tasks["nli_triples"], batch_size=16, sequence_length=48, seed=seed)  # noqa: E731
    first = _take(make(7), 100)
    _assert_batches_equal(first, _take(make(7), 100))
    other = _take(make(8), 1)[0]
    assert not np.array_equal(other["row_id"], first[0]["row_id"])
    ids = np.concatenate([b["row_id"] for b in first])
    assert len(set(ids.tolist())) == 1600  # a permutation: no row twice within an epoch


def test_resume_equals_uninterrupted_across_epochs(tasks):
    """STS-B dev: 1500 rows / 64 = 23 batches an epoch; stop at 20, resume past the epoch boundary."""
    make = lambda: InputPipeline(tasks["sts_pairs"], batch_size=64, sequence_length=64, seed=3, split="validation")  # noqa: E731
    full = _take(make(), 40)
    pipe = make()
    head = _take(pipe, 20)
    state = pipe.state_dict()
    assert state["epoch"] == 0 and state["step_in_epoch"] == 20
    resumed = make()
    resumed.load_state_dict(state)
    tail = _take(resumed, 20)
    _assert_batches_equal(head + tail, full)
    assert resumed.state_dict()["epoch"] == 1
    # Epochs differ in order but cover the same rows.
    e0 = np.concatenate([b["row_id"] for b in full[:23]])
    e1 = np.concatenate([b["row_id"] for b in full[23:40]])
    assert len(set(e0.tolist())) == 23 * 64 and not np.array_equal(e0[: len(e1)], e1)


def test_state_from_other_settings_refused(tasks):
    pipe = InputPipeline(tasks["nli_triples"], batch_size=8, sequence_length=32, seed=1)
    state = pipe.state_dict()
    other = InputPipeline(tasks["nli_triples"], batch_size=8, sequence_length=32, seed=2)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_shards_are_disjoint_and_cover_the_epoch(tasks):
    def rows(index):
        pipe = InputPipeline(tasks["sts_pairs"], batch_size=50, sequence_length=32, seed=0, split="validation",
                             shard_info=seqio.ShardInfo(index, 2), num_epochs=1)
        return np.concatenate([b["row_id"] for b in pipe])

    a, b = rows(0), rows(1)
    assert len(a) == len(b) == 750 and not set(a.tolist()) & set(b.tolist())
    assert sorted(a.tolist() + b.tolist()) == list(range(1500))


def test_model_batch_features(tasks, minilm_dir):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    pipe = InputPipeline(tasks["sts_pairs"], batch_size=32, sequence_length=128, seed=0, split="validation", shuffle=False)
    batch = _take(pipe, 1)[0]
    assert set(batch) == {"sentence1_input_ids", "sentence1_attention_mask", "sentence2_input_ids",
                          "sentence2_attention_mask", "score", "row_id"}
    ids, mask = batch["sentence1_input_ids"], batch["sentence1_attention_mask"]
    assert ids.shape[1] in (8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64) and ids.dtype == np.int32
    assert mask.sum(1).max() <= ids.shape[1] < 1.3 * mask.sum(1).max() + 8
    from sentemb_jax.data.files import read_sts_pairs

    s1, _, gold = read_sts_pairs(os.path.join(os.path.dirname(os.path.dirname(pipe.provider.source.list_shards("validation")[0])), "stsb", "dev.tsv"))
    want = hf(s1[:32])["input_ids"]
    for i in range(32):
        assert ids[i, : mask[i].sum()].tolist() == want[i] and (ids[i, mask[i].sum():] == 0).all()
    np.testing.assert_allclose(batch["score"], gold[:32], rtol=1e-6)


def test_views_deterministic_and_augmented(minilm_dir, data_dir):
    def first_batch(views, seed=0):
        names = register_tasks(tokenizer_dir=minilm_dir, data_dir=data_dir, views=views, augment_rate=0.3, kinds=("sentences",))
        return _take(InputPipeline(names["sentences"], batch_size=32, sequence_length=64, seed=seed), 1)[0]

    plain = first_batch(("none", "none"))
    np.testing.assert_array_equal(plain["view1_input_ids"], plain["view2_input_ids"])  # SimCSE: dropout only
    deleted = first_batch(("word_deletion", "random_crop"))
    _assert_batches_equal([deleted], [first_batch(("word_deletion", "random_crop"))])
    np.testing.assert_array_equal(deleted["row_id"], plain["row_id"])
    shorter1 = deleted["view1_attention_mask"].sum(1) <= plain["view1_attention_mask"].sum(1)
    shorter2 = deleted["view2_attention_mask"].sum(1) <= plain["view1_attention_mask"].sum(1)
    assert shorter1.all() and shorter2.all()
    assert (deleted["view1_attention_mask"].sum(1) < plain["view1_attention_mask"].sum(1)).mean() > 0.5
    other_seed = first_batch(("word_deletion", "random_crop"), seed=1)
    assert not np.array_equal(other_seed["row_id"], deleted["row_id"])
    masked = first_batch(("none", "span_masking"))
    a, b, m = masked["view1_input_ids"], masked["view2_input_ids"], masked["view1_attention_mask"]
    np.testing.assert_array_equal(masked["view2_attention_mask"], m)
    for i in range(len(a)):
        n = m[i].sum()
        diff = np.nonzero(a[i, :n] != b[i, :n])[0]
        assert (b[i, diff] == 103).all()  # [MASK]
        assert a[i, 0] == b[i, 0] == 101 and a[i, n - 1] == b[i, n - 1] == 102  # specials untouched
        if len(diff):
            assert diff.max() - diff.min() + 1 == len(diff)  # one contiguous span
            assert len(diff) == int(np.ceil(0.3 * (n - 2)))


def test_precomputed_view_column(minilm_dir, tmp_path):
    (tmp_path / "s.tsv").write_text("sentence\tbt_de\nA man plays.\tA guy is playing.\nHello there\tHi there\n")
    names = register_tasks(tokenizer_dir=minilm_dir, data_dir=str(tmp_path), files={"sentences": "s.tsv"},
                           views=("none", "column:bt_de"), view_columns=("bt_de",), kinds=("sentences",))
    batch = _take(InputPipeline(names["sentences"], batch_size=2, sequence_length=32, shuffle=False, num_epochs=1), 1)[0]
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    for i, (text, bt) in enumerate([("A man plays.", "A guy is playing."), ("Hello there", "Hi there")]):
        assert batch["view1_input_ids"][i, : batch["view1_attention_mask"][i].sum()].tolist() == hf(text)["input_ids"]
        assert batch["view2_input_ids"][i, : batch["view2_attention_mask"][i].sum()].tolist() == hf(bt)["input_ids"]


def test_neighbour_view_is_the_next_row_of_the_same_file(minilm_dir, tmp_path):
    """view2 'neighbour' = the next accepted row of the same file (the previous one for a file's
    last row), in every shuffled epoch; never a row of the other file; view_texts gives the same."""
    from sentemb_jax.data.files import FileSpec, index_rows, neighbour_positions
    from sentemb_jax.data.tasks import view_texts

    a = ["Alpha one is here.", "!!!!", "Alpha two is here.", "Alpha three is here."]  # "!!!!" is cleaned out
    b = ["Beta one is here.", "Beta two is here."]
    (tmp_path / "a.tsv").write_text("sentence\n" + "\n".join(a) + "\n")
    (tmp_path / "b.tsv").write_text("sentence\n" + "\n".join(b) + "\n")
    names = register_tasks(tokenizer_dir=minilm_dir, data_dir=str(tmp_path), files={"sentences": ["a.tsv", "b.tsv"]},
                           views=("none", "neighbour"), clean=True, kinds=("sentences",))
    rows = [a[0], a[2], a[3], b[0], b[1]]
    expected = {rows[0]: rows[1], rows[1]: rows[2], rows[2]: rows[1], rows[3]: rows[4], rows[4]: rows[3]}
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    decode = lambda ids, m: hf.decode(ids[: m.sum()], skip_special_tokens=True)  # noqa: E731
    seen = {}
    for batch in InputPipeline(names["sentences"], batch_size=5, sequence_length=32, seed=1, num_epochs=2):
        for i in range(5):
            v1 = decode(batch["view1_input_ids"][i], batch["view1_attention_mask"][i])
            seen.setdefault(v1, set()).add(decode(batch["view2_input_ids"][i], batch["view2_attention_mask"][i]))
    assert seen == {hf.decode(hf(k)["input_ids"], skip_special_tokens=True): {hf.decode(hf(v)["input_ids"], skip_special_tokens=True)}
                    for k, v in expected.items()}
    assert view_texts(names["sentences"], 1) == [expected[r] for r in rows]
    single = index_rows(FileSpec(str(tmp_path / "b.tsv"), {"text": "sentence"}))
    assert neighbour_positions(single, [0, 1]).tolist() == [1, 0]
    with pytest.raises(IndexError):
        neighbour_positions(single, [2])


def test_missing_file_names_path_and_binding(minilm_dir, tmp_path):
    """A required task's missing file is named up front; an unrequired one when the task is read."""
    message = r"nli/triples\.tsv: no such file \(from DataConfig\.data_dir="
    with pytest.raises(DataError, match=message):
        register_tasks(tokenizer_dir=minilm_dir, data_dir=str(tmp_path), kinds=("nli_triples",), require=("nli_triples",))
    names = register_tasks(tokenizer_dir=minilm_dir, data_dir=str(tmp_path), kinds=("nli_triples",))
    with pytest.raises(DataError, match=message):
        next(iter(InputPipeline(names["nli_triples"], batch_size=2, sequence_length=16, seed=0)))


def _pair_keys(batch):
    """Each example's anchor and positive token ids (padding stripped): which task it came from."""
    return [tuple(a[m == 1]) + (-1,) + tuple(p[n == 1]) for a, m, p, n in zip(
        batch["anchor_input_ids"], batch["anchor_attention_mask"], batch["positive_input_ids"], batch["positive_attention_mask"])]


def test_mixture_draws_from_both_tasks_in_proportion_to_their_rows(tasks, data_dir):
    """qa_nli_pairs mixes commqa and nli_pairs at rates proportional to their train rows
    (data/tasks.py: _size_rate). Each of the 64 x 32 = 2048 examples drawn is traced to its task by
    its token ids (the two tasks' examples are disjoint: checked), and commqa's count is compared
    with the binomial Binomial(2048, p), p = commqa rows / all rows: seqio mixes by an independent
    weighted draw per example. Seed 0 gives 497 (the mean is 489.2, sd 19.3); the bound is 4 sd, so
    the check is deterministic for this seed and would hold for ~99.99% of seeds, while an equal
    mix (p = 0.5, 1024) or one task only is > 25 sd away."""
    mixture = seqio.get_mixture_or_task(tasks["qa_nli_pairs"])
    rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
    assert set(rates) == {tasks["commqa"], tasks["nli_pairs"]}
    # The rates are the rows each task keeps, counted here from the files themselves: commqa keeps
    # "Good" answers, nli_pairs entailment pairs (5,267 and 16,783 in the shared data).
    with open(os.path.join(data_dir, "qa", "cqa_qatarliving.jsonl"), encoding="utf-8") as f:
        good = sum(json.loads(line)["label"] == "Good" for line in f if line.strip())
    with open(os.path.join(data_dir, "nli", "pairs.tsv"), encoding="utf-8", newline="") as f:
        entail = sum(r["label"] == "entailment" for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rates == {tasks["commqa"]: float(good), tasks["nli_pairs"]: float(entail)}
    seen = {}
    for kind in ("commqa", "nli_pairs"):
        pipe = InputPipeline(tasks[kind], batch_size=1024, sequence_length=64, seed=0, shuffle=False, num_epochs=1,
                             drop_remainder=False)
        seen[kind] = {k for b in pipe for k in _pair_keys(b)}
    assert not seen["commqa"] & seen["nli_pairs"]

    pipe = InputPipeline(tasks["qa_nli_pairs"], batch_size=32, sequence_length=64, seed=0)
    batches = _take(pipe, 64)
    _assert_batches_equal(batches[:8], _take(InputPipeline(tasks["qa_nli_pairs"], batch_size=32, sequence_length=64, seed=0), 8))
    assert all(b["anchor_input_ids"].shape[0] == 32 for b in batches)
    keys = [k for b in batches for k in _pair_keys(b)]
    from_qa = sum(k in seen["commqa"] for k in keys)
    from_nli = sum(k in seen["nli_pairs"] for k in keys)
    assert from_qa + from_nli == len(keys) == 2048  # every example is from one of the two tasks
    p = rates[tasks["commqa"]] / sum(rates.values())
    mean, sd = len(keys) * p, np.sqrt(len(keys) * p * (1 - p))
    assert abs(from_qa - mean) <= 4 * sd, (from_qa, mean, sd)


def test_tfds_tasks_with_mock_data(minilm_dir):
    import tensorflow_datasets as tfds

    names = register_tfds_tasks(tokenizer_dir=minilm_dir, kinds=("tfds_snli", "tfds_stsb"))
    with tfds.testing.mock_data(num_examples=40):
        pairs = _take(InputPipeline(names["tfds_snli"], batch_size=4, sequence_length=32, seed=0, drop_remainder=False, num_epochs=1), 50)
        sts = _take(InputPipeline(names["tfds_stsb"], batch_size=4, sequence_length=32, seed=0, num_epochs=1), 3)
    assert pairs and set(pairs[0]) >= {"anchor_input_ids", "positive_input_ids"}
    assert sum(len(b["anchor_input_ids"]) for b in pairs) < 40  # only entailment (label 0) pairs kept
    assert set(sts[0]) >= {"sentence1_input_ids", "sentence2_input_ids", "score"} and sts[0]["score"].dtype == np.float32
    assert (sts[0]["sentence1_input_ids"][:, 0] == 101).all()


def test_to_model_batch_pads_with_model_pad_id():
    batch = {"a": np.array([[5, 6, 7], [8, 0, 0]], np.int32), "a_length": np.array([3, 1]), "text": np.array([b"x", b"y"])}
    out = to_model_batch(batch, ("a",), pad_id=1, buckets=(4, 8))
    np.testing.assert_array_equal(out["a_input_ids"], [[5, 6, 7, 1], [8, 1, 1, 1]])
    np.testing.assert_array_equal(out["a_attention_mask"], [[1, 1, 1, 0], [1, 0, 0, 0]])
    assert "text" not in out


def test_data_job_reports_missing_file_with_binding(tmp_path):
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/data_summary.gin"),
                           f"--gin.DATA_DIR='{tmp_path}'"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert (f"error: {tmp_path}/qa/cqa_qatarliving.jsonl: no such file (from DataConfig.data_dir='{tmp_path}' + "
            "files['commqa']='qa/cqa_qatarliving.jsonl')") in proc.stderr


def test_same_length_pads_every_feature_to_one_bucket():
    batch = {"a": np.array([[5, 6, 7]], np.int32), "a_length": np.array([3]), "b": np.array([[9]], np.int32), "b_length": np.array([1])}
    out = to_model_batch(batch, ("a", "b"), pad_id=0, buckets=(2, 4, 8), same_length=True)
    assert out["a_input_ids"].shape == out["b_input_ids"].shape == (1, 4)
    np.testing.assert_array_equal(out["b_attention_mask"], [[1, 0, 0, 0]])


def test_fixed_view_same_every_epoch_and_precomputable(minilm_dir, tmp_path):
    """A `fixed:` view is drawn once per sentence: equal in every epoch and seed, and equal to
    view_texts (what a teacher embeds once), tokenised."""
    from sentemb_jax.data.tasks import view_texts

    sentences = [f"word{i} alpha beta gamma delta epsilon zeta eta theta iota kappa" for i in range(12)]
    (tmp_path / "s.tsv").write_text("sentence\n" + "\n".join(sentences) + "\n")
    names = register_tasks(tokenizer_dir=minilm_dir, data_dir=str(tmp_path), files={"sentences": "s.tsv"},
                           views=("none", "fixed:word_deletion"), augment_rate=0.3, kinds=("sentences",))

    def view2_by_row(seed, epochs):
        pipe = InputPipeline(names["sentences"], batch_size=4, sequence_length=32, seed=seed, num_epochs=epochs)
        out = {}
        for b in pipe:
            for r, ids, m in zip(b["row_id"], b["view2_input_ids"], b["view2_attention_mask"]):
                out.setdefault(int(r), set()).add(tuple(ids[: m.sum()].tolist()))
        return out

    seen = view2_by_row(0, 3)
    assert sorted(seen) == list(range(12)) and all(len(v) == 1 for v in seen.values())  # one text per row, 3 epochs
    assert view2_by_row(5, 1) == seen  # and per seed
    texts = view_texts(names["sentences"], 1)
    assert view_texts(names["sentences"], 0) == sentences
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    assert {r: {tuple(hf(t)["input_ids"])} for r, t in enumerate(texts)} == seen
    kept = [len(t.split()) for t in texts]
    assert all(1 <= k <= 11 for k in kept) and sum(kept) < 12 * 11  # words were deleted
    with pytest.raises(ValueError, match="fixed:<one of"):
        register_tasks(tokenizer_dir=minilm_dir, data_dir=str(tmp_path), files={"sentences": "s.tsv"},
                       views=("none", "fixed:span_masking"), kinds=("sentences",))


def test_state_moves_between_process_counts_with_one_global_batch(tasks):
    """2 shards x batch 25 -> 1 shard x batch 50: batch k covers the same rows of the global order,
    and every shard stops an epoch after the global number of full batches (1500 // 50 = 30)."""
    def pipe(index, shards, batch):
        return InputPipeline(tasks["sts_pairs"], batch_size=batch, sequence_length=32, seed=4, split="validation",
                             shard_info=seqio.ShardInfo(index, shards) if shards > 1 else None)

    parts = [pipe(i, 2, 25) for i in range(2)]
    for p in parts:
        _take(p, 7)
    one = pipe(0, 1, 50)
    one.load_state_dict(parts[0].state_dict())
    resumed = _take(one, 3)
    rest = [_take(p, 3) for p in parts]
    for k in range(3):
        assert sorted(resumed[k]["row_id"].tolist()) == sorted(rest[0][k]["row_id"].tolist() + rest[1][k]["row_id"].tolist())
    with pytest.raises(ValueError, match="global batch 50.*global batch 40"):
        pipe(0, 1, 40).load_state_dict(parts[0].state_dict())
    counts = [sum(1 for _ in InputPipeline(tasks["sts_pairs"], batch_size=5, sequence_length=32, seed=0, split="validation",
                                           shard_info=seqio.ShardInfo(i, 7), num_epochs=1)) for i in range(7)]
    assert counts == [1500 // 35] * 7  # shards of 215 rows would give 43 batches, of 214 rows 42: all stop at 42


def test_too_few_rows_for_one_batch_is_an_error_not_a_hang(minilm_dir, tmp_path):
    """5 rows, batch 8, incomplete batches dropped: every epoch would be empty (it looped forever)."""
    from sentemb_jax.errors import DataError

    (tmp_path / "nli").mkdir()
    rows = ["anchor\tpositive\tnegative"] + [f"a{i} x\tp{i} y\tn{i} z" for i in range(5)]
    (tmp_path / "nli" / "triples.tsv").write_text("\n".join(rows) + "\n")
    names = register_tasks(tokenizer_dir=minilm_dir, data_dir=str(tmp_path), kinds=("nli_triples",))
    pipe = InputPipeline(names["nli_triples"], batch_size=8, sequence_length=16, seed=0)
    with pytest.raises(DataError, match=r"nli/triples\.tsv: 5 usable rows cannot fill one batch of batch_size=8 "
                                         r"\('train' split of 'sentemb_nli_triples'"):
        next(iter(pipe))
    assert len(_take(InputPipeline(names["nli_triples"], batch_size=5, sequence_length=16, seed=0), 3)) == 3  # 5 fill one

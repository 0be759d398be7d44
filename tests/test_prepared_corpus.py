"""Input at pod scale: globs, gzip and remote paths; the preparation command; the prepared
corpus's order, host coverage, exact resume, and damaged shards."""
import gzip
import itertools
import json
import os
import shutil

import numpy as np
import pytest
import seqio

from sentemb_jax.data import prepare as prep
from sentemb_jax.data import storage
from sentemb_jax.data.kinds import file_spec
from sentemb_jax.data.pipeline import InputPipeline
from sentemb_jax.data.prepared import PreparedSource
from sentemb_jax.data.prepared_corpus import PreparedCorpus
from sentemb_jax.data.tasks import RowFileSource, cut_ids, register_tasks
from sentemb_jax.errors import ConfigError, DataError

ROWS_PER_FILE = 60


def _row(i: int, r: int) -> dict:
    """Row r of input file i: every 7th is labelled Bad (filtered out), row 5 of file 1 has an empty answer."""
    answer = "" if (i, r) == (1, 5) else f"answer {i}-{r} " + "x" * (r % 11)
    return {"question_title": f"question {i}-{r}", "question_body": f"body {r % 5}", "answer": answer,
            "label": "Bad" if r % 7 == 0 else "Good"}


def _write_inputs(directory: str, files: int = 3, opener=gzip.open) -> list[str]:
    storage.makedirs(directory)
    paths = []
    for i in range(files):
        path = storage.join(directory, f"cqa-{i:05d}-of-{files:05d}.jsonl.gz")
        data = gzip.compress("".join(json.dumps(_row(i, r)) + "\n" for r in range(ROWS_PER_FILE)).encode(), mtime=0)
        storage.write_bytes(path, data)
        paths.append(path)
    return paths


def _expected() -> set[tuple[str, str]]:
    """(anchor, positive) of every row the rules keep, computed from the row generator."""
    rows = [_row(i, r) for i in range(3) for r in range(ROWS_PER_FILE)]
    return {(f"{x['question_title']} {x['question_body']}", x["answer"]) for x in rows if x["label"] == "Good" and x["answer"]}


def _examples(source, split="train", shuffle=False, seed=0, shard_info=None) -> list[tuple[str, str, int]]:
    ds = source.get_dataset(split, shuffle=shuffle, seed=seed, shard_info=shard_info)
    return [(e["anchor"].decode(), e["positive"].decode(), int(e["row_id"])) for e in ds.as_numpy_iterator()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("cqa")
    inputs = _write_inputs(str(root / "raw"))
    manifest = prep.prepare(file_spec("commqa", ""), [str(root / "raw" / "cqa-*.jsonl.gz")], str(root / "prepared"),
                            num_shards=6, kind="commqa", prefix="cqa", progress=False)
    return {"root": str(root), "inputs": inputs, "out": str(root / "prepared"), "manifest": manifest}


def test_glob_gzip_round_trip_through_the_preparation_command(corpus):
    m = corpus["manifest"]
    expected = _expected()
    assert m["rows"] == len(expected) == 3 * ROWS_PER_FILE - 3 * 9 - 1  # 9 Bad labels per file, one empty answer
    assert (m["skipped_filtered"], m["skipped_empty_text"], m["skipped_malformed"]) == (27, 1, 0)
    assert [s["file"] for s in m["shards"]] == [f"cqa-{j:05d}-of-00006.array_record" for j in range(6)]
    # 6 shards over 3 inputs: each input split in two by row parity (rows r % 2 == j // 3).
    assert [s["sources"] for s in m["shards"]] == [[corpus["inputs"][j % 3]] for j in range(6)]
    got = _examples(PreparedSource({"train": corpus["out"]}))
    assert {(a, p) for a, p, _ in got} == expected and len(got) == len(expected)
    assert sorted(r for _, _, r in got) == list(range(len(expected)))
    # The validated-file path reads the same glob (gzip, sorted files) to the same examples.
    validated = RowFileSource({"train": tuple(file_spec("commqa", p) for p in corpus["inputs"])})
    assert {(a, p) for a, p, _ in _examples(validated)} == expected
    assert prep.verify(corpus["out"]) == []


def test_a_remote_style_path_reads_what_the_local_path_reads(corpus, minilm_dir):
    """ram:// (TensorFlow's in-process filesystem) stands in for gs://: the raw glob trains the same
    batches as the local files, and preparing from and to ram:// writes byte-identical shards."""
    remote = "ram://cqa_test/raw"
    remote_inputs = _write_inputs(remote)
    assert [storage.read_bytes(p) for p in remote_inputs] == [storage.read_bytes(p) for p in corpus["inputs"]]
    batches = {}
    for where, pattern in (("local", os.path.join(corpus["root"], "raw", "cqa-*.jsonl.gz")), ("ram", remote + "/cqa-*.jsonl.gz")):
        names = register_tasks(tokenizer_dir=minilm_dir, data_dir=corpus["root"], files={"commqa": pattern}, kinds=("commqa",))
        pipe = InputPipeline(names["commqa"], batch_size=16, sequence_length=32, seed=4)
        batches[where] = list(itertools.islice(iter(pipe), 6))
    for a, b in zip(batches["local"], batches["ram"]):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    m = prep.prepare(file_spec("commqa", ""), [remote + "/cqa-*.jsonl.gz"], "ram://cqa_test/prepared", num_shards=6,
                     kind="commqa", prefix="cqa", progress=False)
    assert [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in corpus["manifest"]["shards"]]
    # ArrayRecord shards are read from a local or mounted path; a remote one is refused, saying so.
    with pytest.raises(DataError, match="gcsfuse"):
        PreparedCorpus("ram://cqa_test/prepared")


def test_hosts_read_disjoint_parts_that_cover_the_corpus(corpus):
    source = PreparedSource({"train": corpus["out"]}, window_shards=2)
    whole = [r for *_, r in _examples(source, shuffle=True, seed=11)]
    assert sorted(whole) == list(range(corpus["manifest"]["rows"]))  # a permutation
    parts = [[r for *_, r in _examples(source, shuffle=True, seed=11, shard_info=seqio.ShardInfo(h, 8))] for h in range(8)]
    assert sorted(itertools.chain(*parts)) == sorted(whole)  # disjoint and complete
    for h in range(8):  # host h reads positions h, h + 8, ... of the one global order
        assert parts[h] == whole[h::8]
    assert whole != [r for *_, r in _examples(source, shuffle=True, seed=12)]
    # windows of 2 shards: the first window's rows come first (shuffled within it), then the next
    plan = source.corpus("train").plan(11)
    first_window = set(plan.window_shards[0])
    starts = source.corpus("train").starts
    shard_of = lambda r: int(np.searchsorted(starts, r, side="right")) - 1  # noqa: E731
    assert {shard_of(r) for r in whole[: plan.window_starts[1]]} == first_window


def test_resume_after_n_batches_equals_the_uninterrupted_order(corpus, minilm_dir):
    """Across an epoch boundary, and onto another number of hosts with the same global batch."""
    names = register_tasks(tokenizer_dir=minilm_dir, data_dir=corpus["root"], files={"commqa": corpus["out"]}, kinds=("commqa",))
    make = lambda shard=None, bs=8: InputPipeline(names["commqa"], batch_size=bs, sequence_length=32, seed=5,  # noqa: E731
                                                  shard_info=shard)
    full = list(itertools.islice(iter(make()), 30))  # 152 rows / 8 = 19 batches an epoch
    pipe = make()
    head = list(itertools.islice(iter(pipe), 23))
    state = pipe.state_dict()
    assert (state["epoch"], state["step_in_epoch"]) == (1, 4)
    resumed = make()
    resumed.load_state_dict(state)
    tail = list(itertools.islice(iter(resumed), 7))
    for a, b in zip(head + tail, full):
        np.testing.assert_array_equal(a["row_id"], b["row_id"])
        np.testing.assert_array_equal(a["anchor_input_ids"], b["anchor_input_ids"])
    # Saved by 2 hosts of batch 4, resumed by 1 host of batch 8: the same global batches follow.
    hosts = [make(seqio.ShardInfo(h, 2), 4) for h in range(2)]
    for p in hosts:
        list(itertools.islice(iter(p), 3))
    one = make()
    one.load_state_dict(hosts[0].state_dict())
    nxt = next(iter(one))["row_id"]
    global_order = np.concatenate([b["row_id"] for b in full])
    assert sorted(nxt.tolist()) == sorted(global_order[24:32].tolist())


def test_a_damaged_or_truncated_shard_is_named_or_skipped_and_counted(corpus, tmp_path, minilm_dir):
    out = str(tmp_path / "prepared")
    shutil.copytree(corpus["out"], out)
    shards = corpus["manifest"]["shards"]
    victim = os.path.join(out, shards[2]["file"])
    with open(victim, "r+b") as f:
        f.truncate(shards[2]["bytes"] - 10)
    with pytest.raises(DataError, match=r"cqa-00002-of-00006\.array_record: shard .*truncated"):
        PreparedCorpus(out)
    skipping = PreparedCorpus(out, on_bad_shard="skip")
    assert len(skipping) == corpus["manifest"]["rows"] - shards[2]["rows"] and len(skipping.skipped) == 1
    source = PreparedSource({"train": out}, on_bad_shard="skip")
    assert len(_examples(source, shuffle=True)) == len(skipping)
    # Same size, damaged inside: the read fails naming the shard; verify() names it too.
    shutil.copy(os.path.join(corpus["out"], shards[2]["file"]), victim)
    with open(victim, "r+b") as f:
        f.seek(300)  # inside the first chunk's data (a shard's records sit in its first few KiB here)
        f.write(b"\xff" * 16)
    register_tasks(tokenizer_dir=minilm_dir, data_dir=corpus["root"], files={"commqa": out}, kinds=("commqa",))
    with pytest.raises(DataError, match=r"cqa-00002-of-00006\.array_record: damaged shard \(Corrupted Riegeli"):
        list(InputPipeline("sentemb_commqa", batch_size=8, sequence_length=16, seed=0, num_epochs=1))
    assert [b.split(":")[0] for b in prep.verify(out)] == [victim]


def test_an_interrupted_preparation_resumes_and_workers_share_it(corpus, tmp_path):
    pattern = os.path.join(corpus["root"], "raw", "cqa-*.jsonl.gz")
    out = str(tmp_path / "out")
    part = prep.prepare(file_spec("commqa", ""), [pattern], out, 6, worker=(0, 2), kind="commqa", prefix="cqa", progress=False)
    assert part == {"complete": False, "shards_done": 3, "shards": 6, "missing": [f"cqa-{j:05d}-of-00006.array_record" for j in (1, 3, 5)]}
    os.remove(os.path.join(out, "cqa-00002-of-00006.array_record.json"))  # as if killed before its entry was written
    before = os.path.getmtime(os.path.join(out, "cqa-00000-of-00006.array_record"))
    m = prep.prepare(file_spec("commqa", ""), [pattern], out, 6, processes=2, kind="commqa", prefix="cqa", progress=False)
    assert os.path.getmtime(os.path.join(out, "cqa-00000-of-00006.array_record")) == before  # not rewritten
    assert [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in corpus["manifest"]["shards"]]


_KILL_SHARD_2 = """
import os, resource, signal
import sentemb_jax.data.prepare as prepare

_write_shard = prepare.write_shard


def write_shard(spec, task, *args):
    if task.index == 2:  # the out-of-memory killer, placed deterministically
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), signal.SIGKILL)
    return _write_shard(spec, task, *args)


prepare.write_shard = write_shard
"""


def test_a_killed_worker_process_is_named_not_waited_for_and_the_rerun_completes(corpus, tmp_path, monkeypatch):
    """processes=2: a worker killed while it writes shard 2 (a sitecustomize on the workers'
    PYTHONPATH kills it) ends the preparation with an error naming the unfinished shards, where
    multiprocessing.Pool waited forever; the shards finished are kept and the same call, without
    the fault, completes the corpus byte for byte. (The alarm only turns a regression into a failure.)"""
    import signal

    from sentemb_jax.errors import SentembError

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_KILL_SHARD_2)
    pattern = os.path.join(corpus["root"], "raw", "cqa-*.jsonl.gz")
    out = str(tmp_path / "out")

    def waited_forever(*_):
        raise AssertionError("prepare still waits for a worker that was killed 600 s ago")

    old = signal.signal(signal.SIGALRM, waited_forever)
    signal.alarm(600)
    try:
        with monkeypatch.context() as m:
            m.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])))
            with pytest.raises(SentembError, match=r"a preparation worker process died .* may not have finished "
                                                   r"\(.*cqa-00002-of-00006\.array_record.*\); \d finished shard"):
                prep.prepare(file_spec("commqa", ""), [pattern], out, 6, processes=2, kind="commqa", prefix="cqa",
                             progress=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    assert not os.path.exists(os.path.join(out, "cqa-00002-of-00006.array_record.json"))
    m = prep.prepare(file_spec("commqa", ""), [pattern], out, 6, processes=2, kind="commqa", prefix="cqa", progress=False)
    assert [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in corpus["manifest"]["shards"]]


def test_bad_input_is_named_before_any_work(corpus, tmp_path, minilm_dir):
    spec = file_spec("commqa", "")
    with pytest.raises(DataError, match="no file matches"):
        prep.prepare(spec, [str(tmp_path / "none-*.jsonl")], str(tmp_path / "o"), progress=False)
    with pytest.raises(ValueError, match="not a multiple"):
        prep.prepare(spec, corpus["inputs"], str(tmp_path / "o"), 4, progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row(0, 1)) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON"):
        prep.prepare(spec, [str(bad)], str(tmp_path / "o2"), progress=False)
    m = prep.prepare(spec, [str(bad)], str(tmp_path / "o3"), on_bad_row="skip", progress=False)
    assert (m["rows"], m["skipped_malformed"]) == (1, 1)
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b"".join(json.dumps(_row(0, r)).encode() + b"\n" for r in range(1, 50)))[:-30])
    with pytest.raises(DataError, match=r"broken\.jsonl\.gz: damaged gzip"):
        prep.prepare(spec, [str(broken)], str(tmp_path / "o4"), progress=False)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text('{"format": "array_record", "version": 1, "features": {}, "shards": []}')
    with pytest.raises(DataError, match="features"):
        PreparedCorpus(str(tmp_path / "m"))
    with pytest.raises(DataError, match="no prepared corpus"):
        PreparedCorpus(str(tmp_path))
    with pytest.raises(ConfigError, match="prepared corpus"):
        register_tasks(tokenizer_dir=minilm_dir, data_dir=corpus["root"], files={"commqa": [corpus["out"], corpus["inputs"][0]]},
                       kinds=("commqa",))


def test_a_corpus_tokenized_ahead_trains_the_same_batches_as_its_text(corpus, minilm_dir, tmp_path):
    """prepare(tokenizer_dir=) stores the ids the training pipeline's own tokenizer makes: the same
    batches, id for id, as the text corpus; cut again to a shorter length the same way; refused by
    a model whose tokenizer differs."""
    pattern = os.path.join(corpus["root"], "raw", "cqa-*.jsonl.gz")
    ids_dir = str(tmp_path / "ids")
    m = prep.prepare(file_spec("commqa", ""), [pattern], ids_dir, 6, kind="commqa", prefix="cqa", progress=False,
                     tokenizer_dir=minilm_dir, max_length=64)
    assert m["features"] == {"anchor": "ids", "positive": "ids"} and m["tokenizer"]["max_length"] == 64
    for length in (64, 6):
        got = {}
        for label, path in (("text", corpus["out"]), ("ids", ids_dir)):
            names = register_tasks(tokenizer_dir=minilm_dir, data_dir=corpus["root"], files={"commqa": path}, kinds=("commqa",))
            got[label] = list(itertools.islice(iter(InputPipeline(names["commqa"], batch_size=16, sequence_length=length, seed=2)), 12))
        for a, b in zip(got["text"], got["ids"]):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{k} at length {length}")
    assert got["ids"][0]["anchor_attention_mask"].sum(1).max() == 6  # the anchors (8 tokens) were cut at length 6
    other = tmp_path / "other_tokenizer"
    shutil.copytree(minilm_dir, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**cfg, "do_lower_case": not cfg.get("do_lower_case", True)}))
    with pytest.raises(DataError, match="was tokenized with the tokenizer of"):
        register_tasks(tokenizer_dir=str(other), data_dir=corpus["root"], files={"commqa": ids_dir}, kinds=("commqa",))


@pytest.mark.parametrize("max_len,suffix", [(6, (102,)), (6, (1, 2)), (6, ()), (1, (102,))])
def test_cut_ids_cuts_every_row_as_the_per_row_rule(max_len, suffix):
    """The batched cut (the fast route for ids tokenized ahead, and truncate_ids) equals the rule
    written per row: a row longer than max_len keeps max_len - len(suffix) ids, then the suffix."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    rows = [[int(v) for v in rng.integers(3, 100, size=n)] for n in (0, 1, 3, 5, 6, 7, 8, 20)]
    want = [r[: max_len - len(suffix)] + list(suffix) if len(r) > max_len else r for r in rows]
    for splits in (tf.int32, tf.int64):
        got = cut_ids(tf.ragged.constant(rows, dtype=tf.int32, row_splits_dtype=splits), max_len, suffix).to_list()
        assert got == want


def test_without_array_record_a_prepared_corpus_is_named_at_open_and_text_files_need_none(corpus, monkeypatch):
    """A GPU host's own Python may lack ArrayRecord: opening a prepared corpus then stops in one
    line naming the corpus and the install, before any row is read; importing the readers and the
    training setup needs no ArrayRecord at all (the import is where a corpus is opened)."""
    import subprocess
    import sys

    from sentemb_jax.dependencies import MissingDependency

    monkeypatch.setitem(sys.modules, "array_record", None)
    monkeypatch.setitem(sys.modules, "array_record.python.array_record_module", None)
    with pytest.raises(MissingDependency, match=r"the prepared corpus .*manifest\.json needs "
                                                r"array_record\.python\.array_record_module.*pip install array-record"):
        PreparedCorpus(corpus["out"])
    code = ("import sys; sys.modules['array_record'] = None\n"
            "import sentemb_jax.training.setup, sentemb_jax.data.reader, sentemb_jax.data.prepare, sentemb_jax.jobs\n"
            "assert not any(m.startswith('array_record') and sys.modules[m] for m in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]

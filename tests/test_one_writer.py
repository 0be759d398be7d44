"""One writer per directory (sentemb_jax.locking): a MODEL_DIR, a prepare_corpus output and an
export directory are locked while written; a second writer is refused naming the holder; a lock
left by a dead process on this host is taken over with a warning; no lock is left after a run."""
import json
import logging
import os
import socket
import subprocess

import pytest
from run_utils import gin_file_args

import gin
from sentemb_jax.errors import DataError
from sentemb_jax.locking import LOCK_FILE, DirectoryLock, LockError

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.fixture
def sleeper():
    """A live process of this host (its PID holds the test's locks); ended by PID after the test."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _hold(directory, pid, name=LOCK_FILE):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump({"host": socket.gethostname(), "pid": pid, "token": "someone else", "job": "another job"}, f)
    return path


def test_lock_is_exclusive_reentrant_and_removed(tmp_path, sleeper):
    d = tmp_path / "d"
    with DirectoryLock(str(d), "MODEL_DIR"):
        holder = json.loads((d / LOCK_FILE).read_text())
        assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
        with DirectoryLock(str(d), "MODEL_DIR"):  # the same process again (a job that calls fit inside its lock)
            pass
        assert (d / LOCK_FILE).exists()
    assert not (d / LOCK_FILE).exists()
    with pytest.raises(RuntimeError), DirectoryLock(str(d), "MODEL_DIR"):
        raise RuntimeError("the job failed")
    assert not (d / LOCK_FILE).exists()  # however the job ends
    path = _hold(str(d), sleeper.pid)
    with pytest.raises(LockError) as e:
        DirectoryLock(str(d), "MODEL_DIR").acquire()
    assert str(e.value) == (f"MODEL_DIR {d} is being written by another job (host {socket.gethostname()!r}, PID {sleeper.pid}, "
                            f"another job); lock file {path}. Wait for it to end, use another directory, or delete the "
                            "lock file if that job is gone")
    assert json.loads(open(path).read())["pid"] == sleeper.pid  # the holder's lock untouched
    other_host = _hold(str(tmp_path / "e"), 1)
    json.dump({"host": "elsewhere", "pid": 1}, open(other_host, "w"))
    with pytest.raises(LockError, match="host 'elsewhere', PID 1"):  # another host's PID cannot be judged
        DirectoryLock(str(tmp_path / "e"), "MODEL_DIR").acquire()


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog):
    d = tmp_path / "d"
    dead = _dead_pid()
    path = _hold(str(d), dead)
    with caplog.at_level(logging.WARNING, logger="sentemb_jax"), DirectoryLock(str(d), "MODEL_DIR"):
        assert json.loads(open(path).read())["pid"] == os.getpid()
    assert f"taking over the stale lock {path} of {d}: host {socket.gethostname()}, PID {dead} is no longer running" in caplog.text
    assert not os.path.exists(path)


def test_remote_paths_are_not_locked(caplog):
    with caplog.at_level(logging.INFO, logger="sentemb_jax"), DirectoryLock("gs://bucket/run", "MODEL_DIR") as lock:
        assert lock.path is None
    assert "is remote: not locked" in caplog.text


# ------------------------------------------------------------------------------------------------
# The train job


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir):
    from hf_models import make_minilm_shaped_bert

    path = tmp_path_factory.mktemp("tiny_minilm")
    make_minilm_shaped_bert(path, minilm_dir, layers=1, hidden=32)
    return str(path)


def _train(model, run, data_dir, steps, capsys):
    from sentemb_jax import main as runner

    gin.clear_config()
    capsys.readouterr()
    rc = runner.main([*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{run}'", f"--gin.MODEL_PATH='{model}'",
                      f"--gin.DATA_DIR='{data_dir}'", f"--gin.sentemb_jax.RunConfig.num_steps={steps}",
                      "--gin.sentemb_jax.DataConfig.batch_size=4", "--gin.sentemb_jax.DataConfig.sequence_length=16",
                      "--gin.sentemb_jax.EvalConfig.every=None", "--gin.sentemb_jax.ScheduleConfig.total_steps=4",
                      "--gin.sentemb_jax.ScheduleConfig.warmup_steps=0", "--gin.sentemb_jax.CheckpointConfig.every=1"])
    gin.clear_config()
    return rc, capsys.readouterr().err


def _tree(run):
    out = {}
    for dirpath, _, files in os.walk(run):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), run)
            if rel != "run.log":
                out[rel] = open(os.path.join(dirpath, f), "rb").read()
    return out


def test_a_second_train_job_on_a_model_dir_is_refused_and_a_dead_ones_lock_taken_over(tiny, tmp_path, data_dir,
                                                                                       capsys, sleeper):
    run = tmp_path / "run"
    rc, err = _train(tiny, run, data_dir, 1, capsys)
    assert rc == 0, err
    assert not (run / LOCK_FILE).exists()  # a finished run leaves no lock
    path = _hold(str(run), sleeper.pid)  # a job running on it (before: both exited 0, checkpoints interleaved)
    before = _tree(run)
    rc, err = _train(tiny, run, data_dir, 2, capsys)
    last = err.strip().splitlines()[-1]
    assert rc == 1 and last.startswith(f"error: MODEL_DIR {run} is being written by another job (host "
                                       f"{socket.gethostname()!r}, PID {sleeper.pid}"), last
    assert f"lock file {path}" in last
    assert _tree(run) == before  # nothing else changed
    sleeper.kill()
    sleeper.wait()  # that job is gone: its lock is stale
    rc, err = _train(tiny, run, data_dir, 2, capsys)
    assert rc == 0 and f"warning: taking over the stale lock {path}" in err, err
    assert f"resumed from {run} at step 1" in err and not (run / LOCK_FILE).exists()


# ------------------------------------------------------------------------------------------------
# prepare_corpus and exports


@pytest.fixture
def raw(tmp_path):
    from test_prepared_corpus import _write_inputs

    _write_inputs(str(tmp_path / "raw"), files=2)
    return str(tmp_path / "raw" / "cqa-*.jsonl.gz")


def test_prepare_corpus_is_locked_and_refuses_other_settings(raw, tmp_path, sleeper, minilm_dir):
    from sentemb_jax.data import prepare as prep
    from sentemb_jax.data.kinds import file_spec

    out = str(tmp_path / "out")
    kw = dict(kind="commqa", prefix="cqa", progress=False)
    m = prep.prepare(file_spec("commqa", ""), [raw], out, **kw)
    assert m["settings"]["kind"] == "commqa" and m["settings"]["tokenizer"] is None and len(m["inputs"]) == 2
    assert not os.path.exists(os.path.join(out, LOCK_FILE))
    manifest = open(os.path.join(out, "manifest.json"), "rb").read()
    # Rerun with a tokenizer over the text corpus: before, every shard skipped and a manifest of "ids".
    with pytest.raises(DataError) as e:
        prep.prepare(file_spec("commqa", ""), [raw], out, tokenizer_dir=minilm_dir, **kw)
    assert str(e.value).startswith(f"prepare_corpus output {out} holds a corpus made otherwise: its manifest.json: ")
    assert "max_length: None -> 128" in str(e.value) and "tokenizer: None -> '" in str(e.value)
    with pytest.raises(DataError, match=r"dedup: False -> True"):
        prep.prepare(file_spec("commqa", ""), [raw], out, dedup=True, **kw)
    # Another kind into the directory: before, its manifest replaced the commqa one.
    with pytest.raises(DataError, match=r"kind: 'commqa' -> 'nli_pairs'.*lists other shards"):
        prep.prepare(file_spec("commqa", ""), [raw], out, kind="nli_pairs", prefix="nli_pairs", progress=False)
    assert open(os.path.join(out, "manifest.json"), "rb").read() == manifest
    # An input changed since: refused too.
    first = sorted(m["inputs"])[0]
    os.utime(first, ns=(0, 0))
    with pytest.raises(DataError, match=rf"input {first}: changed since"):
        prep.prepare(file_spec("commqa", ""), [raw], out, **kw)
    # A second writer of the directory.
    other = str(tmp_path / "other")
    path = _hold(other, sleeper.pid)
    with pytest.raises(LockError, match=rf"prepare_corpus output {other} is being written by another job .*PID {sleeper.pid}"):
        prep.prepare(file_spec("commqa", ""), [raw], other, **kw)
    assert sorted(os.listdir(other)) == [LOCK_FILE] and os.path.exists(path)


def test_save_pretrained_into_a_locked_directory_is_refused(tiny, tmp_path, sleeper):
    from sentemb_jax.encoder import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(tiny)
    out = tmp_path / "export"
    _hold(str(out), sleeper.pid)
    with pytest.raises(LockError, match=rf"export directory {out} is being written by another job"):
        encoder.save_pretrained(str(out))
    assert os.listdir(out) == [LOCK_FILE]
    encoder.save_pretrained(str(tmp_path / "free"))
    assert not (tmp_path / "free" / LOCK_FILE).exists() and (tmp_path / "free" / "modules.json").exists()

"""SIGTERM outside the train loop ends everything the job started, keeps what was finished, leaves no
temporary file and prints one line: what was kept and how to continue (exit 143). The signal is
placed deterministically (sentemb_jax.faults, SENTEMB_FAULT=sigterm_in:<phase>): in prepare_corpus's
parent once its first shard is finished while two worker processes write the others; before the
first evaluation; before the teacher embeds the texts; before the trained tower is exported. Inside
the train loop SIGTERM checkpoints first: tests/test_robustness.py."""
import glob
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from hf_models import make_minilm_shaped_bert
from run_utils import REPO, gin_file_args

import gin
from sentemb_jax import main as runner

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

CONTINUE = "; run the same command to continue"


def _main(args, monkeypatch, capsys, fault=None) -> tuple[int, str]:
    """The job in this process (main's handlers turn the signal into Interrupted), its stderr."""
    assert threading.current_thread() is threading.main_thread()  # else the SIGTERM would end pytest itself
    if fault:
        monkeypatch.setenv("SENTEMB_FAULT", f"sigterm_in:{fault}")
    else:
        monkeypatch.delenv("SENTEMB_FAULT", raising=False)
    gin.clear_config()
    capsys.readouterr()
    try:
        rc = runner.main(args)
    finally:
        gin.clear_config()
    return rc, capsys.readouterr().err


def _last(err: str) -> str:
    return err.strip().splitlines()[-1]


def _processes_with(mark: str) -> list[int]:
    """PIDs whose environment holds `mark` (a job and every process it started inherit it)."""
    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(environ, "rb") as f:
                if mark.encode() in f.read():
                    found.append(int(environ.split("/")[2]))
        except OSError:
            continue
    return found


def test_sigterm_while_workers_prepare_stops_them_keeps_finished_shards_and_the_rerun_completes(data_dir, tmp_path):
    source = tmp_path / "triples.tsv"
    with open(os.path.join(data_dir, "nli", "triples.tsv"), encoding="utf-8") as f:
        source.write_text("".join(next(f) for _ in range(3001)), encoding="utf-8")
    out, mark = tmp_path / "corpus", f"SENTEMB_TEST_MARK={uuid.uuid4().hex}"
    args = [sys.executable, "-m", "sentemb_jax.main", "--gin_file=gin/runs/prepare_corpus.gin",
            f"--gin.INPUT='{source}'", f"--gin.OUTPUT='{out}'", "--gin.NUM_SHARDS=8",
            "--gin.sentemb_jax.prepare_corpus.kind='nli_triples'", "--gin.sentemb_jax.prepare_corpus.processes=2"]
    env = dict(os.environ, SENTEMB_FAULT="sigterm_in:prepare_after_shard", SENTEMB_TEST_MARK=mark.split("=")[1])
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 143, proc.stderr[-3000:]
    entries = sorted(glob.glob(str(out / "*.array_record.json")))
    assert _last(proc.stderr) == (f"stopped by SIGTERM: {out} keeps {len(entries)} finished shard(s) of 8 (its worker "
                                  f"processes were stopped){CONTINUE}"), proc.stderr[-2000:]
    assert 1 <= len(entries) < 8 and not (out / "manifest.json").exists()
    deadline = time.monotonic() + 10
    while _processes_with(mark) and time.monotonic() < deadline:  # the workers: gone, not writing on
        time.sleep(0.2)
    assert _processes_with(mark) == []
    assert [n for n in os.listdir(out) if ".tmp-" in n] == []  # the shards being written: removed
    done = {p: os.path.getmtime(p[: -len(".json")]) for p in entries}
    env.pop("SENTEMB_FAULT")
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rows"] == 3000 and len(manifest["shards"]) == 8
    assert {p: os.path.getmtime(p[: -len(".json")]) for p in entries} == done  # finished shards were not redone


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, data_dir, minilm_dir):
    root = tmp_path_factory.mktemp("signals")
    make_minilm_shaped_bert(root / "model", minilm_dir, layers=1, hidden=32)
    lines = open(os.path.join(data_dir, "nli", "sentences.tsv"), encoding="utf-8").read().splitlines()
    col = lines[0].split("\t").index("sentence")
    (root / "sentences.tsv").write_text("sentence\n" + "\n".join(line.split("\t")[col] for line in lines[1:65]) + "\n",
                                        encoding="utf-8")
    return root


def _nli(model, run, data_dir, *extra):
    return [*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{run}'", f"--gin.MODEL_PATH='{model}'",
            f"--gin.DATA_DIR='{data_dir}'", "--gin.sentemb_jax.RunConfig.num_steps=2",
            "--gin.sentemb_jax.DataConfig.batch_size=4", "--gin.sentemb_jax.DataConfig.sequence_length=16",
            "--gin.sentemb_jax.ScheduleConfig.warmup_steps=0", *extra]


def test_sigterm_before_the_first_evaluation_says_nothing_was_checkpointed(tiny, tmp_path, small_sts_data_dir,
                                                                           monkeypatch, capsys):
    run = tmp_path / "run"
    args = _nli(tiny / "model", run, small_sts_data_dir, "--gin.sentemb_jax.EvalConfig.every=2",
                "--gin.sentemb_jax.EvalConfig.at_start=True")
    rc, err = _main(args, monkeypatch, capsys, fault="eval_at_start")
    assert rc == 143 and _last(err) == f"stopped by SIGTERM: no checkpoint of this run was written yet{CONTINUE}", err
    assert not (run / "checkpoints").exists() or os.listdir(run / "checkpoints") == []
    rc, err = _main(args, monkeypatch, capsys)
    assert rc == 0, err


def test_sigterm_before_the_export_keeps_the_checkpoints_and_leaves_the_export_as_it_was(tiny, tmp_path,
                                                                                         small_sts_data_dir,
                                                                                         monkeypatch, capsys):
    run, export = tmp_path / "run", tmp_path / "export"
    export.mkdir()
    (export / "README.md").write_text("an earlier export's note\n")
    args = _nli(tiny / "model", run, small_sts_data_dir, "--gin.sentemb_jax.EvalConfig.every=2",
                "--gin.sentemb_jax.CheckpointConfig.every=1", f"--gin.sentemb_jax.train.export_dir='{export}'")
    rc, err = _main(args, monkeypatch, capsys, fault="export")
    assert rc == 143 and _last(err) == (f"stopped by SIGTERM: {run} keeps its checkpoints (the last of step 2)"
                                        f"{CONTINUE}"), err
    assert sorted(os.listdir(export)) == ["README.md"]  # no partial export, no staging folder, no lock
    rc, err = _main(args, monkeypatch, capsys)
    assert rc == 0, err
    assert {"model.safetensors", "modules.json", "README.md"} <= set(os.listdir(export))
    assert [n for n in os.listdir(export) if n.startswith(".")] == []
    record = json.loads((export / "sentemb_export.json").read_text())  # what the export was made from
    assert {k: record[k] for k in ("model_dir", "tower", "step")} == {"model_dir": str(run), "tower": "best", "step": 2}
    (metric, score), = ((k, v) for k, v in record["best"].items() if k != "step")
    assert record["best"]["step"] == 2 and isinstance(score, float), record["best"]
    assert len(record["run_config_sha256"]) == 64


def test_sigterm_before_the_teacher_embeds_leaves_no_cache_file(tiny, tmp_path, data_dir, monkeypatch, capsys):
    cache = tmp_path / "cache"
    args = ["--gin_file=gin/congen.gin", f"--gin.MODEL_DIR='{tmp_path / 'congen'}'", f"--gin.TEACHER='{tiny / 'model'}'",
            "--gin.STUDENT_LAYERS=1", f"--gin.DATA_DIR='{data_dir}'",
            f"--gin.sentemb_jax.DataConfig.files={{'sentences': {[str(tiny / 'sentences.tsv')]!r}}}", "--gin.NUM_STEPS=1",
            "--gin.sentemb_jax.DataConfig.batch_size=8", "--gin.sentemb_jax.DataConfig.sequence_length=16",
            "--gin.sentemb_jax.EvalConfig.every=None", "--gin.sentemb_jax.ConGen.queue_size=16",
            f"--gin.sentemb_jax.ConGen.cache_dir='{cache}'"]
    rc, err = _main(args, monkeypatch, capsys, fault="teacher_embedding")
    assert rc == 143 and _last(err) == f"stopped by SIGTERM: no checkpoint of this run was written yet{CONTINUE}", err
    assert not cache.exists() or os.listdir(cache) == []
    rc, err = _main(args, monkeypatch, capsys)
    assert rc == 0, err
    assert len(glob.glob(str(cache / "teacher_*.npy"))) == 1 and not glob.glob(str(cache / "*.tmp*"))


def test_a_teacher_cache_dir_that_is_a_file_is_refused_before_the_teacher_embeds(tiny, tmp_path, data_dir,
                                                                                  monkeypatch, capsys):
    cache = tmp_path / "cache"
    cache.write_text("")
    args = ["--gin_file=gin/congen.gin", f"--gin.MODEL_DIR='{tmp_path / 'congen'}'", f"--gin.TEACHER='{tiny / 'model'}'",
            "--gin.STUDENT_LAYERS=1", f"--gin.DATA_DIR='{data_dir}'",
            f"--gin.sentemb_jax.DataConfig.files={{'sentences': {[str(tiny / 'sentences.tsv')]!r}}}", "--gin.NUM_STEPS=1",
            f"--gin.sentemb_jax.ConGen.cache_dir='{cache}'"]
    rc, err = _main(args, monkeypatch, capsys)
    assert rc == 1 and _last(err).startswith(f"error: {cache}: is not a directory"), err
    assert "sentemb_jax.ConGen.cache_dir" in _last(err)

"""Jobs on a host without TensorFlow: with tensorflow, tensorflow_text, seqio and
tensorflow_datasets unimportable in the job's process (run_utils.without_tensorflow), contrastive
MiniLM training from TSV files and from a prepared corpus of ids, the STS
evaluation and the sentence-transformers export run to the end; training gives the same losses as
the seqio route (DataConfig.reader='seqio', run here with TensorFlow) on the same data and seed. A
job that needs TensorFlow stops in one line naming the binding that asked for it. The default
ConGen job runs so in test_accelerator_report.py (the report's default_job stage)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from run_utils import REPO, cut_data_dir, gin_file_args, without_tensorflow

from sentemb_jax import main as runner
from sentemb_jax.data import prepare as prep
from sentemb_jax.data.kinds import file_spec

BLOCKED = ("tensorflow", "tensorflow_text", "seqio", "tensorflow_datasets")


def _job(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sentemb_jax.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=without_tensorflow())


def _in_process(args: list[str]) -> int:
    import gin

    gin.clear_config()
    try:
        return runner.main(args)
    finally:
        gin.clear_config()


def _losses(model_dir) -> list[float]:
    rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8")]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, data_dir):
    """DATA_DIR with the first rows of STS-B dev and test, the NLI triples, NLI sentences and wiki
    sentences (what the jobs below read; a small STS-B keeps their evaluations short)."""
    return cut_data_dir(tmp_path_factory.mktemp("data"), data_dir, {
        "stsb/dev.tsv": 301, "stsb/test.tsv": 301, "nli/triples.tsv": 301, "nli/sentences.tsv": 401,
        "unlabelled/wiki1m_head.tsv": 201})


def test_tensorflow_cannot_be_imported_in_the_jobs_process():
    code = ("import importlib.util, sys\n"
            f"for name in {BLOCKED!r}:\n"
            "    assert importlib.util.find_spec(name) is None, name\n"
            "    try:\n        __import__(name)\n    except ImportError:\n        pass\n"
            "    else:\n        sys.exit(name + ' imported')\n"
            "import sentemb_jax.jobs, sentemb_jax.main  # every job and configurable registers without them\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=without_tensorflow())
    assert proc.returncode == 0, proc.stderr[-2000:]


def _nli_args(small_data, out, *extra) -> list[str]:
    return [*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{out}'", f"--gin.DATA_DIR='{small_data}'",
            "--gin.NUM_STEPS=3", "--gin.sentemb_jax.ScheduleConfig.warmup_steps=1", "--gin.sentemb_jax.RunConfig.log_every=1", "--gin.sentemb_jax.EvalConfig.every=None",
            "--gin.sentemb_jax.DataConfig.batch_size=16", "--gin.sentemb_jax.DataConfig.sequence_length=32", *extra]


def test_contrastive_training_from_tsv_equals_the_seqio_route_and_exports(small_data, tmp_path, minilm_dir):
    """The same batches on both routes (test_input_routes): the same losses, step for step; the best
    tower exported as a sentence-transformers directory that sentence-transformers loads."""
    export = tmp_path / "export"
    proc = _job(_nli_args(small_data, tmp_path / "numpy", f"--gin.sentemb_jax.train.export_dir='{export}'",
                          "--gin.sentemb_jax.EvalConfig.every=3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _in_process(_nli_args(small_data, tmp_path / "seqio", "--gin.sentemb_jax.DataConfig.reader='seqio'")) == 0
    numpy_losses, seqio_losses = _losses(tmp_path / "numpy"), _losses(tmp_path / "seqio")
    assert len(numpy_losses) == 3
    np.testing.assert_allclose(numpy_losses, seqio_losses, rtol=1e-6)
    from sentence_transformers import SentenceTransformer

    from sentemb_jax.encoder import SentenceEncoder

    texts = ["A man plays a guitar.", "Two dogs run across a field in the snow."]
    want = SentenceEncoder.from_pretrained(str(export)).encode(texts)
    got = SentenceTransformer(str(export), device="cpu").encode(texts)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_contrastive_training_from_a_prepared_corpus_of_ids(small_data, tmp_path, minilm_dir):
    """A corpus tokenised ahead (prepared here, with TensorFlow) trains without it, with the losses
    of the seqio route on the same corpus."""
    ids = tmp_path / "ids"
    prep.prepare(file_spec("nli_triples", ""), [str(small_data / "nli" / "triples.tsv")], str(ids), 2, kind="nli_triples",
                 prefix="nli", progress=False, tokenizer_dir=minilm_dir, max_length=32)
    files = f"--gin.sentemb_jax.DataConfig.files={{'nli_triples': '{ids}'}}"
    proc = _job(_nli_args(small_data, tmp_path / "numpy", files))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _in_process(_nli_args(small_data, tmp_path / "seqio", files, "--gin.sentemb_jax.DataConfig.reader='seqio'")) == 0
    np.testing.assert_allclose(_losses(tmp_path / "numpy"), _losses(tmp_path / "seqio"), rtol=1e-6)


def test_the_sts_evaluation_job(small_data, tmp_path):
    proc = _job([*gin_file_args("gin/runs/eval_sts.gin"), f"--gin.MODEL_DIR='{tmp_path / 'eval'}'",
                 f"--gin.DATA_DIR='{small_data}'"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert "stsb" in json.dumps(results).lower()


@pytest.mark.parametrize("args,named", [
    (["gin/runs/export_savedmodel.gin", "--gin.EXPORT_DIR='{tmp}/sm'"], "sentemb_jax.export_savedmodel"),
    (["gin/runs/minilm_nli.gin", "--gin.MODEL_DIR='{tmp}/run'", "--gin.sentemb_jax.DataConfig.reader='seqio'"],
     "sentemb_jax.DataConfig.reader='seqio'"),
])
def test_a_job_that_needs_tensorflow_stops_in_one_line_naming_what_asked(args, named, tmp_path):
    proc = _job([*gin_file_args(args[0]), *(a.format(tmp=tmp_path) for a in args[1:])], timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {named}") and "needs tensorflow" in last, last
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "sm")

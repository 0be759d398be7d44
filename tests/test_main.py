"""The job runner: the README's default job, and clear errors for bad command lines and gin."""
import json
import os
import subprocess
import sys

import pytest
from run_utils import gin_file_args
from st_reference import cosine_spearman_x100, read_scored_pairs, st_encode

from sentemb_jax import main as runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_default_job_scores_stsb_dev(tmp_path, data_dir, minilm_dir):
    """The README's `make run` job, in-process: MiniLM on STS-B dev."""
    out = tmp_path / "run"
    rc = runner.main([*gin_file_args("gin/runs/eval_stsb_dev.gin"), f"--gin.DATA_DIR='{data_dir}'",
                      f"--gin.sentemb_jax.evaluate_stsb.model_dir='{out}'"])
    assert rc == 0
    result = json.loads((out / "results.json").read_text())
    assert result["pairs"] == 1500 and result["split"] == "dev"
    # The reference, computed outside our stack: sentence-transformers' own embeddings of the same
    # 1500 dev pairs (csv-read), cosine, scipy's Spearman (x 100): 86.7163. Our embeddings agree
    # with sentence-transformers' to cosine >= 0.99999 (tests/test_minilm.py), so pair cosines
    # differ by ~1e-6 and only pairs tied that closely can swap ranks: the two Spearmans agree to
    # ~1e-3 (x 100). 0.01 bounds that (the old bound against the copied 86.72 was 0.05).
    s1, s2, gold = read_scored_pairs(os.path.join(data_dir, "stsb", "dev.tsv"))
    assert len(gold) == 1500
    reference = cosine_spearman_x100(st_encode(minilm_dir, s1), st_encode(minilm_dir, s2), gold)
    assert result["spearman"] == pytest.approx(reference, abs=0.01), (result, reference)


@pytest.mark.parametrize(
    "args, message",
    [
        ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--gin.nosuch.param=1"], "No configurable matching 'nosuch'"),
        ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--gin.sentemb_jax.evaluate_stsb.bogus=1"], "doesn't have a parameter named 'bogus'"),
        # A value of the wrong type is named before the job starts (not a TypeError deep inside it).
        ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--gin.sentemb_jax.evaluate_stsb.batch_size='64'"],
         "sentemb_jax.evaluate_stsb.batch_size = '64': expected int"),
        ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--gin.sentemb_jax.evaluate_stsb.model_dir=3"],
         "sentemb_jax.evaluate_stsb.model_dir = 3: expected str or None"),
        ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--gin.sentemb_jax.evaluate_stsb.split=('dev'"],
         "gin configuration error: ('EOF in multi-line statement'"),
        ([*gin_file_args("gin/runs/absent.gin")], "gin/runs/absent.gin: no such file"),
        ([], "no --gin_file given"),
        ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--oops"], "unrecognised argument '--oops'"),
    ],
)
def test_bad_command_lines_exit_2(args, message, capsys):
    import gin

    gin.clear_config()
    assert runner.main(args) == 2
    assert message in capsys.readouterr().err


def test_missing_required_value_exit_2(tmp_path, capsys):
    import gin

    gin.clear_config()
    cfg = tmp_path / "job.gin"
    cfg.write_text("run.job = @sentemb_jax.evaluate_stsb\n")
    assert runner.main([f"--gin_file={cfg}"]) == 2
    err = capsys.readouterr().err
    assert "model_path" in err or "data_dir" in err


def test_missing_data_file_names_path(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/eval_stsb_dev.gin"), f"--gin.DATA_DIR='{tmp_path}'"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert f"{tmp_path}/stsb/dev.tsv: no such file" in proc.stderr

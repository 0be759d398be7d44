"""Ensemble distillation: the weighting, the combined loss against hand-computed values,
the ensemble encoder, junk cleaning, and a tiny end-to-end run of the gin job."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from run_utils import gin_file_args

from sentemb_jax import losses
from sentemb_jax.jobs.distill import ensemble_distill
from sentemb_jax.methods.ensemble import EnsembleEncoder, ensemble_weights

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_weights_uniform_and_softmax_of_scores():
    np.testing.assert_allclose(ensemble_weights([70.0, 72.0, 71.0], "uniform"), [1 / 3] * 3)
    w = ensemble_weights([70.0, 72.0, 71.0], "softmax", temperature=1.0)
    e = np.exp([70.0, 72.0, 71.0])
    np.testing.assert_allclose(w, e / e.sum(), rtol=1e-12)
    np.testing.assert_allclose(ensemble_weights([70.0, 72.0], "softmax", temperature=2.0),
                               [1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-12)
    with pytest.raises(ValueError, match="choose from"):
        ensemble_weights([1.0], "median")
    with pytest.raises(ValueError, match="must be > 0"):
        ensemble_weights([1.0], "softmax", temperature=0)


def _loss_numpy(s, t, lam, tau, regression):
    sn = s / np.linalg.norm(s, axis=1, keepdims=True)
    tn = t / np.linalg.norm(t, axis=1, keepdims=True)
    logits = sn @ tn.T / tau
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    info = -np.mean(np.diag(logp))
    d = s - t
    if regression == "mae":  # eq. 4: per sentence, summed over the dimensions; mean over the batch
        reg = np.mean(np.abs(d).sum(1))
    elif regression == "mse":
        reg = np.mean((d ** 2).sum(1))
    elif regression == "smooth_l1":
        reg = np.mean(np.where(np.abs(d) < 1, 0.5 * d ** 2, np.abs(d) - 0.5).sum(1))
    else:
        tl = tn @ tn.T / tau
        tlog = tl - np.log(np.exp(tl).sum(1, keepdims=True))
        reg = np.mean(np.sum(np.exp(tlog) * (tlog - logp), axis=1))
    return lam * info + (1 - lam) * reg


@pytest.mark.parametrize("regression", ["mae", "mse", "smooth_l1", "kl"])
def test_combined_loss_equals_hand_computed(regression):
    rng = np.random.default_rng(0)
    s = rng.standard_normal((6, 5)).astype(np.float32) * 1.5
    t = rng.standard_normal((6, 5)).astype(np.float32)
    got = float(losses.ensemble_distillation_loss(s, t, 0.1, 0.3, regression))
    assert got == pytest.approx(_loss_numpy(s.astype(np.float64), t.astype(np.float64), 0.1, 0.3, regression), rel=1e-5)
    # lambda = 0: the regression term alone, by hand: eq. 4 is 1/M sum_i ||t_i - s_i||_1 (M = 2 rows).
    a, b = np.array([[1.0, -2.0], [0.0, 3.0]], np.float32), np.array([[0.5, 0.0], [1.0, 1.0]], np.float32)
    by_hand = {"mae": ((0.5 + 2.0) + (1.0 + 2.0)) / 2, "mse": ((0.25 + 4.0) + (1.0 + 4.0)) / 2,
               "smooth_l1": ((0.125 + 1.5) + (0.5 + 1.5)) / 2}
    if regression in by_hand:
        assert float(losses.ensemble_distillation_loss(a, b, 0.0, 0.3, regression)) == pytest.approx(by_hand[regression])


class _Fixed:
    """A stand-in encoder with fixed embeddings per text."""

    def __init__(self, table):
        self.table = table

    def get_sentence_embedding_dimension(self):
        return 2

    def encode(self, texts, batch_size=64, normalize=True, show_progress_bar=None):
        out = np.array([self.table[t] for t in texts], np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True) if normalize else out


def test_ensemble_encoder_is_the_weighted_sum_of_normalised_submodels():
    a = _Fixed({"x": [3.0, 4.0], "y": [1.0, 0.0]})
    b = _Fixed({"x": [0.0, 2.0], "y": [0.0, 5.0]})
    ens = EnsembleEncoder([a, b], [0.25, 0.75])
    raw = ens.encode(["x", "y"], normalize=False)
    np.testing.assert_allclose(raw, [[0.25 * 0.6, 0.25 * 0.8 + 0.75], [0.25, 0.75]], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(ens.encode(["x", "y"]), axis=1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="sum to 1"):
        EnsembleEncoder([a, b], [0.5, 0.6])


def test_bad_student_init_is_refused_before_any_training(tmp_path):
    def never(**kwargs):
        raise AssertionError("no submodel may train when the job's settings are wrong")

    with pytest.raises(ValueError, match="student_init 'first_submodel': choose from"):
        ensemble_distill(model_dir=str(tmp_path / "run"), submodels=[], submodel_methods=[], student=None, method=None,
                         student_init="first_submodel")
    assert not (tmp_path / "run").exists()


def test_submodel_average_is_the_elementwise_mean_and_refuses_other_architectures(tmp_path, minilm_dir):
    from hf_models import make_minilm_shaped_bert

    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.methods.ensemble import average_submodels

    for seed in (0, 1, 2):
        make_minilm_shaped_bert(tmp_path / f"m{seed}", minilm_dir, layers=1, seed=seed)
    make_minilm_shaped_bert(tmp_path / "deeper", minilm_dir, layers=2, seed=3)
    paths = [str(tmp_path / f"m{seed}") for seed in (0, 1, 2)]
    out = average_submodels(paths, str(tmp_path / "avg"))
    avg = SentenceEncoder.from_pretrained(out)
    parts = [SentenceEncoder.from_pretrained(p) for p in paths]
    leaves = [jax.tree_util.tree_leaves(p.params) for p in parts]
    assert len(leaves[0]) > 10 and sum(not np.allclose(a, b) for a, b in zip(*leaves[:2])) == 9  # 9 weight matrices differ
    for got, *want in zip(jax.tree_util.tree_leaves(avg.params), *leaves):
        np.testing.assert_allclose(np.asarray(got), np.mean([np.asarray(w) for w in want], 0), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="deeper differs from .* in architecture or pooling"):
        average_submodels([paths[0], str(tmp_path / "deeper")], str(tmp_path / "bad"))
    assert not os.path.exists(tmp_path / "bad")


def test_junk_cleaning():
    from sentemb_jax.data.files import is_junk_text

    assert [is_junk_text(t) for t in ["ok.", "Fine sentence.", "Wow!!!! great", "12 345", "(( ))", "A man walks."]] == \
        [True, False, True, True, True, False]


def test_tiny_ensemble_job_end_to_end(tmp_path, data_dir, small_sts_data_dir, minilm_dir):
    """2 submodels + student (1 layer of a random 2-layer BERT) on 240 sentences, STS files cut to 40
    pairs each: the job writes each row of the STS table, the ensemble's and the student's STS-B
    dev, weights that sum to 1, and a student distilled from the cached ensemble embeddings, started
    from the best submodel by dev (student_init). (The CPU job's third submodel and "student
    before" row are left out here to keep the test short.)"""
    from hf_models import make_minilm_shaped_bert

    model = tmp_path / "base"
    make_minilm_shaped_bert(model, minilm_dir, layers=2, seed=0)
    lines = open(os.path.join(data_dir, "nli/sentences.tsv"), encoding="utf-8").read().splitlines()
    col = lines[0].split("\t").index("sentence")
    (tmp_path / "s.tsv").write_text("sentence\n" + "\n".join(l.split("\t")[col] for l in lines[1:241]) + "\nok\n")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/ensemble_distill_cpu.gin"),
           f"--gin.MODEL_DIR='{out}'", f"--gin.TEACHER='{model}'", f"--gin.DATA_DIR='{small_sts_data_dir}'",
           f"--gin.sentemb_jax.DataConfig.files={{'sentences': '{tmp_path / 's.tsv'}'}}",
           "--gin.SUB_STEPS=3", "--gin.STUDENT_STEPS=4", "--gin.STUDENT_LAYERS=1", "--gin.sentemb_jax.DataConfig.batch_size=16",
           "--gin.sentemb_jax.DataConfig.sequence_length=32", "--gin.sentemb_jax.EvalConfig.every=3",
           "--gin.student/sentemb_jax.EvalConfig.every=2", "--gin.sentemb_jax.ensemble_distill.teacher=None",
           "--gin.sentemb_jax.ensemble_distill.submodels=[@sub1/sentemb_jax.RunConfig(), @sub2/sentemb_jax.RunConfig()]",
           "--gin.sentemb_jax.ensemble_distill.submodel_methods=[@sub1/sentemb_jax.SimCSE(), @sub2/sentemb_jax.SimCSE()]",
           "--gin.sentemb_jax.ensemble_distill.student_init='best_submodel'",
           f"--gin.sentemb_jax.EnsembleStudent.cache_dir='{tmp_path / 'cache'}'"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "results.json").read_text())
    assert list(result["rows"]) == ["submodel 1", "submodel 2", "ensemble", "distilled student"]
    assert sum(result["weights"]) == pytest.approx(1.0) and len(result["submodel_dev"]) == 2
    assert np.isfinite(result["ensemble_dev"]) and np.isfinite(result["student_dev"])
    assert result["weighting"] == "uniform"  # the CPU job's choice (gin/ensemble_distill.gin)
    np.testing.assert_allclose(result["weights"], ensemble_weights(result["submodel_dev"], "uniform"), rtol=1e-9)
    assert all(np.isfinite(r["STSB"]) and np.isfinite(r["avg"]) for r in result["rows"].values())
    assert "1 junk texts cleaned out" in proc.stderr  # the trailing 'ok'
    cached = [f for f in os.listdir(tmp_path / "cache") if f.endswith(".npy")]
    assert len(cached) == 1 and np.load(tmp_path / "cache" / cached[0]).shape == (240, 32)
    best = int(np.argmax(result["submodel_dev"])) + 1
    assert result["student_init"] == str(out / f"sub{best}" / "model")
    # The student started from that submodel's weights (its architecture record says so).
    assert json.loads((out / "student" / "encoder.json").read_text())["init_from"] == result["student_init"]
    history = [json.loads(l) for l in open(out / "student" / "metrics.jsonl")]
    assert [h["step"] for h in history if "loss" in h][-1] == 4

"""Trans-Encoder: pseudo-labels and losses against hand-computed values; a tiny end-to-end cycle."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_models import make_minilm_shaped_bert
from run_utils import simulated_devices_flags
from scipy import stats

from sentemb_jax.errors import DataError
from sentemb_jax.jobs.trans_encoder import trans_encoder as trans_encoder_job
from sentemb_jax.methods import trans_encoder as te

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def test_bi_encoder_scores_are_cosines():
    a = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], np.float32)
    b = np.array([[3.0, 4.0], [0.0, 1.0], [0.0, -5.0]], np.float32)
    np.testing.assert_allclose(np.asarray(te.bi_encoder_scores(a, b)), [1.0, 0.0, -1.0], atol=1e-7)
    a2 = np.array([[1.0, 2.0, 2.0]], np.float32)
    b2 = np.array([[2.0, 1.0, 2.0]], np.float32)
    np.testing.assert_allclose(np.asarray(te.bi_encoder_scores(a2, b2)), [8.0 / 9.0], rtol=1e-6)


def test_cross_encoder_scores_average_both_orders():
    l12, l21 = np.array([0.0, 2.0, -1.0], np.float32), np.array([0.0, -2.0, 3.0], np.float32)
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    want = (sig(l12) + sig(l21)) / 2
    np.testing.assert_allclose(np.asarray(te.cross_encoder_scores(l12, l21)), want, rtol=1e-6)
    assert float(te.cross_encoder_scores(np.array([2.0]), np.array([-2.0]))[0]) == pytest.approx(0.5, abs=1e-7)


def test_mutual_labels_and_relabel():
    np.testing.assert_allclose(te.mutual_labels([np.array([0.2, 0.8]), np.array([0.4, 0.4])]), [0.3, 0.6], rtol=1e-6)
    with pytest.raises(ValueError, match="different shapes"):
        te.mutual_labels([np.zeros(2), np.zeros(3)])
    x = np.array([0.8, 0.9, 1.0], np.float32)
    np.testing.assert_allclose(te.relabel(x, "minmax"), [0.0, 0.5, 1.0], atol=1e-6)
    z = te.relabel(x, "standardize", target_mean=0.5, target_std=0.2)
    np.testing.assert_allclose(z, 0.5 + 0.2 * (x - x.mean()) / x.std(), atol=1e-6)
    assert te.relabel(x, "none") is not x and np.array_equal(te.relabel(x, "none"), x)
    with pytest.raises(ValueError, match="relabel mode 'zscore'"):
        te.relabel(x, "zscore")


def test_losses_equal_hand_computed():
    logits, t = np.array([0.0, 2.0, -1.0], np.float32), np.array([0.5, 0.9, 0.2], np.float32)
    p = 1 / (1 + np.exp(-logits))
    bce = -np.mean(t * np.log(p) + (1 - t) * np.log(1 - p))
    assert float(te.soft_bce_loss(logits, t)) == pytest.approx(bce, rel=1e-6)
    assert float(te.sigmoid_mse_loss(logits, t)) == pytest.approx(np.mean((p - t) ** 2), rel=1e-6)
    e1 = np.array([[2.0, 1.0], [1.0, 1.0]], np.float32)
    e2 = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
    cos = np.array([2 / np.sqrt(5), 1 / np.sqrt(2)])
    t2 = np.array([0.5, 0.5], np.float32)
    assert float(te.cosine_mse_loss(e1, e2, t2)) == pytest.approx(np.mean((cos - t2) ** 2), rel=1e-6)
    pc = np.clip(cos, 1e-6, 1 - 1e-6)
    want = -np.mean(t2 * np.log(pc) + (1 - t2) * np.log(1 - pc))
    assert float(te.cosine_bce_loss(e1, e2, t2)) == pytest.approx(want, rel=1e-5)
    # Soft BCE is minimal (gradient zero) where sigmoid(logit) equals the target.
    import jax

    g = jax.grad(lambda z: te.soft_bce_loss(z, jnp.asarray(t)))(jnp.log(t / (1 - t)))
    assert float(jnp.abs(g).max()) < 1e-6


def test_read_unlabelled_pairs_drops_labels_and_duplicates(tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text("sentence1\tsentence2\tscore\na\tb\t1.0\nc\td\t2.0\na\tb\t3.0\n")
    assert te.read_unlabelled_pairs([str(f)]) == [("a", "b"), ("c", "d")]
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence1\tsentence2\tlabel\na\t \t1\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: empty sentence2"):
        te.read_unlabelled_pairs([str(bad)])
    with pytest.raises(DataError, match="not found"):
        te.read_unlabelled_pairs([str(tmp_path / "missing.tsv")])


def _tiny_bert(path, minilm_dir, seed, dropout=0.1):
    make_minilm_shaped_bert(path, minilm_dir, seed=seed, dropout=dropout)
    return str(path)


def test_tiny_mutual_cycle_end_to_end_and_rerun_resumes(tmp_path, data_dir, minilm_dir):
    rows = open(os.path.join(data_dir, "stsb", "train.tsv"), encoding="utf-8").read().splitlines()[:201]
    pairs_file = tmp_path / "pairs.tsv"
    pairs_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
    # Dropout off: this test checks what the cycle learns and keeps, not dropout (the SIGTERM test
    # below keeps it on, for the resumed phase's random stream).
    models = [_tiny_bert(tmp_path / f"m{i}", minilm_dir, seed=i, dropout=0.0) for i in range(2)]
    dev = te.EvalSet("stsb_dev_head", os.path.join(data_dir, "stsb", "dev.tsv"), "sts", (0, 200))
    kw = dict(model_dir=str(tmp_path / "run"), bi_encoders=models, pair_files=[str(pairs_file)], dev=dev, cycles=1,
              # A random model's cosines bunch together: spread them onto [0, 1] so there is a ranking to learn.
              bi_to_cross=te.DistillPhase(learning_rate=1e-3, batch_size=32, epochs=3, max_length=48, relabel="minmax"),
              cross_to_bi=te.DistillPhase(learning_rate=1e-3, batch_size=64, epochs=2, max_length=32, loss="mse"),
              checkpoint_every=5)
    results = trans_encoder_job(**kw)
    assert results["pairs"] == 199 and results["mutual"] is True  # rows 1-200 of STS-B train hold one duplicate pair
    cycle = results["cycles"][0]
    # Mutual: both models learnt the same labels, with the spread of real cosines.
    assert cycle["bi_labels"][0] == cycle["bi_labels"][1] and cycle["bi_labels"][0]["std"] > 0.0
    for m in cycle["models"]:
        assert [e["epoch"] for e in m["cross"]["epochs"]] == [1, 2, 3]
        assert [e["epoch"] for e in m["bi"]["epochs"]] == [1, 2]
        assert np.isfinite(m["bi"]["dev"]) and np.isfinite(m["cross"]["dev"])
    assert set(cycle["ensemble"]) == {"bi", "cross"}
    # The kept models are the best epoch by dev, not the last (a report set would score them too;
    # left out here to keep this test under 2 minutes).
    for i, m in enumerate(cycle["models"]):
        for kind in ("cross", "bi"):
            assert results["best"][f"model_{i}/{kind}"]["dev"] == max(e["dev"] for e in m[kind]["epochs"])
    # The cross-encoders learnt their pseudo-labels: their scores on the training pairs rank like them.
    from sentemb_jax.cross_encoder import CrossEncoder
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.evaluation.sts import cosine_scores

    pairs = te.read_unlabelled_pairs([str(pairs_file)])
    labels = te.mutual_labels([cosine_scores(SentenceEncoder.from_pretrained(m), [a for a, _ in pairs], [b for _, b in pairs])
                               for m in models])
    last = CrossEncoder.from_pretrained(str(tmp_path / "run" / "model_0" / "cross_last"))
    rho = stats.spearmanr(last.predict(pairs), labels).statistic
    start = stats.spearmanr(CrossEncoder.from_pretrained(models[0]).predict(pairs), labels).statistic
    assert rho > 0.5 and rho > start + 0.3, (rho, start)
    assert CrossEncoder.from_pretrained(str(tmp_path / "run" / "model_0" / "cross_best")).predict(pairs[:2]).shape == (2,)
    assert SentenceEncoder.from_pretrained(str(tmp_path / "run" / "model_1" / "bi_best")).encode(["a"]).shape == (1, 32)
    # A rerun finds every phase finished in its checkpoints: same numbers, no training.
    again = trans_encoder_job(**kw)
    assert json.dumps(again["cycles"][0]["models"], sort_keys=True) == json.dumps(cycle["models"], sort_keys=True)


def test_bad_settings_fail_before_training(tmp_path, minilm_dir):
    dev = te.EvalSet("d", "x.tsv")
    with pytest.raises(ValueError, match="schedule 'cyclic'"):
        trans_encoder_job(model_dir=str(tmp_path), bi_encoders=[minilm_dir], pair_files=["x"], dev=dev, schedule="cyclic")
    with pytest.raises(ValueError, match=r"^sentemb_jax.DistillPhase\(relabel='zscore'\): must be one of"):
        te.DistillPhase(relabel="zscore")


def test_sigterm_in_a_phase_checkpoints_and_the_rerun_ends_as_uninterrupted(tmp_path, data_dir, minilm_dir, monkeypatch):
    """The phases run in the one train loop: SIGTERM (preemption) after step 3 of the bi -> cross
    phase checkpoints that step and stops the job (Preempted, exit 143 on the command line); the
    same call again resumes the phase at step 3 and ends with the parameters and dev scores of an
    uninterrupted run."""
    from sentemb_jax.cross_encoder import CrossEncoder
    from sentemb_jax.errors import Preempted

    rows = open(os.path.join(data_dir, "stsb", "train.tsv"), encoding="utf-8").read().splitlines()[:49]
    pairs_file = tmp_path / "pairs.tsv"
    pairs_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
    model = _tiny_bert(tmp_path / "m", minilm_dir, seed=0)
    dev = te.EvalSet("stsb_dev_head", os.path.join(data_dir, "stsb", "dev.tsv"), "sts", (0, 100))
    kw = dict(bi_encoders=[model], pair_files=[str(pairs_file)], dev=dev, cycles=1, checkpoint_every=100,
              bi_to_cross=te.DistillPhase(learning_rate=1e-3, batch_size=16, epochs=2, max_length=32, relabel="minmax"),
              cross_to_bi=te.DistillPhase(learning_rate=1e-3, batch_size=32, epochs=1, max_length=32, loss="mse"))
    whole = trans_encoder_job(model_dir=str(tmp_path / "whole"), **kw)
    monkeypatch.setenv("SENTEMB_FAULT", "sigterm_after_step:3")
    with pytest.raises(Preempted) as stopped:
        trans_encoder_job(model_dir=str(tmp_path / "cut"), **kw)
    assert stopped.value.step == 3
    phase_dir = tmp_path / "cut" / "model_0" / "cycle_1" / "bi_to_cross" / "checkpoints"
    assert sorted(os.listdir(phase_dir)) == ["3"]  # step 3 is no checkpoint step: saved because of the signal
    monkeypatch.delenv("SENTEMB_FAULT")
    resumed = trans_encoder_job(model_dir=str(tmp_path / "cut"), **kw)
    def scores(r):  # every phase's dev / epoch losses (times differ), to 5 decimals
        return [[(k, e["epoch"], e["step"], round(e["loss"], 5), round(e["dev"], 5)) for k in ("cross", "bi")
                 for e in m[k]["epochs"]] + [round(m[k]["dev"], 5) for k in ("cross", "bi")]
                for m in r["cycles"][0]["models"]]
    assert scores(resumed) == scores(whole)
    assert [e["epoch"] for e in whole["cycles"][0]["models"][0]["cross"]["epochs"]] == [1, 2]
    a, b = (CrossEncoder.from_pretrained(str(tmp_path / d / "model_0" / "cross_last")).params for d in ("whole", "cut"))
    assert max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))) <= 1e-6


def _same_tree(a, b) -> bool:
    a, b = jax.device_get(a), jax.device_get(b)
    return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
        np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_sequential_schedule_passes_backbones_both_ways(tmp_path, data_dir, minilm_dir, monkeypatch):
    """schedule='sequential', one cycle: the bi -> cross phase starts from the bi-encoder's backbone
    (under the cross-encoder's own head), not from the cross-encoder's start backbone; the cross ->
    bi phase starts from the backbone the cross-encoder has just learnt (the bi-encoder's other
    parameters kept). The cross-encoder starts from another tiny model (seed 1) than the bi-encoder
    (seed 0), so the two starts differ and each check can tell them apart."""
    from sentemb_jax.cross_encoder import CrossEncoder
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.jobs import trans_encoder as job

    rows = open(os.path.join(data_dir, "stsb", "train.tsv"), encoding="utf-8").read().splitlines()[:33]
    pairs_file = tmp_path / "pairs.tsv"
    pairs_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
    bi_path, cross_path = _tiny_bert(tmp_path / "bi", minilm_dir, seed=0), _tiny_bert(tmp_path / "cross", minilm_dir, seed=1)
    calls = []
    real_fit_phase = job.fit_phase

    def spy(name, out, model, *args, **kwargs):
        init = jax.device_get(model.params)
        params, info = real_fit_phase(name, out, model, *args, **kwargs)
        calls.append((name, init, jax.device_get(params)))
        return params, info

    monkeypatch.setattr(job, "fit_phase", spy)
    results = trans_encoder_job(
        model_dir=str(tmp_path / "run"), bi_encoders=[bi_path], cross_encoders=[cross_path], pair_files=[str(pairs_file)],
        dev=te.EvalSet("stsb_dev_head", os.path.join(data_dir, "stsb", "dev.tsv"), "sts", (0, 50)), cycles=1,
        schedule="sequential", checkpoint_every=100,
        bi_to_cross=te.DistillPhase(learning_rate=1e-3, batch_size=16, epochs=1, max_length=32, relabel="minmax"),
        cross_to_bi=te.DistillPhase(learning_rate=1e-3, batch_size=16, epochs=1, max_length=32, loss="mse"))
    assert results["schedule"] == "sequential"
    assert [name for name, _, _ in calls] == ["model 0 cycle 1 bi->cross", "model 0 cycle 1 cross->bi"]
    bi_start, cross_start = SentenceEncoder.from_pretrained(bi_path).params, CrossEncoder.from_pretrained(
        cross_path, pooling="first", max_seq_length=32, seed=0).params
    assert not _same_tree(bi_start["backbone"], cross_start["backbone"])  # two different starts
    (_, cross_init, cross_trained), (_, bi_init, bi_trained) = calls
    assert set(cross_init) == {"backbone", "head"}
    assert _same_tree(cross_init["backbone"], bi_start["backbone"])  # the bi-encoder's backbone ...
    assert _same_tree(cross_init["head"], cross_start["head"])  # ... under the cross-encoder's own (seed 0) head
    assert not _same_tree(cross_trained["backbone"], cross_init["backbone"])  # the phase trained it
    assert _same_tree(bi_init["backbone"], cross_trained["backbone"])  # the cross-encoder's learnt backbone
    assert _same_tree({k: v for k, v in bi_init.items() if k != "backbone"},
                      {k: v for k, v in bi_start.items() if k != "backbone"})
    assert not _same_tree(bi_trained["backbone"], bi_init["backbone"])
    # What the job saved is what the phases returned.
    assert _same_tree(CrossEncoder.from_pretrained(str(tmp_path / "run" / "model_0" / "cross_last")).params["backbone"],
                      cross_trained["backbone"])


def test_cycle_on_8_devices_equals_one_device_and_uses_the_configured_optimizer(tmp_path, data_dir, minilm_dir):
    """The phases build through the run setup: on 8 simulated devices (a data-parallel mesh, each
    phase's batch split 8 ways) a cycle ends with the parameters of the same cycle on one device
    (1e-5), and a phase trains with the optimizer its DistillPhase configures (Adafactor in a third
    run: its factored statistics are in the phase's checkpoint, AdamW's moments are not).
    (Adafactor is not used for the comparison: its epsilon of 1e-30 turns float round-off in a
    gradient that is zero on one device into a step of the learning rate's size.)"""
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trans_encoder_devices.py")
    # Dropout off: sharded dropout equal to one device's is tests/test_sharding.py's check.
    model = _tiny_bert(tmp_path / "m", minilm_dir, seed=0, dropout=0.0)
    out = {}
    for devices, optimizer in ((1, "adamw"), (8, "adamw"), (1, "adafactor")):
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=simulated_devices_flags(devices))
        run = tmp_path / f"run{devices}_{optimizer}"
        proc = subprocess.run([sys.executable, script, model, data_dir, str(run), optimizer], capture_output=True,
                              text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
        out[devices if optimizer == "adamw" else optimizer] = result
    assert out[8]["devices"] == 8 and out[1]["devices"] == 1
    for kind in ("cross", "bi"):
        diff = max(abs(a - b) for a, b in zip(out[1][kind], out[8][kind]))
        assert diff <= 1e-5, (kind, diff)
        assert max(abs(a) for a in out[1][f"{kind}_moved"]) > 1e-4  # the phase trained
    assert out[1]["cross_optimizer"] == out[1]["bi_optimizer"] == ["mu", "nu"]  # AdamW
    assert out["adafactor"]["cross_optimizer"] == ["v_col", "v_row"]  # Adafactor, as its DistillPhase configures
    assert out["adafactor"]["bi_optimizer"] == ["mu", "nu"]  # the other phase's default

"""Queue-based distillation (ConGen, SCT, baselines): the FIFO queue (also sharded on 8 simulated
devices), the losses against numpy, layer dropping, and tiny runs of the gin jobs end to end."""
import itertools
import json
import os
import subprocess
import sys

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
from hf_models import make_minilm_shaped_bert
from run_utils import simulated_devices_flags

from sentemb_jax import losses
from sentemb_jax.errors import ConfigError
from sentemb_jax.methods import instance_queue as iq
from sentemb_jax.methods.queue_distill import SCT, ConGen, EnsembleStudent, L2Distillation
from sentemb_jax.training.method import TrainState

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def test_fifo_order_after_wrap_around():
    q = iq.new_queue(np.arange(10, dtype=np.float32).reshape(5, 2))
    first = np.array([[100, 100], [101, 101], [102, 102]], np.float32)
    q = iq.enqueue(q, first)
    assert int(q.pointer) == 3
    second = np.array([[200, 200], [201, 201], [202, 202]], np.float32)
    q = iq.enqueue(q, second)  # slots 3, 4, then wraps to 0
    assert int(q.pointer) == 1
    np.testing.assert_array_equal(np.asarray(q.values)[:, 0], [202, 101, 102, 200, 201])
    np.testing.assert_array_equal(np.asarray(iq.in_order(q))[:, 0], [101, 102, 200, 201, 202])  # oldest first
    np.testing.assert_array_equal(np.asarray(iq.slots_of_last(q, 3)), [3, 4, 0])
    # A batch as large as the queue replaces everything, in order.
    full = np.arange(300, 305, dtype=np.float32)[:, None].repeat(2, axis=1)
    np.testing.assert_array_equal(np.asarray(iq.in_order(iq.enqueue(q, full)))[:, 0], full[:, 0])
    with pytest.raises(ValueError, match="6 rows into a queue of 5"):
        iq.enqueue(q, np.zeros((6, 2), np.float32))


_SHARDED_SCRIPT = r"""
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from sentemb_jax import losses
from sentemb_jax.methods import instance_queue as iq
from sentemb_jax.partitioning import make_mesh
mesh = make_mesh(data=8)
rng = np.random.default_rng(0)
unit = lambda n: (lambda x: x / np.linalg.norm(x, axis=1, keepdims=True))(rng.standard_normal((n, 16)).astype(np.float32))
start, batches = unit(64), [unit(24) for _ in range(5)]
students = [unit(24) for _ in range(5)]
shardings = iq.queue_sharding(mesh, 64, shard_min_entries=8)
def step(q, t, s):
    q = iq.enqueue(q, t)
    return q, losses.congen_loss(t, s, s[::-1], q.values, 0.05, 0.07, 0.5)
rows = NamedSharding(mesh, P("data"))
sharded = jax.jit(step, in_shardings=(shardings, rows, rows), out_shardings=(shardings, NamedSharding(mesh, P())))
plain = jax.jit(step)
qs, qp = jax.device_put(iq.new_queue(start), shardings), iq.new_queue(start)
out = {"spec": str(qs.values.sharding.spec), "loss_diff": 0.0}
for t, s in zip(batches, students):
    qs, ls = sharded(qs, t, s)
    qp, lp = plain(qp, t, s)
    out["loss_diff"] = max(out["loss_diff"], abs(float(ls) - float(lp)))
out["spec_after"] = str(qs.values.sharding.spec)
out["values_equal"] = bool(np.array_equal(np.asarray(qs.values), np.asarray(qp.values)))
out["pointer"] = [int(qs.pointer), int(qp.pointer)]
print("RESULT " + json.dumps(out))
"""


def test_sharded_queue_equals_unsharded():
    env = dict(os.environ, XLA_FLAGS=simulated_devices_flags(8), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT "):])
    assert r["spec"] in ("P('data', None)", "PartitionSpec('data', None)") and r["spec_after"] == r["spec"]  # rows stay split over 8 devices
    assert r["values_equal"] and r["pointer"] == [(5 * 24) % 64] * 2  # wrapped around twice
    assert r["loss_diff"] <= 2e-5  # losses ~4: float32 sums in another order across the 8 row blocks


def test_distribution_losses_equal_numpy():
    rng = np.random.default_rng(0)
    t, c, g, q = _unit(rng, 3, 4), _unit(rng, 3, 4), _unit(rng, 3, 4), _unit(rng, 5, 4)
    pt = np.exp(_log_softmax(t @ q.T / 0.05))
    ce = lambda s: float(np.mean(-(pt * _log_softmax(s @ q.T / 0.07)).sum(axis=1)))  # noqa: E731
    want = 0.3 * ce(c) + 0.7 * ce(g)
    assert float(losses.congen_loss(t, c, g, q, 0.05, 0.07, alpha=0.3)) == pytest.approx(want, rel=1e-5)
    kl = float(np.mean((pt * (np.log(pt) - _log_softmax(c @ q.T / 0.07))).sum(axis=1)))
    assert float(losses.distribution_kl(t @ q.T / 0.05, c @ q.T / 0.07)) == pytest.approx(kl, rel=1e-5)
    # CKD: InfoNCE with the positive at a known slot.
    slots = np.array([4, 0, 2])
    ls = _log_softmax(c @ q.T / 0.05)
    assert float(losses.contrastive_distillation_loss(slots, c, q, 0.05)) == pytest.approx(-ls[[0, 1, 2], slots].mean(), rel=1e-5)
    assert float(losses.mse_loss(c, g)) == pytest.approx(float(np.mean((c - g) ** 2)), rel=1e-6)


def test_sct_loss_is_cross_view_kl():
    rng = np.random.default_rng(1)
    z1, z2, r1, r2 = (_unit(rng, 4, 6) for _ in range(4))
    d1, d2 = _unit(rng, 7, 6), _unit(rng, 7, 6)

    def kl(target, logits):
        p = np.exp(_log_softmax(target))
        return np.mean((p * (np.log(p) - _log_softmax(logits))).sum(axis=1))

    # c1 = SR(z1, D2), c2 = SR(z2, D1); c1_ref = SR(r1, D1), c2_ref = SR(r2, D2)  (SCT Sec. 3.2-3.3)
    want = 0.5 * kl(r2 @ d2.T / 0.02, z1 @ d2.T / 0.03) + 0.5 * kl(r1 @ d1.T / 0.02, z2 @ d1.T / 0.03)
    got = float(losses.sct_loss(z1, z2, r1, r2, d1, d2, 0.02, 0.03))
    assert got == pytest.approx(want, rel=1e-5)
    # The reference side gets no gradient (stop-gradient, SCT eq. 2).
    g = jax.grad(lambda r: losses.sct_loss(z1, z2, r, r2, d1, d2, 0.02, 0.03))(jnp.asarray(r1))
    assert float(jnp.abs(g).max()) == 0.0


def test_baseline_switch_terms():
    rng = np.random.default_rng(2)
    t, c, g = _unit(rng, 3, 4), _unit(rng, 3, 4), _unit(rng, 3, 4)
    mse = lambda a, b: float(np.mean((a - b) ** 2))  # noqa: E731
    loss = lambda m: float(L2Distillation(variant=m, teacher="t").loss(c, g, (), (t,), None))  # noqa: E731
    assert loss("l2") == pytest.approx(mse(c, t), rel=1e-6)
    assert loss("dual_l2") == pytest.approx(mse(c, t) + mse(g, t), rel=1e-6)
    assert loss("skd") == pytest.approx(mse(c, t) + mse(g, t) + mse(c, g), rel=1e-6)
    with pytest.raises(ConfigError, match=r"^sentemb_jax.ConGen\(teacher=None\): needs a teacher"):
        ConGen()
    with pytest.raises(ConfigError, match=r"^sentemb_jax.L2Distillation\(variant='seed'\): must be one of"):
        L2Distillation(variant="seed", teacher="t")



@pytest.mark.parametrize("method", ["l2", "dual_l2", "skd"])
def test_l2_baselines_compare_unit_vectors_unless_asked(method):
    """ConGen 3.1: every z is unit length. A student without a Normalize module (outputs of norm 3
    here) gets the same loss as its unit-length output; l2_on_raw_output keeps the earlier raw one."""
    rng = np.random.default_rng(5)
    t, c, g = _unit(rng, 3, 4), _unit(rng, 3, 4), _unit(rng, 3, 4)
    mse = lambda a, b: float(np.mean((a - b) ** 2))  # noqa: E731
    terms = {"l2": [(c, t)], "dual_l2": [(c, t), (g, t)], "skd": [(c, t), (g, t), (c, g)]}[method]

    def loss(cfg, student_scale):
        norm = cfg.embedding_norm()
        return float(cfg.loss(norm(student_scale * c), norm(student_scale * g), (), (norm(t),), None))

    faithful = L2Distillation(variant=method, teacher="t")
    assert loss(faithful, 3.0) == pytest.approx(sum(mse(a, b) for a, b in terms), rel=1e-6)
    raw = L2Distillation(variant=method, teacher="t", on_raw_output=True)
    scaled = {id(c): 3 * c, id(g): 3 * g, id(t): t}
    assert loss(raw, 3.0) == pytest.approx(sum(mse(scaled[id(a)], scaled[id(b)]) for a, b in terms), rel=1e-6)
    np.testing.assert_array_equal(EnsembleStudent().embedding_norm()(3 * c), 3 * c)  # as given

def test_first_layers_is_the_teachers_intermediate_layer(tmp_path, minilm_dir):
    from sentemb_jax.encoder import SentenceEncoder

    hf = make_minilm_shaped_bert(tmp_path / "t", minilm_dir, layers=4)
    student = SentenceEncoder.from_pretrained(str(tmp_path / "t")).first_layers(2)
    texts = ["A man is playing a guitar.", "Two dogs run on the beach near the water."]
    enc = student.tokenizer(texts)
    with torch.no_grad():
        hidden = hf(input_ids=torch.tensor(np.asarray(enc["input_ids"])), attention_mask=torch.tensor(np.asarray(enc["attention_mask"])),
                    output_hidden_states=True).hidden_states[2].numpy()
    mask = np.asarray(enc["attention_mask"])[..., None]
    want = (hidden * mask).sum(1) / mask.sum(1)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(student.encode(texts, normalize_embeddings=True), want, atol=2e-5)
    student.save_pretrained(str(tmp_path / "s"))
    assert SentenceEncoder.from_pretrained(str(tmp_path / "s")).config.num_hidden_layers == 2
    with pytest.raises(ValueError, match="has 4 encoder layers"):
        SentenceEncoder.from_pretrained(str(tmp_path / "t")).first_layers(5)


# ------------------------------------------------------------------------------------------------
# Tiny runs of the gin jobs: a 4-layer random teacher, its first layer as the student.


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, data_dir, minilm_dir):
    root = tmp_path_factory.mktemp("qd")
    make_minilm_shaped_bert(root / "teacher", minilm_dir, layers=4, seed=0)
    make_minilm_shaped_bert(root / "teacher2", minilm_dir, layers=4, seed=1)
    files = []
    for name, rel, n in (("nli.tsv", "nli/sentences.tsv", 150), ("wiki.tsv", "unlabelled/wiki1m_head.tsv", 90)):
        lines = open(os.path.join(data_dir, rel), encoding="utf-8").read().splitlines()
        header = lines[0].split("\t")
        col = header.index("sentence")
        (root / name).write_text("sentence\n" + "\n".join(line.split("\t")[col] for line in lines[1 : n + 1]) + "\n",
                                 encoding="utf-8")
        files.append(str(root / name))
    return root, files


def _run(gin_file, root, files, out, data_dir, teacher="teacher", extra=(), cache="cache", expect_ok=True, method="ConGen"):
    cmd = [sys.executable, "-m", "sentemb_jax.main", f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{out}'",
           f"--gin.TEACHER='{root / teacher}'", "--gin.STUDENT_LAYERS=1", f"--gin.DATA_DIR='{data_dir}'",
           f"--gin.sentemb_jax.DataConfig.files={{'sentences': {files!r}}}", "--gin.NUM_STEPS=6",
           "--gin.sentemb_jax.DataConfig.batch_size=16", "--gin.sentemb_jax.DataConfig.sequence_length=32",
           "--gin.sentemb_jax.EvalConfig.every=None", "--gin.sentemb_jax.CheckpointConfig.every=3",
           "--gin.sentemb_jax.RunConfig.log_every=1", "--gin.sentemb_jax.ScheduleConfig.peak=1e-3",
           f"--gin.sentemb_jax.{method}.queue_size=40",
           f"--gin.sentemb_jax.{method}.cache_dir='{root / cache}'", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if not expect_ok:
        return proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    manager = ocp.CheckpointManager(os.path.join(out, "checkpoints"))
    state = manager.restore(manager.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    return lines, state


def test_congen_job_caches_teacher_per_teacher_and_fills_the_queue(tiny, tmp_path, data_dir):
    from sentemb_jax.encoder import SentenceEncoder

    root, files = tiny
    lines, state = _run("gin/congen.gin", root, files, str(tmp_path / "congen"), data_dir)
    assert [l["step"] for l in lines] == list(range(1, 7)) and all(np.isfinite(l["loss"]) for l in lines)
    # The cache: the teacher's embedding of every row, the two files read as one (row ids run across them).
    cached = [f for f in os.listdir(root / "cache") if f.endswith(".npy")]
    assert len(cached) == 1
    rows = np.load(root / "cache" / cached[0])
    texts = [line for f in files for line in open(f, encoding="utf-8").read().splitlines()[1:]]
    assert rows.shape == (240, 32)
    teacher = SentenceEncoder.from_pretrained(str(root / "teacher"), max_seq_length=32)
    np.testing.assert_allclose(rows[[0, 149, 150, 239]], teacher.encode([texts[i] for i in (0, 149, 150, 239)],
                                                                        normalize_embeddings=True), atol=1e-5)
    # Queue: 6 steps x 16 teacher rows into 40 slots; every entry is a teacher row.
    (queue,) = state["extra"]["queues"]
    assert int(queue["pointer"]) == (6 * 16) % 40
    values = np.asarray(queue["values"])
    assert np.abs(values[:, None, :] - rows[None]).max(axis=2).min(axis=1).max() <= 1e-6
    assert "projection" not in state["params"]["tower"]  # same width as the teacher: no student head
    # Another teacher never reuses this cache. (This student starts from random weights.)
    _, state2 = _run("gin/congen.gin", root, files, str(tmp_path / "congen2"), data_dir, teacher="teacher2",
                     extra=["--gin.sentemb_jax.TowerConfig.init_random=True"])
    assert len([f for f in os.listdir(root / "cache") if f.endswith(".npy")]) == 2
    from safetensors.numpy import load_file

    word = load_file(str(root / "teacher2" / "model.safetensors"))["embeddings.word_embeddings.weight"]
    tables = [np.asarray(x) for x in jax.tree_util.tree_leaves(state2["params"]["tower"]) if np.shape(x) == word.shape]
    assert len(tables) == 1 and np.abs(tables[0] - word).max() > 0.1  # not the teacher's (lr 1e-3 x 6 steps moves < 0.01)
    # The run directory loads as a SentenceEncoder: the teacher's first layer + the checkpoint's tower.
    student = SentenceEncoder.from_pretrained(str(tmp_path / "congen"))
    assert student.module.backbone_config.num_hidden_layers == 1 and student.params["backbone"].keys() == state["params"]["tower"]["backbone"].keys()
    for a, b in zip(jax.tree_util.tree_leaves(student.params), jax.tree_util.tree_leaves(state["params"]["tower"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert student.encode(["a man plays a guitar"]).shape == (1, 32)


@pytest.mark.parametrize("gin_file,view2", [("gin/sct.gin", None), ("gin/sct_distill.gin", None),
                                            ("gin/sct_distill.gin", "word_deletion")])
def test_sct_jobs_run_two_queues_and_a_projector(tiny, tmp_path, data_dir, gin_file, view2):
    """sct; sct_distill with its fixed view2 (the teacher's view2 embeddings cached: D2 holds only
    those rows) and with a view2 drawn anew each epoch (the teacher runs inside the step)."""
    root, files = tiny
    distill = gin_file.endswith("sct_distill.gin")
    # The default reference pass ('separate': f_ref's own no-gradient pass with its own dropout).
    extra = ["--gin.sentemb_jax.SCT.projector_expansion=2"]
    if view2:
        extra.append(f"--gin.sentemb_jax.DataConfig.views=('none', '{view2}')")
    cache = root / "cache"
    before = set(os.listdir(cache)) if cache.is_dir() else set()
    lines, state = _run(gin_file, root, files, str(tmp_path / "sct"), data_dir, extra=extra, method="SCT")
    assert [l["step"] for l in lines] == list(range(1, 7)) and all(np.isfinite(l["loss"]) for l in lines)
    q1, q2 = state["extra"]["queues"]
    assert int(q1["pointer"]) == int(q2["pointer"]) == (6 * 16) % 40
    # Filled by the two views' references: different rows, unit length.
    v1, v2 = np.asarray(q1["values"]), np.asarray(q2["values"])
    assert not np.allclose(v1, v2)
    np.testing.assert_allclose(np.linalg.norm(v1, axis=1), 1.0, atol=1e-5)
    assert np.asarray(state["params"]["projector"]["block0_up"]["kernel"]).shape == (32, 64)
    online = distill and view2 == "word_deletion"
    assert bool(state["extra"].get("teacher")) == online  # the teacher's weights ride in the state only when it runs in the step
    if distill and not online:
        from sentemb_jax.data import views  # the numpy route (DataConfig.reader default) draws the fixed words

        texts = [line for f in files for line in open(f, encoding="utf-8").read().splitlines()[1:]]
        fixed = views.fixed_view_texts(texts, "fixed:word_deletion", 0.1, 1)
        assert sum(a != b for a, b in zip(texts, fixed)) > 100  # 10% word deletion changed most sentences
        from sentemb_jax.encoder import SentenceEncoder

        teacher = SentenceEncoder.from_pretrained(str(root / "teacher"), max_seq_length=32)
        want = teacher.encode(fixed, normalize_embeddings=True)
        unit = want / np.linalg.norm(want, axis=1, keepdims=True)
        assert np.abs(v2[:, None, :] - unit[None]).max(axis=2).min(axis=1).max() <= 1e-5  # D2 = cached teacher rows
        new = {f for f in set(os.listdir(cache)) - before if f.endswith(".npy")}
        # One new cache file holds view2's rows (view1's may be new too when the ConGen test did not run first).
        assert 1 <= len(new) <= 2 and sum(np.load(cache / f).shape == want.shape and
                                          np.abs(np.load(cache / f) - want).max() <= 1e-5 for f in new) == 1


def test_nonfinite_batch_stops_or_is_skipped(tiny, tmp_path, data_dir, monkeypatch, capsys):
    """A NaN in the 5th batch (its teacher embeddings): by default the job stops - found at step 6,
    the next point that reads the device - naming step 5 and the batch's source lines, the last
    checkpoint (step 3) intact and finite and nothing of steps 5-6 saved; with
    RunConfig.skip_nonfinite=1 the batch is skipped (state unchanged), counted, and the run finishes.
    A cache file holding NaN rows is refused when read."""
    from sentemb_jax import main as runner
    from sentemb_jax.data.pipeline import InputPipeline
    from sentemb_jax.data.tasks import register_tasks
    from sentemb_jax.methods import queue_distill as qd
    from sentemb_jax.methods import teacher_cache

    root, files = tiny
    names = register_tasks(tokenizer_dir=str(root / "teacher"), data_dir=data_dir, files={"sentences": files},
                           views=("none", "word_deletion"), kinds=("sentences",))
    fifth = list(itertools.islice(iter(InputPipeline(names["sentences"], batch_size=16, sequence_length=32, seed=0)), 5))[-1]
    bad = int(fifth["row_id"][0])  # the first row of the train loop's 5th batch (seed 0: the job's order)
    where = f"{files[0]}:{bad + 2}" if bad < 150 else f"{files[1]}:{bad - 150 + 2}"  # header = line 1
    model_batch = qd.QueueDistill.model_batch

    def poisoned(self, batch):
        out = model_batch(self, batch)
        if bad in batch["row_id"]:
            out["teacher_view1"] = out["teacher_view1"].copy()
            out["teacher_view1"][list(batch["row_id"]).index(bad)] = np.nan
        return out

    monkeypatch.setattr(qd.QueueDistill, "model_batch", poisoned)
    args = ["--gin_file=gin/congen.gin", f"--gin.TEACHER='{root / 'teacher'}'", "--gin.STUDENT_LAYERS=1",
            f"--gin.DATA_DIR='{data_dir}'", f"--gin.sentemb_jax.DataConfig.files={{'sentences': {files!r}}}",
            "--gin.NUM_STEPS=6", "--gin.sentemb_jax.DataConfig.batch_size=16", "--gin.sentemb_jax.DataConfig.sequence_length=32",
            "--gin.sentemb_jax.EvalConfig.every=None", "--gin.sentemb_jax.CheckpointConfig.every=3",
            "--gin.sentemb_jax.RunConfig.log_every=1", "--gin.sentemb_jax.ConGen.queue_size=40",
            f"--gin.sentemb_jax.ConGen.cache_dir='{root / 'cache'}'"]
    out = tmp_path / "stop"  # logging every 4 steps: the flag of step 5 is read at step 6's checkpoint
    late = [a.replace("log_every=1", "log_every=4") for a in args]
    assert runner.main(late + [f"--gin.MODEL_DIR='{out}'"]) == 1
    err = capsys.readouterr().err
    assert "non-finite loss / gradient" in err and "at step 5; batch from" in err and where in err, err[-2000:]
    assert "last checkpoint: step 3" in err
    manager = ocp.CheckpointManager(str(out / "checkpoints"))
    assert manager.latest_step() == 3
    assert [json.loads(line)["step"] for line in open(out / "metrics.jsonl")] == [4]  # step 4 logged, nothing later
    state = manager.restore(3, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(state))

    skip = tmp_path / "skip"
    assert runner.main(args + [f"--gin.MODEL_DIR='{skip}'", "--gin.sentemb_jax.RunConfig.skip_nonfinite=1"]) == 0
    lines = [json.loads(line) for line in open(skip / "metrics.jsonl")]
    assert [l["step"] for l in lines] == list(range(1, 7)) and all(np.isfinite(l["loss"]) for l in lines)
    assert "skipped_batches" not in lines[3] and lines[4]["skipped_batches"] == lines[-1]["skipped_batches"] == 1
    manager = ocp.CheckpointManager(str(skip / "checkpoints"))
    state = manager.restore(6, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(state))
    assert int(state["extra"]["queues"][0]["pointer"]) == (6 * 16) % 40  # 6 steps from 7 batches: the bad one left no trace

    # A cache file with a NaN row is refused, naming the file.
    (npy,) = [f for f in os.listdir(root / "cache") if f.endswith(".npy") and np.load(root / "cache" / f).shape == (240, 32)][:1]
    rows = np.load(root / "cache" / npy)
    rows[7] = np.inf
    np.save(tmp_path / "bad.npy", rows)
    with pytest.raises(ValueError, match=r"bad\.npy: 1 row\(s\) hold NaN / inf \(rows \[7\]\)"):
        teacher_cache._checked_finite(np.load(tmp_path / "bad.npy"), str(tmp_path / "bad.npy"))


def test_warmup_fraction_schedule():
    from sentemb_jax.training.config import ScheduleConfig
    from sentemb_jax.training.optimizers import learning_rate_schedule

    s = learning_rate_schedule(ScheduleConfig(peak=1e-3, warmup_fraction=0.1), num_steps=100)
    assert [float(s(i)) for i in (0, 5, 10, 55, 100)] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4, 0.0], abs=1e-9)
    with pytest.raises(ConfigError, match=r"^sentemb_jax.ScheduleConfig\(warmup_fraction=1.5\): must be None or a number in \[0, 1\)$"):
        ScheduleConfig(warmup_fraction=1.5)


class _BagOfWords(flax.linen.Module):
    """A student whose embeddings numpy can compute: 3 x the masked mean of a token table (norm ~3, so
    the step's normalisation matters; no dropout)."""

    vocab: int = 11
    dim: int = 4

    @flax.linen.compact
    def __call__(self, ids, mask, deterministic=True):
        table = self.param("table", flax.linen.initializers.normal(1.0), (self.vocab, self.dim))
        m = mask[..., None].astype(jnp.float32)
        return 3.0 * (table[ids] * m).sum(1) / m.sum(1)


def _np_embed(table, ids, mask):
    m = mask[..., None].astype(np.float64)
    return 3.0 * (table[ids] * m).sum(1) / m.sum(1)


def _np_unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _np_enqueue(values, pointer, rows):
    """FIFO by hand: row i goes to slot (pointer + i) mod K; the pointer moves on by the rows."""
    out = np.array(values, np.float64)
    for i, row in enumerate(rows):
        out[(pointer + i) % len(out)] = row
    return out, (pointer + len(rows)) % len(out)


def _np_kl(target_logits, logits):
    p = np.exp(_log_softmax(target_logits))
    return np.mean((p * (np.log(p) - _log_softmax(logits))).sum(axis=1))


def _distill_batch(rng, b=4, length=5, vocab=11):
    batch = {}
    for side in ("view1", "view2"):
        batch[f"{side}_input_ids"] = rng.integers(1, vocab, (b, length)).astype(np.int32)
        batch[f"{side}_attention_mask"] = (np.arange(length)[None] < rng.integers(1, length + 1, (b, 1))).astype(np.int32)
    return batch


@pytest.mark.parametrize("method", ["congen", "sct"])
def test_one_distill_step_equals_numpy(method):
    """One `distill_step` of ConGen and of SCT against numpy: the student's embeddings, the
    normalisation `embedding_norm(cfg)` gives (unit length for both), the FIFO queues after the
    batch is enqueued (from pointer 4 of 6: slots 4, 5, 0, 1 - a wrap-around), and the loss taken
    over the updated queues (ConGen eq. 1 and SCT eq. 2: enqueue first, then the distributions)."""
    import functools

    import optax

    from sentemb_jax.methods.queue_distill import Projector

    rng = np.random.default_rng(5)
    batch = _distill_batch(rng)
    module = _BagOfWords()
    tower = module.init(jax.random.PRNGKey(0), jnp.asarray(batch["view1_input_ids"]), jnp.asarray(batch["view1_attention_mask"]))["params"]
    table = np.asarray(tower["table"], np.float64)
    z1 = _np_embed(table, batch["view1_input_ids"], batch["view1_attention_mask"])
    z2 = _np_embed(table, batch["view2_input_ids"], batch["view2_attention_mask"])
    assert np.linalg.norm(z1, axis=1).min() > 1.2  # not unit length: the step must normalise
    start = [_unit(rng, 6, 4) for _ in range(2 if method == "sct" else 1)]
    queues = tuple(iq.InstanceQueue(values=jnp.asarray(q), pointer=jnp.asarray(4, jnp.int32)) for q in start)
    if method == "congen":
        cfg = ConGen(teacher="t", queue_size=6, alpha=0.3)
        teacher_raw = 2.0 * rng.standard_normal((4, 4)).astype(np.float32)
        batch["teacher_view1"] = teacher_raw
        params = {"tower": tower}
    else:
        cfg = SCT(queue_size=6, projector_layers=1, projector_expansion=2)
        params = {"tower": tower, "projector": Projector(1, 2).init(jax.random.PRNGKey(1), jnp.zeros((1, 4)))["params"]}
    np.testing.assert_allclose(np.asarray(cfg.embedding_norm()(jnp.asarray([[3.0, 4.0]]))), [[0.6, 0.8]], rtol=1e-6)  # unit length
    optimizer = optax.sgd(0.1)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                       extra={"queues": queues, "teacher": None})
    step = jax.jit(functools.partial(cfg.step, module=module, optimizer=optimizer))
    new, metrics = step(state, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(3))

    u1, u2 = _np_unit(z1), _np_unit(z2)
    if method == "congen":
        t = _np_unit(teacher_raw.astype(np.float64))
        q, pointer = _np_enqueue(start[0], 4, t)
        expected_queues = [(q, pointer)]
        pt = np.exp(_log_softmax(t @ q.T / 0.05))
        ce = lambda s: float(np.mean(-(pt * _log_softmax(s @ q.T / 0.07)).sum(axis=1)))  # noqa: E731
        want = 0.3 * ce(u1) + 0.7 * ce(u2)
    else:
        # References: the student's own (unit) outputs, no gradient; they fill D1 / D2.
        d1, p1 = _np_enqueue(start[0], 4, u1)
        d2, p2 = _np_enqueue(start[1], 4, u2)
        expected_queues = [(d1, p1), (d2, p2)]
        proj = jax.device_get(params["projector"])

        def project(x):
            h = np.maximum(x @ np.asarray(proj["block0_up"]["kernel"], np.float64) + np.asarray(proj["block0_up"]["bias"]), 0)
            return _np_unit(h @ np.asarray(proj["block0_down"]["kernel"], np.float64) + np.asarray(proj["block0_down"]["bias"]))

        o1, o2 = project(u1), project(u2)
        # SCT eq. 2: view 1's online projection against D2 learns view 2's reference over D2, and vice versa.
        want = 0.5 * _np_kl(u2 @ d2.T / 0.02, o1 @ d2.T / 0.03) + 0.5 * _np_kl(u1 @ d1.T / 0.02, o2 @ d1.T / 0.03)
    assert float(metrics["loss"]) == pytest.approx(want, rel=1e-5)
    assert int(new.step) == 1
    assert len(new.extra["queues"]) == len(expected_queues)
    for got, (values, pointer), before in zip(new.extra["queues"], expected_queues, start):
        assert int(got.pointer) == pointer == 2
        np.testing.assert_allclose(np.asarray(got.values), values, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(got.values)[2:4], before[2:4])  # slots 2, 3 not reached: untouched
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(params)))
    assert moved > 0  # the step updated the student


class _DroppedBagOfWords(flax.linen.Module):
    """_BagOfWords with dropout (rate 0.5) on the token table: each pass's mask shows in its output."""

    vocab: int = 11
    dim: int = 4

    @flax.linen.compact
    def __call__(self, ids, mask, deterministic=True):
        table = self.param("table", flax.linen.initializers.normal(1.0), (self.vocab, self.dim))
        tokens = flax.linen.Dropout(0.5)(table[ids], deterministic=deterministic)
        m = mask[..., None].astype(jnp.float32)
        return 3.0 * (tokens * m).sum(1) / m.sum(1)


def test_sct_reference_pass_is_separate_with_its_own_dropout_by_default():
    """SCT section 3.1: the views are encoded again by f_ref. The queues hold the references, so
    they show which pass made them: the default 'separate' pass has dropout on (not the dropout-free
    embeddings) with a mask of its own (not the online pass's outputs, which 'online' enqueues);
    'separate_no_dropout' enqueues exactly the dropout-free embeddings (numpy)."""
    import functools

    import optax

    from sentemb_jax.methods.queue_distill import Projector

    assert SCT().reference_pass == "separate"
    with pytest.raises(ConfigError, match="reference_pass"):
        SCT(reference_pass="twice")
    rng = np.random.default_rng(7)
    batch = {k: jnp.asarray(v) for k, v in _distill_batch(rng, b=6, length=6).items()}
    module = _DroppedBagOfWords()
    tower = module.init(jax.random.PRNGKey(0), batch["view1_input_ids"], batch["view1_attention_mask"])["params"]
    clean = [_np_unit(_np_embed(np.asarray(tower["table"], np.float64), np.asarray(batch[f"{s}_input_ids"]),
                                np.asarray(batch[f"{s}_attention_mask"]))) for s in ("view1", "view2")]
    params = {"tower": tower, "projector": Projector(1, 2).init(jax.random.PRNGKey(1), jnp.zeros((1, 4)))["params"]}
    optimizer = optax.sgd(0.1)
    enqueued = {}
    for mode in ("separate", "online", "separate_no_dropout"):
        cfg = SCT(queue_size=6, projector_layers=1, projector_expansion=2, reference_pass=mode)
        queues = tuple(iq.InstanceQueue(values=jnp.zeros((6, 4)), pointer=jnp.asarray(0, jnp.int32)) for _ in range(2))
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                           extra={"queues": queues, "teacher": None})
        new, metrics = jax.jit(functools.partial(cfg.step, module=module, optimizer=optimizer))(
            state, batch, jax.random.PRNGKey(3))
        assert np.isfinite(float(metrics["loss"]))
        enqueued[mode] = [np.asarray(q.values, np.float64) for q in new.extra["queues"]]
    for got, want in zip(enqueued["separate_no_dropout"], clean):
        np.testing.assert_allclose(got, want, atol=1e-5)
    for view in range(2):
        sep, onl = enqueued["separate"][view], enqueued["online"][view]
        np.testing.assert_allclose(np.linalg.norm(sep, axis=1), 1.0, atol=1e-5)
        assert np.abs(sep - clean[view]).max() > 0.1  # dropout on in the reference pass
        assert np.abs(onl - clean[view]).max() > 0.1
        assert np.abs(sep - onl).max() > 0.1  # its own mask, not the online pass's

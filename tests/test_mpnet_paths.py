"""MPNet beyond encode: a tiny random MPNet with all-mpnet-base-v2's tokenizer exported to ONNX
(padded and packed graphs) and run by ONNX Runtime gives our float32 embeddings (1e-5); trained with
the in-batch softmax (padded and packed) its first loss is the one PyTorch computes from Hugging
Face's MPNetModel (1e-4) and a few steps lower it; and as the teacher of a BERT student (the mixed
families of a real distillation: two tokenizers) ConGen and SCT cache the teacher's own embeddings
(1e-5), ConGen's first loss is numpy's and both losses fall. Models: 2 layers, width 32; real
sentences."""
from __future__ import annotations

import collections
import os

import jax
import numpy as np
import onnx
import pytest
import torch
from hf_models import make_minilm_shaped_bert, make_mpnet
from transformers import AutoTokenizer

from sentemb_jax import SentenceEncoder
from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.methods.queue_distill import SCT, ConGen
from sentemb_jax.models import MPNetConfig
from sentemb_jax.training.config import DataConfig, EvalConfig, OptimizerConfig, RunConfig, ScheduleConfig, TowerConfig
from sentemb_jax.training.setup import setup_run

pytestmark = pytest.mark.fast_compile  # tiny models, a few steps: compile-bound (tests/conftest.py)

LAYERS = 2
SEQ = 32
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
TEXTS = ["", "hi", "Two dogs run.", "A man is playing a guitar.", "A woman is slicing an onion in the kitchen.",
         "Someone makes music on a stringed instrument, loudly and with joy.",
         "The quick brown fox jumps over the lazy dog near the river bank in the evening.",
         "Dr. Smith's café—open 24/7—serves crème brûlée; isn't that wonderful?",
         "A group of children are playing soccer in a park while their parents watch from the benches nearby.",
         " ".join(["word"] * 120)]  # longer than the tiny model's 78 positions: cut
PAIRS = [("A man is playing a guitar.", "Someone plays music on a stringed instrument."),
         ("Two dogs run across the grassy field.", "Animals are running outside."),
         ("A woman slices an onion in the kitchen.", "Someone is cooking."),
         ("The children are sleeping.", "Kids are asleep in their beds at night."),
         ("A cat sits on the sofa.", "An animal rests on furniture."),
         ("The train leaves the station at noon.", "A train departs."),
         ("He reads a long book about the history of Rome.", "A man is reading."),
         ("Rain falls on the city.", "It is raining downtown and the streets are wet.")]


@pytest.fixture(scope="module")
def models(mpnet_dir, minilm_dir, data_dir, tmp_path_factory):
    """A tiny random MPNet (real tokenizer; its torch reference), the same as a sentence-transformers
    directory ending in Normalize, a BERT student of its width with MiniLM's WordPiece (and its torch
    reference), and 40 NLI sentences as a `sentences` file."""
    root = tmp_path_factory.mktemp("mpnet_paths")
    mpnet = str(root / "mpnet")
    ref = make_mpnet(mpnet, pooler=False, tokenizer_dir=mpnet_dir, layers=LAYERS)
    st = str(root / "mpnet_st")
    SentenceEncoder.from_pretrained(mpnet, normalize=True).save_pretrained(st)
    bert = make_minilm_shaped_bert(root / "bert", minilm_dir, layers=LAYERS, hidden=32, dropout=0.0)
    with open(os.path.join(data_dir, "nli", "sentences.tsv"), encoding="utf-8") as f:
        header, *lines = f.read().splitlines()[:41]
    col = header.split("\t").index("sentence")
    sentences = [line.split("\t")[col] for line in lines]
    (root / "sentences.tsv").write_text("sentence\n" + "\n".join(sentences) + "\n", encoding="utf-8")
    return dict(root=root, mpnet=mpnet, ref=ref, st=st, bert=str(root / "bert"), bert_ref=bert, sentences=sentences,
                file=str(root / "sentences.tsv"))


def _torch_mean(model, ids, mask):
    with torch.no_grad():
        h = model(input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long),
                  attention_mask=torch.as_tensor(np.asarray(mask), dtype=torch.long)).last_hidden_state.double()
    m = torch.as_tensor(np.asarray(mask))[..., None].double()
    return ((h * m).sum(1) / m.sum(1)).numpy()


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


# ------------------------------------------------------------------------------------------------
# ONNX


def test_onnx_padded_and_packed_equal_our_encode(models, tmp_path):
    """export_onnx of the MPNet encoder (its relative-position bias traced with symbolic lengths),
    padded and packed, run by ONNX Runtime: our float32 embeddings within 1e-5; every dot a MatMul
    (8 per layer), one Gelu per layer, no Einsum; load_encoder(backend='onnx') in one call too."""
    from sentemb_jax.onnx_export import export_onnx, load_encoder, onnx_encoder

    enc = SentenceEncoder.from_pretrained(models["mpnet"])
    assert isinstance(enc.config, MPNetConfig) and enc.tokenizer.max_length == 78
    assert len(enc.tokenizer.hf(TEXTS[-1])["input_ids"]) > 78  # the long text is cut
    ours = enc.encode(TEXTS)
    diffs = {}
    for packed in (False, True):
        path = export_onnx(enc, str(tmp_path), packed=packed)
        assert path.endswith("model_packed.onnx" if packed else "model.onnx")
        ops = collections.Counter(node.op_type for node in onnx.load(path, load_external_data=False).graph.node)
        assert (ops["MatMul"], ops["Einsum"], ops["Gelu"]) == (8 * LAYERS, 0, LAYERS), dict(ops)
        fast = onnx_encoder(enc, path)
        assert fast.packed == packed
        diffs[packed] = float(np.abs(fast.encode(TEXTS) - ours).max())
        assert diffs[packed] <= 1e-5, diffs
        np.testing.assert_allclose(fast.encode(TEXTS[2:6], batch_size=2), enc.encode(TEXTS[2:6]), atol=1e-5)
    print(f"onnx: max |ORT - ours| padded {diffs[False]:.2e}, packed {diffs[True]:.2e}")
    one_call = load_encoder(models["mpnet"], backend="onnx")
    assert one_call.packed and "_embed_packed" in vars(one_call)
    np.testing.assert_allclose(one_call.encode(TEXTS), ours, atol=1e-5)
    # And ours is Hugging Face's (so the graph is too): mean of MPNetModel's last layer.
    feats = enc.tokenizer.hf(TEXTS, padding=True, truncation=True, max_length=78, return_tensors="np")
    assert np.abs(_torch_mean(models["ref"], feats["input_ids"], feats["attention_mask"]) - ours).max() <= 1e-4


# ------------------------------------------------------------------------------------------------
# Training: the in-batch softmax


def _config(init_from, data: DataConfig, overrides=None) -> RunConfig:
    return RunConfig(model_dir="/unused", num_steps=50, model=TowerConfig(init_from=init_from, config_overrides=overrides),
                     data=data, optimizer=OptimizerConfig(name="adamw"),
                     schedule=ScheduleConfig(peak=1e-3, decay="constant"), evaluation=EvalConfig(every=None))


def _steps(run, batch, n):
    """n steps on one batch from the run's start: losses, the state before the first step (on the
    host), the step's batch, the state after the last step."""
    state = run.initial_state()
    before = jax.device_get(state)  # the step donates its state
    losses = []
    with run.context():
        placed = run.device_batch(batch)
        for _ in range(n):
            state, metrics = run.step_fn(state, placed, run.rng())
            losses.append(float(metrics["loss"]))
    return losses, before, placed, state


def _falling(losses) -> bool:
    return bool(np.isfinite(losses).all()) and all(later < earlier for earlier, later in zip(losses, losses[1:]))


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_contrastive_first_loss_equals_torch_and_steps_lower_it(models, pack):
    """An MPNet sentence-transformers directory (mean pooling, Normalize) as TowerConfig.init_from,
    dropout set to 0 by config_overrides: the first step's in-batch softmax loss (8 pairs, tau 0.05)
    equals cross-entropy over cos / tau of HF MPNetModel's mean-pooled embeddings (torch, float64
    after the model) within 1e-4; 5 AdamW steps on that batch lower it at every step."""
    tok = AutoTokenizer.from_pretrained(models["mpnet"])
    feats = tok([a for a, _ in PAIRS] + [p for _, p in PAIRS], padding=True, return_tensors="np")
    ids, mask, b = feats["input_ids"].astype(np.int32), feats["attention_mask"].astype(np.int32), len(PAIRS)
    assert ids[0, -1] == 1 and tok.pad_token_id == 1  # MPNet pads with 1 (its positions count from 2)
    batch = {"anchor_input_ids": ids[:b], "anchor_attention_mask": mask[:b],
             "positive_input_ids": ids[b:], "positive_attention_mask": mask[b:]}
    e = torch.as_tensor(_unit(_torch_mean(models["ref"], ids, mask)))
    want = float(torch.nn.functional.cross_entropy(e[:b] @ e[b:].T / 0.05, torch.arange(b)))

    run = setup_run(_config(models["st"], DataConfig(batch_size=b, sequence_length=SEQ, pack=pack), NO_DROPOUT),
                    Contrastive(), batches=[batch])
    cfg = run.module.backbone_config
    assert isinstance(cfg, MPNetConfig) and run.module.normalize
    assert (cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob) == (0.0, 0.0)  # the directory's: 0.1
    losses, _, placed, _ = _steps(run, batch, 5)
    assert ("packed_input_ids" in placed) == pack
    print(f"contrastive {'packed' if pack else 'padded'}: torch {want:.6f}, losses {losses}")
    assert abs(losses[0] - want) <= 1e-4
    assert _falling(losses) and losses[-1] < 0.5 * losses[0]


# ------------------------------------------------------------------------------------------------
# Distillation: an MPNet teacher, a BERT student


def _distill_run(models, method, views):
    data = DataConfig(task="sentences", files={"sentences": [models["file"]]}, views=views, batch_size=8,
                      sequence_length=SEQ, fixed_padding=True)
    return setup_run(_config(models["bert"], data), method)


def _teacher_rows(models, texts):
    """The teacher's own encode (max_seq_length = the run's), and HF MPNetModel's mean (torch)."""
    teacher = SentenceEncoder.from_pretrained(models["mpnet"], max_seq_length=SEQ)
    feats = teacher.tokenizer.hf(texts, padding=True, truncation=True, max_length=SEQ, return_tensors="np")
    return teacher.encode(texts, normalize_embeddings=True), _unit(_torch_mean(models["ref"], feats["input_ids"],
                                                                               feats["attention_mask"]))


def _cached(cache_dir, rows):
    """The .npy file of `cache_dir` holding exactly `rows`."""
    found = [f for f in os.listdir(cache_dir) if f.endswith(".npy") and np.array_equal(np.load(os.path.join(cache_dir, f)), rows)]
    return len(found) == 1


def test_congen_mpnet_teacher_bert_student(models, tmp_path):
    """ConGen, MPNet teacher -> BERT student (its own WordPiece): the cached teacher rows are the
    teacher's encode (1e-5) and HF MPNetModel's (1e-5); the first loss is ConGen eq. 1 in numpy
    from torch's student embeddings and the queue after the batch went in (1e-4); 5 steps on that
    batch lower it at every step."""
    cache = str(tmp_path / "cache")
    run = _distill_run(models, ConGen(teacher=models["mpnet"], queue_size=16, cache_dir=cache), ("none", "word_deletion"))
    rows = run.method._rows
    ours, hf = _teacher_rows(models, models["sentences"])
    assert rows.shape == (40, 32) and _cached(cache, rows)
    print(f"congen cache: vs encode {np.abs(rows - ours).max():.2e}, vs torch {np.abs(rows - hf).max():.2e}")
    assert np.abs(rows - ours).max() <= 1e-5 and np.abs(rows - hf).max() <= 1e-5
    assert run.module.projection_dim is None  # one width: no student head

    batch = next(iter(run.batches))
    losses, before, placed, _ = _steps(run, batch, 5)
    np.testing.assert_array_equal(np.asarray(placed["teacher_view1"]), rows[batch["row_id"]])
    z = {s: _unit(_torch_mean(models["bert_ref"], batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"]))
         for s in ("view1", "view2")}
    (queue,) = before.extra["queues"]
    values, t = np.array(queue.values, np.float64), _unit(rows[batch["row_id"]])
    values[(int(queue.pointer) + np.arange(8)) % 16] = t  # FIFO: the batch's teacher rows go in first
    p_teacher = np.exp(_log_softmax(t @ values.T / 0.05))
    ce = lambda s: float(np.mean(-(p_teacher * _log_softmax(s @ values.T / 0.07)).sum(axis=1)))  # noqa: E731
    want = 0.5 * ce(z["view1"]) + 0.5 * ce(z["view2"])
    print(f"congen: numpy {want:.6f}, losses {losses}")
    assert abs(losses[0] - want) <= 1e-4 and _falling(losses)


def test_sct_distillation_mpnet_teacher_bert_student(models, tmp_path):
    """SCT with a teacher (gin/sct_distill.gin's views: view2 a fixed 10% word deletion), MPNet
    teacher -> BERT student of another vocabulary: both views' teacher rows are cached, each the
    teacher's encode of that view (1e-5) and HF's (1e-5), the queues take them in, and 5 steps on
    one batch lower the loss. A view2 drawn anew each epoch would run the teacher on the student's
    ids: that mix is refused, naming the vocabulary."""
    from sentemb_jax.data import views

    cache = str(tmp_path / "cache")
    method = SCT(teacher=models["mpnet"], queue_size=16, projector_layers=1, projector_expansion=2, cache_dir=cache)
    run = _distill_run(models, method, ("none", "fixed:word_deletion"))
    assert method.kind == "sct_distill" and not method.online_teacher
    fixed = views.fixed_view_texts(models["sentences"], "fixed:word_deletion", 0.1, 1)
    assert sum(a != b for a, b in zip(models["sentences"], fixed)) > 20  # most sentences lost a word
    for rows, texts in ((method._rows, models["sentences"]), (method._rows2, fixed)):
        ours, hf = _teacher_rows(models, texts)
        assert rows.shape == (40, 32) and _cached(cache, rows)
        print(f"sct cache: vs encode {np.abs(rows - ours).max():.2e}, vs torch {np.abs(rows - hf).max():.2e}")
        assert np.abs(rows - ours).max() <= 1e-5 and np.abs(rows - hf).max() <= 1e-5
    assert np.abs(method._rows - method._rows2).max() > 0.01

    batch = next(iter(run.batches))
    losses, _, placed, state = _steps(run, batch, 5)
    np.testing.assert_array_equal(np.asarray(placed["teacher_view2"]), method._rows2[batch["row_id"]])
    print(f"sct: losses {losses}")
    assert _falling(losses)
    for queue, rows in zip(state.extra["queues"], (method._rows, method._rows2)):  # 5 x the batch's 8 rows into 16 slots
        values = np.asarray(queue.values)
        assert int(queue.pointer) == (5 * 8) % 16
        assert np.abs(values[:, None, :] - _unit(rows[batch["row_id"]])[None]).max(axis=2).min(axis=1).max() <= 1e-6

    online = SCT(teacher=models["mpnet"], queue_size=16, projector_layers=1, projector_expansion=2, cache_dir=cache)
    with pytest.raises(ValueError, match="drawn anew each epoch runs the teacher on the student's token ids"):
        _distill_run(models, online, ("none", "word_deletion"))

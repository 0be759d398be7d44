"""Trans-Encoder (Liu et al. 2022): bi-encoder <-> cross-encoder self- and mutual distillation.

Pure pieces (tested against hand-computed values in tests/test_trans_encoder.py):
* pseudo-labels: `bi_encoder_scores` (cosine of the two sentence embeddings) and
  `cross_encoder_scores` (sigmoid of the logits of both pair orders, averaged); mutual distillation
  averages the labels of every model (`mutual_labels`);
* losses (paper, Table 8): bi -> cross soft binary cross-entropy on the logits (`soft_bce_loss`),
  cross -> bi mean squared error between cosine and label (`cosine_mse_loss`); the other
  configurations (`mse` for bi -> cross on sigmoid(logit), `bce` for cross -> bi on the cosine
  clipped into (0, 1)) exist for the ablation;
* `relabel`: optional transforms of the pseudo-labels (the paper uses them raw).
One step function per direction: `cross_step` (bi -> cross) and `bi_step` (cross -> bi).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from sentemb_jax import validation as v
from sentemb_jax.data.files import iter_tsv, read_sts_pairs
from sentemb_jax.data.packing import packing_inputs
from sentemb_jax.errors import DataError
from sentemb_jax.evaluation.pairs import pair_auc, pair_scores
from sentemb_jax.evaluation.readers import read_labelled_pairs
from sentemb_jax.evaluation.sts import correlations
from sentemb_jax.pooling import l2_normalize
from sentemb_jax.training import trainer
from sentemb_jax.training.config import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    MeshConfig,
    OptimizerConfig,
    RunConfig,
    ScheduleConfig,
)
from sentemb_jax.training.loop import host_params
from sentemb_jax.training.method import Method, TrainState, side_features
from sentemb_jax.training.step import apply_gradients, embed_packed

log = logging.getLogger(__name__)
Array = jax.Array
_EPS = 1e-6
BI_TO_CROSS_LOSSES = ("bce", "mse")
CROSS_TO_BI_LOSSES = ("mse", "bce")
RELABEL_MODES = ("none", "minmax", "standardize")


def bi_encoder_scores(emb1: Array, emb2: Array) -> Array:
    """Cosine similarity of paired rows [n, d] x [n, d] -> [n] (float32)."""
    return jnp.sum(l2_normalize(emb1) * l2_normalize(emb2), axis=-1)


def cross_encoder_scores(logits_12: Array, logits_21: Array) -> Array:
    """Cross-encoder pseudo-labels: sigmoid of (s1, s2) and (s2, s1) logits, averaged."""
    return (jax.nn.sigmoid(logits_12.astype(jnp.float32)) + jax.nn.sigmoid(logits_21.astype(jnp.float32))) / 2


def mutual_labels(labels: Sequence[np.ndarray]) -> np.ndarray:
    """Mutual distillation: every model learns the mean of all models' pseudo-labels."""
    if not labels:
        raise ValueError("mutual_labels: no label sets given")
    shapes = {np.shape(x) for x in labels}
    if len(shapes) != 1:
        raise ValueError(f"mutual_labels: label sets of different shapes {sorted(shapes)}")
    return np.mean(np.stack([np.asarray(x, np.float32) for x in labels]), axis=0)


def relabel(labels: np.ndarray, mode: str = "none", target_mean: float = 0.5, target_std: float = 0.2) -> np.ndarray:
    """Transform pseudo-labels before the next model learns them.

    none: as they are (the paper). minmax: linearly onto [0, 1]. standardize: to mean
    `target_mean` and std `target_std`, clipped into [0, 1] (a bi-encoder's cosines can bunch near
    0.9, giving a soft-BCE target with almost no spread).
    """
    x = np.asarray(labels, np.float64)
    if mode == "none":
        out = x
    elif mode == "minmax":
        span = x.max() - x.min()
        out = (x - x.min()) / span if span > 0 else np.full_like(x, 0.5)
    elif mode == "standardize":
        std = x.std()
        out = np.clip((x - x.mean()) / std * target_std + target_mean if std > 0 else np.full_like(x, target_mean), 0.0, 1.0)
    else:
        raise ValueError(f"relabel mode {mode!r}: choose from {RELABEL_MODES}")
    return out.astype(np.float32)


def soft_bce_loss(logits: Array, targets: Array) -> Array:
    """Binary cross-entropy with soft targets in [0, 1] on logits (bi -> cross, the paper's choice)."""
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), targets.astype(jnp.float32)))


def sigmoid_mse_loss(logits: Array, targets: Array) -> Array:
    """MSE between sigmoid(logit) and the target (bi -> cross ablation, Table 8)."""
    return jnp.mean(jnp.square(jax.nn.sigmoid(logits.astype(jnp.float32)) - targets.astype(jnp.float32)))


def cosine_mse_loss(emb1: Array, emb2: Array, targets: Array) -> Array:
    """MSE between the pair's cosine and the target (cross -> bi, the paper's choice)."""
    return jnp.mean(jnp.square(bi_encoder_scores(emb1, emb2) - targets.astype(jnp.float32)))


def cosine_bce_loss(emb1: Array, emb2: Array, targets: Array) -> Array:
    """BCE with the cosine, clipped into (0, 1), as the probability (cross -> bi ablation, Table 8)."""
    p = jnp.clip(bi_encoder_scores(emb1, emb2), _EPS, 1 - _EPS)
    t = targets.astype(jnp.float32)
    return -jnp.mean(t * jnp.log(p) + (1 - t) * jnp.log1p(-p))


def _cross_features(batch: dict) -> dict:
    if "packed_input_ids" in batch:  # whole pairs packed into rows (CrossEncoder.packed_features)
        return {"input_ids": batch["packed_input_ids"], "attention_mask": None,
                "token_type_ids": batch.get("packed_token_type_ids"), "packing": packing_inputs(batch)}
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}


def cross_step(state: TrainState, batch: dict, rng: Array, *, module: nn.Module, optimizer, loss: str = "bce"):
    """bi -> cross: one step of the cross-encoder (params["tower"]) on (pair features, `labels`);
    `batch` may carry the packed form of the pairs (CrossEncoder.packed_features)."""
    if loss not in BI_TO_CROSS_LOSSES:
        raise ValueError(f"bi->cross loss {loss!r}: choose from {BI_TO_CROSS_LOSSES}")
    rng = jax.random.fold_in(rng, state.step)
    features = _cross_features(batch)

    def loss_fn(params):
        logits = module.apply({"params": params["tower"]}, **features, deterministic=False, rngs={"dropout": rng})
        return (soft_bce_loss if loss == "bce" else sigmoid_mse_loss)(logits, batch["labels"])

    value, grads = jax.value_and_grad(loss_fn)(state.params)
    return apply_gradients(state, value, grads, optimizer)


def bi_step(state: TrainState, batch: dict, rng: Array, *, module: nn.Module, optimizer, loss: str = "mse"):
    """cross -> bi: one step of the bi-encoder (a SentenceEmbedder, params["tower"]) on (sentence
    pairs, `labels`); `batch` may carry the packed form of both sides (sentemb_jax.data.packing)."""
    if loss not in CROSS_TO_BI_LOSSES:
        raise ValueError(f"cross->bi loss {loss!r}: choose from {CROSS_TO_BI_LOSSES}")
    rng = jax.random.fold_in(rng, state.step)

    def loss_fn(params):
        tower = params["tower"]
        if "packed_input_ids" in batch:  # both sides in one call over packed rows
            e1, e2 = embed_packed(module, tower, batch, rng, ["sentence1", "sentence2"]).values()
        else:
            embed = lambda side, i: module.apply(  # noqa: E731
                {"params": tower}, batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"], False,
                rngs={"dropout": jax.random.fold_in(rng, i)})
            e1, e2 = embed("sentence1", 0), embed("sentence2", 1)
        return (cosine_mse_loss if loss == "mse" else cosine_bce_loss)(e1, e2, batch["labels"])

    value, grads = jax.value_and_grad(loss_fn)(state.params)
    return apply_gradients(state, value, grads, optimizer)


@dataclasses.dataclass
class CrossEncoderPhase(Method):
    """bi -> cross: the cross-encoder learns the bi-encoder's pseudo-labels of the pairs (soft BCE
    on its logits, the paper's choice; 'mse' on sigmoid(logit) for the ablation). Batches: whole
    pairs (CrossEncoder.features, packed), with `labels`."""

    loss: str = "bce"
    sides = ()

    def __post_init__(self):
        v.require_choice(self.loss, BI_TO_CROSS_LOSSES, "sentemb_jax.CrossEncoderPhase", "loss")

    def batch_features(self, batch_size: int, sequence_length: int) -> dict:
        ids = jax.ShapeDtypeStruct((batch_size, sequence_length), jnp.int32)
        return {"input_ids": ids, "attention_mask": ids, "labels": jax.ShapeDtypeStruct((batch_size,), jnp.float32)}

    def model_batch(self, batch: dict) -> dict:
        return {k: x for k, x in batch.items() if k != PAIR_ROWS}

    def step(self, state, batch, rng, *, module, optimizer):
        return cross_step(state, batch, rng, module=module, optimizer=optimizer, loss=self.loss)


@dataclasses.dataclass
class BiEncoderPhase(Method):
    """cross -> bi: the bi-encoder learns the cross-encoder's pseudo-labels (MSE between the pair's
    cosine and the label, the paper's choice; 'bce' on the clipped cosine for the ablation)."""

    loss: str = "mse"
    sides = ("sentence1", "sentence2")

    def __post_init__(self):
        v.require_choice(self.loss, CROSS_TO_BI_LOSSES, "sentemb_jax.BiEncoderPhase", "loss")

    def batch_features(self, batch_size: int, sequence_length: int) -> dict:
        return {"labels": jax.ShapeDtypeStruct((batch_size,), jnp.float32)}

    def model_batch(self, batch: dict) -> dict:
        return {**side_features(batch, self.sides), "labels": batch["labels"]}

    def step(self, state, batch, rng, *, module, optimizer):
        return bi_step(state, batch, rng, module=module, optimizer=optimizer, loss=self.loss)


# ------------------------------------------------------------------------------------------------
# The phases: their settings, the pair files, the evaluation sets, one phase's fit (the job that
# runs cycles of them is sentemb_jax.jobs.trans_encoder).

SCHEDULES = ("refresh", "sequential")
PAIR_ROWS = "pair_rows"  # a phase batch's example indices: what describe() names; not a step input


@dataclasses.dataclass(frozen=True)
class DistillPhase:
    """One direction's settings (defaults: the paper's Table 16, STS, base models: bi -> cross):
    the batch, epochs and length; the learning rate, warmed up over `warmup_ratio` of the phase and
    decayed linearly to 0; the optimizer (AdamW, weight decay 0.01, gradient clipping at 1.0, as
    the paper's sentence-transformers code); the relabelling of the pseudo-labels it learns."""

    learning_rate: float = 2e-5
    batch_size: int = 32
    epochs: int = 1
    max_length: int = 64
    loss: str = "bce"
    warmup_ratio: float = 0.1
    relabel: str = "none"  # transform of the pseudo-labels this phase learns (see `relabel`)
    optimizer: OptimizerConfig = OptimizerConfig(name="adamw", clip_norm=1.0, weight_decay=0.01)

    def __post_init__(self):
        api = "sentemb_jax.DistillPhase"
        v.require_number(self.learning_rate, api, "learning_rate", 0, low_open=True)
        v.require_int(self.batch_size, api, "batch_size", 1)
        v.require_int(self.epochs, api, "epochs", 1)
        v.require_int(self.max_length, api, "max_length", 2)
        v.require_number(self.warmup_ratio, api, "warmup_ratio", 0, 1, high_open=True)
        v.require_choice(self.relabel, RELABEL_MODES, api, "relabel")
        if not isinstance(self.optimizer, OptimizerConfig):
            v.fail(self.optimizer, api, "optimizer", "must be an OptimizerConfig (e.g. @sentemb_jax.OptimizerConfig())")


def bi_to_cross_defaults() -> DistillPhase:
    return DistillPhase()


def cross_to_bi_defaults() -> DistillPhase:
    return DistillPhase(learning_rate=5e-5, batch_size=128, epochs=10, max_length=32, loss="mse")


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """A labelled pair file: `sts` (Spearman x 100 against scores) or `pairs` (ROC AUC x 100 against 0/1 labels)."""

    name: str
    path: str
    kind: str = "sts"
    rows: tuple[int | None, int | None] = (None, None)


def read_unlabelled_pairs(paths: Sequence[str]) -> list[tuple[str, str]]:
    """(sentence1, sentence2) of every row of the TSV files (score / label columns dropped), exact duplicates removed."""
    seen, pairs = set(), []
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"{path}: unlabelled pair file not found")
        for lineno, row in iter_tsv(path, ("sentence1", "sentence2")):
            a, b = row["sentence1"], row["sentence2"]
            if not a.strip() or not b.strip():
                raise DataError(f"{path}:{lineno}: empty {'sentence1' if not a.strip() else 'sentence2'}")
            if (a, b) not in seen:
                seen.add((a, b))
                pairs.append((a, b))
    if not pairs:
        raise DataError(f"no sentence pairs in {list(paths)}")
    return pairs


@functools.lru_cache(maxsize=16)
def _read_eval_set(ev: EvalSet) -> tuple[list[str], list[str], np.ndarray]:
    """The rows of an eval set, read once per job (it is scored after every epoch and phase)."""
    if ev.kind not in ("sts", "pairs"):
        raise ValueError(f"eval set {ev.name}: kind {ev.kind!r} (choose 'sts' or 'pairs')")
    s1, s2, gold = read_sts_pairs(ev.path) if ev.kind == "sts" else read_labelled_pairs(ev.path)
    rows = slice(*ev.rows)
    return s1[rows], s2[rows], gold[rows]


def score_eval_set(model, ev: EvalSet) -> float:
    s1, s2, gold = _read_eval_set(ev)
    scores = pair_scores(model, s1, s2)
    name = f"evaluation set {getattr(ev, 'name', None) or getattr(ev, 'path', '')}"
    return correlations(scores, gold, name)["spearman"] if ev.kind == "sts" else pair_auc(scores, gold, name)


class PairBatches:
    """The loop's batch source for a phase: batches of `batch_size` examples (with their labels)
    over the in-memory examples, a new permutation each epoch (seed + epoch), the last batch of an
    epoch short; its position is the number of batches taken (saved with each checkpoint)."""

    def __init__(self, examples: list, labels: np.ndarray, batch_size: int, seed: int, features: Callable, name: str):
        self.examples, self.labels, self.batch_size, self.seed = examples, np.asarray(labels, np.float32), batch_size, seed
        self.features, self.name = features, name
        self.per_epoch = math.ceil(len(examples) / batch_size)
        self.position = 0
        self._order: tuple[int, np.ndarray] | None = None

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        epoch, b = divmod(self.position, self.per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng(self.seed + epoch).permutation(len(self.examples)))
        rows = self._order[1][b * self.batch_size : (b + 1) * self.batch_size]
        self.position += 1
        return {**self.features([self.examples[i] for i in rows]), "labels": self.labels[rows], PAIR_ROWS: rows}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])

    def describe(self, batch) -> str:
        """The pairs of `batch` (its own rows: the loop's input thread may have taken later batches)."""
        rows = np.asarray(batch[PAIR_ROWS])
        return f"{self.name}, pairs {rows[:8].tolist()}" + (" ..." if len(rows) > 8 else "")


def fit_phase(name: str, out_dir: str, model, method: Method, examples: list, labels: np.ndarray, features: Callable,
              phase: DistillPhase, seed: int, evaluator, checkpoint_every: int, keeper, mesh: MeshConfig = MeshConfig()):
    """Train one phase of `model` (a CrossEncoder or SentenceEncoder with its start params) in the
    train loop through the run setup (mesh, shardings and optimizer from `phase` and `mesh`);
    resumable from out_dir/checkpoints. Returns (last tower params, {"best": dev, "history": [one
    entry per epoch]}).

    `evaluator(params)` (with `metric` and `label`, as the loop's evaluators) is scored at each
    epoch end; `keeper.save(state, score)` is called when it beats the phase's best so far (the caller
    keeps the best over all phases)."""
    batches = PairBatches(examples, labels, phase.batch_size, seed, features, name)
    total = batches.per_epoch * phase.epochs
    config = RunConfig(
        model_dir=out_dir, num_steps=total, model=None,
        data=DataConfig(batch_size=phase.batch_size, sequence_length=phase.max_length, seed=seed,
                        pack=isinstance(method, BiEncoderPhase), same_length=False),
        optimizer=phase.optimizer,
        schedule=ScheduleConfig(peak=phase.learning_rate, warmup_steps=int(phase.warmup_ratio * total), total_steps=total),
        mesh=mesh, checkpoints=CheckpointConfig(every=checkpoint_every, keep=1, at_evaluation=True),
        evaluation=EvalConfig(every=batches.per_epoch), log_every=25)
    run = trainer.fit(config, method, model=model, batches=batches, evaluator=evaluator, keeper=keeper, label=name)
    history = [{"epoch": e["step"] // batches.per_epoch, "step": e["step"], "loss": e["loss"], "dev": e[evaluator.metric],
                "seconds": e["train_seconds"]} for e in run.evaluations]
    return host_params(run.state.params["tower"]), {"best": run.best[evaluator.metric] if run.best else None,
                                                    "history": history}

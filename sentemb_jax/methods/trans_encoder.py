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
import json
import logging
import math
import os
import time
from typing import Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm.auto import tqdm

import gin
from sentemb_jax import preflight
from sentemb_jax import validation as v
from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.data.files import DataError, default_data_dir, iter_tsv, read_sts_pairs
from sentemb_jax.data.packing import pack_batch, packing_inputs
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.evaluation.pairs import pair_auc, pair_scores
from sentemb_jax.evaluation.readers import read_labelled_pairs
from sentemb_jax.evaluation.sts import correlations, cosine_scores
from sentemb_jax.tokenization import Tokenizer
from sentemb_jax.training.optimizers import learning_rate_schedule, make_optimizer
from sentemb_jax.training.step import embed_packed

log = logging.getLogger(__name__)
Array = jax.Array
_EPS = 1e-6
BI_TO_CROSS_LOSSES = ("bce", "mse")
CROSS_TO_BI_LOSSES = ("mse", "bce")
RELABEL_MODES = ("none", "minmax", "standardize")


def bi_encoder_scores(emb1: Array, emb2: Array) -> Array:
    """Cosine similarity of paired rows [n, d] x [n, d] -> [n] (float32)."""
    a = emb1.astype(jnp.float32)
    b = emb2.astype(jnp.float32)
    a = a / jnp.maximum(jnp.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / jnp.maximum(jnp.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return jnp.sum(a * b, axis=-1)


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


@flax.struct.dataclass
class StepState:
    step: Array
    params: dict
    opt_state: optax.OptState


def init_state(params, optimizer: optax.GradientTransformation) -> StepState:
    return StepState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))


def _apply_grads(state: StepState, loss, grads, optimizer):
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return StepState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def cross_step(state: StepState, batch: dict, rng: Array, *, module: nn.Module, optimizer, loss: str = "bce"):
    """bi -> cross: one step of the cross-encoder on (pair features, `labels`); `batch` may carry
    the packed form of the pairs (CrossEncoder.packed_features)."""
    if loss not in BI_TO_CROSS_LOSSES:
        raise ValueError(f"bi->cross loss {loss!r}: choose from {BI_TO_CROSS_LOSSES}")
    rng = jax.random.fold_in(rng, state.step)
    if "packed_input_ids" in batch:  # whole pairs packed into rows (CrossEncoder.packed_features)
        features = {"input_ids": batch["packed_input_ids"], "attention_mask": None,
                    "token_type_ids": batch.get("packed_token_type_ids"),
                    "packing": packing_inputs(batch)}
    else:
        features = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}

    def loss_fn(params):
        logits = module.apply({"params": params}, **features, deterministic=False, rngs={"dropout": rng})
        return (soft_bce_loss if loss == "bce" else sigmoid_mse_loss)(logits, batch["labels"])

    value, grads = jax.value_and_grad(loss_fn)(state.params)
    return _apply_grads(state, value, grads, optimizer)


def bi_step(state: StepState, batch: dict, rng: Array, *, module: nn.Module, optimizer, loss: str = "mse"):
    """cross -> bi: one step of the bi-encoder (a SentenceEmbedder) on (sentence pairs, `labels`);
    `batch` may carry the packed form of both sides (sentemb_jax.data.packing)."""
    if loss not in CROSS_TO_BI_LOSSES:
        raise ValueError(f"cross->bi loss {loss!r}: choose from {CROSS_TO_BI_LOSSES}")
    rng = jax.random.fold_in(rng, state.step)

    def loss_fn(params):
        if "packed_input_ids" in batch:  # both sides in one call over packed rows
            e1, e2 = embed_packed(module, params, batch, rng, ["sentence1", "sentence2"]).values()
        else:
            embed = lambda side, i: module.apply(  # noqa: E731
                {"params": params}, batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"], False,
                rngs={"dropout": jax.random.fold_in(rng, i)})
            e1, e2 = embed("sentence1", 0), embed("sentence2", 1)
        return (cosine_mse_loss if loss == "mse" else cosine_bce_loss)(e1, e2, batch["labels"])

    value, grads = jax.value_and_grad(loss_fn)(state.params)
    return _apply_grads(state, value, grads, optimizer)


# ------------------------------------------------------------------------------------------------
# The job: cycles of bi -> cross and cross -> bi distillation over unlabelled pairs.

SCHEDULES = ("refresh", "sequential")


@gin.configurable(module="sentemb_jax")
@dataclasses.dataclass(frozen=True)
class DistillPhase:
    """One direction's settings (defaults: the paper's Table 16, STS, base models: bi -> cross)."""

    learning_rate: float = 2e-5
    batch_size: int = 32
    epochs: int = 1
    max_length: int = 64
    loss: str = "bce"
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    relabel: str = "none"  # transform of the pseudo-labels this phase learns (see `relabel`)


def _check_phase(ph: DistillPhase, param: str) -> None:
    """A DistillPhase's numbers (ConfigError naming `<scope>/sentemb_jax.DistillPhase.<field>`)."""
    sel = f"{param}/sentemb_jax.DistillPhase"
    api = "sentemb_jax.DistillPhase"
    v.require_number(ph.learning_rate, sel, "learning_rate", 0, low_open=True, api=api)
    v.require_int(ph.batch_size, sel, "batch_size", 1, api=api)
    v.require_int(ph.epochs, sel, "epochs", 1, api=api)
    v.require_int(ph.max_length, sel, "max_length", 2, api=api)
    v.require_number(ph.warmup_ratio, sel, "warmup_ratio", 0, 1, high_open=True, api=api)
    v.require_number(ph.weight_decay, sel, "weight_decay", 0, api=api)


def bi_to_cross_defaults() -> DistillPhase:
    return DistillPhase()


def cross_to_bi_defaults() -> DistillPhase:
    return DistillPhase(learning_rate=5e-5, batch_size=128, epochs=10, max_length=32, loss="mse")


@gin.configurable(module="sentemb_jax")
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


def _fit(name: str, out_dir: str, init_params, step_fn: Callable, features: Callable, examples: list, labels: np.ndarray,
         phase: DistillPhase, seed: int, dev: Callable, checkpoint_every: int, save_best: Callable):
    """Train one phase; resumable from out_dir/checkpoints. Returns (last params, {"best": dev, "history": [...]}).

    The dev score is taken at each epoch end; `save_best(params, score)` is called when it beats
    the phase's best so far (the caller keeps the best over all phases)."""
    per_epoch = math.ceil(len(examples) / phase.batch_size)
    total = per_epoch * phase.epochs
    schedule = learning_rate_schedule(phase.learning_rate, int(phase.warmup_ratio * total), total)
    optimizer = make_optimizer("adamw", schedule, clip_norm=1.0, weight_decay=phase.weight_decay)
    step = jax.jit(functools.partial(step_fn, optimizer=optimizer, loss=phase.loss), donate_argnums=(0,))
    state = init_state(jax.tree_util.tree_map(jnp.array, init_params), optimizer)
    manager = ocp.CheckpointManager(os.path.join(os.path.abspath(out_dir), "checkpoints"),
                                    options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True))
    info = {"best": None, "history": []}
    if manager.latest_step() is not None:
        restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(jax.tree_util.tree_map(np.asarray, state)), info=ocp.args.JsonRestore()))
        state, info = restored["state"], restored["info"]
        log.info("%s: resumed at step %d", name, int(state.step))
    rng = jax.random.PRNGKey(seed)
    labels = np.asarray(labels, np.float32)
    start = time.perf_counter()
    bar = tqdm(total=total, initial=int(state.step), desc=name, unit="step", disable=None)
    while int(state.step) < total:
        epoch, offset = divmod(int(state.step), per_epoch)
        order = np.random.default_rng(seed + epoch).permutation(len(examples))
        for b in range(offset, per_epoch):
            idx = order[b * phase.batch_size : (b + 1) * phase.batch_size]
            batch = {**features([examples[i] for i in idx]), "labels": labels[idx]}
            state, metrics = step(state, batch, rng)
            s = int(state.step)
            bar.update(1)
            if s % 25 == 0:
                bar.set_postfix(loss=f"{float(metrics['loss']):.4f}")
            end_of_epoch = b == per_epoch - 1
            if end_of_epoch:
                score = dev(state.params)
                info["history"].append({"epoch": epoch + 1, "step": s, "loss": float(metrics["loss"]), "dev": score,
                                        "seconds": time.perf_counter() - start})
                bar.write(f"{name} epoch {epoch + 1}: loss {float(metrics['loss']):.4f} dev {score:.2f}")
                if info["best"] is None or score > info["best"]:
                    info["best"] = score
                    save_best(state.params, score)
            if s % checkpoint_every == 0 or end_of_epoch:
                manager.save(s, args=ocp.args.Composite(state=ocp.args.StandardSave(state), info=ocp.args.JsonSave(info)),
                             force=True)
    bar.close()
    manager.wait_until_finished()
    return jax.device_get(state.params), info


def _check_inputs(data_dir: str, bi_encoders, cross_encoders, pair_files, dev: EvalSet, report) -> None:
    """Before any work: every start model directory, DATA_DIR (when a path is under it) and every
    pair / dev / report file exist; a failure names the gin binding (sentemb_jax.trans_encoder.<param>)."""
    job = "sentemb_jax.trans_encoder"
    for param, paths in (("bi_encoders", bi_encoders), ("cross_encoders", cross_encoders or ())):
        for path in paths:
            preflight.require_model_dir(path, job, param)
    files = [("pair_files", p) for p in pair_files] + [("dev", dev.path)] + [("report", ev.path) for ev in report]
    if any(path.startswith(os.path.join(data_dir, "")) for _, path in files):
        preflight.require_dir(data_dir, job, "data_dir")
    for param, path in files:
        preflight.require_file(path, job, param)


@gin.configurable(module="sentemb_jax")
def trans_encoder(
    model_dir: str = gin.REQUIRED,
    bi_encoders: Sequence[str] = gin.REQUIRED,
    pair_files: Sequence[str] = gin.REQUIRED,
    dev: EvalSet = gin.REQUIRED,
    cross_encoders: Sequence[str] | None = None,
    cycles: int = 3,
    schedule: str = "refresh",
    mutual: bool | None = None,
    bi_to_cross: DistillPhase | None = None,
    cross_to_bi: DistillPhase | None = None,
    cross_pooling: str = "first",
    report: Sequence[EvalSet] = (),
    checkpoint_every: int = 200,
    seed: int = 0,
    data_dir: str | None = None,
) -> dict:
    """Trans-Encoder self-distillation (one model) or mutual distillation (several, `mutual`).

    bi_encoders: start checkpoints (sentence-transformers / HF dirs), one per model.
    cross_encoders: each model's cross-encoder start (default: its bi-encoder's weights + a new head).
    schedule: `refresh` - each cycle the cross-encoder restarts from its start weights and the
      bi-encoder from its start checkpoint (paper's default); `sequential` - each starts from the
      other's latest backbone.
    mutual: pseudo-labels are the mean of every model's predictions (default: when > 1 model).
    dev: the selection set (STS-B dev for STS); the best bi- and cross-encoder of each model by it
      are saved under model_dir/model_<i>/{bi_best,cross_best} (results["best"]: their dev and report
      scores), the latest ones under {bi_last,cross_last}. report: sets scored after each
      phase (e.g. STS-B test), written with everything else to model_dir/results.json.
    data_dir: relative paths in pair_files / dev / report are under it (default: the shared data).
    A rerun with the same model_dir resumes: finished phases come back from their checkpoints.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"trans_encoder.schedule {schedule!r}: choose from {SCHEDULES}")
    bi_to_cross, cross_to_bi = bi_to_cross or bi_to_cross_defaults(), cross_to_bi or cross_to_bi_defaults()
    for ph in (bi_to_cross, cross_to_bi):
        relabel(np.zeros(2), ph.relabel)  # fail on a bad mode before any training
    mutual = len(bi_encoders) > 1 if mutual is None else mutual

    sel = "sentemb_jax.trans_encoder"
    v.require_int(cycles, sel, "cycles", 1)
    v.require_int(checkpoint_every, sel, "checkpoint_every", 1)
    v.check_seed(seed, sel)
    for param, ph in (("bi_to_cross", bi_to_cross), ("cross_to_bi", cross_to_bi)):
        _check_phase(ph, param)
    data_dir = data_dir or default_data_dir()

    def under(path: str, what: str) -> str:  # absolute paths stay as they are; relative ones stay under data_dir
        if isinstance(path, str) and not os.path.isabs(path) and not v.is_under(path, data_dir):
            raise v.ConfigError(f"gin binding {sel}.{what} = {path!r}: a relative path must stay under data_dir "
                                f"{os.path.normpath(data_dir)} (it resolves to {os.path.normpath(os.path.join(data_dir, path))}); "
                                "give an absolute path for a file elsewhere")
        return os.path.join(data_dir, path)

    pair_files = [under(p, "pair_files") for p in pair_files]
    dev = dataclasses.replace(dev, path=under(dev.path, "dev"))
    report = [dataclasses.replace(ev, path=under(ev.path, "report")) for ev in report]
    _check_inputs(data_dir, bi_encoders, cross_encoders, pair_files, dev, report)
    pairs = read_unlabelled_pairs(pair_files)
    swapped = [(b, a) for a, b in pairs]
    both_orders = pairs + swapped
    s1, s2 = [p[0] for p in pairs], [p[1] for p in pairs]
    os.makedirs(model_dir, exist_ok=True)
    results_path = os.path.join(model_dir, "results.json")
    results = {"pairs": len(pairs), "schedule": schedule, "mutual": mutual, "models": [], "cycles": []}
    best: dict[str, dict] = {}  # "model_<i>/bi" -> {"dev": score, "cycle": c}: the best over all phases

    def keeper(model, i: int, kind: str, cycle: int):
        key = f"model_{i}/{kind}"

        def save(params, score: float) -> None:
            if key not in best or score > best[key]["dev"]:
                best[key] = {"dev": score, "cycle": cycle}
                _save_with(model, params, os.path.join(model_dir, f"model_{i}", f"{kind}_best"))
        return save

    def note_best(i: int, kind: str, cycle: int, info: dict) -> None:
        # A phase restored from its checkpoint saved its best dir in the earlier run; count its score.
        key = f"model_{i}/{kind}"
        if info["best"] is not None and (key not in best or info["best"] > best[key]["dev"]):
            best[key] = {"dev": info["best"], "cycle": cycle}

    bis = [SentenceEncoder.from_pretrained(p) for p in bi_encoders]
    bi_start = [b.params for b in bis]
    crosses = [CrossEncoder.from_pretrained(c, pooling=cross_pooling, max_seq_length=bi_to_cross.max_length, seed=seed + i)
               for i, c in enumerate(cross_encoders or bi_encoders)]
    cross_start = [c.params for c in crosses]
    if len(crosses) != len(bis):
        raise ValueError(f"trans_encoder: {len(bis)} bi_encoders but {len(crosses)} cross_encoders")
    if schedule == "sequential":
        for i, (b, c) in enumerate(zip(bis, crosses)):
            if b.config != c.config:
                raise ValueError(f"trans_encoder: schedule 'sequential' passes weights between model {i}'s bi- and "
                                 "cross-encoder, which need the same backbone config")

    def scores(model) -> dict:
        return {"dev": score_eval_set(model, dev), **{ev.name: score_eval_set(model, ev) for ev in report}}

    for i, path in enumerate(bi_encoders):
        results["models"].append({"bi_encoder": path, "start": scores(bis[i])})
        log.info("model %d start: %s", i, results["models"][-1]["start"])

    def pair_labels(kind: str) -> list[np.ndarray]:
        if kind == "bi":
            return [cosine_scores(b, s1, s2) for b in bis]
        return [np.asarray(cross_encoder_scores(c.predict(pairs, activation="none"), c.predict(swapped, activation="none")))
                for c in crosses]

    def shared(labels: list[np.ndarray], mode: str) -> list[np.ndarray]:
        if mutual:
            labels = [mutual_labels(labels)] * len(labels)
        return [relabel(x, mode) for x in labels]

    for cycle in range(1, cycles + 1):
        record = {"cycle": cycle, "models": []}
        t0 = time.perf_counter()
        labels = shared(pair_labels("bi"), bi_to_cross.relabel)
        record["bi_labels"] = [_summary(x) for x in labels]
        for i, cross in enumerate(crosses):
            init = cross_start[i]
            if schedule == "sequential":  # the bi-encoder that just made the labels, under the latest head
                init = {"backbone": bis[i].params["backbone"], "head": cross.params["head"]}
            out = os.path.join(model_dir, f"model_{i}", f"cycle_{cycle}", "bi_to_cross")
            cross.params, info = _fit(
                f"model {i} cycle {cycle} bi->cross", out, init,
                functools.partial(cross_step, module=cross.module), cross.packed_features,
                both_orders, np.concatenate([labels[i], labels[i]]), bi_to_cross, seed + 1000 * cycle + i,
                lambda p, c=cross: _score_with(c, p, dev), checkpoint_every, keeper(cross, i, "cross", cycle))
            note_best(i, "cross", cycle, info)
            cross.save_pretrained(os.path.join(model_dir, f"model_{i}", "cross_last"))
            record["models"].append({"cross": {**scores(cross), "epochs": info["history"]}})
        labels = shared(pair_labels("cross"), cross_to_bi.relabel)
        record["cross_labels"] = [_summary(x) for x in labels]
        for i, bi in enumerate(bis):
            init = bi_start[i]
            if schedule == "sequential":
                init = {**bi.params, "backbone": crosses[i].params["backbone"]}
            out = os.path.join(model_dir, f"model_{i}", f"cycle_{cycle}", "cross_to_bi")
            # Training truncates at the phase's max length; evaluation keeps the model's own.
            train_tok = Tokenizer(bi.tokenizer.hf, cross_to_bi.max_length, lowercase=bi.tokenizer.lowercase)

            def bi_features(batch, tok=train_tok):
                f1, f2 = tok([a for a, _ in batch]), tok([b for _, b in batch])
                sides = {"sentence1_input_ids": f1["input_ids"], "sentence1_attention_mask": f1["attention_mask"],
                         "sentence2_input_ids": f2["input_ids"], "sentence2_attention_mask": f2["attention_mask"]}
                # Packed rows of real tokens: the same loss, ~2x fewer tokens than padding each side.
                return pack_batch(sides, ("sentence1", "sentence2"), tok.max_length, tok.pad_id)

            bi.params, info = _fit(
                f"model {i} cycle {cycle} cross->bi", out, init, functools.partial(bi_step, module=bi.module), bi_features,
                pairs, labels[i], cross_to_bi, seed + 1000 * cycle + 500 + i, lambda p, b=bi: _score_with(b, p, dev),
                checkpoint_every, keeper(bi, i, "bi", cycle))
            note_best(i, "bi", cycle, info)
            bi.save_pretrained(os.path.join(model_dir, f"model_{i}", "bi_last"))
            record["models"][i]["bi"] = {**scores(bi), "epochs": info["history"]}
        if len(bis) > 1:
            record["ensemble"] = {"bi": scores(_Ensemble(bis)), "cross": scores(_Ensemble(crosses))}
        record["seconds"] = time.perf_counter() - t0
        results["cycles"].append(record)
        results["best"] = best
        log.info("cycle %d: %s", cycle, json.dumps(record["models"]))
        with open(results_path, "w") as f:
            json.dump(results, f, indent=2)
    if report:  # the kept models (best by dev over every phase, not the last epoch's) on the report sets too
        for key, entry in best.items():
            i, kind = key.split("/")
            path = os.path.join(model_dir, i, f"{kind}_best")
            kept = (CrossEncoder if kind == "cross" else SentenceEncoder).from_pretrained(path)
            entry.update({ev.name: score_eval_set(kept, ev) for ev in report})
        log.info("kept models: %s", json.dumps(best))
        with open(results_path, "w") as f:
            json.dump(results, f, indent=2)
    return results


def _summary(x: np.ndarray) -> dict:
    return {"mean": float(np.mean(x)), "std": float(np.std(x)), "min": float(np.min(x)), "max": float(np.max(x))}


def _score_with(model, params, ev: EvalSet) -> float:
    old, model.params = model.params, jax.device_get(params)
    try:
        return score_eval_set(model, ev)
    finally:
        model.params = old


def _save_with(model, params, out_dir: str) -> None:
    old, model.params = model.params, jax.device_get(params)
    try:
        model.save_pretrained(out_dir)
    finally:
        model.params = old


class _Ensemble:
    """Average of several models' pair scores (bi-encoders: cosine; cross-encoders: predict)."""

    def __init__(self, models):
        self.models = models

    def predict(self, pairs):
        a, b = [p[0] for p in pairs], [p[1] for p in pairs]
        return np.mean([pair_scores(m, a, b) for m in self.models], axis=0)

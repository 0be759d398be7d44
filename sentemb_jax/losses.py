"""Training losses: small pure functions on embeddings, computed in float32.

Under `jax.jit` with sharded inputs these see the *global* batch, so in-batch negatives span
every data shard.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from sentemb_jax.pooling import l2_normalize

Array = jax.Array
_MASKED = -1e9  # finite, so masked entries times a zero target stay zero (not nan)


def in_batch_softmax_loss(
    anchors: Array,
    positives: Array,
    hard_negatives: Array | None = None,
    temperature: float | Array = 0.05,
    bidirectional: bool = False,
    label_smoothing: float = 0.0,
    duplicates: Array | None = None,
) -> Array:
    """Sentence-T5 eq. 2: softmax over each anchor's positive, the other positives, hard negatives.

    anchors, positives, hard_negatives: [B, D] embeddings (L2-normalised for cosine similarity).
    bidirectional: also classify each positive against all anchors; the two terms are averaged.
    label_smoothing: target mass spread uniformly over the non-masked candidates.
    duplicates: [B, B] bool, True where positives i and j are the same text; such other rows
      are masked out of the candidates (a duplicate of the positive is not a negative).
    Returns the mean loss (a float32 scalar).
    """
    a = anchors.astype(jnp.float32)
    p = positives.astype(jnp.float32)
    candidates = p if hard_negatives is None else jnp.concatenate([p, hard_negatives.astype(jnp.float32)], axis=0)
    batch = a.shape[0]
    valid = jnp.ones((batch, candidates.shape[0]), bool)
    if duplicates is not None:
        valid = valid.at[:, :batch].set(~(duplicates & ~jnp.eye(batch, dtype=bool)))
    forward = _softmax_xent(a @ candidates.T / temperature, valid, label_smoothing)
    if not bidirectional:
        return forward
    backward_valid = valid[:, :batch].T
    backward = _softmax_xent(p @ a.T / temperature, backward_valid, label_smoothing)
    return (forward + backward) / 2


def _softmax_xent(logits: Array, valid: Array, label_smoothing: float) -> Array:
    """Mean cross-entropy where row i's target is column i, over valid columns only."""
    batch, n = logits.shape
    logits = jnp.where(valid, logits, _MASKED)
    onehot = jax.nn.one_hot(jnp.arange(batch), n, dtype=jnp.float32)
    if label_smoothing:
        uniform = valid.astype(jnp.float32) / jnp.sum(valid, axis=1, keepdims=True)
        targets = (1.0 - label_smoothing) * onehot + label_smoothing * uniform
    else:
        targets = onehot
    return jnp.mean(optax.softmax_cross_entropy(logits, targets))


# ------------------------------------------------------------------------------------------------
# Queue-based distillation (ConGen, Limkonchotiwat et al. 2022; SCT, Limkonchotiwat et al. 2023).
# Embeddings and queue entries are L2-normalised, so a dot product is the cosine similarity.


def queue_logits(z: Array, queue: Array, temperature: float) -> Array:
    """sim(z_i, d_j) / tau over the K queue entries: [B, D] x [K, D] -> [B, K] (ConGen eq. 1, SCT eq. 1)."""
    return z.astype(jnp.float32) @ queue.astype(jnp.float32).T / temperature


def distribution_cross_entropy(target_logits: Array, logits: Array) -> Array:
    """Mean over rows of CE(softmax(target_logits), softmax(logits)); no gradient into the target."""
    target = jax.nn.softmax(jax.lax.stop_gradient(target_logits), axis=-1)
    return jnp.mean(optax.softmax_cross_entropy(logits, target))


def distribution_kl(target_logits: Array, logits: Array) -> Array:
    """Mean over rows of KL(softmax(target_logits) || softmax(logits)); no gradient into the target."""
    target_log = jax.nn.log_softmax(jax.lax.stop_gradient(target_logits), axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(target_log) * (target_log - jax.nn.log_softmax(logits, axis=-1)), axis=-1))


def congen_loss(teacher: Array, control: Array, generalize: Array, queue: Array, teacher_temperature: float,
                student_temperature: float, alpha: float = 0.5) -> Array:
    """ConGen eq. 2: alpha CE(P_ref^T, P_con^S) + (1 - alpha) CE(P_ref^T, P_gen^S) over the queue."""
    target = queue_logits(teacher, queue, teacher_temperature)
    return (alpha * distribution_cross_entropy(target, queue_logits(control, queue, student_temperature))
            + (1 - alpha) * distribution_cross_entropy(target, queue_logits(generalize, queue, student_temperature)))


def contrastive_distillation_loss(teacher_slots: Array, student: Array, queue: Array, temperature: float) -> Array:
    """CKD (ConGen's baseline after Wu et al. 2021): InfoNCE of each student embedding against the
    teacher queue, whose positive is the teacher's embedding of the same sentence at `teacher_slots`."""
    logits = queue_logits(student, queue, temperature)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, teacher_slots))


def mse_loss(a: Array, b: Array) -> Array:
    """Mean squared difference over all elements (sentence-transformers' MSELoss, the L2 baselines)."""
    return jnp.mean(jnp.square(a.astype(jnp.float32) - b.astype(jnp.float32)))


def sct_loss(online_1: Array, online_2: Array, reference_1: Array, reference_2: Array, queue_1: Array, queue_2: Array,
             reference_temperature: float, online_temperature: float) -> Array:
    """SCT eq. 2 (and L_CD, eq. 4, with a teacher's embeddings as the references): cross-view
    1/2 KL(SG(c2_ref) || c1) + 1/2 KL(SG(c1_ref) || c2), where c1 = SR(z1, D2), c2 = SR(z2, D1),
    c1_ref = SR(r1, D1), c2_ref = SR(r2, D2)."""
    c1 = queue_logits(online_1, queue_2, online_temperature)
    c2 = queue_logits(online_2, queue_1, online_temperature)
    c1_ref = queue_logits(reference_1, queue_1, reference_temperature)
    c2_ref = queue_logits(reference_2, queue_2, reference_temperature)
    return (distribution_kl(c2_ref, c1) + distribution_kl(c1_ref, c2)) / 2


# ------------------------------------------------------------------------------------------------
# Ensemble distillation (the round-trip-translation ensemble paper, eq. 3-4 and its Table 4).

REGRESSION_LOSSES = ("mae", "mse", "smooth_l1", "kl")


def ensemble_distillation_loss(student: Array, teacher: Array, weight: float = 0.1, temperature: float = 0.3,
                               regression: str = "mae") -> Array:
    """weight * InfoNCE(student, teacher; tau) + (1 - weight) * regression(student, teacher).

    InfoNCE: student embedding i against every teacher embedding of the batch (cosine / tau), the
    positive being teacher i (teacher fixed). regression (eq. 4 and Table 4's ablation): 'mae'
    1/M sum_i ||t_i - s_i||_1, 'mse' 1/M sum_i ||t_i - s_i||^2, 'smooth_l1' (Huber, beta 1) - each
    summed over the D dimensions as eq. 4 is (a mean over them, as torch's L1Loss takes, makes the
    gradient D times smaller; students then drifted from the ensemble, 0.97 -> 0.82 cosine) and
    averaged over the batch - or 'kl' KL(softmax(t_i . t_j / tau) || softmax(s_i . t_j / tau)).
    """
    s = student.astype(jnp.float32)
    t = jax.lax.stop_gradient(teacher.astype(jnp.float32))
    tn = l2_normalize(t)
    logits = l2_normalize(s) @ tn.T / temperature
    info_nce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(s.shape[0])))
    elementwise = {"mae": lambda: jnp.abs(s - t), "mse": lambda: jnp.square(s - t),
                   "smooth_l1": lambda: optax.huber_loss(s, t, delta=1.0)}
    if regression in elementwise:
        reg = jnp.mean(jnp.sum(elementwise[regression](), axis=-1))
    elif regression == "kl":
        reg = distribution_kl(tn @ tn.T / temperature, logits)
    else:
        raise ValueError(f"regression {regression!r}: choose from {REGRESSION_LOSSES}")
    return weight * info_nce + (1.0 - weight) * reg

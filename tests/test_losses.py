"""Losses against hand-computed numpy values."""
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax.losses import in_batch_softmax_loss

rng = np.random.default_rng(0)


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


A, Pp, N = (_unit(rng.normal(size=(4, 5))) for _ in range(3))
T = 0.05


def _xent(logits, targets):
    logits = logits - logits.max(1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return float(-(targets * logp).sum(1).mean())


def test_in_batch_with_hard_negatives():
    logits = A @ np.concatenate([Pp, N]).T / T
    want = _xent(logits, np.eye(4, 8))
    assert abs(float(in_batch_softmax_loss(A, Pp, N, T)) - want) < 1e-5
    assert abs(float(in_batch_softmax_loss(A, Pp, None, T)) - _xent(A @ Pp.T / T, np.eye(4))) < 1e-5


def test_bidirectional_is_average_of_both_directions():
    fwd = _xent(A @ np.concatenate([Pp, N]).T / T, np.eye(4, 8))
    bwd = _xent(Pp @ A.T / T, np.eye(4))
    assert abs(float(in_batch_softmax_loss(A, Pp, N, T, bidirectional=True)) - (fwd + bwd) / 2) < 1e-5


def test_label_smoothing():
    eps = 0.1
    targets = (1 - eps) * np.eye(4, 8) + eps / 8
    want = _xent(A @ np.concatenate([Pp, N]).T / T, targets)
    assert abs(float(in_batch_softmax_loss(A, Pp, N, T, label_smoothing=eps)) - want) < 1e-5


def test_duplicate_positives_masked():
    dup = np.zeros((4, 4), bool)
    dup[0, 2] = dup[2, 0] = True  # positives 0 and 2 are the same text
    logits = A @ np.concatenate([Pp, N]).T / T
    keep = np.ones((4, 8), bool)
    keep[0, 2] = keep[2, 0] = False
    want = _xent(np.where(keep, logits, -1e30), np.eye(4, 8))
    got = float(in_batch_softmax_loss(A, Pp, N, T, duplicates=jnp.asarray(dup | np.eye(4, dtype=bool))))
    assert abs(got - want) < 1e-5
    # Masked duplicates with label smoothing: no mass on the masked column, still finite.
    s = float(in_batch_softmax_loss(A, Pp, N, T, label_smoothing=0.2, duplicates=jnp.asarray(dup)))
    targets = 0.8 * np.eye(4, 8) + 0.2 * keep / keep.sum(1, keepdims=True)
    assert abs(s - _xent(np.where(keep, logits, -1e30), targets)) < 1e-5


def test_temperature_scales_logits():
    assert float(in_batch_softmax_loss(A, Pp, None, 1.0)) == pytest.approx(_xent(A @ Pp.T, np.eye(4)), abs=1e-6)

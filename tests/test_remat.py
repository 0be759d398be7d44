"""Rematerialisation policies (models.common.REMAT_POLICIES): the same gradients under each, and the
compiler's memory falling from 'none' (every activation kept) through 'dots' (the Dense outputs
kept) to 'full' (each layer recomputed from its input)."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax.benchmarks import remat_choice
from sentemb_jax.errors import ConfigError
from sentemb_jax.models import BertConfig, T5Config
from sentemb_jax.models.common import remat_policy
from sentemb_jax.models.sentence import SentenceEmbedder


def _t5(remat, scan: bool) -> T5Config:
    return T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=256, num_layers=3, num_decoder_layers=1, num_heads=4,
                    relative_attention_num_buckets=8, dropout_rate=0.0, scan_layers=scan, remat=remat)


def _program(cfg: T5Config):
    module = SentenceEmbedder(cfg, pooling=("mean",))
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (8, 64)), jnp.int32)
    params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), ids, ids)["params"])
    grad = jax.jit(jax.grad(lambda p: jnp.sum(module.apply({"params": p}, ids, ids) ** 2)))
    return grad, params


def test_each_policy_gives_the_same_gradients_keeping_less_for_the_backward_pass():
    """Scanned layers (as every shipped config that rematerialises): XLA:CPU's temporaries fall from
    'none' through 'dots' to 'full'. (Unscanned, XLA:CPU schedules the recompute without saving
    memory; the TPU figures are benchmarks.remat_choice's.)"""
    temps, grads = {}, {}
    for policy in ("none", "dots", "full"):
        grad, params = _program(_t5(policy, scan=True))
        compiled = grad.lower(params).compile()
        temps[policy] = compiled.memory_analysis().temp_size_in_bytes
        grads[policy] = jax.tree_util.tree_leaves(compiled(params))
    for policy in ("dots", "full"):
        for a, b in zip(grads[policy], grads["none"]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert temps["none"] > temps["dots"] > temps["full"], temps


def test_true_and_false_name_the_older_choices_and_a_wrong_name_is_refused():
    assert (remat_policy(True), remat_policy(False), remat_policy("dots")) == ("full", "none", "dots")
    for config in (T5Config, BertConfig):
        with pytest.raises(ConfigError) as e:
            config(remat="some")
        assert (e.value.param, e.value.value) == ("remat", "some")
        assert "must be one of ('none', 'dots', 'full')" in str(e.value)


def test_the_choice_is_the_least_recompute_that_leaves_the_headroom():
    gib = 2**30
    rows = lambda *need: [{"policy": p, "per_device": n, "memory": 16 * gib, "at_least": False}  # noqa: E731
                          for p, n in zip(("none", "dots", "full"), need)]
    assert remat_choice.choose(rows(30 * gib, 14 * gib, 9 * gib), 0.1) == "dots"
    assert remat_choice.choose(rows(30 * gib, 14.5 * gib, 9 * gib), 0.1) == "full"  # 14.5 > 0.9 x 16
    assert remat_choice.choose(rows(10 * gib, 8 * gib, 7 * gib), 0.1) == "none"
    assert remat_choice.choose(rows(None, 20 * gib, 17 * gib), 0.1) == "none fits"
    lower_bound = rows(30 * gib, 10 * gib, 9 * gib)
    lower_bound[1]["at_least"] = True  # only a lower bound of the need: not known to fit
    assert remat_choice.choose(lower_bound, 0.1) == "full"

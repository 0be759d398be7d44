"""The loss-only method of docs/ARCHITECTURE.md: triplet_margin_loss plugged into the train step
through ContrastiveConfig.loss gives the loss computed by hand, and gin binds it."""
import flax.linen as nn
import jax
import numpy as np
import pytest

import gin
from sentemb_jax.methods.triplet import triplet_margin_loss
from sentemb_jax.models import T5Config
from sentemb_jax.models.sentence import SentenceEmbedder
from sentemb_jax.training.step import ContrastiveConfig, initial_params, loss_and_grads

SIDES = ("anchor", "positive", "negative")


def by_hand(a, p, n, margin):
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    a, p, n = unit(a), unit(p), unit(n)
    d_ap, d_an = 1 - (a * p).sum(1), 1 - (a * n).sum(1)
    return float(np.mean(np.maximum(d_ap - d_an + margin, 0)))


def test_loss_equals_hand_computation():
    rng = np.random.default_rng(0)
    e = {s: rng.standard_normal((16, 8)).astype(np.float32) for s in SIDES}
    cfg = ContrastiveConfig(negative="negative")
    for margin in (0.0, 0.5, 2.0):
        got = float(triplet_margin_loss(e, {}, None, cfg, margin=margin))
        assert got == pytest.approx(by_hand(e["anchor"], e["positive"], e["negative"], margin), abs=1e-6)
    assert float(triplet_margin_loss(e, {}, None, cfg, margin=2.0)) > 0.5  # not trivially zero
    with pytest.raises(ValueError, match="needs a hard negative"):
        triplet_margin_loss(e, {}, None, ContrastiveConfig(negative=None))  # explicit: gin state of other tests aside


def test_train_step_uses_the_configured_loss():
    cfg_model = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=4,
                         relative_attention_num_buckets=8, dropout_rate=0.0)  # no dropout: embeddings are deterministic
    module = SentenceEmbedder(cfg_model, pooling=("mean",))
    rng = np.random.default_rng(1)
    batch = {}
    for s in SIDES:
        batch[f"{s}_input_ids"] = rng.integers(2, 64, (8, 6)).astype(np.int32)
        batch[f"{s}_attention_mask"] = np.ones((8, 6), np.int32)
    tower = nn.meta.unbox(module.init(jax.random.PRNGKey(0), batch["anchor_input_ids"], batch["anchor_attention_mask"])["params"])
    cfg = ContrastiveConfig(negative="negative", loss=triplet_margin_loss)
    loss, grads = loss_and_grads(module, initial_params(tower, cfg), batch, jax.random.PRNGKey(2), cfg)
    e = {s: np.asarray(module.apply({"params": tower}, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"])) for s in SIDES}
    assert float(loss) == pytest.approx(by_hand(e["anchor"], e["positive"], e["negative"], 0.5), abs=1e-5)
    default, _ = loss_and_grads(module, initial_params(tower, ContrastiveConfig(negative="negative")), batch,
                                jax.random.PRNGKey(2), ContrastiveConfig(negative="negative"))
    assert abs(float(default) - float(loss)) > 1e-3  # the in-batch softmax is another number
    assert max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(grads)) > 0


def test_gin_binds_the_loss_and_its_margin():
    gin.clear_config()
    try:
        gin.parse_config(["sentemb_jax.ContrastiveConfig.negative = 'negative'",
                          "sentemb_jax.ContrastiveConfig.loss = @sentemb_jax.triplet_margin_loss",
                          "sentemb_jax.triplet_margin_loss.margin = 2.0"])
        cfg = ContrastiveConfig()
        rng = np.random.default_rng(3)
        e = {s: rng.standard_normal((4, 8)).astype(np.float32) for s in SIDES}
        assert float(cfg.loss(e, {}, None, cfg)) == pytest.approx(by_hand(e["anchor"], e["positive"], e["negative"], 2.0), abs=1e-6)
    finally:
        gin.clear_config()

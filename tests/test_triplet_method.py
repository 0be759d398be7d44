"""The loss-only method of docs/ARCHITECTURE.md: Triplet (a Contrastive with its own loss) gives the
loss computed by hand in the train step, and gin binds it and its margin."""
import flax.linen as nn
import jax
import numpy as np
import pytest

import gin
import sentemb_jax.jobs  # noqa: F401 - registers the methods with gin
from sentemb_jax.errors import ConfigError
from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.methods.triplet import Triplet
from sentemb_jax.models import T5Config
from sentemb_jax.models.sentence import SentenceEmbedder

SIDES = ("anchor", "positive", "negative")


def by_hand(a, p, n, margin):
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    a, p, n = unit(a), unit(p), unit(n)
    d_ap, d_an = 1 - (a * p).sum(1), 1 - (a * n).sum(1)
    return float(np.mean(np.maximum(d_ap - d_an + margin, 0)))


def test_loss_equals_hand_computation():
    rng = np.random.default_rng(0)
    e = {s: rng.standard_normal((16, 8)).astype(np.float32) for s in SIDES}
    for margin in (0.0, 0.5, 2.0):
        got = float(Triplet(margin=margin).loss(e, {}, None))
        assert got == pytest.approx(by_hand(e["anchor"], e["positive"], e["negative"], margin), abs=1e-6)
    assert float(Triplet(margin=2.0).loss(e, {}, None)) > 0.5  # not trivially zero
    with pytest.raises(ConfigError, match=r"sentemb_jax.Triplet\(negative=None\): needs a hard negative"):
        Triplet(negative=None)


def test_train_step_uses_the_methods_loss():
    cfg_model = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=4,
                         relative_attention_num_buckets=8, dropout_rate=0.0)  # no dropout: embeddings are deterministic
    module = SentenceEmbedder(cfg_model, pooling=("mean",))
    rng = np.random.default_rng(1)
    batch = {}
    for s in SIDES:
        batch[f"{s}_input_ids"] = rng.integers(2, 64, (8, 6)).astype(np.int32)
        batch[f"{s}_attention_mask"] = np.ones((8, 6), np.int32)
    tower = nn.meta.unbox(module.init(jax.random.PRNGKey(0), batch["anchor_input_ids"], batch["anchor_attention_mask"])["params"])
    loss, grads = Triplet().loss_and_grads(module, {"tower": tower}, batch, jax.random.PRNGKey(2))
    e = {s: np.asarray(module.apply({"params": tower}, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"])) for s in SIDES}
    assert float(loss) == pytest.approx(by_hand(e["anchor"], e["positive"], e["negative"], 0.5), abs=1e-5)
    default, _ = Contrastive(negative="negative").loss_and_grads(module, {"tower": tower}, batch, jax.random.PRNGKey(2))
    assert abs(float(default) - float(loss)) > 1e-3  # the in-batch softmax is another number
    assert max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(grads)) > 0


def test_gin_binds_the_method_and_its_margin():
    gin.parse_config(["METHOD = @sentemb_jax.Triplet()", "sentemb_jax.Triplet.margin = 2.0"])
    method = gin.get_bindings("METHOD/gin.macro")["value"]
    assert isinstance(method, Triplet) and method.margin == 2.0 and method.negative == "negative"
    rng = np.random.default_rng(3)
    e = {s: rng.standard_normal((4, 8)).astype(np.float32) for s in SIDES}
    assert float(method.loss(e, {}, None)) == pytest.approx(by_hand(e["anchor"], e["positive"], e["negative"], 2.0), abs=1e-6)

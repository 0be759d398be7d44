"""GradCache gives the full-batch gradient (dropout on), and the step learns."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax.models import T5Config
from sentemb_jax.models.sentence import SentenceEmbedder
from sentemb_jax.training.step import ContrastiveConfig, initial_params, loss_and_grads

B, L = 64, 12


@pytest.fixture(scope="module")
def setup():
    cfg = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=1, num_heads=4,
                   relative_attention_num_buckets=8, dropout_rate=0.1)
    module = SentenceEmbedder(cfg, pooling=("encdec_first",), projection_dim=16)
    rng = np.random.default_rng(0)
    batch = {}
    for side in ("anchor", "positive", "negative"):
        ids = rng.integers(2, 100, (B, L)).astype(np.int32)
        mask = (np.arange(L)[None] < rng.integers(3, L + 1, (B, 1))).astype(np.int32)
        batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"] = jnp.asarray(ids * mask), jnp.asarray(mask)
    tower = nn.meta.unbox(module.init(jax.random.PRNGKey(0), batch["anchor_input_ids"][:2], batch["anchor_attention_mask"][:2])["params"])
    return module, tower, batch


def test_chunks_of_8_equal_full_batch_64(setup):
    learnable = True  # also covers the temperature gradient through the cached loss
    module, tower, batch = setup
    cfg = ContrastiveConfig(negative="negative", chunk_size=8, learnable_temperature=learnable, bidirectional=True)
    params = initial_params(tower, cfg)
    full = jax.jit(lambda p, rng: loss_and_grads(module, p, batch, rng, cfg))
    cached = jax.jit(lambda p: loss_and_grads(module, p, batch, jax.random.PRNGKey(1), dataclasses.replace(cfg, gradcache=True)))
    (l1, g1), (l2, g2) = full(params, jax.random.PRNGKey(1)), cached(params)
    assert abs(float(l1) - float(l2)) <= 1e-5
    diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), g1, g2))
    assert max(diffs) <= 1e-5
    assert max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(g1)) > 1e-2  # non-trivial gradients
    # Dropout is on: another rng gives another loss.
    assert abs(float(l1) - float(full(params, jax.random.PRNGKey(2))[0])) > 1e-3


def test_chunk_size_must_divide_batch(setup):
    module, tower, batch = setup
    cfg = ContrastiveConfig(chunk_size=7, gradcache=True)
    with pytest.raises(ValueError, match="not divisible by chunk_size=7"):
        loss_and_grads(module, initial_params(tower, cfg), batch, jax.random.PRNGKey(0), cfg)

"""GradCache gives the full-batch gradient (dropout on), and the step learns."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.models import T5Config
from sentemb_jax.models.sentence import SentenceEmbedder
from sentemb_jax.training.method import TrainState

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

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
    cfg = Contrastive(negative="negative", chunk_size=8, learnable_temperature=learnable, bidirectional=True)
    params = {"tower": tower, **cfg.init_params(16)}
    full = jax.jit(lambda p, rng: cfg.loss_and_grads(module, p, batch, rng))
    cached = jax.jit(lambda p: dataclasses.replace(cfg, gradcache=True).loss_and_grads(module, p, batch, jax.random.PRNGKey(1)))
    (l1, g1), (l2, g2) = full(params, jax.random.PRNGKey(1)), cached(params)
    assert abs(float(l1) - float(l2)) <= 1e-5
    diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), g1, g2))
    assert max(diffs) <= 1e-5
    assert max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(g1)) > 1e-2  # non-trivial gradients
    # Dropout is on: another rng gives another loss.
    assert abs(float(l1) - float(full(params, jax.random.PRNGKey(2))[0])) > 1e-3


def test_chunk_size_must_divide_batch(setup):
    module, tower, batch = setup
    cfg = Contrastive(chunk_size=7, gradcache=True)
    with pytest.raises(ValueError, match="not divisible by chunk_size=7"):
        cfg.loss_and_grads(module, {"tower": tower}, batch, jax.random.PRNGKey(0))


@pytest.mark.parametrize("chunk_size", [8, None])
def test_gradcache_step_equals_plain_full_batch_step_without_dropout(setup, chunk_size):
    """Dropout off (dropout_rate 0): a GradCache step (chunks of 8, or the whole batch as one chunk)
    and the plain step (one forward over the full batch of 64, no chunking, no GradCache) are the
    same function of the parameters, so their losses, gradients and the parameters after one SGD
    step agree to float32 round-off (bound 1e-5, as in the chunked test above)."""
    module, tower, batch = setup
    module = module.clone(backbone_config=dataclasses.replace(module.backbone_config, dropout_rate=0.0))
    cfg = Contrastive(negative="negative", learnable_temperature=True, bidirectional=True)
    params = {"tower": tower, **cfg.init_params(16)}
    optimizer = optax.sgd(0.5)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))
    plain = jax.jit(lambda s, rng: cfg.step(s, batch, rng, module=module, optimizer=optimizer))
    cached_cfg = dataclasses.replace(cfg, chunk_size=chunk_size, gradcache=True)
    cached = jax.jit(lambda s, rng: cached_cfg.step(s, batch, rng, module=module, optimizer=optimizer))
    (l1, g1), (l2, g2) = [jax.jit(lambda p, c=c: c.loss_and_grads(module, p, batch, jax.random.PRNGKey(1)))(params)
                          for c in (cfg, cached_cfg)]
    assert abs(float(l1) - float(l2)) <= 1e-5
    assert max(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), g1, g2))) <= 1e-5
    assert max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(g1)) > 1e-2  # non-trivial gradients
    # Dropout is off: the rng changes nothing (another rng, the same loss).
    plain_loss = jax.jit(lambda p, rng: cfg.loss_and_grads(module, p, batch, rng)[0])
    assert float(plain_loss(params, jax.random.PRNGKey(1))) == float(plain_loss(params, jax.random.PRNGKey(2)))
    (s1, m1), (s2, m2) = plain(state, jax.random.PRNGKey(3)), cached(state, jax.random.PRNGKey(4))
    assert abs(float(m1["loss"]) - float(m2["loss"])) <= 1e-5
    moved = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), s1.params, params))
    assert max(moved) > 5e-3  # the step moved the parameters
    diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), s1.params, s2.params))
    assert max(diffs) <= 0.5 * 1e-5 + 1e-6  # lr x the gradient bound, plus float32 round-off of the update


def _max_diff(a, b):
    return max(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, y: float(jnp.abs(x - y).max()), a, b)))


@pytest.mark.parametrize("chunk_size,gradcache", [(None, False), (8, False), (8, True)])
def test_one_encoder_call_equals_one_call_per_side_without_dropout(setup, chunk_size, gradcache):
    """Every side in one encoder call (the default) and one call per side are the same function of
    the parameters without dropout: loss and gradients to float32 round-off, plain, chunked and
    GradCache. The positives are shorter than the anchors (padded to the longest side in one call)."""
    module, tower, batch = setup
    module = module.clone(backbone_config=dataclasses.replace(module.backbone_config, dropout_rate=0.0))
    batch = {**batch, "positive_input_ids": batch["positive_input_ids"][:, :7],
             "positive_attention_mask": batch["positive_attention_mask"][:, :7]}
    one = Contrastive(negative="negative", learnable_temperature=True, bidirectional=True, chunk_size=chunk_size,
                      gradcache=gradcache)
    per_side = dataclasses.replace(one, single_call=False)
    assert [sides for sides, *_ in one.encoder_calls(batch, jax.random.PRNGKey(0))] == [["anchor", "positive", "negative"]]
    assert len(per_side.encoder_calls(batch, jax.random.PRNGKey(0))) == 3
    params = {"tower": tower, **one.init_params(16)}
    (l1, g1), (l2, g2) = [jax.jit(lambda p, c=c: c.loss_and_grads(module, p, batch, jax.random.PRNGKey(1)))(params)
                          for c in (one, per_side)]
    assert abs(float(l1) - float(l2)) <= 1e-5
    assert _max_diff(g1, g2) <= 1e-5
    assert max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(g1)) > 1e-2  # non-trivial gradients


def test_one_encoder_call_gives_every_text_its_own_dropout_mask(setup):
    """With dropout on, one call over both views of the same texts (SimCSE) still gives the two
    views different embeddings, and a new rng changes them; without dropout the views are equal."""
    from sentemb_jax.methods.contrastive import SimCSE
    from sentemb_jax.training.step import embed_side, split_sides

    module, tower, batch = setup
    views = {f"{v}_{k}": batch[f"anchor_{k}"] for v in ("view1", "view2") for k in ("input_ids", "attention_mask")}
    (sides, ids, mask, _), = SimCSE().encoder_calls(views, jax.random.PRNGKey(0))
    assert ids.shape == (2 * B, L) and bool(jnp.all(ids[0::2] == ids[1::2]))  # text by text: view1, view2
    embed = jax.jit(lambda rng: split_sides(embed_side(module, tower, ids, mask, rng, None), sides))
    out = embed(jax.random.PRNGKey(0))
    gap = jnp.abs(out["view1"] - out["view2"]).max(axis=-1)
    assert float(gap.min()) > 1e-3  # each text's two views differ
    assert float(jnp.abs(out["view1"] - embed(jax.random.PRNGKey(1))["view1"]).max()) > 1e-3
    deterministic = module.apply({"params": tower}, ids, mask)
    assert float(jnp.abs(split_sides(deterministic, sides)["view1"] - split_sides(deterministic, sides)["view2"]).max()) == 0.0


def test_interleaving_keeps_each_texts_sides_together_and_refuses_unequal_batches(setup):
    from sentemb_jax.training.step import interleave_rows, interleave_sides, split_sides

    _, _, batch = setup
    sides = ["anchor", "positive", "negative"]
    ids, mask = interleave_sides(batch, sides)
    assert ids.shape == (3 * B, L)
    for i, s in enumerate(sides):
        assert bool(jnp.all(ids[i::3] == batch[f"{s}_input_ids"])) and bool(jnp.all(mask[i::3] == batch[f"{s}_attention_mask"]))
    by_side = split_sides(ids, sides)
    assert all(bool(jnp.all(by_side[s] == batch[f"{s}_input_ids"])) for s in sides)
    assert bool(jnp.all(interleave_rows(by_side, sides) == ids))
    short = {**batch, "negative_input_ids": batch["negative_input_ids"][:8], "negative_attention_mask": batch["negative_attention_mask"][:8]}
    with pytest.raises(ValueError, match=r"have \[8, 64\] rows"):
        interleave_sides(short, sides)

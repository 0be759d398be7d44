"""Sequence packing: the packed layout is exact, and packed embeddings / gradients equal unpacked ones."""
import dataclasses
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax.data.packing import first_fit_decreasing, pack_batch, pack_texts
from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.models import BertConfig, T5Config
from sentemb_jax.models.sentence import SentenceEmbedder

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

SIDES = ("anchor", "positive", "negative")


def _batch(rng, n=16, width=16, vocab=100, min_len=1):
    batch = {}
    for side in SIDES:
        lengths = rng.integers(min_len, width + 1, n)
        mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
        batch[f"{side}_input_ids"] = (rng.integers(3, vocab, (n, width)) * mask).astype(np.int32)
        batch[f"{side}_attention_mask"] = mask
    return batch


def test_first_fit_decreasing_fills_rows_and_keeps_every_text():
    lengths = [10, 3, 7, 5, 9, 1, 16, 2]
    rows = first_fit_decreasing(lengths, 16)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 16 for r in rows)
    assert len(rows) == 4  # 53 tokens in 16-token rows: 4 is the minimum
    with pytest.raises(ValueError, match="text 0 has 17 tokens, more than the packing row length 16"):
        first_fit_decreasing([17], 16)


def test_pack_texts_layout_round_trips():
    rng = np.random.default_rng(0)
    batch = _batch(rng, n=10, width=12)
    packed = pack_batch(batch, SIDES, row_length=24, pad_id=0, row_multiple=4)
    rows = packed["packed_input_ids"]
    assert rows.shape[0] % 4 == 0 and rows.shape[1] == 24
    flat_ids, flat_seg, flat_pos = (packed[k].reshape(-1) for k in ("packed_input_ids", "packed_segment_ids", "packed_positions"))
    ids = np.concatenate([batch[f"{s}_input_ids"] for s in SIDES])
    mask = np.concatenate([batch[f"{s}_attention_mask"] for s in SIDES])
    np.testing.assert_array_equal(packed["packed_token_mask"], mask)
    for t in range(len(ids)):
        n = mask[t].sum()
        index = packed["packed_token_index"][t, :n]
        np.testing.assert_array_equal(flat_ids[index], ids[t, :n])  # the text's tokens, in order
        np.testing.assert_array_equal(flat_pos[index], np.arange(n))  # positions restart per text
        assert len(set(flat_seg[index])) == 1 and flat_seg[index][0] > 0  # one segment per text
        assert np.all(np.diff(index) == 1)  # contiguous
    # Every real token is used once; padding has segment 0.
    assert (flat_seg > 0).sum() == mask.sum()
    # Fewer tokens than the per-side padded batch.
    assert rows.size < sum(batch[f"{s}_input_ids"].size for s in SIDES)


def _models():
    t5 = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, dropout_rate=0.0, dense_act_fn="gelu_new", is_gated_act=True)
    bert = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    roberta = dataclasses.replace(bert, model_type="roberta", pad_token_id=1)
    return {
        "t5_mean": SentenceEmbedder(t5, pooling=("mean",), projection_dim=16),
        "t5_encdec_first": SentenceEmbedder(t5, pooling=("encdec_first",), projection_dim=16),
        "t5_first_and_mean": SentenceEmbedder(t5, pooling=("first", "mean")),
        "bert_cls_max": SentenceEmbedder(bert, pooling=("cls", "max")),
        "bert_first_last_avg": SentenceEmbedder(bert, pooling=("first_last_avg",)),
        "roberta_mean": SentenceEmbedder(roberta, pooling=("mean",)),
    }


@pytest.mark.parametrize("name", list(_models()))
def test_packed_embeddings_equal_unpacked(name):
    module = _models()[name]
    rng = np.random.default_rng(1)
    batch = _batch(rng, n=12, width=16, min_len=1)
    pad = 1 if name.startswith("roberta") else 0
    for s in SIDES:  # the model's pad id in padding positions
        batch[f"{s}_input_ids"] = np.where(batch[f"{s}_attention_mask"] > 0, batch[f"{s}_input_ids"], pad).astype(np.int32)
    params = module.init(jax.random.PRNGKey(0), batch["anchor_input_ids"][:2], batch["anchor_attention_mask"][:2])["params"]
    unpacked = np.concatenate([module.apply({"params": params}, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"])
                               for s in SIDES])
    packed = pack_texts([batch[f"{s}_input_ids"] for s in SIDES], [batch[f"{s}_attention_mask"] for s in SIDES],
                        row_length=32, pad_id=pad)
    packing = {k: packed[f"packed_{k}"] for k in ("segment_ids", "positions", "token_index", "token_mask")}
    out = module.apply({"params": params}, packed["packed_input_ids"], None, packing=packing)
    assert out.shape == unpacked.shape
    np.testing.assert_allclose(np.asarray(out), unpacked, atol=2e-6, rtol=0)


def test_packed_loss_and_gradients_equal_unpacked():
    module = _models()["t5_encdec_first"]
    batch = _batch(np.random.default_rng(2), n=16, width=16)
    params = {"tower": nn.meta.unbox(module.init(jax.random.PRNGKey(0), batch["anchor_input_ids"][:2],
                                                 batch["anchor_attention_mask"][:2])["params"])}
    cfg = Contrastive(negative="negative", bidirectional=True)
    packed = {k: jnp.asarray(v) for k, v in pack_batch(batch, SIDES, row_length=32, pad_id=0).items()}
    l1, g1 = cfg.loss_and_grads(module, params, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(0))
    l2, g2 = jax.jit(lambda p, b: cfg.loss_and_grads(module, p, b, jax.random.PRNGKey(0)))(params, packed)
    assert abs(float(l1) - float(l2)) <= 1e-5
    diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), g1, g2))
    assert max(diffs) <= 1e-5
    assert max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(g1)) > 1e-2
    with pytest.raises(ValueError, match="packed batches run the whole batch in one call"):
        dataclasses.replace(cfg, chunk_size=8).loss_and_grads(module, params, packed, jax.random.PRNGKey(0))


@pytest.mark.parametrize("backbone,pooling", [("bert", "first"), ("bert", "mean"), ("t5", "first")])
def test_packed_cross_encoder_logits_and_gradients_equal_padded(backbone, pooling):
    """Cross-encoder pairs packed into rows (token types packed along): same logits, same gradients."""
    import optax

    from sentemb_jax.methods.trans_encoder import cross_step
    from sentemb_jax.models.cross import CrossEncoderModule
    from sentemb_jax.training.method import TrainState

    module = CrossEncoderModule(_models()[f"{backbone}_mean" if backbone == "t5" else "bert_cls_max"].backbone_config,
                                pooling=pooling, head_dropout=0.0)
    rng = np.random.default_rng(3)
    n, width = 12, 20
    lengths = rng.integers(3, width + 1, n)
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    ids = (rng.integers(3, 100, (n, width)) * mask).astype(np.int32)
    first_len = rng.integers(1, lengths)  # the second sentence's tokens have type 1
    types = ((np.arange(width)[None] >= first_len[:, None]) * mask).astype(np.int32)
    feats = {"input_ids": ids, "attention_mask": mask}
    if backbone == "bert":
        feats["token_type_ids"] = types
    params = module.init(jax.random.PRNGKey(0), ids[:2], mask[:2])["params"]
    extras = {"token_type_ids": [types]} if backbone == "bert" else None
    packed = pack_texts([ids], [mask], row_length=24, pad_id=0, row_multiple=4, extras=extras)
    assert packed["packed_input_ids"].size < ids.size  # fewer tokens than padded
    if backbone == "bert":  # token types travel with their tokens
        flat = packed["packed_token_type_ids"].reshape(-1)
        for t in range(n):
            np.testing.assert_array_equal(flat[packed["packed_token_index"][t, : lengths[t]]], types[t, : lengths[t]])
    packing = {k: packed[f"packed_{k}"] for k in ("segment_ids", "positions", "token_index", "token_mask")}
    padded = module.apply({"params": params}, **feats)
    out = module.apply({"params": params}, packed["packed_input_ids"], None, packed.get("packed_token_type_ids"),
                       packing=packing)
    np.testing.assert_allclose(np.asarray(out), np.asarray(padded), atol=2e-6, rtol=0)

    labels = rng.uniform(0, 1, n).astype(np.float32)
    opt = optax.sgd(1.0)
    grads = {}
    for name, batch in (("padded", {**feats, "labels": labels}), ("packed", {**feats, **packed, "labels": labels})):
        state = TrainState(step=jnp.zeros((), jnp.int32), params={"tower": params}, opt_state=opt.init({"tower": params}))
        new, metrics = cross_step(state, batch, jax.random.PRNGKey(0), module=module, optimizer=opt)
        grads[name] = (float(metrics["loss"]), jax.tree_util.tree_map(lambda a, b: a - b, params, new.params["tower"]))
    assert abs(grads["padded"][0] - grads["packed"][0]) <= 1e-6
    diffs = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), grads["padded"][1], grads["packed"][1])
    assert max(jax.tree_util.tree_leaves(diffs)) <= 1e-5
    assert max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(grads["padded"][1])) > 1e-3  # not a no-op


# The item-by-item forms the vectorised packer replaced: the reference it must equal exactly.
def _loop_first_fit(lengths: Sequence[int], row_length: int) -> list[list[int]]:
    """Bins of item indices, each bin's lengths summing to at most `row_length` (longest first)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = int(lengths[i])
        if n > row_length:
            raise ValueError(f"text {i} has {n} tokens, more than the packing row length {row_length}")
        for r, space in enumerate(free):
            if n <= space:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_length - n)
    return rows


def _loop_fill_rows(tokens: Sequence[Sequence[int]], rows_of_items: Sequence[Sequence[int]], row_length: int, rows: int,
              text_slots: int, width: int, pad_id: int, extras: dict[str, Sequence[Sequence[int]]] | None = None,
              slot_by_item: bool = False) -> dict:
    """The packed arrays of items laid out as `rows_of_items` (row r holds those items, in order):
    `input_ids` (and each extra, e.g. token_type_ids) [rows, row_length], and `packing` =
    segment_ids / positions [rows, row_length], token_index / token_mask [text_slots, width].
    An item's text slot is its index (slot_by_item) or its place in row order; an empty item keeps
    a one-token (padding) segment. Unused slots point at token 0 with a one-token mask (a finite
    result to drop)."""
    extras = extras or {}
    ids = np.full((rows, row_length), pad_id, np.int32)
    more = {name: np.zeros((rows, row_length), np.int32) for name in extras}
    segments = np.zeros((rows, row_length), np.int32)
    positions = np.zeros((rows, row_length), np.int32)
    token_index = np.zeros((text_slots, width), np.int32)
    token_mask = np.zeros((text_slots, width), np.int32)
    token_mask[:, 0] = 1
    k = 0
    for r, members in enumerate(rows_of_items):
        start = 0
        for s, item in enumerate(members, start=1):
            n, slot = len(tokens[item]), (item if slot_by_item else k)
            ids[r, start : start + n] = tokens[item]
            for name, values in extras.items():
                more[name][r, start : start + n] = values[item]
            segments[r, start : start + max(n, 1)] = s
            positions[r, start : start + n] = np.arange(n)
            token_index[slot, :n] = r * row_length + start + np.arange(n)
            token_index[slot, n:] = r * row_length + start  # padding slots point at the text's first token (masked)
            token_mask[slot] = 0
            token_mask[slot, :n] = 1
            start += max(n, 1)
            k += 1
    packing = {"segment_ids": segments, "positions": positions, "token_index": token_index, "token_mask": token_mask}
    return {"input_ids": ids, **more, "packing": packing}


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_packer_equals_the_item_by_item_one(seed):
    """Random lengths (empty texts included), extras, both slot orders, a row count rounded up:
    first-fit's rows and every array of fill_rows are equal to the loops' exactly."""
    from sentemb_jax.data.packing import fill_rows

    rng = np.random.default_rng(seed)
    row_length = int(rng.choice([8, 16, 64]))
    lengths = rng.integers(0, row_length + 1, int(rng.integers(1, 200)))
    assert first_fit_decreasing(lengths, row_length) == _loop_first_fit(lengths.tolist(), row_length)
    bins = first_fit_decreasing(np.maximum(lengths, 1), row_length)
    tokens = [rng.integers(3, 1000, n).tolist() for n in lengths]
    extras = {"token_type_ids": [rng.integers(0, 2, n).tolist() for n in lengths]}
    width = int(max(lengths.max(), 1))
    for slot_by_item in (True, False):
        args = (tokens, bins, row_length, len(bins) + 3, len(lengths) + 2, width, 7, extras)
        got, want = fill_rows(*args, slot_by_item=slot_by_item), _loop_fill_rows(*args, slot_by_item=slot_by_item)
        for key in ("input_ids", "token_type_ids"):
            np.testing.assert_array_equal(got[key], want[key])
        for key in want["packing"]:
            np.testing.assert_array_equal(got["packing"][key], want["packing"][key], err_msg=key)


def test_pack_batch_equals_the_text_by_text_packer():
    """pack_texts gathers tokens from the side matrices (sides of different widths, empty texts,
    an extra): the same arrays as packing each text's tokens through the loops."""
    rng = np.random.default_rng(3)
    sides = [rng.integers(3, 500, (n, w)) for n, w in ((9, 12), (9, 7), (4, 12))]
    masks = [(np.arange(x.shape[1])[None] < rng.integers(0, x.shape[1] + 1, (len(x), 1))).astype(np.int32) for x in sides]
    types = [rng.integers(0, 2, x.shape) for x in sides]
    got = pack_texts(sides, masks, row_length=16, pad_id=1, row_multiple=4, extras={"token_type_ids": types})

    def texts(mats):
        return [x[i, : m[i].sum()] for x, m in zip(mats, masks) for i in range(len(x))]

    lengths = np.concatenate([m.sum(1) for m in masks])
    bins = _loop_first_fit(np.maximum(lengths, 1).tolist(), 16)
    want = _loop_fill_rows(texts(sides), bins, 16, -(-len(bins) // 4) * 4, len(lengths), 12, 1,
                           {"token_type_ids": texts(types)}, slot_by_item=True)
    np.testing.assert_array_equal(got["packed_input_ids"], want["input_ids"])
    np.testing.assert_array_equal(got["packed_token_type_ids"], want["token_type_ids"])
    for key, value in want["packing"].items():
        np.testing.assert_array_equal(got[f"packed_{key}"], value, err_msg=key)

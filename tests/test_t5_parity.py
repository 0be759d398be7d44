"""Our Flax T5 equals Hugging Face's PyTorch T5 on random tiny configs, with padding."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_models import make_t5, padded_batch

from sentemb_jax.checkpoints import load_hf_checkpoint
from sentemb_jax.models import build_model
from sentemb_jax.models.sentence import SentenceEmbedder

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

TOL = 1e-4
LENGTHS = [19, 7, 12, 1]


@pytest.fixture(scope="module", params=["1.0", "1.1"])
def t5(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(f"t5_{request.param}"))
    ref = make_t5(path, request.param)
    cfg, params, _ = load_hf_checkpoint(path)
    ids, mask = padded_batch(cfg.vocab_size, LENGTHS, cfg.pad_token_id)
    return request.param, path, ref, cfg, params, ids, mask


def _encode(cfg, params, ids, mask):
    out, _ = build_model(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), method="encode")
    return np.asarray(out)


def test_config_read_from_checkpoint(t5):
    version, _, _, cfg, _, _, _ = t5
    if version == "1.0":
        assert (cfg.dense_act_fn, cfg.is_gated_act, cfg.tie_word_embeddings, cfg.scale_decoder_outputs) == ("relu", False, True, True)
    else:
        assert (cfg.dense_act_fn, cfg.is_gated_act, cfg.tie_word_embeddings, cfg.scale_decoder_outputs) == ("gelu_new", True, False, False)
        assert cfg.has_lm_head


def test_encoder_last_hidden_state(t5):
    _, _, ref, cfg, params, ids, mask = t5
    with torch.no_grad():
        want = ref.encoder(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    got = _encode(cfg, params, ids, mask)
    valid = mask.astype(bool)
    assert np.abs(got - want)[valid].max() <= TOL
    assert np.abs(got - want).max() <= TOL  # padded positions too


def test_encoder_hidden_states_match_hf(t5):
    _, _, ref, cfg, params, ids, mask = t5
    with torch.no_grad():
        want = ref.encoder(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True).hidden_states
    _, got = build_model(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), True, True, method="encode")
    assert len(got) == len(want) == cfg.num_layers + 1
    for g, w in zip(got, want):
        assert np.abs(np.asarray(g) - w.numpy()).max() <= TOL


def test_encoder_decoder_first_token_and_logits(t5):
    _, _, ref, cfg, params, ids, mask = t5
    start = torch.full((ids.shape[0], 1), cfg.decoder_start_token_id)
    with torch.no_grad():
        out = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), decoder_input_ids=start, output_hidden_states=True)
    model = build_model(cfg)
    encoded = _encode(cfg, params, ids, mask)
    first = model.apply({"params": params}, jnp.asarray(encoded), jnp.asarray(mask), method="decode_first_token")
    assert np.abs(np.asarray(first) - out.decoder_hidden_states[-1][:, 0].numpy()).max() <= TOL
    logits = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(start.numpy()))
    assert np.abs(np.asarray(logits) - out.logits.numpy()).max() <= TOL


def test_decoder_longer_sequence(t5):
    """Causal self-attention with relative buckets over several decoder positions."""
    _, _, ref, cfg, params, ids, mask = t5
    dec = np.random.default_rng(1).integers(2, cfg.vocab_size, size=(ids.shape[0], 9))
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), decoder_input_ids=torch.tensor(dec),
                   output_hidden_states=True).decoder_hidden_states[-1].numpy()
    model = build_model(cfg)
    encoded = _encode(cfg, params, ids, mask)
    got = model.apply({"params": params}, jnp.asarray(dec), jnp.asarray(encoded), jnp.asarray(mask), method="decode")
    assert np.abs(np.asarray(got) - want).max() <= TOL


def test_scan_layers_equal_loop(t5):
    from sentemb_jax.checkpoints import stack_layers

    _, _, _, cfg, params, ids, mask = t5
    scanned = dataclasses.replace(cfg, scan_layers=True, remat=True)
    a = _encode(cfg, params, ids, mask)
    b = _encode(scanned, stack_layers(params), ids, mask)
    assert np.abs(a - b).max() <= 1e-5


def test_bfloat16_activations_close(t5):
    _, _, _, cfg, params, ids, mask = t5
    a = _encode(cfg, params, ids, mask)
    b = _encode(dataclasses.replace(cfg, dtype=jnp.bfloat16), params, ids, mask)
    assert b.dtype == jnp.bfloat16
    cos = np.sum(a * b.astype(np.float32), -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b.astype(np.float32), axis=-1)
    assert cos[mask.astype(bool)].min() > 0.99


def test_dropout_active_only_when_not_deterministic(t5):
    _, _, _, cfg, params, ids, mask = t5
    model = SentenceEmbedder(cfg, pooling=("mean",))
    p = {"backbone": params}
    det = model.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask))
    d1 = model.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask), False, rngs={"dropout": jax.random.PRNGKey(1)})
    d2 = model.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask), False, rngs={"dropout": jax.random.PRNGKey(2)})
    d1b = model.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask), False, rngs={"dropout": jax.random.PRNGKey(1)})
    assert np.abs(np.asarray(d1) - np.asarray(d2)).max() > 1e-3
    assert np.abs(np.asarray(d1) - np.asarray(det)).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(d1), np.asarray(d1b))


def test_encoder_only_checkpoint(tmp_path):
    ref = make_t5(str(tmp_path), "1.1", encoder_only=True)
    cfg, params, _ = load_hf_checkpoint(str(tmp_path))
    assert not cfg.has_decoder and "decoder" not in params
    ids, mask = padded_batch(cfg.vocab_size, LENGTHS, 0)
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    assert np.abs(_encode(cfg, params, ids, mask) - want).max() <= TOL


def test_relative_position_buckets_match_hf():
    from transformers.models.t5.modeling_t5 import T5Attention

    from sentemb_jax.models.t5 import relative_position_bucket

    rel = np.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        for buckets, dist in ((32, 128), (8, 16)):
            want = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional, buckets, dist).numpy()
            got = np.asarray(relative_position_bucket(jnp.asarray(rel, jnp.int32), bidirectional, buckets, dist))
            np.testing.assert_array_equal(got, want)

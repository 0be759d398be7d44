"""Random initialisation as t5x does it (what training from scratch depends on)."""
import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

from sentemb_jax.models import T5Config, build_model
from sentemb_jax.models.sentence import SentenceEmbedder

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def test_query_init_folds_in_one_over_sqrt_head_dim():
    # T5 attention has no 1/sqrt(d_kv) on the logits; t5x puts it into the query's init instead.
    cfg = T5Config(vocab_size=64, d_model=128, d_ff=256, num_layers=1, num_heads=4, d_kv=64, has_decoder=False)
    ids = np.ones((1, 8), np.int32)
    params = nn.meta.unbox(SentenceEmbedder(cfg).init(jax.random.PRNGKey(0), ids, ids)["params"])
    attention = params["backbone"]["encoder"]["layers_0"]["self_attention"]
    ratio = float(np.std(attention["query"]["kernel"]) / np.std(attention["key"]["kernel"]))
    np.testing.assert_allclose(ratio, 64 ** -0.5, rtol=0.05)
    np.testing.assert_allclose(float(np.std(attention["key"]["kernel"])), 128 ** -0.5, rtol=0.05)  # fan-in



def test_dropout_placement_switches():
    # ST5-EncDec from scratch keeps dropout inside the encoder's layers only: the final states
    # (what mean pooling averages, what cross-attention reads) and the decoder go undropped.
    ids = np.tile(np.arange(2, 14, dtype=np.int32), (3, 1))
    mask = np.ones_like(ids)
    base = T5Config(vocab_size=64, d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=2, d_kv=32,
                    dropout_rate=0.3, decoder_dropout_rate=0.0)
    for final in (True, False):
        model = build_model(dataclasses.replace(base, dropout_final_states=final))
        params = {"params": nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids, mask)["params"])}
        encoded, _ = model.apply(params, ids, mask, False, method="encode", rngs={"dropout": jax.random.PRNGKey(1)})
        encoded = np.asarray(encoded)
        if final:  # T5's final dropout zeroes ~30% of the states
            assert 0.2 < float(np.mean(encoded == 0.0)) < 0.4
        else:  # every state is the final RMSNorm's output (scale 1 at init), yet the layers did drop
            np.testing.assert_allclose(np.sqrt(np.mean(encoded**2, -1)), 1.0, rtol=1e-4)
            encoded_det, _ = model.apply(params, ids, mask, True, method="encode")
            assert np.abs(encoded - np.asarray(encoded_det)).max() > 1e-2
        # decoder_dropout_rate 0: the first-token state does not depend on the dropout rng.
        first = [np.asarray(model.apply(params, encoded, mask, False, method="decode_first_token",
                                        rngs={"dropout": jax.random.PRNGKey(k)})) for k in (2, 3)]
        np.testing.assert_array_equal(first[0], first[1])
        np.testing.assert_array_equal(first[0], np.asarray(model.apply(params, encoded, mask, True,
                                                                        method="decode_first_token")))

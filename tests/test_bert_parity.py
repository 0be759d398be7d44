"""Our Flax BERT / RoBERTa equal Hugging Face's PyTorch models on random tiny configs, with padding."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_models import make_bert, padded_batch

from sentemb_jax.checkpoints import load_hf_checkpoint, stack_layers
from sentemb_jax.models import build_model

TOL = 1e-4


@pytest.fixture(scope="module", params=["bert", "roberta"])
def bert(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    ref = make_bert(path, request.param)
    cfg, params, _ = load_hf_checkpoint(path)
    ids, mask = padded_batch(cfg.vocab_size, [23, 5, 11, 2], cfg.pad_token_id, low=cfg.pad_token_id + 1)
    return request.param, ref, cfg, params, ids, mask


def _run(cfg, params, ids, mask, hidden=False):
    return build_model(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), True, hidden, method="encode")


def test_model_type(bert):
    kind, _, cfg, _, _, _ = bert
    assert cfg.model_type == kind and cfg.add_pooling_layer


def test_last_hidden_state_and_pooler(bert):
    _, ref, cfg, params, ids, mask = bert
    with torch.no_grad():
        out = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
    last, hidden = _run(cfg, params, ids, mask, hidden=True)
    assert np.abs(np.asarray(last) - out.last_hidden_state.numpy()).max() <= TOL
    assert len(hidden) == len(out.hidden_states) == cfg.num_hidden_layers + 1
    for g, w in zip(hidden, out.hidden_states):
        assert np.abs(np.asarray(g) - w.numpy()).max() <= TOL
    pooled = build_model(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
    assert np.abs(np.asarray(pooled) - out.pooler_output.numpy()).max() <= TOL


def test_roberta_positions_offset_by_padding_idx():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    from sentemb_jax.models.bert import BertConfig, position_ids_for

    ids = np.array([[5, 6, 7, 1, 1], [8, 1, 1, 1, 1]])
    got = np.asarray(position_ids_for(BertConfig(model_type="roberta", pad_token_id=1), jnp.asarray(ids)))
    want = RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(ids), padding_idx=1).numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0], [2, 3, 4, 1, 1])


def test_scan_equals_loop(bert):
    _, _, cfg, params, ids, mask = bert
    a, _ = _run(cfg, params, ids, mask)
    b, _ = _run(dataclasses.replace(cfg, scan_layers=True), stack_layers(params), ids, mask)
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5

"""Loaded files are checked for consistency, not only for shape: config.json values of the right
type and range, a tokenizer whose ids fit the embedding table, floating and finite tensors, a
prompt that leaves room for the text; and a save never leaves weight files that would load
instead of it."""
import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest
from flax import traverse_util
from hf_models import make_bert, make_minilm_shaped_bert
from safetensors.numpy import load_file, save_file

from sentemb_jax import checkpoints
from sentemb_jax import encode_contract as contract
from sentemb_jax.checkpoints import config_from_hf, load_hf_checkpoint, save_hf_checkpoint
from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import CheckpointError
from sentemb_jax.models import BertConfig
from sentemb_jax.training.config import TowerConfig
from sentemb_jax.training.setup import load_tower

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny random BERT: vocab 120, hidden 32, 4 heads, 3 layers, with a pooler; no tokenizer."""
    path = str(tmp_path_factory.mktemp("bert"))
    make_bert(path, "bert")
    return path


def _not_read(*args, **kwargs):
    raise AssertionError("tensors were read before config.json was checked")


def test_config_values_of_the_wrong_type_or_range_are_named_before_any_tensor_is_read(bert_dir, tmp_path, monkeypatch):
    d = tmp_path / "bad_config"
    shutil.copytree(bert_dir, d)
    hf = json.loads((d / "config.json").read_text())
    hf.update(num_attention_heads="12", type_vocab_size=0, pad_token_id=120, hidden_dropout_prob=1.0, layer_norm_eps=0)
    (d / "config.json").write_text(json.dumps(hf))
    monkeypatch.setattr(checkpoints, "read_hf_tensors", _not_read)
    with pytest.raises(CheckpointError) as e:
        load_hf_checkpoint(str(d))
    assert str(e.value) == (
        f"{d}/config.json: num_attention_heads must be a positive integer, got '12' (str); "
        "type_vocab_size must be a positive integer, got 0 (int); "
        "pad_token_id must be an integer in [0, vocab_size=120), got 120 (int); "
        "hidden_dropout_prob must be a probability in [0, 1), got 1.0 (float); "
        "layer_norm_eps must be a number > 0, got 0 (int)")
    with pytest.raises(CheckpointError, match=r"config\.json: num_attention_heads must be a positive integer, got '12'"):
        SentenceEncoder.from_pretrained(str(d))
    with pytest.raises(CheckpointError, match=r"config\.json: num_attention_heads must be a positive integer, got '12'"):
        CrossEncoder.from_pretrained(str(d))

    # A dict given to config_from_hf directly (no file) is checked too, before transformers sees it.
    with pytest.raises(CheckpointError) as e:
        config_from_hf({"model_type": "bert", "hidden_size": 30, "num_attention_heads": 4})
    assert str(e.value) == "config.json: hidden_size 30 must be a multiple of num_attention_heads 4"
    with pytest.raises(CheckpointError) as e:
        config_from_hf({"model_type": "t5", "vocab_size": 160, "d_kv": 8.0, "num_decoder_layers": None, "eos_token_id": 160,
                        "decoder_start_token_id": None, "dropout_rate": True, "layer_norm_epsilon": float("nan")},
                       source="t5/config.json")
    assert str(e.value) == ("t5/config.json: d_kv must be a positive integer, got 8.0 (float); "
                            "eos_token_id must be an integer in [0, vocab_size=160), got 160 (int); "
                            "dropout_rate must be a probability in [0, 1), got True (bool); "
                            "layer_norm_epsilon must be a number > 0, got nan (float)")


def test_a_tokenizer_with_ids_past_the_embedding_table_is_refused(bert_dir, minilm_dir, tmp_path):
    """all-MiniLM-L6-v2's tokenizer (30,522 ids) beside a model with 120 embedding rows."""
    d = tmp_path / "mismatched"
    shutil.copytree(bert_dir, d)
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(minilm_dir, name)):
            shutil.copy(os.path.join(minilm_dir, name), d)
    want = (f"{d}: the tokenizer's largest token id is 30521, but the model's embedding table has 120 rows (vocab_size); "
            "ids >= 120 have no embedding")
    for load in (SentenceEncoder.from_pretrained, CrossEncoder.from_pretrained):
        with pytest.raises(CheckpointError) as e:
            load(str(d))
        assert str(e.value) == want, load
    backbone = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    with pytest.raises(CheckpointError) as e:
        load_tower(TowerConfig(tokenizer_dir=minilm_dir, backbone=backbone), 32)
    assert str(e.value) == (f"{minilm_dir} (TowerConfig.tokenizer_dir, beside TowerConfig.backbone): the tokenizer's largest "
                            "token id is 30521, but the model's embedding table has 120 rows (vocab_size); ids >= 120 have "
                            "no embedding")


def test_tensors_of_a_non_floating_dtype_or_holding_nan_or_inf_are_refused(bert_dir, tmp_path):
    d = tmp_path / "bad_tensors"
    shutil.copytree(bert_dir, d)
    tensors = load_file(str(d / "model.safetensors"))
    query = "encoder.layer.0.attention.self.query.weight"
    tensors[query] = np.ones(tensors[query].shape, np.int64)
    tensors["embeddings.LayerNorm.weight"] = np.ones(32, bool)
    bias = tensors["pooler.dense.bias"].copy()
    bias[:3] = [np.nan, np.inf, -np.inf]
    tensors["pooler.dense.bias"] = bias
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        load_hf_checkpoint(str(d))
    assert str(e.value) == (f"{d}: tensors of a non-floating dtype for floating parameters (2): "
                            f"embeddings.LayerNorm.weight: bool; {query}: int64 | "
                            "tensors holding NaN or inf (1): pooler.dense.bias: 3 of 32 values")


def test_a_prompt_that_fills_max_seq_length_is_warned_about_once(minilm_dir, tmp_path, caplog):
    d = tmp_path / "small"
    make_minilm_shaped_bert(d, minilm_dir, layers=1, hidden=32)
    enc = SentenceEncoder.from_pretrained(str(d), max_seq_length=16)
    full = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "  # 14 = 16 - [CLS], [SEP]
    with caplog.at_level(logging.WARNING, logger=contract.__name__):
        a = enc.encode(["a cat sleeps.", "stock markets fell sharply today."], prompt=full)
        enc.encode(["another text"], prompt=full)
        contract.with_prompt(["x"], enc, full[:-len("fourteen ")], None, "SentenceEncoder.encode")  # 13 tokens: room for 1
    warnings = [r.getMessage() for r in caplog.records if r.name == contract.__name__]
    assert warnings == [f"SentenceEncoder.encode: the prompt is 14 tokens and max_seq_length is 16 (14 beside the special "
                        f"tokens): no token of the text is left after truncation, so every text embeds the same; "
                        f"prompt {full[:57] + '...'!r}"]
    np.testing.assert_allclose(a[0], a[1], rtol=0, atol=1e-6)  # what the warning says
    assert contract._PROMPT_TOKENS[enc.tokenizer] == {full: 14, full[:-len("fourteen ")]: 13}  # each counted once


def _flat(params) -> dict:
    return traverse_util.flatten_dict(jax.device_get(params))


def test_a_save_removes_the_weight_files_of_other_layouts_it_does_not_overwrite(bert_dir, tmp_path, caplog):
    cfg, params, hf = load_hf_checkpoint(bert_dir)
    d = tmp_path / "out"
    save_hf_checkpoint(str(d), cfg, params, hf, max_shard_bytes=60_000)  # an earlier sharded save
    shards = sorted(set(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values()))
    assert len(shards) > 2
    (d / "pytorch_model.bin").write_bytes(b"old")
    (d / "pytorch_model-00001-of-00001.bin").write_bytes(b"old")
    (tmp_path / "outside.bin").write_bytes(b"not the directory's")
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {
        "a": "pytorch_model-00001-of-00001.bin", "b": "../outside.bin", "c": "config.json"}}))
    with caplog.at_level(logging.WARNING, logger="sentemb_jax.checkpoint_checks"):
        save_hf_checkpoint(str(d), cfg, params, hf)
    removed = ["pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json", *shards,
               "pytorch_model-00001-of-00001.bin"]
    assert [r.getMessage() for r in caplog.records if r.name == "sentemb_jax.checkpoint_checks"] == [
        f"{d}: removed {', '.join(removed)} (weights of an earlier save that this save does not overwrite, which could "
        "load instead of it)"]
    assert sorted(os.listdir(d)) == ["config.json", "model.safetensors"]
    assert (tmp_path / "outside.bin").read_bytes() == b"not the directory's"  # named by the index, but not the directory's


def test_a_sharded_save_over_an_old_model_safetensors_loads_the_new_weights(bert_dir, tmp_path):
    cfg, old, hf = load_hf_checkpoint(bert_dir)
    new = jax.tree_util.tree_map(lambda x: x + 1.0, old)
    d = tmp_path / "out"
    save_hf_checkpoint(str(d), cfg, old, hf)
    save_hf_checkpoint(str(d), cfg, new, hf, max_shard_bytes=60_000)
    assert "model.safetensors" not in os.listdir(d) and "model.safetensors.index.json" in os.listdir(d)
    _, loaded, _ = load_hf_checkpoint(str(d))
    got, want = _flat(loaded), _flat(new)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg="/".join(k))


def test_head_and_dense_tensors_of_a_non_floating_dtype_or_holding_nan_are_refused(tmp_path):
    """The tensors cast to float32 outside the backbone - a sentence-transformers Dense module, our
    cross-encoder head file, a Hugging Face sequence-classification head - are checked as the
    backbone's are: a non-floating dtype or NaN / inf values named, before the cast hides them."""
    from sentemb_jax.checkpoints import split_sequence_classifier
    from sentemb_jax.cross_encoder import HEAD_FILE, _our_head
    from sentemb_jax.st_layout import read_dense

    dense = tmp_path / "2_Dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"in_features": 4, "out_features": 2, "bias": True,
                                                   "activation_function": "torch.nn.modules.linear.Identity"}))
    save_file({"linear.weight": np.arange(8, dtype=np.int64).reshape(2, 4),
               "linear.bias": np.array([0.0, np.nan], np.float32)}, str(dense / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        read_dense(str(dense), 4, allow_pickle=False)
    assert str(e.value) == (f"{dense}: tensors of a non-floating dtype for floating parameters (1): linear.weight: int64; "
                            "tensors holding NaN or inf (1): linear.bias: 1 of 2 values")

    save_file({"kernel": np.full((4, 1), np.inf, np.float32), "bias": np.zeros((1,), np.float32)},
              str(tmp_path / HEAD_FILE))
    with pytest.raises(CheckpointError, match=r"head\.safetensors: tensors holding NaN or inf \(1\): kernel: 4 of 4 values$"):
        _our_head(str(tmp_path), 4)

    head = {"classifier.weight": np.zeros((1, 4), np.float32), "classifier.bias": np.array([True]),
            "bert.pooler.dense.weight": np.zeros((4, 4), np.float32), "bert.pooler.dense.bias": np.zeros((4,), np.float32)}
    with pytest.raises(CheckpointError, match=r"^src: tensors of a non-floating dtype for floating parameters \(1\): "
                                              r"classifier\.bias: bool$"):
        split_sequence_classifier({"model_type": "bert"}, head, "src")
    head["classifier.bias"] = np.zeros((1,), np.float32)
    rest, params = split_sequence_classifier({"model_type": "bert"}, head, "src")
    assert rest == {} and params["pooler"]["kernel"].dtype == np.float32  # a usable head still loads


@pytest.mark.parametrize("reader", ["numpy", "seqio"])
def test_a_tokenizer_dir_beside_init_from_is_checked_against_the_embedding_table_on_both_routes(bert_dir, minilm_dir,
                                                                                                  reader):
    """TowerConfig.tokenizer_dir (all-MiniLM-L6-v2's, 30,522 ids) as the training input's tokenizer
    of a model with 120 embedding rows: refused before a batch is read, through the TensorFlow-free
    reader and through seqio alike."""
    from sentemb_jax.models.sentence import SentenceEmbedder
    from sentemb_jax.training import setup
    from sentemb_jax.training.config import DataConfig, RunConfig

    backbone = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    model = SentenceEncoder(SentenceEmbedder(backbone, pooling=("mean",)), None, None)
    config = RunConfig(model_dir="/unused", num_steps=1, model=TowerConfig(init_from=bert_dir, tokenizer_dir=minilm_dir),
                       data=DataConfig(reader=reader, sequence_length=16))
    with pytest.raises(CheckpointError) as e:
        setup._input(config, model, fixed_padding=True)
    assert str(e.value) == (f"{minilm_dir} (the tokenizer of the training input): the tokenizer's largest token id is "
                            "30521, but the model's embedding table has 120 rows (vocab_size); ids >= 120 have no embedding")

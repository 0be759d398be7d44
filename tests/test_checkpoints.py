"""Checkpoint import/export: clear errors naming tensors and files, exact round trips, safe loading."""
import json
import os
import shutil

import numpy as np
import pytest
import torch
from flax import traverse_util
from hf_models import make_bert, make_t5
from safetensors.numpy import load_file, save_file

from sentemb_jax.checkpoints import load_hf_checkpoint, read_hf_tensors, save_hf_checkpoint
from sentemb_jax.errors import CheckpointError


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bert"))
    make_bert(path, "bert")
    return path


def _edit_copy(src, dst, edit):
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)
    return dst


def test_missing_tensor_is_named(bert_dir, tmp_path):
    d = _edit_copy(bert_dir, tmp_path / "m", lambda t: t.pop("encoder.layer.1.attention.self.key.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors \(1\): encoder\.layer\.1\.attention\.self\.key\.weight"):
        load_hf_checkpoint(str(d))


def test_unexpected_tensor_is_named(bert_dir, tmp_path):
    d = _edit_copy(bert_dir, tmp_path / "u", lambda t: t.update({"encoder.layer.0.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors \(1\): encoder\.layer\.0\.extra\.weight"):
        load_hf_checkpoint(str(d))
    # ... unless the caller says to ignore it.
    load_hf_checkpoint(str(d), ignore_unexpected=[r"\.extra\."])


def test_wrong_shape_is_named(bert_dir, tmp_path):
    def edit(t):
        t["encoder.layer.2.intermediate.dense.weight"] = np.zeros((63, 32), np.float32)

    d = _edit_copy(bert_dir, tmp_path / "s", edit)
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.2\.intermediate\.dense\.weight: file has \(63, 32\), config expects \(64, 32\)"):
        load_hf_checkpoint(str(d))


def test_all_problems_reported_at_once(bert_dir, tmp_path):
    def edit(t):
        t.pop("pooler.dense.bias")
        t["bogus"] = np.zeros(1, np.float32)
        t["embeddings.LayerNorm.weight"] = np.zeros(7, np.float32)

    d = _edit_copy(bert_dir, tmp_path / "all", edit)
    with pytest.raises(CheckpointError) as e:
        load_hf_checkpoint(str(d))
    msg = str(e.value)
    assert "pooler.dense.bias" in msg and "bogus" in msg and "embeddings.LayerNorm.weight" in msg and str(d) in msg


def test_pickle_refused_without_opt_in(bert_dir, tmp_path):
    d = tmp_path / "pickled"
    shutil.copytree(bert_dir, d)
    tensors = load_file(str(d / "model.safetensors"))
    os.remove(d / "model.safetensors")
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: refusing a pickle-based checkpoint.*allow_pickle=True"):
        load_hf_checkpoint(str(d))
    _, params, _ = load_hf_checkpoint(str(d), allow_pickle=True)
    np.testing.assert_array_equal(params["embeddings"]["word_embeddings"]["embedding"], tensors["embeddings.word_embeddings.weight"])


def test_pickle_with_code_rejected_even_with_opt_in(tmp_path):
    """allow_pickle still goes through torch's weights-only loader: arbitrary objects are refused."""
    d = tmp_path / "evil"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="weights-only"):
        read_hf_tensors(str(d), allow_pickle=True)


def test_no_weights_and_truncated_file(bert_dir, tmp_path):
    d = tmp_path / "now"
    d.mkdir()
    shutil.copy(os.path.join(bert_dir, "config.json"), d)
    with pytest.raises(CheckpointError, match="no weights found"):
        load_hf_checkpoint(str(d))
    with open(os.path.join(bert_dir, "model.safetensors"), "rb") as f:
        (d / "model.safetensors").write_bytes(f.read()[:1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read safetensors"):
        load_hf_checkpoint(str(d))
    with pytest.raises(CheckpointError, match="no such model directory"):
        load_hf_checkpoint(str(tmp_path / "absent"))


def _assert_same_tree(a, b):
    fa, fb = traverse_util.flatten_dict(a), traverse_util.flatten_dict(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        assert fa[k].dtype == fb[k].dtype, k
        np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=str(k))


@pytest.mark.parametrize("kind", ["bert", "roberta", "t5-1.0", "t5-1.1"])
def test_round_trip_identical(kind, tmp_path):
    src = str(tmp_path / "src")
    if kind.startswith("t5"):
        make_t5(src, kind.split("-")[1])
    else:
        make_bert(src, kind)
    cfg, params, hf = load_hf_checkpoint(src)
    save_hf_checkpoint(str(tmp_path / "out"), cfg, params, hf)
    cfg2, params2, _ = load_hf_checkpoint(str(tmp_path / "out"))
    assert cfg2 == cfg
    _assert_same_tree(params, params2)
    # The file holds exactly the tensors of the source (buffers like position_ids aside).
    ours = load_file(str(tmp_path / "out" / "model.safetensors"))
    theirs = {k: v for k, v in load_file(os.path.join(src, "model.safetensors")).items() if k != "embeddings.position_ids"}
    assert ours.keys() == theirs.keys()
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k])


def test_sharded_round_trip_and_scan(tmp_path):
    import dataclasses

    src = str(tmp_path / "src")
    make_t5(src, "1.1")
    cfg, params, hf = load_hf_checkpoint(src)
    save_hf_checkpoint(str(tmp_path / "sharded"), cfg, params, hf, max_shard_bytes=20_000)
    files = sorted(os.listdir(tmp_path / "sharded"))
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
    cfg2, params2, _ = load_hf_checkpoint(str(tmp_path / "sharded"), scan_layers=True)
    assert cfg2 == dataclasses.replace(cfg, scan_layers=True)
    enc = params2["encoder"]["layers"]["self_attention"]["query"]["kernel"]
    assert enc.shape == (cfg.num_layers, cfg.d_model, cfg.num_heads * cfg.d_kv)
    # Scanned params export to the same unstacked layout.
    save_hf_checkpoint(str(tmp_path / "again"), cfg2, params2, hf)
    _, params3, _ = load_hf_checkpoint(str(tmp_path / "again"))
    _assert_same_tree(params, params3)


def test_missing_shard_named(tmp_path):
    src = str(tmp_path / "src")
    make_t5(src, "1.0")
    cfg, params, hf = load_hf_checkpoint(src)
    out = tmp_path / "sharded"
    save_hf_checkpoint(str(out), cfg, params, hf, max_shard_bytes=20_000)
    victim = sorted(f for f in os.listdir(out) if f.startswith("model-"))[1]
    os.remove(out / victim)
    with pytest.raises(CheckpointError, match=victim):
        load_hf_checkpoint(str(out))


def test_bert_task_heads_ignored_and_prefix_stripped(bert_dir, tmp_path):
    def edit(t):
        for k in list(t):
            t["bert." + k] = t.pop(k)
        t["cls.predictions.bias"] = np.zeros(120, np.float32)

    d = _edit_copy(bert_dir, tmp_path / "mlm", edit)
    _, params, _ = load_hf_checkpoint(str(d))
    _, ref, _ = load_hf_checkpoint(bert_dir)
    _assert_same_tree(params, ref)


@pytest.mark.parametrize("cfg", [
    "t5_v1_1_encoder", "t5_v1_0_encdec", "bert"])
def test_config_of_a_tower_from_scratch_reads_back(cfg):
    """A tower trained from scratch has no config.json to copy: hf_config_of writes one that
    config_from_hf turns back into the same backbone config (and transformers accepts)."""
    import transformers

    from sentemb_jax.checkpoints import config_from_hf, hf_config_of
    from sentemb_jax.models.bert import BertConfig
    from sentemb_jax.models.t5 import T5Config

    ours = {"t5_v1_1_encoder": T5Config(vocab_size=8192, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16,
                                        dense_act_fn="gelu_new", is_gated_act=True, tie_word_embeddings=False,
                                        scale_decoder_outputs=False, has_decoder=False),
            "t5_v1_0_encdec": T5Config(has_decoder=True), "bert": BertConfig(num_hidden_layers=2)}[cfg]
    hf = hf_config_of(ours)
    assert config_from_hf(hf) == ours
    theirs = transformers.AutoConfig.for_model(**hf)
    assert theirs.model_type == ours.model_type

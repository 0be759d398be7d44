"""The benchmark kit (sentemb_jax.benchmarks.portable_kit): a compact copy of the model and the data the
CPU benchmarks read, for a machine with neither. What it must keep: the model's outputs on the kit's
texts, bitwise; the data as the benchmarks read it."""
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from sentemb_jax import SentenceEncoder
from sentemb_jax.benchmarks import portable_kit
from sentemb_jax.data.files import FileSpec, read_examples, read_sts_pairs


@pytest.fixture(scope="module")
def kit(minilm_dir, data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("kit") / "kit")
    assert portable_kit.main(["pack", "--out", out, "--model", minilm_dir, "--data_dir", data_dir,
                              "--entailment_rows", "600"]) == 0
    model = str(tmp_path_factory.mktemp("unpacked") / "M")
    assert portable_kit.main(["unpack", os.path.join(out, "model"), model]) == 0
    return out, model


def test_the_kit_data_is_what_the_benchmarks_read(kit, data_dir):
    out, _ = kit
    with open(os.path.join(out, "data", "stsb", "test.tsv"), "rb") as a, \
            open(os.path.join(data_dir, "stsb", "test.tsv"), "rb") as b:
        assert a.read() == b.read()
    spec = lambda d: FileSpec(os.path.join(d, "nli", "pairs.tsv"),  # noqa: E731  (train_throughput's reader)
                              {"anchor": "sentence1", "positive": "sentence2"}, keep={"label": ("entailment",)})
    kept, full = read_examples(spec(os.path.join(out, "data"))), read_examples(spec(data_dir))
    assert len(kept) == 600 and kept == full[:600]
    with open(os.path.join(out, "data", "nli", "pairs.tsv"), encoding="utf-8") as a, \
            open(os.path.join(data_dir, "nli", "pairs.tsv"), encoding="utf-8") as b:
        lines = a.read().splitlines()
        assert lines == b.read().splitlines()[:len(lines)]  # a prefix, byte for byte


def test_unpacked_model_equals_the_original_on_the_kit_texts_bitwise(kit, minilm_dir):
    out, model = kit
    compact = os.path.getsize(os.path.join(out, "model", portable_kit.COMPACT))
    assert compact < 0.7 * os.path.getsize(os.path.join(minilm_dir, "model.safetensors"))
    original, rebuilt = (load_file(os.path.join(d, "model.safetensors")) for d in (minilm_dir, model))
    assert sorted(original) == sorted(rebuilt)
    name = "embeddings.word_embeddings.weight"
    assert all(np.array_equal(original[k], rebuilt[k]) for k in original if k != name)
    kept = np.flatnonzero(np.any(rebuilt[name] != 0, axis=1))
    assert 1000 < len(kept) < 0.5 * len(original[name])
    np.testing.assert_array_equal(rebuilt[name][kept], original[name][kept])
    s1, s2, _ = read_sts_pairs(os.path.join(out, "data", "stsb", "test.tsv"))
    texts = s1[:40] + s2[-40:] + ["", "Zürich naïve café – 東京"]  # the last: characters outside the kit
    a = SentenceEncoder.from_pretrained(minilm_dir).encode(texts[:-1], batch_size=32)
    b = SentenceEncoder.from_pretrained(model).encode(texts[:-1], batch_size=32)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(SentenceEncoder.from_pretrained(model).encode(texts[-1:]),
                              SentenceEncoder.from_pretrained(minilm_dir).encode(texts[-1:]))


def test_a_model_directory_of_links_is_packed_with_the_files_they_point_to(minilm_dir, data_dir, tmp_path):
    """Hugging Face cache snapshots are directories of symbolic links."""
    links = tmp_path / "snapshot"
    links.mkdir()
    for entry in os.listdir(minilm_dir):
        (links / entry).symlink_to(os.path.join(minilm_dir, entry))
    (links / "broken.json").symlink_to(tmp_path / "missing.json")
    (links / "tf_model.h5").symlink_to(os.path.join(minilm_dir, "config.json"))  # another format's weights: left out
    out = tmp_path / "kit"
    assert portable_kit.main(["pack", "--out", str(out), "--model", str(links), "--data_dir", data_dir,
                              "--entailment_rows", "10"]) == 0
    kept = sorted(os.listdir(out / "model"))
    assert {"config.json", "tokenizer.json", "vocab.txt", "modules.json", "1_Pooling", portable_kit.COMPACT} <= set(kept)
    assert "tf_model.h5" not in kept and "broken.json" not in kept and "model.safetensors" not in kept
    assert not any(os.path.islink(out / "model" / k) for k in kept)


def test_bad_input_is_refused_before_any_work(kit, minilm_dir, data_dir, tmp_path, capsys):
    out, model = kit
    before = os.path.getmtime(os.path.join(model, "model.safetensors"))
    assert portable_kit.main(["unpack", os.path.join(out, "model"), model]) == 2
    assert "not empty; unpack into a new directory" in capsys.readouterr().err.strip().splitlines()[-1]
    assert os.path.getmtime(os.path.join(model, "model.safetensors")) == before
    assert portable_kit.main(["pack", "--out", out, "--model", minilm_dir, "--data_dir", data_dir]) == 2
    assert "not empty" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("x")
    assert portable_kit.main(["pack", "--out", str(tmp_path / "a_file"), "--model", minilm_dir]) == 2
    assert f"--out {tmp_path}/a_file: not a directory" in capsys.readouterr().err
    assert portable_kit.main(["unpack", os.path.join(out, "model"), str(tmp_path / "a_file")]) == 2
    assert f"{tmp_path}/a_file: not a directory" in capsys.readouterr().err
    assert portable_kit.main(["unpack", str(tmp_path), str(tmp_path / "x")]) == 1
    assert f"{tmp_path}/compact.safetensors: no such file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"vocab_size": 30522}')
    assert portable_kit.main(["pack", "--out", str(tmp_path / "k"), "--model", str(tmp_path / "m"),
                              "--data_dir", data_dir]) == 1
    assert f"{tmp_path}/m" in capsys.readouterr().err.strip().splitlines()[-1]
    assert portable_kit.main(["pack", "--out", str(tmp_path / "k"), "--model", minilm_dir, "--data_dir", data_dir,
                              "--entailment_rows", "10000000"]) == 1
    assert "entailment rows, the kit asks for 10000000" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["a_file", "m"]  # no kit, no temporary directory left behind


def test_a_bfloat16_checkpoint_is_packed_and_unpacked_exactly(minilm_dir, data_dir, tmp_path):
    """Weights in any dtype safetensors holds (bf16 here) go through; the kept rows and every other
    tensor come back exact, in bfloat16."""
    import shutil

    import jax.numpy as jnp
    from safetensors.flax import load_file, save_file

    model = tmp_path / "bf16"
    shutil.copytree(minilm_dir, model)
    weights = load_file(str(model / "model.safetensors"))
    save_file({k: v.astype(jnp.bfloat16) for k, v in weights.items()}, str(model / "model.safetensors"),
              metadata={"format": "pt"})
    assert portable_kit.main(["pack", "--out", str(tmp_path / "kit"), "--model", str(model), "--data_dir", data_dir,
                              "--entailment_rows", "10"]) == 0
    assert portable_kit.main(["unpack", str(tmp_path / "kit" / "model"), str(tmp_path / "M")]) == 0
    a, b = load_file(str(model / "model.safetensors")), load_file(str(tmp_path / "M" / "model.safetensors"))
    name = "embeddings.word_embeddings.weight"
    assert {v.dtype for v in b.values()} == {jnp.dtype(jnp.bfloat16)}
    assert all(bool((a[k] == b[k]).all()) for k in a if k != name)
    kept = np.flatnonzero(np.any(np.asarray(b[name], np.float32) != 0, axis=1))
    assert 1000 < len(kept) < len(a[name]) and bool((a[name][kept] == b[name][kept]).all())

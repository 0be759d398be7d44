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
from sentemb_jax.errors import ConfigError


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


def test_store_bfloat16_halves_the_kit_and_unpacks_to_the_rounded_float32_weights(minilm_dir, data_dir, tmp_path):
    """--store_bfloat16 (room for OpenVINO in a 64 MiB transfer): each float32 tensor comes back as
    float32, equal to the original rounded to bfloat16 (round to nearest even) and nothing else."""
    import jax.numpy as jnp

    assert portable_kit.main(["pack", "--out", str(tmp_path / "kit"), "--model", minilm_dir, "--data_dir", data_dir,
                              "--entailment_rows", "10", "--store_bfloat16"]) == 0
    compact = os.path.getsize(tmp_path / "kit" / "model" / portable_kit.COMPACT)
    assert compact < 0.36 * os.path.getsize(os.path.join(minilm_dir, "model.safetensors"))
    assert portable_kit.main(["unpack", str(tmp_path / "kit" / "model"), str(tmp_path / "M")]) == 0
    original, rebuilt = (load_file(os.path.join(d, "model.safetensors")) for d in (minilm_dir, str(tmp_path / "M")))
    assert sorted(original) == sorted(rebuilt) and all(original[k].dtype == rebuilt[k].dtype for k in original)
    rounded = {k: np.asarray(jnp.asarray(v).astype(jnp.bfloat16).astype(v.dtype)) if v.dtype == np.float32 else v
               for k, v in original.items()}
    name = "embeddings.word_embeddings.weight"
    assert all(np.array_equal(rounded[k], rebuilt[k]) for k in original if k != name)
    kept = np.flatnonzero(np.any(rebuilt[name] != 0, axis=1))
    np.testing.assert_array_equal(rebuilt[name][kept], rounded[name][kept])
    some = next(k for k in original if k != name and original[k].ndim == 2 and original[k].dtype == np.float32)
    assert not np.array_equal(original[some], rebuilt[some])  # it did round


def test_the_openvino_archive_runs_an_onnx_model_on_the_cpu_without_what_it_left_out(tmp_path):
    """KIT/openvino.tar.xz, extracted and first on PYTHONPATH, loads and runs a MatMul + Gelu ONNX
    graph on the CPU (float32 hint: on a CPU with bf16 units OpenVINO runs bf16 by default), equal to
    numpy; the GPU / NPU plugins and the other frontends are not in it."""
    import subprocess
    import sys
    import tarfile

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    archive = tmp_path / "openvino.tar.xz"
    assert portable_kit.pack_openvino(portable_kit.openvino_root(), str(archive), preset=0) == \
        sys.implementation.cache_tag
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "site", filter="data")
    libs = {os.path.basename(n) for n in names if n.startswith("openvino/libs/")}
    assert {"libopenvino_intel_cpu_plugin.so", "libopenvino_onnx_frontend.so.2640"} <= libs
    assert not any(portable_kit.OPENVINO_UNUSED.match(n[len("openvino/"):]) for n in names)
    assert not any("gpu" in n or "npu" in n or "pytorch_frontend" in n for n in libs)
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Gelu", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(tmp_path / "g.onnx"))
    code = ("import sys, numpy as np, openvino\n"
            "assert openvino.__file__.startswith(sys.argv[1]), openvino.__file__\n"
            "m = openvino.Core().compile_model(sys.argv[2], 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})\n"
            "x = np.arange(24, dtype=np.float32).reshape(3, 8) / 10\n"
            "print(repr(np.asarray(m(x)[0]).tolist()))\n")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site"), str(tmp_path / "g.onnx")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert run.returncode == 0, run.stderr[-2000:]
    from scipy.special import erf
    h = (np.arange(24, dtype=np.float64).reshape(3, 8) / 10) @ w
    np.testing.assert_allclose(np.array(eval(run.stdout.strip().splitlines()[-1])), h / 2 * (1 + erf(h / np.sqrt(2))),
                               rtol=1e-5, atol=1e-5)


def test_the_openvino_archive_from_a_wheel_names_its_python_and_bad_sources_are_refused(tmp_path):
    """`--openvino WHEEL` packs another Python's openvino (the lent machines run 3.12, this one
    3.11: a Xeon host's first run failed on it): the archive holds the wheel's package
    less OPENVINO_UNUSED, and pack_openvino returns the Python its extension was built for. A file
    that is not a wheel, a wheel without openvino/, or one without the compiled extension is a
    ConfigError naming it, and pack refuses a missing wheel before writing anything."""
    import tarfile
    import zipfile

    wheel = tmp_path / "openvino-9-cp312-cp312-manylinux_2_28_x86_64.whl"
    kept = ["openvino/__init__.py", "openvino/_pyopenvino.cpython-312-x86_64-linux-gnu.so",
            "openvino/libs/libopenvino_intel_cpu_plugin.so", "openvino/libs/libopenvino_onnx_frontend.so.2640"]
    dropped = ["openvino/libs/libopenvino_intel_gpu_plugin.so", "openvino/libs/libopenvino_pytorch_frontend.so",
               "openvino/include/openvino.hpp", "openvino/libs/cache.json", "openvino/__pycache__/a.pyc",
               "openvino-9.dist-info/METADATA"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in kept + dropped:
            z.writestr(name, name)
    archive = tmp_path / "ov.tar.xz"
    assert portable_kit.pack_openvino(str(wheel), str(archive), preset=0) == "cpython-312"
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert files == {name: name for name in kept}

    def refused(source, needle):
        with pytest.raises(ConfigError, match=needle):
            portable_kit.pack_openvino(str(source), str(tmp_path / "refused.tar.xz"), preset=0)
        assert not (tmp_path / "refused.tar.xz").exists()

    (tmp_path / "text.whl").write_text("not a zip")
    refused(tmp_path / "text.whl", "text.whl: not a wheel")
    with zipfile.ZipFile(tmp_path / "other.whl", "w") as z:
        z.writestr("other/__init__.py", "")
    refused(tmp_path / "other.whl", "other.whl: the wheel holds no openvino/ package")
    with zipfile.ZipFile(tmp_path / "pure.whl", "w") as z:
        z.writestr("openvino/__init__.py", "")
    refused(tmp_path / "pure.whl", r"no single compiled openvino/_pyopenvino")
    with pytest.raises(ConfigError, match="missing.whl: no such wheel file"):
        portable_kit.pack(str(tmp_path), str(tmp_path), str(tmp_path / "kit"), openvino=str(tmp_path / "missing.whl"))
    assert not (tmp_path / "kit").exists()

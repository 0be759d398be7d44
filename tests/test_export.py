"""TF SavedModel export: the reloaded model's embeddings from raw strings equal our JAX embeddings
(within 1e-5) on the STS-B dev sentences, for all-MiniLM-L6-v2 and tiny T5 encoder-mean and
encoder-decoder-first models; the token-id signature, `__call__` and tensorflow_hub's KerasLayer
(Sentence-T5's TF Hub calling convention: `encoder(sentences)[0]`) too. The reference is the
encoder's output L2-normalised here (whatever encode's own default), as the export normalises."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hf_models import make_t5
from run_utils import gin_file_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5


@pytest.fixture(scope="module")
def stsb_dev_sentences(data_dir):
    from sentemb_jax.data.files import read_sts_pairs

    s1, s2, _ = read_sts_pairs(os.path.join(data_dir, "stsb", "dev.tsv"))
    return list(dict.fromkeys(s1 + s2))  # every distinct sentence, in order


def _normalised(x):
    x = np.asarray(x, np.float64)
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def _max_diff(got, want) -> float:
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max())


def _reload_and_compare(out_dir, encoder, sentences, batch=500, want=None):
    """max |SavedModel - JAX| of serving_default (every sentence), embed_ids and __call__ (a batch each)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  the graph's tokenizer ops (docs/serving.md says so)

    loaded = tf.saved_model.load(out_dir)
    serve = loaded.signatures["serving_default"]
    got = np.concatenate([serve(text=tf.constant(sentences[i:i + batch]))["embeddings"].numpy()
                          for i in range(0, len(sentences), batch)])
    want = _normalised(encoder.encode(sentences, batch_size=128)) if want is None else want
    diffs = {"serving_default": _max_diff(got, want)}
    # The id signature, on our tokenizer's padded batch.
    batch_ids = encoder.tokenizer.pad(encoder.tokenizer.tokenize(sentences[:7]))
    by_ids = loaded.signatures["embed_ids"](input_ids=tf.constant(batch_ids["input_ids"], tf.int32),
                                            attention_mask=tf.constant(batch_ids["attention_mask"], tf.int32))
    diffs["embed_ids"] = _max_diff(by_ids["embeddings"].numpy(), want[:7])
    called = loaded(tf.constant(sentences[:batch]))  # a list of one tensor, as Sentence-T5's hub models
    assert isinstance(called, (list, tuple)) and len(called) == 1
    diffs["__call__"] = _max_diff(called[0].numpy(), want[:batch])
    print(f"{out_dir}: {len(sentences)} sentences, max |SavedModel - JAX|: "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(diffs.values()) <= TOL, diffs
    return diffs


@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory):
    """all-MiniLM-L6-v2 exported once for this module, by the gin job on the command line."""
    out = str(tmp_path_factory.mktemp("export") / "minilm_sm")
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/export_savedmodel.gin"),
                           f"--gin.EXPORT_DIR='{out}'"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir, stsb_dev_sentences):
    """(encoder, its L2-normalised embeddings of the STS-B dev sentences)."""
    from sentemb_jax.encoder import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    return encoder, _normalised(encoder.encode(stsb_dev_sentences, batch_size=128))


def test_minilm_savedmodel_from_the_gin_job(minilm_export, minilm_reference, stsb_dev_sentences):
    assert len(stsb_dev_sentences) > 2500
    encoder, want = minilm_reference
    _reload_and_compare(minilm_export, encoder, stsb_dev_sentences, want=want)


def test_the_load_command_of_the_serving_page_runs_on_the_export(minilm_export):
    """docs/serving.md's one-line load of the export, in a fresh process (nothing else imported
    first), on this export: it prints the embedding's shape."""
    text = open(os.path.join(REPO, "docs", "serving.md"), encoding="utf-8").read()
    (line,) = [x for x in text.splitlines() if x.startswith("python -c") and "tf.saved_model.load" in x]
    code = line[len('python -c "'):-1].replace("/tmp/minilm_savedmodel", minilm_export)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "(1, 384)"


@pytest.mark.filterwarnings("ignore:pkg_resources is deprecated:UserWarning")  # tensorflow_hub's own import
def test_minilm_savedmodel_as_a_tf_hub_keras_layer(minilm_export, minilm_reference, stsb_dev_sentences):
    """hub.KerasLayer(path)(strings)[0], alone and inside a tf_keras model, equals the JAX embeddings."""
    import tensorflow as tf
    import tensorflow_hub as hub
    import tensorflow_text  # noqa: F401  the graph's tokenizer ops
    import tf_keras

    sentences, want = stsb_dev_sentences[:300], minilm_reference[1][:300]
    layer = hub.KerasLayer(minilm_export)
    out = layer(tf.constant(sentences))
    assert isinstance(out, (list, tuple)) and len(out) == 1
    (embeddings,) = out
    d_layer = _max_diff(embeddings.numpy(), want)
    assert layer.weights and not layer.trainable_weights  # the model's variables, for inference
    text = tf_keras.layers.Input(shape=(), dtype=tf.string)
    model = tf_keras.Model(text, hub.KerasLayer(minilm_export)(text)[0])
    d_model = _max_diff(model.predict(tf.constant(sentences), batch_size=100, verbose=0), want)
    print(f"hub.KerasLayer: max |hub - JAX| layer {d_layer:.2e}, tf_keras model {d_model:.2e}")
    assert d_layer <= TOL and d_model <= TOL, (d_layer, d_model)


@pytest.mark.parametrize("pooling", ["mean", "encdec_first"])
def test_tiny_t5_savedmodel(tmp_path, pooling, stsb_dev_sentences):
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.export import export_savedmodel

    model = str(tmp_path / "t5")
    make_t5(model, "1.1")
    out = export_savedmodel(model, str(tmp_path / "sm"), pooling=pooling)
    _reload_and_compare(out, SentenceEncoder.from_pretrained(model, pooling=pooling), stsb_dev_sentences)


def test_minilm_sentence_transformers_export_loads_offline(minilm_dir, tmp_path, stsb_dev_sentences):
    """save_pretrained -> sentence_transformers.SentenceTransformer(dir) with the hub off: its
    embeddings match ours (cosine >= 0.9999) on 500 STS-B dev sentences."""
    from sentemb_jax.encoder import SentenceEncoder

    ours = SentenceEncoder.from_pretrained(minilm_dir)
    out = str(tmp_path / "st")
    ours.save_pretrained(out)
    code = ("import sys, json, numpy as np; from sentence_transformers import SentenceTransformer; "
            "m = SentenceTransformer(sys.argv[1], device='cpu'); s = json.load(open(sys.argv[2])); "
            "np.save(sys.argv[3], m.encode(s, convert_to_numpy=True, normalize_embeddings=True))")
    sentences = stsb_dev_sentences[:500]
    (tmp_path / "s.json").write_text(__import__("json").dumps(sentences))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code, out, str(tmp_path / "s.json"), str(tmp_path / "st.npy")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = np.load(tmp_path / "st.npy")
    mine = ours.encode(sentences)
    cosine = (theirs * mine).sum(1) / np.linalg.norm(theirs, axis=1) / np.linalg.norm(mine, axis=1)
    assert cosine.min() >= 0.9999, cosine.min()


def test_export_into_a_non_empty_directory_is_refused_unless_overwrite(tmp_path):
    """It overwrote saved_model.pb and left the old variables/ files mixed in, exit 0."""
    from sentemb_jax.export import export_savedmodel

    model = str(tmp_path / "t5")
    make_t5(model, "1.1")
    out = tmp_path / "sm"
    (out / "variables").mkdir(parents=True)
    (out / "variables" / "stale.index").write_text("an earlier export")
    with pytest.raises(ValueError, match=f"{out}: not empty \\(an earlier export\\?\\); give export_savedmodel.overwrite=True"):
        export_savedmodel(model, str(out))
    assert os.listdir(out) == ["variables"]  # refused before any work: nothing written
    export_savedmodel(model, str(out), overwrite=True)
    assert not (out / "variables" / "stale.index").exists() and (out / "saved_model.pb").is_file()
    assert sorted(os.listdir(tmp_path)) == ["sm", "t5"]  # no staging or set-aside directory left behind

"""ONNX export (sentemb_jax.onnx_export): the shipped all-MiniLM-L6-v2 exported by jax2onnx (padded
batches, and packed blocks) and run by ONNX Runtime or OpenVINO gives our embeddings (float32, <= 1e-5); int8 dynamic quantisation (ONNX
Runtime) and bfloat16 (OpenVINO) stay within 0.2 Spearman x 100 of float32 on STS-B test (scipy on
the same pairs)."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import scipy.stats

from sentemb_jax import SentenceEncoder
from sentemb_jax.onnx_export import export_onnx, onnx_encoder, openvino_encoder


@pytest.fixture(scope="module")
def exported(minilm_dir, tmp_path_factory):
    model = SentenceEncoder.from_pretrained(minilm_dir)
    out = str(tmp_path_factory.mktemp("onnx"))
    quantized = export_onnx(model, out, quantize="int8")  # writes model.onnx, then its int8 form
    packed_int8 = export_onnx(model, out, quantize="int8", packed=True)  # model_packed.onnx and its int8 form
    return model, out + "/model.onnx", quantized, out + "/model_packed.onnx", packed_int8


def _spearman(model, s1, s2, gold) -> float:
    a = model.encode(s1, normalize_embeddings=True)
    b = model.encode(s2, normalize_embeddings=True)
    return 100 * scipy.stats.spearmanr((a * b).sum(axis=1), gold).statistic


@pytest.fixture(scope="module")
def ours_stsb(exported, stsb_test):
    """Our (JAX) encoder's STS-B test Spearman x 100, against which both runtimes' low precisions are
    held: computed once for the module."""
    return _spearman(exported[0], *stsb_test)


def test_onnx_float32_equals_ours_and_int8_keeps_stsb(exported, stsb_test, ours_stsb):
    model, path, quantized, packed_path, packed_int8 = exported
    s1, s2, gold = stsb_test
    texts = ["", "A man is playing a guitar.", " ".join(["word"] * 300)] + s1[:200]  # empty, cut at 256 tokens
    ours = model.encode(texts)
    fast = onnx_encoder(model, path)
    assert not fast.packed
    np.testing.assert_allclose(fast.encode(texts), ours, atol=1e-5)
    # The packed graph takes packed blocks (rows of 64 and, for the 256-token text, of 256 tokens).
    assert packed_path.endswith("model_packed.onnx")
    packed = onnx_encoder(model, packed_path)
    assert packed.packed
    np.testing.assert_allclose(packed.encode(texts), ours, atol=1e-5)
    np.testing.assert_allclose(packed.encode(texts[1:4], batch_size=2), model.encode(texts[1:4]), atol=1e-5)
    # The encode contract is the encoder's own: keywords pass through unchanged.
    np.testing.assert_array_equal(fast.encode(texts[:5], precision="binary"), model.encode(texts[:5], precision="binary"))
    with pytest.raises(TypeError, match="no_such_keyword"):
        fast.encode(texts[:1], no_such_keyword=1)

    assert quantized.endswith("model_qint8.onnx")
    int8 = onnx_encoder(model, quantized)
    full, low = ours_stsb, _spearman(int8, s1, s2, gold)
    assert full == pytest.approx(82.03, abs=0.01)  # MTEB's published STS-B test figure for this model
    assert abs(low - full) <= 0.2
    assert np.abs(int8.encode(texts) - ours).max() > 1e-4  # it is another model (int8 weights)
    # Every product with a weight matrix is int8: 6 layers x (q, k, v, out, 2 FFN); the 12 attention
    # products (activations x activations) stay float. jax2onnx's Einsums, which the quantiser skips,
    # were rewritten as MatMul in the float32 graphs.
    for graph, counts in ((path, (48, 0)), (packed_path, (48, 0)), (quantized, (12, 36)), (packed_int8, (12, 36))):
        ops = collections.Counter(node.op_type for node in onnx.load(graph, load_external_data=False).graph.node)
        assert (ops["MatMul"], ops["MatMulInteger"], ops["Einsum"]) == (*counts, 0), graph
        # GELU is ONNX's Gelu node, one per layer (ONNX Runtime's fused kernel), not our erf polynomial
        # traced into elementwise nodes (its Clip): that graph ran at half the speed, a third in int8.
        assert (ops["Gelu"], ops["Clip"]) == (6, 0), graph
    # int8 on the packed graph: packed blocks, int8 weights, the same quality bound.
    assert packed_int8.endswith("model_packed_qint8.onnx")
    int8_packed = onnx_encoder(model, packed_int8)
    assert int8_packed.packed
    assert abs(_spearman(int8_packed, s1, s2, gold) - full) <= 0.2


def test_load_encoder_serves_the_packed_export_in_one_call(exported, minilm_dir):
    """backend='onnx' exports the packed graph into a temporary directory, gone by the time the
    encoder runs (the runtime holds the graph), and gives our embeddings."""
    from sentemb_jax.onnx_export import load_encoder

    model = exported[0]
    fast = load_encoder(minilm_dir, backend="onnx")
    assert fast.packed and "_embed_packed" in vars(fast)  # packed blocks through ONNX Runtime's forward, not XLA's
    texts = ["", "A man is playing a guitar.", " ".join(["word"] * 300), "A woman is slicing an onion."]
    np.testing.assert_allclose(fast.encode(texts), model.encode(texts), atol=1e-5)


def test_load_encoder_checks_backend_and_precision_first_and_passes_them_on(monkeypatch, tmp_path):
    from sentemb_jax import onnx_export

    # Checked before any work: the model directory does not exist.
    with pytest.raises(ValueError, match=r"backend 'torch': choose from \('onnx', 'openvino'\)"):
        onnx_export.load_encoder("/no/such/model", backend="torch")
    with pytest.raises(ValueError, match=r"precision 'int8' for backend 'openvino': choose from \('f32', 'bf16'\)"):
        onnx_export.load_encoder("/no/such/model", backend="openvino", precision="int8")
    exports = []
    monkeypatch.setattr(onnx_export.SentenceEncoder, "from_pretrained", classmethod(lambda cls, path, **kw: (path, kw)))
    monkeypatch.setattr(onnx_export, "export_onnx", lambda enc, out, quantize=None, packed=False:
                        exports.append((out, quantize, packed)) or os.path.join(out, "graph.onnx"))
    monkeypatch.setattr(onnx_export, "openvino_encoder", lambda enc, path, precision: ("openvino", enc, path, precision))
    monkeypatch.setattr(onnx_export, "onnx_encoder", lambda enc, path: ("onnx", enc, path))
    graph = os.path.join(str(tmp_path), "graph.onnx")
    assert onnx_export.load_encoder("m", max_seq_length=64, export_dir=str(tmp_path)) == (
        "openvino", ("m", {"max_seq_length": 64}), graph, "f32")
    assert onnx_export.load_encoder("m", backend="onnx", precision="int8", packed=False, export_dir=str(tmp_path)) == (
        "onnx", ("m", {}), graph)
    assert exports == [(str(tmp_path), None, True), (str(tmp_path), "int8", False)]


# Run in a child process: with OpenVINO's CPU plugin loaded and run in the pytest process, a later
# test that sends itself SIGINT (tests/test_robustness.py) died of a segmentation fault.
_OPENVINO_CHECK = """
import json, sys
import numpy as np, scipy.stats
from sentemb_jax import SentenceEncoder
from sentemb_jax.data.files import read_sts_pairs
from sentemb_jax.onnx_export import openvino_encoder
model_dir, path, packed_path, stsb = sys.argv[1:5]
model = SentenceEncoder.from_pretrained(model_dir)
s1, s2, gold = read_sts_pairs(stsb, score_range=(0, 5))
texts = ["", "A man is playing a guitar.", " ".join(["word"] * 300)] + s1[:200]
def spearman(m):
    a, b = m.encode(s1, normalize_embeddings=True), m.encode(s2, normalize_embeddings=True)
    return 100 * scipy.stats.spearmanr((a * b).sum(axis=1), gold).statistic
f32, bf16 = openvino_encoder(model, path, "f32"), openvino_encoder(model, path, "bf16")
packed, packed_bf16 = openvino_encoder(model, packed_path, "f32"), openvino_encoder(model, packed_path, "bf16")
ours = model.encode(texts)
print(json.dumps({"f32_precision": f32.runtime_precision, "bf16_precision": bf16.runtime_precision,
                  "f32_max_diff": float(np.abs(f32.encode(texts) - ours).max()),
                  "packed": [packed.packed, packed_bf16.packed, f32.packed],
                  "packed_max_diff": float(np.abs(packed.encode(texts) - ours).max()),
                  "bf16_spearman": spearman(bf16),
                  "packed_bf16_spearman": spearman(packed_bf16)}))
"""


def test_openvino_float32_equals_ours_and_bf16_keeps_stsb(exported, minilm_dir, data_dir, ours_stsb):
    """OpenVINO on the same graphs (padded and packed): float32 gives our embeddings; the bfloat16
    hint (float32 where the CPU has no bf16 units: `runtime_precision` says which ran) stays within
    0.2 of our encoder's Spearman on STS-B test."""
    _, path, _, packed_path, _ = exported
    out = subprocess.run([sys.executable, "-c", _OPENVINO_CHECK, minilm_dir, path, packed_path,
                          os.path.join(data_dir, "stsb", "test.tsv")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["f32_precision"] == "f32" and got["bf16_precision"] in ("bf16", "f32")
    assert got["f32_max_diff"] <= 1e-5 and got["packed_max_diff"] <= 1e-5
    assert got["packed"] == [True, True, False]
    assert ours_stsb == pytest.approx(82.03, abs=0.01)
    assert abs(got["bf16_spearman"] - ours_stsb) <= 0.2
    assert abs(got["packed_bf16_spearman"] - ours_stsb) <= 0.2


def test_bad_arguments(exported, tmp_path):
    model, _, _, _, _ = exported
    with pytest.raises(ValueError, match="quantize 'int4'"):
        export_onnx(model, str(tmp_path), quantize="int4")
    with pytest.raises(FileNotFoundError, match="no such ONNX model"):
        onnx_encoder(model, str(tmp_path / "missing.onnx"))
    with pytest.raises(FileNotFoundError, match="no such ONNX model"):
        openvino_encoder(model, str(tmp_path / "missing.onnx"))
    with pytest.raises(ValueError, match="precision 'fp8'"):
        openvino_encoder(model, str(tmp_path / "missing.onnx"), "fp8")

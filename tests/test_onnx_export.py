"""ONNX export (sentemb_jax.onnx_export): the shipped all-MiniLM-L6-v2 exported by jax2onnx and run
by ONNX Runtime or OpenVINO gives our embeddings (float32, <= 1e-5); int8 dynamic quantisation (ONNX
Runtime) and bfloat16 (OpenVINO) stay within 0.2 Spearman x 100 of float32 on STS-B test (scipy on
the same pairs)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from sentemb_jax import SentenceEncoder
from sentemb_jax.onnx_export import export_onnx, onnx_encoder, openvino_encoder


@pytest.fixture(scope="module")
def exported(minilm_dir, tmp_path_factory):
    model = SentenceEncoder.from_pretrained(minilm_dir)
    out = str(tmp_path_factory.mktemp("onnx"))
    quantized = export_onnx(model, out, quantize="int8")  # writes model.onnx, then its int8 form
    return model, out + "/model.onnx", quantized


def _spearman(model, s1, s2, gold) -> float:
    a = model.encode(s1, normalize_embeddings=True)
    b = model.encode(s2, normalize_embeddings=True)
    return 100 * scipy.stats.spearmanr((a * b).sum(axis=1), gold).statistic


def test_onnx_float32_equals_ours_and_int8_keeps_stsb(exported, stsb_test):
    model, path, quantized = exported
    s1, s2, gold = stsb_test
    texts = ["", "A man is playing a guitar.", " ".join(["word"] * 300)] + s1[:200]  # empty, cut at 256 tokens
    fast = onnx_encoder(model, path)
    np.testing.assert_allclose(fast.encode(texts), model.encode(texts), atol=1e-5)
    # The encode contract is the encoder's own: keywords pass through unchanged.
    np.testing.assert_array_equal(fast.encode(texts[:5], precision="binary"), model.encode(texts[:5], precision="binary"))
    with pytest.raises(TypeError, match="no_such_keyword"):
        fast.encode(texts[:1], no_such_keyword=1)

    assert quantized.endswith("model_qint8.onnx")
    int8 = onnx_encoder(model, quantized)
    full, low = _spearman(model, s1, s2, gold), _spearman(int8, s1, s2, gold)
    assert full == pytest.approx(82.03, abs=0.01)  # MTEB's published STS-B test figure for this model
    assert abs(low - full) <= 0.2
    assert np.abs(int8.encode(texts) - model.encode(texts)).max() > 1e-4  # it is another model (int8 weights)


def test_openvino_float32_equals_ours_and_bf16_keeps_stsb(exported, stsb_test):
    """OpenVINO on the same graph: float32 gives our embeddings; the bfloat16 hint (float32 where the
    CPU has no bf16 units: `runtime_precision` says which ran) stays within 0.2 on STS-B test."""
    model, path, _ = exported
    s1, s2, gold = stsb_test
    texts = ["", "A man is playing a guitar.", " ".join(["word"] * 300)] + s1[:200]
    f32 = openvino_encoder(model, path, "f32")
    assert f32.runtime_precision == "f32"
    np.testing.assert_allclose(f32.encode(texts), model.encode(texts), atol=1e-5)
    bf16 = openvino_encoder(model, path, "bf16")
    assert bf16.runtime_precision in ("bf16", "f32")
    assert abs(_spearman(bf16, s1, s2, gold) - _spearman(model, s1, s2, gold)) <= 0.2


def test_bad_arguments(exported, tmp_path):
    model, _, _ = exported
    with pytest.raises(ValueError, match="quantize 'int4'"):
        export_onnx(model, str(tmp_path), quantize="int4")
    with pytest.raises(FileNotFoundError, match="no such ONNX model"):
        onnx_encoder(model, str(tmp_path / "missing.onnx"))
    with pytest.raises(FileNotFoundError, match="no such ONNX model"):
        openvino_encoder(model, str(tmp_path / "missing.onnx"))
    with pytest.raises(ValueError, match="precision 'fp8'"):
        openvino_encoder(model, str(tmp_path / "missing.onnx"), "fp8")

"""benchmarks.encode_throughput --only: which rows run and which ONNX graphs are exported for them
(a run on a borrowed machine names a few rows; each graph export costs ~10 s on 2 cores)."""
from __future__ import annotations

import os
import types

import pytest

from sentemb_jax.benchmarks import encode_throughput as bench


def test_the_flags_select_their_rows_and_only_selects_named_rows_plus_the_baseline():
    assert bench._kinds(False, False, None) == ["sentemb_jax", "sentemb_jax_packed", "sentence_transformers"]
    assert bench._kinds(True, True, None) == list(bench.ALL_KINDS)
    assert bench._kinds(False, False, " sentemb_jax_openvino_bf16_packed,sentemb_jax_packed ") == [
        "sentemb_jax_packed", "sentence_transformers", "sentemb_jax_openvino_bf16_packed"]
    with pytest.raises(ValueError, match=r"\['openvino'\]: unknown rows"):
        bench._kinds(False, False, "sentemb_jax,openvino")


def test_an_unknown_row_is_a_usage_error_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--only", "sentemb_jax_packed,openvino", "--data_dir", "/no/such/dir"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--only ['openvino']: unknown rows; choose from sentemb_jax, sentemb_jax_packed" in err


@pytest.mark.parametrize("rows, exports, keys", [
    (["sentemb_jax_openvino_bf16_packed"], [(None, True)], {"packed_f32"}),
    (["sentemb_jax_onnx_int8_packed", "sentemb_jax_openvino_packed"], [("int8", True)], {"packed_f32", "packed_int8"}),
    (["sentemb_jax_onnx", "sentemb_jax_onnx_int8_packed"], [(None, False), ("int8", True)], {"f32", "packed_f32", "packed_int8"}),
    (["sentemb_jax_packed"], [], set()),
])
def test_only_the_graphs_the_rows_run_are_exported(monkeypatch, tmp_path, rows, exports, keys):
    calls = []

    def export_onnx(encoder, out_dir, quantize=None, packed=False):
        calls.append((quantize, packed))
        name = "model_packed" if packed else "model"
        return os.path.join(out_dir, f"{name}_qint8.onnx" if quantize else f"{name}.onnx")

    monkeypatch.setattr(bench, "_onnx_export", lambda: types.SimpleNamespace(export_onnx=export_onnx))
    monkeypatch.setattr(bench.SentenceEncoder, "from_pretrained", classmethod(lambda cls, path: object()))
    paths = bench._export_graphs("model_dir", ["sentence_transformers", *rows], str(tmp_path))
    assert calls == exports
    assert set(paths) == keys
    assert all(os.path.basename(p) == {"f32": "model.onnx", "int8": "model_qint8.onnx", "packed_f32": "model_packed.onnx",
                                       "packed_int8": "model_packed_qint8.onnx"}[k] for k, p in paths.items())

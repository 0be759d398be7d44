"""ONNX export of a sentence encoder, and ONNX Runtime / OpenVINO behind `SentenceEncoder.encode`.

    from sentemb_jax import SentenceEncoder
    from sentemb_jax.onnx_export import export_onnx, onnx_encoder

    model = SentenceEncoder.from_pretrained("path/to/all-MiniLM-L6-v2")
    path = export_onnx(model, "out/onnx", quantize="int8")        # out/onnx/model_qint8.onnx
    fast = onnx_encoder(model, path)                                # the same encode() contract
    fast.encode(["a sentence"], normalize_embeddings=True)
    bf16 = openvino_encoder(model, "out/onnx/model.onnx", precision="bf16")  # OpenVINO, bfloat16 matmuls

The graph is our Flax module traced by jax2onnx (batch and length dynamic: `input_ids`,
`attention_mask` int32 [batch, length] -> `sentence_embedding` float32 [batch, dim], the model's
output with its Normalize module if it has one); tokenisation stays in Python (our tokenizer).
`quantize="int8"` adds ONNX Runtime's dynamic quantisation (int8 weights, activations quantised
per batch at run time: the VNNI / AMX-INT8 instructions where the CPU has them), as
sentence-transformers' `export_dynamic_quantized_onnx_model` does for its ONNX backend.
`openvino_encoder(..., precision="bf16")` runs the float32 graph in OpenVINO with bfloat16
inference precision: AMX / AVX512-BF16 where the CPU has them; where it has neither, OpenVINO
runs float32 and `runtime_precision` says so (not an error).

Serve OpenVINO in a process of its own: with its CPU plugin loaded and run in our test process, a
later test that sent the process SIGINT died of a segmentation fault (tests/test_onnx_export.py
now runs OpenVINO in a child process).

Needs the `onnx` extra (`pip install -e '.[onnx]'`; the test extra includes it); nothing else in
the package imports this module.
"""
from __future__ import annotations

import copy
import logging
import os

import jax
import jax.numpy as jnp
import onnxruntime as ort
import onnxruntime.quantization as ortq
import openvino
from jax2onnx import to_onnx

from sentemb_jax.encoder import SentenceEncoder

QUANTIZATIONS = (None, "int8")


def export_onnx(encoder: SentenceEncoder, out_dir: str, quantize: str | None = None) -> str:
    """Write `out_dir`/model.onnx (+ model.onnx.data, the weights) and, with quantize='int8',
    model_qint8.onnx; returns the path of the model to run."""
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"export_onnx: quantize {quantize!r}: choose from {QUANTIZATIONS}")
    # jax2onnx logs a traceback for each optional plugin it cannot load (dm_pix, ...) and onnx_ir a
    # warning per untyped shape constant: neither concerns this graph (tests/test_onnx_export.py checks its outputs).
    for name in ("jax2onnx", "onnx_ir"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    params, module = encoder.params, encoder.module
    dynamic = jax.ShapeDtypeStruct(("batch", "length"), jnp.int32)
    to_onnx(lambda ids, mask: module.apply({"params": params}, ids, mask), [dynamic, dynamic], model_name="sentence_encoder",
            return_mode="file", output_path=path, input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"])
    if quantize is None:
        return path
    quantized = os.path.join(out_dir, "model_qint8.onnx")
    ortq.quantize_dynamic(path, quantized, weight_type=ortq.QuantType.QInt8)
    return quantized


def onnx_encoder(encoder: SentenceEncoder, onnx_path: str, threads: int | None = None) -> SentenceEncoder:
    """A copy of `encoder` whose forward runs `onnx_path` in ONNX Runtime (CPU): tokenisation,
    length-sorted batching and the whole `encode` contract (normalize_embeddings, precision,
    prompts, truncate_dim) are the encoder's own. threads: ONNX Runtime's intra-op threads
    (default: its own choice, every core)."""
    _require_file(onnx_path)
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    return _with_forward(encoder, lambda inputs: session.run(None, inputs)[0])


OPENVINO_PRECISIONS = ("f32", "bf16")


def openvino_encoder(encoder: SentenceEncoder, onnx_path: str, precision: str = "f32") -> SentenceEncoder:
    """A copy of `encoder` whose forward runs the float32 ONNX model `onnx_path` in OpenVINO (CPU)
    with `precision` as its inference precision hint ('bf16': bfloat16 matmuls where the CPU has
    them). `.runtime_precision` on the copy: the precision OpenVINO chose on this machine."""
    if precision not in OPENVINO_PRECISIONS:
        raise ValueError(f"openvino_encoder: precision {precision!r}: choose from {OPENVINO_PRECISIONS}")
    _require_file(onnx_path)
    compiled = openvino.Core().compile_model(onnx_path, "CPU", {"INFERENCE_PRECISION_HINT": precision})
    clone = _with_forward(encoder, lambda inputs: compiled(inputs)[0])
    clone.runtime_precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # "f32" / "bf16"
    return clone


def _require_file(onnx_path: str) -> None:
    if not os.path.isfile(onnx_path):
        raise FileNotFoundError(f"{onnx_path}: no such ONNX model")


def _with_forward(encoder: SentenceEncoder, forward) -> SentenceEncoder:
    """A copy of `encoder` whose padded-batch forward is `forward({"input_ids", "attention_mask"})`
    (the exported graph's inputs): everything else in `encode` stays the encoder's own."""
    clone = copy.copy(encoder)
    clone.packed = False  # the exported graph takes padded batches
    clone._embed = lambda _params, ids, mask: forward({"input_ids": ids, "attention_mask": mask})
    return clone

"""ONNX export of a sentence encoder, and ONNX Runtime / OpenVINO behind `SentenceEncoder.encode`.

    from sentemb_jax import SentenceEncoder
    from sentemb_jax.onnx_export import export_onnx, onnx_encoder

    model = SentenceEncoder.from_pretrained("path/to/all-MiniLM-L6-v2")
    path = export_onnx(model, "out/onnx", quantize="int8")        # out/onnx/model_qint8.onnx
    fast = onnx_encoder(model, path)                                # the same encode() contract
    fast.encode(["a sentence"], normalize_embeddings=True)
    bf16 = openvino_encoder(model, "out/onnx/model.onnx", precision="bf16")  # OpenVINO, bfloat16 matmuls

    # or in one call, as sentence-transformers' SentenceTransformer(path, backend="openvino"):
    fast = load_encoder("path/to/all-MiniLM-L6-v2", backend="openvino", precision="bf16")

The graph is our Flax module traced by jax2onnx (batch and length dynamic: `input_ids`,
`attention_mask` int32 [batch, length] -> `sentence_embedding` float32 [batch, dim], the model's
output with its Normalize module if it has one); tokenisation stays in Python (our tokenizer).
`export_onnx(..., packed=True)` traces the packed forward instead (`model_packed.onnx`: texts end
to end in rows, `sentemb_jax.inference`; inputs `input_ids`, `segment_ids`, `positions` [rows,
row_length] and `token_index`, `token_mask` [texts, width], all dynamic): the runtimes then get
packed blocks (fewer token slots, as `SentenceEncoder.packed`) and give the same embeddings.
`quantize="int8"` adds ONNX Runtime's dynamic quantisation (int8 weights per output channel,
activations quantised per batch at run time: the VNNI / AMX-INT8 instructions where the CPU has
them; the Einsums jax2onnx writes are first rewritten as MatMul, which the quantiser handles), as
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

import contextlib
import copy
import logging
import os
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime.quantization as ortq
import openvino
from jax2onnx import to_onnx

from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.models import common

QUANTIZATIONS = (None, "int8")


PACKING_INPUTS = ("segment_ids", "positions", "token_index", "token_mask")


def graph_path(out_dir: str, packed: bool = False, quantize: str | None = None) -> str:
    """Where export_onnx writes a graph: model.onnx, model_packed.onnx, and their `_qint8` forms."""
    return os.path.join(out_dir, ("model_packed" if packed else "model") + ("_qint8" if quantize else "") + ".onnx")


def export_onnx(encoder: SentenceEncoder, out_dir: str, quantize: str | None = None, packed: bool = False) -> str:
    """Write `out_dir`/model.onnx (packed: model_packed.onnx; + .data, the weights) and, with
    quantize='int8', its `_qint8` form; returns the path of the model to run."""
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"export_onnx: quantize {quantize!r}: choose from {QUANTIZATIONS}")
    # jax2onnx logs a traceback for each optional plugin it cannot load (dm_pix, ...) and onnx_ir a
    # warning per untyped shape constant: neither concerns this graph (tests/test_onnx_export.py checks its outputs).
    for name in ("jax2onnx", "onnx_ir"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.makedirs(out_dir, exist_ok=True)
    path = graph_path(out_dir, packed)
    params, module = encoder.params, encoder.module
    if packed:
        rows, texts = (jax.ShapeDtypeStruct(shape, jnp.int32) for shape in (("rows", "row_length"), ("texts", "width")))
        forward = lambda ids, segment_ids, positions, token_index, token_mask: module.apply(  # noqa: E731
            {"params": params}, ids, None, packing={"segment_ids": segment_ids, "positions": positions,
                                                    "token_index": token_index, "token_mask": token_mask})
        inputs, names = [rows, rows, rows, texts, texts], ["input_ids", *PACKING_INPUTS]
    else:
        dynamic = jax.ShapeDtypeStruct(("batch", "length"), jnp.int32)
        forward = lambda ids, mask: module.apply({"params": params}, ids, mask)  # noqa: E731
        inputs, names = [dynamic, dynamic], ["input_ids", "attention_mask"]
    # Our "gelu" (models.common.gelu_erf) computes erf as a clipped rational polynomial, for XLA:CPU and
    # TF's XlaCallModule; traced into ONNX it is 18 more elementwise nodes per layer, which ran MiniLM in
    # ONNX Runtime at 0.50x the speed (float32) and 0.29x (int8) of one Gelu node, its fused kernel
    # (EPYC, 2 threads). jax.nn.gelu's exact form is what jax2onnx writes as Gelu; values within 2e-7.
    # The swap is process-wide while it lasts: a model traced by another thread meanwhile gets it too.
    with mock.patch.dict(common.ACTIVATIONS, gelu=lambda x: jax.nn.gelu(x, approximate=False)):
        to_onnx(forward, inputs, model_name="sentence_encoder", return_mode="file", output_path=path,
                input_names=names, output_names=["sentence_embedding"])
    _einsums_to_matmuls(path)
    if quantize is None:
        return path
    quantized = graph_path(out_dir, packed, quantize)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process the graph (shape inference) goes to the root logger
    try:
        # Weights per output channel, in 7 bits (reduce_range: no saturation in the AVX2 u8 x s8 kernels
        # of CPUs without VNNI): STS-B test 81.89 padded / 81.87 packed vs 82.03 float32; per tensor,
        # 8 bits: 81.79 / 81.76, past the 0.2 bound.
        ortq.quantize_dynamic(path, quantized, weight_type=ortq.QuantType.QInt8, per_channel=True, reduce_range=True)
    finally:
        root.setLevel(level)
    return quantized


# jax2onnx writes every dot_general as Einsum, which ONNX Runtime's quantiser skips (its int8 graph
# kept 48 float Einsums) and runs through transposes. Our models use these three, each a MatMul
# (numpy broadcasting) with transposes around it: equation -> (perm of A, perm of B, perm of the product).
_EINSUM_AS_MATMUL = {
    "abc,cd->abd": (None, None, None),                       # dense layers: [.., in] x [in, out]
    "bqhd,bkhd->bhqk": ((0, 2, 1, 3), (0, 2, 3, 1), None),   # attention scores per head
    "bhqk,bkhd->bqhd": (None, (0, 2, 1, 3), (0, 2, 1, 3)),   # attention-weighted values
}


def _einsums_to_matmuls(path: str) -> None:
    """Rewrite the exported graph's Einsum nodes of `_EINSUM_AS_MATMUL`'s equations as MatMul (+
    Transpose) in place; the weights (external data) are untouched. Others stay Einsum."""
    model = onnx.load(path, load_external_data=False)
    nodes = []
    for node in model.graph.node:
        equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), None)
        if node.op_type != "Einsum" or equation not in _EINSUM_AS_MATMUL:
            nodes.append(node)
            continue
        perms, operands, out = _EINSUM_AS_MATMUL[equation], list(node.input), node.output[0]
        for i, perm in enumerate(perms[:2]):  # new values are named after the output: unique, as every output
            if perm:
                nodes.append(onnx.helper.make_node("Transpose", [operands[i]], [f"{out}__operand{i}"], perm=perm))
                operands[i] = f"{out}__operand{i}"
        product = f"{out}__product" if perms[2] else out
        nodes.append(onnx.helper.make_node("MatMul", operands, [product], name=node.name))
        if perms[2]:
            nodes.append(onnx.helper.make_node("Transpose", [product], [out], perm=perms[2]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, path)


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
    names = {i.name for i in session.get_inputs()}
    return _with_forward(encoder, lambda inputs: session.run(None, inputs)[0], names)


OPENVINO_PRECISIONS = ("f32", "bf16")


def openvino_encoder(encoder: SentenceEncoder, onnx_path: str, precision: str = "f32") -> SentenceEncoder:
    """A copy of `encoder` whose forward runs the float32 ONNX model `onnx_path` in OpenVINO (CPU)
    with `precision` as its inference precision hint ('bf16': bfloat16 matmuls where the CPU has
    them). `.runtime_precision` on the copy: the precision OpenVINO chose on this machine."""
    if precision not in OPENVINO_PRECISIONS:
        raise ValueError(f"openvino_encoder: precision {precision!r}: choose from {OPENVINO_PRECISIONS}")
    _require_file(onnx_path)
    compiled = openvino.Core().compile_model(onnx_path, "CPU", {"INFERENCE_PRECISION_HINT": precision})
    names = {port.get_any_name() for port in compiled.inputs}
    clone = _with_forward(encoder, lambda inputs: compiled(inputs)[0], names)
    clone.runtime_precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # "f32" / "bf16"
    return clone


# backend -> its precisions (the first is the default): ONNX Runtime float32 or int8 dynamic
# quantisation; OpenVINO's inference precision hint.
BACKENDS = {"onnx": QUANTIZATIONS, "openvino": OPENVINO_PRECISIONS}


def load_encoder(model_dir: str, backend: str = "openvino", precision: str | None = None, packed: bool = True,
                 export_dir: str | None = None, **from_pretrained_kwargs) -> SentenceEncoder:
    """The encoder of `model_dir` (`SentenceEncoder.from_pretrained(model_dir, **kwargs)`) served by
    a CPU runtime in one call, as sentence-transformers' `SentenceTransformer(path, backend=...)`:
    its forward exported to ONNX (packed blocks by default: faster than padded in every runtime
    measured, docs/RESULTS.md) and run by ONNX Runtime (`backend="onnx"`, precision None / 'int8')
    or OpenVINO (`"openvino"`, precision 'f32' / 'bf16'). export_dir keeps the exported files;
    by default they go to a temporary directory, removed once the runtime has loaded them."""
    if backend not in BACKENDS:
        raise ValueError(f"load_encoder: backend {backend!r}: choose from {tuple(BACKENDS)}")
    precision = BACKENDS[backend][0] if precision is None else precision
    if precision not in BACKENDS[backend]:
        raise ValueError(f"load_encoder: precision {precision!r} for backend {backend!r}: choose from {BACKENDS[backend]}")
    encoder = SentenceEncoder.from_pretrained(model_dir, **from_pretrained_kwargs)
    with tempfile.TemporaryDirectory() if export_dir is None else contextlib.nullcontext(export_dir) as out:
        if backend == "onnx":
            return onnx_encoder(encoder, export_onnx(encoder, out, quantize=precision, packed=packed))
        return openvino_encoder(encoder, export_onnx(encoder, out, packed=packed), precision)


def _require_file(onnx_path: str) -> None:
    if not os.path.isfile(onnx_path):
        raise FileNotFoundError(f"{onnx_path}: no such ONNX model")


def _with_forward(encoder: SentenceEncoder, forward, input_names: set[str]) -> SentenceEncoder:
    """A copy of `encoder` whose forward is `forward(inputs)`, inputs named as the exported graph's:
    padded batches (`input_ids`, `attention_mask`) or, for a packed graph, packed blocks (`input_ids`
    + PACKING_INPUTS). Everything else in `encode` stays the encoder's own."""
    clone = copy.copy(encoder)
    clone.packed = "segment_ids" in input_names
    host = lambda inputs: forward({k: np.asarray(v) for k, v in inputs.items()})  # noqa: E731 - encode puts them on the JAX device
    if clone.packed:
        clone._embed_packed = lambda _params, arrays: host({"input_ids": arrays["input_ids"], **arrays["packing"]})
    else:
        clone._embed = lambda _params, ids, mask: host({"input_ids": ids, "attention_mask": mask})
    return clone

"""A benchmark worker for sentence-transformers' own ONNX / OpenVINO backends, run by another Python.

    <python> st_backend_worker.py KIND MODEL_DIR THREADS BATCH_SIZE DATA_JSON

Those backends need `optimum`, which needs transformers 4 (sentence-transformers 6's `[onnx]` extra
does not resolve: optimum-onnx 0.1.0 requires transformers < 4.58), so they cannot live beside our
pins. `encode_throughput --st_python PATH` starts this script with an interpreter that has them
(`pip install "sentence-transformers[onnx,openvino]==5.7.0" scipy`) and alternates it with the other
rows. This file imports nothing of sentemb_jax: it runs where sentemb_jax is not installed.

KIND: sentence_transformers_onnx (float32), sentence_transformers_onnx_int8
(`export_dynamic_quantized_onnx_model`, the config for this CPU: avx512_vnni / avx512 / avx2),
sentence_transformers_openvino (float32), sentence_transformers_openvino_bf16 (its bf16 hint).
DATA_JSON: {"sentences", "s1", "s2", "gold"}.
Protocol, one JSON value a line: it prints {"ready": {first_call_s, stsb_test, versions}} once warm,
then answers each "run" on stdin with the seconds one encode of the sentences took; "stop" ends it.
Library output goes to stderr.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import onnxruntime as ort
import scipy.stats
import torch
from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

KINDS = ("sentence_transformers_onnx", "sentence_transformers_onnx_int8", "sentence_transformers_openvino",
         "sentence_transformers_openvino_bf16")


def quantization_config() -> str:
    """sentence-transformers' dynamic quantisation config for this CPU (its names)."""
    with open("/proc/cpuinfo") as f:
        flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    return next((name for flag, name in (("avx512_vnni", "avx512_vnni"), ("avx512f", "avx512"), ("avx2", "avx2"))
                 if flag in flags), "avx2")


def load(kind: str, model_dir: str, threads: int, work_dir: str):
    """The model of `kind`, from a copy of model_dir (the export and quantisation write beside it)."""
    torch.set_num_threads(threads)
    local = shutil.copytree(model_dir, f"{work_dir}/model")
    if kind.startswith("sentence_transformers_openvino"):
        # Its default precision is OpenVINO's: bfloat16 where the CPU has bf16 units, so say which.
        hint = "bf16" if kind.endswith("bf16") else "f32"
        return SentenceTransformer(local, device="cpu", backend="openvino",
                                   model_kwargs={"ov_config": {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": hint}})
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    model = SentenceTransformer(local, device="cpu", backend="onnx", model_kwargs={"session_options": options})
    if kind == "sentence_transformers_onnx":
        return model
    config = quantization_config()
    export_dynamic_quantized_onnx_model(model, config, local)
    return SentenceTransformer(local, device="cpu", backend="onnx",
                               model_kwargs={"file_name": f"onnx/model_qint8_{config}.onnx", "session_options": options})


def stsb_spearman(model, s1: list[str], s2: list[str], gold: list[float], batch_size: int) -> float:
    a = model.encode(s1, batch_size=batch_size, normalize_embeddings=True)
    b = model.encode(s2, batch_size=batch_size, normalize_embeddings=True)
    return 100 * float(scipy.stats.spearmanr(np.sum(a * b, axis=1), gold).statistic)


def versions() -> str:
    names = ("sentence-transformers", "transformers", "optimum-onnx", "onnxruntime", "optimum-intel", "openvino", "torch")
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def main(argv: list[str]) -> None:
    kind, model_dir, threads, batch_size, data_json = argv
    if kind not in KINDS:
        raise SystemExit(f"st_backend_worker: kind {kind!r}: choose from {KINDS}")
    # The protocol keeps the real stdout; whatever the libraries print (Python or native) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with open(data_json) as f:
        data = json.load(f)
    threads, batch_size = int(threads), int(batch_size)
    with tempfile.TemporaryDirectory() as work_dir:
        model = load(kind, model_dir, threads, work_dir)
        run = lambda: model.encode(data["sentences"], batch_size=batch_size, show_progress_bar=False)  # noqa: E731
        start = time.perf_counter()
        run()  # the first call from cold
        first = time.perf_counter() - start
        stsb = stsb_spearman(model, data["s1"], data["s2"], data["gold"], batch_size)
        ready = {"first_call_s": first, "stsb_test": stsb, "versions": versions()}
        if kind.startswith("sentence_transformers_openvino"):  # the precision OpenVINO chose on this machine
            ready["runtime_precision"] = model[0].auto_model.request.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        print(json.dumps({"ready": ready}), file=protocol, flush=True)
        for line in sys.stdin:
            if line.strip() != "run":
                break
            start = time.perf_counter()
            run()
            print(json.dumps(time.perf_counter() - start), file=protocol, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Encoding throughput: our JAX encoder vs sentence-transformers, same model, data, batch and threads.

    python -m sentemb_jax.benchmarks.encode_throughput [--device cpu|gpu] [--fp32_matmul ieee|tf32] [--rounds 5]
        [--batch_size N] [--bf16] [--onnx] [--only ROWS] [--xla_flags=FLAGS ...] [--st_python ENV/bin/python]
        [--texts FILE.tsv [--texts_column sentence]]

Encodes the STS-B test sentences (both columns), or with --texts a column of your own TSV file (a header
line names it; every text non-empty), with all-MiniLM-L6-v2: ours with padded batches
and packed (`SentenceEncoder.packed`), sentence-transformers in float32. --bf16 adds both in
bfloat16 (ours: `from_pretrained(dtype="bfloat16")`, XLA, padded and packed; theirs: `model.bfloat16()`); --onnx adds
ours exported to ONNX (sentemb_jax.onnx_export) run by ONNX Runtime (float32; int8 dynamic
quantisation) and by OpenVINO (float32; bfloat16 precision hint), each also on the packed export
(`export_onnx(packed=True)`: packed blocks, as `SentenceEncoder.packed`). Every row has its STS-B test
Spearman beside it. Each implementation lives in its own worker process (so torch's OpenMP
spin-waiting and XLA's thread pool never compete), which loads only its own libraries
(benchmarks.torch_side holds the sentence-transformers side). Each worker first times its first call from
cold (ours: compiles included) and ours then `warm_up()` (every bucket shape); then this script
alternates the workers round by round - one runs at a time - and prints sentences/s of each
(median over rounds). The first line names the CPU and its extensions (or the GPU), the second the
float32 matmul mode of both sides; the last line is
`ratio_vs_sentence_transformers=<ours / theirs>`, float32 against float32: ours the fastest of our
float32 paths (JAX padded / packed, and with --onnx ONNX Runtime / OpenVINO on our exports); the
line before it gives the JAX paths alone. --only runs the rows it names (and the baseline), exporting
only the graphs they need: e.g. `--only sentemb_jax_packed,sentemb_jax_openvino_bf16_packed`.
--xla_flags=FLAGS (repeatable) adds the default JAX row (packed) once more per value, and the bf16 packed
row too where it runs, its worker run under `XLA_FLAGS=FLAGS` (set before its XLA backend starts; checked
first: flags XLA refuses are a usage error), alternating with the others: an XLA setting judged side by
side, not across runs (drift on a shared host).
--st_python adds sentence-transformers' own ONNX Runtime (float32, int8 dynamic quantisation) and
OpenVINO backends, run by that interpreter (`st_backend_worker.py`): they need optimum and so
transformers 4, another environment (`python -m venv ENV && ENV/bin/pip install
"sentence-transformers[onnx,openvino]==5.7.0" scipy`).
--device gpu (the default where JAX's default backend is a GPU) runs JAX and sentence-transformers on the
GPU (CUDA), batch 512 unless --batch_size says otherwise (64 on the CPU), every process allocating GPU
memory as it needs it (benchmarks.machine.select_benchmark_device); --fp32_matmul (GPU: ieee, the default,
or tf32) sets float32 matmuls on both sides alike. With --bf16 a GPU run adds sentence-transformers under
`torch.autocast(bfloat16)` (float32 weights, bf16 matmuls: as our bf16 rows) beside `model.bfloat16()`.
The ONNX Runtime / OpenVINO rows run on the CPU only.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

from sentemb_jax import SentenceEncoder
from sentemb_jax.benchmarks.machine import (
    apply_jax_fp32_matmul,
    device_description,
    fp32_matmul_line,
    fp32_matmul_settings,
    gpu_memory_line,
    select_benchmark_device,
    usable_cores,
)
from sentemb_jax.benchmarks.side_by_side import run_side_by_side, serve_rounds
from sentemb_jax.data.files import iter_tsv, read_sts_pairs
from sentemb_jax.errors import DataError, UsageError
from sentemb_jax.evaluation.sts import StsbEvaluator
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.paths import default_data_dir
from sentemb_jax.xla_options import backend_started

JAX_KINDS = ("sentemb_jax", "sentemb_jax_packed", "sentemb_jax_bf16", "sentemb_jax_bf16_packed")
BASE_KINDS = ("sentemb_jax", "sentemb_jax_packed", "sentence_transformers")  # every run
BF16_KINDS = ("sentemb_jax_bf16", "sentemb_jax_bf16_packed", "sentence_transformers_bf16")  # --bf16
# --bf16 on a GPU (--only anywhere): torch's mixed precision, float32 weights, as our bf16 rows keep theirs.
AUTOCAST_KINDS = ("sentence_transformers_autocast_bf16",)
ONNX_KINDS = ("sentemb_jax_onnx", "sentemb_jax_onnx_packed", "sentemb_jax_onnx_int8", "sentemb_jax_onnx_int8_packed",
              "sentemb_jax_openvino", "sentemb_jax_openvino_packed", "sentemb_jax_openvino_bf16",
              "sentemb_jax_openvino_bf16_packed")
# sentence-transformers' own ONNX / OpenVINO backends: another Python runs them (--st_python).
ST_BACKEND_KINDS = ("sentence_transformers_onnx", "sentence_transformers_onnx_int8", "sentence_transformers_openvino",
                    "sentence_transformers_openvino_bf16")
ALL_KINDS = (*BASE_KINDS, *BF16_KINDS, *AUTOCAST_KINDS, *ONNX_KINDS, *ST_BACKEND_KINDS)
CPU_ONLY_KINDS = (*ONNX_KINDS, *ST_BACKEND_KINDS)  # ONNX Runtime / OpenVINO here run on the CPU
DEFAULT_BATCH_SIZE = {"cpu": 64, "gpu": 512}  # a GPU idles at 64 MiniLM sentences a call
ST_BACKEND_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "st_backend_worker.py")
# float32 paths of ours: the headline ratio takes the fastest.
OURS_F32 = ("sentemb_jax", "sentemb_jax_packed", "sentemb_jax_onnx", "sentemb_jax_onnx_packed", "sentemb_jax_openvino",
            "sentemb_jax_openvino_packed")


def _stsb_test_pairs(data_dir: str | None):
    """STS-B test (sentences 1, sentences 2, gold): both columns are the sentences encoded."""
    return read_sts_pairs(os.path.join(data_dir or default_data_dir(), "stsb", "test.tsv"))


def read_texts(path: str, column: str) -> list[str]:
    """--texts: the `column` of a TSV file with a header line, in file order. A missing file, a bad
    header or row, an empty text or no rows at all: a DataError naming the file (and line)."""
    texts = []
    for lineno, row in iter_tsv(path, (column,)):
        if not row[column].strip():
            raise DataError(f"{path}:{lineno}: empty text in column {column!r} (the benchmark times real texts)")
        texts.append(row[column])
    if not texts:
        raise DataError(f"{path}: no rows under the header: nothing to encode")
    return texts


def _stsb_test(model, data_dir: str | None) -> float:
    """STS-B test Spearman x 100 of the model's cosine similarities (the quality beside the speed)."""
    return StsbEvaluator(data_dir or default_data_dir(), "test")(model)["spearman"]


def _onnx_export():
    """The ONNX / OpenVINO rows only: their runtimes are the optional `onnx` extra."""
    from sentemb_jax import onnx_export  # lazy: without the onnx extra the JAX and torch rows still run

    return onnx_export


def flagged_row(flags: str, kind: str) -> str:
    """The name of JAX row `kind` run under XLA_FLAGS=flags (--xla_flags)."""
    return f"{kind}[{flags}]"


def flagged_kinds(kinds: list[str]) -> list[str]:
    """The JAX rows --xla_flags repeats: the default (packed float32) always, bf16 packed where it runs
    (an XLA setting may act on one precision's products only, e.g. oneDNN's bf16 kernels)."""
    return ["sentemb_jax_packed", *(["sentemb_jax_bf16_packed"] if "sentemb_jax_bf16_packed" in kinds else [])]


def check_xla_flags(flags: str) -> None:
    """ValueError unless a fresh Python starts XLA's CPU backend under XLA_FLAGS=flags (XLA aborts the
    process on a flag it does not know: found here, before any work, not in a worker)."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    probe = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"], env=env,
                           capture_output=True, text=True, timeout=300)
    if probe.returncode:
        why = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        raise ValueError(f"--xla_flags={flags}: XLA refused them: {why}")


def set_xla_flags(flags: str) -> None:
    """Append `flags` to XLA_FLAGS for this process; XLA reads them when its backend starts, so after
    that they would silently do nothing: refused then."""
    if backend_started():
        raise RuntimeError(f"XLA_FLAGS {flags!r} come too late: this process's XLA backend has started")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def check_torch_finds(device: str, devices) -> None:
    """torch_side.check_torch_finds for a GPU run (torch must find the GPU too); on the CPU there is
    nothing to check, and this process does not load torch."""
    if device == "gpu":
        from sentemb_jax.benchmarks import torch_side  # lazy: torch and sentence-transformers (6 s), for a GPU run only
        torch_side.check_torch_finds(device, devices)


def _worker(kind: str, model_dir: str, data_dir: str | None, sentences: list[str], batch_size: int, threads: int,
            onnx_paths: dict, settings: dict, xla_flags: str, conn) -> None:
    """One row's process. settings: fp32_matmul_settings (the device and float32 matmul mode of both sides)."""
    if xla_flags:
        set_xla_flags(xla_flags)
    warm, extra, autocast = 0.0, {}, kind in AUTOCAST_KINDS
    bf16, packed = "bf16" in kind, "packed" in kind
    precision = contextlib.nullcontext  # the STS-B score too is computed under it
    if kind.startswith("sentence_transformers"):
        from sentemb_jax.benchmarks import torch_side  # lazy: torch and sentence-transformers (6 s), in their worker only
        model = torch_side.load_model(model_dir, settings, threads)
        if bf16 and not autocast:
            model = model.bfloat16()
        precision = functools.partial(torch_side.autocast, settings, autocast)
    elif kind.startswith("sentemb_jax_onnx"):
        path = onnx_paths[("packed_" if packed else "") + ("int8" if "int8" in kind else "f32")]
        model = _onnx_export().onnx_encoder(SentenceEncoder.from_pretrained(model_dir), path, threads)
    elif kind.startswith("sentemb_jax_openvino"):
        model = _onnx_export().openvino_encoder(SentenceEncoder.from_pretrained(model_dir),
                                                onnx_paths["packed_f32" if packed else "f32"], "bf16" if bf16 else "f32")
        extra["runtime_precision"] = model.runtime_precision
    else:
        apply_jax_fp32_matmul(settings)
        model = SentenceEncoder.from_pretrained(model_dir, dtype="bfloat16" if bf16 else None)
        model.packed = packed

    def run():
        with precision():
            return model.encode(sentences, batch_size=batch_size, show_progress_bar=False)

    start = time.perf_counter()
    run()  # the first call from cold: compiles the shapes these sentences need / fills allocator caches
    first = time.perf_counter() - start
    if kind in JAX_KINDS:
        start = time.perf_counter()
        model.warm_up(batch_size)  # every bucket shape (what a server does at load)
        warm = time.perf_counter() - start
    with precision():
        stsb = _stsb_test(model, data_dir)
    conn.send(("ready", {"first_call_s": first, "warm_up_s": warm, "stsb_test": stsb, **extra}))
    serve_rounds(conn, run)


def _kinds(bf16: bool, onnx: bool, only: str | None, st_python: str | None = None) -> list[str]:
    """The rows to run: the flags' sets, or those `only` names (sentence_transformers always: the baseline)."""
    if only is None:
        return [*BASE_KINDS, *(BF16_KINDS if bf16 else ()), *(ONNX_KINDS if onnx else ()),
                *(ST_BACKEND_KINDS if st_python else ())]
    wanted = {k.strip() for k in only.split(",") if k.strip()}
    if wanted - set(ALL_KINDS):
        raise ValueError(f"--only {sorted(wanted - set(ALL_KINDS))}: unknown rows; choose from {', '.join(ALL_KINDS)}")
    if wanted & set(ST_BACKEND_KINDS) and not st_python:
        raise ValueError(f"--only {sorted(wanted & set(ST_BACKEND_KINDS))}: these rows need --st_python")
    return [k for k in ALL_KINDS if k in wanted or k == "sentence_transformers"]


def _on_device(kinds: list[str], device: str, bf16: bool) -> list[str]:
    """The rows of a run on `device`: on a GPU, --bf16 (`bf16`) adds torch's autocast row, and the rows
    whose runtimes run on the CPU only are refused (they would be timed against GPU rows)."""
    if device != "gpu":
        return kinds
    cpu_only = [k for k in kinds if k in CPU_ONLY_KINDS]
    if cpu_only:
        raise UsageError(f"--device gpu: rows {cpu_only} run on the CPU only (ONNX Runtime / OpenVINO here): "
                         "leave out --onnx / --st_python / those --only rows, or use --device cpu")
    wanted = set(kinds) | (set(AUTOCAST_KINDS) if bf16 else set())
    return [k for k in ALL_KINDS if k in wanted]


def _export_graphs(model_dir: str, kinds: list[str], out_dir: str) -> dict:
    """Export the ONNX graphs the ONNX Runtime / OpenVINO rows need (padded and/or packed; int8 beside
    float32 when an int8 row runs); {'f32' | 'int8' | 'packed_f32' | 'packed_int8': path}."""
    paths, onnx_export, encoder = {}, _onnx_export(), None
    for packed in (False, True):
        rows = [k for k in kinds if k in ONNX_KINDS and ("packed" in k) == packed]
        if not rows:
            continue
        encoder = encoder or SentenceEncoder.from_pretrained(model_dir)
        quantize = "int8" if any("int8" in k for k in rows) else None
        prefix = "packed_" if packed else ""
        path = onnx_export.export_onnx(encoder, out_dir, quantize=quantize, packed=packed)
        paths[prefix + "f32"] = onnx_export.graph_path(out_dir, packed)  # written beside the int8 form
        if quantize:
            paths[prefix + quantize] = path
    return paths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None,
                        help="where both sides run (default: a GPU where JAX's default backend is one, else the CPU)")
    parser.add_argument("--fp32_matmul", choices=("ieee", "tf32"), default=None,
                        help="float32 matmuls of both sides on a GPU (default: ieee; the CPU has ieee only)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=None,
                        help=f"sentences a call (default: {DEFAULT_BATCH_SIZE['cpu']} on the CPU, {DEFAULT_BATCH_SIZE['gpu']} on a GPU)")
    parser.add_argument("--bf16", action="store_true", help="also ours and sentence-transformers in bfloat16")
    parser.add_argument("--onnx", action="store_true", help="also ours in ONNX Runtime (float32, int8) and OpenVINO (float32, bf16), padded and packed")
    parser.add_argument("--only", default=None, help="comma-separated rows to run instead of the flags' sets "
                        "(sentence_transformers always runs); rows: " + ", ".join(ALL_KINDS))
    parser.add_argument("--st_python", default=None, help="a Python with sentence-transformers' ONNX / OpenVINO backends "
                        "(they need transformers 4: another environment); adds their rows: " + ", ".join(ST_BACKEND_KINDS))
    parser.add_argument("--xla_flags", action="append", default=[], metavar="FLAGS",
                        help="also the packed JAX rows (float32; bf16 where it runs) under XLA_FLAGS=FLAGS, side by side "
                        "(repeatable; write --xla_flags=...)")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--texts", default=None, metavar="FILE.tsv", help="time these texts instead of STS-B test's "
                        "sentences: a TSV file with a header line (quality is still scored on STS-B test)")
    parser.add_argument("--texts_column", default="sentence", help="the --texts column to encode (default: sentence)")
    return parser


def _check_args(args, parser) -> tuple[list[str], str, list, dict]:
    """(rows, device, JAX's devices, fp32_matmul_settings); a bad command line, or a device that JAX or
    torch does not find, exits 2 here, before any work (no model loaded, no worker started)."""
    try:
        kinds = _kinds(args.bf16, args.onnx, args.only, args.st_python)
        if args.batch_size is not None and args.batch_size < 1:
            raise ValueError(f"--batch_size {args.batch_size}: at least 1")
        if args.st_python and not os.access(args.st_python, os.X_OK):
            raise ValueError(f"--st_python {args.st_python}: not an executable file")
        if len(set(args.xla_flags)) < len(args.xla_flags):
            raise ValueError(f"--xla_flags {args.xla_flags}: the same flags twice would be one row")
        for flags in args.xla_flags:
            check_xla_flags(flags)
        device, devices = select_benchmark_device(args.device)
        check_torch_finds(device, devices)
        settings = fp32_matmul_settings(device, args.fp32_matmul)
        kinds = _on_device(kinds, device, args.bf16 and args.only is None)
    except (ValueError, UsageError) as e:
        parser.error(str(e))  # exit 2, before any work
    return kinds, device, devices, settings


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    kinds, device, devices, settings = _check_args(args, parser)
    try:
        texts = read_texts(args.texts, args.texts_column) if args.texts else None
    except DataError as e:
        sys.exit(f"error: {e}")  # bad input: exit 1, before any work

    print(f"machine: {device_description(devices)}", flush=True)
    print(f"device: {device} (sentence-transformers on torch {settings['torch_device']}); {fp32_matmul_line(settings)}",
          flush=True)
    if device == "gpu":
        print(gpu_memory_line(), flush=True)
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE[device]
    model_dir = args.model or packaged_minilm_path()
    s1, s2, gold = _stsb_test_pairs(args.data_dir)
    sentences = texts or s1 + s2
    threads = usable_cores()  # XLA's CPU client uses every core it may; give torch the same
    with tempfile.TemporaryDirectory() as tmp:
        onnx_paths = {}
        if any(k in ONNX_KINDS for k in kinds):
            start = time.perf_counter()
            onnx_paths = _export_graphs(model_dir, kinds, tmp)
            print(f"ONNX export ({', '.join(sorted(onnx_paths))}): {time.perf_counter() - start:.0f} s", flush=True)
        common = (model_dir, args.data_dir, sentences, batch_size, threads, onnx_paths, settings)
        workers = {k: (_worker, (k, *common, "")) for k in kinds}
        workers.update({flagged_row(f, k): (_worker, (k, *common, f)) for f in args.xla_flags for k in flagged_kinds(kinds)})
        if any(k in ST_BACKEND_KINDS for k in kinds):
            data_json = os.path.join(tmp, "sentences.json")
            with open(data_json, "w") as f:
                json.dump({"sentences": sentences, "s1": s1, "s2": s2, "gold": list(map(float, gold))}, f)
            workers.update({k: ([args.st_python, ST_BACKEND_WORKER], (k, model_dir, threads, batch_size, data_json))
                            for k in kinds if k in ST_BACKEND_KINDS})
        startup: dict = {}
        try:
            med = run_side_by_side(workers, args.rounds, count=len(sentences), startup=startup,
                                   start_together=device == "gpu")
        except RuntimeError as e:  # a worker that failed or died: named, the last line, exit 1
            sys.exit(f"error: {e}")
    source = f"texts={args.texts}:{args.texts_column}" if texts else "texts=STS-B test"
    print(f"model={model_dir} {source} sentences={len(sentences)} batch_size={batch_size} threads={threads} rounds={args.rounds}")
    _report(med, startup, kinds, args.xla_flags)


def _report(med: dict[str, float], startup: dict, kinds: list[str], xla_flags: list[str]) -> None:
    """Each row's rate, start-up and quality; the ratios; last the headline ratio (float32 vs float32)."""
    for n, v in med.items():
        s = startup[n]
        warm = f", warm_up() {s['warm_up_s']:.1f} s" if s.get("warm_up_s") else ""
        warm += f", OpenVINO ran {s['runtime_precision']}" if "runtime_precision" in s else ""
        print(f"{n}: {v:.1f} sentences/s (median); first call from cold {s['first_call_s']:.2f} s{warm}; "
              f"STS-B test {s['stsb_test']:.2f}")
    st_versions = {startup[n]["versions"] for n in med if "versions" in startup[n]}
    for v in st_versions:
        print(f"sentence-transformers' ONNX / OpenVINO rows ran on: {v}")
    for n in med:
        if n != "sentence_transformers":
            print(f"{n} / sentence_transformers = {med[n] / med['sentence_transformers']:.2f}")
    for k in filter(med.__contains__, flagged_kinds(kinds)):
        for f in xla_flags:
            print(f"{flagged_row(f, k)} / {k} = {med[flagged_row(f, k)] / med[k]:.2f}")
    jax_f32 = [v for n, v in med.items() if n in ("sentemb_jax", "sentemb_jax_packed")]
    ours_f32 = [v for n, v in med.items() if n in OURS_F32]
    if jax_f32:
        print(f"ratio_jax_vs_sentence_transformers={max(jax_f32) / med['sentence_transformers']:.2f}")
    if ours_f32:
        print(f"ratio_vs_sentence_transformers={max(ours_f32) / med['sentence_transformers']:.2f}")


if __name__ == "__main__":
    main()

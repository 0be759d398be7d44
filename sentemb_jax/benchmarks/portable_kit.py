"""A small, self-contained folder for running the CPU benchmarks on another machine: one with no
network and no copy of the data, whose transfer is limited in size (to measure on every
machine; how the Intel Xeon rows of docs/RESULTS.md were run).

    python -m sentemb_jax.benchmarks.portable_kit pack --out KIT [--model M] [--data_dir D] \
        [--store_bfloat16] [--openvino [WHEEL]]
    # on the other machine, with this repository beside KIT:
    python -m sentemb_jax.benchmarks.portable_kit unpack KIT/model /tmp/M
    tar xJf KIT/openvino.tar.xz -C SITE   # with --openvino; SITE first on PYTHONPATH
    SENTEMB_DATA_DIR=KIT/data python -m sentemb_jax.benchmarks.encode_throughput --model /tmp/M
    SENTEMB_DATA_DIR=KIT/data python -m sentemb_jax.benchmarks.train_throughput --model /tmp/M

`pack` writes what the encode and training benchmarks read: STS-B test as it is, the first NLI
pairs holding `--entailment_rows` entailment rows (train_throughput reads steps x batch of them),
and the model with every [vocab, width] tensor (the word embedding; T5's shared / lm_head) cut to
the rows that matter: the ids the model's own tokenizer gives those texts (its lowercasing and
truncation), its special tokens, ids below `--keep_ids_below`, and the rows holding each column's
minimum and maximum (ONNX Runtime's int8 export quantises the embedding with its range). Every
other tensor is kept exact, and only the files a model loads are copied (configs, tokenizer,
sentence-transformers' module folders). all-MiniLM-L6-v2: a 57 MiB kit, against 87 MiB of
weights. `unpack` rebuilds the full safetensors file, the other rows zero: on the kit's texts the
model's outputs equal the original's bitwise (tests/test_portable_kit.py). With T5's tied
lm_head, the zeroed rows' logits change; no benchmark reads them.

Two options make room for OpenVINO in a 64 MiB transfer (its wheel is 59 MB):
* `--store_bfloat16` rounds every wider float tensor to bfloat16 (half the bytes: 29 MiB for
  all-MiniLM-L6-v2); `unpack` widens them back to their dtypes, exactly. Speed rows are unchanged
  (dense kernels do not depend on the values); quality rows then score the rounded model (STS-B
  test 82.04 with all-MiniLM-L6-v2, 82.03 exact), so measure quality on the exact weights elsewhere.
* `--openvino [WHEEL]` writes KIT/openvino.tar.xz: the `openvino` package without what a CPU run
  of an ONNX model never loads (the GPU / NPU plugins, the other frameworks' frontends, C++
  headers, the GPU kernel cache): 22 MB for openvino 2026.4.0. Its compiled extension runs on one
  Python version, which pack prints: the installed package fits a machine with this one's, a
  wheel fits another (the Xeon host's Python 3.12, from here on 3.11:
  `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
  manylinux_2_28_x86_64 openvino==2026.4.0`; cpu_benchmarks.sh checks the match before any job).

The kit is written to a temporary directory beside --out and renamed at the end: a refused or
failed pack leaves nothing. Keep KIT outside the repository's tracked files (the data's terms:
../shared/data/README.md).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from sentemb_jax.checkpoints import read_safetensors_file
from sentemb_jax.data import storage
from sentemb_jax.data.files import iter_tsv, read_sts_pairs
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import CheckpointError, ConfigError, DataError, SentembError
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.paths import default_data_dir

WEIGHTS = "model.safetensors"
COMPACT = "compact.safetensors"
IDS = "__kit_ids"
ROWS = "__kit_rows__"  # + the tensor's name
# What a model directory needs to load: configs, tokenizer and vocabulary files, and
# sentence-transformers' module folders (1_Pooling, 2_Dense, ...). Not other formats' weights.
KEPT_FILE = re.compile(r".+\.(json|txt|model)$")
MODULE_DIR = re.compile(r"^\d+_\w+$")
NLI_COLUMNS = ("sentence1", "sentence2", "label")
OPENVINO_ARCHIVE = "openvino.tar.xz"
# What a CPU run of an ONNX / IR model in OpenVINO never loads (paths inside the `openvino` package).
OPENVINO_UNUSED = re.compile(r"^(include/|libs/cache\.json$|libs/libopenvino_intel_(gpu|npu)_plugin\.so"
                             r"|libs/libopenvino_(tensorflow|tensorflow_lite|paddle|pytorch|jax|gguf)_frontend\.so)")
PYOPENVINO = re.compile(r"^_pyopenvino\.(cpython-\d+)-.*\.so$")  # the compiled extension names its Python


def _tsv_text(columns, rows) -> str:
    """Rows (every column of the source, in its order) back as TSV lines (blank lines and CRs, which
    the reader drops, are not written back)."""
    return "\n".join(["\t".join(columns)] + ["\t".join(r[c] for c in columns) for r in rows]) + "\n"


def kit_data(data_dir: str, out_dir: str, entailment_rows: int) -> list[str]:
    """Write out_dir/stsb/test.tsv and out_dir/nli/pairs.tsv (a prefix); return every text in them."""
    stsb = storage.join(data_dir, "stsb", "test.tsv")
    s1, s2, _ = read_sts_pairs(stsb)  # validated: a bad row is a DataError naming its line
    nli_path, nli, found = storage.join(data_dir, "nli", "pairs.tsv"), [], 0
    for _, row in iter_tsv(nli_path, NLI_COLUMNS):
        nli.append(row)
        found += row["label"] == "entailment"
        if found == entailment_rows:
            break
    if found < entailment_rows:
        raise DataError(f"{nli_path}: {found} entailment rows, the kit asks for {entailment_rows}")
    for sub, name, data in (("stsb", "test.tsv", storage.read_bytes(stsb)),
                            ("nli", "pairs.tsv", _tsv_text(list(nli[0]), nli).encode("utf-8"))):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
        with open(os.path.join(out_dir, sub, name), "wb") as f:
            f.write(data)
    return s1 + s2 + [r[c] for r in nli for c in ("sentence1", "sentence2")]


def _refuse_unless_new(path: str, label: str, what: str) -> None:
    """Pack and unpack write into a new (or empty) directory only: nothing of the user's is overwritten."""
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise ConfigError(f"{label}{path}: {'not a directory' if not os.path.isdir(path) else 'not empty'}; "
                          f"{what} into a new directory (nothing was written)")


def _read_weights(path: str) -> tuple[dict, dict]:
    """(tensors, the file's metadata); CheckpointError naming the file if it is missing or unreadable."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    tensors = read_safetensors_file(path)
    with safe_open(path, "np") as f:  # read_safetensors_file has just read this header
        return tensors, f.metadata() or {}


def _vocab_tensors(tensors: dict, vocab_size: int) -> list[str]:
    return sorted(k for k, v in tensors.items() if v.ndim == 2 and v.shape[0] == vocab_size)


def _kept_ids(encoder: SentenceEncoder, tensors: dict, names: list[str], texts: list[str], keep_ids_below: int,
              vocab_size: int) -> np.ndarray:
    ids = set(range(min(keep_ids_below, vocab_size))) | set(encoder.tokenizer.hf.all_special_ids)
    for row in encoder.tokenizer.tokenize(texts):  # the encoder's own tokenisation: lowercasing, truncation
        ids.update(row)
    for name in names:  # each column's extremes: an int8 export's quantisation range stays the same
        table = np.asarray(tensors[name], np.float32)
        ids.update(np.argmin(table, axis=0).tolist() + np.argmax(table, axis=0).tolist())
    return np.array(sorted(i for i in ids if 0 <= i < vocab_size), dtype=np.int64)


def _copy_model_files(model_dir: str, out_dir: str) -> None:
    for entry in sorted(os.listdir(model_dir)):
        src = os.path.join(model_dir, entry)
        if not os.path.exists(src):  # a broken link
            continue
        if os.path.isdir(src) and MODULE_DIR.match(entry):
            shutil.copytree(src, os.path.join(out_dir, entry))  # links inside are copied as what they point to
        elif os.path.isfile(src) and KEPT_FILE.match(entry):
            shutil.copyfile(src, os.path.join(out_dir, entry))  # follows a link (Hugging Face cache snapshots)


def _stored(tensors: dict, store_bfloat16: bool) -> tuple[dict, dict]:
    """(tensors as the kit stores them, {name: dtype} of those unpack must widen back)."""
    if not store_bfloat16:
        return tensors, {}
    wide = {k: str(v.dtype) for k, v in tensors.items() if np.issubdtype(v.dtype, np.floating) and v.dtype.itemsize > 2}
    return {k: v.astype(jnp.bfloat16) if k in wide else v for k, v in tensors.items()}, wide  # nearest even


def openvino_root() -> str:
    """The installed `openvino` package's directory; ConfigError if there is none."""
    spec = importlib.util.find_spec("openvino")  # found, not imported: its native libraries are not loaded
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("--openvino: the openvino package is not installed (pip install -e '.[onnx]')")
    return list(spec.submodule_search_locations)[0]


def openvino_python(source: str) -> str:
    """The CPython tag (`cpython-312`) that the openvino package at source (its directory, or a
    wheel) was built for, read from its compiled extension's name; ConfigError naming source."""
    if os.path.isfile(source):
        try:
            with zipfile.ZipFile(source) as wheel:
                inside = [n[len("openvino/"):] for n in wheel.namelist() if n.startswith("openvino/")]
        except zipfile.BadZipFile as e:
            raise ConfigError(f"--openvino {source}: not a wheel ({e})") from e
        if not inside:
            raise ConfigError(f"--openvino {source}: the wheel holds no openvino/ package")
    else:
        inside = os.listdir(source)
    tags = [m.group(1) for m in map(PYOPENVINO.match, inside) if m]
    if len(tags) != 1:
        raise ConfigError(f"--openvino {source}: no single compiled openvino/_pyopenvino.<python>-*.so (found {tags})")
    return tags[0]


def pack_openvino(source: str, archive: str, preset: int = 6) -> str:
    """Write the `openvino` package, less OPENVINO_UNUSED, as an xz tar (`openvino/...`); the Python
    tag it runs on. source: the package's directory, or a wheel (for the other machine's Python)."""
    def keep(info: tarfile.TarInfo):
        inside = os.path.relpath(info.name, "openvino").replace(os.sep, "/")
        return None if OPENVINO_UNUSED.match(inside + ("/" if info.isdir() else "")) or "__pycache__" in inside \
            else info

    tag = openvino_python(source)  # checked before anything is written
    with tempfile.TemporaryDirectory() as unzipped:
        if os.path.isfile(source):
            with zipfile.ZipFile(source) as wheel:
                wheel.extractall(unzipped, [n for n in wheel.namelist() if n.startswith("openvino/")])
            source = os.path.join(unzipped, "openvino")
        with tarfile.open(archive, "w:xz", preset=preset) as tar:
            tar.add(source, arcname="openvino", filter=keep)
    return tag


def compact_model(encoder: SentenceEncoder, tensors: dict, metadata: dict, names: list[str], texts: list[str],
                  keep_ids_below: int, store_bfloat16: bool) -> dict:
    """The kit's model: `names` ([vocab, width] tensors) cut to the rows `texts` need, the others as
    they are (rounded to bfloat16 if asked); {"tensors", "metadata", "rows"}. Nothing is written."""
    vocab_size = encoder.hf_config.get("vocab_size")
    ids = _kept_ids(encoder, tensors, names, texts, keep_ids_below, vocab_size)
    compact = {k: v for k, v in tensors.items() if k not in names}
    compact.update({ROWS + n: np.ascontiguousarray(tensors[n][ids]) for n in names})
    compact, widen = _stored(compact, store_bfloat16)
    compact[IDS] = ids.astype(np.int32)
    return {"tensors": compact, "rows": len(ids),
            "metadata": {"vocab_size": str(vocab_size), "source_metadata": json.dumps(metadata),
                         "widen": json.dumps(widen)}}


def save_compact_model(compact: dict, model_dir: str, out_dir: str) -> None:
    """out_dir/compact.safetensors and the files of model_dir a model loads (configs, tokenizer)."""
    os.makedirs(out_dir)
    save_file(compact["tensors"], os.path.join(out_dir, COMPACT), metadata=compact["metadata"])
    _copy_model_files(model_dir, out_dir)


def pack(model_dir: str, data_dir: str, out: str, entailment_rows: int = 1200, keep_ids_below: int = 1000,
         store_bfloat16: bool = False, openvino: str | None = None) -> dict:
    """Write the kit into `out` (new or empty); a summary. Everything is read and checked first.
    openvino: None (no archive), "" (the installed package) or the path of an openvino wheel."""
    _refuse_unless_new(out, "--out ", "the kit goes")
    if openvino and not os.path.isfile(openvino):
        raise ConfigError(f"--openvino {openvino}: no such wheel file")
    openvino_source = openvino_root() if openvino == "" else openvino
    python_tag = openvino_python(openvino_source) if openvino_source else None  # a bad wheel: before any work
    encoder = SentenceEncoder.from_pretrained(model_dir)  # the model loads (a bad directory is named here)
    weights = os.path.join(model_dir, WEIGHTS)
    tensors, metadata = _read_weights(weights)
    vocab_size = encoder.hf_config.get("vocab_size")
    names = _vocab_tensors(tensors, vocab_size) if isinstance(vocab_size, int) else []
    if not names:
        raise CheckpointError(f"{weights}: no [vocab_size={vocab_size}, width] embedding tensor")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".kit-", dir=parent)
    try:
        texts = kit_data(data_dir, os.path.join(work, "data"), entailment_rows)
        compact = compact_model(encoder, tensors, metadata, names, texts, keep_ids_below, store_bfloat16)
        save_compact_model(compact, model_dir, os.path.join(work, "model"))
        if openvino_source:
            pack_openvino(openvino_source, os.path.join(work, OPENVINO_ARCHIVE))
        os.replace(work, out)  # onto a missing or empty directory
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {"rows": compact["rows"], "vocab_size": vocab_size, "tensors": names,
            "rounded": len(json.loads(compact["metadata"]["widen"])),
            "openvino_python": python_tag,
            "bytes": sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)}


def unpack(kit_model_dir: str, out_dir: str) -> str:
    """Rebuild out_dir/model.safetensors (rows outside the kit zero) beside the kit's other files."""
    _refuse_unless_new(out_dir, "", "unpack")
    path = os.path.join(kit_model_dir, COMPACT)
    tensors, metadata = _read_weights(path)
    if IDS not in tensors or "vocab_size" not in metadata:
        raise CheckpointError(f"{path}: not written by portable_kit pack")
    ids = tensors.pop(IDS)
    widen = json.loads(metadata.get("widen", "{}"))  # --store_bfloat16: back to each tensor's dtype (exact)
    tensors = {k: v.astype(widen[k]) if k in widen else v for k, v in tensors.items()}
    for name in [k for k in tensors if k.startswith(ROWS)]:
        rows = tensors.pop(name)
        full = np.zeros((int(metadata["vocab_size"]), rows.shape[1]), rows.dtype)
        full[ids] = rows
        tensors[name[len(ROWS):]] = full
    shutil.copytree(kit_model_dir, out_dir, ignore=shutil.ignore_patterns(COMPACT), dirs_exist_ok=True)
    save_file(tensors, os.path.join(out_dir, WEIGHTS), metadata=json.loads(metadata.get("source_metadata", "{}")) or None)
    return os.path.join(out_dir, WEIGHTS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    packing = sub.add_parser("pack", help="write the kit (data and compact model) into a new directory")
    packing.add_argument("--out", required=True)
    packing.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    packing.add_argument("--data_dir", default=None)
    packing.add_argument("--entailment_rows", type=int, default=1200, help="NLI entailment pairs to keep (default 1200)")
    packing.add_argument("--keep_ids_below", type=int, default=1000)
    packing.add_argument("--store_bfloat16", action="store_true",
                         help="round float tensors to bfloat16 in the kit (half the bytes; unpack widens them back)")
    packing.add_argument("--openvino", nargs="?", const="", default=None, metavar="WHEEL",
                         help=f"also write KIT/{OPENVINO_ARCHIVE} for CPU runs (22 MB): the installed openvino, or "
                              "WHEEL's for the other machine's Python (its compiled extension is per version)")
    unpacking = sub.add_parser("unpack", help="rebuild a model directory from a kit's model")
    unpacking.add_argument("kit_model")
    unpacking.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "pack" and (args.entailment_rows < 1 or args.keep_ids_below < 0):
        parser.error(f"--entailment_rows {args.entailment_rows} / --keep_ids_below {args.keep_ids_below}: want >= 1 / >= 0")
    try:
        if args.command == "unpack":
            print(f"model: {unpack(args.kit_model, args.out)}")
            return 0
        summary = pack(args.model or packaged_minilm_path(), args.data_dir or default_data_dir(), args.out,
                       args.entailment_rows, args.keep_ids_below, args.store_bfloat16, args.openvino)
        print(f"data: {os.path.join(args.out, 'data')} (STS-B test, NLI pairs to {args.entailment_rows} entailment rows)")
        rounded = f"; {summary['rounded']} tensors rounded to bfloat16" if summary["rounded"] else ""
        print(f"model: {os.path.join(args.out, 'model')} ({summary['rows']} of {summary['vocab_size']} rows of "
              f"{', '.join(summary['tensors'])}{rounded}; kit {summary['bytes'] / 2**20:.1f} MiB)")
        if summary["openvino_python"]:
            print(f"openvino: {os.path.join(args.out, OPENVINO_ARCHIVE)} (runs on {summary['openvino_python']} only)")
        return 0
    except SentembError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

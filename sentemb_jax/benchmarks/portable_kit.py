"""A small, self-contained folder for running the CPU benchmarks on another machine: one with no
network and no copy of the data, whose transfer is limited in size (issue 33: measure on every
machine of the pool; how the Xeon leases in docs/RESULTS.md were run).

    python -m sentemb_jax.benchmarks.portable_kit pack --out KIT [--model M] [--data_dir D]
    # on the other machine, with this repository beside KIT:
    python -m sentemb_jax.benchmarks.portable_kit unpack KIT/model /tmp/M
    SENTEMB_DATA_DIR=KIT/data python -m sentemb_jax.benchmarks.encode_throughput --model /tmp/M
    SENTEMB_DATA_DIR=KIT/data python -m sentemb_jax.benchmarks.train_throughput --model /tmp/M

`pack` writes what the encode and training benchmarks read: STS-B test as it is, the first NLI
pairs holding `--entailment_rows` entailment rows (train_throughput reads steps x batch of them),
and the model with its word embedding cut to the rows those texts' tokens use, the tokenizer's
special tokens and ids below `--keep_ids_below` (all-MiniLM-L6-v2: 56 MB instead of 91). Every
other tensor is kept exact. `unpack` rebuilds the full safetensors file, the other rows zero:
on the kit's texts the model's outputs equal the original's bitwise
(tests/test_portable_kit.py), and no benchmark looks anything else up.

Keep KIT outside the repository's tracked files (the data's terms: ../shared/data/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from sentemb_jax.data.files import default_data_dir, iter_tsv, read_sts_pairs
from sentemb_jax.errors import CheckpointError, ConfigError, DataError, SentembError
from sentemb_jax.hub import packaged_minilm_path

WEIGHTS = "model.safetensors"
COMPACT = "compact.safetensors"
ROWS, IDS = "__kit_rows", "__kit_ids"
# Large files of a Hugging Face directory that no benchmark reads.
SKIPPED_FILES = {WEIGHTS, "README.md", ".gitattributes", "data_config.json", "pytorch_model.bin", "model.onnx"}
STS_COLUMNS = ("sentence1", "sentence2", "score")
NLI_COLUMNS = ("sentence1", "sentence2", "label")


def _tsv_text(columns, rows) -> str:
    """Rows (every column of the source, in its order) back as TSV lines, byte for byte."""
    # The data's format has no quoting: a field never holds a TAB or a newline (../shared/data/README.md).
    return "\n".join(["\t".join(columns)] + ["\t".join(r[c] for c in columns) for r in rows]) + "\n"


def kit_data(data_dir: str, out_dir: str, entailment_rows: int) -> list[str]:
    """Write out_dir/stsb/test.tsv and out_dir/nli/pairs.tsv (a prefix); return every text in them."""
    stsb = os.path.join(data_dir, "stsb", "test.tsv")
    s1, s2, _ = read_sts_pairs(stsb)  # validated: a bad row is a DataError naming its line
    nli_path, nli, found = os.path.join(data_dir, "nli", "pairs.tsv"), [], 0
    for _, row in iter_tsv(nli_path, NLI_COLUMNS):
        nli.append(row)
        found += row["label"] == "entailment"
        if found == entailment_rows:
            break
    if found < entailment_rows:
        raise DataError(f"{nli_path}: {found} entailment rows, the kit asks for {entailment_rows}")
    for sub, name, text in (("stsb", "test.tsv", None), ("nli", "pairs.tsv", _tsv_text(list(nli[0]), nli))):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
        if text is None:
            shutil.copyfile(stsb, os.path.join(out_dir, sub, name))
        else:
            with open(os.path.join(out_dir, sub, name), "w", encoding="utf-8") as f:
                f.write(text)
    return s1 + s2 + [r[c] for r in nli for c in ("sentence1", "sentence2")]


def _embedding_name(tensors: dict, vocab_size: int, path: str) -> str:
    names = [k for k, v in tensors.items() if v.ndim == 2 and v.shape[0] == vocab_size]
    if len(names) != 1:
        raise CheckpointError(f"{path}: want one [vocab_size={vocab_size}, width] embedding, found {names or 'none'}")
    return names[0]


def _read_tensors(path: str) -> tuple[dict, dict]:
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    with safe_open(path, "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})


def used_token_ids(model_dir: str, texts: list[str], keep_ids_below: int) -> np.ndarray:
    """Sorted ids of every token of `texts` (no truncation: any max length is covered), the tokenizer's
    special tokens and ids below keep_ids_below."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file (the kit needs a fast tokenizer)")
    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    ids = set(range(keep_ids_below)) | set(tokenizer.get_added_tokens_decoder())
    for encoding in tokenizer.encode_batch(texts):
        ids.update(encoding.ids)
    return np.array(sorted(ids), dtype=np.int64)


def pack_model(model_dir: str, texts: list[str], out_dir: str, keep_ids_below: int = 1000) -> dict:
    """Write out_dir/compact.safetensors and the directory's small files; return a summary."""
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config_path):
        raise CheckpointError(f"{config_path}: no such file")
    with open(config_path, encoding="utf-8") as f:
        vocab_size = json.load(f).get("vocab_size")
    if not isinstance(vocab_size, int):
        raise CheckpointError(f"{config_path}: no integer vocab_size")
    ids = used_token_ids(model_dir, texts, keep_ids_below)
    ids = ids[ids < vocab_size]
    tensors, metadata = _read_tensors(os.path.join(model_dir, WEIGHTS))
    name = _embedding_name(tensors, vocab_size, os.path.join(model_dir, WEIGHTS))
    embedding = tensors.pop(name)
    tensors.update({ROWS: np.ascontiguousarray(embedding[ids]), IDS: ids})
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, COMPACT),
              metadata={"embedding": name, "vocab_size": str(vocab_size), "source_metadata": json.dumps(metadata)})
    for entry in sorted(os.listdir(model_dir)):
        src = os.path.join(model_dir, entry)
        if entry in SKIPPED_FILES or os.path.islink(src):
            continue
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(out_dir, entry))
        else:
            shutil.copyfile(src, os.path.join(out_dir, entry))
    return {"rows": len(ids), "vocab_size": vocab_size, "embedding": name,
            "bytes": sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out_dir) for f in fs)}


def unpack_model(kit_model_dir: str, out_dir: str) -> str:
    """Rebuild out_dir/model.safetensors (rows outside the kit zero) beside the kit's other files."""
    target = os.path.join(out_dir, WEIGHTS)
    if os.path.exists(target):
        raise ConfigError(f"{target}: exists; unpack into a new directory (nothing was written)")
    tensors, metadata = _read_tensors(os.path.join(kit_model_dir, COMPACT))
    if ROWS not in tensors or IDS not in tensors or "embedding" not in metadata:
        raise CheckpointError(f"{os.path.join(kit_model_dir, COMPACT)}: not written by portable_kit pack")
    rows, ids = tensors.pop(ROWS), tensors.pop(IDS)
    embedding = np.zeros((int(metadata["vocab_size"]), rows.shape[1]), rows.dtype)
    embedding[ids] = rows
    tensors[metadata["embedding"]] = embedding
    shutil.copytree(kit_model_dir, out_dir, ignore=shutil.ignore_patterns(COMPACT), dirs_exist_ok=True)
    save_file(tensors, target, metadata=json.loads(metadata.get("source_metadata", "{}")) or None)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    pack = sub.add_parser("pack", help="write the kit (data and compact model) into a new directory")
    pack.add_argument("--out", required=True)
    pack.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    pack.add_argument("--data_dir", default=None)
    pack.add_argument("--entailment_rows", type=int, default=1200, help="NLI entailment pairs to keep (default 1200)")
    pack.add_argument("--keep_ids_below", type=int, default=1000)
    unpack = sub.add_parser("unpack", help="rebuild a model directory from a kit's model")
    unpack.add_argument("kit_model")
    unpack.add_argument("out")
    args = parser.parse_args(argv)
    try:
        if args.command == "unpack":
            print(f"model: {unpack_model(args.kit_model, args.out)}")
            return 0
        if args.entailment_rows < 1 or args.keep_ids_below < 0:
            raise ConfigError(f"--entailment_rows {args.entailment_rows} / --keep_ids_below {args.keep_ids_below}: "
                              "want >= 1 / >= 0")
        if os.path.exists(args.out) and os.listdir(args.out):
            raise ConfigError(f"--out {args.out}: not empty; the kit goes into a new directory (nothing was written)")
        model_dir = args.model or packaged_minilm_path()
        for needed in ("config.json", "tokenizer.json", WEIGHTS):  # before anything is written
            if not os.path.isfile(os.path.join(model_dir, needed)):
                raise CheckpointError(f"{os.path.join(model_dir, needed)}: no such file")
        texts = kit_data(args.data_dir or default_data_dir(), os.path.join(args.out, "data"), args.entailment_rows)
        summary = pack_model(model_dir, texts, os.path.join(args.out, "model"), args.keep_ids_below)
        print(f"data: {os.path.join(args.out, 'data')} (STS-B test, NLI pairs to {args.entailment_rows} entailment rows)")
        print(f"model: {os.path.join(args.out, 'model')} ({summary['rows']} of {summary['vocab_size']} rows of "
              f"{summary['embedding']}; {summary['bytes'] / 2**20:.1f} MiB)")
        return 0
    except SentembError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

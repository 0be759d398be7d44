"""The one bundle the accelerator report needs on a GPU host that has its own Python (jax with the
CUDA plugin, flax, optax, orbax, torch, transformers, sentence-transformers) but not our other
packages, no data and no network; at most 64 MiB (what such a host takes in one transfer).

    python -m sentemb_jax.benchmarks.report_kit pack --out KIT [--wheel WHEEL ...] [--limit_mib 64]
    # on the GPU host, this repository beside KIT:
    PYTHONPATH=KIT/site python -m sentemb_jax.benchmarks.report_kit unpack KIT /tmp/kit
    SENTEMB_TEST_SPM_MODEL=/tmp/kit/test_data/sentencepiece.model \
    PYTHONPATH=KIT/site python -m sentemb_jax.benchmarks.accelerator_report --out DIR \
        --model /tmp/kit/model --data_dir /tmp/kit/data

KIT holds: `model/` - all-MiniLM-L6-v2 as benchmarks.portable_kit writes it (rounded to bfloat16,
the word embedding cut to the rows the data's texts use; `unpack` rebuilds the model, equal to
the rounded one on those texts); `data.tar.xz` - what the report's stages read (STS-B, STS12-16,
the NLI pairs and sentences, the wiki sentences); `site/` - the pure-Python packages the report
needs beyond the host's (gin-config, tensorboardX, pytest and its own), copied from this
environment, plus any `--wheel` given (e.g. a matplotlib wheel downloaded for the host's Python),
unpacked; `test_data/sentencepiece.model` - seqio's test tokenizer, which the T5 parity tests
read (on the host through `SENTEMB_TEST_SPM_MODEL`). The bundle's size is bounded before anything
is written (the data's raw size, the model's stored bytes, the packages' files); over
`--limit_mib` it is refused.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tarfile
import tempfile
import zipfile

from sentemb_jax.benchmarks import portable_kit as pk
from sentemb_jax.data.files import iter_tsv, read_sts_pairs
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import ConfigError, SentembError
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.paths import default_data_dir

# What the report's stages read, relative to the data directory.
DATA_FILES = ("stsb/dev.tsv", "stsb/test.tsv", "nli/pairs.tsv", "nli/sentences.tsv", "unlabelled/wiki1m_head.tsv",
              *(f"sts12-16/STS1{i}" for i in range(2, 7)))
# Pure-Python packages the report imports beyond a GPU host's own (module names; their dist-info too).
SITE_PACKAGES = ("gin", "tensorboardX", "pytest", "_pytest", "pluggy", "iniconfig", "py")
DATA_ARCHIVE = "data.tar.xz"
# The T5 parity tests' tokenizer (seqio's test sentencepiece model): the host has no seqio.
TEST_SPM = os.path.join("test_data", "sentencepiece.model")


def seqio_test_spm() -> str | None:
    """seqio's test sentencepiece model where seqio is installed (its files are found, seqio is not
    imported: that would import TensorFlow); None elsewhere, or where seqio is made unimportable."""
    try:
        spec = importlib.util.find_spec("seqio")
    except ValueError:  # sys.modules["seqio"] is None (tests/no_tensorflow)
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "test_data", "sentencepiece", "sentencepiece.model")
    return path if os.path.isfile(path) else None


def _data_texts(data_dir: str) -> list[str]:
    """Every text of the data files the kit carries (the model keeps their embedding rows)."""
    texts: list[str] = []
    for rel in DATA_FILES:
        path = os.path.join(data_dir, rel)
        if rel.startswith("stsb/"):
            s1, s2, _ = read_sts_pairs(path)
            texts += s1 + s2
        elif os.path.isfile(path):  # every text column (a label column holds digits)
            texts += [c for _, row in iter_tsv(path, ()) for c in row.values() if c and not c.isdigit()]
    return texts


def _data_paths(data_dir: str) -> list[str]:
    missing = [rel for rel in DATA_FILES if not os.path.exists(os.path.join(data_dir, rel))]
    if missing:
        raise ConfigError(f"--data_dir {data_dir}: missing {', '.join(missing)} (nothing was written)")
    out = []
    for rel in DATA_FILES:
        full = os.path.join(data_dir, rel)
        out += [os.path.join(r, f) for r, _, fs in os.walk(full) for f in fs] if os.path.isdir(full) else [full]
    return out


def _site_sources() -> list[tuple[str, str]]:
    """(path, name in site/) of each package in SITE_PACKAGES installed here, with its dist-info."""
    distributions = importlib.metadata.packages_distributions()
    found: dict[str, str] = {}
    for name in SITE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        path = os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin
        found[path] = os.path.basename(path)
        for dist_name in distributions.get(name, []):
            dist = importlib.metadata.distribution(dist_name)
            for top in {f.parts[0] for f in dist.files or [] if f.parts[0].endswith(".dist-info")}:
                found[str(dist.locate_file(top))] = top
    return list(found.items())


def _bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs
                   if "__pycache__" not in r)
    return os.path.getsize(path)


def pack(model_dir: str, data_dir: str, out: str, wheels: list[str], limit_mib: float = 64.0) -> dict:
    """Write the bundle into `out` (new or empty), after checking that it fits `limit_mib`."""
    pk._refuse_unless_new(out, "--out ", "the bundle goes")
    for w in wheels:
        if not (os.path.isfile(w) and zipfile.is_zipfile(w)):
            raise ConfigError(f"--wheel {w}: not a wheel file (nothing was written)")
    data_paths = _data_paths(data_dir)
    site = _site_sources()
    rest = sum(map(os.path.getsize, data_paths)) + sum(_bytes(p) for p, _ in site) + sum(map(os.path.getsize, wheels))
    if rest > limit_mib * 2**20:  # refused before the model is compacted (its texts' tokenisation: seconds)
        raise ConfigError(f"the bundle would take at least {rest / 2**20:.1f} MiB (its data, packages and wheels), "
                          f"over --limit_mib {limit_mib:g} (nothing was written)")
    encoder = SentenceEncoder.from_pretrained(model_dir)
    tensors, metadata = pk._read_weights(os.path.join(model_dir, pk.WEIGHTS))
    vocab_size = encoder.hf_config.get("vocab_size")
    names = pk._vocab_tensors(tensors, vocab_size)
    compact = pk.compact_model(encoder, tensors, metadata, names, _data_texts(data_dir), 1000, store_bfloat16=True)
    bound = sum(v.nbytes for v in compact["tensors"].values()) + rest + 2 * 2**20  # + configs, tokenizer
    if bound > limit_mib * 2**20:
        raise ConfigError(f"the bundle would take up to {bound / 2**20:.1f} MiB, over --limit_mib {limit_mib:g} "
                          "(nothing was written)")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".report-kit-", dir=parent)
    try:
        pk.save_compact_model(compact, model_dir, os.path.join(work, "model"))
        # xz preset 3: the data's 15 MiB in 3.1 MiB in 3 s; the default preset 6 took 9 s for 2.0 MiB
        with tarfile.open(os.path.join(work, DATA_ARCHIVE), "w:xz", preset=3) as tar:
            for path in data_paths:
                tar.add(path, arcname=os.path.relpath(path, data_dir))
        for path, name in site:
            target = os.path.join(work, "site", name)
            if os.path.isdir(path):
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(path, target)
        for w in wheels:
            with zipfile.ZipFile(w) as z:
                z.extractall(os.path.join(work, "site"))
        spm = seqio_test_spm()
        if spm:
            os.makedirs(os.path.join(work, "test_data"))
            shutil.copy2(spm, os.path.join(work, TEST_SPM))
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {"rows": compact["rows"], "vocab_size": vocab_size, "site": sorted(n for _, n in site), "bound": bound,
            "bytes": _bytes(out)}


def unpack(kit: str, out: str) -> dict:
    """out/model (the rebuilt model) and out/data (the data), from a bundle."""
    pk._refuse_unless_new(out, "", "unpack")
    model = pk.unpack(os.path.join(kit, "model"), os.path.join(out, "model"))
    with tarfile.open(os.path.join(kit, DATA_ARCHIVE), "r:xz") as tar:
        tar.extractall(os.path.join(out, "data"), filter="data")  # no path leaves out/data
    done = {"model": os.path.dirname(model), "data": os.path.join(out, "data")}
    if os.path.isfile(os.path.join(kit, TEST_SPM)):
        os.makedirs(os.path.join(out, "test_data"))
        done["test_spm"] = shutil.copy2(os.path.join(kit, TEST_SPM), os.path.join(out, TEST_SPM))
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    packing = sub.add_parser("pack", help="write the bundle into a new directory")
    packing.add_argument("--out", required=True)
    packing.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    packing.add_argument("--data_dir", default=None)
    packing.add_argument("--wheel", action="append", default=[], help="a wheel to unpack into KIT/site (repeatable)")
    packing.add_argument("--limit_mib", type=float, default=64.0)
    unpacking = sub.add_parser("unpack", help="rebuild the model and the data from a bundle")
    unpacking.add_argument("kit")
    unpacking.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "unpack":
        done = unpack(args.kit, args.out)
        print(f"model: {done['model']}\ndata: {done['data']}")
        if "test_spm" in done:  # the accelerator report's tests stage reads it through this variable
            print(f"export SENTEMB_TEST_SPM_MODEL={done['test_spm']}")
        return 0
    s = pack(args.model or packaged_minilm_path(), args.data_dir or default_data_dir(), args.out, args.wheel,
             args.limit_mib)
    print(f"bundle: {args.out} ({s['bytes'] / 2**20:.1f} MiB, bounded at {s['bound'] / 2**20:.1f}); model rows "
          f"{s['rows']} of {s['vocab_size']}; packages: {', '.join(s['site'])}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SentembError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)

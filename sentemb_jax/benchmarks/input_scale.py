"""Input at pod scale: time to first batch, peak memory and examples/s per host against corpus size.

    python -m sentemb_jax.benchmarks.input_scale                        # 1M, 10M, 50M rows; 1, 8, 64 hosts
    python -m sentemb_jax.benchmarks.input_scale --rows 1000000 --hosts 1 --workdir /tmp/x

Synthetic Community-QA corpora (question title / body / answer / label, JSONL) are generated into a
temporary directory (deleted after). A 1M-row raw corpus is written in 8 shards and prepared
once as text (sentemb_jax.data.prepare, timed); one of its shards is also prepared with the
tokenizer (ids tokenized ahead, timed). The 10M / 50M corpora are 10 / 50 copies of the 8 text
shards, or 80 / 400 copies of the tokenized shard, listed in one manifest (the reader's costs
depend on rows, shards and bytes, not on whether texts repeat). The validated-file path (`RowFileSource`, every row indexed
at start-up) reads the raw JSONL repeated to the same row count.

Each measurement is a fresh process (its own peak RSS): host 0 of H (seqio.ShardInfo(0, H)) builds
the training input of `sentemb_commqa` (the real InputPipeline: read, parse, WordPiece-tokenise
in the TF graph with all-MiniLM-L6-v2's vocabulary, pad, batch) at a global batch of 2048 pairs
(2048 / H per host), length 128; it reports the seconds from creating the pipeline to the first
batch, the process's peak RSS from then on (the imports' peak excluded: VmHWM reset), and
examples/s over the next 32 global batches (65,536 examples; a shorter window is dominated by
the prefetch buffer and by noise).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import seqio

from sentemb_jax import hub
from sentemb_jax.benchmarks.machine import cpu_description
from sentemb_jax.data import prepare as prep
from sentemb_jax.data.kinds import file_spec
from sentemb_jax.data.pipeline import InputPipeline
from sentemb_jax.data.tasks import register_tasks

GLOBAL_BATCH = 2048
RAW_SHARDS = 8
BASE_ROWS = 1_000_000
WORDS = np.array("what how why when where which does can is the a of to in for on with my your this that it be "
                 "question answer visa car house food price good best way work job school doctor phone bank".split())


def write_raw(directory: str, rows: int, shards: int, seed: int = 0) -> list[str]:
    """rows synthetic QA rows in JSONL shards (every 10th labelled Bad: filtered out, as in real CQA)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"cqa-{s:05d}-of-{shards:05d}.jsonl")
        n = rows // shards + (s < rows % shards)
        with open(path, "w") as f:
            for start in range(0, n, 100_000):
                k = min(100_000, n - start)
                words = WORDS[rng.integers(0, len(WORDS), size=(k, 40))]
                lines = []
                for i in range(k):
                    w = words[i]
                    lines.append(json.dumps({"question_title": " ".join(w[:8]) + "?", "question_body": " ".join(w[8:20]),
                                             "answer": " ".join(w[20:]), "label": "Bad" if (start + i) % 10 == 9 else "Good"}))
                f.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def replicate_prepared(base: str, out: str, copies: int) -> None:
    """A prepared corpus of `copies` x base's shards (hard links where the filesystem allows)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(base, "manifest.json")) as f:
        manifest = json.load(f)
    shards = []
    for c in range(copies):
        for entry in manifest["shards"]:
            name = f"copy{c:03d}-{entry['file']}"
            try:
                os.link(os.path.join(base, entry["file"]), os.path.join(out, name))
            except OSError:
                shutil.copy(os.path.join(base, entry["file"]), os.path.join(out, name))
            shards.append({**entry, "file": name})
    manifest.update(shards=shards, rows=manifest["rows"] * copies)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def replicate_raw(paths: list[str], out: str, copies: int) -> str:
    """One JSONL file holding `copies` x the raw shards (the validated path's input)."""
    with open(out, "wb") as dst:
        for _ in range(copies):
            for p in paths:
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 24)
    return out


def reset_peak_rss() -> None:
    """Start the process's peak RSS afresh (Linux: clear_refs 5 resets VmHWM), so that the peak is the
    pipeline's, not the imports' (TF + jax + seqio reach ~1.1 GiB while importing)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(path: str, hosts: int, batches: int, tokenizer_dir: str) -> dict:
    """In this process: host 0 of `hosts` reading `path` (a prepared corpus or a raw file)."""
    reset_peak_rss()
    t0 = time.perf_counter()
    names = register_tasks(tokenizer_dir=tokenizer_dir, data_dir=os.path.dirname(path), files={"commqa": path}, kinds=("commqa",))
    pipe = InputPipeline(names["commqa"], batch_size=GLOBAL_BATCH // hosts, sequence_length=128, seed=0,
                         shard_info=seqio.ShardInfo(0, hosts) if hosts > 1 else None)
    it = iter(pipe)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(batches):
        next(it)
    steady = batches * (GLOBAL_BATCH // hosts) / (time.perf_counter() - t1)
    return {"rows": pipe.provider.source.num_input_examples("train"), "first_batch_s": first, "examples_per_s": steady, "peak_rss_mib": peak_rss_mib()}


def _in_subprocess(path: str, hosts: int, batches: int, tokenizer_dir: str) -> dict:
    cmd = [sys.executable, "-m", "sentemb_jax.benchmarks.input_scale", "--measure", path, "--hosts", str(hosts),
           "--batches", str(batches), "--tokenizer_dir", tokenizer_dir]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"measurement failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000000,10000000,50000000", help="corpus sizes (multiples of 1M)")
    parser.add_argument("--hosts", default="1,8,64", help="simulated hosts (host 0 measured)")
    parser.add_argument("--batches", type=int, default=None, help="batches timed after the first (default: 32 x hosts, i.e. 32 global batches)")
    parser.add_argument("--validated_max_rows", type=int, default=10_000_000, help="largest corpus read by the validated path")
    parser.add_argument("--workdir", default=None, help="where the corpora go (default: a temporary directory, deleted)")
    parser.add_argument("--processes", type=int, default=2, help="preparation processes")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer_dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, int(args.hosts), args.batches, args.tokenizer_dir)))
        return 0
    return run(args)


def run(args) -> int:
    sizes = [int(x) for x in args.rows.split(",")]
    hosts = [int(x) for x in args.hosts.split(",")]
    tokenizer_dir = hub.packaged_minilm_path()
    work = args.workdir or tempfile.mkdtemp(prefix="input_scale_")
    print(f"machine: {cpu_description()}; workdir {work}")
    spec = file_spec("commqa", "")
    try:
        raw = write_raw(os.path.join(work, "raw"), BASE_ROWS, RAW_SHARDS)
        t = time.perf_counter()
        prep.prepare(spec, raw, os.path.join(work, "text_1M"), processes=args.processes, kind="commqa", prefix="cqa", progress=False)
        text_s = time.perf_counter() - t
        t = time.perf_counter()
        prep.prepare(spec, raw[:1], os.path.join(work, "ids_shard"), kind="commqa", prefix="cqa", progress=False,
                     tokenizer_dir=tokenizer_dir, max_length=128)
        ids_s = time.perf_counter() - t
        print(f"prepare, text: {BASE_ROWS:,} raw rows in {RAW_SHARDS} shards, {args.processes} processes: {text_s:.1f} s "
              f"({BASE_ROWS / text_s:,.0f} rows/s); tokenized ahead: 1 shard of {BASE_ROWS // RAW_SHARDS:,} rows, 1 process: "
              f"{ids_s:.1f} s ({BASE_ROWS // RAW_SHARDS / ids_s:,.0f} rows/s)")
        print("| raw rows | corpus rows | input | hosts | batch per host | time to first batch s | peak RSS MiB | examples/s per host |")
        print("|---|---|---|---|---|---|---|---|")
        for n in sizes:
            copies = n // BASE_ROWS
            sources = [("prepared, ids", os.path.join(work, f"ids_{copies}M")), ("prepared, text", os.path.join(work, f"text_{copies}M"))]
            replicate_prepared(os.path.join(work, "ids_shard"), sources[0][1], RAW_SHARDS * copies)
            if copies > 1:
                replicate_prepared(os.path.join(work, "text_1M"), sources[1][1], copies)
            if n <= args.validated_max_rows:
                sources.append(("validated file", replicate_raw(raw, os.path.join(work, f"raw_{copies}M.jsonl"), copies)))
            for label, path in sources:
                for h in hosts:
                    r = _in_subprocess(path, h, args.batches or 32 * h, tokenizer_dir)
                    print(f"| {n:,} | {r['rows']:,} | {label} | {h} | {GLOBAL_BATCH // h} | {r['first_batch_s']:.2f} | {r['peak_rss_mib']:.0f} "
                          f"| {r['examples_per_s']:,.0f} |", flush=True)
            for label, path in sources:
                if path != os.path.join(work, "text_1M"):
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

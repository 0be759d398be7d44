"""Prepare a large corpus once: validate raw TSV / JSONL(.gz) shards, write ArrayRecord shards + a manifest.

    python -m sentemb_jax.main --gin_file=gin/runs/prepare_corpus.gin \
        --gin.INPUT="'raw/cqa-*.jsonl.gz'" --gin.OUTPUT="'/mnt/bucket/cqa'"

The rows are validated here, once, exactly as the validated-file path validates them at every
start (data.files: same columns, filters, empty-text and score rules, `on_bad_row`); training then
reads the shards without looking at a row it does not use (data.prepared).

Output shard j holds the rows of the input files i with i % num_shards == j (every input file
goes to exactly one output shard: one worker reads only its own inputs), or, with more output
shards than inputs (num_shards a multiple of the input count), every (num_shards / inputs)-th row
of input j % inputs. Each output shard is written to a temporary name, then renamed, and its
manifest entry written beside it (`<shard>.json`): an interrupted run re-run with the same
arguments skips the finished shards. `worker=(k, n)` does only the shards j % n == k, so n
machines (or processes) prepare a corpus together; the manifest is written by whichever run finds
every shard's entry present (or by a last run with nothing left to do).

dedup: drop a row whose text fields repeat an earlier row's of the same output shard (a 16-byte
hash per row kept while that shard is written; duplicates across shards are not looked for).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Sequence

from array_record.python.array_record_module import ArrayRecordWriter
from tqdm.auto import tqdm

from sentemb_jax.data import storage
from sentemb_jax.data.example_proto import example_class
from sentemb_jax.data.files import FileSpec, ReadSummary, validated_rows
from sentemb_jax.data.prepared_corpus import FORMAT, MANIFEST, RECORD, VERSION, parse_manifest
from sentemb_jax.errors import DataError, SentembError
from sentemb_jax.paths import is_remote
from sentemb_jax.tokenization import tokenizer_fingerprint

log = logging.getLogger(__name__)
TOKENIZE_CHUNK = 1024  # examples tokenized together (one call of the traced batch tokenizer)


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One output shard: which input files (and which of their rows) it takes."""

    index: int
    num_shards: int
    inputs: tuple[str, ...]
    row_stride: int = 1  # take rows r with r % row_stride == row_offset (of each input, in file order)
    row_offset: int = 0

    @property
    def name(self) -> str:
        return f"{self.prefix}-{self.index:05d}-of-{self.num_shards:05d}.array_record"

    prefix: str = "data"


def plan_shards(inputs: Sequence[str], num_shards: int | None, prefix: str) -> list[ShardTask]:
    """Output shards over the input files (see the module docstring); num_shards None: one per input."""
    n_in = len(inputs)
    num_shards = n_in if num_shards is None else num_shards
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
    if num_shards <= n_in:
        return [ShardTask(j, num_shards, tuple(inputs[j::num_shards]), prefix=prefix) for j in range(num_shards)]
    if num_shards % n_in:
        raise ValueError(f"num_shards={num_shards} is more than the {n_in} input files and not a multiple of it: "
                         "give a multiple (each input is split row by row) or at most as many shards as inputs")
    per = num_shards // n_in
    return [ShardTask(j, num_shards, (inputs[j % n_in],), per, j // n_in, prefix) for j in range(num_shards)]


def _example_bytes(spec: FileSpec, tokenized: bool) -> Callable[[dict], bytes]:
    """A serializer of validated examples to tf.train.Example bytes (one reused message: fast; the
    protobuf library's own message, data.example_proto: no TensorFlow).
    tokenized: text fields hold id arrays (int64 lists), not strings."""
    message = example_class()()
    slots = {}
    for field in spec.fields:
        feature = message.features.feature[field]
        if field == spec.score_field:
            slots[field] = ("float", feature.float_list.value)
        elif tokenized:
            slots[field] = ("ids", feature.int64_list.value)
        else:
            slots[field] = ("string", feature.bytes_list.value)

    def serialize(example: dict) -> bytes:
        for field, (kind, value) in slots.items():
            if kind == "ids":
                value[:] = example[field].tolist()
            else:
                value[:] = [example[field] if kind == "float" else example[field].encode("utf-8")]
        return message.SerializeToString(deterministic=True)  # map keys sorted: the same bytes in every process

    return serialize


@functools.lru_cache(maxsize=2)
def _batch_tokenizer(tokenizer_dir: str, max_length: int) -> Callable:
    """texts [n] -> ids [n, (length)]: TokenizerSpec.tokenize_batch_tf, whose graph the spec builds once."""
    from sentemb_jax.data.vocab import tokenizer_spec_for  # lazy: TensorFlow, only for a corpus of ids

    return functools.partial(tokenizer_spec_for(tokenizer_dir).tokenize_batch_tf, max_length=max_length)


def _tokenize(examples: list[dict], fields: Sequence[str], tokenizer_dir: str, max_length: int) -> list[dict]:
    """The examples with their text fields replaced by ids - the training pipeline's own in-graph
    tokenizer (data.tasks.tokenize_texts' rule), so a prepared corpus holds exactly the ids it would
    make (tests/test_prepared_corpus.py checks batch for batch)."""
    import tensorflow as tf  # lazy: a corpus of ids is tokenised in-graph

    tokenize = _batch_tokenizer(tokenizer_dir, max_length)
    for field in fields:
        ids = tokenize(tf.constant([e[field] for e in examples]))
        for example, row in zip(examples, ids.numpy()):
            example[field] = row
    return examples


def _rows(spec: FileSpec, task: ShardTask, path: str, counts: dict, on_bad_row: str):
    """The validated examples of one input file for this shard (the validated-file rules,
    files.validated_rows), the skipped rows added to `counts`."""
    summary = ReadSummary(path)
    take = None if task.row_stride == 1 else (lambda k: k % task.row_stride == task.row_offset)
    for _, _, example in validated_rows(dataclasses.replace(spec, path=path), on_bad_row, summary, take):
        yield example
    counts["malformed"] += summary.skipped_bad_rows
    counts["filtered"] += summary.filtered
    counts["empty_text"] += summary.skipped_empty_text
    counts["junk"] += summary.cleaned
    if summary.first_bad_row:
        counts.setdefault("first_malformed", f"{path}:{summary.first_bad_row.removeprefix('line ')}")


def write_shard(spec: FileSpec, task: ShardTask, output: str, on_bad_row: str = "error", dedup: bool = False,
                tokenizer_dir: str | None = None, max_length: int = 128) -> dict:
    """Validate the shard's input rows and write them (tokenized when tokenizer_dir is given);
    returns (and writes beside it) its manifest entry."""
    serialize = _example_bytes(spec, tokenizer_dir is not None)
    text_fields = [f for f in spec.fields if f != spec.score_field]
    pending: list[dict] = []
    counts = {"malformed": 0, "filtered": 0, "empty_text": 0, "junk": 0, "duplicate": 0}
    seen: set[bytes] = set()
    rows = 0
    local_dir = output if not is_remote(output) else tempfile.mkdtemp(prefix="sentemb_prepare_")
    tmp = os.path.join(local_dir, f".{task.name}.tmp-{os.getpid()}")
    writer = ArrayRecordWriter(tmp, "group_size:1")
    try:
        for path in task.inputs:
            for example in _rows(spec, task, path, counts, on_bad_row):
                if dedup:
                    key = hashlib.blake2b("\x00".join(example[f] for f in spec.texts).encode(), digest_size=16).digest()
                    if key in seen:
                        counts["duplicate"] += 1
                        continue
                    seen.add(key)
                pending.append(example)
                if len(pending) == TOKENIZE_CHUNK or tokenizer_dir is None:
                    rows += _flush(pending, writer, serialize, text_fields, tokenizer_dir, max_length)
        rows += _flush(pending, writer, serialize, text_fields, tokenizer_dir, max_length)
    finally:
        writer.close()
    digest = storage.sha256(tmp)
    final = storage.join(output, task.name)
    if is_remote(output):
        storage.copy(tmp, final)
        os.remove(tmp)
        os.rmdir(local_dir)
    else:
        os.replace(tmp, final)
    entry = {"file": task.name, "rows": rows, "bytes": storage.size(final), "sha256": digest,
             "sources": list(task.inputs), "row_stride": task.row_stride, "row_offset": task.row_offset,
             "skipped": counts}
    storage.write_bytes(storage.join(output, task.name + ".json"), json.dumps(entry).encode())
    return entry


def _flush(pending: list[dict], writer, serialize, fields, tokenizer_dir: str | None, max_length: int) -> int:
    if tokenizer_dir is not None and pending:
        _tokenize(pending, fields, tokenizer_dir, max_length)
    for example in pending:
        writer.write(serialize(example))
    n = len(pending)
    pending.clear()
    return n


def _done(task: ShardTask, output: str) -> dict | None:
    """The shard's manifest entry when a previous run finished it (entry present, file of its size)."""
    entry_file = storage.join(output, task.name + ".json")
    if not storage.exists(entry_file):
        return None
    entry = json.loads(storage.read_bytes(entry_file))
    same = entry.get("sources") == list(task.inputs) and entry.get("row_stride") == task.row_stride
    final = storage.join(output, task.name)
    return entry if same and storage.exists(final) and storage.size(final) == entry.get("bytes") else None


def _run_one(args) -> dict:
    spec, task, output, on_bad_row, dedup, tokenizer_dir, max_length = args
    return write_shard(spec, task, output, on_bad_row, dedup, tokenizer_dir, max_length)


def _run_in_processes(jobs: list, processes: int, bar) -> None:
    """The shard jobs on `processes` spawned workers. A worker that dies (the out-of-memory killer, a
    signal) is an error naming the shards it may have held, not a wait forever: multiprocessing.Pool
    would replace the worker and never return its shard (concurrent.futures marks the pool broken).
    Finished shards are kept either way: the same command continues. The first error (a bad row)
    cancels the shards not yet started and lets the running ones finish (kept), then is raised."""
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
    futures = {pool.submit(_run_one, job): job[1].name for job in jobs}
    try:
        for future in as_completed(futures):
            future.result()
            bar.update()
    except BrokenProcessPool as e:  # its cause (a worker's traceback, if it had one) goes to the log
        lost = sorted(name for future, name in futures.items()
                      if not future.done() or future.cancelled() or future.exception() is not None)
        raise SentembError(f"a preparation worker process died (killed, e.g. out of memory) while {len(lost)} "
                           f"shard(s) may not have finished ({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''}); "
                           f"{len(futures) - len(lost)} finished shard(s) are kept: run the same command again "
                           f"to continue (fewer processes use less memory)") from e
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def prepare(spec: FileSpec, inputs: Sequence[str], output: str, num_shards: int | None = None, *,
            on_bad_row: str = "error", dedup: bool = False, processes: int = 1, worker: tuple[int, int] = (0, 1),
            prefix: str = "data", kind: str = "", progress: bool = True, tokenizer_dir: str | None = None,
            max_length: int = 128) -> dict:
    """Prepare `inputs` (globs allowed) into `output`; returns the manifest (or, when other workers'
    shards are still missing, a summary of this worker's part).

    tokenizer_dir: also tokenize (truncated to max_length, the model's special tokens added): the
    corpus then holds ids and training skips tokenisation (what seqio's offline caching does for
    t5x); only a model with the same tokenizer (vocab.tokenizer_fingerprint) can read it."""
    files = [f for pattern in inputs for f in storage.expand(pattern)]
    if not files:
        raise DataError("no input files given")
    for f in files:
        if not storage.exists(f):
            raise DataError(f"{f}: no such file")
    k, n = worker
    tasks = plan_shards(files, num_shards, prefix)
    storage.makedirs(output)
    mine = [t for t in tasks if t.index % n == k]
    todo = [t for t in mine if _done(t, output) is None]
    if len(todo) < len(mine):
        log.info("%d of this worker's %d shards were finished by an earlier run: skipped", len(mine) - len(todo), len(mine))
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc="prepare", unit="shard", disable=None if progress else True)
    jobs = [(spec, t, output, on_bad_row, dedup, tokenizer_dir, max_length) for t in todo]
    if processes > 1 and len(jobs) > 1:
        _run_in_processes(jobs, min(processes, len(jobs)), bar)
    else:
        for job in jobs:
            _run_one(job)
            bar.update()
    bar.close()
    tokenizer = None if tokenizer_dir is None else {"fingerprint": tokenizer_fingerprint(tokenizer_dir),
                                                     "max_length": max_length, "source": tokenizer_dir}
    return finalize(spec, tasks, output, kind, tokenizer)


def finalize(spec: FileSpec, tasks: Sequence[ShardTask], output: str, kind: str = "", tokenizer: dict | None = None) -> dict:
    """Write manifest.json when every shard's entry is present; else return what is done so far."""
    entries = [_done(t, output) for t in tasks]
    missing = [t.name for t, e in zip(tasks, entries) if e is None]
    if missing:
        return {"complete": False, "shards_done": len(tasks) - len(missing), "shards": len(tasks), "missing": missing[:5]}
    text = "string" if tokenizer is None else "ids"
    features = {f: "float" if f == spec.score_field else text for f in spec.fields}
    manifest = {"format": FORMAT, "version": VERSION, "record": RECORD, "kind": kind, "features": features,
                "rows": sum(e["rows"] for e in entries), "shards": entries}
    if tokenizer is not None:
        manifest["tokenizer"] = tokenizer
    for reason in ("malformed", "filtered", "empty_text", "junk", "duplicate"):
        manifest[f"skipped_{reason}"] = sum(e["skipped"].get(reason, 0) for e in entries)
    storage.write_bytes(storage.join(output, MANIFEST), json.dumps(manifest, indent=1).encode())
    return manifest


def verify(path: str) -> list[str]:
    """Every shard whose sha256 or size differs from the manifest (reads every byte once)."""
    manifest_file = path if path.endswith(MANIFEST) else storage.join(path, MANIFEST)
    manifest = parse_manifest(manifest_file)
    directory = manifest_file[: -len(MANIFEST)].rstrip("/") or "."
    bad = []
    for entry in manifest["shards"]:
        file = storage.join(directory, entry["file"])
        if not storage.exists(file):
            bad.append(f"{file}: missing")
            continue
        digest = storage.sha256(file)
        if digest != entry.get("sha256"):
            bad.append(f"{file}: sha256 {digest[:12]}..., the manifest says {str(entry.get('sha256'))[:12]}...")
    return bad

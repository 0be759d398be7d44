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

Settings: every shard entry and the manifest record what they were made with (`settings`: kind,
columns and filters, tokenizer fingerprint or None, max_length of a corpus of ids, dedup; `inputs`:
each input file's size and modification time). A shard is "done" only when its entry's settings
and inputs are this run's; a run whose settings or inputs differ from those of the shards or the
manifest already in `output` is refused before anything is written, naming what differs - never a
corpus of mixed shards or a manifest describing shards it was not made from.

One writer: `output/.sentemb.lock` is held while the run writes (worker k of n: its own
`.sentemb.lock.worker-k-of-n`, the workers of one corpus share the directory); locking.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Sequence

from tqdm.auto import tqdm

from sentemb_jax import dependencies, faults
from sentemb_jax.data import storage
from sentemb_jax.data.example_proto import example_class
from sentemb_jax.data.files import FileSpec, ReadSummary, validated_rows
from sentemb_jax.data.prepared_corpus import FORMAT, MANIFEST, RECORD, VERSION, parse_manifest
from sentemb_jax.errors import DataError, Interrupted, SentembError
from sentemb_jax.locking import LOCK_FILE, DirectoryLock
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
                tokenizer_dir: str | None = None, max_length: int = 128, record: dict | None = None) -> dict:
    """Validate the shard's input rows and write them (tokenized when tokenizer_dir is given);
    returns (and writes beside it) its manifest entry. record: {"settings", "inputs"} of the run
    (preparation_record), kept in the entry."""
    serialize = _example_bytes(spec, tokenizer_dir is not None)
    text_fields = [f for f in spec.fields if f != spec.score_field]
    pending: list[dict] = []
    counts = {"malformed": 0, "filtered": 0, "empty_text": 0, "junk": 0, "duplicate": 0}
    seen: set[bytes] = set()
    rows = 0
    local_dir = output if not is_remote(output) else tempfile.mkdtemp(prefix="sentemb_prepare_")
    tmp = os.path.join(local_dir, f".{task.name}.tmp-{os.getpid()}")
    writer = dependencies.array_record("prepare_corpus").ArrayRecordWriter(tmp, "group_size:1")
    try:
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
    except BaseException:  # a bad row, a signal (Interrupted): no half-written shard stays behind
        _remove_quietly(tmp)
        if local_dir != output:
            _remove_quietly(local_dir, directory=True)
        raise
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
    if record is not None:
        entry["settings"] = record["settings"]
        entry["inputs"] = {p: record["inputs"][p] for p in task.inputs if p in record["inputs"]}
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


def _entry(task: ShardTask, output: str) -> dict | None:
    entry_file = storage.join(output, task.name + ".json")
    if not storage.exists(entry_file):
        return None
    try:
        return json.loads(storage.read_bytes(entry_file))
    except ValueError:
        return None  # a torn entry: the shard is written again


def _done(task: ShardTask, output: str, record: dict | None = None) -> dict | None:
    """The shard's manifest entry when a previous run finished it (entry present, file of its size,
    made with `record`'s settings and inputs when given)."""
    entry = _entry(task, output)
    if entry is None:
        return None
    same = entry.get("sources") == list(task.inputs) and entry.get("row_stride") == task.row_stride
    if record is not None and _record_differences(entry, record, task.inputs):
        return None
    final = storage.join(output, task.name)
    return entry if same and storage.exists(final) and storage.size(final) == entry.get("bytes") else None


def _input_stamp(path: str) -> dict:
    """Size and modification time of an input file (what says it was replaced since)."""
    if is_remote(path):
        stat = storage._tf().io.gfile.stat(path)
        return {"bytes": int(stat.length), "mtime_ns": int(getattr(stat, "mtime_nsec", 0))}
    stat = os.stat(path)
    return {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def preparation_record(spec: FileSpec, files: Sequence[str], kind: str, dedup: bool, tokenizer_dir: str | None,
                       max_length: int) -> dict:
    """{"settings": what decides a shard's bytes besides its inputs, "inputs": {file: size, mtime}}."""
    columns = {"fields": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.fields.items()},
               "text_fields": list(spec.text_fields) if spec.text_fields is not None else None,
               "score_field": spec.score_field, "score_range": list(spec.score_range) if spec.score_range else None,
               "keep": {k: list(v) for k, v in dict(spec.keep).items()}, "clean": spec.clean}
    settings = {"kind": kind, "columns": columns, "dedup": dedup,
                "tokenizer": None if tokenizer_dir is None else tokenizer_fingerprint(tokenizer_dir),
                "max_length": None if tokenizer_dir is None else max_length}
    return json.loads(json.dumps({"settings": settings, "inputs": {f: _input_stamp(f) for f in files}}))


def _record_differences(made: dict, now: dict, inputs: Sequence[str] | None = None) -> list[str]:
    """What differs between what shards / a manifest were made with (`made`: an entry or a manifest)
    and this run's record; inputs: the input files to compare (None: every one `made` names)."""
    before = made.get("settings")
    if before is None:
        return ["settings: not recorded (made by an earlier version of prepare_corpus)"]
    out = [f"{key}: {before.get(key)!r} -> {now['settings'].get(key)!r}"
           for key in sorted(set(before) | set(now["settings"])) if before.get(key) != now["settings"].get(key)]
    made_inputs = made.get("inputs") or {}
    for path in sorted(made_inputs if inputs is None else inputs):
        a, b = made_inputs.get(path), now["inputs"].get(path)
        if a != b:
            out.append(f"input {path}: " + ("not an input now" if b is None else "not recorded" if a is None
                                             else f"changed since ({a.get('bytes')} -> {b.get('bytes')} bytes, "
                                                  "or another modification time)"))
    return out


def _check_output(output: str, tasks: Sequence[ShardTask], record: dict) -> None:
    """Refuse (DataError) a run into a directory holding shards or a manifest made with other
    settings, inputs or another shard plan: it would mix them or replace their manifest."""
    if not storage.isdir(output):
        return
    problems = []
    manifest_file = storage.join(output, MANIFEST)
    planned = {t.name for t in tasks}
    if storage.exists(manifest_file):
        try:
            manifest = json.loads(storage.read_bytes(manifest_file))
        except ValueError:
            manifest = {}
        changed = _record_differences(manifest, record)
        if changed:
            problems.append(f"its {MANIFEST}: " + "; ".join(changed))
        names = {e.get("file") for e in manifest.get("shards", [])}
        if names != planned:
            problems.append(f"its {MANIFEST} lists other shards ({len(names)}, e.g. {sorted(names)[:1]}) than this run "
                            f"plans ({len(planned)}, e.g. {sorted(planned)[:1]})")
    others = sorted(name for name in _entry_names(output) if name not in planned)
    if others:
        problems.append(f"shards of another preparation ({len(others)}, e.g. {others[0]})")
    for task in tasks:
        entry = _entry(task, output)
        if entry is not None:
            changed = _record_differences(entry, record, task.inputs)
            if changed:
                problems.append(f"shard {task.name}: " + "; ".join(changed))
                break  # the first shard says it; the others were made alike
    if problems:
        raise DataError(f"prepare_corpus output {output} holds a corpus made otherwise: " + " | ".join(problems)
                        + ". Preparing into it would mix the two; use another output directory, or delete this one "
                        "to prepare it again")


def _entry_names(output: str) -> list[str]:
    """The shard names of the entries (`<shard>.json`) in `output`."""
    try:
        files = storage.expand(storage.join(output, "*.array_record.json"))
    except DataError:  # no file matches
        return []
    return [f.rstrip("/").rsplit("/", 1)[-1][: -len(".json")] for f in files]


def _remove_quietly(path: str, directory: bool = False) -> None:
    try:
        os.rmdir(path) if directory else os.remove(path)
    except OSError:
        pass


def remove_temporary_shards(output: str, tasks: Sequence[ShardTask]) -> int:
    """Delete the temporary files of `tasks`' shards in a local `output` (left by a worker that was
    stopped or killed mid-shard); the caller holds the output's lock. Returns how many."""
    if is_remote(output) or not os.path.isdir(output):
        return 0
    prefixes = tuple(f".{t.name}.tmp-" for t in tasks)
    stale = [name for name in os.listdir(output) if name.startswith(prefixes)]
    for name in stale:
        _remove_quietly(os.path.join(output, name))
    return len(stale)


def _worker_start(parent: int) -> None:
    """In each preparation worker: Ctrl-C is the parent's to handle (it stops the workers and says
    what was kept), and a worker whose parent is gone (SIGKILL) exits instead of preparing on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def exit_when_orphaned():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=exit_when_orphaned, daemon=True).start()


def _run_one(args) -> dict:
    spec, task, output, on_bad_row, dedup, tokenizer_dir, max_length, record = args
    return write_shard(spec, task, output, on_bad_row, dedup, tokenizer_dir, max_length, record)


def _run_in_processes(jobs: list, processes: int, bar) -> None:
    """The shard jobs on `processes` spawned workers. A worker that dies (the out-of-memory killer, a
    signal) is an error naming the shards it may have held, not a wait forever: multiprocessing.Pool
    would replace the worker and never return its shard (concurrent.futures marks the pool broken).
    Finished shards are kept either way: the same command continues. The first error (a bad row)
    cancels the shards not yet started and lets the running ones finish (kept), then is raised."""
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start,
                               initargs=(os.getpid(),))
    futures = {pool.submit(_run_one, job): job[1] for job in jobs}
    try:
        for future in as_completed(futures):
            future.result()
            bar.update()
            faults.in_phase("prepare_after_shard")  # tests only (SENTEMB_FAULT=sigterm_in:prepare_after_shard)
    except Interrupted:  # SIGTERM / Ctrl-C (main's handlers): the workers stop too, mid-shard
        pool.shutdown(wait=False, cancel_futures=True)
        for child in multiprocessing.active_children():
            child.terminate()
        for child in multiprocessing.active_children():
            child.join(10)
        # Every task's: a finished shard's file is renamed already, and a stopped worker's future
        # may read as done (BrokenProcessPool) by now.
        remove_temporary_shards(jobs[0][2], list(futures.values()))
        raise
    except BrokenProcessPool as e:  # its cause (a worker's traceback, if it had one) goes to the log
        lost = sorted(task.name for future, task in futures.items()
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
    record = preparation_record(spec, files, kind, dedup, tokenizer_dir, max_length)
    _check_output(output, tasks, record)  # before anything is written
    storage.makedirs(output)
    lock = None if n == 1 else storage.join(output, f"{LOCK_FILE}.worker-{k}-of-{n}")
    with DirectoryLock(output, "prepare_corpus output", lock_path=lock, job="prepare_corpus"):
        _check_output(output, tasks, record)  # again, now that no other run of this worker writes it
        return _prepare_locked(spec, tasks, output, record, worker, on_bad_row=on_bad_row, dedup=dedup,
                               processes=processes, kind=kind, progress=progress, tokenizer_dir=tokenizer_dir,
                               max_length=max_length)


def _prepare_locked(spec: FileSpec, tasks: list[ShardTask], output: str, record: dict, worker: tuple[int, int], *,
                    on_bad_row: str, dedup: bool, processes: int, kind: str, progress: bool, tokenizer_dir: str | None,
                    max_length: int) -> dict:
    k, n = worker
    mine = [t for t in tasks if t.index % n == k]
    todo = [t for t in mine if _done(t, output, record) is None]
    if len(todo) < len(mine):
        log.info("%d of this worker's %d shards were finished by an earlier run: skipped", len(mine) - len(todo), len(mine))
    remove_temporary_shards(output, todo)  # of a run killed mid-shard (the lock says none is running)
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc="prepare", unit="shard", disable=None if progress else True)
    jobs = [(spec, t, output, on_bad_row, dedup, tokenizer_dir, max_length, record) for t in todo]
    try:
        if processes > 1 and len(jobs) > 1:
            _run_in_processes(jobs, min(processes, len(jobs)), bar)
        else:
            for job in jobs:
                _run_one(job)
                bar.update()
    except Interrupted as e:
        done = sum(_done(t, output, record) is not None for t in mine)
        e.kept.append(f"{output} keeps {done} finished shard(s) of {len(mine)}"
                      + (" (its worker processes were stopped)" if processes > 1 and len(jobs) > 1 else ""))
        raise
    finally:
        bar.close()
    tokenizer = None if tokenizer_dir is None else {"fingerprint": tokenizer_fingerprint(tokenizer_dir),
                                                     "max_length": max_length, "source": tokenizer_dir}
    return finalize(spec, tasks, output, kind, tokenizer, record)


def finalize(spec: FileSpec, tasks: Sequence[ShardTask], output: str, kind: str = "", tokenizer: dict | None = None,
             record: dict | None = None) -> dict:
    """Write manifest.json when every shard's entry is present (made with `record`'s settings and
    inputs, when given); else return what is done so far."""
    entries = [_done(t, output, record) for t in tasks]
    missing = [t.name for t, e in zip(tasks, entries) if e is None]
    if missing:
        return {"complete": False, "shards_done": len(tasks) - len(missing), "shards": len(tasks), "missing": missing[:5]}
    text = "string" if tokenizer is None else "ids"
    features = {f: "float" if f == spec.score_field else text for f in spec.fields}
    manifest = {"format": FORMAT, "version": VERSION, "record": RECORD, "kind": kind, "features": features,
                "rows": sum(e["rows"] for e in entries), "shards": entries}
    if tokenizer is not None:
        manifest["tokenizer"] = tokenizer
    if record is not None:
        manifest.update(settings=record["settings"], inputs=record["inputs"])
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

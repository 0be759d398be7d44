"""A prepared corpus: ArrayRecord shards of `tf.train.Example` rows and a manifest, read as a seqio source.

    cqa/manifest.json                      rows, bytes and sha256 of each shard, its sources, what was skipped
    cqa/cqa-00000-of-01024.array_record    one validated example per record (group_size 1: random access)

Written once by `sentemb_jax.data.prepare` (validation happens there); read here with nothing
proportional to the corpus in memory and nothing read at start-up but the manifest:

* **Order** (depends only on the seed and the manifest, not on the number of hosts): each epoch
  permutes the shards by its seed, cuts that shard order into windows of `window_shards` shards,
  and permutes all rows of a window with `tf.random.experimental.index_shuffle` (a stateless
  bijection computed per position: no permutation array is built). Global position p of an epoch
  is row `index_shuffle(p - start of its window)` of its window.
* **Hosts**: host h of H reads positions h, h + H, h + 2H, ... of that global order (as the validated
  file path does): disjoint, complete, and each host opens only the shards of the current window.
* **Resume**: a position is computed, not replayed: `InputPipeline` starts the source at the first
  example after the last consumed batch. A state saved by N hosts resumes exactly on M hosts with
  the same global batch (positions are global).
* **Shards** are checked at start-up against the manifest by size (one stat each, no read); a
  missing or truncated shard is a DataError naming it, or, with `on_bad_shard="skip"`, left out
  of the order and counted. A shard damaged inside (a flipped bit) fails its record checksum when
  read: a DataError naming the shard (`prepare --verify` checks every shard's sha256).

ArrayRecord files are read by random access from a local or mounted path: on a TPU VM, mount the
bucket with gcsfuse, as MaxText's Grain + ArrayRecord input does (the open-source ArrayRecord
reader has no gs:// client); the manifest itself may be on any tf.io.gfile filesystem.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
from typing import Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf
from array_record.python.array_record_module import ArrayRecordReader

from sentemb_jax.data import storage
from sentemb_jax.errors import DataError
from sentemb_jax.paths import is_remote

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "array_record"
RECORD = "tf.train.Example"
VERSION = 1
READ_CHUNK = 1024  # positions looked up and read per call into Python (the rest is graph ops)
OPEN_READERS = 32  # readers kept open: two windows of shards (each reader holds its shard's record index, ~14 bytes a row)


def manifest_path(path: str) -> str | None:
    """The manifest of a prepared corpus named by `path` (its directory or its manifest), else None."""
    if path.endswith(MANIFEST):
        return path
    candidate = storage.join(path, MANIFEST)
    return candidate if storage.isdir(path) and storage.exists(candidate) else None


def parse_manifest(path: str) -> dict:
    """The manifest at `path`, its structure checked (DataError naming the file and the entry)."""
    try:
        manifest = json.loads(storage.read_bytes(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not a JSON manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DataError(f"{path}: not a prepared-corpus manifest (want format {FORMAT!r}, version {VERSION})")
    features = manifest.get("features")
    if not isinstance(features, dict) or not features or set(features.values()) - {"string", "float", "ids"}:
        raise DataError(f"{path}: 'features' must map feature names to 'string', 'ids' or 'float'")
    if "ids" in features.values() and not isinstance(manifest.get("tokenizer"), dict):
        raise DataError(f"{path}: a tokenized corpus ('ids' features) must name its tokenizer")
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise DataError(f"{path}: no shards listed")
    for i, s in enumerate(shards):
        ok = isinstance(s, dict) and isinstance(s.get("file"), str) and "/" not in s["file"] and s["file"] not in ("", ".", "..")
        if not ok or not all(isinstance(s.get(k), int) and s[k] >= 0 for k in ("rows", "bytes")):
            raise DataError(f"{path}: shards[{i}] must have a file name in the manifest's directory and rows / bytes counts")
    return manifest


@dataclasses.dataclass
class EpochPlan:
    """Where each global position of an epoch reads: the windows of the seed's shard order."""

    window_shards: np.ndarray  # [windows, window_shards] shard ids (-1 = padding)
    window_counts: np.ndarray  # [windows, window_shards + 1] cumulative rows within each window
    window_starts: np.ndarray  # [windows + 1] first global position of each window


class PreparedCorpus:
    def __init__(self, path: str, window_shards: int = 16, on_bad_shard: str = "error"):
        if on_bad_shard not in ("error", "skip"):
            raise ValueError(f"on_bad_shard must be 'error' or 'skip', got {on_bad_shard!r}")
        if not isinstance(window_shards, int) or window_shards < 1:
            raise ValueError(f"window_shards must be a positive integer, got {window_shards!r}")
        self.manifest_file = manifest_path(path) or path
        if not storage.exists(self.manifest_file):
            raise DataError(f"{path}: no prepared corpus here (no {MANIFEST}; prepare one with "
                            "python -m sentemb_jax.main --gin_file=gin/runs/prepare_corpus.gin)")
        self.manifest = parse_manifest(self.manifest_file)
        self.directory = self.manifest_file[: -len(MANIFEST)].rstrip("/") or "."
        self.features = dict(self.manifest["features"])
        self.files = [storage.join(self.directory, s["file"]) for s in self.manifest["shards"]]
        if is_remote(self.files[0]):
            raise DataError(f"{self.files[0]}: ArrayRecord shards are read by random access from a local or mounted "
                            "path; mount the bucket (gcsfuse, as MaxText's Grain input does) and name the mount")
        self.counts = np.asarray([s["rows"] for s in self.manifest["shards"]], np.int64)
        self.skipped = self._check_shards(on_bad_shard)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])
        self.window_shards = window_shards
        self._readers: collections.OrderedDict[int, ArrayRecordReader] = collections.OrderedDict()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _check_shards(self, on_bad_shard: str) -> list[str]:
        """Missing or truncated shards (a stat each): DataError, or left out and counted."""
        bad = []
        for k, (file, entry) in enumerate(zip(self.files, self.manifest["shards"])):
            problem = None
            if not storage.exists(file):
                problem = "missing"
            elif storage.size(file) != entry["bytes"]:
                problem = f"{storage.size(file)} bytes, the manifest says {entry['bytes']} (truncated or replaced)"
            if problem:
                if on_bad_shard == "error":
                    raise DataError(f"{file}: shard {problem} ({self.manifest_file})")
                bad.append(f"{file}: {problem}")
                self.counts[k] = 0
        if bad:
            log.warning("%s: %d of %d shards left out (on_bad_shard='skip'), %d rows remain: %s", self.manifest_file,
                        len(bad), len(self.files), int(self.counts.sum()), "; ".join(bad[:5]))
        return bad

    def plan(self, seed: int) -> EpochPlan:
        order = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5EED]).permutation(len(self.files))
        order = order[self.counts[order] > 0]
        w = self.window_shards
        windows = max(1, -(-len(order) // w))
        shards = np.full((windows, w), -1, np.int64)
        shards.flat[: len(order)] = order
        rows = np.where(shards >= 0, self.counts[np.maximum(shards, 0)], 0)
        counts = np.concatenate([np.zeros((windows, 1), np.int64), np.cumsum(rows, axis=1)], axis=1)
        starts = np.concatenate([[0], np.cumsum(counts[:, -1])])
        return EpochPlan(shards, counts, starts)

    def locate(self, positions: tf.Tensor, seed: int, plan: EpochPlan) -> tuple[tf.Tensor, tf.Tensor]:
        """(shard, record) of global positions of the epoch with `seed`: graph ops, usable in tf.data."""
        positions = tf.cast(positions, tf.int64)
        window = tf.searchsorted(tf.constant(plan.window_starts[1:]), positions, side="right", out_type=tf.int64)
        offset = positions - tf.gather(tf.constant(plan.window_starts), window)
        size = tf.gather(tf.constant(plan.window_counts[:, -1]), window)
        # A seed per position: (run seed, window, a constant). The raw op: tf.random.experimental.index_shuffle's
        # wrapper pads a [n, 2] seed along the wrong axis.
        seeds = tf.stack([tf.fill(tf.shape(window), tf.constant(int(seed) & 0x7FFFFFFF, tf.int64)), window,
                          tf.fill(tf.shape(window), tf.constant(0x5E17, tf.int64))], axis=1)
        shuffled = tf.raw_ops.RandomIndexShuffle(index=offset, seed=seeds, max_index=tf.maximum(size - 1, 0), rounds=4)
        counts = tf.gather(tf.constant(plan.window_counts), window)  # [n, window_shards + 1]
        slot = tf.reduce_sum(tf.cast(counts[:, 1:] <= shuffled[:, None], tf.int64), axis=1)
        shard = tf.gather_nd(tf.constant(plan.window_shards), tf.stack([window, slot], axis=1))
        record = shuffled - tf.gather(counts, slot, batch_dims=1)
        return shard, record

    def _reader(self, shard: int) -> ArrayRecordReader:
        reader = self._readers.pop(shard, None)
        if reader is None:
            try:
                reader = ArrayRecordReader(self.files[shard], "readahead_buffer_size:0,max_parallelism:0")
            except Exception as e:  # the C++ reader raises bare RuntimeErrors / ValueErrors
                raise DataError(f"{self.files[shard]}: cannot read this shard ({str(e).splitlines()[0][:200]})") from None
            if reader.num_records() != self.counts[shard]:
                raise DataError(f"{self.files[shard]}: {reader.num_records()} records, the manifest says {int(self.counts[shard])}")
            while len(self._readers) >= OPEN_READERS:
                self._readers.popitem(last=False)[1].close()
        self._readers[shard] = reader
        return reader

    def read(self, shards: np.ndarray, records: np.ndarray) -> np.ndarray:
        """The serialized records at (shard, record) pairs, in the order given."""
        out = np.empty(len(shards), object)
        for shard in np.unique(shards):
            where = np.flatnonzero(shards == shard)
            try:
                out[where] = self._reader(int(shard)).read(records[where].tolist())
            except DataError:
                raise
            except Exception as e:
                raise DataError(f"{self.files[int(shard)]}: damaged shard ({str(e).splitlines()[0][:200]}); "
                                "check it with prepare_corpus.verify=True") from None
        return out

    def describe(self, row_ids: Sequence[int]) -> list[str]:
        """`shard file #record` of global row ids (manifest order)."""
        out = []
        for r in row_ids:
            k = int(np.searchsorted(self.starts, int(r), side="right")) - 1
            out.append(f"{self.files[k]} #{int(r) - int(self.starts[k])}")
        return out


class PreparedSource(seqio.DataSource):
    """A seqio source over prepared corpora (one per split); see the module docstring for the order.

    `start_at` (set by InputPipeline before `get_dataset` when it resumes): the number of this
    host's examples of the epoch already consumed; the dataset begins right after them.
    """

    def __init__(self, paths: Mapping[str, str], window_shards: int = 16, on_bad_shard: str = "error"):
        self._paths = dict(paths)
        self._window_shards, self._on_bad_shard = window_shards, on_bad_shard
        self._corpora: dict[str, PreparedCorpus] = {}
        self.start_at = 0
        super().__init__(splits=list(paths), num_input_examples=None, caching_permitted=True,
                         performs_internal_shuffling=True)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    def corpus(self, split: str) -> PreparedCorpus:
        if split not in self._paths:
            raise DataError(f"split {split!r} not available; this source has {sorted(self._paths)}")
        if split not in self._corpora:
            self._corpora[split] = PreparedCorpus(self._paths[split], self._window_shards, self._on_bad_shard)
        return self._corpora[split]

    def list_shards(self, split: str) -> Sequence[str]:
        return self.corpus(split).files

    def num_input_examples(self, split: str) -> int:
        return len(self.corpus(split))

    def describe(self, split: str, row_ids: Sequence[int]) -> list[str]:
        return self.corpus(split).describe(row_ids)

    def tokenizer(self) -> dict | None:
        """The tokenizer every split was tokenized with (fingerprint, max_length), None for text; a
        split tokenized differently from the others is a DataError."""
        found = {split: self.corpus(split).manifest.get("tokenizer") for split in self._paths}
        kinds = {json.dumps(t and {k: t[k] for k in ("fingerprint", "max_length")}, sort_keys=True) for t in found.values()}
        if len(kinds) > 1:
            raise DataError(f"prepared corpora {sorted(self._paths.values())}: splits tokenized differently ({found})")
        return next(iter(found.values()))

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False, num_epochs=1):
        corpus = self.corpus(split)
        seed = 0 if seed is None else int(seed)
        index, hosts = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
        plan = corpus.plan(seed)
        spec = {f: tf.io.RaggedFeature(tf.int64) if t == "ids" else tf.io.FixedLenFeature([], tf.float32 if t == "float" else tf.string)
                for f, t in corpus.features.items()}

        def lookup(k):  # k: this host's example numbers -> global positions -> (shard, record)
            positions = index + k * hosts
            if not shuffle:
                shard = tf.searchsorted(tf.constant(corpus.starts[1:]), positions, side="right", out_type=tf.int64)
                return shard, positions - tf.gather(tf.constant(corpus.starts), shard)
            return corpus.locate(positions, seed, plan)

        def read(shard, record):  # one Python call per chunk (the reader cache is not thread-safe: sequential)
            return shard, record, tf.numpy_function(corpus.read, [shard, record], tf.string, stateful=False)

        def parse(shard, record, records):
            examples = tf.io.parse_example(tf.reshape(records, [-1]), spec)
            examples = {f: tf.cast(x, tf.int32) if x.dtype == tf.int64 else x for f, x in examples.items()}  # ids
            examples["row_id"] = tf.gather(tf.constant(corpus.starts), shard) + record
            return examples

        mine = max(0, -(-(len(corpus) - index) // hosts))
        ds = tf.data.Dataset.range(min(self.start_at, mine), mine).batch(READ_CHUNK)
        ds = ds.map(lookup).map(read)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.unbatch()

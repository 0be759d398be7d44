"""A prepared corpus: ArrayRecord shards of `tf.train.Example` rows and a manifest, read without
TensorFlow (the records are parsed by data.example_proto); both input routes read it through this
class (the seqio source in data.prepared, the TensorFlow-free reader in data.reader).

    cqa/manifest.json                      rows, bytes and sha256 of each shard, its sources, what was skipped
    cqa/cqa-00000-of-01024.array_record    one validated example per record (group_size 1: random access)

Written once by `sentemb_jax.data.prepare` (validation happens there); read here with nothing
proportional to the corpus in memory and nothing read at start-up but the manifest:

* **Order** (depends only on the seed and the manifest, not on the number of hosts): each epoch
  permutes the shards by its seed, cuts that shard order into windows of `window_shards` shards,
  and permutes all rows of a window with numpy (a permutation per window and seed, the two last
  used kept: memory in the rows of two windows, never the corpus). Global position p of an epoch
  is row `permutation[p - start of its window]` of its window.
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
from typing import Sequence

import numpy as np

from sentemb_jax import dependencies
from sentemb_jax.data import storage
from sentemb_jax.data.example_proto import parse_examples
from sentemb_jax.errors import DataError
from sentemb_jax.paths import is_remote

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "array_record"
RECORD = "tf.train.Example"
VERSION = 1
READ_CHUNK = 1024  # positions looked up and read per call
OPEN_READERS = 32  # readers kept open: two windows of shards (each reader holds its shard's record index, ~14 bytes a row)


def check_kind(made_as: str | None, where: str, kind: str) -> None:
    """A corpus prepared as one kind and read as another (NLI pairs given as a QA task) would train
    on rows whose columns mean something else; a corpus without a kind (prepared by the library
    without one) is taken as it is."""
    if made_as and made_as != kind:
        raise DataError(f"{where}: a corpus prepared as {made_as!r} (prepare_corpus.kind), given here as the {kind!r} "
                        f"task's files: give it as files[{made_as!r}], or prepare the {kind!r} rows with "
                        f"prepare_corpus.kind={kind!r}")


def check_sequence_length(made_by: dict | None, where: str, kind: str, sequence_length: int | None) -> None:
    """A corpus of ids cut at a max_length below the run's sequence_length would train on texts cut
    shorter than the run asks (a text corpus is tokenized by the run itself: nothing to check)."""
    if made_by is None or sequence_length is None or "max_length" not in made_by:
        return
    cut = int(made_by["max_length"])
    if cut < sequence_length:
        raise DataError(f"{where}: the {kind!r} corpus holds ids cut at {cut} tokens (prepare_corpus.max_length), fewer "
                        f"than DataConfig.sequence_length={sequence_length}: longer texts would train cut short. "
                        f"Prepare it again with prepare_corpus.max_length={sequence_length}, or train with "
                        f"sequence_length <= {cut}")


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
        self._array_record = dependencies.array_record(f"the prepared corpus {self.manifest_file}")  # before any work
        if is_remote(self.files[0]):
            raise DataError(f"{self.files[0]}: ArrayRecord shards are read by random access from a local or mounted "
                            "path; mount the bucket (gcsfuse, as MaxText's Grain input does) and name the mount")
        self.counts = np.asarray([s["rows"] for s in self.manifest["shards"]], np.int64)
        self.skipped = self._check_shards(on_bad_shard)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])
        self.window_shards = window_shards
        self._readers: collections.OrderedDict[int, object] = collections.OrderedDict()
        self._permutations: dict[tuple[int, int], np.ndarray] = {}

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

    def locate(self, positions: np.ndarray, seed: int, plan: EpochPlan) -> tuple[np.ndarray, np.ndarray]:
        """(shard, record) of global positions of the epoch with `seed`."""
        positions = np.asarray(positions, np.int64)
        window = np.searchsorted(plan.window_starts[1:], positions, side="right")
        offset = positions - plan.window_starts[window]
        shuffled = np.empty_like(offset)
        for w in np.unique(window):
            where = window == w
            shuffled[where] = self._window_permutation(seed, int(w), int(plan.window_counts[w, -1]))[offset[where]]
        counts = plan.window_counts[window]  # [n, window_shards + 1]
        slot = np.sum(counts[:, 1:] <= shuffled[:, None], axis=1)
        shard = plan.window_shards[window, slot]
        record = shuffled - counts[np.arange(len(counts)), slot]
        return shard, record

    def _window_permutation(self, seed: int, window: int, size: int) -> np.ndarray:
        """The order of a window's rows (the last two windows' kept: a chunk may span a boundary)."""
        key = (int(seed), window)
        if key not in self._permutations:
            if len(self._permutations) >= 2:
                self._permutations.pop(next(iter(self._permutations)))
            self._permutations[key] = np.random.default_rng([int(seed) & 0xFFFFFFFF, window, 0x5E17]).permutation(size)
        return self._permutations[key]

    def host_positions(self, start: int, stop: int, index: int, hosts: int) -> np.ndarray:
        """Global positions of this host's examples start .. stop - 1 (host h reads h, h + H, ...)."""
        return index + np.arange(start, stop, dtype=np.int64) * hosts

    def host_rows(self, index: int, hosts: int) -> int:
        """How many examples of an epoch this host reads."""
        return max(0, -(-(len(self) - index) // hosts))

    def _reader(self, shard: int):
        reader = self._readers.pop(shard, None)
        if reader is None:
            try:
                reader = self._array_record.ArrayRecordReader(self.files[shard], "readahead_buffer_size:0,max_parallelism:0")
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



    def examples(self, shards: np.ndarray, records: np.ndarray) -> list[dict]:
        """The parsed rows at (shard, record) pairs, in the order given, each with its `row_id`."""
        rows = parse_examples(self.read(shards, records), self.features)
        for row, shard, record in zip(rows, shards, records):
            row["row_id"] = int(self.starts[int(shard)] + int(record))
        return rows

    def tokenizer(self) -> dict | None:
        """The tokenizer the corpus was tokenized with (fingerprint, max_length, source); None for text."""
        return self.manifest.get("tokenizer")

"""Where a kind's rows come from, without TensorFlow: its files (validated TSV / JSONL rows, or a
prepared corpus), one epoch's order of them, the rows, and where a row came from. Both input
routes read through these - the seqio tasks wrap them (data.tasks), the TensorFlow-free reader
iterates them (data.reader) - so the order, the host sharding, the bad-row and bad-shard rules
are one contract.

* Validated files (`FileRows`): an epoch is a full permutation of the rows by the seed (no
  buffer); host h of H reads every H-th row of it, so hosts read disjoint parts of one order.
* A prepared corpus (`PreparedRows`, data.prepared_corpus): shards permuted by the seed, rows
  permuted within windows of shards; host h reads global positions h, h + H, ...
"""
from __future__ import annotations

import os
from typing import Iterator, Mapping, Sequence

import numpy as np

from sentemb_jax.data import prepared_corpus, storage
from sentemb_jax.data.files import (
    ConcatRowIndex,
    FileSpec,
    RowIndex,
    index_rows,
    missing_file_message,
    neighbour_positions,
    read_rows,
    source_lines,
)
from sentemb_jax.data.kinds import API, DEFAULT_FILES, MIXTURES, NEIGHBOUR, file_spec
from sentemb_jax.errors import ConfigError, DataError, TrainingError
from sentemb_jax.paths import is_remote
from sentemb_jax.validation import is_under

PREFIX = "sentemb_"  # a kind's task name: sentemb_<kind>


def task_names(kinds: Sequence[str]) -> dict[str, str]:
    """kind -> task name for these kinds, and the mixtures whose parts they all hold."""
    names = {kind: PREFIX + kind for kind in kinds}
    names.update({m: PREFIX + m for m, parts in MIXTURES.items() if set(parts) <= set(kinds)})
    return names


def split_specs(kind: str, data_dir: str, files: Mapping, build) -> dict[str, FileSpec | tuple[FileSpec, ...]]:
    """split -> the FileSpec(s) of a kind: its `files` entry (default DEFAULT_FILES), relative ones
    under data_dir (never out of it), a glob expanded in sorted order, a list read as one split, a
    prepared corpus named by its directory or manifest."""
    rel = files.get(kind, DEFAULT_FILES[kind])
    by_split = rel if isinstance(rel, Mapping) else {"train": rel}
    specs = {}
    for split, paths in by_split.items():
        built = []
        for path in [paths] if isinstance(paths, str) else list(paths):  # a list: files read as one
            binding = f"DataConfig.data_dir={data_dir!r} + files[{kind!r}]={path!r}"
            if not isinstance(path, str) or not path:
                raise ConfigError("{where}: must be a file path (a string; relative ones are under DataConfig.data_dir)",
                                  api=API, param="files", value=path, key=f"[{kind!r}]")
            absolute = os.path.isabs(path) or is_remote(path)
            if not absolute and not is_under(path, data_dir):
                # A relative entry stays under DATA_DIR; an absolute one (or gs://...) is the user's own.
                raise ConfigError(f"{{where}}: a relative path must stay under DATA_DIR {os.path.normpath(data_dir)} (it "
                                  f"resolves to {os.path.normpath(os.path.join(data_dir, path))}); give an absolute path "
                                  "for a file elsewhere", api=API, param="files", value=path, key=f"[{kind!r}]")
            full = path if absolute else os.path.join(data_dir, path)
            manifest = prepared_corpus.manifest_path(full) if not storage.is_pattern(full) else None
            if manifest:  # a prepared corpus (data.prepare)
                built.append(build(manifest, binding))
                continue
            try:  # a glob: its files in sorted order, read as one split (no match: reported when required / read)
                built += [build(f, binding) for f in storage.expand(full)]
            except DataError:
                built.append(build(full, binding))
        specs[split] = built[0] if len(built) == 1 and isinstance(paths, str) else tuple(built)
    return specs


def kind_specs(data_dir: str, files: Mapping, kinds: Sequence[str], **options) -> dict[str, dict]:
    """kind -> split -> FileSpec(s), for `kinds` (options: DataConfig's label / column / score rules)."""
    return {kind: split_specs(kind, data_dir, files, lambda path, binding, kind=kind: file_spec(kind, path, binding, **options))
            for kind in kinds}


def check_required(specs_of: Mapping[str, dict], data_dir: str, require: Sequence[str]) -> None:
    """DataError naming every missing file of the required kinds / mixtures (and what produced each
    path); the data directory itself when it does not exist."""
    wanted = []
    for name in require:
        parts = MIXTURES.get(name, (name,))
        unknown = [p for p in parts if p not in specs_of]
        if unknown:
            raise ValueError(f"register_tasks.require: {name!r} is not a registered kind; registered: "
                             f"{sorted(specs_of) + [m for m, p in MIXTURES.items() if set(p) <= set(specs_of)]}")
        wanted += [p for p in parts if p not in wanted]
    missing = []
    for kind in wanted:
        for spec in specs_of[kind].values():
            missing += [part for part in (spec if isinstance(spec, tuple) else (spec,)) if not storage.exists(part.path)]
    if not missing:
        return
    if not os.path.isdir(data_dir) and any(part.path.startswith(os.path.join(data_dir, "")) for part in missing):
        raise DataError(f"{data_dir}: no such data directory ({{where}})", api=API, param="data_dir", value=data_dir,
                        source=True)
    raise DataError("; ".join(missing_file_message(part) for part in missing))


def task_specs(data, data_dir: str) -> dict:
    """split -> FileSpec(s) of a DataConfig's task (a mixture: none - seqio reads it), after the
    checks register_tasks makes: the task is a kind (or a mixture of kinds), its files exist.
    Nothing is read."""
    options = data.task_options()
    files = options.pop("files")
    if data.task not in task_names(DEFAULT_FILES).keys():
        raise TrainingError(f"DataConfig.task {data.task!r} unknown; registered: {sorted(task_names(DEFAULT_FILES))}")
    specs_of = kind_specs(data_dir, files, MIXTURES.get(data.task, (data.task,)),
                          **{k: options[k] for k in ("commqa_labels", "nli_pair_labels", "sts_score_range",
                                                     "sentence_column", "view_columns", "clean")})
    check_required(specs_of, data_dir, (data.task,))
    return specs_of.get(data.task, {})


def seqio_route_reason(data) -> tuple[str, str]:
    """(what asks for the seqio route, what runs without it) of a DataConfig that reads through seqio."""
    if data.reader == "seqio":
        return "sentemb_jax.DataConfig.reader='seqio'", "read the task with DataConfig.reader='numpy' (no TensorFlow)"
    return f"sentemb_jax.DataConfig.task={data.task!r} (a mixture, read through seqio)", ""


def is_prepared(specs: Mapping, kind: str) -> bool:
    """Whether a kind's splits are prepared corpora (all of them, each its split's only entry)."""
    parts = [p for spec in specs.values() for p in (spec if isinstance(spec, tuple) else (spec,))]
    prepared = [p.path.endswith(prepared_corpus.MANIFEST) for p in parts]
    if not any(prepared):
        return False
    if not all(prepared) or len(parts) != len(specs) or kind == "sentences":
        raise ConfigError(f"{API}.files[{kind!r}]: a prepared corpus (manifest.json) must be the split's only entry, "
                          "every split of the kind prepared"
                          + (" (the sentences task reads validated files: its views need row neighbours)" if kind == "sentences" else ""))
    return True


class FileRows:
    """One split of validated files (several read as one: row ids run across them)."""

    def __init__(self, spec: FileSpec | tuple[FileSpec, ...], on_bad_row: str = "error", neighbour_of: str | None = None):
        """neighbour_of: a text field; each row also carries, as `neighbour`, that field of the row
        next to it in its file (files.neighbour_positions): the `neighbour` view's text."""
        self.spec, self.on_bad_row, self.neighbour_of = spec, on_bad_row, neighbour_of
        self._index: RowIndex | ConcatRowIndex | None = None

    @property
    def files(self) -> list[str]:
        return [s.path for s in self.spec] if isinstance(self.spec, tuple) else [self.spec.path]

    @property
    def first_spec(self) -> FileSpec:
        return self.spec[0] if isinstance(self.spec, tuple) else self.spec  # the parts share their columns

    @property
    def index(self) -> RowIndex | ConcatRowIndex:
        """Every row validated once (the first time it is needed), their byte offsets kept."""
        if self._index is None:
            spec = self.spec
            self._index = (ConcatRowIndex([index_rows(s, self.on_bad_row) for s in spec]) if isinstance(spec, tuple)
                           else index_rows(spec, self.on_bad_row))
        return self._index

    def __len__(self) -> int:
        return len(self.index)

    def order(self, seed: int | None, shard: tuple[int, int] | None = None, shuffle: bool = True) -> np.ndarray:
        """This host's rows of the epoch with `seed`, in order: every shard[1]-th of the permutation."""
        n = len(self)
        order = np.random.default_rng(0 if seed is None else int(seed)).permutation(n) if shuffle else np.arange(n)
        if shard is not None and shard[1] > 1:
            order = order[shard[0] :: shard[1]]
        return order

    def rows(self, order: Sequence[int]) -> Iterator[dict]:
        """The rows at these positions, each with its `row_id` (and `neighbour`)."""
        index = self.index
        neighbours = read_rows(index, neighbour_positions(index, order)) if self.neighbour_of else None
        for pos, example in zip(order, read_rows(index, order)):
            example["row_id"] = int(pos)
            if neighbours is not None:
                example[NEIGHBOUR] = next(neighbours)[self.neighbour_of]
            yield example

    def describe(self, row_ids: Sequence[int]) -> list[str]:
        """`path:line` of row ids (what a bad batch came from)."""
        return source_lines(self.index, row_ids)


class PreparedRows:
    """One split of a prepared corpus (data.prepared_corpus): the same rules, read by position."""

    def __init__(self, path: str, window_shards: int = 16, on_bad_shard: str = "error"):
        self.corpus = prepared_corpus.PreparedCorpus(path, window_shards, on_bad_shard)
        self._plan: tuple[int, prepared_corpus.EpochPlan] | None = None

    @property
    def files(self) -> list[str]:
        return self.corpus.files

    def __len__(self) -> int:
        return len(self.corpus)

    def positions(self, start: int, stop: int, seed: int, shard: tuple[int, int] | None = None,
                  shuffle: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(shard, record) of this host's examples start .. stop - 1 of the epoch with `seed`."""
        index, hosts = shard if shard else (0, 1)
        positions = self.corpus.host_positions(start, min(stop, self.corpus.host_rows(index, hosts)), index, hosts)
        if not shuffle:
            k = np.searchsorted(self.corpus.starts[1:], positions, side="right")
            return k, positions - self.corpus.starts[k]
        if self._plan is None or self._plan[0] != seed:
            self._plan = (seed, self.corpus.plan(seed))
        return self.corpus.locate(positions, seed, self._plan[1])

    def host_rows(self, shard: tuple[int, int] | None = None) -> int:
        index, hosts = shard if shard else (0, 1)
        return self.corpus.host_rows(index, hosts)

    def describe(self, row_ids: Sequence[int]) -> list[str]:
        return self.corpus.describe(row_ids)

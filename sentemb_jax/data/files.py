"""Validated readers for the TSV and JSONL files that training and evaluation read.

Format of the TSV files (see ../shared/data/README.md): UTF-8, a header line, TAB-separated
fields, no quoting. JSONL: one JSON object per line.

A file may live on any filesystem tf.io.gfile reads (`gs://...`) and may be gzip-compressed
(`.gz`: decompressed into memory, this path is for small data; a large corpus is prepared once
into shards, sentemb_jax.data.prepare). A file is read in two passes: `index_rows` validates every line once (before any training step
runs) and records the byte offset of each accepted row; `read_row` re-reads one row by offset,
so a shuffled, sharded epoch needs 8 bytes of memory per row however large the file is.

Every problem is a `DataError` naming the file and line (or byte offset). Rows with the wrong
number of fields either stop the read (`on_bad_row="error"`, the default) or are skipped and
counted (`on_bad_row="skip"`); rows with an empty text are always skipped and counted; scores
that are not numbers, NaN or outside the declared range always stop the read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from sentemb_jax.data import storage
from sentemb_jax.errors import DataError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Simple whole-file readers (evaluation)


def iter_tsv(path: str, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row dict) for each non-blank data line; the header must contain `columns`."""
    spec = FileSpec(path=path, fields={c: c for c in columns}, text_fields=())
    header = None
    for lineno, offset, raw in _iter_lines(path):
        line = _decode(path, lineno, offset, raw)
        fields = _split_tsv(line)
        if header is None:
            header = _check_header(spec, fields)
            continue
        if line.strip() == "":
            continue
        if len(fields) != len(header):
            raise DataError(f"{path}:{lineno}: expected {len(header)} TAB-separated fields, found {len(fields)}")
        yield lineno, dict(zip(header, fields))
    if header is None:
        raise DataError(f"{path}: empty file (no header line)")


def read_sts_pairs(path: str, score_range: tuple[float, float] | None = None):
    """(sentence1 list, sentence2 list, float scores) of an STS TSV file."""
    s1, s2, scores = [], [], []
    for lineno, row in iter_tsv(path, ("sentence1", "sentence2", "score")):
        score = parse_score(path, lineno, row["score"], score_range)
        s1.append(row["sentence1"])
        s2.append(row["sentence2"])
        scores.append(score)
    return s1, s2, np.asarray(scores, np.float64)


def parse_score(path: str, lineno: int, text: str, score_range: tuple[float, float] | None) -> float:
    try:
        score = float(text)
    except (TypeError, ValueError):
        raise DataError(f"{path}:{lineno}: score {text!r} is not a number") from None
    if math.isnan(score) or math.isinf(score):
        raise DataError(f"{path}:{lineno}: score is {score}")
    if score_range is not None and not score_range[0] <= score <= score_range[1]:
        raise DataError(f"{path}:{lineno}: score {score} outside the declared range {list(score_range)}")
    return score


# ---------------------------------------------------------------------------------------------
# Indexed, validated row files (training)


@dataclasses.dataclass(frozen=True)
class FileSpec:
    """What a data file must hold, and how its columns become example fields.

    fields: output field -> source column, or a tuple of columns joined with a space
      (e.g. a CQA question = title + body).
    text_fields: output fields that must be non-empty (rows where one is empty are skipped).
    score_field / score_range: an output field parsed as a float in this range.
    keep: source column -> allowed values (other rows are filtered out, e.g. label == "Good").
    binding: the settings that chose this path (DataConfig.data_dir + files), named in "missing file" errors.
    clean: skip (and count) rows whose text is junk (`is_junk_text`): the ensemble paper's cleaning.
    """

    path: str
    fields: Mapping[str, str | tuple[str, ...]]
    text_fields: tuple[str, ...] | None = None
    score_field: str | None = None
    score_range: tuple[float, float] | None = None
    keep: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    binding: str | None = None
    clean: bool = False

    @property
    def fmt(self) -> str:
        return "jsonl" if self.path.removesuffix(".gz").endswith((".jsonl", ".json")) else "tsv"

    @property
    def texts(self) -> tuple[str, ...]:
        if self.text_fields is not None:
            return self.text_fields
        return tuple(f for f in self.fields if f != self.score_field)

    def source_columns(self) -> set[str]:
        cols = set(self.keep)
        for src in self.fields.values():
            cols.update((src,) if isinstance(src, str) else src)
        return cols


@dataclasses.dataclass
class ReadSummary:
    path: str
    rows: int = 0
    skipped_bad_rows: int = 0
    skipped_empty_text: int = 0
    filtered: int = 0
    cleaned: int = 0
    first_bad_row: str | None = None
    header: list[str] | None = dataclasses.field(default=None, repr=False)  # a TSV file's columns

    def __str__(self) -> str:
        s = (f"{self.path}: {self.rows} rows; skipped {self.skipped_bad_rows} malformed rows, "
             f"{self.skipped_empty_text} with empty text; {self.filtered} filtered out"
             + (f"; {self.cleaned} junk texts cleaned out" if self.cleaned else ""))
        return s + (f" (first malformed row: {self.first_bad_row})" if self.first_bad_row else "")


@dataclasses.dataclass
class RowIndex:
    """Byte offsets (and line numbers) of the accepted rows of a validated file."""

    spec: FileSpec
    header: list[str] | None
    offsets: np.ndarray
    line_numbers: np.ndarray
    summary: ReadSummary

    def __len__(self) -> int:
        return len(self.offsets)


def _iter_lines(path: str) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, raw bytes) of each line (any filesystem; .gz decompressed)."""
    return storage.iter_lines(path)


def _decode(path: str, lineno: int, offset: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno}: invalid UTF-8 at byte offset {offset + e.start}") from None


def _split_tsv(line: str) -> list[str]:
    return line.rstrip("\n").rstrip("\r").split("\t")


def _check_header(spec: FileSpec, header: list[str]) -> list[str]:
    missing = sorted(c for c in spec.source_columns() if c not in header)
    if missing:
        raise DataError(f"{spec.path}:1: header {header} lacks column(s) {missing}")
    if len(set(header)) != len(header):
        raise DataError(f"{spec.path}:1: header {header} repeats a column name")
    return header


class _BadRow(Exception):
    pass


def _parse_line(spec: FileSpec, header: list[str] | None, line: str, lineno: int) -> dict | None:
    """The example of one data line; None for a filtered row; _BadRow for a malformed one."""
    if spec.fmt == "tsv":
        values = _split_tsv(line)
        if len(values) != len(header):
            raise _BadRow(f"expected {len(header)} TAB-separated fields, found {len(values)}")
        row = dict(zip(header, values))
    else:
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise _BadRow(f"not valid JSON ({e.__class__.__name__}: {str(e)[:80]})") from None
        if not isinstance(row, dict):
            raise _BadRow(f"expected a JSON object, found {type(row).__name__}")
        missing = sorted(c for c in spec.source_columns() if c not in row)
        if missing:
            raise _BadRow(f"missing key(s) {missing}")
        bad = sorted(c for c in spec.source_columns() if not isinstance(row[c], (str, int, float)) or isinstance(row[c], bool))
        if bad:
            raise _BadRow(f"value of {bad} is not a string or number")
        row = {k: str(row[k]) for k in spec.source_columns()}
        for k, v in row.items():  # JSON escapes can spell lone surrogates, which UTF-8 cannot hold
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _BadRow(f"value of {k!r} is not valid Unicode (lone surrogate {v[e.start]!r} at character {e.start})") from None
    for column, allowed in spec.keep.items():
        if row[column] not in allowed:
            return None
    out = {}
    for field, src in spec.fields.items():
        out[field] = row[src] if isinstance(src, str) else " ".join(row[c] for c in src if row[c].strip())
    return out


def _validate_example(spec: FileSpec, example: dict, lineno: int) -> dict | None:
    """Parsed score; None when a text field is empty (skipped and counted)."""
    if spec.score_field is not None:
        example[spec.score_field] = parse_score(spec.path, lineno, example[spec.score_field], spec.score_range)
    if any(not example[f].strip() for f in spec.texts):
        return None
    return example


_REPEATED_PUNCTUATION = re.compile(r"([^\w\s])\1{3,}")


def is_junk_text(text: str) -> bool:
    """The ensemble paper's cleaning: 3 characters or fewer, a run of 4+ repeated punctuation
    marks ("!!!!", "...."), or no letter at all (numbers, symbols, markup debris)."""
    t = text.strip()
    return len(t) <= 3 or bool(_REPEATED_PUNCTUATION.search(t)) or not any(c.isalpha() for c in t)


def missing_file_message(spec: FileSpec) -> str:
    via = f" (from {spec.binding})" if spec.binding else ""
    return f"{spec.path}: no such file{via}"


def validated_rows(spec: FileSpec, on_bad_row: str, summary: ReadSummary,
                   take: Callable[[int], bool] | None = None) -> Iterator[tuple[int, int, dict]]:
    """(line number, byte offset, example) of each accepted row of a file, the skipped ones counted
    in `summary` (and the TSV header kept there). take(k): whether data row k (0-based, blank
    lines not counted) is read at all - the rows of other output shards (data.prepare) are not."""
    data_row = -1
    for lineno, offset, raw in _iter_lines(spec.path):
        line = _decode(spec.path, lineno, offset, raw)
        if spec.fmt == "tsv" and summary.header is None:
            summary.header = _check_header(spec, _split_tsv(line))
            continue
        if line.strip() == "":
            continue
        data_row += 1
        if take is not None and not take(data_row):
            continue
        try:
            example = _parse_line(spec, summary.header, line, lineno)
        except _BadRow as e:
            if on_bad_row == "error":
                raise DataError(f"{spec.path}:{lineno}: {e}") from None
            summary.skipped_bad_rows += 1
            summary.first_bad_row = summary.first_bad_row or f"line {lineno}: {e}"
            continue
        if example is None:
            summary.filtered += 1
        elif _validate_example(spec, example, lineno) is None:
            summary.skipped_empty_text += 1
        elif spec.clean and any(is_junk_text(example[f]) for f in spec.texts):
            summary.cleaned += 1
        else:
            yield lineno, offset, example
    if spec.fmt == "tsv" and summary.header is None:
        raise DataError(f"{spec.path}: empty file (no header line)")


def index_rows(spec: FileSpec, on_bad_row: str = "error") -> RowIndex:
    """Validate every row of a file and record where the accepted rows start."""
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    if not storage.exists(spec.path):
        raise DataError(missing_file_message(spec))
    summary = ReadSummary(spec.path)
    offsets, lines = [], []
    for lineno, offset, _ in validated_rows(spec, on_bad_row, summary):
        offsets.append(offset)
        lines.append(lineno)
    summary.rows = len(offsets)
    if summary.skipped_bad_rows or summary.skipped_empty_text or summary.cleaned:
        log.warning("%s", summary)
    return RowIndex(spec, summary.header, np.asarray(offsets, np.int64), np.asarray(lines, np.int64), summary)


@dataclasses.dataclass
class ConcatRowIndex:
    """Several files read as one: position p is row p - starts[k] of parts[k] (files in order)."""

    parts: list[RowIndex]

    def __post_init__(self):
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def summary(self) -> str:
        return "\n".join(str(p.summary) for p in self.parts)


def read_rows(index: RowIndex | ConcatRowIndex, order: Sequence[int] | None = None) -> Iterator[dict]:
    """The examples of an index (in `order`, positions into the index), parsed again from disk."""
    parts = index.parts if isinstance(index, ConcatRowIndex) else [index]
    starts = np.cumsum([0] + [len(p) for p in parts])
    positions = range(len(index)) if order is None else order
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(storage.open_seekable(p.spec.path)) for p in parts]
        for pos in positions:
            k = int(np.searchsorted(starts, pos, side="right")) - 1
            part, local = parts[k], int(pos) - int(starts[k])
            files[k].seek(int(part.offsets[local]))
            line = files[k].readline().decode("utf-8")
            example = _parse_line(part.spec, part.header, line, int(part.line_numbers[local]))
            yield _validate_example(part.spec, example, int(part.line_numbers[local]))


def neighbour_positions(index: RowIndex | ConcatRowIndex, positions: Sequence[int]) -> np.ndarray:
    """The row next to each position in the same file: p + 1, or p - 1 for a file's last row (p
    itself when the file has one row). Neighbours never cross from one file of a split to another."""
    parts = index.parts if isinstance(index, ConcatRowIndex) else [index]
    starts = np.cumsum([0] + [len(p) for p in parts])
    positions = np.asarray(positions, np.int64)
    if positions.size and (positions.min() < 0 or positions.max() >= starts[-1]):
        raise IndexError(f"row positions outside 0..{int(starts[-1]) - 1}")
    part = np.searchsorted(starts, positions, side="right")  # 1 + the file each row is in
    return np.where(positions + 1 < starts[part], positions + 1, np.maximum(positions - 1, starts[part - 1]))


def source_lines(index: RowIndex | ConcatRowIndex, positions: Sequence[int]) -> list[str]:
    """`path:line` of each row position (what a bad batch came from)."""
    parts = index.parts if isinstance(index, ConcatRowIndex) else [index]
    starts = np.cumsum([0] + [len(p) for p in parts])
    out = []
    for pos in positions:
        k = int(np.searchsorted(starts, int(pos), side="right")) - 1
        out.append(f"{parts[k].spec.path}:{int(parts[k].line_numbers[int(pos) - int(starts[k])])}")
    return out


def read_examples(spec: FileSpec, on_bad_row: str = "error") -> list[dict]:
    """Every accepted example of a file, in file order."""
    return list(read_rows(index_rows(spec, on_bad_row)))

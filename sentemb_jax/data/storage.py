"""Data files on any filesystem `tf.io.gfile` reads (local, gs://, ram://, ...): globs, gzip, existence.

Local paths go through the os (faster line iteration); a path with a scheme (`gs://...`) through
`tf.io.gfile`, the filesystem layer TensorFlow, seqio and TFDS read buckets with. TensorFlow is
imported on the first such path only: reading local files (evaluation, `encode`'s callers, the
benchmarks) then never pays its ~3 s import nor prints its native start-up lines.
"""
from __future__ import annotations

import glob as _glob
import gzip
import hashlib
import io
import os
import zlib
from typing import BinaryIO, Iterator

from sentemb_jax.errors import DataError
from sentemb_jax.paths import is_remote

GLOB_CHARS = "*?["


def _tf():
    """TensorFlow, for paths with a scheme (`tf.io.gfile`, `tf.errors`)."""
    import tensorflow as tf  # lazy: remote paths only; a 3 s import with native start-up lines on stderr

    return tf


def is_pattern(path: str) -> bool:
    return any(c in path for c in GLOB_CHARS)


def expand(pattern: str, via: str = "") -> list[str]:
    """The files a path or glob names, sorted (shard order); a glob that matches nothing is a DataError."""
    if not is_pattern(pattern):
        return [pattern]
    matches = _tf().io.gfile.glob(pattern) if is_remote(pattern) else _glob.glob(pattern)
    matches = sorted(m for m in matches if not isdir(m))
    if not matches:
        raise DataError(f"{pattern}: no file matches{via}")
    return matches


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    gfile = _tf().io.gfile
    return gfile.exists(path) and not gfile.isdir(path)


def isdir(path: str) -> bool:
    return _tf().io.gfile.isdir(path) if is_remote(path) else os.path.isdir(path)


def size(path: str) -> int:
    return _tf().io.gfile.stat(path).length if is_remote(path) else os.path.getsize(path)


def join(*parts: str) -> str:
    return "/".join([parts[0].rstrip("/"), *parts[1:]]) if is_remote(parts[0]) else os.path.join(*parts)


def makedirs(path: str) -> None:
    _tf().io.gfile.makedirs(path) if is_remote(path) else os.makedirs(path, exist_ok=True)


def _open_raw(path: str, mode: str = "rb") -> BinaryIO:
    if is_remote(path):
        tf = _tf()
        missing, failed, opener = tf.errors.NotFoundError, tf.errors.OpError, tf.io.gfile.GFile
    else:
        missing, failed, opener = FileNotFoundError, OSError, open
    try:
        return opener(path, mode)
    except missing:
        raise DataError(f"{path}: no such file") from None
    except failed as e:
        raise DataError(f"{path}: cannot open ({getattr(e, 'strerror', None) or getattr(e, 'message', e)})") from None


def open_seekable(path: str) -> BinaryIO:
    """A seekable binary file. A gzip file (`.gz`) is decompressed whole into memory: the validated
    row path re-reads rows by offset and is meant for small data (a large corpus is prepared once
    into shards, sentemb_jax.data.prepare)."""
    f = _open_raw(path)
    if not path.endswith(".gz"):
        return f
    with f:
        try:
            return io.BytesIO(gzip.decompress(f.read()))
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(f"{path}: not a complete gzip file ({e.__class__.__name__}: {e})") from None


def iter_lines(path: str) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset in the decompressed text, raw line) of each line, streamed (a
    `.gz` file is decompressed as it is read); a damaged gzip stream is a DataError naming the file."""
    f = _open_raw(path)
    with f:
        stream = gzip.GzipFile(fileobj=f) if path.endswith(".gz") else f
        offset, lineno = 0, 0
        try:
            for lineno, raw in enumerate(stream, start=1):
                yield lineno, offset, raw
                offset += len(raw)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(f"{path}: damaged gzip stream after line {lineno} ({e.__class__.__name__}: {e})") from None


def write_bytes(path: str, data: bytes) -> None:
    """Write a small file whole (atomically on a local disk: temp file + rename)."""
    if is_remote(path):
        with _tf().io.gfile.GFile(path, "wb") as f:
            f.write(data)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_bytes(path: str) -> bytes:
    with _open_raw(path) as f:
        return f.read()


def sha256(path: str) -> str:
    """The file's sha256, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with _open_raw(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy(src: str, dst: str) -> None:
    _tf().io.gfile.copy(src, dst, overwrite=True)

"""Teacher embeddings of a task's texts, computed once and cached on disk under a key of the
teacher (weights, pooling, max length) and the texts: never reused across teachers or data.
ConGen, SCT (distillation), the L2 baselines and the ensemble student read their teacher's rows here."""
from __future__ import annotations

import hashlib
import json
import logging
import os

import jax
import numpy as np

from sentemb_jax import faults

log = logging.getLogger(__name__)


def params_fingerprint(params) -> str:
    """sha256 over every parameter's path, shape, dtype and bytes: the teacher's identity."""
    h = hashlib.sha256()
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0], key=lambda x: str(x[0])):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.shape}|{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def texts_fingerprint(texts) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def cached_teacher_embeddings(teacher, texts: list[str], cache_dir: str | None, batch_size: int = 128) -> np.ndarray:
    """teacher.encode(texts, normalize_embeddings=True) ([N, D] float32, unit rows), read from /
    written to `cache_dir` under a key of the teacher (weights, pooling, max length) and the texts."""
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "sentemb_jax", "teacher_embeddings")
    identity = {"params": params_fingerprint(teacher.params), "module": repr(teacher.module),
                "max_length": teacher.max_seq_length, "texts": texts_fingerprint(texts), "rows": len(texts)}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    path = os.path.join(cache_dir, f"teacher_{key}.npy")
    if os.path.isfile(path):
        out = np.load(path, allow_pickle=False)
        if out.shape[0] == len(texts):
            log.info("teacher embeddings from the cache %s", path)
            return _checked_finite(out, path)
        log.warning("%s: %d rows for %d texts; recomputing", path, out.shape[0], len(texts))
    faults.in_phase("teacher_embedding")  # tests only (SENTEMB_FAULT=sigterm_in:teacher_embedding)
    # Unit vectors whatever the teacher's modules (what the cache has always held: encode normalised
    # by default before it followed sentence-transformers' normalize_embeddings=False).
    out = _checked_finite(np.asarray(teacher.encode(texts, batch_size=batch_size, show_progress_bar=None,
                                                    normalize_embeddings=True), np.float32),
                          "the teacher's embeddings")
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}.npy"
    try:
        np.save(tmp, out)
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    except BaseException:  # a full disk, a signal (Interrupted): no partial file stays behind
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    with open(os.path.join(cache_dir, f"teacher_{key}.json"), "w") as f:
        json.dump(identity, f, indent=1)
    return out


def _checked_finite(rows: np.ndarray, where: str) -> np.ndarray:
    bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
    if len(bad):
        raise ValueError(f"{where}: {len(bad)} row(s) hold NaN / inf (rows {bad[:8].tolist()}); a corrupted cache file "
                         "can be deleted (it is recomputed)")
    return rows

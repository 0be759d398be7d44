"""Batches of a task as the train step takes them: `<f>_input_ids` / `<f>_attention_mask` per text
feature, padded to a bucket length (few compiled shapes). Both input routes (the seqio pipeline
and the TensorFlow-free reader) end here, so their batches have one layout."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from sentemb_jax.tokenization import DEFAULT_BUCKETS, bucket_length


def to_model_batch(batch: Mapping[str, np.ndarray], text_features: Sequence[str], pad_id: int,
                   buckets: Sequence[int] = DEFAULT_BUCKETS, same_length: bool = False) -> dict[str, np.ndarray]:
    """Padded id matrices -> `<f>_input_ids` / `<f>_attention_mask` at a bucket length; rest passed on.

    same_length: one bucket length for every text feature of the batch (a train step then
    compiles once per bucket, not once per combination of buckets).
    """
    out = {}
    for name, value in batch.items():
        if name in text_features or name.endswith("_length") or value.dtype.kind in "OSU":
            continue  # raw strings stay on the host side
        out[name] = value
    common = max(int(batch[f"{name}_length"].max(initial=1)) for name in text_features)
    for name in text_features:
        lengths = batch[f"{name}_length"]
        width = bucket_length(max(common if same_length else int(lengths.max(initial=1)), 1), buckets)
        ids = np.full((len(lengths), width), pad_id, np.int32)
        src = batch[name][:, :width]
        ids[:, : src.shape[1]] = src
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32)
        ids[mask == 0] = pad_id
        out[f"{name}_input_ids"] = ids
        out[f"{name}_attention_mask"] = mask
    return out


def id_matrix(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, longest] zero-padded, lengths [n]) of id lists: what to_model_batch takes per feature."""
    lengths = np.asarray([len(r) for r in rows], np.int32)
    out = np.zeros((len(rows), max(int(lengths.max(initial=0)), 1)), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, lengths

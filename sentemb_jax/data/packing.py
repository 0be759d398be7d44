"""Sequence packing for training: every text of a batch (all sides) laid end to end in few rows.

A contrastive batch of 64 NLI triples holds ~35 real tokens per triple, but padded per side to a
bucket it costs 2-3x that. Packed, the encoder runs over the real tokens only (plus the tail of
each row). Attention is restricted to the own text by segment ids, positions restart at 0 for
each text, and `token_index` gathers each text's token states back into the padded
[texts, length] layout, so pooling, the decoder and the loss are those of the unpacked batch:
in eval mode the embeddings equal the unpacked ones (tests/test_packing.py).

    packed = pack_texts(ids_by_side, masks_by_side, row_length=64, pad_id=0)
    # packed_input_ids / packed_segment_ids / packed_positions [rows, row_length]
    # packed_token_index / packed_token_mask [texts, width]: texts in side order
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

PACKED_KEYS = ("packed_input_ids", "packed_segment_ids", "packed_positions", "packed_token_index", "packed_token_mask")


def first_fit_decreasing(lengths: Sequence[int], row_length: int) -> list[list[int]]:
    """Bins of item indices, each bin's lengths summing to at most `row_length` (longest first)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = int(lengths[i])
        if n > row_length:
            raise ValueError(f"text {i} has {n} tokens, more than the packing row length {row_length}")
        for r, space in enumerate(free):
            if n <= space:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_length - n)
    return rows


def pack_texts(ids: Sequence[np.ndarray], masks: Sequence[np.ndarray], row_length: int, pad_id: int,
               row_multiple: int = 8, extras: dict[str, Sequence[np.ndarray]] | None = None) -> dict[str, np.ndarray]:
    """Pack the texts of several [n_i, width_i] id matrices (right-padded, masks 1 for real tokens).

    The number of rows is rounded up to `row_multiple` (few compiled shapes; divisible by the
    data-parallel mesh size). Empty texts get one (padding) token so that they keep a slot.
    extras: other per-token matrices laid out like `ids` (e.g. BERT's token types), packed into
    `packed_<name>` alongside the ids (0 on padding).
    """
    lengths = np.concatenate([np.asarray(m).sum(axis=1) for m in masks]).astype(np.int64)
    def texts_of(mats):
        return [np.asarray(x)[i, : int(np.asarray(m)[i].sum())] for x, m in zip(mats, masks) for i in range(len(x))]

    bins = first_fit_decreasing(np.maximum(lengths, 1), row_length)
    n_rows = -(-len(bins) // row_multiple) * row_multiple
    width = max(int(np.asarray(x).shape[1]) for x in ids)
    arrays = fill_rows(texts_of(ids), bins, row_length, n_rows, len(lengths), width, pad_id,
                       {name: texts_of(mats) for name, mats in (extras or {}).items()}, slot_by_item=True)
    packing = arrays.pop("packing")
    return {"packed_input_ids": arrays.pop("input_ids"), **{f"packed_{k}": v for k, v in packing.items()},
            **{f"packed_{name}": x for name, x in arrays.items()}}


def fill_rows(tokens: Sequence[Sequence[int]], rows_of_items: Sequence[Sequence[int]], row_length: int, rows: int,
              text_slots: int, width: int, pad_id: int, extras: dict[str, Sequence[Sequence[int]]] | None = None,
              slot_by_item: bool = False) -> dict:
    """The packed arrays of items laid out as `rows_of_items` (row r holds those items, in order):
    `input_ids` (and each extra, e.g. token_type_ids) [rows, row_length], and `packing` =
    segment_ids / positions [rows, row_length], token_index / token_mask [text_slots, width].
    An item's text slot is its index (slot_by_item) or its place in row order; an empty item keeps
    a one-token (padding) segment. Unused slots point at token 0 with a one-token mask (a finite
    result to drop)."""
    extras = extras or {}
    ids = np.full((rows, row_length), pad_id, np.int32)
    more = {name: np.zeros((rows, row_length), np.int32) for name in extras}
    segments = np.zeros((rows, row_length), np.int32)
    positions = np.zeros((rows, row_length), np.int32)
    token_index = np.zeros((text_slots, width), np.int32)
    token_mask = np.zeros((text_slots, width), np.int32)
    token_mask[:, 0] = 1
    k = 0
    for r, members in enumerate(rows_of_items):
        start = 0
        for s, item in enumerate(members, start=1):
            n, slot = len(tokens[item]), (item if slot_by_item else k)
            ids[r, start : start + n] = tokens[item]
            for name, values in extras.items():
                more[name][r, start : start + n] = values[item]
            segments[r, start : start + max(n, 1)] = s
            positions[r, start : start + n] = np.arange(n)
            token_index[slot, :n] = r * row_length + start + np.arange(n)
            token_index[slot, n:] = r * row_length + start  # padding slots point at the text's first token (masked)
            token_mask[slot] = 0
            token_mask[slot, :n] = 1
            start += max(n, 1)
            k += 1
    packing = {"segment_ids": segments, "positions": positions, "token_index": token_index, "token_mask": token_mask}
    return {"input_ids": ids, **more, "packing": packing}


def packing_inputs(batch: dict) -> dict:
    """The packed layout a model's `packing=` argument takes, from a batch holding `packed_*` keys."""
    return {k: batch[f"packed_{k}"] for k in ("segment_ids", "positions", "token_index", "token_mask")}


def pack_batch(batch: dict, sides: Sequence[str], row_length: int, pad_id: int, row_multiple: int = 8) -> dict:
    """`batch` plus the packed form of its `<side>_input_ids` / `<side>_attention_mask` (sides in order)."""
    packed = pack_texts([batch[f"{s}_input_ids"] for s in sides], [batch[f"{s}_attention_mask"] for s in sides],
                        row_length, pad_id, row_multiple)
    return {**batch, **packed}

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
    """Bins of item indices, each bin's lengths summing to at most `row_length` (longest first, each
    into the first row with room: one vectorised search of the rows' free space per item)."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    too_long = np.flatnonzero(lengths > row_length)
    if too_long.size:
        i = int(too_long[0])
        raise ValueError(f"text {i} has {int(lengths[i])} tokens, more than the packing row length {row_length}")
    order = np.lexsort((np.arange(len(lengths)), -lengths))  # longest first, ties by index
    free = np.full(len(lengths), row_length, np.int64)  # at most one row per item
    row_of = np.empty(len(lengths), np.int64)
    used = 0
    for i in order.tolist():
        n = lengths[i]
        r = int(np.argmax(free[: used + 1] >= n))  # row `used` is empty, so a row is always found
        free[r] -= n
        row_of[i] = r
        used = max(used, r + 1)
    rows: list[list[int]] = [[] for _ in range(used)]
    for i in order.tolist():
        rows[row_of[i]].append(i)
    return rows


def pack_texts(ids: Sequence[np.ndarray], masks: Sequence[np.ndarray], row_length: int, pad_id: int,
               row_multiple: int = 8, extras: dict[str, Sequence[np.ndarray]] | None = None) -> dict[str, np.ndarray]:
    """Pack the texts of several [n_i, width_i] id matrices (right-padded, masks 1 for real tokens).

    The number of rows is rounded up to `row_multiple` (few compiled shapes; divisible by the
    data-parallel mesh size). Empty texts get one (padding) token so that they keep a slot.
    extras: other per-token matrices laid out like `ids` (e.g. BERT's token types), packed into
    `packed_<name>` alongside the ids (0 on padding). Tokens are gathered from the matrices in one
    indexing per array, not text by text.
    """
    width = max(int(np.asarray(x).shape[1]) for x in ids)

    def stacked(mats) -> np.ndarray:  # every side's rows, one matrix padded to the widest side
        return np.concatenate([np.pad(np.asarray(x), ((0, 0), (0, width - np.asarray(x).shape[1]))) for x in mats])

    lengths = stacked(masks).sum(axis=1).astype(np.int64)
    bins = first_fit_decreasing(np.maximum(lengths, 1), row_length)
    n_rows = -(-len(bins) // row_multiple) * row_multiple
    sources = {"input_ids": stacked(ids), **{name: stacked(mats) for name, mats in (extras or {}).items()}}
    arrays = _fill(bins, lengths, lambda name, items, offset: sources[name][items, offset], list(sources)[1:],
                   row_length, n_rows, len(lengths), width, pad_id, slot_by_item=True)
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
    sources = {"input_ids": tokens, **extras}
    order = [item for members in rows_of_items for item in members]

    def take(name, _items, _offset):  # the items' tokens end to end, in row order (as _fill asks for them)
        parts = [np.asarray(sources[name][i], np.int64).reshape(-1) for i in order]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    lengths = np.zeros(max(order, default=-1) + 1, np.int64)
    lengths[order] = [len(tokens[i]) for i in order]
    return _fill(rows_of_items, lengths, take, list(extras), row_length, rows, text_slots, width, pad_id, slot_by_item)


def _fill(rows_of_items, lengths_by_item: np.ndarray, take, extra_names, row_length: int, rows: int, text_slots: int,
          width: int, pad_id: int, slot_by_item: bool) -> dict:
    """fill_rows' arrays, each written by one scatter over all tokens. `take(name, items, offset)`
    gives the values of source `name` at each (item, offset in its text), tokens in row order."""
    items = np.fromiter((item for members in rows_of_items for item in members), np.int64)
    row = np.repeat(np.arange(len(rows_of_items)), [len(m) for m in rows_of_items])
    lengths = lengths_by_item[items]
    spans = np.maximum(lengths, 1)  # an empty item keeps one (padding) token
    per_row = np.bincount(row, minlength=len(rows_of_items)) if len(row) else np.zeros(0, np.int64)
    first = np.cumsum(per_row) - per_row  # each row's first item
    ends = np.cumsum(spans)
    start = ends - spans - np.repeat((ends - spans)[first[per_row > 0]], per_row[per_row > 0])  # offset in its row
    segment = np.arange(len(items)) - np.repeat(first[per_row > 0], per_row[per_row > 0]) + 1  # 1-based place in row
    slot = items if slot_by_item else np.arange(len(items))
    base = row * row_length + start  # each item's first token, flat
    owner = np.repeat(np.arange(len(items)), lengths)
    offset = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # token's place in its text
    dest = base[owner] + offset
    out = {}
    for name in ("input_ids", *extra_names):
        out[name] = np.full(rows * row_length, pad_id if name == "input_ids" else 0, np.int32)
        out[name][dest] = take(name, items[owner], offset)
    span_owner = np.repeat(np.arange(len(items)), spans)
    segments = np.zeros(rows * row_length, np.int32)
    segments[base[span_owner] + np.arange(int(spans.sum())) - np.repeat(ends - spans, spans)] = segment[span_owner]
    positions = np.zeros(rows * row_length, np.int32)
    positions[dest] = offset
    token_index = np.zeros((text_slots, width), np.int32)
    token_mask = np.zeros((text_slots, width), np.int32)
    token_mask[:, 0] = 1
    token_index[slot] = base[:, None]  # padding slots point at the text's first token (masked)
    token_mask[slot] = 0
    token_index[slot[owner], offset] = dest
    token_mask[slot[owner], offset] = 1
    shape = (rows, row_length)
    packing = {"segment_ids": segments.reshape(shape), "positions": positions.reshape(shape), "token_index": token_index,
               "token_mask": token_mask}
    return {**{k: v.reshape(shape) for k, v in out.items()}, "packing": packing}


def packing_inputs(batch: dict) -> dict:
    """The packed layout a model's `packing=` argument takes, from a batch holding `packed_*` keys."""
    return {k: batch[f"packed_{k}"] for k in ("segment_ids", "positions", "token_index", "token_mask")}


def pack_batch(batch: dict, sides: Sequence[str], row_length: int, pad_id: int, row_multiple: int = 8) -> dict:
    """`batch` plus the packed form of its `<side>_input_ids` / `<side>_attention_mask` (sides in order)."""
    packed = pack_texts([batch[f"{s}_input_ids"] for s in sides], [batch[f"{s}_attention_mask"] for s in sides],
                        row_length, pad_id, row_multiple)
    return {**batch, **packed}

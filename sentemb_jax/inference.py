"""Batching for inference (`SentenceEncoder.encode`, `CrossEncoder.predict`): texts in batches
sorted by length and padded to a bucket, or packed end to end in rows as training packs them.

Padded (`run_length_sorted`): each batch pads its texts to the bucket of its longest; sorted by
length, the slots beyond the real tokens are ~15% on STS-B (MiniLM tokenizer, batch 64).

Packed (`run_packed`): texts, longest first, fill rows of `row_length` token slots (best fit),
grouped into blocks of `rows` rows; attention stays within a text (segment ids), positions restart
at 0 for each text, and each text's token states are gathered back for pooling: in eval mode the
results equal the padded path's (tests/test_inference_packing.py). Every block has one shape
([rows, row_length] tokens, [text_slots, width] texts; width a bucket), so few shapes compile.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from sentemb_jax.data.packing import fill_rows
from sentemb_jax.tokenization import DEFAULT_BUCKETS, bucket_length

# Packed blocks: rows of at least this many token slots (longer when a text is longer); a block
# holds batch_size x TOKENS_PER_TEXT slots and up to batch_size x TEXTS_PER_BATCH_TEXT texts.
# Chosen by encode speed of all-MiniLM-L6-v2 on STS-B test (AMD EPYC, 2 cores, batch 64, sent/s):
# rows of 64 beat rows of 128 (less attention across the row) and blocks of 1536 slots beat 4096
# (activations that stay in cache): 64 / 24 488, 48 / 16 481, 64 / 16 436-460, 128 / 32 384,
# 128 / 64 303, padded 423 (docs/RESULTS.md).
PACK_ROW_LENGTH = 64
TOKENS_PER_TEXT = 24
TEXTS_PER_BATCH_TEXT = 4


# encode's batch size when the caller names none: on the CPU sentence-transformers' own default, 64
# (the packed blocks above were tuned at it); on an accelerator 1,024, since a call of 64 short
# texts is too little work to keep a GPU busy between the host's dispatches.
CPU_BATCH_SIZE = 64
ACCELERATOR_BATCH_SIZE = 1024
# Texts tokenised at a time (run_pipelined) on an accelerator: at least this many and CHUNK_BATCHES
# batches, so that a chunk's length sort groups texts as closely as one sort of the whole input
# would, and the device has several calls queued while the next chunk is tokenised.
TEXTS_PER_CHUNK = 4096
CHUNK_BATCHES = 8


def default_batch_size() -> int:
    return CPU_BATCH_SIZE if jax.default_backend() == "cpu" else ACCELERATOR_BATCH_SIZE


def chunk_texts(batch_size: int, texts_per_chunk: int | None = None) -> int:
    """Texts a chunk of run_pipelined: `texts_per_chunk`, never less than one batch (a call of fewer
    texts is then one chunk). Default: on an accelerator TEXTS_PER_CHUNK or CHUNK_BATCHES batches,
    the larger; on the CPU every text in one chunk. There the tokenizer and XLA share the same
    cores, so tokenising beside the forward saves nothing (all-MiniLM-L6-v2, 6,000 Wikipedia
    sentences, 2 busy cores: 54-60 sent/s in chunks of 1,024, 58-61 in one), while chunks whose
    longest texts differ pack into rows of different lengths, more block shapes to compile on first
    use (there the first chunked call ran at 40 sent/s)."""
    if texts_per_chunk is None and jax.default_backend() == "cpu":
        return sys.maxsize
    return max(batch_size, texts_per_chunk or max(TEXTS_PER_CHUNK, CHUNK_BATCHES * batch_size))


class DeviceParams:
    """The `params` attribute of an inference model (SentenceEncoder, CrossEncoder), held on the
    device: the host (numpy) leaves of a tree assigned to it are put on the default device once.
    A jitted call given numpy arrays copies each of them to the device on every call: for MiniLM
    its 103 leaves per block, 8-12% of encode time on 2 cores (docs/RESULTS.md). Leaves
    already on devices (a trained, possibly sharded state) stay where they are, and a tree with
    no host leaf is kept as it is (the very same containers)."""

    def __set_name__(self, owner, name: str):
        self.slot = "_" + name

    def __get__(self, obj, objtype=None):
        return self if obj is None else obj.__dict__[self.slot]

    def __set__(self, obj, tree) -> None:
        if any(isinstance(leaf, np.ndarray) for leaf in jax.tree_util.tree_leaves(tree)):
            tree = jax.tree_util.tree_map(lambda leaf: jax.device_put(leaf) if isinstance(leaf, np.ndarray) else leaf, tree)
        obj.__dict__[self.slot] = tree


def params_for_compute(obj):
    """`obj.params` (a SentenceEncoder / CrossEncoder) as its jitted calls take them: with a compute
    dtype narrower than the weights (dtype="bfloat16"), the backbone's Dense kernels already in that
    dtype. The Dense layers cast them on use; done in every call, the casts were 13% of a bf16
    MiniLM encode on 2 cores. Same values; made once per params tree (a new assignment
    is a new tree) and kept beside it (MiniLM: +44 MiB); `params` itself stays as loaded, for saving
    and export."""
    dtype = jnp.dtype(obj.module.backbone_config.dtype)
    params = obj.params
    if dtype.itemsize >= 4:
        return params
    made_from, compute = obj.__dict__.get("_params_for_compute", (None, None))
    if made_from is not params:
        def narrow(path, leaf):
            kernel = getattr(path[-1], "key", None) == "kernel" and jnp.issubdtype(leaf.dtype, jnp.floating)
            return leaf.astype(dtype) if kernel and leaf.dtype.itemsize > dtype.itemsize else leaf
        compute = {**params, "backbone": jax.tree_util.tree_map_with_path(narrow, params["backbone"])}
        obj.__dict__["_params_for_compute"] = (params, compute)
    return compute


def shared_programs(build: Callable, module) -> tuple:
    """build(module): jitted programs whose only closure is the Flax `module`, shared by every
    caller with an equal module (the same config, pooling and head; params are the programs'
    arguments). A model loaded again, a checkpoint of it or a second submodel of one architecture
    then reuses the shapes the first traced and compiled instead of tracing each again. A module
    that cannot be hashed (a config holding a list or dict) gets programs of its own."""
    try:
        hash(module)
    except TypeError:
        return build(module)
    # jit's own cache does not key on jax_disable_most_optimizations: this one does, so programs
    # compiled with XLA's optimisations off are never run where they are on, nor the reverse.
    return _programs_by_module(build, module, jax.config.values["jax_disable_most_optimizations"])


@functools.lru_cache(maxsize=32)
def _programs_by_module(build: Callable, module, unoptimised: bool) -> tuple:
    return build(module)


def clear_shared_programs() -> None:
    """Drops every shared program set (the next encoder builds and compiles anew), freeing the
    compiled programs of models no longer used (up to 32 module configurations are kept)."""
    _programs_by_module.cache_clear()


def compile_instead_of_run(jitted) -> Callable:
    """A stand-in for the jitted function `jitted` when warming up: it compiles for its arguments'
    shapes and returns zeros of the output's shape instead of running. jit's caches then hold the
    executable, so a later call with those shapes compiles nothing. Running the dummy batches was
    72% of MiniLM's warm_up(64) (docs/RESULTS.md)."""
    def call(*args):
        out = jitted.lower(*args).compile().out_info
        return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), out)
    return call


def warm_up_lengths(tokenizer, max_length: int | None) -> list[int]:
    """The lengths a warm-up compiles: every bucket up to `max_length` (default and cap: the
    tokenizer's max_length), then that length itself."""
    longest = min(max_length or tokenizer.max_length, tokenizer.max_length)
    lengths = [b for b in tokenizer.buckets if b <= longest]
    if not lengths or lengths[-1] < longest:
        lengths.append(longest)
    return lengths


# (item indices, the device's result for them, not yet fetched): what a dispatch leaves to collect.
Pending = list[tuple[np.ndarray, object]]


def run_length_sorted(lengths: Sequence[int], batch_size: int, run_batch, out_tail: tuple = (),
                      show_progress: bool = False, desc: str = "batches") -> np.ndarray:
    """float32 [len(lengths), *out_tail]: `run_batch(indices, rows)` over batches of items sorted by
    length (each batch pads little), results put back in the input order.

    Full batches keep one shape (`rows` = batch_size); fewer items than a batch are padded to a
    power of two only. Every batch is dispatched before any is fetched: host work overlaps device work.
    """
    pending, _ = dispatch_length_sorted(lengths, batch_size, run_batch, few=len(lengths) < batch_size)
    return collect(pending, len(lengths), out_tail, show_progress, desc)


def dispatch_length_sorted(lengths: Sequence[int], batch_size: int, run_batch, few: bool, final: bool = True,
                           buckets: Sequence[int] | None = None) -> tuple[Pending, list[int]]:
    """run_length_sorted's batches dispatched, not fetched; and the items held back for the next
    chunk (unless `final`): a last batch short of batch_size. few: the whole call has fewer items
    than a batch (rows: a power of two).

    With `buckets`, full batches are made within each bucket first (longest first) and only the
    buckets' remainders are held back, or, when final, batched together sorted by length: every
    full batch pads to its own texts' bucket, so chunk by chunk this pads exactly as one sort of the
    whole input does, where a plain sort per chunk pads more (STS-B train, MiniLM, batch 64 / 1,024,
    chunks of 4,096 / 8,192: +2% / +20% token slots; bucketed: the same count as one global sort)."""
    n = len(lengths)
    order = np.argsort([-x for x in lengths], kind="stable")
    rows = 1 << (n - 1).bit_length() if few else batch_size
    group = np.array([bucket_length(lengths[i], buckets) for i in order]) if buckets else np.zeros(n, np.int64)
    batches, rest = [], []
    for g in np.unique(group)[::-1]:  # longest first
        members = order[group == g]
        full = len(members) - len(members) % batch_size
        batches += [members[start : start + batch_size] for start in range(0, full, batch_size)]
        rest.append(members[full:])
    rest = np.concatenate(rest) if rest else order
    if final:
        batches += [rest[start : start + batch_size] for start in range(0, len(rest), batch_size)]
        rest = rest[:0]
    return [(batch, run_batch(batch, rows)) for batch in batches], rest.tolist()


def collect(pending: Pending, n: int, out_tail: tuple, show_progress: bool = False, desc: str = "batches",
            out: np.ndarray | None = None, bar=None) -> np.ndarray:
    """float32 [n, *out_tail] (or `out`): each pending result fetched into its items' rows."""
    out = np.empty((n, *out_tail), np.float32) if out is None else out
    with tqdm(total=n, desc=desc, disable=not show_progress, unit="text") if bar is None else contextlib.nullcontext(bar) as b:
        for items, result in pending:
            out[items] = np.asarray(result)[: len(items)]
            b.update(len(items))
    return out


def run_pipelined(texts: Sequence[str], tokenize: Callable[[Sequence[str]], list[list[int]]], texts_per_chunk: int,
                  dispatch: Callable[[list[list[int]], bool], tuple[Pending, list[int]]], out_tail: tuple,
                  show_progress: bool = False, desc: str = "texts") -> np.ndarray:
    """float32 [len(texts), *out_tail] in the input order: texts tokenised `texts_per_chunk` at a time, each
    chunk's token lists (with the items the chunk before held back) handed to `dispatch(tokens, final)`,
    which dispatches their batches or blocks and returns (pending results, indices it held back).

    A thread tokenises the next chunk while this one packs, dispatches and runs (the Rust tokenizer
    releases the GIL; on an accelerator the host's tokenising is what the device would wait for), and
    a chunk's results are fetched only once the next chunk is dispatched: the device always has a
    chunk queued, and device memory holds two chunks' results, not the whole call's.
    Length sorting is per chunk (plus what the chunk before held back), not one sort of the whole
    input: a text's length is known only once it is tokenised, and its characters do not give the
    token order. That costs little: packed, chunks of 4,096 texts take within 0.4% of the token
    slots of one pack of everything (STS-B train, Wikipedia head; MiniLM, batch 64; at batch 1,024
    0.2% fewer), and padded batches (dispatch_length_sorted with buckets) take as many as one sort.
    """
    n = len(texts)
    out = np.empty((n, *out_tail), np.float32)
    bounds = [(start, min(start + texts_per_chunk, n)) for start in range(0, n, texts_per_chunk)]
    index, tokens, behind, ahead = np.zeros(0, np.int64), [], [], None
    with tqdm(total=n, desc=desc, disable=not show_progress, unit="text") as bar, \
            (ThreadPoolExecutor(1, thread_name_prefix="tokenize") if len(bounds) > 1 else contextlib.nullcontext()) as pool:
        for k, (start, stop) in enumerate(bounds):
            new = ahead.result() if ahead is not None else tokenize(texts[start:stop])
            ahead = pool.submit(tokenize, texts[stop : bounds[k + 1][1]]) if k + 1 < len(bounds) else None
            index, tokens = np.concatenate([index, np.arange(start, stop)]), tokens + list(new)
            pending, held = dispatch(tokens, k + 1 == len(bounds))
            collect(behind, n, out_tail, out=out, bar=bar)  # the chunk before: done, or next in the device's queue
            behind = [(index[items], result) for items, result in pending]
            index, tokens = index[held], [tokens[i] for i in held]
        collect(behind, n, out_tail, out=out, bar=bar)
    return out


def pack_blocks(lengths: Sequence[int], row_length: int, rows: int, text_slots: int) -> list[list[list[int]]]:
    """Blocks of rows of item indices. Items, longest first, go to the row with the least room that
    still takes them (best fit; a new row when none does), a row holding at most `text_slots` items;
    the rows, in the order they were opened, are then grouped into blocks of at most `rows` rows and
    `text_slots` items. Every length must be in [1, row_length]. O(items x row_length)."""
    by_free: list[list[int]] = [[] for _ in range(row_length + 1)]  # free slots -> open rows with that room
    members: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = int(lengths[i])
        if not 1 <= n <= row_length:
            raise ValueError(f"item {i} has {n} tokens: packing takes 1 to {row_length}")
        r = next((by_free[f].pop() for f in range(n, row_length + 1) if by_free[f]), None)
        if r is None:
            members.append([])
            free.append(row_length)
            r = len(members) - 1
        members[r].append(i)
        free[r] -= n
        if free[r] and len(members[r]) < text_slots:
            by_free[free[r]].append(r)
    blocks: list[list[list[int]]] = []
    count = 0
    for row in members:
        if not blocks or len(blocks[-1]) == rows or count + len(row) > text_slots:
            blocks.append([])
            count = 0
        blocks[-1].append(row)
        count += len(row)
    return blocks


def block_shape(batch_size: int, longest: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> tuple[int, int, int]:
    """(row_length, rows, text_slots) of the packed blocks for texts of at most `longest` tokens."""
    row_length = max(PACK_ROW_LENGTH, bucket_length(longest, buckets))
    return row_length, max(1, -(-batch_size * TOKENS_PER_TEXT // row_length)), batch_size * TEXTS_PER_BATCH_TEXT


def run_packed(tokens: Sequence[Sequence[int]], batch_size: int, run_block: Callable[[dict], object], out_tail: tuple,
               pad_id: int, extras: dict[str, Sequence[Sequence[int]]] | None = None, buckets: Sequence[int] = DEFAULT_BUCKETS,
               show_progress: bool = False, desc: str = "blocks") -> np.ndarray:
    """float32 [len(tokens), *out_tail]: `run_block(arrays)` (arrays from `data.packing.fill_rows`, result
    [text_slots, *out_tail]) over packed blocks, results put back in the input order. Empty token
    lists are not packed (callers' texts always carry special tokens)."""
    pending, _ = dispatch_packed(tokens, batch_size, run_block, pad_id, extras, buckets, few=len(tokens) < batch_size)
    return collect(pending, len(tokens), out_tail, show_progress, desc)


def dispatch_packed(tokens: Sequence[Sequence[int]], batch_size: int, run_block: Callable[[dict], object], pad_id: int,
                    extras: dict[str, Sequence[Sequence[int]]] | None = None, buckets: Sequence[int] = DEFAULT_BUCKETS,
                    few: bool = False, final: bool = True) -> tuple[Pending, list[int]]:
    """run_packed's blocks dispatched, not fetched; and the items held back: unless `final`, the last
    block's (its rows hold the shortest texts and may be part-filled) wait for the next chunk's.
    few: the whole call has fewer texts than a batch (a smaller block, as dispatch_length_sorted's
    power-of-two batch)."""
    n = len(tokens)
    lengths = [len(t) for t in tokens]
    row_length, rows, text_slots = block_shape(batch_size, max(lengths), buckets)
    if few:
        rows = max(1, min(rows, -(-sum(lengths) // row_length) * 2))
        text_slots = 1 << (n - 1).bit_length()
    blocks = pack_blocks(lengths, row_length, rows, text_slots)
    held = [i for row in blocks.pop() for i in row] if not final else []
    pending = []
    for block in blocks:
        items = [i for row in block for i in row]
        width = bucket_length(max(lengths[i] for i in items), buckets)
        arrays = fill_rows(tokens, block, row_length, rows, text_slots, width, pad_id, extras)
        pending.append((np.asarray(items), run_block(arrays)))
    return pending, held

"""The instance queue of ConGen / SCT (He et al. 2020's MoCo queue): a fixed [K, D] array and a pointer.

`enqueue` is first-in-first-out and pure, so it runs inside the jitted train step: the m newest
rows overwrite the m oldest, starting at `pointer` and wrapping around. `in_order` gives the
entries oldest first. Under a mesh the values can be sharded along the data axis (rows), which
keeps a 65,536 x 1,024 queue off every device's full memory; the scatter in `enqueue` then runs
as a sharded update and gives the same values as the unsharded queue (tests/test_queue_distill.py).
"""
from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sentemb_jax.pooling import l2_normalize_host

Array = jax.Array
SHARD_MIN_ENTRIES = 65_536  # smaller queues are replicated: their scatter is cheaper than the collectives


@flax.struct.dataclass
class InstanceQueue:
    values: Array  # [K, D]
    pointer: Array  # int32 scalar: the slot the next entry goes to (the oldest entry once full)


def new_queue(values) -> InstanceQueue:
    """A queue holding `values` ([K, D], oldest first); the next enqueue overwrites row 0."""
    values = jnp.asarray(values, jnp.float32)
    if values.ndim != 2 or values.shape[0] == 0:
        raise ValueError(f"instance queue: need a [K, D] array with K > 0, got shape {values.shape}")
    return InstanceQueue(values=values, pointer=jnp.zeros((), jnp.int32))


def random_unit_rows(rng: np.random.Generator, size: int, dim: int) -> np.ndarray:
    """SCT's initial queue: `size` random directions (Gaussian rows, L2-normalised)."""
    x = rng.standard_normal((size, dim)).astype(np.float32)
    return l2_normalize_host(x)


def enqueue(queue: InstanceQueue, rows: Array) -> InstanceQueue:
    """FIFO: `rows` [m, D] (m <= K) replace the m oldest entries; the pointer moves on by m mod K."""
    size, m = queue.values.shape[0], rows.shape[0]
    if m > size:
        raise ValueError(f"enqueue: {m} rows into a queue of {size}")
    slots = (queue.pointer + jnp.arange(m, dtype=jnp.int32)) % size
    values = queue.values.at[slots].set(rows.astype(queue.values.dtype))
    return InstanceQueue(values=values, pointer=(queue.pointer + m) % size)


def slots_of_last(queue: InstanceQueue, m: int) -> Array:
    """Where the last `m` enqueued rows sit (row i of that batch at slots[i])."""
    size = queue.values.shape[0]
    return (queue.pointer - m + jnp.arange(m, dtype=jnp.int32)) % size


def in_order(queue: InstanceQueue) -> Array:
    """The entries oldest first."""
    return jnp.roll(queue.values, -queue.pointer, axis=0)


def queue_sharding(mesh: Mesh, size: int, shard_min_entries: int = SHARD_MIN_ENTRIES) -> InstanceQueue:
    """Shardings of a queue of `size` rows: rows along the data axis when large and divisible."""
    replicated = NamedSharding(mesh, P())
    data = mesh.shape.get("data", 1)
    rows = NamedSharding(mesh, P("data", None)) if size >= shard_min_entries and data > 1 and size % data == 0 else replicated
    return InstanceQueue(values=rows, pointer=replicated)

"""Device mesh and t5x-style logical axis rules: sharding is chosen by rules, not annotations.

Parameters carry logical axis names (`vocab`, `embed`, `mlp`, `heads`, `joined_kv`, ...);
activations are constrained on (`batch`, `length`, `embed`). The rules below map them to mesh
axes `data`, `fsdp` and `model`:

* `batch` -> data and fsdp (the global batch is split over both);
* model parallelism: `vocab`, `mlp`, `heads`, `joined_kv` -> model;
* FSDP: parameters' `embed` dimension -> fsdp (activations' `embed` stays unsharded because
  fsdp is already used by `batch` in the same array).
Optimizer-state shardings are derived from the parameters' (XLA would leave them replicated).
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sentemb_jax import validation as v
from sentemb_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "model")

LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("joined_kv", "model"),
    ("kv", None),
    ("embed", "fsdp"),
    ("embed", None),
    ("length", None),
    ("layers", None),
    ("relpos_buckets", None),
    ("abspos_buckets", None),
    ("affinity", None),
)


def make_mesh(data: int = -1, fsdp: int = 1, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, model) mesh (MeshConfig's axes); -1 for `data` takes the devices left over.
    A mesh that does not fit the devices is a ConfigError naming both, before anything compiles.

    TPU v4 / v5p: one device per chip (megacore), as jax.devices() gives them on a TPU VM; the
    compile-only devices of `get_topology_desc(..., chip_config_name='megacore')` too (per-core
    devices are refused with that hint). Several slices (devices with distinct `slice_index`,
    Multislice over DCN): the `data` axis spans the slices - each slice holds data / num_slices
    of it, fsdp and model stay within a slice on ICI (create_hybrid_device_mesh).
    """
    api = "sentemb_jax.MeshConfig"
    if data != -1 and not (v._is_int(data) and data >= 1):
        v.fail(data, api, "data", "must be -1 (the devices left over) or an integer >= 1")
    v.require_int(fsdp, api, "fsdp", 1)
    v.require_int(model, api, "model", 1)
    devices = list(devices if devices is not None else jax.devices())
    found = f"{len(devices)} {devices[0].platform.upper() if devices else ''} device(s)".replace("  ", " ")
    if data == -1:
        if len(devices) % (fsdp * model):
            raise ConfigError(f"mesh fsdp={fsdp} x model={model} does not divide the {found} JAX finds "
                                "({where}; lower fsdp / model, or run on more devices)",
                                api=api, param="fsdp" if fsdp > 1 else "model", value=fsdp if fsdp > 1 else model)
        data = len(devices) // (fsdp * model)
    if data * fsdp * model != len(devices):
        raise ConfigError(f"mesh data={data} x fsdp={fsdp} x model={model} = {data * fsdp * model} devices, but JAX "
                            f"finds {found} ({{where}}; data=-1 takes the devices left over)",
                            api=api, param="data", value=data)
    auto = (jax.sharding.AxisType.Auto,) * 3  # t5x-style propagation needs Auto axes
    _check_one_device_per_chip(devices)
    slices = num_slices(devices)
    if slices > 1:
        if data % slices:
            raise ValueError(f"mesh data={data} must be a multiple of the {slices} slices (the data axis spans them over "
                             f"DCN; fsdp={fsdp} x model={model} stay within a slice)")

        grid = mesh_utils.create_hybrid_device_mesh((data // slices, fsdp, model), (slices, 1, 1), devices,
                                                    allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES, axis_types=auto)
    return jax.make_mesh((data, fsdp, model), MESH_AXES, axis_types=auto, devices=devices)


def num_slices(devices: Sequence[jax.Device]) -> int:
    """How many TPU slices (Multislice, joined over DCN) the devices come from; 1 elsewhere."""
    return len({getattr(d, "slice_index", 0) for d in devices})


def _check_one_device_per_chip(devices: Sequence[jax.Device]) -> None:
    kind = str(getattr(devices[0], "device_kind", ""))
    per_core = kind.startswith(("TPU v4", "TPU v5")) and "lite" not in kind and any(
        getattr(d, "core_on_chip", 0) for d in devices)
    if per_core:
        raise ValueError(f"{kind}: these devices are TensorCores (two per chip); a mesh needs one device per chip "
                         "(megacore). From jax.experimental.topologies.get_topology_desc ask for "
                         "chip_config_name='megacore' (on a TPU VM, jax.devices() is megacore already)")


def logical_specs(abstract_tree) -> Any:
    """Logical PartitionSpecs of a boxed (nn.LogicallyPartitioned) tree; unboxed leaves -> P()."""
    return nn.get_partition_spec(abstract_tree)


def mesh_shardings(logical_spec_tree, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
    return nn.logical_to_mesh_sharding(logical_spec_tree, mesh, list(rules))


def _keys(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path)


def derive_state_shardings(state_shapes, param_shapes, param_shardings, mesh: Mesh):
    """Shardings for an optimizer state, from the parameter each leaf belongs to.

    A leaf whose path ends with a parameter's path takes that parameter's sharding when it has
    the same shape (Adam moments), or the sharding with one dimension dropped when it is a
    factored statistic one rank lower (Adafactor's v_row / v_col); anything else is replicated.
    """
    flat_params = {_keys(p): (s, sh) for (p, s), sh in zip(
        jax.tree_util.tree_flatten_with_path(param_shapes)[0], jax.tree_util.tree_leaves(param_shardings))}
    replicated = NamedSharding(mesh, P())

    def for_leaf(path, leaf):
        keys = _keys(path)
        for start in range(len(keys)):
            match = flat_params.get(keys[start:])
            if match is None:
                continue
            param, sharding = match
            spec = tuple(sharding.spec) + (None,) * (len(param.shape) - len(sharding.spec))
            if tuple(leaf.shape) == tuple(param.shape):
                return sharding
            if len(leaf.shape) == len(param.shape) - 1:
                for drop in range(len(param.shape)):
                    if tuple(leaf.shape) == tuple(param.shape[:drop] + param.shape[drop + 1:]):
                        return NamedSharding(mesh, P(*(spec[:drop] + spec[drop + 1:])))
            return replicated
        return replicated

    return jax.tree_util.tree_map_with_path(for_leaf, state_shapes)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, P(("data", "fsdp")))


def batch_shards(mesh: Mesh) -> int:
    """How many parts the batch dimension is split into (data x fsdp)."""
    return int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))


def shard_batch(batch: dict, mesh: Mesh) -> dict:
    """Place a host batch (numpy) on the mesh, split along the batch dimension. With several
    processes, `batch` is this process's part: the global batch is every process's part in
    process order (jax.make_array_from_process_local_data)."""
    sharding = batch_sharding(mesh)
    if jax.process_count() > 1:
        return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}
    return {k: jax.device_put(np.asarray(v), sharding) for k, v in batch.items()}

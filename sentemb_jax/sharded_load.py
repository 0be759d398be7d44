"""Pretrained backbone weights straight from safetensors files into sharded `jax.Array`s.

`checkpoints.load_hf_checkpoint` reads every tensor of a checkpoint into host memory (and casts,
transposes and stacks it there) before a run places it on the mesh: for an 11B-parameter T5 that
is 44 GB of float32 on every host of a pod, more while it is cast and stacked. Here each parameter
is made by `jax.make_array_from_callback`: JAX asks for the region of the parameter each of this
process's devices holds, and only that region is read from the file (safetensors' `get_slice`), so
a process reads only its own devices' slices and the host holds about one tensor at a time.

    cfg, abstract, hf = abstract_checkpoint(model_dir)                # config.json + file headers only
    params = load_backbone(model_dir, cfg, shardings)                 # shardings: abstract's tree of NamedSharding

The checks are the whole-file loader's (`checkpoints.params_from_hf`): missing, unexpected and
wrong-shape tensors and non-floating dtypes come from the file headers and are reported in one
CheckpointError before any data is read; NaN / inf is counted per slice as it is read and reported
after the last parameter. With several processes each region is counted by one process (the one of
its lowest-numbered device) and the counts are summed across them, so every process raises the same
error with the whole tensor's count. The values equal the whole-file loader's bit for bit: the same
casts (per slice here), transposes and layer stacking.

Safetensors only: a pickle checkpoint cannot be read by region (and loading one runs code), so it
is refused here; the train setup keeps those on the whole-file path (training.setup).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import traverse_util
from jax.experimental import multihost_utils
from safetensors import SafetensorError, safe_open

from sentemb_jax import checkpoint_checks as checks
from sentemb_jax import checkpoints
from sentemb_jax.checkpoint_checks import CONFIG_FILE, PICKLE_FILE, PICKLE_INDEX, SAFETENSORS_FILE, SAFETENSORS_INDEX
from sentemb_jax.errors import CheckpointError
from sentemb_jax.models import ModelConfig

log = logging.getLogger(__name__)

Path = tuple[str, ...]
Region = tuple[tuple[int, int], ...]  # (start, stop) per dimension of a parameter's global shape

# The dtypes of safetensors headers, as safe_open(framework="np") returns them (BF16 and F8 as
# ml_dtypes' types, which astype casts exactly as the whole-file loader's casts do).
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
          "BOOL": np.bool_}


@dataclasses.dataclass(frozen=True)
class Stored:
    """One tensor as its file's header describes it (no data read). `hf_name` is the name after
    base-prefix stripping and legacy renames (what errors name, as the whole-file loader's do);
    `transpose`: our parameter is this tensor transposed (our [in, out] = the file's [out, in])."""

    file: str
    name: str
    hf_name: str
    shape: tuple[int, ...]
    dtype: Any
    transpose: bool = False


# ---------------------------------------------------------------------------------------------
# Files and headers


def has_safetensors(model_dir: str) -> bool:
    """Whether the directory's weights are safetensors (one file or a shard index): what this loader reads."""
    return any(os.path.isfile(os.path.join(model_dir, n)) for n in (SAFETENSORS_FILE, SAFETENSORS_INDEX))


def weight_files(model_dir: str) -> list[str]:
    """The safetensors files of a model directory, in the order the whole-file loader reads them."""
    join = lambda name: os.path.join(model_dir, name)  # noqa: E731
    if not os.path.isdir(model_dir):
        raise CheckpointError(f"{model_dir}: no such model directory")
    if os.path.isfile(join(SAFETENSORS_FILE)):
        return [join(SAFETENSORS_FILE)]
    if os.path.isfile(join(SAFETENSORS_INDEX)):
        files = [join(shard) for shard in checkpoints.index_files(model_dir, SAFETENSORS_INDEX)]
        for path in files:
            if not os.path.isfile(path):
                raise CheckpointError(f"{path}: shard named in {SAFETENSORS_INDEX} is missing")
        return files
    pickles = [n for n in (PICKLE_FILE, PICKLE_INDEX) if os.path.isfile(join(n))]
    if pickles:
        raise CheckpointError(
            f"{join(pickles[0])}: a pickle-based checkpoint; the sharded loader reads safetensors only (each "
            "device's slice is read from the file by region, which a pickle cannot give, and pickle can execute "
            "code). Convert it to safetensors, or load it whole (SentenceEncoder.from_pretrained(..., allow_pickle=True)).")
    raise CheckpointError(
        f"{model_dir}: no weights found (looked for {SAFETENSORS_FILE}, {SAFETENSORS_INDEX}); "
        f"directory holds: {sorted(os.listdir(model_dir))}")


def read_headers(model_dir: str) -> dict[str, Stored]:
    """Every tensor's file, shape and dtype from the headers (a later shard's tensor of the same
    name wins, as in the whole-file loader)."""
    out = {}
    for path in weight_files(model_dir):
        try:
            with safe_open(path, framework="np") as f:
                for name in f.keys():
                    s = f.get_slice(name)
                    out[name] = Stored(path, name, name, tuple(int(n) for n in s.get_shape()), s.get_dtype())
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot read safetensors file ({e})") from None
    return out


def read_slice(file: str, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """The region `index` (slices in the file's layout) of one stored tensor, in its stored dtype: the
    only place this module reads data (the tests count bytes through it). The file is opened for each
    read: safetensors maps it into memory, and every page a read touches - a column slice touches every
    row of its tensor - counts as this process's memory while the map is open; closed at once, a load
    never holds more than one tensor's pages (reopening costs one header parse)."""
    try:
        with safe_open(file, framework="np") as f:
            return f.get_slice(name)[index] if index else f.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file}: cannot read {name} ({e})") from None


# ---------------------------------------------------------------------------------------------
# Checks from the headers


def _dtype_problem(name: str, stored: str, want) -> str | None:
    dtype = DTYPES.get(stored)
    if dtype is None:  # a dtype numpy cannot hold (a new float8 kind): never a floating parameter here
        return f"{name}: {stored}"
    problem = checks.tensor_dtype_problem(name, np.empty(0, dtype), want)  # empty: the dtype rule only
    return problem[1] if problem else None


def _unstacked(abstract: dict, scanned: bool) -> dict[Path, jax.ShapeDtypeStruct]:
    """The flat abstract params with layers unstacked (`layers` -> `layers_0..n-1`): derived from the
    scanned shapes rather than traced again (tracing a large model unscanned takes seconds)."""
    flat = traverse_util.flatten_dict(abstract)
    if not scanned:
        return flat
    out = {}
    for path, leaf in flat.items():
        if "layers" not in path:
            out[path] = leaf
            continue
        i = path.index("layers")
        for n in range(leaf.shape[0]):
            out[path[:i] + (f"layers_{n}",) + path[i + 1:]] = jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)
    return out


def plan(cfg: ModelConfig, tensors: dict[str, Stored], source: str, ignore_unexpected: Iterable[str] = (),
         warn: bool = True, abstract: dict | None = None) -> dict[Path, Stored]:
    """Our param path (layers unstacked) -> the tensor it is read from, after every check the
    whole-file loader makes that needs no data; the problems in one CheckpointError. `abstract`:
    checkpoints.abstract_params(cfg), when the caller has it."""
    name_map = checkpoints.hf_name_map(cfg)
    abstract = checkpoints.abstract_params(cfg) if abstract is None else abstract
    expected = _unstacked(abstract, cfg.scan_layers)
    found, missing, unexpected, heads = checkpoints.sort_hf_names(cfg, tensors, ignore_unexpected)
    wrong_shape, wrong_dtype, out = [], [], {}
    for name, raw in found.items():
        stored, (path, transpose) = tensors[raw], name_map[name]
        want = expected[path]
        if (stored.shape[::-1] if transpose else stored.shape) != tuple(want.shape):
            wrong_shape.append(f"{name}: file has {stored.shape}, "
                               f"config expects {tuple(want.shape[::-1] if transpose else want.shape)}")
            continue
        problem = _dtype_problem(name, stored.dtype, want.dtype)
        if problem:
            wrong_dtype.append(problem)
            continue
        out[path] = dataclasses.replace(stored, hf_name=name, transpose=transpose)
    problems = checks.tensor_problems(missing, unexpected, wrong_shape, wrong_dtype, [])
    if problems:
        raise CheckpointError(f"{source}: " + " | ".join(problems))
    if heads and warn:
        log.warning("%s: ignoring %d task-head tensors not used by the encoder (%s ...)", source, len(heads), heads[0])
    return out


def abstract_checkpoint(model_dir: str, ignore_unexpected: Iterable[str] = (), **config_overrides):
    """(config, abstract params, hf_config_dict): what checkpoints.load_hf_checkpoint gives, with
    jax.ShapeDtypeStruct leaves for the params, from config.json and the file headers alone. Every
    header check is made here, so a bad checkpoint is refused before a run builds its mesh and
    compiles its step, not after."""
    hf = checkpoints.read_hf_config_dict(model_dir)
    tensors = read_headers(model_dir)
    cfg = checkpoints.config_from_hf(hf, tensors.keys(), source=os.path.join(model_dir, CONFIG_FILE), **config_overrides)
    abstract = checkpoints.abstract_params(cfg)
    plan(cfg, tensors, model_dir, ignore_unexpected, abstract=abstract)
    return cfg, abstract, hf


# ---------------------------------------------------------------------------------------------
# Reading by region


def _region(index: tuple, shape: tuple[int, ...]) -> Region:
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _owners(sharding, shape: tuple[int, ...]) -> dict[Region, int]:
    """The process that counts each region's NaN / inf: its lowest-numbered device's (so a region
    replicated over several processes is counted once in the sum over processes)."""
    first: dict[Region, Any] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        region = _region(index, shape)
        if region not in first or device.id < first[region].id:
            first[region] = device
    return {region: device.process_index for region, device in first.items()}


def _read(stored: Stored, region: Region, dtype, counts: dict[str, int] | None) -> np.ndarray:
    """Our region of one (unstacked) parameter: the file's region (the two slices swapped for a
    transposed parameter), checked for NaN / inf in its stored dtype, then cast."""
    file_region = region[::-1] if stored.transpose else region
    block = read_slice(stored.file, stored.name, tuple(slice(a, b) for a, b in file_region))
    if counts is not None and jnp.issubdtype(block.dtype, jnp.floating):
        bad = int(block.size - np.count_nonzero(np.isfinite(block)))
        if bad:
            counts[stored.hf_name] = counts.get(stored.hf_name, 0) + bad
    return (block.T if stored.transpose else block).astype(dtype, copy=False)


def _layer_sources(path: Path, layers: int, sources: dict[Path, Stored]) -> list[Stored]:
    """The per-layer tensors of a scanned parameter (`layers` stacked on axis 0 from layers_0..n-1)."""
    i = path.index("layers")
    return [_source(path[:i] + (f"layers_{n}",) + path[i + 1:], sources) for n in range(layers)]


def _source(path: Path, sources: dict[Path, Stored]) -> Stored:
    if path not in sources:  # a parameter of the module that the family's name map does not give
        raise ValueError(f"{'/'.join(path)}: no checkpoint tensor maps to this parameter (hf_name_map)")
    return sources[path]


def _make(path: Path, want, sharding, sources: dict[Path, Stored], stacked: bool, counts: dict[str, int]):
    """One parameter as a global jax.Array: each addressable device's region read from the file."""
    layers = _layer_sources(path, want.shape[0], sources) if stacked else None
    single = None if stacked else _source(path, sources)
    me, multi = jax.process_index(), jax.process_count() > 1
    owners = _owners(sharding, want.shape) if multi else {}
    # Devices holding the same region (replicated axes) share one read. make_array_from_callback
    # keeps every device's block until its one batched device_put anyway, so keeping them here as
    # well costs nothing; the cache lives for this one parameter, never more than its distinct regions.
    cache: dict[Region, np.ndarray] = {}

    def callback(index):
        region = _region(index, want.shape)
        if region not in cache:
            owned = counts if not multi or owners[region] == me else None
            if layers is None:
                cache[region] = _read(single, region, want.dtype, owned)
            else:  # each layer in the region's layer range read and stacked, as stack_layers does
                (start, stop), rest = region[0], region[1:]
                block = np.empty(tuple(b - a for a, b in region), want.dtype)
                for j, n in enumerate(range(start, stop)):
                    block[j] = _read(layers[n], rest, want.dtype, owned)
                cache[region] = block
        return cache[region]

    try:
        return jax.make_array_from_callback(tuple(want.shape), sharding, callback, dtype=want.dtype)
    finally:
        cache.clear()


def _non_finite_problems(counts: dict[str, int], sources: dict[Path, Stored]) -> list[str]:
    """Every process's counts summed (a collective: every process calls it, after its last read)."""
    sizes = {s.hf_name: int(np.prod(s.shape)) for s in sources.values()}
    if jax.process_count() > 1:
        names = sorted(sizes)
        local = np.array([counts.get(n, 0) for n in names], np.int32)
        summed = np.asarray(multihost_utils.process_allgather(local)).reshape(-1, len(names)).sum(0)
        counts = {n: int(c) for n, c in zip(names, summed) if c}
    return [f"{n}: {c} of {sizes[n]} values" for n, c in counts.items()]


def load_backbone(model_dir: str, cfg: ModelConfig, shardings, ignore_unexpected: Iterable[str] = (),
                  warn: bool = True) -> dict:
    """The backbone params of a local HF safetensors directory as global jax.Arrays with the given
    shardings (a tree of Shardings of `checkpoints.abstract_params(cfg)`'s structure - layers stacked
    when cfg.scan_layers - or one Sharding for every leaf), each process reading only the regions
    its own devices hold. Equal, bit for bit, to `load_hf_checkpoint`'s params placed with them."""
    abstract = checkpoints.abstract_params(cfg)
    sources = plan(cfg, read_headers(model_dir), model_dir, ignore_unexpected, warn=warn, abstract=abstract)
    want = traverse_util.flatten_dict(abstract)
    if isinstance(shardings, jax.sharding.Sharding):
        targets = dict.fromkeys(want, shardings)
    else:
        targets = traverse_util.flatten_dict(shardings)
    if set(targets) != set(want):
        differ = sorted("/".join(p) for p in set(targets) ^ set(want))
        raise ValueError(f"load_backbone: the shardings' tree is not the params' ({len(differ)} paths differ: "
                         f"{', '.join(differ[:5])})")
    counts: dict[str, int] = {}
    out = {}
    for path, leaf in want.items():
        stacked = cfg.scan_layers and "layers" in path
        out[path] = _make(path, leaf, targets[path], sources, stacked, counts)
    problems = _non_finite_problems(counts, sources)
    if problems:
        raise CheckpointError(f"{model_dir}: " + " | ".join(checks.tensor_problems([], [], [], [], problems)))
    size = sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in want.values())
    log.info("%s: %d parameters (%.2f GB) read by region onto %d local devices", model_dir, len(out), size / 1e9,
             jax.local_device_count())
    return traverse_util.unflatten_dict(out)

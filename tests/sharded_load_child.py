"""The processes of tests/test_sharded_load.py (simulated CPU devices: XLA_FLAGS from the parent).

    python sharded_load_child.py equality SPEC.json     # 8 devices: new == old loader, bytes per device, the run seam
    python sharded_load_child.py memory new|old DIR     # 8 devices: the rise of peak RSS over one load
    python sharded_load_child.py multihost SPEC.json    # one of 2 processes (SENTEMB_* env), 4 devices each

Each prints one line `RESULT {json}` for the parent to check.
"""
from __future__ import annotations

import json
import sys
import time

import jax
import numpy as np
from flax import traverse_util

from sentemb_jax import checkpoints, partitioning, sharded_load
from sentemb_jax.errors import CheckpointError
from sentemb_jax.models.sentence import SentenceEmbedder
from sentemb_jax.training import sharded

IDS = np.ones((1, 8), np.int32)


def target_shardings(cfg, mesh):
    """The backbone's shardings as the run setup makes them (Run.shardings.params['tower']['backbone'])."""
    return sharded.tower_shardings(SentenceEmbedder(cfg, pooling=("mean",)), IDS, IDS, mesh)[1]["backbone"]


class CountingReads:
    """sharded_load.read_slice wrapped: every read's (tensor, file region) and bytes."""

    def __init__(self):
        self.reads: list[tuple[str, tuple, int]] = []
        self.original = sharded_load.read_slice

    def __call__(self, file, name, index):
        block = self.original(file, name, index)
        self.reads.append((name, tuple((s.start, s.stop) for s in index), int(block.nbytes)))
        return block

    def __enter__(self):
        sharded_load.read_slice = self
        return self

    def __exit__(self, *exc):
        sharded_load.read_slice = self.original


def _region(index, shape):
    return tuple(s.indices(n)[:2] for s, n in zip(tuple(index) + (slice(None),) * (len(shape) - len(index)), shape))


def device_regions(model_dir, cfg, shardings, devices):
    """{device id: {(stored tensor name, file region): bytes}}: what each device's slices are in the
    files, worked out here from the shardings alone (transposed parameters: the region reversed;
    scanned ones: one region per layer of the slice's layer range)."""
    sources = sharded_load.plan(cfg, sharded_load.read_headers(model_dir), model_dir, warn=False)
    want = traverse_util.flatten_dict(checkpoints.abstract_params(cfg))
    flat_sh = traverse_util.flatten_dict(shardings)
    out = {d.id: {} for d in devices}
    for path, leaf in want.items():
        stacked = cfg.scan_layers and "layers" in path
        for device, index in flat_sh[path].devices_indices_map(tuple(leaf.shape)).items():
            if device.id not in out:
                continue
            region = _region(index, leaf.shape)
            parts = [(path, region)]
            if stacked:
                i = path.index("layers")
                parts = [(path[:i] + (f"layers_{n}",) + path[i + 1:], region[1:]) for n in range(*region[0])]
            for p, r in parts:
                s = sources[p]
                r = r[::-1] if s.transpose else r
                size = int(np.prod([b - a for a, b in r])) * np.dtype(sharded_load.DTYPES[s.dtype]).itemsize
                out[device.id][(s.name, r)] = size
    return out


def read_accounting(counter, regions, total_bytes):
    """Bytes read per device (each read counted for every device whose slice it is), each device's
    share, reads repeated, reads that are no device's slice."""
    seen = {}
    for name, region, nbytes in counter.reads:
        seen[(name, region)] = seen.get((name, region), 0) + 1
    per_device = {d: sum(n for key, n in own.items() if key in seen) for d, own in regions.items()}
    share = {d: sum(own.values()) for d, own in regions.items()}
    anyone = set().union(*[set(own) for own in regions.values()])
    return {"bytes_per_device": per_device, "share_per_device": share, "total_read": sum(n for *_, n in counter.reads),
            "reads": len(counter.reads), "repeated_reads": sum(c - 1 for c in seen.values()),
            "foreign_reads": sum(1 for key in seen if key not in anyone), "model_bytes": total_bytes}


def compare(new, old, shardings):
    """(every leaf bitwise equal with the same dtype, every leaf's sharding the target's)."""
    flat_new = traverse_util.flatten_dict(new)
    flat_old = traverse_util.flatten_dict(old)
    flat_sh = traverse_util.flatten_dict(shardings)
    assert set(flat_new) == set(flat_old) == set(flat_sh)
    equal = all(np.asarray(flat_new[p]).dtype == flat_old[p].dtype
                and np.asarray(flat_new[p]).tobytes() == np.ascontiguousarray(flat_old[p]).tobytes() for p in flat_new)
    same_sharding = all(flat_new[p].sharding == flat_sh[p] for p in flat_new)
    return equal, same_sharding


def stored_bytes(model_dir):
    headers = sharded_load.read_headers(model_dir)
    return sum(int(np.prod(t.shape)) * np.dtype(sharded_load.DTYPES[t.dtype]).itemsize for t in headers.values())


def equality(spec):
    mesh = partitioning.make_mesh(2, 2, 2)
    out = {}
    for case in spec["cases"]:
        cfg, old, _ = checkpoints.load_hf_checkpoint(case["dir"], scan_layers=case["scan"])
        target = target_shardings(cfg, mesh)
        start = time.perf_counter()
        with CountingReads() as counter:
            new = sharded_load.load_backbone(case["dir"], cfg, target)
        seconds = time.perf_counter() - start
        equal, same_sharding = compare(new, old, target)
        regions = device_regions(case["dir"], cfg, target, jax.devices())
        out[case["label"]] = {"equal": equal, "sharding": same_sharding, "seconds": seconds,
                              **read_accounting(counter, regions, stored_bytes(case["dir"]))}
    out["seam"] = seam(spec["seam_dir"], mesh)
    out["errors"] = {label: nan_message(d, mesh) for label, d in spec.get("nan_dirs", {}).items()}
    return out


def nan_message(model_dir, mesh):
    """(the sharded loader's CheckpointError, the whole-file loader's) for a checkpoint holding NaN."""
    cfg, _, _ = sharded_load.abstract_checkpoint(model_dir)
    messages = []
    for load in (lambda: sharded_load.load_backbone(model_dir, cfg, target_shardings(cfg, mesh)),
                 lambda: checkpoints.load_hf_checkpoint(model_dir)):
        try:
            load()
            messages.append(None)
        except CheckpointError as e:
            messages.append(str(e))
    return messages


def seam(model_dir, mesh):
    """The train setup: TowerConfig(init_from=a safetensors dir) reads no tensor in setup_run, and
    Run.initial_state reads the backbone by region into Run.shardings - equal to the whole-file load."""
    from sentemb_jax.methods.contrastive import Contrastive
    from sentemb_jax.training.config import DataConfig, EvalConfig, MeshConfig, RunConfig, TowerConfig
    from sentemb_jax.training.setup import setup_run

    config = RunConfig(model_dir="/unused", num_steps=1, mesh=MeshConfig(*mesh.devices.shape),
                       model=TowerConfig(init_from=model_dir, config_overrides={"scan_layers": True}),
                       data=DataConfig(batch_size=8, sequence_length=16), evaluation=EvalConfig(every=None))
    with CountingReads() as at_setup:
        run = setup_run(config, Contrastive(), abstract=True)
    abstract_leaves = all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(run.model.params["backbone"]))
    with CountingReads() as at_start:
        state = run.initial_state()
    _, old, _ = checkpoints.load_hf_checkpoint(model_dir, scan_layers=True)
    equal, same_sharding = compare(state.params["tower"]["backbone"], old, run.shardings.params["tower"]["backbone"])
    return {"backbone_from": run.backbone_from, "abstract_until_start": abstract_leaves, "reads_in_setup": len(at_setup.reads),
            "reads_in_initial_state": len(at_start.reads), "equal": equal, "sharding": same_sharding}


def _peak_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def memory(which, model_dir):
    """The rise of this process's peak RSS over one load onto a (data 1, fsdp 4, model 2) mesh, and
    the bytes the arrays hold on the 8 simulated devices (host memory too, here)."""
    mesh = partitioning.make_mesh(1, 4, 2)
    cfg, _, _ = sharded_load.abstract_checkpoint(model_dir)
    target = target_shardings(cfg, mesh)
    jax.block_until_ready(jax.device_put(np.zeros(8, np.float32), jax.devices()[0]))  # the runtime's own start-up first
    try:  # the peak reset to the current RSS (Linux >= 4.0), so the import's own peak cannot hide the load's
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    before = _rss_kb() if reset else _peak_kb()
    start = time.perf_counter()
    if which == "new":
        params = sharded_load.load_backbone(model_dir, cfg, target)
    else:  # today's start: the whole checkpoint on the host, then placed with the run's shardings
        _, host, _ = checkpoints.load_hf_checkpoint(model_dir)
        params = jax.device_put(host, target)
        del host
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    rise = (_peak_kb() - before) * 1024
    on_devices = sum(s.data.nbytes for x in jax.tree_util.tree_leaves(params) for s in x.addressable_shards)
    headers = sharded_load.read_headers(model_dir)
    largest = max(int(np.prod(t.shape)) * np.dtype(sharded_load.DTYPES[t.dtype]).itemsize for t in headers.values())
    return {"which": which, "rise": rise, "on_devices": on_devices, "largest_tensor": largest,
            "model_bytes": stored_bytes(model_dir), "seconds": seconds, "peak_reset": reset}


def multihost(spec):
    """One process of two: only its own devices' regions are read, and its shards equal the
    whole-file load's; a NaN is reported by both processes alike, with the whole tensor's count."""
    from sentemb_jax.distributed import initialize_distributed

    initialize_distributed()
    assert jax.process_count() == 2 and jax.device_count() == 8, (jax.process_count(), jax.device_count())
    # The process boundary runs through fsdp: a data axis spanning the processes would give each
    # process a whole replica to read.
    mesh = partitioning.make_mesh(*spec["mesh"])
    out = {"process": jax.process_index()}
    for case in spec["cases"]:
        cfg, old, _ = checkpoints.load_hf_checkpoint(case["dir"], scan_layers=case["scan"])
        target = target_shardings(cfg, mesh)
        with CountingReads() as counter:
            new = sharded_load.load_backbone(case["dir"], cfg, target)
        flat_new = traverse_util.flatten_dict(new)
        flat_old = traverse_util.flatten_dict(old)
        equal = all(np.asarray(s.data).tobytes() == np.ascontiguousarray(flat_old[p][s.index]).tobytes()
                    for p, x in flat_new.items() for s in x.addressable_shards)
        mine = device_regions(case["dir"], cfg, target, jax.local_devices())
        everyone = device_regions(case["dir"], cfg, target, jax.devices())
        own = {key: n for regions in mine.values() for key, n in regions.items()}
        acc = read_accounting(counter, mine, stored_bytes(case["dir"]))
        out[case["label"]] = {"equal": equal, "process_read": acc["total_read"], "process_share": sum(own.values()),
                              "repeated_reads": acc["repeated_reads"], "foreign_reads": acc["foreign_reads"],
                              "all_devices_share": sum(sum(r.values()) for r in everyone.values()),
                              "model_bytes": acc["model_bytes"], "bytes_per_device": acc["bytes_per_device"]}
    out["errors"] = {label: nan_message(d, mesh) for label, d in spec.get("nan_dirs", {}).items()}
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "memory":
        result = memory(sys.argv[2], sys.argv[3])
    else:
        with open(sys.argv[2]) as f:
            spec = json.load(f)
        result = equality(spec) if mode == "equality" else multihost(spec)
    print("RESULT " + json.dumps(result, default=str), flush=True)

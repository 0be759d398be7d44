"""What a TPU slice is to the compiler here: each generation's published per-chip figures (CHIPS),
the slices known to work with this libtpu, and a slice's abstract devices (no TPU needed).
Used by sentemb_jax.benchmarks.tpu_compile and scaling_check."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

from jax.experimental import topologies

import sentemb_jax

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published figures per jax device (a chip; a TensorCore for v2 / v3, whose devices are cores)."""

    name: str
    peak_bf16: float  # FLOP/s
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    ici_bw: float  # bytes/s one chip sends (one direction)
    source: str


# Sources (Google Cloud TPU documentation, "System architecture" table of each version's page):
# v3  https://cloud.google.com/tpu/docs/v3  : 123 TFLOP/s bf16, 32 GiB HBM2 at 900 GB/s per chip of
#     two TensorCores (a jax device is one core: half of each); ICI per chip not listed - taken as the
#     pod's all-reduce bandwidth / chips = 340 TB/s / 1024 = 332 GB/s (half per core).
# v4  https://cloud.google.com/tpu/docs/v4  : 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s; ICI per chip
#     not listed - the pod's all-reduce bandwidth / chips = 1.1 PB/s / 4096 = 268 GB/s.
# v5e https://cloud.google.com/tpu/docs/v5e : 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, inter-chip
#     interconnect 1600 Gbps = 200 GB/s (= the pod's 51.2 TB/s all-reduce bandwidth / 256 chips).
# v5p https://cloud.google.com/tpu/docs/v5p : 459 TFLOP/s bf16, 95 GiB HBM at 2765 GB/s, ICI 4800 Gbps
#     = 600 GB/s (the page lists 1200 GB/s bidirectional).
# v6e https://cloud.google.com/tpu/docs/v6e : 918 TFLOP/s bf16, 32 GB HBM at 1640 GB/s, ICI 3584 Gbps
#     = 448 GB/s (an other edition of the page: 1600 GB/s and 3200 Gbps).
# HBM is counted in GiB as the compiler's limit is (16 GiB on v5e, 32 GiB on v4 / v6e).
CHIPS = {
    "v3": Chip("TPU v3 (per core)", 123e12 / 2, 16 * GIB, 900e9 / 2, 332e9 / 2, "cloud.google.com/tpu/docs/v3"),
    "v4": Chip("TPU v4", 275e12, 32 * GIB, 1200e9, 268e9, "cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", 197e12, 16 * GIB, 819e9, 200e9, "cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", 459e12, 95 * GIB, 2765e9, 600e9, "cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", 918e12, 32 * GIB, 1640e9, 448e9, "cloud.google.com/tpu/docs/v6e"),
}
# Slices known to work with this libtpu (generation:topology; v4 / v5p are given in chips, megacore).
KNOWN_TOPOLOGIES = {
    "v3": ["v3:2x2", "v3:4x4", "v3:4x8", "v3:8x8", "v3:8x16", "v3:16x16", "v3:16x32", "v3:32x32"],
    "v4": ["v4:2x2x1", "v4:2x2x2", "v4:2x2x4", "v4:2x4x4", "v4:4x4x4", "v4:4x4x8", "v4:4x8x8", "v4:8x8x8"],
    "v5e": ["v5e:2x2", "v5e:2x4", "v5e:4x4", "v5e:4x8", "v5e:8x8", "v5e:8x16", "v5e:16x16"],
    "v5p": ["v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4", "v5p:2x4x4", "v5p:4x4x4", "v5p:4x4x8"],
    "v6e": ["v6e:2x2", "v6e:2x4", "v6e:4x4", "v6e:4x8", "v6e:8x8", "v6e:8x16", "v6e:16x16"],
}
SEARCH_TOPOLOGIES = {"v4": KNOWN_TOPOLOGIES["v4"][:6], "v5e": KNOWN_TOPOLOGIES["v5e"]}
INSTALL_HINT = ("the TPU compiler needs libtpu: pip install libtpu==0.0.42.1 (the version jax[tpu]==0.10.2 pins), "
                "or pip install -e '.[test]'")


class TopologyError(ValueError):
    pass


class LibtpuMissing(RuntimeError):
    pass


def quiet_compile_only_env() -> None:
    """On a host without a TPU, libtpu is only the compiler here: let several processes load it
    (no device is opened, so its single-user lock file is not needed) and give it the host layout
    it would otherwise look up from the TPU VM metadata (silences its initialisation errors)."""
    if sentemb_jax.tpu_attached():
        return
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")


def generation(topology: str) -> str:
    gen = topology.split(":")[0].lower()
    return {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e"}.get(gen, gen)


def chip_of(topology: str) -> Chip:
    gen = generation(topology)
    if gen not in CHIPS:
        raise TopologyError(f"no published figures for {gen!r} in CHIPS; known: {sorted(CHIPS)}")
    return CHIPS[gen]


def known_list() -> str:
    return "; ".join(f"{g}: {', '.join(v)}" for g, v in KNOWN_TOPOLOGIES.items())


def topology_devices(topology: str, num_slices: int = 1) -> list:
    """The abstract devices of a slice (one per chip on v4 / v5p: megacore)."""
    if importlib.util.find_spec("libtpu") is None:
        raise LibtpuMissing(INSTALL_HINT)
    quiet_compile_only_env()
    if not re.fullmatch(r"[a-z0-9]+:\d+(x\d+){1,2}", topology) or generation(topology) not in KNOWN_TOPOLOGIES:
        raise TopologyError(f"unknown topology {topology!r} (want generation:AxB or AxBxC); known: {known_list()}")

    kwargs = {"num_slices": num_slices} if num_slices > 1 else {}
    if generation(topology) in ("v4", "v5p"):
        kwargs["chip_config_name"] = "megacore"
    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=topology, **kwargs).devices)
    except Exception as e:  # JaxRuntimeError: INVALID_ARGUMENT ...
        raise TopologyError(f"topology {topology!r} rejected by libtpu ({str(e).splitlines()[0][:300]}); "
                            f"known: {known_list()}") from None

"""sentemb_jax: sentence encoders in JAX/Flax, from a laptop CPU to a TPU pod."""
import glob as _glob
import importlib as _importlib
import importlib.util as _importlib_util
import os as _os
import sys as _sys

# PCI vendor / device ids of TPU chips (the ones jax._src.hardware_utils knows: v3 .. TPU7x).
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"}
# Variables that mean "this process is meant to talk to a TPU runtime": then nothing is changed.
_TPU_ENV = ("JAX_FORCE_TPU_INIT", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS")
_GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "jax_plugins")


def tpu_attached() -> bool:
    """Whether this host has a TPU: a TPU chip on the PCI bus (how jax itself counts them), or the
    device nodes a TPU VM / a GKE TPU container exposes (/dev/accel*, /dev/vfio)."""
    if _glob.glob("/dev/accel*") or _os.path.exists("/dev/vfio"):
        return True
    for vendor_path in _glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor_path) as f:
                if f.read().strip() != _GOOGLE_PCI_VENDOR:
                    continue
            with open(_os.path.join(_os.path.dirname(vendor_path), "device")) as f:
                if f.read().strip() in _TPU_PCI_DEVICES:
                    return True
        except OSError:
            continue
    return False


def _cpu_unless_tpu() -> None:
    """With libtpu installed (the `test` extra installs it to compile for TPU ahead of time) on a
    host without a TPU, `import jax` + the first jax.devices() would try to start the TPU runtime,
    print its initialisation errors (TPU_WORKER_HOSTNAMES ...) and fall back to CPU. Default jax to
    the CPU platform there instead - only when the user chose no platform (JAX_PLATFORMS unset),
    no TPU variable is set, no TPU is attached and no GPU plugin is installed. TPU VMs keep their
    TPU; `jax.experimental.topologies.get_topology_desc(platform="tpu")` (the TPU compiler without
    a TPU, sentemb_jax.benchmarks.tpu_compile) does not depend on the platform list and still works."""
    if "JAX_PLATFORMS" in _os.environ or "JAX_PLATFORM_NAME" in _os.environ:
        return
    if any(name in _os.environ for name in _TPU_ENV):
        return
    if _importlib_util.find_spec("libtpu") is None and not _os.environ.get("TPU_LIBRARY_PATH"):
        return  # nothing would try to start a TPU runtime
    if any(_importlib_util.find_spec(name) is not None for name in _GPU_PLUGINS):
        return  # a GPU build: leave jax's own platform choice alone
    if tpu_attached():
        return
    _os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in _sys.modules:  # imported before us: its config read the environment already
        try:
            from jax._src import xla_bridge  # lazy: only when jax was imported before us (a private module)

            if not xla_bridge._backends:  # not started yet: the setting still takes effect
                _sys.modules["jax"].config.update("jax_platforms", "cpu")
        except (ImportError, AttributeError):
            pass


_cpu_unless_tpu()

# The public names, loaded on first use (PEP 562): `import sentemb_jax.data.files` must not load
# the Flax models (a package's __init__ runs before any of its modules).
_EXPORTS = {"SentenceEncoder": "sentemb_jax.encoder", "CrossEncoder": "sentemb_jax.cross_encoder",
            "CheckpointError": "sentemb_jax.errors", "enable_compilation_cache": "sentemb_jax.compile_cache"}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(_importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sentemb_jax' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])

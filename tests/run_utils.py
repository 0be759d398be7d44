"""Helpers for tests that run training jobs and read their checkpoints."""
import itertools
import os

import jax
import orbax.checkpoint as ocp


def latest_checkpoint(model_dir: str, step: int):
    """(params, data state) of MODEL_DIR/checkpoints/<step>, which must be the latest, restored onto
    this process's first device whatever topology wrote it (orbax needs the target layout then)."""
    manager = ocp.CheckpointManager(os.path.join(model_dir, "checkpoints"), item_handlers={
        "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})
    assert manager.latest_step() == step
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    meta = manager.item_metadata(step)["state"]
    target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), getattr(meta, "tree", meta))
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                             data=ocp.args.JsonRestore()))
    return restored["state"]["params"], restored["data"]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def header_gin_files(path: str) -> list[str]:
    """The --gin_file list of the `python -m sentemb_jax.main` command in a gin file's header (a run
    file's command names the model file to put before it); [path] when the header has none."""
    import re
    import shlex

    full = path if os.path.isabs(path) else os.path.join(REPO, path)
    if not os.path.isfile(full):
        return [path]
    head = "\n".join(line[1:] for line in open(full, encoding="utf-8").read().splitlines()
                     if line.startswith("#")).replace("\\\n", " ")
    found = re.search(r"python -m sentemb_jax\.main ([^\n]*)", head)
    if not found:
        return [path]
    files = [a.split("=", 1)[1] for a in shlex.split(found.group(1).replace("[", "").replace("]", ""))
             if a.startswith("--gin_file=")]
    return files if path in files else [path]


def gin_file_args(path: str) -> list[str]:
    """`--gin_file=` arguments that run `path` as its header says (its model file first)."""
    return [f"--gin_file={f}" for f in header_gin_files(path)]


NO_TENSORFLOW = os.path.join(REPO, "tests", "no_tensorflow")


def without_tensorflow(env: dict | None = None) -> dict:
    """The environment of a child process on which TensorFlow, tensorflow_text, seqio and
    tensorflow_datasets cannot be imported (tests/no_tensorflow/sitecustomize.py)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([NO_TENSORFLOW, REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def simulated_devices_flags(devices: int) -> str:
    """XLA_FLAGS for a process with `devices` simulated CPU devices. The programs of these tests are
    tiny models compiled once or twice: LLVM's optimisation passes cost more than they save
    (tests/test_sharding.py's child: 68 s -> 52 s without them). Both sides of every comparison run
    under the same flags; the encode-heavy tests keep the default (optimised code runs 25% faster)."""
    return f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"


def cut_data_dir(root, data_dir: str, lines: dict[str, int]):
    """`root` (a pathlib folder) holding the first `lines[rel]` lines (header included) of each
    DATA_DIR file `rel`: a small DATA_DIR for jobs whose figures are not what a test checks."""
    for rel, n in lines.items():
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(os.path.join(data_dir, rel), encoding="utf-8") as f:
            dst.write_text("".join(itertools.islice(f, n)), encoding="utf-8")
    return root

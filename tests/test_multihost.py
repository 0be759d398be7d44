"""Multi-host on one machine: 2 processes on 127.0.0.1 (gloo CPU collectives), 4 simulated devices
each, train 3 steps of the tiny T5 job; the params equal a 1-process run on 8 simulated devices,
and the 2-process checkpoint restores in a 1-process run."""
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from hf_models import make_t5
from run_utils import gin_file_args, latest_checkpoint, simulated_devices_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(model_path, model_dir, data_dir, steps):
    return [sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/tiny_t5_nli.gin"),
            f"--gin.MODEL_PATH='{model_path}'", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.DATA_DIR='{data_dir}'",
            f"--gin.sentemb_jax.RunConfig.num_steps={steps}", "--gin.sentemb_jax.CheckpointConfig.every=3",
            # Each process reads every 2nd row of the global order, so a global batch holds the same
            # rows as the 1-process run's in another order: dropout masks would land on other rows.
            "--gin.sentemb_jax.TowerConfig.config_overrides={'dropout_rate': 0.0}",
            "--gin.sentemb_jax.DataConfig.fixed_padding=True", "--gin.sentemb_jax.MeshConfig.model=2"]


def _env(devices, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTEMB_")}
    env["XLA_FLAGS"] = simulated_devices_flags(devices)
    env["JAX_PLATFORMS"] = "cpu"
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("t5"))
    make_t5(path, "1.1")
    return path


def test_two_processes_equal_one_and_checkpoint_restores_in_one(t5_dir, tmp_path, data_dir):
    two = str(tmp_path / "two")
    port = _free_port()
    procs = [subprocess.Popen(_cmd(t5_dir, two, data_dir, 3), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_env(4, SENTEMB_COORDINATOR=f"127.0.0.1:{port}", SENTEMB_NUM_PROCESSES=2,
                                                  SENTEMB_PROCESS_ID=i))
             for i in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert "process 0 of 2; 4 local / 8 global devices" in logs[0] and "process 1 of 2" in logs[1]
    one = str(tmp_path / "one")
    proc = subprocess.run(_cmd(t5_dir, one, data_dir, 3), cwd=REPO, capture_output=True, text=True, timeout=600, env=_env(8))
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, data_a = latest_checkpoint(two, 3)
    b, data_b = latest_checkpoint(one, 3)
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(leaves_a) == len(leaves_b) > 10
    diffs = [float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(leaves_a, leaves_b)]
    assert max(diffs) <= 1e-5, max(diffs)
    # Process 0 alone wrote the metrics (3 lines, not 6); both processes' data positions were saved.
    with open(os.path.join(two, "metrics.jsonl")) as f:
        assert [int(line.split('"step": ')[1].split(",")[0]) for line in f] == [1, 2, 3]
    assert data_a["input"]["shard"] in ([0, 2], [1, 2])
    # The 2-process checkpoint restores in a 1-process (8-device) run, which goes on to step 4.
    proc = subprocess.run(_cmd(t5_dir, two, data_dir, 4), cwd=REPO, capture_output=True, text=True, timeout=600, env=_env(8))
    assert proc.returncode == 0 and "at step 3" in proc.stderr, proc.stderr[-3000:]
    # And SentenceEncoder reads the run directory (its latest checkpoint, onto one device).
    from sentemb_jax.encoder import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(two)
    params_4, _ = latest_checkpoint(two, 4)
    for x, y in zip(jax.tree_util.tree_leaves(encoder.params), jax.tree_util.tree_leaves(params_4["tower"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.isfinite(encoder.encode(["A man plays a guitar."])).all()

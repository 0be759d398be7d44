"""Multi-host runs: one process per host (a TPU VM worker, a GPU node), `jax.distributed` over them.

    # every process, same command (gin or environment):
    python -m sentemb_jax.main --gin_file=gin/st5_11b.gin --gin.MODEL_DIR="'gs://bucket/run'" \
        --gin.sentemb_jax.initialize_distributed.auto=True          # TPU pod slice: from the TPU metadata
    SENTEMB_COORDINATOR=10.0.0.2:8476 SENTEMB_NUM_PROCESSES=4 SENTEMB_PROCESS_ID=$i python -m sentemb_jax.main ...

Each process then reads its own shard of the training data (every `process_count`-th row of the
global order), its part of every global batch is placed with
`jax.make_array_from_process_local_data`, and orbax checkpoints are written and restored by all
processes together. Metrics, TensorBoard files and exports are written by process 0.
"""
from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger(__name__)

ENV = ("SENTEMB_COORDINATOR", "SENTEMB_NUM_PROCESSES", "SENTEMB_PROCESS_ID")


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, auto: bool = False) -> bool:
    """Join the other processes of this job; returns whether it runs on several processes.

    coordinator_address / num_processes / process_id: from gin, else from SENTEMB_COORDINATOR /
      SENTEMB_NUM_PROCESSES / SENTEMB_PROCESS_ID; all three or none.
    auto: jax.distributed.initialize() with no arguments (TPU pods, SLURM, ... detect them).
    Nothing given: a single-process run.
    """
    env = {k: os.environ.get(k) for k in ENV}
    coordinator_address = coordinator_address or env["SENTEMB_COORDINATOR"]
    num_processes = num_processes if num_processes is not None else _int_env(env, "SENTEMB_NUM_PROCESSES")
    process_id = process_id if process_id is not None else _int_env(env, "SENTEMB_PROCESS_ID")
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ValueError("initialize_distributed: give coordinator_address, num_processes and process_id together "
                         f"(configuration or {', '.join(ENV)}); got {coordinator_address=}, {num_processes=}, {process_id=}")
    if not any(given) and not auto:
        return False
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    if any(given):
        if not 0 <= process_id < num_processes:
            raise ValueError(f"initialize_distributed: process_id {process_id} not in [0, {num_processes})")
        # CPU processes exchange collectives through gloo (TPU / GPU use their own interconnect).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    else:
        jax.distributed.initialize()
    log.info("process %d of %d; %d local / %d global devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
    return jax.process_count() > 1


def _int_env(env: dict, key: str) -> int | None:
    if env[key] is None:
        return None
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"{key}={env[key]!r}: not an integer") from None


def is_primary() -> bool:
    """Process 0 writes what is written once (metrics, TensorBoard, exports)."""
    return jax.process_index() == 0


def process_index() -> int:
    """This process's index among the job's processes (0 on one host)."""
    return jax.process_index()

"""The benchmarks' side-by-side protocol: one worker process per implementation, each warmed up, then
timed in alternation, one at a time, so that drift on a shared host falls on every row alike
(encode_throughput, train_throughput).

A worker is a function run in a spawned process (it receives its end of a Pipe) or a command in
another Python (`CommandWorker`); it sends ("ready", {its start-up figures}) when warm, then serves
'run' requests (`serve_rounds`) until 'stop'. A worker that dies is named with how it ended, not
waited for. This module imports no model library: a spawned worker loads only what its own
function imports.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import subprocess
import tempfile
import time

from sentemb_jax.child_process import how_it_ended


def serve_rounds(conn, run) -> None:
    """A worker's side of run_side_by_side: the seconds of run() for each 'run', until 'stop' or until
    the parent is gone (its closed pipe ends the worker quietly)."""
    while True:
        try:
            if conn.recv() != "run":
                return
        except EOFError:
            return
        start = time.perf_counter()
        run()
        conn.send(time.perf_counter() - start)


class CommandWorker:
    """A worker in another Python environment (argv: a command), behind the Pipe interface below:
    'run' / 'stop' lines to its stdin, one JSON value a line from its stdout ({"ready": {...}} first,
    as st_backend_worker prints); its stderr is kept and its tail names why it failed."""

    def __init__(self, name: str, argv: list[str]):
        self.name, self.log = name, tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def send(self, message: str) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(message + "\n")
                self.proc.stdin.flush()
            except OSError:  # BrokenPipeError: it died just now; recv() says how
                pass

    def recv(self):
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"{self.name} worker {how_it_ended(self.proc.wait())}: {' | '.join(tail)}")
        value = json.loads(line)
        return ("ready", value["ready"]) if isinstance(value, dict) else value

    def join(self, timeout: float) -> None:
        self.proc.wait(timeout)


class ProcessWorker:
    """A worker process's end of its Pipe: a worker that dies (a crash in XLA or a runtime, e.g. SIGILL
    from flags this CPU cannot run) is a RuntimeError naming it and how it ended, not a wait forever."""

    def __init__(self, name: str, conn, proc):
        self.name, self.conn, self.proc = name, conn, proc

    def send(self, message: str) -> None:
        try:
            self.conn.send(message)
        except OSError:  # BrokenPipeError: it died; recv() says how
            pass

    def recv(self):
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(30)
            code = self.proc.exitcode  # None: it closed its pipe and still runs
            how = "closed its pipe" if code is None else how_it_ended(code)
            raise RuntimeError(f"{self.name} worker {how} (its output is above)") from None


def run_side_by_side(workers: dict[str, tuple], rounds: int, label: str = "sent/s", count: int = 1,
                     startup: dict | None = None, start_together: bool = False) -> dict[str, float]:
    """Start one process per (target, args) entry (each sends ("ready", {startup figures}) when
    warm; they go to `startup`), then alternate them `rounds` times; median rates. A target that
    is a list is a command (another Python: `CommandWorker`), its args appended to it.
    Workers start one after another (each one's first call from cold is timed alone), or with
    `start_together` all at once (a GPU host's many cores compile them side by side; their
    first-call figures then include the others' start-up); the rounds run one worker at a time."""
    ctx = mp.get_context("spawn")
    conns, procs = {}, []
    startup = {} if startup is None else startup
    rates: dict[str, list[float]] = {n: [] for n in workers}
    if start_together:
        print("workers start together (the host's cores compile them side by side): each first call from cold "
              "includes the others' start-up; the rounds run one worker at a time", flush=True)
    try:  # the workers already started are stopped and joined however this ends
        for name, (target, args) in workers.items():
            if isinstance(target, list):
                parent = p = CommandWorker(name, [*target, *map(str, args)])
            else:
                parent, child = ctx.Pipe()
                p = ctx.Process(target=target, args=(*args, child), daemon=True)
                p.start()
                child.close()  # the worker's end lives in the worker only: its death ends the pipe (EOFError)
                parent = ProcessWorker(name, parent, p)
            conns[name], procs = parent, procs + [p]
            if not start_together:
                startup[name] = _ready(name, parent)
        for name, conn in conns.items():
            if name not in startup:
                startup[name] = _ready(name, conn)
        for r in range(rounds):
            for name, conn in conns.items():
                conn.send("run")
                rates[name].append(count / conn.recv())
            print(f"round {r + 1}: " + "  ".join(f"{n}={rates[n][-1]:.1f} {label}" for n in workers), flush=True)
    finally:
        for conn in conns.values():
            conn.send("stop")
        for p in procs:
            p.join(timeout=30)
    return {n: statistics.median(v) for n, v in rates.items()}


def _ready(name: str, conn) -> dict:
    ready = conn.recv()
    if not (isinstance(ready, tuple) and ready[0] == "ready"):
        raise RuntimeError(f"{name} worker failed to start")
    return ready[1]

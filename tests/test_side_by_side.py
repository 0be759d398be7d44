"""The benchmarks' side-by-side protocol (sentemb_jax.benchmarks.side_by_side): workers in another
Python and spawned worker processes alternate round by round, start together when asked, and one that
dies is named with how it ended instead of waited for. Its own file, importing no model library: a
spawned worker imports this module, and the benchmark modules would cost it JAX and our encoder
(about 2 s a worker on 2 cores)."""
from __future__ import annotations

import os
import sys
import time

import pytest

from sentemb_jax.benchmarks import side_by_side

# A stand-in for another environment's worker: st_backend_worker's protocol, fixed timings.
_FAKE_WORKER = """
import json, sys
kind, seconds = sys.argv[1], float(sys.argv[2])
if kind == "broken":
    print("ImportError: no module named optimum", file=sys.stderr)
    sys.exit(3)
print(json.dumps({"ready": {"first_call_s": 1.5, "stsb_test": 80.0}}), flush=True)
for line in sys.stdin:
    if line.strip() != "run":
        break
    print(json.dumps(seconds), flush=True)
"""


def test_a_worker_in_another_python_alternates_with_the_others(tmp_path, capsys):
    script = tmp_path / "worker.py"
    script.write_text(_FAKE_WORKER)
    startup: dict = {}
    med = side_by_side.run_side_by_side({"a": ([sys.executable, str(script)], ("a", 0.5)),
                                         "b": ([sys.executable, str(script)], ("b", 0.25))},
                                        rounds=3, count=100, startup=startup)
    assert med == {"a": 200.0, "b": 400.0}
    assert startup == {"a": {"first_call_s": 1.5, "stsb_test": 80.0}, "b": {"first_call_s": 1.5, "stsb_test": 80.0}}
    assert capsys.readouterr().out.splitlines()[-1] == "round 3: a=200.0 sent/s  b=400.0 sent/s"
    with pytest.raises(RuntimeError, match=r"broken worker exited with 3: ImportError: no module named optimum"):
        side_by_side.run_side_by_side({"broken": ([sys.executable, str(script)], ("broken", 1.0))}, rounds=1)


# Workers that see each other start: "first" sends ready only once "second" has started (or
# after 60 s, saying so); started one after another, "first" would wait the whole 60 s.
_MEETING_WORKER = """
import json, os, sys, time
kind, folder = sys.argv[1], sys.argv[2]
open(os.path.join(folder, kind), "w").close()
deadline = time.monotonic() + (60 if kind == "first" else 0)
while kind == "first" and not os.path.exists(os.path.join(folder, "second")) and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"ready": {"first_call_s": 0.0, "saw_second": os.path.exists(os.path.join(folder, "second"))}}), flush=True)
for line in sys.stdin:
    if line.strip() != "run":
        break
    print(json.dumps(0.5), flush=True)
"""


def test_workers_started_together_start_before_any_is_ready_and_alternate_as_before(tmp_path):
    """start_together (a GPU host: encode_throughput / train_throughput there) starts every worker
    before waiting for the first to be ready; the rounds and the rates are as when they start one
    after another."""
    script = tmp_path / "worker.py"
    script.write_text(_MEETING_WORKER)
    startup: dict = {}
    started = time.monotonic()
    med = side_by_side.run_side_by_side({"first": ([sys.executable, str(script)], ("first", tmp_path)),
                                         "second": ([sys.executable, str(script)], ("second", tmp_path))},
                                        rounds=2, count=100, startup=startup, start_together=True)
    assert startup["first"]["saw_second"] is True and time.monotonic() - started < 50
    assert med == {"first": 200.0, "second": 200.0}


def _steady_worker(conn):
    conn.send(("ready", {"first_call_s": 0.0}))
    side_by_side.serve_rounds(conn, lambda: None)


def _worker_that_dies(when: str, conn):
    """A spawned worker (run_side_by_side's protocol) killed by a signal before it is ready or in its
    second timed call, as XLA:CPU was by SIGILL under flags this CPU could not run (encode_throughput
    then waited forever)."""
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if when == "at start":
        os.kill(os.getpid(), signal.SIGSEGV)
    conn.send(("ready", {"first_call_s": 0.0}))
    runs = 0
    while conn.recv() == "run":
        runs += 1
        if runs == 2:
            os.kill(os.getpid(), signal.SIGSEGV)
        conn.send(0.5)


@pytest.mark.parametrize("when", ["at start", "in round 2"])
def test_a_worker_process_that_dies_is_named_with_its_signal_not_waited_for(when, capfd):
    """The parent holds no copy of a worker's end of the pipe, so a dead worker ends the wait; the
    worker started before it is stopped, quietly. (The alarm only turns a regression, which would
    wait forever, into a failure; it decides nothing else.)"""
    import signal

    def waited_forever(*_):
        raise AssertionError("run_side_by_side still waits for a worker that died 600 s ago")

    old = signal.signal(signal.SIGALRM, waited_forever)
    signal.alarm(600)  # far above the second or two a spawned worker of this module takes to start
    try:
        with pytest.raises(RuntimeError, match=r"^dies worker died on SIGSEGV \(its output is above\)$"):
            side_by_side.run_side_by_side({"steady": (_steady_worker, ()), "dies": (_worker_that_dies, (when,))},
                                          rounds=3, count=1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "EOFError" not in err, err
    assert ("round 1: steady=" in out) == (when == "in round 2") and "round 2:" not in out

"""Where a test run's compile time goes: with SENTEMB_TEST_COMPILE_LOG naming a folder, every
Python process of the run (the pytest workers and the processes tests start: tests/conftest.py puts
this folder on PYTHONPATH, whose sitecustomize imports this module) appends one line per JAX
compilation phase to FOLDER/<pid>.tsv: the test that was running (PYTEST_CURRENT_TEST, which the
processes a test starts inherit), the phase (trace, lower, compile) and its seconds. A line is
written as its phase ends, so a process killed mid-test keeps what it had done.
`python tests/compile_log/summary.py FOLDER .pytest-times.xml` sums them per test file.

It listens through jax's own monitoring events, registered when jax imports its monitoring module
(a process that never imports jax pays nothing). jax's compile phase covers a program loaded from
the run's persistent cache too, for the time that load took."""
import importlib.abc
import importlib.util
import os
import sys

LOG_ENV = "SENTEMB_TEST_COMPILE_LOG"
PHASES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}


_FOLDER = os.environ.get(LOG_ENV)  # read once: a test that changes its environment changes no log


def _record(event: str, duration: float, **_) -> None:
    phase = PHASES.get(event)
    if phase is None:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
    try:  # jax calls listeners unguarded: a log that cannot be written must not fail the compile
        with open(os.path.join(_FOLDER, f"{os.getpid()}.tsv"), "a", encoding="utf-8") as f:
            f.write(f"{test}\t{phase}\t{duration:.4f}\n")
    except OSError:
        pass


class _ListenOnceJaxMonitoringLoads(importlib.abc.MetaPathFinder):
    """Finds jax._src.monitoring through the other finders, then registers the listener right after
    the module runs: before any compile, without importing jax in processes that do not."""

    def find_spec(self, name, path, target=None):
        if name != "jax._src.monitoring":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec  # nothing to wrap: the import goes on without the log
        run_module = spec.loader.exec_module

        def run_and_listen(module):
            run_module(module)
            module.register_event_duration_secs_listener(_record)

        spec.loader.exec_module = run_and_listen
        return spec


def install() -> None:
    """Listens in this process (once) when LOG_ENV names a folder."""
    if not _FOLDER or any(isinstance(f, _ListenOnceJaxMonitoringLoads) for f in sys.meta_path):
        return
    monitoring = sys.modules.get("jax._src.monitoring")
    if monitoring is not None:  # jax came first (an interpreter that imported it before this)
        monitoring.register_event_duration_secs_listener(_record)
    else:
        sys.meta_path.insert(0, _ListenOnceJaxMonitoringLoads())


install()

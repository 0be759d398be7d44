"""SENTEMB_TEST_COMPILE_LOG: a process started with tests/compile_log on its PYTHONPATH (as
conftest.py sets it for a run) logs each JAX compile phase under the test that was running, a
process without TensorFlow too (its sitecustomize comes first and chains), and
tests/compile_log/summary.py sums the log per file beside the junit XML's test times."""
import os
import subprocess
import sys

from run_utils import without_tensorflow

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = os.path.join(HERE, "compile_log")
SUMMARY = os.path.join(HOOK, "summary.py")
# x + 1 on host arrays of two shapes (two compiles), then the first shape again (in memory: none).
JIT_THREE_CALLS = ("import jax, numpy as np; f = jax.jit(lambda x: x + 1); "
                   "f(np.ones(3)).block_until_ready(); f(np.ones(4)).block_until_ready(); f(np.ones(3)).block_until_ready()")


def _run_logged(log, test: str, env: dict) -> None:
    env = {**env, "SENTEMB_TEST_COMPILE_LOG": str(log), "PYTEST_CURRENT_TEST": f"{test} (call)",
           "JAX_ENABLE_COMPILATION_CACHE": "false"}  # compiled here, not loaded from the run's cache
    proc = subprocess.run([sys.executable, "-c", JIT_THREE_CALLS], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_each_process_logs_its_compile_phases_under_the_running_test_and_the_summary_sums_them(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HOOK, os.environ.get("PYTHONPATH")]))}
    _run_logged(log, "tests/test_a.py::test_one", env)
    _run_logged(log, "tests/test_b.py::test_two", without_tensorflow(env))
    _run_logged(log, "tests/test_b.py::test_three", {k: v for k, v in env.items() if k != "PYTHONPATH"})  # not loaded
    files = sorted(log.iterdir())
    assert len(files) == 2  # the third process had no hook on its path: nothing written
    for path in files:
        rows = [line.split("\t") for line in path.read_text().splitlines()]
        tests = {r[0] for r in rows}
        assert len(tests) == 1 and tests < {"tests/test_a.py::test_one", "tests/test_b.py::test_two"}
        compiles = [float(r[2]) for r in rows if r[1] == "compile"]
        assert len(compiles) == 2 and all(s > 0 for s in compiles)  # two shapes, the third call cached in memory
        assert sum(r[1] == "trace" for r in rows) == 2 and sum(r[1] == "lower" for r in rows) == 2

    junit = tmp_path / "times.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_one" time="3.5"/>'
                     '<testcase classname="tests.test_b" name="test_two" time="1.25"/>'
                     '<testcase classname="tests.test_b" name="test_three" time="1.0"/></testsuite></testsuites>')
    with open(files[0], "a") as f:
        f.write("tests/test_a.py::test_one\tcompile")  # the last line of a process killed while writing: skipped
    proc = subprocess.run([sys.executable, SUMMARY, str(log), str(junit)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in proc.stdout.splitlines()[2:]}
    assert list(rows) == ["test_a.py", "test_b.py", "all 2 files"]  # the slowest file first
    assert rows["test_a.py"][0] == "4" and rows["test_b.py"][0] == "2" and rows["all 2 files"][0] == "6"
    assert rows["test_a.py"][4] == rows["test_b.py"][4] == "1"  # one process each

    with open(files[1], "a") as f:  # a damaged line that is not the last one: refused, naming the place
        f.write("tests/test_b.py::test_two\tcompile\tsoon\nnot a log line\n")
    bad = subprocess.run([sys.executable, SUMMARY, str(log), str(junit)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.splitlines()[-1].startswith(f"{files[1]}:") and bad.stderr.endswith("SECONDS: 'tests/test_b.py::test_two\\tcompile\\tsoon'\n")


def test_a_folder_holding_an_earlier_runs_log_is_refused_before_any_test(tmp_path):
    """The log appends: a run given a folder with an earlier run's *.tsv stops at start-up with a
    usage error naming the folder, instead of summing both runs."""
    (tmp_path / "123.tsv").write_text("tests/test_a.py::test_one\tcompile\t1.0\n")
    env = {**os.environ, "SENTEMB_TEST_COMPILE_LOG": str(tmp_path)}
    env.pop("SENTEMB_TEST_COMPILE_LOG_OF_THIS_RUN", None)  # set when this run itself logs
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "tests/test_compile_log.py"],
                          cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"SENTEMB_TEST_COMPILE_LOG={tmp_path} holds an earlier run's log (*.tsv): give a new or empty folder" in proc.stderr

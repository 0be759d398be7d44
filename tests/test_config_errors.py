"""Command-line and environment errors that used to pass silently or flood the console.

Each case runs the job runner in-process (`sentemb_jax.main.main`) and checks the exit code and the
last stderr line (`error: ...`): a macro set on the command line that nothing reads, an include
cycle, a value gin cannot parse (exit 2, naming the binding); `~` in a configured path (the home
directory, not a folder named `~`); a full / read-only disk while saving (exit 1, one line, the
library tracebacks in the log); the free-space check counting only what the saves add.
"""
import errno
import os
import shutil
import threading

import pytest
from run_utils import gin_file_args

import gin
from sentemb_jax import configuration
from sentemb_jax import main as runner
from sentemb_jax.errors import TrainingError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@gin.configurable("config_errors_test_job")
def marker_job(model_dir: str = gin.REQUIRED):
    """A job that creates its MODEL_DIR and writes one file there (no model, no data)."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "marker.txt"), "w", encoding="utf-8") as f:
        f.write("ok")


def run_main(args, capsys):
    """(exit code, the stderr lines) of an in-process job."""
    gin.clear_config()
    rc = runner.main(args)
    return rc, capsys.readouterr().err.strip().splitlines()


def job_file(tmp_path, model_dir) -> str:
    cfg = tmp_path / "job.gin"
    cfg.write_text(f"run.job = @config_errors_test_job\nconfig_errors_test_job.model_dir = %MODEL_DIR\n"
                   f"MODEL_DIR = {model_dir!r}\n")
    return str(cfg)


# ---------------------------------------------------------------------------------------------
# 1. A macro set on the command line that nothing reads


def test_a_macro_nothing_reads_exit_2_with_the_close_name(tmp_path, capsys):
    model_dir = tmp_path / "run"
    rc, err = run_main([*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{model_dir}'", "--gin.NUM_STEP=30"],
                       capsys)
    assert rc == 2
    assert err[-1] == ("error: gin configuration error: --gin.NUM_STEP=... sets macro NUM_STEP, but nothing reads it "
                       "(no %NUM_STEP in the gin files or bindings); did you mean NUM_STEPS? (--gin.NUM_STEPS=...)")
    assert not model_dir.exists()


def test_a_macro_read_by_a_file_a_binding_or_the_code_is_accepted(tmp_path):
    texts = ["sentemb_jax.RunConfig.num_steps = %NUM_STEPS  # %IN_A_COMMENT\nx.y = '%IN_A_STRING'\n"]
    assert configuration.unread_macros(["NUM_STEPS = 3", "MODEL_DIR = '/x'", "FOO = 1", "a.b = %FOO"], texts) == []
    assert configuration.unread_macros(["IN_A_COMMENT = 1", "IN_A_STRING = 2", "ZZZ = 3"], texts) == [
        "--gin.IN_A_COMMENT=... sets macro IN_A_COMMENT, but nothing reads it (no %IN_A_COMMENT in the gin files or "
        "bindings)", "--gin.IN_A_STRING=... sets macro IN_A_STRING, but nothing reads it (no %IN_A_STRING in the gin "
        "files or bindings)", "--gin.ZZZ=... sets macro ZZZ, but nothing reads it (no %ZZZ in the gin files or bindings)"]


@pytest.mark.parametrize("binding, message", [
    ("sentemb_jax.RunConfig.num_step=30", "sentemb_jax.RunConfig' doesn't have a parameter named 'num_step'"),
    ("sentemb_jax.NoSuchConfig.x=1", "No configurable matching 'sentemb_jax.NoSuchConfig'"),
])
def test_a_binding_to_an_unknown_configurable_or_parameter_exit_2(binding, message, capsys):
    rc, err = run_main([*gin_file_args("gin/runs/eval_stsb_dev.gin"), f"--gin.{binding}"], capsys)
    assert rc == 2 and err[-1].startswith("error: gin configuration error: ") and message in err[-1], err


# ---------------------------------------------------------------------------------------------
# 2. An include cycle


def test_an_include_cycle_is_one_line_naming_the_chain(tmp_path, monkeypatch, capsys):
    (tmp_path / "a.gin").write_text("include 'b.gin'\nA = 1\n")
    (tmp_path / "b.gin").write_text("# b\ninclude 'a.gin'\nB = 2\n")
    monkeypatch.chdir(tmp_path)
    rc, err = run_main(["--gin_file=a.gin"], capsys)
    assert rc == 2
    assert err == ["error: gin configuration error: include cycle: a.gin -> b.gin -> a.gin (a file includes itself "
                   "through these includes; remove one of them)"]


def test_a_file_including_itself_and_a_diamond(tmp_path, monkeypatch, capsys):
    (tmp_path / "self.gin").write_text("include 'self.gin'\n")
    for name, body in {"top.gin": "include 'l.gin'\ninclude 'r.gin'\n", "l.gin": "include 'base.gin'\n",
                       "r.gin": "include 'base.gin'\n", "base.gin": "X = 1\n"}.items():
        (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)
    rc, err = run_main(["--gin_file=self.gin"], capsys)
    assert (rc, err[-1]) == (2, "error: gin configuration error: include cycle: self.gin -> self.gin (a file includes "
                                "itself through these includes; remove one of them)")
    # Two files including the same one is no cycle (gin's own "run.job" message comes next).
    assert len(configuration.read_gin_files(["top.gin"], ["", str(tmp_path)])) == 4


# ---------------------------------------------------------------------------------------------
# 3. A value gin cannot parse


@pytest.mark.parametrize("binding, message", [
    ("sentemb_jax.DataConfig.batch_size=2*32",
     "--gin.sentemb_jax.DataConfig.batch_size=2*32: cannot parse the value 2*32 (gin computes no expressions: write the "
     "number itself; "),
    ("MODEL_DIR=/tmp/x", "--gin.MODEL_DIR=/tmp/x: cannot parse the value /tmp/x (a string must be quoted; "),
])
def test_an_unparseable_value_names_the_binding_and_the_quoting(binding, message, capsys):
    rc, err = run_main([*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.{binding}"], capsys)
    key, value = binding.split("=", 1)
    assert rc == 2
    assert err[-1].startswith("error: gin configuration error: " + message), err
    assert err[-1].endswith(f"a string on the command line is quoted twice: --gin.{key}=\"'{value}'\")"), err
    assert len(err) == 1


def test_an_unparseable_value_in_a_file_keeps_gins_file_and_line(tmp_path, capsys):
    cfg = tmp_path / "bad.gin"
    cfg.write_text("MODEL_DIR = /tmp/x\n")
    rc, err = run_main([f"--gin_file={cfg}"], capsys)
    assert rc == 2 and err[-1].startswith("error: gin configuration error: Unable to parse value"), err


# ---------------------------------------------------------------------------------------------
# 4. `~` in a configured path


def test_tilde_in_model_dir_is_the_home_directory(tmp_path, monkeypatch, capsys):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    rc, err = run_main([f"--gin_file={job_file(tmp_path, '~/runs/x')}"], capsys)
    assert rc == 0, err
    assert (home / "runs" / "x" / "marker.txt").read_text() == "ok"
    assert (home / "runs" / "x" / "run.log").exists()  # the console's log followed the expanded MODEL_DIR
    assert os.listdir(cwd) == []  # nothing named `~` in the working directory


def test_tilde_is_expanded_in_every_bound_string(tmp_path, monkeypatch):
    from sentemb_jax.paths import local_path
    from sentemb_jax.run_dir import run_path, write_results

    monkeypatch.setenv("HOME", str(tmp_path))
    gin.parse_config_files_and_bindings([], ["D = '~/data'", "config_errors_test_job.model_dir = ['~/a', {'k': '~'}]"],
                                        finalize_config=True)
    assert gin.query_parameter("D/gin.macro.value") == f"{tmp_path}/data"
    assert gin.query_parameter("config_errors_test_job.model_dir") == [f"{tmp_path}/a", {"k": str(tmp_path)}]
    assert local_path("~/x") == f"{tmp_path}/x" and local_path("gs://b/~x") == "gs://b/~x"
    assert run_path("~/r", "checkpoints") == f"{tmp_path}/r/checkpoints"
    monkeypatch.chdir(tmp_path)
    write_results("~/res", {"a": 1})
    assert (tmp_path / "res" / "results.json").exists() and not (tmp_path / "~").exists()


# ---------------------------------------------------------------------------------------------
# 5. A full, read-only or forbidden disk while saving


class _ClosedLoopCallback:
    """Raises when collected, as orbax's pending writes do once their event loop has closed:
    Python reports it through sys.unraisablehook (the 194 console tracebacks of a full disk)."""

    def __del__(self):
        raise RuntimeError("Event loop is closed")


def _closed_loop_in_a_thread():
    raise RuntimeError("Event loop is closed")


def _flood_then_raise(error):
    def job():
        for _ in range(194):
            _ClosedLoopCallback()  # collected at once: one unraisable exception each
        thread = threading.Thread(target=_closed_loop_in_a_thread)
        thread.start()
        thread.join()
        raise error
    return job


@pytest.mark.parametrize("error, what", [
    (OSError(errno.ENOSPC, "No space left on device", "CKPT"), "no space left on device"),
    (OSError(errno.EACCES, "Permission denied", "CKPT"), "permission denied"),
    (OSError(errno.EROFS, "Read-only file system", "CKPT"), "read-only file system"),
    # tensorstore (orbax's array writer) raises ValueError with the OS error in its text
    (ValueError('RESOURCE_EXHAUSTED: Error writing local file "CKPT": Failed to write 60752 bytes to file 6: No space '
                "left on device [os_error_code='28']"), "no space left on device"),
])
def test_a_failed_save_is_one_line_exit_1(error, what, tmp_path, monkeypatch, capsys):
    model_dir = tmp_path / "run"
    ckpt = str(model_dir / "checkpoints" / "6.orbax-checkpoint-tmp" / "state")
    if isinstance(error, OSError):
        error.filename = ckpt
    else:
        error = ValueError(str(error).replace("CKPT", ckpt))
    monkeypatch.setattr(runner, "run", _flood_then_raise(error))
    rc, err = run_main([f"--gin_file={job_file(tmp_path, str(model_dir))}"], capsys)
    assert rc == 1
    assert err[-1].startswith(f"error: cannot write {ckpt}: {what} ("), err
    assert len(err) <= 2 and err[0].startswith("log: "), err  # the log's place, then the error: no flood
    log = open(err[0][len("log: "):], encoding="utf-8").read()
    assert log.count("Event loop is closed") >= 194  # the library's tracebacks are kept in the log


def test_a_full_disk_names_model_dir_when_the_error_names_no_file(tmp_path, monkeypatch, capsys):
    model_dir = tmp_path / "run"
    monkeypatch.setattr(runner, "run", _flood_then_raise(RuntimeError("write failed: No space left on device")))
    rc, err = run_main([f"--gin_file={job_file(tmp_path, str(model_dir))}"], capsys)
    assert (rc, err[-1].split(" (")[0]) == (1, f"error: cannot write {model_dir}: no space left on device")


# ---------------------------------------------------------------------------------------------
# 6. The free-space check counts what the saves add


GIB = 2**30


def _fake_disk(monkeypatch, free):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100 * GIB, 100 * GIB - free, free))


def _checkpoints(model_dir, kind, steps):
    for step in steps:
        os.makedirs(os.path.join(model_dir, kind, str(step)))


def test_a_resume_with_keep_1_asks_for_one_checkpoint(tmp_path, monkeypatch):
    from sentemb_jax.training.checks import check_disk_space

    run = str(tmp_path / "run")
    _checkpoints(run, "checkpoints", [4])
    os.makedirs(os.path.join(run, "checkpoints", "6.orbax-checkpoint-tmp-123"))  # half-written: not counted
    _fake_disk(monkeypatch, int(1.5 * GIB))
    check_disk_space(run, GIB, keep=1, best=False)  # one more checkpoint fits
    _fake_disk(monkeypatch, GIB // 2)
    with pytest.raises(TrainingError) as e:
        check_disk_space(run, GIB, keep=1, best=False)
    assert str(e.value) == (f"MODEL_DIR {run}: 0.50 GiB free, but 1 checkpoints of this train state (1.00 GiB each) "
                            "need 1.00 GiB (CheckpointConfig.keep=1, 1 checkpoint(s) there; a new checkpoint is written "
                            "before the oldest is deleted): free space, or lower CheckpointConfig.keep")


@pytest.mark.parametrize("keep, present, best, best_present, add", [
    (1, 1, False, 0, 1), (1, 0, False, 0, 2), (3, 0, False, 0, 4), (3, 2, False, 0, 2), (3, 5, False, 0, 1),
    (1, 1, True, 1, 1), (1, 1, True, 0, 2), (3, 0, True, 0, 5),
])
def test_checkpoints_to_add(keep, present, best, best_present, add, tmp_path, monkeypatch):
    from sentemb_jax.training.checks import check_disk_space, checkpoints_to_add

    assert checkpoints_to_add(keep, present, best, best_present) == add
    run = str(tmp_path / "run")
    _checkpoints(run, "checkpoints", range(present))
    _checkpoints(run, "best", range(best_present))
    _fake_disk(monkeypatch, add * GIB)
    check_disk_space(run, GIB, keep=keep, best=best)  # exactly enough
    _fake_disk(monkeypatch, add * GIB - 1)
    with pytest.raises(TrainingError, match=f"but {add} checkpoints of this train state"):
        check_disk_space(run, GIB, keep=keep, best=best)

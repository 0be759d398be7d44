"""sentemb_jax.child_process: a child that dies on a signal is named by the signal, its output kept in
a file of the cache log directory (never outside it, whatever the tag), and nothing printed."""
import os
import signal

from sentemb_jax import child_process


def test_a_child_killed_by_a_signal_is_named_and_its_output_kept(tmp_path, monkeypatch, capfd):
    (tmp_path / "abort_now.py").write_text(
        "import os, resource, signal, sys\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\nprint('abort_now: out', flush=True)\nprint('abort_now: err', file=sys.stderr, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGABRT)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    done, died = child_process.run_module("abort_now", [], "../../gin/a config.gin")
    assert done.returncode == -signal.SIGABRT
    assert died.startswith("died on SIGABRT; its output: ")
    kept = died.split("its output: ")[1]
    logs = tmp_path / "cache" / "sentemb_jax" / "logs"
    assert os.path.dirname(kept) == str(logs) and os.listdir(logs) == [os.path.basename(kept)]
    assert "-.._.._gin_a_config.gin-" in os.path.basename(kept)  # the tag's separators cannot leave the directory
    with open(kept, encoding="utf-8") as f:
        kept_text = f.read()
    assert "abort_now: out\n" in kept_text and "abort_now: err\n" in kept_text
    out, err = capfd.readouterr()
    assert "abort_now" not in out + err


def test_a_child_that_exits_is_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    done, died = child_process.run_module("json.tool", ["--not-an-option"], "tag")
    assert done.returncode == 2 and died is None and "--not-an-option" in done.stderr
    assert not (tmp_path / "cache").exists()


def test_signal_names():
    assert child_process.signal_name(11) == "SIGSEGV"
    assert child_process.signal_name(6) == "SIGABRT"
    assert child_process.signal_name(99) == "signal 99"  # no such member: named by its number, no ValueError

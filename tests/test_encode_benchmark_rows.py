"""benchmarks.encode_throughput --only: which rows run and which ONNX graphs are exported for them
(a run on a borrowed machine names a few rows; each graph export costs ~10 s on 2 cores)."""
from __future__ import annotations

import os
import types

import pytest

from sentemb_jax.benchmarks import encode_throughput as bench


def _on_cpu(name):
    """select_benchmark_device without its process-wide settings (JAX platform, compilation cache)."""
    import jax

    return "cpu", jax.devices("cpu")


def test_the_flags_select_their_rows_and_only_selects_named_rows_plus_the_baseline():
    assert bench._kinds(False, False, None) == ["sentemb_jax", "sentemb_jax_packed", "sentence_transformers"]
    assert bench._kinds(True, True, None) == [k for k in bench.ALL_KINDS
                                              if k not in bench.ST_BACKEND_KINDS and k not in bench.AUTOCAST_KINDS]
    assert bench._kinds(True, True, None, "/env/bin/python") == [k for k in bench.ALL_KINDS if k not in bench.AUTOCAST_KINDS]
    assert bench._kinds(False, False, "sentence_transformers_autocast_bf16") == [  # --bf16 adds it on a GPU only
        "sentence_transformers", "sentence_transformers_autocast_bf16"]
    assert bench._kinds(False, False, " sentemb_jax_openvino_bf16_packed,sentemb_jax_packed ") == [
        "sentemb_jax_packed", "sentence_transformers", "sentemb_jax_openvino_bf16_packed"]
    with pytest.raises(ValueError, match=r"\['openvino'\]: unknown rows"):
        bench._kinds(False, False, "sentemb_jax,openvino")


def test_an_unknown_row_is_a_usage_error_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--only", "sentemb_jax_packed,openvino", "--data_dir", "/no/such/dir"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--only ['openvino']: unknown rows; choose from sentemb_jax, sentemb_jax_packed" in err


@pytest.mark.parametrize("rows, exports, keys", [
    (["sentemb_jax_openvino_bf16_packed"], [(None, True)], {"packed_f32"}),
    (["sentemb_jax_onnx_int8_packed", "sentemb_jax_openvino_packed"], [("int8", True)], {"packed_f32", "packed_int8"}),
    (["sentemb_jax_onnx", "sentemb_jax_onnx_int8_packed"], [(None, False), ("int8", True)], {"f32", "packed_f32", "packed_int8"}),
    (["sentemb_jax_packed"], [], set()),
])
def test_only_the_graphs_the_rows_run_are_exported(monkeypatch, tmp_path, rows, exports, keys):
    from sentemb_jax.onnx_export import graph_path  # the onnx extra: imported by this test only

    calls = []

    def export_onnx(encoder, out_dir, quantize=None, packed=False):
        calls.append((quantize, packed))
        return graph_path(out_dir, packed, quantize)

    monkeypatch.setattr(bench, "_onnx_export", lambda: types.SimpleNamespace(export_onnx=export_onnx, graph_path=graph_path))
    monkeypatch.setattr(bench.SentenceEncoder, "from_pretrained", classmethod(lambda cls, path: object()))
    paths = bench._export_graphs("model_dir", ["sentence_transformers", *rows], str(tmp_path))
    assert calls == exports
    assert set(paths) == keys
    assert all(os.path.basename(p) == {"f32": "model.onnx", "int8": "model_qint8.onnx", "packed_f32": "model_packed.onnx",
                                       "packed_int8": "model_packed_qint8.onnx"}[k] for k, p in paths.items())


def test_sentence_transformers_backend_rows_need_another_python():
    assert bench._kinds(False, False, None, "/env/bin/python")[3:] == list(bench.ST_BACKEND_KINDS)
    assert bench._kinds(False, False, "sentence_transformers_onnx_int8", "/env/bin/python") == [
        "sentence_transformers", "sentence_transformers_onnx_int8"]
    with pytest.raises(ValueError, match=r"\['sentence_transformers_onnx_int8'\]: these rows need --st_python"):
        bench._kinds(False, False, "sentence_transformers_onnx_int8")


def test_the_sentence_transformers_backend_worker_keeps_its_protocol_clean(tmp_path):
    """What the libraries print to stdout (Python or native) goes to stderr, not into the protocol;
    the STS-B figure is the Spearman of the model's cosines."""
    import json
    import subprocess
    import sys

    data = tmp_path / "data.json"
    data.write_text(json.dumps({"sentences": ["a", "b", "c"], "s1": ["a", "b", "c"], "s2": ["a", "c", "b"], "gold": [5.0, 1.0, 2.0]}))
    code = f"""
import os, sys, numpy as np
sys.path.insert(0, {os.path.dirname(bench.ST_BACKEND_WORKER)!r})
import st_backend_worker as w
class Model:
    def encode(self, texts, batch_size=64, normalize_embeddings=False, show_progress_bar=None):
        print("a library line on stdout")
        os.write(1, b"a native line on fd 1\\n")
        return np.array([{{"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [0.6, 0.8]}}[t] for t in texts])
w.load = lambda kind, model_dir, threads, work_dir: Model()
w.main(["sentence_transformers_onnx", "unused", "2", "64", {str(data)!r}])
"""
    out = subprocess.run([sys.executable, "-c", code], input="run\nrun\nstop\n", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 3 and isinstance(lines[1], float) and isinstance(lines[2], float)
    ready = lines[0]["ready"]
    # cosines: a·a = 1, b·c = 0.8, c·b = 0.8 against gold 5, 1, 2: ranks (3, 1.5, 1.5) vs (3, 1, 2)
    assert ready["stsb_test"] == pytest.approx(100 * 0.8660254, abs=1e-5)
    assert "a library line on stdout" in out.stderr and "a native line on fd 1" in out.stderr


def test_xla_flags_reach_a_fresh_process_and_come_too_late_once_xla_has_started(tmp_path):
    """--xla_flags workers set XLA_FLAGS before their backend starts: the flags act (--xla_dump_to writes
    the compiled module there) beside the ones already set; after the start they would do nothing: refused."""
    import subprocess
    import sys

    import jax.numpy as jnp

    dump = tmp_path / "dump"
    code = (f"from sentemb_jax.benchmarks import encode_throughput as b; b.set_xla_flags('--xla_dump_to={dump}'); "
            "import os, jax; jax.jit(lambda x: x * 3)(1.0).block_until_ready(); print(os.environ['XLA_FLAGS'])")
    env = {**os.environ, "XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"--xla_cpu_enable_fast_math=false --xla_dump_to={dump}"
    assert any(p.name.endswith(".txt") for p in dump.iterdir())
    jnp.zeros(1).block_until_ready()  # this process's backend has started
    with pytest.raises(RuntimeError, match="come too late: this process's XLA backend has started"):
        bench.set_xla_flags("--xla_cpu_enable_fast_math=false")


def test_flags_xla_refuses_are_a_usage_error_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--xla_flags=--xla_cpu_no_such_flag=1", "--data_dir", "/no/such/dir"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--xla_flags=--xla_cpu_no_such_flag=1: XLA refused them:" in err and "--xla_cpu_no_such_flag" in err.split("them:")[1]
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--xla_flags=--xla_cpu_use_onednn=true", "--xla_flags=--xla_cpu_use_onednn=true"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("the same flags twice would be one row")


def test_each_xla_flags_value_is_one_more_packed_jax_row_beside_the_others(monkeypatch, capsys):
    seen = {}

    def side_by_side(workers, rounds, count=1, startup=None, start_together=False):
        seen.update(workers)
        startup.update({n: {"first_call_s": 1.0, "stsb_test": 82.0} for n in workers})
        return {n: {"sentemb_jax_packed": 500.0, "sentence_transformers": 400.0}.get(n, 550.0) for n in workers}

    monkeypatch.setattr(bench, "run_side_by_side", side_by_side)
    monkeypatch.setattr(bench, "check_xla_flags", lambda flags: None)
    monkeypatch.setattr(bench, "select_benchmark_device", _on_cpu)  # it would set this process's JAX platform for good
    bench.main(["--only", "sentemb_jax_packed", "--xla_flags=--xla_cpu_use_onednn=true", "--xla_flags=--a=1 --b=2"])
    assert list(seen) == ["sentemb_jax_packed", "sentence_transformers", "sentemb_jax_packed[--xla_cpu_use_onednn=true]",
                          "sentemb_jax_packed[--a=1 --b=2]"]
    # the same worker and arguments as the default row, with the flags as its last argument
    for name, flags in [("sentemb_jax_packed", ""), ("sentemb_jax_packed[--a=1 --b=2]", "--a=1 --b=2")]:
        assert seen[name][0] is bench._worker and seen[name][1][0] == "sentemb_jax_packed" and seen[name][1][-1] == flags
    assert seen["sentemb_jax_packed"][1][1:-1] == seen["sentemb_jax_packed[--a=1 --b=2]"][1][1:-1]
    out = capsys.readouterr().out.splitlines()
    assert "sentemb_jax_packed[--a=1 --b=2] / sentemb_jax_packed = 1.10" in out
    assert out[-1] == "ratio_vs_sentence_transformers=1.25"  # the headline stays the default configuration's

    # With the bf16 packed row selected, each flag value repeats it too, with its own ratio line.
    seen.clear()
    bench.main(["--only", "sentemb_jax_bf16_packed", "--xla_flags=--a=1"])
    assert list(seen) == ["sentence_transformers", "sentemb_jax_bf16_packed", "sentemb_jax_packed[--a=1]",
                          "sentemb_jax_bf16_packed[--a=1]"]
    assert seen["sentemb_jax_bf16_packed[--a=1]"][1][0] == "sentemb_jax_bf16_packed"
    assert seen["sentemb_jax_bf16_packed[--a=1]"][1][1:-1] == seen["sentemb_jax_bf16_packed"][1][1:-1]
    assert seen["sentemb_jax_bf16_packed[--a=1]"][1][-1] == "--a=1"
    out = capsys.readouterr().out.splitlines()
    assert "sentemb_jax_bf16_packed[--a=1] / sentemb_jax_bf16_packed = 1.00" in out


def test_texts_of_your_own_file_are_timed_and_a_bad_file_is_named_before_any_work(monkeypatch, capsys, tmp_path, data_dir):
    """--texts FILE.tsv: every worker encodes that column, in file order, and the rate counts its texts;
    the quality column is still STS-B test. A missing file, a header without the column, an empty
    text or no rows: exit 1 with the file (and line) named, before the machine line or any worker."""
    seen = {}

    def side_by_side(workers, rounds, count=1, startup=None, start_together=False):
        seen.update(workers=workers, count=count)
        startup.update({n: {"first_call_s": 1.0, "stsb_test": 82.0} for n in workers})
        return {n: 100.0 for n in workers}

    monkeypatch.setattr(bench, "run_side_by_side", side_by_side)
    monkeypatch.setattr(bench, "select_benchmark_device", _on_cpu)
    good = tmp_path / "mine.tsv"
    good.write_text("id\ttext\n7\tthe first text\n\n8\ta second, longer text\n", encoding="utf-8")
    bench.main(["--only", "sentemb_jax_packed", "--texts", str(good), "--texts_column", "text", "--data_dir", data_dir])
    assert list(seen["workers"]) == ["sentemb_jax_packed", "sentence_transformers"]
    for _, args in seen["workers"].values():
        assert args[3] == ["the first text", "a second, longer text"]  # (kind, model, data_dir, texts, ...)
    assert seen["count"] == 2
    assert any(f" texts={good}:text sentences=2 " in line for line in capsys.readouterr().out.splitlines())

    seen.clear()
    monkeypatch.setattr(bench, "device_description", lambda devices: pytest.fail("work began before the texts were checked"))
    missing, no_column, empty, header_only = (tmp_path / n for n in ("missing.tsv", "b.tsv", "c.tsv", "d.tsv"))
    no_column.write_text("text\nsome text\n", encoding="utf-8")
    empty.write_text("sentence\tlabel\nfine\t1\n \t0\n", encoding="utf-8")
    header_only.write_text("sentence\tlabel\n", encoding="utf-8")
    for path, message in [(missing, f"{missing}: no such file"),
                          (no_column, f"{no_column}:1: header ['text'] lacks column(s) ['sentence']"),
                          (empty, f"{empty}:3: empty text in column 'sentence' (the benchmark times real texts)"),
                          (header_only, f"{header_only}: no rows under the header: nothing to encode")]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main(["--only", "sentemb_jax_packed", "--texts", str(path), "--data_dir", data_dir])
        assert exit_info.value.code == f"error: {message}"  # sys.exit(str): exit status 1, the message last on stderr
    assert not seen

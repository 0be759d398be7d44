"""Every configured number, choice and path is checked before any work.

Each case runs the job runner in-process (or calls the API) and checks the exit code and the exact
`error:` line: a number / choice out of range or a path out of its root -> exit 2 naming the gin
binding (or API argument) and what is allowed; an undefined score -> exit 1 saying why. No model
is loaded: every case stops before that (the model directories only have to exist).
"""
import json
import math
import os

import numpy as np
import pytest
from run_utils import gin_file_args

import gin
from sentemb_jax import main as runner
from sentemb_jax.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_job(gin_file, *bindings, capsys):
    """(exit code, the `error:` line without its prefix) of an in-process job."""
    gin.clear_config()
    rc = runner.main([*gin_file_args(gin_file), *[f"--gin.{b}" for b in bindings]])
    err = capsys.readouterr().err.strip().splitlines()
    last = err[-1] if err else ""
    assert rc == 0 or last.startswith("error: "), err
    return rc, last[len("error: "):]


@pytest.fixture
def model_dir(tmp_path):
    return str(tmp_path / "run")


def assert_untouched(model_dir):
    """Nothing of a run was started: no checkpoints, no run record (run.log is the console's log)."""
    left = set(os.listdir(model_dir)) if os.path.isdir(model_dir) else set()
    assert left <= {"run.log"}, left


# ---------------------------------------------------------------------------------------------
# 1. Numbers and choices: exit 2, the gin binding and the allowed range, before any model loads

B = "gin binding sentemb_jax"
TRAIN_CASES = [
    ("sentemb_jax.DataConfig.batch_size=0", f"{B}.DataConfig.batch_size = 0: must be an integer >= 1"),
    ("sentemb_jax.DataConfig.batch_size=-4", f"{B}.DataConfig.batch_size = -4: must be an integer >= 1"),
    ("sentemb_jax.RunConfig.num_steps=0", f"{B}.RunConfig.num_steps = 0: must be an integer >= 1"),
    ("NUM_STEPS=-5", f"{B}.RunConfig.num_steps = %NUM_STEPS = -5: must be an integer >= 1"),
    ("sentemb_jax.DataConfig.sequence_length=1", f"{B}.DataConfig.sequence_length = 1: must be an integer >= 2"),
    ("sentemb_jax.CheckpointConfig.every=0", f"{B}.CheckpointConfig.every = 0: must be an integer >= 1"),
    ("sentemb_jax.CheckpointConfig.keep=0", f"{B}.CheckpointConfig.keep = 0: must be an integer >= 1"),
    ("sentemb_jax.EvalConfig.every=0", f"{B}.EvalConfig.every = 0: must be None (no evaluation) or an integer >= 1"),
    ("sentemb_jax.RunConfig.log_every=-1", f"{B}.RunConfig.log_every = -1: must be an integer >= 1"),
    ("sentemb_jax.RunConfig.time_budget_s=0", f"{B}.RunConfig.time_budget_s = 0: must be None (no budget) or a finite number > 0"),
    ("sentemb_jax.RunConfig.time_budget_s=1e999", f"{B}.RunConfig.time_budget_s = inf: must be None (no budget) or a finite number > 0"),
    ("sentemb_jax.DataConfig.seed=-1", f"{B}.DataConfig.seed = -1: must be an integer in [0, 2147483647]"),
    (f"sentemb_jax.DataConfig.seed={2**40}", f"{B}.DataConfig.seed = {2**40}: must be an integer in [0, 2147483647]"),
    ("sentemb_jax.RunConfig.skip_nonfinite=-1", f"{B}.RunConfig.skip_nonfinite = -1: must be an integer >= 0"),
    ("sentemb_jax.TowerConfig.init_layers=0", f"{B}.TowerConfig.init_layers = 0: must be None (every layer) or an integer >= 1"),
    ("sentemb_jax.RunConfig.prng_impl='fast'", f"{B}.RunConfig.prng_impl = 'fast': must be one of ('threefry2x32', 'rbg', 'unsafe_rbg')"),
    ("sentemb_jax.RunConfig.matmul_precision='tf32'", f"{B}.RunConfig.matmul_precision = 'tf32': must be one of "
     "('default', 'high', 'highest')"),
    ("sentemb_jax.TowerConfig.pooling=['avg']", f"{B}.TowerConfig.pooling = ['avg']: must be None (the model's own) or modes from "),
    ("sentemb_jax.DataConfig.task=''", f"{B}.DataConfig.task = '': must be a task name (a string, e.g. 'nli_triples')"),
    ("sentemb_jax.DataConfig.views=('none', 'shuffle')", f"{B}.DataConfig.views = ('none', 'shuffle'): unknown view 'shuffle'; "),
    # The optimizer and schedule: checked when the run configuration is made, before any model loads.
    ("sentemb_jax.ScheduleConfig.peak='abc'", "gin configuration error: sentemb_jax.ScheduleConfig.peak = 'abc': expected float"),
    ("sentemb_jax.ScheduleConfig.peak=-0.001", f"{B}.ScheduleConfig.peak = -0.001: must be a finite number >= 0"),
    ("sentemb_jax.ScheduleConfig.peak=1e999", f"{B}.ScheduleConfig.peak = inf: must be a finite number >= 0"),
    ("sentemb_jax.OptimizerConfig.name='sgd'", f"{B}.OptimizerConfig.name = 'sgd': must be one of ('adafactor', 'adamw')"),
    ("sentemb_jax.OptimizerConfig.clip_norm=0", f"{B}.OptimizerConfig.clip_norm = 0: must be None (no clipping) or a finite number > 0"),
    ("sentemb_jax.OptimizerConfig.weight_decay=-0.1", f"{B}.OptimizerConfig.weight_decay = -0.1: must be a finite number >= 0"),
    ("sentemb_jax.ScheduleConfig.warmup_steps=-1", f"{B}.ScheduleConfig.warmup_steps = -1: must be an integer >= 0"),
    ("sentemb_jax.ScheduleConfig.warmup_steps=500", f"{B}.ScheduleConfig.warmup_steps = 500: must be <= the schedule's 200 "
     "steps (RunConfig.num_steps or total_steps)"),
    ("sentemb_jax.ScheduleConfig.total_steps=0", f"{B}.ScheduleConfig.total_steps = 0: must be None (the run's num_steps) or "
     "an integer >= 1"),
    ("sentemb_jax.ScheduleConfig.decay='cosine'", f"{B}.ScheduleConfig.decay = 'cosine': must be one of ('linear', 'constant')"),
    ("sentemb_jax.ScheduleConfig.warmup_fraction=1.5", f"{B}.ScheduleConfig.warmup_fraction = 1.5: must be None or a number in [0, 1)"),
    ("sentemb_jax.DataConfig.sequence_length=1024", f"{B}.DataConfig.sequence_length = 1024: must be an integer in [2, 512]: "),
    ("sentemb_jax.MeshConfig.fsdp=0", f"{B}.MeshConfig.fsdp = 0: must be an integer >= 1"),
    ("sentemb_jax.MeshConfig.data=0", f"{B}.MeshConfig.data = 0: must be -1 (the devices left over) or an integer >= 1"),
    ("sentemb_jax.MeshConfig.data=64", "mesh data=64 x fsdp=1 x model=1 = 64 devices, but JAX finds 1 CPU device(s) "
     f"({B}.MeshConfig.data = 64; data=-1 takes the devices left over)"),
    ("sentemb_jax.MeshConfig.fsdp=3", "mesh fsdp=3 x model=1 does not divide the 1 CPU device(s) JAX finds "
     f"({B}.MeshConfig.fsdp = 3; lower fsdp / model, or run on more devices)"),
    ("sentemb_jax.Contrastive.temperature=0.0", f"{B}.Contrastive.temperature = 0.0: must be a finite number > 0"),
    ("sentemb_jax.Contrastive.temperature=-0.05", f"{B}.Contrastive.temperature = -0.05: must be a finite number > 0"),
    ("sentemb_jax.Contrastive.label_smoothing=1.0", f"{B}.Contrastive.label_smoothing = 1.0: must be a number in [0, 1)"),
    ("sentemb_jax.Contrastive.chunk_size=0", f"{B}.Contrastive.chunk_size = 0: must be None (whole batch) or an integer >= 1"),
]


@pytest.mark.parametrize("binding, message", TRAIN_CASES, ids=[c[0].split("sentemb_jax.")[-1] for c in TRAIN_CASES])
def test_train_numbers_exit_2_naming_the_binding(binding, message, model_dir, capsys):
    rc, err = run_job("gin/runs/minilm_nli.gin", f"MODEL_DIR='{model_dir}'", binding, capsys=capsys)
    assert rc == 2
    assert err.startswith(message) if message.endswith(" ") else err == message, err
    assert_untouched(model_dir)


def test_a_number_set_through_a_macro_names_the_macro(tmp_path, model_dir, capsys):
    cfg = tmp_path / "job.gin"
    cfg.write_text(f"include '{REPO}/gin/models/minilm_l6.gin'\ninclude '{REPO}/gin/runs/minilm_nli.gin'\n"
                   "STEPS = -3\nsentemb_jax.RunConfig.num_steps = %STEPS\n")
    rc, err = run_job(str(cfg), f"MODEL_DIR='{model_dir}'", capsys=capsys)
    assert (rc, err) == (2, "gin binding sentemb_jax.RunConfig.num_steps = %STEPS = -3: must be an integer >= 1")


def test_a_scoped_train_names_its_scope(tmp_path, model_dir, capsys):
    cfg = tmp_path / "job.gin"
    cfg.write_text(f"include '{REPO}/gin/models/minilm_l6.gin'\ninclude '{REPO}/gin/runs/minilm_nli.gin'\n"
                   "run.job = @stage1/sentemb_jax.train\n"
                   "stage1/sentemb_jax.DataConfig.batch_size = 0\n")
    rc, err = run_job(str(cfg), f"MODEL_DIR='{model_dir}'", capsys=capsys)
    assert (rc, err) == (2, "gin binding stage1/sentemb_jax.DataConfig.batch_size = 0: must be an integer >= 1")


Q = "gin binding sentemb_jax.ConGen"


@pytest.mark.parametrize("binding, message", [
    ("sentemb_jax.ConGen.queue_size=0", f"{Q}.queue_size = 0: must be an integer >= 1"),
    ("sentemb_jax.ConGen.teacher_temperature=0.0", f"{Q}.teacher_temperature = 0.0: must be a finite number > 0"),
    ("sentemb_jax.ConGen.student_temperature=-1.0", f"{Q}.student_temperature = -1.0: must be a finite number > 0"),
    ("sentemb_jax.ConGen.teacher_batch_size=0", f"{Q}.teacher_batch_size = 0: must be an integer >= 1"),
    ("sentemb_jax.ConGen.teacher_weights=(1.0, 2.0)", f"{Q}.teacher_weights = (1.0, 2.0): must be None "
     "(uniform) or 1 finite weights >= 0 with a positive sum, one per teacher"),
])
def test_queue_distill_numbers_exit_2(binding, message, model_dir, capsys):
    rc, err = run_job("gin/runs/congen_cpu.gin", f"MODEL_DIR='{model_dir}'", binding, capsys=capsys)
    assert (rc, err) == (2, message)
    assert_untouched(model_dir)


@pytest.mark.parametrize("gin_file, binding, message", [
    ("gin/runs/eval_stsb_dev.gin", "sentemb_jax.evaluate_stsb.batch_size=0",
     "gin binding sentemb_jax.evaluate_stsb.batch_size = 0: must be an integer >= 1"),
    ("gin/runs/eval_sts.gin", "sentemb_jax.eval_sts.batch_size=-8",
     "gin binding sentemb_jax.eval_sts.batch_size = -8: must be an integer >= 1"),
    ("gin/runs/eval_transfer.gin", "sentemb_jax.eval_transfer.kfold=1",
     "gin binding sentemb_jax.eval_transfer.kfold = 1: must be an integer >= 2"),
    ("gin/runs/eval_transfer.gin", "sentemb_jax.eval_transfer.seed=-2",
     "gin binding sentemb_jax.eval_transfer.seed = -2: must be an integer in [0, 2147483647]"),
    ("gin/runs/eval_transfer.gin", "sentemb_jax.eval_transfer.tasks=['MR', 'XX']",
     "gin binding sentemb_jax.eval_transfer.tasks = ['MR', 'XX']: must be a non-empty list of names from "
     "('MR', 'CR', 'SUBJ', 'MPQA', 'SST2', 'TREC'); unknown: ['XX']"),
    ("gin/runs/eval_transfer.gin", "sentemb_jax.eval_transfer.tasks=[]",
     "gin binding sentemb_jax.eval_transfer.tasks = []: must be a non-empty list of names from "
     "('MR', 'CR', 'SUBJ', 'MPQA', 'SST2', 'TREC')"),
    ("gin/runs/data_summary.gin", "sentemb_jax.DataConfig.batch_size=0",
     "gin binding sentemb_jax.DataConfig.batch_size = 0: must be an integer >= 1"),
])
def test_eval_and_data_jobs_numbers_exit_2(gin_file, binding, message, tmp_path, data_dir, capsys):
    rc, err = run_job(gin_file, f"MODEL_DIR='{tmp_path / 'out'}'", f"DATA_DIR='{data_dir}'", binding, capsys=capsys)
    assert (rc, err) == (2, message)
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.parametrize("gin_file, binding, message", [
    ("gin/runs/minilm_nli.gin", "sentemb_jax.DataConfig.on_bad_row='ignore'",
     "gin binding sentemb_jax.DataConfig.on_bad_row = 'ignore': must be one of ('error', 'skip')"),
    ("gin/runs/congen_cpu.gin", "sentemb_jax.DataConfig.augment_rate=1.5",
     "gin binding sentemb_jax.DataConfig.augment_rate = 1.5: must be a number in [0, 1)"),
    ("gin/runs/minilm_nli.gin", "sentemb_jax.DataConfig.sts_score_range=(5.0, 0.0)",
     "gin binding sentemb_jax.DataConfig.sts_score_range = (5.0, 0.0): must be (low, high), two finite "
     "numbers with low < high"),
    ("gin/default.gin", "sentemb_jax.distill_report.student_layers=0",
     "gin binding sentemb_jax.TowerConfig.init_layers = %STUDENT_LAYERS = 0: must be None (every layer) or an integer >= 1"),
    ("gin/runs/ensemble_distill_cpu.gin", "sentemb_jax.ensemble_distill.weight_temperature=0.0",
     "gin binding sentemb_jax.ensemble_distill.weight_temperature = 0.0: must be a finite number > 0"),
    ("gin/runs/ensemble_distill_cpu.gin", "sentemb_jax.ensemble_distill.weighting='max'",
     "gin binding sentemb_jax.ensemble_distill.weighting = 'max': must be one of ('uniform', 'softmax')"),
])
def test_data_and_pipeline_job_numbers_exit_2(gin_file, binding, message, model_dir, data_dir, capsys):
    extra = ["STUDENT_LAYERS=0"] if "student_layers" in binding else [binding]
    rc, err = run_job(gin_file, f"MODEL_DIR='{model_dir}'", f"DATA_DIR='{data_dir}'", *extra, capsys=capsys)
    assert (rc, err) == (2, message)
    assert_untouched(model_dir)


@pytest.mark.parametrize("binding, message", [
    ("bi_to_cross/sentemb_jax.DistillPhase.batch_size=0",
     "gin binding bi_to_cross/sentemb_jax.DistillPhase.batch_size = 0: must be an integer >= 1"),
    ("cross_to_bi/sentemb_jax.DistillPhase.learning_rate=-5e-05",
     "gin binding cross_to_bi/sentemb_jax.DistillPhase.learning_rate = -5e-05: must be a finite number > 0"),
    ("sentemb_jax.MeshConfig.model=2", "mesh fsdp=1 x model=2 does not divide the 1 CPU device(s) JAX finds "
     "(gin binding sentemb_jax.MeshConfig.model = 2; lower fsdp / model, or run on more devices)"),
    ("sentemb_jax.trans_encoder.cycles=0", "gin binding sentemb_jax.trans_encoder.cycles = 0: must be an integer >= 1"),
])
def test_trans_encoder_numbers_exit_2(binding, message, model_dir, data_dir, capsys):
    rc, err = run_job("gin/runs/trans_encoder_sts_cpu.gin", f"MODEL_DIR='{model_dir}'", f"DATA_DIR='{data_dir}'",
                      binding, capsys=capsys)
    assert (rc, err) == (2, message)
    assert_untouched(model_dir)


def test_trans_encoder_relative_pair_files_stay_under_data_dir(model_dir, data_dir, capsys):
    rc, err = run_job("gin/runs/trans_encoder_sts_cpu.gin", f"MODEL_DIR='{model_dir}'", f"DATA_DIR='{data_dir}'",
                      "sentemb_jax.trans_encoder.pair_files=['stsb/train.tsv', '../../etc/passwd']", capsys=capsys)
    assert (rc, err) == (2, f"gin binding sentemb_jax.trans_encoder.pair_files = '../../etc/passwd': a relative path "
                            f"must stay under data_dir {data_dir} (it resolves to "
                            f"{os.path.normpath(os.path.join(data_dir, '../../etc/passwd'))}); give an absolute path "
                            "for a file elsewhere")
    assert_untouched(model_dir)


def test_export_max_length_exit_2(tmp_path, minilm_dir, capsys):
    out = tmp_path / "export"
    rc, err = run_job("gin/runs/export_savedmodel.gin", f"MODEL_PATH='{minilm_dir}'", f"EXPORT_DIR='{out}'",
                      "sentemb_jax.export_savedmodel.max_length=0", capsys=capsys)
    assert (rc, err) == (2, "gin binding sentemb_jax.export_savedmodel.max_length = 0: must be None (the model's own) "
                            "or an integer >= 1")
    assert not out.exists()


def test_numbers_given_through_the_api_name_the_argument(tmp_path):
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.methods.queue_distill import SCT
    from sentemb_jax.training.config import DataConfig, OptimizerConfig, RunConfig, ScheduleConfig, TowerConfig

    tower = TowerConfig(init_from=str(tmp_path))
    cases = [
        (lambda: RunConfig(model_dir=str(tmp_path / "r"), num_steps=10, model=tower, data=DataConfig(batch_size=0)),
         "sentemb_jax.DataConfig(batch_size=0): must be an integer >= 1"),
        (lambda: RunConfig(model_dir=str(tmp_path / "r"), num_steps=0, model=tower),
         "sentemb_jax.RunConfig(num_steps=0): must be an integer >= 1"),
        (lambda: RunConfig(model_dir=str(tmp_path / "r"), num_steps=10, model="/path"),
         "sentemb_jax.RunConfig(model='/path'): must be a TowerConfig (e.g. @sentemb_jax.TowerConfig(); gin/models/*.gin)"),
        (lambda: TowerConfig(), "sentemb_jax.TowerConfig(init_from=None): give a model directory (init_from) or, to train "
         "from scratch, tokenizer_dir and a backbone"),
        (lambda: OptimizerConfig(clip_norm=float("nan")),
         "sentemb_jax.OptimizerConfig(clip_norm=nan): must be None (no clipping) or a finite number > 0"),
        (lambda: OptimizerConfig(multiply_by_parameter_scale=1),
         "sentemb_jax.OptimizerConfig(multiply_by_parameter_scale=1): must be True or False"),
        (lambda: ScheduleConfig(peak=float("nan")), "sentemb_jax.ScheduleConfig(peak=nan): must be a finite number >= 0"),
        (lambda: SCT(queue_size=0), "sentemb_jax.SCT(queue_size=0): must be an integer >= 1"),
        (lambda: SCT(online_temperature=float("inf")), "sentemb_jax.SCT(online_temperature=inf): must be a finite number > 0"),
        (lambda: SentenceEncoder.encode(SentenceEncoder.__new__(SentenceEncoder), ["a"], batch_size=2.5),
         "SentenceEncoder.encode: batch_size must be an integer >= 1, got 2.5"),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value) == message
    assert not (tmp_path / "r").exists()


def test_a_home_path_is_expanded(tmp_path):
    from sentemb_jax.training.config import RunConfig, TowerConfig

    config = RunConfig(model_dir="~/runs/x", num_steps=1, model=TowerConfig(init_from="~/models/m"))
    assert config.model_dir == os.path.expanduser("~/runs/x") and not config.model_dir.startswith("~")
    assert config.model.init_from == os.path.expanduser("~/models/m")


# ---------------------------------------------------------------------------------------------
# 2. run.job must be a reference to a job


@pytest.mark.parametrize("binding, message", [
    ("run.job='evaluate_stsb'", "gin binding run.job = 'evaluate_stsb' is a str, not a job: "
     "write run.job = @sentemb_jax.evaluate_stsb (a reference to the job, with @)"),
    ("run.job='sentemb_jax.eval_sts'", "gin binding run.job = 'sentemb_jax.eval_sts' is a str, not a job: "
     "write run.job = @sentemb_jax.eval_sts (a reference to the job, with @)"),
    ("run.job='nosuch'", "gin binding run.job = 'nosuch' is a str, not a job: "
     "write run.job = @sentemb_jax.<job>, e.g. @sentemb_jax.evaluate_stsb (a reference to the job, with @)"),
    ("run.job=3", "gin binding run.job = 3 is a int, not a job: "
     "write run.job = @sentemb_jax.<job>, e.g. @sentemb_jax.evaluate_stsb (a reference to the job, with @)"),
    ("run.job=None", "gin binding run.job = None is a NoneType, not a job: "
     "write run.job = @sentemb_jax.<job>, e.g. @sentemb_jax.evaluate_stsb (a reference to the job, with @)"),
    # @job() would run the job while run's arguments are read (then fail on its result): refused first.
    ("run.job=@sentemb_jax.evaluate_stsb()", "gin binding run.job = @sentemb_jax.evaluate_stsb(): the parentheses "
     "would run the job while run's arguments are read; write run.job = @sentemb_jax.evaluate_stsb (no parentheses)"),
])
def test_a_job_that_is_not_a_reference_exits_2(binding, message, tmp_path, data_dir, capsys):
    rc, err = run_job("gin/runs/eval_stsb_dev.gin", f"DATA_DIR='{data_dir}'",
                      f"sentemb_jax.evaluate_stsb.model_dir='{tmp_path / 'out'}'", binding, capsys=capsys)
    assert (rc, err) == (2, message)
    assert not (tmp_path / "out").exists()


def test_a_job_string_through_a_macro(tmp_path, capsys):
    cfg = tmp_path / "job.gin"
    cfg.write_text("JOB = 'eval_sts'\nrun.job = %JOB\n")
    rc, err = run_job(str(cfg), capsys=capsys)
    assert (rc, err) == (2, "gin binding run.job = %JOB = 'eval_sts' is a str, not a job: "
                            "write run.job = @sentemb_jax.eval_sts (a reference to the job, with @)")


# ---------------------------------------------------------------------------------------------
# 3. An undefined score says why (no `nan`)


def _stsb_dir(tmp_path, rows):
    d = tmp_path / "data"
    (d / "stsb").mkdir(parents=True)
    lines = ["sentence1\tsentence2\tscore"] + [f"{a}\t{b}\t{s}" for a, b, s in rows]
    (d / "stsb" / "dev.tsv").write_text("\n".join(lines) + "\n")
    return d


@pytest.mark.parametrize("rows, why", [
    ([], "correlation undefined: 0 pair(s) to score (an empty split?); it needs at least 2"),
    ([("a b", "c d", 2.0)], "correlation undefined: 1 pair(s) to score (an empty split?); it needs at least 2"),
    ([("a", "b", 3.0), ("c", "d", 3.0), ("e", "f", 3.0)],
     "correlation undefined: every one of the 3 gold scores is 3 (constant gold scores have no ranking to correlate with)"),
])
def test_evaluate_stsb_undefined_score_exits_1_before_the_model_loads(rows, why, tmp_path, minilm_dir, capsys):
    d = _stsb_dir(tmp_path, rows)
    rc, err = run_job("gin/runs/eval_stsb_dev.gin", f"DATA_DIR='{d}'", f"MODEL_PATH='{minilm_dir}'", capsys=capsys)
    assert (rc, err) == (1, f"STS-B dev ({d}/stsb/dev.tsv): {why}")


class _Constant:
    def encode(self, sentences, batch_size=64, **kwargs):
        return np.ones((len(sentences), 4), np.float32)


class _NaN:
    def encode(self, sentences, batch_size=64, **kwargs):
        return np.full((len(sentences), 4), np.nan, np.float32)


def test_constant_or_nan_predictions_say_why():
    from sentemb_jax.errors import UndefinedScoreError
    from sentemb_jax.evaluation.pairs import pair_auc
    from sentemb_jax.evaluation.sts import ScoredPairs, correlations, evaluate_sts_pairs

    s1, s2, gold = ["a", "b", "c"], ["d", "e", "f"], [1.0, 2.0, 3.0]
    cases = [
        (lambda: evaluate_sts_pairs(_Constant(), s1, s2, gold, name="STS-B dev"),
         "STS-B dev: score undefined: the model gives all 3 pairs the same score (1); constant predictions have no "
         "ranking (a collapsed model?)"),
        (lambda: evaluate_sts_pairs(_NaN(), s1, s2, gold, name="STS-B dev"),
         "STS-B dev: score undefined: 3 of the 3 model scores are NaN / inf (NaN embeddings?)"),
        (lambda: correlations(np.array([0.1, 0.2]), np.array([1.0, float("nan")]), "x.tsv"),
         "x.tsv: correlation undefined: 1 gold score(s) are NaN / inf"),
        (lambda: ScoredPairs("MSRpar", np.array([0.5, 0.5]), np.array([1.0, 2.0])).correlations(),
         "MSRpar: score undefined: the model gives all 2 pairs the same score (0.5); constant predictions have no "
         "ranking (a collapsed model?)"),
        (lambda: pair_auc([0.1, 0.2, 0.3], [1, 1, 1], "mrpc/test.tsv"),
         "mrpc/test.tsv: AUC undefined: every one of the 3 labels is 1 (it needs both classes, 0 and 1)"),
        (lambda: pair_auc([], [], "qnli/dev.tsv rows [1000:]"),
         "qnli/dev.tsv rows [1000:]: AUC undefined: no pairs to score (an empty split?)"),
        (lambda: pair_auc([0.1, float("nan")], [0, 1], "qqp.tsv"),
         "qqp.tsv: AUC undefined: 1 of the 2 model scores are NaN / inf (NaN embeddings?)"),
    ]
    for call, message in cases:
        with pytest.raises(UndefinedScoreError) as e:
            call()
        assert str(e.value) == message
        assert "nan" not in str(e.value).replace("NaN", "")
    # Defined scores are unchanged.
    assert math.isclose(correlations(np.array([0.1, 0.2, 0.3]), np.array(gold))["spearman"], 100.0)
    assert pair_auc([0.1, 0.9], [0, 1]) == 100.0


# ---------------------------------------------------------------------------------------------
# 4. Paths built from configuration or from files we read stay under their root


@pytest.mark.parametrize("split", ["../../etc/passwd", "..", "/etc/passwd", "", "dev/../../x"])
def test_split_names_stay_under_data_dir(split, tmp_path, data_dir, capsys):
    rc, err = run_job("gin/runs/eval_stsb_dev.gin", f"DATA_DIR='{data_dir}'", f"sentemb_jax.evaluate_stsb.split={split!r}",
                      capsys=capsys)
    assert (rc, err) == (2, f"gin binding sentemb_jax.evaluate_stsb.split = {split!r}: must be a plain name "
                            f"(no '/' or '..'): it names a file under {data_dir}/stsb")


def test_task_names_that_name_files_are_checked(tmp_path, data_dir, capsys):
    rc, err = run_job("gin/runs/eval_transfer.gin", f"MODEL_DIR='{tmp_path}'", f"DATA_DIR='{data_dir}'",
                      "sentemb_jax.eval_transfer.tasks=['../../etc/passwd']", capsys=capsys)
    assert rc == 2 and err.startswith("gin binding sentemb_jax.eval_transfer.tasks = ['../../etc/passwd']: must be a "
                                      "non-empty list of names from ('MR',"), err


@pytest.mark.parametrize("entry", ["../../x.tsv", "nli/../../x.tsv", ["nli/triples.tsv", "../x.tsv"]])
def test_relative_task_files_stay_under_data_dir(entry, tmp_path, data_dir, capsys):
    bad = entry[-1] if isinstance(entry, list) else entry
    rc, err = run_job("gin/runs/minilm_nli.gin", f"MODEL_DIR='{tmp_path / 'run'}'", f"DATA_DIR='{data_dir}'",
                      f"sentemb_jax.DataConfig.files={{'nli_triples': {entry!r}}}", capsys=capsys)
    assert (rc, err) == (2, f"gin binding sentemb_jax.DataConfig.files['nli_triples'] = {bad!r}: a relative "
                            f"path must stay under DATA_DIR {data_dir} (it resolves to "
                            f"{os.path.normpath(os.path.join(data_dir, bad))}); give an absolute path for a file elsewhere")
    assert_untouched(str(tmp_path / "run"))


def test_absolute_task_files_are_the_users_own(tmp_path, data_dir, capsys):
    absent = tmp_path / "elsewhere" / "triples.tsv"
    rc, err = run_job("gin/runs/minilm_nli.gin", f"MODEL_DIR='{tmp_path / 'run'}'", f"DATA_DIR='{data_dir}'",
                      f"sentemb_jax.DataConfig.files={{'nli_triples': '{absent}'}}", capsys=capsys)
    assert rc == 1 and err.startswith(f"{absent}: no such file"), err  # accepted as a path; only absent


def _st_dir(tmp_path, modules):
    d = tmp_path / "model"
    d.mkdir()
    (d / "modules.json").write_text(json.dumps(modules))
    return d


@pytest.mark.parametrize("entry", ["../../x", "/etc", "1_Pooling/../../x", 3])
def test_modules_json_entries_stay_in_the_model_directory(entry, tmp_path):
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.errors import CheckpointError

    d = _st_dir(tmp_path, [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                           {"idx": 1, "name": "1", "path": entry, "type": "sentence_transformers.models.Pooling"}])
    with pytest.raises(CheckpointError) as e:
        SentenceEncoder.from_pretrained(str(d))
    assert str(e.value) == (f"{d}/modules.json: module 1 (Pooling) has path {entry!r}, which leaves the model "
                            f"directory {d}; module paths are relative to it")


def test_dense_module_outside_the_model_directory(tmp_path):
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.errors import CheckpointError

    d = _st_dir(tmp_path, [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                           {"idx": 1, "name": "1", "path": "../other/2_Dense", "type": "sentence_transformers.models.Dense"}])
    with pytest.raises(CheckpointError, match=r"module 1 \(Dense\) has path '../other/2_Dense', which leaves"):
        SentenceEncoder.from_pretrained(str(d))


def test_shard_index_entries_stay_in_the_model_directory(tmp_path):
    from sentemb_jax.checkpoints import read_hf_tensors
    from sentemb_jax.errors import CheckpointError

    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../secret.safetensors"}}))
    with pytest.raises(CheckpointError) as e:
        read_hf_tensors(str(d))
    assert str(e.value) == (f"{d}/model.safetensors.index.json: weight_map entry '../secret.safetensors' leaves the "
                            f"model directory {d}")

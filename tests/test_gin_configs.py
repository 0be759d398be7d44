"""Every shipped gin file runs as its header command says, and builds: the configuration its job
gets is made and checked (RunConfig, the method), and the tower it describes builds with abstract
shapes (no weights). The three layers hold: model files set MODEL and its optimizer; recipes and
run files name no model (a training run file alone stops asking for MODEL); each paper's recipe
is written once."""
import glob
import os
import re
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_utils import gin_file_args

import gin
from sentemb_jax import main as runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rel(pattern):
    return sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, pattern)))


RUNNABLE = [p for p in _rel("gin/*.gin") if p != "gin/train.gin"] + _rel("gin/runs/*.gin") + _rel("gin/models/*.gin")
MODEL_FILES, RUN_FILES, RECIPES = _rel("gin/models/*.gin"), _rel("gin/runs/*.gin"), _rel("gin/recipes/*.gin")
EXPERIMENTS = [p for p in _rel("gin/*.gin") if p != "gin/train.gin"]

# Published parameter counts (encoder + decoder) of the checkpoints these sizes describe.
PUBLISHED = {"t5_small": 60.5e6, "t5_base": 222.9e6, "t5_large": 737.7e6, "t5_3b": 2.85e9, "t5_11b": 11.3e9,
             "t5_1_1_small": 77.0e6, "t5_1_1_base": 247.6e6, "t5_1_1_large": 783.2e6, "t5_1_1_xl": 2.85e9, "t5_1_1_xxl": 11.14e9,
             "bert_base": 109.5e6, "roberta_base": 124.6e6, "minilm_l6": 22.7e6}


def _abstract_param_count(module) -> int:
    ids = jnp.ones((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids, ids))["params"]
    return sum(int(np.prod(x.value.shape if hasattr(x, "value") else x.shape)) for x in jax.tree_util.tree_leaves(
        shapes, is_leaf=lambda x: hasattr(x, "value")))


def _header_command(path: str) -> tuple[list[str], list[str]]:
    """The gin files and bindings of the `python -m sentemb_jax.main` command in the file's header."""
    head = "\n".join(line[1:] for line in open(os.path.join(REPO, path), encoding="utf-8").read().splitlines()
                     if line.startswith("#")).replace("\\\n", " ")  # a command continued on the next line
    found = re.search(r"python -m sentemb_jax\.main ([^\n]*)", head)
    assert found, f"{path}: the header must show the command that runs it"
    args = shlex.split(found.group(1).replace("[", "").replace("]", ""))
    files = [a.split("=", 1)[1] for a in args if a.startswith("--gin_file=")]
    bindings = [a[len("--gin."):] for a in args if a.startswith("--gin.")]
    assert path in files, f"{path}: its header command must run it ({files})"
    return files, bindings


def _parse(files, bindings=()):
    """Macros here point every path a file may ask for at something (placeholders: a file that does
    not read one is not an error); other bindings are checked as the command line's."""
    gin.clear_config()
    runner.register_configurables()
    macros = [b for b in bindings if "." not in b.split("=", 1)[0]]
    runner.parse_gin(files, [b for b in bindings if b not in macros], placeholders=macros)


@pytest.mark.parametrize("path", RUNNABLE)
def test_header_command_parses_and_builds(path, minilm_dir, tmp_path):
    """The file's own header command (with every path it asks for pointed at something that exists:
    the shipped MiniLM for models, temporary folders for outputs) parses; a train job's RunConfig and
    method are made (checked) and its tower builds; a model file alone sets MODEL."""
    from sentemb_jax.jobs.train import bound_model, bound_train
    from sentemb_jax.models.sentence import SentenceEmbedder
    from sentemb_jax.training.config import RunConfig, TowerConfig
    from sentemb_jax.training.method import Method

    files, _ = _header_command(path)
    places = {"MODEL_DIR": str(tmp_path / "run"), "TOKENIZER_DIR": minilm_dir, "MODEL_PATH": minilm_dir, "TEACHER": minilm_dir,
              "EXPORT_DIR": str(tmp_path / "export"), "RERANK_PATH": str(tmp_path / "q.jsonl"), "INPUT": "x/*.jsonl",
              "OUTPUT": str(tmp_path / "out")}
    _parse(files, [f"{k}={v!r}" for k, v in places.items()] + [f"BI_ENCODERS=['{minilm_dir}']"])
    model = None
    if path.startswith("gin/models/"):
        model = bound_model()
        assert isinstance(model, TowerConfig)
    job = gin.query_parameter("run.job").selector
    if job == "sentemb_jax.train":
        config, method = bound_train()
        assert isinstance(config, RunConfig) and isinstance(method, Method), path
        model = config.model
    elif job in ("sentemb_jax.distill_report", "sentemb_jax.ensemble_distill"):
        bindings = gin.get_bindings(job)
        configs = [bindings["config"]] if "config" in bindings else [*bindings["submodels"], bindings["student"]]
        assert all(isinstance(c, RunConfig) for c in configs)
        model = configs[0].model
    if model is not None and model.backbone is not None and not model.init_from:
        module = SentenceEmbedder(model.backbone, pooling=model.pooling or ("mean",), projection_dim=model.projection_dim)
        count = _abstract_param_count(module)
        assert count > 1e6, (path, count)
        if "11b" in path:
            cfg = module.backbone_config
            assert cfg.scan_layers and cfg.remat and cfg.d_ff == 65536
            expected = 11.3e9 if "encdec" in path else 11.3e9 * 0.42
            assert abs(count - expected) / expected < 0.1, count
    elif model is not None:
        assert model.init_from == minilm_dir or model.init_from == places["MODEL_PATH"], (path, model.init_from)


_MODEL_BINDINGS = re.compile(r"^(MODEL\s*=|sentemb_jax\.(TowerConfig|T5Config|BertConfig)\.|include 'gin/(models|sizes|architectures)/)",
                             re.M)


@pytest.mark.parametrize("path", RUN_FILES + RECIPES)
def test_runs_and_recipes_name_no_model(path):
    """t5x's run layer: no architecture, size or start model in a run file or a recipe (the
    ensemble's per-submodel pooling and dropout switches excepted: how a recipe trains, not what)."""
    text = open(os.path.join(REPO, path), encoding="utf-8").read()
    named = [m.group(0) for m in _MODEL_BINDINGS.finditer(text)]
    allowed = ("pooling", "config_overrides", "params_from")
    named = [n for n in named if not any(a in line for line in text.splitlines() if line.startswith(n) for a in allowed)]
    assert not named, f"{path} names a model: {named}"


@pytest.mark.parametrize("path", [p for p in RUN_FILES if "include 'gin/recipes/" in open(os.path.join(REPO, p)).read()
                                  or "include 'gin/train.gin'" in open(os.path.join(REPO, p)).read()])
def test_training_run_file_alone_asks_for_a_model(path, capsys):
    _parse_rc = runner.main([f"--gin_file={path}", "--gin.MODEL_DIR='/tmp/unused'"])
    assert _parse_rc == 2
    assert "MODEL" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("path", MODEL_FILES)
def test_model_files_set_the_model_and_its_optimizer(path):
    _parse([path], ["TOKENIZER_DIR='/tmp/unused'", "MODEL_PATH='/tmp/unused'"])
    from sentemb_jax.jobs.train import bound_model

    bound_model()
    assert gin.query_parameter("sentemb_jax.OptimizerConfig.name") in ("adamw", "adafactor")


def test_optimizer_kind_is_bound_only_in_model_files_and_each_recipe_written_once():
    files = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "gin", "**", "*.gin"), recursive=True))
    binds_optimizer = [f for f in files if re.search(r"^sentemb_jax\.OptimizerConfig\.name\b", open(os.path.join(REPO, f)).read(), re.M)]
    assert all(f.startswith(("gin/models/", "gin/optimizers/")) for f in binds_optimizer), binds_optimizer
    # Sentence-T5's recipe (temperature 0.01, batch 512) lives in one file, included by the others.
    st5 = [f for f in files if "sentemb_jax.Contrastive.temperature = 0.01" in open(os.path.join(REPO, f)).read()
           and "sentemb_jax.DataConfig.batch_size = 512" in open(os.path.join(REPO, f)).read()]
    assert st5 == ["gin/recipes/st5_nli.gin"], st5
    for method in ("ConGen", "SCT", "SimCSE", "EnsembleStudent", "L2Distillation"):
        defining = [f for f in files if re.search(rf"^(METHOD|sentemb_jax\.\w+\.method) = @sentemb_jax\.{method}(\(\))?$",
                                                  open(os.path.join(REPO, f)).read(), re.M)]
        assert len(defining) == 1 and defining[0].startswith("gin/recipes/"), (method, defining)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_size_files_match_published_counts(name):
    from sentemb_jax.jobs.train import bound_model
    from sentemb_jax.models.sentence import SentenceEmbedder

    bert = name in ("bert_base", "roberta_base", "minilm_l6")
    bindings = ["TOKENIZER_DIR='/tmp/unused'", "sentemb_jax.TowerConfig.projection_dim = None"]
    if bert:
        bindings += ["sentemb_jax.TowerConfig.backbone = @sentemb_jax.BertConfig()", "sentemb_jax.BertConfig.add_pooling_layer = True",
                     "sentemb_jax.BertConfig.scan_layers = True"]
    else:
        bindings += ["sentemb_jax.T5Config.has_decoder = True", "sentemb_jax.T5Config.scan_layers = True"]
        if "1_1" in name:
            bindings += ["sentemb_jax.T5Config.has_lm_head = True"]
    _parse(["gin/architectures/t5_encoder_mean.gin", f"gin/sizes/{name}.gin"], bindings)
    model = bound_model()
    count = _abstract_param_count(SentenceEmbedder(model.backbone, projection_dim=model.projection_dim))
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.03, (name, count)


def test_data_dir_binding_reaches_the_training_job(tmp_path, minilm_dir):
    """--gin.DATA_DIR is where `train` reads its tasks from, not $SENTEMB_DATA_DIR / ../shared/data:
    a missing folder is named in the error, with the binding that set it (before any work)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SENTEMB_DATA_DIR"}
    missing = tmp_path / "no_data_here"
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.main", *gin_file_args("gin/runs/tiny_t5_nli.gin"), f"--gin.MODEL_PATH='{minilm_dir}'",
                           f"--gin.MODEL_DIR='{tmp_path / 'run'}'", f"--gin.DATA_DIR='{missing}'"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {missing}: no such data directory (set by gin binding sentemb_jax.DataConfig.data_dir = %DATA_DIR)"), \
        proc.stderr[-2000:]

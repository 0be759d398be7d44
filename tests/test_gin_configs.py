"""Every gin file parses; every model it describes builds with abstract shapes (no weights)."""
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gin
from sentemb_jax import main as runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_FILES = sorted(glob.glob(os.path.join(REPO, "gin", "*.gin")) + glob.glob(os.path.join(REPO, "gin", "runs", "*.gin")))
MACROS = ["MODEL_DIR='/tmp/unused'", "TOKENIZER_DIR='/tmp/unused'", "MODEL_PATH='/tmp/unused'", "RERANK_PATH='/tmp/unused'", "EXPORT_DIR='/tmp/unused'",
          "INPUT='/tmp/unused/*.jsonl'", "OUTPUT='/tmp/unused'"]

# Published parameter counts (encoder + decoder) of the T5 checkpoints these sizes describe.
PUBLISHED = {"t5_small": 60.5e6, "t5_base": 222.9e6, "t5_large": 737.7e6, "t5_3b": 2.85e9, "t5_11b": 11.3e9,
             "t5_1_1_small": 77.0e6, "t5_1_1_base": 247.6e6, "t5_1_1_large": 783.2e6, "t5_1_1_xl": 2.85e9, "t5_1_1_xxl": 11.14e9,
             "bert_base": 109.5e6, "roberta_base": 124.6e6, "minilm_l6": 22.7e6}


def _abstract_param_count(module) -> int:
    ids = jnp.ones((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids, ids))["params"]
    return sum(int(np.prod(x.value.shape if hasattr(x, "value") else x.shape)) for x in jax.tree_util.tree_leaves(
        shapes, is_leaf=lambda x: hasattr(x, "value")))


def _parse(files, bindings=()):
    gin.clear_config()
    runner.register_configurables()
    runner.parse_gin(files, list(MACROS) + list(bindings))


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_run_file_parses_and_builds(path):
    with open(path) as f:
        head = f.read(600)
    assert "python -m sentemb_jax.main" in head and os.path.relpath(path, REPO) in head, "header must show the command"
    _parse([os.path.relpath(path, REPO)])
    assert gin.query_parameter("run.job") is not None
    try:
        backbone_bound = gin.query_parameter("sentemb_jax.tower_module.backbone") is not None
    except ValueError:
        backbone_bound = False
    if backbone_bound:  # every file that builds its tower from gin (from scratch), not only those naming tokenizer_dir
        from sentemb_jax.training.trainer import tower_module

        module = tower_module()
        count = _abstract_param_count(module)
        if "tiny_t5_scratch" in path:  # issue 5's CPU learning check: d_model 256, 4+4 layers, 8k vocab
            d, vocab, ff, layers, relpos = 256, 8192, 1024, 4, 32 * 4
            encoder = vocab * d + layers * (4 * d * d + 3 * d * ff + 2 * d) + relpos + d
            # No lm_head: encdec_first reads the decoder's first state, never a vocabulary projection
            # (the file leaves T5Config.has_lm_head unset; the encdec file was not built here before).
            decoder = layers * (8 * d * d + 3 * d * ff + 3 * d) + relpos + d
            assert count == encoder + (decoder if "encdec" in path else 0), count  # no projection
        else:
            assert count > 1e8, count
        if "11b" in path:
            cfg = module.backbone_config
            assert cfg.scan_layers and cfg.remat and cfg.d_ff == 65536
            expected = 11.3e9 if "encdec" in path else 11.3e9 * 0.42
            assert abs(count - expected) / expected < 0.1, count
    gin.clear_config()


def _resolve(value):
    """A bound value with its macros (%NAME) and evaluated references (@f()) resolved."""
    if isinstance(value, gin.config.ConfigurableReference):
        return _resolve(value.scoped_configurable_fn())
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v) for v in value)
    return value


def _bound(param):
    try:
        return _resolve(gin.query_parameter(param))
    except ValueError:
        return None


# The jobs whose model comes from a model directory (train / ensemble_distill / distill_report via
# train.init_from [+ init_layers], trans_encoder via bi_encoders): those macros are pointed at the
# shipped MiniLM (no downloads), and the tower the file describes is built abstractly on it.
MODEL_DIR_JOBS = ("sentemb_jax.train", "sentemb_jax.ensemble_distill", "sentemb_jax.distill_report", "sentemb_jax.trans_encoder")
# Runnable files with no tower of their own to build, and why.
NO_TOWER = {
    "data_summary": "reads and counts data files; no model",
    "prepare_corpus": "tokenizes a corpus into ids; no model",
    "eval_": "evaluation jobs load a finished model directory (MODEL_PATH); the MiniLM load is tested in tests/test_minilm.py",
    "export_savedmodel": "exports a finished model directory (tests/test_export.py)",
    "st5_commqa_then_nli": "run_stages: its stages' towers are gin-built and counted by test_run_file_parses_and_builds",
    "scaling": "scaling_study: each rung's tower is built by the ladder's own check before training "
               "(tests/test_scaling_study.py: the CPU ladder's rungs and all eight of gin/scaling_st5.gin)",
}


@pytest.fixture(scope="module")
def minilm_encoder(minilm_dir):
    from sentemb_jax.encoder import SentenceEncoder

    return SentenceEncoder.from_pretrained(minilm_dir)


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_run_file_builds_its_model_from_a_directory(path, minilm_dir, minilm_encoder):
    """Each file whose job starts from a model directory: with MODEL_PATH / TEACHER / BI_ENCODERS
    pointed at the shipped all-MiniLM-L6-v2, the tower it describes (the first init_layers layers
    for a layer-dropped student) builds abstractly (jax.eval_shape) and has exactly the parameters
    the job would load into it (SentenceEncoder.first_layers of the loaded weights)."""
    rel = os.path.relpath(path, REPO)
    _parse([rel], [f"MODEL_PATH='{minilm_dir}'", f"TEACHER='{minilm_dir}'", f"BI_ENCODERS=['{minilm_dir}']"])
    job = gin.query_parameter("run.job").selector
    init_from, bi_encoders = _bound("sentemb_jax.train.init_from"), _bound("sentemb_jax.trans_encoder.bi_encoders")
    layers = _bound("sentemb_jax.train.init_layers")
    pooling, overrides = _bound("sentemb_jax.train.pooling"), _bound("sentemb_jax.train.config_overrides")
    gin.clear_config()
    if job not in MODEL_DIR_JOBS or (init_from is None and bi_encoders is None):
        reason = [r for key, r in NO_TOWER.items() if key in os.path.basename(rel)]
        from_gin = job == "sentemb_jax.train"  # from scratch: built in test_run_file_parses_and_builds
        assert reason or from_gin, f"{rel}: job {job} is neither built here nor listed in NO_TOWER"
        pytest.skip(reason[0] if reason else "tower built from gin by test_run_file_parses_and_builds")
    starts = [init_from] if init_from is not None else list(bi_encoders)
    assert starts and all(p == minilm_dir for p in starts), (rel, starts)  # every start is a macro pointed at MiniLM
    assert not overrides, (rel, overrides)
    encoder = minilm_encoder
    if pooling is not None:
        encoder = type(encoder).from_pretrained(minilm_dir, pooling=pooling)
    if layers:
        assert isinstance(layers, int) and 0 < layers <= 6, (rel, layers)
        encoder = encoder.first_layers(layers)
    loaded = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(encoder.params))
    assert _abstract_param_count(encoder.module) == loaded, rel
    full = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(minilm_encoder.params))
    assert (loaded < full) == bool(layers and layers < 6), (rel, loaded, full)  # a layer-dropped student is smaller
    assert loaded > 1e7, (rel, loaded)  # at least MiniLM's embeddings (30522 x 384 = 11.7M)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_model_size_files_match_published_counts(name):
    from sentemb_jax.training.trainer import tower_module

    bert = name in ("bert_base", "roberta_base", "minilm_l6")
    bindings = ["sentemb_jax.tower_module.projection_dim = None"]
    if bert:
        bindings += ["sentemb_jax.tower_module.backbone = @sentemb_jax.BertConfig()", "sentemb_jax.BertConfig.add_pooling_layer = True",
                     "sentemb_jax.BertConfig.scan_layers = True"]
    else:
        bindings += ["sentemb_jax.T5Config.has_decoder = True", "sentemb_jax.T5Config.scan_layers = True"]
        if "1_1" in name:
            bindings += ["sentemb_jax.T5Config.has_lm_head = True"]
    _parse(["gin/architectures/dual_encoder.gin", f"gin/models/{name}.gin"], bindings)
    count = _abstract_param_count(tower_module())
    gin.clear_config()
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.03, (name, count)


def test_data_dir_binding_reaches_the_training_job(tmp_path, minilm_dir):
    """--gin.DATA_DIR is where `train` reads its tasks from, not $SENTEMB_DATA_DIR / ../shared/data
    (train passes its own data_dir to register_tasks): a missing folder is named in the error, with
    the binding that set it (before any work: tests/test_missing_data.py)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SENTEMB_DATA_DIR"}
    missing = tmp_path / "no_data_here"
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.main", "--gin_file=gin/runs/tiny_t5_nli.gin",
                           f"--gin.MODEL_PATH='{minilm_dir}'", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                           f"--gin.DATA_DIR='{missing}'"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert (f"error: {missing}: no such data directory (set by gin binding sentemb_jax.train.data_dir = %DATA_DIR)"
            in proc.stderr), proc.stderr[-2000:]

"""The scaling-study job (sentemb_jax.jobs.scaling): a two-rung ladder of tiny T5s from scratch
(encoder-mean, encoder-decoder first token) killed after its first rung and rerun - the first rung
is reused, not retrained; its table, JSON, FLOPs and scores checked against independent counts; a
bad rung is named before any training, a rung whose check crashes too; the TPU ladder
gin/scaling_st5.gin parses, builds every rung abstractly and compiles for its slice."""
import importlib.util
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import spearmanr

from sentemb_jax import main as runner
from sentemb_jax.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D, FF, LAYERS, HEADS, VOCAB = 32, 64, 1, 2, 8192
SIZE = [f"sentemb_jax.T5Config.d_model = {D}", f"sentemb_jax.T5Config.d_ff = {FF}",
        f"sentemb_jax.T5Config.num_layers = {LAYERS}", f"sentemb_jax.T5Config.num_decoder_layers = {LAYERS}",
        f"sentemb_jax.T5Config.num_heads = {HEADS}", "sentemb_jax.T5Config.d_kv = 16",
        # dropout off: no test here checks it, and its masks are half of what XLA compiles for a step this small
        "sentemb_jax.T5Config.dropout_rate = 0.0"]
STEPS, BATCH, LENGTH = 4, 8, 32


def _ladder_gin(path, rungs: str) -> str:
    with open(path, "w") as f:
        f.write(f"""# two tiny rungs (tests/test_scaling_study.py)
run.job = @sentemb_jax.scaling_study
sentemb_jax.scaling_study.model_dir = %MODEL_DIR
sentemb_jax.scaling_study.recipe = ['gin/recipes/tiny_t5_nli_scratch.gin']
sentemb_jax.scaling_study.bindings = ['NUM_STEPS = {STEPS}', 'sentemb_jax.DataConfig.batch_size = {BATCH}',
    'sentemb_jax.DataConfig.sequence_length = {LENGTH}', 'sentemb_jax.ScheduleConfig.warmup_steps = 1',
    'sentemb_jax.EvalConfig.every = 2', 'sentemb_jax.EvalConfig.at_start = False',
    'sentemb_jax.CheckpointConfig.every = 2', 'sentemb_jax.RunConfig.log_every = 2']
sentemb_jax.scaling_study.prepare = @sentemb_jax.from_scratch_inputs
sentemb_jax.from_scratch_inputs.out_dir = %INPUTS
sentemb_jax.scaling_study.rungs = {rungs}
""")
    return str(path)


SIZE_BINDINGS = "[" + ", ".join(repr(b) for b in SIZE) + "]"
TWO_RUNGS = f"""[
    {{'name': 'r1_mean', 'gin_files': ['gin/models/t5_tiny_scratch.gin'], 'bindings': {SIZE_BINDINGS}}},
    {{'name': 'r2_encdec', 'gin_files': ['gin/models/t5_tiny_scratch_encdec.gin'], 'bindings': {SIZE_BINDINGS}}},
]"""


@pytest.fixture(scope="module")
def ladder_data(data_dir, tmp_path_factory):
    """DATA_DIR with NLI and the wiki sentences linked and STS-B dev / test cut to 200 pairs (no
    other STS task: the suite scores STS-B test only, quickly)."""
    root = tmp_path_factory.mktemp("ladder_data")
    for name in ("nli", "unlabelled"):
        os.symlink(os.path.join(data_dir, name), root / name)
    (root / "stsb").mkdir()
    for split in ("dev", "test"):
        with open(os.path.join(data_dir, "stsb", f"{split}.tsv"), encoding="utf-8") as fin, \
                open(root / "stsb" / f"{split}.tsv", "w", encoding="utf-8") as fout:
            fout.writelines(itertools.islice(fin, 201))
    return str(root)


def _run_ladder(gin_file, model_dir, data, inputs, fault=None):
    env = {**os.environ, "SENTEMB_DATA_DIR": data}
    env.pop("SENTEMB_FAULT", None)
    if fault:
        env["SENTEMB_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "sentemb_jax.main", f"--gin_file={gin_file}",
                           f"--gin.MODEL_DIR='{model_dir}'", f"--gin.INPUTS='{inputs}'"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def killed_and_rerun(ladder_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ladder")
    gin_file = _ladder_gin(tmp / "ladder.gin", TWO_RUNGS)
    model_dir, inputs = str(tmp / "run"), str(tmp_path_factory.mktemp("inputs"))
    killed = _run_ladder(gin_file, model_dir, ladder_data, inputs, fault="after_rung:1")
    r1 = os.path.join(model_dir, "r1_mean")
    snapshot = {name: open(os.path.join(r1, name), "rb").read() for name in ("metrics.jsonl", "rung.json")}
    checkpoints = sorted(os.listdir(os.path.join(r1, "checkpoints")))
    after_kill = {"r2_started": os.path.isdir(os.path.join(model_dir, "r2_encdec")),
                  "results": os.path.isfile(os.path.join(model_dir, "results.json"))}
    rerun = _run_ladder(gin_file, model_dir, ladder_data, inputs)
    return {"killed": killed, "rerun": rerun, "model_dir": model_dir, "snapshot": snapshot, "checkpoints": checkpoints,
            "after_kill": after_kill, "data": ladder_data}


def test_kill_after_rung_one_then_rerun_reuses_it(killed_and_rerun):
    k = killed_and_rerun
    assert k["killed"].returncode == -9, k["killed"].stderr[-2000:]  # SIGKILL after rung 1 (SENTEMB_FAULT)
    assert not k["after_kill"]["r2_started"] and not k["after_kill"]["results"]
    assert k["rerun"].returncode == 0, k["rerun"].stderr[-3000:]
    assert "rung r1_mean: finished earlier" in k["rerun"].stderr
    assert "[r1_mean]" not in k["rerun"].stderr and "[r2_encdec]" in k["rerun"].stderr  # only rung 2 trained
    r1 = os.path.join(k["model_dir"], "r1_mean")
    for name, content in k["snapshot"].items():  # rung 1 not retrained, not re-evaluated
        assert open(os.path.join(r1, name), "rb").read() == content, name
    assert sorted(os.listdir(os.path.join(r1, "checkpoints"))) == k["checkpoints"]


def _tower_counts(decoder: bool) -> tuple[int, int, int]:
    """(params, non-embedding params, decoder non-embedding params) of a T5 v1.1 tower of these
    sizes, counted from the architecture (as tests/test_gin_configs.py): no projection (the recipe)."""
    inner, relpos = HEADS * 16, 32 * HEADS
    enc_layer = 2 * D + 4 * D * inner + 3 * D * FF  # two layer norms, q k v o, gated-GELU wi_0 wi_1 wo
    enc = LAYERS * enc_layer + D  # + final norm
    dec = LAYERS * (3 * D + 8 * D * inner + 3 * D * FF) + D if decoder else 0
    embedding = VOCAB * D + relpos + (relpos if decoder else 0)
    return embedding + enc + dec, enc + dec, dec


def test_table_json_and_flops(killed_and_rerun):
    model_dir = killed_and_rerun["model_dir"]
    with open(os.path.join(model_dir, "results.json")) as f:
        rows = json.load(f)["rungs"]
    assert list(rows) == ["r1_mean", "r2_encdec"]
    markdown = open(os.path.join(model_dir, "results.md")).read()
    for name, row in rows.items():
        decoder = name == "r2_encdec"
        params, matmul, dec = _tower_counts(decoder)
        assert (row["params"], row["matmul_params"], row["decoder_params"]) == (params, matmul, dec)
        assert row["architecture"] == ("encoder-decoder first token" if decoder else "encoder-mean")
        assert row["steps"] == STEPS and row["texts"] == STEPS * BATCH * 3  # anchor, positive, negative
        history = [json.loads(line) for line in open(os.path.join(model_dir, name, "metrics.jsonl"))]
        assert row["tokens"] == history[-1]["tokens"]
        assert STEPS * BATCH * 3 * 2 < row["tokens"] < STEPS * BATCH * 3 * LENGTH  # real tokens, not padding
        assert row["train_flops"] == 6 * ((matmul - dec) * row["tokens"] + dec * row["texts"])
        dev = [m["stsb_dev_spearman"] for m in history if "stsb_dev_spearman" in m]
        assert len(dev) == 2 and row["stsb_dev"] == max(dev)
        assert row["wall_s"] > 0 and row["train_flops_compiler"] is None
        assert f"| {name} | {row['architecture']} |" in markdown and f"{row['stsb_dev']:.2f}" in markdown
    for plot in ("score_vs_params.png", "score_vs_flops.png"):
        with open(os.path.join(model_dir, plot), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_sts_score_of_the_kept_model_computed_independently(killed_and_rerun):
    """STS-B test in the table = Spearman (scipy) of the kept model's cosine similarities."""
    from sentemb_jax.data.files import read_sts_pairs
    from sentemb_jax.encoder import SentenceEncoder

    model_dir, data = killed_and_rerun["model_dir"], killed_and_rerun["data"]
    rows = json.load(open(os.path.join(model_dir, "results.json")))["rungs"]
    s1, s2, gold = read_sts_pairs(os.path.join(data, "stsb", "test.tsv"), score_range=(0, 5))
    assert len(s1) == 200
    for name in rows:
        encoder = SentenceEncoder.from_pretrained(os.path.join(model_dir, name, "model"))
        a = encoder.encode(s1, normalize_embeddings=True)
        b = encoder.encode(s2, normalize_embeddings=True)
        expected = 100 * spearmanr(np.sum(a * b, axis=1), gold).statistic
        assert rows[name]["sts"]["STSB"] == pytest.approx(expected, abs=1e-4)
        assert rows[name]["sts"]["avg"] == rows[name]["sts"]["STSB"]  # the only STS task in this DATA_DIR


def test_bad_rungs_are_named_before_any_training(ladder_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SENTEMB_DATA_DIR", ladder_data)
    monkeypatch.chdir(REPO)
    rungs = f"""[
        {{'name': 'good', 'gin_files': ['gin/models/t5_tiny_scratch.gin'], 'bindings': {SIZE_BINDINGS}}},
        {{'name': 'no_file', 'gin_files': ['gin/models/t5_tiny_scratch.gin', 'gin/sizes/t5_nope.gin']}},
        {{'name': 'bad_binding', 'gin_files': ['gin/models/t5_tiny_scratch.gin'],
          'bindings': ['sentemb_jax.T5Config.not_a_field = 3']}},
    ]"""
    gin_file = _ladder_gin(tmp_path / "bad.gin", rungs)
    model_dir = tmp_path / "run"
    code = runner.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.INPUTS='{tmp_path / 'in'}'"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "2 of 3 rungs cannot run, nothing trained" in err, err
    assert "rung 'no_file'" in err and "gin/sizes/t5_nope.gin: no such gin file" in err
    assert "rung 'bad_binding'" in err and "not_a_field" in err and "rung 'good'" not in err
    assert not model_dir.exists() or os.listdir(model_dir) == ["run.log"]  # nothing written, no inputs made
    assert not os.path.exists(tmp_path / "in")


@pytest.mark.parametrize("rungs,message", [
    ([], "non-empty list"),
    ([{"name": "../up", "gin_files": ["a.gin"]}], "plain directory name"),
    ([{"name": "a", "gin_files": ["a.gin"]}, {"name": "a", "gin_files": ["b.gin"]}], "used by an earlier rung"),
    ([{"name": "a", "gin_files": []}], "non-empty list of gin file paths"),
    ([{"name": "a", "gin_files": ["a.gin"], "steps": 3}], "unknown key(s) ['steps']"),
    ([{"name": "a", "gin_files": ["a.gin"], "bindings": ["no equals sign"]}], "'KEY = VALUE'"),
])
def test_rung_list_errors_name_the_rung(rungs, message):
    from sentemb_jax.jobs.scaling import parse_rungs

    with pytest.raises(ConfigError, match="sentemb_jax.scaling_study.rungs") as e:
        parse_rungs(rungs)
    assert message in str(e.value)


NEEDS_LIBTPU = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu not installed (pip install -e '.[test]')")


def _ladder_spec(monkeypatch):
    """gin/scaling_st5.gin's rungs, recipe and topology, as scaling_study receives them."""
    import gin
    from sentemb_jax.jobs.scaling import parse_rungs

    monkeypatch.chdir(REPO)
    runner.register_configurables()
    runner.parse_gin(["gin/scaling_st5.gin"], ["MODEL_DIR = '/tmp/unused'", "TOKENIZER_DIR = '/tmp/unused'"])
    def resolved(value):  # macros (%T5_BASE) as scaling_study receives them
        if isinstance(value, gin.config.ConfigurableReference):
            return value.scoped_configurable_fn()
        if isinstance(value, dict):
            return {k: resolved(v) for k, v in value.items()}
        return [resolved(v) for v in value] if isinstance(value, (list, tuple)) else value

    ladder = parse_rungs(resolved(gin.query_parameter("sentemb_jax.scaling_study.rungs")))
    return (ladder, list(gin.query_parameter("sentemb_jax.scaling_study.recipe")),
            gin.query_parameter("sentemb_jax.scaling_study.compiler_topology"))


@NEEDS_LIBTPU
def test_tpu_ladder_parses_builds_and_compiles(monkeypatch):
    """gin/scaling_st5.gin: every rung (Base to 11B, both architectures) builds its train step
    abstractly on the ladder's slice (v5e-32) with its own mesh; the Large rung is compiled there by
    the TPU compiler, through the job's own check (its own process), and fits HBM."""
    from sentemb_jax.benchmarks import scaling_check
    from sentemb_jax.jobs.scaling import check_rungs

    ladder, recipe, topology = _ladder_spec(monkeypatch)
    rungs = [r.spec() for r in ladder]
    assert all(r["init_from"] is None for r in rungs)  # T5_BASE ... left None: from random init
    assert topology == "v5e:4x8" and len(rungs) == 8
    built = scaling_check.describe_rungs({"rungs": rungs, "recipe": recipe, "bindings": [], "topology": topology,
                                          "compile": False})
    assert [r.get("error") for r in built] == [None] * 8
    params = {r["name"]: r["params"] for r in built}
    assert params["st5_base"] < params["st5_large"] < params["st5_3b"] < params["st5_11b"]
    assert params["st5_11b_encdec"] == pytest.approx(11.3e9, rel=0.05)
    assert {r["architecture"] for r in built} == {"encoder-mean", "encoder-decoder first token"}
    assert all(r["batch"] == 512 and r["length"] == 128 and r["num_steps"] == 10000 for r in built)
    # One TPU compile, the path the job takes before training: the Large rung (scanned layers; with
    # its gin file's model 1 libtpu 0.0.42 dies on a stack overflow here, hence the ladder's model 2).
    # Every rung compiled by hand: docs/scale.md, "Scaling studies" (the runs: docs/notes/scaling_log.md).
    # The Base rung, unscanned, takes 4 min on 2 cores.
    (large,) = [r for r in ladder if r.name == "st5_large"]
    row = check_rungs([large], recipe, [], topology)["st5_large"]
    c = row["compiled"]
    assert c["devices"] == 32 and 0 < c["per_chip_gib"] < 16 and c["mesh"] == {"data": 4, "fsdp": 4, "model": 2}
    # The compiler's FLOPs per step (the scanned layers counted once per layer) against 6 x N x
    # padded tokens: within 2x (remat recomputes the forward).
    assert row["padded_step_flops_6nd"] <= c["step_flops"] < 2 * row["padded_step_flops_6nd"]


@NEEDS_LIBTPU
def test_a_rung_whose_check_process_crashes_is_named_and_the_others_still_checked(ladder_data, tmp_path, capsys,
                                                                                 monkeypatch):
    """With a compiler topology each rung is checked (built and compiled) in its own process: one that
    dies on a signal (as libtpu's compiler can) is named with the signal, the rungs after it are
    still checked, a good rung is not named, its output is kept in a file the error names, nothing
    is trained. The crash is placed by a gin file importing a module that sends its process SIGSEGV."""
    (tmp_path / "segfault_on_import.py").write_text(
        "import os, resource, signal\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\nprint('segfault_on_import: sending SIGSEGV', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    (tmp_path / "crash.gin").write_text("import segfault_on_import\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SENTEMB_DATA_DIR", ladder_data)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(REPO)
    tiny = "'gin/models/t5_tiny_scratch.gin'"
    rungs = f"""[
        {{'name': 'crashes', 'gin_files': [{tiny}, '{tmp_path / "crash.gin"}'], 'bindings': {SIZE_BINDINGS}}},
        {{'name': 'good', 'gin_files': [{tiny}], 'bindings': {SIZE_BINDINGS}}},
        {{'name': 'bad_binding', 'gin_files': [{tiny}], 'bindings': ['sentemb_jax.T5Config.not_a_field = 3']}},
    ]"""
    gin_file = _ladder_gin(tmp_path / "crash_ladder.gin", rungs)
    model_dir = tmp_path / "run"
    code = runner.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.INPUTS='{tmp_path / 'in'}'",
                        "--gin.sentemb_jax.scaling_study.compiler_topology='v5e:2x2'"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "2 of 3 rungs cannot run, nothing trained" in err, err
    assert "rung 'crashes' (gin/models/t5_tiny_scratch.gin" in err
    assert "its check process (build and TPU compile) died on SIGSEGV; its output: " in err
    assert "rung 'bad_binding'" in err and "not_a_field" in err and "rung 'good'" not in err
    kept = err.split("its output: ")[1].split()[0]
    assert os.path.dirname(kept) == str(tmp_path / "cache" / "sentemb_jax" / "logs") and "rung_check-crashes" in kept
    with open(kept, encoding="utf-8") as f:
        assert "segfault_on_import: sending SIGSEGV" in f.read()
    assert "segfault_on_import:" not in err  # the crash's output stays in its file
    assert not model_dir.exists() or os.listdir(model_dir) == ["run.log"]  # nothing trained, no inputs made
    assert not os.path.exists(tmp_path / "in")

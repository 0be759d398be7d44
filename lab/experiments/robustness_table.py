"""Every bad input we know of, run for real: the exit code (job runner) or exception (library call)
and the message each produces. The table in docs/ROBUSTNESS.md is this script's output.

    python -m lab.experiments.robustness_table > /tmp/robustness.md

Job-runner cases call `sentemb_jax.main.main(argv)` in this process (the exit code it returns is
the process's); data and checkpoint cases build the bad file in a temporary directory first.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

from sentemb_jax import main as runner
from sentemb_jax.data.files import FileSpec, index_rows
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.paths import default_data_dir

STS_HEADER = "sentence1\tsentence2\tscore\n"


def _main(argv: list[str]) -> tuple[str, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = runner.main(argv)
    lines = [line[len("error: "):] for line in err.getvalue().splitlines() if line.startswith("error: ")]
    return f"exit {code}", (lines[0] if lines else "(no error line)")


def _call(fn) -> tuple[str, str]:
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the point is to show what escapes
        return type(e).__name__, str(e).splitlines()[0]
    return "returns", repr(getattr(out, "shape", out))


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _call_warning(fn) -> tuple[str, str]:
    """_call, with the warnings sentemb_jax logs during the call after the result."""
    handler, logger = _Warnings(), logging.getLogger("sentemb_jax")
    logger.addHandler(handler)
    try:
        outcome, message = _call(fn)
    finally:
        logger.removeHandler(handler)
    return outcome + (" + warning" if handler.lines else ""), "; warning: ".join([message, *handler.lines])


def _eval_job(data_dir: str, model_path: str | None = None, *extra: str) -> list[str]:
    argv = ["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/eval_stsb_dev.gin", f"--gin.DATA_DIR='{data_dir}'", *extra]
    return argv + ([f"--gin.MODEL_PATH='{model_path}'"] if model_path else [])


def data_cases(tmp: str):
    def sts(name: str, body: bytes | str) -> str:
        d = os.path.join(tmp, name)
        os.makedirs(os.path.join(d, "stsb"), exist_ok=True)
        with open(os.path.join(d, "stsb", "dev.tsv"), "wb") as f:
            f.write(body if isinstance(body, bytes) else body.encode())
        return d

    good = "A man plays.\tA man is playing.\t4.5\n"
    yield "TSV row with a missing field", _main(_eval_job(sts("fields", STS_HEADER + good + "only one\t3.0\n")))
    yield "TSV with invalid UTF-8", _main(_eval_job(sts("utf8", STS_HEADER.encode() + good.encode() + b"caf\xe9\tx\t1.0\n")))
    yield "TSV score that is NaN", _main(_eval_job(sts("nan", STS_HEADER + good + "a\tb\tnan\n")))
    yield "TSV score out of range (7 on a 0-5 scale)", _main(_eval_job(sts("range", STS_HEADER + good + "a\tb\t7\n")))
    yield "TSV score not a number", _main(_eval_job(sts("word", STS_HEADER + good + "a\tb\tfive\n")))
    yield "TSV without a needed column", _main(_eval_job(sts("cols", "sentence1\tscore\nA man.\t3.0\n")))
    yield "TSV empty file (no header)", _main(_eval_job(sts("empty", "")))
    os.makedirs(os.path.join(tmp, "no_stsb"))
    yield "data file missing", _main(_eval_job(os.path.join(tmp, "no_stsb")))
    yield "DATA_DIR missing", _main(_eval_job(os.path.join(tmp, "absent")))
    sts_job = ["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/eval_sts.gin", f"--gin.MODEL_DIR='{tmp}/eval'", f"--gin.DATA_DIR='{tmp}/no_stsb'"]
    yield "SICKR_TEST_PATH missing", _main(sts_job + [f"--gin.SICKR_TEST_PATH='{tmp}/sick_r_test.tsv'"])
    yield "an evaluation with every task omitted (no STS file)", _main(sts_job)

    made = []

    def jsonl(body: str) -> str:
        made.append(body)
        path = os.path.join(tmp, f"rows{len(made)}.jsonl")
        with open(path, "w") as f:
            f.write(body)
        return path

    def index(path):
        return lambda: len(index_rows(FileSpec(path, {"anchor": "q", "positive": "a"})))

    yield "JSONL line that is not JSON", _call(index(jsonl('{"q": "a", "a": "b"}\n{"q": oops}\n')))
    yield "JSONL object without a needed key", _call(index(jsonl('{"q": "a"}\n')))
    yield "JSONL value that is a list", _call(index(jsonl('{"q": ["a"], "a": "b"}\n')))
    yield "JSONL text with a lone surrogate (\\ud800 escape)", _call(index(jsonl('{"q": "x \\ud800", "a": "b"}\n')))
    yield "empty text in a training row", _call(lambda: str(index_rows(FileSpec(jsonl('{"q": " ", "a": "b"}\n{"q": "c", "a": "d"}\n'),
                                                                             {"anchor": "q", "positive": "a"})).summary))


def gin_cases(tmp: str):
    yield "unknown configurable", _main(["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/eval_stsb_dev.gin", "--gin.nosuch.param=1"])
    yield "unknown parameter", _main(["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/eval_stsb_dev.gin", "--gin.sentemb_jax.evaluate_stsb.bogus=1"])
    yield "wrong type (batch_size='64')", _main(["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/eval_stsb_dev.gin",
                                                "--gin.sentemb_jax.evaluate_stsb.batch_size='64'"])
    yield "wrong type through a macro", _main(["--gin_file=gin/models/local.gin", "--gin_file=gin/runs/tiny_t5_nli.gin", "--gin.MODEL_PATH='x'",
                                              "--gin.MODEL_DIR='y'", "--gin.sentemb_jax.RunConfig.num_steps='8'"])
    path = os.path.join(tmp, "job.gin")
    with open(path, "w") as f:
        f.write("run.job = @sentemb_jax.evaluate_stsb\n")
    yield "missing required value", _main([f"--gin_file={path}"])
    yield "gin syntax error", _main(["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/eval_stsb_dev.gin", "--gin.sentemb_jax.evaluate_stsb.split=('dev'"])
    yield "no such gin file", _main(["--gin_file=gin/runs/absent.gin"])
    yield "no --gin_file", _main([])
    yield "stray argument", _main(["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/eval_stsb_dev.gin", "--oops"])


def checkpoint_cases(tmp: str, data_dir: str):
    src = packaged_minilm_path()
    tensors = load_file(os.path.join(src, "model.safetensors"))

    def model(name: str, weights: dict | None = None, raw: bytes | None = None, file: str = "model.safetensors") -> str:
        d = os.path.join(tmp, name)
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "onnx", "openvino"))
        if weights is not None:
            save_file(weights, os.path.join(d, file))
        if raw is not None:
            with open(os.path.join(d, file), "wb") as f:
                f.write(raw)
        return d

    first = sorted(tensors)[0]
    yield "model directory without weights", _main(_eval_job(data_dir, model("none")))
    yield "missing tensor", _main(_eval_job(data_dir, model("missing", {k: v for k, v in tensors.items() if k != first})))
    yield "unexpected tensor", _main(_eval_job(data_dir, model("extra", {**tensors, "encoder.extra.weight": np.zeros(3, np.float32)})))
    wrong = dict(tensors)
    wrong[first] = np.zeros((7, 3), np.float32)
    yield "tensor of the wrong shape", _main(_eval_job(data_dir, model("shape", wrong)))
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        head = f.read(4096)
    yield "truncated safetensors file", _main(_eval_job(data_dir, model("truncated", raw=head)))
    yield "pickle checkpoint (pytorch_model.bin), no opt-in", _main(
        _eval_job(data_dir, model("pickle", raw=b"\x80\x02not really", file="pytorch_model.bin")))
    yield "model directory missing", _main(_eval_job(data_dir, os.path.join(tmp, "absent_model")))


def encode_cases():
    enc = SentenceEncoder.from_pretrained(packaged_minilm_path())
    yield "encode([])", _call(lambda: enc.encode([]))
    yield "encode(None)", _call(lambda: enc.encode(None))
    yield "encode(['a', 3])", _call(lambda: enc.encode(["a", 3]))
    yield "encode([b'bytes'])", _call(lambda: enc.encode([b"bytes"]))
    yield "encode(['ab\\ud800c'])", _call(lambda: enc.encode(["ab\ud800c"]))
    yield "encode(['a'], batch_size=0)", _call(lambda: enc.encode(["a"], batch_size=0))
    yield "encode(['word ' * 50000, ''])", _call(lambda: enc.encode(["word " * 50_000, ""]))
    # sentence-transformers 6.2 refuses these too (ValueError); InputTypeError is a TypeError and a ValueError.
    yield "encode({'a': 'x', 'b': 'y'})", _call(lambda: enc.encode({"a": "x", "b": "y"}))
    yield "encode({'text': 'x'}) (sentence-transformers' text form)", _call(lambda: enc.encode({"text": "x"}))
    yield "encode({'hello', 'world'})", _call(lambda: enc.encode({"hello", "world"}))
    yield "encode(b'hello')", _call(lambda: enc.encode(b"hello"))
    yield "encode(t for t in ['a', 'b'])", _call(lambda: enc.encode(t for t in ["a", "b"]))
    yield "encode(['a', 'b'], truncate_dim=1000)", _call_warning(lambda: enc.encode(["a", "b"], truncate_dim=1000))


def predict_cases():
    from sentemb_jax.cross_encoder import CrossEncoder

    cross = CrossEncoder.from_pretrained(packaged_minilm_path())
    pairs = [("a", "b"), ("c", "d")]
    yield "predict(pairs, batch_size=2.5)", _call(lambda: cross.predict(pairs, batch_size=2.5))
    yield "predict(pairs, batch_size='8')", _call(lambda: cross.predict(pairs, batch_size="8"))
    yield "predict(np.array(pairs)) (shape [2, 2] of str)", _call(lambda: cross.predict(np.array(pairs)))
    yield "predict(('a', 'b')) (one pair)", _call(lambda: cross.predict(("a", "b")))
    yield "predict(p for p in pairs)", _call(lambda: cross.predict(p for p in pairs))


def mteb_cases():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import mteb
    from torch.utils.data import DataLoader

    from sentemb_jax.evaluation.mteb_adapter import MtebEncoder

    enc = MtebEncoder(SentenceEncoder.from_pretrained(packaged_minilm_path()))
    kwargs = dict(task_metadata=mteb.get_task("STSBenchmark").metadata, hf_split="test", hf_subset="default")
    rows = DataLoader([{"text": "hello"}, {"text": "a man"}], batch_size=None)  # a batch per row: 'text' is a str
    yield "MtebEncoder.encode(batches {'text': 'hello'}, {'text': 'a man'})", _call(lambda: enc.encode(rows, **kwargs))
    yield "MtebEncoder.encode(a batch {'text': {'a', 'b'}})", _call(lambda: enc.encode(iter([{"text": {"a", "b"}}]), **kwargs))


def train_cases(tmp: str, data_dir: str):
    blocker = os.path.join(tmp, "file")
    open(blocker, "w").close()
    base = ["--gin_file=gin/models/minilm_student.gin", "--gin_file=gin/runs/congen_cpu.gin", f"--gin.DATA_DIR='{data_dir}'"]
    yield "MODEL_DIR not writable", _main(base + [f"--gin.MODEL_DIR='{blocker}/sub'"])
    nli_stsb = os.path.join(tmp, "nli_stsb")  # NLI and STS-B only
    os.makedirs(nli_stsb)
    for name in ("nli", "stsb"):
        os.symlink(os.path.join(data_dir, name), os.path.join(nli_stsb, name))
    nli = ["--gin_file=gin/models/minilm_l6.gin", "--gin_file=gin/runs/minilm_nli.gin", f"--gin.MODEL_DIR='{tmp}/t0'", f"--gin.DATA_DIR='{nli_stsb}'"]
    yield "the training task's file missing (QA + NLI mixture, no qa/)", _main(nli + ["--gin.sentemb_jax.DataConfig.task='qa_nli_pairs'"])
    yield "MODEL_PATH missing (training)", _main(nli + [f"--gin.MODEL_PATH='{tmp}/absent_model'"])
    yield "task name unknown", _main(base + [f"--gin.MODEL_DIR='{tmp}/t1'", "--gin.sentemb_jax.DataConfig.task='nosuch'"])
    yield "ConGen with a view1 drawn anew each epoch", _main(
        base + [f"--gin.MODEL_DIR='{tmp}/t2'", "--gin.sentemb_jax.DataConfig.views=('word_deletion', 'none')"])
    yield "queue_init='data' without a teacher", _main(
        ["--gin_file=gin/models/minilm_student.gin", "--gin_file=gin/runs/sct_cpu.gin", f"--gin.MODEL_DIR='{tmp}/t3'", "--gin.sentemb_jax.SCT.queue_init='data'"])


def main() -> None:
    data_dir = default_data_dir()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for group, cases in (("data", data_cases(tmp)), ("gin", gin_cases(tmp)), ("checkpoint", checkpoint_cases(tmp, data_dir)),
                             ("encode()", encode_cases()), ("predict()", predict_cases()), ("MTEB", mteb_cases()),
                             ("job", train_cases(tmp, data_dir))):
            for name, (outcome, message) in cases:
                rows.append((group, name, outcome, message.replace(tmp, "$TMP").replace(data_dir, "$DATA")))
                logging.getLogger().handlers.clear()
    print("| kind | bad input | exit code / exception | message |\n|---|---|---|---|")
    for group, name, outcome, message in rows:
        cell = message.replace("|", "\\|")
        print(f"| {group} | {name} | {outcome} | `{cell}` |")


if __name__ == "__main__":
    main()

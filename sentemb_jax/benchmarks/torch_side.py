"""The sentence-transformers side of the side-by-side benchmarks (encode_throughput, train_throughput):
everything that imports torch and sentence-transformers. Those two take about 6 s to import. A
benchmark loads this module only in the process that runs sentence-transformers (its worker), and in
the parent only to check a GPU run. So our JAX workers start without them, and on a GPU host torch
never starts CUDA in a JAX worker's process.
"""
from __future__ import annotations

import contextlib

import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import losses
from sentence_transformers.util import batch_to_device

from sentemb_jax.benchmarks.machine import device_description
from sentemb_jax.errors import UsageError


def apply_torch_fp32_matmul(settings: dict) -> None:
    """In a torch worker, before its model is built: the float32 matmul mode of
    machine.fp32_matmul_settings (cuBLAS: IEEE or TF32); on the CPU nothing changes."""
    if not settings["torch_fp32_precision"]:
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; mixing it with the legacy allow_tf32 is an error there
        matmul.fp32_precision = settings["torch_fp32_precision"]
    else:
        matmul.allow_tf32 = settings["torch_fp32_precision"] == "tf32"


def check_torch_finds(device: str, devices) -> None:
    """A UsageError, before any model loads, where JAX finds the GPU but torch does not (a CPU build of
    torch, a driver only JAX's CUDA libraries work with): sentence-transformers' rows need it."""
    if device == "gpu" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a build without CUDA"
        raise UsageError(f"--device gpu: JAX finds {device_description(devices)} but torch {torch.__version__} "
                         f"({build}) finds no CUDA device, so sentence-transformers cannot run there")


def load_model(model_dir: str, settings: dict, threads: int) -> SentenceTransformer:
    """sentence-transformers' model on settings' device, torch on `threads` CPU threads, the float32
    matmul mode set first."""
    torch.set_num_threads(threads)
    apply_torch_fp32_matmul(settings)
    transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bar, once per worker
    return SentenceTransformer(model_dir, device=settings["torch_device"])


def autocast(settings: dict, bf16: bool):
    """torch's mixed precision on settings' device (bf16 matmuls, float32 weights), or nothing."""
    return torch.autocast(settings["torch_device"], dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def mnrl_train_run(model_dir: str, batches, settings: dict, threads: int, bf16: bool):
    """run(): sentence-transformers' MNRL steps over `batches` on settings' device, AdamW at 2e-5;
    bf16: the forward (and the loss) under autocast, the backward and AdamW on the float32 weights."""
    device = settings["torch_device"]
    model = load_model(model_dir, settings, threads)
    model.max_seq_length = 64
    loss_fn = losses.MultipleNegativesRankingLoss(model, scale=20.0)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model.train()

    def run():
        for b in batches:
            feats = [batch_to_device(model.preprocess([p[i] for p in b]), device) for i in (0, 1)]
            with autocast(settings, bf16):
                loss = loss_fn(feats, None)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float(loss.detach())  # waits for the device
    return run

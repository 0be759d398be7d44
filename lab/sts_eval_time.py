"""Wall time of the 7-task STS evaluation (STS12-16, STS-B test, SICK-R) of all-MiniLM-L6-v2.

    python -m lab.sts_eval_time [--sickr_test_path FILE] [--data_dir DIR] [--batch_size 64]

Times, in one fresh process: loading the model, then `evaluate_sts_tasks` (reading the files,
encoding every distinct sentence once - JIT compilation included - and the correlations). SICK-R
defaults to `sick/sick_r_trial.tsv` (the test split is not in the shared data). The budget is
120 s on the 2-core CPU; the load average is printed because another process sharing the cores
slows encoding roughly in proportion. Last line: `sts_eval_seconds=<load + evaluation>`.
"""
from __future__ import annotations

import argparse
import os
import time

from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.evaluation.encoding import EmbeddingCache
from sentemb_jax.evaluation.sts import evaluate_sts_tasks
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.paths import default_data_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--sickr_test_path", default=None, help="default: <data_dir>/sick/sick_r_trial.tsv")
    parser.add_argument("--model_path", default=None, help="default: the shipped all-MiniLM-L6-v2")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--budget_s", type=float, default=120.0)
    args = parser.parse_args()
    data_dir = args.data_dir or default_data_dir()
    sickr = args.sickr_test_path or os.path.join(data_dir, "sick", "sick_r_trial.tsv")

    start = time.perf_counter()

    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores)")
    model = EmbeddingCache(SentenceEncoder.from_pretrained(args.model_path or packaged_minilm_path()))
    loaded = time.perf_counter()
    report = evaluate_sts_tasks(model, data_dir, sickr, "all", args.batch_size)
    done = time.perf_counter()
    print("  ".join(f"{task}={value:.2f}" for task, value in report.spearman.items()))
    print(f"sentences encoded: {len(model)}  pairs: {sum(report.pairs.values())}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"model_load_seconds={loaded - start:.1f}  evaluation_seconds={done - loaded:.1f}")
    total = done - start
    print(f"within_budget={total <= args.budget_s} (budget {args.budget_s:.0f} s)")
    print(f"sts_eval_seconds={total:.1f}")


if __name__ == "__main__":
    main()

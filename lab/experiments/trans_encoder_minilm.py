"""The experiment: Trans-Encoder from all-MiniLM-L6-v2 (A) and from its first three layers (B).

    python -m lab.experiments.trans_encoder_minilm --out runs/tenc [--runs self_B ...] [--cycles 1]

1. Writes B: A's embeddings and first three Transformer layers (a sentence-transformers directory,
   mean pooling + normalise, like A).
2. Runs each named configuration as a job (`python -m sentemb_jax.main --gin_file=gin/runs/
   trans_encoder_sts_cpu.gin ...`) on the unlabelled STS-B train+dev and SICK-R train+trial pairs;
   selection on STS-B dev, STS-B test reported after every phase (model_dir/results.json).
3. Prints one table: start, each cross-encoder and bi-encoder after each cycle, STS-B dev / test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.hub import packaged_minilm_path

STS_GIN = "gin/runs/trans_encoder_sts_cpu.gin"
PAIRS_GIN = "gin/runs/trans_encoder_pairs_cpu.gin"
FIXED_GIN = "gin/runs/trans_encoder_sts_cpu_from_bi.gin"  # the study's selection: bi->cross lr 1e-4
MUTUAL_GIN = "gin/runs/trans_encoder_mutual_sts_cpu.gin"  # FIXED_GIN + mutual + the cross head on the token mean
FIXED = ["--gin.bi_to_cross/sentemb_jax.DistillPhase.learning_rate=1e-4"]
B2C = "--gin.bi_to_cross/sentemb_jax.DistillPhase"
# name -> (bi-encoders ("A" / "B"), gin file, extra bindings; "@A" / "@B" stand for the model paths).
# self_* and mutual_AB are the paper's recipe; B_* vary one thing of B's bi -> cross phase (the
# obstacle study, selected on STS-B dev); *_fixed use what the study selected (FIXED_GIN).
RUNS = {
    "self_A": (["A"], STS_GIN, []),
    "self_B": (["B"], STS_GIN, []),
    "mutual_AB": (["A", "B"], STS_GIN, []),
    "B_standardize": (["B"], STS_GIN, [f"{B2C}.relabel='standardize'"]),
    "B_minmax": (["B"], STS_GIN, [f"{B2C}.relabel='minmax'"]),
    "B_mean_head": (["B"], STS_GIN, ["--gin.sentemb_jax.trans_encoder.cross_pooling='mean'"]),
    "B_lr1e-4": (["B"], STS_GIN, [f"{B2C}.learning_rate=1e-4"]),
    "B_standardize_lr1e-4": (["B"], STS_GIN, [f"{B2C}.relabel='standardize'", f"{B2C}.learning_rate=1e-4"]),
    "B_lr3e-4": (["B"], STS_GIN, [f"{B2C}.learning_rate=3e-4"]),
    "B_mean_head_lr1e-4": (["B"], STS_GIN, ["--gin.sentemb_jax.trans_encoder.cross_pooling='mean'", f"{B2C}.learning_rate=1e-4"]),
    "B_cross_from_A": (["B"], STS_GIN, ["--gin.sentemb_jax.trans_encoder.cross_encoders=['@A']"]),
    "pairs_B": (["B"], PAIRS_GIN, []),
    "self_A_fixed": (["A"], FIXED_GIN, []),
    "mutual_AB_fixed": (["A", "B"], FIXED_GIN, []),
    "pairs_B_fixed": (["B"], PAIRS_GIN, FIXED),
    "B_cross_from_A_fixed": (["B"], FIXED_GIN, ["--gin.sentemb_jax.trans_encoder.cross_encoders=['@A']"]),
    # the cross-encoder setting with the study's best cross dev (B_mean_head_lr1e-4), for both models
    "mutual_AB_mean_head": (["A", "B"], MUTUAL_GIN, []),
}
DEFAULT_RUNS = ["self_B", "B_standardize", "B_lr1e-4", "B_lr3e-4", "B_mean_head", "B_mean_head_lr1e-4", "self_A_fixed",
                "mutual_AB_fixed", "mutual_AB_mean_head", "pairs_B_fixed"]


def make_truncated(src: str, out: str, layers: int = 3) -> str:
    """A sentence-transformers directory holding the first `layers` layers of the BERT-family model `src`."""
    if os.path.isfile(os.path.join(out, "modules.json")):
        return out
    small = SentenceEncoder.from_pretrained(src).first_layers(layers)
    small.save_pretrained(out)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/tenc")
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, choices=list(RUNS))
    parser.add_argument("--cycles", type=int, default=None, help="override the gin file's cycle count")
    parser.add_argument("--rerun", action="store_true", help="run again configurations that have results")
    args = parser.parse_args(argv)

    models = {"A": packaged_minilm_path(), "B": make_truncated(packaged_minilm_path(), os.path.join(args.out, "B_minilm_l3"))}
    for name in args.runs:
        bis, gin_file, extra = RUNS[name]
        extra = [x.replace("@A", models["A"]).replace("@B", models["B"]) for x in extra]
        cmd = [sys.executable, "-m", "sentemb_jax.main", "--gin_file=gin/models/minilm_l6.gin", f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{os.path.join(args.out, name)}'",
               f"--gin.BI_ENCODERS={[models[m] for m in bis]!r}", *extra]
        if args.cycles:
            cmd.append(f"--gin.sentemb_jax.trans_encoder.cycles={args.cycles}")
        if os.path.isfile(os.path.join(args.out, name, "results.json")) and not args.rerun:
            print(f"{name}: done before (results.json), not rerun", flush=True)
            continue
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    for name in args.runs:
        print_table(name, os.path.join(args.out, name, "results.json"))


def print_table(name: str, path: str) -> None:
    with open(path) as f:
        res = json.load(f)
    cols = list(res["models"][0]["start"])  # dev, then the report sets (stsb_test / mrpc_test)

    def row(label: str, s: dict) -> str:
        return f"  {label:24s}" + "".join(f"{s.get(c, float('nan')):10.2f}" for c in cols)

    print(f"\n{name}: x 100 ({res['pairs']} unlabelled pairs, schedule {res['schedule']}, mutual {res['mutual']})")
    print(f"  {'':24s}" + "".join(f"{c:>10s}" for c in cols))
    for i, m in enumerate(res["models"]):
        print(row(f"model {i} start", m["start"]))
        for c in res["cycles"]:
            for kind in ("cross", "bi"):
                print(row(f"model {i} cycle {c['cycle']} {kind}", c["models"][i][kind]))
    for key, kept in sorted(res.get("best", {}).items()):  # best by dev over all epochs: the saved *_best models
        model, kind = key.split("/")
        print(row(f"model {model.split('_')[1]} kept {kind} (c{kept['cycle']})", kept))
    for c in res["cycles"]:
        if "ensemble" in c:
            for kind in ("cross", "bi"):
                print(row(f"ensemble cycle {c['cycle']} {kind}", c["ensemble"][kind]))
        print(f"  cycle {c['cycle']}: {c['seconds'] / 60:.1f} min; bi labels {c['bi_labels'][0]}; "
              f"cross labels {c['cross_labels'][0]}")


if __name__ == "__main__":
    main()

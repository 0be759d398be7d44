"""Job runner: `python -m sentemb_jax.main --gin_file=gin/<job>.gin [--gin.KEY=VALUE ...]`.

The job (evaluate, and later train / export / distill ...) is chosen in gin through `run.job`.
Bad gin (unknown binding, syntax error, missing required value) -> a message naming the key on
stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import gin

REPO_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")

USAGE = "python -m sentemb_jax.main --gin_file=FILE [--gin_file=FILE ...] [--gin.KEY=VALUE ...] [--gin_search_path=DIR]"


class UsageError(Exception):
    """Bad command line or gin configuration (exit code 2)."""


def register_configurables() -> None:
    """Import every module that defines gin configurables, so bindings can name them."""
    import sentemb_jax.evaluation.jobs  # noqa: F401
    import sentemb_jax.jobs  # noqa: F401
    import sentemb_jax.methods.queue_distill  # noqa: F401
    import sentemb_jax.methods.trans_encoder  # noqa: F401
    import sentemb_jax.training.trainer  # noqa: F401


def parse_args(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    parser = argparse.ArgumentParser(prog="sentemb_jax.main", usage=USAGE)
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument("--gin_search_path", action="append", default=[], help="extra directory for gin includes")
    args, rest = parser.parse_known_args(argv)
    bindings = []
    for arg in rest:
        if arg.startswith("--gin.") and "=" in arg:
            key, value = arg[len("--gin."):].split("=", 1)
            bindings.append(f"{key} = {value}")
        else:
            raise UsageError(f"unrecognised argument {arg!r} (bindings are --gin.KEY=VALUE)\nusage: {USAGE}")
    if not args.gin_file:
        raise UsageError(f"no --gin_file given\nusage: {USAGE}")
    return args.gin_file, bindings, args.gin_search_path


def parse_gin(files: list[str], bindings: list[str], search_paths: list[str] = ()) -> None:
    # Each invocation is one job: start from an empty, unlocked config so main() can be called
    # again in the same process (tests, notebooks) without "Attempted to modify locked Gin config".
    gin.clear_config()
    for path in [os.getcwd(), os.path.dirname(REPO_GIN_DIR), REPO_GIN_DIR, *search_paths]:
        gin.add_config_file_search_path(path)
    for f in files:
        if not any(os.path.isfile(os.path.join(p, f)) for p in ["", os.getcwd(), os.path.dirname(REPO_GIN_DIR), *search_paths]):
            raise UsageError(f"--gin_file={f}: no such file")
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=True)
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
        raise UsageError(f"gin configuration error: {e}") from None


@gin.configurable
def run(job=gin.REQUIRED):
    """Runs the job chosen in gin (`run.job = @some_job`)."""
    return job()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU" noise on CPU
    argv = sys.argv[1:] if argv is None else argv
    from sentemb_jax.checkpoints import CheckpointError
    from sentemb_jax.data.files import DataError
    from sentemb_jax.tokenization import TokenizerError
    from sentemb_jax.training.trainer import TrainingError

    try:
        register_configurables()
        files, bindings, search = parse_args(argv)
        parse_gin(files, bindings, search)
        try:
            run()
        except RuntimeError as e:
            # gin raises RuntimeError("Required bindings for `x` not provided in config: [...]").
            if "Required bindings" in str(e):
                raise UsageError(f"gin configuration error: {e}") from None
            raise
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, DataError, TokenizerError, TrainingError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

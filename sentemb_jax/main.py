"""Job runner: `python -m sentemb_jax.main --gin_file=gin/<job>.gin [--gin.KEY=VALUE ...]`.

The job (evaluate, and later train / export / distill ...) is chosen in gin through `run.job`.
Bad gin (unknown binding, syntax error, missing required value, a value of the wrong type) -> a
message naming the key on stderr and exit code 2. A bad input found by the job (data file,
checkpoint, model directory, a config's validation) -> its message and exit code 1.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import sys
import threading
import tokenize
import traceback

from gin.config import ParserDelegate

import gin
from gin import config_parser
from sentemb_jax import configuration
from sentemb_jax.configuration import UNSET, ConfigurableReference, bound_value
from sentemb_jax.console import Console
from sentemb_jax.dependencies import require_tensorflow
from sentemb_jax.errors import ConfigError, Interrupted, Preempted, SentembError, UsageError, signal_name

REPO_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")

USAGE = ("python -m sentemb_jax.main --gin_file=FILE [--gin_file=FILE ...] [--gin.KEY=VALUE ...] [--gin_search_path=DIR] "
         "[--gin_search_paths=DIR,DIR] [--tfds_data_dir=DIR] [--verbosity=0|1|2]")


def register_configurables() -> None:
    """Import every job (sentemb_jax.jobs), so bindings can name them and what they configure."""
    import sentemb_jax.jobs  # noqa: F401  # lazy: only once the console has taken stderr (TF / JAX import chatter)


def gin_bindings(args: list[str]) -> tuple[list[str], list[str]]:
    """`--gin.KEY=VALUE` arguments as gin binding lines `KEY = VALUE`, and the arguments that are not."""
    bindings, unknown = [], []
    for arg in args:
        if arg.startswith("--gin.") and "=" in arg:
            key, value = arg[len("--gin."):].split("=", 1)
            bindings.append(f"{key} = {value}")
        else:
            unknown.append(arg)
    return bindings, unknown


def parse_args(argv: list[str]) -> tuple[list[str], list[str], list[str], str | None]:
    """(gin files, bindings, search paths, tfds_data_dir). t5x's spellings are accepted beside
    ours: --gin_search_paths=a,b (comma-separated) and --tfds_data_dir."""
    parser = argparse.ArgumentParser(prog="sentemb_jax.main", usage=USAGE)
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument("--gin_search_path", action="append", default=[], help="extra directory for gin includes")
    parser.add_argument("--gin_search_paths", action="append", default=[], help="t5x's spelling: comma-separated directories")
    parser.add_argument("--tfds_data_dir", default=None, help="where TFDS-backed seqio tasks read prepared datasets "
                        "(as t5x: overrides every task's tfds_data_dir)")
    parser.add_argument("--verbosity", default="0", help="0: our lines only (default); 1: + library warnings; "
                        "2: + library INFO. Everything goes to the log file (MODEL_DIR/run.log)")
    args, rest = parser.parse_known_args(argv)
    bindings, unknown = gin_bindings(rest)
    if unknown:
        raise UsageError(f"unrecognised argument {unknown[0]!r} (bindings are --gin.KEY=VALUE)\nusage: {USAGE}")
    if not args.gin_file:
        raise UsageError(f"no --gin_file given\nusage: {USAGE}")
    search = list(args.gin_search_path) + [p for arg in args.gin_search_paths for p in arg.split(",") if p]
    for path in search:
        if not os.path.isdir(path):
            raise UsageError(f"--gin_search_path(s)={path}: no such directory")
    if args.tfds_data_dir is not None and not args.tfds_data_dir:
        raise UsageError("--tfds_data_dir: empty (give a directory, or leave the flag out)")
    return args.gin_file, bindings, search, args.tfds_data_dir


def gin_file_exists(path: str, search_paths=()) -> bool:
    """Whether a --gin_file resolves: as given, under the working directory, the repository or a search path."""
    return any(os.path.isfile(os.path.join(p, path)) for p in ["", os.getcwd(), os.path.dirname(REPO_GIN_DIR), *search_paths])


def parse_gin(files: list[str], bindings: list[str], search_paths: list[str] = (), placeholders: list[str] = ()) -> None:
    """`placeholders`: bindings a tool adds before the user's (e.g. a stand-in TOKENIZER_DIR for an
    abstract build), not checked for being read."""
    # Each invocation is one job: start from an empty, unlocked config so main() can be called
    # again in the same process (tests, notebooks) without "Attempted to modify locked Gin config".
    gin.clear_config()
    prefixes = [os.getcwd(), os.path.dirname(REPO_GIN_DIR), REPO_GIN_DIR, *search_paths]
    for path in prefixes:
        gin.add_config_file_search_path(path)
    for f in files:
        if not gin_file_exists(f, search_paths):
            raise UsageError(f"--gin_file={f}: no such file")
    texts = configuration.read_gin_files(files, ["", *prefixes])  # an include cycle: named, before gin recurses
    try:
        gin.parse_config_files_and_bindings(files, [*placeholders, *bindings], finalize_config=True)
    except (SyntaxError, tokenize.TokenError) as e:  # TokenError: unclosed brackets
        bad = _unparseable_binding(e, [*placeholders, *bindings])
        if bad is not None and isinstance(e, SyntaxError):
            raise UsageError(configuration.unparseable_binding(bad)) from None
        where = f" in --gin.{bad.replace(' = ', '=', 1)} (an unclosed bracket or quote)" if bad is not None else ""
        raise UsageError(f"gin configuration error: {configuration.short_gin_error(e)}{where}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"gin configuration error: {configuration.short_gin_error(e)}") from None
    unread = configuration.unread_macros(bindings, texts)
    if unread:
        raise UsageError("gin configuration error: " + "; ".join(unread))
    wrong = configuration.binding_type_errors()
    if wrong:
        raise UsageError("gin configuration error: " + "; ".join(wrong))


def _unparseable_binding(error: Exception, bindings: list[str]) -> str | None:
    """The --gin. binding a gin parse error is about, None when it is about a file. gin parses the
    bindings as one text, a line each: a SyntaxError without a file names the line; otherwise
    (TokenError: an unclosed bracket) the first binding that does not parse on its own."""
    if isinstance(error, SyntaxError) and error.filename:
        return None
    line = getattr(error, "lineno", None)
    if isinstance(error, SyntaxError) and isinstance(line, int) and 1 <= line <= len(bindings) \
            and (error.text or "").strip() == bindings[line - 1].strip():
        return bindings[line - 1]
    for binding in bindings:
        try:
            list(config_parser.ConfigParser(binding, ParserDelegate(skip_unknown=True)))
        except (SyntaxError, tokenize.TokenError):
            return binding
        except Exception:  # noqa: BLE001 - other errors are not about parsing
            continue
    return None


def check_run_job() -> None:
    """`run.job` must be a reference to a job, `@sentemb_jax.evaluate_stsb` (checked before it runs:
    `@job()` would run it while the arguments of `run` are read, a string is not a job)."""
    key = next((k for k in ("run.job", "sentemb_jax.main.run.job", "__main__.run.job")
                if bound_value(k) is not UNSET), None)
    if key is None:
        return  # unbound: gin's "Required bindings" message
    try:
        raw = gin.query_parameter(key)
    except (ValueError, KeyError):
        return
    value = bound_value(key)
    if isinstance(value, ConfigurableReference):
        if value.evaluate:
            name = value.configurable.selector
            raise ConfigError(f"gin binding run.job = @{name}(): the parentheses would run the job while run's "
                             f"arguments are read; write run.job = @{name} (no parentheses)")
        return
    if callable(value):
        return
    shown = f"{key} = %{raw.scoped_selector.rsplit('/', 1)[0]}" if isinstance(raw, ConfigurableReference) else key
    raise ConfigError(f"gin binding {shown} = {value!r} is a {type(value).__name__}, not a job: "
                      f"write run.job = @{configuration.suggest_job(value)} (a reference to the job, with @)")



@gin.configurable
def run(job=gin.REQUIRED, compilation_cache_dir: str | None = None, xla_options: tuple[str, ...] = ()):
    """Runs the job chosen in gin (`run.job = @some_job`). compilation_cache_dir: keep XLA's compiles
    there (sentemb_jax.compile_cache): a restarted job loads them instead of compiling again.
    xla_options: named XLA GPU options (sentemb_jax.xla_options), applied before anything touches a
    device (_run_job, before the job and the multi-host set-up)."""
    if not callable(job):
        raise UsageError(f"run.job = {job!r} is a {type(job).__name__}, not a job: write run.job = @{configuration.suggest_job(job)} "
                         "(a reference to the job, with @)")
    if compilation_cache_dir is not None:
        from sentemb_jax.compile_cache import enable_compilation_cache  # lazy: imports jax (console first)

        logging.getLogger(__name__).info("compilation cache: %s", enable_compilation_cache(compilation_cache_dir))
    return job()


def split_gin_context(message: str) -> tuple[str, list[str]]:
    """gin appends "  In call to configurable 'x' (<function ...>)" lines to an exception's
    message: the message alone (for the console) and those lines (for the log file)."""
    lines = message.split("\n")
    context = [line for line in lines if _GIN_CONTEXT.match(line)]
    return "\n".join(line for line in lines if not _GIN_CONTEXT.match(line)).rstrip(), context


_GIN_CONTEXT = re.compile(r"^\s+In call to configurable '")


def _apply_xla_options() -> None:
    try:
        names = gin.query_parameter("run.xla_options")
    except (ValueError, KeyError):
        return
    from sentemb_jax.xla_options import apply_xla_options  # lazy: only after the console has taken stderr

    flags = apply_xla_options(names, _model_dir_of_config(), where="gin binding run.xla_options")
    if flags:
        logging.getLogger(__name__).info("XLA options: %s", " ".join(flags))


def _model_dir_of_config() -> str | None:
    try:
        value = gin.query_parameter("MODEL_DIR/gin.macro.value")
    except (ValueError, KeyError):
        return None
    return value if isinstance(value, str) and value else None


# errno -> how the error line words it: what stops a save (a checkpoint, metrics, an export) on a
# full or unwritable disk. tensorstore (orbax's array writer) raises ValueError with the OS error
# in its text ("... No space left on device [os_error_code='28']"), so the text is read as well.
_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                   errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                   errno.EROFS: "read-only file system"}
_STORAGE_TEXT = [(re.compile(r"No space left on device|os_error_code='28'"), errno.ENOSPC),
                 (re.compile(r"Disk quota exceeded|os_error_code='122'"), errno.EDQUOT),
                 (re.compile(r"Read-only file system|os_error_code='30'"), errno.EROFS),
                 (re.compile(r"Permission denied|os_error_code='13'"), errno.EACCES)]
_QUOTED_PATH = re.compile(r'"(/[^"]+)"')


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def storage_error(error: BaseException, model_dir: str | None = None) -> str | None:
    """`cannot write <path>: no space left on device (...)` when `error` (or one it was raised
    from) is a full disk, an exceeded quota, a read-only file system or a permission refused;
    None otherwise. The path is the file the OS error names, else the first path in the message,
    else MODEL_DIR."""
    code, path = None, None
    for e in _chain(error):
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            code, path = e.errno, e.filename
            break
        text = str(e)
        found = next((c for pattern, c in _STORAGE_TEXT if pattern.search(text)), None)
        if found is not None:
            code = found
            quoted = _QUOTED_PATH.search(text)
            path = quoted.group(1) if quoted else None
            break
    if code is None:
        return None
    path = os.fsdecode(path) if path is not None else (model_dir or "MODEL_DIR")
    what = _STORAGE_ERRNOS[code]
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = _free_space(path)
        hint = (f"{free} free there; " if free else "") + ("free some space or choose another MODEL_DIR, then run "
                                                           "the same command: a train run resumes from its last checkpoint")
    else:
        hint = "give a MODEL_DIR this user can write, then run the same command"
    return f"cannot write {path}: {what} ({hint}; details in the log)"


def _free_space(path: str) -> str | None:
    """`0.00 GiB` free on the file system holding `path` (its nearest existing parent); None when unknown."""
    if "://" in path:
        return None
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        return f"{shutil.disk_usage(probe).free / 2**30:.2f} GiB"
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        verbosity = _verbosity(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    console = Console(verbosity, argv).start()
    try:
        with _signals_interrupt():
            return _run_job(argv, console)
    finally:
        console.finish()


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGINT raise Interrupted wherever the job is (the train loop sets its own
    handlers: it checkpoints first), so every phase unwinds: a phase with child processes stops
    them, temporary files go, one line says what was kept. Python's default SIGTERM kills at
    once, leaving children and no line."""
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield
        return

    def interrupt(signum, _frame):
        raise Interrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run_job(argv: list[str], console) -> int:
    def fail(e: BaseException, code: int, prefix: str = "") -> int:
        # An error naming an API argument is worded as the gin binding that set it.
        message, context = split_gin_context(configuration.reword(e) if isinstance(e, SentembError) else str(e))
        storage = storage_error(e, _model_dir_of_config()) if code == 1 else None
        if storage is not None:  # a full disk / no permission while saving: not a bug, one line
            message, prefix = storage, ""
        if code != 2:
            console.log_only("".join(traceback.format_exception(e)))
            if os.environ.get("SENTEMB_TRACEBACK"):
                traceback.print_exception(e)  # sys.stderr: the console
        else:
            console.log_only("\n".join(context))
        if code != 2:
            console.settle()  # the log is in MODEL_DIR if the job got as far as creating it
            console.say(f"log: {console.log_path}")
        console.say(f"error: {prefix}{message}")
        return code

    try:
        files, bindings, search, tfds_data_dir = parse_args(argv)
        register_configurables()
        parse_gin(files, bindings, search)
        check_run_job()  # a string or @job() is refused before anything runs
        _apply_xla_options()  # XLA reads its flags when the backend starts: before any device is touched
        if tfds_data_dir:
            require_tensorflow("--tfds_data_dir (TFDS-backed seqio tasks)")
            import seqio  # lazy: imports TF, only once the console has taken stderr

            seqio.set_tfds_data_dir_override(tfds_data_dir)
        from sentemb_jax.distributed import initialize_distributed, process_index  # lazy: jax after the console

        several = initialize_distributed()  # multi-host runs: before anything touches a device
        model_dir = _model_dir_of_config()
        process = process_index() if several else 0
        console.use_model_dir(model_dir, process)
        try:
            run()
        except RuntimeError as e:
            # gin raises RuntimeError("Required bindings for `x` not provided in config: [...]").
            if "Required bindings" in str(e):
                raise UsageError(f"gin configuration error: {split_gin_context(str(e))[0]}") from None
            raise
        if model_dir and process == 0:
            _keep_gin_config(model_dir, console)
    except Preempted as e:  # SIGTERM / Ctrl-C in training: checkpointed, resumable
        message, context = split_gin_context(str(e))
        console.log_only("\n".join(context))
        console.say(f"stopped by {message}")
        return e.exit_code
    except SentembError as e:  # ours (sentemb_jax.errors): its exit code - 2 usage / config, 1 bad input
        return fail(e, e.exit_code)
    except KeyboardInterrupt as e:  # Interrupted (a signal outside the train loop), or a second Ctrl-C in it
        return _interrupted(e, console)
    except (FileNotFoundError, ValueError) as e:
        # Bad values found by a library or a config's own validation (e.g. a dataclass's
        # __post_init__) end the job with their message; the traceback goes to the log file.
        return fail(e, 1)
    except Exception as e:  # noqa: BLE001 - a bug: one line here, the traceback in the log file
        return fail(e, 1, f"unexpected {type(e).__name__} (a bug; its traceback is in the log): ")
    return 0


def _verbosity(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg == "--verbosity" or arg.startswith("--verbosity="):
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            if value not in ("0", "1", "2"):
                raise UsageError(f"--verbosity={value}: must be 0 (our lines), 1 (+ library warnings) or 2 (+ library INFO)")
            return int(value)
    return 0


def _interrupted(e: KeyboardInterrupt, console) -> int:
    """One line: the signal, what was kept, how to continue."""
    signum = getattr(e, "signum", signal.SIGINT)
    console.log_only("".join(traceback.format_exception(e)))
    kept = list(getattr(e, "kept", []))
    model_dir = _model_dir_of_config()
    if not kept and model_dir:
        steps = _checkpoint_steps(model_dir)
        kept.append(f"{model_dir} keeps its checkpoints (the last of step {max(steps)})" if steps
                    else "no checkpoint of this run was written yet")
    console.say(f"stopped by {signal_name(signum)}: {'; '.join(kept) or 'nothing was written'}; "
                "run the same command to continue")
    return 128 + signum


def _checkpoint_steps(model_dir: str) -> list[int]:
    """The steps of MODEL_DIR/checkpoints/<step> (orbax's finished checkpoints; run_dir.CHECKPOINTS,
    read without importing orbax)."""
    try:
        names = os.listdir(os.path.join(model_dir, "checkpoints"))
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]


def _keep_gin_config(model_dir: str, console) -> None:
    """MODEL_DIR/config.gin, as t5x writes it, once a job has finished (the train job writes it
    at its start; a failed or refused job adds nothing to MODEL_DIR but its log)."""
    from sentemb_jax.run_dir import keep_gin_config  # lazy: imports orbax / jax, only once the console has taken stderr

    try:
        written = keep_gin_config(model_dir, gin.config_str(), gin.markdown(gin.config_str()))
    except OSError as e:  # the job's own outcome matters more than this record
        console.log_only(f"could not write config.gin in {model_dir}: {e}")
        return
    if written:
        console.log_only(f"gin config written to {written}")


def _exit_within(seconds: float, code: int) -> None:
    """A runtime thread that blocks interpreter shutdown must not keep a finished job alive: exit
    anyway `seconds` after main() returned (normal shutdown, atexit handlers included, first)."""
    timer = threading.Timer(seconds, os._exit, args=(code,))
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    exit_code = main()
    _exit_within(30.0, exit_code)
    sys.exit(exit_code)

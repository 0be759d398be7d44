"""What a job prints, and the log file that keeps everything else.

The console (stderr) gets our own lines: the `sentemb_jax.*` loggers at INFO as plain text (their
warnings as `warning: ...`), progress bars, tables on stdout, and the error as the last line.
Library records (orbax, absl, TensorFlow, jax, matplotlib, ...) and the native stderr of the C++
runtimes (TensorFlow / XLA / libtpu start-up lines) go to the log file only, unless
`--verbosity` asks for them:

  0 (default)  as above;
  1            library warnings and errors on the console as well, native stderr left alone;
  2            every library record at INFO on the console.

The log file holds every record at INFO (DEBUG with verbosity 2), the native stderr, the gin
context of an error and the traceback of an unexpected one. It is `MODEL_DIR/run.log` when the
job has a MODEL_DIR (appended; each invocation starts with a header line), otherwise
`~/.cache/sentemb_jax/logs/<time>-<pid>.log`. The job starts writing to the latter and moves the
log into MODEL_DIR once that exists (at once for a resumed run; for a new one when the job has
created it, after its checks): a start refused before that leaves no MODEL_DIR behind.
"""
from __future__ import annotations

import datetime
import logging
import os
import sys
import threading
import traceback
import warnings

from sentemb_jax.paths import new_cache_log
from sentemb_jax.run_dir import RUN_LOG

OURS = "sentemb_jax"
LOG_NAME = RUN_LOG
_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class _ConsoleHandler(logging.Handler):
    """Writes to whatever `stream()` returns at emit time (pytest swaps sys.stderr per test)."""

    def __init__(self, verbosity: int, stream):
        super().__init__(logging.DEBUG)
        self.verbosity = verbosity
        self.stream = stream

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name == OURS or record.name.startswith(OURS + ".")
        if ours:
            return record.levelno >= logging.INFO
        return record.levelno >= (logging.INFO if self.verbosity >= 2 else logging.WARNING if self.verbosity >= 1
                                  else logging.CRITICAL + 1)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.name == OURS or record.name.startswith(OURS + "."):
                if record.levelno >= logging.WARNING:
                    msg = f"{record.levelname.lower()}: {msg}"
            else:
                msg = f"{record.name}: {record.levelname}: {msg}"
            stream = self.stream()
            stream.write(msg + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


class _FileHandler(logging.StreamHandler):
    """The log file's handler: a record that cannot be written (the disk is full) is dropped,
    not reported on the console with a `--- Logging error ---` traceback for every record."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        pass


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A Python warning: one of ours (a class or a call site in sentemb_jax, e.g. MissingDataWarning:
    a task omitted) is a console line; a library's goes to the log file only."""
    ours = category.__module__.startswith(OURS) or os.sep + OURS + os.sep in str(filename)
    if ours:
        logging.getLogger(OURS).warning("%s", message)
    else:
        logging.getLogger("py.warnings").warning("%s", warnings.formatwarning(message, category, filename, lineno, line))


class Console:
    """Set up by `start()`, pointed at MODEL_DIR by `use_model_dir()`, closed by `finish()`.

    In a command-line process (sys.stderr is the process's real stderr) file descriptor 2 is
    redirected into the log file at verbosity 0, so native libraries' start-up lines land there;
    our own lines go to a duplicate of the original stderr. Called in-process (tests, notebooks,
    where sys.stderr has been replaced) only the Python logging handlers are installed.
    """

    def __init__(self, verbosity: int = 0, argv: list[str] | None = None):
        self.verbosity = verbosity
        self.argv = list(argv or [])
        self.log_path: str | None = None
        self._file = None
        self._file_handler: logging.Handler | None = None
        self._console_handler: logging.Handler | None = None
        self._saved_root: tuple | None = None
        self._console_fd: int | None = None
        self._console_stream = None
        self._redirected = False
        self._temporary = False
        self._saved_showwarning = None
        self._saved_hooks: tuple | None = None
        self._pending: tuple[str, int] | None = None

    # -- set-up --------------------------------------------------------------------------------

    def start(self) -> "Console":
        self._open_log(new_cache_log(str(os.getpid())), temporary=True)
        if self.verbosity == 0 and sys.stderr is sys.__stderr__ and sys.__stderr__ is not None:
            self._redirect_native_stderr()
        root = logging.getLogger()
        self._saved_root = (root.level, list(root.handlers))
        for h in list(root.handlers):
            root.removeHandler(h)
        root.setLevel(logging.DEBUG if self.verbosity >= 2 else logging.INFO)
        stream = (lambda: self._console_stream) if self._redirected else (lambda: sys.stderr)
        self._console_handler = _ConsoleHandler(self.verbosity, stream)
        self._console_handler.addFilter(self._settle_filter)  # a new MODEL_DIR gets the log once it exists
        root.addHandler(self._console_handler)
        root.addHandler(self._file_handler)
        self._saved_showwarning = warnings.showwarning
        warnings.showwarning = _show_warning  # ours on the console as "warning: ...", libraries' in the log
        if self.verbosity < 2:
            self._take_exception_hooks()
        if self.verbosity < 1:
            # TensorFlow's C++ logging when stderr is not redirected (in-process calls).
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        return self

    def _take_exception_hooks(self) -> None:
        """Tracebacks that a library's threads and callbacks print themselves (sys.excepthook from
        a native thread's callback, threading.excepthook, sys.unraisablehook) go to the log file:
        orbax's writer threads print one `RuntimeError: Event loop is closed` per pending write
        when a save fails (194 on a full disk), before the job's error line. The job's own error
        is caught by main and still ends the console; --verbosity=2 keeps Python's hooks."""
        self._saved_hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)

        def to_log(kind: str, exc_type, exc, tb, where: str = "") -> None:
            text = "".join(traceback.format_exception(exc_type, exc, tb)) if exc_type is not None else ""
            self.log_only(f"{kind}{where}:\n{text}")

        sys.excepthook = lambda t, e, tb: to_log("uncaught exception", t, e, tb)
        threading.excepthook = lambda a: to_log("exception in thread", a.exc_type, a.exc_value, a.exc_traceback,
                                                f" {a.thread.name if a.thread else ''}")
        sys.unraisablehook = lambda u: to_log("exception ignored", type(u.exc_value) if u.exc_value is not None
                                              else u.exc_type, u.exc_value, u.exc_traceback,
                                              f" in {u.object!r}" if u.object is not None else "")

    def _give_back_exception_hooks(self, keep_threads: bool = False) -> None:
        """Python's hooks back; keep_threads (a command-line process): the thread and unraisable
        hooks stay, so what library threads print while the process shuts down stays in the log."""
        if self._saved_hooks is not None:
            sys.excepthook = self._saved_hooks[0]
            if not keep_threads:
                threading.excepthook, sys.unraisablehook = self._saved_hooks[1:]
            self._saved_hooks = None

    def _open_log(self, path: str, temporary: bool) -> None:
        self._file = open(path, "a", encoding="utf-8", buffering=1)
        self._file.write(f"==== {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} "
                         f"pid {os.getpid()}: python -m sentemb_jax.main {' '.join(self.argv)}\n")
        self._file.flush()
        handler = _FileHandler(self._file)
        handler.setFormatter(_FORMAT)
        handler.setLevel(logging.DEBUG)
        if self._file_handler is not None:
            logging.getLogger().removeHandler(self._file_handler)
            logging.getLogger().addHandler(handler)
        self._file_handler = handler
        self.log_path, self._temporary = path, temporary

    def _redirect_native_stderr(self) -> None:
        sys.stderr.flush()
        self._console_fd = os.dup(2)
        self._console_stream = os.fdopen(self._console_fd, "w", buffering=1, encoding="utf-8", errors="replace")
        os.dup2(self._file.fileno(), 2)
        sys.stderr = self._console_stream  # tqdm, print(file=sys.stderr) and tracebacks stay on the console
        self._redirected = True

    def use_model_dir(self, model_dir: str | None, process_index: int = 0) -> None:
        """Move the log into MODEL_DIR now if it exists (a resumed run), else once the job has
        created it (`settle`): a start refused before that creates no MODEL_DIR. Local
        directories only; a bucket keeps the local file."""
        if not model_dir or "://" in model_dir or not self._temporary:
            return
        self._pending = (model_dir, process_index)
        self.settle()

    def _settle_filter(self, record: logging.LogRecord) -> bool:
        if self._pending is not None:
            self.settle()
        return True

    def settle(self) -> None:
        """Move the log into the pending MODEL_DIR if the job has created it by now."""
        if self._pending is None or not os.path.isdir(self._pending[0]):
            return
        model_dir, process_index = self._pending
        self._pending = None
        try:
            target = os.path.join(model_dir, LOG_NAME if process_index == 0 else f"run.process{process_index}.log")
            self._file.flush()
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                earlier = f.read()
            new = open(target, "a", encoding="utf-8", buffering=1)
        except OSError:
            return  # the job reports an unusable MODEL_DIR itself; the log stays where it is
        try:
            new.write(earlier)
            new.flush()
        except OSError:  # MODEL_DIR's disk is full: the log stays where it is
            try:
                new.close()
            except OSError:
                pass
            return
        old, old_path = self._file, self.log_path
        self._file = new
        handler = _FileHandler(new)
        handler.setFormatter(_FORMAT)
        root = logging.getLogger()
        root.removeHandler(self._file_handler)
        root.addHandler(handler)
        self._file_handler = handler
        if self._redirected:
            os.dup2(new.fileno(), 2)
        old.close()
        os.unlink(old_path)
        self.log_path, self._temporary = target, False

    # -- output --------------------------------------------------------------------------------

    def log_only(self, text: str) -> None:
        """Lines for the log file alone (gin context, tracebacks)."""
        if self._file is not None:
            try:
                self._file.write(text.rstrip("\n") + "\n")
                self._file.flush()
            except (OSError, ValueError):  # a full disk (or a closed file): the console line still comes
                pass

    def say(self, line: str) -> None:
        stream = self._console_stream if self._redirected else sys.stderr
        stream.write(line + "\n")
        stream.flush()
        self.log_only(line)

    def finish(self) -> None:
        """Remove the handlers (so main() can run again in the same process). In a command-line
        process the native stderr stays in the log file until exit: nothing a runtime prints at
        shutdown lands after the job's last line."""
        self.settle()
        root = logging.getLogger()
        for h in (self._console_handler, self._file_handler):
            if h is not None:
                root.removeHandler(h)
        if self._saved_root is not None:
            root.setLevel(self._saved_root[0])
            for h in self._saved_root[1]:
                root.addHandler(h)
        if self._saved_showwarning is not None:
            warnings.showwarning = self._saved_showwarning
            self._saved_showwarning = None
        self._give_back_exception_hooks(keep_threads=self._redirected)
        if self._file is not None:
            try:
                self._file.flush()
            except OSError:
                pass
            if not self._redirected:
                self._file.close()
                self._file = None

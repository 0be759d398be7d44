"""One writer per directory: a lock file held while a job writes a MODEL_DIR, a prepared corpus or an export.

    with DirectoryLock(model_dir, "MODEL_DIR"):
        ...   # write checkpoints, metrics

The lock is a file (`<dir>/.sentemb.lock`, or a path given) created atomically (O_CREAT | O_EXCL)
holding the holder's host name, PID, process start time and a random token. A second writer is
refused with a LockError naming the holder and the lock file (exit 1). A lock left by a job that
died - on this host, and its PID no longer running (or running a process started later: a reused
PID) - is taken over with a warning. The lock is removed when the `with` block ends, however it
ends (an exception, SIGTERM's Preempted, Ctrl-C); only SIGKILL leaves it, and the next start takes
it over. A lock of another host is never judged stale (its PIDs cannot be checked here): the
message says to delete the file once that job is known to be gone.

The lock is re-entrant within one process (a job that locks MODEL_DIR and then calls fit on it).
Remote paths (gs://...) are not locked: object stores have no atomic exclusive create that every
filesystem layer honours; a log line says so.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time

from sentemb_jax.errors import SentembError
from sentemb_jax.paths import is_remote

log = logging.getLogger(__name__)

LOCK_FILE = ".sentemb.lock"

_held: dict[str, int] = {}  # lock path -> depth, this process's locks (re-entrant)
_held_guard = threading.Lock()


class LockError(SentembError):
    """Another job is writing this directory (exit 1: the environment, not the configuration)."""


def _host() -> str:
    return socket.gethostname()


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), to tell a reused PID apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        return stat.rsplit(")", 1)[1].split()[19]  # field 22 (starttime), counted after the command name
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    """Whether `pid` runs on this host and is the process that wrote the lock (when its start is known)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    now = _start_time(pid)
    return not (started and now and now != started)


def _read(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None


def _describe(holder: dict | None) -> str:
    if not holder:
        return "an unknown holder (the lock file is empty or unreadable: being written, or left by a crash)"
    return (f"host {holder.get('host')!r}, PID {holder.get('pid')}"
            + (f", {holder['job']}" if holder.get("job") else "")
            + (f", since {holder['since']}" if holder.get("since") else ""))


class DirectoryLock:
    """The lock of `directory` (created if missing) while the `with` block runs.

    what: how messages name the directory ("MODEL_DIR", "prepare_corpus output", "export directory").
    lock_path: the lock file (default `<directory>/.sentemb.lock`); a directory replaced whole by a
    rename (an export) is locked by a file beside it. job: a word for the holder (shown to others)."""

    def __init__(self, directory: str, what: str = "directory", lock_path: str | None = None, job: str = ""):
        self.directory, self.what, self.job = directory, what, job
        self.remote = is_remote(directory)
        self.path = None if self.remote else os.path.abspath(lock_path or os.path.join(directory, LOCK_FILE))
        self.token = secrets.token_hex(8)
        self.acquired = False

    # -- taking and giving back -------------------------------------------------------------------

    def acquire(self) -> "DirectoryLock":
        if self.remote:
            log.info("%s %s is remote: not locked (one writer per directory is up to you)", self.what, self.directory)
            return self
        with _held_guard:
            if self.path in _held:  # this process holds it already
                _held[self.path] += 1
                self.acquired = True
                return self
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(3):  # a taken-over stale lock: create again
            if self._create():
                with _held_guard:
                    _held[self.path] = 1
                self.acquired = True
                return self
            holder = _read(self.path)
            if holder is None:
                time.sleep(0.2)  # a writer between create and write: read once more
                holder = _read(self.path)
            if holder is not None and holder.get("host") == _host() and not _alive(holder.get("pid"), holder.get("start")):
                if self._take_over(holder):
                    log.warning("taking over the stale lock %s of %s: host %s, PID %s is no longer running "
                                "(a job that was killed)", self.path, self.directory, holder.get("host"), holder.get("pid"))
                continue
            if holder is not None and holder.get("host") == _host() and holder.get("pid") == os.getpid():
                raise LockError(f"{self.what} {self.directory} is locked by this process already ({self.path}): "
                                "two writers of one directory in one job")
            raise LockError(f"{self.what} {self.directory} is being written by another job ({_describe(holder)}); "
                            f"lock file {self.path}. Wait for it to end, use another directory, or delete the lock "
                            "file if that job is gone")
        raise LockError(f"{self.what} {self.directory}: could not take the lock {self.path} (others took it over "
                        "concurrently); run again")

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError as e:
            raise LockError(f"{self.what} {self.directory}: cannot create the lock file {self.path} "
                            f"({e.strerror or e})") from None
        holder = {"host": _host(), "pid": os.getpid(), "start": _start_time(os.getpid()), "token": self.token,
                  "job": self.job, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "directory": self.directory}
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(holder, f)
            f.flush()
            os.fsync(f.fileno())
        return True

    def _take_over(self, stale: dict) -> bool:
        """Move the stale lock out of the way - only if it is still the stale one (another starter may
        have taken it over and created its own meanwhile: that one is put back)."""
        aside = f"{self.path}.stale-{os.getpid()}-{self.token}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False  # someone else moved it: try to create again
        if _read(aside) == stale:
            os.unlink(aside)
            return True
        try:  # not the one judged stale: a live holder's; back into place unless another lock is there now
            os.link(aside, self.path)
        except FileExistsError:
            pass
        os.unlink(aside)
        return False

    def release(self) -> None:
        if self.remote or not self.acquired:
            return
        self.acquired = False
        with _held_guard:
            _held[self.path] -= 1
            if _held[self.path] > 0:
                return
            del _held[self.path]
        holder = _read(self.path)
        if holder is not None and holder.get("token") == self.token:  # never another job's lock
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

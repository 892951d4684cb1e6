"""Caches and sidecar indexes another user could have written are never trusted, never written
through a link, and never readable by anyone else: a real second user (``nobody``) plants files
in a shared sticky folder and in a shared HOME (HOME=/tmp, as in many containers and CI runners),
and the victim (this process) must not be fooled, clobbered or read."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from stoker.cli.convert import convert
from stoker.sources import folder as folder_module
from stoker.sources import tar as tar_module
from stoker.sources.folder import FolderSource
from stoker.sources.shards import ShardSource
from stoker.sources.tar import TarSource

PER_CLASS = 4
PLANT = """
import base64, os, sys
for path, kind, data in {files!r}:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for d in {folders!r}:
        if os.path.isdir(d) and os.stat(d).st_uid == os.getuid():
            os.chmod(d, 0o777)
    if kind == "link":
        os.symlink(data, path)
    else:
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        os.chmod(path, 0o644)
"""


@pytest.fixture
def cached(monkeypatch):
    """Every scan is big enough, and old enough, to be cached."""
    monkeypatch.setattr(folder_module, "MIN_CACHED", 1)
    monkeypatch.setattr(folder_module, "RACY_S", 0.0)
    monkeypatch.setattr(tar_module, "MIN_CACHED_BYTES", 0)


def _plant(nobody, root: Path, files: dict[str, bytes | Path]) -> None:
    """As the second user: write each file (or a link, for a Path value) at ``root/<rel>``,
    the folders made on the way open to all (mode 0777)."""
    listing = [
        (str(root / rel), "link", str(v))
        if isinstance(v, Path)
        else (str(root / rel), "file", base64.b64encode(v).decode())
        for rel, v in files.items()
    ]
    folders = sorted(
        {
            str(p)
            for rel in files
            for p in (root / rel).parents
            if str(p).startswith(str(root) + os.sep)
        }
    )
    nobody(PLANT.format(files=listing, folders=folders))


def _dataset(root: Path, jpeg: bytes) -> Path:
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(PER_CLASS):
            (root / c / f"{i:03d}.jpg").write_bytes(jpeg)
    return root


def _tar(path: Path, jpeg: bytes) -> Path:
    with tarfile.open(path, "w") as tar:
        for i in range(2 * PER_CLASS):
            for name, data in ((f"{i:03d}.jpg", jpeg), (f"{i:03d}.cls", b"ab"[i % 2 : i % 2 + 1])):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _jpeg(image_folder: Path) -> bytes:
    return next(image_folder.glob("class_000/*.jpg")).read_bytes()


def _lying(path: Path) -> bytes:
    """The bytes of the cache file ``path`` (whatever its format) with every label swapped."""
    if path.suffix == ".npz":
        with np.load(path) as npz:
            members = {k: npz[k] for k in npz.files}
        members["labels"] = 1 - members["labels"]
        buf = io.BytesIO()
        np.savez(buf, **members)
        return buf.getvalue()
    if path.name == "labels.npy":
        buf = io.BytesIO()
        np.save(buf, 1 - np.load(path))
        return buf.getvalue()
    if path.suffix == ".json" and b'"samples"' in path.read_bytes():
        meta = json.loads(path.read_text())
        for sample in meta["samples"]:
            sample[3] = {"a": "b", "b": "a"}[sample[3]]
        return json.dumps(meta).encode()
    return path.read_bytes()


@contextmanager
def _warnings() -> Iterator[list[str]]:
    """The texts of the warnings raised inside (checked after the outcome, so a test on code
    that trusts a planted file fails on the wrong result, not only on a missing warning)."""
    texts: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield texts
    texts.extend(str(w.message) for w in seen)


def _warned(texts: list[str], *parts: str) -> bool:
    return any(all(p in t for p in parts) for t in texts)


def _cache_files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- planted files


@pytest.mark.timeout(120)
def test_a_sidecar_index_planted_beside_a_shard_in_a_shared_folder_is_ignored_with_a_warning(
    shared, nobody, tmp_path, image_folder
):
    """Another user's ``shard.parquet.idx.npy`` that matches the shard in every header field
    but gives every row another image's bytes."""
    data = shared / "shards"
    data.mkdir()
    os.chmod(data, 0o1777)
    convert(image_folder, data, progress=False)
    first = ShardSource(data, cache_dir=tmp_path / "cache1")
    truth = [first.read(i) for i in range(len(first))]
    built = Path(first.index_files[0])
    first.close()
    table = np.load(built)
    table[-len(truth) :] = table[-len(truth) :][::-1].copy()
    buf = io.BytesIO()
    np.save(buf, table)
    (shard,) = sorted(data.glob("*.parquet"))
    beside = Path(f"{shard}.idx.npy")
    beside.unlink(missing_ok=True)
    _plant(nobody, data, {beside.name: buf.getvalue()})
    with _warnings() as texts:
        again = ShardSource(data, cache_dir=tmp_path / "cache2")
    assert [again.read(i) for i in range(len(again))] == truth
    assert Path(again.index_files[0]) != beside
    assert _warned(texts, str(beside), "owned by uid 65534"), texts
    again.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("make", "name", "source_type", "kind", "labels"),
    [
        (_dataset, "data", FolderSource, "scan", [0] * PER_CLASS + [1] * PER_CLASS),
        (_tar, "data.tar", TarSource, "tar", [0, 1] * PER_CLASS),
    ],
    ids=["folder", "tar"],
)
def test_a_scan_cache_planted_in_a_shared_home_is_not_used(
    shared,
    nobody,
    tmp_path,
    image_folder,
    cached,
    monkeypatch,
    make,
    name,
    source_type,
    kind,
    labels,
):
    data = make(tmp_path / name, _jpeg(image_folder))
    private = tmp_path / "private"
    truth = source_type(data, cache_dir=private)
    lies = {f".cache/stoker/{kind}/{rel}": _lying(p) for rel, p in _cache_files(private).items()}
    _plant(nobody, shared, lies)
    monkeypatch.setenv("HOME", str(shared))
    with _warnings() as texts:
        source = source_type(data)
    assert source.labels.tolist() == truth.labels.tolist() == labels
    assert _warned(texts, str(shared / ".cache"), "owned by uid 65534"), texts


@pytest.mark.timeout(120)
def test_links_planted_at_the_cache_names_never_clobber_the_victims_file(
    shared, nobody, tmp_path, image_folder, cached, monkeypatch
):
    """Links at every name a cache is written under (its own, and the fixed temporary names
    writers used: ``.tmp``, ``.<pid>.tmp``), pointing at a file of the victim's."""
    victim = shared / "victim-secret"
    victim.write_bytes(b"the victim's own data")
    os.chmod(victim, 0o600)
    root = _dataset(tmp_path / "data", _jpeg(image_folder))
    tar = _tar(tmp_path / "data.tar", _jpeg(image_folder))
    private = tmp_path / "private"
    FolderSource(root, cache_dir=private / "scan")
    TarSource(tar, cache_dir=private / "tar")
    names = set(_cache_files(private))
    for rel in list(names):
        folder, name = os.path.split(rel)
        names |= {
            f"{rel}.tmp",
            f"{rel}.{os.getpid()}.tmp",
            os.path.join(folder, "meta.json"),
            os.path.join(folder, "meta.json.tmp"),
            os.path.join(folder, f"{name}.npz"),
        }
        for array in ("blob", "offsets", "labels"):
            names.add(os.path.join(folder, array, "x")[:-2] + ".npy")
    _plant(nobody, shared, {f".cache/stoker/{rel}": victim for rel in names})
    monkeypatch.setenv("HOME", str(shared))
    with _warnings() as texts:
        assert len(FolderSource(root)) == len(TarSource(tar)) == 2 * PER_CLASS
    assert victim.read_bytes() == b"the victim's own data"
    assert os.stat(victim).st_mode & 0o777 == 0o600
    assert _warned(texts, "owned by uid 65534"), texts


def test_a_cache_written_over_a_link_replaces_the_link_not_its_target(tmp_path):
    """The same rule without a second user: a link left at a cache's name (by anyone) is
    replaced; the file it pointed to is untouched, and the cache file is 0600."""
    from stoker.sources import cachefile

    target = tmp_path / "target"
    target.write_bytes(b"keep")
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    (folder / "scan.json").symlink_to(target)
    assert cachefile.write_cache(folder / "scan.json", lambda f: f.write(b"{}")) is not None
    assert target.read_bytes() == b"keep"
    assert not (folder / "scan.json").is_symlink() and (folder / "scan.json").read_bytes() == b"{}"
    assert os.stat(folder / "scan.json").st_mode & 0o777 == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["scan.json"]  # no temporary file left


# --------------------------------------------------------------------------- reading

PEEK = """
import os
opened = []
for path in {paths!r}:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        opened.append(path)
    except OSError:
        pass
print(opened)
"""


@pytest.mark.timeout(180)
def test_another_user_cannot_list_or_read_any_cache(
    shared, nobody, tmp_path, image_folder, cached, monkeypatch
):
    """Folder scans, tar scans and shard indexes built with HOME in a shared folder: folders
    0700, files 0600, so the second user can neither list a dataset's files nor read them."""
    monkeypatch.setenv("HOME", str(shared))
    data = shared / "shards"  # a shared shard folder: its index goes to the private cache
    data.mkdir()
    os.chmod(data, 0o1777)
    convert(image_folder, data, progress=False)
    ShardSource(data).close()
    FolderSource(_dataset(tmp_path / "data", _jpeg(image_folder)))
    TarSource(_tar(tmp_path / "data.tar", _jpeg(image_folder)))
    home_cache = shared / ".cache"
    written = list(home_cache.rglob("*"))
    assert len([p for p in written if p.is_file()]) >= 3  # a scan, a tar scan, an index
    paths = [str(p) for p in [home_cache, *written]]
    for path in paths:
        mode = os.stat(path).st_mode & 0o777
        assert mode == (0o700 if os.path.isdir(path) else 0o600), (path, oct(mode))
    assert nobody(PEEK.format(paths=paths)).stdout.strip() == "[]"
    assert not list(data.glob("*.idx.npy"))

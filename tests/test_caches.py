"""Caches that cannot lie: a folder scan or a tar scan is reused only while what it describes is
unchanged (including changes that keep mtimes and sizes), and a saved state refuses another
dataset."""

from __future__ import annotations

import io
import os
import pathlib
import tarfile

import pytest

from helpers import tick_past
from stoker.errors import ConfigError
from stoker.loader.state import check_state
from stoker.loader.steps import state_of
from stoker.order import Plan
from stoker.sources import cachefile
from stoker.sources import folder as folder_module
from stoker.sources import tar as tar_module
from stoker.sources.folder import FolderSource
from stoker.sources.tar import TarSource

PER_CLASS = 6


@pytest.fixture
def cached(monkeypatch):
    """Every scan big enough to cache, and none too recent to cache (the racy rule is tested on
    its own)."""
    monkeypatch.setattr(folder_module, "MIN_CACHED", 1)
    monkeypatch.setattr(folder_module, "RACY_S", 0.0)
    monkeypatch.setattr(tar_module, "MIN_CACHED_BYTES", 0)


def _jpeg(image_folder: pathlib.Path) -> bytes:
    return next(image_folder.glob("class_000/*.jpg")).read_bytes()


def _dataset(root: pathlib.Path, jpeg: bytes, per_class: int = PER_CLASS) -> pathlib.Path:
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            (root / c / f"{i:03d}.jpg").write_bytes(jpeg)
    return root


class _NoScan(FolderSource):
    def _walk(self):
        raise AssertionError("walked although the cache is valid")


def test_a_change_during_the_walk_is_walked_again_and_only_a_still_scan_is_cached(
    tmp_path, image_folder, cached, monkeypatch
):
    """A file moved between the walk and the stamps read after it (a hook, not timing): the
    scan is walked again, and what is cached is the listing after the move."""
    root = _dataset(tmp_path / "data", _jpeg(image_folder))
    cache = tmp_path / "cache"
    real = folder_module._stamps
    moves = []

    def move_once(dirs):
        if not moves:
            tick_past(root, tmp_path / "probe")
            os.rename(root / "a" / "000.jpg", root / "b" / "moved.jpg")
            moves.append(1)
        return real(dirs)

    monkeypatch.setattr(folder_module, "_stamps", move_once)
    first = FolderSource(root, cache_dir=cache)
    assert len(moves) == 1 and first.labels.tolist().count(1) == PER_CLASS + 1
    monkeypatch.setattr(folder_module, "_stamps", real)
    again = _NoScan(root, cache_dir=cache)
    names = [again.name(i) for i in range(len(again))]
    assert str(root / "b" / "moved.jpg") in names
    assert str(root / "a" / "000.jpg") not in names
    assert again.fingerprint() == first.fingerprint()


def test_a_folder_that_never_holds_still_is_not_cached(tmp_path, image_folder, cached, monkeypatch):
    root = _dataset(tmp_path / "data", _jpeg(image_folder))
    cache = tmp_path / "cache"
    real = folder_module._stamps
    flips = []

    def move_every_time(dirs):
        tick_past(root, tmp_path / "probe")
        src, dst = (root / "a" / "000.jpg", root / "b" / "x.jpg")
        os.rename(*((src, dst) if not len(flips) % 2 else (dst, src)))
        flips.append(1)
        return real(dirs)

    monkeypatch.setattr(folder_module, "_stamps", move_every_time)
    source = FolderSource(root, cache_dir=cache)
    assert len(flips) == folder_module.SCAN_TRIES and len(source) == 2 * PER_CLASS
    assert not list(cache.glob("*.npz"))


def test_new_files_with_the_old_folder_mtimes_are_seen(tmp_path, image_folder, cached):
    """Version 2 unpacked over version 1 with the same folder mtimes (a reproducible tarball):
    the folders' ctimes changed, so the cached listing of version 1 is not used."""
    jpeg = _jpeg(image_folder)
    root = _dataset(tmp_path / "data", jpeg)
    cache = tmp_path / "cache"
    assert len(FolderSource(root, cache_dir=cache)) == 2 * PER_CLASS
    times = {d: os.stat(d).st_mtime_ns for d in (root, root / "a", root / "b")}
    tick_past(root, tmp_path / "probe")
    for i in range(3):
        (root / "a" / f"v2_{i}.jpg").write_bytes(jpeg)
    for d, ns in times.items():
        os.utime(d, ns=(ns, ns))
    assert {d: os.stat(d).st_mtime_ns for d in times} == times
    assert len(FolderSource(root, cache_dir=cache)) == 2 * PER_CLASS + 3


def test_a_cached_stamp_that_lists_no_folder_is_never_valid(tmp_path, image_folder, cached):
    """A cache whose stamp lists no folders (planted, or damaged) is rebuilt, not trusted."""
    root = _dataset(tmp_path / "data", _jpeg(image_folder))
    cache = tmp_path / "cache"
    real = FolderSource(root, cache_dir=cache)
    (cache_file,) = cache.glob("*.npz")
    meta, arrays = cachefile.load_arrays(cache_file, ("blob", "offsets", "labels"))
    meta.update(dirs=[], stamps=[], mtimes=[], classes=["b", "a"])  # every label swapped
    assert cachefile.save_arrays(cache_file, meta, arrays)
    again = FolderSource(root, cache_dir=cache)
    assert again.classes == ["a", "b"] and again.labels.tolist() == real.labels.tolist()


def test_a_scan_of_a_folder_changed_moments_ago_is_not_cached(tmp_path, image_folder, monkeypatch):
    """Two changes within one tick of the file system's clock leave equal times: a scan is
    cached only once its folders last changed at least RACY_S ago."""
    monkeypatch.setattr(folder_module, "MIN_CACHED", 1)
    monkeypatch.setattr(folder_module, "RACY_S", 3600.0)
    root = _dataset(tmp_path / "data", _jpeg(image_folder))
    FolderSource(root, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.npz"))


# --------------------------------------------------------------------------- tars


def _tar(path: pathlib.Path, jpeg: bytes, label: str) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(4):
            for name, data in ((f"{i:03d}.jpg", jpeg), (f"{i:03d}.cls", label.encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))


def _same_times(*paths: pathlib.Path) -> None:
    for p in paths:
        os.utime(p, ns=(10**18, 10**18))


def _state(source) -> dict:
    plan = Plan(n=8, batch_size=2, seed=0, shuffle=True, drop_last=False)
    return state_of(plan, 0, 1, source.fingerprint())


@pytest.mark.parametrize("swap", ["rename", "rewrite"])
def test_two_tars_of_equal_size_and_mtime_swapped_get_their_own_labels(
    tmp_path, image_folder, cached, swap
):
    """Swapped by renames (new inodes) or rewritten in place (same inodes, new content): each
    tar's scan is its own, and a state saved before the swap is refused."""
    jpeg = _jpeg(image_folder)
    folder, cache = tmp_path / "wds", tmp_path / "cache"
    folder.mkdir()
    a, b = folder / "a.tar", folder / "b.tar"
    _tar(a, jpeg, "0")
    _tar(b, jpeg, "1")
    _same_times(a, b)
    assert a.stat().st_size == b.stat().st_size
    before = TarSource(folder, cache_dir=cache)
    assert before.labels.tolist() == [0] * 4 + [1] * 4 and len(list(cache.glob("*.json"))) == 2
    state = _state(before)
    if swap == "rename":
        os.rename(a, folder / "t.tar")
        os.rename(b, a)
        os.rename(folder / "t.tar", b)
    else:
        data_a, data_b = a.read_bytes(), b.read_bytes()
        with open(a, "r+b") as f:
            f.write(data_b)
        with open(b, "r+b") as f:
            f.write(data_a)
    _same_times(a, b)
    after = TarSource(folder, cache_dir=cache)
    assert after.labels.tolist() == [1] * 4 + [0] * 4
    with pytest.raises(ConfigError, match="another dataset"):
        check_state(state, _state(after))
    for s in (before, after):
        s.close()


def test_a_tar_rewritten_with_the_same_labels_but_other_images_changes_the_fingerprint(
    tmp_path, image_folder, cached
):
    """The head/tail hash is part of a tar source's fingerprint: equal names, sizes and labels
    but other bytes are another dataset."""
    one = _jpeg(image_folder)
    other = bytes(reversed(one))  # same size, other bytes
    shard = tmp_path / "s.tar"
    _tar(shard, one, "0")
    first = TarSource(shard, cache_dir=tmp_path / "cache")
    _tar(shard, other, "0")
    _same_times(shard)
    second = TarSource(shard, cache_dir=tmp_path / "cache")
    assert second.read(0) == other
    assert first.fingerprint() != second.fingerprint()
    for s in (first, second):
        s.close()


def test_a_tar_state_saved_by_an_earlier_release_resumes_with_a_warning(
    tmp_path, image_folder, cached
):
    """Earlier releases' tar fingerprint lacked the head/tail hash: their state still loads
    (its names, sizes, members and labels match), with a warning; a truly other one does not."""
    import stoker
    from stoker.errors import StokerWarning

    folder = tmp_path / "wds"
    folder.mkdir()
    _tar(folder / "a.tar", _jpeg(image_folder), "0")
    with stoker.Loader(folder, batch_size=2, image_size=16, workers=0) as loader:
        state = loader.state_dict()
        (older,) = loader.recipe.source.older_fingerprints()
        with pytest.warns(StokerWarning, match="earlier stoker"):
            loader.load_state_dict({**state, "fingerprint": older, "position": 1})
        assert loader.state_dict()["position"] == 1
        with pytest.raises(ConfigError, match="another dataset"):
            loader.load_state_dict({**state, "fingerprint": "0" * 24})

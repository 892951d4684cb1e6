"""The cache folder rules of ``sources.cachefile``, without a second user: which folders may
hold a cache, the modes stoker creates, and what a refused folder means (no cache, a warning)."""

from __future__ import annotations

import os

import pytest

from stoker.errors import StokerWarning
from stoker.sources import cachefile


def test_folders_stoker_makes_are_0700_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        made = cachefile.private_folder(tmp_path / "home" / ".cache" / "stoker", create=True)
    finally:
        os.umask(old)
    assert made is not None
    for folder in (tmp_path / "home", tmp_path / "home" / ".cache", made):
        assert os.stat(folder).st_mode & 0o777 == 0o700, folder


@pytest.mark.parametrize("mode, why", [(0o777, "not sticky"), (0o770, "not sticky")])
def test_a_cache_below_a_folder_others_can_write_is_refused(tmp_path, mode, why):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    with pytest.warns(StokerWarning, match=f"{shared}.*{why}"):
        assert cachefile.private_folder(shared / "cache", create=True) is None
    assert cachefile.write_cache(shared / "cache" / "x.json", lambda f: f.write(b"{}")) is None


def test_a_sticky_folder_above_is_fine_but_a_cache_folder_others_can_write_is_not(tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    assert cachefile.private_folder(sticky / "mine", create=True) == (sticky / "mine").resolve()
    os.chmod(sticky / "mine", 0o777)
    with pytest.warns(StokerWarning, match="writable by group or others"):
        assert cachefile.private_folder(sticky / "mine", create=False) is None


def test_a_cache_folder_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.warns(StokerWarning, match="symbolic link"):
        assert cachefile.private_folder(tmp_path / "link", create=False) is None


def test_a_cache_file_others_can_write_or_a_link_is_not_read(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    (folder / "open.json").write_bytes(b"{}")
    os.chmod(folder / "open.json", 0o666)
    (folder / "link.json").symlink_to(folder / "open.json")
    with pytest.warns(StokerWarning, match="open.json: it is writable by group or others"):
        assert cachefile.read_cache(folder / "open.json") is None
    with pytest.warns(StokerWarning, match="link.json: it is a symbolic link"):
        assert cachefile.read_cache(folder / "link.json") is None
    assert cachefile.read_cache(folder / "missing.json") is None  # missing: silently no cache

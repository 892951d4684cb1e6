"""``follow_links``: an image folder's symbolic links are followed by default (each real folder
walked once) and skipped, every one of them, with ``follow_links=False``."""

from __future__ import annotations

from pathlib import Path

import pytest

import stoker
from stoker.datasets import make_image_folder
from stoker.loader.options import parse
from stoker.sources import folder as folder_module
from stoker.sources.folder import FolderSource


def _linked_folder(tmp_path: Path) -> Path:
    """2 classes x 3 real JPEGs, plus under the root: a linked subfolder of 3 more (in class
    0), a linked file (in class 1) and a linked class folder of 3 more."""
    root = make_image_folder(
        tmp_path / "data", classes=2, per_class=3, min_side=32, max_side=40, seed=0
    )
    extra = make_image_folder(
        tmp_path / "extra", classes=2, per_class=3, min_side=32, max_side=40, seed=1
    )
    (root / "class_000" / "more").symlink_to(extra / "class_000", target_is_directory=True)
    one = sorted((extra / "class_001").iterdir())[0]
    (root / "class_001" / "linked.jpg").symlink_to(one)
    (root / "class_zzz").symlink_to(extra / "class_001", target_is_directory=True)
    return root


@pytest.mark.timeout(60)
def test_links_are_followed_by_default_and_all_skipped_with_follow_links_false(tmp_path):
    root = _linked_folder(tmp_path)
    with stoker.Loader(root, batch_size=2, workers=0) as loader:
        assert loader.class_names == ["class_000", "class_001", "class_zzz"]
        assert len(loader.recipe.source) == 6 + 3 + 1 + 3
        assert any("more" in p for p in loader.file_paths)
    with stoker.Loader(root, batch_size=2, workers=0, follow_links=False) as loader:
        assert loader.class_names == ["class_000", "class_001"]
        assert len(loader.recipe.source) == 6
        assert not any("more" in p or "linked" in p for p in loader.file_paths)
        images, labels = next(iter(loader))  # the real files still load
        assert images.shape[0] == 2 and set(labels.tolist()) <= {0, 1}


@pytest.mark.timeout(60)
def test_follow_links_is_checked_before_the_folder_is_walked(tmp_path):
    with pytest.raises(stoker.ConfigError, match="follow_links='no': give True or False"):
        stoker.Loader(tmp_path / "no-such-folder", follow_links="no")


@pytest.mark.timeout(60)
def test_a_cached_scan_is_never_reused_with_the_other_follow_links(tmp_path, monkeypatch):
    monkeypatch.setattr(folder_module, "MIN_CACHED", 1)  # every scan is cached ...
    monkeypatch.setattr(folder_module, "RACY_S", 0.0)  # ... however recent its folders
    root, cache = _linked_folder(tmp_path), tmp_path / "cache"
    skip = parse(source=root, follow_links=False).source
    for _ in range(2):  # the second round reads both scans from the cache
        assert len(FolderSource(root, cache_dir=cache)) == 13
        assert len(FolderSource(root, cache_dir=cache, settings=skip)) == 6
    assert len(list(cache.rglob("*.npz"))) == 2

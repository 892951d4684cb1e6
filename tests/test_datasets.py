"""Tests of stoker.datasets: layout, labels, determinism, idempotence, formats, errors."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from stoker import datasets
from stoker.datasets import MARKER, make_image_folder, make_large_photos
from stoker.errors import ConfigError

SMALL = {"classes": 3, "per_class": 4, "min_side": 32, "max_side": 48}


def _files(root: pathlib.Path) -> dict[str, bytes]:
    """Relative path -> bytes of every image under ``root``."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.glob("class_*/*"))
        if p.is_file()
    }


def _labels(root: pathlib.Path) -> list[tuple[str, int]]:
    with open(root / "labels.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["path", "label"]
    return [(path, int(label)) for path, label in rows[1:]]


def test_layout_labels_and_image_properties(tmp_path):
    root = make_image_folder(tmp_path / "ds", **SMALL)
    assert root == tmp_path / "ds"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "class_000",
        "class_001",
        "class_002",
    ]
    expected = [(f"class_{c:03d}/img_{i:05d}.jpg", c) for c in range(3) for i in range(4)]
    assert _labels(root) == expected
    assert sorted(_files(root)) == [p for p, _ in expected]
    for rel, _ in expected:
        with Image.open(root / rel) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert JpegImagePlugin.get_sampling(im) == 2  # 4:2:0
            w, h = im.size
            assert 32 <= min(w, h) <= 48
            assert 3 / 4 - 0.03 <= w / h <= 4 / 3 + 0.03


def test_image_folder_fixture(image_folder):
    labels = _labels(image_folder)
    assert len(labels) == 36 and {c for _, c in labels} == {0, 1, 2}
    assert all((image_folder / p).is_file() for p, _ in labels)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = _files(make_image_folder(tmp_path / "a", seed=7, **SMALL))
    b = _files(make_image_folder(tmp_path / "b", seed=7, **SMALL))
    c = _files(make_image_folder(tmp_path / "c", seed=8, **SMALL))
    assert a == b
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a)
    assert len(set(a.values())) == len(a)  # every image is different


def test_worker_processes_give_the_same_bytes(tmp_path):
    serial = _files(make_image_folder(tmp_path / "serial", **SMALL))
    parallel = _files(make_image_folder(tmp_path / "parallel", workers=2, **SMALL))
    assert serial == parallel


def test_classes_are_learnable_from_colour_histograms(tmp_path):
    # 12 classes: 10 photos, then classes 10 and 11 reuse photos 0 and 1 with swapped channels
    classes = 12
    root = make_image_folder(
        tmp_path / "ds", classes=classes, per_class=6, min_side=32, max_side=40
    )
    feats, labels = [], []
    for rel, label in _labels(root):
        with Image.open(root / rel) as im:
            pixels = np.asarray(im).reshape(-1, 3)
        feats.append(np.histogramdd(pixels, bins=4, range=[(0, 256)] * 3)[0].ravel() / len(pixels))
        labels.append(label)
    x, y = np.array(feats), np.array(labels)
    hits = 0
    for i in range(len(y)):  # leave-one-out nearest class centroid; chance is 1/12
        rest = np.arange(len(y)) != i
        centroids = np.stack([x[rest & (y == c)].mean(0) for c in range(classes)])
        hits += int(np.argmin(((centroids - x[i]) ** 2).sum(1)) == y[i])
    assert hits / len(y) > 0.7


def test_second_call_is_a_no_op(tmp_path):
    root = make_image_folder(tmp_path / "ds", **SMALL)
    marker = json.loads((root / MARKER).read_text())
    assert marker["kind"] == "image_folder"
    assert marker["params"] == {**SMALL, "seed": 0, "format": "jpeg", "quality": 90}
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    for p in stamps:
        os.utime(p, ns=(0, 0))
    make_image_folder(root, **SMALL)
    assert all(p.stat().st_mtime_ns == 0 for p in stamps)


@pytest.mark.parametrize("damage", ["delete_image", "delete_labels", "garble_marker"])
def test_incomplete_dataset_is_rebuilt(tmp_path, damage):
    root = make_image_folder(tmp_path / "ds", **SMALL)
    before = _files(root)
    if damage == "delete_image":
        (root / "class_001/img_00002.jpg").unlink()
    elif damage == "delete_labels":
        (root / "labels.csv").unlink()
    else:
        (root / MARKER).write_text("{not json")
    make_image_folder(root, **SMALL)
    assert _files(root) == before
    assert len(_labels(root)) == 12
    assert json.loads((root / MARKER).read_text())["params"]["per_class"] == 4


def test_other_parameters_rewrite_and_remove_old_images(tmp_path):
    root = make_image_folder(tmp_path / "ds", **SMALL)
    make_image_folder(root, **{**SMALL, "classes": 2, "per_class": 2})
    assert sorted(_files(root)) == [
        f"class_{c:03d}/img_{i:05d}.jpg" for c in range(2) for i in range(2)
    ]
    assert not (root / "class_002").exists()
    assert json.loads((root / MARKER).read_text())["params"]["classes"] == 2


def test_png_format(tmp_path):
    root = make_image_folder(tmp_path / "ds", **SMALL)
    make_image_folder(root, format="png", **SMALL)
    files = _files(root)
    assert len(files) == 12 and all(p.endswith(".png") for p in files)
    assert [p for p, _ in _labels(root)] == sorted(files)
    with Image.open(root / "class_000/img_00000.png") as im:
        assert im.format == "PNG" and im.mode == "RGB"
    assert json.loads((root / MARKER).read_text())["params"]["quality"] is None


@pytest.mark.parametrize(
    "bad",
    [
        {"classes": 0},
        {"per_class": 0},
        {"min_side": 0},
        {"min_side": 60, "max_side": 50},
        {"format": "webp"},
        {"quality": 101},
        {"workers": 0},
    ],
)
def test_bad_arguments_raise_config_error(tmp_path, bad):
    with pytest.raises(ConfigError):
        make_image_folder(tmp_path / "ds", **{**SMALL, **bad})
    assert not (tmp_path / "ds").exists()


def test_missing_demo_extra_is_a_clear_error(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a)
    )
    datasets._photos.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install 'stoker\[demo\]'"):
            make_image_folder(tmp_path / "ds", **SMALL)
    finally:
        datasets._photos.cache_clear()
    assert not (tmp_path / "ds").exists()


def test_import_does_not_load_skimage_or_sklearn():
    code = (
        "import sys, stoker.datasets; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('skimage', 'sklearn')))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]"


def test_large_photos(tmp_path):
    root = make_large_photos(tmp_path / "big", count=2, megapixels=(0.2, 0.4), seed=3)
    assert _labels(root) == [("class_000/img_00000.jpg", 0), ("class_000/img_00001.jpg", 0)]
    for rel, _ in _labels(root):
        with Image.open(root / rel) as im:
            assert im.format == "JPEG"
            assert 0.19e6 <= im.size[0] * im.size[1] <= 0.41e6
    before = _files(root)
    for p in root.rglob("*"):
        os.utime(p, ns=(0, 0))
    make_large_photos(root, count=2, megapixels=(0.2, 0.4), seed=3)
    assert all(p.stat().st_mtime_ns == 0 for p in root.rglob("*"))
    assert (
        _files(make_large_photos(tmp_path / "again", count=2, megapixels=(0.2, 0.4), seed=3))
        == before
    )

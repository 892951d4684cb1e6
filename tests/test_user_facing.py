"""Small things a user sees: a StokerWarning names the user's own line, ``stats()`` does not
blame the input for ``workers="auto"``'s own choice of none, and the stock ops print as the
calls that made them."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import stoker
from stoker.errors import StokerWarning


class OneBad:
    """A per-sample dataset whose sample 2 is bad."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 2:
            raise ValueError("a bad sample")
        return {"x": np.full(2, i, np.float32)}


def _caught(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fn()
    return [w for w in got if issubclass(w.category, StokerWarning)]


@pytest.mark.timeout(120)
def test_stoker_warnings_point_at_the_users_line(tmp_path, monkeypatch, image_folder):
    def skipped():
        with stoker.Loader(OneBad(), batch_size=4, workers=0, shuffle=False) as loader:
            for _ in loader:  # the warning is given while this loop takes a batch
                pass

    def too_many_workers():
        monkeypatch.setattr(stoker.loader.config, "usable_cpus", lambda: 1)
        stoker.Loader(np.zeros((4, 8, 8, 3), np.uint8), batch_size=2, workers=3).close()

    def empty_class():
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
        jpeg = next((image_folder / "class_000").iterdir())
        (tmp_path / "a" / "one.jpg").write_bytes(jpeg.read_bytes())
        stoker.Loader(tmp_path, batch_size=1, workers=0).close()  # class "b" has no images

    for fn in (skipped, too_many_workers, empty_class):
        got = _caught(fn)
        assert got, fn.__name__
        assert {w.filename for w in got} == {__file__}, [(w.filename, w.lineno) for w in got]


@pytest.mark.timeout(120)
def test_stats_names_workers_auto_choosing_none_not_the_input_as_the_bottleneck():
    with stoker.Loader(np.zeros((64, 8, 8, 3), np.uint8), batch_size=8, workers="auto") as loader:
        list(loader)
        report = loader.stats()
    assert loader.run.workers == 0 and report.workers_reason.startswith("auto: 0")
    waited = dataclasses.replace(report, wait_s=1.0, wait_share=0.9)  # the loop waited a lot
    assert waited.bottleneck == "input"
    text = str(waited)
    assert 'workers="auto" chose 0 worker processes (loading in this process' in text
    assert "pass workers=N" in text
    chosen = dataclasses.replace(waited, workers=0, workers_reason="workers=0")
    assert "bottleneck: input\n" in str(chosen)  # the user's own workers=0: the plain verdict


def test_the_stock_ops_print_as_the_calls_that_made_them():
    assert repr(stoker.ops.HorizontalFlip()) == "HorizontalFlip(p=0.5)"
    assert repr(stoker.ops.Resize(224)) == "Resize(size=(224, 224))"
    assert repr(stoker.ops.CenterCrop(0.9)) == "CenterCrop(fraction=0.9)"
    assert repr(stoker.ops.RandomResizedCrop(scale=(0.5, 1.0))) == (
        "RandomResizedCrop(scale=(0.5, 1.0), ratio=(0.75, 1.3333333333333333))"
    )


def _resize_then_center_crop(path, size):
    """torchvision's ``Resize(size)`` + ``CenterCrop(size)`` on a PIL image (its PIL path):
    the shorter side to ``size`` (bilinear), then the centred ``size`` square."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        short, long = (w, h) if w <= h else (h, w)
        other = int(size * long / short)
        im = im.resize((size, other) if w <= h else (other, size), Image.BILINEAR)
        w, h = im.size
        top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
        return np.asarray(im.crop((left, top, left + size, top + size)))


@pytest.mark.timeout(120)
def test_torchvisions_resize_then_center_crop_of_one_size_is_crop_to_aspect_ratio_not_eval(
    image_folder,
):
    size = 48
    kwargs = dict(image_size=size, batch_size=4, shuffle=False, workers=0, batch=("image", "path"))
    distance = {}
    for name, options in (
        ("crop_to_aspect_ratio", dict(augment=None, crop_to_aspect_ratio=True)),
        ("eval", dict(augment="eval")),
        ("resize", dict(augment=None)),
    ):
        with stoker.Loader(image_folder, **kwargs, **options) as loader:
            images, paths = next(iter(loader))
        want = np.stack([_resize_then_center_crop(p, size) for p in paths])
        distance[name] = float(np.abs(images.astype(int) - want.astype(int)).mean())
    # the same window (the centred square), filters apart; "eval" keeps 87.5 % of the
    # shorter side, a plain resize the whole image, squashed: other windows, far off
    assert distance["eval"] > 2 * distance["crop_to_aspect_ratio"], distance
    assert distance["resize"] > 1.5 * distance["crop_to_aspect_ratio"], distance

"""``stoker show`` and ``stoker bench --plot`` are judged by the PNGs they write: the size, the
grid of tiles read back from the pixels, each tile equal to the sample the model would get, the
masks' overlay, and the chart's ceiling, rate and wait drawn where their values say."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.cli import main
from stoker.cli import plot as plot_mod
from stoker.cli import show as show_mod


def _png(path: pathlib.Path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True."""
    runs, start = [], None
    for i, f in enumerate([*flags.tolist(), False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def _grid(sheet: np.ndarray, tile: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The tile columns and tile image rows found in a sheet: a column (row) of background
    pixels only is a gap; a run of image rows is as tall as a tile."""
    bg = (sheet == show_mod.BACKGROUND).all(axis=-1)
    cols = [r for r in _runs(~bg.all(axis=0)) if r[1] == tile]
    rows = [r for r in _runs(~bg.all(axis=1)) if r[1] >= tile]
    return cols, rows


def _peeked(source, n, size, seed, augment="train", **kw):
    with stoker.Loader(
        source,
        batch_size=n,
        image_size=size,
        augment=augment,
        seed=seed,
        workers=0,
        drop_last=False,
        batch="dict",
        **kw,
    ) as loader:
        return loader.peek(), loader.class_names


@pytest.mark.timeout(180)
def test_show_writes_a_grid_of_the_augmented_samples_with_captions(image_folder, tmp_path, capsys):
    out = tmp_path / "sheet.png"
    flags = "--rows 2 --cols 3 --image-size 32 --seed 5".split()
    assert main(["show", str(image_folder), "--out", str(out), *flags]) == 0
    assert str(out) in capsys.readouterr().out
    sheet = _png(out)
    assert sheet.shape[1::-1] == show_mod.sheet_size(2, 3, 32, 32)
    cols, rows = _grid(sheet, 32)
    assert len(cols) == 3 and len(rows) == 2, (cols, rows)
    batch, names = _peeked(str(image_folder), 6, 32, seed=5)
    for k in range(6):
        x, y = show_mod.tile_origin(k, 3, 32, 32)
        assert (x, y) == (cols[k % 3][0], rows[k // 3][0])
        np.testing.assert_array_equal(sheet[y : y + 32, x : x + 32], batch["image"][k])
        strip = sheet[y + 32 : y + 32 + show_mod.CAPTION, x : x + 32]
        assert (strip != show_mod.BACKGROUND).any(axis=-1).any(), f"tile {k} has no caption"
    assert show_mod.caption(batch, 0, names) == names[int(batch["label"][0])]


@pytest.mark.timeout(180)
def test_show_depends_on_the_seed_and_the_augment(image_folder, tmp_path):
    sheets = {}
    for seed, augment in ((0, "train"), (1, "train"), (0, "none")):
        out = tmp_path / f"{seed}-{augment}.png"
        flags = f"--rows 1 --cols 2 --image-size 24 --seed {seed} --augment {augment}".split()
        assert main(["show", str(image_folder), "--out", str(out), *flags]) == 0
        sheets[seed, augment] = _png(out)
    assert not np.array_equal(sheets[0, "train"], sheets[1, "train"])
    assert not np.array_equal(sheets[0, "train"], sheets[0, "none"])


def test_show_overlays_masks_and_leaves_class_zero_clear(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 20, 20, 3), dtype=np.uint8)
    masks = np.zeros((4, 20, 20), np.uint8)
    masks[:, 5:15, 5:15] = 1
    masks[:, 0:3, 0:3] = 2
    batch = {"image": images, "mask": masks, "path": np.array([f"array[{i}]" for i in range(4)])}
    sheet = np.asarray(show_mod.contact_sheet(batch, 2, 2))
    for k in range(4):
        x, y = show_mod.tile_origin(k, 2, 20, 20)
        tile = sheet[y : y + 20, x : x + 20]
        clear = masks[k] == 0
        np.testing.assert_array_equal(tile[clear], images[k][clear])
        for cls in (1, 2):
            colour = show_mod.PALETTE[cls - 1]
            want = np.rint(0.5 * images[k][masks[k] == cls] + 0.5 * colour).astype(np.uint8)
            np.testing.assert_array_equal(tile[masks[k] == cls], want)


def test_show_of_a_mask_source_through_the_cli(tmp_path):
    images = np.full((3, 16, 16, 3), 100, np.uint8)
    masks = np.zeros((3, 16, 16), np.uint8)
    masks[:, :, 8:] = 1
    np.save(tmp_path / "images.npy", images)
    batch, _ = _peeked(images, 3, 16, seed=0, augment=None, masks=masks)
    sheet = np.asarray(show_mod.contact_sheet(batch, 2, 2))
    cols, rows = _grid(sheet, 16)
    assert len(cols) == 2 and len(rows) == 2  # 3 samples on a 2 x 2 grid: the 4th tile empty
    x, y = show_mod.tile_origin(3, 2, 16, 16)
    assert (sheet[y : y + 16, x : x + 16] == show_mod.BACKGROUND).all()
    x, y = show_mod.tile_origin(0, 2, 16, 16)
    assert (sheet[y : y + 16, x : x + 8] == 100).all() and (
        sheet[y : y + 16, x + 8 : x + 16] != 100
    ).any()


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--out", "sheet.jpg"], "name it *.png"),
        (["--out", "sheet.png", "--rows", "0"], "--rows 0: give a positive integer"),
    ],
)
def test_show_refuses_bad_options_in_one_line(image_folder, tmp_path, capsys, argv, says):
    argv = [a if not a.startswith("sheet") else str(tmp_path / a) for a in argv]
    assert main(["show", str(image_folder), *argv]) == 1
    assert says in capsys.readouterr().err


# --------------------------------------------------------------------------- bench --plot


def test_bins_hold_consecutive_batches_with_their_rate_and_wait_share():
    batches = [plot_mod.Arrival(at=0.1 * (i + 1), images=10, waited=0.05) for i in range(40)]
    cut = plot_mod.bins(batches, count=10)
    assert len(cut) == 10 and cut[0].start == 0 and cut[-1].end == pytest.approx(4.0)
    assert sum(b.images for b in cut) == 400
    for b in cut:
        assert b.rate == pytest.approx(100, rel=0.01)
        assert b.wait_share == pytest.approx(0.5, abs=0.01)


def _ceiling_row(chart: np.ndarray) -> int:
    """The row holding the most of the ceiling's dashes."""
    left, _, right, bottom = plot_mod.RATE_BOX
    hits = (chart[:bottom, left:right] == plot_mod.CEILING).all(axis=-1).sum(axis=1)
    assert hits.max() >= 0.4 * (right - left), "no dashed ceiling line"
    return int(hits.argmax())


def test_chart_draws_rate_ceiling_and_wait_where_their_values_are(tmp_path):
    batches = [plot_mod.Arrival(at=0.1 * (i + 1), images=10, waited=0.05) for i in range(80)]
    out = tmp_path / "chart.png"
    plot_mod.bench_chart(batches, ceiling=250.0, epoch_starts=[0.0, 4.0], out=out, title="t")
    chart = _png(out)
    assert chart.shape == (plot_mod.HEIGHT, plot_mod.WIDTH, 3)
    top = plot_mod.rate_axis_top(plot_mod.bins(batches), 250.0)
    assert _ceiling_row(chart) == plot_mod.y_at(250.0, top, plot_mod.RATE_BOX)
    rate_rows = np.nonzero((chart == plot_mod.RATE).all(axis=-1).any(axis=1))[0]
    y100 = plot_mod.y_at(100.0, top, plot_mod.RATE_BOX)
    assert rate_rows.min() >= y100 - 3 and rate_rows.max() <= y100 + 3
    left, _, right, bottom = plot_mod.WAIT_BOX
    x = left + round((right - left) * 2.2 / 8.0)  # inside a 0.4 s bin, off the epoch line
    bar = (chart[:, x] == plot_mod.WAIT).all(axis=-1)
    assert np.nonzero(bar)[0].min() == plot_mod.y_at(0.5, 1.0, plot_mod.WAIT_BOX)
    assert bar[bottom - 1]


@pytest.mark.timeout(240)
def test_bench_plot_writes_the_measured_run_beside_its_ceiling(image_folder, tmp_path, capsys):
    out = tmp_path / "bench.png"
    flags = "--batch-size 4 --image-size 32 --workers 2 --epochs 2".split()
    assert main(["bench", str(image_folder), *flags, "--plot", str(out)]) == 0
    report = capsys.readouterr().out
    assert f"plot: {out}" in report
    assert re.search(r"busy cores decode ([\d,]+) img/s", report)
    chart = _png(out)
    assert chart.shape == (plot_mod.HEIGHT, plot_mod.WIDTH, 3)
    row = _ceiling_row(chart)
    left, top_px, right, bottom = plot_mod.RATE_BOX
    # the axis top is a round number above the ceiling: the ceiling sits in the panel's body
    assert top_px < row < bottom
    assert (chart[top_px:bottom, left:right] == plot_mod.RATE).all(axis=-1).sum() > 20
    assert (chart[plot_mod.WAIT_BOX[1] : plot_mod.WAIT_BOX[3], left:right] == plot_mod.WAIT).all(
        axis=-1
    ).sum() > 100  # a bench loop does nothing but wait


def test_bench_plot_refuses_a_name_that_is_not_png(image_folder, tmp_path, capsys):
    assert main(["bench", str(image_folder), "--plot", str(tmp_path / "x.svg")]) == 1
    assert "name it *.png" in capsys.readouterr().err

"""``stoker bench --plot``: the measured run as a PNG, drawn with Pillow (no plotting library).

Top panel: images per second over time (each bin's images over its duration) beside the decode
ceiling this machine measured for the same data (a dashed line), epoch starts marked. Bottom
panel: the share of each bin the loop spent waiting for the next batch. The geometry is fixed
(``WIDTH`` x ``HEIGHT``, panels at ``RATE_BOX`` and ``WAIT_BOX``) and ``y_at`` maps a value to
its row, so a test can read the values back from the file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 800, 520
RATE_BOX = (70, 40, 780, 330)  # left, top, right, bottom of the img/s panel's plot area
WAIT_BOX = (70, 380, 780, 490)  # the wait-share panel (0 at the bottom, 100 % at the top)
BINS = 60  # bins across the run
WHITE, AXIS, GRID = (255, 255, 255), (60, 60, 60), (225, 225, 225)
RATE, CEILING, WAIT, EPOCH = (31, 119, 180), (255, 127, 14), (150, 150, 150), (200, 200, 200)


@dataclass(frozen=True)
class Arrival:
    """One batch the benchmark received: when (seconds from the start), how many images, and
    how long the loop waited for it."""

    at: float
    images: int
    waited: float


@dataclass(frozen=True)
class Bin:
    """A slice of the run: its start, end, images received and time spent waiting."""

    start: float
    end: float
    images: int
    waited: float

    @property
    def rate(self) -> float:
        """Images per second in this bin."""
        return self.images / (self.end - self.start)

    @property
    def wait_share(self) -> float:
        """The share of this bin spent waiting for batches, 0-1."""
        return min(1.0, self.waited / (self.end - self.start))


def bins(batches: Sequence[Arrival], count: int = BINS) -> list[Bin]:
    """The run cut into about ``count`` bins of consecutive batches (at least four batches a
    bin, so a bin's rate is never one batch or none): a bin runs from the previous bin's last
    arrival to its own last arrival, and holds its batches' images and waits."""
    size = max(4, math.ceil(len(batches) / count))
    cut, start = [], 0.0
    for i in range(0, len(batches), size):
        group = batches[i : i + size]
        end = group[-1].at
        if end > start:
            cut.append(Bin(start, end, sum(b.images for b in group), sum(b.waited for b in group)))
            start = end
    return cut


def y_at(value: float, top_value: float, box: tuple[int, int, int, int]) -> int:
    """The pixel row of ``value`` on a panel whose axis runs from 0 (bottom) to ``top_value``."""
    _, top, _, bottom = box
    return round(bottom - (bottom - top) * min(max(value / top_value, 0.0), 1.0))


def rate_axis_top(bins_: Sequence[Bin], ceiling: float) -> float:
    """The img/s panel's top value: a round number above both the ceiling and the fastest bin."""
    peak = max([ceiling, *(b.rate for b in bins_)]) * 1.1 or 1.0
    step = 10 ** math.floor(math.log10(peak))
    return math.ceil(peak / step) * step


def bench_chart(
    batches: Sequence[Arrival],
    ceiling: float,
    epoch_starts: Sequence[float],
    out: str | os.PathLike[str],
    title: str,
) -> Image.Image:
    """Draw the chart of a run to ``out`` (PNG) and return it."""
    cut = bins(batches)
    end = cut[-1].end if cut else 1.0
    top = rate_axis_top(cut, ceiling)
    image = Image.new("RGB", (WIDTH, HEIGHT), WHITE)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    draw.text((RATE_BOX[0], 6), title, fill=AXIS, font=font)

    def x_at(t: float) -> int:
        left, _, right, _ = RATE_BOX
        return round(left + (right - left) * min(max(t / end, 0.0), 1.0))

    _axes(draw, RATE_BOX, top, "img/s", font, lambda v: f"{v:,.0f}")
    _axes(draw, WAIT_BOX, 1.0, "waiting for data", font, lambda v: f"{v:.0%}")
    for t in epoch_starts:
        for box in (RATE_BOX, WAIT_BOX):
            draw.line([(x_at(t), box[1]), (x_at(t), box[3])], fill=EPOCH, width=1)
    _dashed(draw, RATE_BOX, y_at(ceiling, top, RATE_BOX), CEILING)
    draw.text(
        (RATE_BOX[2] - 210, y_at(ceiling, top, RATE_BOX) - 14),
        f"decode ceiling {ceiling:,.0f} img/s",
        fill=CEILING,
        font=font,
    )
    points = [(x_at((b.start + b.end) / 2), y_at(b.rate, top, RATE_BOX)) for b in cut]
    if len(points) > 1:
        draw.line(points, fill=RATE, width=2)
    for p in points:
        draw.ellipse([p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2], fill=RATE)
    for b in cut:
        y = y_at(b.wait_share, 1.0, WAIT_BOX)
        if y < WAIT_BOX[3]:
            draw.rectangle(
                [x_at(b.start) + 1, y, max(x_at(b.start) + 1, x_at(b.end) - 1), WAIT_BOX[3] - 1],
                fill=WAIT,
            )
    draw.text(
        (RATE_BOX[0], HEIGHT - 22),
        f"seconds (0 - {end:.1f} s); grey lines: epoch starts",
        fill=AXIS,
        font=font,
    )
    image.save(out, format="PNG")
    return image


def _axes(
    draw: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    top: float,
    label: str,
    font: Any,
    fmt: Callable[[float], str],
) -> None:
    """A panel's frame, four grid lines with their values, and its label."""
    left, upper, right, bottom = box
    for k in range(5):
        value = top * k / 4
        y = y_at(value, top, box)
        if 0 < k < 4:
            draw.line([(left + 1, y), (right - 1, y)], fill=GRID)
        text = fmt(value)
        draw.text((left - 6 - draw.textlength(text, font=font), y - 6), text, fill=AXIS, font=font)
    draw.rectangle([left, upper, right, bottom], outline=AXIS)
    draw.text((left, upper - 14), label, fill=AXIS, font=font)


def _dashed(
    draw: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    y: int,
    colour: tuple[int, int, int],
    dash: int = 8,
) -> None:
    """A horizontal dashed line across the panel at row ``y``."""
    for x in range(box[0] + 1, box[2] - 1, 2 * dash):
        draw.line([(x, y), (min(x + dash, box[2] - 1), y)], fill=colour, width=1)

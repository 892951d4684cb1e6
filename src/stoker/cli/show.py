"""``stoker show``: a contact sheet of samples as the model gets them (augmented), as a PNG.

The batch comes from ``Loader.peek()`` (loaded in this process, nothing consumed). Each tile is
one sample's image pasted pixel for pixel, with its caption (class name, label value, or file)
on a strip below; masks are overlaid in colour (class 0 left clear). Tiles are laid out on a
``rows x cols`` grid separated by ``GAP`` pixels of ``BACKGROUND``, so the grid can be read
back from the file. Only Pillow is needed (no plotting library).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..errors import ConfigError
from ..loader import Loader
from .outputs import output_file

GAP = 4  # pixels of background between tiles and around the sheet
CAPTION = 14  # pixels of caption strip under each tile
BACKGROUND = (24, 24, 24)
TEXT = (235, 235, 235)
MASK_ALPHA = 0.5
# class k > 0 of a mask gets PALETTE[(k - 1) % len(PALETTE)]
PALETTE = np.array(
    [
        (230, 25, 75),
        (60, 180, 75),
        (255, 225, 25),
        (0, 130, 200),
        (245, 130, 48),
        (145, 30, 180),
        (70, 240, 240),
        (240, 50, 230),
    ],
    np.float32,
)


def sheet_size(rows: int, cols: int, height: int, width: int) -> tuple[int, int]:
    """The sheet's ``(width, height)`` in pixels for a grid of tiles of ``height x width``."""
    return GAP + cols * (width + GAP), GAP + rows * (height + CAPTION + GAP)


def tile_origin(k: int, cols: int, height: int, width: int) -> tuple[int, int]:
    """The ``(x, y)`` of tile ``k``'s top-left image pixel (row-major order)."""
    r, c = divmod(k, cols)
    return GAP + c * (width + GAP), GAP + r * (height + CAPTION + GAP)


def as_rgb(image: np.ndarray) -> np.ndarray:
    """An ``(H, W, C)`` uint8 image as ``(H, W, 3)``: gray repeated, alpha dropped."""
    if image.ndim == 2:
        image = image[..., None]
    if image.shape[-1] == 1:
        return np.repeat(image, 3, axis=-1)
    return image[..., :3]


def overlay(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``image`` with every mask pixel of class > 0 blended with its class colour."""
    out = image.astype(np.float32)
    hit = mask > 0
    colours = PALETTE[(mask[hit].astype(np.int64) - 1) % len(PALETTE)]
    out[hit] = (1 - MASK_ALPHA) * out[hit] + MASK_ALPHA * colours
    return np.rint(out).astype(np.uint8)


def caption(batch: dict[str, Any], k: int, class_names: Sequence[str] | None) -> str:
    """Tile ``k``'s caption: the class name or the label's value(s); for an unlabeled sample
    (label -1) the file name."""
    if "label" in batch:
        label = np.asarray(batch["label"][k])
        if label.ndim > 0 or label.dtype.kind not in "iu":
            return np.array2string(label, precision=2, separator=",", threshold=6)
        if int(label) >= 0:
            if class_names is not None and int(label) < len(class_names):
                return str(class_names[int(label)])
            return f"label {int(label)}"
    return os.path.basename(str(batch["path"][k])) if "path" in batch else f"#{k}"


def contact_sheet(
    batch: dict[str, Any], rows: int, cols: int, class_names: Sequence[str] | None = None
) -> Image.Image:
    """The sheet of a batch (a dict with ``image`` and optionally ``mask``, ``label``,
    ``path``): the first ``rows * cols`` samples, row-major."""
    images = np.asarray(batch["image"])
    n, height, width = min(len(images), rows * cols), images.shape[1], images.shape[2]
    sheet = Image.new("RGB", sheet_size(rows, cols, height, width), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for k in range(n):
        tile = as_rgb(images[k])
        if "mask" in batch:
            tile = overlay(tile, np.asarray(batch["mask"][k]))
        x, y = tile_origin(k, cols, height, width)
        sheet.paste(Image.fromarray(np.ascontiguousarray(tile), "RGB"), (x, y))
        text = _fit(draw, caption(batch, k, class_names), width, font)
        draw.text((x + 1, y + height + 1), text, fill=TEXT, font=font)
    return sheet


def _fit(draw: ImageDraw.ImageDraw, text: str, width: int, font: Any) -> str:
    """``text`` cut (with an ellipsis) to fit ``width`` pixels."""
    if draw.textlength(text, font=font) <= width - 2:
        return text
    while text and draw.textlength(text + "...", font=font) > width - 2:
        text = text[:-1]
    return text + "..." if text else ""


def show(
    source: Any,
    out: str | os.PathLike[str],
    *,
    rows: int = 4,
    cols: int = 4,
    image_size: int = 128,
    augment: Any = "train",
    seed: int = 0,
) -> str:
    """Write the contact sheet of ``source``'s first batch (as epoch 0 of
    ``Loader(source, seed=seed, augment=augment, image_size=image_size)`` gives it) to ``out``
    (PNG); return a one-line summary."""
    for name, value in (("rows", rows), ("cols", cols), ("image_size", image_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {value!r}: give a positive integer")
    output_file("--out", out, ".png", "the sheet")
    with Loader(
        source,
        batch_size=rows * cols,
        image_size=image_size,
        augment=augment,
        seed=seed,
        workers=0,
        drop_last=False,
        batch="dict",
    ) as loader:
        batch = loader.peek()
        sheet = contact_sheet(batch, rows, cols, loader.class_names)
    sheet.save(out, format="PNG")
    n = min(len(batch["image"]), rows * cols)
    what = "with masks overlaid" if "mask" in batch else "with their labels"
    return (
        f"stoker show: {n} samples ({rows} x {cols} grid, augment={augment}, seed {seed}) "
        f"{what} -> {out} ({sheet.width} x {sheet.height} px)"
    )

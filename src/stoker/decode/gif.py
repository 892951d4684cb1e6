"""GIF: the first frame, decoded by Pillow (the reference); OpenCV rejects valid GIFs (a
background index outside the palette, no global palette, odd logical-screen extents)."""

from __future__ import annotations

import numpy as np

from . import pillow
from .common import Box, ImageInfo, crop_oriented


def probe(data: bytes | memoryview) -> tuple[int, int, int]:
    """(height, width, 1): GIF carries no orientation."""
    height, width, _ = pillow.probe(data, "gif")
    return height, width, 1


def decode(data: bytes | memoryview, info: ImageInfo, box: Box, *_: object) -> np.ndarray:
    """The ``box`` of a GIF's first frame, RGB."""
    return crop_oriented(pillow.decode(data, info), box, info)

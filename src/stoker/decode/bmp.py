"""BMP: decoded by Pillow, the reference. OpenCV shifts the 5-bit channels of 16-bit BMPs
instead of scaling them (white comes out 248), drops a channel of 52-byte (V2) headers and
trusts a pixel offset that points into the palette; Pillow gets all three right."""

from __future__ import annotations

import numpy as np

from . import pillow
from .common import Box, ImageInfo, crop_oriented


def probe(data: bytes | memoryview) -> tuple[int, int, int]:
    """(height, width, 1): BMP carries no orientation."""
    height, width, _ = pillow.probe(data, "bmp")
    return height, width, 1


def decode(data: bytes | memoryview, info: ImageInfo, box: Box, *_: object) -> np.ndarray:
    """The ``box`` of a BMP image, RGB."""
    return crop_oriented(pillow.decode(data, info), box, info)

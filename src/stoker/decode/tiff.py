"""TIFF: decoded by Pillow (first page). OpenCV's libtiff RGBA reader premultiplies
unassociated alpha (darkening the colours) and mis-converts CIELab, so Pillow is the only
decoder: unassociated alpha is dropped, associated (premultiplied) alpha is un-premultiplied by
Pillow, and 8-bit CIELab is converted to RGB (see :func:`.pillow.to_rgb`). Orientation comes
from the Orientation tag, else from XMP (tag 700), as Pillow reads them."""

from __future__ import annotations

import numpy as np

from ..errors import DecodeError
from . import pillow
from .common import Box, ImageInfo, crop_oriented, xmp_orientation

_ORIENTATION, _XMP = 274, 700


def probe(data: bytes | memoryview) -> tuple[int, int, int]:
    """(height, width, orientation) of a TIFF's first page."""
    with pillow.open_header(data, "tiff") as im:
        width, height = im.size
        try:
            tags = im.tag_v2
            value = tags.get(_ORIENTATION)
            xmp = tags.get(_XMP)
        except Exception as exc:  # Pillow raises many types on bad tag data
            raise DecodeError(f"corrupt TIFF header: {exc}") from None
    orientation = value if isinstance(value, int) and 1 <= value <= 8 else 0
    if not orientation and isinstance(xmp, bytes | str):
        orientation = xmp_orientation(xmp.encode("latin-1") if isinstance(xmp, str) else xmp)
    return height, width, orientation or 1


def decode(data: bytes | memoryview, info: ImageInfo, box: Box, *_: object) -> np.ndarray:
    """The displayed ``box`` of a TIFF's first page, RGB."""
    return crop_oriented(pillow.decode(data, info), box, info)

"""TIFF: decoded by Pillow (first page). OpenCV's libtiff RGBA reader premultiplies
unassociated alpha (darkening the colours) and mis-converts CIELab, so Pillow is the only
decoder: unassociated alpha is dropped, associated (premultiplied) alpha is un-premultiplied by
Pillow, and 8-bit CIELab is converted to sRGB (see :func:`.pillow.to_rgb`). Orientation comes
from the Orientation tag, else from XMP (tag 700), as Pillow reads them; recent Pillow applies
it while loading a TIFF, older Pillow does not, and :func:`pillow_orients` tells which."""

from __future__ import annotations

import functools
import io

import numpy as np
from PIL import Image

from ..errors import DecodeError
from . import pillow
from .common import Box, ImageInfo, crop_oriented, xmp_orientation

_WIDTH, _LENGTH, _ORIENTATION, _XMP = 256, 257, 274, 700


def probe(data: bytes | memoryview) -> tuple[int, int, int]:
    """Stored (height, width) and orientation of a TIFF's first page."""
    with pillow.open_header(data, "tiff") as im:
        try:
            tags = im.tag_v2
            width, height = tags[_WIDTH], tags[_LENGTH]
            value, xmp = tags.get(_ORIENTATION), tags.get(_XMP)
        except Exception as exc:  # Pillow raises many types on bad tag data
            raise DecodeError(f"corrupt TIFF header: {exc}") from None
    if not isinstance(width, int) or not isinstance(height, int):
        raise DecodeError(f"corrupt TIFF header: image size {height!r}x{width!r}")
    orientation = value if isinstance(value, int) and 1 <= value <= 8 else 0
    if not orientation and isinstance(xmp, bytes | str):
        orientation = xmp_orientation(xmp.encode("latin-1") if isinstance(xmp, str) else xmp)
    return height, width, orientation or 1


def decode(
    data: bytes | memoryview, info: ImageInfo, box: Box, *_: object, channels: int = 3
) -> np.ndarray:
    """The displayed ``box`` of a TIFF's first page, RGB (RGBA with its alpha for
    ``channels=4``)."""
    if info.orientation != 1 and pillow_orients():
        top, left, height, width = box
        image = pillow.decode(data, info, oriented=True, channels=channels)
        return image[top : top + height, left : left + width]
    return crop_oriented(pillow.decode(data, info, channels=channels), box, info)


@functools.cache
def pillow_orients() -> bool:
    """Whether this Pillow applies a TIFF's orientation as it loads it (checked once)."""
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[_ORIENTATION] = 3  # rotated 180 degrees
    Image.fromarray(np.array([[0, 255]], np.uint8)).save(buf, "TIFF", exif=exif)
    with Image.open(buf) as im:
        return bool(np.asarray(im)[0, 0] == 255)

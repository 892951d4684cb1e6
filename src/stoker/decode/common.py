"""What every format shares: the ImageInfo record, format sniffing, the pixel budget, boxes in
displayed vs stored coordinates, and EXIF/XMP orientation (read from a TIFF structure or an
XMP packet, applied to decoded pixels)."""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

import cv2
import numpy as np

from ..errors import DecodeError, DecompressionBombError

Box = tuple[int, int, int, int]  # top, left, height, width

IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg",
    ".jpeg",
    ".png",
    ".webp",
    ".bmp",
    ".gif",
    ".tif",
    ".tiff",
)
"""Lowercase file extensions that stoker treats as images (used by the folder scanner)."""

DEFAULT_MAX_PIXELS = 178_956_970
"""Default pixel budget of one image (Pillow's threshold); larger images are refused."""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class ImageInfo(NamedTuple):
    """What :func:`stoker.decode.probe` learns from an image header, without decoding pixels."""

    height: int  # displayed height, i.e. after applying the EXIF orientation
    width: int  # displayed width
    format: str  # 'jpeg', 'png', 'webp', 'bmp', 'gif', 'tiff' or 'other'
    orientation: int  # EXIF orientation 1..8 (1 = as stored)


def byte_view(data: bytes | memoryview) -> bytes | memoryview:
    """Return ``data`` indexable as unsigned bytes (flat memoryviews of format 'B')."""
    if isinstance(data, memoryview) and (data.format != "B" or data.ndim != 1):
        try:
            return data.cast("B")
        except TypeError as exc:  # non-contiguous views cannot be cast
            raise DecodeError(f"cannot read image data: {exc}") from None
    return data


def sniff(data: bytes | memoryview) -> str:
    """Name the format from the first bytes; ``'other'`` when no known magic matches."""
    if len(data) == 0:
        raise DecodeError("not an image: empty data (zero bytes)")
    head = bytes(data[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == PNG_MAGIC:
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return "other"


def check_pixels(height: int, width: int, max_pixels: int) -> None:
    """Raise DecompressionBombError when the image has more than ``max_pixels`` pixels."""
    if height * width > max_pixels:
        raise DecompressionBombError(
            f"image of {height}x{width} = {height * width} pixels exceeds "
            f"max_pixels={max_pixels}; refused as a possible decompression bomb"
        )


def check_box(box: Box, info: ImageInfo) -> None:
    """Raise ValueError unless ``box`` is a non-empty region inside the displayed image."""
    top, left, height, width = box
    if height <= 0 or width <= 0 or top < 0 or left < 0:
        raise ValueError(f"box {box} must have top, left >= 0 and height, width > 0")
    if top + height > info.height or left + width > info.width:
        raise ValueError(
            f"box {box} (top, left, height, width) exceeds the image size "
            f"{info.height}x{info.width}"
        )


def exif_orientation(data: bytes | memoryview, start: int, end: int) -> int:
    """Read tag 0x0112 from IFD0 of the TIFF structure in ``data[start:end]``; 0 if none.

    Every read is bounds-checked: garbage gives 0 (no orientation), never an exception. A
    value outside 1..8 counts as none, as Pillow's ``exif_transpose`` treats it.
    """
    end = min(end, len(data))
    if start + 8 > end:
        return 0
    order = bytes(data[start : start + 2])
    if order == b"II":
        endian = "<"
    elif order == b"MM":
        endian = ">"
    else:
        return 0
    magic, ifd_offset = struct.unpack_from(endian + "HI", data, start + 2)
    ifd = start + ifd_offset
    if magic != 42 or ifd + 2 > end:
        return 0
    (count,) = struct.unpack_from(endian + "H", data, ifd)
    count = min(count, (end - ifd - 2) // 12)
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind = struct.unpack_from(endian + "HH", data, entry)
        if tag == 0x0112:
            if kind == 3:  # SHORT
                (value,) = struct.unpack_from(endian + "H", data, entry + 8)
            elif kind == 4:  # LONG, written by a few tools
                (value,) = struct.unpack_from(endian + "I", data, entry + 8)
            else:
                return 0
            return value if 1 <= value <= 8 else 0
    return 0


_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(?:="|>)([0-9])')


def xmp_orientation(packet: bytes) -> int:
    """The ``tiff:Orientation`` of an XMP packet (attribute or element form); 0 if none."""
    match = _XMP_ORIENTATION.search(packet)
    value = int(match[1]) if match else 0
    return value if 1 <= value <= 8 else 0


def stored_size(info: ImageInfo) -> tuple[int, int]:
    """(height, width) of the image as stored, i.e. before orientation."""
    if info.orientation >= 5:
        return info.width, info.height
    return info.height, info.width


def stored_box(box: Box, info: ImageInfo) -> Box:
    """Map a displayed-coordinates box to the same pixels in stored coordinates."""
    top, left, height, width = box
    bottom, right = info.height - top - height, info.width - left - width
    return {
        1: (top, left, height, width),
        2: (top, right, height, width),
        3: (bottom, right, height, width),
        4: (bottom, left, height, width),
        5: (left, top, width, height),
        6: (right, top, width, height),
        7: (right, bottom, width, height),
        8: (left, bottom, width, height),
    }[info.orientation]


def crop_oriented(image: np.ndarray, box: Box, info: ImageInfo, factor: int = 1) -> np.ndarray:
    """Cut ``box`` (displayed coords) out of ``image`` (stored, scaled 1/factor), oriented."""
    orientation = info.orientation
    if orientation == 1 and factor == 1:
        top, left, height, width = box
        if (height, width) == image.shape[:2]:
            return image
        return image[top : top + height, left : left + width]
    top, left, height, width = stored_box(box, info)
    region = image[
        top // factor : -(-(top + height) // factor),
        left // factor : -(-(left + width) // factor),
    ]
    if orientation == 1:
        return region
    return np.ascontiguousarray(orient(region, orientation))


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """Return a view of ``image`` (as stored) transformed for EXIF ``orientation``."""
    if orientation == 2:
        return image[:, ::-1]
    if orientation == 3:
        return image[::-1, ::-1]
    if orientation == 4:
        return image[::-1]
    transposed = image.swapaxes(0, 1)  # gray (h, w) or (h, w, c)
    if orientation == 5:
        return transposed
    if orientation == 6:
        return transposed[:, ::-1]
    if orientation == 7:
        return transposed[::-1, ::-1]
    return transposed[::-1]  # 8


_CONVERSIONS = {
    (1, 3): cv2.COLOR_GRAY2RGB,
    (1, 4): cv2.COLOR_GRAY2RGBA,
    (3, 1): cv2.COLOR_RGB2GRAY,
    (3, 4): cv2.COLOR_RGB2RGBA,
    (4, 1): cv2.COLOR_RGBA2GRAY,
    (4, 3): cv2.COLOR_RGBA2RGB,
}


def to_channels(image: np.ndarray, count: int) -> np.ndarray:
    """A gray (h, w) / (h, w, 1), RGB or RGBA ``uint8`` image with ``count`` channels: gray as
    (h, w) for 1 (luma, BT.601), RGB for 3 (alpha dropped), RGBA for 4 (opaque if none)."""
    have = 1 if image.ndim == 2 else image.shape[2]
    if image.ndim == 3 and have == 1:
        image = image[:, :, 0]
    if have == count or (count == 1 and image.ndim == 2):
        return image
    return cv2.cvtColor(np.ascontiguousarray(image), _CONVERSIONS[(have, count)])

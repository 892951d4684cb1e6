"""WebP: size as Pillow reads it; orientation from the EXIF chunk, else the XMP chunk, of an
extended (VP8X) file; decoded by OpenCV (libwebp), or by Pillow where OpenCV cannot or for an
animation (its first frame)."""

from __future__ import annotations

import struct

import numpy as np

from . import pillow
from .common import Box, ImageInfo, crop_oriented, exif_orientation, xmp_orientation

MAX_CHUNKS = 10_000
_ANIMATION = 0x02


def probe(data: bytes | memoryview) -> tuple[int, int, int]:
    """(height, width, orientation) of a WebP file."""
    height, width, _ = pillow.probe(data, "webp")
    return height, width, _chunks(data)[0]


def animated(data: bytes | memoryview) -> bool:
    """Whether ``data`` is an animated WebP (the VP8X animation flag)."""
    return _chunks(data)[1]


def _chunks(data: bytes | memoryview) -> tuple[int, bool]:
    """(orientation, animated) from the RIFF chunks of an extended file; (1, False) otherwise."""
    n = min(len(data), 8 + struct.unpack_from("<I", data, 4)[0])
    if n < 21 or bytes(data[12:16]) != b"VP8X":
        return 1, False
    animated = bool(data[20] & _ANIMATION)
    exif = xmp = 0
    pos = 12
    for _ in range(MAX_CHUNKS):
        if pos + 8 > n:
            break
        kind, length = struct.unpack_from("<4sI", data, pos)
        start, end = pos + 8, pos + 8 + length
        if kind == b"EXIF" and not exif:
            payload = bytes(data[start:end])
            if payload.startswith(b"Exif\x00\x00"):
                payload = payload[6:]
            exif = exif_orientation(payload, 0, len(payload))
        elif kind == b"XMP " and not xmp:
            xmp = xmp_orientation(bytes(data[start:end]))
        pos = end + (length & 1)
    return exif or xmp or 1, animated


def decode(data: bytes | memoryview, info: ImageInfo, box: Box, *_: object) -> np.ndarray:
    """The displayed ``box`` of a WebP image, RGB."""
    return crop_oriented(pillow.decode_fast(data, info, not animated(data)), box, info)


def decode_rgba(data: bytes | memoryview, info: ImageInfo, box: Box) -> np.ndarray:
    """The displayed ``box`` of a WebP image with its alpha, RGBA: OpenCV's decode of the
    file's own channels (opaque without alpha); Pillow for an animation or what OpenCV
    cannot decode."""
    image = None if animated(data) else pillow.decode_cv2_rgba(data, info)
    if image is None:
        image = pillow.decode(data, info, channels=4)
    return crop_oriented(image, box, info)

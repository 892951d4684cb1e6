"""PNG: size from IHDR; orientation from an eXIf chunk, an ImageMagick "Raw profile type exif"
text chunk or XMP (``tiff:Orientation``), in that order, as Pillow reads them; decoded by
OpenCV (libpng), or by Pillow where OpenCV cannot. An animated PNG (APNG) gives its default
image, the one in IDAT that every non-animating reader shows, through Pillow (OpenCV would
give the first animation frame, which may be another picture)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from ..errors import DecodeError
from . import pillow
from .common import Box, ImageInfo, crop_oriented, exif_orientation, xmp_orientation

MAX_CHUNKS = 100_000
_XMP_KEY = b"XML:com.adobe.xmp"
_RAW_EXIF_KEY = b"Raw profile type exif"


def probe(data: bytes | memoryview) -> tuple[int, int, int]:
    """(height, width, orientation) from the PNG's chunks."""
    if len(data) < 24:
        raise DecodeError("truncated header: PNG data ends before its IHDR chunk")
    if bytes(data[12:16]) != b"IHDR":
        raise DecodeError("corrupt PNG header: first chunk is not IHDR")
    width, height = struct.unpack_from(">II", data, 16)
    return height, width, _chunks(data)[0]


def animated(data: bytes | memoryview) -> bool:
    """Whether ``data`` is an animated PNG (an acTL chunk anywhere): OpenCV's APNG reader
    crashes the process on some damaged ones, so they never go to OpenCV."""
    return _chunks(data)[1]


def _chunks(data: bytes | memoryview) -> tuple[int, bool, bool]:
    """(orientation, is an APNG, has a tRNS chunk) from a walk over the chunks
    (bounds-checked; garbage ends it)."""
    n, pos = len(data), 8
    exif = xmp = 0
    animated = keyed = False
    for _ in range(MAX_CHUNKS):
        if pos + 8 > n:
            break
        length, kind = struct.unpack_from(">I4s", data, pos)
        start, end = pos + 8, pos + 8 + length
        if kind == b"IEND" or end > n:
            break
        if kind == b"acTL":
            animated = True
        elif kind == b"tRNS":
            keyed = True
        elif kind == b"eXIf" and not exif:
            exif = _exif_payload(bytes(data[start:end]))
        elif kind in (b"tEXt", b"zTXt", b"iTXt"):
            key, text = _text(kind, bytes(data[start:end]))
            if key == _RAW_EXIF_KEY and not exif:
                exif = _raw_profile(text)
            elif key == _XMP_KEY and not xmp:
                xmp = xmp_orientation(text)
        pos = end + 4
    return exif or xmp or 1, animated, keyed


def _exif_payload(payload: bytes) -> int:
    if payload.startswith(b"Exif\x00\x00"):
        payload = payload[6:]
    return exif_orientation(payload, 0, len(payload))


def _text(kind: bytes, payload: bytes) -> tuple[bytes, bytes]:
    """(keyword, text) of a tEXt/zTXt/iTXt chunk; (b'', b'') when it cannot be read."""
    key, _, rest = payload.partition(b"\x00")
    try:
        if kind == b"zTXt":
            return key, zlib.decompressobj().decompress(rest[1:], 1 << 20)
        if kind == b"iTXt":
            compressed, body = rest[:1] == b"\x01", rest[2:]
            body = body.split(b"\x00", 2)[-1]  # after the language tag and translated key
            return key, zlib.decompressobj().decompress(body, 1 << 20) if compressed else body
    except zlib.error:
        return b"", b""
    return key, rest


def _raw_profile(text: bytes) -> int:
    """Orientation from ImageMagick's hex-encoded "Raw profile type exif" text."""
    try:
        raw = bytes.fromhex("".join(text.decode("latin-1").split("\n")[3:]))
    except ValueError:
        return 0
    return _exif_payload(raw)


def decode(data: bytes | memoryview, info: ImageInfo, box: Box, *_: object) -> np.ndarray:
    """The displayed ``box`` of a PNG (the default image of an APNG), RGB."""
    return crop_oriented(pillow.decode_fast(data, info, not animated(data)), box, info)


def decode_rgba(data: bytes | memoryview, info: ImageInfo, box: Box) -> np.ndarray:
    """The displayed ``box`` of a PNG with its alpha, RGBA: OpenCV's decode of the file's own
    channels; Pillow for an APNG, and for a tRNS transparency OpenCV did not turn into alpha
    (a gray image's transparent value)."""
    _, is_apng, keyed = _chunks(data)
    image = None if is_apng else pillow.decode_cv2_rgba(data, info, need_alpha=keyed)
    if image is None:
        image = pillow.decode(data, info, channels=4)
    return crop_oriented(image, box, info)

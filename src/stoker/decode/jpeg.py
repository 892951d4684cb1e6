"""JPEG: stoker's own marker parser and the JPEG decoders.

:func:`parse_header` walks the marker segments up to the first scan, as libjpeg does (garbage
before a marker is skipped, fill bytes are allowed), and reads the frame size, the components
and their sampling factors, the Adobe colour transform and the EXIF/XMP orientation. It is
pure Python and has no opinion about subsampling, so every JPEG libjpeg-turbo can decode
(4:4:1, 4:1:0, 2x4 ...) probes, whether or not the C extension is built.

Decoding (:func:`decode`) first checks that the data reaches an end-of-image marker after its
scan data (trailing bytes after it, any amount, are fine: phone "motion photos" carry a
video there). That check does not depend on the crop: a truncated file is reported the same
whatever region an epoch draws. Then:

1. the crop-window C extension (:mod:`.jpegcrop`): only the rows and columns needed, at a
   reduced DCT scale when the caller will shrink the region anyway;
2. where it is not built, or for CMYK/YCCK, simplejpeg (strict) over the whole image;
3. Pillow, the reference, for what those refuse.

Grayscale (``channels=1``) is asked of libjpeg itself in 1 and 2 (its grayscale output: a
YCbCr file's Y plane, the chroma never decoded, upsampled or converted); Pillow's RGB is
from libjpeg's grayscale output too (Pillow's ``draft("L")``) in 3.

libjpeg warnings (recoverable corrupt data) do not stop a decode, as they do not in Pillow or
OpenCV; they are appended to the caller's ``notes`` so the loader can report them.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

import numpy as np
import simplejpeg

from ..errors import DecodeError
from . import jpegcrop, pillow
from .common import (
    Box,
    ImageInfo,
    crop_oriented,
    exif_orientation,
    orient,
    stored_box,
    stored_size,
    xmp_orientation,
)

MAX_SEGMENTS = 4096
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD9)})  # TEM, RST0-7, SOI
_XMP_ID = b"http://ns.adobe.com/xap/1.0/\x00"
_EOI = b"\xff\xd9"
_MARKER = re.compile(rb"(?<=\xff)[^\x00\xff]")  # a marker's code: after FF, not 00 or FF
# simplejpeg's messages (strict mode) for libjpeg's warnings: recoverable, decoded by Pillow.
_WARNING_TEXTS = (
    "corrupt jpeg data",
    "premature end of data segment",
    "unknown adobe",
    "inconsistent progression",
    "invalid sos parameters",
    "bad icc",
)


class JpegHeader(NamedTuple):
    """What :func:`parse_header` reads from the markers before the first scan."""

    height: int  # stored (not oriented)
    width: int
    components: int
    sampling: tuple[tuple[int, int], ...]  # (h, v) sampling factors per component
    colorspace: str  # 'gray', 'ycbcr', 'rgb', 'cmyk', 'ycck' or 'unknown' (libjpeg's guess)
    process: str  # 'baseline', 'extended', 'progressive', 'lossless', with '+arithmetic'
    orientation: int  # EXIF orientation, else XMP tiff:Orientation, else 1
    scan: int  # offset of the first SOS marker


def parse_header(data: bytes | memoryview) -> JpegHeader:
    """Parse a JPEG's markers up to its first scan; DecodeError when that is not possible."""
    n, pos = len(data), 2
    frame: tuple[int, int, int, tuple[tuple[int, int], ...], tuple[int, ...], int] | None = None
    exif = xmp = 0
    adobe: int | None = None
    jfif = False
    for _ in range(MAX_SEGMENTS):
        pos = _next_marker(data, pos)
        marker = data[pos + 1]
        if marker in _NO_LENGTH:
            pos += 2
            continue
        if marker == 0xD9:
            raise DecodeError("corrupt JPEG: end-of-image marker before any image data")
        if pos + 4 > n:
            raise DecodeError("truncated JPEG header: the data ends inside a marker")
        length = (data[pos + 2] << 8) | data[pos + 3]
        end = pos + 2 + length
        if length < 2 or end > n:
            raise DecodeError(
                f"truncated or corrupt JPEG header: segment FF{marker:02X} of {length} bytes "
                f"at offset {pos} does not fit the {n} bytes of data"
            )
        if marker == 0xDA:
            if frame is None:
                raise DecodeError("corrupt JPEG: scan data before any frame header (SOF)")
            return _header(frame, adobe, jfif, exif or xmp or 1, pos)
        if marker in _SOF and frame is None:
            frame = _frame(data, pos, end, marker)
        elif marker == 0xE1 and not exif:
            exif, xmp = _app1_orientation(data, pos + 4, end, exif, xmp)
        elif marker == 0xE0 and bytes(data[pos + 4 : pos + 9]) == b"JFIF\x00":
            jfif = True
        elif marker == 0xEE and length >= 14 and bytes(data[pos + 4 : pos + 9]) == b"Adobe":
            adobe = data[pos + 15]
        pos = end
    raise DecodeError(f"corrupt JPEG header: more than {MAX_SEGMENTS} marker segments")


def _next_marker(data: bytes | memoryview, pos: int) -> int:
    """The offset of the next marker at or after ``pos``: junk bytes, fill bytes and stuffed
    FF 00 pairs are skipped, as libjpeg skips them (with a warning)."""
    if pos + 1 < len(data) and data[pos] == 0xFF and data[pos + 1] not in (0x00, 0xFF):
        return pos  # the usual case: a marker right here
    found = _MARKER.search(data, pos + 1)
    if found is None:
        raise DecodeError("truncated JPEG header: the data ends before the first scan")
    return found.start() - 1


def _find(data: bytes | memoryview, needle: bytes, start: int) -> int:
    """``data.find(needle, start)`` for bytes and memoryviews alike, without copying."""
    found = re.compile(re.escape(needle)).search(data, start)
    return -1 if found is None else found.start()


def _frame(data: bytes | memoryview, pos: int, end: int, marker: int) -> tuple:
    """(height, width, precision, sampling factors, component ids, SOF marker) of an SOF."""
    if end - pos < 10:
        raise DecodeError("corrupt JPEG header: frame header (SOF) too short")
    precision = data[pos + 4]
    height, width = struct.unpack_from(">HH", data, pos + 5)
    count = data[pos + 9]
    if count == 0 or pos + 10 + 3 * count > end:
        raise DecodeError(f"corrupt JPEG header: frame header lists {count} components")
    comps = [pos + 10 + 3 * i for i in range(count)]
    sampling = tuple((data[c + 1] >> 4, data[c + 1] & 15) for c in comps)
    if height == 0:
        raise DecodeError("unsupported JPEG: image height given by a DNL marker (height 0)")
    if width == 0 or any(h not in (1, 2, 3, 4) or v not in (1, 2, 3, 4) for h, v in sampling):
        raise DecodeError(f"corrupt JPEG header: width {width}, sampling factors {sampling}")
    return height, width, precision, sampling, tuple(data[c] for c in comps), marker


def _app1_orientation(data: bytes | memoryview, start: int, end: int, exif: int, xmp: int):
    """(exif, xmp) orientations updated from an APP1 segment's payload ``data[start:end]``."""
    head = bytes(data[start : start + len(_XMP_ID)])
    if head[:6] == b"Exif\x00\x00":
        return exif_orientation(data, start + 6, end), xmp
    if head == _XMP_ID and not xmp:
        return exif, xmp_orientation(bytes(data[start + len(_XMP_ID) : end]))
    return exif, xmp


def _header(frame: tuple, adobe: int | None, jfif: bool, orientation: int, scan: int):
    height, width, _, sampling, ids, marker = frame
    count = len(ids)
    if count == 1:
        colorspace = "gray"
    elif count == 3:  # as libjpeg's default_decompress_parms guesses it
        if jfif:
            rgb = False
        elif adobe is not None:
            rgb = adobe == 0
        else:
            rgb = ids == (82, 71, 66)  # 'R', 'G', 'B'
        colorspace = "rgb" if rgb else "ycbcr"
    elif count == 4:
        colorspace = "ycck" if adobe not in (None, 0) else "cmyk"
    else:
        colorspace = "unknown"
    process = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive", 0xC3: "lossless"}.get(
        marker & ~8, "hierarchical"
    )
    if marker & 8:
        process += "+arithmetic"
    return JpegHeader(height, width, count, sampling, colorspace, process, orientation, scan)


def probe(data: bytes | memoryview) -> tuple[int, int, int]:
    """Stored (height, width) and orientation of JPEG data."""
    header = parse_header(data)
    return header.height, header.width, header.orientation


def check_complete(data: bytes | memoryview) -> None:
    """Raise DecodeError unless an end-of-image marker follows the scan data.

    FF D9 cannot occur inside entropy-coded data (an FF there is stuffed or a restart marker),
    so the first one after the first scan header ends the image; whatever follows is not
    looked at. The common case (the file ends with FF D9) costs nothing.
    """
    if bytes(data[-2:]) == _EOI:
        return
    if _find(data, _EOI, parse_header(data).scan) < 0:
        raise DecodeError("truncated JPEG: the data ends before its end-of-image marker (FF D9)")


def decode(
    data: bytes | memoryview,
    info: ImageInfo,
    box: Box,
    min_size: tuple[int, int] | None,
    fast: bool,
    notes: list[str] | None,
    channels: int = 3,
) -> np.ndarray:
    """The displayed-coordinates ``box`` of a JPEG, RGB (or gray (h, w) for ``channels=1``),
    possibly at a reduced DCT scale."""
    check_complete(data)
    if jpegcrop.AVAILABLE:
        region = _decode_window(data, info, box, min_size, fast, notes, channels)
        if region is not None:
            return region
    factor = _scale_factor(box, min_size)
    image, factor = _decode_whole(data, info, factor, fast, notes, channels)
    return crop_oriented(image, box, info, factor)


def scan_warnings(data: bytes | memoryview, info: ImageInfo) -> list[str]:
    """libjpeg's warnings for all of a JPEG's data: a decode of the whole image at 1/8 scale,
    gray, fast (every entropy-coded byte is read, where the warnings arise, for a fraction of
    a full decode's work); ``[]`` when there are none."""
    notes: list[str] = []
    try:
        if jpegcrop.AVAILABLE:
            jpegcrop.decode_region(
                data, None, (1, 1), True, image_size=stored_size(info), notes=notes, channels=1
            )
            return notes
        simplejpeg.decode_jpeg(
            data,
            colorspace="GRAY",
            fastdct=True,
            fastupsample=True,
            min_height=1,
            min_width=1,
            strict=True,
        )
    except ValueError as exc:
        if "cmyk" in str(exc).lower():  # decoded whole (simplejpeg strict): seen already
            return notes
        notes.append(f"libjpeg: {exc}")
    return notes


def _decode_window(data, info: ImageInfo, box: Box, min_size, fast: bool, notes, channels):
    """Decode only ``box`` with the C extension; None where it cannot (CMYK/YCCK)."""
    stored = stored_box(box, info)
    if min_size is not None and info.orientation >= 5:
        min_size = (min_size[1], min_size[0])
    try:
        region = jpegcrop.decode_region(
            data,
            stored,
            min_size,
            fast,
            image_size=stored_size(info),
            notes=notes,
            channels=channels,
        )
    except ValueError as exc:
        message = str(exc)
        if "cmyk" in message.lower():
            return None
        if message.startswith("truncated"):
            raise DecodeError(message) from None
        return _reference(data, info, message, box, channels)
    if info.orientation == 1:
        return region
    return np.ascontiguousarray(orient(region, info.orientation))


def _reference(data, info: ImageInfo, message: str, box: Box, channels: int) -> np.ndarray:
    """Pillow's decode of a JPEG libjpeg-turbo refused here; DecodeError if Pillow fails too."""
    try:
        image = pillow.decode(data, info, channels=channels)
    except DecodeError:
        raise DecodeError(message) from None  # libjpeg's reason: "corrupt or unsupported ..."
    return crop_oriented(image, box, info)


def _scale_factor(box: Box, min_size: tuple[int, int] | None) -> int:
    """Largest DCT downscale in (8, 4, 2) that keeps the region >= ``min_size``; else 1."""
    if min_size is None:
        return 1
    return jpegcrop.pick_denom(box[2], box[3], min_size[0], min_size[1])


def _decode_whole(
    data, info: ImageInfo, factor: int, fast: bool, notes, channels: int = 3
) -> tuple[np.ndarray, int]:
    """Decode a whole JPEG at scale 1/``factor`` with simplejpeg (Pillow where it refuses),
    RGB or (``channels=1``) libjpeg's grayscale; return the array and the scale used."""
    stored_h, stored_w = stored_size(info)
    want_h, want_w = -(-stored_h // factor), -(-stored_w // factor)
    try:
        image = simplejpeg.decode_jpeg(
            data,
            colorspace="GRAY" if channels == 1 else "RGB",
            fastdct=fast,
            fastupsample=fast,
            min_height=want_h if factor > 1 else 0,
            min_width=want_w if factor > 1 else 0,
            strict=True,
        )
    except ValueError as exc:
        image = pillow.decode(data, info, channels=channels)
        message = str(exc)
        if notes is not None and any(t in message.lower() for t in _WARNING_TEXTS):
            notes.append(f"libjpeg warning: {message}")
        return image, 1
    if channels == 1:
        image = image[:, :, 0]
    if image.shape[:2] != (want_h, want_w):
        if factor > 1:  # a tiny image where another scale gave the same size: go full
            return _decode_whole(data, info, 1, fast, notes, channels)
        raise DecodeError(f"JPEG decoded to {image.shape[:2]}, header says {(stored_h, stored_w)}")
    return image, factor

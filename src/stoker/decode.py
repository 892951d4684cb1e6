"""Image decoding: header probing and (reduced-scale, cropped) decoding to RGB uint8.

This module owns turning the bytes of one image file into pixels:

- :func:`probe` reads only the header: format (from magic bytes, never the file name),
  displayed size (after EXIF orientation) and orientation, and refuses decompression bombs
  before any pixel is allocated.
- :func:`decode` returns the RGB ``uint8`` pixels of a region given in displayed
  coordinates, optionally at a reduced JPEG DCT scale (1/2, 1/4, 1/8) when the caller will
  shrink it anyway. JPEG goes through simplejpeg (libjpeg-turbo) in strict mode; everything
  else through ``cv2.imdecode`` with Pillow as the last resort.

Every failure caused by the data is a :class:`~stoker.errors.DecodeError` (or its subclass
:class:`~stoker.errors.DecompressionBombError`); a bad argument is a plain ``ValueError``.
EXIF orientation is read and applied for JPEG only; other formats are decoded as stored.
"""

from __future__ import annotations

import functools
import io
import struct
from typing import NamedTuple

import cv2
import numpy as np
import simplejpeg
from PIL import Image

from . import jpegcrop
from .errors import DecodeError, DecompressionBombError

__all__ = ["IMAGE_EXTENSIONS", "ImageInfo", "probe", "decode", "DEFAULT_MAX_PIXELS"]

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

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# OpenCV >= 4.10 decodes straight to RGB; older versions give BGR, swapped in _decode_other.
_CV2_RGB = hasattr(cv2, "IMREAD_COLOR_RGB")
_CV2_FLAGS = getattr(cv2, "IMREAD_COLOR_RGB", cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION
_PIL_FORMATS = {
    "JPEG": "jpeg",
    "MPO": "jpeg",
    "PNG": "png",
    "WEBP": "webp",
    "BMP": "bmp",
    "DIB": "bmp",
    "GIF": "gif",
    "TIFF": "tiff",
}
_SJ_COLORSPACES = frozenset({"YCbCr", "Gray", "RGB", "CMYK", "YCCK"})
_MAX_JPEG_SEGMENTS = 64


class ImageInfo(NamedTuple):
    """What :func:`probe` learns from an image header, without decoding pixels."""

    height: int  # displayed height, i.e. after applying the EXIF orientation
    width: int  # displayed width
    format: str  # 'jpeg', 'png', 'webp', 'bmp', 'gif', 'tiff' or 'other'
    orientation: int  # EXIF orientation 1..8 (1 = as stored); only JPEG has others


# ---------------------------------------------------------------------------- probe


def probe(data: bytes | memoryview, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Read the header of an encoded image and return its :class:`ImageInfo`.

    The format is recognised from magic bytes, never from a file name. Raises
    :class:`DecodeError` when the data is not a readable image header, and
    :class:`DecompressionBombError` when ``height * width > max_pixels``; neither
    allocates pixel memory.
    """
    data = _byte_view(data)
    fmt = _sniff(data)
    if fmt == "jpeg":
        height, width, orientation = _probe_jpeg(data)
    elif fmt == "png":
        height, width, orientation = _probe_png(data)
    else:
        height, width, fmt = _probe_pillow(data, fmt)
        orientation = 1
    if height <= 0 or width <= 0:
        raise DecodeError(f"corrupt {fmt} header: image size {height}x{width}")
    _check_pixels(height, width, max_pixels)
    if orientation >= 5:
        height, width = width, height
    return ImageInfo(height, width, fmt, orientation)


def _byte_view(data: bytes | memoryview) -> bytes | memoryview:
    """Return ``data`` indexable as unsigned bytes (flat memoryviews of format 'B')."""
    if isinstance(data, memoryview) and (data.format != "B" or data.ndim != 1):
        try:
            return data.cast("B")
        except TypeError as exc:  # non-contiguous views cannot be cast
            raise DecodeError(f"cannot read image data: {exc}") from None
    return data


def _sniff(data: bytes | memoryview) -> str:
    """Name the format from the first bytes; ``'other'`` when no known magic matches."""
    if len(data) == 0:
        raise DecodeError("not an image: empty data (zero bytes)")
    head = bytes(data[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == _PNG_MAGIC:
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


def _check_pixels(height: int, width: int, max_pixels: int) -> None:
    """Raise DecompressionBombError when the image has more than ``max_pixels`` pixels."""
    if height * width > max_pixels:
        raise DecompressionBombError(
            f"image of {height}x{width} = {height * width} pixels exceeds "
            f"max_pixels={max_pixels}; refused as a possible decompression bomb"
        )


def _probe_jpeg(data: bytes | memoryview) -> tuple[int, int, int]:
    """Return stored (height, width) and EXIF orientation of JPEG data."""
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise DecodeError(f"corrupt or truncated JPEG header: {exc}") from None
    return height, width, _jpeg_orientation(data)


def _probe_png(data: bytes | memoryview) -> tuple[int, int, int]:
    """Return (height, width, 1) from the PNG IHDR chunk."""
    if len(data) < 24:
        raise DecodeError("truncated header: PNG data ends before its IHDR chunk")
    if bytes(data[12:16]) != b"IHDR":
        raise DecodeError("corrupt PNG header: first chunk is not IHDR")
    width, height = struct.unpack_from(">II", data, 16)
    return height, width, 1


def _probe_pillow(data: bytes | memoryview, fmt: str) -> tuple[int, int, str]:
    """Return (height, width, format) through a lazy ``PIL.Image.open`` (header only)."""
    formats = None if fmt == "other" else [k for k, v in _PIL_FORMATS.items() if v == fmt]
    try:
        with Image.open(io.BytesIO(data), formats=formats) as im:
            width, height = im.size
            pil_format = im.format or ""
    except Image.DecompressionBombError as exc:
        raise DecompressionBombError(f"refused by Pillow: {exc}") from None
    except Exception as exc:  # Pillow raises many types on garbage headers
        if fmt == "other":
            raise DecodeError("not an image: unrecognised header") from None
        raise DecodeError(f"corrupt or truncated {fmt} header: {exc}") from None
    if fmt == "other":
        fmt = _PIL_FORMATS.get(pil_format, "other")
    return height, width, fmt


def _jpeg_orientation(data: bytes | memoryview) -> int:
    """Return the EXIF orientation (1..8) from a JPEG's APP1 segment; 1 if absent or bad.

    Walks the marker segments up to the first scan; every read is bounds-checked so that
    garbage gives 1, never an exception.
    """
    n = len(data)
    pos = 2
    for _ in range(_MAX_JPEG_SEGMENTS):
        if pos + 4 > n or data[pos] != 0xFF:
            return 1
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xDA, 0xD9):  # start of scan / end of image: no EXIF before pixels
            return 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # segments without a length
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            return 1
        end = min(pos + 2 + length, n)
        if marker == 0xE1 and bytes(data[pos + 4 : pos + 10]) == b"Exif\x00\x00":
            return _exif_orientation(data, pos + 10, end)
        pos += 2 + length
    return 1


def _exif_orientation(data: bytes | memoryview, start: int, end: int) -> int:
    """Read tag 0x0112 from IFD0 of the TIFF structure in ``data[start:end]``; 1 if none."""
    if start + 8 > end:
        return 1
    order = bytes(data[start : start + 2])
    if order == b"II":
        endian = "<"
    elif order == b"MM":
        endian = ">"
    else:
        return 1
    magic, ifd_offset = struct.unpack_from(endian + "HI", data, start + 2)
    ifd = start + ifd_offset
    if magic != 42 or ifd + 2 > end:
        return 1
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
                return 1
            return value if 1 <= value <= 8 else 1
    return 1


# ---------------------------------------------------------------------------- decode


def decode(
    data: bytes | memoryview,
    info: ImageInfo | None = None,
    *,
    box: tuple[int, int, int, int] | None = None,
    min_size: tuple[int, int] | None = None,
    fast: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decode an image (or the region ``box`` of it) to an RGB ``uint8`` array (h, w, 3).

    ``info`` is the result of :func:`probe` on the same data (probed here when None).
    ``box = (top, left, height, width)`` is in displayed (orientation-applied)
    full-resolution coordinates; None means the whole image. With ``min_size = (H, W)``
    a JPEG may be decoded at a DCT scale of 1/2, 1/4 or 1/8, as long as the returned
    region still has at least H rows and W columns (a region smaller than that comes back
    at full resolution). ``fast`` trades a little accuracy for speed (fast IDCT and
    upsampling). The result may be a non-contiguous view.

    Raises :class:`DecodeError` for corrupt, truncated or unsupported data,
    :class:`DecompressionBombError` for images over ``max_pixels``, and ``ValueError``
    for a box outside the image.
    """
    data = _byte_view(data)
    if info is None:
        info = probe(data, max_pixels=max_pixels)
    else:
        _check_pixels(info.height, info.width, max_pixels)
    if box is None:
        box = (0, 0, info.height, info.width)
    else:
        _check_box(box, info)
    if info.format == "jpeg" and jpegcrop.AVAILABLE:
        region = _decode_jpeg_window(data, info, box, min_size, fast)
        if region is not None:
            return region
    factor = _scale_factor(box, min_size) if info.format == "jpeg" else 1
    if info.format == "jpeg":
        image, factor = _decode_jpeg(data, info, factor, fast)
    else:
        image = _decode_other(data, info)
    return _crop_oriented(image, box, info, factor)


def _decode_jpeg_window(
    data: bytes | memoryview,
    info: ImageInfo,
    box: tuple[int, int, int, int],
    min_size: tuple[int, int] | None,
    fast: bool,
) -> np.ndarray | None:
    """Decode only ``box`` with the C extension (crop window, skipped rows, DCT scaling).

    Returns None for CMYK/YCCK (the caller falls back). The file must end in an EOI marker:
    rows below the window are never decoded, so truncation is checked here instead, which
    keeps "is this file bad?" the same whatever crop an epoch draws.
    """
    if not _ends_with_eoi(data):
        raise DecodeError("truncated JPEG: no end-of-image marker")
    stored = _stored_box(box, info)
    if min_size is not None and info.orientation >= 5:
        min_size = (min_size[1], min_size[0])
    try:
        region = jpegcrop.decode_region(
            data, stored, min_size, fast, image_size=_stored_size(info)
        )
    except ValueError as exc:
        if "cmyk" in str(exc).lower():
            return None
        raise DecodeError(f"corrupt JPEG: {exc}") from None
    if info.orientation == 1:
        return region
    return np.ascontiguousarray(_orient(region, info.orientation))


def _ends_with_eoi(data: bytes | memoryview) -> bool:
    """True when an EOI marker (FF D9) is at the end, allowing up to 4 KiB of trailing bytes.

    FF D9 cannot occur inside entropy-coded data (an FF there is always stuffed or a restart
    marker), so a truncated file has none near its end.
    """
    if bytes(data[-2:]) == b"\xff\xd9":
        return True
    return bytes(data[-4096:]).rfind(b"\xff\xd9") >= 0


def _check_box(box: tuple[int, int, int, int], info: ImageInfo) -> None:
    """Raise ValueError unless ``box`` is a non-empty region inside the displayed image."""
    top, left, height, width = box
    if height <= 0 or width <= 0 or top < 0 or left < 0:
        raise ValueError(f"box {box} must have top, left >= 0 and height, width > 0")
    if top + height > info.height or left + width > info.width:
        raise ValueError(
            f"box {box} (top, left, height, width) exceeds the image size "
            f"{info.height}x{info.width}"
        )


def _scale_factor(box: tuple[int, int, int, int], min_size: tuple[int, int] | None) -> int:
    """Largest DCT downscale in (8, 4, 2) that keeps the region >= ``min_size``; else 1."""
    if min_size is None:
        return 1
    min_h, min_w = max(int(min_size[0]), 1), max(int(min_size[1]), 1)
    height, width = box[2], box[3]
    for factor in (8, 4, 2):
        if height >= min_h * factor and width >= min_w * factor:
            return factor
    return 1


def _decode_jpeg(
    data: bytes | memoryview, info: ImageInfo, factor: int, fast: bool
) -> tuple[np.ndarray, int]:
    """Decode a whole JPEG at scale 1/``factor``; return the array and the scale used."""
    stored_h, stored_w = _stored_size(info)
    want_h, want_w = -(-stored_h // factor), -(-stored_w // factor)
    try:
        image = simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            fastdct=fast,
            fastupsample=fast,
            min_height=want_h if factor > 1 else 0,
            min_width=want_w if factor > 1 else 0,
            strict=True,
        )
    except ValueError as exc:
        return _decode_jpeg_fallback(data, info, exc), 1
    if image.shape[:2] != (want_h, want_w):
        if factor > 1:  # a tiny image where another scale gave the same size: go full
            return _decode_jpeg(data, info, 1, fast)
        raise DecodeError(f"JPEG decoded to {image.shape[:2]}, header says {(stored_h, stored_w)}")
    return image, factor


def _decode_jpeg_fallback(data: bytes | memoryview, info: ImageInfo, exc: ValueError) -> np.ndarray:
    """Decode a JPEG that simplejpeg refused as unsupported (not corrupt) with Pillow.

    Corruption (strict-mode warnings, truncation) is never retried: the lenient decoders
    would return a silently damaged image.
    """
    message = str(exc)
    try:
        colorspace = simplejpeg.decode_jpeg_header(data)[2]
    except ValueError:
        colorspace = ""
    if "nsupported" not in message and colorspace in _SJ_COLORSPACES:
        raise DecodeError(f"corrupt or truncated JPEG: {message}") from None
    return _decode_pillow(data, info)


def _decode_other(data: bytes | memoryview, info: ImageInfo) -> np.ndarray:
    """Decode a non-JPEG image with cv2; Pillow only where cv2 lacks the format.

    Where cv2 reads the format, its failure is final: Pillow is laxer (it decodes damaged
    GIF data, for one) and would return a silently corrupt image.
    """
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), _CV2_FLAGS)
    except cv2.error:
        image = None
    expected = _stored_size(info)
    if image is not None and image.shape == (*expected, 3) and image.dtype == np.uint8:
        return image if _CV2_RGB else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    if info.format in ("other", "tiff") or not _cv2_reads(info.format):
        return _decode_pillow(data, info)
    if image is None:
        raise DecodeError(f"corrupt or truncated {info.format} image: OpenCV cannot decode it")
    raise DecodeError(f"{info.format} decoded to {image.shape}, header says {expected}")


@functools.cache
def _cv2_reads(fmt: str) -> bool:
    """Whether this OpenCV build decodes ``fmt`` (checked once on a tiny Pillow-made file)."""
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (10, 20, 30)).save(buf, fmt.upper())
    return cv2.imdecode(np.frombuffer(buf.getvalue(), np.uint8), _CV2_FLAGS) is not None


def _decode_pillow(data: bytes | memoryview, info: ImageInfo) -> np.ndarray:
    """Decode with Pillow (the last resort) and convert any mode to RGB uint8."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            image = _pillow_to_rgb(im)
    except Image.DecompressionBombError as exc:
        raise DecompressionBombError(f"refused by Pillow: {exc}") from None
    except Exception as exc:  # Pillow raises many types on bad data
        raise DecodeError(f"cannot decode {info.format} image: {exc}") from None
    expected = _stored_size(info)
    if image.shape[:2] != expected:
        raise DecodeError(f"{info.format} decoded to {image.shape[:2]}, header says {expected}")
    return image


def _pillow_to_rgb(im: Image.Image) -> np.ndarray:
    """Convert a loaded Pillow image to RGB uint8, scaling 16-bit data (not clipping)."""
    if im.mode.startswith("I;16") or im.mode == "I":
        wide = np.asarray(im).astype(np.uint32, copy=False)
        gray = (np.minimum(wide, 65535) >> 8).astype(np.uint8)
        return cv2.cvtColor(gray, cv2.COLOR_GRAY2RGB)
    if im.mode == "L":
        return cv2.cvtColor(np.asarray(im), cv2.COLOR_GRAY2RGB)
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im)


def _stored_size(info: ImageInfo) -> tuple[int, int]:
    """(height, width) of the image as stored, i.e. before orientation."""
    if info.orientation >= 5:
        return info.width, info.height
    return info.height, info.width


def _stored_box(box: tuple[int, int, int, int], info: ImageInfo) -> tuple[int, int, int, int]:
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


def _crop_oriented(
    image: np.ndarray, box: tuple[int, int, int, int], info: ImageInfo, factor: int
) -> np.ndarray:
    """Cut ``box`` (displayed coords) out of ``image`` (stored, scaled 1/factor), oriented."""
    orientation = info.orientation
    if orientation == 1 and factor == 1:
        top, left, height, width = box
        if (height, width) == image.shape[:2]:
            return image
        return image[top : top + height, left : left + width]
    top, left, height, width = _stored_box(box, info)
    region = image[
        top // factor : -(-(top + height) // factor),
        left // factor : -(-(left + width) // factor),
    ]
    if orientation == 1:
        return region
    return np.ascontiguousarray(_orient(region, orientation))


def _orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """Return a view of ``image`` (as stored) transformed for EXIF ``orientation``."""
    if orientation == 2:
        return image[:, ::-1]
    if orientation == 3:
        return image[::-1, ::-1]
    if orientation == 4:
        return image[::-1]
    transposed = image.transpose(1, 0, 2)
    if orientation == 5:
        return transposed
    if orientation == 6:
        return transposed[:, ::-1]
    if orientation == 7:
        return transposed[::-1, ::-1]
    return transposed[::-1]  # 8


# ---------------------------------------------------------------------------- masks


def decode_mask(
    data: bytes | memoryview | np.ndarray, *, max_pixels: int = DEFAULT_MAX_PIXELS
) -> np.ndarray:
    """Decode a segmentation mask to a ``(h, w)`` ``uint8`` array of class values.

    A palette PNG gives its palette *indices* (the class ids), never the RGB colours; a gray
    image its values; a 3- or 4-channel image its first (red) channel. A decoded array is
    accepted as it is (``(h, w)``, or ``(h, w, c)``: channel 0). Values above 255 (a 16-bit
    mask) are a :class:`DecodeError`: stoker's masks are ``uint8``.
    """
    if isinstance(data, np.ndarray):
        return as_mask(data)
    data = _byte_view(data)
    info = probe(data, max_pixels=max_pixels)
    if info.format == "png" and len(data) > 25 and data[25] == 3:  # colour type 3: palette
        return _decode_mask_pillow(data, info)
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error:
        image = None
    if image is None:
        return _decode_mask_pillow(data, info)
    if image.ndim == 3:
        image = image[:, :, 2] if image.shape[2] >= 3 else image[:, :, 0]  # BGR(A): red
    return as_mask(image)


def _decode_mask_pillow(data: bytes | memoryview, info: ImageInfo) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            keep = im.mode in ("P", "L", "I", "I;16", "1")
            image = np.asarray(im if keep else im.convert("RGB"))
    except Image.DecompressionBombError as exc:
        raise DecompressionBombError(f"refused by Pillow: {exc}") from None
    except Exception as exc:  # Pillow raises many types on bad data
        raise DecodeError(f"cannot decode {info.format} mask: {exc}") from None
    return as_mask(image)


def as_mask(image: np.ndarray) -> np.ndarray:
    """A ``(h, w)`` ``uint8`` view or copy of a decoded mask: channel 0 of a multi-channel one."""
    if image.ndim == 3:
        image = image[:, :, 0]
    if image.ndim != 2:
        raise DecodeError(f"a mask must be (h, w) or (h, w, c), got shape {image.shape}")
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.bool_:
        return image.astype(np.uint8)
    if image.size and (image.min() < 0 or image.max() > 255):
        raise DecodeError(
            f"mask values span {image.min()}..{image.max()}; stoker masks are uint8 (0-255)"
        )
    return image.astype(np.uint8)

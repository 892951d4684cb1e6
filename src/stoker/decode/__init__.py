"""Image decoding: header probing and (reduced-scale, cropped) decoding to RGB uint8.

This package owns turning the bytes of one image file into pixels, one module per format
(:mod:`.jpeg` with the crop-window C extension :mod:`.jpegcrop`, :mod:`.png`, :mod:`.webp`,
:mod:`.bmp`, :mod:`.gif`, :mod:`.tiff`), the shared geometry and orientation rules in
:mod:`.common`, the general OpenCV/Pillow decoders in :mod:`.pillow` and masks in :mod:`.masks`.

- :func:`probe` reads only the header: format (from magic bytes, never the file name),
  displayed size (after EXIF/XMP orientation) and orientation, and refuses decompression
  bombs before any pixel is allocated.
- :func:`decode` returns the RGB ``uint8`` pixels of a region given in displayed
  coordinates, optionally at a reduced JPEG DCT scale (1/2, 1/4, 1/8) when the caller will
  shrink it anyway; ``channels=1`` gives gray (a JPEG straight from libjpeg's grayscale
  output) and ``channels=4`` RGBA (a PNG's or WebP's alpha through OpenCV's unchanged read).

Every failure caused by the data is a :class:`~stoker.errors.DecodeError` (or its subclass
:class:`~stoker.errors.DecompressionBombError`), whatever a decoder underneath raised; a bad
argument is a plain ``ValueError``. Orientation (EXIF, else XMP ``tiff:Orientation``) is
applied for JPEG, PNG, WebP and TIFF, the formats that carry it; BMP and GIF have none.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np

from ..errors import DecodeError, StokerError
from . import bmp, gif, jpeg, jpegcrop, masks, pillow, png, tiff, webp
from .common import (
    DEFAULT_MAX_PIXELS,
    IMAGE_EXTENSIONS,
    Box,
    ImageInfo,
    byte_view,
    check_box,
    check_pixels,
    crop_oriented,
    sniff,
    to_channels,
)
from .masks import as_mask

__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageInfo",
    "probe",
    "decode",
    "decode_mask",
    "as_mask",
    "decoder_name",
    "DEFAULT_MAX_PIXELS",
]

_FORMATS: dict[str, ModuleType] = {
    "jpeg": jpeg,
    "png": png,
    "webp": webp,
    "bmp": bmp,
    "gif": gif,
    "tiff": tiff,
}


def _own_errors(what: str, fmt: str, call: Callable[[], object]) -> object:
    """Run ``call``; any exception but stoker's own becomes a DecodeError saying what failed."""
    try:
        return call()
    except StokerError:
        raise
    except Exception as exc:  # noqa: BLE001 - a decoder's bug or surprise is bad data here
        raise DecodeError(
            f"{fmt} {what} failed inside the decoder: {type(exc).__name__}: {exc}"
        ) from exc


def probe(data: bytes | memoryview, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Read the header of an encoded image and return its :class:`ImageInfo`.

    The format is recognised from magic bytes, never from a file name. Raises
    :class:`DecodeError` when the data is not a readable image header, and
    :class:`DecompressionBombError` when ``height * width > max_pixels``; neither
    allocates pixel memory.
    """
    data = byte_view(data)
    fmt = sniff(data)
    info = _own_errors("header", fmt, lambda: _probe(data, fmt))
    assert isinstance(info, ImageInfo)
    check_pixels(info.height, info.width, max_pixels)
    return info


def _probe(data: bytes | memoryview, fmt: str) -> ImageInfo:
    if fmt in _FORMATS:
        height, width, orientation = _FORMATS[fmt].probe(data)
    else:
        height, width, fmt = pillow.probe(data, fmt)
        orientation = 1
    if height <= 0 or width <= 0:
        raise DecodeError(f"corrupt {fmt} header: image size {height}x{width}")
    if orientation >= 5:
        height, width = width, height
    return ImageInfo(height, width, fmt, orientation)


def decode(
    data: bytes | memoryview,
    info: ImageInfo | None = None,
    *,
    box: Box | None = None,
    min_size: tuple[int, int] | None = None,
    fast: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    notes: list[str] | None = None,
    channels: int = 3,
) -> np.ndarray:
    """Decode an image (or the region ``box`` of it) to an RGB ``uint8`` array (h, w, 3), or
    with ``channels=1`` a gray (h, w) one, with ``channels=4`` an RGBA (h, w, 4) one.

    ``info`` is the result of :func:`probe` on the same data (probed here when None).
    ``box = (top, left, height, width)`` is in displayed (orientation-applied)
    full-resolution coordinates; None means the whole image. With ``min_size = (H, W)``
    a JPEG may be decoded at a DCT scale of 1/2, 1/4 or 1/8, as long as the returned
    region still has at least H rows and W columns (a region smaller than that comes back
    at full resolution). ``fast`` trades a little accuracy for speed (fast IDCT and
    upsampling). The result may be a non-contiguous view. Recoverable problems that did
    not stop the decode (libjpeg's warnings about corrupt data) are appended to ``notes``
    when it is given.

    Gray: a JPEG is decoded straight to gray by libjpeg (its grayscale output, which for the
    usual YCbCr file is the stored Y plane: the chroma is never decoded); other formats are
    converted from RGB with BT.601 luma weights (as Pillow's ``convert("L")``). RGBA: a PNG's or
    WebP's own alpha (OpenCV's unchanged read, Pillow for what it cannot or a gray PNG's tRNS
    key), a JPEG's RGB crop-window decode with alpha 255, Pillow's ``convert("RGBA")`` for
    the other formats.

    Raises :class:`DecodeError` for corrupt, truncated or unsupported data (whatever the
    decoder underneath raised), :class:`DecompressionBombError` for images over
    ``max_pixels``, and ``ValueError`` for a box outside the image or ``channels`` not 1,
    3 or 4.
    """
    if channels not in (1, 3, 4):
        raise ValueError(f"channels={channels!r}: use 1 (gray), 3 (RGB) or 4 (RGBA)")
    data = byte_view(data)
    if info is None:
        info = probe(data, max_pixels=max_pixels)
    else:
        check_pixels(info.height, info.width, max_pixels)
    if box is None:
        box = (0, 0, info.height, info.width)
    else:
        check_box(box, info)
    args = (data, info, box, min_size, fast, notes, channels)
    image = _own_errors("decode", info.format, lambda: _decode(*args))
    assert isinstance(image, np.ndarray)
    return image


def refuse_warnings(
    data: bytes | memoryview,
    info: ImageInfo,
    box: Box | None,
    notes: list[str],
) -> None:
    """``strict_decode``: raise DecodeError when decoding ``box`` of the image gave warnings
    (``notes``), or, for a JPEG decoded only in part, when the rest of its data would (so a
    file is bad in every epoch, whatever crop an epoch draws). Only libjpeg reports
    recoverable damage; the other decoders decode or refuse."""
    found = list(notes)
    whole = box is None or tuple(box) == (0, 0, info.height, info.width)
    if not found and info.format == "jpeg" and not whole:
        found = jpeg.scan_warnings(byte_view(data), info)
    if found:
        raise DecodeError(
            f"decoded only with warnings ({'; '.join(found)}); strict_decode=True counts such "
            "a file as bad"
        )


def _decode(data, info, box, min_size, fast, notes, channels) -> np.ndarray:  # type: ignore[no-untyped-def]
    module = _FORMATS.get(info.format)
    if channels == 4 and module is not jpeg:
        return _decode_rgba(data, info, box)
    if module is jpeg:
        image = jpeg.decode(data, info, box, min_size, fast, notes, 1 if channels == 1 else 3)
    elif module is None:  # another format Pillow reads
        image = crop_oriented(pillow.decode(data, info), box, info)
    else:
        image = module.decode(data, info, box, min_size, fast, notes)
    return to_channels(image, channels)


def _decode_rgba(data: bytes | memoryview, info: ImageInfo, box: Box):  # type: ignore[no-untyped-def]
    """The displayed ``box`` with the image's alpha, RGBA (opaque where it has none)."""
    if info.format in ("png", "webp"):
        return _FORMATS[info.format].decode_rgba(data, info, box)
    if info.format == "tiff":
        return tiff.decode(data, info, box, channels=4)
    return crop_oriented(pillow.decode(data, info, channels=4), box, info)


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
    data = byte_view(data)
    info = probe(data, max_pixels=max_pixels)
    mask = _own_errors("mask decode", info.format, lambda: masks.decode(data, info))
    assert isinstance(mask, np.ndarray)
    return mask


def decoder_name() -> str:
    """The JPEG decoder in use: the crop-window C extension, or simplejpeg where it is not
    built (with the extra cost), for doctor, bench and stats to print."""
    if jpegcrop.AVAILABLE:
        return "stoker crop-window C extension (libjpeg-turbo)"
    return "simplejpeg (crop-window C extension not built: ~20-25% more CPU per image)"

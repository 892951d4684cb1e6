"""The general decoders: OpenCV (fast, for PNG and WebP) and Pillow (the reference, and the
fallback for whatever OpenCV rejects or gets wrong), each giving RGB ``uint8``, or RGBA with
the image's alpha (``color_mode="rgba"``)."""

from __future__ import annotations

import functools
import io
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageCms

from ..errors import DecodeError, DecompressionBombError
from .common import ImageInfo, stored_size

# OpenCV >= 4.10 decodes straight to RGB; older versions give BGR, swapped in decode_cv2.
_CV2_RGB = hasattr(cv2, "IMREAD_COLOR_RGB")
_CV2_FLAGS = getattr(cv2, "IMREAD_COLOR_RGB", cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION
_CV2_UNCHANGED = cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION
_TO_RGBA = {1: cv2.COLOR_GRAY2RGBA, 3: cv2.COLOR_BGR2RGBA, 4: cv2.COLOR_BGRA2RGBA}
PIL_FORMATS = {
    "JPEG": "jpeg",
    "MPO": "jpeg",
    "PNG": "png",
    "WEBP": "webp",
    "BMP": "bmp",
    "DIB": "bmp",
    "GIF": "gif",
    "TIFF": "tiff",
}


def open_header(data: bytes | memoryview, fmt: str) -> Any:
    """A lazily opened Pillow image (header read, no pixels); DecodeError when unreadable."""
    formats = None if fmt == "other" else [k for k, v in PIL_FORMATS.items() if v == fmt]
    try:
        return Image.open(io.BytesIO(data), formats=formats)
    except Image.DecompressionBombError as exc:
        raise DecompressionBombError(f"refused by Pillow: {exc}") from None
    except Exception as exc:  # Pillow raises many types on garbage headers
        if fmt == "other":
            raise DecodeError("not an image: unrecognised header") from None
        raise DecodeError(f"corrupt or truncated {fmt} header: {exc}") from None


def probe(data: bytes | memoryview, fmt: str) -> tuple[int, int, str]:
    """Return (height, width, format) from the header as Pillow reads it."""
    with open_header(data, fmt) as im:
        width, height = im.size
        pil_format = im.format or ""
    if fmt == "other":
        fmt = PIL_FORMATS.get(pil_format, "other")
    return height, width, fmt


def decode_cv2(data: bytes | memoryview, info: ImageInfo) -> np.ndarray | None:
    """OpenCV's RGB decode, or None where OpenCV cannot decode it to the header's size."""
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), _CV2_FLAGS)
    except cv2.error:
        return None
    if image is None or image.shape != (*stored_size(info), 3) or image.dtype != np.uint8:
        return None
    return image if _CV2_RGB else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def decode_cv2_rgba(
    data: bytes | memoryview, info: ImageInfo, need_alpha: bool = False
) -> np.ndarray | None:
    """OpenCV's decode with the image's own channels (``IMREAD_UNCHANGED``) as RGBA ``uint8``
    (opaque where the image has no alpha; 16-bit data scaled to 8 bits, as :func:`to_rgb`
    does); None where OpenCV cannot, or gives no alpha channel though ``need_alpha``."""
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), _CV2_UNCHANGED)
    except cv2.error:
        return None
    if image is None or image.shape[:2] != stored_size(info):
        return None
    have = 1 if image.ndim == 2 else image.shape[2]
    if have not in _TO_RGBA or (need_alpha and have != 4):
        return None
    if image.dtype == np.uint16:
        image = (np.asarray(image, np.uint16) >> 8).astype(np.uint8)
    elif image.dtype != np.uint8:
        return None
    return cv2.cvtColor(image, _TO_RGBA[have])


def decode_fast(data: bytes | memoryview, info: ImageInfo, cv2_first: bool) -> np.ndarray:
    """OpenCV's decode when ``cv2_first`` and it succeeds, else Pillow's."""
    image = decode_cv2(data, info) if cv2_first else None
    return decode(data, info) if image is None else image


def decode(
    data: bytes | memoryview,
    info: ImageInfo,
    frame: int = 0,
    oriented: bool = False,
    channels: int = 3,
) -> np.ndarray:
    """Decode with Pillow (frame ``frame`` of a multi-frame file) to RGB uint8 (``channels``
    4: RGBA with the image's alpha; 1: gray, a JPEG's from libjpeg's own grayscale output) at
    stored size (at displayed size when ``oriented``: Pillow orients TIFFs itself as it loads
    them)."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            if frame:
                im.seek(frame)
            if channels == 1 and im.format in ("JPEG", "MPO"):
                im.draft("L", None)  # libjpeg's gray (the Y plane), as the fast decoders give
            im.load()
            image = _CONVERT[channels](im)
    except Image.DecompressionBombError as exc:
        raise DecompressionBombError(f"refused by Pillow: {exc}") from None
    except DecodeError:
        raise
    except Exception as exc:  # Pillow raises many types on bad data
        raise DecodeError(f"cannot decode {info.format} image: {exc}") from None
    expected = (info.height, info.width) if oriented else stored_size(info)
    if image.shape[:2] != expected:
        raise DecodeError(f"{info.format} decoded to {image.shape[:2]}, header says {expected}")
    return image


def to_rgb(im: Image.Image) -> np.ndarray:
    """Convert a loaded Pillow image to RGB uint8, scaling 16-bit data (not clipping)."""
    if im.mode.startswith("I;16") or im.mode == "I":
        wide = np.asarray(im).astype(np.uint32, copy=False)
        gray = (np.minimum(wide, 65535) >> 8).astype(np.uint8)
        return cv2.cvtColor(gray, cv2.COLOR_GRAY2RGB)
    if im.mode == "L":
        return cv2.cvtColor(np.asarray(im), cv2.COLOR_GRAY2RGB)
    if im.mode == "LAB":
        return np.asarray(ImageCms.applyTransform(im, _lab_to_srgb()))
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im)


def to_rgba(im: Image.Image) -> np.ndarray:
    """Convert a loaded Pillow image to RGBA uint8 (its alpha or transparency kept, opaque
    otherwise); 16-bit and CIELab data as :func:`to_rgb` converts them."""
    if im.mode.startswith("I;16") or im.mode in ("I", "LAB"):
        return cv2.cvtColor(to_rgb(im), cv2.COLOR_RGB2RGBA)
    return np.asarray(im if im.mode == "RGBA" else im.convert("RGBA"))


def to_gray(im: Image.Image) -> np.ndarray:
    """Convert a loaded Pillow image to gray (h, w) uint8: luma (BT.601) of :func:`to_rgb`."""
    if im.mode == "L":
        return np.asarray(im)
    return cv2.cvtColor(to_rgb(im), cv2.COLOR_RGB2GRAY)


_CONVERT = {1: to_gray, 3: to_rgb, 4: to_rgba}


@functools.cache
def _lab_to_srgb() -> ImageCms.ImageCmsTransform:
    """CIELab (D50, as TIFF readers assume it without a WhitePoint tag) to sRGB, by LittleCMS."""
    lab = ImageCms.createProfile("LAB")
    return ImageCms.buildTransform(lab, ImageCms.createProfile("sRGB"), "LAB", "RGB")

"""Segmentation masks: decode to a ``(h, w)`` ``uint8`` array of class values (palette
indices, gray values or the red channel), never RGB colours."""

from __future__ import annotations

import io

import cv2
import numpy as np
from PIL import Image

from ..errors import DecodeError, DecompressionBombError
from . import png, webp
from .common import ImageInfo


def decode(data: bytes | memoryview, info: ImageInfo) -> np.ndarray:
    """The class values of an encoded mask whose header ``info`` was probed."""
    if info.format == "png" and len(data) > 25 and data[25] == 3:  # colour type 3: palette
        return _decode_mask_pillow(data, info)
    if (info.format == "png" and png.animated(data)) or (
        info.format == "webp" and webp.animated(data)
    ):  # the default image / first frame, never OpenCV's APNG reader (see png.animated)
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
    """Pillow's decode of a mask, keeping palette indices and gray values."""
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

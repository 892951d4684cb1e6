"""Segmentation masks: decode to a ``(h, w)`` ``uint8`` array of class values (palette
indices, gray values or the red channel), never RGB colours."""

from __future__ import annotations

import io
from typing import Any

import cv2
import numpy as np
from PIL import Image

from ..errors import ConfigError, DecodeError, DecompressionBombError
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


class MaskMap:
    """``Loader(mask_map=)``: a mapping of mask values applied to every decoded mask, as a
    256-entry lookup table. A dict ``{stored: wanted}`` maps the values it names and keeps the
    others (``{1: 0, 2: 1, 3: 2}`` for Oxford pets' trimaps; ``{255: 255}`` is a no-op); an
    int adds an offset (``-1``: 1..3 -> 0..2). A value that maps outside 0-255 makes its mask
    bad data (named, counted against ``max_errors``), never a silently wrapped value."""

    def __init__(self, value: Any) -> None:
        self.value = value
        table = np.arange(256, dtype=np.int64)
        if isinstance(value, dict):
            for stored, wanted in value.items():
                _check_value("a key", stored, value)
                _check_value("a value", wanted, value)
                table[int(stored)] = int(wanted)
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if not -255 <= value <= 255:
                raise ConfigError(
                    f"mask_map={value!r}: an offset past 255 maps every mask value (0-255) "
                    "outside 0-255, so no mask would load; give an offset in -255..255 (-1: "
                    "1..3 -> 0..2), or a dict {stored: wanted}"
                )
            table += int(value)
        else:
            raise ConfigError(
                f"mask_map={value!r}: give a dict of mask values {{stored: wanted}} (e.g. "
                "{1: 0, 2: 1, 3: 2, 255: 255}) or an int offset (-1)"
            )
        self.valid = (table >= 0) & (table <= 255)
        self.table = np.where(self.valid, table, 0).astype(np.uint8)

    def apply(self, mask: np.ndarray) -> np.ndarray:
        """The mapped mask (a new array); DecodeError for a value with no uint8 image."""
        if not self.valid.all():
            bad = ~self.valid[mask]
            if bad.any():
                v = int(mask[bad][0])
                raise DecodeError(
                    f"mask value {v} maps to {v + int(self.value)} with mask_map={self.value}, "
                    "outside the uint8 masks' 0-255; map it with a dict instead"
                )
        return self.table[mask]


def _check_value(what: str, v: Any, mapping: dict[Any, Any]) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= 255:
        raise ConfigError(
            f"mask_map={mapping!r}: {what} {v!r} is not a mask value; masks are uint8, so keys "
            "and values are ints in 0-255 (use 255 as the ignored class: CrossEntropyLoss("
            "ignore_index=255))"
        )

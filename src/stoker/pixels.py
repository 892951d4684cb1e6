"""How decoded pixels become the batch's image: channel count (``color_mode``), the resize
filter (``interpolation``) and fitting another aspect ratio (``crop_to_aspect_ratio`` /
``pad_to_aspect_ratio``), as Keras' ``image_dataset_from_directory`` names them."""

from __future__ import annotations

import io
from typing import Any

import cv2
import numpy as np

from .errors import ConfigError, DecodeError

COLOR_MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}
INTERPOLATIONS = {
    "bilinear": cv2.INTER_LINEAR,
    "area": cv2.INTER_AREA,
    "bicubic": cv2.INTER_CUBIC,
    "nearest": cv2.INTER_NEAREST_EXACT,
}
Box = tuple[int, int, int, int]  # top, left, height, width


def channels(color_mode: Any, own: int | None) -> int:
    """Channels of the batch's images: ``color_mode`` ("grayscale" 1, "rgb" 3, "rgba" 4);
    None keeps a source of decoded arrays' own channel count (``own``), else 3."""
    if color_mode is None:
        return own if own is not None else 3
    if not isinstance(color_mode, str) or color_mode not in COLOR_MODES:
        raise ConfigError(f"color_mode={color_mode!r}: use 'grayscale', 'rgb', 'rgba' or None")
    return COLOR_MODES[color_mode]


def interpolation(value: Any) -> str:
    """Check ``interpolation``: "auto" (bilinear, area averaging past a 2x shrink) or a name."""
    if isinstance(value, str) and (value == "auto" or value in INTERPOLATIONS):
        return str(value)
    raise ConfigError(
        f"interpolation={value!r}: use 'auto', {', '.join(repr(k) for k in INTERPOLATIONS)}"
    )


def to_channels(image: np.ndarray, count: int) -> np.ndarray:
    """A gray (h, w) / (h, w, 1), RGB or RGBA ``uint8`` image with ``count`` channels: gray as
    (h, w) for 1 (luma, BT.601), RGB for 3 (alpha dropped), RGBA for 4 (opaque if none)."""
    have = 1 if image.ndim == 2 else image.shape[2]
    if image.ndim == 3 and have == 1:
        image = image[:, :, 0]
    if have == count or (count == 1 and image.ndim == 2):
        return image
    code = {
        (1, 3): cv2.COLOR_GRAY2RGB,
        (1, 4): cv2.COLOR_GRAY2RGBA,
        (3, 1): cv2.COLOR_RGB2GRAY,
        (3, 4): cv2.COLOR_RGB2RGBA,
        (4, 1): cv2.COLOR_RGBA2GRAY,
        (4, 3): cv2.COLOR_RGBA2RGB,
    }[(have, count)]
    return cv2.cvtColor(np.ascontiguousarray(image), code)


def resize_into(region: np.ndarray, out: np.ndarray, how: str = "auto") -> None:
    """Resize ``region`` (channels already ``out``'s) into ``out`` in place."""
    h, w = out.shape[:2]
    target = out[:, :, 0] if out.ndim == 3 and out.shape[2] == 1 else out
    if region.ndim == 3 and region.shape[2] == 1:
        region = region[:, :, 0]
    if region.shape[:2] == (h, w):
        target[...] = region
        return
    if how == "auto":
        shrink = min(region.shape[0] / h, region.shape[1] / w)
        code = cv2.INTER_AREA if shrink > 2.0 else cv2.INTER_LINEAR
    else:
        code = INTERPOLATIONS[how]
    cv2.resize(region, (w, h), dst=target, interpolation=code)


def aspect_box(h: int, w: int, out_h: int, out_w: int) -> Box:
    """``crop_to_aspect_ratio``: the largest centred box of ``out_h:out_w``'s aspect ratio."""
    if h * out_w > w * out_h:  # taller than wanted: crop rows
        ch, cw = max(1, round(w * out_h / out_w)), w
    else:
        ch, cw = h, max(1, round(h * out_w / out_h))
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def pad_into(region: np.ndarray, out: np.ndarray, how: str) -> None:
    """``pad_to_aspect_ratio``: resize keeping the aspect ratio, centred, black borders."""
    h, w = out.shape[:2]
    scale = min(h / region.shape[0], w / region.shape[1])
    rh = min(h, max(1, round(region.shape[0] * scale)))
    rw = min(w, max(1, round(region.shape[1] * scale)))
    top, left = (h - rh) // 2, (w - rw) // 2
    inner = np.empty((rh, rw, *out.shape[2:]), out.dtype)
    resize_into(region, inner, how)
    out[...] = 0
    out[top : top + rh, left : left + rw] = inner


def decode_rgba(data: bytes, box: Box | None) -> np.ndarray:
    """Decode an image with its alpha channel (``color_mode="rgba"`` on files) through Pillow,
    orientation applied, cut to ``box``; images without alpha come out opaque."""
    from PIL import Image, ImageOps

    try:
        with Image.open(io.BytesIO(data)) as img:
            rgba = np.asarray(ImageOps.exif_transpose(img).convert("RGBA"))
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this sample's bad data
        raise DecodeError(f"cannot decode with alpha ({type(exc).__name__}: {exc})") from None
    if box is None:
        return rgba
    return rgba[box[0] : box[0] + box[2], box[1] : box[1] + box[3]]

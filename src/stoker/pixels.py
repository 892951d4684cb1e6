"""How decoded pixels become the batch's image: channel count (``color_mode``), the resize
filter (``interpolation``) and fitting another aspect ratio (``crop_to_aspect_ratio`` /
``pad_to_aspect_ratio``), as Keras' ``image_dataset_from_directory`` names them."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from .decode.common import Box
from .decode.common import to_channels as to_channels  # re-exported: the pipelines use it
from .errors import ConfigError

COLOR_MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}
INTERPOLATIONS = {
    "bilinear": cv2.INTER_LINEAR,
    "area": cv2.INTER_AREA,
    "bicubic": cv2.INTER_CUBIC,
    "nearest": cv2.INTER_NEAREST_EXACT,
}


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


def pad_box(h: int, w: int, out_h: int, out_w: int) -> Box:
    """``pad_to_aspect_ratio``: where an ``h`` x ``w`` image goes in an ``out_h`` x ``out_w``
    output, ``(top, left, height, width)``, exactly as Keras' ``image_dataset_from_directory``
    places it (``tf.image.resize_with_pad``): the scale from float32 ratios, the size rounded
    down, the offset half the float32 margin rounded down. Rounding the size to nearest, or
    centring the integer size, moves the image by a row or column on some sizes."""
    f = np.float32
    ratio = max(f(w) / f(out_w), f(h) / f(out_h))
    rh_f, rw_f = f(h) / ratio, f(w) / ratio
    rh, rw = max(1, min(out_h, int(np.floor(rh_f)))), max(1, min(out_w, int(np.floor(rw_f))))
    top = max(0, int(np.floor((f(out_h) - rh_f) / f(2))))
    left = max(0, int(np.floor((f(out_w) - rw_f) / f(2))))
    return min(top, out_h - rh), min(left, out_w - rw), rh, rw


def pad_into(
    region: np.ndarray, out: np.ndarray, how: str, full: tuple[int, int] | None = None
) -> None:
    """``pad_to_aspect_ratio``: resize keeping the aspect ratio into ``pad_box``'s place,
    black borders. ``full``: the image's own (height, width) when ``region`` was decoded at a
    reduced scale (the place follows the image's size, as Keras decodes it whole)."""
    h, w = out.shape[:2]
    fh, fw = full if full is not None else region.shape[:2]
    top, left, rh, rw = pad_box(fh, fw, h, w)
    inner = np.empty((rh, rw, *out.shape[2:]), out.dtype)  # cv2 writes only contiguous dst
    resize_into(region, inner, how)
    out[...] = 0
    out[top : top + rh, left : left + rw] = inner

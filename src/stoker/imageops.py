"""Pixel operations on ``uint8`` images, as torchvision and PIL define them.

Each function takes an RGB ``(h, w, 3)`` or grayscale ``(h, w)`` / ``(h, w, 1)`` ``uint8``
image, never writes into it (it may be a view of a batch slot or of the user's array), and
returns a new image of the same shape, or the input itself where the operation changes nothing.

How each matches its definition:

- Per-value maps (brightness, contrast, posterize, solarize, autocontrast, equalize) are
  256-entry lookup tables computed as PIL computes them (``float32`` blends truncated to an
  integer, PIL's integer rounding of the contrast mean), so they give PIL's bytes.
- Blends with a per-pixel image (saturation, sharpness) run through ``cv2.addWeighted``, which
  rounds; a bias of ``-0.5 + 1/512`` turns the rounding into the truncation PIL and torchvision
  apply, except where the exact result is within ``1/512`` below an integer.
- Geometry (shear, translate, rotate) is ``cv2.warpAffine`` with nearest-neighbour sampling and
  black fill, given PIL's inverse matrix moved from PIL's pixel-corner coordinates to OpenCV's
  pixel-centre ones.
- Hue is rotated in ``float32`` HSV (torchvision's tensor definition, without its 8-bit hue
  quantisation on the PIL path) and rounded back to ``uint8``.
"""

from __future__ import annotations

import math
import threading

import cv2
import numpy as np

from .errors import ConfigError

_VALUES = np.arange(256, dtype=np.float32)
_TRUNCATE = -0.5 + 1 / 512  # addWeighted's bias that makes its rounding a truncation
_TIE = 1.5 / 1024  # see warp
_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13  # PIL ImageFilter.SMOOTH


def check_image(image: np.ndarray, op: str) -> np.ndarray:
    """``image`` as a C-contiguous RGB or grayscale ``uint8`` array; a TypeError naming ``op``
    for anything else."""
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (1, 3))):
        raise TypeError(
            f"stoker.ops.{op} works on uint8 RGB (h, w, 3) or grayscale images; got {arr.dtype} "
            f"of shape {arr.shape} (with color_mode='rgba', drop the alpha channel first)"
        )
    return np.ascontiguousarray(arr)


def is_rgb(image: np.ndarray) -> bool:
    """Whether ``image`` has three colour channels (otherwise it is grayscale)."""
    return image.ndim == 3 and image.shape[2] == 3


def _like(result: np.ndarray, image: np.ndarray) -> np.ndarray:
    """OpenCV drops a trailing channel axis of 1; give ``result`` ``image``'s shape back."""
    return result.reshape(image.shape) if result.shape != image.shape else result


def apply_lut(image: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Map every value through a 256-entry ``uint8`` table (or one table per channel,
    shape ``(256, 3)``)."""
    table = lut.reshape(256, 1, -1) if lut.ndim == 2 else lut
    return _like(cv2.LUT(image, table), image)


def blend_lut(factor: float, degenerate: float) -> np.ndarray:
    """The table of PIL's ``Image.blend(degenerate, image, factor)`` for a constant
    degenerate value: ``degenerate + factor * (v - degenerate)``, clipped, truncated."""
    d = np.float32(degenerate)
    values = d + np.float32(factor) * (_VALUES - d)
    return np.clip(values, 0, 255).astype(np.uint8)


def blend(image: np.ndarray, degenerate: np.ndarray, factor: float) -> np.ndarray:
    """PIL's ``Image.blend(degenerate, image, factor)``: clipped, truncated to ``uint8``."""
    f = float(factor)
    return _like(cv2.addWeighted(image, f, degenerate, 1.0 - f, _TRUNCATE), image)


def gray(image: np.ndarray) -> np.ndarray:
    """The luma ``(h, w)`` of an RGB image (ITU-R 601-2, as PIL's ``convert("L")``)."""
    return cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)


# ------------------------------------------------------------------------ colour


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Brightness``: blend with black; 1 is the identity."""
    if factor == 1:
        return image
    return apply_lut(image, blend_lut(factor, 0.0))


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Contrast``: blend with the image's mean luma, rounded to an integer."""
    if factor == 1:
        return image
    luma = gray(image) if is_rgb(image) else image
    mean = int(cv2.mean(luma)[0] + 0.5)
    return apply_lut(image, blend_lut(factor, mean))


def saturation(image: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Color``: blend with the image's grayscale; gray images are unchanged."""
    if factor == 1 or not is_rgb(image):
        return image
    degenerate = cv2.cvtColor(gray(image), cv2.COLOR_GRAY2RGB)
    return blend(image, degenerate, factor)


def hue(image: np.ndarray, shift: float) -> np.ndarray:
    """torchvision's ``adjust_hue``: rotate the hue by ``shift`` turns (-0.5..0.5) in HSV,
    keeping saturation and value; gray images are unchanged."""
    if shift == 0 or not is_rgb(image):
        return image
    rgb, hsv = _scratch(image.shape)
    rgb[...] = image
    cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV, dst=hsv)  # hue in degrees
    hsv[..., 0] += (shift % 1.0) * 360.0  # HSV2RGB takes angles 0-720, not < 0
    cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=rgb)  # 0-255, never negative
    return cv2.convertScaleAbs(rgb)  # rounded, saturated, in one pass


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 arrays of ``shape``, kept per thread for the last shape asked for: a fresh
    float image per call costs more in page faults than the colour conversion itself (see
    benchmarks/README.md#stock-augmentation-ops)."""
    pair = getattr(_SCRATCH, "pair", None)
    if pair is None or pair[0].shape != shape:
        pair = _SCRATCH.pair = (np.empty(shape, np.float32), np.empty(shape, np.float32))
    return pair


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Sharpness``: blend with PIL's SMOOTH filter of the image, whose
    one-pixel border is the image's own; images under 3x3 are unchanged."""
    if factor == 1 or image.shape[0] < 3 or image.shape[1] < 3:
        return image
    smooth = _like(cv2.filter2D(image, -1, _SMOOTH, borderType=cv2.BORDER_REPLICATE), image)
    smooth[0], smooth[-1], smooth[:, 0], smooth[:, -1] = (
        image[0],
        image[-1],
        image[:, 0],
        image[:, -1],
    )
    return blend(image, smooth, factor)


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
    """``ImageOps.posterize``: keep the top ``bits`` (1-8) bits of each value."""
    if bits >= 8:
        return image
    mask = (0xFF << (8 - int(bits))) & 0xFF
    return apply_lut(image, (np.arange(256) & mask).astype(np.uint8))


def solarize(image: np.ndarray, threshold: float) -> np.ndarray:
    """``ImageOps.solarize``: invert every value at or above ``threshold``."""
    values = np.arange(256)
    return apply_lut(image, np.where(values >= threshold, 255 - values, values).astype(np.uint8))


def _channels(image: np.ndarray) -> list[np.ndarray]:
    """The image's channels as 2-D arrays."""
    return list(cv2.split(image)) if is_rgb(image) else [image.reshape(image.shape[:2])]


def _per_channel(image: np.ndarray, luts: list[np.ndarray]) -> np.ndarray:
    """Apply one table per channel."""
    return apply_lut(image, np.stack(luts, axis=1) if len(luts) > 1 else luts[0])


def autocontrast(image: np.ndarray) -> np.ndarray:
    """``ImageOps.autocontrast`` (no cutoff): stretch each channel's min..max to 0..255,
    truncating; a flat channel is left as it is."""
    luts = []
    for channel in _channels(image):
        lo, hi = (int(v) for v in cv2.minMaxLoc(channel)[:2])
        if hi <= lo:
            luts.append(np.arange(256, dtype=np.uint8))
            continue
        scale = 255.0 / (hi - lo)
        values = np.arange(256, dtype=np.float64) * scale - lo * scale  # PIL's own arithmetic
        luts.append(np.clip(np.trunc(values), 0, 255).astype(np.uint8))
    return _per_channel(image, luts)


def _histograms(image: np.ndarray) -> np.ndarray:
    """Per-channel counts of each value, shape (channels, 256)."""
    count = 3 if is_rgb(image) else 1
    return np.stack(
        [cv2.calcHist([image], [k], None, [256], [0, 256]).ravel() for k in range(count)]
    ).astype(np.int64)


def equalize(image: np.ndarray) -> np.ndarray:
    """``ImageOps.equalize``: flatten each channel's histogram. Per channel the table is the
    count of smaller values plus half a step, over a step of (all pixels but those of the
    highest value used) / 255; the identity where that step is 0."""
    hist = _histograms(image)
    top = 255 - np.argmax(hist[:, ::-1] > 0, axis=1)  # the highest value used, per channel
    step = (hist.sum(axis=1) - hist[np.arange(len(hist)), top]) // 255
    below = np.cumsum(hist, axis=1) - hist  # pixels of smaller value
    safe = np.maximum(step, 1)[:, None]
    luts = np.clip((below + safe // 2) // safe, 0, 255).astype(np.uint8)
    luts[step == 0] = np.arange(256, dtype=np.uint8)
    return _per_channel(image, list(luts))


# ---------------------------------------------------------------------- geometry

Matrix = tuple[float, float, float, float, float, float]


def warp(image: np.ndarray, inverse: Matrix, fill: int = 0) -> np.ndarray:
    """``Image.transform(AFFINE, inverse, NEAREST, fillcolor=fill)``: output pixel (x, y)
    takes the input at ``inverse @ (x, y, 1)`` in PIL's coordinates (pixel corners; pixel
    ``(x, y)`` is sampled at its centre ``(x + 0.5, y + 0.5)``)."""
    a, b, c, d, e, f = inverse
    # PIL samples floor(M (p + 0.5)); OpenCV's nearest samples round(M' p) in 1/1024-pixel
    # fixed point: M' p = M (p + 0.5) - 0.5 + TIE, where TIE (above that fixed point's error)
    # sends a whole-number coordinate, as on the diagonals of a 45-degree turn, to floor's side;
    # only coordinates within 2.5/1024 below a pixel edge then take the neighbouring pixel
    m = np.array(
        [[a, b, c + (a + b - 1) / 2 + _TIE], [d, e, f + (d + e - 1) / 2 + _TIE]],
        np.float64,
    )
    h, w = image.shape[:2]
    out = cv2.warpAffine(
        image,
        m,
        (w, h),
        flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=(fill, fill, fill, 0),
    )
    return _like(out, image)


def shear_x(image: np.ndarray, amount: float) -> np.ndarray:
    """torchvision's ShearX: ``affine(shear=(degrees(atan(amount)), 0), center=(0, 0))``,
    so output (x, y) takes input (x + amount * y, y)."""
    return image if amount == 0 else warp(image, (1.0, amount, 0.0, 0.0, 1.0, 0.0))


def shear_y(image: np.ndarray, amount: float) -> np.ndarray:
    """torchvision's ShearY: output (x, y) takes input (x, y + amount * x)."""
    return image if amount == 0 else warp(image, (1.0, 0.0, 0.0, amount, 1.0, 0.0))


def translate(image: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """Shift the content by whole pixels (right and down for positive), black fill."""
    if dx == 0 and dy == 0:
        return image
    return warp(image, (1.0, 0.0, -float(dx), 0.0, 1.0, -float(dy)))


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
    """``Image.rotate(degrees)``: counter-clockwise about the centre ``(w / 2, h / 2)``,
    same size, black fill."""
    if degrees % 360 == 0:
        return image
    h, w = image.shape[:2]
    cx, cy = w / 2, h / 2
    r = -math.radians(degrees)
    a, b = round(math.cos(r), 15), round(math.sin(r), 15)
    d, e = -b, a
    c = a * -cx + b * -cy + cx
    f = d * -cx + e * -cy + cy
    return warp(image, (a, b, c, d, e, f))


# ------------------------------------------------------------------- validation


def check_range(name: str, value: object, lo: float, hi: float) -> float:
    """A real number within ``[lo, hi]``, or a ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name}={value!r}: must be a number in [{lo}, {hi}]")
    v = float(value)
    if not (lo <= v <= hi):
        raise ConfigError(f"{name}={value!r}: must be in [{lo}, {hi}]")
    return v

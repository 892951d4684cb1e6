"""Crop boxes and the stock ops (``stoker.ops``): the geometry that the pipelines share.

A box is ``(top, left, height, width)``; the random ones are drawn from a sample's uniforms
(see ``order``), so they depend only on ``(seed, epoch, index)``. Each stock op is
``(image, rng) -> image``, with a ``pair`` form that moves an image and its mask alike.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from . import pixels
from .decode.common import Box
from .pixels import resize_into


def as_rgb(image: np.ndarray) -> np.ndarray:
    """A (h, w, 3) view or copy of a gray, RGB or RGBA uint8 image."""
    return pixels.to_channels(image, 3)


def resize_mask_into(mask: np.ndarray, out: np.ndarray) -> None:
    """Resize a (h, w) ``uint8`` mask into ``out`` in place, nearest-neighbour (no new values)."""
    h, w = out.shape[:2]
    if mask.shape[:2] == (h, w):
        out[...] = mask
        return
    cv2.resize(np.ascontiguousarray(mask), (w, h), dst=out, interpolation=cv2.INTER_NEAREST_EXACT)


def cut(image: np.ndarray, box: Box) -> np.ndarray:
    """The ``(top, left, height, width)`` box of ``image``, as a view."""
    return image[box[0] : box[0] + box[2], box[1] : box[1] + box[3]]


def random_resized_crop_box(
    h: int, w: int, u: np.ndarray, scale: tuple[float, float], ratio: tuple[float, float]
) -> Box:
    """The usual RandomResizedCrop sampling (10 tries, then a centre crop), from 40 uniforms."""
    area = h * w
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[4 * t])
        aspect = math.exp(lo + (hi - lo) * u[4 * t + 1])
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            top = int(u[4 * t + 2] * (h - ch + 1))
            left = int(u[4 * t + 3] * (w - cw + 1))
            return top, left, ch, cw
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        ch, cw = h, w
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def center_box(h: int, w: int, out_h: int, out_w: int, fraction: float) -> Box:
    """The box that 'resize shorter side to out/fraction, then centre crop out' takes."""
    scale = max(out_h / (fraction * h), out_w / (fraction * w))
    ch, cw = min(h, max(1, round(out_h / scale))), min(w, max(1, round(out_w / scale)))
    return (h - ch) // 2, (w - cw) // 2, ch, cw


class _Shown:
    """An op whose repr is its call with its arguments: ``HorizontalFlip(p=0.5)``."""

    _args: tuple[str, ...] = ()

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._args)
        return f"{type(self).__name__}({shown})"


class RandomResizedCrop(_Shown):
    """Op: crop a random area fraction ``scale`` and aspect ``ratio`` of the image."""

    _args = ("scale", "ratio")

    def __init__(self, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> None:
        self.scale, self.ratio = tuple(scale), tuple(ratio)

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        t, left, h, w = random_resized_crop_box(
            image.shape[0], image.shape[1], rng.random(40), self.scale, self.ratio
        )
        return image[t : t + h, left : left + w]

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """The same crop of an image and its mask."""
        box = random_resized_crop_box(
            image.shape[0], image.shape[1], rng.random(40), self.scale, self.ratio
        )
        return cut(image, box), cut(mask, box)


class CenterCrop(_Shown):
    """Op: keep the centre ``fraction`` of each side."""

    _args = ("fraction",)

    def __init__(self, fraction: float = 0.875) -> None:
        self.fraction = fraction

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = image.shape[:2]
        ch, cw = max(1, round(h * self.fraction)), max(1, round(w * self.fraction))
        return image[(h - ch) // 2 : (h - ch) // 2 + ch, (w - cw) // 2 : (w - cw) // 2 + cw]

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """The same centre crop of an image and its mask."""
        return self(image, rng), self(mask, rng)


class Resize(_Shown):
    """Op: resize to ``size`` (int for a square, or (height, width))."""

    _args = ("size",)

    def __init__(self, size: int | tuple[int, int]) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty((self.size[0], self.size[1], 3), np.uint8)
        resize_into(as_rgb(image), out)
        return out

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """The image resized; its mask resized nearest-neighbour (no new values)."""
        out = np.empty(self.size, np.uint8)
        resize_mask_into(mask, out)
        return self(image, rng), out


class HorizontalFlip(_Shown):
    """Op: mirror left-right with probability ``p``."""

    _args = ("p",)

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return image[:, ::-1] if rng.random() < self.p else image

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """Both mirrored, or neither."""
        flip = rng.random() < self.p
        return (image[:, ::-1], mask[:, ::-1]) if flip else (image, mask)

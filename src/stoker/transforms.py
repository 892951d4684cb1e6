"""Train/eval/resize pipelines; each writes one sample into an ``out=`` array.

A pipeline turns one stored sample (encoded bytes or a decoded array) into ``out`` (H, W, 3)
``uint8``. The stock pipelines are fused: the crop box is chosen from the image header, only
that region is decoded (at a reduced DCT scale where the output allows), and it is resized
straight into the batch slot. Randomness comes from per-sample uniforms (see ``order``), so
results depend only on ``(seed, epoch, index)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import cv2
import numpy as np

from . import decode as dec
from . import pixels
from .crops import (
    CenterCrop,
    HorizontalFlip,
    RandomResizedCrop,
    Resize,
    as_rgb,
    center_box,
    cut,
    random_resized_crop_box,
    resize_mask_into,
)
from .decode.common import Box
from .errors import ConfigError, DecodeError
from .pixels import resize_into
from .seeding import seeded
from .userops import (
    check_mask_ops,
    check_user_image,
    check_user_mask,
    op_module,
    pair_step,
    run_post,
    run_post_pair,
)

#: What other stages import from here; the crop boxes and stock ops are ``crops``', the user
#: callables' checks and runners ``userops``'.
__all__ = [
    "STOCK_NAMES",
    "CenterCrop",
    "CustomPipeline",
    "EvalPipeline",
    "HorizontalFlip",
    "ImageSettings",
    "Pipeline",
    "RandomResizedCrop",
    "Resize",
    "ResizePipeline",
    "TrainPipeline",
    "as_rgb",
    "center_box",
    "check_mask_ops",
    "image_pipeline",
    "make_pipeline",
    "random_resized_crop_box",
    "resize_into",
    "resize_mask_into",
    "run_post",
    "run_post_pair",
]


def _flip_if(u: np.ndarray, out: np.ndarray) -> None:
    """The train pipeline's random horizontal flip (uniform 40 of the sample), in place."""
    if u[40] < 0.5:
        cv2.flip(out, 1, dst=out)


class Pipeline:
    """Base of the stock pipelines: geometry from the header, then a fused decode + resize."""

    uniforms = 0
    needs_rng = False
    reduce = True  # may the decoder shrink the region (DCT scaling) down to the output size?
    channels = 3  # of the output: 1 (grayscale), 3 (RGB) or 4 (RGBA); set by image_pipeline
    interpolation = "auto"  # the resize filter (see pixels.INTERPOLATIONS)
    mask_map: Any = None  # ``Loader(mask_map=)``: a MaskMap applied to each decoded mask
    post: tuple[Callable[..., np.ndarray], ...] = ()  # ops run on the written output
    #: A file that decodes only with the decoder's warnings (recoverable corrupt data) is bad
    #: data, as one that does not decode (set by image_pipeline).
    strict_decode = False

    def __init__(self, size: tuple[int, int], fast: bool, max_pixels: int) -> None:
        self.size, self.fast, self.max_pixels = size, fast, max_pixels

    def box(self, h: int, w: int, u: np.ndarray) -> Box | None:
        """The region of the (displayed) image to keep; None for all of it."""
        return None

    def load(
        self, data: bytes | np.ndarray, u: np.ndarray, notes: list[str] | None = None
    ) -> np.ndarray:
        """Decode the sample's region (the stage whose errors count as bad data); the decoder's
        recoverable warnings go to ``notes``."""
        return self._load(data, u, notes)[0]

    def _load(
        self, data: bytes | np.ndarray, u: np.ndarray, notes: list[str] | None = None
    ) -> tuple[np.ndarray, tuple[int, int], Box | None]:
        """The region, the full image's (height, width) and the box the region was cut from."""
        if isinstance(data, np.ndarray):
            img = data
            size = (img.shape[0], img.shape[1])
            box = self.box(*size, u)
            return (img if box is None else cut(img, box)), size, box
        info = dec.probe(data, max_pixels=self.max_pixels)
        box = self.box(info.height, info.width, u)
        if self.strict_decode and notes is None:
            notes = []
        region = dec.decode(
            data,
            info,
            box=box,
            min_size=self.size if self.reduce else None,
            fast=self.fast,
            max_pixels=self.max_pixels,
            notes=notes,
            channels=self.channels,
        )
        if self.strict_decode:
            dec.refuse_warnings(data, info, box, notes or [])
        return region, (info.height, info.width), box

    def finish(self, region: np.ndarray, u: np.ndarray, rng: Any, out: np.ndarray) -> None:
        """Write the loaded region into ``out``."""
        resize_into(pixels.to_channels(region, self.channels), out, self.interpolation)

    def write(self, region: np.ndarray, u: np.ndarray, rng: Any, out: np.ndarray) -> None:
        """Write the loaded region into ``out``, then run the ``post`` ops on it there."""
        self.finish(region, u, rng, out)
        if self.post:
            run_post(self.post, rng, out, self.channels, self.interpolation)

    # segmentation: the image's box and flip, applied to its mask with nearest-neighbour resizing

    def load_pair(
        self,
        data: bytes | np.ndarray,
        mask: bytes | np.ndarray,
        u: np.ndarray,
        notes: list[str] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode an image's region and the same region of its mask (same size as the image)."""
        labels = dec.decode_mask(mask, max_pixels=self.max_pixels)
        region, (h, w), box = self._load(data, u, notes)
        if labels.shape != (h, w):
            raise DecodeError(
                f"the mask is {labels.shape[1]}x{labels.shape[0]} (WxH) but its image is "
                f"{w}x{h}; a mask must have its image's size"
            )
        return region, (labels if box is None else cut(labels, box))

    def finish_mask(self, mask: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
        """Write the mask region into ``out`` (h, w): nearest-neighbour, pixel centres aligned
        with the image's resize (``INTER_NEAREST_EXACT``; plain ``INTER_NEAREST`` is shifted
        by up to half a source pixel)."""
        resize_mask_into(mask, out)

    def finish_pair(
        self,
        region: np.ndarray,
        mask: np.ndarray,
        u: np.ndarray,
        rng: Any,
        out: np.ndarray,
        mask_out: np.ndarray,
    ) -> None:
        """Write an image region and its mask region into ``out`` and ``mask_out``."""
        self.finish(region, u, rng, out)
        self.finish_mask(mask, u, mask_out)

    def write_pair(
        self,
        region: np.ndarray,
        mask: np.ndarray,
        u: np.ndarray,
        rng: Any,
        out: np.ndarray,
        mask_out: np.ndarray,
    ) -> None:
        """``finish_pair``, then the ``post`` ops on both outputs (the mask follows the
        geometry, nearest-neighbour)."""
        self.finish_pair(region, mask, u, rng, out, mask_out)
        if self.post:
            run_post_pair(self.post, rng, out, mask_out, self.channels, self.interpolation)


class TrainPipeline(Pipeline):
    """RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3) and a random horizontal flip."""

    uniforms = 41

    def __init__(self, size, fast, max_pixels, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        super().__init__(size, fast, max_pixels)
        self.scale, self.ratio = scale, ratio

    def box(self, h: int, w: int, u: np.ndarray) -> Box:
        return random_resized_crop_box(h, w, u, self.scale, self.ratio)

    def finish(self, region: np.ndarray, u: np.ndarray, rng: Any, out: np.ndarray) -> None:
        super().finish(region, u, rng, out)
        _flip_if(u, out)

    def finish_mask(self, mask: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
        resize_mask_into(mask, out)
        _flip_if(u, out)  # the image's flip


class EvalPipeline(Pipeline):
    """Resize the shorter side to ``size / 0.875``, then take the centre ``size`` crop."""

    def __init__(self, size, fast, max_pixels, fraction: float = 0.875):
        super().__init__(size, fast, max_pixels)
        self.fraction = fraction

    def box(self, h: int, w: int, u: np.ndarray) -> Box:
        return center_box(h, w, self.size[0], self.size[1], self.fraction)


class ResizePipeline(Pipeline):
    """A plain resize of the whole image to ``size``: aspect ratio not kept, unless ``fit`` is
    "crop" (the centred box of the output's aspect ratio, decoded alone: Keras'
    ``crop_to_aspect_ratio``) or "pad" (resized whole into the middle, black borders:
    ``pad_to_aspect_ratio``)."""

    fit: str | None = None

    def box(self, h: int, w: int, u: np.ndarray) -> Box | None:
        if self.fit == "crop":
            return pixels.aspect_box(h, w, self.size[0], self.size[1])
        return None

    def load(self, data: bytes | np.ndarray, u: np.ndarray, notes: list[str] | None = None) -> Any:
        """The decoded image; with ``fit="pad"``, ``(image, its full (height, width))``: the
        padding's place follows the full size, and a reduced-scale decode is smaller."""
        region, size, _ = self._load(data, u, notes)
        return (region, size) if self.fit == "pad" else region

    def finish(self, region: Any, u: np.ndarray, rng: Any, out: np.ndarray) -> None:
        if self.fit == "pad":
            image, full = region
            pixels.pad_into(pixels.to_channels(image, self.channels), out, self.interpolation, full)
        else:
            super().finish(region, u, rng, out)


class CustomPipeline(Pipeline):
    """Decode the whole image, run the user's callable(s) ``(image, rng) -> image``, fit to size.

    With masks each callable is ``(image, mask, rng) -> (image, mask)`` (a stock op's
    ``pair``), so one draw moves both; the mask is then resized nearest-neighbour."""

    needs_rng = True
    reduce = False

    def __init__(self, size, fast, max_pixels, ops: Sequence[Callable[..., np.ndarray]]):
        super().__init__(size, fast, max_pixels)
        self.ops = list(ops)
        # the global RNGs are seeded per sample for a user's callable (stock ops draw from rng)
        self.user_code = any(not op_module(op).startswith("stoker.") for op in self.ops)

    def finish(self, region: np.ndarray, u: np.ndarray, rng: Any, out: np.ndarray) -> None:
        image = as_rgb(region) if self.channels == 3 else region
        with self._globals(rng):
            for op in self.ops:
                image = op(image, rng)
        image = check_user_image(image, self.ops)
        resize_into(pixels.to_channels(image, self.channels), out, self.interpolation)

    def finish_pair(self, region, mask, u, rng, out, mask_out) -> None:
        image = as_rgb(region) if self.channels == 3 else region
        with self._globals(rng):
            for op in self.ops:
                image, mask = pair_step(op, image, mask, rng)
        image = check_user_image(image, self.ops)
        mask = check_user_mask(mask, image, self.ops)
        resize_into(pixels.to_channels(image, self.channels), out, self.interpolation)
        resize_mask_into(mask, mask_out)

    def _globals(self, rng: Any) -> Any:
        """``seeding.seeded(rng)`` around a user's callables; nothing around stock ops."""
        return seeded(rng) if self.user_code else contextlib.nullcontext()


class ImageSettings(Protocol):
    """What a pipeline reads of the loader's image options (``loader.options.ImageOptions``,
    which this lower stage never imports)."""

    @property
    def interpolation(self) -> str: ...
    @property
    def crop_to_aspect_ratio(self) -> bool: ...
    @property
    def pad_to_aspect_ratio(self) -> bool: ...
    @property
    def max_pixels(self) -> int: ...
    @property
    def strict_decode(self) -> bool: ...


def image_pipeline(
    image: ImageSettings, augment: Any, size: tuple[int, int], *, fast: bool, channels: int
) -> Pipeline:
    """The pipeline of the image options ``image``, once the loader has resolved against its
    source what they leave open: ``augment`` (never "auto"), the output ``size``, ``fast``
    (the fast IDCT or not) and ``channels``. ``crop_to_aspect_ratio``/``pad_to_aspect_ratio``
    go with ``augment=None`` only; ``strict_decode`` makes a file decoded only with warnings
    bad data."""
    pipeline = make_pipeline(augment, size, fast, image.max_pixels)
    crop, pad = image.crop_to_aspect_ratio, image.pad_to_aspect_ratio
    fit = "crop" if crop else "pad" if pad else None
    if fit is not None and type(pipeline) is not ResizePipeline:
        raise ConfigError(
            f"crop_to_aspect_ratio / pad_to_aspect_ratio resize the whole image and go with "
            f"augment=None (not augment={augment!r}, which chooses its own crop)"
        )
    interpolation = image.interpolation
    pipeline.channels, pipeline.interpolation = channels, interpolation
    pipeline.strict_decode = image.strict_decode
    if isinstance(pipeline, ResizePipeline):
        pipeline.fit = fit
        # a point-sampling filter named for pad_to_aspect_ratio samples the whole decode, as
        # Keras does; a reduced-scale decode would average first (what "auto"/"area" do anyway)
        if fit == "pad" and interpolation not in ("auto", "area"):
            pipeline.reduce = False
    return pipeline


def make_pipeline(augment: Any, size: tuple[int, int], fast: bool, max_pixels: int) -> Pipeline:
    """The pipeline that ``augment=`` names: "train", "eval", None, a callable, a list of ops,
    or a stock name followed by ops (``["train", op, ...]``: the ops run on its output), as it
    writes by default (3 channels, the "auto" filter, no aspect fit: ``image_pipeline`` sets
    those from the loader's options)."""
    if augment == "train":
        return TrainPipeline(size, fast, max_pixels)
    if augment == "eval":
        return EvalPipeline(size, fast, max_pixels)
    if augment is None or augment == "resize":
        return ResizePipeline(size, fast, max_pixels)
    if callable(augment):
        return CustomPipeline(size, fast, max_pixels, [augment])
    if isinstance(augment, (list, tuple)) and augment and all(callable(a) for a in augment):
        return CustomPipeline(size, fast, max_pixels, augment)
    if isinstance(augment, (list, tuple)) and augment and _stock_name(augment[0]):
        return _then_ops(augment, size, fast, max_pixels)
    raise ConfigError(
        f"augment={augment!r} is not understood; use 'train', 'eval', None, a callable "
        "(image, rng) -> image, a list of stoker ops such as [stoker.ops.RandomResizedCrop()], "
        "or a stock pipeline's name then ops: ['train', stoker.ops.TrivialAugmentWide()]"
    )


STOCK_NAMES = ("train", "eval", "resize")


def _stock_name(value: Any) -> bool:
    """Whether ``value`` names a stock pipeline that ops may follow."""
    return isinstance(value, str) and value in STOCK_NAMES


def _then_ops(
    augment: Sequence[Any], size: tuple[int, int], fast: bool, max_pixels: int
) -> Pipeline:
    """``["train", op, ...]``: the fused stock pipeline, then the ops on its output."""
    ops = list(augment[1:])
    bad = [op for op in ops if not callable(op)]
    if not ops or bad:
        what = "nothing" if not ops else repr(bad[0])
        raise ConfigError(
            f"augment={list(augment)!r}: after {augment[0]!r} come ops (image, rng) -> image, "
            f"such as stoker.ops.TrivialAugmentWide(); got {what}"
        )
    pipeline = make_pipeline(augment[0], size, fast, max_pixels)
    pipeline.post, pipeline.needs_rng = tuple(ops), True
    return pipeline

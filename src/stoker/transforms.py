"""Train/eval/resize pipelines; each writes one sample into an ``out=`` array.

A pipeline turns one stored sample (encoded bytes or a decoded array) into ``out`` (H, W, 3)
``uint8``. The stock pipelines are fused: the crop box is chosen from the image header, only
that region is decoded (at a reduced DCT scale where the output allows), and it is resized
straight into the batch slot. Randomness comes from per-sample uniforms (see ``order``), so
results depend only on ``(seed, epoch, index)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

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
from .decode.common import DEFAULT_MAX_PIXELS, Box
from .decode.masks import MaskMap
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
    "Pipeline",
    "PipelineSpec",
    "RandomResizedCrop",
    "Resize",
    "ResizePipeline",
    "TrainPipeline",
    "as_rgb",
    "center_box",
    "check_mask_ops",
    "make_pipeline",
    "pipeline_spec",
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
    """Base of the stock pipelines: geometry from the header, then a fused decode + resize.

    A live pipeline is made from its frozen :class:`PipelineSpec` (``spec.build()``) in the
    process that uses it, and never changed after: what it does is the spec's fields."""

    uniforms = 0
    reduce = True  # may the decoder shrink the region (DCT scaling) down to the output size?

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self.size, self.fast, self.max_pixels = spec.size, spec.fast, spec.max_pixels
        #: of the output: 1 (grayscale), 3 (RGB) or 4 (RGBA)
        self.channels = spec.channels
        self.interpolation = spec.interpolation  # the resize filter (pixels.INTERPOLATIONS)
        #: A file that decodes only with the decoder's warnings (recoverable corrupt data) is
        #: bad data, as one that does not decode.
        self.strict_decode = spec.strict_decode
        self.mask_map = spec.mask_map  # ``Loader(mask_map=)``, applied to each decoded mask
        self.post = spec.post  # ops run on the written output
        self.needs_rng = bool(spec.post)

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
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)

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

    fraction = 0.875

    def box(self, h: int, w: int, u: np.ndarray) -> Box:
        return center_box(h, w, self.size[0], self.size[1], self.fraction)


class ResizePipeline(Pipeline):
    """A plain resize of the whole image to ``size``: aspect ratio not kept, unless ``fit`` is
    "crop" (the centred box of the output's aspect ratio, decoded alone: Keras'
    ``crop_to_aspect_ratio``) or "pad" (resized whole into the middle, black borders:
    ``pad_to_aspect_ratio``)."""

    def __init__(self, spec: PipelineSpec) -> None:
        super().__init__(spec)
        self.fit = spec.fit
        # a point-sampling filter named for pad_to_aspect_ratio samples the whole decode, as
        # Keras does; a reduced-scale decode would average first (what "auto"/"area" do anyway)
        if self.fit == "pad" and self.interpolation not in ("auto", "area"):
            self.reduce = False

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

    reduce = False

    def __init__(self, spec: PipelineSpec) -> None:
        super().__init__(spec)
        self.needs_rng = True
        self.ops = list(spec.ops)
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


KINDS = ("train", "eval", "resize", "custom")
STOCK_NAMES = ("train", "eval", "resize")


@dataclass(frozen=True)
class PipelineSpec:
    """A decode + transform pipeline, resolved and frozen: what the Recipe holds and every
    process (the loader's own, each worker, each node) builds its live :class:`Pipeline` from
    (:meth:`build`). A new pixel option is a field here and the line of the pipeline that
    reads it; :meth:`keeps_pixels` then counts it as changing pixels unless it is named in
    ``PIXEL_NEUTRAL``, so the bulk copy of in-memory arrays cannot skip it."""

    #: "train" (random resized crop + flip), "eval" (shorter side resized, centre crop),
    #: "resize" (the whole image, see ``fit``) or "custom" (``ops`` on the whole decode).
    kind: str = "resize"
    #: The output's (height, width).
    size: tuple[int, int] = (224, 224)
    #: Of the output: 1 (grayscale), 3 (RGB) or 4 (RGBA).
    channels: int = 3
    #: The resize filter (``pixels.INTERPOLATIONS``).
    interpolation: str = "auto"
    #: With "resize": None (aspect not kept), "crop" (``crop_to_aspect_ratio``) or "pad".
    fit: str | None = None
    #: libjpeg's fast integer IDCT.
    fast: bool = False
    #: Larger images are refused from their header.
    max_pixels: int = DEFAULT_MAX_PIXELS
    #: A file that decodes only with the decoder's warnings is bad data.
    strict_decode: bool = False
    #: ``Loader(mask_map=)``: applied to each decoded mask.
    mask_map: MaskMap | None = None
    #: "custom": the user's callables ``(image, rng) -> image``, in order.
    ops: tuple[Callable[..., Any], ...] = ()
    #: Ops run on the stock pipeline's written output (``["train", op, ...]``).
    post: tuple[Callable[..., Any], ...] = ()

    #: Fields that never change an in-memory array copied at its own size and channels: its
    #: pixels are not decoded (``fast``, ``max_pixels``, ``strict_decode``), a resize to the
    #: same size is a copy whatever the filter or fit (``interpolation``, ``fit``), and masks
    #: never take the bulk copy (``mask_map``).
    PIXEL_NEUTRAL: ClassVar[frozenset[str]] = frozenset(
        {"interpolation", "fit", "fast", "max_pixels", "strict_decode", "mask_map"}
    )

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"PipelineSpec(kind={self.kind!r}): use one of {KINDS}")
        if (self.kind == "custom") != bool(self.ops):
            raise ConfigError("PipelineSpec: ops go with kind='custom', which needs them")
        if self.fit is not None and self.kind != "resize":
            raise ConfigError(
                "crop_to_aspect_ratio / pad_to_aspect_ratio resize the whole image and go with "
                f"augment=None (not augment={self.augment!r}, which chooses its own crop)"
            )

    @property
    def augment(self) -> Any:
        """The ``augment=`` this spec is (for messages): a stock name, or the ops."""
        if self.kind == "custom":
            return self.ops[0] if len(self.ops) == 1 else list(self.ops)
        return [self.kind, *self.post] if self.post else self.kind

    def keeps_pixels(self, size: tuple[int, int] | None, channels: int) -> bool:
        """Whether an image already decoded at ``size`` with ``channels`` comes out unchanged
        (so a source of in-memory arrays may copy a batch of them whole): every field not in
        ``PIXEL_NEUTRAL`` has its default, but ``size`` and ``channels``, which are the
        image's own."""
        plain = dataclasses.replace(self, **{n: _DEFAULTS[n] for n in self.PIXEL_NEUTRAL})
        return size is not None and plain == PipelineSpec(size=size, channels=channels)

    def build(self) -> Pipeline:
        """The live pipeline of this spec, for the process that calls it."""
        return _CLASSES[self.kind](self)


def pipeline_spec(augment: Any, size: tuple[int, int], **settings: Any) -> PipelineSpec:
    """The spec of ``augment=`` (never "auto"): "train", "eval", None/"resize", a callable, a
    list of ops, or a stock name followed by ops (``["train", op, ...]``: the ops run on its
    output), at ``size``, with the other fields of :class:`PipelineSpec` from ``settings``."""
    if isinstance(augment, str) and augment in STOCK_NAMES:
        return PipelineSpec(kind=augment, size=size, **settings)
    if augment is None:
        return PipelineSpec(kind="resize", size=size, **settings)
    if callable(augment):
        return PipelineSpec(kind="custom", size=size, ops=(augment,), **settings)
    if isinstance(augment, (list, tuple)) and augment and all(callable(a) for a in augment):
        return PipelineSpec(kind="custom", size=size, ops=tuple(augment), **settings)
    if isinstance(augment, (list, tuple)) and augment and _stock_name(augment[0]):
        return PipelineSpec(kind=augment[0], size=size, post=_then_ops(augment), **settings)
    raise ConfigError(
        f"augment={augment!r} is not understood; use 'train', 'eval', None, a callable "
        "(image, rng) -> image, a list of stoker ops such as [stoker.ops.RandomResizedCrop()], "
        "or a stock pipeline's name then ops: ['train', stoker.ops.TrivialAugmentWide()]"
    )


def make_pipeline(augment: Any, size: tuple[int, int], fast: bool, max_pixels: int) -> Pipeline:
    """The live pipeline that ``augment=`` names, as it writes by default (3 channels, the
    "auto" filter, no aspect fit)."""
    return pipeline_spec(augment, size, fast=fast, max_pixels=max_pixels).build()


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(PipelineSpec)}
_CLASSES: dict[str, Callable[[PipelineSpec], Pipeline]] = {
    "train": TrainPipeline,
    "eval": EvalPipeline,
    "resize": ResizePipeline,
    "custom": CustomPipeline,
}


def _stock_name(value: Any) -> bool:
    """Whether ``value`` names a stock pipeline that ops may follow."""
    return isinstance(value, str) and value in STOCK_NAMES


def _then_ops(augment: Sequence[Any]) -> tuple[Callable[..., Any], ...]:
    """``["train", op, ...]``: the ops that run on the fused stock pipeline's output."""
    ops = list(augment[1:])
    bad = [op for op in ops if not callable(op)]
    if not ops or bad:
        what = "nothing" if not ops else repr(bad[0])
        raise ConfigError(
            f"augment={list(augment)!r}: after {augment[0]!r} come ops (image, rng) -> image, "
            f"such as stoker.ops.TrivialAugmentWide(); got {what}"
        )
    return tuple(ops)

"""The image conversion every adapter takes: an output ``dtype`` with optional ``mean``/``std``
normalisation, and the channel order (``layout``). Labels and other fields are never touched.

``mean``/``std`` are scalars or one value per channel, giving ``(x - mean) / std``. Values all
<= 1 are read in 0-1 units (torchvision's ``mean=(0.485, 0.456, 0.406), std=(0.229, 0.224,
0.225)``), otherwise in 0-255 units; ``mean=0, std=1`` gives values in [0, 1]."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from ..errors import ConfigError
from ..schema import FieldSpec
from .feed import Feed

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, DTypeLike

#: ``mean=``/``std=``: a scalar or one value per channel, in 0-1 or 0-255 units.
Scale: TypeAlias = "ArrayLike"

LAYOUTS = ("channels_first", "channels_last")


def is_channels_first(layout: object, view: str) -> bool:
    """Check ``layout=`` of the ``view`` adapter: "channels_first" gives images (B, C, H, W),
    "channels_last" (B, H, W, C), the loader's own."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ConfigError(
            f"{view}(layout={layout!r}): use 'channels_first' for (B, C, H, W) images or "
            "'channels_last' for (B, H, W, C)"
        )
    return layout == "channels_first"


def channels_of(loader: Feed) -> int:
    """Channels of the loader's images (3 for a loader without an ``image`` field)."""
    spec = loader.recipe.schema.slot_layout.field("image")
    return int(spec[2][-1]) if spec is not None else 3


def units(mean: Scale, std: Scale, channels: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """``mean``/``std`` in 0-255 units, one float64 value per channel."""
    try:
        m = np.broadcast_to(np.asarray(mean, dtype=np.float64), (channels,)).copy()
        s = np.broadcast_to(np.asarray(std, dtype=np.float64), (channels,)).copy()
    except ValueError:
        raise ConfigError(
            f"mean={mean!r}, std={std!r}: give a scalar or {channels} per-channel values"
        ) from None
    if not (np.isfinite(m).all() and np.isfinite(s).all() and (s > 0).all()):
        raise ConfigError(f"mean={mean!r}, std={std!r}: need finite values and std > 0")
    if m.max() <= 1.0 and s.max() <= 1.0:  # 0-1 units, as torchvision's Normalize
        m, s = m * 255.0, s * 255.0
    return m, s


def is_floating(dtype: np.dtype) -> bool:
    """True for a floating dtype: numpy's (kind ``f``) and ml_dtypes' (``bfloat16``, the
    ``float8_*`` kinds, which numpy sees as kind ``V``; JAX's and TensorFlow's ``bfloat16``)."""
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.name.startswith(("bfloat", "float")))


class ImageConversion:
    """``dtype`` (a numpy dtype name or object; None keeps ``uint8``), ``mean``/``std`` and
    ``channels_first``, checked once; ``numpy(x)`` applies them on the host."""

    def __init__(
        self,
        channels: int,
        dtype: DTypeLike | None = None,
        mean: Scale | None = None,
        std: Scale | None = None,
        channels_first: bool = False,
    ) -> None:
        if (mean is None) != (std is None):
            raise ConfigError("pass both mean and std, or neither")
        self.dtype = None if dtype is None else np.dtype(getattr(dtype, "name", dtype))
        if mean is not None and (self.dtype is None or not is_floating(self.dtype)):
            raise ConfigError("mean/std need a floating dtype: pass dtype='float32' too")
        self.norm = None if mean is None or std is None else units(mean, std, channels)
        self.channels_first = bool(channels_first)

    @property
    def active(self) -> bool:
        """True when the image is changed at all."""
        return self.dtype is not None or self.channels_first

    def numpy(self, x: np.ndarray) -> np.ndarray:
        """The image batch (B, H, W, C) ``uint8`` -> the dtype, scaling and layout asked for."""
        if self.dtype is not None:
            work = np.float32 if self.dtype.itemsize < 4 else self.dtype
            x = x.astype(work)
            if self.norm is not None:
                x = (x - self.norm[0].astype(work)) / self.norm[1].astype(work)
            x = x.astype(self.dtype, copy=False)
        if self.channels_first:
            x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        return x


#: What the image conversion does to an image leaf: every option ("pixels": uint8 (H, W, C), whose
#: 0-255 units and channels-last layout stoker knows), or only ``dtype`` ("cast").
PIXELS, CAST = "pixels", "cast"


def _describe_field(name: str, dtype: str, shape: tuple[int, ...]) -> str:
    return f"{name!r} {np.dtype(dtype)} {tuple(shape)}"


def leaf_kinds(loader: Feed, view: str, *, dtype: bool, mean: bool, layout: bool) -> dict[str, str]:
    """The image leaves of ``loader``'s batches and what the image conversion does to each.

    An image leaf is the field ``image`` and, in a per-sample dataset's batches (``Loader(
    dataset)``, whatever its structure: dict, tuple, single array), every field of one image
    per sample (3-D): a uint8 ``(H, W, C)`` one (C 1, 3 or 4) gets every option, any other
    (a float ``(C, H, W)`` tensor from ``ToTensor``) only ``dtype``. An option that would
    change no leaf, or cannot apply to one, is refused naming the leaf: never ignored.
    ``dtype``/``mean``/``layout``: whether those options were given (``layout``: explicitly)."""
    fields: tuple[FieldSpec, ...] = loader.recipe.schema.slot_layout.fields
    dataset = loader.recipe.source.sample_fields is not None
    kinds = {}
    for name, dt, shape in fields:
        if name == "image" or (dataset and len(shape) == 3):
            pixels = np.dtype(dt) == np.uint8 and len(shape) == 3 and shape[-1] in (1, 3, 4)
            kinds[name] = PIXELS if pixels else CAST
    if (dtype or mean or layout) and not kinds:
        listed = ", ".join(_describe_field(*f) for f in fields if f[0] != "index")
        raise ConfigError(
            f"{view}(): dtype/mean/std/layout convert images, and no field of this loader is "
            f"one (the field 'image', or a dataset's 3-D field per sample); its fields are "
            f"{listed}. Leave the options out, or convert in __getitem__"
        )
    spec = {f[0]: f for f in fields}
    for name, kind in kinds.items():
        if kind == CAST and (mean or layout):
            option = "mean/std" if mean else "layout"
            raise ConfigError(
                f"{view}({option}=...): field {_describe_field(*spec[name])} is not a uint8 "
                f"(H, W, C) image, whose 0-255 units and channel axis stoker knows; {option} "
                "applies only to those (dtype= alone casts this field). Normalise or permute "
                "it in __getitem__, or return uint8 (H, W, C) and let the adapter do it"
            )
    return kinds


def pixel_channels(loader: Feed, kinds: dict[str, str]) -> int:
    """Channels of the loader's uint8 image leaves (for per-channel ``mean``/``std``)."""
    layout = loader.recipe.schema.slot_layout
    for name, kind in kinds.items():
        spec = layout.field(name) if kind == PIXELS else None
        if spec is not None:
            return int(spec[2][-1])
    return channels_of(loader)

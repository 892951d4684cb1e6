"""The image options every adapter takes: an output ``dtype`` with optional ``mean``/``std``
normalisation, and the channel order (``layout``). Labels and other fields are never touched.

``mean``/``std`` are scalars or one value per channel, giving ``(x - mean) / std``. Values all
<= 1 are read in 0-1 units (torchvision's ``mean=(0.485, 0.456, 0.406), std=(0.229, 0.224,
0.225)``), otherwise in 0-255 units; ``mean=0, std=1`` gives values in [0, 1]."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError

LAYOUTS = ("channels_first", "channels_last")


def is_channels_first(layout: Any, view: str) -> bool:
    """Check ``layout=`` of the ``view`` adapter: "channels_first" gives images (B, C, H, W),
    "channels_last" (B, H, W, C), the loader's own."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ConfigError(
            f"{view}(layout={layout!r}): use 'channels_first' for (B, C, H, W) images or "
            "'channels_last' for (B, H, W, C)"
        )
    return layout == "channels_first"


def channels_of(loader: Any) -> int:
    """Channels of the loader's images (3 for a loader without a layout)."""
    layout = getattr(loader, "layout", None)
    spec = layout.field("image") if layout is not None else None
    return int(spec[2][-1]) if spec is not None else 3


def units(mean: Any, std: Any, channels: int = 3) -> tuple[np.ndarray, np.ndarray]:
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


class ImageOptions:
    """``dtype`` (a numpy dtype name or object; None keeps ``uint8``), ``mean``/``std`` and
    ``channels_first``, checked once; ``numpy(x)`` applies them on the host."""

    def __init__(
        self,
        channels: int,
        dtype: Any = None,
        mean: Any = None,
        std: Any = None,
        channels_first: bool = False,
    ) -> None:
        if (mean is None) != (std is None):
            raise ConfigError("pass both mean and std, or neither")
        self.dtype = None if dtype is None else np.dtype(getattr(dtype, "name", dtype))
        if mean is not None and (self.dtype is None or not is_floating(self.dtype)):
            raise ConfigError("mean/std need a floating dtype: pass dtype='float32' too")
        self.norm = None if mean is None else units(mean, std, channels)
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

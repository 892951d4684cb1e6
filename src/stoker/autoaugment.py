"""torchvision's stock augmentations as stoker ops: ColorJitter, RandomErasing,
TrivialAugmentWide and RandAugment, each ``(image, rng) -> image`` on ``uint8`` images.

The arguments, ranges and op spaces are torchvision's (``transforms.ColorJitter``,
``RandomErasing``, ``autoaugment.TrivialAugmentWide`` / ``RandAugment``); the pixel operations
are in ``imageops``. Every random choice is drawn from the sample's ``rng``, so a batch depends
only on ``(seed, epoch, index)``. Values are in ``uint8`` levels (0-255), as for torchvision's
``uint8`` tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import imageops as im
from .decode.common import Box
from .errors import ConfigError

# ------------------------------------------------------------------- ColorJitter


def _factor_range(name: str, value: Any) -> tuple[float, float] | None:
    """torchvision's range of a brightness/contrast/saturation factor: ``x`` gives
    ``[max(0, 1 - x), 1 + x]``, ``(lo, hi)`` itself; None when it is always 1."""
    if isinstance(value, (tuple, list)):
        lo, hi = _pair(name, value, 0.0, math.inf)
    else:
        x = im.check_range(name, value, 0.0, math.inf)
        lo, hi = max(0.0, 1.0 - x), 1.0 + x
    return None if lo == hi == 1.0 else (lo, hi)


def _hue_range(value: Any) -> tuple[float, float] | None:
    """torchvision's hue shift range: ``x`` in [0, 0.5] gives ``[-x, x]``; None for 0."""
    if isinstance(value, (tuple, list)):
        lo, hi = _pair("hue", value, -0.5, 0.5)
    else:
        x = im.check_range("hue", value, 0.0, 0.5)
        lo, hi = -x, x
    return None if lo == hi == 0.0 else (lo, hi)


def _pair(name: str, value: Any, lo: float, hi: float) -> tuple[float, float]:
    """A ``(min, max)`` pair within ``[lo, hi]``, or a ConfigError that says so."""
    if len(value) != 2:
        raise ConfigError(f"{name}={value!r}: give one number or a (min, max) pair")
    a = im.check_range(f"{name}[0]", value[0], lo, hi)
    b = im.check_range(f"{name}[1]", value[1], lo, hi)
    if a > b:
        raise ConfigError(f"{name}={value!r}: the pair is (min, max); write ({b}, {a})")
    return a, b


class ColorJitter:
    """Op: torchvision's ``ColorJitter``: random brightness, contrast, saturation and hue.

    ``brightness``, ``contrast`` and ``saturation`` take ``x >= 0`` (a factor drawn uniformly
    from ``[max(0, 1 - x), 1 + x]``) or a ``(min, max)`` range of factors; ``hue`` takes
    ``x`` in ``[0, 0.5]`` (a shift of the hue by ``[-x, x]`` turns) or a range within
    ``[-0.5, 0.5]``. Per sample the four adjustments run in a random order, as torchvision's.

    The defaults (brightness and contrast 0.2) keep ``ColorJitter()`` a jitter; torchvision's
    defaults, all 0, change nothing. Given explicitly, every argument means what it means in
    torchvision.
    """

    def __init__(
        self, brightness: Any = 0.2, contrast: Any = 0.2, saturation: Any = 0, hue: Any = 0
    ) -> None:
        self.brightness = _factor_range("brightness", brightness)
        self.contrast = _factor_range("contrast", contrast)
        self.saturation = _factor_range("saturation", saturation)
        self.hue = _hue_range(hue)

    def draw(self, rng: np.random.Generator) -> tuple[list[int], list[float | None]]:
        """The order of the four adjustments and their factors (None: skipped)."""
        order = [int(i) for i in rng.permutation(4)]
        ranges = (self.brightness, self.contrast, self.saturation, self.hue)
        factors = [None if r is None else float(rng.uniform(r[0], r[1])) for r in ranges]
        return order, factors

    def __repr__(self) -> str:
        return (
            f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue})"
        )

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        image = im.check_image(image, "ColorJitter")
        order, factors = self.draw(rng)
        adjust = (im.brightness, im.contrast, im.saturation, im.hue)
        for i in order:
            factor = factors[i]
            if factor is not None:
                image = adjust[i](image, factor)
        return image

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """Colours change; the mask does not."""
        return self(image, rng), mask


# ------------------------------------------------------------------ RandomErasing


class RandomErasing:
    """Op: torchvision's ``RandomErasing``: with probability ``p``, fill a random rectangle.

    Its area is a fraction of the image drawn from ``scale`` and its aspect ratio (height over
    width) is log-uniform in ``ratio``; up to 10 draws, and if none fits, the image is left as
    it is. ``value`` is a level 0-255, one level per channel, or ``"random"`` (uniform random
    levels per pixel).
    """

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: Any = 0,
    ) -> None:
        self.p = im.check_range("p", p, 0.0, 1.0)
        self.scale = _sequence_pair("scale", scale, 0.0, 1.0)
        self.ratio = _sequence_pair("ratio", ratio, 1e-6, math.inf)
        self.value = _erase_value(value)

    def box(self, h: int, w: int, rng: np.random.Generator) -> Box | None:
        """torchvision's ``get_params``: the (top, left, height, width) to erase, or None."""
        area = h * w
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            erase_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            eh = int(round(math.sqrt(erase_area * aspect)))
            ew = int(round(math.sqrt(erase_area / aspect)))
            if not (eh < h and ew < w):
                continue
            top = int(rng.integers(0, h - eh + 1))
            left = int(rng.integers(0, w - ew + 1))
            return top, left, eh, ew
        return None

    def __repr__(self) -> str:
        value = self.value if isinstance(self.value, str) else list(self.value)
        return f"RandomErasing(p={self.p}, scale={self.scale}, ratio={self.ratio}, value={value!r})"

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        image = im.check_image(image, "RandomErasing")
        if rng.random() >= self.p:
            return image
        box = self.box(image.shape[0], image.shape[1], rng)
        if box is None:
            return image
        top, left, eh, ew = box
        out = image.copy()
        patch = out[top : top + eh, left : left + ew]
        if isinstance(self.value, str):
            patch[...] = rng.integers(0, 256, patch.shape, dtype=np.uint8)
        elif out.ndim == 3 and len(self.value) == out.shape[2]:
            patch[...] = np.asarray(self.value, np.uint8)
        elif len(self.value) == 1:
            patch[...] = self.value[0]
        else:
            raise ConfigError(
                f"RandomErasing(value={self.value!r}) has {len(self.value)} levels but the "
                f"image has {1 if out.ndim == 2 else out.shape[2]} channels; give one level"
            )
        return out

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """The image is erased; the mask is kept (torchvision's v2 passes masks through)."""
        return self(image, rng), mask


def _sequence_pair(name: str, value: Any, lo: float, hi: float) -> tuple[float, float]:
    """RandomErasing's ``scale``/``ratio``: a (min, max) pair."""
    if not isinstance(value, (tuple, list)):
        raise ConfigError(f"{name}={value!r}: give a (min, max) pair")
    return _pair(name, value, lo, hi)


def _erase_value(value: Any) -> tuple[int, ...] | str:
    """RandomErasing's ``value``: a level, a level per channel, or "random"."""
    if isinstance(value, str):
        if value != "random":
            raise ConfigError(f"value={value!r}: use a level 0-255, a tuple of them or 'random'")
        return value
    levels = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not levels:
        raise ConfigError("value=(): give a level 0-255, one per channel, or 'random'")
    for v in levels:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= 255:
            raise ConfigError(
                f"value={value!r}: levels are integers 0-255 (uint8 images; torchvision's "
                "float values in 0-1 are these divided by 255)"
            )
    return tuple(int(v) for v in levels)


# ------------------------------------------------- TrivialAugmentWide, RandAugment

# One op of the space: (name, its magnitudes over the bins or None, signed, apply).
Space = list[tuple[str, np.ndarray | None, bool, Callable[[np.ndarray, float], np.ndarray]]]


def _linspace(hi: float, bins: int) -> np.ndarray:
    """``torch.linspace(0, hi, bins)`` in float32."""
    return np.linspace(0.0, hi, bins, dtype=np.float32)


def _posterize_bits(bins: int, span: int) -> np.ndarray:
    """``8 - (arange(bins) / ((bins - 1) / span)).round()``: 8 down to ``8 - span`` bits."""
    steps = np.arange(bins, dtype=np.float32) / np.float32((bins - 1) / span)
    return (8 - np.round(steps)).astype(np.float32)


def _space(bins: int, h: int, w: int, wide: bool) -> Space:
    """torchvision's ``_augmentation_space``: TrivialAugmentWide's (``wide``) or RandAugment's
    for an ``h`` x ``w`` image."""
    shear, rot, enhance = (0.99, 135.0, 0.99) if wide else (0.3, 30.0, 0.9)
    tx, ty = (32.0, 32.0) if wide else (150.0 / 331.0 * w, 150.0 / 331.0 * h)
    return [
        ("Identity", None, False, lambda img, m: img),
        ("ShearX", _linspace(shear, bins), True, im.shear_x),
        ("ShearY", _linspace(shear, bins), True, im.shear_y),
        ("TranslateX", _linspace(tx, bins), True, lambda img, m: im.translate(img, int(m), 0)),
        ("TranslateY", _linspace(ty, bins), True, lambda img, m: im.translate(img, 0, int(m))),
        ("Rotate", _linspace(rot, bins), True, im.rotate),
        ("Brightness", _linspace(enhance, bins), True, lambda img, m: im.brightness(img, 1 + m)),
        ("Color", _linspace(enhance, bins), True, lambda img, m: im.saturation(img, 1 + m)),
        ("Contrast", _linspace(enhance, bins), True, lambda img, m: im.contrast(img, 1 + m)),
        ("Sharpness", _linspace(enhance, bins), True, lambda img, m: im.sharpness(img, 1 + m)),
        ("Posterize", _posterize_bits(bins, 6 if wide else 4), False,
         lambda img, m: im.posterize(img, int(m))),
        ("Solarize", np.linspace(255.0, 0.0, bins, dtype=np.float32), False, im.solarize),
        ("AutoContrast", None, False, lambda img, m: im.autocontrast(img)),
        ("Equalize", None, False, lambda img, m: im.equalize(img)),
    ]  # fmt: skip


OP_NAMES = tuple(name for name, *_ in _space(2, 1, 1, True))


def _bins(value: Any) -> int:
    """``num_magnitude_bins``: an int of at least 2."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise ConfigError(f"num_magnitude_bins={value!r}: must be an integer >= 2 (default 31)")
    return int(value)


class _SpaceCache:
    """The op space per image size, built once per size (RandAugment's translations scale
    with the image)."""

    def __init__(self, bins: int, wide: bool) -> None:
        self.bins, self.wide = bins, wide
        self._spaces: dict[tuple[int, int], Space] = {}

    def get(self, h: int, w: int) -> Space:
        """The space for an ``h`` x ``w`` image."""
        key = (h, w) if not self.wide else (0, 0)
        space = self._spaces.get(key)
        if space is None:
            space = self._spaces[key] = _space(self.bins, h, w, self.wide)
        return space

    def __getstate__(self) -> dict[str, Any]:  # the lambdas are rebuilt where the op runs
        return {"bins": self.bins, "wide": self.wide, "_spaces": {}}


class TrivialAugmentWide:
    """Op: torchvision's ``TrivialAugmentWide``: one op of 14 (Identity, ShearX/Y,
    TranslateX/Y, Rotate, Brightness, Color, Contrast, Sharpness, Posterize, Solarize,
    AutoContrast, Equalize) at a random magnitude of ``num_magnitude_bins``, random sign.
    Geometric ops sample nearest-neighbour and fill with black."""

    def __init__(self, num_magnitude_bins: int = 31) -> None:
        self.num_magnitude_bins = _bins(num_magnitude_bins)
        self._space = _SpaceCache(self.num_magnitude_bins, wide=True)

    def draw(self, image: np.ndarray, rng: np.random.Generator) -> tuple[str, float]:
        """The op's name and signed magnitude for this sample."""
        name, magnitudes, signed, _ = self._space.get(*image.shape[:2])[int(rng.integers(14))]
        m = 0.0 if magnitudes is None else float(magnitudes[int(rng.integers(len(magnitudes)))])
        if signed and rng.integers(2):
            m = -m
        return name, m

    def __repr__(self) -> str:
        return f"TrivialAugmentWide(num_magnitude_bins={self.num_magnitude_bins})"

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        image = im.check_image(image, "TrivialAugmentWide")
        name, m = self.draw(image, rng)
        return _apply(self._space.get(*image.shape[:2]), name, image, m)

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """The same op on both where it moves pixels (nearest, 0 fill); colours on the image."""
        image = im.check_image(image, "TrivialAugmentWide")
        name, m = self.draw(image, rng)
        return _apply_pair(self._space.get(*image.shape[:2]), name, image, mask, m)


class RandAugment:
    """Op: torchvision's ``RandAugment``: ``num_ops`` ops drawn from the same 14 as
    TrivialAugmentWide (narrower ranges; translations up to 150/331 of the image), each at
    bin ``magnitude`` of ``num_magnitude_bins``, random sign."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31):
        self.num_magnitude_bins = _bins(num_magnitude_bins)
        if isinstance(num_ops, bool) or not isinstance(num_ops, (int, np.integer)) or num_ops < 0:
            raise ConfigError(f"num_ops={num_ops!r}: must be an integer >= 0 (default 2)")
        top = self.num_magnitude_bins - 1
        if (
            isinstance(magnitude, bool)
            or not isinstance(magnitude, (int, np.integer))
            or not 0 <= magnitude <= top
        ):
            raise ConfigError(
                f"magnitude={magnitude!r}: must be an integer bin 0..{top} "
                f"(num_magnitude_bins={self.num_magnitude_bins}); default 9"
            )
        self.num_ops, self.magnitude = int(num_ops), int(magnitude)
        self._space = _SpaceCache(self.num_magnitude_bins, wide=False)

    def draw(self, image: np.ndarray, rng: np.random.Generator) -> list[tuple[str, float]]:
        """The ops' names and signed magnitudes for this sample, in order."""
        space = self._space.get(*image.shape[:2])
        chosen = []
        for _ in range(self.num_ops):
            name, magnitudes, signed, _ = space[int(rng.integers(14))]
            m = 0.0 if magnitudes is None else float(magnitudes[self.magnitude])
            if signed and rng.integers(2):
                m = -m
            chosen.append((name, m))
        return chosen

    def __repr__(self) -> str:
        return (
            f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, "
            f"num_magnitude_bins={self.num_magnitude_bins})"
        )

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        image = im.check_image(image, "RandAugment")
        space = self._space.get(*image.shape[:2])
        for name, m in self.draw(image, rng):
            image = _apply(space, name, image, m)
        return image

    def pair(self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> Any:
        """The same ops on both where they move pixels (nearest, 0 fill); colours on the
        image."""
        image = im.check_image(image, "RandAugment")
        space = self._space.get(*image.shape[:2])
        for name, m in self.draw(image, rng):
            image, mask = _apply_pair(space, name, image, mask, m)
        return image, mask


def _apply(space: Space, name: str, image: np.ndarray, magnitude: float) -> np.ndarray:
    """Run the op called ``name`` of ``space``."""
    for op_name, _, _, fn in space:
        if op_name == name:
            return fn(image, magnitude)
    raise KeyError(name)


GEOMETRIC = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"})


def _apply_pair(
    space: Space, name: str, image: np.ndarray, mask: np.ndarray, magnitude: float
) -> tuple[np.ndarray, np.ndarray]:
    """Run the op called ``name`` on the image, and on the mask too if it moves pixels."""
    out = _apply(space, name, image, magnitude)
    if name in GEOMETRIC:
        mask = _apply(space, name, np.ascontiguousarray(mask), magnitude)
    return out, mask

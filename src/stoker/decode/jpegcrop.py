"""Decode only the crop window of a JPEG, optionally at a reduced DCT scale.

A thin wrapper over the optional C extension :mod:`stoker.decode._jpeg` (built against the
system's libjpeg-turbo by ``setup.py``). It decodes the rows and columns a region
needs and no more -- ``jpeg_crop_scanline`` for the columns, ``jpeg_skip_scanlines``
for the rows above, nothing below -- straight into a numpy buffer, with the GIL
released, so threads in one worker decode in parallel. The window is returned as a view of
the rows libjpeg wrote (they start at an iMCU boundary left of it), never copied out of a row
buffer: that copy is a measurable share of a decode (see benchmarks/README.md#crop-window-decode).

Where the extension could not be built, :data:`AVAILABLE` is False and the callers
(:mod:`stoker.decode.jpeg`) use simplejpeg instead; the pure-Python helpers here
(:func:`scaled_region`, :func:`pick_denom`) work either way.

Coordinates: a region ``(top, left, height, width)`` is in full-resolution *stored*
pixel coordinates (before any EXIF rotation). Decoded at scale ``1/s`` the result is
the smallest window of the scaled image that covers the region (see
:func:`scaled_region`). Decoding is exact: the window equals the same window of a
full decode by the same libjpeg-turbo with the same settings.
"""

from __future__ import annotations

import importlib
import os
import platform
from types import ModuleType

import numpy as np

from .common import Box

API_VERSION = 2
"""The C extension's interface version this module calls (``STOKER_JPEG_API`` in _jpeg.c)."""

_jpeg: ModuleType | None
STALE: str = ""
"""Why a built extension is not used: it was built from another version of stoker's source."""
try:
    _jpeg = importlib.import_module("stoker.decode._jpeg")
except ImportError:  # built without libjpeg headers: the callers fall back to simplejpeg
    _jpeg = None
if _jpeg is not None and getattr(_jpeg, "API_VERSION", 1) != API_VERSION:
    STALE = (
        f"{_jpeg.__file__} was built from another version of stoker (interface "
        f"{getattr(_jpeg, 'API_VERSION', 1)}, this stoker calls {API_VERSION})"
    )
    _jpeg = None

Buffer = bytes | bytearray | memoryview
"""What the functions accept as JPEG data (anything with the buffer protocol works)."""

__all__ = ["AVAILABLE", "DENOMS", "decode_region", "header", "pick_denom", "scaled_region"]

AVAILABLE: bool = _jpeg is not None
"""True when the C extension :mod:`stoker.decode._jpeg` is importable."""

DENOMS: tuple[int, ...] = (8, 4, 2, 1)
"""The DCT scales used, as denominators, largest first. Only powers of two: libjpeg's
other scales (7/8 ... 1/8 in eighths) are slower than a full-size decode."""

ROW_SLACK = 34
"""Extra pixels per row the output buffer needs: libjpeg starts a cropped row at an iMCU
boundary (up to 31 pixels left of the window) and stoker asks for one spare column on
each side."""


def _ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative integers, without floating point."""
    return -(-a // b)


def scaled_region(
    top: int, left: int, height: int, width: int, img_h: int, img_w: int, denom: int
) -> Box:
    """Map a full-resolution region to the window decoded at scale ``1/denom``.

    Returns ``(y0, x0, out_h, out_w)``: the window's top-left corner and size in the
    scaled image, which libjpeg makes ``ceil(img_h/denom) x ceil(img_w/denom)``::

        y0 = top // denom    y1 = min(ceil((top + height) / denom), ceil(img_h / denom))
        x0 = left // denom   x1 = min(ceil((left + width) / denom), ceil(img_w / denom))
        out_h, out_w = y1 - y0, x1 - x0

    i.e. the smallest scaled window covering the region (the ``min`` never binds for a
    region inside the image; it is kept as a guard). This mirrors the C code
    exactly, and is what :func:`decode_region` returns the shape of. Raises
    ``ValueError`` for a region outside the image or an unsupported ``denom``.
    """
    if denom not in DENOMS:
        raise ValueError(f"denom must be one of {DENOMS}, not {denom!r}")
    if height <= 0 or width <= 0 or top < 0 or left < 0:
        raise ValueError(
            f"region {(top, left, height, width)} needs top, left >= 0 and height, width > 0"
        )
    if top + height > img_h or left + width > img_w:
        raise ValueError(
            f"region {(top, left, height, width)} (top, left, height, width) exceeds "
            f"the image size {img_h}x{img_w}"
        )
    y0, x0 = top // denom, left // denom
    y1 = min(_ceil_div(top + height, denom), _ceil_div(img_h, denom))
    x1 = min(_ceil_div(left + width, denom), _ceil_div(img_w, denom))
    return y0, x0, y1 - y0, x1 - x0


def pick_denom(box_h: int, box_w: int, min_h: int, min_w: int) -> int:
    """The largest DCT scale denominator in (8, 4, 2, 1) that keeps a region big enough.

    Returns the largest ``s`` with ``box_h >= min_h * s`` and ``box_w >= min_w * s``,
    which guarantees the scaled window (:func:`scaled_region`) has at least
    ``min_h`` rows and ``min_w`` columns; 1 (full resolution) when no reduction fits.
    Minimums below 1 count as 1.
    """
    min_h, min_w = max(int(min_h), 1), max(int(min_w), 1)
    for denom in DENOMS[:-1]:
        if box_h >= min_h * denom and box_w >= min_w * denom:
            return denom
    return 1


def header(data: Buffer) -> tuple[int, int, int, int]:
    """Return ``(height, width, components, colorspace)`` of a JPEG without decoding.

    Sizes are full-resolution and stored (no EXIF rotation); ``colorspace`` is
    libjpeg's ``J_COLOR_SPACE`` (1 grayscale, 2 RGB, 3 YCbCr, 4 CMYK, 5 YCCK). Nothing
    is allocated from the dimensions, so check them here before :func:`decode_region`.
    Raises ``ValueError`` for data without a readable JPEG header and
    ``RuntimeError`` when the extension is not available.
    """
    height, width, components, colorspace = _require().header(data)[:4]
    return height, width, components, colorspace


def decode_region(
    data: Buffer,
    box: Box | None = None,
    min_size: tuple[int, int] | None = None,
    fast: bool = False,
    *,
    image_size: tuple[int, int] | None = None,
    notes: list[str] | None = None,
    channels: int = 3,
) -> np.ndarray:
    """Decode the region ``box = (top, left, height, width)`` of a JPEG to RGB, or with
    ``channels=1`` straight to grayscale (libjpeg's grayscale output: a YCbCr file's Y plane,
    its chroma never decoded).

    ``box`` is in full-resolution stored coordinates (None: the whole image). With
    ``min_size = (H, W)`` the region is decoded at the largest DCT scale 1/8, 1/4 or
    1/2 that still gives at least H rows and W columns (:func:`pick_denom`); the
    result is then the covering window of the scaled image (:func:`scaled_region`).
    ``fast`` uses the fast integer IDCT and plain upsampling (slightly less accurate).
    ``image_size = (height, width)`` skips the header parse when the caller already
    has the stored size (and has checked it against its pixel budget). libjpeg's warnings
    (recoverable corrupt data, decoded anyway) are appended to ``notes`` when given, as
    ``"libjpeg warning: <first message>"`` (with a count when there were more).

    Returns a ``uint8`` array of shape ``(out_h, out_w, 3)`` (``(out_h, out_w)`` for gray)
    whose pixels and columns are
    contiguous but whose rows may be padded (a view into the rows libjpeg wrote: the window
    is not copied out of them); ``np.ascontiguousarray`` gives a packed copy.
    Raises ``ValueError`` for corrupt or truncated data (for the latter the message starts
    "truncated"), a region outside the image,
    and CMYK/YCCK images (the message contains "cmyk": decode those another way);
    ``RuntimeError`` when the extension is not available. Damage *below* the region
    of a baseline file is not seen (those rows are never decoded); the pixels
    returned are always the file's own.
    """
    lib = _require()
    if image_size is None:
        img_h, img_w = lib.header(data)[:2]
    else:
        img_h, img_w = image_size
    top, left, height, width = (0, 0, img_h, img_w) if box is None else box
    denom = 1 if min_size is None else pick_denom(height, width, min_size[0], min_size[1])
    _, _, out_h, out_w = scaled_region(top, left, height, width, img_h, img_w, denom)
    buf = np.empty(out_h * (out_w + ROW_SLACK) * channels, dtype=np.uint8)
    got_h, got_w, skip, pitch, warnings, warning = lib.decode_region(
        data, top, left, height, width, denom, bool(fast), buf, channels
    )
    if warnings and notes is not None:
        more = f" (and {warnings - 1} more)" if warnings > 1 else ""
        notes.append(f"libjpeg warning: {warning}{more}")
    if (got_h, got_w) != (out_h, out_w):  # cannot happen: the C code uses the same mapping
        raise RuntimeError(f"JPEG region decoded to {(got_h, got_w)}, expected {(out_h, out_w)}")
    rows = buf[: out_h * pitch * channels].reshape(out_h, pitch, channels)
    window = rows[:, skip : skip + out_w]
    return window[:, :, 0] if channels == 1 else window


def _require() -> ModuleType:
    """Return the extension module, or raise RuntimeError saying how to get it."""
    if _jpeg is None:
        raise RuntimeError(missing_message())
    return _jpeg


def missing_message() -> str:
    """What it costs that the extension is not built, and the one-line fix for this platform."""
    if STALE:
        return (
            f"stoker's fast JPEG decoder is not used: {STALE}. JPEGs decode with simplejpeg "
            "instead, at about 20-25% more CPU per image. Fix: rebuild it (pip install -e . "
            "in a clone, or python setup.py build_ext --inplace)"
        )
    return (
        "stoker's fast JPEG decoder (the crop-window C extension stoker.decode._jpeg) is not "
        "built: libjpeg-turbo's headers or a C compiler were missing when stoker was "
        "installed. JPEGs decode with simplejpeg instead, at about 20-25% more CPU per "
        f"image. Fix: {install_hint()}, then reinstall stoker from source "
        "(pip install --force-reinstall --no-deps --no-binary stoker stoker, or "
        "pip install -e . in a clone)"
    )


def install_hint() -> str:
    """The command that installs libjpeg-turbo's development files and a C compiler here."""
    system = platform.system()
    if os.environ.get("CONDA_PREFIX"):
        return "conda install -c conda-forge libjpeg-turbo c-compiler"
    if system == "Darwin":
        return "brew install jpeg-turbo (and xcode-select --install for the compiler)"
    if system == "Windows":
        return (
            "conda install -c conda-forge libjpeg-turbo, plus the Microsoft C++ Build Tools "
            "(or vcpkg install libjpeg-turbo)"
        )
    distro = _os_release()
    if distro & {"debian", "ubuntu"}:
        return "sudo apt-get install libjpeg-turbo8-dev gcc (Debian: libjpeg62-turbo-dev gcc)"
    if distro & {"fedora", "rhel", "centos"}:
        return "sudo dnf install libjpeg-turbo-devel gcc"
    if "alpine" in distro:
        return "apk add libjpeg-turbo-dev build-base"
    if "arch" in distro:
        return "sudo pacman -S libjpeg-turbo gcc"
    return "install your system's libjpeg-turbo development package and a C compiler"


def _os_release() -> set[str]:
    """The ID and ID_LIKE words of /etc/os-release (empty where it cannot be read)."""
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    words: set[str] = set()
    for line in lines:
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            words.update(value.strip('"').lower().split())
    return words

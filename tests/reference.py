"""The reference decoder of the conformance tests: Pillow, oriented as Pillow orients."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps


def encode(image: np.ndarray | Image.Image, fmt: str, **options: object) -> bytes:
    """``image`` saved by Pillow as ``fmt`` with ``options``."""
    im = Image.fromarray(image) if isinstance(image, np.ndarray) else image
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


def pillow_rgb(data: bytes) -> np.ndarray:
    """Pillow's decode (first frame), EXIF/XMP-oriented, as RGB ``uint8``."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


def run_without_extension(code: str) -> None:
    """Run ``code`` in a fresh interpreter where the C extension cannot be imported (as where
    it was not built); it must print ``ok``."""
    import subprocess
    import sys

    prelude = "import sys\nsys.modules['stoker.decode._jpeg'] = None\n"
    out = subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr

"""Build the optional C extensions; all metadata lives in pyproject.toml.

``stoker.decode._jpeg`` decodes the crop window of a JPEG with libjpeg-turbo (>= 1.5.1, for
``jpeg_crop_scanline``/``jpeg_skip_scanlines``). Where it is linked from is chosen by
``STOKER_JPEG`` at build time (never at run time):

- ``auto`` (the default, a source install): the system's libjpeg-turbo (headers ``jpeglib.h``,
  library ``-ljpeg``) if it builds; where the headers, the library or a C compiler are missing
  the install goes on without the extension, and stoker decodes JPEGs with simplejpeg (more CPU
  per image), warning once at the first ``Loader`` with the fix;
- ``system``: the system's libjpeg-turbo, and the build fails if it cannot be used;
- ``static``: a static libjpeg-turbo built by ``scripts/build_libjpeg_turbo.sh`` under
  ``STOKER_JPEG_PREFIX`` (``include/``, ``lib/`` or ``lib64/`` with ``libjpeg.a``), linked into
  the extension with its symbols hidden, so a wheel needs no libjpeg on the user's machine and
  never clashes with another copy loaded by Pillow or OpenCV (the release wheels);
- ``off``: no JPEG extension (the simplejpeg branch, for CI to test it).

``stoker.sources._readfiles`` (POSIX threads only, no library) runs the read-ahead window's
file reads off the interpreter; without it the window reads on Python threads.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup

CHOICES = ("auto", "system", "static", "off")


def _static_jpeg(prefix: str) -> dict:
    """Compile and link arguments for a static libjpeg-turbo installed under ``prefix``."""
    root = Path(prefix)
    archives = [root / d / "libjpeg.a" for d in ("lib", "lib64")]
    archive = next((a for a in archives if a.is_file()), None)
    if archive is None or not (root / "include" / "jpeglib.h").is_file():
        sys.exit(
            f"STOKER_JPEG=static: no include/jpeglib.h and lib/libjpeg.a under {prefix!r}; "
            "build them with scripts/build_libjpeg_turbo.sh"
        )
    hide = (
        ["-Wl,-exported_symbol,_PyInit__jpeg"]
        if sys.platform == "darwin"
        else ["-Wl,--exclude-libs,ALL"]
    )
    return {
        "include_dirs": [str(root / "include")],
        "extra_objects": [str(archive)],
        "extra_compile_args": ["-fvisibility=hidden"],
        "extra_link_args": hide,
    }


def _jpeg_extension() -> list[Extension]:
    """The ``_jpeg`` extension as ``STOKER_JPEG`` asks (none for ``off``)."""
    choice = os.environ.get("STOKER_JPEG", "auto")
    if choice not in CHOICES:
        sys.exit(f"STOKER_JPEG={choice!r}: use one of {', '.join(CHOICES)}")
    if choice == "off":
        return []
    if choice == "static":
        args = _static_jpeg(os.environ.get("STOKER_JPEG_PREFIX", ""))
        return [Extension("stoker.decode._jpeg", sources=["src/stoker/decode/_jpeg.c"], **args)]
    return [
        Extension(
            "stoker.decode._jpeg",
            sources=["src/stoker/decode/_jpeg.c"],
            libraries=["jpeg"],
            optional=choice == "auto",
        )
    ]


setup(
    ext_modules=[
        *_jpeg_extension(),
        Extension(
            "stoker.sources._readfiles",
            sources=["src/stoker/sources/_readfiles.c"],
            optional=True,
        ),
    ],
)

"""Build the optional C extension ``stoker._jpeg``; all metadata lives in pyproject.toml.

``stoker._jpeg`` decodes the crop window of a JPEG with the system's libjpeg-turbo
(headers ``jpeglib.h``, library ``-ljpeg``; libjpeg-turbo >= 1.5.1 for
``jpeg_crop_scanline``/``jpeg_skip_scanlines``). The extension is optional: where the
headers or the library are missing the build prints a warning and the install goes on
without it; ``stoker.jpegcrop.AVAILABLE`` is then False and stoker decodes with simplejpeg.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stoker._jpeg",
            sources=["src/stoker/_jpeg.c"],
            libraries=["jpeg"],
            optional=True,
        )
    ],
)

"""Build the optional C extension ``stoker.decode._jpeg``; all metadata lives in pyproject.toml.

``stoker.decode._jpeg`` decodes the crop window of a JPEG with the system's libjpeg-turbo
(headers ``jpeglib.h``, library ``-ljpeg``; libjpeg-turbo >= 1.5.1 for
``jpeg_crop_scanline``/``jpeg_skip_scanlines``). The extension is optional: where the
headers, the library or a C compiler are missing the install goes on without it,
``stoker.decode.jpegcrop.AVAILABLE`` is then False, stoker decodes JPEGs with simplejpeg
(about 20-25% more CPU per image) and warns once, at the first ``Loader``, with the fix.

``stoker.sources._readfiles`` (POSIX threads only, no library) runs the read-ahead window's
file reads off the interpreter; without it the window reads on Python threads.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stoker.decode._jpeg",
            sources=["src/stoker/decode/_jpeg.c"],
            libraries=["jpeg"],
            optional=True,
        ),
        Extension(
            "stoker.sources._readfiles",
            sources=["src/stoker/sources/_readfiles.c"],
            optional=True,
        ),
    ],
)

"""A C extension built from another version of stoker's source (an editable install not rebuilt
after a pull) is refused at import with a message saying to rebuild, and JPEGs still decode
(through simplejpeg) instead of every image failing with the extension's TypeError."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from stoker.decode import jpegcrop

SCRIPT = textwrap.dedent(
    """
    import sys, types, warnings
    old = types.ModuleType("stoker.decode._jpeg")  # an older build: no API_VERSION stamp
    old.__file__ = sys.argv[2]
    old.decode_region = lambda *a: (_ for _ in ()).throw(TypeError("takes exactly 8 arguments"))
    sys.modules["stoker.decode._jpeg"] = old
    import stoker
    from stoker.decode import jpegcrop
    assert not jpegcrop.AVAILABLE and "another version" in jpegcrop.STALE
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = stoker.Loader(sys.argv[1], batch_size=4, image_size=32, workers=0)
        images, labels = next(iter(loader))
    assert images.shape == (4, 32, 32, 3) and loader.stats().skipped == 0
    messages = [str(w.message) for w in seen]
    assert any("rebuild it" in m for m in messages), messages
    print("ok", jpegcrop.missing_message())
    """
)


def test_the_built_extension_matches_this_source():
    assert jpegcrop.AVAILABLE, "build it: python setup.py build_ext --inplace"
    assert jpegcrop._jpeg.API_VERSION == jpegcrop.API_VERSION


def test_a_stale_build_is_refused_and_jpegs_still_decode(image_folder):
    assert jpegcrop._jpeg is not None
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(image_folder), jpegcrop._jpeg.__file__],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout and "python setup.py build_ext --inplace" in out.stdout

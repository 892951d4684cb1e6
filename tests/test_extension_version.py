"""A C extension built from another version of stoker's source (an editable install not rebuilt
after a pull) is refused at import with a message saying to rebuild, and JPEGs still decode
(through simplejpeg) instead of every image failing with the extension's TypeError; a stale
native reader (``_readfiles``) is refused the same way and the window reads on Python threads."""

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
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout and "python setup.py build_ext --inplace" in out.stdout


NATIVE_READS = textwrap.dedent(
    """
    import sys, types
    old = types.ModuleType("stoker.sources._readfiles")  # a build from another stoker
    old.__file__, old.API_VERSION = "/old/_readfiles.so", 0
    sys.modules["stoker.sources._readfiles"] = old
    import numpy as np
    import stoker
    from stoker.cli.doctor import doctor
    from stoker.sources import filereads, open_source
    from stoker.sources.readahead import ReadAhead, ReadSettings
    assert not filereads.AVAILABLE and "another stoker version" in filereads.STALE
    files = sorted(__import__("pathlib").Path(sys.argv[1]).glob("*/*.jpg"))[:4]
    source = open_source(None, paths=[str(f) for f in files], labels=[0, 1, 2, 3])
    reads = ReadAhead(source, ReadSettings(window=2))
    assert reads._native is None  # the window reads on Python threads
    reads.start(np.arange(4))
    assert [reads.take(k)[0] for k in range(4)] == [f.read_bytes() for f in files]
    print(doctor())
    """
)


def test_a_stale_native_reader_is_refused_and_the_window_reads_on_python_threads(image_folder):
    from stoker.sources import filereads

    assert filereads.AVAILABLE, "build it: python setup.py build_ext --inplace"
    out = subprocess.run(
        [sys.executable, "-c", NATIVE_READS, str(image_folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "reads ahead of decoding: Python threads: the built /old/_readfiles.so" in out.stdout
    assert "python setup.py build_ext --inplace" in out.stdout

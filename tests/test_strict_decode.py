"""Say what is decoded: JPEGs whose damage libjpeg recovers from (with a warning) decode by
default, even some that Pillow refuses; ``strict_decode=True`` counts them as bad files, in
every epoch, whatever crop an epoch draws."""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pytest
from PIL import Image

import stoker
from helpers import files_loader
from stoker.decode import decode, probe, refuse_warnings
from stoker.errors import ConfigError, DecodeError, TooManyErrors

#: A 4:2:0 JPEG with three bytes of its scan data changed: libjpeg warns "premature end of data
#: segment" and decodes it; Pillow refuses it ("broken data stream when reading image file").
PILLOW_REFUSES = pathlib.Path(__file__).parent / "corpus" / "corrupt" / "pillow_refuses.jpg"


def _photo_jpeg(size: tuple[int, int] = (320, 240)) -> bytes:
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // w, y * 255 // h, ((x // 8 + y // 8) % 2) * 200], -1)
    buf = io.BytesIO()
    Image.fromarray(a.astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _damaged_low(data: bytes) -> bytes:
    """A marker inside the scan data three quarters of the way down: damage below the top."""
    sos = data.index(b"\xff\xda")
    at = sos + (len(data) - sos) * 3 // 4
    return data[:at] + b"\xff\xd3" + data[at:]


def _loader(tmp_path, data: dict[str, bytes], **options) -> stoker.Loader:
    """helpers.files_loader, inline (``workers=0``) unless ``options`` say otherwise."""
    return files_loader(tmp_path, data, **{"workers": 0, **options})


def test_pillow_refuses_the_file_that_libjpeg_decodes_with_a_warning():
    data = PILLOW_REFUSES.read_bytes()
    with pytest.raises(OSError, match="broken data stream"):
        Image.open(io.BytesIO(data)).load()
    notes: list[str] = []
    assert decode(data, notes=notes).shape[:2] == (240, 320)
    assert len(notes) == 1 and "premature end of data segment" in notes[0]


@pytest.mark.timeout(60)
def test_strict_decode_counts_a_file_decoded_with_warnings_as_bad(tmp_path):
    files = {"good.jpg": _photo_jpeg(), "warned.jpg": PILLOW_REFUSES.read_bytes()}
    with _loader(tmp_path, files, max_errors=0) as lenient:
        next(iter(lenient))
        report = lenient.stats()
    assert report.skipped == 0 and [n for n, _ in report.warned_files] == [
        str(tmp_path / "warned.jpg")
    ]
    with _loader(tmp_path, files, max_errors=1, strict_decode=True, workers=1) as strict:
        x, _ = next(iter(strict))
        report = strict.stats()
    assert report.skipped == 1 and not report.warned_files
    assert "warned.jpg" in str(report) and "strict_decode=True" in str(report)
    with _loader(tmp_path, files, max_errors=0, strict_decode=True) as strict:
        with pytest.raises(TooManyErrors, match="warned.jpg"):
            next(iter(strict))


def test_strict_decode_sees_damage_outside_the_region_a_crop_decodes():
    """A crop of the top rows never reads the damaged data below it: by default no warning,
    under strict_decode the whole file's data is checked, so the file is bad whatever crop."""
    data = _damaged_low(_photo_jpeg())
    info = probe(data)
    top = (0, 0, 32, 64)
    notes: list[str] = []
    decode(data, info, box=top, notes=notes)
    assert notes == []
    with pytest.raises(DecodeError, match="decoded only with warnings.*strict_decode=True"):
        refuse_warnings(data, info, top, notes)
    refuse_warnings(_photo_jpeg(), probe(_photo_jpeg()), top, [])  # an intact file passes


@pytest.mark.timeout(60)
def test_strict_decode_is_validated_up_front(tmp_path):
    with pytest.raises(ConfigError, match="strict_decode"):
        _loader(tmp_path, {"good.jpg": _photo_jpeg()}, strict_decode="yes")

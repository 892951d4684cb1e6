"""JPEG conformance: stoker's decode against Pillow (the reference) on its own corpus.

tests/corpus/jpeg/ holds small files written by libjpeg-turbo's cjpeg (scripts/make_corpus.py):
every sampling layout cjpeg writes, restart intervals, arithmetic coding, progressive scans,
grayscale and RGB. The tests derive the rest from them: each libjpeg warning case, trailing
data after the end-of-image marker, truncation, CMYK (Pillow) and YCCK (TurboJPEG).
"""

from __future__ import annotations

import glob
import io
import os
import struct

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from helpers import files_loader
from reference import pillow_rgb, run_without_extension
from stoker.decode import decode, jpeg, probe
from stoker.errors import DecodeError

CORPUS = os.path.join(os.path.dirname(__file__), "corpus", "jpeg")
FILES = sorted(glob.glob(os.path.join(CORPUS, "*.jpg")))
NAMES = [os.path.basename(f)[:-4] for f in FILES]


def _read(name: str) -> bytes:
    with open(os.path.join(CORPUS, f"{name}.jpg"), "rb") as f:
        return f.read()


def assert_close(got: np.ndarray, ref: np.ndarray, mean: float = 0.5, peak: int = 255) -> None:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert diff.mean() <= mean and diff.max() <= peak, (diff.mean(), diff.max())


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def _after_soi(data: bytes, extra: bytes) -> bytes:
    return data[:2] + extra + data[2:]


def _before(data: bytes, marker: bytes, extra: bytes) -> bytes:
    pos = data.index(marker)
    return data[:pos] + extra + data[pos:]


def test_corpus_is_there() -> None:
    assert len(FILES) >= 20 and {"s441", "s410", "s2x4", "arithmetic", "progressive"} <= set(NAMES)
    assert sum(os.path.getsize(f) for f in FILES) < 200_000


@pytest.mark.parametrize("name", NAMES)
def test_corpus_matches_pillow(name: str) -> None:
    """Findings 1-2: every layout cjpeg writes (4:4:1, 4:1:0, 2x4, 3x1 ...) probes and decodes
    exactly as Pillow does, whole, in a window and at a reduced DCT scale."""
    data = _read(name)
    ref = pillow_rgb(data)
    info = probe(data)
    assert (info.height, info.width, info.format) == (*ref.shape[:2], "jpeg")
    assert_close(decode(data, info), ref, mean=0.0)
    window = decode(data, info, box=(7, 9, 30, 40))
    assert_close(window, ref[7:37, 9:49], mean=0.0)
    small = decode(data, info, min_size=(20, 28))
    assert small.shape[:2] == (23, 31)  # 1/2 scale: ceil(45 / 2), ceil(61 / 2)


def test_header_parser_reads_the_frame() -> None:
    header = jpeg.parse_header(_read("s441"))
    assert (header.height, header.width, header.components) == (45, 61, 3)
    assert header.sampling == ((1, 4), (1, 1), (1, 1))
    assert header.colorspace == "ycbcr" and header.process == "baseline"
    assert jpeg.parse_header(_read("progressive_arithmetic")).process == "progressive+arithmetic"
    assert jpeg.parse_header(_read("rgb")).colorspace == "rgb"
    assert jpeg.parse_header(_read("grayscale")).colorspace == "gray"


def test_corpus_without_the_c_extension() -> None:
    """Where the extension is not built (simplejpeg, then Pillow), the corpus still matches."""
    code = (
        "import glob, io, numpy as np\n"
        "from PIL import Image\n"
        "from stoker.decode import decode, jpegcrop\n"
        "assert not jpegcrop.AVAILABLE\n"
        f"for f in sorted(glob.glob({CORPUS!r} + '/*.jpg')):\n"
        "    data = open(f, 'rb').read()\n"
        "    ref = np.asarray(Image.open(io.BytesIO(data)).convert('RGB'))\n"
        "    got = decode(data, box=(7, 9, 30, 40))\n"
        "    assert np.array_equal(got, ref[7:37, 9:49]), f\n"
        "print('ok')\n"
    )
    run_without_extension(code)


def test_a_441_jpeg_loads_in_a_loader(tmp_path) -> None:
    """Finding 1: a 4:4:1 JPEG among good ones made the probe raise KeyError out of the Loader
    (even with max_errors); now it loads like the others."""
    files = {f"{i}.jpg": _read(name) for i, name in enumerate(["s420", "s441", "s444", "s410"])}
    with files_loader(tmp_path, files, workers=0, max_errors=10) as loader:
        images, labels = next(iter(loader))
        assert images.shape == (4, 16, 16, 3) and loader.stats().skipped == 0


def test_cmyk_and_ycck_match_pillow() -> None:
    picture = np.asarray(Image.open(io.BytesIO(_read("s444"))).convert("RGB"))
    cmyk = io.BytesIO()
    Image.fromarray(picture).convert("CMYK").save(cmyk, "JPEG", quality=95)
    ycck = simplejpeg.encode_jpeg(
        np.asarray(Image.fromarray(picture).convert("CMYK")), quality=95, colorspace="CMYK"
    )
    assert jpeg.parse_header(cmyk.getvalue()).colorspace == "cmyk"
    assert jpeg.parse_header(ycck).colorspace == "ycck"
    for data in (cmyk.getvalue(), ycck):
        assert_close(decode(data), pillow_rgb(data), mean=1.0, peak=3)
        assert_close(decode(data, box=(5, 6, 20, 30)), pillow_rgb(data)[5:25, 6:36], 1.0, 3)


# ------------------------------------------------------------------ finding 3: libjpeg warnings


def _warning_cases() -> dict[str, tuple[bytes, str | None]]:
    """name -> (data, what libjpeg's warning says, or None when libjpeg does not warn)."""
    base = _read("s420")
    restart = _read("restart_1row")
    rst = restart.index(b"\xff\xd1")  # the second restart marker: make it RST5
    sos = base.index(b"\xff\xda")
    scan_mid = (sos + len(base)) // 2
    bad_exif = _segment(0xE1, b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff" + b"\x01" * 40)
    icc = _segment(0xE2, b"ICC_PROFILE\x00\x01\x01" + b"\x00" * 200)
    jfif = base.index(b"JFIF\x00")
    se = sos + 5 + 2 * base[sos + 4] + 1  # the SOS's Se byte (63 in a sequential file)
    progressive = _read("progressive")
    scans = [i for i in range(len(progressive) - 1) if progressive[i : i + 2] == b"\xff\xda"]
    # The second scan's Ah/Al byte (Ah=0, Al=2): Ah=3 is legal, but not what came before.
    ahal = scans[1] + 5 + 2 * progressive[scans[1] + 4] + 2
    no_jfif = base[:2] + base[4 + struct.unpack_from(">H", base, 4)[0] :]  # APP0 dropped
    adobe = _segment(0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x07")  # transform 7: unknown
    return {
        "junk_before_marker": (_before(base, b"\xff\xdb", b"\x00\x11\x22"), "extraneous bytes"),
        "ff00_in_header": (_before(base, b"\xff\xdb", b"\xff\x00"), "extraneous bytes"),
        "adobe_unknown_transform": (_after_soi(no_jfif, adobe), "adobe"),
        "icc_after_sof": (_before(base, b"\xff\xc4", icc), None),
        "bad_exif_block": (_after_soi(base, bad_exif), None),
        "jfif_major_version_2": (base[: jfif + 5] + b"\x02" + base[jfif + 6 :], "jfif"),
        "marker_inside_scan": (base[:scan_mid] + b"\xff\xd3" + base[scan_mid:], "corrupt"),
        "wrong_restart_number": (restart[: rst + 1] + b"\xd5" + restart[rst + 2 :], "corrupt"),
        "bad_huffman_code": (base[:scan_mid] + b"\xff\x00" * 6 + base[scan_mid:], "huffman"),
        "sequential_sos_parameters": (base[:se] + b"\x3e" + base[se + 1 :], "sos parameters"),
        "bogus_progression": (
            progressive[:ahal] + b"\x32" + progressive[ahal + 1 :],
            "progression",
        ),
    }


WARNING_CASES = _warning_cases()


@pytest.mark.parametrize("case", sorted(WARNING_CASES))
def test_libjpeg_warning_cases_decode_like_pillow(case: str) -> None:
    """Finding 3: recoverable corrupt data decodes (to Pillow's pixels); libjpeg's warning,
    where it gives one, is reported in ``notes``."""
    data, warning = WARNING_CASES[case]
    ref = pillow_rgb(data)
    notes: list[str] = []
    got = decode(data, notes=notes)
    np.testing.assert_array_equal(decode(memoryview(bytearray(data))), got)
    assert_close(got, ref, mean=0.5 if warning != "corrupt" else 2.0)
    if warning is None:
        assert notes == []
    else:
        assert len(notes) == 1 and warning in notes[0].lower(), notes


def test_warnings_show_in_stats_not_as_errors(tmp_path) -> None:
    names = ["junk_before_marker", "marker_inside_scan"]
    files = {f"{name}.jpg": WARNING_CASES[name][0] for name in names}
    with files_loader(tmp_path, files, workers=1, max_errors=0) as loader:
        next(iter(loader))
        report = loader.stats()
    assert report.skipped == 0
    assert sorted(os.path.basename(n) for n, _ in report.warned_files) == sorted(
        f"{n}.jpg" for n in names
    )
    assert "decoded with warnings" in str(report)


# ------------------------------------------------------------------ finding 4: trailing data


@pytest.mark.parametrize("size", [0, 10_000, 3_000_000], ids=["0B", "10KB", "3MB"])
def test_any_trailing_data_after_eoi_is_fine(size: int) -> None:
    """Finding 4: a motion photo carries a video after the image's EOI; more than ~4 KB of it
    made the file "truncated". Trailing bytes (with FF D9 and other markers in them) are fine."""
    data = _read("s420")
    rng = np.random.default_rng(size)
    trailer = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    full = data + trailer
    ref = pillow_rgb(data)
    info = probe(full)
    assert_close(decode(full, info), ref, mean=0.0)
    assert_close(decode(full, info, box=(20, 30, 25, 31)), ref[20:45, 30:61], mean=0.0)
    assert_close(decode(data + _read("progressive") + trailer), ref, mean=0.0)  # MPO-like
    view = memoryview(bytearray(b"xx" + full))[2:]
    assert_close(decode(view, probe(view), box=(20, 30, 25, 31)), ref[20:45, 30:61], mean=0.0)


@pytest.mark.parametrize("name", ["s420", "progressive", "restart_1row", "arithmetic"])
def test_truncated_is_refused_whatever_the_crop(name: str) -> None:
    """A truncated file is bad for every box an epoch may draw, even one above the cut."""
    data = _read(name)
    cut = data[: len(data) * 7 // 10]
    info = probe(cut)
    rng = np.random.default_rng(0)
    for _ in range(12):
        h, w = int(rng.integers(1, 45)), int(rng.integers(1, 61))
        box = (int(rng.integers(0, 46 - h)), int(rng.integers(0, 62 - w)), h, w)
        with pytest.raises(DecodeError, match="truncated"):
            decode(cut, info, box=box, min_size=(4, 4))
    with pytest.raises(DecodeError, match="truncated"):
        decode(cut, info, box=(0, 0, 8, 8))


def test_missing_eoi_with_trailing_zeros_is_truncated() -> None:
    data = _read("s420")
    with pytest.raises(DecodeError, match="truncated"):
        decode(data[: len(data) // 2] + bytes(20_000))

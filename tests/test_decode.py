"""Tests of stoker.decode: probe, RGB decoding of all formats, crops, DCT scaling, EXIF, errors."""

from __future__ import annotations

import struct
import tracemalloc

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from reference import encode, pillow_rgb
from stoker.decode import IMAGE_EXTENSIONS, ImageInfo, decode, probe
from stoker.errors import DecodeError, DecompressionBombError


def _photo(height: int = 96, width: int = 128) -> np.ndarray:
    """A deterministic smooth RGB picture with some edges (JPEG-friendly)."""
    y, x = np.mgrid[0:height, 0:width]
    checks = ((x // 16 + y // 16) % 2) * 120
    rgb = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), checks + 60], axis=-1)
    return rgb.astype(np.uint8)


_encode, _pillow_rgb = encode, pillow_rgb


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _assert_rgb(image: np.ndarray, shape: tuple[int, int]) -> None:
    assert image.dtype == np.uint8
    assert image.shape == (*shape, 3)


def _close(a: np.ndarray, b: np.ndarray, tol: float = 3.0) -> None:
    assert a.shape == b.shape
    diff = float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())
    assert diff < tol, f"mean absolute difference {diff:.2f} >= {tol}"


JPEG = _encode(_photo(), "JPEG", quality=92)
PNG = _encode(_photo(), "PNG")
GIF = _encode(_photo(), "GIF")
WEBP = _encode(_photo(), "WEBP")
BMP = _encode(_photo(), "BMP")


def test_image_extensions() -> None:
    assert set(IMAGE_EXTENSIONS) >= {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif"}
    assert all(ext == ext.lower() and ext.startswith(".") for ext in IMAGE_EXTENSIONS)


def test_baseline_jpeg_matches_pillow() -> None:
    assert probe(JPEG) == ImageInfo(96, 128, "jpeg", 1)
    image = decode(JPEG)
    _assert_rgb(image, (96, 128))
    _close(image, _pillow_rgb(JPEG), tol=1.0)
    _close(decode(JPEG, fast=True), image, tol=5.0)


def test_memoryview_and_given_info() -> None:
    view = memoryview(bytearray(b"xx" + JPEG))[2:]
    info = probe(view)
    np.testing.assert_array_equal(decode(view, info), decode(JPEG))


@pytest.mark.parametrize("data", [JPEG, PNG], ids=["jpeg", "png"])
def test_box_is_slice_of_full_decode(data: bytes) -> None:
    full = decode(data)
    crop = decode(data, box=(10, 20, 50, 70))
    np.testing.assert_array_equal(crop, full[10:60, 20:90])


def test_bad_box_is_value_error() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        decode(JPEG, box=(50, 0, 50, 10))
    with pytest.raises(ValueError):
        decode(JPEG, box=(0, 0, 0, 10))


def test_min_size_reduced_scale() -> None:
    data = _encode(_photo(800, 1200), "JPEG", quality=90)
    full = decode(data)
    _assert_rgb(full, (800, 1200))
    half = decode(data, min_size=(400, 600))  # exactly 1/2 allowed
    _assert_rgb(half, (400, 600))
    eighth = decode(data, min_size=(10, 10))
    _assert_rgb(eighth, (100, 150))
    _close(eighth, cv2.resize(full, (150, 100), interpolation=cv2.INTER_AREA), tol=4.0)
    # slightly above a power of two: must not go below min_size
    _assert_rgb(decode(data, min_size=(401, 10)), (800, 1200))
    quarter = decode(data, min_size=(200, 299))
    _assert_rgb(quarter, (200, 300))


@pytest.mark.parametrize("seed", range(20))
def test_min_size_never_smaller_than_allowed(seed: int) -> None:
    rng = np.random.default_rng(seed)
    height, width = (int(v) for v in rng.integers(9, 300, 2))
    data = _encode(_photo(height, width), "JPEG", quality=80)
    top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
    bh, bw = int(rng.integers(1, height - top + 1)), int(rng.integers(1, width - left + 1))
    min_h, min_w = (int(v) for v in rng.integers(1, 80, 2))
    region = decode(data, box=(top, left, bh, bw), min_size=(min_h, min_w))
    assert region.shape[0] >= min(min_h, bh) and region.shape[1] >= min(min_w, bw)
    assert region.shape[0] <= bh and region.shape[1] <= bw
    if bh >= 2 * min_h and bw >= 2 * min_w:
        assert region.shape[0] < bh  # a reduced scale was used


def test_min_size_crop_matches_downscaled_full() -> None:
    data = _encode(_photo(512, 640), "JPEG", quality=95)
    full = decode(data)
    crop = decode(data, box=(64, 128, 256, 320), min_size=(64, 80))
    _assert_rgb(crop, (64, 80))  # 1/4 scale, box aligned to the scale
    expected = cv2.resize(full[64:320, 128:448], (80, 64), interpolation=cv2.INTER_AREA)
    _close(crop, expected, tol=4.0)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("gray_jpeg", lambda: _encode(Image.fromarray(_photo()).convert("L"), "JPEG")),
        ("cmyk_jpeg", lambda: _encode(Image.fromarray(_photo()).convert("CMYK"), "JPEG")),
        ("rgba_png", lambda: _encode(Image.fromarray(_photo()).convert("RGBA"), "PNG")),
        ("webp", lambda: _encode(_photo(), "WEBP", quality=95)),
        ("bmp", lambda: _encode(_photo(), "BMP")),
        ("gif", lambda: _encode(_photo(), "GIF")),
        ("tiff", lambda: _encode(_photo(), "TIFF")),
    ],
)
def test_formats_decode_to_rgb(name: str, make) -> None:
    data = make()
    info = probe(data)
    assert (info.height, info.width) == (96, 128)
    expected_format = name.rsplit("_", 1)[-1] if "_" in name else name
    assert info.format == expected_format
    image = decode(data, info)
    _assert_rgb(image, (96, 128))
    _close(image, _pillow_rgb(data), tol=3.0)


def test_png_named_jpg(tmp_path) -> None:
    path = tmp_path / "really_a_png.jpg"
    path.write_bytes(PNG)
    data = path.read_bytes()
    assert probe(data).format == "png"
    np.testing.assert_array_equal(decode(data), _photo())


def test_png16_scaled_not_clipped() -> None:
    gray = (np.arange(96 * 128, dtype=np.uint32).reshape(96, 128) * 5).astype(np.uint16)
    color = np.stack([gray, gray[::-1], gray[:, ::-1]], axis=-1)
    ok, buf = cv2.imencode(".png", color)
    assert ok
    image = decode(buf.tobytes())
    _assert_rgb(image, (96, 128))
    expected = (color[..., ::-1] >> 8).astype(np.uint8)  # cv2 wrote BGR
    assert np.abs(image.astype(int) - expected).max() <= 1
    assert image.max() > 200  # not clipped at 255 from the low byte


def test_palette_png_with_transparency() -> None:
    palette = Image.fromarray(_photo()).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    data = _encode(palette, "PNG", transparency=0)
    image = decode(data)
    _assert_rgb(image, (96, 128))
    _close(image, np.asarray(palette.convert("RGB")), tol=0.5)


def test_corrupt_files_fixture(corrupt_files) -> None:
    for key, path in corrupt_files.items():
        data = path.read_bytes()
        if key.startswith("bad_"):
            with pytest.raises(DecodeError):
                decode(data)
        else:
            info = probe(data)
            image = decode(data, info)
            _assert_rgb(image, (info.height, info.width))
    assert probe(corrupt_files["odd_exif_rotated"].read_bytes())[:2] == (96, 64)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation(orientation: int) -> None:
    data = _encode(_photo(96, 128), "JPEG", quality=95, exif=_exif(orientation))
    info = probe(data)
    assert info.orientation == orientation
    expected = _pillow_rgb(data)
    assert (info.height, info.width) == expected.shape[:2]
    image = decode(data, info)
    np.testing.assert_array_equal(image, _orient_reference(decode_plain(data), orientation))
    _close(image, expected, tol=1.0)
    box = (5, 7, 40, 30)
    crop = decode(data, info, box=box)
    np.testing.assert_array_equal(crop, image[5:45, 7:37])
    small = decode(data, info, box=(0, 0, info.height, info.width), min_size=(30, 30))
    _assert_rgb(small, (info.height // 2, info.width // 2))
    _close(small, cv2.resize(image, small.shape[1::-1], interpolation=cv2.INTER_AREA), 4.0)


def decode_plain(data: bytes) -> np.ndarray:
    """Decode ignoring orientation (reference for the orientation tests)."""
    return cv2.cvtColor(
        cv2.imdecode(
            np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
        ),
        cv2.COLOR_BGR2RGB,
    )


def _orient_reference(image: np.ndarray, orientation: int) -> np.ndarray:
    ops = {
        1: lambda a: a,
        2: np.fliplr,
        3: lambda a: np.rot90(a, 2),
        4: np.flipud,
        5: lambda a: np.rot90(np.fliplr(a), 1),
        6: lambda a: np.rot90(a, -1),
        7: lambda a: np.rot90(np.fliplr(a), -1),
        8: lambda a: np.rot90(a, 1),
    }
    return ops[orientation](image)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "empty"),
        (b"hello, this is a text file and not an image\n" * 5, "not an image"),
        (JPEG[:200], "JPEG"),
        (JPEG[: len(JPEG) * 6 // 10], "JPEG"),
        (JPEG[:3], "JPEG"),
        (PNG[:20], "truncated header"),
        (PNG[: len(PNG) // 2], "png"),
        (GIF[: len(GIF) // 2], "gif"),
        (WEBP[: len(WEBP) // 2], "webp"),
        (BMP[: len(BMP) // 2], "bmp"),
    ],
    ids=["zero", "text", "jpeg200", "jpeg_truncated", "jpeg3", "png_header", "png_truncated"]
    + ["gif_truncated", "webp_truncated", "bmp_truncated"],
)
def test_bad_data_is_decode_error(data: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        decode(data)


def test_corrupt_jpeg_body_decodes_with_a_warning() -> None:
    """Recoverable corrupt scan data decodes (as in Pillow and OpenCV) and says so in notes."""
    start = len(JPEG) // 2
    data = JPEG[:start] + b"\x00" * 64 + JPEG[start + 64 :]
    notes: list[str] = []
    assert decode(data, notes=notes).shape == (96, 128, 3)
    assert notes and "corrupt jpeg data" in notes[0].lower(), notes


def _png_claiming(height: int, width: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + b"\x00\x00\x00\x00"
    return PNG[:8] + chunk + PNG[33:]


def _jpeg_claiming(height: int, width: int) -> bytes:
    pos = JPEG.index(b"\xff\xc0")  # SOF0: FF C0, length(2), precision(1), height(2), width(2)
    return JPEG[: pos + 5] + struct.pack(">HH", height, width) + JPEG[pos + 9 :]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", [_png_claiming, _jpeg_claiming], ids=["png", "jpeg"])
def test_decompression_bomb_refused_quickly(make) -> None:
    """Refused from the header: nothing near the claimed 10+ GB is allocated (counted by
    tracemalloc, not timed; a decode attempt would also run past the test's limit)."""
    data = make(60_000, 60_000) if make is _jpeg_claiming else make(100_000, 100_000)
    tracemalloc.start()
    try:
        with pytest.raises(DecompressionBombError):
            probe(data)
        with pytest.raises(DecompressionBombError):
            decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    assert issubclass(DecompressionBombError, DecodeError)


def test_max_pixels_argument() -> None:
    with pytest.raises(DecompressionBombError):
        decode(JPEG, max_pixels=96 * 128 - 1)
    with pytest.raises(DecompressionBombError):
        decode(PNG, probe(PNG), max_pixels=100)
    assert decode(JPEG, max_pixels=96 * 128).shape == (96, 128, 3)


def test_exif_parser_survives_garbage_app1() -> None:
    soi, rest = JPEG[:2], JPEG[2:]
    for payload in (
        b"Exif\x00\x00",
        b"Exif\x00\x00MM\x00*\xff\xff\xff\xff",
        b"Exif\x00\x00II*\x00",
    ):
        app1 = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
        assert probe(soi + app1 + rest).orientation == 1


_SEEDS = {"jpeg": JPEG, "png": PNG, "exif": _encode(_photo(32, 48), "JPEG", exif=_exif(6))}


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.sampled_from(sorted(_SEEDS)),
    cut=st.floats(0.0, 1.0),
    edits=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255)), max_size=6),
)
def test_mutated_bytes_only_raise_decode_error(seed: str, cut: float, edits) -> None:
    data = bytearray(_SEEDS[seed])
    for where, value in edits:
        data[int(where * (len(data) - 1))] = value
    data = bytes(data[: max(0, int(cut * len(data) * 1.2))])  # cut > 1/1.2 keeps it whole
    try:
        info = probe(data, max_pixels=10_000_000)
        image = decode(data, info, min_size=(8, 8), max_pixels=10_000_000)
    except DecodeError:
        return
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.shape[0] <= info.height and image.shape[1] <= info.width

"""Grayscale and RGBA through the fast decoders (``decode(channels=1|4)``, ``color_mode=``).

Gray: a JPEG is decoded straight to gray by libjpeg (JCS_GRAYSCALE: for a YCbCr file the stored
Y plane, the chroma never decoded), in the crop-window C extension and in the simplejpeg
fallback alike. That equals Pillow's ``draft("L")`` decode exactly. It is *not* Pillow's
``convert("L")`` of the RGB decode: that one is BT.601 luma of RGB pixels that were rounded and
clipped to 0..255 after upsampled chroma was added back, so it differs from Y by the rounding (a
level or two) and, where the RGB was clipped (saturated colours), by more. The tests bound that
difference as measured on stoker's JPEG corpus: mean < 0.1 level, 99.9th percentile <= 4,
maximum <= 16.

RGBA: a PNG's or WebP's own channels through OpenCV's unchanged read, equal to Pillow's
``convert("RGBA")`` for every PNG colour type (alpha, tRNS keys, palettes); 16-bit data is
scaled to 8 bits as the RGB path scales it (Pillow's ``convert`` clips 16-bit gray instead). A
JPEG keeps its crop-window decode and gets alpha 255.
"""

from __future__ import annotations

import io
import pathlib

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

import stoker
from stoker import decode as dec
from stoker.decode import jpegcrop

CORPUS = sorted((pathlib.Path(__file__).parent / "corpus" / "jpeg").glob("*.jpg"))


def _photo(h: int = 90, w: int = 130, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x // 9 + y // 9) % 2 * 200], -1)
    return np.clip(rgb + rng.integers(-20, 20, rgb.shape), 0, 255).astype(np.uint8)


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _pillow_gray(data: bytes) -> np.ndarray:
    """libjpeg's own grayscale output, through Pillow (``draft("L")``), orientation applied."""
    im = Image.open(io.BytesIO(data))
    im.draft("L", None)
    return np.asarray(ImageOps.exif_transpose(im.convert("L")))


@pytest.fixture(params=["extension", "simplejpeg"])
def jpeg_path(request, monkeypatch):
    """Run a test through the crop-window C extension and through its simplejpeg fallback."""
    if request.param == "extension" and not jpegcrop.AVAILABLE:
        pytest.skip("stoker.decode._jpeg is not built")
    if request.param == "simplejpeg":
        monkeypatch.setattr(jpegcrop, "AVAILABLE", False)
    return request.param


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_jpeg_gray_is_libjpegs_grayscale(path, jpeg_path):
    data = path.read_bytes()
    gray = dec.decode(data, channels=1)
    assert gray.ndim == 2 and gray.dtype == np.uint8
    assert np.array_equal(gray, _pillow_gray(data))


def test_jpeg_gray_against_pillows_convert_l_of_rgb():
    """The stated difference from Pillow's ``convert("L")`` (BT.601 luma of decoded RGB)."""
    diffs = []
    for path in CORPUS:
        data = path.read_bytes()
        luma = np.asarray(Image.open(io.BytesIO(data)).convert("L")).astype(int)
        diffs.append(np.abs(dec.decode(data, channels=1).astype(int) - luma).ravel())
    every = np.concatenate(diffs)
    assert every.mean() < 0.1 and np.percentile(every, 99.9) <= 4 and every.max() <= 16
    assert every.max() > 0  # not the same thing: a test that the Y plane is what is returned


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_jpeg_gray_window_scale_and_orientation(orientation, jpeg_path):
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encode(Image.fromarray(_photo(160, 240)), "JPEG", quality=90, exif=exif)
    full = _pillow_gray(data)
    info = dec.probe(data)
    box = (13, 21, 70, 90)  # displayed coordinates
    window = dec.decode(data, info, box=box, channels=1)
    assert np.array_equal(window, full[13:83, 21:111])
    small = dec.decode(data, info, box=box, min_size=(30, 40), channels=1)  # DCT scale 1/2
    im = Image.open(io.BytesIO(data))
    im.draft("L", (120, 80))  # libjpeg's gray at 1/2 scale, through Pillow
    half = np.asarray(ImageOps.exif_transpose(im.convert("L")))
    assert np.array_equal(small, half[6:42, 10:56])  # floor(13/2):ceil(83/2), floor(21/2):...


def test_cmyk_jpeg_gray_and_rgba():
    """A CMYK JPEG (which the C extension refuses) goes to simplejpeg: its gray is within 2
    levels of Pillow's ``convert("L")``; its RGBA is the RGB decode, opaque."""
    data = _encode(Image.fromarray(_photo()).convert("CMYK"), "JPEG", quality=90)
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    luma = np.asarray(Image.open(io.BytesIO(data)).convert("L")).astype(int)
    assert np.abs(dec.decode(data, channels=1).astype(int) - luma).max() <= 2
    rgba = dec.decode(data, channels=4)
    assert np.array_equal(rgba[..., :3], dec.decode(data)) and (rgba[..., 3] == 255).all()
    assert np.abs(rgba[..., :3].astype(int) - rgb).max() <= 2


def test_jpeg_rgba_is_the_rgb_crop_window_decode_with_alpha_255(jpeg_path):
    data = _encode(Image.fromarray(_photo(160, 240)), "JPEG", quality=90)
    info = dec.probe(data)
    box = (10, 30, 120, 160)
    rgb = dec.decode(data, info, box=box, min_size=(30, 40))
    rgba = dec.decode(data, info, box=box, min_size=(30, 40), channels=4)
    assert rgba.shape == (*rgb.shape[:2], 4) and rgb.shape[:2] == (31, 41)  # 1/4 scale kept
    assert np.array_equal(rgba[..., :3], rgb) and (rgba[..., 3] == 255).all()


def _pngs() -> dict[str, bytes]:
    rgb = _photo(20, 30)
    a = np.random.default_rng(1).integers(0, 256, (20, 30), np.uint8)
    pal = Image.fromarray(rgb).quantize(16)
    key = tuple(int(v) for v in rgb[0, 0])
    return {
        "RGBA": _encode(Image.fromarray(np.dstack([rgb, a]), "RGBA"), "PNG"),
        "RGB": _encode(Image.fromarray(rgb), "PNG"),
        "L": _encode(Image.fromarray(a), "PNG"),
        "LA": _encode(Image.fromarray(np.dstack([a, a[::-1]]), "LA"), "PNG"),
        "P": _encode(pal, "PNG"),
        "P+tRNS": _encode(pal, "PNG", transparency=3),
        "RGB+tRNS": _encode(Image.fromarray(rgb), "PNG", transparency=key),
        "L+tRNS": _encode(Image.fromarray(a), "PNG", transparency=int(a[0, 0])),
        "1-bit": _encode(Image.fromarray(a > 128), "PNG"),
        "webp-lossless": _encode(
            Image.fromarray(np.dstack([rgb, a]), "RGBA"), "WEBP", lossless=True
        ),
        "webp-lossy-alpha": _encode(Image.fromarray(np.dstack([rgb, a]), "RGBA"), "WEBP"),
        "webp-rgb": _encode(Image.fromarray(rgb), "WEBP"),
        "gif": _encode(pal, "GIF", transparency=3),
    }


@pytest.mark.parametrize("kind", list(_pngs()))
def test_rgba_equals_pillows_convert_rgba(kind):
    data = _pngs()[kind]
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))
    assert np.array_equal(dec.decode(data, channels=4), want)
    assert np.array_equal(dec.decode(data, box=(3, 4, 10, 12), channels=4), want[3:13, 4:16])


def test_rgba_16_bit_is_scaled_like_rgb_and_orientation_applies():
    wide = (np.arange(20 * 30, dtype=np.uint16).reshape(20, 30) * 109).astype(np.uint16)
    data = _encode(Image.fromarray(wide), "PNG")  # 16-bit gray: Pillow's convert would clip
    rgba = dec.decode(data, channels=4)
    assert (
        np.array_equal(rgba[..., 0], (wide >> 8).astype(np.uint8)) and (rgba[..., 3] == 255).all()
    )
    assert np.array_equal(rgba[..., :3], dec.decode(data))  # the same 8 bits as the RGB path
    rgb16 = np.dstack([wide, wide[::-1], wide[:, ::-1], wide // 2 + 7]).astype(np.uint16)
    ok, enc = cv2.imencode(".png", cv2.cvtColor(rgb16, cv2.COLOR_RGBA2BGRA))
    assert np.array_equal(dec.decode(enc.tobytes(), channels=4), (rgb16 >> 8).astype(np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    rgba8 = np.dstack([_photo(20, 30), np.arange(600, dtype=np.uint8).reshape(20, 30)])
    data = _encode(Image.fromarray(rgba8, "RGBA"), "PNG", exif=exif)
    want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGBA"))
    assert want.shape == (30, 20, 4) and np.array_equal(dec.decode(data, channels=4), want)


def test_channels_argument_is_checked():
    with pytest.raises(ValueError, match="channels=2"):
        dec.decode(CORPUS[0].read_bytes(), channels=2)


@pytest.mark.timeout(120)
def test_loader_color_modes_through_the_fast_paths(tmp_path):
    """End to end in a worker process: grayscale JPEGs are libjpeg's gray (not luma of RGB);
    RGBA PNGs and WebPs keep their alpha; a JPEG is opaque."""
    jpgs = []
    for i in range(4):
        path = tmp_path / f"{i}.jpg"
        path.write_bytes(_encode(Image.fromarray(_photo(48, 64, seed=i)), "JPEG", quality=85))
        jpgs.append(path)
    kw = dict(image_size=(48, 64), augment=None, shuffle=False, batch_size=4, workers=1)
    with stoker.Loader(paths=jpgs, color_mode="grayscale", **kw) as gray:
        x1, _ = next(iter(gray))
    want = np.stack([_pillow_gray(p.read_bytes()) for p in jpgs])
    assert x1.shape == (4, 48, 64, 1) and np.array_equal(x1[..., 0], want)
    rgba = np.dstack(
        [_photo(48, 64), np.random.default_rng(3).integers(0, 256, (48, 64), np.uint8)]
    )
    files = {
        "a.png": _encode(Image.fromarray(rgba, "RGBA"), "PNG"),
        "b.webp": _encode(Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True),
        "c.jpg": jpgs[0].read_bytes(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with stoker.Loader(
        paths=[tmp_path / n for n in files], color_mode="rgba", **{**kw, "batch_size": 3}
    ) as four:
        x4, _ = next(iter(four))
    webp = np.asarray(Image.open(tmp_path / "b.webp").convert("RGBA"))  # colour under alpha 0
    assert np.array_equal(x4[0], rgba) and np.array_equal(x4[1], webp)  # may be zeroed
    assert np.array_equal(x4[2][..., :3], np.asarray(Image.open(jpgs[0]).convert("RGB")))
    assert (x4[2][..., 3] == 255).all()

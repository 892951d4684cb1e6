"""Every other format right, with Pillow as the reference (findings 5-9 of issue 11).

The files are made here: APNG (default image outside and inside the animation), EXIF- and
XMP-oriented PNG, WebP and TIFF, hand-written BMP header variants and bit depths, TIFF alpha
kinds and CIELab, and GIFs OpenCV rejects.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from reference import encode, pillow_rgb
from stoker.decode import decode, probe

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def _picture(height: int = 12, width: int = 20) -> Image.Image:
    """An asymmetric picture: every orientation gives a different array."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 12, y * 20, (x * y) % 256], axis=-1).astype(np.uint8)
    rgb[:3, :5] = RED
    return Image.fromarray(rgb)


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _xmp(orientation: int) -> bytes:
    return (
        b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/'
        b'22-rdf-syntax-ns#"><rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" '
        b'tiff:Orientation="%d"/></rdf:RDF></x:xmpmeta>' % orientation
    )


def _check(data: bytes, box: tuple[int, int, int, int] | None = (2, 3, 5, 7)) -> None:
    """stoker's decode (whole, and a box of it) equals Pillow's, shape and pixels."""
    ref = pillow_rgb(data)
    info = probe(data)
    assert (info.height, info.width) == ref.shape[:2]
    np.testing.assert_array_equal(decode(data, info), ref)
    if box is not None:
        top, left, h, w = box
        np.testing.assert_array_equal(
            decode(data, info, box=box), ref[top : top + h, left : left + w]
        )


# ------------------------------------------------------------------ finding 5: APNG


def test_apng_gives_its_default_image() -> None:
    """The default image (IDAT) is red, the animation green and blue: red comes out."""
    frames = [Image.new("RGB", (20, 12), c) for c in (GREEN, BLUE)]
    data = encode(
        Image.new("RGB", (20, 12), RED),
        "PNG",
        save_all=True,
        append_images=frames,
        default_image=True,
    )
    assert decode(data)[0, 0].tolist() == list(RED)
    _check(data)


def test_apng_whose_default_image_is_the_first_frame() -> None:
    frames = [Image.new("RGB", (20, 12), c) for c in (GREEN, BLUE)]
    data = encode(_picture(), "PNG", save_all=True, append_images=frames)
    _check(data)


# ------------------------------------------------------------------ finding 6: orientation


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "TIFF"])
def test_exif_orientation(fmt: str, orientation: int) -> None:
    options = {"lossless": True} if fmt == "WEBP" else {}
    data = encode(_picture(), fmt, exif=_exif(orientation), **options)
    assert probe(data).orientation == orientation
    _check(data)


@pytest.mark.parametrize("orientation", [3, 6, 8])
@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "JPEG"])
def test_xmp_orientation(fmt: str, orientation: int) -> None:
    if fmt == "PNG":
        text = PngImagePlugin.PngInfo()
        text.add_itxt("XML:com.adobe.xmp", _xmp(orientation).decode())
        data = encode(_picture(), fmt, pnginfo=text)
    else:
        options = {"lossless": True} if fmt == "WEBP" else {"quality": 95}
        data = encode(_picture(), fmt, xmp=_xmp(orientation), **options)
    assert probe(data).orientation == orientation
    if fmt == "JPEG":
        ref = pillow_rgb(data)
        got = decode(data)
        assert got.shape == ref.shape and np.abs(got.astype(int) - ref).mean() < 1.0
    else:
        _check(data)


def test_exif_wins_over_xmp() -> None:
    data = encode(_picture(), "WEBP", lossless=True, exif=_exif(6), xmp=_xmp(3))
    assert probe(data).orientation == 6
    _check(data)


# ------------------------------------------------------------------ finding 7: BMP


def _bmp(
    width: int,
    height: int,
    bpp: int,
    pixels: bytes,
    *,
    header: int = 40,
    compression: int = 0,
    masks: bytes = b"",
    palette: bytes = b"",
    colors: int | None = None,
) -> bytes:
    """A hand-written BMP: file header, a ``header``-byte info header, palette, pixels."""
    count = len(palette) // 4 if colors is None else colors
    info = (
        struct.pack(
            "<IiiHHIIiiII",
            header,
            width,
            height,
            1,
            bpp,
            compression,
            len(pixels),
            2835,
            2835,
            count,
            0,
        )
        + masks
    )
    info += bytes(max(0, header - len(info)))  # a 40-byte header has its masks after it
    offset = 14 + len(info) + len(palette)
    size = offset + len(pixels)
    return b"BM" + struct.pack("<IHHI", size, 0, 0, offset) + info + palette + pixels


_RGB555 = struct.pack("<4H", 0x7FFF, 0x7C00, 0x03E0, 0x001F) * 2
_RGB565 = struct.pack("<4H", 0xFFFF, 0xF800, 0x07E0, 0x001F) * 2
_MASKS565 = struct.pack("<III", 0xF800, 0x07E0, 0x001F)
_PALETTE = bytes([0, 0, 255, 0, 0, 255, 0, 0, 255, 0, 0, 0, 9, 9, 9, 0])  # BGRx: red green blue

BMPS = {
    "16bit_555": _bmp(4, 2, 16, _RGB555),
    "16bit_565_bitfields": _bmp(4, 2, 16, _RGB565, compression=3, masks=_MASKS565),
    "16bit_565_v2_header": _bmp(4, 2, 16, _RGB565, header=52, compression=3, masks=_MASKS565),
    "32bit_v3_header_alpha_mask": _bmp(
        4,
        2,
        32,
        struct.pack("<4I", 0x80FF8040, 0x80FF0000, 0x8000FF00, 0x800000FF) * 2,
        header=56,
        compression=3,
        masks=struct.pack("<IIII", 0xFF0000, 0xFF00, 0xFF, 0xFF << 24),
    ),
    "palette_larger_than_stored": _bmp(
        4, 2, 8, bytes([0, 1, 2, 3]) * 2, palette=_PALETTE, colors=256
    ),
    "palette_count_16_of_4": _bmp(4, 2, 8, bytes([0, 1, 2, 3]) * 2, palette=_PALETTE, colors=16),
    "24bit_v5_header": _bmp(4, 2, 24, bytes([0, 0, 255] * 4) * 2, header=124),
    "top_down": _bmp(4, -2, 24, bytes([0, 0, 255] * 4 + [255, 0, 0] * 4)),
}


@pytest.mark.parametrize("name", sorted(BMPS))
def test_bmp_variants_match_pillow(name: str) -> None:
    _check(BMPS[name], box=(0, 1, 2, 2))


def test_16bit_bmp_white_is_255() -> None:
    assert decode(BMPS["16bit_555"])[0].tolist() == [[255] * 3, list(RED), list(GREEN), list(BLUE)]


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "RGBA"])
def test_bmp_bit_depths_pillow_writes(mode: str) -> None:
    _check(encode(_picture().convert(mode), "BMP"))


# ------------------------------------------------------------------ finding 8: TIFF


def test_tiff_unassociated_alpha_is_not_premultiplied() -> None:
    rgba = np.zeros((12, 20, 4), np.uint8)
    rgba[..., :3] = (200, 100, 50)
    rgba[..., 3] = 128
    data = encode(Image.fromarray(rgba, "RGBA"), "TIFF")
    assert decode(data)[0, 0].tolist() == [200, 100, 50]
    _check(data)


def test_tiff_associated_alpha_is_unpremultiplied() -> None:
    """ExtraSamples = 1 (associated alpha): the stored colours are premultiplied; Pillow (and
    stoker) give them back un-premultiplied."""
    rgba = np.zeros((12, 20, 4), np.uint8)
    rgba[..., :3] = (100, 50, 25)
    rgba[..., 3] = 128
    data = bytearray(encode(Image.fromarray(rgba, "RGBA"), "TIFF"))
    ifd = struct.unpack_from("<I", data, 4)[0]
    for entry in range(ifd + 2, ifd + 2 + 12 * struct.unpack_from("<H", data, ifd)[0], 12):
        if struct.unpack_from("<H", data, entry)[0] == 338:  # ExtraSamples: 2 -> 1
            struct.pack_into("<H", data, entry + 8, 1)
    assert decode(bytes(data))[0, 0].tolist() == [199, 99, 49]
    _check(bytes(data))


@pytest.mark.parametrize("compression", [None, "tiff_lzw", "tiff_adobe_deflate", "packbits"])
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "CMYK"])
def test_tiff_kinds_match_pillow(mode: str, compression: str | None) -> None:
    data = encode(_picture().convert(mode), "TIFF", compression=compression)
    np.testing.assert_array_equal(decode(data), pillow_rgb(data))


def test_16bit_tiff_is_scaled_not_clipped() -> None:
    gray = np.asarray(_picture().convert("L"))
    data = encode(Image.fromarray(gray.astype(np.uint16) * 257), "TIFF")
    np.testing.assert_array_equal(decode(data), np.repeat(gray[..., None], 3, axis=2))


def test_tiff_cielab_converts_to_rgb() -> None:
    colours = np.array([[(255, 255, 255), (128, 128, 128), (0, 0, 0), RED, GREEN, BLUE]], np.uint8)
    data = encode(Image.fromarray(colours).convert("LAB"), "TIFF")
    got = decode(data).astype(int)
    assert np.abs(got[0, :3] - colours[0, :3]).max() <= 2  # white, grey, black
    assert np.abs(got[0, 3:] - colours[0, 3:]).max() <= 25  # primaries, through 8-bit Lab
    assert np.argmax(got[0, 3:], axis=1).tolist() == [0, 1, 2]


# ------------------------------------------------------------------ finding 9: GIF


def _gif(background: int = 0, palette: bool = True) -> bytes:
    im = Image.new("P", (20, 12))
    im.putpalette([*RED, *GREEN, *BLUE, 9, 9, 9])
    im.putdata([(x // 5) % 4 for _ in range(12) for x in range(20)])
    data = bytearray(encode(im, "GIF"))
    data[11] = background
    if not palette:  # drop the global colour table: Pillow reads the indices as grey
        size = 3 << ((data[10] & 7) + 1)
        data[10] &= 0x7F
        del data[13 : 13 + size]
    return bytes(data)


@pytest.mark.parametrize(
    "data",
    [_gif(), _gif(background=200), _gif(palette=False), encode(_picture(), "GIF")],
    ids=["plain", "background_outside_palette", "no_palette", "picture"],
)
def test_gifs_match_pillow(data: bytes) -> None:
    _check(data)


def test_animated_gif_and_webp_give_the_first_frame() -> None:
    frames = [Image.new("RGB", (20, 12), c) for c in (GREEN, BLUE)]
    for fmt, options in (("GIF", {}), ("WEBP", {"lossless": True})):
        data = encode(
            Image.new("RGB", (20, 12), RED), fmt, save_all=True, append_images=frames, **options
        )
        assert decode(data)[5, 5].tolist() == list(RED)


def test_damaged_apng_never_reaches_opencv() -> None:
    """Fuzzed APNGs (tests/corpus/fuzz) on which OpenCV 5's APNG reader crashes the process:
    decode() and decode_mask() send animated PNGs to Pillow, and say why it cannot be read."""
    folder = os.path.join(os.path.dirname(__file__), "corpus", "fuzz")
    code = (
        "import glob\n"
        "from stoker.decode import decode, decode_mask\n"
        "from stoker.errors import DecodeError\n"
        f"for path in sorted(glob.glob({folder!r} + '/apng-*.png')):\n"
        "    data = open(path, 'rb').read()\n"
        "    for call in (decode, decode_mask):\n"
        "        try:\n"
        "            call(data)\n"
        "        except DecodeError:\n"
        "            pass\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, (out.returncode, out.stderr[-500:])

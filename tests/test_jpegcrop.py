"""Tests for stoker.decode.jpegcrop and its C extension stoker.decode._jpeg (crop-window decode).

Reference: a crop-window decode must equal the same window of a full decode. We check it
*exactly* against (a) a full-image decode by the same extension (same libjpeg-turbo, same
settings) and (b) simplejpeg's full decode, which bundles its own libjpeg-turbo: the
accurate ("islow") and fast ("ifast") integer IDCTs and the upsamplers are integer
algorithms that libjpeg-turbo keeps bit-identical across versions and SIMD paths, so no
tolerance is needed. Exactness at the window's left/right edges depends on the extension
asking libjpeg for one spare column on each side (libjpeg's "fancy" chroma upsampling
treats the edges of a cropped window as image edges); the odd-box tests catch a
regression there.
"""

from __future__ import annotations

import functools
import io
import subprocess
import sys
import threading

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from stoker.decode import jpegcrop
from stoker.decode.jpegcrop import decode_region, pick_denom, scaled_region

needs_ext = pytest.mark.skipif(not jpegcrop.AVAILABLE, reason="stoker.decode._jpeg is not built")

# --------------------------------------------------------------------------- test images


def _pixels(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise: every channel and chroma edge gets exercised."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack(
        [(x * 7 + y * 3) % 256, (x * x // 5 + y) % 256, rng.integers(0, 256, (height, width))],
        axis=-1,
    )
    return image.astype(np.uint8)


@functools.cache
def _jpeg(kind: str, height: int = 333, width: int = 517) -> bytes:
    """A JPEG of ``kind``: 420, 422, 444, 411, 440, gray, progressive, restart, cmyk."""
    image = _pixels(height, width)
    buf = io.BytesIO()
    if kind in ("411", "440"):  # 4:1:1 has the widest iMCU (32 px): the most row padding
        return simplejpeg.encode_jpeg(image, quality=90, colorsubsampling=kind)
    if kind == "restart":  # restart marker every MCU row, via OpenCV's libjpeg
        ok, enc = cv2.imencode(
            ".jpg",
            image[..., ::-1],
            [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_RST_INTERVAL, 3],
        )
        assert ok and b"\xff\xdd" in enc.tobytes()  # DRI present
        return enc.tobytes()
    pil = Image.fromarray(image)
    if kind == "gray":
        pil.convert("L").save(buf, "JPEG", quality=90)
    elif kind == "cmyk":
        pil.convert("CMYK").save(buf, "JPEG", quality=90)
    elif kind == "progressive":
        pil.save(buf, "JPEG", quality=90, progressive=True, subsampling=2)
    else:
        subsampling = {"444": 0, "422": 1, "420": 2}[kind]
        pil.save(buf, "JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


KINDS = ["420", "422", "444", "411", "440", "gray", "progressive", "restart"]


def _raw(
    data: bytes, box: tuple[int, ...], denom: int, fast: bool, channels: int = 3
) -> np.ndarray:
    """The C function's window, viewed in the padded rows it wrote (checks the row layout)."""
    height, width = jpegcrop.header(data)[:2]
    _, _, out_h, out_w = scaled_region(*box, height, width, denom)
    buf = np.empty(out_h * (out_w + jpegcrop.ROW_SLACK) * channels, np.uint8)
    got_h, got_w, skip, pitch, _, _ = jpegcrop._jpeg.decode_region(
        data, *box, denom, fast, buf, channels
    )
    assert (got_h, got_w) == (out_h, out_w)
    assert skip + out_w <= pitch <= out_w + jpegcrop.ROW_SLACK
    rows = buf[: out_h * pitch * channels].reshape(out_h, pitch, channels)
    return rows[:, skip : skip + out_w]


def _full_scaled(data: bytes, denom: int, fast: bool) -> np.ndarray:
    height, width = jpegcrop.header(data)[:2]
    return _raw(data, (0, 0, height, width), denom, fast)


def _simplejpeg_full(data: bytes, denom: int, fast: bool, colorspace: str = "RGB") -> np.ndarray:
    """simplejpeg's full decode at 1/denom (min_height/min_width select the scale)."""
    height, width = jpegcrop.header(data)[:2]
    return simplejpeg.decode_jpeg(
        data,
        colorspace=colorspace,
        fastdct=fast,
        fastupsample=fast,
        min_height=-(-height // denom),
        min_width=-(-width // denom),
    )


def _boxes(height: int, width: int, count: int, seed: int) -> list[tuple[int, int, int, int]]:
    """Random boxes plus the awkward ones: 1-pixel, edges, corners, full rows/columns."""
    rng = np.random.default_rng(seed)
    boxes = [
        (0, 0, height, width),
        (0, 0, 1, 1),
        (height - 1, width - 1, 1, 1),
        (0, width - 1, height, 1),
        (height - 1, 0, 1, width),
        (7, 15, 1, 1),  # just left of an iMCU boundary
        (8, 16, 1, 1),  # on an iMCU boundary
        (15, 17, 3, 2),
        (height // 2, 16, 5, width - 16),
        (1, 1, height - 2, width - 2),
    ]
    boxes = [
        (t, x, h, w)
        for t, x, h, w in boxes
        if min(t, x) >= 0 and min(h, w) > 0 and t + h <= height and x + w <= width
    ]
    for _ in range(count):
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        boxes.append(
            (
                top,
                left,
                int(rng.integers(1, height - top + 1)),
                int(rng.integers(1, width - left + 1)),
            )
        )
    return boxes


# --------------------------------------------------------------------------- pure Python


def test_scaled_region_examples() -> None:
    assert scaled_region(0, 0, 333, 517, 333, 517, 1) == (0, 0, 333, 517)
    assert scaled_region(0, 0, 333, 517, 333, 517, 8) == (0, 0, 42, 65)  # ceil(333/8), ceil(517/8)
    assert scaled_region(3, 5, 1, 1, 333, 517, 2) == (1, 2, 1, 1)
    assert scaled_region(3, 5, 2, 2, 333, 517, 2) == (1, 2, 2, 2)  # rows 3-4 -> scaled rows 1-2
    assert scaled_region(332, 516, 1, 1, 333, 517, 8) == (41, 64, 1, 1)
    assert scaled_region(100, 40, 224, 224, 333, 517, 4) == (25, 10, 56, 56)


@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_scaled_region_covers_the_box(denom: int) -> None:
    """The window is the smallest scaled window covering the box, inside the scaled image."""
    height, width = 333, 517
    for top, left, h, w in _boxes(height, width, 300, seed=denom):
        y0, x0, out_h, out_w = scaled_region(top, left, h, w, height, width, denom)
        assert y0 * denom <= top < (y0 + 1) * denom
        assert x0 * denom <= left < (x0 + 1) * denom
        assert (y0 + out_h) * denom >= top + h or y0 + out_h == -(-height // denom)
        assert (y0 + out_h - 1) * denom < top + h
        assert (x0 + out_w - 1) * denom < left + w
        assert 0 < out_h and y0 + out_h <= -(-height // denom)
        assert 0 < out_w and x0 + out_w <= -(-width // denom)


@pytest.mark.parametrize(
    "box", [(-1, 0, 5, 5), (0, 0, 0, 5), (0, 0, 5, -1), (330, 0, 4, 5), (0, 510, 5, 8)]
)
def test_scaled_region_rejects_bad_boxes(box: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError):
        scaled_region(*box, 333, 517, 1)


def test_scaled_region_rejects_bad_denom() -> None:
    with pytest.raises(ValueError, match="denom"):
        scaled_region(0, 0, 5, 5, 333, 517, 3)


def test_pick_denom() -> None:
    assert pick_denom(2000, 2000, 224, 224) == 8
    assert pick_denom(1792, 1792, 224, 224) == 8
    assert pick_denom(1791, 1792, 224, 224) == 4
    assert pick_denom(500, 1000, 224, 224) == 2
    assert pick_denom(447, 1000, 224, 224) == 1
    assert pick_denom(100, 100, 224, 224) == 1
    assert pick_denom(64, 64, 0, 0) == 8  # minimums below 1 count as 1
    assert pick_denom(3, 3, 1, 1) == 2


def test_pick_denom_keeps_min_size() -> None:
    rng = np.random.default_rng(1)
    for _ in range(500):
        img_h, img_w = (int(v) for v in rng.integers(1, 3000, 2))
        top, left = int(rng.integers(0, img_h)), int(rng.integers(0, img_w))
        h, w = int(rng.integers(1, img_h - top + 1)), int(rng.integers(1, img_w - left + 1))
        min_h, min_w = (int(v) for v in rng.integers(1, 300, 2))
        denom = pick_denom(h, w, min_h, min_w)
        out_h, out_w = scaled_region(top, left, h, w, img_h, img_w, denom)[2:]
        if denom > 1:
            assert out_h >= min_h and out_w >= min_w
            assert pick_denom(h, w, min_h, min_w) in (2, 4, 8)


def test_import_without_extension_degrades() -> None:
    """With stoker.decode._jpeg unimportable, jpegcrop still imports and says why it cannot."""
    code = (
        "import sys; sys.modules['stoker.decode._jpeg'] = None\n"
        "from stoker.decode import jpegcrop\n"
        "assert jpegcrop.AVAILABLE is False\n"
        "assert jpegcrop.pick_denom(1000, 1000, 224, 224) == 4\n"
        "try:\n"
        "    jpegcrop.decode_region(b'x', (0, 0, 1, 1))\n"
        "except RuntimeError as exc:\n"
        "    assert 'libjpeg' in str(exc)\n"
        "else:\n"
        "    raise SystemExit('no RuntimeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- header


@needs_ext
@pytest.mark.parametrize("kind", KINDS + ["cmyk"])
def test_header(kind: str) -> None:
    data = _jpeg(kind)
    height, width, components, colorspace = jpegcrop.header(data)
    assert (height, width) == (333, 517)
    sj = simplejpeg.decode_jpeg_header(data)
    assert (height, width) == sj[:2]
    expected = {"gray": (1, 1), "cmyk": (4, 4)}.get(kind, (3, 3))  # (components, JCS_*)
    assert (components, colorspace) == expected


# --------------------------------------------------------------------------- exactness


@needs_ext
@pytest.mark.parametrize("fast", [False, True], ids=["accurate", "fast"])
@pytest.mark.parametrize("kind", KINDS)
def test_full_decode_matches_simplejpeg(kind: str, fast: bool) -> None:
    data = _jpeg(kind)
    for denom in (1, 2, 4, 8):
        ours = _full_scaled(data, denom, fast)
        np.testing.assert_array_equal(ours, _simplejpeg_full(data, denom, fast))


@needs_ext
@pytest.mark.parametrize("fast", [False, True], ids=["accurate", "fast"])
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_region_equals_window_of_full_decode(kind: str, denom: int, fast: bool) -> None:
    data = _jpeg(kind)
    height, width = 333, 517
    full = _full_scaled(data, denom, fast)
    reference = _simplejpeg_full(data, denom, fast)
    for box in _boxes(height, width, 60, seed=denom):
        y0, x0, out_h, out_w = scaled_region(*box, height, width, denom)
        out = _raw(data, box, denom, fast)
        window = full[y0 : y0 + out_h, x0 : x0 + out_w]
        assert np.array_equal(out, window), f"box {box} at 1/{denom}"
        assert np.array_equal(out, reference[y0 : y0 + out_h, x0 : x0 + out_w])


@needs_ext
@pytest.mark.parametrize("size", [(1, 1), (7, 9), (16, 16), (17, 33), (517, 333)])
def test_odd_and_tiny_sizes(size: tuple[int, int]) -> None:
    height, width = size
    for kind in ("420", "444"):
        data = _jpeg(kind, height, width)
        for denom in (1, 2, 8):
            full = _simplejpeg_full(data, denom, False)
            for box in _boxes(height, width, 10, seed=height):
                y0, x0, out_h, out_w = scaled_region(*box, height, width, denom)
                out = _raw(data, box, denom, False)
                np.testing.assert_array_equal(out, full[y0 : y0 + out_h, x0 : x0 + out_w])


@needs_ext
@pytest.mark.parametrize("fast", [False, True], ids=["accurate", "fast"])
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["420", "444", "411", "gray", "progressive", "restart"])
def test_gray_output_is_libjpegs_grayscale_in_every_window(kind, denom, fast) -> None:
    """channels=1 asks libjpeg for grayscale output (a YCbCr file's Y plane, no chroma work):
    every window equals the same window of simplejpeg's (own libjpeg-turbo) GRAY decode at the
    same scale, exactly; at full scale also Pillow's ``draft("L")`` decode (libjpeg's gray)."""
    data = _jpeg(kind)
    height, width = 333, 517
    reference = _simplejpeg_full(data, denom, fast, "GRAY")[:, :, 0]
    if denom == 1 and not fast:
        pil = Image.open(io.BytesIO(data))
        pil.draft("L", None)
        assert np.array_equal(reference, np.asarray(pil.convert("L")))
    for box in _boxes(height, width, 25, seed=denom):
        y0, x0, out_h, out_w = scaled_region(*box, height, width, denom)
        out = _raw(data, box, denom, fast, channels=1)
        assert out.shape == (out_h, out_w, 1)
        assert np.array_equal(out[:, :, 0], reference[y0 : y0 + out_h, x0 : x0 + out_w]), box
    whole = decode_region(data, (5, 6, 70, 80), channels=1)  # the wrapper: a (h, w) view
    assert whole.shape == (70, 80)
    assert np.array_equal(whole, _raw(data, (5, 6, 70, 80), 1, False, 1)[:, :, 0])


@needs_ext
def test_gray_output_refuses_other_channel_counts() -> None:
    buf = np.empty(64 * 64 * 4, np.uint8)
    with pytest.raises(ValueError, match="channels must be 1 or 3"):
        jpegcrop._jpeg.decode_region(_jpeg("420"), 0, 0, 8, 8, 1, False, buf, 4)
    with pytest.raises(ValueError, match=r"rows of \d+ x 3"):  # the buffer check counts channels
        jpegcrop._jpeg.decode_region(_jpeg("420"), 0, 0, 8, 8, 1, False, buf[:40], 3)


@needs_ext
def test_grayscale_matches_pillow() -> None:
    data = _jpeg("gray")
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    got = decode_region(data, (10, 20, 100, 200))
    np.testing.assert_array_equal(got, expected[10:110, 20:220])
    assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()


# --------------------------------------------------------------------------- wrapper


@needs_ext
def test_decode_region_wrapper() -> None:
    data = _jpeg("420")
    full = _simplejpeg_full(data, 1, False)
    whole = decode_region(data)
    assert whole.shape == (333, 517, 3) and whole.dtype == np.uint8 and whole.flags.c_contiguous
    np.testing.assert_array_equal(whole, full)
    np.testing.assert_array_equal(decode_region(data, (5, 6, 70, 80)), full[5:75, 6:86])
    np.testing.assert_array_equal(
        decode_region(data, (5, 6, 70, 80), image_size=(333, 517)), full[5:75, 6:86]
    )
    # min_size picks the scale: a 300x400 box holds (64, 64) 4 times but not 8 times
    box = (10, 20, 300, 400)
    denom = pick_denom(300, 400, 64, 64)
    assert denom == 4
    y0, x0, out_h, out_w = scaled_region(*box, 333, 517, denom)
    scaled = decode_region(data, box, min_size=(64, 64))
    assert scaled.shape == (out_h, out_w, 3) and out_h >= 64 and out_w >= 64
    np.testing.assert_array_equal(
        scaled, _simplejpeg_full(data, denom, False)[y0 : y0 + out_h, x0 : x0 + out_w]
    )
    fast = decode_region(data, box, min_size=(64, 64), fast=True)
    assert fast.shape == scaled.shape
    assert np.abs(fast.astype(int) - scaled).mean() < 4  # fast IDCT: close, not equal


@needs_ext
def test_wrong_image_size_is_caught() -> None:
    data = _jpeg("420")
    with pytest.raises(ValueError):
        decode_region(data, (300, 0, 100, 10), image_size=(400, 517))  # region past the end
    with pytest.raises(ValueError):
        decode_region(data, (0, 500, 10, 30), image_size=(333, 530))


@needs_ext
@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, "readonly_numpy", "slice"])
def test_accepts_any_bytes_like(wrap: object) -> None:
    data = _jpeg("444")
    if wrap == "readonly_numpy":
        array = np.frombuffer(data, np.uint8)
        assert not array.flags.writeable
        source: object = array
    elif wrap == "slice":
        source = memoryview(b"xx" + data + b"yy")[2:-2]
    else:
        source = wrap(data)  # type: ignore[operator]
    np.testing.assert_array_equal(
        decode_region(source, (3, 4, 50, 60)), _simplejpeg_full(data, 1, False)[3:53, 4:64]
    )


@needs_ext
def test_output_buffer_checks() -> None:
    data = _jpeg("420")
    lib = jpegcrop._jpeg
    with pytest.raises(ValueError, match="output buffer"):
        lib.decode_region(data, 0, 0, 10, 10, 1, False, np.empty((10, 9, 3), np.uint8))
    with pytest.raises((TypeError, BufferError)):
        lib.decode_region(data, 0, 0, 10, 10, 1, False, np.empty((10, 10, 3), np.uint8)[:, ::-1])
    with pytest.raises(TypeError):
        lib.decode_region(data, 0, 0, 10, 10, 1, False, bytes(300))  # read-only
    big = np.full((20, 20, 3), 7, np.uint8)  # larger than needed: only the prefix is written
    out_h, out_w, skip, pitch, _, _ = lib.decode_region(data, 0, 0, 10, 10, 1, False, big)
    assert (out_h, out_w, skip) == (10, 10, 0) and pitch == 11  # one spare column on the right
    assert (big.reshape(-1)[10 * pitch * 3 :] == 7).all()


@needs_ext
@pytest.mark.parametrize(
    "args",
    [
        (0, 0, 10, 10, 3),
        (-1, 0, 10, 10, 1),
        (0, 0, 0, 10, 1),
        (330, 0, 10, 10, 1),
        (0, 510, 1, 8, 1),
    ],
)
def test_bad_arguments(args: tuple[int, ...]) -> None:
    top, left, height, width, denom = args
    out = np.empty((64, 64, 3), np.uint8)
    with pytest.raises(ValueError):
        jpegcrop._jpeg.decode_region(_jpeg("420"), top, left, height, width, denom, False, out)


# --------------------------------------------------------------------------- bad data


def _truncations(data: bytes) -> list[bytes]:
    return [data[: len(data) // 2], data[: len(data) - 10], data[:-2]]


@needs_ext
@pytest.mark.parametrize("kind", ["420", "progressive", "restart"])
def test_truncated_file_raises(kind: str) -> None:
    data = _jpeg(kind)
    for cut in _truncations(data)[:2]:
        with pytest.raises(ValueError, match="(?i)corrupt|premature|end"):
            decode_region(cut)  # the whole image reaches the missing data
        with pytest.raises(ValueError):
            decode_region(cut, (300, 0, 33, 517))  # the bottom rows are missing


@needs_ext
def test_truncated_baseline_above_the_cut_is_exact() -> None:
    """Rows above the damage are decoded (exactly); rows below a window are never read."""
    data = _jpeg("420")
    got = decode_region(data[: len(data) // 2], (0, 0, 32, 517))
    np.testing.assert_array_equal(got, _simplejpeg_full(data, 1, False)[:32])


@needs_ext
def test_missing_eoi_only() -> None:
    """A file cut just before EOI: all pixels present; libjpeg warns -> we raise."""
    with pytest.raises(ValueError):
        decode_region(_jpeg("420")[:-2])


@needs_ext
def test_corrupt_entropy_data_is_a_warning() -> None:
    """A marker inside the scan data is libjpeg's recoverable "premature end of data segment"
    warning: decoded (as Pillow and OpenCV decode it), and reported in ``notes``."""
    data = _jpeg("420")
    mid = len(data) // 2
    damaged = data[:mid] + b"\xff\xd9" + data[mid + 2 :]  # a marker inside the scan data
    notes: list[str] = []
    got = decode_region(damaged, notes=notes)
    assert got.shape == (333, 517, 3)
    assert len(notes) == 1 and "premature end of data segment" in notes[0].lower(), notes


@needs_ext
@pytest.mark.parametrize(
    "data",
    [b"", b"\x00" * 1000, b"\xff\xd8", b"\xff\xd8\xff\xe0" + b"\x00" * 50, b"GIF89a" + bytes(100)],
    ids=["empty", "zeros", "soi-only", "soi-app0-zeros", "gif"],
)
def test_garbage_raises(data: bytes) -> None:
    with pytest.raises(ValueError):
        jpegcrop.header(data)
    with pytest.raises(ValueError):
        jpegcrop._jpeg.decode_region(data, 0, 0, 1, 1, 1, False, bytearray(3))


@needs_ext
def test_random_garbage_never_crashes() -> None:
    rng = np.random.default_rng(3)
    data = _jpeg("420")
    for _ in range(200):
        junk = bytearray(data)
        for pos in rng.integers(200, len(junk), 5):
            junk[pos] = int(rng.integers(0, 256))
        try:
            decode_region(bytes(junk), (10, 10, 200, 300), fast=bool(rng.integers(0, 2)))
        except ValueError:
            pass


@needs_ext
def test_cmyk_is_refused() -> None:
    data = _jpeg("cmyk")
    with pytest.raises(ValueError, match="cmyk"):
        decode_region(data, (0, 0, 10, 10))


# --------------------------------------------------------------------------- threads


@needs_ext
def test_threads_decode_concurrently_and_correctly() -> None:
    """Decoding runs without the GIL: many threads at once must give the same pixels."""
    data = {kind: _jpeg(kind) for kind in ("420", "progressive", "444")}
    jobs = [(kind, box) for kind in data for box in _boxes(333, 517, 20, seed=7)]
    expected = [decode_region(data[kind], box) for kind, box in jobs]
    results: list[list[np.ndarray]] = [[] for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(slot: int) -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(3):
                for kind, box in jobs:
                    results[slot].append(decode_region(data[kind], box))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    for got in results:
        assert len(got) == 3 * len(jobs)
        for i, image in enumerate(got):
            np.testing.assert_array_equal(image, expected[i % len(jobs)])

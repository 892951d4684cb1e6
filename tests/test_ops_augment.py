"""The torchvision-style stock ops (ColorJitter, RandomErasing, TrivialAugmentWide,
RandAugment) against independent references written here from the published definitions.

torchvision's PIL backend *is* PIL (ImageEnhance, ImageOps, Image.transform / rotate), so PIL
is the reference for the enhancements, the lookup-table ops and the geometry; hue follows
torchvision's tensor formulas (float RGB -> HSV -> RGB), written out below in float64.

Tolerances, and why:
- brightness, posterize, solarize, autocontrast, equalize: identical bytes (same tables).
- contrast: at most 1 level (the mean luma is OpenCV's gray, which differs from PIL's "L" by
  one level on a few pixels, and can move the rounded mean by one).
- saturation ("Color"), sharpness: at most 1 level on under 1% of the values (OpenCV's gray
  and its float blend against PIL's, where the exact result sits at an integer).
- hue: at most 1 level from the exact float result (ours rounds; the exact one is not cut to
  8-bit hue as torchvision's PIL path does, which differs from it by several levels).
- translate: identical. shear, rotate: equal except at output pixels whose source coordinate
  lies within 1/256 pixel of a pixel edge (OpenCV's 1/1024-pixel fixed point against PIL's
  float coordinates), which may take the neighbouring source pixel; such pixels are under 3%.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

import stoker
from stoker import imageops as im
from stoker.errors import ConfigError
from stoker.ops import ColorJitter, RandAugment, RandomErasing, TrivialAugmentWide


def photo(h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    """A photo-like RGB image: colour gradients, a few edges and mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x / w * 200 + 30, y / h * 180 + 40, (x + y) / (w + h) * 160 + 60], -1)
    base[h // 3 : h // 2, w // 4 : w // 2] = (230, 40, 90)
    base += rng.normal(0, 12, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


IMG = photo()
GRAY = np.asarray(Image.fromarray(IMG).convert("L"))


def pil(a: np.ndarray) -> Image.Image:
    return Image.fromarray(a)


def arr(p: Image.Image) -> np.ndarray:
    return np.asarray(p)


def diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
    return np.abs(a.astype(np.int16) - b.astype(np.int16))


# ------------------------------------------------------------------- references


def ref_inverse_affine(center, angle, translate, scale, shear):
    """torchvision's ``_get_inverse_affine_matrix`` (the matrix its PIL path hands to
    ``Image.transform``), from its documented formula: M^-1 = C RSS^-1 C^-1 T^-1."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [x / scale for x in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def ref_affine(a: np.ndarray, **kw) -> np.ndarray:
    """torchvision ``F.affine`` on a PIL image (nearest, black fill)."""
    img = pil(a)
    center = kw.pop("center", None)
    if center is None:
        center = [img.size[0] * 0.5, img.size[1] * 0.5]
    matrix = ref_inverse_affine(center, **kw)
    return arr(img.transform(img.size, Image.AFFINE, matrix, Image.NEAREST, fillcolor=0))


def ref_op(a: np.ndarray, name: str, m: float) -> np.ndarray:
    """torchvision's ``_apply_op`` on a PIL image, through PIL."""
    img = pil(a)
    if name == "Identity":
        return a
    if name == "ShearX":
        return ref_affine(
            a,
            angle=0.0,
            translate=[0, 0],
            scale=1.0,
            shear=[math.degrees(math.atan(m)), 0.0],
            center=[0, 0],
        )
    if name == "ShearY":
        return ref_affine(
            a,
            angle=0.0,
            translate=[0, 0],
            scale=1.0,
            shear=[0.0, math.degrees(math.atan(m))],
            center=[0, 0],
        )
    if name == "TranslateX":
        return ref_affine(a, angle=0.0, translate=[int(m), 0], scale=1.0, shear=[0.0, 0.0])
    if name == "TranslateY":
        return ref_affine(a, angle=0.0, translate=[0, int(m)], scale=1.0, shear=[0.0, 0.0])
    if name == "Rotate":
        return arr(img.rotate(m, Image.NEAREST, expand=False, fillcolor=0))
    enhance = {
        "Brightness": ImageEnhance.Brightness,
        "Color": ImageEnhance.Color,
        "Contrast": ImageEnhance.Contrast,
        "Sharpness": ImageEnhance.Sharpness,
    }
    if name in enhance:
        return arr(enhance[name](img).enhance(1.0 + m))
    if name == "Posterize":
        return arr(ImageOps.posterize(img, int(m)))
    if name == "Solarize":
        return arr(ImageOps.solarize(img, m))
    if name == "AutoContrast":
        return arr(ImageOps.autocontrast(img))
    if name == "Equalize":
        return arr(ImageOps.equalize(img))
    raise KeyError(name)


def ref_hue(a: np.ndarray, shift: float) -> np.ndarray:
    """torchvision's tensor ``adjust_hue`` (``_rgb2hsv``, hue + shift mod 1, ``_hsv2rgb``) in
    float64, rounded (not cut to 8-bit hue)."""
    rgb = a.astype(np.float64) / 255.0
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    maxc, minc = rgb.max(-1), rgb.min(-1)
    eqc = maxc == minc
    cr = maxc - minc
    s = cr / np.where(eqc, 1.0, maxc)
    crd = np.where(eqc, 1.0, cr)
    rc, gc, bc = (maxc - r) / crd, (maxc - g) / crd, (maxc - b) / crd
    hr = (maxc == r) * (bc - gc)
    hg = ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
    hb = ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    h = np.fmod((hr + hg + hb) / 6.0 + 1.0, 1.0)
    h = np.fmod(h + shift + 1.0, 1.0)
    i = np.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.astype(int) % 6
    v = maxc
    p = np.clip(v * (1 - s), 0, 1)
    q = np.clip(v * (1 - s * f), 0, 1)
    t = np.clip(v * (1 - s * (1 - f)), 0, 1)
    table = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = np.zeros_like(rgb)
    for k, chans in enumerate(table):
        sel = i == k
        for c in range(3):
            out[..., c][sel] = chans[c][sel]
    return np.clip(np.rint(out * 255.0), 0, 255).astype(np.uint8)


def ref_hue_pil(a: np.ndarray, shift: float) -> np.ndarray:
    """torchvision's PIL ``adjust_hue``: 8-bit hue in PIL's HSV, shifted modulo 256."""
    h, s, v = pil(a).convert("HSV").split()
    np_h = (np.asarray(h).astype(np.int64) + int(shift * 255)) % 256
    hsv = Image.merge("HSV", (Image.fromarray(np_h.astype(np.uint8), "L"), s, v))
    return arr(hsv.convert("RGB"))


# ------------------------------------------------------------ the pixel operations


@pytest.mark.parametrize("factor", [0.0, 0.3, 0.99, 1.01, 1.5, 1.99])
def test_brightness_posterize_solarize_match_pil_exactly(factor: float) -> None:
    for a in (IMG, GRAY):
        assert np.array_equal(
            im.brightness(a, factor), arr(ImageEnhance.Brightness(pil(a)).enhance(factor))
        )
    for bits in range(1, 9):
        assert np.array_equal(im.posterize(IMG, bits), arr(ImageOps.posterize(pil(IMG), bits)))
    for threshold in (0, 1, 127.5, 128, 246.5, 255, 256):
        assert np.array_equal(
            im.solarize(IMG, threshold), arr(ImageOps.solarize(pil(IMG), threshold))
        )


@pytest.mark.parametrize("seed", range(4))
def test_autocontrast_and_equalize_match_pil_exactly(seed: int) -> None:
    a = (photo(40, 56, seed).astype(np.float32) * 0.5 + 40).astype(np.uint8)  # a narrow range
    for img in (a, IMG, GRAY, np.full((8, 8, 3), 77, np.uint8)):
        assert np.array_equal(im.autocontrast(img), arr(ImageOps.autocontrast(pil(img))))
        assert np.array_equal(im.equalize(img), arr(ImageOps.equalize(pil(img))))


@pytest.mark.parametrize("factor", [0.0, 0.25, 0.5, 1.5, 1.99])
def test_contrast_saturation_sharpness_match_pil_to_a_level(factor: float) -> None:
    for a in (IMG, photo(31, 45, 3), GRAY):
        c = diff(im.contrast(a, factor), arr(ImageEnhance.Contrast(pil(a)).enhance(factor)))
        assert c.max() <= 1
        for ours, theirs in (
            (im.saturation, ImageEnhance.Color),
            (im.sharpness, ImageEnhance.Sharpness),
        ):
            d = diff(ours(a, factor), arr(theirs(pil(a)).enhance(factor)))
            assert d.max() <= 1 and (d > 0).mean() < 0.01, (ours.__name__, d.max(), d.mean())


@pytest.mark.parametrize("shift", [-0.5, -0.31, -0.05, 0.02, 0.25, 0.5])
def test_hue_matches_the_exact_hsv_rotation(shift: float) -> None:
    for a in (IMG, photo(33, 21, 5)):
        ours = im.hue(a, shift)
        assert diff(ours, ref_hue(a, shift)).max() <= 1
        pil_path = diff(ours, ref_hue_pil(a, shift))  # torchvision's 8-bit-hue path
        assert pil_path.mean() < 2.0, pil_path.mean()
    assert im.hue(GRAY, shift) is GRAY


def source_coords(matrix, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Where PIL's affine transform samples each output pixel (pixel centres, corner
    coordinates)."""
    a, b, c, d, e, f = matrix
    y, x = np.mgrid[0:h, 0:w] + 0.5
    return a * x + b * y + c, d * x + e * y + f


def near_edge(matrix, h: int, w: int, within: float = 1 / 256) -> np.ndarray:
    """Output pixels whose source coordinate is within ``within`` of a pixel edge: there a
    nearest-neighbour sample may honestly take either neighbour."""
    xs, ys = source_coords(matrix, h, w)
    dist = lambda v: np.abs(v - np.rint(v))  # noqa: E731
    return (dist(xs) < within) | (dist(ys) < within)


def assert_same_geometry(ours: np.ndarray, ref: np.ndarray, matrix) -> None:
    """Equal except where the source coordinate sits on a pixel edge, and those are few."""
    h, w = ours.shape[:2]
    differs = diff(ours, ref).reshape(h, w, -1).max(-1) > 0
    edge = near_edge(matrix, h, w)
    assert not (differs & ~edge).any()
    assert differs.mean() < 0.03, differs.mean()


def shear_matrix(m: float, axis: str) -> list[float]:
    shear = [math.degrees(math.atan(m)), 0.0] if axis == "x" else [0.0, math.degrees(math.atan(m))]
    return ref_inverse_affine([0, 0], 0.0, [0, 0], 1.0, shear)


@pytest.mark.parametrize("m", [-0.99, -0.429, -0.3, -0.033, 0.1, 0.5, 0.99])
def test_shear_matches_torchvision_through_pil(m: float) -> None:
    for a in (IMG, GRAY, photo(224, 224, 2)):
        assert_same_geometry(im.shear_x(a, m), ref_op(a, "ShearX", m), shear_matrix(m, "x"))
        assert_same_geometry(im.shear_y(a, m), ref_op(a, "ShearY", m), shear_matrix(m, "y"))


@pytest.mark.parametrize("degrees", [-135.0, -90.0, -31.5, 4.5, 45.0, 90.0, 135.0, 180.0])
def test_rotate_and_translate_match_pil(degrees: float) -> None:
    for a in (IMG, photo(40, 40, 1), photo(224, 224, 2)):  # square: PIL's 90-degree shortcut
        h, w = a.shape[:2]
        # torchvision's tensor rotate: the inverse affine matrix of -degrees about the centre
        matrix = ref_inverse_affine([w / 2, h / 2], -degrees, [0, 0], 1.0, [0.0, 0.0])
        assert_same_geometry(im.rotate(a, degrees), ref_op(a, "Rotate", degrees), matrix)
    for dx, dy in ((-32, 0), (7, 0), (0, -3), (0, 29)):
        name, m = ("TranslateX", dx) if dx else ("TranslateY", dy)
        assert np.array_equal(im.translate(IMG, dx, dy), ref_op(IMG, name, m))


def test_the_input_is_never_written() -> None:
    a = IMG.copy()
    for fn, m in (
        (im.brightness, 1.5),
        (im.contrast, 0.5),
        (im.saturation, 0.2),
        (im.hue, 0.3),
        (im.sharpness, 1.9),
        (im.shear_x, 0.4),
        (im.rotate, 30),
    ):
        out = fn(a, m)
        assert out is not a and np.array_equal(a, IMG), fn.__name__


# ------------------------------------------------------------------ the stock ops


def test_colorjitter_ranges_are_torchvision_s() -> None:
    cj = ColorJitter(brightness=0.4, contrast=(0.5, 1.5), saturation=1.5, hue=0.1)
    assert cj.brightness == (0.6, 1.4) and cj.contrast == (0.5, 1.5)
    assert cj.saturation == (0.0, 2.5) and cj.hue == (-0.1, 0.1)
    assert ColorJitter(brightness=0, hue=0).brightness is None
    assert ColorJitter(brightness=(1, 1)).brightness is None
    default = ColorJitter()  # stoker's default is a jitter (torchvision's, all 0, is not)
    assert (default.brightness, default.contrast) == ((0.8, 1.2), (0.8, 1.2))
    assert default.saturation is None and default.hue is None
    assert not np.array_equal(default(IMG, np.random.default_rng(0)), IMG)


def test_colorjitter_draws_every_order_and_factors_within_range() -> None:
    cj = ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    rng = np.random.default_rng(0)
    orders, factors = set(), []
    for _ in range(2000):
        order, f = cj.draw(rng)
        orders.add(tuple(order))
        factors.append(f)
    f = np.array(factors)
    assert len(orders) == 24  # torchvision's randperm(4): every order
    assert (f[:, :3] >= 0.6).all() and (f[:, :3] <= 1.4).all()
    assert (np.abs(f[:, 3]) <= 0.1).all()
    assert f[:, :3].min() < 0.61 and f[:, :3].max() > 1.39  # the whole range is used
    assert abs(f[:, 0].mean() - 1.0) < 0.02  # uniform


@pytest.mark.parametrize("seed", range(6))
def test_colorjitter_is_its_adjustments_in_the_drawn_order(seed: int) -> None:
    cj = ColorJitter(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.2)
    order, factors = cj.draw(np.random.default_rng(seed))
    expected = IMG
    for i in order:
        if i == 3:
            expected = ref_hue(expected, factors[3])
        else:
            kind = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)[i]
            expected = arr(kind(pil(expected)).enhance(factors[i]))
    got = cj(IMG, np.random.default_rng(seed))
    d = diff(got, expected)
    assert d.max() <= 3 and d.mean() < 0.2, (d.max(), d.mean())  # a level per step, at most


def test_random_erasing_boxes_follow_scale_and_ratio() -> None:
    re = RandomErasing(p=1.0, scale=(0.05, 0.3), ratio=(0.5, 2.0), value=(10, 20, 30))
    rng = np.random.default_rng(1)
    h, w = 60, 80
    fractions, aspects = [], []
    for _ in range(500):
        box = re.box(h, w, rng)
        assert box is not None
        top, left, eh, ew = box
        assert 0 <= top and top + eh <= h and 0 <= left and left + ew <= w
        assert eh < h and ew < w
        fractions.append(eh * ew / (h * w))
        aspects.append(eh / ew)
    fractions, aspects = np.array(fractions), np.log(np.array(aspects))
    slack = 0.03  # rounding each side to whole pixels moves the area a little
    assert fractions.min() >= 0.05 - slack and fractions.max() <= 0.3 + slack
    assert np.median(fractions) == pytest.approx(0.175, abs=0.03)
    assert aspects.min() >= math.log(0.5) - 0.2 and aspects.max() <= math.log(2.0) + 0.2
    assert abs(np.median(aspects)) < 0.15  # log-uniform about 1


def test_random_erasing_fills_the_box_and_nothing_else() -> None:
    for value in (0, 200, (10, 20, 30), "random"):
        re = RandomErasing(p=1.0, value=value)
        out = re(IMG, np.random.default_rng(3))
        box = re.box(*IMG.shape[:2], _after_coin(3))
        top, left, eh, ew = box
        inside = np.zeros(IMG.shape[:2], bool)
        inside[top : top + eh, left : left + ew] = True
        assert np.array_equal(out[~inside], IMG[~inside])
        patch = out[inside]
        if value == "random":
            assert len(np.unique(patch)) > 50
        else:
            want = np.broadcast_to(np.asarray(value, np.uint8), patch.shape)
            assert np.array_equal(patch, want)


def _after_coin(seed: int) -> np.random.Generator:
    rng = np.random.default_rng(seed)
    rng.random()  # the p coin comes first
    return rng


def test_random_erasing_applies_with_probability_p() -> None:
    re = RandomErasing(p=0.3)
    rng = np.random.default_rng(0)
    changed = sum(not np.array_equal(re(IMG, rng), IMG) for _ in range(1000))
    assert 240 < changed < 360  # binomial(1000, 0.3): mean 300, sd 14.5
    big = RandomErasing(p=1.0, scale=(0.99, 1.0), ratio=(1.0, 1.0))
    assert big(IMG, rng) is IMG  # no box fits in 10 tries: unchanged, as torchvision


def test_trivial_augment_draws_every_op_and_magnitude_uniformly() -> None:
    ta = TrivialAugmentWide()
    rng = np.random.default_rng(0)
    draws = [ta.draw(IMG, rng) for _ in range(7000)]
    names = [n for n, _ in draws]
    counts = np.array([names.count(n) for n in stoker.autoaugment.OP_NAMES])
    assert counts.min() > 380 and counts.max() < 620  # 500 each expected
    shears = sorted({abs(m) for n, m in draws if n == "ShearX"})
    assert len(shears) == 31 and shears[-1] == pytest.approx(0.99)
    rotations = [m for n, m in draws if n == "Rotate"]
    assert min(rotations) == pytest.approx(-135) and max(rotations) == pytest.approx(135)
    bits = {m for n, m in draws if n == "Posterize"}
    assert bits == {2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}
    assert {m for n, m in draws if n == "Solarize"} >= {0.0, 255.0}


def test_rand_augment_uses_its_magnitude_bin_and_image_relative_translation() -> None:
    ra = RandAugment(num_ops=3, magnitude=30)
    rng = np.random.default_rng(0)
    draws = [d for _ in range(1000) for d in ra.draw(IMG, rng)]
    assert len(draws) == 3000
    widths = {abs(m) for n, m in draws if n == "TranslateX"}
    heights = {abs(m) for n, m in draws if n == "TranslateY"}
    assert widths == {np.float32(np.linspace(0, 150 / 331 * 64, 31, dtype=np.float32)[30])}
    assert heights == {np.float32(np.linspace(0, 150 / 331 * 48, 31, dtype=np.float32)[30])}
    assert {abs(m) for n, m in draws if n == "Rotate"} == {30.0}
    assert {m for n, m in draws if n == "Posterize"} == {4.0}


def _tolerance_ok(name: str, ours: np.ndarray, ref: np.ndarray) -> bool:
    d = diff(ours, ref)
    if name in ("ShearX", "ShearY", "Rotate"):
        return (d > 0).mean() < 0.03  # near pixel edges only: see the geometry tests
    if name in ("Color", "Sharpness", "Contrast"):
        return d.max() <= 1
    return d.max() == 0


@pytest.mark.parametrize("op", [TrivialAugmentWide(), RandAugment(num_ops=1, magnitude=15)])
def test_autoaugment_ops_match_torchvision_s_apply_op_through_pil(op) -> None:
    seen = set()
    for seed in range(300):
        draw = op.draw(IMG, np.random.default_rng(seed))
        name, m = draw if isinstance(draw, tuple) else draw[0]
        ours = op(IMG, np.random.default_rng(seed))
        assert _tolerance_ok(name, ours, ref_op(IMG, name, m)), (name, m)
        seen.add(name)
    assert len(seen) == 14


def test_ops_work_on_gray_images_and_refuse_rgba() -> None:
    for op in (
        TrivialAugmentWide(),
        RandAugment(),
        ColorJitter(0.4, 0.4, 0.4, 0.1),
        RandomErasing(p=1.0),
    ):
        for seed in range(20):
            out = op(GRAY[:, :, None], np.random.default_rng(seed))
            assert out.shape == (48, 64, 1) and out.dtype == np.uint8
        with pytest.raises(TypeError, match="drop the alpha"):
            op(np.zeros((8, 8, 4), np.uint8), np.random.default_rng(0))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: ColorJitter(brightness=-1), r"brightness=-1: must be in \[0.0, inf\]"),
        (lambda: ColorJitter(contrast=(1.5, 0.5)), r"\(min, max\); write \(0.5, 1.5\)"),
        (lambda: ColorJitter(hue=0.7), r"hue=0.7: must be in \[0.0, 0.5\]"),
        (lambda: ColorJitter(hue=(-0.6, 0.1)), r"hue\[0\]=-0.6"),
        (lambda: ColorJitter(saturation="lots"), "must be a number"),
        (lambda: RandomErasing(p=1.5), r"p=1.5: must be in \[0.0, 1.0\]"),
        (lambda: RandomErasing(scale=(0.4, 0.1)), r"write \(0.1, 0.4\)"),
        (lambda: RandomErasing(scale=0.3), r"scale=0.3: give a \(min, max\) pair"),
        (lambda: RandomErasing(value="noise"), "or 'random'"),
        (lambda: RandomErasing(value=0.5), "levels are integers 0-255"),
        (lambda: TrivialAugmentWide(num_magnitude_bins=1), "integer >= 2"),
        (lambda: RandAugment(magnitude=31), r"integer bin 0..30"),
        (lambda: RandAugment(num_ops=-1), "num_ops=-1"),
    ],
)
def test_arguments_are_checked_up_front_with_the_fix(make, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        make()


# ---------------------------------------------------------------- in the Loader

OPS = [
    TrivialAugmentWide(),
    RandAugment(),
    ColorJitter(0.4, 0.4, 0.4, 0.1),
    RandomErasing(p=0.5, value="random"),
]
KW = {"batch_size": 6, "image_size": 32, "seed": 7}


def _epoch(folder: pathlib.Path, augment, workers: int) -> list[np.ndarray]:
    with stoker.Loader(folder, augment=augment, workers=workers, **KW) as loader:
        return [x.copy() for x, _ in loader]


@pytest.mark.timeout(300)
def test_after_the_fused_train_pipeline_same_seed_same_bytes_with_workers(
    image_folder: pathlib.Path,
) -> None:
    augment = ["train", *OPS]
    plain = _epoch(image_folder, "train", 0)
    zero = _epoch(image_folder, augment, 0)
    two = _epoch(image_folder, augment, 2)
    assert len(zero) == len(two) == len(plain) == 6
    assert all(np.array_equal(a, b) for a, b in zip(zero, two, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(zero, plain, strict=True))
    again = _epoch(image_folder, augment, 0)
    assert all(np.array_equal(a, b) for a, b in zip(zero, again, strict=True))


@pytest.mark.timeout(300)
def test_a_resumed_run_replays_the_ops(image_folder: pathlib.Path) -> None:
    def augment():  # new objects each time, as in a restarted script
        return ["train", TrivialAugmentWide(), RandomErasing(p=1.0)]

    expected = _epoch(image_folder, augment(), 0)
    with stoker.Loader(image_folder, augment=augment(), workers=2, **KW) as first:
        stream = iter(first)
        got = [next(stream)[0].copy() for _ in range(2)]
        state = first.state_dict()
    with stoker.Loader(image_folder, augment=augment(), workers=2, **KW) as again:
        again.load_state_dict(state)
        got += [x.copy() for x, _ in again]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.timeout(300)
def test_ops_in_a_plain_op_list_run_in_worker_processes(image_folder: pathlib.Path) -> None:
    augment = [stoker.ops.RandomResizedCrop(), stoker.ops.HorizontalFlip(), *OPS]
    zero = _epoch(image_folder, augment, 0)
    two = _epoch(image_folder, augment, 2)
    assert all(np.array_equal(a, b) for a, b in zip(zero, two, strict=True))
    assert all(x.shape == (6, 32, 32, 3) for x in two)


def test_ops_say_what_they_are() -> None:
    assert repr(RandAugment()) == "RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31)"
    assert repr(TrivialAugmentWide()) == "TrivialAugmentWide(num_magnitude_bins=31)"
    assert "hue=(-0.1, 0.1)" in repr(ColorJitter(hue=0.1))
    assert "value='random'" in repr(RandomErasing(value="random"))


def test_a_stock_name_must_be_followed_by_ops(image_folder: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="after 'train' come ops"):
        stoker.Loader(image_folder, augment=["train", "flip"], workers=0)
    with pytest.raises(ConfigError, match="after 'eval' come ops"):
        stoker.Loader(image_folder, augment=["eval"], workers=0)


# -------------------------------------------------------------------- with masks


def _labelled(h: int = 48, w: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """An image whose red channel is its mask (labels 1..5), so alignment can be read back."""
    mask = (np.add.outer(np.arange(h) // 7, np.arange(w) // 9) % 5 + 1).astype(np.uint8)
    image = photo(h, w, 4)
    image[..., 0] = mask
    return image, mask


@pytest.mark.parametrize("op", [TrivialAugmentWide(), RandAugment(num_ops=2, magnitude=20)])
def test_autoaugment_moves_the_mask_with_the_image(op) -> None:
    image, mask = _labelled()
    moved = 0
    for seed in range(120):
        draw = op.draw(image, np.random.default_rng(seed))
        names = [draw[0]] if isinstance(draw, tuple) else [n for n, _ in draw]
        out, out_mask = op.pair(image, mask, np.random.default_rng(seed))
        assert np.array_equal(out, op(image, np.random.default_rng(seed)))  # same draws
        if all(n in stoker.autoaugment.GEOMETRIC or n == "Identity" for n in names):
            assert np.array_equal(out[..., 0], out_mask)  # the warp the image had, exactly
            moved += not np.array_equal(out_mask, mask)
        elif not any(n in stoker.autoaugment.GEOMETRIC for n in names):
            assert out_mask is mask  # colour ops leave the mask alone
    assert moved > 10


def test_colour_ops_and_erasing_keep_the_mask() -> None:
    image, mask = _labelled()
    for op in (ColorJitter(0.5, 0.5, 0.5, 0.2), RandomErasing(p=1.0)):
        out, out_mask = op.pair(image, mask, np.random.default_rng(0))
        assert out_mask is mask and not np.array_equal(out, image)


@pytest.mark.timeout(300)
def test_ops_after_train_with_masks_in_worker_processes() -> None:
    pairs = [_labelled(48 + 4 * k, 64) for k in range(12)]
    images = np.stack([p[0][:48] for p in pairs])
    masks = np.stack([p[1][:48] for p in pairs])
    augment = ["train", TrivialAugmentWide(), RandomErasing(p=0.0)]
    kw = {"batch_size": 4, "image_size": 32, "seed": 3, "augment": augment, "batch": "dict"}
    with stoker.Loader(images, masks=masks, workers=2, **kw) as loader:
        two = [(b["image"].copy(), b["mask"].copy()) for b in loader]
    with stoker.Loader(images, masks=masks, workers=0, **kw) as loader:
        zero = [(b["image"].copy(), b["mask"].copy()) for b in loader]
    for (x2, m2), (x0, m0) in zip(two, zero, strict=True):
        assert np.array_equal(x2, x0) and np.array_equal(m2, m0)
        assert np.isin(m2, np.arange(6)).all()  # nearest: labels or the 0 fill, nothing new

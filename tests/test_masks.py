"""Segmentation: image + mask pairs get the same crop and flip, masks resized nearest-neighbour.

Every test image carries its own mask in its red channel (red = 32 * mask value), so alignment
is checked pixel by pixel after augmentation: wherever the red channel is clearly one class's
value (away from the blurred class borders), the mask must hold that class.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.decode import decode_mask
from stoker.errors import ConfigError, SourceError, TooManyErrors

STEP = 32  # red = STEP * mask value


def _pattern(h: int, w: int, shift: int) -> np.ndarray:
    """A mask of 8 classes that is asymmetric left-right and top-bottom (flips show)."""
    y, x = np.mgrid[0:h, 0:w]
    return ((((x + shift) // 20) % 4) + 4 * (((y + shift) // 16) % 2)).astype(np.uint8)


def _pair(h: int, w: int, shift: int) -> tuple[np.ndarray, np.ndarray]:
    mask = _pattern(h, w, shift)
    rng = np.random.default_rng(shift)
    image = np.zeros((h, w, 3), np.uint8)
    image[..., 0] = mask * STEP
    image[..., 1] = rng.integers(0, 256, (h, w), dtype=np.uint8)
    image[..., 2] = 200
    return image, mask


def _check_aligned(images: np.ndarray, masks: np.ndarray, radius: int = 1) -> None:
    """Inside mask regions (a pixel whose neighbours within ``radius`` share its class) the
    image's red channel must show that class; borders blur with the image's resampling."""
    m = masks.astype(np.int32)
    inside = np.ones(m.shape, bool)
    # pixels at the batch border count as unknown (-1): resampling there sees outside the box
    pad = np.pad(m, ((0, 0), (radius, radius), (radius, radius)), constant_values=-1)
    h, w = m.shape[1:]
    for dy in range(2 * radius + 1):
        for dx in range(2 * radius + 1):
            inside &= pad[:, dy : dy + h, dx : dx + w] == m
    assert inside.mean() > 0.25, inside.mean()
    near = np.rint(images[..., 0].astype(np.int32) / STEP)
    agree = (near == m)[inside].mean()
    assert agree > 0.995, agree


def _write_pairs(root: pathlib.Path, sizes: list[tuple[int, int]], header: str = "image,mask"):
    root.mkdir(parents=True, exist_ok=True)
    lines = [header]
    for i, (h, w) in enumerate(sizes):
        image, mask = _pair(h, w, i)
        Image.fromarray(image).save(root / f"img{i}.png")
        Image.fromarray(mask, mode="L").save(root / f"mask{i}.png")
        lines.append(f"img{i}.png,mask{i}.png")
    (root / "pairs.csv").write_text("\n".join(lines) + "\n")
    return root / "pairs.csv"


SIZES = [(48 + 8 * (i % 5), 64 + 12 * (i % 4)) for i in range(20)]


def _all(loader) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.copy(), m.copy()) for x, m in loader]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("augment", ["train", "eval", None])
def test_csv_pairs_stay_aligned_and_match_across_worker_counts(tmp_path, augment) -> None:
    table = _write_pairs(tmp_path / "d", SIZES)
    kw = {"batch_size": 4, "image_size": (24, 32), "augment": augment, "seed": 3}
    with stoker.Loader(table, workers=0, **kw) as loader:
        assert loader.recipe.source.has_masks and len(loader) == 5
        inline = _all(loader)
    with stoker.Loader(table, workers=2, **kw) as loader:
        pooled = _all(loader)
    assert len(inline) == len(pooled) == 5
    for (x0, m0), (x2, m2) in zip(inline, pooled, strict=True):
        assert x0.shape == (4, 24, 32, 3) and x0.dtype == np.uint8
        assert m0.shape == (4, 24, 32) and m0.dtype == np.uint8
        assert np.array_equal(x0, x2) and np.array_equal(m0, m2)
        _check_aligned(x0, m0)
        assert set(np.unique(m0).tolist()) <= set(range(8))  # nearest: no new values


@pytest.mark.timeout(60)
def test_train_flips_and_crops_the_mask_with_its_image() -> None:
    pairs = [_pair(64, 96, i) for i in range(16)]
    images = np.stack([p[0] for p in pairs])
    masks = np.stack([p[1] for p in pairs])
    with stoker.Loader(
        images, masks=masks, batch_size=16, image_size=32, seed=1, workers=0
    ) as loader:
        ((x, m),) = _all(loader)
    _check_aligned(x, m)
    # the flip happened to some samples: an unflipped mask would then disagree
    flipped = [not np.array_equal(m[i], m[i][:, ::-1]) for i in range(16)]
    assert any(flipped)


@pytest.mark.timeout(120)
def test_arrays_and_path_lists_with_masks(tmp_path) -> None:
    table = _write_pairs(tmp_path / "d", [(40, 40)] * 8)
    paths = [tmp_path / "d" / f"img{i}.png" for i in range(8)]
    mpaths = [tmp_path / "d" / f"mask{i}.png" for i in range(8)]
    images = np.stack([np.asarray(Image.open(p)) for p in paths])
    masks = np.stack([np.asarray(Image.open(p)) for p in mpaths])
    kw = {"batch_size": 4, "image_size": 40, "augment": None, "shuffle": False}
    with stoker.Loader(images, masks=masks, workers=2, **kw) as loader:
        from_arrays = _all(loader)
    with stoker.Loader(paths=paths, masks=mpaths, workers=0, **kw) as loader:
        from_paths = _all(loader)
    with stoker.Loader(table, workers=0, **kw) as loader:
        from_table = _all(loader)
    for a, b, c in zip(from_arrays, from_paths, from_table, strict=True):
        assert all(np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]) for k in (0, 1))
    got = np.concatenate([m for _, m in from_arrays])
    assert np.array_equal(got, masks)  # same size: exact


@pytest.mark.timeout(60)
def test_state_and_fingerprint_include_masks(tmp_path) -> None:
    images = np.zeros((8, 16, 16, 3), np.uint8)
    masks = np.zeros((8, 16, 16), np.uint8)
    other = masks.copy()
    other[:, 0, 0] = 1
    with stoker.Loader(images, masks=masks, batch_size=4, image_size=16, workers=0) as a:
        state = a.state_dict()
        with stoker.Loader(images, masks=other, batch_size=4, image_size=16, workers=0) as b:
            with pytest.raises(ConfigError, match="fingerprint"):
                b.load_state_dict(state)
        with stoker.Loader(images, batch_size=4, image_size=16, workers=0) as c:
            assert c.state_dict()["fingerprint"] != state["fingerprint"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_mask_of_the_wrong_size_names_both_files(tmp_path, workers) -> None:
    table = _write_pairs(tmp_path / "d", [(40, 48)] * 8)
    Image.fromarray(np.zeros((20, 24), np.uint8)).save(tmp_path / "d" / "mask5.png")
    with stoker.Loader(table, batch_size=4, image_size=16, workers=workers, max_errors=0) as loader:
        with pytest.raises(TooManyErrors) as info:  # max_errors=0: raised, no warning first
            _all(loader)
    text = str(info.value)
    assert "img5.png" in text and "mask5.png" in text and "24x20" in text


@pytest.mark.timeout(60)
def test_bad_mask_files_count_as_bad_samples(tmp_path) -> None:
    table = _write_pairs(tmp_path / "d", [(40, 48)] * 8)
    (tmp_path / "d" / "mask2.png").write_bytes(b"not a png")
    with pytest.warns(stoker.StokerWarning, match="mask2.png"):
        with stoker.Loader(table, batch_size=4, image_size=16, workers=0, max_errors=1) as loader:
            got = _all(loader)
            assert [n for n, _ in loader.stats().bad_files] == [
                f"{tmp_path / 'd' / 'img2.png'} (mask {tmp_path / 'd' / 'mask2.png'})"
            ]
    assert sum(len(m) for _, m in got) == 8  # replaced, shape kept


@pytest.mark.timeout(60)
def test_palette_png_masks_give_indices(tmp_path) -> None:
    _, mask = _pair(32, 32, 0)
    im = Image.fromarray(mask, mode="L").convert("P")
    im.putdata(mask.ravel().tolist())
    palette = []
    for i in range(256):
        palette += [(i * 53) % 256, 255 - (i * 29) % 256, 7]
    im.putpalette(palette)
    path = tmp_path / "palette.png"
    im.save(path)
    assert Image.open(path).mode == "P"
    assert np.array_equal(decode_mask(path.read_bytes()), mask)
    rgb = tmp_path / "rgb.png"
    Image.fromarray(np.dstack([mask, mask * 0 + 9, mask * 0 + 1])).save(rgb)
    assert np.array_equal(decode_mask(rgb.read_bytes()), mask)  # 3 channels: channel 0
    image, _ = _pair(32, 32, 0)
    Image.fromarray(image).save(tmp_path / "img.png")
    (tmp_path / "pairs.tsv").write_text("path\tmask\nimg.png\tpalette.png\n")
    with stoker.Loader(
        tmp_path / "pairs.tsv", batch_size=1, image_size=32, augment=None, workers=0
    ) as loader:
        ((_, m),) = _all(loader)
    assert np.array_equal(m[0], mask)


@pytest.mark.timeout(30)
def test_mask_configuration_errors(tmp_path) -> None:
    images = np.zeros((4, 16, 16, 3), np.uint8)
    with pytest.raises(ConfigError, match=r"called as \(image, mask, rng\)"):
        stoker.Loader(images, masks=np.zeros((4, 16, 16), np.uint8), augment=lambda x, r: x)
    with pytest.raises(SourceError, match="do not match"):
        stoker.Loader(images, masks=np.zeros((4, 8, 16), np.uint8))
    with pytest.raises(SourceError, match="masks="):
        stoker.Loader(paths=["a.png"], masks=["a.png", "b.png"])
    with pytest.raises(SourceError, match="not both"):
        stoker.Loader(images, labels=[0, 1, 2, 3], masks=np.zeros((4, 16, 16), np.uint8))


@pytest.mark.timeout(120)
def test_torch_and_tf_shapes_with_masks() -> None:
    pairs = [_pair(32, 32, i) for i in range(8)]
    images = np.stack([p[0] for p in pairs])
    masks = np.stack([p[1] for p in pairs])
    kw = {"batch_size": 4, "image_size": 24, "workers": 0}
    torch = pytest.importorskip("torch")
    with stoker.Loader(images, masks=masks, **kw) as loader:
        for x, m in loader.torch():
            assert x.shape == (4, 3, 24, 24) and m.shape == (4, 24, 24)  # masks never permuted
            assert m.dtype == torch.uint8
    tf = pytest.importorskip("tensorflow")
    with stoker.Loader(images, masks=masks, **kw) as loader:
        dataset = loader.tf()
        assert dataset.element_spec[1].shape.as_list() == [4, 24, 24]
        assert dataset.element_spec[1].dtype == tf.uint8
        for x, m in dataset:
            assert tuple(x.shape) == (4, 24, 24, 3) and tuple(m.shape) == (4, 24, 24)
        first = loader.tf(layout="channels_first")
        assert first.element_spec[0].shape.as_list() == [4, 3, 24, 24]
        assert first.element_spec[1].shape.as_list() == [4, 24, 24]  # masks never permuted


@pytest.mark.timeout(30)
def test_convert_refuses_mask_pairs(tmp_path) -> None:
    from stoker.cli.convert import convert

    table = _write_pairs(tmp_path / "d", [(16, 16)] * 2)
    with pytest.raises(ConfigError, match="masks"):
        convert(table, tmp_path / "out")


# ----------------------------------------------------------------- mask_map, callables, ops


def _trimaps(root: pathlib.Path, n: int = 8) -> pathlib.Path:
    """Image + mask PNG pairs whose masks hold trimap values 1, 2, 3 and VOC's 255 border."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["image,mask"]
    for i in range(n):
        image, mask = _pair(40, 56, i)
        trimap = (mask % 3 + 1).astype(np.uint8)
        trimap[:, :8] = 255
        Image.fromarray(image).save(root / f"img{i}.png")
        Image.fromarray(trimap, mode="L").save(root / f"mask{i}.png")
        lines.append(f"img{i}.png,mask{i}.png")
    (root / "pairs.csv").write_text("\n".join(lines) + "\n")
    return root / "pairs.csv"


@pytest.mark.timeout(120)
def test_mask_map_remaps_values_in_the_workers_and_keeps_the_unnamed(tmp_path) -> None:
    table = _trimaps(tmp_path / "d")
    kw = {"batch_size": 4, "image_size": 24, "augment": None, "seed": 5}
    with stoker.Loader(table, workers=0, **kw) as loader:
        raw = _all(loader)
    with stoker.Loader(table, workers=2, mask_map={1: 0, 2: 1, 3: 2}, **kw) as loader:
        mapped = _all(loader)
    lut = np.arange(256, dtype=np.uint8)
    lut[[1, 2, 3]] = [0, 1, 2]
    for (x0, m0), (x1, m1) in zip(raw, mapped, strict=True):
        assert np.array_equal(x0, x1)
        assert np.array_equal(lut[m0], m1)
        assert set(np.unique(m1).tolist()) <= {0, 1, 2, 255} and 255 in m1


@pytest.mark.timeout(60)
def test_mask_map_offset_and_its_errors() -> None:
    pairs = [_pair(32, 32, i) for i in range(4)]
    images = np.stack([p[0] for p in pairs])
    masks = np.stack([p[1] for p in pairs]) + 1  # 1..8
    kw = {"batch_size": 4, "image_size": 32, "workers": 0, "augment": None, "shuffle": False}
    with stoker.Loader(images, masks=masks, mask_map=-1, **kw) as loader:
        ((_, m),) = _all(loader)
    assert np.array_equal(m, masks - 1)
    with stoker.Loader(images, masks=masks - 1, mask_map=-1, max_errors=0, **kw) as loader:
        with pytest.raises(TooManyErrors, match="mask value 0 maps to -1"):
            _all(loader)
    with pytest.raises(ConfigError, match="no masks"):
        stoker.Loader(images, mask_map={1: 0})
    with pytest.raises(ConfigError, match="ints in 0-255"):
        stoker.Loader(images, masks=masks, mask_map={1: -100})
    with pytest.raises(ConfigError, match="dict of mask values"):
        stoker.Loader(images, masks=masks, mask_map="trimap")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("offset", [1000, -256, 256])
def test_an_offset_no_mask_value_survives_is_refused_when_the_loader_is_made(offset) -> None:
    """mask_map=1000 used to make every sample bad at the first batch; it is refused before
    any file is opened (the missing folder below is never looked at)."""
    pairs = [_pair(32, 32, i) for i in range(4)]
    images, masks = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
    with pytest.raises(ConfigError, match=rf"mask_map={offset}: .* offset in -255\.\.255"):
        stoker.Loader(images, masks=masks, mask_map=offset, batch_size=4, image_size=32)
    with pytest.raises(ConfigError, match=rf"mask_map={offset}: "):
        stoker.Loader("/no/such/folder", mask_map=offset, batch_size=4, image_size=32)


def rot90_pair(image, mask, rng):
    """A user's (image, mask, rng) transform: the same random quarter turn for both."""
    k = int(rng.integers(4))
    return np.rot90(image, k), np.rot90(mask, k)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "augment",
    [
        [stoker.ops.RandomResizedCrop(scale=(0.3, 1.0)), stoker.ops.HorizontalFlip()],
        rot90_pair,
        [stoker.ops.CenterCrop(0.8), rot90_pair, stoker.ops.Resize(40)],
    ],
    ids=["stock-ops", "callable", "mixed"],
)
def test_callables_and_op_lists_move_the_mask_with_its_image(tmp_path, augment) -> None:
    table = _write_pairs(tmp_path / "d", SIZES[:12])
    kw = {"batch_size": 4, "image_size": (24, 32), "seed": 2}
    with stoker.Loader(table, workers=0, augment=None, **kw) as loader:
        plain = _all(loader)
    with stoker.Loader(table, workers=0, augment=augment, **kw) as loader:
        inline = _all(loader)
    with stoker.Loader(table, workers=2, augment=augment, **kw) as loader:
        pooled = _all(loader)
    for (x0, m0), (x2, m2) in zip(inline, pooled, strict=True):
        assert np.array_equal(x0, x2) and np.array_equal(m0, m2)
        _check_aligned(x0, m0)  # the image's red channel still shows the mask's class
        assert set(np.unique(m0).tolist()) <= set(range(8))  # nearest: no new values
    assert any(not np.array_equal(m, p) for (_, m), (_, p) in zip(inline, plain, strict=True))


def test_colour_ops_leave_the_mask_and_a_bad_pair_is_named() -> None:
    image, mask = _pair(16, 16, 0)
    rng = np.random.default_rng(0)
    jittered, same = stoker.ops.ColorJitter(0.5, 0.5).pair(image, mask, rng)
    assert same is mask and not np.array_equal(jittered, image)
    images, masks = image[None].repeat(4, 0), mask[None].repeat(4, 0)
    for wrong, match in [
        (lambda im, m, r: im, "must return the pair"),
        (lambda im, m, r: (im, m[:8]), "the image's size"),
    ]:
        with stoker.Loader(images, masks=masks, augment=wrong, batch_size=4, workers=0) as lo:
            with pytest.raises(TypeError, match=match):
                _all(lo)

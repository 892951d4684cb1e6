"""The arguments a Keras ``image_dataset_from_directory`` user relies on: validation_split +
subset, label_mode, class_names, color_mode, interpolation, crop/pad_to_aspect_ratio, an
output dtype for every adapter, channels-first Keras batches, class_names and file_paths."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.errors import ConfigError, SourceError

OPTS = dict(batch_size=4, workers=0, image_size=16)


def _epoch_index(loader) -> np.ndarray:
    return np.concatenate([b[-1] for b in loader])


@pytest.mark.timeout(120)
def test_validation_split_is_disjoint_deterministic_and_stratifiable(image_folder):
    kw = dict(validation_split=0.25, batch=("image", "index"), drop_last=False, **OPTS)
    train, val = stoker.Loader(image_folder, subset="both", seed=7, **kw)
    with train, val:
        a, b = set(train.file_paths), set(val.file_paths)
        assert not a & b and len(a) + len(b) == 36 and len(b) == 9
        assert "augment='train'" in repr(train) and "augment='eval'" in repr(val)
        again = stoker.Loader(image_folder, subset="validation", seed=7, **kw)
        other = stoker.Loader(image_folder, subset="validation", seed=8, **kw)
        with again, other:
            assert set(again.file_paths) == b and set(other.file_paths) != b
        assert len(_epoch_index(val)) == 9  # every validation sample, once
    strat = stoker.Loader(image_folder, subset="validation", seed=7, stratify=True, **kw)
    with strat:
        assert np.bincount(strat.recipe.source.labels).tolist() == [3, 3, 3]
    with pytest.raises(ConfigError, match="subset="):
        stoker.Loader(image_folder, validation_split=0.2, **OPTS)
    with pytest.raises(ConfigError, match="fraction"):
        stoker.Loader(image_folder, validation_split=1.5, subset="training", **OPTS)


@pytest.mark.timeout(60)
def test_label_modes_and_class_names(image_folder):
    with stoker.Loader(image_folder, label_mode="categorical", shuffle=False, **OPTS) as cat:
        _, y = next(iter(cat))
        assert y.dtype == np.float32 and y.shape == (4, 3) and (y.sum(1) == 1).all()
    picked = stoker.Loader(
        image_folder,
        class_names=["class_002", "class_000"],
        label_mode="binary",
        shuffle=False,
        **OPTS,
    )
    with picked:
        assert picked.class_names == ["class_002", "class_000"] and len(picked.recipe.source) == 24
        assert all("class_001" not in p for p in picked.file_paths)
        labels = np.concatenate([y for _, y in picked])
        assert labels.shape == (24, 1) and labels.dtype == np.float32
        names = [p.split("/")[-2] for p in picked.file_paths]
        assert labels[:, 0].tolist() == [float(n == "class_000") for n in names]
    with stoker.Loader(image_folder, label_mode=None, **OPTS) as none:
        x = next(iter(none))
        assert isinstance(x, np.ndarray) and x.shape == (4, 16, 16, 3)
    with pytest.raises(SourceError, match="class_names"):
        stoker.Loader(image_folder, class_names=["class_000", "dog"], **OPTS)
    with pytest.raises(SourceError, match="exactly 2 classes"):
        stoker.Loader(image_folder, label_mode="binary", **OPTS)
    with pytest.raises(SourceError, match="label_mode='auto'"):
        stoker.Loader(
            np.zeros((4, 8, 8, 3), np.uint8),
            labels=np.ones(4) / 3,
            label_mode="categorical",
            **OPTS,
        )


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.timeout(60)
def test_color_modes(tmp_path, image_folder):
    jpg = sorted(image_folder.glob("class_000/*.jpg"))[:4]
    kw = dict(augment=None, shuffle=False, **OPTS)
    with (
        stoker.Loader(paths=jpg, **kw) as rgb,
        stoker.Loader(paths=jpg, color_mode="grayscale", **kw) as gray,
    ):
        x3, _ = next(iter(rgb))
        x1, _ = next(iter(gray))
    assert x1.shape == (4, 16, 16, 1)
    ref = np.stack([cv2.cvtColor(np.ascontiguousarray(a), cv2.COLOR_RGB2GRAY) for a in x3])
    assert np.abs(x1[..., 0].astype(int) - ref).max() <= 2  # gray of the same decode
    rgba = np.random.default_rng(0).integers(0, 256, (16, 16, 4), dtype=np.uint8)
    (tmp_path / "a.png").write_bytes(_png(rgba))
    one = {**kw, "batch_size": 1}
    with stoker.Loader(paths=[tmp_path / "a.png"], color_mode="rgba", **one) as l4:
        x4, _ = next(iter(l4))
    assert x4.shape == (1, 16, 16, 4) and np.array_equal(x4[0], rgba)  # alpha kept exactly
    gray_arrays = np.random.default_rng(1).integers(0, 256, (4, 16, 16), dtype=np.uint8)
    with stoker.Loader(gray_arrays, **kw) as own:  # arrays keep their own channel count
        assert np.array_equal(next(iter(own))[0][..., 0], gray_arrays)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "how,flag",
    [
        ("bilinear", cv2.INTER_LINEAR),
        ("area", cv2.INTER_AREA),
        ("bicubic", cv2.INTER_CUBIC),
        ("nearest", cv2.INTER_NEAREST_EXACT),
    ],
)
def test_interpolation_and_aspect_ratio_fits(how, flag):
    images = np.random.default_rng(2).integers(0, 256, (4, 20, 40, 3), dtype=np.uint8)
    kw = dict(augment=None, shuffle=False, batch_size=4, workers=0, interpolation=how)
    with stoker.Loader(images, image_size=(10, 15), **kw) as plain:
        x, _ = next(iter(plain))
    assert np.array_equal(x[1], cv2.resize(images[1], (15, 10), interpolation=flag))
    with stoker.Loader(images, image_size=(10, 10), crop_to_aspect_ratio=True, **kw) as crop:
        x, _ = next(iter(crop))
    centre = np.ascontiguousarray(images[2][:, 10:30])
    assert np.array_equal(x[2], cv2.resize(centre, (10, 10), interpolation=flag))
    with stoker.Loader(images, image_size=(10, 10), pad_to_aspect_ratio=True, **kw) as pad:
        x, _ = next(iter(pad))
    assert (x[3][:2] == 0).all() and (x[3][7:] == 0).all()  # 40x20 -> 10x5 band in the middle
    assert np.array_equal(x[3][2:7], cv2.resize(images[3], (10, 5), interpolation=flag))
    with pytest.raises(ConfigError, match="augment=None"):
        stoker.Loader(images, augment="train", crop_to_aspect_ratio=True, workers=0)


@pytest.mark.timeout(60)
def test_crop_to_aspect_ratio_decodes_only_the_window_of_a_jpeg(image_folder):
    from stoker import decode
    from stoker.pixels import aspect_box

    path = sorted(image_folder.glob("class_001/*.jpg"))[0]
    data = path.read_bytes()
    info = decode.probe(data)
    box = aspect_box(info.height, info.width, 16, 32)
    assert box[2] * 2 == box[3] or abs(box[3] / box[2] - 2) < 0.05  # the output's aspect
    window = decode.decode(data, info, box=box, min_size=(16, 32))  # the crop-window decode
    want = cv2.resize(np.ascontiguousarray(window), (32, 16))
    with stoker.Loader(
        paths=[path],
        augment=None,
        image_size=(16, 32),
        batch_size=1,
        workers=0,
        crop_to_aspect_ratio=True,
        interpolation="bilinear",
    ) as win:
        x, _ = next(iter(win))
    assert np.abs(x[0].astype(int) - want).max() <= 1


@pytest.mark.timeout(180)
def test_output_dtype_for_every_adapter_and_channels_first_keras():
    import keras
    import tensorflow as tf
    import torch

    images = np.random.default_rng(3).integers(0, 256, (8, 6, 5, 3), dtype=np.uint8)
    with stoker.Loader(images, labels=np.arange(8), batch_size=4, workers=1) as loader:
        got = {
            "keras": loader.keras(dtype="float32", mean=0, std=1)[0],
            "jax": next(iter(loader.jax(dtype="float32", mean=0, std=1))),
            "tf": next(iter(loader.tf(dtype=tf.float32, mean=0, std=1))),
            "torch": next(iter(loader.torch(dtype=torch.float32, mean=0, std=1))),  # (B, C, H, W)
        }
        before = keras.config.image_data_format()
        keras.config.set_image_data_format("channels_first")
        try:
            first = loader.keras()[1]
        finally:
            keras.config.set_image_data_format(before)
    for name, (x, y) in got.items():
        x, y = np.asarray(x), np.asarray(y)
        x = x.transpose(0, 2, 3, 1) if name == "torch" else x
        assert x.dtype == np.float32, name
        assert np.allclose(x, images[y].astype(np.float32) / 255), name
    assert first[0].shape == (4, 3, 6, 5)
    assert np.array_equal(first[0], images[first[1]].transpose(0, 3, 1, 2))


SIZES_PAD = [(32, 32), (48, 80), (100, 60)]


@pytest.mark.timeout(300)
def test_pad_to_aspect_ratio_places_the_image_where_keras_does(tmp_path):
    """Against keras.utils.image_dataset_from_directory(pad_to_aspect_ratio=True) itself, on
    real JPEGs of many aspect ratios: the border is the same rows and columns exactly; the
    pixels differ only by Keras' decoder (TensorFlow's default IDCT is libjpeg's fast one,
    stoker's the accurate one, 0-6 levels): against tf.image.resize_with_pad on the accurate
    decode, every pixel is within 1 level (the uint8 rounding of the resize)."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    from stoker.datasets import make_image_folder

    root = make_image_folder(tmp_path, classes=2, per_class=5, min_side=64, max_side=120, seed=1)
    files = sorted(str(p) for p in root.glob("*/*.jpg"))
    for k, size in enumerate(SIZES_PAD):
        ds = keras.utils.image_dataset_from_directory(
            str(root),
            image_size=size,
            batch_size=10,
            shuffle=False,
            verbose=False,
            pad_to_aspect_ratio=True,
            interpolation="bilinear",
        )
        theirs = np.concatenate([x.numpy() for x, _ in ds])
        with stoker.Loader(
            root,
            image_size=size,
            augment=None,
            shuffle=False,
            batch_size=10,
            workers=2 if k == 0 else 0,
            interpolation="bilinear",
            pad_to_aspect_ratio=True,
        ) as loader:
            ours = np.concatenate([x for x, _ in loader])
        assert loader.file_paths == files
        for i in range(len(files)):  # the geometry: the same black rows and columns
            for axis in (0, 1):
                black = (theirs[i] == 0).all(axis=(1 - axis, 2))
                assert np.array_equal(black, (ours[i] == 0).all(axis=(1 - axis, 2)))
        diff = np.abs(ours.astype(np.float32) - theirs)
        assert diff.mean() < 1.5 and diff.max() <= 8, (size, diff.mean(), diff.max())
        accurate = np.stack(
            [
                tf.image.resize_with_pad(
                    tf.io.decode_jpeg(
                        tf.io.read_file(f), channels=3, dct_method="INTEGER_ACCURATE"
                    ),
                    *size,
                    method="bilinear",
                ).numpy()
                for f in files
            ]
        )
        assert np.abs(ours.astype(np.float32) - accurate).max() <= 1.0, size


def test_pad_to_aspect_ratio_with_masks_is_refused():
    images = np.zeros((4, 16, 8, 3), np.uint8)
    with pytest.raises(ConfigError, match="crop_to_aspect_ratio"):
        stoker.Loader(images, masks=np.zeros((4, 16, 8), np.uint8), pad_to_aspect_ratio=True)

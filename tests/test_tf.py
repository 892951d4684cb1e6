"""TensorFlow adapter: a tf.data.Dataset with an exact signature and cardinality, one epoch per
iteration, values equal to the numpy path, and seamless continuation of a resumed loader."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import stoker

tf = pytest.importorskip("tensorflow")

SMALL = {"batch_size": 8, "image_size": 32}


def _numpy_stream(folder: pathlib.Path, count: int, state=None, **kw) -> list[tuple]:
    """The first ``count`` batches of ``loader.stream()``, copied."""
    with stoker.Loader(folder, **{**SMALL, **kw}) as loader:
        if state is not None:
            loader.load_state_dict(state)
        stream = loader.stream()
        return [tuple(a.copy() for a in next(stream)) for _ in range(count)]


@pytest.mark.timeout(120)
def test_two_epochs_match_the_numpy_path(image_folder: pathlib.Path) -> None:
    expected = _numpy_stream(image_folder, 8, workers=2, seed=7)
    with stoker.Loader(image_folder, workers=2, seed=7, **SMALL) as loader:
        ds = loader.tf()
        assert isinstance(ds, tf.data.Dataset)
        images_spec, labels_spec = ds.element_spec
        assert images_spec.shape.as_list() == [8, 32, 32, 3] and images_spec.dtype == tf.uint8
        assert labels_spec.shape.as_list() == [8] and labels_spec.dtype == tf.int64
        assert int(ds.cardinality()) == len(ds) == len(loader) == 4
        epochs = [[(x.numpy(), y.numpy()) for x, y in ds] for _ in range(2)]
        assert loader.stats().batches == 8
    assert [len(e) for e in epochs] == [4, 4]
    for (x, y), (ex, ey) in zip(epochs[0] + epochs[1], expected, strict=True):
        assert x.shape == (8, 32, 32, 3) and y.shape == (8,)
        assert np.array_equal(x, ex) and np.array_equal(y, ey)


@pytest.mark.timeout(60)
def test_short_last_batch_gives_a_free_batch_axis(image_folder: pathlib.Path) -> None:
    kw = {"workers": 0, "augment": "eval", "shuffle": False}
    expected = _numpy_stream(image_folder, 5, **kw)
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        ds = loader.tf()
        assert ds.element_spec[0].shape.as_list() == [None, 32, 32, 3]
        assert ds.element_spec[1].shape.as_list() == [None]
        got = [(x.numpy(), y.numpy()) for x, y in ds]
    assert [len(y) for _, y in got] == [8, 8, 8, 8, 4]
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert np.array_equal(x, ex) and np.array_equal(y, ey)
    with stoker.Loader(image_folder, **SMALL, workers=0, shuffle=False, drop_last=True) as loader:
        assert loader.tf().element_spec[0].shape.as_list() == [8, 32, 32, 3]


@pytest.mark.timeout(60)
def test_resumed_loader_continues_and_keeps_the_cardinality(image_folder: pathlib.Path) -> None:
    with stoker.Loader(image_folder, workers=0, seed=9, **SMALL) as loader:
        stream = loader.stream()
        next(stream)
        next(stream)
        state = loader.state_dict()
    expected = _numpy_stream(image_folder, 8, state=state, workers=0, seed=9)
    with stoker.Loader(image_folder, workers=0, seed=9, **SMALL) as loader:
        loader.load_state_dict(state)
        ds = loader.tf()
        epochs = [[(x.numpy(), y.numpy()) for x, y in ds] for _ in range(2)]
        assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["position"] == 2
    assert [len(e) for e in epochs] == [4, 4]  # 2 batches of epoch 0, then 2 of epoch 1, ...
    for (x, y), (ex, ey) in zip(epochs[0] + epochs[1], expected, strict=True):
        assert np.array_equal(x, ex) and np.array_equal(y, ey)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [None, "float32"])
def test_channels_first_layout(image_folder: pathlib.Path, dtype) -> None:
    kw = {"workers": 0, "augment": "eval", "shuffle": False}
    expected = _numpy_stream(image_folder, 2, **kw)
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        ds = loader.tf(layout="channels_first", dtype=dtype)
        spec = ds.element_spec[0]
        assert spec.shape.as_list() == [None, 3, 32, 32]
        assert spec.dtype == (tf.uint8 if dtype is None else tf.float32)
        assert int(ds.cardinality()) == len(loader)
        got = [x.numpy() for x, _ in ds.take(2)]
        with pytest.raises(stoker.ConfigError, match="layout='NCHW'"):
            loader.tf(layout="NCHW")
    for x, (ex, _) in zip(got, expected, strict=True):
        assert np.array_equal(x, ex.transpose(0, 3, 1, 2).astype(x.dtype))

"""JAX adapter: a real training loop, values equal to the numpy path, device_put one batch ahead,
shardings and state delegation."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import stoker

jax = pytest.importorskip("jax")
jnp = jax.numpy

SMALL = {"batch_size": 8, "image_size": 32}


def _numpy_batches(folder: pathlib.Path, **kw) -> list[tuple[np.ndarray, np.ndarray]]:
    with stoker.Loader(folder, **{**SMALL, **kw}) as loader:
        return [(x.copy(), y.copy()) for x, y in loader]


def _loss(params, x, y):
    feats = x.reshape(x.shape[0], -1).astype(jnp.float32) / 255.0
    logits = feats @ params["w"] + params["b"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_training_loop_learns(image_folder: pathlib.Path) -> None:
    params = {"w": jnp.zeros((32 * 32 * 3, 3)), "b": jnp.zeros(3)}
    step = jax.jit(
        lambda p, x, y: jax.tree_util.tree_map(
            lambda a, g: a - 0.05 * g, p, jax.grad(_loss)(p, x, y)
        )
    )
    loss = jax.jit(_loss)
    with stoker.Loader(image_folder, workers=2, seed=0, augment="eval", **SMALL) as loader:
        batches = loader.jax()
        assert len(batches) == len(loader) == 4
        epoch_losses = []
        for _ in range(5):
            losses = []
            for x, y in batches:
                assert isinstance(x, jax.Array) and isinstance(y, jax.Array)
                assert x.shape == (8, 32, 32, 3) and x.dtype == jnp.uint8
                assert y.shape == (8,) and jnp.issubdtype(y.dtype, jnp.integer)
                losses.append(float(loss(params, x, y)))
                params = step(params, x, y)
            epoch_losses.append(float(np.mean(losses)))
        assert loader.stats().batches == 5 * len(loader)
    assert all(np.isfinite(epoch_losses))
    assert epoch_losses[-1] < epoch_losses[0], epoch_losses


@pytest.mark.timeout(60)
def test_values_equal_the_numpy_path(image_folder: pathlib.Path) -> None:
    expected = _numpy_batches(image_folder, workers=1, seed=5)
    with stoker.Loader(image_folder, workers=1, seed=5, **SMALL) as loader:
        got = [(np.asarray(x), np.asarray(y)) for x, y in loader.jax()]
    assert len(got) == len(expected) == 4
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert np.array_equal(x, ex) and np.array_equal(y, ey)


@pytest.mark.timeout(60)
def test_one_batch_ahead_gives_the_same_batches(image_folder: pathlib.Path) -> None:
    kw = {"workers": 0, "augment": "eval", "shuffle": False}
    expected = _numpy_batches(image_folder, **kw)
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        batches = loader.jax()
        got = []
        for x, y in batches:
            got.append((np.asarray(x), np.asarray(y)))
            if len(got) == 1:  # the next batch was already taken, but not received
                assert loader.stats().batches == 2
                assert loader.state_dict()["position"] == 1
    assert [len(y) for _, y in got] == [8, 8, 8, 8, 4]
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert np.array_equal(x, ex) and np.array_equal(y, ey)


@pytest.mark.timeout(60)
def test_device_and_sharding_targets(image_folder: pathlib.Path) -> None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from stoker.adapters.jax import _on_cpu

    device = jax.devices()[0]
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    assert _on_cpu(None) and _on_cpu(device) and _on_cpu(sharding)
    assert _on_cpu((sharding, sharding))
    with stoker.Loader(image_folder, workers=0, **SMALL) as loader:
        x, y = next(iter(loader.jax(sharding=device)))
        assert x.devices() == {device} and y.devices() == {device}
        x, y = next(iter(loader.jax(sharding=sharding)))
        assert x.sharding == sharding and y.sharding == sharding
        assert "JaxLoader" in repr(loader.jax())


@pytest.mark.timeout(60)
def test_state_dict_delegates(image_folder: pathlib.Path) -> None:
    with stoker.Loader(image_folder, workers=0, seed=3, **SMALL) as loader:
        batches = loader.jax()
        it = iter(batches)
        next(it)
        state = batches.state_dict()
        assert state == loader.state_dict() and state["position"] == 1
        batches.load_state_dict({**state, "position": 3})
        assert len(list(batches)) == 1

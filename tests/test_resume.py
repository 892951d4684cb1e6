"""Positions count what the training step received, through every adapter and its look-ahead:
a state taken after ``k`` batches resumes at batch ``k``, compared batch by batch with an
uninterrupted run; and no adapter makes the loader replace slots (no "kept past reuse")."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import stoker

KW = {"batch_size": 8, "image_size": 16, "seed": 4}
TAKEN = 2  # batches received before the state is saved
FOLLOWING = 6  # batches compared after the resume: the rest of epoch 0 and into epoch 1


def _arrays(batch) -> tuple[np.ndarray, ...]:
    return tuple(np.array(a) for a in batch)


def _numpy(loader):
    return loader.stream()


def _torch(device):
    def make(loader):
        return _stream(loader.torch(device=device, layout="channels_last"))  # as numpy

    return make


def _jax(sharded):
    def make(loader):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        sharding = None
        if sharded:
            sharding = NamedSharding(
                Mesh(np.array(jax.devices()[:1]), ("data",)), PartitionSpec("data")
            )
        return _stream(loader.jax(sharding=sharding))

    return make


def _tf(loader):
    return _stream(loader.tf())


def _stream(view):
    """Epoch after epoch of a view, as a training loop iterates it."""
    while True:
        yield from view


ADAPTERS = {
    "numpy": (None, _numpy),
    "torch": ("torch", _torch(None)),
    "torch-cpu": ("torch", _torch("cpu")),
    "jax": ("jax", _jax(False)),
    "jax-sharded": ("jax", _jax(True)),
    "tf": ("tensorflow", _tf),
}


def _need(module: str | None) -> None:
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(ADAPTERS))
def test_state_after_k_batches_resumes_at_batch_k(name: str, image_folder: pathlib.Path) -> None:
    module, make = ADAPTERS[name]
    _need(module)
    with stoker.Loader(image_folder, workers=0, **KW) as plain:
        stream = plain.stream()
        expected = [_arrays(next(stream)) for _ in range(TAKEN + FOLLOWING)]
    with stoker.Loader(image_folder, workers=0, **KW) as first:
        batches = make(first)
        got = [_arrays(next(batches)) for _ in range(TAKEN)]
        state = first.state_dict()
        assert (state["epoch"], state["position"]) == (0, TAKEN)
        taken = first.stats().batches  # what the adapter pulled, look-ahead included
        batches.close()
    if name.startswith("jax"):
        assert taken == TAKEN + 1  # one batch is put ahead, yet the state counts TAKEN
    elif name == "tf":
        assert taken == TAKEN  # no prefetch of tf.data's own pulls batches ahead
    with stoker.Loader(image_folder, workers=0, **KW) as again:
        again.load_state_dict(state)
        batches = make(again)
        got += [_arrays(next(batches)) for _ in range(FOLLOWING)]
        batches.close()
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert all(np.array_equal(a, b) for a, b in zip(g, e, strict=True)), f"batch {k}"


@pytest.mark.timeout(60)
def test_a_stopped_look_ahead_gives_its_batch_back(image_folder: pathlib.Path) -> None:
    _need("jax")
    with stoker.Loader(image_folder, workers=0, **KW) as plain:
        expected = [_arrays(b) for b in plain]
    with stoker.Loader(image_folder, workers=0, **KW) as loader:
        view = loader.jax()
        got = []
        for batch in view:  # the next batch is already put when the loop breaks
            got.append(_arrays(batch))
            if len(got) == 2:
                break
        assert loader.state_dict()["position"] == 2
        got += [_arrays(b) for b in view]
    assert len(got) == len(expected) == 4
    for g, e in zip(got, expected, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(g, e, strict=True))


@pytest.mark.timeout(60)
def test_empty_state_starts_fresh(image_folder: pathlib.Path) -> None:
    with stoker.Loader(image_folder, workers=0, **KW) as loader:
        first = _arrays(next(iter(loader)))
        for _ in loader:
            pass
        next(iter(loader))
        assert loader.state_dict()["epoch"] == 1
        loader.load_state_dict({})
        assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (0, 0)
        again = _arrays(next(iter(loader)))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(ADAPTERS))
def test_no_slot_is_kept_past_reuse(name: str, image_folder: pathlib.Path) -> None:
    """A loop that keeps nothing over several epochs never makes the loader replace a slot."""
    module, make = ADAPTERS[name]
    _need(module)
    with stoker.Loader(image_folder, workers=1, prefetch=2, **KW) as loader:
        batches = make(loader)
        total = 0
        for _, (x, y) in zip(range(3 * len(loader)), batches, strict=False):
            total += int(np.asarray(y).shape[0]) + 0 * int(np.asarray(x)[0, 0, 0, 0])
        batches.close()
        report = loader.stats()
    assert total == 3 * len(loader) * KW["batch_size"]
    assert report.kept_batches == 0, f"{name}: {report.kept_batches} slots replaced"


@pytest.mark.timeout(60)
def test_set_epoch_starts_that_epoch(image_folder: pathlib.Path) -> None:
    with stoker.Loader(image_folder, workers=0, **KW) as plain:
        for _ in range(3 * len(plain)):  # epochs 0, 1 and 2
            next(iter(plain))
        expected = [_arrays(b) for b in plain]  # epoch 3
    with stoker.Loader(image_folder, workers=0, **KW) as loader:
        next(iter(loader))
        view = loader.jax() if importlib.util.find_spec("jax") else loader
        view.set_epoch(3)
        assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (3, 0)
        got = [_arrays(b) for b in view]
        with pytest.raises(stoker.ConfigError, match="set_epoch"):
            loader.set_epoch(-1)
    for g, e in zip(got, expected, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(g, e, strict=True))

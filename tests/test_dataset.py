"""The per-sample dataset API: ``stoker.Loader(dataset)`` for any ``__len__``/``__getitem__``
object, in stoker's workers: determinism across worker counts, exact resume, the failure
budget, a worker crash, every adapter, a torch ``Dataset`` ported unchanged."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import stoker
from stoker.errors import ConfigError, TooManyErrors, WorkerDied


class Clips:
    """A non-image dataset: an 'audio clip' (random, from stoker.sample_rng), features, a label."""

    def __init__(self, n: int = 48, bad: tuple[int, ...] = (), crash: int = -1) -> None:
        self.n, self.bad, self.crash = n, bad, crash
        self.parent = os.getpid()  # ``crash`` ends only a worker, never the test's process

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if i in self.bad:
            raise OSError(f"clip {i} is truncated")
        if i == self.crash and os.getpid() != self.parent:
            os._exit(3)
        noise = stoker.sample_rng().normal(size=64).astype(np.float32)
        return {
            "audio": np.sin(np.arange(64, dtype=np.float32) * (i + 1) / 10) + noise,
            "features": np.full((2, 3), i, np.float64),
            "label": np.int64(i % 4),
        }


def _epoch(loader) -> list[dict[str, np.ndarray]]:
    return [{k: np.array(v) for k, v in b.items()} for b in loader]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.timeout(180)
def test_same_batches_whatever_the_worker_count_and_fields_kept_exactly():
    runs = []
    for workers in (0, 1, 2):
        with stoker.Loader(Clips(), batch_size=8, seed=4, workers=workers) as loader:
            runs.append(_epoch(loader) + _epoch(loader))  # two epochs: new randomness
    assert _same(runs[0], runs[1]) and _same(runs[0], runs[2])
    first = runs[0][0]
    assert first["audio"].dtype == np.float32 and first["audio"].shape == (8, 64)
    assert first["features"].dtype == np.float64 and first["features"].shape == (8, 2, 3)
    assert first["label"].dtype == np.int64
    assert not np.array_equal(runs[0][0]["audio"], runs[0][6]["audio"])  # epochs differ


@pytest.mark.timeout(120)
def test_exact_resume_mid_epoch():
    with stoker.Loader(Clips(), batch_size=8, seed=2, workers=2) as full:
        want = _epoch(full)
    with stoker.Loader(Clips(), batch_size=8, seed=2, workers=2) as first:
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
    with stoker.Loader(Clips(), batch_size=8, seed=2, workers=1) as again:
        again.load_state_dict(state)
        assert _same(_epoch(again), want[3:])


@pytest.mark.timeout(120)
def test_a_bad_sample_within_the_budget_is_replaced_and_named():
    with stoker.Loader(
        Clips(bad=(5,)),
        batch_size=8,
        shuffle=False,
        workers=2,
        max_errors=1,
        batch=("audio", "label", "index"),
    ) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = list(loader)
        assert all(len(b[2]) == 8 for b in batches)
        indices = np.concatenate([b[2] for b in batches])
        assert 5 not in indices and len(indices) == 48
        assert any("dataset[5]" in str(w.message) and "truncated" in str(w.message) for w in caught)
        report = loader.stats()
        assert "dataset[5]" in str(report)
    with stoker.Loader(Clips(bad=(5, 9)), batch_size=8, workers=1, max_errors=1) as loader:
        with pytest.raises(TooManyErrors, match="dataset\\[9\\]|dataset\\[5\\]"):
            list(loader)


@pytest.mark.timeout(120)
def test_a_worker_crash_names_the_sample():
    # batches made in this process while the workers start skip the crash; the stream goes
    # on until a worker reaches sample 13 (in batch 1 of every epoch)
    with stoker.Loader(Clips(crash=13), batch_size=8, shuffle=False, workers=2) as loader:
        with pytest.raises(WorkerDied, match="dataset\\[13\\]"):
            for _ in loader.stream():
                pass


class WrongShape(Clips):
    def __getitem__(self, i):
        sample = super().__getitem__(i)
        if i == 3:
            sample["audio"] = sample["audio"][:10]
        return sample


@pytest.mark.timeout(60)
def test_fields_must_keep_shape_and_dtype_and_spec_declares_them():
    with stoker.Loader(WrongShape(), batch_size=8, workers=0, max_errors=0) as loader:
        with pytest.raises(TooManyErrors, match="field 'audio' is float32 \\(10,\\)"):
            list(loader)
    spec = {"audio": ((64,), "float32"), "features": ((2, 3), "float64"), "label": ((), "int64")}
    with stoker.Loader(Clips(), spec=spec, batch_size=8, workers=0) as loader:
        assert next(iter(loader))["features"].shape == (8, 2, 3)
    bad = {**spec, "label": ((), "int32")}
    with stoker.Loader(Clips(), spec=bad, batch_size=8, workers=0, max_errors=0) as loader:
        with pytest.raises(TooManyErrors, match="field 'label' is int64"):
            list(loader)
    with pytest.raises(ConfigError, match="give \\(shape, dtype\\)"):
        stoker.Loader(Clips(), spec={"audio": "float32"}, workers=0)


@pytest.mark.timeout(240)
def test_every_adapter_with_a_dataset():
    import tensorflow as tf

    with stoker.Loader(Clips(), batch_size=8, shuffle=False, workers=1) as loader:
        want = _epoch(loader)[0]
        t = next(iter(loader.torch()))
        j = next(iter(loader.jax()))
        f = next(iter(loader.tf()))
        k = loader.keras()[0]
    for got in (t, j, f, k):
        for name in ("audio", "features", "label"):
            value = got[name].numpy() if isinstance(got[name], tf.Tensor) else np.asarray(got[name])
            if name == "features" and value.dtype == np.float32:  # JAX without x64
                value = value.astype(np.float64)
            assert value.shape == want[name].shape
    assert str(t["audio"].dtype) == "torch.float32" and str(t["features"].dtype) == "torch.float64"
    assert f["features"].dtype == tf.float64 and f["label"].dtype == tf.int64
    assert k["audio"].dtype == np.float32


def _torch_dataset():
    import torch

    class Pairs(torch.utils.data.Dataset):
        def __init__(self):
            self.x = torch.arange(40 * 6, dtype=torch.float32).reshape(40, 6)
            self.y = torch.arange(40) % 5

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i] * 2, self.y[i]

    return Pairs()


@pytest.mark.timeout(120)
def test_a_torch_dataset_ported_unchanged():
    import torch

    ds = _torch_dataset()
    with stoker.Loader(ds, batch_size=8, shuffle=False, workers=2) as loader:
        batches = list(loader.torch())
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert torch.equal(x, ds.x * 2) and torch.equal(y, ds.y) and y.dtype == torch.int64


class GlobalRandom:
    """Ported code: ``__getitem__`` draws from numpy's global RNG, Python's ``random`` and
    torch's global generator (never from ``stoker.sample_rng()``). It holds a tensor, as torch
    datasets do, so a worker has torch imported before its first sample."""

    def __init__(self) -> None:
        import torch

        self.scale = torch.ones(2, dtype=torch.float64)

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        import random

        import torch

        return {
            "np": np.random.random(3),
            "py": np.float64(random.random()),
            "torch": torch.rand(2, dtype=torch.float64) * self.scale,
            "i": np.int64(i),
        }


def _by_index(epoch: list[dict[str, np.ndarray]]) -> dict[int, np.ndarray]:
    rows = {}
    for batch in epoch:
        for j, i in enumerate(batch["i"]):
            rows[int(i)] = np.concatenate([batch["np"][j], [batch["py"][j]], batch["torch"][j]])
    return rows


@pytest.mark.timeout(240)
def test_global_random_in_getitem_is_reseeded_per_sample():
    import random

    import torch

    np.random.seed(123)
    random.seed(123)
    torch.manual_seed(123)
    before = (np.random.random(), random.random(), float(torch.rand(1)))
    np.random.seed(123)
    random.seed(123)
    torch.manual_seed(123)
    runs = []
    for workers in (0, 1, 2):
        with stoker.Loader(GlobalRandom(), batch_size=6, seed=7, workers=workers) as loader:
            runs.append([_by_index(_epoch(loader)), _by_index(_epoch(loader))])
        if workers == 0:  # in the calling process the user's global states are put back
            assert (np.random.random(), random.random(), float(torch.rand(1))) == before
    for epoch in (0, 1):  # the same numbers for a sample whatever the worker count
        for i in range(24):
            assert np.array_equal(runs[0][epoch][i], runs[1][epoch][i])
            assert np.array_equal(runs[0][epoch][i], runs[2][epoch][i])
    first = runs[2][0]
    values = np.stack([first[i] for i in range(24)])
    # no two samples (in different workers or not) share their numbers, nor epochs, nor
    # numpy's, random's and torch's streams each other's
    assert len({tuple(r) for r in values[:, :3]}) == 24
    assert len(set(values[:, 3])) == 24 and len(set(values[:, 4])) == 24
    assert not set(values[:, 0]) & set(values[:, 3]) and not set(values[:, 0]) & set(values[:, 4])
    assert all(not np.array_equal(first[i], runs[2][1][i]) for i in range(24))
    with stoker.Loader(GlobalRandom(), batch_size=6, seed=8, workers=0) as other:
        assert not np.array_equal(_by_index(_epoch(other))[0], first[0])  # the seed matters


def _hf_images(tmp_path):
    """A Hugging Face ``datasets`` image dataset whose ``with_transform`` adds a fixed-size
    ``pixel_values`` and keeps the PIL ``image`` column (of varying size), as the HF
    image-classification scripts do."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    paths = []
    for i, (w, h) in enumerate([(20, 16), (24, 30), (18, 18), (40, 22)] * 2):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (w, h), (i * 30, 5, 9)).save(path)
        paths.append(str(path))
    table = {"image": paths, "label": [i % 2 for i in range(8)]}
    ds = datasets.Dataset.from_dict(table).cast_column("image", datasets.Image())

    def pixels(batch):
        small = [i.convert("RGB").resize((8, 8)) for i in batch["image"]]
        batch["pixel_values"] = [np.asarray(i) for i in small]
        return batch

    return ds.with_transform(pixels)


@pytest.mark.timeout(120)
def test_batch_leaves_a_hugging_face_datasets_variable_size_field_out_of_the_batch(tmp_path):
    ds = _hf_images(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no sample skipped
        kept = ("pixel_values", "label")
        with stoker.Loader(ds, batch_size=4, workers=0, shuffle=False, batch=kept) as loader:
            assert "image" not in loader.recipe.schema.names  # never checked, copied or sent
            got = list(loader)
    assert [y.tolist() for _, y in got] == [[0, 1, 0, 1], [0, 1, 0, 1]]
    assert got[0][0].shape == (4, 8, 8, 3)
    want = np.asarray(ds[1]["image"].convert("RGB").resize((8, 8)))
    assert np.array_equal(got[0][0][1], want)
    # spec= need not declare a field batch= leaves out
    spec = {"pixel_values": ((8, 8, 3), "uint8"), "label": ((), "int64")}
    with stoker.Loader(ds, batch_size=4, workers=0, spec=spec, batch=kept) as loader:
        assert len(list(loader)) == 2


@pytest.mark.timeout(120)
def test_a_variable_size_field_is_an_error_saying_how_to_resize_or_leave_it_out(tmp_path):
    ds = _hf_images(tmp_path)
    fix = "batch=\\('label', 'pixel_values'\\)"
    with stoker.Loader(ds, batch_size=4, workers=0, shuffle=False, max_errors=0) as loader:
        wrong = f"field 'image' is uint8 \\(30, 24, 3\\).*resize.*{fix}"
        with pytest.raises(TooManyErrors, match=wrong) as err:
            next(iter(loader))
    assert "spec=" not in str(err.value)  # spec= cannot describe a field of varying size
    spec = {"pixel_values": ((8, 8, 3), "uint8"), "label": ((), "int64")}
    with pytest.raises(ConfigError, match=f"no entry for the dataset's field 'image'.*{fix}"):
        stoker.Loader(ds, batch_size=4, workers=0, spec=spec)

"""PyTorch adapter: a real training loop, layouts, on-device float conversion and normalisation,
and state delegation."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")

SMALL = {"batch_size": 8, "image_size": 32}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _numpy_batches(folder: pathlib.Path, **kw) -> list[tuple[np.ndarray, np.ndarray]]:
    with stoker.Loader(folder, **{**SMALL, **kw}) as loader:
        return [(x.copy(), y.copy()) for x, y in loader]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_training_loop_learns(image_folder: pathlib.Path) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 3),
    )
    before = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    loss_fn = torch.nn.CrossEntropyLoss()
    with stoker.Loader(image_folder, workers=2, seed=0, augment="eval", **SMALL) as loader:
        batches = loader.torch(
            device="cpu", channels_last=False, dtype=torch.float32, mean=0.0, std=1.0
        )
        assert len(batches) == len(loader) == 4
        epoch_losses = []
        for _ in range(8):
            losses = []
            for x, y in batches:
                assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32
                assert y.dtype == torch.int64 and 0.0 <= x.min() and x.max() <= 1.0
                loss = loss_fn(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            epoch_losses.append(float(np.mean(losses)))
        assert loader.stats().batches == 8 * len(loader)
    assert all(np.isfinite(epoch_losses))
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert epoch_losses[-1] < epoch_losses[0], epoch_losses


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option", [{"layout": "channels_last"}, {"channels_last": True}])
def test_channels_last_layout_is_the_loaders_own_zero_copy(image_folder, option) -> None:
    expected = _numpy_batches(image_folder, workers=0, seed=1)
    with stoker.Loader(image_folder, workers=0, seed=1, **SMALL) as loader:
        got = list(loader.torch(**option))
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert x.dtype == torch.uint8 and x.shape == (8, 32, 32, 3) and x.is_contiguous()
        assert np.array_equal(x.numpy(), ex) and np.array_equal(y.numpy(), ey)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option", [{}, {"layout": "channels_first"}, {"channels_last": False}])
def test_nchw_by_default_as_a_free_view(image_folder: pathlib.Path, option) -> None:
    """PyTorch's (B, C, H, W) unless asked otherwise: a permuted view of the loader's batch
    (no copy: channels-last memory), equal to the numpy batch transposed."""
    expected = _numpy_batches(image_folder, workers=0, seed=2)
    with stoker.Loader(image_folder, workers=0, seed=2, **SMALL) as loader:
        for (x, _), (ex, _) in zip(loader.torch(**option), expected, strict=True):
            assert x.shape == (8, 3, 32, 32) and x.dtype == torch.uint8
            assert x.is_contiguous(memory_format=torch.channels_last)
            assert np.array_equal(x.numpy(), ex.transpose(0, 3, 1, 2))


@pytest.mark.timeout(60)
def test_nchw_default_with_one_channel() -> None:
    gray = np.random.default_rng(0).integers(0, 256, (8, 12, 10), np.uint8)
    with stoker.Loader(gray[..., None], batch_size=4, shuffle=False, workers=0) as loader:
        x, _ = next(iter(loader.torch()))
    assert x.shape == (4, 1, 12, 10) and np.array_equal(x[:, 0].numpy(), gray[:4])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("units", [1.0, 255.0])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_cpu_float_normalised_matches_numpy(
    image_folder: pathlib.Path, units: float, layout: str
) -> None:
    kw = {"workers": 0, "augment": "eval", "shuffle": False}
    expected = _numpy_batches(image_folder, **kw)
    mean = np.array(IMAGENET_MEAN) * units
    std = np.array(IMAGENET_STD) * units
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        got = list(
            loader.torch(
                device="cpu", layout=layout, dtype=torch.float32, mean=tuple(mean), std=tuple(std)
            )
        )
    assert [len(y) for _, y in got] == [8, 8, 8, 8, 4]  # the short last batch comes too
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        ref = (ex.astype(np.float64) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        if layout == "channels_first":
            ref = ref.transpose(0, 3, 1, 2)
        assert x.dtype == torch.float32 and x.device.type == "cpu"
        assert tuple(x.shape) == ref.shape
        np.testing.assert_allclose(x.numpy(), ref, rtol=1e-5, atol=1e-5)
        assert np.array_equal(y.numpy(), ey)


@pytest.mark.timeout(60)
def test_half_precision_and_unit_range(image_folder: pathlib.Path) -> None:
    kw = {"workers": 0, "augment": "eval", "shuffle": False}
    (ex, _), *_ = _numpy_batches(image_folder, **kw)
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        x, _ = next(iter(loader.torch(device="cpu", dtype=torch.bfloat16, mean=0, std=1)))
    assert x.dtype == torch.bfloat16 and x.shape == (8, 3, 32, 32)
    np.testing.assert_allclose(x.float().numpy(), ex.transpose(0, 3, 1, 2) / 255.0, atol=4e-3)
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        x, _ = next(iter(loader.torch(device="cpu", dtype=torch.float64, layout="channels_last")))
    assert x.dtype == torch.float64 and np.array_equal(x.numpy(), ex.astype(np.float64))


@pytest.mark.timeout(60)
def test_state_dict_delegates_and_resumes(image_folder: pathlib.Path) -> None:
    expected = _numpy_batches(image_folder, workers=0, seed=3)
    with stoker.Loader(image_folder, workers=0, seed=3, **SMALL) as loader:
        batches = loader.torch()
        it = iter(batches)
        next(it)
        next(it)
        state = batches.state_dict()
        assert state == loader.state_dict() and state["position"] == 2
    with stoker.Loader(image_folder, workers=0, seed=3, **SMALL) as loader:
        batches = loader.torch()
        batches.load_state_dict(state)
        rest = [x.numpy().transpose(0, 2, 3, 1).copy() for x, _ in batches]
    assert len(rest) == 2
    for x, (ex, _) in zip(rest, expected[2:], strict=True):
        assert np.array_equal(x, ex)


@pytest.mark.timeout(60)
def test_bad_options_are_refused(image_folder: pathlib.Path) -> None:
    with stoker.Loader(image_folder, workers=0, **SMALL) as loader:
        with pytest.raises(stoker.ConfigError, match="both mean and std"):
            loader.torch(dtype=torch.float32, mean=0.5)
        with pytest.raises(stoker.ConfigError, match="floating dtype"):
            loader.torch(mean=0.5, std=0.2)
        with pytest.raises(stoker.ConfigError, match="std > 0"):
            loader.torch(dtype=torch.float32, mean=0.5, std=0.0)
        with pytest.raises(stoker.ConfigError, match="torch.dtype"):
            loader.torch(dtype="float32")
        with pytest.raises(stoker.ConfigError, match="layout=.NCHW."):
            loader.torch(layout="NCHW")
        with pytest.raises(stoker.ConfigError, match="disagree"):
            loader.torch(layout="channels_last", channels_last=False)
        assert "TorchLoader" in repr(loader.torch(device="cpu"))


@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copies_ahead_and_matches_the_cpu_path(image_folder: pathlib.Path) -> None:
    kw = {"workers": 1, "augment": "eval", "shuffle": False}
    opts = {
        "channels_last": False,
        "dtype": torch.float32,
        "mean": IMAGENET_MEAN,
        "std": IMAGENET_STD,
    }
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        cpu = [(x.clone(), y.clone()) for x, y in loader.torch(device="cpu", **opts)]
    with stoker.Loader(image_folder, **SMALL, **kw) as loader:
        batches = loader.torch(device="cuda", **opts)
        got = []
        for i, (x, y) in enumerate(batches):
            assert x.device.type == "cuda" and y.device.type == "cuda"
            if i < len(batches) - 1:  # the next batch was taken (and its copy issued) already
                assert loader.stats().batches == i + 2
                assert loader.state_dict()["position"] == i + 1  # but not received
            got.append((x.float().mul(2).cpu(), y.cpu()))  # use it on the consumer's stream
        torch.cuda.synchronize()
    assert [len(y) for _, y in got] == [8, 8, 8, 8, 4]
    for (x, y), (cx, cy) in zip(got, cpu, strict=True):
        torch.testing.assert_close(x, cx * 2, rtol=1e-5, atol=1e-5)
        assert torch.equal(y, cy)

"""The CUDA path of ``torch(device="cuda")`` on CPU: the real transfer logic (page-locking the ring,
zero-copy from slots, fences holding slot reuse, the memcpy fallback and its reason, the GPU-clock
wait) with a fake at the CUDA boundary only. The fake copies *lazily*, like a DMA still in
flight: the bytes are read from host memory only when the copy's event completes, so a slot
reused before its fence completed would show up as wrong data.

The same paths run against a real GPU in benchmarks/gpu_check.py (``test_cuda_*`` below, which
need a CUDA device).
"""

from __future__ import annotations

import contextlib
import ctypes
import pathlib

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")

KW = {"batch_size": 8, "image_size": 16, "seed": 2, "augment": "train"}


class FakeStream:
    """Copies queued on a stream, taken by the next event recorded on it."""

    def __init__(self) -> None:
        self.queued: list = []

    def wait_event(self, event) -> None:
        """GPU-side wait: nothing for the host to do."""


class FakeEvent:
    def __init__(self, runtime, timing: bool) -> None:
        self.runtime, self.timing = runtime, timing
        self.copies: list = []
        self.done = False

    def record(self, stream) -> None:
        self.copies, stream.queued = stream.queued, []
        self.runtime.events.append(self)

    def query(self) -> bool:
        return self.done or (self.timing and not self.copies)

    def synchronize(self) -> None:
        """The copies this event covers happen now (a DMA completing)."""
        for address, nbytes, dst, _keep in self.copies:
            src = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
            dst.numpy().reshape(-1).view(np.uint8)[:] = src
        self.copies, self.done = [], True
        self.runtime.synced += 1

    def elapsed_time(self, end) -> float:
        return 2.0  # ms: the GPU's idle time between two timing events


class FakeCuda:
    """Stands in for stoker.adapters.cuda.CudaRuntime: the CUDA calls, nothing else."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []
        self.events: list[FakeEvent] = []
        self.synced = 0
        self.main = FakeStream()
        self.active = self.main
        self.owned: dict[int, object] = {}  # pinned buffers, kept until their copy is done

    def register(self, address: int, size: int) -> str | None:
        if self.fail:
            return self.fail
        self.registered[address] = size
        return None

    def unregister(self, address: int) -> None:
        self.unregistered.append(address)

    def side_stream(self) -> FakeStream:
        return FakeStream()

    def current_stream(self) -> FakeStream:
        return self.main

    @contextlib.contextmanager
    def on(self, stream):
        before, self.active = self.active, stream
        try:
            yield
        finally:
            self.active = before

    def event(self, timing: bool = False) -> FakeEvent:
        return FakeEvent(self, timing)

    def to_device(self, host):
        dst = torch.empty_like(host)
        keep = self.owned.get(host.data_ptr())  # a DMA reads raw memory: no reference to it
        self.active.queued.append((host.data_ptr(), host.numel() * host.element_size(), dst, keep))
        return dst

    def pinned(self, shape, dtype):
        t = torch.from_numpy(np.empty(shape, dtype))
        self.owned[t.data_ptr()] = t
        return t

    def use_on(self, tensor, stream) -> None:
        pass

    def finish(self) -> None:
        for event in self.events:
            if not event.done:
                event.synchronize()


def _expected(folder: pathlib.Path, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    with stoker.Loader(folder, workers=0, **KW) as plain:
        stream = plain.stream()
        return [tuple(a.copy() for a in next(stream)) for _ in range(count)]


def _run(loader, runtime, epochs: int = 2, **options):
    view = loader.torch(device="cuda", cuda_runtime=runtime, **options)
    got = []
    for _ in range(epochs):
        got += [(x, y) for x, y in view]  # "device" tensors: the fake's own memory
    runtime.finish()  # the GPU work still queued completes
    assert all(x.shape[1] == 3 for x, _ in got)  # PyTorch's (B, C, H, W) by default
    return [(x.permute(0, 2, 3, 1).numpy().copy(), y.numpy().copy()) for x, y in got]


def _same(got, expected) -> None:
    assert len(got) == len(expected)
    for k, ((x, y), (ex, ey)) in enumerate(zip(got, expected, strict=True)):
        assert np.array_equal(x, ex) and np.array_equal(y, ey), f"batch {k}"


@pytest.mark.timeout(120)
def test_zero_copy_from_page_locked_slots_waits_for_each_copy(image_folder) -> None:
    runtime = FakeCuda()
    with stoker.Loader(image_folder, workers=1, prefetch=2, **KW) as loader:
        got = _run(loader, runtime)
        report = loader.stats()
        slots = len(loader._ring().segments)
    _same(got, _expected(image_folder, 8))
    assert "zero-copy" in report.transfer and "zero-copy" in str(report)
    assert len(runtime.registered) == slots  # every ring slot page-locked once
    assert sorted(runtime.unregistered) == sorted(runtime.registered)  # and unlocked at close
    assert runtime.synced >= 6  # slot reuse waited on the copies' events
    assert report.kept_batches == 0
    # 2 ms GPU idle per batch; the first batch's wait is start-up, left out as the host's is
    assert report.device_wait_s == pytest.approx(7 * 0.002)
    assert "GPU waited" in str(report)


@pytest.mark.timeout(120)
def test_refused_page_locking_falls_back_to_memcpy_and_says_why(image_folder) -> None:
    runtime = FakeCuda(fail="cudaHostRegister: operation not supported (error 801)")
    with stoker.Loader(image_folder, workers=1, prefetch=2, **KW) as loader:
        got = _run(loader, runtime)
        report = loader.stats()
    _same(got, _expected(image_folder, 8))
    assert "memcpy" in report.transfer and "operation not supported" in report.transfer
    assert not runtime.registered
    with stoker.Loader(image_folder, workers=1, prefetch=2, **KW) as loader:
        with pytest.raises(stoker.StokerError, match="zero_copy=True"):
            _run(loader, FakeCuda(fail="no"), zero_copy=True)


@pytest.mark.timeout(60)
def test_workers_0_and_zero_copy_false_use_memcpy(image_folder) -> None:
    with stoker.Loader(image_folder, workers=0, **KW) as loader:
        got = _run(loader, FakeCuda(), epochs=1)
        assert "workers=0" in loader.stats().transfer
    _same(got, _expected(image_folder, 4))
    runtime = FakeCuda()
    with stoker.Loader(image_folder, workers=1, prefetch=2, **KW) as loader:
        _run(loader, runtime, epochs=1, zero_copy=False)
        assert "zero_copy=False" in loader.stats().transfer
    assert not runtime.registered
    with pytest.raises(stoker.ConfigError, match="zero_copy"):
        loader.torch(device="cuda", cuda_runtime=FakeCuda(), zero_copy="yes")


# --------------------------------------------------------------------------- a real GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.timeout(300)
def test_cuda_zero_copy_matches_the_numpy_path(image_folder) -> None:
    expected = _expected(image_folder, 8)
    with stoker.Loader(image_folder, workers=2, **KW) as loader:
        got = []
        for _ in range(2):
            got += [
                (x.permute(0, 2, 3, 1).cpu().numpy(), y.cpu().numpy())
                for x, y in loader.torch(device="cuda")
            ]
        report = loader.stats()
    _same(got, expected)
    assert "zero-copy" in report.transfer, report.transfer
    assert report.device_wait_s is not None and report.kept_batches == 0


@cuda
@pytest.mark.timeout(300)
def test_cuda_memcpy_fallback_matches_the_numpy_path(image_folder) -> None:
    expected = _expected(image_folder, 4)
    with stoker.Loader(image_folder, workers=1, **KW) as loader:
        got = [
            (x.cpu().numpy(), y.cpu().numpy())
            for x, y in loader.torch(device="cuda", zero_copy=False, layout="channels_last")
        ]
        assert "memcpy" in loader.stats().transfer
    _same(got, expected)

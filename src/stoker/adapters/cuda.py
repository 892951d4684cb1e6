"""Host-to-GPU transfer for ``torch(device="cuda")``: zero-copy from page-locked ring slots, or a
memcpy into pinned buffers; and the GPU's own clock for "waiting for data".

- **Zero copy**: every slot segment of the loader's ring is page-locked once with
  ``cudaHostRegister`` (through torch's CUDA runtime bindings), so a batch is DMA'd to the GPU
  straight from the slot the worker wrote, on a side stream. The copy's event is the slot's
  fence: the loader does not reuse the slot before it has completed. Segments are unregistered
  before they are unlinked.
- **memcpy** (the fallback): each batch is copied into one of two pinned buffers, then DMA'd. It
  is used with ``workers=0`` (no ring), when page-locking fails (the reason is in ``stats()``),
  or with ``zero_copy=False``.

Every CUDA call goes through ``CudaRuntime``; tests put a fake there and run the real logic.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import TypeAlias, TypeVar

import numpy as np
import torch

from ..stats import Stats
from .feed import FieldList, Ring, RingSegment

__all__ = ["CudaRuntime", "DeviceClock", "MemcpyTransfer", "SlotPinner", "ZeroCopyTransfer"]

CUDA_SUCCESS = 0
Item = TypeVar("Item")

#: A field of a batch on its way: a tensor, or a ``path`` field's strings (numpy: torch has no
#: string tensors).
Leaf: TypeAlias = "torch.Tensor | np.ndarray"
#: The fields of a batch once their copies are queued, and the event the consumer waits on.
Issued: TypeAlias = "tuple[dict[str, Leaf], torch.cuda.Event]"


class CudaRuntime:
    """The CUDA calls the transfer makes, in one place."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def register(self, address: int, size: int) -> str | None:
        """Page-lock ``size`` bytes at ``address``; None on success, else the CUDA error."""
        cudart = torch.cuda.cudart()
        code = int(cudart.cudaHostRegister(address, size, 0))  # as torch.cuda's own pinning
        if code == CUDA_SUCCESS:
            return None
        text = f"error {code}"
        with contextlib.suppress(Exception):
            text = f"{cudart.cudaGetErrorString(cudart.cudaError(code))} ({text})"
        clear = getattr(cudart, "cudaGetLastError", None)
        if clear is not None:  # a later kernel-launch check must not report this failure
            with contextlib.suppress(Exception):
                clear()
        return f"cudaHostRegister: {text}"

    def unregister(self, address: int) -> None:
        """Undo ``register``."""
        torch.cuda.cudart().cudaHostUnregister(address)

    def side_stream(self) -> torch.cuda.Stream:
        """A new stream for the copies."""
        return torch.cuda.Stream(self.device)

    def current_stream(self) -> torch.cuda.Stream:
        """The consumer's stream."""
        return torch.cuda.current_stream(self.device)

    def on(self, stream: torch.cuda.Stream) -> torch.cuda.StreamContext:
        """A context in which work is queued on ``stream``."""
        return torch.cuda.stream(stream)

    def event(self, timing: bool = False) -> torch.cuda.Event:
        """A new CUDA event (``record``, ``query``, ``synchronize``, ``elapsed_time``)."""
        return torch.cuda.Event(enable_timing=timing)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """Queue the copy of a page-locked host tensor on the current stream."""
        return host.to(self.device, non_blocking=True)

    def pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
        """A page-locked host buffer from torch's caching host allocator."""
        return torch.from_numpy(np.empty(shape, dtype)).pin_memory()

    def use_on(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        """Tell the caching allocator ``tensor`` (made on the side stream) is used on
        ``stream``."""
        tensor.record_stream(stream)


def _address(segment: RingSegment) -> int:
    return int(np.frombuffer(memoryview(segment.map), np.uint8).ctypes.data)


class SlotPinner:
    """Page-locks the ring's segments as the ring reports them; the first failure is kept."""

    def __init__(self, runtime: CudaRuntime) -> None:
        self.runtime = runtime
        self.pinned: dict[str, tuple[int, int]] = {}  # segment path -> (address, size)
        self.error: str | None = None

    def added(self, segment: RingSegment) -> None:
        """Page-lock a new segment (not after a failure)."""
        if self.error is not None:
            return
        address = _address(segment)
        error = self.runtime.register(address, segment.size)
        if error is None:
            self.pinned[segment.path] = (address, segment.size)
        else:
            self.error = error

    def removed(self, segment: RingSegment) -> None:
        """Unlock a segment before it goes."""
        entry = self.pinned.pop(segment.path, None)
        if entry is not None:
            with contextlib.suppress(Exception):  # a driver already torn down at exit
                self.runtime.unregister(entry[0])

    def release(self) -> None:
        """Unlock every segment locked so far (after a failure: the memcpy path is used)."""
        for path in list(self.pinned):
            with contextlib.suppress(Exception):
                self.runtime.unregister(self.pinned.pop(path)[0])

    def covers(self, array: np.ndarray) -> bool:
        """True when ``array``'s memory lies inside a page-locked segment."""
        start = array.ctypes.data
        end = start + array.nbytes
        return any(a <= start and end <= a + n for a, n in self.pinned.values())


_PINNERS: weakref.WeakKeyDictionary[Ring, SlotPinner] = weakref.WeakKeyDictionary()


def pinner_for(ring: Ring, runtime: CudaRuntime) -> SlotPinner:
    """The ring's one SlotPinner (every view of a loader, every epoch, shares it): each
    segment is page-locked once."""
    pinner = _PINNERS.get(ring)
    if pinner is None:
        pinner = _PINNERS[ring] = SlotPinner(runtime)
        ring.watch_segments(pinner.added, pinner.removed)
    return pinner


class DeviceClock:
    """The GPU's own idle time while the consumer waited: an event recorded on the consumer's
    stream when it asks for a batch, another once the batch is ready on it; their distance is
    time the GPU had nothing queued (as the events complete, added to the loader's stats).

    The wait for the loader's first batch is start-up, not training: like the host's wait, it
    is left out, so the GPU's share is of the same training loop as the host's."""

    def __init__(self, runtime: CudaRuntime, stats: Stats) -> None:
        self.runtime, self.stats = runtime, stats
        self.pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, bool]] = deque()

    def timed(self, batches: Iterator[Item]) -> Iterator[Item]:
        """``batches``, with the GPU's wait for each one measured."""
        try:
            while True:
                start = self.runtime.event(timing=True)
                start.record(self.runtime.current_stream())
                first = self.stats.first_at is None
                out = next(batches, None)
                if out is None:
                    return
                end = self.runtime.event(timing=True)
                end.record(self.runtime.current_stream())
                self.pending.append((start, end, first))
                self.collect()
                yield out
                del out
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def collect(self) -> None:
        """Add the waits whose events have completed (they complete in order)."""
        while self.pending and self.pending[0][1].query():
            start, end, first = self.pending.popleft()
            if not first:
                self.stats.add_device_wait(start.elapsed_time(end) / 1000.0)


class _Transfer:
    """What both transfers share: the side stream, the hand-over, the conversion."""

    def __init__(self, runtime: CudaRuntime, convert: Callable[[str, Leaf], Leaf]) -> None:
        self.runtime, self.convert = runtime, convert
        self.side = runtime.side_stream()

    def _finish(self, moved: dict[str, Leaf]) -> Issued:
        """Queue the conversions after the copies; the event the consumer waits on."""
        with self.runtime.on(self.side):
            out = {name: self.convert(name, t) for name, t in moved.items()}
            ready = self.runtime.event()
            ready.record(self.side)
        return out, ready

    def hand_over(self, issued: Issued) -> dict[str, Leaf]:
        """Make the consumer's stream wait for the batch; the tensors, used on its stream."""
        out, ready = issued
        stream = self.runtime.current_stream()
        stream.wait_event(ready)
        for t in out.values():
            if isinstance(t, torch.Tensor):
                self.runtime.use_on(t, stream)
        return out


def is_text(value: object) -> bool:
    """A ``path`` field (strings): passed through as numpy, torch has no string tensors."""
    return isinstance(value, np.ndarray) and value.dtype.kind in "US"


class ZeroCopyTransfer(_Transfer):
    """DMA straight from the page-locked slot; the slot is fenced until the copy completes."""

    def __init__(
        self,
        runtime: CudaRuntime,
        convert: Callable[[str, Leaf], Leaf],
        ring: Ring,
        pinner: SlotPinner,
    ) -> None:
        super().__init__(runtime, convert)
        self.ring, self.pinner = ring, pinner

    def issue(self, fields: dict[str, np.ndarray]) -> Issued:
        """Queue the batch's copies; returns at once."""
        moved: dict[str, Leaf] = {}
        views = []
        with self.runtime.on(self.side):
            for name, value in fields.items():
                if is_text(value):
                    moved[name] = value
                    continue
                if self.pinner.covers(value):
                    views.append(value)
                    host = torch.from_numpy(value)
                else:  # a small field the loader handed out as a copy
                    host = self.runtime.pinned(value.shape, value.dtype)
                    host.numpy()[...] = value
                moved[name] = self.runtime.to_device(host)
                del host
            copied = self.runtime.event()
            copied.record(self.side)
        for view in views:
            self.ring.hold_until(view, copied)
        return self._finish(moved)


class MemcpyTransfer(_Transfer):
    """Copy each batch into one of two pinned buffers, then DMA it (the fallback)."""

    def __init__(
        self, runtime: CudaRuntime, convert: Callable[[str, Leaf], Leaf], layout: FieldList
    ) -> None:
        super().__init__(runtime, convert)
        self.buffers = [_Buffers(runtime, layout) for _ in range(2)]
        self.turn = 0

    def issue(self, fields: dict[str, np.ndarray]) -> Issued:
        """Copy into the next buffer (once its last copy is done) and queue the DMA."""
        buf = self.buffers[self.turn % 2]
        self.turn += 1
        if buf.copied is not None:
            buf.copied.synchronize()  # the copy that last read this buffer is done
        moved: dict[str, Leaf] = {}
        with self.runtime.on(self.side):
            for name, value in fields.items():
                if is_text(value):
                    moved[name] = value
                    continue
                n = len(value)
                np.copyto(buf.tensors[name].numpy()[:n], value)
                moved[name] = self.runtime.to_device(buf.tensors[name][:n])
            buf.copied = self.runtime.event()
            buf.copied.record(self.side)
        return self._finish(moved)


class _Buffers:
    """One pinned host buffer per field, and the event of the copy that last read them."""

    def __init__(self, runtime: CudaRuntime, layout: FieldList) -> None:
        self.tensors = {
            name: runtime.pinned((layout.batch_size, *shape), np.dtype(dtype))
            for name, dtype, shape in layout.fields
        }
        self.copied: torch.cuda.Event | None = None

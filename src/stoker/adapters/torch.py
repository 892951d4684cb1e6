"""PyTorch adapter: a Loader's batches as torch tensors, copied to a device ahead of use.

- ``device=None``: ``torch.from_numpy`` views of the loader's batches, no copy at all.
- ``device="cpu"``: the same views, converted in place of use when ``dtype`` asks for it.
- ``device="cuda"``: each batch goes through a pinned host buffer (a ring of two) and is copied
  on a side stream; the copy of the next batch is issued before the current one is handed over,
  so it overlaps the model's work (the loader's ``state_dict()`` leaves that batch out: it
  counts what the training step received). The consumer's stream waits on an event, and
  ``record_stream`` tells the caching allocator which stream uses the tensors.
- other devices (``mps``, ``xpu``, ...): a plain ``.to(device)``.

``dtype``, ``mean`` and ``std`` are applied on the device after the copy, so only ``uint8`` travels.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from ..batch import map_form
from ..errors import ConfigError
from .base import LoaderView, look_ahead
from .scaling import channels_of, units

__all__ = ["TorchLoader", "to_torch"]

Tensors = Any  # the loader's batch structure, with tensors for arrays


class _Pinned:
    """One pinned host buffer per field (the CUDA ring has two), and the event of the copy
    that last read them."""

    def __init__(self, layout: Any) -> None:
        self.tensors = {
            name: torch.from_numpy(
                np.empty((layout.batch_size, *shape), np.dtype(dtype))
            ).pin_memory()
            for name, dtype, shape in layout.fields
        }
        self.arrays = {name: t.numpy() for name, t in self.tensors.items()}
        self.copied: torch.cuda.Event | None = None


def _is_text(value: Any) -> bool:
    """A ``path`` field (strings): passed through as numpy, torch has no string tensors."""
    return isinstance(value, np.ndarray) and value.dtype.kind in "US"


class TorchLoader(LoaderView):
    """Iterable of ``(images, labels)`` torch tensors over a Loader: one epoch per ``iter()``.

    ``state_dict()``/``load_state_dict()`` delegate to the loader, so checkpointing tools that
    save a data loader's state (torchdata's ``StatefulDataLoader`` protocol, ``torch.distributed
    .checkpoint`` wrappers, Lightning) capture and restore the exact position.
    """

    def __init__(
        self,
        loader: Any,
        device: Any = None,
        channels_last: bool = True,
        dtype: torch.dtype | None = None,
        mean: Any = None,
        std: Any = None,
    ) -> None:
        self.loader = loader
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.channels_last = bool(channels_last)
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise ConfigError(f"dtype={dtype!r} is not a torch.dtype; pass e.g. torch.float32")
        if (mean is None) != (std is None):
            raise ConfigError("pass both mean and std, or neither")
        if mean is not None and (dtype is None or not dtype.is_floating_point):
            raise ConfigError("mean/std need a floating dtype: pass dtype=torch.float32 too")
        self.dtype = dtype
        self._norm = None if mean is None else units(mean, std, channels_of(loader))
        self._consts: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    def __iter__(self) -> Iterator[Tensors]:
        """The rest of the loader's current epoch, as tensors on ``device``."""
        dev = self.device
        if dev is not None and dev.type == "cuda":
            return self._cuda(dev)
        return self._plain(self.loader, dev)

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        """``uint8`` NHWC on the device -> the layout, dtype and normalisation asked for."""
        if not self.channels_last:
            x = x.permute(0, 3, 1, 2)  # NCHW shape; memory stays channels-last (no copy)
        if self.dtype is None:
            return x
        low = self.dtype in (torch.float16, torch.bfloat16)
        work = torch.float32 if low else self.dtype
        x = x.to(work)
        if self._norm is not None:
            mean, std = self._constants(x.device, work)
            x = x.sub_(mean).div_(std)
        return x.to(self.dtype) if low else x

    def _constants(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        key = (device, dtype)
        if key not in self._consts:
            assert self._norm is not None
            count = len(self._norm[0])
            shape = (count,) if self.channels_last else (count, 1, 1)
            mean, std = (torch.tensor(v, dtype=dtype).reshape(shape).to(device) for v in self._norm)
            self._consts[key] = (mean, std)
        return self._consts[key]

    def _leaf(self, name: str, value: Any, dev: torch.device | None) -> Any:
        """One field of a batch as a tensor on ``dev``; the image converted as asked."""
        if _is_text(value):
            return value
        t = torch.from_numpy(value)
        if dev is not None and dev.type != "cpu":
            t = t.to(dev)
        return self._convert(t) if name == "image" else t

    def _plain(self, batches: Iterable[Any], dev: torch.device | None) -> Iterator[Any]:
        form = self.loader.form

        def convert(batch: Any) -> Any:
            return map_form(form, batch, lambda name, v: self._leaf(name, v, dev))

        yield from map(convert, batches)  # map keeps no reference to a batch handed over

    def _cuda(self, dev: torch.device) -> Iterator[Tensors]:
        side = torch.cuda.Stream(dev)
        form = self.loader.form
        ring = [_Pinned(self.loader.layout) for _ in range(2)]

        def issue(batch: Any, buf: _Pinned) -> tuple[Any, Any]:
            if buf.copied is not None:
                buf.copied.synchronize()  # the copy that last read this buffer is done

            def copy(name: str, value: Any) -> Any:
                if _is_text(value):
                    return value
                n = len(value)
                np.copyto(buf.arrays[name][:n], value)
                return buf.tensors[name][:n].to(dev, non_blocking=True)

            with torch.cuda.stream(side):
                moved = map_form(form, batch, copy)
                buf.copied = torch.cuda.Event()
                buf.copied.record(side)
                moved = map_form(form, moved, lambda n, t: self._convert(t) if n == "image" else t)
                ready = torch.cuda.Event()
                ready.record(side)
            return moved, ready

        def hand_over(moved: Any, ready: Any) -> Any:
            stream = torch.cuda.current_stream(dev)
            stream.wait_event(ready)

            def record(name: str, t: Any) -> Any:
                if isinstance(t, torch.Tensor):
                    t.record_stream(stream)  # made on the side stream, used on this one
                return t

            return map_form(form, moved, record)

        turn = itertools.count()
        return look_ahead(
            self.loader, lambda batch: issue(batch, ring[next(turn) % 2]), lambda p: hand_over(*p)
        )

    def __repr__(self) -> str:
        return (
            f"TorchLoader({self.loader!r}, device={self.device}, "
            f"channels_last={self.channels_last}, dtype={self.dtype})"
        )


def to_torch(loader: Any, device: Any = None, **options: Any) -> TorchLoader:
    """Wrap ``loader`` for PyTorch: ``for x, y in to_torch(train, device="cuda"): ...``.

    - ``device``: ``None`` gives zero-copy CPU tensors; ``"cuda"``/``"cuda:1"`` copies through
      pinned memory on a side stream, one batch ahead; ``"cpu"`` and others copy plainly.
    - ``channels_last``: ``True`` keeps the loader's ``(B, H, W, 3)``; ``False`` gives PyTorch's
      ``(B, 3, H, W)`` shape as a free permuted view, whose memory stays channels-last
      (``torch.channels_last`` format, which cuDNN convolutions like); call ``.contiguous()`` if
      you need NCHW-contiguous memory (``.view`` needs it; ``.reshape``/``.flatten`` do not).
    - ``dtype``: e.g. ``torch.float32``/``torch.bfloat16``; converts on the device. Without
      ``mean``/``std`` the values stay 0-255.
    - ``mean``/``std``: scalars or 3 per-channel values giving ``(x - mean) / std``. Values all
      <= 1 are read in 0-1 units (torchvision's ``mean=(0.485, 0.456, 0.406), std=(0.229, 0.224,
      0.225)``), otherwise in 0-255 units (``mean=(123.7, 116.3, 103.5)``); the result is the same
      normalised tensor either way. ``mean=0, std=1`` gives values in [0, 1].
    - Labels keep the loader's dtype and shape (``int64`` ``(B,)`` class ids, or numeric targets
      of any dtype ``(B, ...)``), on the same device; other fields of a structured batch
      (``Loader(batch=...)``) likewise, ``path`` strings stay numpy. For a loader with masks the
      second tensor is the masks, ``uint8`` ``(B, H, W)`` (class ids, never normalised or permuted);
      take ``.long()`` for ``CrossEntropyLoss``.
    """
    return TorchLoader(loader, device, **options)

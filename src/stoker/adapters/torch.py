"""PyTorch adapter: a Loader's batches as torch tensors, copied to a device ahead of use.

- ``device=None``: ``torch.from_numpy`` views of the loader's batches, no copy at all.
- ``device="cpu"``: the same views, converted in place of use when ``dtype`` asks for it.
- ``device="cuda"``: zero-copy where it can be: the loader's ring slots are page-locked
  (``cudaHostRegister``) and each batch is DMA'd straight from its slot on a side stream; the
  slot is not reused before the copy's event completes. Otherwise (``workers=0``, page-locking
  refused, ``zero_copy=False``) it is copied into one of two pinned buffers first; ``stats()``
  says which path and why. The copy of the next batch is issued before the current one is
  handed over, so it overlaps the model's work (the loader's ``state_dict()`` leaves that batch
  out: it counts what the training step received). The consumer's stream waits on an event,
  ``record_stream`` tells the caching allocator which stream uses the tensors, and CUDA events
  around each wait give the GPU's own idle time (``wait_meter``'s ``device_wait``).
- other devices (``mps``, ``xpu``, ...): a plain ``.to(device)``.

``dtype``, ``mean`` and ``std`` are applied on the device after the copy, so only ``uint8`` travels.
Images come as PyTorch's ``(B, C, H, W)`` (``layout="channels_first"``, the default: a free
permuted view whose memory is ``torch.channels_last``) or as the loader's ``(B, H, W, C)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeAlias

import numpy as np
import torch

from ..errors import ConfigError, StokerError
from ..schema import map_form
from .base import LoaderView, look_ahead
from .cuda import (
    CudaRuntime,
    DeviceClock,
    Issued,
    Leaf,
    MemcpyTransfer,
    ZeroCopyTransfer,
    is_text,
    pinner_for,
)
from .feed import Batch, Feed, Ring
from .scaling import CAST, PIXELS, Scale, is_channels_first, leaf_kinds, pixel_channels, units

__all__ = ["TorchLoader", "to_torch"]

#: The loader's batch structure with tensors for its arrays (``path`` strings stay numpy).
Tensors: TypeAlias = "Leaf | tuple[Tensors, ...] | dict[str, Tensors]"
#: How a batch reaches the GPU (picked at the first batch, and again once the ring runs).
Transfer: TypeAlias = "ZeroCopyTransfer | MemcpyTransfer"
#: What ``device=`` takes: as ``torch.device(...)``.
Device: TypeAlias = "torch.device | str | int"


class TorchLoader(LoaderView):
    """Iterable of ``(images, labels)`` torch tensors over a Loader: one epoch per ``iter()``;
    ``for x, y in to_torch(train, device="cuda"): ...`` (or ``train.torch(...)``).

    - ``device``: ``None`` gives zero-copy CPU tensors; ``"cuda"``/``"cuda:1"`` copies through
      pinned memory on a side stream, one batch ahead; ``"cpu"`` and others copy plainly.
    - ``layout``: ``"channels_first"`` (the default) gives PyTorch's ``(B, C, H, W)`` shape, what
      ``torchvision`` models and a ``DataLoader`` with ``ToTensor`` give, as a free permuted view
      whose memory stays channels-last (``torch.channels_last`` format, which cuDNN convolutions
      like); call ``.contiguous()`` if you need NCHW-contiguous memory (``.view`` needs it;
      ``.reshape``/``.flatten`` do not). ``"channels_last"`` keeps the loader's
      ``(B, H, W, C)``. The older ``channels_last=True``/``False`` still means the same as
      ``layout="channels_last"``/``"channels_first"``.
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

    ``state_dict()``/``load_state_dict()`` delegate to the loader, so checkpointing tools that
    save a data loader's state (torchdata's ``StatefulDataLoader`` protocol, ``torch.distributed
    .checkpoint`` wrappers, Lightning) capture and restore the exact position.
    """

    def __init__(
        self,
        loader: Feed,
        device: Device | None = None,
        *,
        layout: str | None = None,
        channels_last: bool | None = None,
        dtype: torch.dtype | None = None,
        mean: Scale | None = None,
        std: Scale | None = None,
        zero_copy: bool | str = "auto",
        cuda_runtime: CudaRuntime | None = None,
    ) -> None:
        self.loader = loader
        self.device = None if device is None else torch.device(device)
        self._runtime = cuda_runtime  # tests put a fake here: the CUDA calls, nothing else
        if (
            self.device is not None
            and self.device.type == "cuda"
            and self.device.index is None
            and cuda_runtime is None
        ):
            self.device = torch.device("cuda", torch.cuda.current_device())
        if zero_copy not in (True, False, "auto"):
            raise ConfigError(f"zero_copy={zero_copy!r}: use 'auto', True or False")
        self.zero_copy = zero_copy
        self.layout = _layout(layout, channels_last)
        self.channels_last = not is_channels_first(self.layout, "torch")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise ConfigError(f"dtype={dtype!r} is not a torch.dtype; pass e.g. torch.float32")
        if (mean is None) != (std is None):
            raise ConfigError("pass both mean and std, or neither")
        if mean is not None and (dtype is None or not dtype.is_floating_point):
            raise ConfigError("mean/std need a floating dtype: pass dtype=torch.float32 too")
        self.dtype = dtype
        self._kinds = leaf_kinds(
            loader,
            "torch",
            dtype=dtype is not None,
            mean=mean is not None,
            layout=layout is not None or channels_last is not None,
        )
        channels = pixel_channels(loader, self._kinds)
        self._norm = None if mean is None or std is None else units(mean, std, channels)
        self._consts: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]]
        self._consts = {}

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

    def _leaf(self, name: str, value: np.ndarray, dev: torch.device | None) -> Leaf:
        """One field of a batch as a tensor on ``dev``; the image converted as asked."""
        if is_text(value):
            return value
        t = torch.from_numpy(value)
        if dev is not None and dev.type != "cpu":
            t = t.to(dev)
        return self._image_leaf(name, t)

    def _image_leaf(self, name: str, t: Leaf) -> Leaf:
        """A field as the image conversion makes it: every option on a uint8 (H, W, C) image,
        ``dtype`` alone on a dataset's other image fields, nothing on any other field (nor
        on ``path`` strings)."""
        kind = self._kinds.get(name)
        if not isinstance(t, torch.Tensor):
            return t
        if kind == PIXELS:
            return self._convert(t)
        if kind == CAST and self.dtype is not None:
            return t.to(self.dtype)
        return t

    def _plain(self, batches: Iterable[Batch], dev: torch.device | None) -> Iterator[Tensors]:
        form = self.loader.recipe.schema.form

        def convert(batch: Batch) -> Tensors:
            return map_form(form, batch, lambda name, v: self._leaf(name, v, dev))

        yield from map(convert, batches)  # map keeps no reference to a batch handed over

    def _cuda(self, dev: torch.device) -> Iterator[Tensors]:
        runtime = self._runtime or CudaRuntime(dev)
        form = self.loader.recipe.schema.form
        # the transfer and the ring it was picked with: picked at the first batch, and again
        # at the first batch from the ring when the first ones were made in this process
        # (Loader(dataset) while its workers start: no ring to page-lock yet)
        chosen: list[tuple[Transfer, Ring | None]] = []

        def issue(batch: Batch) -> tuple[Tensors, tuple[Transfer, Issued]]:
            fields: dict[str, np.ndarray] = {}
            map_form(form, batch, fields.setdefault)
            ring = self.loader._ring()
            if not chosen or (chosen[0][1] is None and ring is not None):
                chosen[:] = [(self._transfer(runtime), ring)]
            transfer = chosen[0][0]
            issued = transfer.issue(fields)
            return map_form(form, batch, lambda name, _: issued[0][name]), (transfer, issued)

        def hand_over(pending: tuple[Tensors, tuple[Transfer, Issued]]) -> Tensors:
            transfer, issued = pending[1]
            transfer.hand_over(issued)  # by the transfer that issued it
            return pending[0]

        clock = DeviceClock(runtime, self.loader._device_stats())
        return clock.timed(look_ahead(self.loader, issue, hand_over))

    def _transfer(self, runtime: CudaRuntime) -> Transfer:
        """Zero-copy from the page-locked ring where it can be, else memcpy; the choice and its
        reason go to the loader's ``stats()``."""
        stats = self.loader._device_stats()

        convert = self._image_leaf

        ring = self.loader._ring()
        why = "zero_copy=False"
        if self.zero_copy and ring is None:
            why = (
                "workers=0: no shared-memory ring to page-lock"
                if not self.loader.run.workers
                else "this batch was made in this process while the workers start: no ring yet"
            )
        elif self.zero_copy and ring is not None:
            pinner = pinner_for(ring, runtime)
            if pinner.error is None:
                stats.transfer = (
                    "zero-copy: DMA straight from the page-locked ring slots "
                    "(cudaHostRegister), on a side stream"
                )
                return ZeroCopyTransfer(runtime, convert, ring, pinner)
            pinner.release()
            why = f"page-locking the ring failed: {pinner.error}"
            if self.zero_copy is True:
                raise StokerError(f"zero_copy=True, but {why}; pass zero_copy='auto'")
        stats.transfer = f"memcpy into a pinned buffer, then DMA on a side stream ({why})"
        return MemcpyTransfer(runtime, convert, self.loader.recipe.schema.slot_layout)

    def __repr__(self) -> str:
        return (
            f"TorchLoader({self.loader!r}, device={self.device}, "
            f"layout={self.layout!r}, dtype={self.dtype})"
        )


def _layout(layout: str | None, channels_last: bool | None) -> str:
    """``layout=`` (default "channels_first"), or the older ``channels_last=`` bool for it."""
    if channels_last is None:
        return "channels_first" if layout is None else layout
    older = "channels_last" if channels_last else "channels_first"
    if layout is not None and layout != older:
        raise ConfigError(
            f"torch(layout={layout!r}, channels_last={channels_last!r}) disagree: pass layout= "
            "alone ('channels_first' or 'channels_last')"
        )
    return older


#: ``to_torch(loader, device, *, layout, ...)``: the function spelling of ``TorchLoader``.
to_torch = TorchLoader

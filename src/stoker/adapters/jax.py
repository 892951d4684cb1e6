"""JAX adapter: a Loader's batches as ``jax.Array``s, put on the device(s) one batch ahead.

``jax.device_put`` is asynchronous: it returns at once and the host-to-device copy runs while the
model computes. The adapter takes the loader's next batch and puts it before handing over the
current one, so the next copy is always in flight during a training step.

On the CPU backend a put is no copy at all: JAX aliases the loader's shared-memory batch (and
keeps it alive, which the loader notices). There, looking ahead gains nothing and would keep one
more batch alive, forcing the loader to replace slots, so batches are put as they are taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax

from .base import LoaderView

__all__ = ["JaxLoader", "to_jax"]


def _on_cpu(target: Any) -> bool:
    """True when every device ``target`` (None, a Device, a Sharding, or a pytree) is a CPU."""
    if target is None:
        return bool(jax.default_backend() == "cpu")
    platforms: set[str] = set()
    for leaf in jax.tree_util.tree_leaves(target):
        devices = getattr(leaf, "device_set", None)
        if devices is None:
            devices = [leaf]
        platforms.update(getattr(d, "platform", "?") for d in devices)
    return platforms == {"cpu"}


class JaxLoader(LoaderView):
    """Iterable of ``(images, labels)`` ``jax.Array`` pairs over a Loader; one epoch per ``iter()``.

    ``images`` is ``uint8`` ``(B, H, W, 3)``, ``labels`` ``int32`` or ``int64`` ``(B,)`` (JAX
    turns ``int64`` into ``int32`` unless ``jax_enable_x64`` is on). A loader with masks gives
    ``(images, masks)``, masks ``uint8`` ``(B, H, W)``.
    """

    def __init__(self, loader: Any, sharding: Any = None) -> None:
        self.loader = loader
        self.sharding = sharding

    def __iter__(self) -> Iterator[tuple[jax.Array, jax.Array]]:
        """The rest of the loader's current epoch, put on ``sharding`` (or the default device)."""
        if _on_cpu(self.sharding):
            return self._direct()
        return self._ahead()

    def _put(self, batch: Any) -> Any:
        return jax.device_put(tuple(batch), self.sharding)

    def _direct(self) -> Iterator[tuple[jax.Array, jax.Array]]:
        for batch in self.loader:
            yield self._put(batch)

    def _ahead(self) -> Iterator[tuple[jax.Array, jax.Array]]:
        pending = None
        for batch in self.loader:
            put = self._put(batch)  # starts the copy; returns at once
            del batch
            if pending is not None:
                yield pending
            pending = put
        if pending is not None:
            yield pending

    def __repr__(self) -> str:
        return f"JaxLoader({self.loader!r}, sharding={self.sharding!r})"


def to_jax(loader: Any, sharding: Any = None) -> JaxLoader:
    """Wrap ``loader`` for JAX: ``for x, y in to_jax(train, sharding=...): step(state, x, y)``.

    ``sharding``: ``None`` (the default device), a ``jax.Device``, a ``jax.sharding.Sharding``
    (e.g. ``NamedSharding(mesh, PartitionSpec("data"))`` to split the batch across devices), or a
    pair of them for images and labels. Each batch is ``jax.device_put`` one batch ahead of use.
    In a multi-process job each process holds its own rank's batch (``Loader(rank=...,
    world_size=...)``); build global arrays with ``jax.make_array_from_process_local_data``.
    """
    return JaxLoader(loader, sharding=sharding)

"""JAX adapter: a Loader's batches as ``jax.Array``s, put on the device(s) one batch ahead.

``jax.device_put`` is asynchronous: it returns at once and the host-to-device copy runs while the
model computes. The adapter takes the loader's next batch and puts it before handing over the
current one, so the next copy is always in flight during a training step; the loader's
``state_dict()`` leaves that batch out (it counts what the step received).

Slots are never kept past their reuse: on an accelerator JAX holds the host array only until its
transfer is done, which is long before the loader reuses the slot. On the CPU backend a put is no
copy at all (JAX aliases the host array, even with ``may_alias=False``), so the arrays that are
views of the loader's shared memory are first copied into memory JAX may keep.

JAX has no public API to page-lock host memory it did not allocate, so the ring's slots cannot
be its DMA source; its transfer manager stages the copy itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

from ..schema import DERIVED, leaves, map_form
from .base import LoaderView, look_ahead, owned_batch
from .feed import Batch, Feed
from .scaling import CAST, PIXELS, ImageConversion, Scale, leaf_kinds, pixel_channels

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["JaxLoader", "to_jax"]

#: ``sharding=``: a device, a sharding, or a pytree of them (one per batch field).
Placement: TypeAlias = (
    "jax.Device | jax.sharding.Sharding | tuple[Placement, ...] | dict[str, Placement]"
)
#: A batch once put: ``jax.Array``s in the loader's structure (``path`` strings stay numpy).
Arrays: TypeAlias = "jax.Array | np.ndarray | tuple[Arrays, ...] | dict[str, Arrays]"


def _on_cpu(target: Placement | None) -> bool:
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
    """Iterable of ``(images, labels)`` ``jax.Array`` pairs over a Loader; one epoch per ``iter()``:
    ``for x, y in to_jax(train, sharding=...): step(state, x, y)`` (or ``train.jax(...)``).

    ``sharding``: ``None`` (the default device), a ``jax.Device``, a ``jax.sharding.Sharding``
    (e.g. ``NamedSharding(mesh, PartitionSpec("data"))`` to split the batch across devices), or a
    pair of them for images and labels. Each batch is ``jax.device_put`` one batch ahead of use.
    In a multi-process job each process holds its own rank's batch (``Loader(rank=...,
    world_size=...)``); build global arrays with ``jax.make_array_from_process_local_data``.

    ``images`` is ``uint8`` ``(B, H, W, C)`` or ``dtype`` with optional ``mean``/``std``
    (converted on the device, after the copy: see ``adapters.scaling``); labels and other
    fields keep the loader's dtype and shape (JAX turns 64-bit arrays into 32-bit ones unless
    ``jax_enable_x64`` is on). A loader with masks gives ``(images, masks)``.
    """

    def __init__(
        self,
        loader: Feed,
        sharding: Placement | None = None,
        dtype: DTypeLike | None = None,
        mean: Scale | None = None,
        std: Scale | None = None,
    ) -> None:
        self.loader = loader
        self.sharding = sharding
        self._copy = _on_cpu(sharding)
        self._kinds = leaf_kinds(
            loader, "jax", dtype=dtype is not None, mean=mean is not None, layout=False
        )
        channels = pixel_channels(loader, self._kinds)
        self.image = ImageConversion(channels, dtype, mean, std)
        self._convert = jax.jit(self._image) if self.image.active else None
        self._cast = jax.jit(self._cast_only) if self.image.active else None

    def _cast_only(self, x: jax.Array) -> jax.Array:
        """A dataset's non-uint8 image field -> ``dtype`` (no scaling: its units are its own)."""
        return x.astype(self.image.dtype)

    def _image(self, x: jax.Array) -> jax.Array:
        """The image batch -> ``dtype`` (and ``mean``/``std``), on the device."""
        opts = self.image
        assert opts.dtype is not None
        work = jnp.float32 if opts.dtype.itemsize < 4 else opts.dtype
        x = x.astype(work)
        if opts.norm is not None:
            x = (x - jnp.asarray(opts.norm[0], work)) / jnp.asarray(opts.norm[1], work)
        return x.astype(opts.dtype)

    def __iter__(self) -> Iterator[Arrays]:
        """The rest of the loader's current epoch, put on ``sharding`` (or the default device)."""
        return look_ahead(self.loader, self._put, _same)

    def _put(self, batch: Batch) -> Arrays:
        """Start the batch's copy to the device(s); returns at once. ``path`` strings stay
        numpy (the structure is kept)."""
        batch = owned_batch(batch) if self._copy else batch
        form = self.loader.recipe.schema.form
        if any(n in DERIVED for n in leaves(form)):
            arrays = map_form(form, batch, lambda n, v: None if n in DERIVED else v)
            put = jax.device_put(arrays, self.sharding)
            put = map_form(form, put, lambda n, v, orig: orig if n in DERIVED else v, batch)
        else:
            put = jax.device_put(batch, self.sharding)
        if self._convert is None or self._cast is None:
            return put
        fns: dict[str, Callable[[jax.Array], jax.Array]] = {
            PIXELS: self._convert,
            CAST: self._cast,
        }
        kinds = self._kinds
        return map_form(form, put, lambda n, v: fns[kinds[n]](v) if n in kinds else v)

    def __repr__(self) -> str:
        return f"JaxLoader({self.loader!r}, sharding={self.sharding!r})"


def _same(put: Arrays) -> Arrays:
    return put


#: ``to_jax(loader, sharding, dtype, mean, std)``: the function spelling of ``JaxLoader``.
to_jax = JaxLoader

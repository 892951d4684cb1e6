"""TensorFlow adapter: a Loader as a ``tf.data.Dataset`` of its batches: ``(images, labels)``,
or the structure ``Loader(batch=...)`` asks for, each field with its own dtype and shape.

Each iteration of the dataset is one epoch: ``len(loader)`` consecutive batches of
``loader.stream()``. On a fresh loader that is exactly the loader's epoch; on one resumed
mid-epoch it continues from there and runs into the next epoch, so every iteration has the same
length and the dataset's cardinality, ``len(loader)``, always holds (``assert_cardinality`` checks
it, and ``len(dataset)`` and Keras' progress bar know it). No ``.prefetch`` is needed: the loader
prefetches in its workers, and a tf.data buffer would only keep more batches alive and pull batches
the training step has not received (tf.data's own injected prefetch is turned off, so the
loader's ``state_dict()`` counts exactly the batches delivered). TensorFlow
aliases a host array it is given and keeps it as long as its tensors live, so each batch is
handed over as a copy TensorFlow may keep, never as a view of the loader's shared-memory slot
(which would force the loader to replace the slot's segment at every reuse).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import tensorflow as tf

from ..schema import Form, map_form
from .base import owned_batch
from .feed import Batch, Feed
from .scaling import (
    CAST,
    PIXELS,
    ImageConversion,
    Scale,
    is_channels_first,
    leaf_kinds,
    pixel_channels,
)

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["to_tf"]

#: A batch inside the dataset's ``map``: tensors in the loader's structure.
Tensors: TypeAlias = "tf.Tensor | tuple[Tensors, ...] | dict[str, Tensors]"


def _always_full(loader: Feed) -> bool:
    """True when every batch has ``batch_size`` samples (so the batch axis can be fixed): the
    ragged one is dropped, or this rank's samples fill every batch."""
    if loader.drop_last:
        return True
    return len(loader.sampler) == len(loader) * loader.batch_size


class _Epochs:
    """One shared ``loader.stream()``, cut into runs of ``len(loader)`` batches."""

    def __init__(self, loader: Feed) -> None:
        self.loader = loader
        self.stream: Iterator[Batch] | None = None
        self.lock = threading.Lock()

    def __call__(self) -> Iterator[Batch]:
        """One epoch of batches (tf.data calls this once per iteration of the dataset)."""
        for _ in range(len(self.loader)):
            with self.lock:
                if self.stream is None:
                    self.stream = self.loader.stream()
                batch = owned_batch(next(self.stream))
            yield batch
            del batch


def _spec(loader: Feed, name: str, batch: int | None) -> tf.TensorSpec:
    """The TensorSpec of field ``name``: its dtype and shape, exactly as the loader gives it."""
    if name == "path":
        return tf.TensorSpec((batch,), tf.string, name=name)
    spec = loader.recipe.schema.slot_layout.field(name)
    assert spec is not None, name  # every leaf of the form but "path" is a slot field
    return tf.TensorSpec((batch, *spec[2]), tf.as_dtype(np.dtype(spec[1])), name=name)


def to_tf(
    loader: Feed,
    dtype: DTypeLike | None = None,
    mean: Scale | None = None,
    std: Scale | None = None,
    layout: str | None = None,
) -> tf.data.Dataset:
    """Wrap ``loader`` as a ``tf.data.Dataset``: ``for images, labels in to_tf(train): ...``.

    The output signature is exact: the loader's batch structure (``Loader(batch=...)``), each
    field with its own dtype and shape: images ``tf.uint8`` ``(B, H, W, C)`` (batch axis ``None``
    when the last batch of an epoch can be short), or ``dtype`` with optional ``mean``/``std``
    (see ``adapters.scaling``), labels as the source holds them (``tf.int64`` ``(B,)`` class
    ids, or numeric targets of any dtype and shape), masks ``tf.uint8`` ``(B, H, W)``, ``path``
    ``tf.string``. Also usable as ``model.fit(to_tf(train), epochs=...)`` on Keras' TensorFlow
    backend. ``layout="channels_first"`` gives images ``(B, C, H, W)`` (transposed in the
    dataset's map); the default ``"channels_last"`` is TensorFlow's own ``(B, H, W, C)``.
    """
    form, batch = loader.recipe.schema.form, loader.batch_size if _always_full(loader) else None
    signature = map_form(form, form, lambda name, _: _spec(loader, name, batch))
    dataset = tf.data.Dataset.from_generator(_Epochs(loader), output_signature=signature)
    first = is_channels_first("channels_last" if layout is None else layout, "tf")
    kinds = leaf_kinds(
        loader, "tf", dtype=dtype is not None, mean=mean is not None, layout=layout is not None
    )
    image = ImageConversion(pixel_channels(loader, kinds), dtype, mean, std, channels_first=first)
    if image.active:
        dataset = dataset.map(_converter(form, image, kinds))
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(loader)))
    options = tf.data.Options()
    # tf.data would add a prefetch of its own, pulling batches ahead of the training step on a
    # background thread: the loader's state would then count batches the step never received.
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def _converter(form: Form, image: ImageConversion, kinds: dict[str, str]) -> Callable[..., Tensors]:
    """A ``Dataset.map`` function converting the image leaf to ``image``'s dtype/scaling and
    layout."""
    target = None if image.dtype is None else tf.as_dtype(image.dtype)
    norm = None if image.norm is None else [tf.constant(v, tf.float32) for v in image.norm]

    def convert(x: tf.Tensor) -> tf.Tensor:
        if target is not None:
            x = tf.cast(x, tf.float32)
            if norm is not None:
                x = (x - norm[0]) / norm[1]
            x = tf.cast(x, target)
        return tf.transpose(x, (0, 3, 1, 2)) if image.channels_first else x

    def apply(*args: Tensors) -> Tensors:
        batch = args if isinstance(form, tuple) else args[0]

        def leaf(name: str, v: tf.Tensor) -> tf.Tensor:
            kind = kinds.get(name)
            if kind == PIXELS:
                return convert(v)
            return tf.cast(v, target) if kind == CAST and target is not None else v

        return map_form(form, batch, leaf)

    return apply

"""Keras 3 adapter: a ``keras.utils.PyDataset`` over a Loader, for ``fit``/``evaluate``/``predict``.

Works on the TensorFlow, JAX and PyTorch backends. Keras epochs are consecutive runs of
``len(loader)`` batches of ``loader.stream()``, so a loader resumed mid-epoch continues where it
stopped. Keras asks for batches by index, and sometimes asks twice: the TensorFlow backend peeks at
the first two batches to build its ``tf.data`` signature and then starts again from index 0, and
the JAX and PyTorch backends take the first batch to build an unbuilt model, then restart the
epoch. The dataset therefore keeps, for the current Keras epoch, a map from index to the loader
batch it handed out (any index order works, so ``fit(shuffle=True)`` is fine), never pulls a
second loader batch for an index it still holds, and keeps only what a restart can ask again:

- the batch pulled last, as the loader's zero-copy view (the loader allows one held batch);
- the first batch, and batches handed out by a peek (outside an epoch), are copies from the
  start (Keras keeps the first one while it builds the step), and batches of an
  interrupted pass are copied once when the loader is about to reuse their memory (at most a
  couple of copies per ``fit``, none in a steady epoch).

On the TensorFlow backend, and on JAX's CPU backend, Keras keeps the host arrays it is given
longer than the loader's ring allows (its ``tf.data`` wrapper aliases and prefetches them; JAX
aliases them and Keras puts two batches ahead), so there every batch is handed over as a copy
Keras may keep: no slot is ever replaced under it. On PyTorch and JAX on an accelerator batches
stay zero-copy views.

A Keras epoch ends when every index was asked for inside ``on_epoch_begin``/``on_epoch_end``.
Limits: if Keras abandons a pass after more batches than were kept (a custom loop, a
``tf.distribute`` strategy whose prefetch ran ahead), the restarted pass gets fresh batches; with
one or two batches per epoch, the model-building peek of the JAX/PyTorch backends may take them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import keras

from ..schema import map_form
from .base import owned_batch
from .feed import Batch, Feed, State
from .scaling import CAST, PIXELS, ImageConversion, Scale, leaf_kinds, pixel_channels

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["LoaderCheckpoint", "StokerPyDataset", "WaitReport", "to_keras"]

#: What Keras passes its callbacks as ``logs``: metric name -> value.
Logs: TypeAlias = "dict[str, float] | None"


class _Entry:
    """A batch handed out for one index; ``pending``: Keras may ask for that index again."""

    __slots__ = ("batch", "pending", "copied")

    def __init__(self, batch: Batch, pending: bool) -> None:
        self.batch, self.pending, self.copied = batch, pending, False


def _backend_keeps_batches() -> bool:
    """True when Keras' backend keeps the host arrays it is given past the loader's reuse of
    their slot: TensorFlow (its ``tf.data`` wrapper aliases them and prefetches), and JAX on
    CPU (``device_put`` aliases them and Keras puts two batches ahead). Those get copies."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return True
    if backend == "jax":
        import jax

        return bool(jax.default_backend() == "cpu")
    return False


class StokerPyDataset(keras.utils.PyDataset):
    """A ``keras.utils.PyDataset`` that hands out each batch of a Loader once per Keras epoch.

    ``len()`` and ``num_batches`` are ``len(loader)``, so progress bars count the right steps.
    Keras' own workers stay off (``workers=1``, no multiprocessing): the loader already decodes
    in worker processes and prefetches, and pulling in the consumer's thread keeps the loader's
    "time waited for data" honest. (On the TensorFlow backend Keras wraps the dataset in a
    ``tf.data`` generator with its own prefetch; that thread then does the pulling.)
    """

    def __init__(
        self,
        loader: Feed,
        dtype: DTypeLike | None = None,
        mean: Scale | None = None,
        std: Scale | None = None,
    ) -> None:
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=1)
        self.loader = loader
        first = keras.config.image_data_format() == "channels_first"
        self._kinds = leaf_kinds(
            loader, "keras", dtype=dtype is not None, mean=mean is not None, layout=False
        )
        channels = pixel_channels(loader, self._kinds)
        self.image = ImageConversion(channels, dtype, mean, std, channels_first=first)
        self._cast = ImageConversion(channels, dtype)  # a dataset's non-uint8 image fields
        self._stream: Iterator[Batch] | None = None
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}  # index -> batch, for indices Keras may ask again
        self._assigned: set[int] = set()  # indices given a batch in this Keras epoch
        self._seen: set[int] = set()  # indices asked for inside on_epoch_begin/on_epoch_end
        self._in_epoch = False
        self._last: int | None = None  # index of the batch pulled last (may stay a view)
        self._keeps = _backend_keeps_batches()
        self._assigned_ever = False

    def __len__(self) -> int:
        """Batches per Keras epoch: ``len(loader)``."""
        return len(self.loader)

    @property
    def num_batches(self) -> int:
        """Batches per Keras epoch: ``len(loader)`` (finite, so Keras shows the step count)."""
        return len(self.loader)

    def __getitem__(self, index: int) -> Batch:
        """The ``(images, labels)`` batch for ``index`` of the current Keras epoch.

        The first request for an index takes the loader's next batch; a repeated request (a
        peek, a restarted pass) returns the same batch again.
        """
        n = len(self.loader)
        index = int(index)
        if not 0 <= index < n:
            raise IndexError(f"batch index {index} out of range for {n} batches")
        with self._lock:
            if self._in_epoch:
                self._seen.add(index)
            entry = self._entries.get(index)
            if entry is not None:
                if self._in_epoch:
                    entry.pending = False
                return entry.batch
            if index in self._assigned:
                # Keras restarted a pass whose batches are gone: begin a new Keras epoch.
                self._reset()
                if self._in_epoch:
                    self._seen.add(index)
            batch = self._pull()
            entry = _Entry(batch, pending=not self._in_epoch)
            if self._keeps or entry.pending or not self._assigned_ever:
                # Keras keeps it (a peek; the first batch, which it builds with): own memory
                entry.batch, entry.copied = owned_batch(batch), True
            self._assigned_ever = True
            self._assigned.add(index)
            self._entries[index] = entry
            self._last = index
            return entry.batch

    def _pull(self) -> Batch:
        """Take the loader's next batch; first free or copy what the loader is about to reuse."""
        for index, entry in list(self._entries.items()):
            if index == self._last:
                continue  # the loader lets the consumer hold its newest batch
            if not entry.pending:
                del self._entries[index]
            elif not entry.copied:  # Keras will ask again: keep it in our own memory
                entry.batch = owned_batch(entry.batch)
                entry.copied = True
        if self._stream is None:
            self._stream = self.loader.stream()
        batch = next(self._stream)
        if not self.image.active:
            return batch
        options = {PIXELS: self.image, CAST: self._cast}
        kinds = self._kinds
        return map_form(
            self.loader.recipe.schema.form,
            batch,
            lambda n, v: options[kinds[n]].numpy(v) if n in kinds else v,
        )

    def _reset(self) -> None:
        self._entries.clear()
        self._assigned.clear()
        self._seen.clear()
        self._last = None

    def on_epoch_begin(self) -> None:
        """Called by Keras when an epoch (or a pass over this dataset) starts."""
        with self._lock:
            self._in_epoch = True

    def on_epoch_end(self) -> None:
        """Called by Keras when a pass ends: a full one ends the Keras epoch; else keep batches."""
        with self._lock:
            self._in_epoch = False
            if len(self._seen) >= len(self.loader):
                self._reset()
            else:  # interrupted (model-building peek): the pass restarts at its first index
                for entry in self._entries.values():
                    entry.pending = True

    def __repr__(self) -> str:
        return f"StokerPyDataset({self.loader!r}, {len(self)} batches)"


def to_keras(
    loader: Feed,
    dtype: DTypeLike | None = None,
    mean: Scale | None = None,
    std: Scale | None = None,
) -> StokerPyDataset:
    """Wrap ``loader`` for Keras 3: ``model.fit(to_keras(train), validation_data=to_keras(val))``.

    Images come as ``uint8`` ``(B, H, W, C)`` (put a ``Rescaling`` layer in the model), or
    ``dtype`` (``"float32"``) with optional ``mean``/``std`` (see ``adapters.scaling``;
    ``mean=0, std=1`` scales to [0, 1]); ``(B, C, H, W)`` when
    ``keras.config.image_data_format()`` is ``"channels_first"``. Labels come as the loader
    holds them (``int64`` ``(B,)`` class ids for ``sparse_categorical_crossentropy``, one-hot
    with ``label_mode="categorical"``, numeric targets as they are). A loader with masks gives
    ``(x, y=masks)``, masks ``uint8`` ``(B, H, W)``: per-pixel sparse targets.
    """
    return StokerPyDataset(loader, dtype=dtype, mean=mean, std=std)


class LoaderCheckpoint(keras.callbacks.Callback):
    """Saves a Loader's position next to your model checkpoints; restores it on a restart.

    Create it before ``fit`` (it restores the saved position, if any, at once), and save at the
    same moments as the model: ``save_freq="epoch"`` (with ``BackupAndRestore()``) or every N
    batches (with ``BackupAndRestore(save_freq=N)`` / ``ModelCheckpoint(save_freq=N)``). The
    saved position counts batches *trained on*, not batches prefetched, so a resumed run sees
    exactly the batches the interrupted one had not trained on yet.
    """

    def __init__(
        self, loader: Feed, path: str | os.PathLike[str], save_freq: int | str = "epoch"
    ) -> None:
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError(f"save_freq={save_freq!r}: use 'epoch' or a positive batch count")
        self.loader, self.path, self.save_freq = loader, Path(path), save_freq
        self.restored = self.path.exists()
        if self.restored:
            loader.load_state_dict(json.loads(self.path.read_text()))
        #: what the restore did when it changed the world size or batch size ("" if not)
        self.note: str = getattr(loader, "resume_note", "") if self.restored else ""
        self._base = loader.state_dict()
        self._trained = 0

    def on_train_begin(self, logs: Logs = None) -> None:
        """Say, beside Keras' own lines, what a restore that changed sizes did."""
        if self.note:
            print(f"stoker: {self.note}", flush=True)

    def state(self) -> State:
        """The loader state after the batches trained so far."""
        return self.loader.advance_state(self._base, self._trained)

    def save(self) -> None:
        """Write the state atomically (temporary file, then rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.state()))
        os.replace(tmp, self.path)

    def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
        """Count a trained batch; save every ``save_freq`` batches."""
        self._trained += 1
        if isinstance(self.save_freq, int) and self._trained % self.save_freq == 0:
            self.save()

    def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
        """Save at the end of each epoch (``save_freq="epoch"``)."""
        if self.save_freq == "epoch":
            self.save()


class WaitReport(keras.callbacks.Callback):
    """Puts the epoch's wait report into Keras' ``logs``: ``data_wait`` (the share of the
    training loop's time spent waiting for the loader) and ``input_img_s`` (images per second
    it received), so History, the progress bar's end-of-epoch line, CSVLogger and TensorBoard
    show them. ``fit(..., callbacks=[train.keras_report(), CSVLogger(...)])``: Keras runs
    callbacks in list order (History and the progress bar last), so list it before the loggers.

    Only training steps count: the loader is paused while validation runs and between epochs.
    On the TensorFlow backend Keras pulls batches on a ``tf.data`` prefetch thread, so the
    figure is that thread's wait; on JAX and PyTorch it is the training loop's own.
    """

    def __init__(self, loader: Feed) -> None:
        super().__init__()
        self.loader = loader
        self.meter = loader.wait_meter(every=1 << 62)

    def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
        """Start the epoch's stretch."""
        self.meter.figures()

    def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
        """The step ended: the training loop's time runs to here."""
        self.meter.step()

    def on_test_begin(self, logs: Logs = None) -> None:
        """Validation starts: the training loader's clock stops."""
        self.meter.pause()

    def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
        """Add this epoch's ``data_wait`` and ``input_img_s`` to ``logs``."""
        self.meter.pause()
        if logs is None:
            return
        figures = self.meter.figures()
        logs["data_wait"] = figures["data_wait"]
        logs["input_img_s"] = figures["input_img_s"]
        if "device_wait" in figures:
            logs["device_wait"] = figures["device_wait"]

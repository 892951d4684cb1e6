"""A Loader's views for the frameworks: Keras, torch, JAX and tf.data adapters, its Keras
callbacks, and the attributes of a ``torch.utils.data.DataLoader`` that frameworks read off it.

Every view is built from the loader as a ``Feed`` (``adapters.feed``): this mixin reads no
attribute of the Loader, only what ``Feed`` lists, so a view cannot come to depend on the
loader's insides. Each adapter imports its framework only when called."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from ..adapters.dataloader import EpochBatches, EpochSampler, Samples, collate
from ..stats import WaitMeter
from . import config

if TYPE_CHECKING:  # never evaluated at run time
    import tensorflow

    from ..adapters.dataloader import Sampled
    from ..adapters.feed import Feed
    from ..adapters.jax import JaxLoader
    from ..adapters.keras import LoaderCheckpoint, StokerPyDataset, WaitReport
    from ..adapters.torch import TorchLoader


class Views:
    """The framework views of ``Loader`` (a mixin of methods over ``self`` as a ``Feed``)."""

    def _feed(self) -> Feed:
        """This loader as adapters see it (``core._is_a_feed`` proves a ``Loader`` is a Feed)."""
        return cast("Feed", self)

    def _sampled(self) -> Sampled:
        """This loader as its DataLoader parts see it (``core._is_sampled`` proves it)."""
        return cast("Sampled", self)

    # ------------------------------------------------------- what DataLoader users read

    @property
    def dataset(self) -> Samples:
        """The samples drawn from, as a DataLoader's ``dataset``: ``len(loader.dataset)`` is
        their count over all ranks (what torchvision's ``evaluate`` compares with); also
        ``.classes`` and ``.class_to_idx``."""
        return Samples(self._sampled())

    @property
    def sampler(self) -> EpochSampler:
        """A DistributedSampler's habits: ``loader.sampler.set_epoch(epoch)`` (kept position
        when ``epoch`` is the current one), ``len()`` = samples this rank visits per epoch."""
        return EpochSampler(self._sampled())

    @property
    def batch_sampler(self) -> EpochBatches:
        """The epoch's batches as a DataLoader's batch sampler yields them (lists of sample
        indices, from the epoch's first batch; ``len()`` = batches per epoch): what
        Lightning's shuffle check and ``accelerate.skip_first_batches`` read."""
        return EpochBatches(self._sampled())

    @property
    def collate_fn(self) -> Callable[[Any], Any]:
        """What a DataLoader rebuilt from this loader's parts applies to a batch fetched from
        ``dataset``: it passes the loader's own batch through (``dataloader.collate``)."""
        return collate

    def _dataset_of(self, view: Iterable[Any]) -> Samples:
        """For adapters: ``dataset`` for ``view`` (one of this loader's framework views): a
        DataLoader rebuilt from the view's parts fetches the view's own batches from it."""
        return Samples(self._sampled(), view)

    # ------------------------------------------------------------------ frameworks

    def keras(self, dtype: Any = None, mean: Any = None, std: Any = None) -> StokerPyDataset:
        """A ``keras.utils.PyDataset`` over this loader, for ``model.fit`` on any backend;
        ``dtype``/``mean``/``std`` convert the images (``mean=0, std=1``: [0, 1])."""
        from ..adapters.keras import to_keras

        return to_keras(self._feed(), dtype=dtype, mean=mean, std=std)

    def keras_report(self) -> WaitReport:
        """A Keras callback that puts each epoch's ``data_wait`` and ``input_img_s`` into
        ``logs`` (History, the progress bar, CSVLogger, TensorBoard), counting only training
        steps; list it before CSVLogger/TensorBoard in ``callbacks=``."""
        from ..adapters.keras import WaitReport

        return WaitReport(self._feed())

    def keras_checkpoint(self, path: Any, save_freq: Any = "epoch") -> LoaderCheckpoint:
        """A Keras callback that saves this loader's position to ``path`` (JSON) as training
        goes, and restores it now if ``path`` exists; pair it with ``BackupAndRestore``."""
        from ..adapters.keras import LoaderCheckpoint

        return LoaderCheckpoint(self._feed(), path, save_freq=save_freq)

    def torch(self, device: Any = None, **kwargs: Any) -> TorchLoader:
        """An iterable of torch tensors, copied to ``device`` ahead of use."""
        from ..adapters.torch import to_torch

        return to_torch(self._feed(), device=device, **kwargs)

    def jax(self, sharding: Any = None, **kwargs: Any) -> JaxLoader:
        """An iterable of jax arrays, put on the device(s) ahead of use (``dtype``, ``mean``,
        ``std`` convert the images there)."""
        from ..adapters.jax import to_jax

        return to_jax(self._feed(), sharding=sharding, **kwargs)

    def tf(self, **kwargs: Any) -> tensorflow.data.Dataset:
        """A ``tf.data.Dataset`` of this loader's batches (one epoch per iteration;
        ``dtype``, ``mean``, ``std`` convert the images)."""
        from ..adapters.tf import to_tf

        return to_tf(self._feed(), **kwargs)

    def wait_meter(self, every: int = 100) -> WaitMeter:
        """The wait report for a hand-written loop: call ``meter.step()`` after each training
        step; every ``every`` steps it returns those steps' ``data_wait``, ``input_img_s`` (and
        ``device_wait``, the GPU's own share, with ``torch(device="cuda")``), else ``None``."""
        return WaitMeter(self._feed()._device_stats(), config.positive_int("every", every))

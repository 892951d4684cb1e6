"""What a Loader shows: its report (``stats()``) and its views for the frameworks (Keras,
torch, JAX, tf.data) and for device adapters; each adapter imports its framework only when
called."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from .. import order as order_mod
from ..adapters.dataloader import EpochBatches, Samples, collate
from ..decode import decoder_name
from ..sources.targets import class_ids
from ..stats import Stats, StatsReport, WaitMeter
from ..workers.launch import describe as describe_start
from ..workers.threads import describe as describe_threads
from . import config

if TYPE_CHECKING:  # never evaluated at run time
    import tensorflow

    from ..adapters.dataloader import Sampled
    from ..adapters.feed import Feed, Ring
    from ..adapters.jax import JaxLoader
    from ..adapters.keras import LoaderCheckpoint, StokerPyDataset, WaitReport
    from ..adapters.torch import TorchLoader
    from ..recipe import Recipe
    from ..workers.runspec import RunSpec
    from .running import Running


class Views:
    """The report and framework views of ``Loader`` (a mixin: its methods run on a ``Loader``,
    which sets these attributes)."""

    recipe: Recipe
    run: RunSpec
    batch_size: int
    shuffle: bool
    epoch: int
    resume_note: str
    _run: Running
    _stats: Stats
    _shuffle_note: tuple[tuple[int, str], list[str]]

    def _feed(self) -> Feed:
        """This loader as adapters see it (``core._is_a_feed`` proves a ``Loader`` is a Feed)."""
        return cast("Feed", self)

    def _sampled(self) -> Sampled:
        """This loader as its DataLoader parts see it (``core.py`` hands them the Loader itself,
        which mypy checks against the protocol)."""
        return cast("Sampled", self)

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

    def dataset_of(self, view: Iterable[Any]) -> Samples:
        """``dataset`` for ``view`` (this loader or one of its framework views): a DataLoader
        rebuilt from the view's parts fetches the view's own batches from it."""
        return Samples(self._sampled(), view)

    def stats(self) -> StatsReport:
        """Throughput, time the consumer waited for data and its share, stage times, bad files."""
        engine = self._run.engine
        startup_s, startup = describe_start(
            self._run.started, self._start_cause(), self._run.waited_s, self._run.here()
        )
        return self._stats.report(
            workers=self.run.workers,
            workers_reason=self.run.workers_reason,
            prefetch=self._run.prefetch(),
            prefetch_reason=self._run.prefetch_reason,
            kept_batches=engine.orphaned if engine is not None else 0,
            memory_folder=self._run.folder,
            notes=self._notes(),
            decoder=decoder_name(),
            startup_s=startup_s,
            startup=startup,
            worker_threads=describe_threads(self.run.worker_threads) if self.run.workers else "",
            from_storage=bool(self.recipe.source.from_storage),
            cluster=self._run.cluster_stats(),
        )

    def _start_cause(self) -> str:
        """What the workers load the user's modules for (see ``launch.CAUSES``)."""
        if self.recipe.source.sample_fields is not None:
            return "dataset"
        return "augment" if getattr(self.recipe.pipeline, "ops", None) else "settings"

    def _notes(self) -> list[str]:
        """Extra lines for the report: what a resume changed, how well a block (row-group)
        shuffle mixes the data.

        Computed once per epoch and resume: the shuffle's line builds the epoch's whole order,
        too much for every call."""
        key = (self.epoch, self.resume_note)
        if self._shuffle_note[0] != key:
            lines = [self.resume_note] if self.resume_note else []
            if self.shuffle and self.recipe.plan.block_sizes:
                lines += self._shuffle_lines()
            self._shuffle_note = (key, lines)
        return self._shuffle_note[1]

    def _shuffle_lines(self) -> list[str]:
        plan = self.recipe.plan
        assert plan.block_sizes is not None
        labels = class_ids(self.recipe.source.labels)
        return [
            order_mod.shuffle_note(
                plan.order(self.epoch), plan.block_sizes, labels, self.batch_size
            )
        ]

    def keras(self, dtype: Any = None, mean: Any = None, std: Any = None) -> StokerPyDataset:
        """A ``keras.utils.PyDataset`` over this loader, for ``model.fit`` on any backend;
        ``dtype``/``mean``/``std`` convert the images (``mean=0, std=1``: [0, 1])."""
        from ..adapters.keras import to_keras

        return to_keras(self._feed(), dtype=dtype, mean=mean, std=std)

    def ring(self) -> Ring | None:
        """For device adapters: the running prefetch ring (``hold_until``,
        ``watch_segments``), or None with ``workers=0`` or before the first batch."""
        engine = self._run.engine
        return None if engine is None else engine.ring()

    def device_stats(self) -> Stats:
        """For device adapters: the counters, to add the device's own wait and say how
        batches reach it."""
        return self._stats

    def wait_meter(self, every: int = 100) -> WaitMeter:
        """The wait report for a hand-written loop: call ``meter.step()`` after each training
        step; every ``every`` steps it returns those steps' ``data_wait``, ``input_img_s`` (and
        ``device_wait``, the GPU's own share, with ``torch(device="cuda")``), else ``None``."""
        return WaitMeter(self._stats, config.positive_int("every", every))

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

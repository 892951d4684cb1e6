"""Loader: wires source, order, workers, prefetch and adapters; iteration, state, stats, close."""

from __future__ import annotations

import textwrap
import warnings
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import order as order_mod
from ..assemble import Assembler, Report
from ..decode import decoder_name
from ..errors import ConfigError, StokerError, StokerWarning, TooManyErrors
from ..order import Plan
from ..schema import BatchSchema, Columns, SlotLayout
from ..seeding import user_states_kept
from ..sources.base import Source
from ..sources.readahead import ReadSettings
from ..sources.targets import class_ids
from ..stats import Stats, StatsReport, WaitMeter
from ..transforms import Pipeline
from ..workers.cluster import options as cluster_options
from ..workers.cluster import probe_digest
from ..workers.launch import describe as describe_start
from ..workers.threads import describe as describe_threads
from . import config, optiondocs, wiring
from .compat import EpochSampler, Samples
from .consumer import Guard
from .options import Options
from .recipe import Recipe
from .running import Running, auto_workers, warn_if_slow_decoder
from .state import advance_state, check_state, make_state
from .supplier import Supplier

if TYPE_CHECKING:  # never evaluated at run time; typing_extensions has Unpack on 3.10 too
    import tensorflow
    from typing_extensions import Unpack

    from ..adapters.feed import Feed, Ring
    from ..adapters.jax import JaxLoader
    from ..adapters.keras import LoaderCheckpoint, StokerPyDataset, WaitReport
    from ..adapters.torch import TorchLoader
    from .kwargs import LoaderKwargs  # generated: imported for type checkers only

Batch = Any  # the structure ``Loader(batch=...)`` asks for; by default (images, labels)
Fields = dict[str, np.ndarray]


def _boxed(batch: Any) -> list[Any] | None:
    """``[batch]``, or None at the end of the epoch."""
    return None if batch is None else [batch]


class Loader:
    """Shuffled, augmented, fixed-shape batches, decoded in parallel and prefetched.

    Iterating gives ``(images, labels)``: ``uint8`` ``(B, H, W, 3)`` images and the labels as
    the source holds them: ``int64`` ``(B,)`` class ids, or numeric targets of any dtype and
    shape ``(B, ...)`` kept bit for bit. A segmentation source (``masks=``, or a CSV with an
    ``image,mask`` header) gives ``(images, masks)``, masks ``uint8`` ``(B, H, W)`` with the
    image's crop and flip. ``batch="dict"`` (or a tuple/dict of field names) gives structured
    batches. Every argument is validated before anything is opened or started, with a message
    saying the fix; ``subset="both"`` returns a ``(training, validation)`` pair of loaders.
    """

    def __init__(self, source: Any = None, **kwargs: Unpack[LoaderKwargs]) -> None:
        # every argument is checked first, before a source is opened or anything is started;
        # the signature help() and IPython show is generated from the groups (``_document``),
        # and type checkers and editors read the names and types from ``LoaderKwargs``
        opts = self.options = Options.from_kwargs(source=source, **kwargs)
        run = opts.run
        self.batch_size, self.seed, self.shuffle = (
            opts.batch.batch_size,
            opts.order.seed,
            opts.order.shuffle,
        )
        self.timeout, self.worker_threads, self.start_method = (
            run.timeout,
            run.worker_threads,
            run.start_method,
        )
        self.workers, self._workers_reason = config.worker_count(run.workers)
        self._auto_workers = isinstance(run.workers, str) and run.workers == "auto"
        self._prefetch_arg = run.prefetch
        ray = opts.ray
        self.cluster = cluster_options(
            ray.cluster, ray.cluster_workers, ray.cluster_transport, ray.cluster_listen
        )
        parts = wiring.build(opts)
        self.subset = opts.source.subset
        self.image_size, self.augment = parts.image_size, parts.augment
        self.has_masks, self.drop_last, self.max_errors = (
            parts.has_masks,
            parts.drop_last,
            parts.max_errors,
        )
        #: what the loader is made of, built once: the workers and nodes receive this object
        self.recipe: Recipe = parts.recipe
        self._peeker: Assembler | None = None  # fills peek()'s batches in this process
        self._batches = self.plan.batches()
        self.epoch, self.position = 0, 0
        self._ahead = 0  # batches an adapter took ahead of the training step (not yet received)
        self._stats = Stats()
        self._shuffle_note: tuple[int, list[str]] = (-1, [])
        self._run = Running()
        self._guard = Guard()
        self._finalizer = weakref.finalize(self, Running.close, self._run)
        warn_if_slow_decoder()
        self._launch_ahead()

    # ------------------------------------------------------------------ iteration

    def __len__(self) -> int:
        """Batches per epoch (for this rank)."""
        return self._batches

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """``subset="both"`` (with ``validation_split``) gives two loaders, ``(training,
        validation)``, as Keras' ``image_dataset_from_directory`` does; ``augment=`` and
        ``batch_transform=`` may then be a dict ``{"training": ..., "validation": ...}``
        giving each half its own (a half left out gets the default)."""
        if kwargs.get("subset") == "both":
            kwargs.pop("subset")
            halves = config.per_half(kwargs)
            return tuple(cls(*args, subset=half, **halves[half]) for half in config.HALVES)
        config.no_per_half(kwargs)
        return super().__new__(cls)

    @property
    def source(self) -> Source:
        """The opened source (after ``validation_split``/``subset`` and ``class_names``)."""
        return self.recipe.source

    @property
    def pipeline(self) -> Pipeline:
        """The decode + transform pipeline every sample goes through."""
        return self.recipe.pipeline

    @property
    def plan(self) -> Plan:
        """Which samples batch k of epoch e holds, for this rank."""
        return self.recipe.plan

    @property
    def schema(self) -> BatchSchema:
        """What a batch is: its slot layout, columns and form."""
        return self.recipe.schema

    @property
    def reads(self) -> ReadSettings | None:
        """The read-ahead settings (``read_ahead``, ``page_cache``)."""
        return self.recipe.read_ahead

    @property
    def slot_layout(self) -> SlotLayout:
        """The fields of one batch as they sit in a slot: names, dtypes, shapes."""
        return self.recipe.schema.slot_layout

    @property
    def columns(self) -> Columns:
        """The per-sample fields carried with each sample (``label``, ``weight``, ...)."""
        return self.recipe.schema.columns

    @property
    def form(self) -> Any:
        """The structure batches are handed out in (``batch=``): field names in tuples/dicts."""
        return self.recipe.schema.form

    @property
    def layout(self) -> Any:
        """Deprecated spelling of ``slot_layout`` (the fields of one batch in shared memory;
        ``layout=`` of an adapter is the channel order); removed in 0.3."""
        warnings.warn(
            "Loader.layout is deprecated and will be removed in stoker 0.3: use "
            "Loader.slot_layout (the batch's fields; an adapter's layout= is the channel order)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.slot_layout

    @property
    def classes(self) -> list[str] | None:
        """Class names, when the source has them (folder names, text labels)."""
        return self.source.classes

    @property
    def class_names(self) -> list[str] | None:
        """Class names (Keras' ``class_names``): class id ``k`` is ``class_names[k]``."""
        return self.source.classes

    @property
    def dataset(self) -> Samples:
        """The samples drawn from, as a DataLoader's ``dataset``: ``len(loader.dataset)`` is
        their count over all ranks (what torchvision's ``evaluate`` compares with); also
        ``.classes`` and ``.class_to_idx``."""
        return Samples(self)

    @property
    def sampler(self) -> EpochSampler:
        """A DistributedSampler's habits: ``loader.sampler.set_epoch(epoch)`` (kept position
        when ``epoch`` is the current one), ``len()`` = samples this rank visits per epoch."""
        return EpochSampler(self)

    @property
    def file_paths(self) -> list[str]:
        """Every sample's file path (or ``array[i]``), in the source's order (Keras'
        ``file_paths``); batches carry theirs with ``batch=`` field ``path``."""
        return [self.source.name(i) for i in range(len(self.source))]

    @property
    def source_indices(self) -> np.ndarray:
        """Each sample's index in the source you passed (before ``validation_split``/``subset``
        and ``class_names``), in the order of ``file_paths``: the numbering of the batches'
        ``index`` field and of ``sample_weight=``/``fields=`` rows."""
        return self.source.source_indices(np.arange(len(self.source)))

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch (all of it, unless resumed or broken off mid-way)."""
        return self._epoch_batches()

    def stream(self) -> Iterator[Batch]:
        """Batches without end, epoch after epoch."""
        while True:
            yield from self._epoch_batches()

    def _epoch_batches(self) -> Iterator[Batch]:
        self._guard.check_process()
        if self.position >= self._batches:
            self.epoch, self.position = self.epoch + 1, 0
        epoch = self.epoch
        # iter(callable, None) keeps no reference to a batch while the consumer has it; the
        # batch travels in a one-item list (a bare array batch cannot be compared with None)
        for box in iter(lambda: _boxed(self._take(epoch)), None):
            yield box.pop()
        if self.epoch == epoch and self.position >= self._batches:
            self.epoch, self.position = epoch + 1, 0
            self._stats.pause()  # the epoch's loop is over: validation etc. is not counted

    def _take(self, epoch: int) -> Batch | None:
        """The next batch of ``epoch`` (None at its end); position moves under the guard."""
        with self._guard.taking():
            if self.position >= self._batches or self.epoch != epoch:
                return None
            out = self._next((epoch, self.position))
            self.position += 1
            return out

    def _next(self, key: tuple[int, int]) -> Batch:
        t0 = self._stats.begin_wait()  # the first wait includes the workers' start-up
        try:
            fields, report = self._engine().get(key)
            self._account(report)
        except BaseException as exc:
            if isinstance(exc, TooManyErrors):  # a batch where no sample loads: count them
                self._stats.add(Report(bad=getattr(exc, "bad", [])))
            self._run.close(fast=True)  # the error is not delayed by waiting on the workers
            raise
        self._stats.end_wait(t0, report.count)
        return self._arrange(fields, report.count)

    def _arrange(self, fields: Fields, count: int) -> Batch:
        """A filled batch as the user gets it: cut to its ``count`` samples, ``path`` added,
        arranged in the ``batch=`` structure."""
        if count < self.batch_size:
            fields = {name: arr[:count] for name, arr in fields.items()}
        return self.schema.arrange(fields, self.source.origin().name)

    def peek(self, batch: int | None = None) -> Batch:
        """A batch exactly as iteration gives it (augmented, ``batch_transform`` applied, the
        same structure), without taking it: the position, ``state_dict()`` and the batches
        iteration gives are unchanged. ``peek()`` is the batch the next iteration starts with;
        ``peek(k)`` is batch ``k`` of that epoch. Loaded in this process (the workers, running
        or not, are not asked), so it costs one batch's decode here; for a plot or a check."""
        self._guard.check_process()
        if self._finalizer.alive is False:
            raise StokerError("this Loader is closed; create a new one")
        epoch, position = self._received()
        if batch is not None:
            if (
                isinstance(batch, bool)
                or not isinstance(batch, int | np.integer)
                or not (0 <= batch < self._batches)
            ):
                raise ConfigError(
                    f"peek({batch!r}): give a batch number in [0, {self._batches}) (len(loader)"
                    "), or nothing for the batch the next iteration starts with"
                )
            position = int(batch)
        fields = self.slot_layout.arrays()
        if self._peeker is None:
            self._peeker = self._assembler()
        with user_states_kept():  # the user's own random draws are not moved by a look
            report = self._peeker.fill(epoch, position, fields)
        return self._arrange(fields, report.count)

    def _account(self, report: Report) -> None:
        """Fold a batch's report into the stats; warn about new bad files; enforce the budget."""
        new = self._stats.add(report)
        before = len(self._stats.bad) - len(new)
        # only the samples within the budget are warned about: past it, the error below names
        # them all (max_errors=0 raises at the first bad sample, with no warning before)
        for k, (_, name, reason) in enumerate(new[: max(0, self.max_errors - before)], start=1):
            warnings.warn(
                f"stoker skipped {name} ({reason}); a good sample took its place "
                f"({before + k} of max_errors={self.max_errors} used)",
                StokerWarning,
                stacklevel=5,
            )
        if len(self._stats.bad) > self.max_errors:
            listed = "\n".join(f"  {n}: {r}" for n, r in list(self._stats.bad.values())[:20])
            raise TooManyErrors(
                f"{len(self._stats.bad)} samples failed to load, more than max_errors="
                f"{self.max_errors}:\n{listed}\nfix or remove these files, or raise max_errors"
            )

    # ------------------------------------------------------------------ workers

    def _engine(self) -> Supplier:
        self._guard.check_process()
        if self._run.engine is None:
            if self._finalizer.alive is False:
                raise StokerError("this Loader is closed; create a new one")
            self._start()
        assert self._run.engine is not None
        return self._run.engine

    def _assembler(self) -> Assembler:
        """A batch filler for this process (workers make their own from the same Recipe)."""
        return self.recipe.assembler()

    def _count_workers(self, assembler: Assembler) -> None:
        """Settle ``workers="auto"`` (once) from the measured cost of a sample."""
        if self.workers and self._auto_workers:
            self.workers, self._workers_reason = auto_workers(
                assembler, self.slot_layout, self.batch_size
            )
            self._auto_workers = False

    def _launch_ahead(self) -> None:
        """A per-sample dataset's workers are launched now, not at the first batch: each
        imports the dataset's modules (torch, datasets: seconds), and that overlaps whatever
        the caller does before iterating (building the model). Image sources start in a
        fraction of a second and keep starting at the first batch; so do cluster loaders."""
        if not self.workers or self.source.sample_fields is None or self.cluster is not None:
            return
        self._count_workers(self._assembler())
        if self.workers:
            self._run.launch_pool(
                self.recipe,
                self.workers,
                self._prefetch_arg,
                self.timeout,
                self.worker_threads,
            )

    def _start(self) -> None:
        assembler = self._assembler()
        self._count_workers(assembler)
        if self.workers == 0 and self.cluster is None:
            self._run.start_inline(assembler, self.slot_layout)
            return
        if self.cluster is not None:  # the nodes get exactly what the local workers get
            self._run.start_cluster(
                self.recipe,
                self.workers,
                self.cluster,
                self._prefetch_arg,
                self._batches,
                self.timeout,
                self.source.name,
                self._samples,
                lambda: probe_digest(assembler, self.slot_layout, (0, 0)),
                self.worker_threads,
            )
            return
        self._run.start_pool(
            self.recipe,
            self.workers,
            self._prefetch_arg,
            self._batches,
            self.timeout,
            self.source.name,
            self.worker_threads,
            here=assembler,  # workers launched ahead and still starting: fill batches here
        )

    def _samples(self, key: tuple[int, int]) -> list[str]:
        """The names of the samples batch ``key`` (epoch, position) holds."""
        start = key[1] * self.batch_size
        order = self.plan.order(key[0])[start : start + self.batch_size]
        return [self.source.name(int(i)) for i in order]

    # ------------------------------------------------------------------ state

    def _received(self) -> tuple[int, int]:
        """``(epoch, position)`` of the next batch the training step has not received yet:
        batches an adapter holds ahead (a device copy in flight) do not count."""
        done = self.epoch * self._batches + self.position - self._ahead
        return divmod(done, self._batches)

    def hold_ahead(self, batches: int) -> None:
        """For adapters: ``batches`` more batches were taken ahead of the training step (a
        negative count: that many were handed over). ``state_dict`` leaves them out."""
        self._ahead += batches

    def give_back_ahead(self) -> None:
        """For adapters: the consumer stopped while batches were held ahead; the next
        iteration starts with the first of them, so none is skipped."""
        if self._ahead:
            self.epoch, self.position = self._received()
            self._ahead = 0

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration (as
        ``DistributedSampler.set_epoch``); the epoch number seeds the order and augmentation."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): give an epoch number >= 0")
        self.epoch, self.position, self._ahead = int(epoch), 0, 0

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as JSON-able data; ``load_state_dict`` resumes exactly there.

        The position counts batches the training step received: a batch an adapter has taken
        ahead (``torch(device="cuda")``, ``jax()``) is left out, so a state taken after ``k``
        batches resumes at batch ``k``."""
        epoch, position = self._received()
        return make_state(
            epoch,
            position,
            seed=self.seed,
            batch_size=self.batch_size,
            batches=self._batches,
            fingerprint=self.source.fingerprint(),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``; refuses a state of another dataset or other settings.

        An empty state (``{}``) starts fresh at epoch 0, as torchdata's ``StatefulDataLoader``
        treats one."""
        if not state:
            self.epoch, self.position, self._ahead = 0, 0, 0
            return
        older: list[str] = getattr(self.source, "older_fingerprints", list)()
        self.epoch, self.position = check_state(state, self.state_dict(), older)
        self._ahead = 0

    # ------------------------------------------------------------------ reporting, adapters

    def stats(self) -> StatsReport:
        """Throughput, time the consumer waited for data and its share, stage times, bad files."""
        engine = self._run.engine
        startup_s, startup = describe_start(
            self._run.started, self._start_cause(), self._run.waited_s, self._run.here()
        )
        return self._stats.report(
            workers=self.workers,
            workers_reason=self._workers_reason,
            prefetch=self._run.prefetch(),
            prefetch_reason=self._run.prefetch_reason,
            kept_batches=engine.orphaned if engine is not None else 0,
            memory_folder=self._run.folder,
            notes=self._notes(),
            decoder=decoder_name(),
            startup_s=startup_s,
            startup=startup,
            worker_threads=describe_threads(self.worker_threads) if self.workers else "",
            from_storage=bool(self.source.from_storage),
            cluster=self._run.cluster_stats(),
        )

    def _start_cause(self) -> str:
        """What the workers load the user's modules for (see ``launch.CAUSES``)."""
        if self.source.sample_fields is not None:
            return "dataset"
        return "augment" if getattr(self.pipeline, "ops", None) else "settings"

    def _notes(self) -> list[str]:
        """Extra lines for the report: how well a block (row-group) shuffle mixes the data.

        Computed once per epoch: it builds the epoch's whole order, too much for every call."""
        if not (self.shuffle and self.plan.block_sizes):
            return []
        if self._shuffle_note[0] != self.epoch:
            self._shuffle_note = (self.epoch, self._shuffle_lines())
        return self._shuffle_note[1]

    def _shuffle_lines(self) -> list[str]:
        assert self.plan.block_sizes is not None
        order = self.plan.order(self.epoch)
        labels = class_ids(self.source.labels)
        return [order_mod.shuffle_note(order, self.plan.block_sizes, labels, self.batch_size)]

    advance_state = staticmethod(advance_state)

    def keras(self, dtype: Any = None, mean: Any = None, std: Any = None) -> StokerPyDataset:
        """A ``keras.utils.PyDataset`` over this loader, for ``model.fit`` on any backend;
        ``dtype``/``mean``/``std`` convert the images (``mean=0, std=1``: [0, 1])."""
        from ..adapters.keras import to_keras

        return to_keras(self, dtype=dtype, mean=mean, std=std)

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

        return WaitReport(self)

    def keras_checkpoint(self, path: Any, save_freq: Any = "epoch") -> LoaderCheckpoint:
        """A Keras callback that saves this loader's position to ``path`` (JSON) as training
        goes, and restores it now if ``path`` exists; pair it with ``BackupAndRestore``."""
        from ..adapters.keras import LoaderCheckpoint

        return LoaderCheckpoint(self, path, save_freq=save_freq)

    def torch(self, device: Any = None, **kwargs: Any) -> TorchLoader:
        """An iterable of torch tensors, copied to ``device`` ahead of use."""
        from ..adapters.torch import to_torch

        return to_torch(self, device=device, **kwargs)

    def jax(self, sharding: Any = None, **kwargs: Any) -> JaxLoader:
        """An iterable of jax arrays, put on the device(s) ahead of use (``dtype``, ``mean``,
        ``std`` convert the images there)."""
        from ..adapters.jax import to_jax

        return to_jax(self, sharding=sharding, **kwargs)

    def tf(self, **kwargs: Any) -> tensorflow.data.Dataset:
        """A ``tf.data.Dataset`` of this loader's batches (one epoch per iteration;
        ``dtype``, ``mean``, ``std`` convert the images)."""
        from ..adapters.tf import to_tf

        return to_tf(self, **kwargs)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the workers and free all shared memory; idempotent."""
        self._finalizer()
        self.recipe.close()

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any], dict[str, Any]]]:
        """``copy``, ``deepcopy`` and ``pickle`` give a new, unstarted Loader with the same
        arguments at the same position (workers and memory are never shared or copied)."""
        return (_rebuild, (self.options.kwargs(), self.state_dict()))

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Loader({len(self.source)} samples, batch_size={self.batch_size}, "
            f"image_size={self.image_size}, augment={self.augment!r}, workers={self.workers})"
        )


def _rebuild(args: dict[str, Any], state: dict[str, Any]) -> Loader:
    """A copy of a loader: made from its arguments, moved to its position."""
    loader = Loader(**args)
    loader.load_state_dict(state)
    return loader


def _document(cls: type[Loader]) -> None:
    """Give ``Loader`` its "Args" section and its real signature, both generated from the
    option groups (``__init__(source, **kwargs)`` and ``__new__(*args, **kwargs)`` would
    otherwise hide the arguments from ``inspect.signature``, ``help()``, IPython and Jupyter)."""
    args = textwrap.indent(optiondocs.args_section(), "    ")
    cls.__doc__ = f"{(cls.__doc__ or '').rstrip()}\n\n{args}\n    "
    cls.__signature__ = optiondocs.signature()  # type: ignore[attr-defined]


_document(Loader)

if TYPE_CHECKING:

    def _is_a_feed(loader: Loader) -> Feed:
        """mypy proves here that a Loader gives adapters all they use (``adapters.feed``)."""
        return loader

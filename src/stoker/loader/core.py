"""Loader: wires source, order, workers, prefetch and adapters; iteration, peek, state, close.

Its start-up (``starting.Starting``) and its report and framework views (``views.Views``) are
mixins in their own modules."""

from __future__ import annotations

import dataclasses
import textwrap
import warnings
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..adapters.dataloader import EpochSampler, Samples
from ..assemble import Assembler, Report
from ..errors import ConfigError, StokerError, TooManyErrors, warn
from ..order import Plan
from ..recipe import Recipe
from ..schema import BatchSchema, Columns, Fields, SlotLayout
from ..seeding import user_states_kept
from ..sources.base import Source, older_fingerprints
from ..sources.readahead import ReadSettings
from ..stats import Stats
from ..transforms import Pipeline
from ..workers.runspec import RunSpec
from . import config, optiondocs, steps, wiring
from .address import Addressing
from .consumer import Guard
from .options import Options
from .running import Running, warn_if_slow_decoder
from .starting import Starting
from .state import check_state
from .views import Views

if TYPE_CHECKING:  # never evaluated at run time; typing_extensions has Unpack on 3.10 too
    from typing_extensions import Unpack

    from ..adapters.feed import Feed
    from .kwargs import LoaderKwargs  # generated: imported for type checkers only


def _boxed(batch: Any) -> list[Any] | None:
    """``[batch]``, or None at the end of the epoch."""
    return None if batch is None else [batch]


class Loader(Addressing, Starting, Views):
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
        self.start_method = run.start_method
        resolved = wiring.resolve(opts)  # every value resolved, once
        self._settled = resolved.settled  # what only the loader reads (augment, max_errors)
        #: how the batches are made, resolved once: the pool and the nodes receive this object
        self.run: RunSpec = resolved.run
        #: what the loader is made of, built once: the workers and nodes receive this object
        self.recipe: Recipe = resolved.recipe
        self._pipeline: Pipeline | None = None  # this process's live pipeline (``pipeline``)
        self._peeker: Assembler | None = None  # fills peek()'s batches in this process
        self._rank_pending, self._rank_used = resolved.rank_pending, False
        #: the position was restored by load_state_dict and no batch was taken since
        self.resumed = False
        #: what a resume that changed the world size or batch size did ("" if none did)
        self.resume_note = ""
        self._skips = opts.order.skip or {}
        if opts.order.exclude:  # from the first epoch
            plan = dataclasses.replace(
                self.recipe.plan, exclude=((0, self._local(opts.order.exclude)),)
            )
            self.recipe = dataclasses.replace(self.recipe, plan=plan)
        self._batches = self.plan.batches()
        self.epoch, self.position = 0, 0
        self._ahead = 0  # batches an adapter took ahead of the training step (not yet received)
        self._stats = Stats()
        self._shuffle_note: tuple[tuple[int, str], list[str]] = ((-1, ""), [])
        self._run = Running()
        self._guard = Guard()
        self._finalizer = weakref.finalize(self, Running.close, self._run)
        warn_if_slow_decoder()
        self._launch_ahead()

    # ------------------------------------------------------------------ iteration

    def __len__(self) -> int:
        """Batches per epoch (for this rank). With no ``rank=`` given, read when called: made
        before the process group, a loader counts the group's split once the group exists."""
        self._ranked()
        return self._length(self.epoch)

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
    def workers(self) -> int:
        """Worker processes (0: batches are made in the calling process); ``"auto"`` is
        settled at the first batch (``run.workers_reason`` says why)."""
        return self.run.workers

    @property
    def source(self) -> Source:
        """The opened source (after ``validation_split``/``subset`` and ``class_names``)."""
        return self.recipe.source

    @property
    def pipeline(self) -> Pipeline:
        """The decode + transform pipeline every sample goes through: this process's live one,
        built from the Recipe's frozen spec (``recipe.pipeline``)."""
        if self._pipeline is None:
            self._pipeline = self.recipe.pipeline.build()
        return self._pipeline

    @property
    def image_size(self) -> tuple[int, int]:
        """Every batch's ``(height, width)`` (``image_size=``, resolved against the source)."""
        return self.recipe.pipeline.size

    @property
    def augment(self) -> Any:
        """``augment=``, with "auto" settled against the source."""
        return self._settled.augment

    @property
    def has_masks(self) -> bool:
        """Whether batches carry segmentation masks."""
        return bool(self.source.has_masks)

    @property
    def drop_last(self) -> bool:
        """Whether the ragged last batch is dropped (``drop_last=``, resolved)."""
        return self.recipe.plan.drop_last

    @property
    def max_errors(self) -> int:
        """The bad-sample budget as a count (``max_errors=``, resolved against the size)."""
        return self._settled.max_errors

    @property
    def subset(self) -> str | None:
        """``subset=``: "training", "validation" or None."""
        return self.options.source.subset

    @property
    def plan(self) -> Plan:
        """Which samples batch k of epoch e holds, for this rank."""
        self._ranked()
        return self.recipe.plan

    @property
    def schema(self) -> BatchSchema:
        """What a batch is: its slot layout, columns and form."""
        return self.recipe.schema

    @property
    def reads(self) -> ReadSettings | None:
        """The read-ahead settings (``read_ahead``, ``page_cache``)."""
        return self.recipe.read_settings

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

    # A batch is a ``schema.Batch`` in the form ``batch=`` picks at run time; the Loader's
    # methods give it as Any, so that a user's ``images, labels = batch`` type-checks.
    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch (all of it, unless resumed or broken off mid-way)."""
        return self._epoch_batches()

    def stream(self) -> Iterator[Any]:
        """Batches without end, epoch after epoch."""
        while True:
            yield from self._epoch_batches()

    def _epoch_batches(self) -> Iterator[Any]:
        self._guard.check_process()
        self._ranked()
        if self._rank_pending:  # batches are handed out as rank 0 of 1 from here
            self._rank_used = True
        self.resumed = False
        if self.position >= self._length(self.epoch):
            self.epoch, self.position = self.epoch + 1, 0
        epoch = self.epoch
        # iter(callable, None) keeps no reference to a batch while the consumer has it; the
        # batch travels in a one-item list (a bare array batch cannot be compared with None)
        for box in iter(lambda: _boxed(self._take(epoch)), None):
            yield box.pop()
        if self.epoch == epoch and self.position >= self._length(epoch):
            self.epoch, self.position = epoch + 1, 0
            self._stats.pause()  # the epoch's loop is over: validation etc. is not counted

    def _take(self, epoch: int) -> Any | None:
        """The next batch of ``epoch`` (None at its end); position moves under the guard."""
        with self._guard.taking():
            if self.position >= self._length(epoch) or self.epoch != epoch:
                return None
            out = self._next((epoch, self._batch_of(epoch, self.position)))
            self.position += 1
            return out

    def _next(self, key: tuple[int, int]) -> Any:
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

    def _arrange(self, fields: Fields, count: int) -> Any:
        """A filled batch as the user gets it: cut to its ``count`` samples, ``path`` added,
        arranged in the ``batch=`` structure."""
        if count < self.batch_size:
            fields = {name: arr[:count] for name, arr in fields.items()}
        return self.schema.arrange(fields, self.source.origin().name)

    def peek(self, batch: int | None = None) -> Any:
        """A batch exactly as iteration gives it (augmented, ``batch_transform`` applied, the
        same structure), without taking it: the position, ``state_dict()`` and the batches
        iteration gives are unchanged. ``peek()`` is the batch the next iteration starts with;
        ``peek(k)`` is batch ``k`` of that epoch. Loaded in this process (the workers, running
        or not, are not asked), so it costs one batch's decode here; for a plot or a check."""
        self._guard.check_process()
        if self._finalizer.alive is False:
            raise StokerError("this Loader is closed; create a new one")
        self._ranked()
        epoch, position = self._received()
        if batch is not None:
            if (
                isinstance(batch, bool)
                or not isinstance(batch, int | np.integer)
                or not (0 <= batch < self._length(epoch))
            ):
                raise ConfigError(
                    f"peek({batch!r}): give a batch number in [0, {self._length(epoch)}) "
                    "(len(loader)"
                    "), or nothing for the batch the next iteration starts with"
                )
            position = int(batch)
        position = self._batch_of(epoch, position)
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
            warn(
                f"stoker skipped {name} ({reason}); a good sample took its place "
                f"({before + k} of max_errors={self.max_errors} used)"
            )
        if len(self._stats.bad) > self.max_errors:
            listed = "\n".join(f"  {n}: {r}" for n, r in list(self._stats.bad.values())[:20])
            raise TooManyErrors(
                f"{len(self._stats.bad)} samples failed to load, more than max_errors="
                f"{self.max_errors}:\n{listed}\nfix or remove these files, or raise max_errors"
            )

    # ------------------------------------------------------------------ state

    def _received(self) -> tuple[int, int]:
        """``(epoch, position)`` of the next batch the training step has not received yet:
        batches an adapter holds ahead (a device copy in flight) do not count."""
        epoch, position = self.epoch, self.position - self._ahead
        while position < 0:  # batches held ahead across an epoch's end
            epoch -= 1
            position += self._length(epoch)
        if position >= self._length(epoch):
            return epoch + 1, position - self._length(epoch)
        return epoch, position

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
        self._replan(dataclasses.replace(self.recipe.plan, resume=None))
        self.epoch, self.position, self._ahead = int(epoch), 0, 0

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as JSON-able data; ``load_state_dict`` resumes exactly there.

        The position is global (docs/resume.md): ``position`` counts the global steps of the
        epoch the training step received and ``samples`` the global samples they consumed, the
        same on every rank, so any rank's state resumes every rank, on any number of ranks. A
        batch an adapter has taken ahead (``torch(device="cuda")``, ``jax()``) is left out, so
        a state taken after ``k`` batches resumes at batch ``k``."""
        self._ranked()
        return self._state_at(*self._received())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``, saved on any rank; refuses a state of another
        dataset, seed, shuffle or rank_split. ``batch_size`` and the world size may differ:
        with the same global batch (``batch_size x world_size``) every later batch is the one
        the uninterrupted run gave; with another, the rest of the epoch is the samples not yet
        consumed, each once, in the same order (with a warning saying what changed; see
        docs/resume.md). An empty state (``{}``) starts fresh at epoch 0, as torchdata's
        ``StatefulDataLoader`` treats one."""
        if not state:
            self._replan(dataclasses.replace(self.recipe.plan, resume=None))
            self.epoch, self.position, self._ahead = 0, 0, 0
            return
        older = older_fingerprints(self.source)
        saved = check_state(state, self.state_dict(), older)
        self._adopt(state)  # a restart keeps skipping and excluding
        plan, self.epoch, batch, self.resume_note = steps.resume(self.plan, saved)
        self._replan(plan)
        self.position = self._position_of(self.epoch, batch)
        self._ahead, self.resumed = 0, True

    def _replan(self, plan: Plan) -> None:
        """Make batches from ``plan`` from now on: workers started with another plan are
        stopped (the next batch starts them with this one)."""
        if plan != self.recipe.plan:
            self._run.close(fast=True)
            self.recipe = dataclasses.replace(self.recipe, plan=plan)
            self._peeker = None

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

"""Loader: iteration, peek, position, stats, close; what it is made of is its ``recipe`` and
``run``.

The run side (the Recipe and RunSpec, what is started from them, the report) is one object,
``starting.Supply``, that the Loader holds and asks; the framework views are ``views.Views``,
a mixin that sees the loader only as an adapter's ``Feed``."""

from __future__ import annotations

import dataclasses
import textwrap
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..assemble import Report
from ..errors import ConfigError, StokerError, TooManyErrors, warn
from ..order import Plan
from ..recipe import Recipe
from ..schema import Fields
from ..seeding import user_states_kept
from ..sources.base import Source, older_fingerprints
from ..stats import Stats, StatsReport
from ..workers.runspec import RunSpec
from . import config, optiondocs, steps, wiring
from .address import Addresses, Skips
from .consumer import Guard
from .options import Options
from .running import Running, warn_if_slow_decoder
from .starting import Supply
from .state import check_state
from .views import Views

if TYPE_CHECKING:  # never evaluated at run time; typing_extensions has Unpack on 3.10 too
    from typing_extensions import Unpack

    from ..adapters.dataloader import Sampled
    from ..adapters.feed import Feed, Ring
    from .kwargs import LoaderKwargs  # generated: imported for type checkers only

# A batch is a ``schema.Batch`` in the form ``batch=`` picks at run time; the Loader's methods
# give it as Any, so that a user's ``images, labels = batch`` type-checks.
Batch = Any


def _boxed(batch: Any) -> list[Any] | None:
    """``[batch]``, or None at the end of the epoch."""
    return None if batch is None else [batch]


def _deprecated(old: str, new: str) -> None:
    """Warn that ``Loader.<old>`` goes in stoker 0.3, naming what to use instead."""
    warnings.warn(
        f"Loader.{old} is deprecated and will be removed in stoker 0.3: use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


class Loader(Views):
    """Shuffled, augmented, fixed-shape batches, decoded in parallel and prefetched.

    Iterating gives ``(images, labels)``: ``uint8`` ``(B, H, W, 3)`` images and the labels as
    the source holds them: ``int64`` ``(B,)`` class ids, or numeric targets of any dtype and
    shape ``(B, ...)`` kept bit for bit. A segmentation source (``masks=``, or a CSV with an
    ``image,mask`` header) gives ``(images, masks)``, masks ``uint8`` ``(B, H, W)`` with the
    image's crop and flip. ``batch="dict"`` (or a tuple/dict of field names) gives structured
    batches. Every argument is validated before anything is opened or started, with a message
    saying the fix; ``subset="both"`` returns a ``(training, validation)`` pair of loaders.

    Its public names are few, each listed with its reason in ``docs/api.md``: what the loader
    is made of lives in ``recipe`` (source, pipeline, plan, batch schema) and ``run`` (workers,
    prefetch, timeout, cluster), not on the loader itself.
    """

    def __init__(self, source: Any = None, **kwargs: Unpack[LoaderKwargs]) -> None:
        # every argument is checked first, before a source is opened or anything is started;
        # the signature help() and IPython show is generated from the groups (``_document``),
        # and type checkers and editors read the names and types from ``LoaderKwargs``
        #: the arguments, checked and grouped (``Loader(**loader.options.kwargs())`` is a copy)
        self.options: Options = Options.from_kwargs(source=source, **kwargs)
        resolved = wiring.resolve(self.options)  # every value resolved, once
        self._settled = resolved.settled  # what only the loader reads (augment, max_errors)
        self._supply = Supply(resolved.recipe, resolved.run, resolved.rank_pending)
        self._steps = Addresses(self._supply, self.options.order.skip or {})
        if self.options.order.exclude:  # from the first epoch
            plan = self._supply.recipe.plan
            local = self._steps.local(self.options.order.exclude)
            self._supply.replan(dataclasses.replace(plan, exclude=((0, local),)))
        #: the epoch the next batch belongs to, and its batch number in that epoch
        self.epoch, self.position = 0, 0
        self._resumed = False  # the position was restored and no batch was taken since
        #: what the last resume changed (the world size or batch size), "" if it changed none
        self.resume_note = ""
        self._ahead = 0  # batches an adapter took ahead of the training step (not yet received)
        self._stats = Stats()
        self._guard = Guard()
        self._finalizer = weakref.finalize(self, Running.close, self._supply.running)
        warn_if_slow_decoder()
        self._supply.launch_ahead()

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

    # ------------------------------------------------------------------ what it is made of

    @property
    def recipe(self) -> Recipe:
        """What the batches are made of, built once and frozen: ``source``, ``pipeline``,
        ``plan`` (which samples batch k of epoch e holds, for this rank), ``schema`` (slot
        layout, columns, form), ``read_settings``; the workers and nodes receive this object."""
        self._supply.ranked()
        return self._supply.recipe

    @property
    def run(self) -> RunSpec:
        """How the batches are made: ``workers`` (and ``workers_reason``), ``prefetch``,
        ``timeout``, ``worker_threads``, ``cluster``; the pool and the nodes receive it whole.
        ``workers="auto"`` is settled at the first batch."""
        return self._supply.run

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last of an epoch holds fewer unless ``drop_last``)."""
        return self._supply.recipe.plan.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether the ragged last batch of an epoch is dropped (a DataLoader's attribute)."""
        return self._supply.recipe.plan.drop_last

    @property
    def class_names(self) -> list[str] | None:
        """Class names (Keras' ``class_names``): class id ``k`` is ``class_names[k]``."""
        return self._supply.recipe.source.classes

    @property
    def file_paths(self) -> list[str]:
        """Every sample's file path (or ``array[i]``), in the source's order (Keras'
        ``file_paths``); batches carry theirs with ``batch=`` field ``path``."""
        source = self._supply.recipe.source
        return [source.name(i) for i in range(len(source))]

    @property
    def source_indices(self) -> np.ndarray:
        """Each sample's index in the source you passed (before ``validation_split``/``subset``
        and ``class_names``), in the order of ``file_paths``: the numbering of the batches'
        ``index`` field and of ``sample_weight=``/``fields=`` rows."""
        source = self._supply.recipe.source
        return source.source_indices(np.arange(len(source)))

    # ------------------------------------------------------------------ deprecated (0.3)

    @property
    def source(self) -> Source:
        """Deprecated: ``loader.recipe.source`` (the opened source); removed in 0.3."""
        _deprecated("source", "loader.recipe.source")
        return self._supply.recipe.source

    @property
    def plan(self) -> Plan:
        """Deprecated: ``loader.recipe.plan`` (which samples batch k of epoch e holds);
        removed in 0.3."""
        _deprecated("plan", "loader.recipe.plan")
        return self.recipe.plan

    @property
    def classes(self) -> list[str] | None:
        """Deprecated: ``loader.class_names`` (the same list); removed in 0.3."""
        _deprecated("classes", "loader.class_names")
        return self.class_names

    @property
    def augment(self) -> Any:
        """Deprecated: ``loader.options.image.augment`` (as given; ``repr(loader)`` shows it
        resolved); removed in 0.3."""
        _deprecated("augment", "loader.options.image.augment (repr(loader) shows it resolved)")
        return self._settled.augment

    @property
    def layout(self) -> Any:
        """Deprecated: ``loader.recipe.schema.slot_layout`` (the fields of one batch in shared
        memory; ``layout=`` of an adapter is the channel order); removed in 0.3."""
        _deprecated("layout", "loader.recipe.schema.slot_layout (the batch's fields)")
        return self._supply.recipe.schema.slot_layout

    # ------------------------------------------------------------------ iteration

    def __len__(self) -> int:
        """Batches per epoch (for this rank). With no ``rank=`` given, read when called: made
        before the process group, a loader counts the group's split once the group exists."""
        self._supply.ranked()
        return self._length(self.epoch)

    def _length(self, epoch: int) -> int:
        """Batches of ``epoch`` this rank hands out (a resumed epoch's rest, skips left out)."""
        return self._steps.length(epoch)

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch (all of it, unless resumed or broken off mid-way)."""
        return self._epoch_batches()

    def stream(self) -> Iterator[Batch]:
        """Batches without end, epoch after epoch."""
        while True:
            yield from self._epoch_batches()

    def _epoch_batches(self) -> Iterator[Batch]:
        self._guard.check_process()
        self._supply.ranked()
        self._supply.hand_out()
        self._resumed = False
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

    def _take(self, epoch: int) -> Batch | None:
        """The next batch of ``epoch`` (None at its end); position moves under the guard."""
        with self._guard.taking():
            if self.position >= self._length(epoch) or self.epoch != epoch:
                return None
            out = self._next((epoch, self._steps.batch_of(epoch, self.position)))
            self.position += 1
            return out

    def _next(self, key: tuple[int, int]) -> Batch:
        t0 = self._stats.begin_wait()  # the first wait includes the workers' start-up
        try:
            self._guard.check_process()
            fields, report = self._supply.engine(self._closed()).get(key)
            self._account(report)
        except BaseException as exc:
            if isinstance(exc, TooManyErrors):  # a batch where no sample loads: count them
                self._stats.add(Report(bad=getattr(exc, "bad", [])))
            self._supply.running.close(fast=True)  # the error is not delayed by the workers
            raise
        self._stats.end_wait(t0, report.count)
        return self._arrange(fields, report.count)

    def _closed(self) -> bool:
        return self._finalizer.alive is False

    def _arrange(self, fields: Fields, count: int) -> Batch:
        """A filled batch as the user gets it: cut to its ``count`` samples, ``path`` added,
        arranged in the ``batch=`` structure."""
        if count < self.batch_size:
            fields = {name: arr[:count] for name, arr in fields.items()}
        recipe = self._supply.recipe
        return recipe.schema.arrange(fields, recipe.source.origin().name)

    def peek(self, batch: int | None = None) -> Batch:
        """A batch exactly as iteration gives it (augmented, ``batch_transform`` applied, the
        same structure), without taking it: the position, ``state_dict()`` and the batches
        iteration gives are unchanged. ``peek()`` is the batch the next iteration starts with;
        ``peek(k)`` is batch ``k`` of that epoch. Loaded in this process (the workers, running
        or not, are not asked), so it costs one batch's decode here; for a plot or a check."""
        self._guard.check_process()
        if self._closed():
            raise StokerError("this Loader is closed; create a new one")
        self._supply.ranked()
        epoch, position = self._received()
        batches = self._length(epoch)
        if batch is not None:
            if (
                isinstance(batch, bool)
                or not isinstance(batch, int | np.integer)
                or not (0 <= batch < batches)
            ):
                raise ConfigError(
                    f"peek({batch!r}): give a batch number in [0, {batches}) (len(loader)"
                    "), or nothing for the batch the next iteration starts with"
                )
            position = int(batch)
        position = self._steps.batch_of(epoch, position)
        fields = self._supply.recipe.schema.slot_layout.arrays()
        peeker = self._supply.peeker()
        with user_states_kept():  # the user's own random draws are not moved by a look
            report = peeker.fill(epoch, position, fields)
        return self._arrange(fields, report.count)

    def _account(self, report: Report) -> None:
        """Fold a batch's report into the stats; warn about new bad files; enforce the budget."""
        new = self._stats.add(report)
        before, budget = len(self._stats.bad) - len(new), self._settled.max_errors
        # only the samples within the budget are warned about: past it, the error below names
        # them all (max_errors=0 raises at the first bad sample, with no warning before)
        for k, (_, name, reason) in enumerate(new[: max(0, budget - before)], start=1):
            warn(
                f"stoker skipped {name} ({reason}); a good sample took its place "
                f"({before + k} of max_errors={budget} used)"
            )
        if len(self._stats.bad) > budget:
            listed = "\n".join(f"  {n}: {r}" for n, r in list(self._stats.bad.values())[:20])
            raise TooManyErrors(
                f"{len(self._stats.bad)} samples failed to load, more than max_errors="
                f"{budget}:\n{listed}\nfix or remove these files, or raise max_errors"
            )

    def stats(self) -> StatsReport:
        """Throughput, time the consumer waited for data and its share, stage times, bad files."""
        return self._supply.report(self._stats, self.epoch, self.resume_note)

    # ------------------------------------------------------------------ for adapters (Feed)

    def _device_stats(self) -> Stats:
        """For device adapters: the counters, to add the device's own wait and say how
        batches reach it."""
        return self._stats

    def _ring(self) -> Ring | None:
        """For device adapters: the running prefetch ring (``hold_until``,
        ``watch_segments``), or None with ``workers=0`` or before the first batch."""
        return self._supply.ring()

    def _hold_ahead(self, batches: int) -> None:
        """For adapters: ``batches`` more batches were taken ahead of the training step (a
        negative count: that many were handed over). ``state_dict`` leaves them out."""
        self._ahead += batches

    def _give_back_ahead(self) -> None:
        """For adapters: the consumer stopped while batches were held ahead; the next
        iteration starts with the first of them, so none is skipped."""
        if self._ahead:
            self.epoch, self.position = self._received()
            self._ahead = 0

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

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration (as
        ``DistributedSampler.set_epoch``); the epoch number seeds the order and augmentation."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): give an epoch number >= 0")
        self._supply.replan(dataclasses.replace(self._supply.recipe.plan, resume=None))
        self.epoch, self.position, self._ahead = int(epoch), 0, 0

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as JSON-able data; ``load_state_dict`` resumes exactly there.

        The position is global (docs/resume.md): ``position`` counts the global steps of the
        epoch the training step received and ``samples`` the global samples they consumed, the
        same on every rank, so any rank's state resumes every rank, on any number of ranks. A
        batch an adapter has taken ahead (``torch(device="cuda")``, ``jax()``) is left out, so
        a state taken after ``k`` batches resumes at batch ``k``."""
        self._supply.ranked()
        return self._steps.state_at(*self._received())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``, saved on any rank; refuses a state of another
        dataset, seed, shuffle or rank_split. ``batch_size`` and the world size may differ:
        with the same global batch (``batch_size x world_size``) every later batch is the one
        the uninterrupted run gave; with another, the rest of the epoch is the samples not yet
        consumed, each once, in the same order (with a warning saying what changed; see
        docs/resume.md). An empty state (``{}``) starts fresh at epoch 0, as torchdata's
        ``StatefulDataLoader`` treats one."""
        if not state:
            self._supply.replan(dataclasses.replace(self._supply.recipe.plan, resume=None))
            self.epoch, self.position, self._ahead = 0, 0, 0
            return
        older = older_fingerprints(self._supply.recipe.source)
        saved = check_state(state, self.state_dict(), older)
        self._steps.adopt(state)  # a restart keeps skipping and excluding
        plan, self.epoch, batch, self.resume_note = steps.resume(self.recipe.plan, saved)
        self._supply.replan(plan)
        self.position = self._steps.position_of(self.epoch, batch)
        self._ahead, self._resumed = 0, True

    def advance_state(self, state: dict[str, Any], batches: int) -> dict[str, Any]:
        """The state ``batches`` batches after ``state`` (one of this loader's states;
        skipped steps are passed over, epochs roll over at their length)."""
        return self._steps.advance_state(state, batches)

    # ------------------------------------------------------------------ addressed steps

    def skip(self, epoch: int, steps: Any) -> None:
        """Leave the global steps ``steps`` of ``epoch`` out (a ``(start, stop)`` pair, stop
        excluded, a ``range`` or one step number): iteration passes over them, every other
        batch stays byte-identical, and ``state_dict()`` keeps the skip so a restart keeps
        skipping. ``batch_at`` and ``samples_at`` still address a skipped step."""
        self._steps.skip(epoch, steps)

    def exclude(self, samples: Iterable[int | str]) -> None:
        """Leave ``samples`` out from now on: source indices (as the batches' ``index`` field
        numbers them) or paths (as ``file_paths`` names them). They leave the current epoch
        if none of its batches was received yet, else from the next epoch on (the epoch under
        way keeps its order, so what it already gave stays exact). The other samples keep
        their order relative to each other: an epoch's order is the same permutation of all
        samples with the excluded ones taken out, so later steps shift up to fill their
        places. Kept in ``state_dict()``; workers running restart at the next batch."""
        self._supply.ranked()
        self._steps.exclude(samples, self._received())

    @property
    def excluded(self) -> dict[int, list[int]]:
        """``{first epoch: source indices}`` of the samples left out (see ``exclude``)."""
        return self._steps.excluded

    @property
    def skipped(self) -> Skips:
        """The global steps left out, ``{epoch: [(start, stop), ...]}`` (see ``skip``)."""
        return self._steps.skipped

    def samples_at(self, epoch: int, step: int, rank: int | None = None) -> dict[str, list[Any]]:
        """The samples of global step ``step`` of ``epoch``: for ``rank``, or for the whole
        global batch (every rank's part, in global order) with ``rank=None``; as lists,
        JSON-able: ``index`` (numbered as the source you passed), ``path``, ``rank`` and
        ``position`` (in the epoch's global order). Nothing is decoded and no file opened. A
        bad file's replacement is found only when it is loaded (``batch_at`` has it)."""
        return self._steps.samples_at(epoch, step, rank)

    def batch_at(self, epoch: int, step: int, rank: int | None = None) -> Batch:
        """Global step ``step`` of ``epoch`` rebuilt: the batch this rank (or ``rank``)
        received there, byte-identical (augmentation, bad-file replacement and
        ``batch_transform`` included), in the batch structure iteration gives. It costs one
        batch's decode in this process, whatever the step: nothing before it is replayed; the
        position and the workers are untouched."""
        return self._arrange(*self._steps.fields_at(epoch, step, rank))

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the workers and free all shared memory; idempotent."""
        self._finalizer()
        self._supply.recipe.close()

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
            f"Loader({len(self._supply.recipe.source)} samples, batch_size={self.batch_size}, "
            f"image_size={self._supply.recipe.pipeline.size}, augment={self._settled.augment!r}, "
            f"workers={self.run.workers})"
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

    def _is_sampled(loader: Loader) -> Sampled:
        """... and its DataLoader parts all they read (``adapters.dataloader``)."""
        return loader

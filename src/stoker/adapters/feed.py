"""What an adapter may use of a Loader: the ``Feed`` protocol, and the ``Ring`` a device
adapter copies straight out of. Adapters are typed against these, never against ``Loader`` or
the workers' engine, so the loader's insides can change without an adapter noticing, and mypy
checks that every adapter asks only for what is listed here (``Loader`` satisfies ``Feed``:
``loader/core.py`` proves it to mypy).

When the program runs this imports only numpy and ``schema`` (what a batch is); the DataLoader
parts (``dataloader``) and the stats types named below are imported for the type checker alone
(adapters import nothing from ``loader/`` or ``workers/``: ``tests/test_imports.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np

from ..schema import Batch, FieldSpec, Form

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from ..stats import Stats, WaitMeter
    from .dataloader import EpochBatches, EpochSampler, Samples

__all__ = [
    "Batch",
    "BatchSchemaView",
    "Feed",
    "Fence",
    "FieldList",
    "RecipeView",
    "Ring",
    "RingSegment",
    "RunView",
    "SampleSource",
    "State",
]

#: A JSON value (what a loader's state is made of).
JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"

#: A loader's position, JSON-able: ``state_dict()`` gives it, ``load_state_dict()`` takes it.
State: TypeAlias = "dict[str, JSON]"


class FieldList(Protocol):
    """The fields one batch has (``loader.recipe.schema.slot_layout``)."""

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        ...

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        """Every field, in slot order."""
        ...

    def field(self, name: str) -> FieldSpec | None:
        """The field called ``name``, or None."""
        ...


class SampleSource(Protocol):
    """What an adapter reads of the loader's source: whether it is a per-sample dataset."""

    @property
    def sample_fields(self) -> tuple[FieldSpec, ...] | None:
        """A per-sample dataset's own fields (``Loader(dataset)``), else None."""
        ...


class Fence(Protocol):
    """Something that completes (a device copy's event): a slot is reused only after it."""

    def synchronize(self) -> None:
        """Block until it has completed."""
        ...


class RingSegment(Protocol):
    """One shared-memory segment of the ring (the memory of one or more batch slots)."""

    @property
    def path(self) -> str:
        """Its name in the memory folder (unique while it lives)."""
        ...

    @property
    def size(self) -> int:
        """Bytes."""
        ...

    @property
    def map(self) -> Buffer:
        """Its mapping in this process."""
        ...


class Ring(Protocol):
    """The shared-memory ring the loader's batches are views of (with ``workers`` > 0), as a
    device adapter sees it: it may DMA straight out of a slot while a fence holds the slot."""

    def hold_until(self, array: np.ndarray, fence: Fence) -> bool:
        """Keep the slot ``array`` (a handed-out view) lies in from reuse until ``fence``
        has completed; False when ``array`` is no held slot's."""
        ...

    def watch_segments(
        self, added: Callable[[RingSegment], None], removed: Callable[[RingSegment], None]
    ) -> None:
        """Call ``added`` for every segment now and later, ``removed`` before one goes."""
        ...


class BatchSchemaView(Protocol):
    """What an adapter reads of the loader's batch schema (``loader.recipe.schema``): ``form``,
    how a batch's fields are arranged (``batch=``), and ``slot_layout``, its fields."""

    @property
    def form(self) -> Form: ...
    @property
    def slot_layout(self) -> FieldList: ...


class RecipeView(Protocol):
    """What an adapter reads of what the batches are made of (``loader.recipe``): the batch
    ``schema``, and the ``source`` (only whether it is a per-sample dataset)."""

    @property
    def schema(self) -> BatchSchemaView: ...
    @property
    def source(self) -> SampleSource: ...


class RunView(Protocol):
    """What an adapter reads of how the batches are made (``loader.run``): ``workers``, the
    worker processes (0: batches are made in the calling process)."""

    @property
    def workers(self) -> int: ...


class Feed(Protocol):
    """Everything an adapter uses of a Loader (``stoker.Loader`` is one): its public names,
    and a private seam of five (``_hold_ahead``, ``_give_back_ahead``,
    ``_ring``, ``_device_stats``, ``_dataset_of``) that only adapters call."""

    def __len__(self) -> int:
        """Batches per epoch."""
        ...

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch."""
        ...

    def stream(self) -> Iterator[Batch]:
        """Batches without end, epoch after epoch."""
        ...

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last of an epoch may hold fewer unless ``drop_last``)."""
        ...

    @property
    def drop_last(self) -> bool:
        """Whether the ragged last batch of an epoch is dropped."""
        ...

    @property
    def recipe(self) -> RecipeView:
        """What the batches are made of (adapters read the schema and the source)."""
        ...

    @property
    def run(self) -> RunView:
        """How the batches are made (adapters read the worker count)."""
        ...

    @property
    def dataset(self) -> Samples:
        """The samples drawn from, as a DataLoader's ``dataset``."""
        ...

    @property
    def sampler(self) -> EpochSampler:
        """A DistributedSampler's habits; ``len()`` = samples this rank visits per epoch."""
        ...

    @property
    def batch_sampler(self) -> EpochBatches:
        """The epoch's batches as a DataLoader's batch sampler yields them."""
        ...

    @property
    def collate_fn(self) -> Callable[[object], object]:
        """What a DataLoader rebuilt from the parts applies to a fetched batch."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch at the next iteration."""
        ...

    def state_dict(self) -> State:
        """The position (batches the training step received)."""
        ...

    def load_state_dict(self, state: State) -> None:
        """Resume from ``state_dict()``."""
        ...

    def advance_state(self, state: State, batches: int) -> State:
        """The state ``batches`` batches after ``state``."""
        ...

    def wait_meter(self, every: int = ...) -> WaitMeter:
        """The wait report every ``every`` training steps."""
        ...

    # the adapters' seam: private on the Loader, typed here

    def _dataset_of(self, view: Iterable[object]) -> Samples:
        """``dataset``, whose ``__getitems__`` hands out ``view``'s batches."""
        ...

    def _hold_ahead(self, batches: int) -> None:
        """``batches`` more were taken ahead of the training step (negative: handed over)."""
        ...

    def _give_back_ahead(self) -> None:
        """The consumer stopped with batches held ahead: the next iteration starts there."""
        ...

    def _device_stats(self) -> Stats:
        """The counters an adapter adds the device's wait and its transfer path to."""
        ...

    def _ring(self) -> Ring | None:
        """The ring batches are views of, or None (``workers=0``, or before the first batch)."""
        ...

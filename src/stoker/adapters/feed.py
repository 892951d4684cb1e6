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
    "Feed",
    "Fence",
    "FieldList",
    "Ring",
    "RingSegment",
    "SampleSource",
    "State",
]

#: A JSON value (what a loader's state is made of).
JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"

#: A loader's position, JSON-able: ``state_dict()`` gives it, ``load_state_dict()`` takes it.
State: TypeAlias = "dict[str, JSON]"


class FieldList(Protocol):
    """The fields one batch has (the loader's ``slot_layout``)."""

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


class Feed(Protocol):
    """Everything an adapter uses of a Loader (``stoker.Loader`` is one)."""

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
    def workers(self) -> int:
        """Worker processes (0: batches are made in the calling process)."""
        ...

    @property
    def drop_last(self) -> bool:
        """Whether the ragged last batch of an epoch is dropped."""
        ...

    @property
    def form(self) -> Form:
        """How a batch's fields are arranged (``batch=``): a field name, tuple or dict."""
        ...

    @property
    def slot_layout(self) -> FieldList:
        """The fields of one batch, their dtypes and shapes."""
        ...

    @property
    def source(self) -> SampleSource:
        """The samples' source (adapters ask only whether it is a per-sample dataset)."""
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

    def dataset_of(self, view: Iterable[object]) -> Samples:
        """``dataset``, whose ``__getitems__`` hands out ``view``'s batches."""
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

    def hold_ahead(self, batches: int) -> None:
        """``batches`` more were taken ahead of the training step (negative: handed over)."""
        ...

    def give_back_ahead(self) -> None:
        """The consumer stopped with batches held ahead: the next iteration starts there."""
        ...

    def device_stats(self) -> Stats:
        """The counters an adapter adds the device's wait and its transfer path to."""
        ...

    def wait_meter(self, every: int = ...) -> WaitMeter:
        """The wait report every ``every`` training steps."""
        ...

    def ring(self) -> Ring | None:
        """The ring batches are views of, or None (``workers=0``, or before the first batch)."""
        ...

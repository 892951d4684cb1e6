"""What every framework view of a Loader shares: its length, its resumable state, its epoch
setter, and the one-batch look-ahead that device adapters use."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .feed import Batch, Feed, State

if TYPE_CHECKING:
    from .dataloader import EpochBatches, EpochSampler, Samples

Issued = TypeVar("Issued")
Out = TypeVar("Out")


class LoaderView:
    """A framework's view of a Loader: ``len``, ``set_epoch``, the ``state_dict`` protocol and
    the DataLoader attributes training loops and frameworks read (``dataset``, ``sampler``,
    ``batch_sampler``, ``batch_size``, ``drop_last``, ``collate_fn``, ``num_workers``).

    A DataLoader rebuilt from these parts (``accelerate.skip_first_batches(view, n)`` does
    that) gives exactly this view's batches from batch ``n`` of the epoch, made by the loader's
    workers (see ``adapters.dataloader``)."""

    loader: Feed
    #: Torch DataLoader worker processes this view starts: none (the loader's own processes are
    #: ``view.loader.run.workers``), so a DataLoader rebuilt from the view's parts runs in this
    #: process and takes its batches from the loader.
    num_workers = 0
    #: Batches each DataLoader worker loads ahead: None, as a DataLoader without workers has.
    prefetch_factor = None

    def __len__(self) -> int:
        """Batches per epoch: ``len(loader)``."""
        return len(self.loader)

    def __iter__(self) -> Iterator[object]:
        """The rest of the loader's current epoch, as the framework's batches."""
        raise NotImplementedError

    @property
    def dataset(self) -> Samples:
        """The samples drawn from (``len(view.dataset)``); see ``Loader.dataset``. A DataLoader
        rebuilt from the view's parts fetches this view's batches from it."""
        return self.loader._dataset_of(self)

    @property
    def batch_sampler(self) -> EpochBatches:
        """The epoch's batches as sample index lists; see ``Loader.batch_sampler``."""
        return self.loader.batch_sampler

    @property
    def collate_fn(self) -> Callable[[object], object]:
        """Passes a batch fetched from ``dataset`` through; see ``Loader.collate_fn``."""
        return self.loader.collate_fn

    @property
    def sampler(self) -> EpochSampler:
        """``view.sampler.set_epoch(epoch)``; see ``Loader.sampler``."""
        return self.loader.sampler

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last batch of an epoch may hold fewer)."""
        return int(self.loader.batch_size)

    @property
    def drop_last(self) -> bool:
        """Whether the ragged last batch of an epoch is dropped."""
        return bool(self.loader.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at the next iteration; see ``Loader.set_epoch``."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> State:
        """The loader's position (JSON-able); see ``Loader.state_dict``."""
        return self.loader.state_dict()

    def load_state_dict(self, state: State) -> None:
        """Resume the loader from ``state_dict()``; see ``Loader.load_state_dict``."""
        self.loader.load_state_dict(state)


def look_ahead(
    loader: Feed, issue: Callable[[Batch], Issued], hand_over: Callable[[Issued], Out]
) -> Iterator[Out]:
    """The rest of ``loader``'s epoch, one batch ahead: ``issue`` (start a device copy) runs on
    batch ``k + 1`` before batch ``k`` goes through ``hand_over`` to the training step.

    The loader is told which batch is held ahead, so its ``state_dict()`` counts only batches
    the step received; a consumer that stops early gives the held batch back (the next
    iteration starts with it, none is skipped).
    """
    batches = iter(loader)
    pending: list[Issued] = []
    try:
        for batch in batches:
            loader._hold_ahead(1)
            pending.append(issue(batch))
            del batch
            if len(pending) > 1:
                loader._hold_ahead(-1)
                yield hand_over(pending.pop(0))
        while pending:
            loader._hold_ahead(-1)
            yield hand_over(pending.pop(0))
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        loader._give_back_ahead()


def owned(leaf: np.ndarray) -> np.ndarray:
    """``leaf`` itself when it owns its memory or its memory can be handed over (an in-process
    batch's block, ``give()``: the loader then never reuses it), else a copy: memory a framework
    may keep after the loader reuses the slot the view points into."""
    if isinstance(leaf, np.ndarray) and not leaf.flags.owndata:
        give = getattr(leaf.base, "give", None)
        return leaf if give is not None and give() else np.array(leaf)
    return leaf


def owned_batch(batch: Batch) -> Batch:
    """``batch`` (an array, or a tuple/list/dict of them, nested) with every slot view copied."""
    if isinstance(batch, dict):
        return {k: owned_batch(v) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return tuple(owned_batch(v) for v in batch)
    return owned(batch)

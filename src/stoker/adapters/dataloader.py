"""The attributes of a ``torch.utils.data.DataLoader`` that training loops and frameworks read
off it, on a Loader and on its framework views: ``.dataset`` (``len(data_loader.dataset)`` in
torchvision's ``evaluate``), ``.sampler`` (``sampler.set_epoch(epoch)`` in timm's and
torchvision's loops), ``.batch_size``, ``.batch_sampler`` (Lightning's shuffle check,
Accelerate's ``skip_first_batches``) and ``.collate_fn``.

A DataLoader rebuilt from these parts (``DataLoader(view.dataset, batch_sampler=
view.batch_sampler, collate_fn=view.collate_fn)``, which is what ``accelerate.
skip_first_batches`` does) gives exactly the view's batches, made by the loader's own workers:
the batch sampler yields one ``BatchRef`` per batch of the epoch (its sample indices, and which
batch it is), ``dataset.__getitems__`` hands back that whole batch as the view gives it, and
``collate_fn`` passes it through."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Protocol

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..order import Plan


class SampledRecipe(Protocol):
    """What these parts read of what the loader's batches are made of (``loader.recipe``)."""

    @property
    def plan(self) -> Plan: ...
    @property
    def source(self) -> Sized: ...


class Sampled(Protocol):
    """What these parts read of the loader they describe (``stoker.Loader`` is one): its
    batches (``len``, iteration, ``batch_size``, ``drop_last``), order (``recipe.plan``: rank,
    shuffle, seed), samples (``recipe.source``, ``class_names``), and position: ``_received()``
    is the ``(epoch, position)`` of the next batch the training step has not received,
    ``_resumed`` whether that position is one ``load_state_dict`` restored (both private to
    the loader: only these parts read them)."""

    _resumed: bool

    @property
    def batch_size(self) -> int: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def recipe(self) -> SampledRecipe: ...
    @property
    def class_names(self) -> list[str] | None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[object]: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> Mapping[str, object]: ...
    def load_state_dict(self, state: dict[str, object]) -> None: ...
    def _received(self) -> tuple[int, int]: ...


class Samples:
    """``loader.dataset``: the samples the loader draws from (after ``class_names`` and
    ``validation_split``), for code that asks a DataLoader's dataset its length or classes.

    ``len()`` counts them over all ranks, as ``len(DataLoader.dataset)`` does: torchvision's
    ``evaluate`` compares it with the samples it saw, summed across processes (equal with
    ``drop_last=False``, and with ``rank_split="once"`` on several ranks)."""

    def __init__(self, loader: Sampled, owner: Iterable[object] | None = None) -> None:
        self._loader = loader
        self._owner = loader if owner is None else owner

    def __len__(self) -> int:
        return len(self._loader.recipe.source)

    def __getitems__(self, ref: object) -> list[object]:
        """The whole batch ``ref`` (a ``BatchRef`` from ``batch_sampler``) as the loader or view
        it came from gives it, in a one-item list that ``collate`` unwraps: what a DataLoader
        rebuilt from the view's parts fetches."""
        if not isinstance(ref, BatchRef):
            raise ConfigError(
                f"loader.dataset[{ref!r}]: stoker's dataset hands out whole batches, named by "
                "its batch_sampler; iterate the loader (or its view), or rebuild a DataLoader "
                "with batch_sampler=view.batch_sampler and collate_fn=view.collate_fn"
            )
        return [cursor(self._owner, self._loader).at(ref.key)]

    @property
    def classes(self) -> list[str] | None:
        """Class names (torchvision's ``ImageFolder.classes``), when the source has them."""
        return self._loader.class_names

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """Class name -> class id (torchvision's ``ImageFolder.class_to_idx``)."""
        classes = self._loader.class_names
        return None if classes is None else {name: k for k, name in enumerate(classes)}

    def __repr__(self) -> str:
        return f"<samples of {self._loader!r}: {len(self)}>"


class EpochSampler:
    """``loader.sampler``: the ``DistributedSampler`` habits a training loop has.

    ``set_epoch(e)`` moves the loader to epoch ``e`` (which seeds its order and augmentation),
    from its first batch, as a DataLoader starts every epoch; when ``e`` is already the loader's
    epoch and its position was restored by ``load_state_dict`` (no batch taken since), the
    position is kept, so a run resumed mid-epoch that calls ``set_epoch`` at each epoch's start
    loses no batch. An epoch broken off mid-way (Lightning's sanity check takes two validation
    batches) starts again from its first batch.
    ``len()`` is the samples this rank visits per epoch, as ``len(DistributedSampler)``."""

    def __init__(self, loader: Sampled) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` at the next iteration from its first batch, or where a resumed
        state left it (see the class)."""
        if epoch != self.epoch or not self._loader._resumed:
            self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return int(self._loader._received()[0])

    @property
    def num_replicas(self) -> int:
        """Ranks the epoch is split across (``world_size``)."""
        return int(self._loader.recipe.plan.world_size)

    @property
    def rank(self) -> int:
        """This loader's rank."""
        return int(self._loader.recipe.plan.rank)

    @property
    def shuffle(self) -> bool:
        """Whether each epoch is shuffled."""
        return bool(self._loader.recipe.plan.shuffle)

    @property
    def seed(self) -> int:
        """The seed of the order and augmentation."""
        return int(self._loader.recipe.plan.seed)

    def __len__(self) -> int:
        return int(self._loader.recipe.plan.per_rank())

    def __repr__(self) -> str:
        return f"<sampler of {self._loader!r}: epoch {self.epoch}, rank {self.rank}>"


class BatchRef(list):  # type: ignore[type-arg]
    """One batch as a batch sampler yields it: the sample indices it holds (a list, as a
    ``BatchSampler`` yields) and ``key``, its ``(epoch, batch)``."""

    def __init__(self, indices: Iterable[int], key: tuple[int, int]) -> None:
        super().__init__(indices)
        self.key = key


class EpochBatches:
    """``loader.batch_sampler``: the epoch's batches as a DataLoader's batch sampler gives them,
    from the first (a DataLoader always starts an epoch at its first batch; ``skip_first_batches``
    counts from there), as ``BatchRef`` lists of sample indices. ``len()`` = batches per epoch.

    The epoch is the one the next batch of the loader belongs to, read when iteration starts."""

    def __init__(self, loader: Sampled) -> None:
        self._loader = loader

    @property
    def sampler(self) -> EpochSampler:
        """The sample-level sampler (``batch_sampler.sampler``, as a ``BatchSampler`` has)."""
        return EpochSampler(self._loader)

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return int(self._loader.batch_size)

    @property
    def drop_last(self) -> bool:
        """Whether the ragged last batch of an epoch is dropped."""
        return bool(self._loader.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """As ``sampler.set_epoch``: the position is kept when ``epoch`` is the current one."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[BatchRef]:
        loader = self._loader
        batches = len(loader)
        epoch, position = loader._received()
        epoch += position >= batches
        order, size = loader.recipe.plan.order(epoch), loader.batch_size
        for k in range(batches):
            yield BatchRef(order[k * size : (k + 1) * size].tolist(), (epoch, k))

    def __repr__(self) -> str:
        return f"<batch_sampler of {self._loader!r}: {len(self)} batches>"


def collate(data: object) -> object:
    """``collate_fn``: the batch ``dataset.__getitems__`` gave (it is already one batch)."""
    if isinstance(data, list) and len(data) == 1:
        return data[0]
    raise ConfigError(
        "collate_fn of a stoker loader takes the one-batch list its dataset's __getitems__ "
        "gives; batches are made by the loader (iterate it, or its view)"
    )


class Cursor:
    """Batch ``(epoch, k)`` of ``owner`` (the loader or a view of it) for a DataLoader rebuilt
    from its parts: taken from one iteration of ``owner`` while the keys asked for follow each
    other, the loader moved to the key (its state) when they jump, as a skip does."""

    def __init__(self, owner: Iterable[object], loader: Sampled) -> None:
        self._owner, self._loader = owner, loader
        self._next: tuple[int, int] | None = None
        self._batches: Iterator[object] | None = None

    def at(self, key: tuple[int, int]) -> object:
        """The batch ``key`` as ``owner`` gives it."""
        if key != self._next or self._batches is None:
            self.stop()
            state = self._loader.state_dict()
            self._loader.load_state_dict({**state, "epoch": key[0], "position": key[1]})
            self._batches = iter(self._owner)
        self._next = (key[0], key[1] + 1)
        return next(self._batches)

    def stop(self) -> None:
        """End the iteration in progress (an adapter gives back a batch it held ahead)."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
        self._batches, self._next = None, None


def cursor(owner: Iterable[object], loader: Sampled) -> Cursor:
    """``owner``'s one Cursor (made at its first use)."""
    found = getattr(owner, "_stoker_cursor", None)
    if found is None:
        found = Cursor(owner, loader)
        owner._stoker_cursor = found  # type: ignore[attr-defined]
    return found

"""The attributes of a ``torch.utils.data.DataLoader`` that training loops read off it, on a
Loader and on its framework views: ``.dataset`` (``len(data_loader.dataset)`` in torchvision's
``evaluate``), ``.sampler`` (``sampler.set_epoch(epoch)`` in timm's and torchvision's loops)
and ``.batch_size``."""

from __future__ import annotations

from typing import Any


class Samples:
    """``loader.dataset``: the samples the loader draws from (after ``class_names`` and
    ``validation_split``), for code that asks a DataLoader's dataset its length or classes.

    ``len()`` counts them over all ranks, as ``len(DataLoader.dataset)`` does: torchvision's
    ``evaluate`` compares it with the samples it saw, summed across processes (equal with
    ``drop_last=False``, and with ``rank_split="once"`` on several ranks)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __len__(self) -> int:
        return len(self._loader.source)

    @property
    def classes(self) -> list[str] | None:
        """Class names (torchvision's ``ImageFolder.classes``), when the source has them."""
        return self._loader.classes

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """Class name -> class id (torchvision's ``ImageFolder.class_to_idx``)."""
        classes = self._loader.classes
        return None if classes is None else {name: k for k, name in enumerate(classes)}

    def __repr__(self) -> str:
        return f"<samples of {self._loader!r}: {len(self)}>"


class EpochSampler:
    """``loader.sampler``: the ``DistributedSampler`` habits a training loop has.

    ``set_epoch(e)`` moves the loader to epoch ``e`` (which seeds its order and augmentation);
    when ``e`` is already the loader's epoch it keeps the position, so a run resumed mid-epoch
    with ``load_state_dict`` that calls ``set_epoch`` at each epoch's start loses no batch.
    ``len()`` is the samples this rank visits per epoch, as ``len(DistributedSampler)``."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the loader's current epoch (from its first batch if it was not)."""
        if epoch != self.epoch:
            self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return int(self._loader._received()[0])

    @property
    def num_replicas(self) -> int:
        """Ranks the epoch is split across (``world_size``)."""
        return int(self._loader.plan.world_size)

    @property
    def rank(self) -> int:
        """This loader's rank."""
        return int(self._loader.plan.rank)

    @property
    def shuffle(self) -> bool:
        """Whether each epoch is shuffled."""
        return bool(self._loader.shuffle)

    @property
    def seed(self) -> int:
        """The seed of the order and augmentation."""
        return int(self._loader.seed)

    def __len__(self) -> int:
        return int(self._loader.plan.per_rank())

    def __repr__(self) -> str:
        return f"<sampler of {self._loader!r}: epoch {self.epoch}, rank {self.rank}>"

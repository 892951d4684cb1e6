"""Which rank of how many a loader is: given (``rank=``, ``world_size=``), or read from the
distributed runtime the process has started, at construction and again when the loader starts
an epoch, until a group of several ranks is found.

A Loader is often made before the process group exists (Lightning builds the data in
``LightningModule.__init__``, before its strategy calls ``init_process_group``), so one read at
construction would make every process rank 0 of 1 and train each on the whole data. The rank
is therefore *pending* while nothing was given and nothing was found: ``len()``, iteration and
``state_dict()`` read the runtime again, and the first group of several ranks they find fixes
the split. A loader that already handed out batches as rank 0 of 1 and then meets such a group
refuses (``ConfigError``) rather than go on with every rank on the whole data.

Runtimes are read only when the process has imported them (``sys.modules``): nothing is
imported, and nothing is initialised (JAX's backend is not touched before
``jax.distributed.initialize``)."""

from __future__ import annotations

import dataclasses
import sys

from ..errors import ConfigError
from ..order import Plan
from ..sources.listing import agree_early

#: (rank, world_size) of a single process.
ALONE = (0, 1)


def detect() -> tuple[int, int]:
    """The rank and world size of the distributed runtime this process has started: an
    initialised ``torch.distributed`` group, a multi-process ``jax.distributed``, a Ray Train
    worker's context; else ``(0, 1)``."""
    for read in (_torch, _jax, _ray_train):
        found = read()
        if found is not None and found[1] > 1:
            return found
    return ALONE


def _torch() -> tuple[int, int] | None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def _jax() -> tuple[int, int] | None:
    jax = sys.modules.get("jax")
    distributed = getattr(jax, "distributed", None)
    # only after jax.distributed.initialize: process_count() would otherwise start the
    # backend as a single process, and a later initialize() would then fail
    if distributed is None or not distributed.is_initialized():
        return None
    return int(jax.process_index()), int(jax.process_count())  # type: ignore[union-attr]


def _ray_train() -> tuple[int, int] | None:
    train = sys.modules.get("ray.train")
    if train is None:
        return None
    try:
        context = train.get_context()
        return int(context.get_world_rank()), int(context.get_world_size())
    except Exception:  # noqa: BLE001 - outside a Ray Train worker each Ray version raises its own
        return None


def pending(rank: object, world_size: object, found: tuple[int, int]) -> bool:
    """Whether the rank is still to be read: none was given and no group was found."""
    return rank is None and world_size is None and found == ALONE


def regroup(plan: Plan, used: bool) -> Plan | None:
    """The plan for the group found now, for a loader whose rank is pending; None when none is
    found. ``used``: the loader already handed out batches as rank 0 of 1 (then a group of
    several ranks is an error: its batches so far were the whole data's)."""
    rank, world = detect()
    if world == 1:
        return None
    if used:
        raise ConfigError(
            f"this Loader handed out batches as rank 0 of 1, and this process is now rank "
            f"{rank} of {world} (the process group was initialised after the loader started): "
            "every rank would train on the whole data. Make the Loader after "
            "init_process_group, or pass rank= and world_size= (dist.get_rank(), "
            "dist.get_world_size()), or start iterating only once the group exists"
        )
    agree_early()  # each rank listed its buckets on its own: the same objects as rank 0?
    return dataclasses.replace(plan, rank=rank, world_size=world)

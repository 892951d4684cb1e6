"""The loader's saved position: a JSON-able dict (``state_dict``), its checks on resume, and
arithmetic on it.

The position is global: ``position`` counts the global steps of the epoch the training step
received and ``samples`` the global samples they consumed (steps x ``batch_size`` x
``world_size``), the same on every rank. So a state saved on any rank resumes every rank, on
any number of ranks: with the same global batch at the same step, with another one at the
first sample not yet consumed (``resume_point``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, warn

STATE_VERSION = 2
#: what must match between a saved state and the loader resuming from it (the dataset, with
#: its selection, and the order); batch_size and world_size may change
MUST_MATCH = ("fingerprint", "seed", "shuffle", "rank_split")
#: what a state of version 1 (a position in this rank's batches) must match as well
MUST_MATCH_V1 = ("fingerprint", "seed", "batch_size", "batches")


@dataclass(frozen=True)
class Saved:
    """A checked state: where it is, and the sizes of the run that saved it."""

    epoch: int
    position: int  # global steps of ``epoch`` received
    samples: int  # global samples of ``epoch`` consumed
    batch_size: int
    world_size: int
    #: ``(epoch, samples, steps)``: the saving run began that epoch mid-way (``Plan.resume``)
    resumed: tuple[int, int, int] | None

    @property
    def global_batch(self) -> int:
        """Samples one of the saving run's steps took over all ranks."""
        return self.batch_size * self.world_size


def make_state(
    epoch: int,
    position: int,
    *,
    samples: int,
    seed: int,
    shuffle: bool,
    rank_split: str,
    batch_size: int,
    world_size: int,
    batches: int,
    fingerprint: Any,
    resumed: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """The state at global step ``position`` (``samples`` global samples) of ``epoch``."""
    state = {
        "version": STATE_VERSION,
        "epoch": epoch,
        "position": position,
        "samples": samples,
        "seed": seed,
        "shuffle": shuffle,
        "rank_split": rank_split,
        "batch_size": batch_size,
        "world_size": world_size,
        "batches": batches,
        "fingerprint": fingerprint,
    }
    # always present, so a loader that restores into its own state's keys (as
    # torch.distributed.checkpoint does) receives them
    state["resumed"] = None if resumed is None else list(resumed)
    return state


def check_state(state: dict[str, Any], mine: dict[str, Any], older: Sequence[str] = ()) -> Saved:
    """``state`` read, after checking it was saved by a loader like the one whose own state
    is ``mine``; a ConfigError says what differs. ``older``: this dataset's fingerprints as
    earlier releases computed them, accepted with a warning. A state of version 1 (saved by
    an earlier stoker) resumes when its batch_size and batches match, as it always did."""
    if state.get("fingerprint") in older:
        warn(
            "this state was saved by an earlier stoker, whose dataset fingerprint did not "
            "cover the tars' contents; it matches this dataset's tar names, sizes, members and "
            "labels, and is resumed. Save a new state to have the full check"
        )
        state = {**state, "fingerprint": mine["fingerprint"]}
    version = state.get("version")
    if version not in (1, STATE_VERSION):
        raise ConfigError(f"state version {version!r}; this stoker reads 1 and {STATE_VERSION}")
    if state.get("fingerprint") != mine["fingerprint"]:
        raise ConfigError(
            f"this state was saved for another dataset (fingerprint {state.get('fingerprint')!r}"
            f", this loader's {mine['fingerprint']!r}): its files, their labels or its tars' "
            "contents differ. Resume with the dataset the state was saved for, or pass {} to "
            "load_state_dict to start afresh"
        )
    for key in MUST_MATCH if version == STATE_VERSION else MUST_MATCH_V1:
        if state.get(key) != mine[key]:
            raise ConfigError(
                f"this state was saved for a different {key} ({state.get(key)!r}, here "
                f"{mine[key]!r}); resume with the same dataset and settings"
            )
    if version == 1:  # a position in this rank's batches, on as many ranks as here
        position = int(state["position"])
        samples = position * mine["batch_size"] * mine["world_size"]
        return Saved(
            int(state["epoch"]), position, samples, mine["batch_size"], mine["world_size"], None
        )
    resumed = state.get("resumed")
    return Saved(
        int(state["epoch"]),
        int(state["position"]),
        int(state["samples"]),
        int(state["batch_size"]),
        int(state["world_size"]),
        None if resumed is None else (int(resumed[0]), int(resumed[1]), int(resumed[2])),
    )


def changed(saved: Saved, batch_size: int, world_size: int) -> str:
    """What differs between the saving run's sizes and these ("" when nothing does)."""
    parts = []
    if saved.world_size != world_size:
        parts.append(f"world_size {saved.world_size} -> {world_size}")
    if saved.batch_size != batch_size:
        parts.append(f"batch_size {saved.batch_size} -> {batch_size}")
    return ", ".join(parts)

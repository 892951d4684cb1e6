"""Global steps: the state at a step, the plan and position a saved state resumes at, and
arithmetic on states. A pure function of the ``Plan`` and the state, so it is tested without
processes.

The rules (docs/resume.md):

- a step is a global batch: step ``k`` of an epoch holds the samples at global positions
  ``[k G, (k + 1) G)`` of its order (``G = batch_size x world_size``), every ``world_size``-th
  one on each rank; so when ``G`` is unchanged, a state resumes at its step, and every later
  batch is the one the uninterrupted run gave, on any number of ranks;
- with another ``G``, the rest of the epoch is the samples not yet consumed, each once, in
  the same order, split over the ranks in batches of the new size (``Plan.resume``); later
  epochs are those of a run with the new sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import warn
from ..order import Plan
from .state import Saved, changed, make_state


def global_step(plan: Plan, epoch: int, position: int) -> int:
    """The global step number of this plan's batch ``position`` of ``epoch``."""
    return plan.first_step(epoch) + position


def consumed(plan: Plan, epoch: int, position: int) -> int:
    """Global samples of ``epoch`` consumed once this plan's ``position`` batches are."""
    return min(plan.count(epoch), plan.start(epoch) + position * plan.global_batch)


def state_of(plan: Plan, epoch: int, position: int, fingerprint: Any) -> dict[str, Any]:
    """The state of a loader with ``plan`` that received ``position`` batches of ``epoch``."""
    return make_state(
        epoch,
        global_step(plan, epoch, position),
        samples=consumed(plan, epoch, position),
        seed=plan.seed,
        shuffle=plan.shuffle,
        rank_split=plan.split,
        batch_size=plan.batch_size,
        world_size=plan.world_size,
        batches=plan.batches(),
        fingerprint=fingerprint,
        resumed=plan.resume,
    )


def resume(plan: Plan, saved: Saved) -> tuple[Plan, int, int, str]:
    """``(plan, epoch, position, note)`` to resume ``saved`` with: the plan (``plan`` with
    the resumed epoch's start, if it needs one), the epoch and this plan's batch position in
    it, and a line for ``stats()`` when the world size or batch size changed ("" if not)."""
    base = dataclasses.replace(plan, resume=None)
    what = changed(saved, plan.batch_size, plan.world_size)
    if saved.global_batch == base.global_batch:
        if saved.resumed is None or saved.resumed[0] != saved.epoch:
            new, position = base, saved.position
        else:  # the saving run's epoch began mid-way: the same start, the same steps
            new = dataclasses.replace(base, resume=saved.resumed)
            position = saved.position - saved.resumed[2]
    elif saved.samples >= base.count(saved.epoch):  # the epoch was consumed whole: the next
        return base, saved.epoch + 1, 0, _note(saved, base, what)
    elif saved.samples == 0:
        new, position = base, 0
    else:
        new = dataclasses.replace(base, resume=(saved.epoch, saved.samples, saved.position))
        position = 0
        warn(_changed_warning(saved, base, what))
    return new, saved.epoch, position, _note(saved, base, what)


def _note(saved: Saved, plan: Plan, what: str) -> str:
    """The ``stats()`` line for a resume that changed sizes ("" for one that did not)."""
    if not what:
        return ""
    same = saved.global_batch == plan.global_batch
    effect = (
        f"the global batch ({plan.global_batch}) is unchanged: every later batch is the "
        "uninterrupted run's"
        if same
        else f"the global batch changed {saved.global_batch} -> {plan.global_batch}: the rest of "
        "the epoch is the samples not yet consumed, each once, in the same order"
    )
    return (
        f"resumed at global sample {saved.samples:,} (step {saved.position}) of epoch "
        f"{saved.epoch} on {_ranks(plan.world_size)} x batch_size {plan.batch_size}, saved on "
        f"{_ranks(saved.world_size)} x batch_size {saved.batch_size} ({what}); {effect}"
    )


def _ranks(world_size: int) -> str:
    return f"{world_size} rank{'s' if world_size != 1 else ''}"


def _changed_warning(saved: Saved, plan: Plan, what: str) -> str:
    rest = plan.count(saved.epoch) - saved.samples
    return (
        f"stoker resumes a state saved with another global batch ({what}: "
        f"{saved.global_batch} -> {plan.global_batch} samples a step). The rest of epoch "
        f"{saved.epoch} is the {rest:,} samples not yet consumed (after global sample "
        f"{saved.samples:,}), each once, in the same order, in steps of {plan.global_batch}; "
        "later epochs are as a run with the new sizes gives them. Keep batch_size x "
        "world_size unchanged to resume with the very batches the saving run would have given"
    )

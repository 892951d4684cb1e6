"""Steps you can address: the samples of any global step (``samples_at``, no decode, no file
opened), its batch rebuilt (``batch_at``, one batch's decode, no replay), and steps left out
(``skip``), kept in ``state_dict()``. A batch is a pure function of (plan, epoch, step), so
all three are exact.

Positions: ``Loader.position`` counts the batches of the epoch handed out or passed over,
skipped steps left out; ``given`` maps it to this plan's batch number (the step less the
epoch's first step, see ``Plan.first_step``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import ConfigError
from ..seeding import user_states_kept
from . import steps

if TYPE_CHECKING:
    from ..assemble import Assembler
    from ..order import Plan
    from ..recipe import Recipe

#: ``{epoch: [(first step, stop step), ...]}``: the global steps left out
Skips = dict[int, list[tuple[int, int]]]


def check_skip(value: Any) -> Skips:
    """``skip=``: ``{epoch: [(start, stop), ...]}`` (a ``range`` or an int for one step is
    accepted too), or the ``[[epoch, start, stop], ...]`` a ``state_dict()`` holds."""
    if value is None:
        return {}
    pairs: Iterable[tuple[Any, Any]]
    if isinstance(value, dict):
        pairs = ((epoch, r) for epoch, ranges in value.items() for r in _listed(ranges))
    else:
        try:
            pairs = [(e, (a, b)) for e, a, b in value]
        except (TypeError, ValueError):
            raise _bad_skip(value) from None
    out: Skips = {}
    for epoch, numbers in pairs:
        start, stop = _range(numbers, value)
        if not _count(epoch):
            raise _bad_skip(value)
        out.setdefault(int(epoch), []).append((start, stop))
    return {epoch: sorted(set(ranges)) for epoch, ranges in out.items()}


def _listed(ranges: Any) -> list[Any]:
    return [ranges] if isinstance(ranges, range | int) or _is_pair(ranges) else list(ranges)


def _is_pair(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(_count(v) for v in value)


def _count(value: Any) -> bool:
    return bool(isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= 0)


def _range(steps: Any, whole: Any) -> tuple[int, int]:
    if isinstance(steps, range) and steps.step == 1:
        steps = (steps.start, steps.stop)
    elif _count(steps):
        steps = (steps, steps + 1)
    if not (isinstance(steps, tuple | list) and len(steps) == 2 and all(map(_count, steps))):
        raise _bad_skip(whole)
    start, stop = int(steps[0]), int(steps[1])
    if stop <= start:
        raise _bad_skip(whole)
    return start, stop


def _bad_skip(value: Any) -> ConfigError:
    return ConfigError(
        f"skip={value!r}: give the global steps to leave out per epoch, as "
        "{epoch: [(start, stop), ...]} (stop excluded; a range or a single step number also "
        "works), e.g. skip={3: [(1200, 1250)]}"
    )


def check_exclude(value: Any) -> tuple[int | str, ...]:
    """``exclude=``: source indices or paths (a list, tuple or set), resolved against the
    opened source when the Loader is made."""
    if value is None:
        return ()
    if isinstance(value, str | bytes | int) or not isinstance(value, list | tuple | set):
        raise ConfigError(
            f"exclude={value!r}: give a list of source indices (as the batches' index field) "
            "or paths (as loader.file_paths names them), e.g. exclude=[17, 'cats/003.jpg']"
        )
    if not all(isinstance(v, str) or _count(v) for v in value):
        raise ConfigError(
            f"exclude={value!r}: every entry must be a source index (an int >= 0) or a path"
        )
    return tuple(value)


def saved_skips(skips: Skips) -> list[list[int]]:
    """``skips`` as ``state_dict()`` keeps them: ``[[epoch, start, stop], ...]``."""
    return [[epoch, a, b] for epoch in sorted(skips) for a, b in skips[epoch]]


def given(plan: Plan, epoch: int, skips: Skips) -> np.ndarray | None:
    """This plan's batch numbers of ``epoch`` that are handed out (skipped steps left out),
    or None when none of its steps is skipped."""
    ranges = skips.get(epoch)
    if not ranges:
        return None
    step = plan.first_step(epoch) + np.arange(plan.epoch_batches(epoch))
    keep = np.ones(len(step), dtype=bool)
    for start, stop in ranges:
        keep &= (step < start) | (step >= stop)
    return np.flatnonzero(keep)


class Supply(Protocol):
    """What ``Addresses`` reads of the loader's run side (``starting.Supply`` is one; named
    here, not imported: ``options`` imports this module's checks, and ``starting`` the
    resolver that imports ``options``)."""

    recipe: Recipe
    batches: int

    def ranked(self) -> None: ...
    def replan(self, plan: Plan) -> None: ...
    def peeker(self) -> Assembler: ...


class Addresses:
    """The global steps of one loader's plan, addressed: its skips (``skip``), where a handed-out
    batch lies in the plan, the state at a position, and any step's samples or batch. It reads
    the plan and the fillers from the loader's ``Supply``, passed in; nothing of the Loader."""

    def __init__(self, supply: Supply, skips: Skips) -> None:
        self._supply = supply
        self._skips = skips  # checked (``check_skip``)
        #: for the plan they were made from: epochs' global orders, other ranks' fillers
        self._addressed: tuple[Plan | None, dict[int, np.ndarray], dict[int, Assembler]] = (
            None,
            {},
            {},
        )

    def length(self, epoch: int) -> int:
        """Batches of ``epoch`` this rank hands out: a resumed epoch's rest or a whole one,
        skipped steps left out."""
        plan = self._supply.recipe.plan
        kept = given(plan, epoch, self._skips)
        if kept is not None:
            return len(kept)
        return plan.epoch_batches(epoch) if plan.resume or plan.exclude else self._supply.batches

    def batch_of(self, epoch: int, position: int) -> int:
        """This plan's batch number of the ``position``-th batch handed out in ``epoch``
        (the epoch's batch count once ``position`` is past its last)."""
        plan = self._supply.recipe.plan
        kept = given(plan, epoch, self._skips)
        if kept is None:
            return position
        return int(kept[position]) if position < len(kept) else plan.epoch_batches(epoch)

    def position_of(self, epoch: int, batch: int) -> int:
        """The inverse of ``batch_of``: batches handed out in ``epoch`` before plan batch
        ``batch`` (skipped ones are passed over)."""
        kept = given(self._supply.recipe.plan, epoch, self._skips)
        return batch if kept is None else int(np.searchsorted(kept, batch))

    def state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The state once ``position`` batches of ``epoch`` were handed out."""
        recipe = self._supply.recipe
        state = steps.state_of(
            recipe.plan, epoch, self.batch_of(epoch, position), recipe.source.fingerprint()
        )
        state["skip"] = saved_skips(self._skips)
        state["exclude"] = [[epoch, indices] for epoch, indices in self.excluded.items()]
        return state

    def adopt(self, state: dict[str, Any]) -> None:
        """Take over the skips and exclusions a saved state holds (a restart keeps them)."""
        for epoch, ranges in check_skip(state.get("skip")).items():
            for numbers in ranges:
                self.skip(epoch, numbers)
        plan = self._supply.recipe.plan
        kept = list(plan.exclude)
        for epoch, indices in state.get("exclude") or []:
            entry = (int(epoch), self.local(indices))
            if entry not in kept:
                kept.append(entry)
        self._supply.replan(dataclasses.replace(plan, exclude=tuple(kept)))

    def exclude(self, samples: Iterable[int | str], received: tuple[int, int]) -> None:
        """``Loader.exclude``, the loader having received batches up to ``received``
        (epoch, position)."""
        local = self.local(samples)
        epoch, position = received
        plan = self._supply.recipe.plan
        start = epoch if position == 0 and not plan.start(epoch) else epoch + 1
        self._supply.replan(dataclasses.replace(plan, exclude=(*plan.exclude, (start, local))))

    @property
    def excluded(self) -> dict[int, list[int]]:
        """``Loader.excluded``."""
        recipe = self._supply.recipe
        return {
            epoch: recipe.source.source_indices(np.asarray(local, np.int64)).tolist()
            for epoch, local in recipe.plan.exclude
        }

    def advance_state(self, state: dict[str, Any], batches: int) -> dict[str, Any]:
        """``Loader.advance_state``."""
        self._supply.ranked()
        plan, epoch = self._supply.recipe.plan, int(state["epoch"])
        position = self.position_of(epoch, int(state["position"]) - plan.first_step(epoch))
        position += int(batches)
        while position >= self.length(epoch):
            position -= self.length(epoch)
            epoch += 1
        return {**state, **self.state_at(epoch, position)}

    def skip(self, epoch: int, steps: Any) -> None:
        """``Loader.skip``."""
        more = check_skip({epoch: [steps]})
        merged = {**self._skips}
        for e, ranges in more.items():
            merged[e] = sorted(set(merged.get(e, []) + ranges))
        self._skips = merged

    @property
    def skipped(self) -> Skips:
        """A copy of the global steps left out."""
        return {epoch: list(ranges) for epoch, ranges in self._skips.items()}

    def samples_at(self, epoch: int, step: int, rank: int | None = None) -> dict[str, list[Any]]:
        """``Loader.samples_at``."""
        plan, j = self._address(epoch, step)
        ranks = range(plan.world_size) if rank is None else [self._rank(rank, plan)]
        parts = [(r, dataclasses.replace(plan, rank=r).batch_slots(epoch, j)) for r in ranks]
        slots = np.concatenate([s for _, s in parts])
        owner = np.concatenate([np.full(len(s), r) for r, s in parts])
        keep = np.argsort(slots, kind="stable")
        slots, owner = slots[keep], owner[keep]
        order = self._global_order(plan, epoch)
        local = order[slots % len(order)]
        source = self._supply.recipe.source
        return {
            "index": source.source_indices(local).tolist(),
            "path": [source.name(int(i)) for i in local],
            "rank": owner.tolist(),
            "position": slots.tolist(),
        }

    def fields_at(
        self, epoch: int, step: int, rank: int | None = None
    ) -> tuple[dict[str, np.ndarray], int]:
        """The fields of global step ``step`` of ``epoch`` for this rank (or ``rank``),
        filled in this process, and their sample count (``Loader.batch_at`` arranges them)."""
        plan, j = self._address(epoch, step)
        own = plan.rank if rank is None else self._rank(rank, plan)
        if own == plan.rank:
            filler = self._supply.peeker()
        else:
            fillers = self._kept(plan)[1]
            if own not in fillers:
                other = dataclasses.replace(plan, rank=own)
                fillers[own] = dataclasses.replace(self._supply.recipe, plan=other).assembler()
            filler = fillers[own]
        fields = self._supply.recipe.schema.slot_layout.arrays()
        with user_states_kept():  # the user's own random draws are not moved by a look
            report = filler.fill(epoch, j, fields)
        return fields, report.count

    def local(self, samples: Iterable[int | str]) -> tuple[int, ...]:
        """``samples`` (source indices or paths) as this source's sample numbers, sorted."""
        source = self._supply.recipe.source
        wanted = list(samples)
        names = [s for s in wanted if isinstance(s, str)]
        numbers = [s for s in wanted if not isinstance(s, str)]
        if not all(_count(s) for s in numbers):
            raise ConfigError(
                f"exclude({wanted!r}): give source indices (ints >= 0, as the batches' index "
                "field) or paths (as loader.file_paths names them)"
            )
        local: set[int] = set()
        if numbers:
            mine = source.source_indices(np.arange(len(source)))
            found = np.flatnonzero(np.isin(mine, np.asarray(numbers, np.int64)))
            missing = sorted(set(numbers) - set(mine[found].tolist()))
            if missing:
                raise ConfigError(f"exclude: no sample has the source index {missing[:5]}")
            local.update(found.tolist())
        if names:
            where = {source.name(i): i for i in range(len(source))}
            missing_names = [n for n in names if n not in where]
            if missing_names:
                raise ConfigError(
                    f"exclude: no sample is named {missing_names[:5]}; name them as "
                    "loader.file_paths does"
                )
            local.update(where[n] for n in names)
        return tuple(sorted(local))

    def _address(self, epoch: int, step: int) -> tuple[Plan, int]:
        """The plan and its batch number for global step ``step`` of ``epoch``."""
        self._supply.ranked()
        plan = self._supply.recipe.plan
        if not (_count(epoch) and _count(step)):
            raise ConfigError(f"epoch={epoch!r}, step={step!r}: give two whole numbers >= 0")
        resumed = plan.resume
        if resumed is not None and (epoch, step) < (resumed[0], resumed[2]):
            raise ConfigError(
                f"step {step} of epoch {epoch} was made before this loader's resume at step "
                f"{resumed[2]} of epoch {resumed[0]}, by a run with another global batch; "
                "address it with a Loader of that run's batch_size and world_size"
            )
        j = step - plan.first_step(epoch)
        count = max(
            dataclasses.replace(plan, rank=r).epoch_batches(epoch) for r in range(plan.world_size)
        )
        if j >= count:
            first = plan.first_step(epoch)
            raise ConfigError(
                f"epoch {epoch} has global steps {first} to {first + count - 1}; step {step} "
                "is past its end"
            )
        return plan, j

    @staticmethod
    def _rank(rank: Any, plan: Plan) -> int:
        if not _count(rank) or rank >= plan.world_size:
            raise ConfigError(
                f"rank={rank!r}: give a rank in [0, {plan.world_size}), or None for every rank"
            )
        return int(rank)

    def _kept(self, plan: Plan) -> tuple[dict[int, np.ndarray], dict[int, Assembler]]:
        """What is kept for ``plan`` (emptied when the plan changes: a resume, a new rank)."""
        if self._addressed[0] != plan:
            self._addressed = (plan, {}, {})
        return self._addressed[1], self._addressed[2]

    def _global_order(self, plan: Plan, epoch: int) -> np.ndarray:
        """The epoch's global order, kept for the last two epochs asked about."""
        orders = self._kept(plan)[0]
        if epoch not in orders:
            if len(orders) >= 2:
                orders.pop(next(iter(orders)))
            orders[epoch] = plan.global_order(epoch)
        return orders[epoch]

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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..seeding import user_states_kept
from . import steps

if TYPE_CHECKING:
    from ..assemble import Assembler
    from ..order import Plan
    from ..recipe import Recipe
    from ..schema import SlotLayout

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


class Addressing:
    """``samples_at``, ``batch_at`` and ``skip`` of ``Loader`` (a mixin: its methods run on a
    ``Loader``, which sets these attributes)."""

    recipe: Recipe
    _batches: int
    _skips: Skips
    _peeker: Assembler | None
    #: for the plan they were made from: epochs' global orders, other ranks' fillers
    _addressed: tuple[Plan | None, dict[int, np.ndarray], dict[int, Assembler]] = (None, {}, {})

    @property
    def plan(self) -> Plan:  # the Loader's, which settles a pending rank first
        raise NotImplementedError

    @property
    def slot_layout(self) -> SlotLayout:  # the Loader's
        raise NotImplementedError

    def _arrange(self, fields: dict[str, np.ndarray], count: int) -> Any:  # the Loader's
        raise NotImplementedError

    def _received(self) -> tuple[int, int]:  # the Loader's
        raise NotImplementedError

    def _replan(self, plan: Plan) -> None:  # the Loader's
        raise NotImplementedError

    def exclude(self, samples: Iterable[int | str]) -> None:
        """Leave ``samples`` out from now on: source indices (as the batches' ``index`` field
        numbers them) or paths (as ``file_paths`` names them). They leave the current epoch
        if none of its batches was received yet, else from the next epoch on (the epoch under
        way keeps its order, so what it already gave stays exact). The other samples keep
        their order relative to each other: an epoch's order is the same permutation of all
        samples with the excluded ones taken out, so later steps shift up to fill their
        places. Kept in ``state_dict()``; workers running restart at the next batch."""
        local = self._local(samples)
        epoch, position = self._received()
        plan = self.recipe.plan
        start = epoch if position == 0 and not plan.start(epoch) else epoch + 1
        self._replan(dataclasses.replace(plan, exclude=(*plan.exclude, (start, local))))

    @property
    def excluded(self) -> dict[int, list[int]]:
        """``{first epoch: source indices}`` of the samples left out (see ``exclude``)."""
        source = self.recipe.source
        return {
            epoch: source.source_indices(np.asarray(local, np.int64)).tolist()
            for epoch, local in self.recipe.plan.exclude
        }

    def _local(self, samples: Iterable[int | str]) -> tuple[int, ...]:
        """``samples`` (source indices or paths) as this source's sample numbers, sorted."""
        source = self.recipe.source
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

    def _length(self, epoch: int) -> int:
        """Batches of ``epoch`` this rank hands out: a resumed epoch's rest or a whole one,
        skipped steps left out."""
        plan = self.recipe.plan
        kept = given(plan, epoch, self._skips)
        if kept is not None:
            return len(kept)
        return plan.epoch_batches(epoch) if plan.resume or plan.exclude else self._batches

    def _batch_of(self, epoch: int, position: int) -> int:
        """This plan's batch number of the ``position``-th batch handed out in ``epoch``
        (the epoch's batch count once ``position`` is past its last)."""
        kept = given(self.recipe.plan, epoch, self._skips)
        if kept is None:
            return position
        return (
            int(kept[position]) if position < len(kept) else self.recipe.plan.epoch_batches(epoch)
        )

    def _position_of(self, epoch: int, batch: int) -> int:
        """The inverse of ``_batch_of``: batches handed out in ``epoch`` before plan batch
        ``batch`` (skipped ones are passed over)."""
        kept = given(self.recipe.plan, epoch, self._skips)
        return batch if kept is None else int(np.searchsorted(kept, batch))

    def _state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The state once ``position`` batches of ``epoch`` were handed out."""
        plan = self.recipe.plan
        state = steps.state_of(
            plan, epoch, self._batch_of(epoch, position), self.recipe.source.fingerprint()
        )
        state["skip"] = saved_skips(self._skips)
        state["exclude"] = [[epoch, indices] for epoch, indices in self.excluded.items()]
        return state

    def _adopt(self, state: dict[str, Any]) -> None:
        """Take over the skips and exclusions a saved state holds (a restart keeps them)."""
        for epoch, ranges in check_skip(state.get("skip")).items():
            for numbers in ranges:
                self.skip(epoch, numbers)
        plan = self.recipe.plan
        kept = list(plan.exclude)
        for epoch, indices in state.get("exclude") or []:
            entry = (int(epoch), self._local(indices))
            if entry not in kept:
                kept.append(entry)
        self._replan(dataclasses.replace(plan, exclude=tuple(kept)))

    def advance_state(self, state: dict[str, Any], batches: int) -> dict[str, Any]:
        """The state ``batches`` batches after ``state`` (one of this loader's states;
        skipped steps are passed over, epochs roll over at their length)."""
        plan, epoch = self.plan, int(state["epoch"])
        position = self._position_of(epoch, int(state["position"]) - plan.first_step(epoch))
        position += int(batches)
        while position >= self._length(epoch):
            position -= self._length(epoch)
            epoch += 1
        return {**state, **self._state_at(epoch, position)}

    def skip(self, epoch: int, steps: Any) -> None:
        """Leave the global steps ``steps`` of ``epoch`` out (a ``(start, stop)`` pair, stop
        excluded, a ``range`` or one step number): iteration passes over them, every other
        batch stays byte-identical, and ``state_dict()`` keeps the skip so a restart keeps
        skipping. ``batch_at`` and ``samples_at`` still address a skipped step."""
        more = check_skip({epoch: [steps]})
        merged = {**self._skips}
        for e, ranges in more.items():
            merged[e] = sorted(set(merged.get(e, []) + ranges))
        self._skips = merged

    @property
    def skipped(self) -> Skips:
        """The global steps left out, ``{epoch: [(start, stop), ...]}`` (see ``skip``)."""
        return {epoch: list(ranges) for epoch, ranges in self._skips.items()}

    def samples_at(self, epoch: int, step: int, rank: int | None = None) -> dict[str, list[Any]]:
        """The samples of global step ``step`` of ``epoch``: for ``rank``, or for the whole
        global batch (every rank's part, in global order) with ``rank=None``; as lists,
        JSON-able: ``index`` (numbered as the source you passed), ``path``, ``rank`` and
        ``position`` (in the epoch's global order). Nothing is decoded and no file opened. A
        bad file's replacement is found only when it is loaded (``batch_at`` has it)."""
        plan, j = self._address(epoch, step)
        ranks = range(plan.world_size) if rank is None else [self._rank(rank, plan)]
        parts = [(r, dataclasses.replace(plan, rank=r).batch_slots(epoch, j)) for r in ranks]
        slots = np.concatenate([s for _, s in parts])
        owner = np.concatenate([np.full(len(s), r) for r, s in parts])
        keep = np.argsort(slots, kind="stable")
        slots, owner = slots[keep], owner[keep]
        order = self._global_order(plan, epoch)
        local = order[slots % len(order)]
        source = self.recipe.source
        return {
            "index": source.source_indices(local).tolist(),
            "path": [source.name(int(i)) for i in local],
            "rank": owner.tolist(),
            "position": slots.tolist(),
        }

    def batch_at(self, epoch: int, step: int, rank: int | None = None) -> Any:
        """Global step ``step`` of ``epoch`` rebuilt: the batch this rank (or ``rank``)
        received there, byte-identical (augmentation, bad-file replacement and
        ``batch_transform`` included), in the batch structure iteration gives. It costs one
        batch's decode in this process, whatever the step: nothing before it is replayed; the
        position and the workers are untouched."""
        plan, j = self._address(epoch, step)
        own = plan.rank if rank is None else self._rank(rank, plan)
        if own == plan.rank:
            if self._peeker is None:
                self._peeker = self.recipe.assembler()
            filler = self._peeker
        else:
            fillers = self._kept(plan)[1]
            if own not in fillers:
                other = dataclasses.replace(plan, rank=own)
                fillers[own] = dataclasses.replace(self.recipe, plan=other).assembler()
            filler = fillers[own]
        fields = self.slot_layout.arrays()
        with user_states_kept():  # the user's own random draws are not moved by a look
            report = filler.fill(epoch, j, fields)
        return self._arrange(fields, report.count)

    def _address(self, epoch: int, step: int) -> tuple[Plan, int]:
        """The plan and its batch number for global step ``step`` of ``epoch``."""
        plan = self.plan
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

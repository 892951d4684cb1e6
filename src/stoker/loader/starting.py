"""How a Loader starts its batch makers: at the first batch (or ahead, for a per-sample
dataset), in this process (``workers=0``), in a local worker pool or on cluster nodes, all made
from the loader's one ``Recipe``; ``running.Running`` owns what is started."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..assemble import Assembler
from ..errors import StokerError
from ..workers.cluster import probe_digest
from . import ranks, wiring
from .running import auto_workers
from .supplier import Supplier

if TYPE_CHECKING:
    import weakref

    from ..recipe import Recipe
    from ..workers.runspec import RunSpec
    from .consumer import Guard
    from .running import Running


class Starting:
    """The start-up half of ``Loader`` (a mixin: its methods run on a ``Loader``, which sets
    these attributes)."""

    recipe: Recipe
    run: RunSpec
    batch_size: int
    _batches: int
    _peeker: Assembler | None
    _rank_pending: bool
    _rank_used: bool
    _run: Running
    _guard: Guard
    _finalizer: weakref.finalize[Any, Any]

    def _ranked(self) -> None:
        """Read the rank again while it is pending (see ``loader.ranks``): the first group of
        several ranks found fixes this loader's split. Workers launched with the old plan are
        stopped; the next batch starts them with the new one."""
        if not self._rank_pending:
            return
        plan = ranks.regroup(self.recipe.plan, self._rank_used)
        if plan is None:
            return
        self._rank_pending = False
        self._run.close(fast=True)
        self.recipe = dataclasses.replace(self.recipe, plan=wiring.check_batches(plan))
        self._batches, self._peeker = plan.batches(), None

    def _engine(self) -> Supplier:
        self._guard.check_process()
        if self._run.engine is None:
            if self._finalizer.alive is False:
                raise StokerError("this Loader is closed; create a new one")
            self._start()
        assert self._run.engine is not None
        return self._run.engine

    def _assembler(self) -> Assembler:
        """A batch filler for this process (workers make their own from the same Recipe)."""
        return self.recipe.assembler()

    def _count_workers(self, assembler: Assembler) -> None:
        """Settle ``workers="auto"`` (once) from the measured cost of a sample."""
        if self.run.workers and self.run.auto_workers:
            self.run = self.run.settled(
                *auto_workers(assembler, self.recipe.schema.slot_layout, self.batch_size)
            )

    def _launch_ahead(self) -> None:
        """A per-sample dataset's workers are launched now, not at the first batch: each
        imports the dataset's modules (torch, datasets: seconds), and that overlaps whatever
        the caller does before iterating (building the model). Image sources start in a
        fraction of a second and keep starting at the first batch; so do cluster loaders."""
        run = self.run
        if not run.workers or self.recipe.source.sample_fields is None or run.cluster is not None:
            return
        self._count_workers(self._assembler())
        if self.run.workers:
            self._run.launch_pool(self.recipe, self.run)

    def _start(self) -> None:
        assembler = self._assembler()
        self._count_workers(assembler)
        if self.run.workers == 0 and self.run.cluster is None:
            self._run.start_inline(assembler, self.recipe.schema.slot_layout)
            return
        if self.run.cluster is not None:  # the nodes get exactly what the local workers get
            self._run.start_cluster(
                self.recipe,
                self.run,
                self._samples,
                lambda: probe_digest(assembler, self.recipe.schema.slot_layout, (0, 0)),
            )
            return
        # workers launched ahead and still starting: batches are filled here (``here``)
        self._run.start_pool(self.recipe, self.run, here=assembler)

    def _samples(self, key: tuple[int, int]) -> list[str]:
        """The names of the samples batch ``key`` (epoch, position) holds."""
        start = key[1] * self.batch_size
        order = self.recipe.plan.order(key[0])[start : start + self.batch_size]
        return [self.recipe.source.name(int(i)) for i in order]

"""The run side of a Loader, one object: ``Supply`` holds the loader's ``Recipe`` and
``RunSpec`` and starts its batch makers from them at the first batch (or ahead, for a
per-sample dataset): in this process (``workers=0``), in a local worker pool or on cluster
nodes; ``running.Running`` owns what is started. ``stats()`` is its report.

The Loader keeps the position and the consumer's side (its guard, its counters) and asks its
``Supply`` only through the methods here, never reaching into it, and the ``Supply`` reads
nothing of the Loader."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .. import order as order_mod
from ..assemble import Assembler
from ..decode import decoder_name
from ..errors import StokerError
from ..sources.targets import class_ids
from ..workers.cluster import probe_digest
from ..workers.launch import describe as describe_start
from ..workers.threads import describe as describe_threads
from . import ranks, wiring
from .running import Running, auto_workers
from .supplier import Supplier

if TYPE_CHECKING:
    from ..adapters.feed import Ring
    from ..order import Plan
    from ..recipe import Recipe
    from ..stats import Stats, StatsReport
    from ..workers.runspec import RunSpec


class Supply:
    """What a Loader's batches are made from (``recipe``, ``run``), what is started from them
    (``running``), the filler of ``peek()``, and the rank while it is pending."""

    def __init__(self, recipe: Recipe, run: RunSpec, rank_pending: bool) -> None:
        self.recipe, self.run = recipe, run
        #: what is started (closed by the Loader's ``close()`` and its finalizer)
        self.running = Running()
        #: batches per epoch for this rank
        self.batches = recipe.plan.batches()
        self._rank_pending, self._rank_used = rank_pending, False
        self._peeker: Assembler | None = None  # fills peek()'s batches in this process
        self._notes_of: tuple[tuple[int, str], list[str]] = ((-1, ""), [])

    def ranked(self) -> None:
        """Read the rank again while it is pending (see ``loader.ranks``): the first group of
        several ranks found fixes this loader's split."""
        if not self._rank_pending:
            return
        plan = ranks.regroup(self.recipe.plan, self._rank_used)
        if plan is None:
            return
        self._rank_pending = False
        self.replan(wiring.check_batches(plan))

    def hand_out(self) -> None:
        """Batches are handed out now: a pending rank is fixed at rank 0 of 1 from here."""
        if self._rank_pending:
            self._rank_used = True

    def replan(self, plan: Plan) -> None:
        """Make batches from ``plan`` from now on: the batch makers started with another plan
        are stopped (the next batch starts them with this one)."""
        if plan == self.recipe.plan:
            return
        self.running.close(fast=True)
        self.recipe = dataclasses.replace(self.recipe, plan=plan)
        self.batches, self._peeker = plan.batches(), None

    def engine(self, closed: bool) -> Supplier:
        """The started supplier of batches, started now if it is not (``closed``: the Loader
        was closed, and is not started again)."""
        if self.running.engine is None:
            if closed:
                raise StokerError("this Loader is closed; create a new one")
            self._start()
        assert self.running.engine is not None
        return self.running.engine

    def peeker(self) -> Assembler:
        """The filler of ``peek()``'s batches in this process (made at its first use)."""
        if self._peeker is None:
            self._peeker = self.recipe.assembler()
        return self._peeker

    def ring(self) -> Ring | None:
        """The running prefetch ring, or None with ``workers=0`` or before the first batch."""
        engine = self.running.engine
        return None if engine is None else engine.ring()

    def _count_workers(self, assembler: Assembler) -> None:
        """Settle ``workers="auto"`` (once) from the measured cost of a sample."""
        if self.run.workers and self.run.auto_workers:
            layout, batch_size = self.recipe.schema.slot_layout, self.recipe.plan.batch_size
            self.run = self.run.settled(*auto_workers(assembler, layout, batch_size))

    def launch_ahead(self) -> None:
        """A per-sample dataset's workers are launched now, not at the first batch: each
        imports the dataset's modules (torch, datasets: seconds), and that overlaps whatever
        the caller does before iterating (building the model). Image sources start in a
        fraction of a second and keep starting at the first batch; so do cluster loaders."""
        run = self.run
        if not run.workers or self.recipe.source.sample_fields is None or run.cluster is not None:
            return
        self._count_workers(self.recipe.assembler())
        if self.run.workers:
            self.running.launch_pool(self.recipe, self.run)

    def _start(self) -> None:
        assembler = self.recipe.assembler()
        self._count_workers(assembler)
        layout = self.recipe.schema.slot_layout
        if self.run.workers == 0 and self.run.cluster is None:
            self.running.start_inline(assembler, layout)
            return
        if self.run.cluster is not None:  # the nodes get exactly what the local workers get
            self.running.start_cluster(
                self.recipe,
                self.run,
                self._samples,
                lambda: probe_digest(assembler, layout, (0, 0)),
            )
            return
        # workers launched ahead and still starting: batches are filled here (``here``)
        self.running.start_pool(self.recipe, self.run, here=assembler)

    def _samples(self, key: tuple[int, int]) -> list[str]:
        """The names of the samples batch ``key`` (epoch, position) holds."""
        size = self.recipe.plan.batch_size
        order = self.recipe.plan.order(key[0])[key[1] * size : (key[1] + 1) * size]
        return [self.recipe.source.name(int(i)) for i in order]

    # ------------------------------------------------------------------ the report

    def report(self, stats: Stats, epoch: int, resume_note: str) -> StatsReport:
        """``stats()``: the consumer's counters with how the batches were made (``epoch``: the
        loader's, for the shuffle note; ``resume_note``: what its last resume changed)."""
        running, run, source = self.running, self.run, self.recipe.source
        engine = running.engine
        startup_s, startup = describe_start(
            running.started, self._start_cause(), running.waited_s, running.here()
        )
        return stats.report(
            workers=run.workers,
            workers_reason=run.workers_reason,
            prefetch=running.prefetch(),
            prefetch_reason=running.prefetch_reason,
            kept_batches=engine.orphaned if engine is not None else 0,
            memory_folder=running.folder,
            notes=self._notes(epoch, resume_note),
            decoder=decoder_name(),
            startup_s=startup_s,
            startup=startup,
            worker_threads=describe_threads(run.worker_threads) if run.workers else "",
            from_storage=bool(source.from_storage),
            cluster=running.cluster_stats(),
        )

    def _start_cause(self) -> str:
        """What the workers load the user's modules for (see ``launch.CAUSES``)."""
        if self.recipe.source.sample_fields is not None:
            return "dataset"
        return "augment" if getattr(self.recipe.pipeline, "ops", None) else "settings"

    def _notes(self, epoch: int, resume_note: str) -> list[str]:
        """Extra lines for the report: what a resume changed, how well a block (row-group)
        shuffle mixes the data.

        Computed once per epoch and resume: the shuffle's line builds the epoch's whole order,
        too much for every call."""
        key = (epoch, resume_note)
        if self._notes_of[0] != key:
            lines = [resume_note] if resume_note else []
            plan = self.recipe.plan
            if plan.shuffle and plan.block_sizes:
                labels = class_ids(self.recipe.source.labels)
                order = plan.order(epoch)
                lines.append(
                    order_mod.shuffle_note(order, plan.block_sizes, labels, plan.batch_size)
                )
            self._notes_of = (key, lines)
        return self._notes_of[1]

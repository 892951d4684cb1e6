"""What a started loader owns and how it starts: the in-process filler (``workers=0``) or the
worker pool and its prefetch engine; the measured choice of ``workers="auto"``; the stop that
the loader's ``close()`` and its finalizer share."""

from __future__ import annotations

import mmap
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import order as order_mod
from ..assemble import Assembler, Report
from ..decode import jpegcrop
from ..errors import warn
from ..recipe import Recipe
from ..schema import Fields, SlotLayout
from ..shm.folder import pick_folder
from ..shm.stale import clean_stale
from ..workers import shutdown
from ..workers.engine import COPY_BYTES, HELD, Engine, RingSpec
from ..workers.launch import StartReport
from ..workers.pool import WorkerPool
from ..workers.runspec import RunSpec
from . import config
from .supplier import Supplier

PROBE_SAMPLES = 8
KEPT_BLOCKS = HELD + 2  # workers=0: blocks remembered for reuse (consumer + adapter ahead)
_SLOW_DECODER_WARNED: list[bool] = []  # appended to once the warning below has been given


def warn_if_slow_decoder() -> None:
    """Warn once per process (at the first Loader) that the fast JPEG decoder is not built."""
    if jpegcrop.AVAILABLE or _SLOW_DECODER_WARNED:
        return
    _SLOW_DECODER_WARNED.append(True)
    warn(jpegcrop.missing_message())


def _probe_cost(assembler: Assembler, layout: SlotLayout) -> float | None:
    """Seconds of read + decode + transform per sample (median), timed here on a few samples
    of the first epoch through the assembler's own per-sample path.

    Only stock pipelines are probed: a user's transform never runs in the calling process.
    """
    if assembler.pipeline.needs_rng or assembler.source.sample_fields is not None:
        return None
    plan = assembler.plan
    indices = assembler.order(0)[:PROBE_SAMPLES]
    u = order_mod.sample_uniforms(plan.seed, 0, indices, assembler.pipeline.uniforms)
    arrays = layout.arrays()
    out = (arrays["image"][0], arrays["mask"][0] if "mask" in arrays else None)
    times = []
    for k, index in enumerate(indices):
        report = Report()
        try:
            if not assembler.load_one(0, int(index), out, u[k], report):
                continue
        except Exception:  # noqa: BLE001 - such a sample shows up, named, in the workers
            continue
        times.append(report.read_s + report.decode_s + report.transform_s)
    return sorted(times)[len(times) // 2] if times else None


def auto_workers(assembler: Assembler, layout: SlotLayout, batch_size: int) -> tuple[int, str]:
    """``workers="auto"``: the worker count (and why) from the measured cost of a sample."""
    cost = _probe_cost(assembler, layout)
    return config.auto_workers(cost, batch_size, PROBE_SAMPLES)


class Block(mmap.mmap):
    """Memory of one in-process batch's large fields (private, anonymous, huge pages)."""

    #: Set by an adapter that hands the batch to a framework which keeps it (``owned``):
    #: the block is then the framework's, never reused, and needs no copy.
    given = False

    def give(self) -> bool:
        """Hand this block over for good (the loader forgets it); True."""
        self.given = True
        return True


class Inline:
    """workers=0: fill each batch in the calling process when asked.

    The large fields (images, masks) are written into one of a few reused blocks of memory,
    not fresh arrays: a fresh batch-sized array is mapped anew and page-faulted on every batch,
    and that first touch costs as much as the copy itself (see benchmarks/README.md#arrays).
    As in the ring, a block is reused only when no array
    handed out from it is still referenced (weak references, so nothing is ever overwritten
    under the consumer); a batch the consumer keeps keeps its memory and the next batch gets a
    new block. Small fields (labels, weights, indices) are fresh arrays, so keeping them pins
    no block. An adapter whose framework keeps batches (tf.data, JAX on CPU) takes a block
    over (``Block.give``) instead of copying it."""

    #: Never grows and keeps no batch past its reuse (a kept batch keeps its own block).
    deepened, orphaned = "", 0

    def __init__(self, assembler: Assembler, layout: SlotLayout) -> None:
        self.assembler, self.layout = assembler, layout
        self.blocks: list[tuple[Block, list[weakref.ref[np.ndarray]]]] = []

    def get(self, key: tuple[int, int]) -> tuple[Fields, Report]:
        """The fields of batch ``key`` (epoch, position) and its report."""
        arrays = self.arrays()
        return arrays, self.assembler.fill(key[0], key[1], arrays)

    def arrays(self) -> Fields:
        """Arrays for one batch: large fields in a free block, small ones fresh."""
        layout = self.layout
        large = [f for f in layout.fields if layout.field_bytes(f) > COPY_BYTES]
        if not large:
            return layout.arrays()
        block = self._free_block(sum(layout.field_bytes(f) for f in large))
        out, refs, offset = {}, [], 0
        for spec in layout.fields:
            name, dtype, shape = spec
            full = (layout.batch_size, *shape)
            if spec in large:  # its base is the block itself, so every view of it pins it
                out[name] = np.ndarray(full, np.dtype(dtype), buffer=block, offset=offset)
                refs.append(weakref.ref(out[name]))
                offset += layout.field_bytes(spec)
            else:
                out[name] = np.empty(full, np.dtype(dtype))
        self.blocks.append((block, refs))
        return out

    def _free_block(self, nbytes: int) -> Block:
        """A block no handed-out array uses any more (taken off the list), else a new one;
        at most ``KEPT_BLOCKS`` are remembered (one the consumer keeps is its own)."""
        self.blocks = [(block, refs) for block, refs in self.blocks if not block.given]
        for k, (block, refs) in enumerate(self.blocks):
            if all(ref() is None for ref in refs):
                del self.blocks[k]
                return block
        if len(self.blocks) >= KEPT_BLOCKS:
            del self.blocks[0]
        # private and anonymous (a shared mapping gets no transparent huge pages); huge pages
        # as numpy asks for its large arrays: a 2 MB page faults and misses the TLB 512x less
        block = Block(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            block.madvise(mmap.MADV_HUGEPAGE)
        return block

    def prefetch_depth(self) -> int:
        """0: each batch is filled when asked."""
        return 0

    def ring(self) -> None:
        """None: batches lie in process memory, no shared ring."""
        return None

    def warming(self) -> tuple[int, float] | None:
        """None: no workers to wait for."""
        return None

    def close(self) -> None:
        """Forget the blocks (each goes when the consumer's last array of it does)."""
        self.blocks = []


class Warming(Inline):
    """Workers launched ahead (``Loader(dataset)``) that have not all started yet: each batch
    asked for meanwhile is filled here, as with ``workers=0`` (the same bytes: batch ``k`` is
    a pure function of the seed, whoever fills it), and the ring takes over at the first batch
    asked for once every worker has started. So the first batch costs one batch's loading
    here, not the workers' interpreters and imports. Which batches ran here is counted for
    ``stats()``: a ``__getitem__`` that ends its process (``os._exit``, a crash in C) ends this
    one while it runs here, as with ``workers=0``."""

    def __init__(
        self, assembler: Assembler, layout: SlotLayout, take_over: Callable[[], Engine | None]
    ) -> None:
        super().__init__(assembler, layout)
        self.take_over = take_over
        self.batches, self.seconds = 0, 0.0

    def get(self, key: tuple[int, int]) -> tuple[Fields, Report]:
        """Batch ``key`` from the ring once every worker has started, else filled here."""
        engine = self.take_over()
        if engine is not None:
            return engine.get(key)
        t0 = time.perf_counter()
        out = super().get(key)
        self.batches += 1
        self.seconds += time.perf_counter() - t0
        return out

    def warming(self) -> tuple[int, float]:
        """The batches (and seconds) filled here so far."""
        return self.batches, self.seconds


class Running:
    """What a started loader owns: pool and engine; closed by close() or the finalizer.

    ``prefetch_reason``, ``folder`` and ``started`` outlive a close, for ``stats()``."""

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.engine: Supplier | None = None
        self.pid = os.getpid()
        self._reason, self.folder = "not started", "-"
        self.started: list[StartReport] = []
        self._cluster: dict[str, Any] = {}
        self.waited_s: float | None = None  # the first batch's wait for workers launched ahead
        self.warmed: tuple[int, float] = (0, 0.0)  # batches (and seconds) filled here meanwhile
        self._depth: tuple[int, int, int, str] = (1, 1, 1, "")

    def start_inline(self, assembler: Assembler, layout: SlotLayout) -> None:
        """Load on demand in this process (``workers=0``)."""
        self.engine = Inline(assembler, layout)
        self._reason, self.folder = "none: workers=0 loads on demand", "process memory"

    def launch_pool(self, recipe: Recipe, run: RunSpec) -> None:
        """Launch ``run.workers`` processes without waiting for them: they start while the
        caller goes on; a failed launch leaves nothing."""
        layout = recipe.schema.slot_layout
        clean_stale()
        self._depth = config.prefetch(run.prefetch, run.workers, HELD, layout.nbytes)
        self._reason = self._depth[3]
        self.folder = pick_folder(self._depth[2] * layout.nbytes)
        shutdown.register(self)
        try:
            self.pool = WorkerPool(run.workers, recipe, run)
        except BaseException:
            self.close(fast=True)
            raise

    def start_pool(self, recipe: Recipe, run: RunSpec, here: Assembler | None = None) -> None:
        """Start the prefetch engine over a ring in shared memory once the workers have
        started (launched here unless :meth:`launch_pool` already did); a failed start leaves
        no worker and no segment. Workers launched ahead that are still starting: with
        ``here`` (this process's filler), batches are filled here until they have
        (:class:`Warming`); without, waited for, and ``waited_s`` is set."""
        ahead = self.pool is not None
        if not ahead:
            self.launch_pool(recipe, run)
        assert self.pool is not None
        ring = (recipe.schema.slot_layout, recipe.plan.batches(), run.timeout, recipe.source.name)
        try:
            if ahead and here is not None and not self.pool.poll_started():
                self.engine = Warming(here, ring[0], lambda: self._take_over(ring))
                return
            t0 = time.perf_counter()
            self.started = self.pool.wait_started()
            self.waited_s = time.perf_counter() - t0 if ahead else None
            self.engine = self._ring(*ring)
        except BaseException:
            self.close(fast=True)
            raise

    def _take_over(self, ring: tuple[SlotLayout, int, float, Any]) -> Engine | None:
        """For :class:`Warming`: the ring, made now that every worker has started, or None
        while one is still starting; a worker that failed to start is raised here."""
        warmed = None if self.engine is None else self.engine.warming()
        assert self.pool is not None and warmed is not None
        if not self.pool.poll_started():
            return None
        self.started = self.pool.wait_started()
        self.warmed, self.waited_s = warmed, 0.0
        self.engine = self._ring(*ring)
        return self.engine

    def _ring(self, layout: SlotLayout, batches: int, timeout: float, name: Any) -> Engine:
        """The prefetch engine over the started pool."""
        assert self.pool is not None
        per_worker, deepest, slots, _ = self._depth
        ring = RingSpec(layout, slots, per_worker, batches, self.folder, timeout, name, deepest)
        return Engine(self.pool, ring)

    def start_cluster(self, recipe: Recipe, run: RunSpec, samples: Any, probe: Any) -> None:
        """Start decode actors on ``run.cluster``'s nodes (``workers.cluster``) beside
        ``run.workers`` local processes, and the prefetch engine over both; a failed start
        leaves nothing. Each node starts its own ``WorkerPool`` from the same ``recipe`` and
        ``run``."""
        from ..workers import cluster as cluster_mod

        layout = recipe.schema.slot_layout
        clean_stale()
        shutdown.register(self)
        nodes = None
        try:
            nodes = cluster_mod.Nodes(recipe, run, probe)
            per_worker, deepest, slots, self._reason = config.prefetch(
                run.prefetch, run.workers + nodes.cores, HELD, layout.nbytes
            )
            slots += nodes.cores * cluster_mod.REMOTE_EXTRA
            self.folder = pick_folder(slots * layout.nbytes)
            local = WorkerPool(run.workers, recipe, run) if run.workers else None
            if local is not None:
                local.wait_started()
            mixed = cluster_mod.MixedPool(local, nodes)
            self.pool = mixed  # type: ignore[assignment]
            self.started = mixed.started
            ring = RingSpec(
                layout,
                slots,
                per_worker,
                recipe.plan.batches(),
                self.folder,
                run.timeout,
                recipe.source.name,
                deepest,
            )
            self.engine = cluster_mod.ClusterEngine(mixed, ring, samples)
        except BaseException:
            if nodes is not None and self.pool is None:
                nodes.close()
            self.close(fast=True)
            raise

    def here(self) -> tuple[int, float, bool]:
        """``(batches, seconds, still starting)``: the batches filled in this process while the
        workers launched ahead were starting (:class:`Warming`), and whether they still are."""
        warming = None if self.engine is None else self.engine.warming()
        if warming is not None:
            return (*warming, True)
        return (*self.warmed, False)

    def cluster_stats(self) -> dict[str, Any]:
        """The cluster's figures for ``stats()`` (kept after a close); {} without a cluster."""
        report = getattr(self.engine, "report", None)
        if report is not None:
            self._cluster = report()
        return self._cluster

    @property
    def prefetch_reason(self) -> str:
        """Why the ring has the depth it has (and when the engine deepened it)."""
        engine = self.engine
        return self._reason + (engine.deepened if engine is not None else "")

    def prefetch(self) -> int:
        """Batches prefetched ahead of the consumer (0 in-process or before the start)."""
        engine = self.engine
        return 0 if engine is None else engine.prefetch_depth()

    def close(self, fast: bool = False) -> None:
        """Stop the workers (``fast``: without waiting for them to finish a batch) and unlink
        every segment; safe to call again, or from a signal handler in the middle of a close.
        In a forked child it only forgets them: they are the parent's."""
        engine, pool = self.engine, self.pool
        self._reason = self.prefetch_reason
        self.cluster_stats()  # what the engine measured outlives it
        self.engine = self.pool = None
        shutdown.unregister(self)
        if os.getpid() != self.pid:
            if pool is not None:
                pool.forget()
            return
        if pool is not None:
            pool.close(0.2 if fast else 5.0)
        if engine is not None:
            engine.close()

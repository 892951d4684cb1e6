"""The prefetch engine: keeps batches in flight on the workers, one ring slot each, and hands
them out in order. Batches are keyed ``(epoch, batch)``; the sequence runs on across epochs, so
the pipeline stays full at an epoch boundary.

Zero copy with safe ownership: a delivered batch is a view of its slot. The engine keeps only a
weak reference; when the slot comes round again and the consumer still holds the array (kept it
in a list, say), the slot's segment is unlinked (the consumer's view stays valid) and the slot
gets a fresh segment, instead of overwriting data under the consumer's feet.

A device adapter may copy straight out of a slot (a DMA from page-locked memory): it attaches a
fence (an object with ``synchronize()``, e.g. the copy's CUDA event) with ``hold_until``, and the
slot is not reused before the fence has completed. ``watch_segments`` tells it about every
segment the ring has, now and later (to page-lock them, and to unlock them before they go).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..assemble import IN_BATCH_TRANSFORM, Report
from ..errors import WorkerHung, one_line
from ..schema import SlotLayout
from ..shm import reaper
from ..shm.segments import Segment, ShmFullError
from .errors import unpack_exception

Key = tuple[int, int]
POLL_S = 0.2
HELD = 2  # batches the consumer may hold before their slot is reused (current + previous)
COPY_BYTES = 1 << 20  # a field this small (labels, weights, indices) is handed out as a copy
IDLE_SHARE = 0.10  # workers idle for work more than this share of their fill time: deepen


class Workers(Protocol):
    """What the engine asks of the processes that fill its slots: a ``WorkerPool`` of local
    processes, or the cluster's ``MixedPool`` of local processes and nodes' cores."""

    #: One entry per worker id (the engine's count of workers).
    procs: list[Any]

    def send(self, wid: int, task: tuple) -> None:
        """Give worker ``wid`` a task ``(epoch, batch, slot, segment handle)``."""
        ...

    def receive(self, timeout: float) -> list[tuple[int, tuple]]:
        """The replies that came within ``timeout`` seconds, as ``(wid, message)``."""
        ...

    def check_alive(self, context: str) -> None:
        """Raise for a worker that died (``context`` says what it was doing)."""
        ...

    def current_sample(self, wid: int) -> int:
        """The sample worker ``wid`` is on now (-1: not known)."""
        ...


@dataclass(frozen=True)
class RingSpec:
    """The ring an engine keeps: ``slots`` slots of ``layout``'s batches in shared memory under
    ``folder``, ``per_worker`` batches in flight per worker (at most ``deepest`` once it
    deepens; None: never deeper), ``batches`` per epoch, ``timeout`` seconds for a batch, and
    ``name`` giving a sample's name for error messages."""

    layout: SlotLayout
    slots: int
    per_worker: int
    batches: int
    folder: str
    timeout: float
    name: Callable[[int], str]
    deepest: int | None = None


def idle_words(share: float) -> str:
    """A wait as a share of the fill time, readable past 100 %: "25% of", "45.7x"."""
    return f"{share:.0%} of" if share < 1 else f"{share:.1f}x"


class Depth:
    """Whether the ring is deep enough, measured: over each window of batches, the time the
    workers waited for their next task (the reply's ``idle_s``; a worker's first task, which
    waits for the start, is not counted) against their fill time, and how many of the
    consumer's gets had to wait. Workers idle while the consumer waited means a deeper ring
    would have had batches ready; workers idle while the consumer never waited means the
    consumer is the limit, and a deeper ring would only hold memory."""

    def __init__(self, workers: int) -> None:
        self.window = 4 * workers
        self.started = [False] * workers
        self.idle = self.busy = 0.0
        self.replies = self.gets = self.waits = 0

    def reply(self, wid: int, report: Report) -> None:
        """Count a worker's reply."""
        if self.started[wid]:
            self.idle, self.busy = self.idle + report.idle_s, self.busy + report.fill_s
            self.replies += 1
        self.started[wid] = True

    def get(self, waited: bool) -> None:
        """Count one of the consumer's gets (``waited``: its batch was not ready)."""
        self.gets += 1
        self.waits += waited

    def deeper(self) -> float | None:
        """At the end of a window: the workers' idle share when the ring should deepen, else
        None (and the next window starts)."""
        if self.replies < self.window:
            return None
        share = self.idle / max(self.busy, 1e-9)
        waited = self.waits * 4 >= self.gets
        self.idle = self.busy = 0.0
        self.replies = self.gets = self.waits = 0
        return share if waited and share > IDLE_SHARE else None


class Engine:
    """Schedules ``(epoch, batch)`` keys on a WorkerPool, ahead of use, into ring slots."""

    def __init__(self, pool: Workers, ring: RingSpec) -> None:
        self.pool, self.layout, self.folder = pool, ring.layout, ring.folder
        self.per_worker = ring.per_worker
        self.deepest = ring.per_worker if ring.deepest is None else ring.deepest
        self.depth = Depth(len(pool.procs))
        self.deepened = ""  # said in stats() when the ring grew
        self.batches, self.timeout, self.name = ring.batches, ring.timeout, ring.name
        self.segments = [
            Segment.create(ring.layout.nbytes, f"slot{i}", ring.folder) for i in range(ring.slots)
        ]
        self.free: deque[int] = deque(range(ring.slots))
        self.held: deque[tuple[int, Any]] = deque()
        self.scheduled: deque[Key] = deque()
        self.inflight: dict[Key, tuple[int, int]] = {}
        self.done: dict[Key, tuple[int, Report]] = {}
        self.discard: set[Key] = set()
        self.load = [0] * len(pool.procs)
        self.next_key: Key | None = None
        self.orphaned = 0
        self.fences: dict[int, Any] = {}  # slot -> what must complete before it is reused
        self.watchers: list[tuple[Callable[[Segment], None], Callable[[Segment], None]]] = []

    def get(self, key: Key) -> tuple[dict[str, np.ndarray], Report]:
        """Return batch ``key`` (waiting if needed); keeps the window ahead of it full."""
        reaper.revive()  # a killed reaper is replaced before a death of ours would need it
        if not self.scheduled or self.scheduled[0] != key:
            self._reset(key)
        self._reclaim(HELD - 1)
        self._fill_window()
        self.depth.get(key not in self.done)
        while key not in self.done:
            self._wait_one(key)
            self._fill_window()
        self.scheduled.popleft()
        slot, report = self.done.pop(key)
        return self._hand_out(slot), report

    def _hand_out(self, slot: int) -> dict[str, np.ndarray]:
        """The slot's fields: the image (and any large field) as views of the slot, watched
        so the slot is not overwritten while the consumer holds them; small fields as copies."""
        fields = self.layout.views(self.segments[slot])
        watched = []
        for name, arr in fields.items():
            if name == "image" or arr.nbytes > COPY_BYTES:
                watched.append(weakref.ref(arr))
            else:
                fields[name] = arr.copy()
        self.held.append((slot, watched))
        return fields

    def prefetch_depth(self) -> int:
        """Batches kept ready ahead of the consumer: the slots it does not hold."""
        return len(self.segments) - HELD

    def ring(self) -> Engine:
        """Itself: handed-out batches are views of its slots (see ``hold_until``)."""
        return self

    def warming(self) -> None:
        """None: its workers have started."""
        return None

    def hold_until(self, array: np.ndarray, fence: Any) -> bool:
        """Keep the slot that ``array`` (a handed-out view) lies in from reuse until
        ``fence.synchronize()`` has returned; False when ``array`` is no held slot's."""
        for slot, refs in self.held:
            if any(ref() is array for ref in refs):
                self.fences[slot] = fence
                return True
        return False

    def watch_segments(
        self, added: Callable[[Segment], None], removed: Callable[[Segment], None]
    ) -> None:
        """Call ``added`` for every slot segment now and for each new one, and ``removed``
        before one is unlinked or unmapped."""
        self.watchers.append((added, removed))
        for seg in self.segments:
            added(seg)

    def _reset(self, key: Key) -> None:
        """Drop what was scheduled (results still coming are discarded) and restart at ``key``."""
        for k in self.scheduled:
            if k in self.done:
                self.free.append(self.done.pop(k)[0])
            elif k in self.inflight:
                self.discard.add(k)
        self.scheduled.clear()
        self.next_key = key

    def _advance(self, key: Key) -> Key:
        epoch, batch = key
        return (epoch, batch + 1) if batch + 1 < self.batches else (epoch + 1, 0)

    def _fill_window(self) -> None:
        """Schedule keys while a slot is free and some worker has room."""
        while self.free and self.next_key is not None:
            wid = min(range(len(self.load)), key=self.load.__getitem__)
            if self.load[wid] >= self.per_worker:
                return
            slot, key = self.free.popleft(), self.next_key
            self.pool.send(wid, (key[0], key[1], slot, self.segments[slot].handle()))
            self.load[wid] += 1
            self.inflight[key] = (wid, slot)
            self.scheduled.append(key)
            self.next_key = self._advance(key)

    def _reclaim(self, keep: int) -> None:
        """Return consumer-held slots beyond the ``keep`` newest to the free list."""
        while len(self.held) > keep:
            slot, refs = self.held.popleft()
            fence = self.fences.pop(slot, None)
            if fence is not None:
                fence.synchronize()  # a copy still reading the slot: it finishes first
            if any(ref() is not None for ref in refs):
                self._replace(slot)
            self.free.append(slot)

    def _replace(self, slot: int) -> None:
        """The consumer still uses this slot's memory: give the slot a new segment."""
        old = self.segments[slot]
        for _, removed in self.watchers:
            removed(old)
        old.unlink()
        try:
            new = Segment.create(self.layout.nbytes, f"slot{slot}", self.folder)
        except ShmFullError:
            raise ShmFullError(old.path, self.layout.nbytes, self._kept_fix()) from None
        self.segments[slot] = new
        for added, _ in self.watchers:
            added(new)
        self.orphaned += 1

    def _kept_fix(self) -> str:
        """What to do when the batches the consumer keeps have used up the shared memory."""
        return (
            f"the training loop keeps the arrays of {self.orphaned + 1} batches it was given, and "
            "each one kept holds its own segment. Copy what you keep (images.copy()) or drop "
            f"old batches; a smaller batch_size or prefetch would not help. ({self.folder} is "
            "full with what is kept)"
        )

    def _handle_replies(self) -> bool:
        """Handle the replies that come within one poll; whether any came."""
        replies = self.pool.receive(POLL_S)
        for wid, reply in replies:
            self._handle(wid, reply)
        return bool(replies)

    def _wait_one(self, key: Key) -> None:
        """Handle replies for up to ``timeout`` seconds; liveness checked between polls."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self._handle_replies():
                return
            wid = self.inflight[key][0] if key in self.inflight else -1
            self.pool.check_alive(self._context(wid, key))
            if time.monotonic() > deadline:
                raise WorkerHung(f"no batch arrived in {self.timeout:g} s; {self._stuck(wid, key)}")

    def _stuck(self, wid: int, key: Key) -> str:
        """What worker ``wid`` is still doing, and the fix."""
        if self._in_batch_transform(wid):
            return (
                f"worker {wid} is still in batch_transform, on batch {key[1]} of epoch "
                f"{key[0]} (its samples all loaded). Check the function for a hang, or raise "
                "Loader(timeout=...) if it is that slow"
            )
        return (
            f"worker {wid} is still on {self._sample(wid)}. Raise Loader(timeout=...) if "
            "samples are that slow."
        )

    def _context(self, wid: int, key: Key) -> str:
        if wid < 0:
            return ""
        where = f"(epoch {key[0]}, batch {key[1]})"
        if self._in_batch_transform(wid):
            return f" while running batch_transform {where}; its samples had all loaded"
        return f" while loading {self._sample(wid)} {where}"

    def _in_batch_transform(self, wid: int) -> bool:
        return wid >= 0 and self.pool.current_sample(wid) == IN_BATCH_TRANSFORM

    def _sample(self, wid: int) -> str:
        index = self.pool.current_sample(wid) if wid >= 0 else -1
        return self.name(index) if index >= 0 else "its first sample"

    def _handle(self, wid: int, reply: tuple) -> None:
        """Record a worker's reply; re-raise its exception here."""
        kind, epoch, batch, slot, payload = reply
        key = (epoch, batch)
        self.load[wid] -= 1
        self.inflight.pop(key, None)
        if key in self.discard:
            self.discard.discard(key)
            self.free.append(slot)
            return
        if kind == "error":
            raise unpack_exception(payload, f"(epoch {epoch}, batch {batch})")
        self.done[key] = (slot, payload)
        self.depth.reply(wid, payload)
        if self.per_worker < self.deepest:
            share = self.depth.deeper()
            if share is not None:
                self._deepen(share)

    def _deepen(self, share: float) -> None:
        """One more batch in flight per worker: a new slot for each worker. Where the memory
        folder has no room for them (or a limit refuses them), the ring stays at its depth and
        stops trying; ``deepened`` says why."""
        added: list[Segment] = []
        try:
            for k in range(len(self.load)):
                slot = len(self.segments) + k
                added.append(Segment.create(self.layout.nbytes, f"slot{slot}", self.folder))
        except OSError as exc:
            for seg in added:
                seg.unlink()
                seg.close()
            self.deepest = self.per_worker
            self.deepened = self._not_deeper(share, exc)
            return
        self.per_worker += 1
        for seg in added:
            self.free.append(len(self.segments))
            self.segments.append(seg)
            for watch, _ in self.watchers:
                watch(seg)
        self.deepened = (
            f"; deepened to {self.per_worker} per worker: the workers waited for work "
            f"{idle_words(share)} their fill time while the consumer waited for batches"
        )

    def _not_deeper(self, share: float, exc: OSError) -> str:
        """Why the ring did not deepen although the workers waited for work."""
        need = len(self.load) * self.layout.nbytes
        return (
            f"{self.deepened}; stays at {self.per_worker} per worker: a deeper ring would have "
            f"had batches ready (the workers waited for work {idle_words(share)} their fill "
            f"time while the consumer waited), but its {need / 2**20:.1f} MiB more could not "
            f"be made in {self.folder} ({one_line(exc)}). Enlarge it or free room there"
        )

    def close(self) -> None:
        """Unlink every slot segment (the pool is closed by its owner); copies still reading
        a slot finish first."""
        self.held.clear()
        fences, self.fences = list(self.fences.values()), {}
        for fence in fences:
            fence.synchronize()
        for seg in self.segments:
            for _, removed in self.watchers:
                removed(seg)
            seg.unlink()
            seg.close()
        self.segments, self.watchers = [], []

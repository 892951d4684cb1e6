"""A batch's byte ranges of remote objects, merged into few requests and each fetched once.

``SpanReads.plan(wanted)`` is told the samples a batch reads next and where each one's bytes
are (``(index, url, start, end)``, from the plan: ``Source.plan_reads``). Ranges of the same
object are merged by ``fetchpolicy.merge_ranges`` (neighbours at most ``max_gap`` apart, spans
of at most ``max_span`` bytes): a run of a Parquet row group's images, or of tar members,
becomes one GET. ``read(index)`` then returns the sample's bytes: the first sample of a span to
be read fetches the whole span (the others of that span wait for it, never fetch it again).
Fetched spans are held for later batches, up to ``max_held`` bytes (least recently used out
first): a later sample whose bytes lie in a held span (a span's gap holds other batches'
samples) is served from it, so while the quasi-random order's window of row groups fits in
``max_held``, no byte of an object is fetched twice in an epoch. A sample the plan does not
know (a replacement for a bad one) gives None: the caller reads it alone. A span whose
request fails gives None to each of its samples as well, so each is then read (and, if it
still fails, reported) alone: one bad object costs only its own samples.

``ChunkReads`` is the other way, for a source whose objects fall into fixed spans (a Parquet
row group's images, cut at ``CHUNK_BYTES``: ``MergedReads.sample_chunks``): the spans are a
function of the stored layout alone, not of the order, so every process of a loader names the
same ones, and ``spancache`` holds each one once for all of them (the loader's worker
processes share a folder of fetched spans; one process alone keeps them in memory). The plan
of the current batch and of the ``upcoming`` ones (the next ``readahead.PLAN_AHEAD`` batches)
says which spans are needed next, and they are fetched ahead, in the order they are first
needed, on ``PREFETCH_THREADS`` threads. While the spans of two of the quasi-random order's
windows fit in the cache, no byte is fetched twice in an epoch by the processes of one machine,
and every byte fetched is decoded (a row group's bytes are its images, less its page headers).
At the start of each epoch the source is told its order and the next epoch's (``plan_epoch``):
a full cache then drops the spans needed last (``NextUses``), so over epochs of data larger
than the cache only about what does not fit is fetched again.
"""

from __future__ import annotations

import math
import mmap
import os
import queue
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from . import fetch, spancache
from .fetchpolicy import DEFAULT_MAX_GAP, DEFAULT_MAX_SPAN, Span, merge_ranges
from .spancache import LocalSpans, SharedSpans, SpanCache, SpanKey

Get = Callable[[str, int, int], bytes]
DEFAULT_MAX_HELD = 64 << 20  # bytes of fetched spans one process keeps for later batches
CHUNK_BYTES = 8 << 20  # a fixed span's most bytes (and one sample more): a row group is cut there
PREFETCH_THREADS = 8  # threads per process fetching the planned spans ahead
READERS = 4  # threads per process getting the spans samples wait for (some may be stuck)


class _Pending:
    """One span of one object: fetched once, by the first sample to ask."""

    def __init__(self, url: str, span: Span, data: bytes | None = None) -> None:
        self.url, self.span = url, span
        self.data = data
        self.failed = False
        self.lock = threading.Lock()

    def part(self, reads: SpanReads, part: tuple[int, int]) -> bytes | None:
        with self.lock:
            if self.data is None and not self.failed:
                try:
                    self.data = reads.get(self.url, self.span.start, self.span.end)
                except Exception:  # noqa: BLE001 - each sample is then read alone, and named
                    self.failed = True
                else:
                    reads.hold(self)
            data = self.data
        return None if data is None else self.span.slice_of(data, part)


class SpanReads:
    """One process's merged reads for the batch being filled; see the module docstring."""

    def __init__(
        self,
        get: Get,
        max_gap: int = DEFAULT_MAX_GAP,
        max_span: int = DEFAULT_MAX_SPAN,
        max_held: int = DEFAULT_MAX_HELD,
    ) -> None:
        self.get, self.max_gap, self.max_span, self.max_held = get, max_gap, max_span, max_held
        self._where: dict[int, tuple[_Pending, tuple[int, int]]] = {}
        self._held: OrderedDict[tuple[str, int], _Pending] = OrderedDict()
        self._held_bytes = 0
        self._lock = threading.Lock()
        self.planned = self.spans = self.reused = 0  # over the run: samples, GETs, re-served

    def plan(self, wanted: list[tuple[int, str, int, int]]) -> None:
        """Replace the plan with these samples' ``(index, url, start, end)``."""
        by_url: dict[str, list[tuple[int, int]]] = {}
        owners: dict[tuple[str, int, int], list[int]] = {}
        where: dict[int, tuple[_Pending, tuple[int, int]]] = {}
        for index, url, start, end in wanted:
            held = self._holding(url, start, end)
            if held is not None:
                where[index] = (held, (start, end))
                self.reused += 1
                continue
            by_url.setdefault(url, []).append((start, end))
            owners.setdefault((url, start, end), []).append(index)
        for url, ranges in by_url.items():
            for span in merge_ranges(ranges, self.max_gap, self.max_span):
                pending = _Pending(url, span)
                for part in span.parts:
                    for index in owners.get((url, *part), ()):
                        where[index] = (pending, part)
                self.spans += 1
        with self._lock:
            self._where = where
            self.planned += len(where)

    def _holding(self, url: str, start: int, end: int) -> _Pending | None:
        """A held span of ``url`` that covers ``[start, end)`` (most recently used first)."""
        with self._lock:
            for key in reversed(self._held):
                pending = self._held[key]
                if key[0] == url and pending.span.start <= start and end <= pending.span.end:
                    self._held.move_to_end(key)
                    return pending
        return None

    def hold(self, pending: _Pending) -> None:
        """Keep a fetched span's bytes for later batches, within ``max_held`` bytes (the least
        recently used spans are dropped first)."""
        size = pending.span.end - pending.span.start
        with self._lock:
            self._held[(pending.url, pending.span.start)] = pending
            self._held_bytes += size
            while self._held_bytes > self.max_held and len(self._held) > 1:
                _, old = self._held.popitem(last=False)
                self._held_bytes -= old.span.end - old.span.start

    def read(self, index: int) -> bytes | None:
        """Sample ``index``'s bytes out of its span, or None (not planned, or its span's
        request failed): read it alone."""
        with self._lock:
            found = self._where.pop(index, None)
        if found is None:
            return None
        pending, part = found
        return pending.part(self, part)

    def clear(self) -> None:
        """Drop the plan and every held span."""
        with self._lock:
            self._where = {}
            self._held.clear()
            self._held_bytes = 0


def fixed_spans(
    offsets: np.ndarray, lengths: np.ndarray, group_starts: np.ndarray, limit: int = CHUNK_BYTES
) -> tuple[np.ndarray, np.ndarray]:
    """One object's fixed spans, from its layout alone: the rows of each row group (rows
    ``group_starts[g]`` to ``group_starts[g + 1]``) whose bytes start within the same ``limit``
    bytes of the group's first one are one span, from the first of their bytes to the last.
    Returns each row's span number (-1: a row with no bytes, ``offsets < 0``) and the spans'
    ``(start, end)`` byte ranges, in storage order. A pure function of the layout, so every
    process names the same spans."""
    offsets = np.asarray(offsets, dtype=np.int64)
    ends = offsets + np.asarray(lengths, dtype=np.int64)
    n = len(offsets)
    span_of = np.full(n, -1, dtype=np.int64)
    valid = np.flatnonzero(offsets >= 0)
    if not len(valid):
        return span_of, np.zeros((0, 2), dtype=np.int64)
    group = np.searchsorted(np.asarray(group_starts, dtype=np.int64), valid, side="right") - 1
    first = np.full(int(group.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, group, offsets[valid])
    piece = (offsets[valid] - first[group]) // max(1, int(limit))
    keys, number = np.unique(np.stack([group, piece], axis=1), axis=0, return_inverse=True)
    number = number.reshape(-1)
    spans = np.empty((len(keys), 2), dtype=np.int64)
    spans[:, 0], spans[:, 1] = np.iinfo(np.int64).max, -1
    np.minimum.at(spans[:, 0], number, offsets[valid])
    np.maximum.at(spans[:, 1], number, ends[valid])
    span_of[valid] = number
    return span_of, spans


class SpanLate(TimeoutError):
    """A planned span did not arrive within the read's deadline (a stalled store): the
    sample is a bad one, named by its source."""


class _Wanted:
    """A span a sample's read waits for, got by one of the reading threads."""

    def __init__(self, key: SpanKey) -> None:
        self.key = key
        self.done = threading.Event()
        self.data: bytes | mmap.mmap | None = None  # None once done: its request failed


class ChunkReads:
    """One process's reads out of fixed spans held by a ``SpanCache``; see the module
    docstring. ``get(url, start, end)`` is one request. A sample whose span is not at hand
    has it got by a reading thread (``READERS`` at most: a span fetched, mapped from the
    shared folder, or waited for while a prefetch thread fetches it) and waits at most the
    process's request deadline (``fetch.fetcher().timeout``): a stalled store makes bad
    samples, never a hang, and the sample never queues behind the prefetches."""

    def __init__(self, get: Get, cache: SpanCache, threads: int = PREFETCH_THREADS) -> None:
        self.get, self.cache, self.threads = get, cache, threads
        self._where: dict[int, tuple[SpanKey, int, int]] = {}
        self._failed: set[SpanKey] = set()
        self._queued: set[SpanKey] = set()
        self._todo: queue.SimpleQueue[SpanKey] = queue.SimpleQueue()
        self._wants: queue.SimpleQueue[_Wanted] = queue.SimpleQueue()
        self._started = self._readers = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.planned = 0

    def plan(self, wanted: list[tuple[int, SpanKey, int, int]], upcoming: list[SpanKey]) -> None:
        """Replace the plan with these samples' ``(index, span, start, end)`` and fetch their
        spans ahead, then the ``upcoming`` batches' (in the order they are first needed)."""
        where = {index: (key, start, end) for index, key, start, end in wanted}
        with self._lock:
            self._where = where
            self._failed.clear()  # a span that failed for one batch is tried again
            self.planned += len(where)
        seen: set[SpanKey] = set()
        for key in [k for _, k, _, _ in wanted] + upcoming:
            if key not in seen:
                seen.add(key)
                self._ahead(key)

    def _forked(self) -> None:
        """In a forked copy (none of the parent's threads): start afresh. Under the lock."""
        if self._pid != os.getpid():
            self._pid, self._started, self._readers = os.getpid(), 0, 0
            self._queued, self._todo, self._wants = set(), queue.SimpleQueue(), queue.SimpleQueue()

    def _ahead(self, key: SpanKey) -> None:
        with self._lock:
            self._forked()
            if key in self._queued or self.cache.has(key):
                return
            self._queued.add(key)
            start = self._started < self.threads
            self._started += start
        self._todo.put(key)
        if start:
            threading.Thread(target=self._fetch_ahead, name="stoker-spans", daemon=True).start()

    def _fetch_ahead(self) -> None:
        """A prefetch thread: fetch queued spans into the cache (a failure is left to the
        samples' own reads, which then read alone and name what failed)."""
        while True:
            key = self._todo.get()
            try:
                self.cache.get(key, self._fetch)
            except Exception:  # noqa: BLE001, S110 - the samples read alone, and are named
                pass
            finally:
                with self._lock:
                    self._queued.discard(key)

    def _fetch(self, key: SpanKey) -> bytes:
        return self.get(key.url, key.start, key.end)

    def _wait_for(self, key: SpanKey) -> bytes | mmap.mmap | None:
        """The span's bytes, got by a reading thread (None: its request failed); raises
        ``SpanLate`` past the deadline."""
        wanted = _Wanted(key)
        with self._lock:
            self._forked()
            start = self._readers < READERS
            self._readers += start
        self._wants.put(wanted)
        if start:
            threading.Thread(target=self._serve, name="stoker-spans-read", daemon=True).start()
        seconds = fetch.fetcher().timeout
        if not wanted.done.wait(seconds):
            raise SpanLate(
                f"no bytes after {seconds:.0f} s (a request that never answers: a stalled "
                "server?); counted as bad"
            )
        return wanted.data

    def _serve(self) -> None:
        """A reading thread: get the spans samples wait for."""
        while True:
            wanted = self._wants.get()
            try:
                wanted.data = self.cache.get(wanted.key, self._fetch)
            except Exception:  # noqa: BLE001, S110 - None: the samples read alone
                pass
            finally:
                wanted.done.set()

    def read(self, index: int) -> bytes | None:
        """Sample ``index``'s bytes out of its span, or None (not planned, or its span's
        request failed): read it alone. Raises ``SpanLate`` past the deadline."""
        with self._lock:
            found = self._where.pop(index, None)
            if found is None or found[0] in self._failed:
                return None
        key, start, end = found
        data = self.cache.held(key)
        if data is None:
            data = self._wait_for(key)
        if data is None:  # its request failed: each sample is then read alone, and named
            with self._lock:
                self._failed.add(key)
            return None
        return bytes(data[start - key.start : end - key.start])

    def clear(self) -> None:
        """Drop the plan and the spans held at hand."""
        with self._lock:
            self._where = {}
        self.cache.clear()


class NextUses:
    """How far ahead the plan needs each fixed span next (``spancache.NextUse``), from one
    epoch's order of samples, their spans' ids, the next epoch's, and each span's id by file
    name; ``at(indices)`` moves it to the batch that starts with ``indices[0]``."""

    def __init__(
        self, order: np.ndarray, ids: np.ndarray, following: np.ndarray, names: dict[str, int]
    ) -> None:
        self.names, self.length, self.position = names, len(ids), 0
        small = np.int32 if len(ids) < 2**31 else np.int64  # positions: 4 bytes a sample
        self.sorter = np.argsort(ids, kind="stable").astype(small)  # by span, ascending
        spans, cuts = np.unique(ids[self.sorter], return_index=True)
        ends = [*cuts[1:].tolist(), len(ids)]
        self.bounds = dict(zip(spans.tolist(), zip(cuts.tolist(), ends, strict=True), strict=True))
        unique, first = np.unique(following, return_index=True)
        self.first_next = dict(zip(unique.tolist(), first.tolist(), strict=True))
        self.by_sample = np.argsort(order, kind="stable").astype(small)  # a sample's position
        self.samples = order[self.by_sample]

    def at(self, indices: np.ndarray) -> None:
        """The batch being planned starts with sample ``indices[0]``."""
        if not len(indices):
            return
        k = int(np.searchsorted(self.samples, indices[0]))
        if k < len(self.samples) and self.samples[k] == indices[0]:
            self.position = int(self.by_sample[k])

    def __call__(self, name: str) -> float:
        """Samples until span ``name`` is needed next: in this epoch, else in the next."""
        span = self.names.get(name)
        if span is None:
            return math.inf
        lo, hi = self.bounds.get(span, (0, 0))
        positions = self.sorter[lo:hi]
        k = int(np.searchsorted(positions, self.position))
        if k < len(positions):
            return float(positions[k] - self.position)
        first = self.first_next.get(span)
        return math.inf if first is None else float(self.length - self.position + first)


class MergedReads:
    """For a source whose sample is one byte range of a stored object (a Parquet shard's
    image, a tar's member): ``plan_reads`` tells the reads of the next batches, and
    ``planned(index)`` serves a sample out of its span (None: read it alone).

    Where the source's objects fall into fixed spans (``sample_chunks``; ``chunked`` true),
    the spans are fetched ahead and held once per machine (``ChunkReads``): a loader with
    workers keeps them in a private folder its worker processes share (made when the source
    is sent to them, removed at ``close``, by the reaper if the trainer dies); else a batch's
    ranges are merged into spans (``SpanReads``, neighbours at most ``merge_gap`` bytes apart).
    ``merge_gap=None``: no merging, each sample is one request.

    The source gives ``sample_range(index)`` (``(url, start, end)``, or None for a sample
    that is not one range), ``span_get(url, start, end)`` (one request), and, for fixed
    spans, ``sample_chunks(indices)``."""

    merge_gap: int | None = DEFAULT_MAX_GAP
    chunked: bool = False
    span_bytes: int = spancache.DEFAULT_LIMIT
    _spans: SpanReads | None = None
    _chunks: ChunkReads | None = None
    _span_folder: str | None = None
    _span_folder_pid = -1
    _span_folder_end: Any = None
    _next_use: NextUses | None = None
    _next_made = 0  # epochs told to plan_epoch: only the latest one's NextUses is kept

    @property
    def fetches_ahead(self) -> bool:
        """Whether planned samples' spans are fetched ahead on the source's own threads
        (``StoredReads.fetches_ahead``): fixed spans, with merging on."""
        return self.chunked and self.merge_gap is not None

    def sample_range(self, index: int) -> tuple[str, int, int] | None:
        """Where sample ``index``'s bytes are: ``(url, start, end)``, or None."""
        raise NotImplementedError

    def sample_chunks(
        self, indices: np.ndarray, only_spans: bool = False
    ) -> list[tuple[int, SpanKey, int, int]]:
        """The fixed spans holding these samples' bytes: ``(index, span, start, end)`` for each
        sample that has one (``start``/``end``: its bytes in the object), in the order given;
        with ``only_spans``, one ``(-1, span, 0, 0)`` per span, in the order first needed.
        Used only where ``chunked``."""
        raise NotImplementedError

    def span_ids(self, indices: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
        """Each sample's fixed span as a number (-1: none), and the numbers of those spans by
        file name (``SpanKey.file_name``). Used only where ``chunked``."""
        raise NotImplementedError

    def span_get(self, url: str, start: int, end: int) -> bytes:
        """One request for bytes ``[start, end)`` of ``url``."""
        raise NotImplementedError

    def plan_epoch(self, order: Any, following: Callable[[], Any]) -> None:
        """An epoch starts with samples ``order``, and ``following()`` is the next epoch's:
        the span cache then drops the spans they need last (``NextUses``) where the spans
        are fixed. Worked out on a thread of its own (about 2 s for ImageNet's 1.28 M samples
        in 1,000 shards): until it is done the previous epoch's answer holds, which already
        knows this epoch's order; a plan that cannot be made leaves the least recently used."""
        if not self.fetches_ahead:
            return
        self._next_made = made = self._next_made + 1
        args = (np.asarray(order, dtype=np.int64), np.asarray(following(), dtype=np.int64), made)
        threading.Thread(
            target=self._make_next_uses, args=args, name="stoker-spans-plan", daemon=True
        ).start()

    def _make_next_uses(self, order: np.ndarray, following: np.ndarray, made: int) -> None:
        """``plan_epoch``'s thread: the epoch's ``NextUses``, unless a later epoch's came."""
        try:
            ids, names = self.span_ids(order)
            next_ids, more = self.span_ids(following)
            uses: NextUses | None = NextUses(order, ids, next_ids, {**names, **more})
        except Exception:  # noqa: BLE001 - no plan: the least recently used go first
            uses = None
        if made != self._next_made:
            return
        self._next_use = uses
        chunks = self._chunks
        if chunks is not None:
            chunks.cache.next_use = uses

    def plan_reads(self, indices: Any, upcoming: Any = None) -> None:
        """Plan the reads of these samples (the next batch's) and of ``upcoming`` ones (the
        batches after it): into few requests, each fetched once."""
        if self.merge_gap is None:
            return
        if self.chunked:
            self._plan_chunks(indices, upcoming)
            return
        if self._spans is None:
            self._spans = SpanReads(self.span_get, max_gap=self.merge_gap)
        wanted = []
        try:
            for index in indices:
                where = self.sample_range(int(index))
                if where is not None:
                    wanted.append((int(index), *where))
        except Exception:  # noqa: BLE001 - no plan: each sample is read (and named) alone
            wanted = []
        self._spans.plan(wanted)

    def _plan_chunks(self, indices: Any, upcoming: Any) -> None:
        if self._chunks is None:
            folder = self._span_folder
            cache: SpanCache
            if folder is not None and spancache.usable_folder(folder):
                cache = SharedSpans(folder, self.span_bytes)
            else:  # one process (workers=0), or a node that cannot reach the loader's folder
                cache = LocalSpans(self.span_bytes)
            self._chunks = ChunkReads(self.span_get, cache)
            cache.next_use = self._next_use
        if self._next_use is not None:
            self._next_use.at(np.asarray(indices, dtype=np.int64))
        try:
            wanted = self.sample_chunks(np.asarray(indices, dtype=np.int64))
            ahead = (
                []
                if upcoming is None or not len(upcoming)
                else self.sample_chunks(np.asarray(upcoming, dtype=np.int64), only_spans=True)
            )
        except Exception:  # noqa: BLE001 - no plan: each sample is read (and named) alone
            wanted, ahead = [], []
        self._chunks.plan(wanted, [key for _, key, _, _ in ahead])

    def planned(self, index: int) -> bytes | None:
        """Sample ``index``'s bytes out of its planned span, or None: read it alone."""
        if self._chunks is not None:
            return self._chunks.read(index)
        return self._spans.read(index) if self._spans is not None else None

    # ------------------------------------------------------------------ the shared folder

    def span_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (the source's, being sent to worker processes) without this process's
        reads, and with the path of the span folder they share (made now, in the process that
        owns the source, when its objects fall into fixed spans)."""
        for key in ("_spans", "_chunks", "_span_folder_end", "_next_use"):
            state.pop(key, None)
        if self.chunked and self.merge_gap is not None and self._span_folder is None:
            if self._span_folder_pid in (-1, os.getpid()):
                try:
                    self._open_span_folder()
                except OSError:  # no room: each worker keeps its spans in its own memory
                    pass
        state["_span_folder"] = self._span_folder
        state["_span_folder_pid"] = self._span_folder_pid
        return state

    def _open_span_folder(self) -> None:
        path = spancache.create_folder(self.span_bytes)
        self._span_folder, self._span_folder_pid = path, os.getpid()
        self._span_folder_end = weakref.finalize(self, _remove_folder, path, os.getpid())

    def close_spans(self) -> None:
        """Drop this process's reads, and remove the span folder if this process made it."""
        if self._chunks is not None:
            self._chunks.clear()
        self._chunks = self._spans = None
        if self._span_folder is not None and self._span_folder_pid == os.getpid():
            if self._span_folder_end is not None:
                self._span_folder_end()
            else:
                _remove_folder(self._span_folder, os.getpid())
            self._span_folder, self._span_folder_end = None, None


def _remove_folder(path: str, creator: int) -> None:
    """Remove a span folder, unless this is a forked child of the process that made it."""
    if os.getpid() == creator:
        spancache.remove_folder(path)

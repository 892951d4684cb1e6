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
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .fetchpolicy import DEFAULT_MAX_GAP, DEFAULT_MAX_SPAN, Span, merge_ranges

Get = Callable[[str, int, int], bytes]
DEFAULT_MAX_HELD = 64 << 20  # bytes of fetched spans one process keeps for later batches


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


class MergedReads:
    """For a source whose sample is one byte range of a stored object (a Parquet shard's
    image, a tar's member): ``plan_reads`` merges a batch's ranges into spans (``SpanReads``,
    neighbours at most ``merge_gap`` bytes apart; ``merge_gap=None``: no merging) and
    ``planned(index)`` serves a sample out of its span (None: read it alone).

    The source gives ``sample_range(index)`` (``(url, start, end)``, or None for a sample
    that is not one range) and ``span_get(url, start, end)`` (one request). Its
    ``__getstate__`` must leave ``_spans`` out: each process makes its own."""

    merge_gap: int | None = DEFAULT_MAX_GAP
    _spans: SpanReads | None = None

    def sample_range(self, index: int) -> tuple[str, int, int] | None:
        """Where sample ``index``'s bytes are: ``(url, start, end)``, or None."""
        raise NotImplementedError

    def span_get(self, url: str, start: int, end: int) -> bytes:
        """One request for bytes ``[start, end)`` of ``url``."""
        raise NotImplementedError

    def plan_reads(self, indices: Any) -> None:
        """Merge the byte ranges of these samples (the next batch's) into few requests."""
        if self.merge_gap is None:
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

    def planned(self, index: int) -> bytes | None:
        """Sample ``index``'s bytes out of its planned span, or None: read it alone."""
        return self._spans.read(index) if self._spans is not None else None

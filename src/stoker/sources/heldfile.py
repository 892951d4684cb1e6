"""A remote Parquet file whose small columns arrive in one round of concurrent requests.

Opening a remote shard reads a few small columns of every row group (the labels, the image
paths): through a plain :class:`.store.ObjectFile` that is one request per row group, one
after the other, so a shard of 64 row groups behind 50 ms costs seconds before a batch is made.
:class:`HeldFile` is that file plus byte ranges held in memory: :meth:`HeldFile.prefetch`
fetches the column chunks a read will ask for, neighbours merged, all in flight at once, and
every read they cover is served from memory; any other read still goes to the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow.parquet as pq

from .fetchpolicy import merge_ranges
from .store import ObjectFile

IN_FLIGHT = 16  # prefetch requests in flight at once
MERGE_GAP = 8 << 10  # ranges at most this far apart are fetched as one (as pyarrow's pre-buffer)


def _chunks(pf: pq.ParquetFile, columns: Iterable[str]) -> list[tuple[int, int, int]]:
    """``(row group, start, end)`` of each chunk of ``columns`` (top-level names or dotted leaf
    paths; a name covers its nested leaves; a name the file lacks covers nothing)."""
    wanted = tuple(columns)
    md = pf.metadata
    out = []
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            path = chunk.path_in_schema
            if not any(path == w or path.startswith(w + ".") for w in wanted):
                continue
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
            out.append((g, start, start + chunk.total_compressed_size))
    return out


def column_ranges(pf: pq.ParquetFile, columns: Iterable[str]) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of the chunks of ``columns`` in every row group, merged
    by ``fetchpolicy.merge_ranges`` (neighbours at most ``MERGE_GAP`` apart)."""
    spans = [(start, end) for _, start, end in _chunks(pf, columns)]
    return [(span.start, span.end) for span in merge_ranges(spans, MERGE_GAP)]


def group_ranges(pf: pq.ParquetFile, column: str) -> list[tuple[int, int]]:
    """Per row group, the byte range from the first to the last chunk of ``column``'s leaves:
    what Parquet reads at once to read that column of the row group."""
    bounds: dict[int, tuple[int, int]] = {}
    for g, start, end in _chunks(pf, [column]):
        lo, hi = bounds.get(g, (start, end))
        bounds[g] = (min(lo, start), max(hi, end))
    return list(bounds.values())


class HeldFile(ObjectFile):
    """An :class:`.store.ObjectFile` that serves reads from ranges held in memory first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: list[tuple[int, bytes]] = []

    def hold(self, start: int, data: bytes) -> None:
        """Serve reads inside ``[start, start + len(data))`` from ``data``."""
        self._held.append((start, data))

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """Fetch ``ranges`` (``IN_FLIGHT`` requests at once, each through ``store.get``: paced,
        retried, counted) and hold them; raises what a request raised."""
        ranges = [(s, min(e, self.size)) for s, e in ranges if s < self.size]
        if not ranges:
            return

        def get(span: tuple[int, int]) -> bytes:
            return self.store.get(self.entry.url, span[0], span[1], self.entry.tag)

        with ThreadPoolExecutor(min(IN_FLIGHT, len(ranges)), "stoker-columns") as pool:
            for (start, _), data in zip(ranges, pool.map(get, ranges), strict=True):
                self.hold(start, data)

    def hold_covering(
        self, ranges: list[tuple[int, int]], start: int, end: int
    ) -> tuple[bytes, int]:
        """Bytes ``[start, end)`` in a buffer, and the file offset of its first byte: the one of
        ``ranges`` that covers them (else just them), fetched and held alone, so that a later
        read inside it comes from memory."""
        lo, hi = next(((a, b) for a, b in ranges if a <= start and end <= b), (start, end))
        data = self.store.get(self.entry.url, lo, hi, self.entry.tag)
        self._held = [(lo, data)]
        return data, lo

    def release(self) -> None:
        """Drop every held range."""
        self._held = []

    def _covering(self, want: int) -> tuple[bytes, int]:
        for start, data in self._held:
            offset = self.tell() - start
            if 0 <= offset and offset + want <= len(data):
                return data, offset
        return super()._covering(want)

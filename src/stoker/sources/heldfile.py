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

from .store import ObjectFile

IN_FLIGHT = 16  # prefetch requests in flight at once
MERGE_GAP = 8 << 10  # ranges at most this far apart are fetched as one (as pyarrow's pre-buffer)


def column_ranges(pf: pq.ParquetFile, columns: Iterable[str]) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of the chunks of ``columns`` (top-level names or
    dotted leaf paths; a name covers its nested leaves) in every row group, sorted, with
    neighbours at most ``MERGE_GAP`` apart merged."""
    wanted = tuple(columns)
    md = pf.metadata
    spans = []
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
            spans.append((start, start + chunk.total_compressed_size))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start - merged[-1][1] <= MERGE_GAP:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


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

    def release(self) -> None:
        """Drop every held range."""
        self._held = []

    def readinto(self, out: Any) -> int:
        view = memoryview(out).cast("B")
        want = min(len(view), self.size - self.tell())
        for start, data in self._held:
            offset = self.tell() - start
            if want > 0 and 0 <= offset and offset + want <= len(data):
                view[:want] = data[offset : offset + want]
                self.seek(want, 1)
                return want
        return super().readinto(out)

"""WebDataset tar shards in a bucket: the local tar source's rules (``tar.py``), read by ranges.

The tars are the ``.tar`` objects directly under a prefix (not hidden ones), one ``.tar`` URL, or
a list of them. Each tar is scanned once through ``ObjectFile`` (its member headers and small
label members, by ranged GETs of ``SCAN_BLOCK`` bytes; the image bytes between them are
skipped), with ``tar.py``'s own scan: the same samples, keys, labels, refused names. The scan
is cached under ``~/.cache/stoker/tar`` (``cachefile``'s rules) keyed on the tar's URL and
stamped with its listed size and ETag/generation, so a replaced tar is scanned again. A
sample is then read out of its batch's merged span (a run of members at most ``merge_gap``
bytes apart is one GET: ``sources.spans``), else with one ranged GET of its image member; both
of the tar's listed version (a tar replaced since is ``ObjectChanged``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .spans import MergedReads
from .store import Entry, ObjectFile, Store, shown
from .tar import CACHE_VERSION, Sample, TarSource, _cache_file, _scan, cached_scan

SCAN_BLOCK = 256 << 10  # bytes one GET of a scan reads from a member's header onwards


class BucketTarSource(MergedReads, TarSource):
    """WebDataset ``.tar`` objects in a bucket; see the module docstring."""

    read_ahead_max = 64

    def __init__(self, store: Store, tars: list[Entry], cache_dir: Any = None) -> None:
        self.store = store
        self._tar_objects = tars
        super().__init__([e.url for e in tars], cache_dir)

    def _list(self, tars: Any) -> list[str]:
        return list(tars)

    def _scan_one(self, t: int, path: str, cache: Path) -> tuple[list[Sample], list[str], str]:
        entry = self._tar_objects[t]
        stamp: list[Any] = [CACHE_VERSION, entry.size, entry.tag]

        def scan() -> tuple[list[Sample], list[str]]:
            with ObjectFile(self.store, entry, SCAN_BLOCK) as f:
                return _scan(shown(path), f)

        where = _cache_file(cache, shown(path))
        samples, refused = cached_scan(where, stamp, scan, lambda: bool(entry.tag))
        return samples, refused, f"{entry.size}|{entry.tag}"

    def _tar_size(self, t: int) -> int:
        return self._tar_objects[t].size

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_spans", None)  # each process merges its own reads
        return state

    def sample_range(self, index: int) -> tuple[str, int, int] | None:
        """The image member's bytes in its tar: ``(url, start, end)``."""
        entry = self._tar_objects[int(self.tar_ids[index])]
        offset = int(self.offsets[index])
        return entry.url, offset, offset + int(self.sizes[index])

    def span_get(self, url: str, start: int, end: int) -> bytes:
        """One ranged GET of a run of members of tar ``url`` (of its listed version)."""
        tag = next(e.tag for e in self._tar_objects if e.url == url)
        return self.store.get(url, start, end, tag)

    def read(self, index: int) -> bytes:
        """The image member's bytes: out of its batch's merged span (a run of members is one
        GET: ``sources.spans``), else one ranged GET of the tar's listed version."""
        planned = self.planned(index)
        if planned is not None:
            return planned
        entry = self._tar_objects[int(self.tar_ids[index])]
        offset, size = int(self.offsets[index]), int(self.sizes[index])
        return self.store.get(entry.url, offset, offset + size, entry.tag)

    def forget(self, index: int) -> bool:
        """Nothing to drop: ranges read over the network leave no pages in the page cache."""
        return False

    def name(self, index: int) -> str:
        """``s3://bucket/shard.tar:member/name.jpg`` (no credential in the URL)."""
        url = self.tars[int(self.tar_ids[index])]
        return f"{shown(url)}:{self.index.relative(index)}"

    def close(self) -> None:
        """Drop this process's client (no descriptor is open)."""
        self.store.close()

"""Parquet shards on remote storage, through fsspec: ``https://``, ``s3://``, ``gs://``, any URL.

``RemoteShardSource(url)`` reads the same shards as ``ShardSource`` (``stoker convert``'s output,
or foreign Parquet), stored anywhere fsspec reaches (``pip install 'stoker[remote]'``; S3 and GCS
also need ``s3fs`` / ``gcsfs``). The shard list comes from ``stoker-manifest.json`` at the URL
root; HTTP(S) has no directory listing, so there the manifest is required. Other filesystems
fall back to listing ``*.parquet``. A URL ending in ``.parquet`` is one shard.

Each shard's byte-offset index is built once, by the same code as a local shard's
(``shardindex.locate_values``, fed one ranged read per column chunk instead of a memory map),
and cached under ``cache_dir`` (default ``~/.cache/stoker/index``)/<hash of the URL>, keyed by
the shard's size and checksum (the manifest's sha256, else the store's ETag). ``read(i)`` is
then served out of a fixed span: a row group's images (cut at ``spans.CHUNK_BYTES``) are one
GET, planned from the batch being filled and the next ones (``plan_reads``), fetched ahead and
held once for all the loader's worker processes (``sources.spans.ChunkReads``,
``sources.spancache``), while ``SPAN_WINDOW`` row groups' spans fit in the span cache; larger
row groups fall back to merging each batch's neighbouring images (at most ``merge_gap`` bytes
apart, default 256 KiB) into one GET (``sources.spans.SpanReads``). ``merge_gap=None`` reads
each image with one ranged request of its own. Every request goes through ``Store.get``
(paced by the rate ceiling, retried, counted: ``sources.fetch``).

Read-ahead is the one every local source has (``sources.readahead``): a window of upcoming
samples' ``read(i)`` calls in flight on threads, sized from the measured latency against the
decode time; a request's latency is far longer than a disk's, so this source lets the window
grow to ``read_ahead_max`` (default 64) requests per worker, still within the window's cap on
bytes held. Each request has its own deadline (``timeout``, enforced on the wait as well as in
the HTTP client), and the window's per-read deadline holds on top of that: a network failure
or a request that never answers is an ``OSError`` naming the URL (the loader counts it as a bad
sample) and never blocks the other samples. Shards whose images are compressed are read a row
group at a time through an fsspec file, as ``ShardSource`` does locally (one at a time: no
read-ahead).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DecodeError, ObjectChanged, SourceError, one_line
from .base import cache_folder
from .fetchpolicy import DEFAULT_MAX_GAP
from .heldfile import HeldFile, column_ranges, group_ranges
from .hfpaths import refuse_remote_path_rows
from .listing import listed, note
from .parquet_targets import label_names
from .shardindex import (
    HEADER_ROWS,
    cache_index,
    cache_path,
    index_valid,
    layout_key,
    locate_values,
    missing_rows,
    trusted_cached,
)
from .shards import MANIFEST, ShardSource
from .spancache import SpanKey
from .spans import CHUNK_BYTES, MergedReads, SpanLate, SpanReads, fixed_spans
from .store import (
    DEFAULT_TIMEOUT,
    LISTING_TTL,
    Entry,
    directly_under,
    is_url,
    open_store,
    shown,
)

__all__ = ["RemoteShardSource", "is_url", "READ_AHEAD_MAX", "DEFAULT_TIMEOUT"]

READ_AHEAD_MAX = 64  # requests in flight per worker the auto window may grow to
SPAN_WINDOW = 16  # row groups whose spans are read at once: two windows of order.block_order
_HTTP = ("http", "https")


class RemoteShardSource(MergedReads, ShardSource):
    """Parquet shards behind an fsspec URL; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        image_column: str = "image",
        label_column: str | list[str] | None = None,
        cache_dir: str | os.PathLike | None = None,
        storage_options: dict[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        read_ahead_max: int = READ_AHEAD_MAX,
        merge_gap: int | None = DEFAULT_MAX_GAP,
        listing: list[Entry] | None = None,
        listing_ttl: float = LISTING_TTL,
    ) -> None:
        self.store = open_store(url, storage_options, timeout, listing_ttl)
        self._listing = listing  # the prefix's objects, when the caller listed them already
        if listing is not None:
            note(self.store, url)
        self.url = url.rstrip("/")
        self.protocol = self.store.protocol
        if (
            isinstance(read_ahead_max, bool)
            or not isinstance(read_ahead_max, int)
            or (read_ahead_max < 1)
        ):
            raise SourceError(
                f"read_ahead_max={read_ahead_max!r}: give the most requests in flight per "
                f"worker, a positive int (default {READ_AHEAD_MAX})"
            )
        self.read_ahead_max = read_ahead_max
        self.merge_gap = merge_gap
        self.access = "remote"
        self.path_rows = []  # a bucket's rows never name local files (refused at the scan)
        self.image_column, self.label_column = image_column, label_column
        self._cache_dir = cache_folder(cache_dir, "index")
        self._reset()
        entries, manifest = self._list()
        self.files = [e[0] for e in entries]
        self._entries = entries
        self._objects = self._stored(entries)
        self._sizes: list[int] = []
        self._scan(self.files, manifest, self.url)
        del self._scanned  # the last shard's file: scanning only, never sent to workers
        self._listing = None  # not sent to workers: each shard's entry is kept
        self.chunked = self._fits_in_spans()
        self.close()  # the main process's handles are not needed until read()

    # ------------------------------------------------------------------ setup

    @contextmanager
    def _reading(self, name: str) -> Iterator[None]:
        """A network or Parquet error reading shard ``name`` is a SourceError naming it."""
        try:
            yield
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"{shown(name)}: cannot read ({one_line(exc)})") from None

    def _open_shard(self, k: int, url: str, manifest: dict | None) -> pq.ParquetFile:
        """Shard ``k`` through fsspec, checked against the size the manifest or listing gave."""
        size, actual = self._entries[k][1], self._objects[k].size
        if actual != size:
            raise SourceError(
                f"{shown(url)}: {actual} bytes, the manifest says {size}; the shard "
                "changed since conversion: upload the matching manifest or convert again"
            )
        pf, handle = self._open_parquet(k)
        self._files_open.append(handle)
        self._scanned: HeldFile = handle  # the shard being scanned (``_scan``)
        self._sizes.append(actual)
        return pf

    def _shard_index(
        self, k: int, url: str, pf: pq.ParquetFile, manifest: dict | None
    ) -> str | None:
        """Shard ``k``'s cached offset index (built if missing or stale), or None. Its rows
        without image bytes are the only ones whose paths are read to refuse them; with no
        index every row group's image column is read for that."""
        version = f"{self._entries[k][2]}|{self._objects[k].tag}"
        try:
            index = self._remote_index(k, url, pf, self._sizes[k], version)
            empty = None if index is None else missing_rows(index)
            if empty is not None and len(empty):  # their paths, if the column has a path
                self._scanned.prefetch(column_ranges(pf, [f"{self.image_column}.path"]))
            refuse_remote_path_rows(pf, url, self.image_column, empty)
        finally:
            self._scanned.release()
        return index

    def _labels(self, pf: pq.ParquetFile, where: str = "") -> np.ndarray | list[Any]:
        """The shard's target, its columns' chunks fetched in one round of requests."""
        names = [n for n in label_names(self.label_column)[0] if n in pf.schema_arrow.names]
        self._scanned.prefetch(column_ranges(pf, names))
        try:
            return super()._labels(pf, where)
        finally:
            self._scanned.release()

    def _list(self) -> tuple[list[tuple[str, int, str]], dict | None]:
        """(url, size, checksum or ETag) of every shard, and the manifest when there is one."""
        if self.url.lower().endswith(".parquet"):
            return [tuple(self.store.head(self.url))], None  # type: ignore[list-item]
        where = f"{self.url}/{MANIFEST}"
        raw: bytes | None
        try:
            raw = self.store.get(where)
        except FileNotFoundError:
            raw = None
        except OSError as exc:
            raise SourceError(f"{exc}; check the URL, the network and credentials") from None
        if raw is not None:
            return _manifest_entries(self.url, where, raw)
        if self.protocol in _HTTP:
            raise SourceError(
                f"{shown(where)}: not found. HTTP has no directory listing, so a remote folder of "
                f"shards needs the {MANIFEST} that `stoker convert` writes: upload it next to "
                "the shards (or pass the URL of one .parquet file)"
            )
        entries = [tuple(e) for e in directly_under(self._listed(), self.url, ".parquet")]
        if not entries:
            raise SourceError(f"{shown(self.url)}: no {MANIFEST} and no .parquet files")
        return entries, None  # type: ignore[return-value]

    def _listed(self) -> list[Entry]:
        """The objects under the URL, listed once."""
        if self._listing is None:
            self._listing = listed(self.store, self.url)
        return self._listing

    def _stored(self, entries: list[tuple[str, int, str]]) -> list[Entry]:
        """Each shard as the store has it now (size, and the version tag every read must
        still match): the listing's, or one listing of the folder when the shards came from a
        manifest. HTTP has no listing: there the manifest's sizes are taken, reads unchecked."""
        if self.protocol in _HTTP:
            return [Entry(url, size, "") for url, size, _ in entries]
        if len(entries) == 1 and entries[0][0] == self.url:
            return [self.store.head(self.url)]
        known = {e.url: e for e in self._listed()}
        if any(url not in known or known[url].size != size for url, size, _ in entries):
            # a cached listing older than the manifest (converted again since): list again
            self._listing = listed(self.store, self.url, fresh=True)
            known = {e.url: e for e in self._listing}
        missing = [url for url, _, _ in entries if url not in known]
        if missing:
            raise SourceError(
                f"{shown(self.url)}: {len(missing)} shard(s) listed in {MANIFEST} are missing, "
                f"first {shown(missing[0])}; upload them or convert again"
            )
        return [known[url] for url, _, _ in entries]

    def _open_parquet(self, k: int) -> tuple[pq.ParquetFile, Any]:
        """A ParquetFile reading shard ``k`` through the store, and its file."""
        f = HeldFile(self.store, self._objects[k])
        try:
            return pq.ParquetFile(f), f
        except (pa.ArrowException, OSError, ValueError) as exc:
            if isinstance(exc, ObjectChanged):
                raise
            raise SourceError(
                f"{shown(f.entry.url)}: not a readable Parquet file ({one_line(exc)})"
            ) from None

    def _remote_index(
        self, k: int, url: str, pf: pq.ParquetFile, size: int, tag: str
    ) -> str | None:
        """Path of a valid cached offset index for shard ``k`` at ``url`` (built if missing or
        stale: keyed on its size, checksum and store version ``tag``), or None when the image
        bytes are not stored verbatim."""
        key = int.from_bytes(
            hashlib.blake2b(f"{size}|{tag}".encode(), digest_size=7).digest(), "little"
        )
        column = self._value_path(pf)
        header = ((size, key), (layout_key(pf, column), pf.metadata.num_rows))
        folder, name = shown(url).rsplit("/", 1)
        path = cache_path(self._cache_dir, folder, name)
        trusted = trusted_cached(path)
        if trusted is not None and index_valid(trusted, header):
            return str(trusted)
        # each chunk is fetched with its neighbours of the same column (a struct's leaves),
        # which is how Parquet reads them next: from memory
        whole = group_ranges(pf, self.image_column)
        offsets = locate_values(
            url, pf, column, fetch=lambda start, end: self._scanned.hold_covering(whole, start, end)
        )
        if offsets is None:
            return None
        written = cache_index(path, header, offsets)
        if written is None:
            raise SourceError(
                f"{shown(url)}: cannot write its byte-offset index under {self._cache_dir} (not "
                "writable, or not a folder of yours alone: see the warning above); pass "
                "cache_dir= a folder of your own"
            )
        return str(written)

    def _make_digest(self, manifest: dict | None) -> str:
        """The same digest a local ShardSource gives for the same shards (so a resume can
        move between local and remote copies)."""
        h = hashlib.blake2b(digest_size=12)
        for k, url in enumerate(self.files):
            sha = manifest["shards"][k].get("sha256", "") if manifest else ""
            h.update(f"{url.rsplit('/', 1)[-1]}|{self._sizes[k]}|{sha}\0".encode())
        h.update(self.starts.tobytes())
        h.update(self.labels.tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------ per-process handles

    def _reset(self) -> None:
        super()._reset()
        self._tables: dict[int, np.ndarray] = {}
        self._files_open: list[Any] = []
        self._spans: SpanReads | None = None
        self._fixed: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in ("_tables", "_files_open", "_fixed", "_scanned"):
            state.pop(key, None)
        return self.span_state(state)

    def close(self) -> None:
        """Close this process's open remote files and drop its filesystem (and, in the
        process that sent the source to workers, remove their shared folder of spans)."""
        self.close_spans()
        for f in self._files_open:
            try:
                f.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead connection
                pass
        self._reset()

    def _filesystem(self) -> Any:
        """This process's fsspec filesystem (the store's: made per process)."""
        return self.store.filesystem()

    def _table(self, shard: int) -> np.ndarray:
        table = self._tables.get(shard)
        if table is None:
            table = np.load(self.index_files[shard], mmap_mode="r", allow_pickle=False)
            self._tables[shard] = table
        return table

    def _parquet_reader(self, shard: int) -> pq.ParquetFile:
        pf, handle = self._open_parquet(shard)
        self._files_open.append(handle)
        return pf

    def _fits_in_spans(self) -> bool:
        """Whether samples are read out of fixed spans (a row group's images, cut at
        ``CHUNK_BYTES``): every image stored verbatim, and the spans of ``SPAN_WINDOW`` row
        groups (two windows of the quasi-random order, ``order.block_order``) fit in the span
        cache, so no span is dropped before its last sample of the epoch is read."""
        if self.merge_gap is None or not self.modes or any(self.modes):
            return False
        largest = 0
        for shard in range(len(self.files)):
            rows = self._table(shard)[HEADER_ROWS:]
            starts = self._group_starts[shard]
            for g in range(len(starts) - 1):
                part = rows[starts[g] : starts[g + 1]]
                kept = part[part[:, 0] >= 0]
                if len(kept):
                    size = int((kept[:, 0] + kept[:, 1]).max() - kept[:, 0].min())
                    largest = max(largest, min(size, CHUNK_BYTES + int(kept[:, 1].max())))
        self._tables = {}
        return largest * SPAN_WINDOW <= self.span_bytes

    def _fixed_spans(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        found = self._fixed.get(shard)
        if found is None:
            rows = self._table(shard)[HEADER_ROWS:]
            found = fixed_spans(rows[:, 0], rows[:, 1], self._group_starts[shard])
            self._fixed[shard] = found
        return found

    # ------------------------------------------------------------------ reading

    def sample_chunks(
        self, indices: np.ndarray, only_spans: bool = False
    ) -> list[tuple[int, SpanKey, int, int]]:
        """The fixed spans (a row group's images, or a part of them) holding these samples'
        image bytes (``MergedReads.sample_chunks``); a null image has none."""
        indices = np.asarray(indices, dtype=np.int64)
        shard, row, number = self._span_numbers(indices)
        offset = np.zeros(len(indices), dtype=np.int64)
        end = np.zeros(len(indices), dtype=np.int64)
        for k, mine in [] if only_spans else _by_shard(shard):
            pairs = np.asarray(self._table(k)[row[mine] + HEADER_ROWS], dtype=np.int64)
            offset[mine], end[mine] = pairs[:, 0], pairs[:, 0] + pairs[:, 1]
        if only_spans:  # each span once, in the order first needed
            _, first = np.unique(shard * (1 << 32) + number, return_index=True)
            picked = np.sort(first)
            return [
                (-1, self._span_key(int(shard[i]), int(number[i])), 0, 0)
                for i in picked.tolist()
                if number[i] >= 0
            ]
        return [
            (
                int(indices[i]),
                self._span_key(int(shard[i]), int(number[i])),
                int(offset[i]),
                int(end[i]),
            )
            for i in range(len(indices))
            if number[i] >= 0
        ]

    def span_ids(self, indices: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
        """Each sample's fixed span as one number (its shard and its span in it), and those
        numbers by the spans' file names (``MergedReads.span_ids``)."""
        shard, _, number = self._span_numbers(np.asarray(indices, dtype=np.int64))
        ids = np.where(number >= 0, (shard << 32) + number, -1)
        names = {
            self._span_key(int(i) >> 32, int(i) & 0xFFFFFFFF).file_name(): int(i)
            for i in np.unique(ids[ids >= 0]).tolist()
        }
        return ids, names

    def _span_numbers(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each sample's shard, row in it and fixed span in it (-1: a null image has none)."""
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        row = indices - self.starts[shard]
        number = np.full(len(indices), -1, dtype=np.int64)
        for k, mine in _by_shard(shard):
            number[mine] = self._fixed_spans(k)[0][row[mine]]
        return shard, row, number

    def _span_key(self, shard: int, number: int) -> SpanKey:
        start, end = (int(v) for v in self._fixed_spans(shard)[1][number])
        return SpanKey(self.files[shard], start, end, self._objects[shard].tag)

    def span_get(self, url: str, start: int, end: int) -> bytes:
        """One request for a merged span of shard ``url`` (of the listed version)."""
        return self.store.get(url, start, end, self._objects[self.files.index(url)].tag)

    def sample_range(self, index: int) -> tuple[str, int, int] | None:
        """Sample ``index``'s image bytes in its shard (None: compressed, or a null)."""
        shard, row = self.locate(index)
        if self.modes[shard] != 0:
            return None
        offset, length = (int(v) for v in self._table(shard)[row + HEADER_ROWS])
        return (self.files[shard], offset, offset + length) if offset >= 0 else None

    def read(self, index: int) -> bytes:
        """The encoded image bytes of sample ``index``: out of its planned span (one request
        for a run of neighbours), else one ranged request of its own."""
        shard, row = self.locate(index)
        if self.modes[shard] != 0:
            try:
                return self._read_group(shard, row, index)
            except (DecodeError, OSError):
                raise
            except Exception as exc:  # noqa: BLE001
                raise OSError(f"{self.name(index)}: {one_line(exc)}") from None
        offset, length = (int(v) for v in self._table(shard)[row + HEADER_ROWS])
        if offset < 0:
            raise DecodeError(f"{self.name(index)}: no image bytes (null)")
        try:
            planned = self.planned(index)
        except SpanLate as exc:
            raise OSError(f"{self.name(index)}: {exc}") from None
        if planned is not None:
            return planned
        return self.store.get(self.files[shard], offset, offset + length, self._objects[shard].tag)

    def name(self, index: int) -> str:
        """``s3://bucket/shard-00003.parquet[row 17]`` (no credential in the URL)."""
        shard, row = self.locate(index)
        return f"{shown(self.files[shard])}[row {row}]"

    def forget(self, index: int) -> bool:
        """Nothing to drop: network reads leave no pages of the shard in the page cache."""
        return False


# ---------------------------------------------------------------------------- helpers


def _manifest_entries(url: str, where: str, raw: bytes) -> tuple[list[tuple[str, int, str]], dict]:
    """(url, size, sha256) of every shard a stoker manifest lists, and the manifest."""
    try:
        manifest = json.loads(raw)
        entries = [
            (f"{url}/{s['file']}", int(s["bytes"]), str(s.get("sha256") or ""))
            for s in manifest["shards"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{shown(where)}: not a stoker manifest ({one_line(exc)})") from None
    if not entries:
        raise SourceError(f"{shown(where)}: lists no shards")
    return entries, manifest


def _by_shard(shard: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each shard among ``shard`` (one per sample) with the positions of its samples: one
    sort, not one pass over all samples per shard."""
    order = np.argsort(shard, kind="stable")
    shards, cuts = np.unique(shard[order], return_index=True)
    return list(zip(shards.tolist(), np.split(order, cuts[1:]), strict=True))

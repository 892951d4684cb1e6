"""The byte-offset index of a Parquet shard: where each image's bytes sit inside the file.

Where a shard's image column is stored uncompressed without a dictionary (PLAIN), every image
sits verbatim in the file, and reading one is a single positioned read of (offset, length).
This module owns that index: finding every value in the file (``locate_values``, from a local
memory map or from ranged reads of a remote shard), checking a stored index against its shard
(``index_valid``), writing one (``write_index``), and where a local shard's index lives
(``local_index``: next to the shard, or under the cache folder when that folder is read-only;
``cache_path`` names the cached copy, for remote shards too).

The stored index is an int64 ``.npy`` array of shape ``(rows + 2, 2)``: ``[MAGIC, VERSION]``,
then the shard's stamp (a local shard's ``[size, mtime_ns]``, a remote one's ``[size, key of its
checksum]``: a mismatch means the shard changed and the index is rebuilt), then one
``[offset, length]`` per row (``[-1, 0]`` for a missing image).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._compat import file_sha256
from ..errors import SourceError

MAGIC = 0x5354_4B49_4458  # "STKIDX"
INDEX_VERSION = 1
_NEEDLE = 64  # bytes of each value searched for when locating it


def local_index(
    path: str, pf: pq.ParquetFile, column: str, cache_dir: Path, sha: str | None = None
) -> str | None:
    """Path of a valid index of ``column`` for the local shard ``path`` (built if missing or
    stale); None when the image bytes are not stored verbatim (compressed or
    dictionary-encoded). ``sha``, the manifest's checksum, is checked before building."""
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns)
    folder = os.path.dirname(os.path.abspath(path))
    beside = f"{path}.idx.npy"
    cached = str(cache_path(cache_dir, folder, os.path.basename(path)))
    places = [beside, cached] if _writable(folder) else [cached, beside]
    for candidate in places:
        if index_valid(candidate, stamp, pf.metadata.num_rows):
            return candidate
    offsets = locate_values(path, pf, column)
    if offsets is None:
        return None
    if sha and sha256(path) != sha:
        raise SourceError(
            f"{path}: sha256 differs from the manifest; the shard is damaged or was "
            "replaced: convert again or restore it"
        )
    for candidate in places:
        try:
            write_index(candidate, stamp, offsets)
            return candidate
        except OSError:
            continue
    raise SourceError(f"{path}: cannot write its byte-offset index anywhere")


def cache_path(cache_dir: Path, folder: str, name: str) -> Path:
    """Where the index of shard ``name`` in ``folder`` (a path or a URL) is kept in the cache."""
    key = hashlib.blake2b(folder.encode("utf-8", "surrogateescape"), digest_size=8)
    return Path(cache_dir) / key.hexdigest() / f"{name}.idx.npy"


def _writable(folder: str) -> bool:
    return os.access(folder, os.W_OK)


def index_valid(candidate: str | os.PathLike, stamp: tuple[int, int], rows: int) -> bool:
    """True when ``candidate`` is an offset index of ``rows`` rows stamped with ``stamp``."""
    try:
        table = np.load(candidate, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return False
    return (
        table.dtype == np.int64
        and table.ndim == 2
        and table.shape == (rows + 2, 2)
        and tuple(table[0]) == (MAGIC, INDEX_VERSION)
        and tuple(table[1]) == stamp
    )


def write_index(path: str | os.PathLike, stamp: tuple[int, int], offsets: np.ndarray) -> None:
    """Store ``offsets`` (one ``[offset, length]`` per row) stamped with ``stamp`` at ``path``,
    atomically (a temporary file, then a rename); OSError if the folder is not writable."""
    table = np.empty((len(offsets) + 2, 2), dtype=np.int64)
    table[0] = (MAGIC, INDEX_VERSION)
    table[1] = stamp
    table[2:] = offsets
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        np.save(f, table, allow_pickle=False)
    os.replace(tmp, path)


def locate_values(
    path: str,
    pf: pq.ParquetFile,
    column: str,
    fetch: Callable[[int, int], bytes] | None = None,
) -> np.ndarray | None:
    """(offset, length) of every value of ``column`` inside the file, or None if they are not
    stored verbatim. PLAIN byte arrays are a 4-byte little-endian length then the bytes; each is
    found from its length and first bytes, searching forward within its column chunk, and then
    compared in full with the value pyarrow reads. ``fetch(start, end)``, when given, returns
    those bytes of the file (a remote shard: one ranged read per column chunk); otherwise the
    local file at ``path`` is memory-mapped."""
    if fetch is not None:
        return _locate_in(pf, column, lambda start, end: (fetch(start, end), start))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return _locate_in(pf, column, lambda start, end: (mm, 0))


def _locate_in(
    pf: pq.ParquetFile, column: str, chunk_bytes: Callable[[int, int], tuple[Any, int]]
) -> np.ndarray | None:
    """The body of ``locate_values``: ``chunk_bytes(start, end)`` gives a buffer holding the
    file's bytes ``start:end`` and the file offset of the buffer's first byte."""
    md = pf.metadata
    names = [md.schema.column(c).path for c in range(md.num_columns)]
    if column not in names:
        return None
    col = names.index(column)
    chunks = [md.row_group(g).column(col) for g in range(md.num_row_groups)]
    if any(c.compression != "UNCOMPRESSED" or c.has_dictionary_page for c in chunks):
        return None
    out = np.empty((md.num_rows, 2), dtype=np.int64)
    row = 0
    for g, chunk in enumerate(chunks):
        cursor = chunk.data_page_offset
        end = cursor + chunk.total_compressed_size
        mm, base = chunk_bytes(cursor, end)
        values = pf.read_row_group(g, columns=[column.split(".")[0]]).column(0)
        values = values.combine_chunks()
        if pa.types.is_struct(values.type):
            values = values.field("bytes")
        for value in values.to_pylist():
            if value is None:
                out[row] = (-1, 0)
                row += 1
                continue
            found = _find(mm, value, cursor - base, end - base)
            if found < 0:
                return None
            out[row] = (found + base, len(value))
            cursor = found + base + len(value)
            row += 1
    return out if row == md.num_rows else None


def _find(mm: Any, value: bytes, start: int, end: int) -> int:
    """Offset of ``value``'s bytes stored as a PLAIN byte array in ``mm[start:end]``, or -1."""
    needle = struct.pack("<I", len(value)) + value[:_NEEDLE]
    pos = mm.find(needle, start, end)
    while pos >= 0:
        begin = pos + 4
        if mm[begin : begin + len(value)] == value:
            return begin
        pos = mm.find(needle, pos + 1, end)
    return -1


def sha256(path: str) -> str:
    """The hex sha256 of a local file (checked against a manifest's before indexing)."""
    with open(path, "rb") as f:
        return file_sha256(f)

"""The byte-offset index of a Parquet shard: where each image's bytes sit inside the file.

Where a shard's image column is stored uncompressed without a dictionary (PLAIN), every image
sits verbatim in the file, and reading one is a single positioned read of (offset, length).
This module owns that index: finding every value in the file (``locate_values``, from a local
memory map or from ranged reads of a remote shard), checking a stored index against its shard
(``index_valid``), writing one (``write_index``), and where a local shard's index lives
(``local_index``; ``cache_path`` names the cached copy, for remote shards too).

Where an index lives, and when one is trusted (nothing another user could have written is):

- beside the shard, as ``<shard>.idx.npy``, only when the shard's folder is this user's and no
  one else can write it (nor any folder above it, unless sticky); it is written there with the
  shard's own read permissions, so whoever may read the shard may use it;
- otherwise in this user's private cache (``cache_dir``, default ``~/.cache/stoker/index``, mode
  0700, files 0600; see :mod:`.cachefile`);
- an index beside a shard is used only when it is owned by this user or by the shard's owner,
  no group or other user can write it, and its folder lets no one else swap it; one in the
  cache only when it is this user's. Anything else is ignored with a warning naming it, and
  the index is rebuilt in the cache. Ownership is what makes an index trustworthy (a planted
  index can be consistent with its shard and still give every row another image); the content
  check below catches a shard that changed under an index, not a forger.

The stored index is an int64 ``.npy`` array of shape ``(rows + HEADER_ROWS, 2)``: ``[MAGIC,
VERSION]``, then the shard's stamp (a local shard's ``[size, mtime_ns]``, a remote one's ``[size,
key of its checksum]``), then ``[layout key, rows]`` (a hash of the image column's chunk offsets
and sizes and the row counts, from the shard's footer), then one ``[offset, length]`` per row
(``[-1, 0]`` for a missing image). A mismatch of any header row means the shard changed, and so
does an offset outside the file or, for a local shard, a first or last value whose 4-byte length
prefix in the shard is not its length: the index is rebuilt.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._compat import file_sha256
from ..errors import SourceError
from . import cachefile

MAGIC = 0x5354_4B49_4458  # "STKIDX"
INDEX_VERSION = 2
HEADER_ROWS = 3  # magic + version, the shard's stamp, its layout key + rows; then one per row
_NEEDLE = 64  # bytes of each value searched for when locating it


def local_index(
    path: str, pf: pq.ParquetFile, column: str, cache_dir: Path, sha: str | None = None
) -> str | None:
    """Path of a valid, trusted index of ``column`` for the local shard ``path`` (built if
    missing, stale or not to be trusted); None when the image bytes are not stored verbatim
    (compressed or dictionary-encoded). ``sha``, the manifest's checksum, is checked before
    building."""
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns)
    header = (stamp, (layout_key(pf, column), pf.metadata.num_rows))
    folder = os.path.dirname(os.path.abspath(path))
    beside = f"{path}.idx.npy"
    cached = cache_path(cache_dir, folder, os.path.basename(path))
    # this user's alone (and writable): the index may go there
    own = cachefile.folder_problem(folder) is None and _writable(folder)
    trusted: str | Path | None
    for candidate in [beside, cached] if own else [cached, beside]:
        if candidate == beside:
            trusted = _trusted_beside(beside, st.st_uid)
        else:
            trusted = trusted_cached(cached)
        if trusted is not None and index_valid(trusted, header, path):
            return str(trusted)
    offsets = locate_values(path, pf, column)
    if offsets is None:
        return None
    if sha and sha256(path) != sha:
        raise SourceError(
            f"{path}: sha256 differs from the manifest; the shard is damaged or was "
            "replaced: convert again or restore it"
        )
    if own:
        try:
            write_index(beside, header, offsets, mode=stat.S_IMODE(st.st_mode) & 0o644)
            return beside
        except OSError:
            pass
    written = cache_index(cached, header, offsets)
    if written is not None:
        return str(written)
    raise SourceError(
        f"{path}: cannot write its byte-offset index beside it or under {cache_dir}; pass "
        "cache_dir= a writable folder of your own"
    )


def _writable(folder: str) -> bool:
    return os.access(folder, os.W_OK)


def _trusted_beside(index: str, shard_owner: int) -> str | None:
    """``index`` (beside its shard) when this user or the shard's owner wrote it and no one
    else can have swapped it; None when missing or (with a warning naming it) not trusted."""
    if not os.path.lexists(index):
        return None
    problem = cachefile.folder_problem(os.path.dirname(os.path.abspath(index)), (shard_owner,))
    if problem is not None:
        cachefile.warn_once(
            f"stoker ignored the index {index}: its folder {problem}, so another user could "
            "have written it; the index is rebuilt in your cache"
        )
        return None
    f = cachefile.open_trusted(index, (shard_owner,))
    if f is None:
        return None
    f.close()
    return index


def trusted_cached(index: Path) -> Path | None:
    """``index`` (in the cache) when it is this user's, in a private folder; None otherwise."""
    folder = cachefile.private_folder(index.parent, create=False)
    if folder is None:
        return None
    f = cachefile.open_trusted(folder / index.name)
    if f is None:
        return None
    f.close()
    return folder / index.name


def cache_path(cache_dir: Path, folder: str, name: str) -> Path:
    """Where the index of shard ``name`` in ``folder`` (a path or a URL) is kept in the cache."""
    key = hashlib.blake2b(folder.encode("utf-8", "surrogateescape"), digest_size=8)
    return Path(cache_dir) / key.hexdigest() / f"{name}.idx.npy"


def layout_key(pf: pq.ParquetFile, column: str) -> int:
    """A positive int64 hash of where ``column``'s chunks sit in the file and how many rows
    each row group has (read from the footer pyarrow already parsed: no extra I/O)."""
    md = pf.metadata
    names = [md.schema.column(c).path for c in range(md.num_columns)]
    col = names.index(column) if column in names else -1
    h = hashlib.blake2b(f"{md.num_rows}|{md.num_row_groups}|{column}".encode(), digest_size=7)
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        chunk = rg.column(col) if col >= 0 else None
        where = (chunk.data_page_offset, chunk.total_compressed_size) if chunk else (-1, -1)
        h.update(f"|{rg.num_rows},{where[0]},{where[1]}".encode())
    return int.from_bytes(h.digest(), "little")


Header = tuple[tuple[int, int], tuple[int, int]]  # the shard's stamp; its layout key and rows


def index_valid(candidate: str | os.PathLike, header: Header, shard: str | None = None) -> bool:
    """True when ``candidate`` is an offset index whose header is ``header`` and whose offsets
    fit the shard (``shard``: a local file whose first and last values are checked too). The
    caller has checked who wrote it (``local_index``)."""
    (size, _), (_, rows) = header
    try:
        table = np.load(candidate, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return False
    if not (
        table.dtype == np.int64
        and table.ndim == 2
        and table.shape == (rows + HEADER_ROWS, 2)
        and tuple(table[0]) == (MAGIC, INDEX_VERSION)
        and tuple(table[1]) == header[0]
        and tuple(table[2]) == header[1]
    ):
        return False
    body = table[HEADER_ROWS:]
    present = body[body[:, 0] >= 0]
    if len(present) and (present[:, 0].min() < 4 or (present.sum(axis=1) > size).any()):
        return False
    return shard is None or _prefixes_match(shard, present)


def missing_rows(index: str | os.PathLike) -> np.ndarray:
    """The rows a valid stored index marks as holding no image bytes (``[-1, 0]``)."""
    table = np.load(index, mmap_mode="r", allow_pickle=False)
    return np.flatnonzero(table[HEADER_ROWS:, 0] < 0)


def _prefixes_match(shard: str, present: np.ndarray) -> bool:
    """Whether the first and last stored values are preceded in ``shard`` by their length, as
    every PLAIN byte array is (a cheap check that the offsets belong to this file)."""
    if not len(present):
        return True
    try:
        fd = os.open(shard, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for offset, length in (present[0], present[-1]):
            if os.pread(fd, 4, int(offset) - 4) != struct.pack("<I", int(length)):
                return False
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def write_index(
    path: str | os.PathLike, header: Header, offsets: np.ndarray, mode: int = cachefile.FILE_MODE
) -> None:
    """Store ``offsets`` (one ``[offset, length]`` per row) under ``header`` at ``path``,
    atomically and exclusively (:func:`.cachefile.write_atomic`); OSError if it cannot."""
    cachefile.write_atomic(path, lambda f: _save(f, header, offsets), mode)


def cache_index(path: Path, header: Header, offsets: np.ndarray) -> Path | None:
    """Store an index in the private cache (:func:`.cachefile.write_cache`): the path written,
    or None when no private cache folder can be written."""
    return cachefile.write_cache(path, lambda f: _save(f, header, offsets))


def _save(f: Any, header: Header, offsets: np.ndarray) -> None:
    table = np.empty((len(offsets) + HEADER_ROWS, 2), dtype=np.int64)
    table[0] = (MAGIC, INDEX_VERSION)
    table[1] = header[0]
    table[2] = header[1]
    table[HEADER_ROWS:] = offsets
    np.save(f, table, allow_pickle=False)


def locate_values(
    path: str,
    pf: pq.ParquetFile,
    column: str,
    fetch: Callable[[int, int], tuple[Any, int]] | None = None,
) -> np.ndarray | None:
    """(offset, length) of every value of ``column`` inside the file, or None if they are not
    stored verbatim. PLAIN byte arrays are a 4-byte little-endian length then the bytes; each is
    found from its length and first bytes, searching forward within its column chunk, and then
    compared in full with the value pyarrow reads. ``fetch(start, end)``, when given, returns a
    buffer holding at least those bytes of the file and the file offset of its first byte (a
    remote shard: one ranged read per column chunk); otherwise the local file at ``path`` is
    memory-mapped."""
    if fetch is not None:
        return _locate_in(pf, column, fetch)
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

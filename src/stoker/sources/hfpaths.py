"""Hugging Face Parquet rows that name a file instead of holding its bytes.

``datasets``' ``Dataset.to_parquet()`` of images loaded from local files writes rows
``image: struct{bytes: null, path: "..."}``; its own ``Image`` feature then opens the path.
stoker does the same: a row whose bytes are null and whose path is set is read from that file.

Where the path leads, checked once at construction (a missing file is an error then, naming
the Parquet file, the row and the fix, never a failure of every row at the first batch):
an absolute path is the user's own file and is read as it is; a relative one is read from the
Parquet file's folder and must stay inside it (a ``..`` that climbs out is refused, as a tar
member's path is). Rows with neither bytes nor a path are bad samples, counted against
``max_errors``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import SourceError
from .base import PathIndex, file_kind

EMBED_FIX = (
    "embed the image bytes in the Parquet file (with datasets: "
    "ds.with_format('arrow').map(datasets.table.embed_table_storage, batched=True) before "
    "to_parquet, as push_to_hub does), or convert it with `stoker convert SRC DST`, which "
    "stores the bytes"
)


class PathRows:
    """The rows of one shard whose image is the file its ``path`` names."""

    def __init__(self, rows: np.ndarray, paths: PathIndex) -> None:
        self.rows, self.paths = rows, paths

    def path(self, row: int) -> str | None:
        """The file holding row ``row``'s image, or None (the row has bytes, or nothing)."""
        k = int(np.searchsorted(self.rows, row))
        if k < len(self.rows) and int(self.rows[k]) == row:
            return self.paths.path(k)
        return None

    def close(self) -> None:
        """Unlink the paths' shared copy (parent only)."""
        self.paths.close()


def path_rows(pf: pq.ParquetFile, shard: str, column: str) -> PathRows | None:
    """The path-only rows of ``shard``'s image ``column`` (None when it has none), each path
    resolved and its file checked; an error names the first rows whose file is missing."""
    if not _has_paths(pf, column):
        return None
    folder = os.path.dirname(os.path.abspath(shard))
    named = _named_rows(pf, column)
    rows = [r for r, _ in named]
    paths = [_resolve(stored, folder, shard, r) for r, stored in named]
    if not rows:
        return None
    _check_exist(rows, paths, shard)
    return PathRows(np.asarray(rows, dtype=np.int64), PathIndex(Path("/"), paths))


def refuse_remote_path_rows(
    pf: pq.ParquetFile, url: str, column: str, empty: np.ndarray | None = None
) -> None:
    """A remote shard's rows must hold their image bytes: a path stored in a file that came
    over the network names a file on the machine that wrote it, never one to open here.
    ``empty``: the rows known to hold no image bytes (from the shard's offset index), so only
    their paths are read; None reads the image column wherever its statistics allow a null."""
    if not _has_paths(pf, column):
        return
    named = _named_rows(pf, column) if empty is None else _paths_of(pf, column, empty)
    if not named:
        return
    listed = "\n".join(f"  row {r}: {p}" for r, p in named[:3])
    raise SourceError(
        f"{url}: {len(named)} rows hold no image bytes, only a path (as Dataset.to_parquet() "
        f"writes for images loaded from local files):\n{listed}\nstoker reads the paths of "
        f"local Parquet files only; a remote file's paths name files on the machine that "
        f"wrote it: {EMBED_FIX}"
    )


def _has_paths(pf: pq.ParquetFile, column: str) -> bool:
    """Whether ``column`` is an image struct with a ``path`` field."""
    kind = pf.schema_arrow.field(column).type
    return pa.types.is_struct(kind) and kind.get_field_index("path") >= 0


def _named_rows(pf: pq.ParquetFile, column: str) -> list[tuple[int, str]]:
    """``(row, stored path)`` of every row of ``column`` whose bytes are null and whose path
    is set; only the row groups whose statistics allow a null are read."""
    out: list[tuple[int, str]] = []
    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
    for g in _groups_with_nulls(pf, column):
        start = sum(sizes[:g])
        values = pf.read_row_group(g, columns=[column]).column(0).combine_chunks()
        empty = values.field("bytes").is_null().to_numpy(zero_copy_only=False)
        stored = values.field("path").to_pylist()
        out += [(start + int(r), stored[r]) for r in np.flatnonzero(empty) if stored[r] is not None]
    return out


def _paths_of(pf: pq.ParquetFile, column: str, rows: np.ndarray) -> list[tuple[int, str]]:
    """``(row, stored path)`` of those of ``rows`` whose path is set (only the path is read)."""
    if not len(rows):
        return []
    stored = pf.read(columns=[f"{column}.path"]).column(0).combine_chunks().field("path")
    picked = stored.take(pa.array(rows, type=pa.int64())).to_pylist()
    return [(int(r), p) for r, p in zip(rows, picked, strict=True) if p is not None]


def _groups_with_nulls(pf: pq.ParquetFile, column: str) -> list[int]:
    """Row groups whose ``bytes`` may be null (the column's statistics say so, or say
    nothing)."""
    md = pf.metadata
    name = f"{column}.bytes"
    where = [i for i in range(md.num_columns) if md.row_group(0).column(i).path_in_schema == name]
    out = []
    for g in range(md.num_row_groups):
        stats = md.row_group(g).column(where[0]).statistics if where else None
        if stats is None or stats.null_count is None or stats.null_count > 0:
            out.append(g)
    return out


def _resolve(stored: str, folder: str, shard: str, row: int) -> str:
    """The file a row's ``path`` names: absolute as it is, relative from the shard's folder."""
    if os.path.isabs(stored):
        return stored
    full = os.path.normpath(os.path.join(folder, stored))
    if os.path.commonpath([folder, full]) != folder:
        raise SourceError(
            f"{shard}[row {row}]: image path {stored!r} leads outside the Parquet file's "
            f"folder ({folder}); a relative path is read only inside it: store absolute "
            f"paths, or {EMBED_FIX}"
        )
    return full


def _check_exist(rows: list[int], paths: list[str], shard: str) -> None:
    """Every path names a regular file: an error lists the rows whose file is missing, or is
    something else (a FIFO, a device, a folder), which a read would block on or fail at."""
    missing, other = [], []
    for row, path in zip(rows, paths, strict=True):
        kind = _kind(path)
        if kind == "missing":
            missing.append((row, path))
        elif kind:
            other.append((row, f"{path} ({kind})"))
    if not missing and not other:
        return
    parts = []
    if missing:
        parts.append(
            _listed(
                missing,
                len(rows),
                "only a path to a file that does not exist (relative "
                "paths are read from the Parquet file's folder)",
            )
        )
    if other:
        parts.append(
            _listed(other, len(rows), "only a path to something that is not a regular file")
        )
    raise SourceError(
        f"{shard}: " + "; and ".join(parts) + f"\nput the image files there, or {EMBED_FIX}"
    )


def _kind(path: str) -> str:
    """ "" for a regular file (through links), "missing", or what else ``path`` is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot stat it: {exc.strerror}"
    return "" if stat.S_ISREG(mode) else f"a {file_kind(mode)}"


def _listed(named: list[tuple[int, str]], total: int, what: str) -> str:
    listed = "\n".join(f"  row {r}: {p}" for r, p in named[:5])
    more = f"\n  ... and {len(named) - 5} more" if len(named) > 5 else ""
    return f"{len(named)} of {total} rows hold no image bytes, {what}:\n{listed}{more}"

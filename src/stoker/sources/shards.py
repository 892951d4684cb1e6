"""Parquet shards: stoker's own (``stoker convert``) and Hugging Face-style image datasets.

A shard has an ``image`` column (``struct{bytes, path}`` or plain binary) and usually a
``label`` column. Where the image bytes are stored uncompressed without a dictionary, every
image sits verbatim in the file: a sidecar index ``<shard>.idx.npy`` gives each image's
(offset, length), and ``read(i)`` is one positioned read (``os.pread``, the default) or a
slice of a memory map (``access="mmap"``). Both are one copy out of the page cache; ``pread``
is the default because a mapping counts every page touched in the process's
RSS (a worker seems to grow to the dataset's size) and turns a shard truncated under it into a
SIGBUS instead of an error. Other shards (compressed image
columns, as most foreign datasets are) are read a row group at a time, keeping the last one.

The sidecar index (``shardindex``) lives next to the shard as ``<shard>.idx.npy`` when the shard's
folder is this user's alone, else under ``cache_dir`` (default ``~/.cache/stoker/index``, private);
it is stamped with the shard's size, mtime and footer layout, trusted only when this user or the
shard's owner wrote it, and every offset is checked against the bytes pyarrow reads when the
index is built.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
from collections import OrderedDict
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DecodeError, SourceError
from .base import Source, StoredReads, cache_folder, drop_pages, short_read, stock
from .hfpaths import PathRows, path_rows
from .names import FORM, escaped, from_text, names_back
from .parquet_targets import join_labels as _join_labels
from .parquet_targets import label_names, shard_targets
from .shardindex import HEADER_ROWS, local_index

MANIFEST = "stoker-manifest.json"
_OPEN_MAPS = 64  # open shard files (descriptors or memory maps) kept per process
_OPEN_FILES = 8  # ParquetFile readers kept open per process (row-group mode)


class ShardSource(StoredReads, Source):
    """A folder (or list) of Parquet shards; see the module docstring."""

    #: Per shard: its rows whose image is a file named by the row's path (Hugging Face
    #: Parquet written from local files), or None; remote shards have none.
    path_rows: list[PathRows | None]

    def __init__(
        self,
        folder_or_files: str | os.PathLike | list[str | os.PathLike],
        *,
        image_column: str = "image",
        label_column: str | list[str] | None = None,
        cache_dir: str | os.PathLike | None = None,
        access: str = "pread",
    ) -> None:
        if access not in ("pread", "mmap"):
            raise SourceError(f"access must be 'pread' or 'mmap', got {access!r}")
        self.access = access
        self.files, manifest = _list_shards(folder_or_files)
        self.image_column, self.label_column = image_column, label_column
        self._cache_dir = cache_folder(cache_dir, "index")
        self.path_rows = []
        self._scan(self.files, manifest, str(folder_or_files))
        self._reset()

    # ------------------------------------------------------------------ setup

    def _scan(self, names: list[str], manifest: dict | None, where: str) -> None:
        """The one scan over the shards, local or remote: open and check each one
        (``_open_shard``), read its row groups and labels, find or build its offset index
        (``_shard_index``), then join rows, labels and classes across shards. Errors reading
        a shard are turned into messages naming it by ``_reading``."""
        rows: list[int] = []
        groups: list[int] = []
        labels: list[Any] = []
        self.modes: list[int] = []
        self.index_files: list[str] = []
        self._group_starts: list[np.ndarray] = []
        hf_classes: list[str] | None = None
        for k, name in enumerate(names):
            with self._reading(name):
                pf = self._open_shard(k, name, manifest)
                self._check_columns(pf, name)
                md = pf.metadata
                sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
                rows.append(md.num_rows)
                groups.extend(sizes)
                self._group_starts.append(
                    np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
                )
                labels.append(self._labels(pf, name))
                hf_classes = hf_classes or _hf_classes(pf)
                idx = self._shard_index(k, name, pf, manifest)
            self.modes.append(0 if idx is not None else 1)
            self.index_files.append(idx or "")
        self.starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64)
        self.block_sizes = tuple(int(g) for g in groups)
        self.labels, text_classes = _join_labels(labels, where)
        self.classes = self._class_names(manifest, hf_classes, text_classes)
        self._digest = self._make_digest(manifest)

    def _reading(self, name: str) -> AbstractContextManager[None]:
        """Around each shard's scan: a local shard's errors are already clear messages."""
        return nullcontext()

    def _open_shard(self, k: int, path: str, manifest: dict | None) -> pq.ParquetFile:
        """Shard ``k``, checked against the manifest's size for it."""
        pf = _open_parquet(path)
        expected = manifest["shards"][k] if manifest else None
        if expected is not None and expected["bytes"] != os.path.getsize(path):
            raise SourceError(
                f"{path}: {os.path.getsize(path)} bytes, the manifest says "
                f"{expected['bytes']}; the shard changed since conversion: convert again"
            )
        return pf

    def _shard_index(
        self, k: int, path: str, pf: pq.ParquetFile, manifest: dict | None
    ) -> str | None:
        """Shard ``k``'s offset index file (None: its images are not stored verbatim); also
        notes its rows whose image is a file named by a path."""
        sha = (manifest["shards"][k] if manifest else {}).get("sha256")
        idx = local_index(path, pf, self._value_path(pf), self._cache_dir, sha)
        self.path_rows.append(path_rows(pf, path, self.image_column))
        return idx

    def _check_columns(self, pf: pq.ParquetFile, path: str) -> None:
        schema = pf.schema_arrow
        if self.image_column not in schema.names:
            raise SourceError(
                f"{path}: no {self.image_column!r} column (columns: {', '.join(schema.names)}); "
                "stoker reads Parquet with an image column of struct{bytes, path} or binary"
            )
        kind = schema.field(self.image_column).type
        ok = (
            pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0)
        )
        if not ok:
            raise SourceError(
                f"{path}: column {self.image_column!r} is {kind}; expected struct{{bytes, path}} "
                "or binary image bytes"
            )

    def _value_path(self, pf: pq.ParquetFile) -> str:
        kind = pf.schema_arrow.field(self.image_column).type
        return f"{self.image_column}.bytes" if pa.types.is_struct(kind) else self.image_column

    def _labels(self, pf: pq.ParquetFile, where: str = "") -> np.ndarray | list[Any]:
        """One shard's target: one column (numbers and fixed-size lists of numbers keep their
        Arrow dtype; text comes back as cells, for class names) or several numeric columns
        stacked into ``(N, K)`` (see :mod:`.parquet_targets`)."""
        names, asked = label_names(self.label_column)
        return shard_targets(pf, names, asked, where or "a shard")

    def _class_names(self, manifest: dict | None, hf: list[str] | None, text: list[str] | None):
        """The classes of the ``label`` column (manifest, Hugging Face metadata, or its text);
        a target read from other columns has only those its own text gives."""
        if label_names(self.label_column)[0] != ["label"]:
            return text
        manifest = manifest or {}
        stored = names_back(manifest.get("classes"), manifest.get("names") == FORM)
        return stored or hf or text

    def _make_digest(self, manifest: dict | None) -> str:
        h = hashlib.blake2b(digest_size=12)
        for k, path in enumerate(self.files):
            sha = manifest["shards"][k]["sha256"] if manifest else ""
            h.update(f"{os.path.basename(path)}|{os.path.getsize(path)}|{sha}\0".encode())
        h.update(self.starts.tobytes())
        h.update(self.labels.tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------ per-process handles

    def _reset(self) -> None:
        self._maps: OrderedDict[int, tuple[Any, np.ndarray]] = OrderedDict()
        self._readers: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self._group: tuple[int, int, pa.Array | None] = (-1, -1, None)
        # Read-ahead threads share the handles: one in use is closed only when its last
        # reader lets go (a closed, reused descriptor would read another file's bytes).
        self._lock = threading.Lock()
        self._busy: dict[int, list[Any]] = {}  # id(entry) -> [entry, readers]

    @property
    def parallel_reads(self) -> bool:  # type: ignore[override]
        """True when every shard's images are stored verbatim (one positioned read each)."""
        return all(m == 0 for m in self.modes)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_maps", "_readers", "_group", "_lock", "_busy"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def open_in_worker(self) -> None:
        """Nothing to do: maps and readers open lazily on first use in each process."""

    def close(self) -> None:
        """Close this process's open shard files and readers (and unlink the shared copy of
        path-only rows' paths)."""
        for handle, _ in self._maps.values():
            _close(handle)
        for rows in self.path_rows:
            if rows is not None:
                rows.close()
        self._reset()

    # ------------------------------------------------------------------ reading

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, row within the shard) of sample ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return shard, int(index - self.starts[shard])

    def read(self, index: int) -> bytes:
        """The encoded image bytes of sample ``index``."""
        shard, row = self.locate(index)
        if self.modes[shard] == 0:
            entry = self._acquire(shard)
            try:
                handle, table = entry
                offset, length = (int(v) for v in table[row + HEADER_ROWS])
                if offset < 0:
                    return self._from_path(shard, row, index)
                if isinstance(handle, int):
                    data = os.pread(handle, length, offset)
                else:
                    data = handle[offset : offset + length]
            finally:
                self._let_go(shard, entry)
            if len(data) != length:
                raise short_read(self.name(index), len(data), length)
            return data
        return self._read_group(shard, row, index)

    def native_reads(self) -> str | None:
        """``"ranges"`` when every image is stored verbatim, read with ``pread`` by this class's
        own ``read`` (not a memory map, not a subclass's reads: remote shards)."""
        own = self.access == "pread" and stock(self, ShardSource, "read")
        return "ranges" if own and self.parallel_reads else None

    def file_range(self, index: int) -> tuple[str, int, int, int] | None:
        """``(shard path, offset, length, fd)`` of sample ``index``'s image bytes (None: a
        null image); ``fd`` duplicates this process's descriptor on the shard (the caller
        closes it), so reads through it keep the kernel's readahead of that shard."""
        shard, row = self.locate(index)
        entry = self._acquire(shard)
        try:
            offset, length = (int(v) for v in entry[1][row + HEADER_ROWS])
            if offset < 0:
                return None
            return str(self.files[shard]), offset, length, os.dup(entry[0])
        finally:
            self._let_go(shard, entry)

    def forget(self, index: int) -> bool:
        """Drop the image's byte range of its shard from the page cache."""
        shard, row = self.locate(index)
        if self.modes[shard] != 0:
            return False
        entry = self._acquire(shard)
        try:
            handle, table = entry
            offset, length = (int(v) for v in table[row + HEADER_ROWS])
            if isinstance(handle, int) and offset >= 0:
                drop_pages("", offset, length, fd=handle)
                return True
            return False
        finally:
            self._let_go(shard, entry)

    def _acquire(self, shard: int) -> tuple[Any, np.ndarray]:
        """This process's open entry for ``shard``, marked in use until ``_let_go``."""
        with self._lock:
            entry = self._open(shard)
            self._busy.setdefault(id(entry), [entry, 0])[1] += 1
            return entry

    def _let_go(self, shard: int, entry: tuple[Any, np.ndarray]) -> None:
        with self._lock:
            held = self._busy[id(entry)]
            held[1] -= 1
            if held[1] == 0:
                del self._busy[id(entry)]
                if self._maps.get(shard) is not entry:
                    _close(entry[0])  # evicted while in use: closed now

    def _open(self, shard: int) -> tuple[Any, np.ndarray]:
        """This process's handle on ``shard`` (a descriptor or a map) and its offset table."""
        entry = self._maps.get(shard)
        if entry is not None:
            self._maps.move_to_end(shard)
            return entry
        table = np.load(self.index_files[shard], mmap_mode="r", allow_pickle=False)
        fd = os.open(self.files[shard], os.O_RDONLY)
        handle: Any = fd
        if self.access == "mmap":
            try:
                handle = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
        entry = self._maps[shard] = (handle, table)
        if len(self._maps) > _OPEN_MAPS:
            old = self._maps.popitem(last=False)[1]
            if id(old) not in self._busy:
                _close(old[0])
        return entry

    def _read_group(self, shard: int, row: int, index: int) -> bytes:
        starts = self._group_starts[shard]
        group = int(np.searchsorted(starts, row, side="right")) - 1
        cached_shard, cached_group, values = self._group
        if (cached_shard, cached_group) != (shard, group) or values is None:
            reader = self._readers.get(shard)
            if reader is None:
                reader = self._readers[shard] = self._parquet_reader(shard)
                if len(self._readers) > _OPEN_FILES:
                    self._readers.popitem(last=False)
            column = reader.read_row_group(group, columns=[self.image_column]).column(0)
            values = column.combine_chunks()
            if pa.types.is_struct(values.type):
                values = values.field("bytes")
            self._group = (shard, group, values)
        value = values[row - int(starts[group])].as_py()
        if value is None:
            return self._from_path(shard, row, index)
        return value

    def _from_path(self, shard: int, row: int, index: int) -> bytes:
        """A row without image bytes: the file its path names (see ``hfpaths``), if any."""
        rows = self.path_rows[shard] if shard < len(self.path_rows) else None
        file = rows.path(row) if rows is not None else None
        if file is None:
            raise DecodeError(f"{self.name(index)}: no image bytes (null) and no path")
        with open(file, "rb") as f:
            return f.read()

    def _parquet_reader(self, shard: int) -> pq.ParquetFile:
        """A ParquetFile on ``shard`` for row-group reads (remote sources open it their way)."""
        return pq.ParquetFile(self.files[shard])

    def stored_path(self, index: int) -> str | None:
        """The name sample ``index``'s ``image.path`` holds (None: no path column, or null):
        for ``stoker convert``'s shards the file's path relative to the folder converted,
        exactly as it was on disk (:mod:`.names`). Reads that row group's paths."""
        shard, row = self.locate(index)
        pf = self._parquet_reader(shard)
        kind = pf.schema_arrow.field(self.image_column).type
        if not pa.types.is_struct(kind) or kind.get_field_index("path") < 0:
            return None
        starts = self._group_starts[shard]
        group = int(np.searchsorted(starts, row, side="right")) - 1
        column = pf.read_row_group(group, columns=[f"{self.image_column}.path"]).column(0)
        text = column.combine_chunks().field("path")[row - int(starts[group])].as_py()
        if text is None or not escaped(pf.schema_arrow.metadata):
            return text
        return from_text(text)

    def name(self, index: int) -> str:
        """``shard-00003.parquet[row 17]``."""
        shard, row = self.locate(index)
        return f"{self.files[shard]}[row {row}]"

    def fingerprint(self) -> str:
        """Digest of shard names, sizes (and manifest checksums), row counts and labels."""
        return self._digest


# ---------------------------------------------------------------------------- helpers


def _list_shards(spec: Any) -> tuple[list[str], dict | None]:
    """The shard files, and the stoker manifest when the folder has one (it lists them)."""
    if isinstance(spec, (list, tuple)):
        files = [os.fspath(p) for p in spec]
        if not files:
            raise SourceError("an empty list of Parquet shards")
        return files, None
    path = Path(spec)
    if path.is_file():
        return [str(path)], None
    if not path.is_dir():
        raise SourceError(f"{path}: no such folder or Parquet file")
    manifest_path = path / MANIFEST
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
        except ValueError as exc:
            raise SourceError(f"{manifest_path}: not valid JSON ({exc})") from None
        files = [str(path / s["file"]) for s in manifest.get("shards", [])]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise SourceError(
                f"{path}: {len(missing)} shard(s) listed in {MANIFEST} are missing, first "
                f"{missing[0]}; copy them back or convert again"
            )
        if not files:
            raise SourceError(f"{manifest_path}: lists no shards")
        return files, manifest
    files = sorted(
        str(p) for p in path.glob("*.parquet") if p.is_file() and not p.name.startswith(".")
    )
    if not files:
        raise SourceError(f"{path}: no .parquet files")
    return files, None


def _close(handle: Any) -> None:
    if isinstance(handle, int):
        os.close(handle)
        return
    try:
        handle.close()
    except BufferError:  # a caller still holds a view; the GC closes it later
        pass


def _hf_classes(pf: pq.ParquetFile) -> list[str] | None:
    """Class names from Hugging Face ``datasets`` metadata (a ClassLabel ``label`` feature)."""
    meta = pf.schema_arrow.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw:
        return None
    try:
        features = json.loads(raw)["info"]["features"]
        label = features.get("label") or features.get("labels") or {}
        names = label.get("names")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(names, list):
        return None
    return names_back([str(n) for n in names], escaped(meta))


def _open_parquet(path: str) -> pq.ParquetFile:
    """Open a Parquet file, or say which file is not one."""
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{path}: not a readable Parquet file ({exc})") from None

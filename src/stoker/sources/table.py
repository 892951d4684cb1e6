"""Sources given as a list of files: a CSV/TSV of ``path,label`` or Python lists ``paths=``.

A table whose header has a ``mask`` column (``image,mask`` or ``path,mask``) is a segmentation
source: each row pairs an image with its mask file, both relative to the table.
"""

from __future__ import annotations

import csv
import os
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SourceError
from .base import FileListSource, PathIndex


def encode_labels(raw: list[Any], where: str) -> tuple[np.ndarray, list[str] | None]:
    """Integer labels as they are; any other labels become indices of their sorted names."""
    if not raw:
        return np.zeros(0, dtype=np.int64), None
    try:
        return np.asarray([int(v) for v in raw], dtype=np.int64), None
    except (TypeError, ValueError):
        pass
    names = sorted({str(v) for v in raw})
    lookup = {n: i for i, n in enumerate(names)}
    if len(names) > max(1000, len(raw) // 2):
        raise SourceError(f"{where}: labels look like free text ({len(names)} distinct values)")
    return np.asarray([lookup[str(v)] for v in raw], dtype=np.int64), names


class _Rows:
    """Streams a CSV/TSV into a compact index: path bytes, offsets and labels, row by row,
    without holding a Python object per row (a 200,000-row list would stay in the heap)."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.blob = bytearray()
        self.offsets = array("q", [0])
        self.ints: array | None = array("q")
        self.texts: list[str] = []
        self.path_col = 0
        self.mask_col: int | None = None  # set by a header with a ``mask`` column
        self.mask_blob = bytearray()
        self.mask_offsets = array("q", [0])

    def header(self, row: list[str]) -> None:
        """Take the columns from a header row: ``image,mask``/``path,mask`` pairs, or path,label."""
        cells = [c.strip().lower() for c in row]
        if "mask" not in cells:
            return
        if "image" not in cells and "path" not in cells:
            raise SourceError(
                f"{self.table}: the header has a mask column but no image (or path) column; "
                "write the header as image,mask"
            )
        self.path_col = cells.index("image") if "image" in cells else cells.index("path")
        self.mask_col = cells.index("mask")

    def _cell(self, row: list[str], col: int, number: int, what: str) -> str:
        path = row[col].strip() if len(row) > col else ""
        if not path:
            expected = "image,mask" if self.mask_col is not None else "path,label"
            raise SourceError(f"{self.table}: row {number} has no {what}; expected {expected}")
        if "\0" in path:
            raise SourceError(f"{self.table}: row {number} has a NUL byte in its {what}")
        return path

    def add(self, row: list[str], number: int) -> None:
        path = self._cell(row, self.path_col, number, "path")
        if self.mask_col is not None:
            mask = self._cell(row, self.mask_col, number, "mask path")
            self.blob += path.encode("utf-8", "surrogateescape")
            self.offsets.append(len(self.blob))
            self.mask_blob += mask.encode("utf-8", "surrogateescape")
            self.mask_offsets.append(len(self.mask_blob))
            if self.ints is not None:  # pairs have no labels: -1 each
                self.ints.append(-1)
            return
        self.blob += path.encode("utf-8", "surrogateescape")
        self.offsets.append(len(self.blob))
        label = row[1].strip() if len(row) > 1 and row[1].strip() else "-1"
        if self.ints is not None:
            try:
                self.ints.append(int(label))
                return
            except ValueError:
                self.texts = [str(v) for v in self.ints]
                self.ints = None
        self.texts.append(label)

    def labels(self) -> tuple[np.ndarray, list[str] | None]:
        if self.ints is not None:
            return np.frombuffer(self.ints, dtype=np.int64).copy(), None
        return encode_labels(self.texts, str(self.table))


def _is_header(row: list[str]) -> bool:
    cells = [c.strip().lower() for c in row]
    return any(c in cells for c in ("path", "label", "filename", "image", "mask"))


def _read_rows(path: Path) -> _Rows:
    """Read a CSV or TSV file (tab if the file is .tsv or its first line has a tab)."""
    rows = _Rows(path)
    with open(path, newline="", encoding="utf-8") as f:
        first = f.readline()
        f.seek(0)
        delimiter = "\t" if path.suffix.lower() == ".tsv" or "\t" in first else ","
        first_row = True
        for number, row in enumerate(csv.reader(f, delimiter=delimiter), start=1):
            if not row or not any(row):
                continue
            if first_row and _is_header(row):
                rows.header(row)
            else:
                rows.add(row, number)
            first_row = False
    if len(rows.offsets) == 1:
        raise SourceError(f"{path}: no rows of path,label (an empty file?)")
    return rows


class TableSource(FileListSource):
    """Images listed in a CSV/TSV file, one ``path,label`` row each, paths relative to the file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.table = Path(path)
        try:
            rows = _read_rows(self.table)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise SourceError(f"{self.table}: not a readable UTF-8 CSV/TSV file ({exc})") from None
        self.labels, self.classes = rows.labels()
        blob = np.frombuffer(bytes(rows.blob), dtype=np.uint8)
        offsets = np.frombuffer(rows.offsets, dtype=np.int64).copy()
        self.index = PathIndex.from_arrays(self.table.parent, blob, offsets)
        if rows.mask_col is not None:
            self.mask_index = PathIndex.from_arrays(
                self.table.parent,
                np.frombuffer(bytes(rows.mask_blob), dtype=np.uint8),
                np.frombuffer(rows.mask_offsets, dtype=np.int64).copy(),
            )


class PathSource(TableSource):
    """Images given as lists: ``paths=[...]`` and optional ``labels=[...]`` (-1 if absent)."""

    def __init__(self, paths: Any, labels: Any = None, masks: Any = None) -> None:
        plist = [os.fspath(p) for p in paths]
        if not plist:
            raise SourceError("paths= is empty")
        if masks is not None:
            mlist = [os.fspath(p) for p in masks]
            if len(mlist) != len(plist):
                raise SourceError(
                    f"paths= has {len(plist)} entries but masks= has {len(mlist)}; give one mask "
                    "file per image"
                )
            self.mask_index = PathIndex(Path(""), [os.path.abspath(p) for p in mlist])
        if labels is None:
            self.labels, self.classes = np.full(len(plist), -1, dtype=np.int64), None
        else:
            llist = list(labels)
            if len(llist) != len(plist):
                raise SourceError(
                    f"paths= has {len(plist)} entries but labels= has {len(llist)}; give one label "
                    "per path"
                )
            self.labels, self.classes = encode_labels(llist, "labels=")
        self.table = Path(".")
        self.index = PathIndex(Path(""), [os.path.abspath(p) for p in plist])

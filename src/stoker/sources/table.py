"""Sources given as a list of files: a CSV/TSV of ``path,label`` or Python lists ``paths=``."""

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

    def add(self, row: list[str], number: int) -> None:
        path = row[0].strip() if row else ""
        if not path:
            raise SourceError(f"{self.table}: row {number} has no path; expected path,label")
        if "\0" in path:
            raise SourceError(f"{self.table}: row {number} has a NUL byte in its path")
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
    return "path" in cells or "label" in cells or "filename" in cells


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
            if not (first_row and _is_header(row)):
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


class PathSource(TableSource):
    """Images given as lists: ``paths=[...]`` and optional ``labels=[...]`` (-1 if absent)."""

    def __init__(self, paths: Any, labels: Any = None) -> None:
        plist = [os.fspath(p) for p in paths]
        if not plist:
            raise SourceError("paths= is empty")
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

"""Sources given as a list of files: a CSV/TSV of ``path,label`` or Python lists ``paths=``."""

from __future__ import annotations

import csv
import os
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


def _read_rows(path: Path) -> list[list[str]]:
    """Rows of a CSV or TSV file (tab if the file is .tsv or its first line has a tab)."""
    with open(path, newline="", encoding="utf-8") as f:
        text = f.read()
    first = text.split("\n", 1)[0]
    delimiter = "\t" if path.suffix.lower() == ".tsv" or "\t" in first else ","
    rows = [r for r in csv.reader(text.splitlines(), delimiter=delimiter) if r and any(r)]
    if not rows:
        raise SourceError(f"{path}: empty file; expected rows of path,label")
    header = [c.strip().lower() for c in rows[0]]
    if "path" in header or "label" in header or "filename" in header:
        rows = rows[1:]
    return rows


class TableSource(FileListSource):
    """Images listed in a CSV/TSV file, one ``path,label`` row each, paths relative to the file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.table = Path(path)
        rows = _read_rows(self.table)
        bad = [i for i, r in enumerate(rows) if len(r) < 1 or not r[0].strip()]
        if bad:
            raise SourceError(f"{self.table}: row {bad[0] + 2} has no path; expected path,label")
        paths = [r[0].strip() for r in rows]
        nul = next((i for i, p in enumerate(paths) if "\0" in p), None)
        if nul is not None:
            raise SourceError(f"{self.table}: row {nul + 1} has a NUL byte in its path")
        raw = [r[1].strip() if len(r) > 1 else "-1" for r in rows]
        self.labels, self.classes = encode_labels(raw, str(self.table))
        if not paths:
            raise SourceError(f"{self.table}: no rows of path,label")
        self.index = PathIndex(self.table.parent, paths)


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

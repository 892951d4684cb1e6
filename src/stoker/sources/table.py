"""Sources given as a list of files: a CSV/TSV of ``path,label`` or Python lists ``paths=``.

A table whose header has a ``mask`` column (``image,mask`` or ``path,mask``) is a segmentation
source: each row pairs an image with its mask file, both relative to the table.
"""

from __future__ import annotations

import csv
import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..decode import IMAGE_EXTENSIONS
from ..errors import SourceError
from .base import FileListSource, PathIndex
from .targets import as_targets, parse_column, stack_columns, unlabeled


def encode_labels(raw: list[Any], where: str) -> tuple[np.ndarray, list[str] | None]:
    """Labels given as Python values: numbers keep their kind (floats stay floats), text
    becomes class ids of the sorted names (see ``targets``)."""
    return as_targets(raw, len(raw), where)


PATH_NAMES = ("path", "image", "filename", "file")
#: Header names taken as the target without ``label_column=`` (the first found, in this order).
LABEL_NAMES = ("label", "class", "cls", "target")
HEADER_NAMES = (*PATH_NAMES, "label", "mask")


def _exists(path: Path) -> bool:
    """``path.exists()``, False where the name cannot even be a path here (too long, a NUL)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


class _Cells:
    """One column's cells, streamed: ``int64`` while every cell is an integer (no Python object
    per row), the text of every cell once one is not."""

    def __init__(self) -> None:
        self.ints: array | None = array("q")
        self.texts: list[str] = []

    def add(self, cell: str) -> None:
        if self.ints is not None:
            try:
                self.ints.append(int(cell) if cell else -1)
                return
            except ValueError:
                self.texts = ["" if v == -1 else str(v) for v in self.ints]
                self.ints = None
        self.texts.append(cell)

    def values(self, where: str) -> tuple[np.ndarray, list[str] | None]:
        """The column as targets: integers, numbers (float64) or class ids and names."""
        if self.ints is not None:
            return np.frombuffer(self.ints, dtype=np.int64).copy(), None
        return parse_column(self.texts, where)


class _Rows:
    """Streams a CSV/TSV into a compact index: path bytes, offsets and label columns, row by
    row, without holding a Python object per row (a 200,000-row list would stay in the heap).

    Columns are taken by name from a header (``path``/``image``/``filename``, ``label`` or the
    ``label_column`` asked for, ``mask``), else by position: ``path,label``."""

    def __init__(
        self,
        table: Path | str,
        label_column: Any = None,
        extra: tuple[str, ...] = (),
        exists: Callable[[str], bool] | None = None,
    ) -> None:
        self.table = table
        #: Whether a first cell names a file (a table without a header starts with one)
        self.exists = exists or (lambda cell: _exists(Path(table).parent / cell))
        self.blob = bytearray()
        self.offsets = array("q", [0])
        self.path_col = 0
        self.mask_col: int | None = None  # set by a header with a ``mask`` column
        self.mask_blob = bytearray()
        self.mask_offsets = array("q", [0])
        self.wanted = label_column
        self.extra = extra
        self.label_cols: list[int] = [1]
        self.label_names: list[str] = ["label"]
        self.cells: list[_Cells] = [_Cells()]
        self.extra_cols: dict[str, int] = {}
        self.extra_cells: dict[str, _Cells] = {}

    def header(self, row: list[str]) -> None:
        """Take the columns by name from a header row."""
        names = [c.strip() for c in row]
        lower = [c.lower() for c in names]
        self.path_col = self._path_column(names, lower)
        if "mask" in lower:
            self.mask_col = lower.index("mask")
        wanted = self._wanted(names, lower)
        self.label_cols = [self._find(names, n) for n in wanted]
        self.label_names = wanted
        self.cells = [_Cells() for _ in wanted]
        for name in self.extra:
            self.extra_cols[name] = self._find(names, name)
            self.extra_cells[name] = _Cells()

    def _path_column(self, names: list[str], lower: list[str]) -> int:
        """The image path's column: named one of ``PATH_NAMES``, never taken by position (a
        header of labels alone would read every label as a file)."""
        found = next((lower.index(n) for n in PATH_NAMES if n in lower), None)
        if found is None:
            shape = "image,mask" if "mask" in lower else "path,label"
            raise SourceError(
                f"{self.table}: the header ({', '.join(names)}) names no image path column; "
                f"name it one of {', '.join(PATH_NAMES)} (e.g. {shape}). A table of labels "
                "alone cannot be loaded: each row needs its image file"
            )
        return found

    def _wanted(self, names: list[str], lower: list[str]) -> list[str]:
        """The label column name(s): ``label_column`` as given, else the first of
        ``LABEL_NAMES`` in the header, else none (unlabeled) when every other column is the
        mask or an extra column asked for. Another column is never taken as the target by
        elimination: the error names it and says to pass ``label_column=``."""
        if self.wanted is not None:
            return [self.wanted] if isinstance(self.wanted, str) else list(self.wanted)
        known = next((n for n in LABEL_NAMES if n in lower), None)
        if known is not None:
            return [names[lower.index(known)]]
        rest = [n for k, n in enumerate(names) if k not in (self.path_col, self.mask_col) and n]
        rest = [n for n in rest if n not in self.extra]
        if rest:
            raise SourceError(
                f"{self.table}: the header ({', '.join(names)}) has no label column and other "
                f"columns ({', '.join(rest)}) stoker does not guess at; name the target column "
                f"one of {', '.join(LABEL_NAMES)}, pick it with label_column='{rest[0]}' (or a "
                "list of columns for a vector target), or drop the other columns for an "
                "unlabeled table"
            )
        return []

    def _find(self, names: list[str], name: str) -> int:
        if name in names:
            return names.index(name)
        raise SourceError(
            f"{self.table}: no column {name!r} in the header ({', '.join(names)}); pass "
            "label_column= (and sample_weight=) with names from the header"
        )

    def no_header(self, row: list[str]) -> None:
        """A table without a header: ``path,label`` (or paths alone, when the first row has
        one cell); named columns cannot be found, and a first row that is neither a file nor
        a known header is refused rather than read as a sample."""
        first = row[0].strip()
        if os.path.splitext(first)[1].lower() not in IMAGE_EXTENSIONS and not self.exists(first):
            raise SourceError(
                f"{self.table}: row 1 ({','.join(row)}) is neither a known header nor an image "
                f"file. Name the columns in the header: the image as one of {', '.join(PATH_NAMES)}"
                ", the target as label (or pass label_column='<name>')"
            )
        if len(row) < 2:
            self.label_cols, self.label_names, self.cells = [], [], []
        if self.wanted is not None or self.extra:
            asked = self.wanted if self.wanted is not None else self.extra[0]
            raise SourceError(
                f"{self.table}: column {asked!r} asked for, but the file has no header row; "
                "add a header (path,label,...) naming the columns"
            )

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
        self.blob += path.encode("utf-8", "surrogateescape")
        self.offsets.append(len(self.blob))
        if self.mask_col is not None:
            mask = self._cell(row, self.mask_col, number, "mask path")
            self.mask_blob += mask.encode("utf-8", "surrogateescape")
            self.mask_offsets.append(len(self.mask_blob))
        for col, cells, name in zip(self.label_cols, self.cells, self.label_names, strict=True):
            cells.add(self._value(row, col, number, name))
        for name, col in self.extra_cols.items():
            self.extra_cells[name].add(self._value(row, col, number, name))

    def _value(self, row: list[str], col: int, number: int, name: str) -> str:
        """A target cell; an empty or missing one is an error, never a silent -1."""
        cell = row[col].strip() if len(row) > col else ""
        if not cell:
            raise SourceError(
                f"{self.table}: row {number} has no {name} (column {col + 1}); give every row "
                "one, or drop the column for an unlabeled dataset"
            )
        return cell

    def labels(self) -> tuple[np.ndarray, list[str] | None]:
        """The target: one column as parsed, several stacked into ``(N, K)``; -1 if none."""
        n = len(self.offsets) - 1
        if not self.cells:
            return unlabeled(n), None
        parsed = [
            c.values(f"{self.table}: column {name!r}")
            for c, name in zip(self.cells, self.label_names, strict=True)
        ]
        if len(parsed) == 1:
            return parsed[0]
        named = [
            name for (_, classes), name in zip(parsed, self.label_names, strict=True) if classes
        ]
        if named:
            raise SourceError(
                f"{self.table}: column {named[0]!r} holds text; a vector target of several "
                "columns must be all numbers"
            )
        return stack_columns([p[0] for p in parsed]), None

    def extras(self) -> dict[str, np.ndarray]:
        """The extra named columns asked for (sample weights...), each numeric."""
        out = {}
        for name, cells in self.extra_cells.items():
            values, classes = cells.values(f"{self.table}: column {name!r}")
            if classes is not None:
                raise SourceError(f"{self.table}: column {name!r} must hold numbers, not text")
            out[name] = values
        return out


def _is_header(row: list[str], names: tuple[str, ...]) -> bool:
    cells = [c.strip() for c in row]
    lower = [c.lower() for c in cells]
    return any(c in lower for c in HEADER_NAMES) or any(n in cells for n in names)


def _csv_rows(path: Path | str, f: Any, delimiter: str) -> Iterator[list[str]]:
    """The CSV reader's rows; a row it cannot parse (a NUL byte on Python 3.10) is an error
    naming the file and the row."""
    reader = csv.reader(f, delimiter=delimiter)
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise SourceError(f"{path}: row {reader.line_num}: not CSV/TSV ({exc})") from None


def _read_rows(path: Path, label_column: Any = None, extra: tuple[str, ...] = ()) -> _Rows:
    """Read a CSV or TSV file (tab if the file is .tsv or its first line has a tab)."""
    with open(path, newline="", encoding="utf-8") as f:
        return read_rows(f, path, label_column, extra)


def read_rows(
    f: IO[str],
    table: Path | str,
    label_column: Any = None,
    extra: tuple[str, ...] = (),
    exists: Callable[[str], bool] | None = None,
) -> _Rows:
    """The rows of a CSV or TSV read from ``f`` (a local file or an object's text) named
    ``table`` in messages; ``exists`` tells whether a first cell names a file (default: a
    file beside a local table)."""
    rows = _Rows(table, label_column, extra, exists)
    asked = tuple([label_column] if isinstance(label_column, str) else list(label_column or ()))
    first = f.readline()
    f.seek(0)
    delimiter = "\t" if str(table).lower().endswith(".tsv") or "\t" in first else ","
    first_row = True
    for number, row in enumerate(_csv_rows(table, f, delimiter), start=1):
        if not row or not any(row):
            continue
        if first_row and _is_header(row, asked + extra):
            rows.header(row)
        else:
            if first_row:
                rows.no_header(row)
            rows.add(row, number)
        first_row = False
    if len(rows.offsets) == 1:
        raise SourceError(f"{table}: no rows of path,label (an empty file?)")
    return rows


class TableSource(FileListSource):
    """Images listed in a CSV/TSV file, one ``path,label`` row each, paths relative to the file."""

    def __init__(
        self, path: str | os.PathLike, label_column: Any = None, columns: tuple[str, ...] = ()
    ) -> None:
        self.table = Path(path)
        try:
            rows = _read_rows(self.table, label_column, tuple(columns))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise SourceError(f"{self.table}: not a readable UTF-8 CSV/TSV file ({exc})") from None
        self.labels, self.classes = rows.labels()
        self.named_columns = rows.extras()
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
        plist, mlist, self.labels, self.classes = given_lists(paths, labels, masks)
        if mlist is not None:
            self.mask_index = PathIndex(Path(""), [os.path.abspath(p) for p in mlist])
        self.table = Path(".")
        self.index = PathIndex(Path(""), [os.path.abspath(p) for p in plist])


def given_lists(
    paths: Any, labels: Any, masks: Any
) -> tuple[list[str], list[str] | None, np.ndarray, list[str] | None]:
    """``paths=``, ``masks=`` and ``labels=`` checked (one mask and one label per path): the
    paths, the masks (None without), the labels (-1 without) and their class names."""
    plist = [os.fspath(p) for p in paths]
    if not plist:
        raise SourceError("paths= is empty")
    mlist = None
    if masks is not None:
        mlist = [os.fspath(p) for p in masks]
        if len(mlist) != len(plist):
            raise SourceError(
                f"paths= has {len(plist)} entries but masks= has {len(mlist)}; give one mask "
                "file per image"
            )
    if labels is None:
        return plist, mlist, unlabeled(len(plist)), None
    llist = list(labels)
    if len(llist) != len(plist):
        raise SourceError(
            f"paths= has {len(plist)} entries but labels= has {len(llist)}; give one label per path"
        )
    return (plist, mlist, *encode_labels(llist, "labels="))

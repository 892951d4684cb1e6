"""Targets: per-sample labels of any numeric dtype and fixed shape, never cast into another
meaning. Integer class ids, numeric targets (``(N,)``, ``(N, K)``, ``(N, ...)``: regression
values, multi-label vectors, boxes, keypoints) and class names all come through here.

The rules (DESIGN §3.10): numbers keep their dtype and shape bit for bit; text becomes class
ids (indices of the sorted names, or of the ``class_names`` given); a mix of numbers and text,
free text, or a dtype that is not a number is an error that names the column and the fix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import SourceError

NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integers, floats
NO_LABEL = -1


def unlabeled(count: int) -> np.ndarray:
    """The labels of an unlabeled source: ``int64`` ``-1`` for every sample."""
    return np.full(count, NO_LABEL, dtype=np.int64)


def as_targets(
    values: Any, count: int, where: str, unit: str = "samples"
) -> tuple[np.ndarray, list[str] | None]:
    """``(targets, class_names)`` from an array, a ``.npy`` path, a list or None.

    Numeric arrays keep their dtype and shape ``(N, ...)``; text (or a list of strings) becomes
    ``int64`` class ids with the sorted names as ``class_names``; None is unlabeled."""
    if values is None:
        return unlabeled(count), None
    if isinstance(values, (str, os.PathLike)):
        values = load_npy(values, where)
    arr = values if isinstance(values, np.ndarray) else _from_list(values, where)
    if arr.ndim == 0 or arr.shape[0] != count:
        got = "a scalar" if arr.ndim == 0 else f"{arr.shape[0]}"
        raise SourceError(f"{where}: {count} {unit} but {got} labels; give one label per sample")
    if arr.dtype.kind in NUMERIC_KINDS:
        return arr, None
    if arr.dtype.kind in "USO" and arr.ndim == 1:
        cells = [v.decode() if isinstance(v, bytes) else str(v) for v in arr.tolist()]
        return parse_column([c.strip() for c in cells], where)
    raise SourceError(
        f"{where}: labels of dtype {arr.dtype} and shape {arr.shape} are neither numbers nor "
        "class names; give a numeric array (N,) or (N, ...) or a list of class names"
    )


def load_npy(path: str | os.PathLike, where: str) -> np.ndarray:
    """A ``.npy`` file of labels, memory-mapped (never pickled objects)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        raise SourceError(
            f"{where}: {path} is not a readable .npy array of labels ({type(exc).__name__}: "
            f"{exc}); save one with numpy.save(path, labels)"
        ) from None


def _from_list(values: Any, where: str) -> np.ndarray:
    """A list of labels as an array: numbers keep their kind; strings stay strings."""
    items = list(values)
    if items and all(isinstance(v, str) for v in items):
        return np.asarray(items, dtype=object)
    try:
        arr = np.asarray(items)
    except ValueError as exc:  # ragged nested lists
        raise SourceError(
            f"{where}: labels of different shapes ({exc}); every label must have the same shape"
        ) from None
    if arr.dtype.kind in "OU":
        raise SourceError(
            f"{where}: labels mix numbers and text (e.g. {items[0]!r}); give all numbers or all "
            "class names"
        )
    return arr


def encode_names(names: Sequence[str], where: str) -> tuple[np.ndarray, list[str]]:
    """Class names -> ``int64`` ids of the sorted distinct names; an empty name is ``-1``
    (unlabeled). Refuses free text."""
    classes = sorted(set(names) - {""})
    if len(classes) > max(1000, len(names) // 2):
        raise SourceError(
            f"{where}: labels look like free text ({len(classes)} distinct values in "
            f"{len(names)} rows), not class names; give numeric targets or fix the column"
        )
    lookup = {n: i for i, n in enumerate(classes)}
    lookup[""] = NO_LABEL
    return np.fromiter((lookup[n] for n in names), dtype=np.int64, count=len(names)), classes


def parse_column(cells: Sequence[str], where: str) -> tuple[np.ndarray, list[str] | None]:
    """A text column (CSV/TSV cells) -> integers (``int64``), numbers (``float64``, exact
    decimal parsing) or class ids with names; empty cells are ``-1`` in an integer column.

    A column that mixes numbers with text is refused with the first offending row named:
    it would otherwise turn numbers into class ids."""
    ints = _parse(cells, int)
    if ints is not None:
        return np.asarray(ints, dtype=np.int64), None
    floats = _parse(cells, float)
    if floats is not None:
        return np.asarray(floats, dtype=np.float64), None
    numeric = [k for k, c in enumerate(cells) if _number(c)]
    if numeric and len(numeric) < len(cells):
        text = next(k for k, c in enumerate(cells) if not _number(c) and c != "")
        raise SourceError(
            f"{where}: mixes numbers (row {numeric[0] + 1}: {cells[numeric[0]]!r}) and text "
            f"(row {text + 1}: {cells[text]!r}); a label column must be all numbers (a numeric "
            "target) or all class names: fix those rows"
        )
    return encode_names(cells, where)


def _number(cell: str) -> bool:
    try:
        return math.isfinite(float(cell)) or cell.lower() in ("nan", "inf", "-inf")
    except ValueError:
        return False


def _parse(cells: Sequence[str], kind: type) -> list[Any] | None:
    """Every cell parsed as ``kind`` (empty cells ``-1`` for ints, NaN for floats), or None."""
    empty = NO_LABEL if kind is int else math.nan
    out: list[Any] = []
    try:
        for c in cells:
            out.append(kind(c) if c != "" else empty)
    except ValueError:
        return None
    return out


def stack_columns(columns: list[np.ndarray]) -> np.ndarray:
    """Several label columns -> one ``(N, K)`` target: ``int64`` if all are, else ``float64``."""
    if all(c.dtype == np.int64 for c in columns):
        return np.stack(columns, axis=1)
    return np.stack([c.astype(np.float64) for c in columns], axis=1)


def class_ids(labels: np.ndarray) -> np.ndarray | None:
    """The labels when they are 1-D integer class ids, else None (numeric targets)."""
    if labels.ndim == 1 and labels.dtype.kind in "iu":
        return labels
    return None


def class_count(ids: np.ndarray, classes: list[str] | None) -> int:
    """How many classes: the names' count when there are names, else the largest class id
    plus one (as Keras' ``to_categorical`` counts them)."""
    return len(classes) if classes else int(ids.max()) + 1


LABEL_MODES = ("auto", "int", "categorical", "binary", None)


def label_mode(labels: np.ndarray, classes: list[str] | None, mode: Any) -> np.ndarray | None:
    """Labels in Keras' ``label_mode``: "auto" as stored; "int" ``int64`` class ids;
    "categorical" one-hot ``float32`` ``(N, classes)``; "binary" ``float32`` ``(N, 1)`` (two
    classes); None: no labels (batches are images only)."""
    if mode not in LABEL_MODES:
        raise SourceError(
            f"label_mode={mode!r}: use 'int', 'categorical', 'binary', None or 'auto' (as stored)"
        )
    if mode == "auto":
        return labels
    if mode is None:
        return None
    ids = class_ids(labels)
    if ids is None or (ids < 0).any():
        raise SourceError(
            f"label_mode={mode!r} needs a class id for every sample; these labels are "
            f"{labels.dtype} of shape {labels.shape[1:]} per sample"
            + (" with unlabeled (-1) samples" if ids is not None else "")
            + ": use label_mode='auto' to keep numeric targets as they are"
        )
    count = class_count(ids, classes)
    if mode == "int":
        return ids.astype(np.int64)
    if mode == "binary":
        if count != 2:
            raise SourceError(f"label_mode='binary' needs exactly 2 classes, not {count}")
        return ids.astype(np.float32).reshape(-1, 1)
    return np.eye(count, dtype=np.float32)[ids]

"""Targets from Parquet columns: one column (integers, floats, bools, a fixed-size list of
numbers for an ``(N, K)`` target, or class names), or several named scalar columns stacked into
an ``(N, K)`` target, the way a CSV's columns are chosen by name. Numbers keep their Arrow dtype
bit for bit; a column that cannot be a target (text among several, nulls, mixed dtypes, no fixed
shape, missing) is an error naming it and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import SourceError
from .targets import parse_column, unlabeled

DEFAULT_COLUMN = "label"


def label_names(label_column: Any) -> tuple[list[str], bool]:
    """``(names, asked)`` of ``label_column=``: None is ``label`` when a shard has it (not
    asked: a shard without it is unlabeled); a name or a list of names must be there."""
    if label_column is None:
        return [DEFAULT_COLUMN], False
    if isinstance(label_column, str):
        return [label_column], True
    names = list(label_column) if isinstance(label_column, Sequence) else None
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) < len(names):
        raise SourceError(
            f"label_column={label_column!r}: give a column name, or a list of distinct names "
            "of numeric columns for an (N, K) target"
        )
    return names, True


def shard_targets(
    pf: pq.ParquetFile, names: list[str], asked: bool, where: str
) -> np.ndarray | list[Any]:
    """One shard's target: its one label column (see :func:`arrow_targets`), or several
    numeric columns of one dtype stacked into ``(N, K)``."""
    present = pf.schema_arrow.names
    missing = [n for n in names if n not in present]
    if missing and not asked:
        return unlabeled(pf.metadata.num_rows)
    if missing:
        raise SourceError(
            f"{where}: no column {missing[0]!r} (columns: {', '.join(present)}); pass "
            "label_column= with names from the shard"
        )
    table = pf.read(columns=names)
    if len(names) == 1:
        column = table.column(0).combine_chunks()
        return arrow_targets(column, f"{where}: label column {names[0]!r}")
    return _stacked(table, names, where)


def _stacked(table: pa.Table, names: list[str], where: str) -> np.ndarray:
    """Several scalar numeric columns -> ``(N, K)`` of their common dtype, never cast."""
    arrays = []
    for name in names:
        column = table.column(name).combine_chunks()
        kind = column.type
        types = pa.types
        if not (types.is_integer(kind) or types.is_floating(kind) or types.is_boolean(kind)):
            raise SourceError(
                f"{where}: column {name!r} is {kind}; the columns of a vector target "
                f"(label_column={names!r}) must each hold one number per row: name numeric "
                "columns, or pass a fixed-size list column alone"
            )
        if column.null_count:
            raise SourceError(
                f"{where}: column {name!r} has {column.null_count} null rows; every row of a "
                "vector target needs a value: fill them"
            )
        arrays.append(column.to_numpy(zero_copy_only=False))
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1:
        kinds = ", ".join(f"{n}: {a.dtype}" for n, a in zip(names, arrays, strict=True))
        raise SourceError(
            f"{where}: the columns of label_column={names!r} differ in dtype ({kinds}); stoker "
            "never casts a target: store them with one dtype, or use separate fields"
        )
    return np.stack(arrays, axis=1)


def arrow_targets(column: pa.Array, where: str) -> np.ndarray | list[Any]:
    """A Parquet column of labels: integers (nulls -1), floats, bools and fixed-size lists of
    numbers as numpy arrays of their own dtype; anything else as text cells ('' for null)."""
    kind = column.type
    if pa.types.is_integer(kind):
        return column.fill_null(-1).to_numpy(zero_copy_only=False)
    if pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        if column.null_count and pa.types.is_boolean(kind):
            raise SourceError(f"{where}: null booleans; fill them before training")
        return column.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(kind) and (
        pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
    ):
        if column.null_count:
            raise SourceError(f"{where}: some rows have no target (null); fill them")
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(column), kind.list_size)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_struct(kind):
        raise SourceError(
            f"{where}: labels of type {kind} have no fixed shape; store them as a fixed-size "
            "list (pa.list_(pa.float32(), K)) or as one column per value, named together in "
            "label_column=[...]"
        )
    return ["" if v is None else str(v) for v in column.to_pylist()]


def join_labels(parts: list[Any], where: str) -> tuple[np.ndarray, list[str] | None]:
    """The shards' labels joined: arrays of one dtype and shape kept as they are; text cells
    parsed as a whole (class names sorted across all shards)."""
    if all(isinstance(p, np.ndarray) for p in parts):
        if not parts:
            return unlabeled(0), None
        shapes = {(p.dtype.str, p.shape[1:]) for p in parts}
        if len(shapes) > 1:
            raise SourceError(f"{where}: the shards' labels differ in dtype or shape ({shapes})")
        return np.concatenate(parts), None
    flat = [_cell(v) for p in parts for v in (p.tolist() if isinstance(p, np.ndarray) else p)]
    return parse_column(flat, where)


def _cell(value: Any) -> str:
    """A label as a text cell; an unlabeled shard's -1 is an empty cell."""
    return "" if value == -1 else str(value)

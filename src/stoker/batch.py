"""A batch's per-sample columns from ``Loader``'s arguments: ``label`` (per ``label_mode``),
``weight`` from ``sample_weight`` and the user's ``fields``, each validated and cut along with
the selection. What a batch is (its fields, layout and form) is :mod:`stoker.schema`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ConfigError
from .schema import DERIVED
from .sources import targets
from .sources.base import Source

RESERVED = ("image", "mask", "label", "weight", "index", *DERIVED)


def columns(
    source: Source, sample_weight: Any = None, fields: Any = None, label_mode: Any = "auto"
) -> dict[str, np.ndarray]:
    """The per-sample fields carried with each sample, beside the image (and mask): ``label``
    (the source's targets, any dtype and shape), ``weight`` from ``sample_weight`` (an array of
    N numbers or a CSV column name; as float32) and the user's ``fields`` (name -> an array
    ``(N, ...)`` of numbers or a CSV column name), each kept exactly.

    N is the length of the source the user passed (``source.origin()``), whatever
    ``validation_split``/``subset``/``class_names`` keep of it: the arrays are cut along with
    the selection, so row ``i`` always belongs to the batches' ``index`` ``i``. The columns
    returned have one row per sample of ``source`` (the selection)."""
    labels = targets.label_mode(source.labels, source.classes, label_mode)
    if source.sample_fields is not None:  # a per-sample dataset carries its own labels
        labels = None
    out = {} if labels is None else {"label": labels}
    n = len(source)
    if sample_weight is not None:
        weights = _column(source, sample_weight, n, "sample_weight")
        if weights.shape != (n,):
            raise ConfigError(
                f"sample_weight: need one number per sample, shape ({n},); got "
                f"shape {weights.shape}"
            )
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise ConfigError("sample_weight: weights must be finite and >= 0")
        out["weight"] = weights.astype(np.float32)
    if fields is None:
        return out
    if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
        raise ConfigError("fields= takes a dict: name -> array (N, ...) or CSV column name")
    for name, value in fields.items():
        if name in RESERVED:
            raise ConfigError(f"fields={{{name!r}: ...}}: {name!r} is a built-in field; rename it")
        out[name] = _column(source, value, n, f"fields[{name!r}]")
    return out


def _column(source: Source, value: Any, n: int, what: str) -> np.ndarray:
    """A per-sample numeric column given as an array (one row per sample of the source the
    user passed, cut here to the selection's ``n``) or a CSV column name (cut with the source).
    """
    if isinstance(value, str):
        if value not in source.named_columns:
            raise ConfigError(f"{what}={value!r}: names a column only for a CSV/TSV source")
        return source.named_columns[value]
    arr = np.asarray(value)
    total = len(source.origin())
    if arr.dtype.kind not in "biuf" or arr.ndim == 0:
        raise ConfigError(
            f"{what}: need numbers, one row per sample ({total}); got {arr.dtype} of shape "
            f"{arr.shape}"
        )
    if arr.shape[0] != total:
        raise ConfigError(_length_message(what, arr, total, n))
    if n != total or source.origin() is not source:
        arr = arr[source.source_indices(np.arange(n))]
    return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))


def _length_message(what: str, arr: np.ndarray, total: int, n: int) -> str:
    """Why an array of the wrong length is refused; for one of the selection's length, the fix.

    One rule, one meaning: rows are the source's samples. An array as long as the selection
    is refused, not guessed at: its rows' order would be the loader's own, which the user
    cannot see before building it (``Loader.source_indices`` shows it)."""
    head = (
        f"{what}: need one row per sample of the source you passed ({total}); got "
        f"{arr.dtype} of shape {arr.shape}"
    )
    if arr.shape[0] != n:
        return head
    return (
        f"{head}, one per sample of the selection (validation_split/subset/class_names keep "
        f"{n} of {total}). Give the whole source's rows: stoker cuts them along with the "
        "selection. Rows you have for the selection go into a full array at the loader's "
        "source_indices: full = np.zeros(total); full[loader.source_indices] = rows"
    )


def column_names(sample_weight: Any, fields: Any) -> tuple[str, ...]:
    """The CSV column names that ``sample_weight`` and ``fields`` ask for."""
    values = [sample_weight, *(fields.values() if isinstance(fields, dict) else ())]
    return tuple(v for v in values if isinstance(v, str))

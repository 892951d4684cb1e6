"""What a batch looks like to the user: its fields (``image``, ``label``, ``mask``, ``weight``,
``index``, ``path`` or a dataset's own names) arranged in the structure ``Loader(batch=...)``
asks for: the default tuple, ``"dict"``, or any nesting of tuples and dicts of field names
(the forms Keras takes: ``(x, y)``, ``(x, y, sample_weight)``, dicts of inputs/outputs).

The structure is a *form*: a pytree whose leaves are field names. Adapters walk the form and
the batch together (``map_form``) so each leaf is converted by what it is (an image is
permuted or scaled, a label never)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import ConfigError
from .sources import targets

#: Fields computed in the parent from the sample indices, not carried in shared memory.
DERIVED = ("path",)

Form = Any  # a field name, or a tuple / dict of forms


def default_form(names: Sequence[str]) -> Form:
    """The structure a plain loader yields: ``(image, label)``, ``(image, mask)`` for a
    segmentation source, ``(image, label, weight)`` with sample weights."""
    if "mask" in names:
        return ("image", "mask", "weight") if "weight" in names else ("image", "mask")
    if "label" not in names:  # label_mode=None: images only, as Keras gives them
        return "image"
    return ("image", "label", "weight") if "weight" in names else ("image", "label")


def resolve_form(value: Any, names: Sequence[str], default: Form | None = None) -> Form:
    """Check ``Loader(batch=...)`` against the batch's field names; return the form.

    ``None``: the default tuple; ``"dict"``: every field (and ``path``) by name; a field name,
    or a tuple/list/dict nesting field names."""
    available = [*names, *DERIVED]
    if value is None:
        return default if default is not None else default_form(names)
    if value == "dict":
        return {n: n for n in available}
    return _check(value, available)


def _check(value: Any, available: list[str]) -> Form:
    if isinstance(value, str):
        if value not in available:
            raise ConfigError(
                f"batch=: no field {value!r}; this loader's fields are {', '.join(available)}"
            )
        return value
    if isinstance(value, (tuple, list)) and value:
        return tuple(_check(v, available) for v in value)
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        return {k: _check(v, available) for k, v in value.items()}
    raise ConfigError(
        f"batch={value!r}: use None (the default tuple), 'dict', a field name, or a tuple/dict "
        "of field names such as ('image', 'label', 'weight') or ({'pixels': 'image'}, 'label')"
    )


def leaves(form: Form) -> list[str]:
    """The field names a form uses, in order."""
    if isinstance(form, str):
        return [form]
    values = form.values() if isinstance(form, dict) else form
    return [name for v in values for name in leaves(v)]


def apply_form(form: Form, fields: dict[str, Any]) -> Any:
    """Arrange a batch's fields (a dict by name) in ``form``."""
    if isinstance(form, str):
        return fields[form]
    if isinstance(form, dict):
        return {k: apply_form(v, fields) for k, v in form.items()}
    return tuple(apply_form(v, fields) for v in form)


def map_form(form: Form, batch: Any, fn: Callable[..., Any], *others: Any) -> Any:
    """``batch`` (arranged in ``form``) with each leaf replaced by ``fn(field name, leaf)``;
    with ``others`` (batches of the same structure), ``fn(name, leaf, other leaves...)``."""
    if isinstance(form, str):
        return fn(form, batch, *others)
    if isinstance(form, dict):
        return {k: map_form(v, batch[k], fn, *(o[k] for o in others)) for k, v in form.items()}
    return tuple(
        map_form(v, b, fn, *(o[k] for o in others))
        for k, (v, b) in enumerate(zip(form, batch, strict=True))
    )


def paths(name: Callable[[int], str], indices: np.ndarray) -> np.ndarray:
    """The ``path`` field: each sample's file path (or ``array[i]``), a numpy string array."""
    return np.asarray([name(int(i)) for i in indices], dtype=np.str_)


RESERVED = ("image", "mask", "label", "weight", "index", *DERIVED)


def columns(
    source: Any, sample_weight: Any = None, fields: Any = None, label_mode: Any = "auto"
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


def _column(source: Any, value: Any, n: int, what: str) -> np.ndarray:
    """A per-sample numeric column given as an array (one row per sample of the source the
    user passed, cut here to the selection's ``n``) or a CSV column name (cut with the source).
    """
    if isinstance(value, str):
        named = getattr(source, "named_columns", {})
        if value not in named:
            raise ConfigError(f"{what}={value!r}: names a column only for a CSV/TSV source")
        return named[value]
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

"""What a batch is, in one place: its fields, the byte layout of a batch slot, the per-sample
columns it carries, and its form (the structure ``Loader(batch=...)`` hands it out in).

Fields are ``image``, ``label``, ``mask``, ``weight``, ``index``, ``path`` or a dataset's own
names. The form is a pytree whose leaves are field names: the default tuple, ``"dict"``, or
any nesting of tuples and dicts of field names (the forms Keras takes: ``(x, y)``,
``(x, y, sample_weight)``, dicts of inputs/outputs). Adapters walk the form and the batch
together (``map_form``) so each leaf is converted by what it is (an image is permuted or
scaled, a label never).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from .errors import ConfigError
from .shm.segments import ALIGN, Segment, SharedArrays

SHARE_COLUMNS_BYTES = 1 << 20  # columns larger than this travel to workers in shared memory

#: One field of a batch: ``(name, dtype string, per-sample shape)``.
FieldSpec = tuple[str, str, tuple[int, ...]]

#: A filled batch's arrays by field name, before they are arranged in the batch's form.
Fields: TypeAlias = dict[str, np.ndarray]

#: One batch as the loader gives it: the arrays of its fields, arranged in its ``form`` (by
#: default ``(images, labels)``; ``Loader(batch=...)``: a tuple or dict, nested).
Batch: TypeAlias = "np.ndarray | tuple[Batch, ...] | dict[str, Batch]"


@dataclass(frozen=True)
class SlotLayout:
    """Byte layout of one batch slot: each field (images, labels of any dtype and shape,
    masks, weights, sample indices, a dataset's own fields) is a ``(batch_size, *shape)``
    array of its dtype, at a 64-byte aligned offset, in the order given."""

    batch_size: int
    fields: tuple[FieldSpec, ...]

    def field_bytes(self, spec: FieldSpec) -> int:
        """Bytes one field takes in a slot, rounded up to the alignment."""
        size = self.batch_size * int(np.prod(spec[2], dtype=np.int64)) * np.dtype(spec[1]).itemsize
        return -(-size // ALIGN) * ALIGN

    @property
    def nbytes(self) -> int:
        """Bytes of one whole slot."""
        return max(1, sum(self.field_bytes(f) for f in self.fields))

    def field(self, name: str) -> FieldSpec | None:
        """The spec of field ``name``, None if the batch has no such field."""
        return next((f for f in self.fields if f[0] == name), None)

    def views(self, seg: Segment) -> dict[str, np.ndarray]:
        """Every field as a numpy array over the slot's segment (no copy)."""
        out, offset = {}, 0
        for spec in self.fields:
            name, dtype, shape = spec
            out[name] = seg.array(np.dtype(dtype), (self.batch_size, *shape), offset)
            offset += self.field_bytes(spec)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """Fresh process-memory arrays for one batch (``workers=0``)."""
        return {n: np.empty((self.batch_size, *s), np.dtype(d)) for n, d, s in self.fields}


class Columns:
    """Per-sample numeric fields carried with each sample (``label`` of any dtype and shape,
    ``weight``, ...): ``batch[name][slot] = column[index]``, dtype and shape kept exactly.

    Sent to a worker, large columns move into one shared segment (made once) that every worker
    maps, instead of a pickled copy each."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = dict(arrays)
        self._shared: SharedArrays | None = None

    def items(self) -> list[tuple[str, np.ndarray]]:
        """``(name, column)`` pairs."""
        return list(self.arrays.items())

    def __getstate__(self) -> dict[str, Any]:
        if sum(a.nbytes for a in self.arrays.values()) <= SHARE_COLUMNS_BYTES:
            return {"arrays": {k: np.ascontiguousarray(v) for k, v in self.arrays.items()}}
        if self._shared is None or not self._shared.alive:
            self._shared = SharedArrays(self.arrays, "cols")
        return {"names": list(self.arrays), "shared": self._shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._shared = state.get("shared")
        if self._shared is None:
            self.arrays = state["arrays"]
        else:
            self.arrays = {n: self._shared[n] for n in state["names"]}

    def close(self) -> None:
        """Unlink the shared copy (parent only)."""
        if self._shared is not None:
            self._shared.unlink()


def field_specs(
    image_size: tuple[int, int],
    channels: int,
    has_masks: bool,
    columns: Columns,
    sample_fields: tuple[FieldSpec, ...] | None = None,
) -> tuple[FieldSpec, ...]:
    """The batch's fields: image (or a dataset's own ``sample_fields``), mask
    (segmentation), every column, the sample index."""
    height, width = image_size
    specs: list[FieldSpec] = [("image", "|u1", (height, width, channels))]
    if sample_fields is not None:  # a per-sample dataset: its own fields
        specs = list(sample_fields)
    if has_masks:
        specs.append(("mask", "|u1", (height, width)))
    for name, column in columns.items():
        specs.append((name, column.dtype.str, tuple(column.shape[1:])))
    specs.append(("index", "<i8", ()))
    return tuple(specs)


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


@dataclass(frozen=True)
class BatchSchema:
    """What a batch is: the byte layout of its slot (every field carried in shared memory),
    the per-sample columns copied into it, and the form it is handed out in."""

    slot_layout: SlotLayout
    columns: Columns
    form: Form

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the fields a slot carries, in slot order."""
        return tuple(f[0] for f in self.slot_layout.fields)

    def arrange(self, fields: dict[str, np.ndarray], name: Callable[[int], str]) -> Any:
        """A filled batch's fields arranged in the form, with ``path`` added (``name`` gives
        the file path of a sample index) when the form uses it."""
        if "path" in leaves(self.form):
            fields["path"] = paths(name, fields["index"])
        return apply_form(self.form, fields)

"""Any per-sample dataset: an object with ``__len__`` and ``__getitem__(i)`` returning a dict
(or a tuple, or one array) of numpy arrays of fixed shapes and dtypes, the way a PyTorch
``Dataset`` does. stoker's workers call ``__getitem__`` and write each field straight into the
shared-memory batch slot; order, exact resume, the failure budget, stats and every adapter work
as for images.

The fields' shapes and dtypes are declared (``Loader(dataset, spec={"audio": ((16000,),
"float32"), "label": ((), "int64")})``) or probed from sample 0. Every sample must match them
exactly: a different shape or dtype is an error naming the field (never a silent cast), and
saying how to resize it or leave it out. ``Loader(batch=...)`` names the fields a batch holds
(without a ``batch_transform``, which reads every field): the others are dropped in the worker,
never checked or copied, so a field of varying size (a Hugging Face ``with_transform`` that
keeps the PIL ``image`` column) can stay in the dataset.

Randomness: inside ``__getitem__``, ``stoker.sample_rng()`` is a ``numpy.random.Generator``
seeded from ``(seed, epoch, index)``: the same numbers for the same sample whatever the worker
count, and a resumed run draws what the uninterrupted one would have. The global RNGs that
ported code calls (``np.random.*``, Python's ``random``, and torch's CPU generator when torch is
already imported) are reseeded from the same ``(seed, epoch, index)`` before each
``__getitem__`` (the classic DataLoader bug, workers repeating each other's "random" numbers,
cannot happen); in the calling process (``workers=0``) the user's global states are put back
after each sample.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle
import numpy as np

from .._compat import add_note
from ..errors import ConfigError, SourceError
from ..seeding import mark_worker, seeded
from .base import Source
from .targets import NUMERIC_KINDS

FieldSpec = tuple[str, str, tuple[int, ...]]
_RNG: contextvars.ContextVar[np.random.Generator | None] = contextvars.ContextVar(
    "stoker_sample_rng", default=None
)


def sample_rng() -> np.random.Generator:
    """The ``numpy.random.Generator`` of the sample being loaded (call it inside a dataset's
    ``__getitem__``): seeded from the loader's ``(seed, epoch, index)``."""
    rng = _RNG.get()
    if rng is None:
        raise RuntimeError(
            "stoker.sample_rng() is only available inside a dataset's __getitem__ while a "
            "stoker Loader is loading that sample"
        )
    return rng


def is_dataset(obj: Any) -> bool:
    """An object stoker reads as a per-sample dataset (not an array, list, string or dict)."""
    plain = (np.ndarray, str, bytes, Mapping, Sequence)
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not isinstance(obj, plain)


def _structure(sample: Any) -> tuple[Any, dict[str, Any]]:
    """``(form, fields)`` of one sample: a dict keeps its keys; a tuple is named ``0``, ``1``,
    ...; a single array is ``x``."""
    if isinstance(sample, Mapping):
        fields = {str(k): v for k, v in sample.items()}
        return {k: k for k in fields}, fields
    if isinstance(sample, (tuple, list)):
        names = [str(k) for k in range(len(sample))]
        return tuple(names), dict(zip(names, sample, strict=True))
    return "x", {"x": sample}


def _leave_out(name: str, names: Sequence[str]) -> str:
    """How to keep field ``name`` out of the batch: ``batch=`` naming the other fields."""
    others = tuple(n for n in names if n != name)
    if not others:
        return "return it in a fixed-size form"
    shown = repr(others[0]) if len(others) == 1 else repr(others)
    return f"leave it out of the batch with batch={shown}"


def _array(value: Any, name: str, names: Sequence[str] = ()) -> np.ndarray:
    """A field's value as a numpy array (torch tensors, PIL images and Python numbers
    convert); one that cannot be an array of numbers is a SourceError saying the fix."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except ValueError:  # a ragged list: no one shape
        arr = np.asarray(None)
    if arr.dtype.kind not in NUMERIC_KINDS:
        kind = type(value).__name__ if arr.dtype.kind == "O" else str(arr.dtype)
        raise SourceError(
            f"field {name!r} is {kind}: a batch field is an array of numbers (bool, int, uint, "
            f"float) of one shape for every sample; encode text as ids, resize images to one "
            f"size, or {_leave_out(name, names)}"
        )
    return arr


def parse_spec(spec: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``spec={name: (shape, dtype)}`` -> ``{name: (dtype string, shape)}``, checked."""
    if not isinstance(spec, Mapping) or not spec:
        raise ConfigError(
            'spec= takes a dict: field name -> (shape, dtype), e.g. {"x": ((3,), "float32")}'
        )
    out = {}
    for name, value in spec.items():
        try:
            shape, dtype = value
            out[str(name)] = (np.dtype(dtype).str, tuple(int(d) for d in shape))
        except (TypeError, ValueError):
            raise ConfigError(
                f"spec[{name!r}]={value!r}: give (shape, dtype), e.g. ((3,), 'float32')"
            ) from None
    return out


def dataset_classes(dataset: Any) -> list[str] | None:
    """The class names a per-sample dataset carries, read without loading a sample: a Hugging
    Face dataset's ``ClassLabel`` feature (``label`` or ``labels``), else a ``classes`` list of
    strings (torchvision's ImageFolder, CIFAR, ...); None if it has neither."""
    features = getattr(dataset, "features", None)
    if isinstance(features, Mapping):
        for key in ("label", "labels"):
            names = getattr(features.get(key), "names", None)
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return list(names)
    classes = getattr(dataset, "classes", None)
    if isinstance(classes, (list, tuple)) and classes and all(isinstance(c, str) for c in classes):
        return list(classes)
    return None


def _freeze(dataset: Any) -> bytes:
    """The dataset as cloudpickle bytes (classes of a notebook or ``__main__`` by value)."""
    try:
        return cloudpickle.dumps(dataset)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raised, say what and the fix
        raise ConfigError(
            f"cannot send the dataset to worker processes ({type(exc).__name__}: {exc}); keep "
            "open files, locks and sockets out of it until __getitem__ opens them, or use "
            "workers=0"
        ) from None


class DatasetSource(Source):
    """A user's per-sample dataset; ``fields`` are its fields' ``(name, dtype, shape)``."""

    # No StoredReads: __getitem__ runs in the worker's own thread, one sample at a time
    from_storage = False  # what __getitem__ reads is the user's business

    def __init__(self, dataset: Any, spec: Any = None, keep: Sequence[str] | None = None) -> None:
        self.dataset = dataset
        try:
            count = len(dataset)
        except TypeError as exc:
            raise SourceError(f"the dataset has no usable len() ({exc})") from None
        if count < 1:
            raise SourceError("the dataset is empty (len() == 0)")
        self.count = int(count)
        self.labels = np.full(self.count, -1, dtype=np.int64)
        self.classes = dataset_classes(dataset)
        # what workers get: the dataset as it is now, before the probe below opens files or
        # memory-maps arrays in it (a pickled np.memmap would be a full copy per worker)
        self._sent = _freeze(dataset)
        try:  # sample_rng() works in the probe too; the user's global RNGs are left as they are
            first = self._call(0, np.random.default_rng(0))
        except Exception as exc:
            add_note(
                exc, "stoker: raised by the dataset's __getitem__(0), read to learn its fields"
            )
            raise
        form, values = _structure(first)
        self.field_names = tuple(values)
        kept = [n for n in values if keep is None or n in keep]
        self.sample_form = form if len(kept) == len(values) else {n: n for n in kept}
        declared = parse_spec(spec) if spec is not None else None
        fields: list[FieldSpec] = []
        for name in kept:
            if declared is not None:
                if name not in declared:
                    raise ConfigError(
                        f"spec= has no entry for the dataset's field {name!r} (its fields: "
                        f"{', '.join(self.field_names)}): add {name!r}: (shape, dtype), or "
                        f"{_leave_out(name, kept)}"
                    )
                dtype, shape = declared[name]
            else:
                arr = _array(values[name], name, kept)
                dtype, shape = arr.dtype.str, tuple(arr.shape)
            fields.append((name, dtype, shape))
        self.declared = declared is not None
        self.own = tuple(fields)
        self.sample_fields = self.own

    def __len__(self) -> int:
        return self.count

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "dataset": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.dataset = cloudpickle.loads(self._sent)

    def open_in_worker(self) -> None:
        """In a worker process: reseed the global RNGs per sample without saving them."""
        mark_worker()

    def name(self, index: int) -> str:
        """``dataset[index]``."""
        return f"dataset[{index}]"

    def load(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        """Call ``__getitem__(index)`` (with ``sample_rng()`` set and the global RNGs seeded
        from the sample) and write each field into ``out``; a field of another shape or dtype
        is a SourceError naming it."""
        sample = self._call(index, rng)
        _, values = _structure(sample)
        if sorted(values) != sorted(self.field_names):
            raise SourceError(
                f"returned fields {sorted(values)}, not {sorted(self.field_names)} as sample "
                "0 did; every sample must have the same fields"
            )
        kept = [f[0] for f in self.own]
        for name, dtype, shape in self.own:
            arr = _array(values[name], name, kept)
            if arr.dtype.str != dtype or tuple(arr.shape) != shape:
                raise SourceError(self._mismatch(name, arr, dtype, shape, kept))
            out[name][...] = arr

    def _mismatch(
        self, name: str, arr: np.ndarray, dtype: str, shape: tuple[int, ...], kept: list[str]
    ) -> str:
        """The error for a field whose dtype or shape is not the batch's, with the fix."""
        where = "spec= declared" if self.declared else "sample 0 had"
        text = (
            f"field {name!r} is {arr.dtype} {tuple(arr.shape)}, not {np.dtype(dtype)} {shape} "
            f"as {where}; stoker never casts or pads: "
        )
        if tuple(arr.shape) != shape:
            return text + (
                "a batch field has one shape for every sample, so resize or crop it to one "
                f"size (in __getitem__, or a Hugging Face dataset's with_transform), or "
                f"{_leave_out(name, kept)}"
            )
        return text + f"return {np.dtype(dtype)} for every sample (convert it in __getitem__)"

    def _call(self, index: int, rng: np.random.Generator) -> Any:
        """``dataset[index]`` with ``sample_rng()`` set to ``rng`` and the global RNGs seeded
        from it (and put back afterwards outside a worker process)."""
        token = _RNG.set(rng)
        try:
            with seeded(rng):
                return self.dataset[index]
        finally:
            _RNG.reset(token)

    def fingerprint(self) -> str:
        """Digest of the dataset's type, length and fields (its content is not known)."""
        key = f"{type(self.dataset).__qualname__}|{self.count}|{self.sample_fields}"
        return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()

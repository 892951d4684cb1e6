"""``Loader(batch_transform=fn)``: a user function on each whole batch, run in the workers
once the batch's samples are in its slot (mixup and cutmix, as torchvision's reference recipe
does them in ``collate_fn``).

The contract: ``fn(batch, rng)``, where ``batch`` is a dict of numpy arrays by field name
(``image`` ``uint8`` ``(n, H, W, C)``, ``label``, ``mask``, ``weight``, ``index``, a
``fields=`` array, a dataset's own fields; ``n`` is the batch's size, smaller for a last
ragged batch) and ``rng`` a ``numpy.random.Generator`` seeded from ``(seed, epoch, global
step)``, the same on every rank, so its draws repeat in every run, with any worker count, any
number of ranks and after a resume.
It changes the arrays in place and returns None, or returns a dict of the fields it replaces
or adds (``{"label": soft_labels}``). ``image`` and ``mask`` keep their dtype and shape, and
``index`` is never replaced; any other field may change dtype and per-sample shape (integer
class ids -> float32 soft labels), and a new name adds a field.

What a batch holds after the function is learnt once, at construction, by calling it in the
calling process on a batch of zeros (class id 0, index 0): every later batch must return the
same names with the same dtypes and per-sample shapes, or a TypeError says which differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import add_note
from .errors import ConfigError
from .schema import FieldSpec
from .seeding import seeded, user_states_kept

#: Fields a batch transform may change in place but never replace with another dtype or shape.
FIXED = ("image", "mask")
#: Fields a batch transform may not return at all (they say which samples the batch holds).
KEPT = ("index", "path")
BATCH_KEY = 0xBA7C  # keeps batch-level draws apart from every per-sample generator


def batch_rng(seed: int, epoch: int, step: int) -> np.random.Generator:
    """The generator a batch transform gets for global step ``step`` of ``epoch``: the same on
    every rank (each rank's part of one global batch draws the same numbers), so it does not
    depend on the world size. (The 0 in its key stands where the rank stood before: a single
    rank's draws are the ones it always had.)"""
    seq = np.random.SeedSequence([seed, epoch, 0, step], spawn_key=(BATCH_KEY,))
    return np.random.default_rng(seq)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _spec_of(name: str, arr: np.ndarray) -> FieldSpec:
    return (name, arr.dtype.str, tuple(arr.shape[1:]))


class BatchTransform:
    """A checked ``batch_transform``: the function, the fields it is given (``inputs``) and
    the fields the batch has after it (``outputs``, learnt from the probe call)."""

    def __init__(self, fn: object, inputs: tuple[FieldSpec, ...], batch_size: int) -> None:
        if not callable(fn):
            raise ConfigError(
                f"batch_transform={fn!r}: give a function (batch, rng) -> None or a dict of "
                "fields, e.g. def mixup(batch, rng): ...; see docs/habits.md"
            )
        self.fn, self.inputs = fn, inputs
        self.outputs = self._probe(batch_size)

    def _probe(self, batch_size: int) -> tuple[FieldSpec, ...]:
        """Call the function once on a batch of zeros; the fields it leaves, in order."""
        arrays = {
            name: np.zeros((batch_size, *shape), np.dtype(dtype))
            for name, dtype, shape in self.inputs
        }
        try:
            with user_states_kept():  # the user's own global random draws are not moved
                returned = self._call(arrays, np.random.default_rng(0))
        except Exception as exc:
            add_note(
                exc,
                f"stoker: raised by batch_transform={_name(self.fn)} when called at "
                f"construction on a batch of zeros (batch_size={batch_size}) to learn the "
                "batch's fields; it must accept any batch of these shapes",
            )
            raise
        specs = {spec[0]: spec for spec in self.inputs}
        for name, arr in returned.items():
            self._check_name(name)
            if arr.shape[:1] != (batch_size,):
                raise TypeError(
                    f"batch_transform={_name(self.fn)} returned {name!r} of shape {arr.shape}; "
                    f"it must have one row per sample ({batch_size}, ...)"
                )
            new = _spec_of(name, arr)
            if name in FIXED and new != specs[name]:
                raise TypeError(
                    f"batch_transform={_name(self.fn)} returned {name!r} as {arr.dtype} "
                    f"{arr.shape}; {name} stays {np.dtype(specs[name][1])} "
                    f"{(batch_size, *specs[name][2])}: write the new values into "
                    f"batch[{name!r}] (batch[{name!r}][...] = ...), as uint8"
                )
            specs[name] = new
        return tuple(specs.values())

    def _check_name(self, name: Any) -> None:
        if not isinstance(name, str) or name in KEPT:
            raise TypeError(
                f"batch_transform={_name(self.fn)} returned field {name!r}; return a dict of "
                f"new or replaced fields by name, never {' or '.join(KEPT)} (they say which "
                "samples the batch holds)"
            )

    def _call(self, arrays: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, Any]:
        with seeded(rng):  # global RNGs as for augment=: from the batch's own generator
            out = self.fn(arrays, rng)
        if out is None:
            return {}
        if not isinstance(out, dict):
            raise TypeError(
                f"batch_transform={_name(self.fn)} returned {type(out).__name__}; return None "
                "(the batch changed in place) or a dict of the fields it replaces"
            )
        return {name: np.asarray(value) for name, value in out.items()}

    @property
    def changed(self) -> tuple[str, ...]:
        """Fields whose dtype or per-sample shape the function changes, or that it adds."""
        before = set(self.inputs)
        return tuple(spec[0] for spec in self.outputs if spec not in before)

    def scratch(self, slot: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
        """The arrays a batch is filled into before the function: the slot's own fields where
        the function keeps them, fresh arrays where it changes them (or the slot has none)."""
        out_specs = set(self.outputs)
        arrays = {}
        for spec in self.inputs:
            name, dtype, shape = spec
            if spec in out_specs:
                arrays[name] = slot[name]
            else:
                arrays[name] = np.empty((batch_size, *shape), np.dtype(dtype))
        return arrays

    def apply(
        self,
        arrays: dict[str, np.ndarray],
        slot: dict[str, np.ndarray],
        n: int,
        rng: np.random.Generator,
    ) -> None:
        """Run the function on the first ``n`` rows of ``arrays`` (filled by ``scratch``) and
        write what it returns into ``slot``, checked against the probed fields."""
        returned = self._call({name: arr[:n] for name, arr in arrays.items()}, rng)
        specs = {spec[0]: spec for spec in self.outputs}
        for name, arr in returned.items():
            self._check_name(name)
            if name not in specs or _spec_of(name, arr) != specs[name] or len(arr) != n:
                want = specs.get(name)
                said = "no such field" if want is None else (f"{np.dtype(want[1])} {(n, *want[2])}")
                raise TypeError(
                    f"batch_transform={_name(self.fn)} returned {name!r} as {arr.dtype} "
                    f"{arr.shape}, but its call at construction made it {said}; return the "
                    "same fields with the same dtype and shape for every batch"
                )
            slot[name][:n] = arr
        for name in self.changed:
            if name not in returned:
                raise TypeError(
                    f"batch_transform={_name(self.fn)} did not return {name!r}, which its call "
                    "at construction returned; return the same fields for every batch"
                )

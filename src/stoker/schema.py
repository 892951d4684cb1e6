"""What a batch is, in one place: its fields, the byte layout of a batch slot, and its form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shm.segments import ALIGN, Segment

#: One field of a batch: ``(name, dtype string, per-sample shape)``.
FieldSpec = tuple[str, str, tuple[int, ...]]


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

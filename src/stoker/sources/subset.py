"""A subset of another source, relabelled: what ``validation_split``/``subset`` and
``class_names`` (a chosen subset of classes, in a chosen order) give. Sample ``i`` of the
subset is sample ``indices[i]`` of the base source; everything else passes through.

Inside the loader a sample is numbered by its place in the subset (the order, the per-sample
randomness); what a batch shows the user (``index``, ``path``) and every per-sample array the
user gives (``sample_weight=``, ``fields=``) is numbered in ``origin()``, the source the user
passed (``source_indices`` translates)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SourceError
from .base import LoadsFields, Source, StoredReads, Takes, stored_reads


class SubsetSource(StoredReads, Source):
    """Samples ``indices`` of ``base``, with ``labels`` (the base's, or relabelled)."""

    def __init__(
        self,
        base: Source,
        indices: np.ndarray,
        labels: np.ndarray | None = None,
        classes: list[str] | None = None,
        tag: str = "",
    ) -> None:
        self.base = base
        self.indices = np.ascontiguousarray(indices, dtype=np.int64)
        self.labels = base.labels[self.indices] if labels is None else labels
        self.classes = base.classes if classes is None else classes
        self.has_masks = base.has_masks
        self.stored = stored_reads(base)  # the base's StoredReads, forwarded
        self._fields = base if isinstance(base, LoadsFields) else None
        self.parallel_reads = self.stored.parallel_reads
        self.read_ahead_max = self.stored.read_ahead_max
        self.from_storage = base.from_storage
        self.named_columns = {k: v[self.indices] for k, v in base.named_columns.items()}
        self.sample_fields, self.sample_form = base.sample_fields, base.sample_form
        self.tag = tag

    def origin(self) -> Source:
        """The source the user passed (the base's origin: subsets nest)."""
        return self.base.origin()

    def source_indices(self, indices: np.ndarray) -> np.ndarray:
        """Where samples ``indices`` of the subset are in ``origin()``."""
        return self.base.source_indices(self.indices[np.asarray(indices, dtype=np.int64)])

    def load(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        """A per-sample dataset's sample ``indices[index]`` into ``out``."""
        assert self._fields is not None  # only a subset of a per-sample dataset loads fields
        self._fields.load(int(self.indices[index]), rng, out)

    def take(self, indices: np.ndarray, out: np.ndarray) -> bool:
        """The base's bulk copy of samples ``indices[indices]`` (False where it has none)."""
        base = self.base
        return isinstance(base, Takes) and base.take(self.indices[indices], out)

    def read(self, index: int) -> bytes | np.ndarray:
        """The base's sample ``indices[index]``."""
        return self.base.read(int(self.indices[index]))

    def read_mask(self, index: int) -> bytes | np.ndarray:
        """The base's mask ``indices[index]``."""
        return self.base.read_mask(int(self.indices[index]))

    def name(self, index: int) -> str:
        """The base's name of the sample."""
        return self.base.name(int(self.indices[index]))

    def mask_name(self, index: int) -> str:
        """The base's name of the mask."""
        return self.base.mask_name(int(self.indices[index]))

    def forget(self, index: int) -> bool:
        """The base's, for sample ``indices[index]``."""
        return self.stored.forget(int(self.indices[index]))

    def plan_reads(self, indices: Any, upcoming: Any = None) -> None:
        """The base's, for samples ``indices[indices]`` (and ``indices[upcoming]``)."""
        ahead = None if upcoming is None else self.indices[np.asarray(upcoming, dtype=np.int64)]
        self.stored.plan_reads(self.indices[np.asarray(indices, dtype=np.int64)], ahead)

    def plan_epoch(self, order: Any, following: Callable[[], Any]) -> None:
        """The base's, for samples ``indices[order]`` (and ``indices[following()]``)."""
        base = self.indices

        def mapped() -> Any:
            return base[np.asarray(following(), dtype=np.int64)]

        self.stored.plan_epoch(base[np.asarray(order, dtype=np.int64)], mapped)

    def bypass_page_cache(self) -> bool:
        """The base's."""
        return self.stored.bypass_page_cache()

    def reads_direct(self) -> bool:
        """The base's."""
        return self.stored.reads_direct()

    def native_reads(self) -> str | None:
        """The base's."""
        return self.stored.native_reads()

    def file_paths(self, index: int) -> tuple[str, str | None]:
        """The base's paths of sample ``indices[index]``."""
        return self.stored.file_paths(int(self.indices[index]))

    def file_range(self, index: int) -> tuple[str, int, int, int] | None:
        """The base's byte range of sample ``indices[index]``."""
        return self.stored.file_range(int(self.indices[index]))

    def pixel_size(self) -> tuple[int, int] | None:
        """The base's."""
        return self.base.pixel_size()

    def pixel_channels(self) -> int | None:
        """The base's."""
        return self.base.pixel_channels()

    def open_in_worker(self) -> None:
        """Reopen the base's handles."""
        self.base.open_in_worker()

    def close(self) -> None:
        """Close the base."""
        self.base.close()

    def fingerprint(self) -> str:
        """The base's, with the subset's samples, labels and classes."""
        h = hashlib.blake2b(self.base.fingerprint().encode(), digest_size=12)
        h.update(self.tag.encode() + self.indices.tobytes() + self.labels.tobytes())
        h.update("\0".join(self.classes or []).encode())
        return h.hexdigest()


def pick_classes(source: Source, names: Any) -> Source:
    """Keep only the classes ``names`` (in that order: class ``k`` is ``names[k]``)."""
    if source.sample_fields is not None:
        raise SourceError(
            "class_names= picks the samples of some classes from a source's labels; a "
            "per-sample dataset's labels are its own: filter the dataset itself (a Hugging Face "
            "dataset's .filter(), a torch Subset)"
        )
    if source.classes is None:
        raise SourceError(
            "class_names= picks classes by name, but this source has no class names (its "
            "labels are numbers); give labels as names, or a folder of class subfolders"
        )
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise SourceError(f"class_names={names!r}: give a list of class names (['cat', 'dog'])")
    wanted = [str(n) for n in names]
    missing = [n for n in wanted if n not in source.classes]
    if missing or len(set(wanted)) != len(wanted) or not wanted:
        raise SourceError(
            f"class_names={wanted!r}: each must be one of the source's classes, once "
            f"({', '.join(source.classes)}); missing: {', '.join(missing) or '-'}"
        )
    old = {source.classes.index(n): k for k, n in enumerate(wanted)}
    mapping = np.full(len(source.classes), -1, dtype=np.int64)
    for before, after in old.items():
        mapping[before] = after
    labels = np.asarray(source.labels, dtype=np.int64)
    keep = np.flatnonzero((labels >= 0) & (mapping[np.clip(labels, 0, None)] >= 0))
    return SubsetSource(source, keep, mapping[labels[keep]], wanted, tag="classes")

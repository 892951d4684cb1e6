"""What a training script needs before its Loader exists: the class names (for the model's
head, an image processor's ``id2label``) and the class count (a soft-label
``batch_transform``), read from the source alone, without a pipeline, a worker or a batch.

A folder reads its class subfolders (through the scan cache a Loader would use), a CSV/TSV
or Parquet shards their text labels or stored class names, HDF5 its ``classes`` attribute, a
Hugging Face dataset its ``ClassLabel`` feature and a torchvision-style dataset its
``classes``; ``class_names=``, ``validation_split=`` and the other source arguments mean what
they mean for ``Loader``, so the answer is the Loader's own ``class_names``."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..sources.dataset import dataset_classes, is_dataset
from ..sources.targets import class_count, class_ids
from .options import Options
from .wiring import open_selected


def class_names(source: Any = None, **kwargs: Any) -> list[str] | None:
    """The class names ``Loader(source, **kwargs).class_names`` would have (class id ``k`` is
    ``names[k]``), without making the Loader; None when the source has none (numeric labels).
    ``kwargs`` are the Loader's own (``class_names=``, ``label_column=``, ``labels=``, ...)."""
    return _classes(source, kwargs)[0]


def num_classes(source: Any = None, **kwargs: Any) -> int:
    """How many classes ``Loader(source, **kwargs)`` has: the class names' count, else the
    largest integer label plus one (as ``label_mode="categorical"`` counts them); an error when
    the source has neither (numeric targets, or a dataset without class names)."""
    names, labels = _classes(source, kwargs)
    if names:
        return len(names)
    if labels is None:
        raise ConfigError(
            "num_classes: this dataset carries no class names (no ClassLabel feature 'label', no "
            ".classes list of names); count its classes yourself"
        )
    ids = class_ids(labels)
    if ids is None or len(ids) == 0 or (ids < 0).any():
        raise ConfigError(
            "num_classes: this source has no class names and its labels are not class ids "
            "(numeric targets, or unlabeled samples); count its classes yourself"
        )
    return class_count(ids, None)


def _classes(source: Any, kwargs: dict[str, Any]) -> tuple[list[str] | None, Any]:
    """``(class names, labels)`` of the source as the Loader would open and cut it; a
    per-sample dataset gives ``(its class names, None)`` without loading a sample."""
    opts = Options.from_kwargs(source=source, **kwargs)
    if is_dataset(source):
        return dataset_classes(source), None
    opened = open_selected(opts.source, opts.order.seed)
    try:
        names = None if opened.classes is None else list(opened.classes)
        return names, opened.labels.copy()
    finally:
        opened.close()

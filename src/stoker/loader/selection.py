"""Which samples a loader sees, as Keras' ``image_dataset_from_directory`` chooses them:
``class_names`` (a subset of classes, in a given order) and ``validation_split`` + ``subset``
(a seeded, disjoint training/validation split, optionally stratified), or the last fraction
unshuffled as Keras' ``fit(validation_split=)`` cuts arrays (``validation_cut="last"``)."""

from __future__ import annotations

from typing import Any

from .. import order
from ..errors import ConfigError
from ..sources.base import Source
from ..sources.subset import SubsetSource, pick_classes
from ..sources.targets import class_ids

SUBSETS = ("training", "validation")
CUTS = ("random", "last")


def check_cut(cut: Any, stratify: bool = False) -> str:
    """``validation_cut``: "random" (a seeded permutation) or "last" (Keras ``fit``'s cut)."""
    if not isinstance(cut, str) or cut not in CUTS:
        raise ConfigError(
            f"validation_cut={cut!r}: use 'random' (a seeded permutation, as Keras' "
            "image_dataset_from_directory) or 'last' (the last fraction in order, unshuffled, as "
            "Keras' fit(validation_split=) on arrays)"
        )
    if cut == "last" and stratify:
        raise ConfigError(
            "stratify=True draws each class's share at random; validation_cut='last' takes the "
            "last samples in order: use one of them"
        )
    return cut


def check_split(validation_split: Any, subset: Any) -> float | None:
    """Validate ``validation_split`` / ``subset`` together, as Keras does."""
    if validation_split is None:
        if subset is not None:
            raise ConfigError(f"subset={subset!r} needs validation_split= (e.g. 0.2)")
        return None
    ok = isinstance(validation_split, (int, float)) and not isinstance(validation_split, bool)
    if not ok or not 0.0 < float(validation_split) < 1.0:
        raise ConfigError(f"validation_split={validation_split!r}: give a fraction in (0, 1)")
    if subset not in SUBSETS:
        raise ConfigError(
            f"validation_split needs subset='training', 'validation' or 'both' (got {subset!r})"
        )
    return float(validation_split)


def select(
    source: Source,
    *,
    class_names: Any,
    validation_split: float | None,
    subset: Any,
    seed: int,
    stratify: bool,
    cut: str = "random",
) -> Source:
    """``source`` cut to the classes and the split part asked for (itself if neither)."""
    if class_names is not None:
        source = pick_classes(source, class_names)
    if validation_split is None:
        return source
    labels = class_ids(source.labels) if stratify else None
    if stratify and labels is None:
        raise ConfigError("stratify=True needs integer class labels to stratify by")
    if cut == "last":
        training, validation = order.split_last(len(source), validation_split)
    else:
        training, validation = order.split(len(source), validation_split, seed, labels)
    part = training if subset == "training" else validation
    if len(part) == 0:
        raise ConfigError(
            f"validation_split={validation_split} of {len(source)} samples leaves the "
            f"{subset} subset empty; change validation_split"
        )
    tag = f"{subset}:{validation_split}:{seed}:{stratify}" + (":last" if cut == "last" else "")
    return SubsetSource(source, part, tag=tag)

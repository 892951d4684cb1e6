"""stoker keeps an accelerator fed: image batches decoded in parallel and prefetched.

``import stoker`` imports no ML framework; the adapters import theirs when called. ``Loader``,
``class_names`` and ``num_classes`` load ``stoker.loader`` at their first use (PEP 562), so a
worker process, which imports this package too, never loads the loader it runs for.
"""

from typing import TYPE_CHECKING, Any

from . import ops
from ._version import __version__
from .errors import (
    ConfigError,
    DecodeError,
    DecompressionBombError,
    ObjectChanged,
    ResourceLimitError,
    SourceError,
    StokerError,
    StokerWarning,
    TooManyErrors,
    WorkerDied,
    WorkerHung,
)
from .sources.dataset import sample_rng
from .stats import Figures, StatsReport, WaitMeter

if TYPE_CHECKING:
    from .loader import Loader
    from .loader.classes import class_names, num_classes

__all__ = [
    "Loader",
    "class_names",
    "num_classes",
    "sample_rng",
    "StatsReport",
    "WaitMeter",
    "Figures",
    "StokerWarning",
    "ops",
    "StokerError",
    "ConfigError",
    "SourceError",
    "DecodeError",
    "DecompressionBombError",
    "ObjectChanged",
    "ResourceLimitError",
    "TooManyErrors",
    "WorkerDied",
    "WorkerHung",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """``stoker.Loader``, ``stoker.class_names`` and ``stoker.num_classes``, imported on first
    use (see the module docstring)."""
    if name == "Loader":
        from .loader import Loader

        return Loader
    if name in ("class_names", "num_classes"):
        from .loader import classes

        return getattr(classes, name)
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""stoker keeps an accelerator fed: image batches decoded in parallel and prefetched.

``import stoker`` imports no ML framework; the adapters import theirs when called.
"""

from . import ops
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
from .loader import Loader
from .loader.classes import class_names, num_classes
from .sources.dataset import sample_rng
from .stats import Figures, StatsReport, WaitMeter

__version__ = "0.1.0"

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

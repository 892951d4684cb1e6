"""The exception tree: every error stoker raises on purpose derives from StokerError."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def one_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` (just the type name for an empty message)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class StokerError(Exception):
    """Base class of every error that stoker raises on purpose."""


class ConfigError(StokerError, ValueError):
    """A Loader argument is invalid; the message says how to fix it."""


class SourceError(StokerError, ValueError):
    """A data source cannot be opened or indexed (missing folder, empty CSV, bad array)."""


class DecodeError(StokerError, ValueError):
    """An image file cannot be decoded (corrupt, truncated, unsupported or not an image)."""


class DecompressionBombError(DecodeError):
    """An image claims more pixels than ``max_pixels`` allows; refused before allocation."""


class TooManyErrors(StokerError):
    """More samples failed to load than the ``max_errors`` budget allows."""


class WorkerDied(StokerError):
    """A worker process ended without being asked to (killed by a signal, ``os._exit``, crash)."""


class WorkerHung(StokerError):
    """A worker made no progress within the loader's ``timeout``."""


class ClusterError(StokerError):
    """The cluster cannot decode for this loader: a node differs from the trainer, cannot
    read the data, or every node is gone."""


class ObjectChanged(StokerError):
    """An object in a bucket was replaced after the dataset was listed (its ETag or generation
    changed): never a bad sample to skip, since its bytes would mix two versions of the data."""


class ResourceLimitError(StokerError, OSError):
    """The operating system refused a file or a mapping: a per-process limit was reached (the
    message names it and the fix)."""


def limit_error(exc: OSError, doing: str) -> OSError:
    """A ResourceLimitError naming the operating-system limit behind ``exc`` (failing to
    ``doing``, e.g. "start worker process 3") and its fix; ``exc`` itself when no limit is
    behind it."""
    why = _LIMITS.get(exc.errno or 0)
    if why is None:
        return exc
    return ResourceLimitError(f"cannot {doing}: {why(_rlimit)}")


def _rlimit(name: str) -> str:
    """This process's soft limit ``name`` (``RLIMIT_NOFILE``...) as text; "?" where unknown."""
    try:
        import resource

        soft = resource.getrlimit(getattr(resource, name))[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return "?"
    return "unlimited" if soft < 0 or soft >= 2**62 else str(soft)


def _limits() -> dict:
    import errno

    return {
        errno.EMFILE: lambda r: (
            f"too many open files in this process (the per-process limit, ulimit -n, is "
            f"{r('RLIMIT_NOFILE')}). Raise it (ulimit -n 65536, or LimitNOFILE= for a service) "
            "or use fewer workers"
        ),
        errno.ENFILE: lambda r: (
            "the system's table of open files is full (the kernel's fs.file-max). Close files "
            "other programs hold or raise it (sysctl -w fs.file-max=1000000)"
        ),
        errno.EAGAIN: lambda r: (
            f"the limit of processes and threads was reached (ulimit -u is "
            f"{r('RLIMIT_NPROC')}, or the container's pids limit). Use fewer workers or "
            "worker_threads, or raise the limit (ulimit -u; docker run --pids-limit)"
        ),
        errno.ENOMEM: lambda r: (
            "out of memory (or of the kernel's memory mappings, vm.max_map_count). Use fewer "
            "workers, a smaller batch_size or prefetch, or free memory"
        ),
        errno.ENOSPC: lambda r: (
            "no space left on the device. Free space there (or, for shared memory, enlarge "
            "/dev/shm)"
        ),
    }


_LIMITS = _limits()


#: Errors that mean "this sample's data is bad" (counted against max_errors), not a bug.
DATA_ERRORS = (DecodeError, SourceError, OSError)


class StokerWarning(UserWarning):
    """Warnings about the data (a skipped bad file, a link loop) or the machine (a small
    /dev/shm, more workers than cores)."""


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the function calling this one that
    points at the first line outside stoker (the user's ``Loader(...)``), however deep the
    call: frames in stoker's files, and the generated code (``<string>``: dataclass
    ``__init__``) that stoker's frames call, are passed over."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and _ours(frame):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str) -> None:
    """Give a :class:`StokerWarning` that points at the user's line (the first frame outside
    stoker, :func:`user_stacklevel`), wherever in stoker it is raised: every StokerWarning
    goes through here."""
    warnings.warn(message, StokerWarning, stacklevel=user_stacklevel())


def _ours(frame: FrameType) -> bool:
    """Whether ``frame`` runs stoker's code, or code generated for it (called from it)."""
    name = frame.f_code.co_filename
    if name.startswith(_PACKAGE):
        return True
    return name.startswith("<") and frame.f_back is not None and _ours(frame.f_back)


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; set as ``__cause__`` of a re-raised error."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb

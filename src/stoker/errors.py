"""The exception tree: every error stoker raises on purpose derives from StokerError."""

from __future__ import annotations


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


class ResourceLimitError(StokerError, OSError):
    """The operating system refused a file or a mapping: a per-process limit was reached (the
    message names it and the fix)."""


class StokerWarning(UserWarning):
    """Warnings about the data (a skipped bad file, a link loop) or the machine (a small
    /dev/shm, more workers than cores)."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; set as ``__cause__`` of a re-raised error."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb

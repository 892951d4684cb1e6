"""Where a command writes, checked before it does any work.

``stoker bench --plot``, ``stoker show --out``, ``stoker demo --out`` and the folder of
``stoker convert`` are checked before the first batch is loaded: a file's folder must exist, be a
folder and be writable, and the file's suffix must be one the command writes; a folder that does
not exist yet must be creatable (its nearest existing parent writable). The check creates
nothing: writability is asked of the operating system with ``access(2)``, which also reports a
read-only file system, so a mistyped path costs nothing instead of the whole run.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError

__all__ = ["output_file", "output_folder"]


def output_file(flag: str, path: str | os.PathLike[str], suffix: str, what: str) -> Path:
    """``path`` (the value of ``flag``), checked as a ``suffix`` file that can be written."""
    out = Path(path)
    if out.suffix.lower() != suffix:
        raise ConfigError(
            f"{flag} {out}: {what} is written as {suffix[1:].upper()}; name it *{suffix}"
        )
    if out.is_dir():
        raise ConfigError(
            f"{flag} {out}: is a folder; name a file in it, e.g. {out / ('out' + suffix)}"
        )
    folder = out.parent
    if not folder.exists():
        raise ConfigError(f"{flag} {out}: the folder {folder} does not exist; create it first")
    if not folder.is_dir():
        raise ConfigError(f"{flag} {out}: {folder} is not a folder")
    if out.exists() and not os.access(out, os.W_OK):
        raise ConfigError(f"{flag} {out}: the file exists and cannot be written ({_why(out)})")
    if not out.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {out}: cannot write in {folder} ({_why(folder)})")
    return out


def output_folder(flag: str, path: str | os.PathLike[str]) -> Path:
    """``path`` (the value of ``flag``), checked as a folder that exists and can be written, or
    that can be created."""
    out = Path(path)
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"{flag} {out}: is not a folder; name a folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {out}: cannot write in this folder ({_why(out)})")
        return out
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {out}: cannot create it: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {out}: cannot create it in {parent} ({_why(parent)})")
    return out


def _why(path: Path) -> str:
    """Why ``path`` cannot be written: a read-only file system, or its permissions."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    except OSError:
        pass
    return "permission denied"

"""The folders a worker process imports from: the trainer's ``sys.path``, less what another
user could plant a module in.

A worker imports stoker, numpy and the user's callables from the folders this process
imports from (stoker's own folder first), with three kinds of entry left out:

- an entry that Python made from an empty or relative ``PYTHONPATH`` entry (``PYTHONPATH=/mine:``
  ends in one): Python resolved it against the folder the trainer started in, which is rarely
  meant to be on the path; the trainer is warned once, naming the folder;
- a folder anyone may write in (mode ``o+w``, such as ``/tmp`` or a shared sticky project
  folder): anyone there can leave a ``numpy.py`` (the trainer is warned once too);
- a relative entry or ``""`` (``python -c``, a notebook) is not left out: it becomes the folder
  it names for this process now (where this process itself imports from), then the rule above
  applies to that folder.

Which entries came from ``PYTHONPATH`` is worked out from where Python puts them: right after
``sys.path[0]``, before the standard library, duplicates dropped (:func:`from_loose_entries`).
"""

from __future__ import annotations

import os
import stat
import sys
import warnings

from ..errors import StokerWarning

__all__ = ["worker_path", "from_loose_entries"]

_STOKER_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_warned: set[str] = set()  # folders this process was warned about (once each)


def worker_path() -> list[str]:
    """The ``sys.path`` a worker imports from: stoker's own folder, then this process's path
    (so a callable that travels by reference is imported from where this process found it),
    less the folders the module docstring names."""
    cwd = os.getcwd()
    entries = [os.path.normpath(os.path.join(cwd, p)) for p in sys.path if isinstance(p, str)]
    pythonpath = "" if sys.flags.ignore_environment else os.environ.get("PYTHONPATH", "")
    loose = from_loose_entries(entries, pythonpath)
    kept: list[str] = [_STOKER_ROOT]
    for entry in entries:
        if entry == _STOKER_ROOT:
            continue
        if entry in loose:
            _warn_once(entry, _LOOSE.format(folder=entry, pythonpath=pythonpath))
        elif _anyone_writes(entry):
            _warn_once(entry, _SHARED.format(folder=entry))
        else:
            kept.append(entry)
    return kept


_LOOSE = (
    "PYTHONPATH={pythonpath!r} holds an empty or relative entry, so Python put {folder} (the "
    "folder this process started in) on sys.path: this process imports from it, and a module "
    "someone leaves there (numpy.py) runs in it. stoker's worker processes leave it out; "
    "remove the entry from PYTHONPATH (a trailing ':' is one)"
)
_SHARED = (
    "sys.path holds {folder}, a folder anyone can write in: a module someone leaves there "
    "(numpy.py) runs in this process. stoker's worker processes leave it out, so a module of "
    "yours there is not found by them; keep your code in a folder of your own"
)


def _warn_once(folder: str, message: str) -> None:
    if folder not in _warned:
        _warned.add(folder)
        warnings.warn(message, StokerWarning, stacklevel=4)


def _anyone_writes(folder: str) -> bool:
    """Whether ``folder`` lets every user create files in it (``o+w``, sticky or not)."""
    try:
        mode = os.stat(folder).st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and bool(mode & stat.S_IWOTH)


def from_loose_entries(path: list[str], pythonpath: str) -> set[str]:
    """The entries of ``path`` (normalised, absolute) that Python made from the empty or
    relative entries of ``pythonpath``: each resolved against the folder Python started in.

    That folder is found as the one under which the resolved ``PYTHONPATH`` entries, with
    duplicates dropped as ``site`` drops them, are the run of ``path`` just before the
    standard library; of several, the longest run wins. An entry that is also ``path[0]`` (the
    script's folder) or an absolute ``PYTHONPATH`` entry is kept; when no folder fits, the
    entries are resolved against the current folder."""
    entries = pythonpath.split(os.pathsep) if pythonpath else []
    loose = [e for e in entries if not os.path.isabs(e)]
    if not loose:
        return set()
    head = path[: _stdlib_at(path)]
    best: tuple[int, str] | None = None
    for start in _candidates(head, loose):
        at = _run_start(head, [os.path.normpath(os.path.join(start, e)) for e in entries])
        if at is not None and (best is None or at < best[0]):
            best = (at, start)
    start = best[1] if best is not None else os.getcwd()
    named = {os.path.normpath(os.path.join(start, e)) for e in loose}
    explicit = {os.path.normpath(e) for e in entries if os.path.isabs(e)}
    return named - explicit - set(path[:1])


def _stdlib_at(path: list[str]) -> int:
    """Where the standard library starts in ``path`` (its zip or its folder), or its end."""
    stdlib = os.path.dirname(os.__file__)
    zipped = f"python{sys.version_info[0]}{sys.version_info[1]}.zip"
    for k, entry in enumerate(path):
        if entry == stdlib or os.path.basename(entry) == zipped:
            return k
    return len(path)


def _candidates(head: list[str], loose: list[str]) -> list[str]:
    """Folders Python may have started in: those under which a loose entry names an entry."""
    out: list[str] = []
    for entry in head:
        for e in loose:
            tail = os.path.normpath(e)
            if tail == ".":
                out.append(entry)
            elif entry.endswith(os.sep + tail):
                out.append(entry[: -len(tail) - 1] or os.sep)
    return list(dict.fromkeys(out))


def _run_start(head: list[str], resolved: list[str]) -> int | None:
    """The index where ``resolved`` (less what ``site`` drops as duplicates of what comes
    before) is exactly the end of ``head``; None if nowhere."""
    unique = list(dict.fromkeys(resolved))
    for at in range(len(head)):
        before = set(head[:at])
        if head[at:] == [r for r in unique if r not in before] and head[at:]:
            return at
    return None

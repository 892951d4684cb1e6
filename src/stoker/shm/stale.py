"""Stale-segment cleanup: the segments (and lock files) of owners that are provably gone.

An owner is gone when its lock file is free (:mod:`.ownerlock`), never because its pid is
missing here (it may run in another PID namespace that shares ``/dev/shm``).
"""

from __future__ import annotations

import os

from . import ownerlock, reaper
from .folder import segment_dirs


def stale_segments(owner: str | None = None) -> list[str]:
    """Paths of stoker segments whose owner is provably gone (its lock is free), or, given
    ``owner`` (a tag, ``<pid>_<token>``), all of that owner's."""
    return _stale(owner, remove=False)


def clean_stale(owner: str | None = None) -> list[str]:
    """Remove the segments (and lock files) of owners provably gone, or all of ``owner``'s;
    return the segments' paths."""
    return _stale(owner, remove=True)


def _stale(owner: str | None, remove: bool) -> list[str]:
    found = []
    for folder in segment_dirs():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        groups: dict[str, list[str]] = {}
        for name in names:
            who = ownerlock.owner_of(name)
            if who is not None and (owner is None or who == owner):
                groups.setdefault(who, [])
                if not ownerlock.is_lock(name):
                    groups[who].append(os.path.join(folder, name))
        for who, paths in groups.items():
            if who == owner:
                found += _remove(folder, who, paths) if remove else paths
                continue
            with ownerlock.gone(folder, who, _uid(paths, folder, who)) as dead:
                if dead:
                    found += _remove(folder, who, paths) if remove else paths
    return found


def _uid(paths: list[str], folder: str, who: str) -> int:
    """The user whose segments these are (whose lock file alone may vouch for them)."""
    for path in [*paths, ownerlock.lock_path(folder, who)]:
        try:
            return os.lstat(path).st_uid
        except OSError:
            continue
    return -1


def _remove(folder: str, who: str, paths: list[str]) -> list[str]:
    removed = []
    for path in paths:
        if os.path.lexists(path):
            reaper.remove_path(path)  # a segment, or a folder of them (a span cache)
            if not os.path.lexists(path):
                removed.append(path)
    try:
        os.unlink(ownerlock.lock_path(folder, who))
    except OSError:
        pass
    return removed

"""Who owns a segment, and whether it is provably gone: one lock file per owning process and
segment folder, held for as long as the process has segments there.

A segment is named ``stoker_<pid>_<token>_...``: its owner's *tag* is ``<pid>_<token>`` (the
token is random per process, so two processes with the same pid in two PID namespaces, as in
two containers sharing ``/dev/shm``, never share a tag). Before its first segment in a folder,
the owner creates ``stoker_<tag>.lock`` there (exclusively, mode 0600) and holds a shared
``flock`` on it; its reaper holds one too. The lock goes when the process's last segment there
is unlinked, and the kernel drops both holds when the processes end, however they end.

Another process removes a segment only when it can take that lock *exclusively* without
waiting (the owner and its reaper are both gone) and the lock file is the same user's as the
segment. A missing pid proves nothing (it may live in another PID namespace), so it is never a
reason; a segment whose lock file is missing (made by an older stoker, or a lock removed by
hand) is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import time
from collections.abc import Iterator

from ..errors import StokerError
from . import reaper

PREFIX = "stoker_"
LOCK_SUFFIX = ".lock"
TOKEN = secrets.token_hex(6)
_TRIES = 200  # a cleaner holds a fresh lock for a moment only: wait up to ~2 s for it to go
_state_lock = threading.Lock()
_held: dict[str, tuple[int, int, set[str]]] = {}  # folder -> (pid, fd, live segment paths)


def tag() -> str:
    """This process's owner tag, ``<pid>_<token>``."""
    return f"{os.getpid()}_{TOKEN}"


def owner_of(name: str) -> str | None:
    """The owner tag in a segment or lock file name, None for a name that is not stoker's."""
    if not name.startswith(PREFIX):
        return None
    parts = name[len(PREFIX) :].split("_", 2)
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    token = parts[1].removesuffix(LOCK_SUFFIX)
    return f"{parts[0]}_{token}" if token else None


def lock_path(folder: str, owner: str) -> str:
    """The lock file of owner tag ``owner`` in ``folder``."""
    return os.path.join(folder, f"{PREFIX}{owner}{LOCK_SUFFIX}")


def is_lock(name: str) -> bool:
    """True for the name of an owner's lock file."""
    return name.startswith(PREFIX) and name.endswith(LOCK_SUFFIX)


# ---------------------------------------------------------------------------- the owner's side


def adding(path: str) -> None:
    """Before creating segment ``path``: hold this process's lock in its folder."""
    folder = os.path.dirname(path)
    with _state_lock:
        held = _held.get(folder)
        if held is None or held[0] != os.getpid():
            held = (os.getpid(), _acquire(folder), set())
            _held[folder] = held
        held[2].add(path)


def removed(path: str) -> None:
    """Segment ``path`` was unlinked (or never made): once the folder has none of this
    process's segments left, its lock file goes."""
    folder = os.path.dirname(path)
    with _state_lock:
        held = _held.get(folder)
        if held is None or held[0] != os.getpid():
            return
        held[2].discard(path)
        if held[2]:
            return
        del _held[folder]
        lock = lock_path(folder, tag())
        with contextlib.suppress(OSError):
            os.unlink(lock)
        reaper.release_lock(lock)
        reaper.untrack_segment(lock)
        os.close(held[1])


def _acquire(folder: str) -> int:
    """Create this process's lock file in ``folder`` and hold it shared; its descriptor."""
    path = lock_path(folder, tag())
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    # announced before it exists, as a segment is: a death between the create and the hold
    # below still leaves the reaper the file to remove
    reaper.track_segment(path)
    for _ in range(_TRIES):
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            time.sleep(0.01)  # a cleaner that took our fresh lock is removing it
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.lstat(path).st_ino:
                reaper.hold_lock(path)
                return fd
        except OSError:
            pass  # taken (or removed) by a cleaner between our create and our lock
        os.close(fd)
        time.sleep(0.01)
    reaper.untrack_segment(path)
    raise StokerError(
        f"cannot create the lock file {path} for this process's shared-memory "
        "segments: another process keeps removing it"
    )


def forget_after_fork() -> None:
    """In a forked child: the parent's locks are the parent's (close our copies, never
    unlock: the hold belongs to the open file the parent still has)."""
    for _, fd, _ in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_after_fork)


# ---------------------------------------------------------------------------- a cleaner's side


@contextlib.contextmanager
def gone(folder: str, owner: str, uid: int) -> Iterator[bool]:
    """Whether ``owner``'s processes are provably gone from ``folder``'s point of view: its
    lock file there exists, is ``uid``'s, and can be locked exclusively now. While the block
    runs, the lock stays taken (so a cleaner removes the segments, then the lock file, inside
    it)."""
    path = lock_path(folder, owner)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield False  # no lock file (an older stoker, removed by hand) or not ours to open
        return
    try:
        st = os.fstat(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = st.st_uid == uid and os.lstat(path).st_ino == st.st_ino
        except OSError:
            taken = False  # held: the owner or its reaper is alive
        yield taken
    finally:
        os.close(fd)

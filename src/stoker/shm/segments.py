"""Shared-memory segments and shared arrays; the process that creates one owns and unlinks it.

Segments are plain files in ``/dev/shm`` (or a temporary folder when ``/dev/shm`` is too small)
named ``stoker_<owner pid>_<token>_<n>_<tag>``, created exclusively with mode 0600. Segments left
by a dead process are removed at the next start (:mod:`.stale`), but only when their owner is
provably gone. Space is reserved with ``posix_fallocate`` when
a segment is created: a full tmpfs gives a clear error then, never a bus error later.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import ResourceLimitError, StokerError
from . import ownerlock, reaper
from .folder import human_size, pick_folder, room_fix, segment_dirs

PREFIX = "stoker_"
ALIGN = 64
_counter = [0]


def _reserve(fd: int, size: int, path: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ShmFullError(path, size) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)


def _unlink_quietly(path: str, creator: int | None = None) -> None:
    """Remove a segment file, unless this is a forked child of the process that made it."""
    if creator is not None and creator != os.getpid():
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    reaper.untrack_segment(path)
    ownerlock.removed(path)


class ShmFullError(StokerError, OSError):
    """Not enough room in the segment folder for a shared-memory segment; ``fix`` says what
    to do (by default: what frees room for the batch ring in that folder)."""

    def __init__(self, path: str, size: int, fix: str | None = None) -> None:
        folder = os.path.dirname(path)
        super().__init__(
            f"no room for a {human_size(size)} shared-memory segment in {folder}: "
            f"{fix or room_fix(folder)}"
        )


def _limit_error(exc: OSError, path: str) -> OSError:
    """A stoker error naming the limit behind ``exc`` and the fix; ``exc`` itself otherwise."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return ResourceLimitError(
            f"cannot open {path}: too many open files (the limit of file descriptors per process,"
            " `ulimit -n`, or the system's fs.file-max). Raise it (ulimit -n 65536), or keep "
            "fewer batches: copy the arrays you keep (images.copy())"
        )
    if exc.errno == errno.ENOMEM:
        return ResourceLimitError(
            f"cannot map {path}: out of memory mappings (the kernel's vm.max_map_count, or "
            "memory). Keep fewer batches (copy the arrays you keep: images.copy()) or raise "
            "vm.max_map_count (sysctl -w vm.max_map_count=262144)"
        )
    return exc


def _map(fd: int, size: int) -> Any:
    """A shared read-write mapping of ``fd`` that keeps no file descriptor open.

    ``mmap.mmap`` keeps a duplicate of the descriptor for as long as the mapping lives (so one
    per batch the consumer keeps); Python 3.13 can drop it (``trackfd=False``), older ones map
    through libc here. The mapping is unmapped when the last array over it is gone.
    """
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, size, trackfd=False)  # type: ignore[call-arg]
    if _libc is None:
        return mmap.mmap(fd, size)
    addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    buf = (ctypes.c_char * size).from_address(addr)
    weakref.finalize(buf, _libc.munmap, ctypes.c_void_p(addr), ctypes.c_size_t(size))
    return buf


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_libc = _load_libc()


class Segment:
    """One shared-memory file mapped into this process (no file descriptor kept open)."""

    def __init__(self, path: str, size: int, owner: bool) -> None:
        self.path, self.size, self.owner = path, size, owner
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise _limit_error(exc, path) from exc
        try:
            self.map = _map(fd, size)
        except OSError as exc:
            raise _limit_error(exc, path) from exc
        finally:
            os.close(fd)
        # the owner's segment goes when its Segment object does (or at exit), even unclosed
        # (never in a forked child of its creator: the segment is the parent's)
        self._unlink = weakref.finalize(self, _unlink_quietly, path, os.getpid()) if owner else None

    @classmethod
    def create(cls, size: int, tag: str, folder: str | None = None) -> Segment:
        """Create, reserve and map a new segment owned by this process.

        Without ``folder``, ``/dev/shm`` is tried first and the temp folder when it is full.
        The reaper learns the path before the file exists, so no crash can leave it behind.
        """
        size = max(size, 1)
        folders = [folder] if folder else segment_dirs()
        for i, where in enumerate(folders):
            try:
                return cls._create_in(where, size, tag)
            except ShmFullError:
                if i == len(folders) - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _create_in(cls, folder: str, size: int, tag: str) -> Segment:
        _counter[0] += 1
        path = os.path.join(folder, f"{PREFIX}{ownerlock.tag()}_{_counter[0]}_{tag}")
        ownerlock.adding(path)  # held before the segment exists: never "stale" early
        reaper.track_segment(path)
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            reaper.untrack_segment(path)
            ownerlock.removed(path)
            raise _limit_error(exc, path) from exc
        try:
            _reserve(fd, size, path)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
        os.close(fd)
        try:
            return cls(path, size, owner=True)
        except BaseException:
            _unlink_quietly(path)
            raise

    @classmethod
    def attach(cls, path: str, size: int) -> Segment:
        """Map an existing segment created by another process."""
        return cls(path, size, owner=False)

    def handle(self) -> tuple[str, int]:
        """What another process needs to attach: ``(path, size)``."""
        return (self.path, self.size)

    def array(self, dtype: Any, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        """A numpy view of part of the segment."""
        return np.ndarray(shape, dtype=dtype, buffer=self.map, offset=offset)

    def unlink(self) -> None:
        """Remove the file; the memory goes once every mapping of it is gone."""
        if self._unlink is not None:
            self._unlink()
        else:
            _unlink_quietly(self.path)

    def close(self) -> None:
        """Drop this object's mapping; it is unmapped once no numpy view uses it.

        Never ``mmap.close()``: numpy views made with ``buffer=`` keep only a reference to the
        mmap object, so closing it would leave them pointing at unmapped memory.
        """
        self.map = None  # type: ignore[assignment]


_PICKLING = threading.local()


@contextmanager
def by_value() -> Iterator[None]:
    """While active (in this thread), SharedArrays pickle their arrays, not a handle: for a
    process on another machine, which cannot map this machine's segments. It unpickles them
    into a segment of its own, which its own workers then share."""
    _PICKLING.by_value = True
    try:
        yield
    finally:
        _PICKLING.by_value = False


class SharedArrays:
    """Named arrays copied once into one parent-owned segment; pickles as a small handle.

    A source sends its big read-only arrays (an index, in-memory images) to workers this way,
    so every worker maps the same pages instead of unpickling a copy of its own.
    """

    def __init__(self, arrays: dict[str, np.ndarray], tag: str) -> None:
        self._fill(arrays, tag)

    def _fill(self, arrays: dict[str, np.ndarray], tag: str) -> None:
        self.specs: list[tuple[str, str, tuple[int, ...], int]] = []
        offset = 0
        for name, arr in arrays.items():
            self.specs.append((name, arr.dtype.str, arr.shape, offset))
            offset += -(-arr.nbytes // ALIGN) * ALIGN
        self.segment = Segment.create(offset, tag, pick_folder(offset, f"a shared {tag}"))
        for (name, _, _, _), arr in zip(self.specs, arrays.values(), strict=True):
            self[name][...] = arr

    def __getitem__(self, name: str) -> np.ndarray:
        spec = next(s for s in self.specs if s[0] == name)
        return self.segment.array(np.dtype(spec[1]), spec[2], spec[3])

    @property
    def alive(self) -> bool:
        """False once the owner has unlinked the segment."""
        return os.path.exists(self.segment.path)

    def __getstate__(self) -> dict[str, Any]:
        if getattr(_PICKLING, "by_value", False):
            return {"arrays": {s[0]: np.ascontiguousarray(self[s[0]]) for s in self.specs}}
        return {"specs": self.specs, "handle": self.segment.handle()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "arrays" in state:  # sent by value (another machine): this process owns a copy
            self._fill(state["arrays"], "node")
            return
        self.specs, self.segment = state["specs"], Segment.attach(*state["handle"])

    def unlink(self) -> None:
        """Remove the segment (owner only; views already made stay valid)."""
        if self.segment.owner:
            self.segment.unlink()

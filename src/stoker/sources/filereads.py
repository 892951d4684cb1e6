"""File reads on native threads: the read-ahead window's reader for file, shard and tar sources.

A folder's (or a CSV's, a path list's) sample is one whole file, a Parquet shard's or a tar's one
byte range of its file, so the window's reads need no Python: the C module ``_readfiles`` opens,
checks and reads each on POSIX threads that never take the GIL, and the worker takes the bytes
by sample when it decodes. On Python threads the same window slows every decode on busy cores
(their wake-ups and the GIL); here a read costs the decoding thread one call to queue it and one
to take it (see benchmarks/README.md#native-reads). The checks are read_file's:
a FIFO, socket, device or folder named like an image is refused unread, a missing file is its
OSError, and a read past its deadline is abandoned (its thread replaced) and reported as late.

Without the module (no C compiler at install, or a stale build) ``AVAILABLE`` is False and the
window reads on Python threads.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .base import not_regular, short_read

API_VERSION = 1  # equal to STOKER_READFILES_API in _readfiles.c

STALE = ""  # why a built module is not used (a build from another stoker)
try:
    from . import _readfiles  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - built without a C compiler
    _readfiles = None
if _readfiles is not None and getattr(_readfiles, "API_VERSION", 0) != API_VERSION:
    STALE = f"the built {_readfiles.__file__} is from another stoker version"
    _readfiles = None  # Python threads read instead
AVAILABLE = _readfiles is not None


def describe() -> str:
    """Who runs the read-ahead window's file reads, and the fix when it is not native."""
    if AVAILABLE:
        return "native threads (stoker.sources._readfiles)"
    why = STALE or "stoker.sources._readfiles is not built (no C compiler at install?)"
    return (
        f"Python threads: {why}; the window then costs each decode more CPU. Fix: rebuild "
        "(pip install -e . in a clone, or python setup.py build_ext --inplace)"
    )


class Late(Exception):
    """A native read did not finish by its deadline (the caller reports it as a bad sample)."""


class NativeReads:
    """File reads (whole files or byte ranges) in flight on up to ``threads`` native threads,
    taken by sample."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pid = os.getpid()
        self._reader: Any = None  # made at the first read (_fresh): most windows never read
        self._mode = (False, False)

    def set_mode(self, direct: bool, drop: bool) -> None:
        """Reads queued from now on: ``direct`` around the page cache (``O_DIRECT``, cached
        where the file system refuses it), ``drop`` their pages from the cache after."""
        self._mode = (direct, drop)
        if self._reader is not None:
            self._reader.set_mode(direct, drop)

    def submit(self, index: int, paths: tuple[str, str | None]) -> NativeRead:
        """Queue sample ``index``'s file (and mask file) and return its pending read."""
        self._fresh()
        path, mask = paths
        self._reader.submit(2 * index, path)
        if mask is not None:
            self._reader.submit(2 * index + 1, mask)
        return NativeRead(self._reader, index, path, mask, dropped=self._mode[1])

    def submit_range(self, index: int, name: str, where: tuple[str, int, int, int]) -> NativeRead:
        """Queue ``length`` bytes at ``offset`` of the file (``where``: path, offset, length and
        a descriptor of it, or -1, which the read takes over; sample ``index``, called ``name``
        in errors) and return its pending read."""
        self._fresh()
        path, offset, length, fd = where
        self._reader.submit(2 * index, path, offset, length, fd)
        return NativeRead(self._reader, index, path, None, length, name, self._mode[1])

    def _fresh(self) -> None:
        """A reader of this process's own (at the first read, after a fork or a ``close``)."""
        if self._reader is None or os.getpid() != self._pid:
            self._pid, self._reader = os.getpid(), _readfiles.Reader(threads=self.threads)
            self._reader.set_mode(*self._mode)

    def discard(self) -> None:
        """Abandon every read not taken (queued ones are never read)."""
        if self._reader is not None and os.getpid() == self._pid:
            self._reader.discard()

    def close(self) -> None:
        """Abandon every read not taken and let the threads end (a later read starts new
        ones)."""
        self.discard()
        if os.getpid() == self._pid:
            self._reader = None  # its threads end once their reads do


class Deferred:
    """A sample the native reader cannot read (not one stored range): read when taken."""

    dropped = False  # read the usual way: its pages are the caller's to drop

    def __init__(self, source: Any, index: int) -> None:
        self.source, self.index = source, index

    def result(self, timeout: float) -> tuple[tuple[Any, None], float]:
        """``((data, None), seconds)``, read now by the source (raises what it raises)."""
        t0 = time.perf_counter()
        data = self.source.read(self.index)
        return (data, None), time.perf_counter() - t0


class NativeRead:
    """One sample's read in flight; ``result`` waits for it."""

    def __init__(
        self,
        reader: Any,
        index: int,
        path: str,
        mask: str | None,
        length: int = -1,
        name: str = "",
        dropped: bool = False,
    ) -> None:
        self._reader, self.index, self.path, self.mask = reader, index, path, mask
        self.length, self.name = length, name  # a byte range: its length, the sample's name
        self.dropped = dropped  # its pages leave the page cache as it is read

    def result(self, timeout: float) -> tuple[tuple[bytes, bytes | None], float]:
        """``((data, mask), seconds the reads took)``; raises the read's OSError, or ``Late``
        past ``timeout`` seconds (the read is abandoned)."""
        data, seconds = self._take(2 * self.index, self.path, timeout)
        if 0 <= self.length != len(data):
            raise short_read(self.name, len(data), self.length)
        mask = None
        if self.mask is not None:
            mask, more = self._take(2 * self.index + 1, self.mask, timeout)
            seconds += more
        return (data, mask), seconds

    def _take(self, tag: int, path: str, timeout: float) -> tuple[bytes, float]:
        got = self._reader.take(tag, timeout)
        if got is None:
            raise Late(path)
        if len(got) == 3:
            err, mode, _ = got
            if mode:
                raise not_regular(path, mode)
            raise OSError(err, os.strerror(err), path)
        return got

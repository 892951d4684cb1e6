"""Fetched spans of remote objects, held once per machine for every process of one loader.

A span is a byte range of one object of one version, named by ``SpanKey``. ``SpanCache.get``
returns its bytes, fetching them at most once however many threads and processes ask: the
first to ask fetches, the others wait for it and read what it wrote.

- ``SharedSpans(folder, limit)``: the spans of one loader's worker processes, as files in a
  private folder (mode 0700, created by the loader's own process with ``create_folder``, under
  the shared-memory folder, removed by ``remove_folder`` at close and by the reaper if the
  trainer is killed: ``shm.reaper``). A span is fetched by whoever holds its lock file's
  exclusive ``flock`` (single flight across processes; a killed fetcher's lock goes with it),
  written under a temporary name and renamed into place, so a span file is always whole. The
  folder holds at most ``limit`` bytes of spans (a process still reading one keeps its
  mapping), plus the spans being written at that moment. A folder that is not this user's
  alone (another owner, group or world access, a link) is never used.
- ``LocalSpans(limit)``: the same in one process's memory (``workers=0``, or a process that
  cannot reach the loader's folder: a node of a cluster), at most ``limit`` bytes.

Which spans go when the cache is full: those the plan needs last (``next_use``: how far ahead
each span is needed next, which the plan knows for this epoch and the next; Belady's rule), or,
where nothing tells that, the least recently used. Over epochs of data a little larger than the
cache, the least recently used is the worst choice: it drops the spans the epoch still needs.

Each process also keeps the spans it maps, at most ``MAPPED`` of them (least recently used
out first), so the memory a loader's spans take is bounded by ``limit`` plus ``MAPPED`` spans
per process. Nothing here decides which spans to fetch (``sources.spans`` does).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from ..shm import ownerlock, reaper
from ..shm.folder import pick_folder

DEFAULT_LIMIT = 256 << 20  # bytes of spans one loader's folder (or one process) holds
MAPPED = 16  # spans one process keeps mapped (or in memory) for the samples it reads next
POLL_S = 0.002  # how often a process waiting on another's fetch looks again
_counter = [0]


class SpanKey(NamedTuple):
    """One span: bytes ``[start, end)`` of the object at ``url``, of version ``tag``."""

    url: str
    start: int
    end: int
    tag: str = ""

    def file_name(self) -> str:
        """The span's file name in a shared folder (a hash: no URL on disk)."""
        text = f"{self.url}|{self.start}|{self.end}|{self.tag}"
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


Fetch = Callable[[SpanKey], bytes]
#: How far ahead the span of this file name (``SpanKey.file_name``) is needed next, in samples
#: of the plan (``math.inf``: not again that it knows of).
NextUse = Callable[[str], float]


class _Flight:
    """One span being fetched in this process: the others of this process wait on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data: bytes | mmap.mmap | None = None
        self.error: BaseException | None = None


class SpanCache:
    """The shared part: per-process single flight and the ``MAPPED`` spans held at hand."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = int(limit)
        self._lock = threading.Lock()
        self._hand: OrderedDict[SpanKey, bytes | mmap.mmap] = OrderedDict()
        self._flights: dict[SpanKey, _Flight] = {}
        self.fetched = self.shared = 0  # spans this process fetched / found fetched by another
        #: the plan's answer to which spans go first when the cache is full (None: the least
        #: recently used); see the module docstring
        self.next_use: NextUse | None = None

    def get(self, key: SpanKey, fetch: Fetch) -> bytes | mmap.mmap:
        """The span's bytes (sliceable), fetched at most once; raises what the fetch raised."""
        with self._lock:
            held = self._at_hand(key)
            if held is not None:
                return held
            flight = self._flights.get(key)
            mine = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        if not mine:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.data is not None
            return flight.data
        try:
            flight.data = self._load(key, fetch)
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
                if flight.data is not None:
                    self._hand[key] = flight.data
                    while len(self._hand) > MAPPED:
                        self._hand.popitem(last=False)  # a reader still slicing keeps it alive
            flight.done.set()
        return flight.data

    def held(self, key: SpanKey) -> bytes | mmap.mmap | None:
        """The span's bytes if this process holds it at hand now (never fetches, never
        waits), else None."""
        with self._lock:
            return self._at_hand(key)

    def _at_hand(self, key: SpanKey) -> bytes | mmap.mmap | None:
        """``held``'s answer, marked used now; under the lock."""
        data = self._hand.get(key)
        if data is not None:
            self._hand.move_to_end(key)
        return data

    def has(self, key: SpanKey) -> bool:
        """Whether this process holds the span at hand or is fetching it now."""
        with self._lock:
            return key in self._hand or key in self._flights

    def _load(self, key: SpanKey, fetch: Fetch) -> bytes | mmap.mmap:
        raise NotImplementedError

    def clear(self) -> None:
        """Drop the spans held at hand."""
        with self._lock:
            self._hand.clear()


class LocalSpans(SpanCache):
    """Spans in this process's memory, at most ``limit`` bytes; see the module docstring."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        super().__init__(limit)
        self._kept: OrderedDict[SpanKey, bytes] = OrderedDict()
        self._kept_bytes = 0

    def _load(self, key: SpanKey, fetch: Fetch) -> bytes:
        with self._lock:
            data = self._kept.get(key)
            if data is not None:
                self._kept.move_to_end(key)
                return data
        data = fetch(key)
        self.fetched += 1
        with self._lock:
            self._kept[key] = data
            self._kept_bytes += len(data)
            if self._kept_bytes > self.limit:
                for victim in _first_out(list(self._kept), key, self.next_use):
                    if self._kept_bytes <= self.limit:
                        break
                    self._kept_bytes -= len(self._kept.pop(victim))
        return data

    def clear(self) -> None:
        super().clear()
        with self._lock:
            self._kept.clear()
            self._kept_bytes = 0


class SharedSpans(SpanCache):
    """Spans as files in one loader's private folder; see the module docstring. ``wait`` is
    the longest one process waits for another's fetch before fetching the span itself."""

    def __init__(self, folder: str, limit: int = DEFAULT_LIMIT, wait: float = 60.0) -> None:
        super().__init__(limit)
        self.folder, self.wait = folder, wait

    def _load(self, key: SpanKey, fetch: Fetch) -> bytes | mmap.mmap:
        path = os.path.join(self.folder, key.file_name())
        found = _mapped(path, key)
        if found is not None:
            self.shared += 1
            return found
        with _locked(f"{path}.lock", self.wait) as locked:
            found = _mapped(path, key) if locked else None  # fetched while we waited
            if found is not None:
                self.shared += 1
                return found
            data = fetch(key)
            self.fetched += 1
            if locked:  # never written without the lock: another may be writing it
                self._write(path, data)
                # the span is in place: its lock goes (a waiter holding the old one checks
                # for the span first, so no span is fetched twice for want of the lock)
                with contextlib.suppress(OSError):
                    os.unlink(f"{path}.lock")
        return data

    def _write(self, path: str, data: bytes) -> None:
        """Write a span whole (a temporary name, then renamed into place), then trim."""
        temp = f"{path}.{os.getpid()}.{threading.get_ident()}.part"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(temp, flags, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(temp, path)
        except OSError:  # a full folder: the span is served from memory, not shared
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return
        self._trim(path)

    def _trim(self, keep: str) -> None:
        """Remove spans, those needed last first (``next_use``; else the least recently
        used), until the folder holds at most ``limit``."""
        spans = []
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            if "." in name:  # a lock or a span being written
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(self.folder, name))
                spans.append((st.st_mtime_ns, st.st_size, name))
        total = sum(size for _, size, _ in spans)
        if total <= self.limit:
            return
        sizes = {name: size for _, size, name in spans}
        ranked = [name for _, _, name in sorted(spans)]  # least recently used first
        for name in _first_out(ranked, os.path.basename(keep), self.next_use, str):
            if total <= self.limit:
                return
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, name))
            total -= sizes[name]


def _first_out(
    ranked: list[Any],
    keep: Any,
    next_use: NextUse | None,
    name: Callable[[Any], str] | None = None,
) -> list[Any]:
    """The spans of ``ranked`` (least recently used first) in the order they leave a full
    cache, ``keep`` (the one just added) not among them: those the plan needs last first,
    the least recently used first among equals and where nothing tells (``next_use`` None).
    ``name``: a span's file name (default: ``SpanKey.file_name``)."""
    out = [span for span in ranked if span != keep]
    if next_use is None:
        return out
    named = name or SpanKey.file_name
    far = [next_use(named(span)) for span in out]
    return [out[i] for i in sorted(range(len(out)), key=lambda i: -far[i])]


def _mapped(path: str, key: SpanKey) -> mmap.mmap | None:
    """The span file at ``path`` mapped (and marked used now), or None when it is not there
    or is not a whole span of ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        size = key.end - key.start
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != size:
            return None
        with contextlib.suppress(OSError):
            os.utime(fd)  # used now: trimmed last
        if size == 0:
            return None
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: str, wait: float):  # type: ignore[no-untyped-def]
    """Hold the exclusive ``flock`` of lock file ``path``: yields True once held, False when
    another process held it for longer than ``wait`` seconds (or it cannot be made)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + wait
        held = False
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_S)
        yield held
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- the folder


def create_folder(limit: int = DEFAULT_LIMIT) -> str:
    """Make this process's private span folder (0700) under the shared-memory folder, known
    to the reaper before it exists; its path."""
    _counter[0] += 1
    where = pick_folder(limit, "the span cache")
    path = os.path.join(where, f"{ownerlock.PREFIX}{ownerlock.tag()}_{_counter[0]}_spans")
    ownerlock.adding(path)
    reaper.track_segment(path)
    try:
        os.mkdir(path, 0o700)
    except OSError:
        reaper.untrack_segment(path)
        ownerlock.removed(path)
        raise
    return path


def remove_folder(path: str) -> None:
    """Remove a span folder made by ``create_folder`` in this process, with its spans."""
    reaper.remove_path(path)
    reaper.untrack_segment(path)
    ownerlock.removed(path)


def usable_folder(path: str) -> bool:
    """Whether ``path`` is a span folder this user alone can write: a folder (not a link),
    this user's, with no access for group or others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )

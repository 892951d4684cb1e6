"""Reads that run ahead of decoding: a bounded window of upcoming samples' reads in flight.

The one read-ahead of every source that waits on storage: files, shards, tars, ``.npy`` and
HDF5 on local disks, and remote shards (each read one ranged request). A worker decodes one
sample while the next few are being read, so the disk's (or the network's) queue stays full
while the core decodes (cold data: a read waits on the disk for a good part of a decode).
``ReadAhead.start(indices)`` is told a batch's samples in order; up to ``window`` of them are
read at once on threads (file reads release the GIL), and ``take(index)`` hands each one's bytes
over as it is needed. Nothing about the batch changes: the same samples, read by the same
``Source.read``, decoded in the same order.

Who reads: where a sample is one whole file (folders, CSV and path lists) or one byte range of
a file (Parquet shards, tars), native threads do (``Source.native_reads``; ``sources.filereads``,
the C module ``_readfiles``: no GIL, no future, a wake-up only when the reads fall behind), else
Python threads (``.npy``, HDF5, remote requests, a subclass's own ``read``).

While reads are cheap next to decoding (a warm page cache), ``window="auto"`` reads plainly on
the decoding thread: threads would cost more than they hide (``ENTER``/``LEAVE``; native reads
of whole files cost less, so they open the window at a tenth of a decode: ``NATIVE_ENTER``/
``NATIVE_LEAVE``). Such a plain read has no deadline of its own (the loader's ``timeout`` still
ends a worker stuck in one). Once reads cost more, the window sizes itself: from the measured
read latency and the time the caller spends from one ``take``'s return to the next ``take``
(decoding; never the time it waited for bytes, which would shrink the window exactly when reads
are slow), enough reads are kept in flight to cover a read's latency three times over (a cold
disk's latency varies a lot), between ``MIN_WINDOW`` and ``MAX_WINDOW`` (or the source's own
``read_ahead_max``: a remote source's requests take tens of milliseconds, so it lets the window
grow further), and never more completed bytes held than ``max_bytes``. A source that fetches
its planned samples ahead by itself (``fetches_ahead``: remote shards' fixed spans, fetched on
their own threads in the order the plan needs them) is read plainly under "auto": a window's
threads would only wait on the same fetches, and their wake-ups slowed decoding by about a tenth
(benchmarks/README.md#bucket); such a source keeps the deadline itself (``spans.ChunkReads``: a
sample waits for its span at most the request deadline). Every read has a deadline
(``timeout``): a file that never answers (a FIFO, a hung mount, a request with no reply) becomes
an ``OSError`` for that sample (a bad sample, replaced as usual) and its stuck thread is
replaced, so it never blocks the other samples.

A memory-mapped source's sample is copied off the mapping on the reading thread (``_owned``),
so its page faults happen there; ``NpySource.read`` asks for the row's pages at once
(``MADV_WILLNEED``), else each fault waits on its own read-around in turn and the window gains
nothing (measured: benchmarks/README.md, "Memory-mapped rows").

Page-cache citizenship (``page_cache``): ``"drop"`` leaves no sample's pages in the page cache:
files are read with ``O_DIRECT`` where the file system allows it (``Source.bypass_page_cache``:
no page is cached, and it costs less CPU than a cached read), else the kernel is told to drop
them once read (``Source.forget``: ``posix_fadvise(DONTNEED)``); ``"keep"`` never does;
``"auto"`` drops only once the dataset is known not to fit in RAM (mean bytes per sample read so
far x samples > the machine's memory), where keeping them would only evict everything else.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import fetch, filereads
from .base import Source, stored_reads
from .fetchpolicy import DEFAULT_RATE

MIN_WINDOW = 4
MAX_WINDOW = 32
START_WINDOW = 8
COVER = 3  # reads in flight cover this many read latencies of decoding
# "auto" reads plainly, on the decoding thread, until a read costs more than ENTER x the
# caller's decode time, and goes back to plain reads below LEAVE x. The window's threads are not
# free (their wake-ups and the GIL slow every decode on busy cores), so they pay only where a
# read costs a good part of a decode: a cold folder on a slow disk, remote shards; see
# benchmarks/README.md#read-ahead-window and benchmarks/README.md#remote-shards.
ENTER, LEAVE = 0.5, 0.25
# Native reads of whole files (sources.filereads: no GIL, a wake-up only when the reads fall
# behind) cost the decoding thread far less, so they open the window once a read costs a tenth
# of a decode (a cold folder), while warm reads stay plain. Byte ranges (Parquet shards, tars)
# keep ENTER/LEAVE: the kernel reads a shard ahead by itself, and a native window open all the
# time is no faster there; see benchmarks/README.md#native-reads and benchmarks/README.md#tars.
NATIVE_ENTER, NATIVE_LEAVE = 0.1, 0.05
DEFAULT_MAX_BYTES = 64 << 20  # completed bytes one worker may hold ahead
MAX_LOST_THREADS = 32  # threads stuck at once on dead files before read-ahead gives up
IDLE_S = 10.0  # a reading thread with nothing to do for this long ends
SIZE_AFTER = 64  # samples read before "auto" judges whether the dataset fits in RAM
PLAN_AHEAD = 4  # batches past the current one whose samples a source is told (plan_reads)
PAGE_CACHE = ("auto", "keep", "drop")


def larger_than_ram(read_bytes: int, reads: int, samples: int, ram: int) -> bool:
    """``page_cache="auto"``'s decision: whether ``samples`` samples, at the mean size of the
    ``reads`` read so far (``read_bytes`` in all), would not fit in ``ram`` bytes of memory;
    False when the memory is unknown (``ram`` 0) or nothing was read yet."""
    return bool(ram) and reads > 0 and read_bytes / reads * samples > ram


def auto_window(window: int, share: float, native_files: bool, max_window: int) -> int:
    """The auto window's next size, from its size now and ``share`` (a read's latency over the
    caller's decode time): 0 (plain reads) while a closed window's share is below the threshold
    to open it (``NATIVE_ENTER`` for native reads of whole files, else ``ENTER``) or an open
    one's is below the threshold to close it (``NATIVE_LEAVE`` / ``LEAVE``); else enough reads
    in flight to cover ``COVER`` read latencies of decoding, within ``[MIN_WINDOW,
    max_window]``. A pure function: the whole pacing policy, tested without threads."""
    enter, leave = (NATIVE_ENTER, NATIVE_LEAVE) if native_files else (ENTER, LEAVE)
    if window == 0 and share < enter or window and share < leave:
        return 0
    return max(MIN_WINDOW, min(max_window, math.ceil(COVER * share) + 1))


@dataclass(frozen=True)
class ReadSettings:
    """How a worker reads: read-ahead window (``"auto"``, a count, or 0 for plain reads),
    the cap on bytes held ahead, the per-read deadline in seconds, the page-cache policy, and
    the most requests/s per prefix of an object store (``sources.fetch``)."""

    window: int | str = "auto"
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout: float = 60.0
    page_cache: str = "auto"
    request_rate: float = DEFAULT_RATE


@dataclass
class ReadCounters:
    """What reading cost so far: bytes, reads and the largest sample read."""

    nbytes: int = 0
    reads: int = 0
    largest: int = 0
    dropped: int = 0  # samples whose pages were dropped from the page cache


def memory_bytes() -> int:
    """The machine's physical memory in bytes (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class ReadAhead:
    """One process's read-ahead window over a source; see the module docstring."""

    def __init__(self, source: Source, settings: ReadSettings | None = None) -> None:
        self.source = source
        #: the source's hints for reading ahead (``StoredReads``; none for memory or user code)
        self.stored = stored_reads(source)
        self.settings = settings or ReadSettings()
        # requests give up (retries included) before the read's deadline, so a store that keeps
        # failing is named by its own error, not by the window's "no bytes after" one
        fetch.configure(rate=self.settings.request_rate, timeout=0.8 * self.settings.timeout)
        fixed = self.settings.window
        self.auto = fixed == "auto"
        self.window = START_WINDOW if self.auto else int(fixed)  # type: ignore[arg-type]
        if self.auto and self.stored.fetches_ahead:
            self.window = 0  # the source reads ahead itself: plain reads, no window threads
        self.max_window = max(MIN_WINDOW, int(self.stored.read_ahead_max or MAX_WINDOW))
        self.enabled = self.stored.parallel_reads and self.window > 0
        self.masks = bool(source.has_masks)
        self.counters = ReadCounters()
        self.held = self.peak_held = 0  # completed bytes not yet taken
        self.lost = 0  # threads still stuck on reads abandoned past their deadline
        self._gave_up = False  # too many stuck at once: reading plainly until they come back
        self._drop = self.settings.page_cache == "drop"
        self._early: list[int] = []  # samples read before "auto" judged the dataset's size
        if self._drop:
            self.stored.bypass_page_cache()
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[tuple[int, cf.Future] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._todo: deque[int] = deque()
        self._ahead: deque[tuple[int, cf.Future]] = deque()
        self._returned_at = 0.0  # when the last take returned (0: none yet in this batch)
        self._decode_s = 0.0  # smoothed time from a take's return to the next take (decoding)
        self._latency_s = 0.0  # smoothed time one read takes (plain or on a thread)
        self._pid = os.getpid()
        # "files", "ranges" (native threads read: sources.filereads) or None (Python threads)
        usable = filereads.AVAILABLE and self.stored.parallel_reads
        self._native_kind = self.stored.native_reads() if usable else None
        self._native = filereads.NativeReads(self.max_window) if self._native_kind else None
        self._native_mode()

    # ------------------------------------------------------------------ caller side

    def plan_epoch(self, order: np.ndarray, following: Callable[[], np.ndarray]) -> None:
        """An epoch starts with samples ``order``; ``following()`` is the next epoch's: told
        to the source (``StoredReads.plan_epoch``)."""
        self.stored.plan_epoch(order, following)

    def start(self, indices: np.ndarray, upcoming: np.ndarray | None = None) -> None:
        """The samples about to be taken, in order (one batch); replaces any earlier window.
        The source is told them first, with the ``upcoming`` ones of the next batches
        (``Source.plan_reads``: a remote source merges their byte ranges into few requests,
        fetched ahead)."""
        self._discard()
        self.stored.plan_reads(indices, upcoming)
        if not self.enabled:
            return
        self._todo = deque(int(i) for i in indices)
        self._returned_at = 0.0
        self._refill()

    def take(self, index: int) -> tuple[Any, Any]:
        """Sample ``index``'s data and mask (None without masks): from the window when it was
        read ahead, else read now (with the same deadline). Raises what the read raised."""
        if not self.enabled:
            return self._plain(index)
        self._pace()
        future = self._pop(index)
        if future is None and self.window == 0:  # auto, reads cheap: read here, measured
            if self._todo and self._todo[0] == index:
                self._todo.popleft()  # never read ahead later, should the window reopen
            try:
                return self._plain(index)
            finally:
                self._returned_at = time.perf_counter()
        if future is None:
            future = self._submit(index)
        try:
            result = self._wait(index, future)
        finally:
            self._returned_at = time.perf_counter()
        self._refill()
        return result

    def _wait(self, index: int, future: Any) -> tuple[Any, Any]:
        """The read's result, once it is done (raises what it raised, or an OSError past the
        deadline: a bad sample)."""
        timeout = self.settings.timeout
        if self._native is not None:
            try:
                (data, mask), seconds = future.result(timeout)
            except filereads.Late:
                raise _late(self.source.name(index), timeout) from None
            self._count(index, data, mask, seconds, dropped=future.dropped)
            return data, mask
        try:
            result, nbytes = future.result(timeout=timeout)
        except cf.TimeoutError:
            self._abandon()
            future.add_done_callback(self._came_back)
            raise _late(self.source.name(index), timeout) from None
        with self._lock:
            self.held -= nbytes
        return result

    def close(self) -> None:
        """Drop the window and stop the threads."""
        self._discard()
        if self._native is not None:
            self._native.close()
        if os.getpid() == self._pid:
            with self._lock:
                for _ in self._threads:
                    self._tasks.put(None)
                self._threads = []

    # ------------------------------------------------------------------ window

    def _pop(self, index: int) -> Any:
        if self._ahead and self._ahead[0][0] == index:  # taken in order: the usual case
            return self._ahead.popleft()[1]
        for k, (i, future) in enumerate(self._ahead):
            if i == index:
                del self._ahead[k]
                return future
        return None

    def _discard(self) -> None:
        if self._native is not None:
            self._native.discard()
            self.held = 0
        else:
            for _, future in self._ahead:
                if not future.cancel():
                    future.add_done_callback(self._release)
        self._ahead.clear()
        self._todo.clear()

    def _release(self, future: cf.Future) -> None:
        """A discarded read finished anyway: its bytes are no longer held."""
        if not future.cancelled() and future.exception() is None:
            with self._lock:
                self.held -= future.result()[1]

    def _came_back(self, future: cf.Future) -> None:
        """An abandoned read finished after all (a slow request, not a dead file): its bytes
        are not held, and its thread serves the window again. Once every stuck thread is back
        (a stalled server or mount recovered), a window given up on is used again."""
        self._release(future)
        with self._lock:
            self.lost -= 1
            if self._gave_up and not self.lost:
                self._gave_up, self.enabled = False, True

    def _refill(self) -> None:
        """Start reads while the window has room and the bytes held stay under the cap."""
        largest = self.counters.largest  # a read's size is judged by the largest seen so far
        native = self._native is not None  # its reads are in flight until taken
        while self._todo and len(self._ahead) < self.window:
            pending = len(self._ahead) if native else sum(1 for _, f in self._ahead if not f.done())
            if pending and not largest:
                return  # no size known yet: one read first
            if self._ahead and self.held + (pending + 1) * largest > self.settings.max_bytes:
                return
            index = self._todo.popleft()
            self._ahead.append((index, self._submit(index)))
        if native:  # its bytes are in C until taken: bounded by the window
            self.held = len(self._ahead) * largest
            self.peak_held = max(self.peak_held, self.held)

    def _submit(self, index: int) -> Any:
        if self._native is not None:
            return self._native_submit(index)
        future: cf.Future = cf.Future()
        if os.getpid() != self._pid:  # forked: this process has none of the parent's threads
            self._pid, self._threads, self.lost = os.getpid(), [], 0
            self._tasks, self._lock = queue.SimpleQueue(), threading.Lock()
        with self._lock:
            self._tasks.put((index, future))
            if len(self._threads) - self.lost < self.window + 1:
                self._spawn()
        return future

    def _native_submit(self, index: int) -> Any:
        if self._native_kind == "files":
            return self._native.submit(index, self.stored.file_paths(index))  # type: ignore[union-attr]
        where = self.stored.file_range(index)
        if where is None:  # not one stored range (a null image): read when taken, as usual
            return filereads.Deferred(self.source, index)
        return self._native.submit_range(index, self.source.name(index), where)  # type: ignore[union-attr]

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._serve, daemon=True, name="stoker-read")
        thread.start()
        self._threads.append(thread)

    def _abandon(self) -> None:
        """A read passed its deadline: its thread is stuck; start another in its place."""
        with self._lock:
            self.lost += 1
            if self.lost <= MAX_LOST_THREADS:
                self._spawn()
                return
            self._gave_up, self.enabled = True, False  # read plainly until they answer
        self._discard()

    def _pace(self) -> None:
        """Re-size an auto window from the recent read latency and the caller's decode time
        (from the last take's return to this take): 0 (plain reads) while reads are cheap."""
        if self._returned_at:
            spent = time.perf_counter() - self._returned_at
            self._decode_s = spent if not self._decode_s else 0.9 * self._decode_s + 0.1 * spent
        if not (self.auto and self.counters.reads >= 8 and self._decode_s > 0):
            return
        share = self._latency_s / self._decode_s
        self.window = auto_window(self.window, share, self._native_kind == "files", self.max_window)

    # ------------------------------------------------------------------ reading threads

    def _serve(self) -> None:
        while True:
            try:
                task = self._tasks.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:  # _submit queues under this lock: no task is left unserved
                    if self._tasks.empty():
                        if threading.current_thread() in self._threads:
                            self._threads.remove(threading.current_thread())
                        return
                continue
            if task is None:
                return
            index, future = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                t0 = time.perf_counter()
                data = _owned(self.source.read(index))
                mask = _owned(self.source.read_mask(index)) if self.masks else None
                nbytes = self._count(index, data, mask, time.perf_counter() - t0)
            except BaseException as exc:  # noqa: BLE001 - handed to take(), raised there
                future.set_exception(exc)
            else:
                with self._lock:
                    self.held += nbytes
                    self.peak_held = max(self.peak_held, self.held)
                future.set_result(((data, mask), nbytes))

    def _plain(self, index: int) -> tuple[Any, Any]:
        """Read sample ``index`` (and its mask) here and now: no window, no deadline. When its
        pages are to be dropped, a view of a memory map is copied first (else the decode
        would read back the pages just dropped)."""
        t0 = time.perf_counter()
        data = self.source.read(index)
        mask = self.source.read_mask(index) if self.masks else None
        if self._drop:
            data, mask = _owned(data), _owned(mask)
        self._count(index, data, mask, time.perf_counter() - t0)
        return data, mask

    def _count(
        self, index: int, data: Any, mask: Any, seconds: float, dropped: bool = False
    ) -> int:
        """Account one read (its size in bytes is returned); drop its pages if asked to
        (``dropped``: the native reader dropped them already: it was queued after the policy
        said so)."""
        nbytes = size_of(data) + (size_of(mask) if mask is not None else 0)
        early: list[int] = []
        with self._lock:
            c = self.counters
            c.nbytes, c.reads = c.nbytes + nbytes, c.reads + 1
            late = self._latency_s
            self._latency_s = seconds if not late else 0.9 * late + 0.1 * seconds
            c.largest = max(c.largest, nbytes)
            if self.settings.page_cache == "auto" and c.reads <= SIZE_AFTER:
                self._early.append(index)
                if c.reads == SIZE_AFTER:
                    self._drop = larger_than_ram(
                        c.nbytes, c.reads, len(self.source), memory_bytes()
                    )
                    early, self._early = (self._early if self._drop else []), []
        if early:  # larger than RAM: what was read while undecided leaves the cache, and the
            self._drop_pages(early)  # reads go around it from now on
            self.stored.bypass_page_cache()
            self._native_mode()
        elif dropped:
            self.counters.dropped += 1
        elif self._drop:
            self._drop_pages([index])
        return nbytes

    def _native_mode(self) -> None:
        """Tell the native reader how reads treat the page cache now."""
        if self._native is not None:
            self._native.set_mode(self.stored.reads_direct(), self._drop)

    def _drop_pages(self, indices: list[int]) -> None:
        for index in indices:
            if self.stored.forget(index):
                self.counters.dropped += 1


def _late(name: str, timeout: float) -> OSError:
    return OSError(
        f"{name}: no bytes after {timeout:.0f} s (a file or request that never answers: a "
        "FIFO, a hung mount, a stalled server?); counted as bad"
    )


def _owned(data: Any) -> Any:
    """The sample's data held in memory: an array that views a memory map is copied here, on
    the reading thread (where its page faults belong), so decoding never waits on the disk."""
    if isinstance(data, np.ndarray) and data.base is not None:
        return np.array(data)
    return data


def size_of(data: Any) -> int:
    """Bytes of a sample's data (encoded bytes or a decoded array)."""
    return int(data.nbytes) if isinstance(data, np.ndarray) else len(data)

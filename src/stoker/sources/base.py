"""The Source interface and the compact path index shared by file-based sources."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..shm.segments import SharedArrays


class Source:
    """Random access to a dataset's samples; subclasses fill in the storage details.

    Every source has these members. What only some sources can do is a named ability:
    ``StoredReads`` (reads from storage the read-ahead window may run ahead of decoding), and
    the protocols below (``Takes``, ``Blocks``, ``Refingerprints``, ``ListedSizes``,
    ``Indexed``)."""

    labels: np.ndarray
    classes: list[str] | None = None
    #: A segmentation source: ``read_mask(i)`` gives sample ``i``'s mask, and batches carry
    #: masks in place of labels.
    has_masks: bool = False
    #: A per-sample dataset's own fields ``(name, dtype, shape)`` and their arrangement (the
    #: default batch structure); None for image sources (see ``sources.dataset``).
    sample_fields: tuple[tuple[str, str, tuple[int, ...]], ...] | None = None
    sample_form: Any = None
    #: Extra numeric columns read by name (a CSV's ``columns=``), one value per sample.
    named_columns: dict[str, np.ndarray] = {}
    #: ``read`` takes bytes from storage (files, network); False where a sample comes from
    #: memory or the user's own code: ``stats()`` then never blames the disk.
    from_storage: bool = True

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def read(self, index: int) -> bytes | np.ndarray:
        """Return sample ``index``: encoded image bytes, or a decoded uint8 array."""
        raise NotImplementedError

    def read_mask(self, index: int) -> bytes | np.ndarray:
        """Return sample ``index``'s mask (encoded bytes or a uint8 array); sources with
        ``has_masks`` only."""
        raise NotImplementedError(f"{type(self).__name__} has no masks")

    def mask_name(self, index: int) -> str:
        """A human-readable name of sample ``index``'s mask."""
        return f"mask {index}"

    def pixel_size(self) -> tuple[int, int] | None:
        """``(height, width)`` shared by every image of a source of decoded arrays; None for
        encoded files (whose sizes vary). Sets the ``image_size=None`` and ``augment="auto"``
        defaults."""
        return None

    def pixel_channels(self) -> int | None:
        """Channels of a source of decoded arrays (sets the ``color_mode=None`` default);
        None for encoded files."""
        return None

    def name(self, index: int) -> str:
        """A human-readable name of sample ``index`` (its file path, or ``array[i]``)."""
        return f"sample {index}"

    def origin(self) -> Source:
        """The source the user passed, before any selection (a split, a class pick): itself."""
        return self

    def source_indices(self, indices: np.ndarray) -> np.ndarray:
        """Where samples ``indices`` of this source are in ``origin()``: the same indices."""
        return np.asarray(indices, dtype=np.int64)

    def fingerprint(self) -> str:
        """A short digest that changes when the dataset's content list changes."""
        raise NotImplementedError

    def open_in_worker(self) -> None:
        """Reopen handles after being sent to a worker process (default: nothing to do)."""

    def close(self) -> None:
        """Release handles and memory this source owns (default: nothing)."""


class StoredReads:
    """The ability of a source whose ``read`` waits on storage (files, network) and may run on
    several threads at once: the read-ahead window (``sources.readahead``) then reads upcoming
    samples ahead of decoding, and uses these hints. A source without it is read in the
    worker's own thread, one sample at a time; ``NO_STORED_READS`` stands for it (every hint
    at its default)."""

    #: Reads may run ahead of decoding now (a subclass may turn it off: an mmap'd shard).
    parallel_reads: bool = True
    #: The most reads in flight an auto-sized read-ahead window may keep for this source (None:
    #: the read-ahead's own maximum; remote sources raise it to cover network latency).
    read_ahead_max: int | None = None

    def forget(self, index: int) -> bool:
        """Hint: sample ``index``'s bytes were read and will not be needed again soon; drop
        them from the page cache if the storage allows it. True when pages were dropped
        (default: nothing to drop, False). Must not raise."""
        return False

    def plan_reads(self, indices: Any, upcoming: Any = None) -> None:
        """Hint: these samples are read next, in this order (one batch, from the plan), and
        ``upcoming`` ones after them (the next batches', or None). A remote source merges
        their byte ranges into few requests, fetched ahead (``sources.spans``); the default
        does nothing. Must not raise (a failed plan is read sample by sample)."""

    def plan_epoch(self, order: Any, following: Callable[[], Any]) -> None:
        """Hint: an epoch starts, its samples in ``order``; ``following()`` gives the next
        epoch's. A source that caches fetched bytes keeps those needed soonest (remote shards'
        span cache); the default does nothing. Must not raise."""

    @property
    def fetches_ahead(self) -> bool:
        """Whether the source fetches the bytes of the samples it is told (``plan_reads``)
        ahead by itself (remote shards' fixed spans): an auto window then stays closed, as its
        threads would only wait on the same fetches and slow decoding (default False)."""
        return False

    def bypass_page_cache(self) -> bool:
        """From now on read around the page cache where the storage allows it (``O_DIRECT``):
        for data larger than RAM, where cached pages would only evict everything else, this
        costs less CPU than a cached read followed by ``forget``. True when it does (``forget``
        then has nothing left to drop); default False."""
        return False

    def reads_direct(self) -> bool:
        """Whether reads go around the page cache now (``bypass_page_cache`` took effect)."""
        return False

    def native_reads(self) -> str | None:
        """How the read-ahead window may read this source on native threads
        (``sources.filereads``): ``"files"`` (each sample one whole file: ``file_paths``),
        ``"ranges"`` (one byte range of a file: ``file_range``), or None (the default: a read
        is more than that, a row, a request, a subclass's own ``read``)."""
        return None

    def file_paths(self, index: int) -> tuple[str, str | None]:
        """Sample ``index``'s file and mask file (None without masks); ``"files"`` sources."""
        raise NotImplementedError

    def file_range(self, index: int) -> tuple[str, int, int, int] | None:
        """``(path, offset, length, fd)`` of sample ``index``'s bytes (``fd``: a descriptor of
        the file the caller closes, or -1); ``"ranges"`` sources (None for a sample that is not
        one stored range: it is read the usual way)."""
        raise NotImplementedError


#: What a source without ``StoredReads`` answers to the read-ahead window: nothing to read ahead.
NO_STORED_READS = StoredReads()
NO_STORED_READS.parallel_reads = False


def stored_reads(source: Source) -> StoredReads:
    """``source``'s ``StoredReads`` ability, or ``NO_STORED_READS`` for one without it."""
    return source if isinstance(source, StoredReads) else NO_STORED_READS


# Optional abilities: a source has one when it has the member, stated by these protocols and
# checked with ``isinstance`` once, where the loader is resolved or a process's Assembler is
# built, never probed with ``getattr`` at the place of use.


@runtime_checkable
class Takes(Protocol):
    """A source of in-memory arrays that copies a whole batch's images at once."""

    def take(self, indices: np.ndarray, out: np.ndarray) -> bool:
        """Copy the images of samples ``indices`` into ``out`` (``(len(indices), H, W, C)``);
        False where it cannot (the caller then reads sample by sample)."""
        ...


@runtime_checkable
class LoadsFields(Protocol):
    """A per-sample dataset (``sample_fields`` set): it fills a sample's own fields itself,
    in place of ``read`` + decode (``sources.dataset``)."""

    def load(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        """Sample ``index``'s fields into ``out`` (one row each); ``rng`` is its generator."""
        ...


@runtime_checkable
class Blocks(Protocol):
    """A source stored in blocks (Parquet row groups) read fastest whole: the shuffle then
    orders blocks and mixes samples within a window of them (``order.block_order``)."""

    #: Samples per block, in the source's order; they add up to ``len(source)``.
    block_sizes: tuple[int, ...]


@runtime_checkable
class Refingerprints(Protocol):
    """A source whose fingerprint changed between stoker releases: a state saved under an
    older one still resumes (with a warning)."""

    def older_fingerprints(self) -> list[str]:
        """The fingerprints earlier releases computed for this dataset."""
        ...


@runtime_checkable
class ListedSizes(Protocol):
    """A source that knows each sample's stored bytes without reading it (a bucket's listing,
    a tar's headers)."""

    #: Bytes of each sample, one per sample (int64).
    sizes: np.ndarray


@runtime_checkable
class Indexed(Protocol):
    """A source whose samples are stored paths kept in a ``PathIndex`` (files listed on a disk
    or in a bucket, a tar's members)."""

    index: PathIndex


def block_sizes(source: Source) -> tuple[int, ...] | None:
    """The source's blocks (``Blocks``), or None for one read sample by sample."""
    blocks = source.block_sizes if isinstance(source, Blocks) else None
    return tuple(int(b) for b in blocks) if blocks else None


def older_fingerprints(source: Source) -> list[str]:
    """The fingerprints earlier releases gave ``source`` (``Refingerprints``; else none)."""
    return source.older_fingerprints() if isinstance(source, Refingerprints) else []


class PathIndex:
    """Many file paths stored as one UTF-8 blob plus int64 offsets: ~bytes of the path each.

    A Python list of strings costs ~80 bytes of object overhead per path and, in forked workers,
    copy-on-read page faults; this costs only the characters and 8 bytes of offset.
    """

    def __init__(self, root: Path, rel_paths: list[str]) -> None:
        encoded = [p.encode("utf-8", "surrogateescape") for p in rel_paths]
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self.root = str(root)
        self._shared: SharedArrays | None = None

    @classmethod
    def from_arrays(cls, root: Path, blob: np.ndarray, offsets: np.ndarray) -> PathIndex:
        """An index from stored arrays (a cached scan)."""
        index = cls.__new__(cls)
        index.blob, index.offsets, index.root = blob, offsets.astype(np.int64), str(root)
        index._shared = None
        return index

    def __getstate__(self) -> dict[str, Any]:
        """Sent to a worker: the arrays move into one shared segment (made once), so every
        worker maps the same pages instead of holding its own copy."""
        if self._shared is None or not self._shared.alive:
            self._shared = SharedArrays({"offsets": self.offsets, "blob": self.blob}, "index")
        return {"root": self.root, "shared": self._shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root, self._shared = state["root"], state["shared"]
        self.offsets, self.blob = self._shared["offsets"], self._shared["blob"]

    def close(self) -> None:
        """Unlink the shared copy (parent only)."""
        if self._shared is not None:
            self._shared.unlink()

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def relative(self, index: int) -> str:
        """The stored (relative) path of entry ``index``."""
        start, stop = self.offsets[index], self.offsets[index + 1]
        return self.blob[start:stop].tobytes().decode("utf-8", "surrogateescape")

    def path(self, index: int) -> str:
        """The full path of entry ``index``."""
        return os.path.join(self.root, self.relative(index))

    def digest(self) -> str:
        """A digest of every path (not file contents)."""
        h = hashlib.blake2b(self.blob.tobytes(), digest_size=12)
        h.update(self.offsets.tobytes())
        return h.hexdigest()


class FileListSource(StoredReads, Source):
    """A source of image files listed in a PathIndex (folders, CSV files, path lists)."""

    index: PathIndex
    #: The mask files, one per image (segmentation sources only).
    mask_index: PathIndex | None = None

    @property
    def has_masks(self) -> bool:  # type: ignore[override]
        return self.mask_index is not None

    _direct = False  # reads bypass the page cache (bypass_page_cache)

    def read(self, index: int) -> bytes:
        """The file's bytes."""
        return self._read(self.index.path(index))

    def read_mask(self, index: int) -> bytes:
        """The mask file's bytes."""
        if self.mask_index is None:
            raise NotImplementedError(f"{type(self).__name__} has no masks")
        return self._read(self.mask_index.path(index))

    def _read(self, path: str) -> bytes:
        if self._direct:
            data = read_file_direct(path)
            if data is not None:
                return data
            self._direct = False  # this file system refuses O_DIRECT: cached reads + forget
        return read_file(path)

    def bypass_page_cache(self) -> bool:
        """Read with ``O_DIRECT`` from now on (where the file system allows it)."""
        self._direct = hasattr(os, "O_DIRECT")
        return self._direct

    def reads_direct(self) -> bool:
        """True once reads use ``O_DIRECT`` (and the file system has not refused it)."""
        return self._direct

    def native_reads(self) -> str | None:
        """``"files"``, unless a subclass or the instance reads files its own way (``read``,
        ``_read`` or ``read_mask`` replaced): then None, and its own read is used."""
        own = ("read", "_read", "read_mask")
        return "files" if all(stock(self, FileListSource, n) for n in own) else None

    def file_paths(self, index: int) -> tuple[str, str | None]:
        """The image file's path and the mask file's (None without masks)."""
        mask = self.mask_index.path(index) if self.mask_index is not None else None
        return self.index.path(index), mask

    def forget(self, index: int) -> bool:
        """Drop the file's (and its mask's) pages from the page cache (nothing to drop when
        the reads bypass it)."""
        if self._direct:
            return True
        drop_pages(self.index.path(index))
        if self.mask_index is not None:
            drop_pages(self.mask_index.path(index))
        return True

    def name(self, index: int) -> str:
        """The file's path."""
        return self.index.path(index)

    def mask_name(self, index: int) -> str:
        """The mask file's path."""
        return self.mask_index.path(index) if self.mask_index is not None else f"mask {index}"

    def close(self) -> None:
        """Unlink the shared copy of the index, if one was made."""
        self.index.close()
        if self.mask_index is not None:
            self.mask_index.close()

    def fingerprint(self) -> str:
        """Digest of the listed paths (and mask paths), labels and class names."""
        h = hashlib.blake2b(self.index.digest().encode(), digest_size=12)
        h.update(self.labels.tobytes())
        h.update("\0".join(self.classes or []).encode("utf-8", "surrogateescape"))
        if self.mask_index is not None:
            h.update(b"masks" + self.mask_index.digest().encode())
        return h.hexdigest()


def cache_folder(cache_dir: str | os.PathLike | None, kind: str) -> Path:
    """Where stoker keeps ``kind``'s cache (folder scans, tar scans, shard indexes):
    ``cache_dir`` when given, else ``~/.cache/stoker/<kind>``."""
    return Path(cache_dir) if cache_dir else Path.home() / ".cache" / "stoker" / kind


def stock(source: object, kind: type, name: str) -> bool:
    """Whether ``source.<name>`` is ``kind``'s own method (not a subclass's or the instance's)."""
    return getattr(getattr(source, name), "__func__", None) is getattr(kind, name)


def file_fingerprint(path: Path, parts: tuple[object, ...], labels: np.ndarray) -> str:
    """Digest of one file's resolved path, ``parts``, size and mtime, and the labels."""
    st = os.stat(path)
    key = "|".join(str(p) for p in (path.resolve(), *parts, st.st_size, st.st_mtime_ns))
    h = hashlib.blake2b(key.encode(), digest_size=12)
    h.update(labels.tobytes())
    return h.hexdigest()


def read_file(path: str) -> bytes:
    """Read a whole regular file; OSError propagates (the loader counts it as a bad sample).

    Opened without blocking and checked first: a FIFO, socket or device named like an image
    is refused as not a regular file, never read (a FIFO would block the worker forever)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode)
        return f.read()


def not_regular(path: str, mode: int) -> OSError:
    """The error for a path that names a FIFO, socket, device or folder, not an image file."""
    return OSError(errno.EINVAL, f"not a regular file (a {file_kind(mode)}); refused", path)


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` that is not a regular file is: "FIFO", "folder"..."""
    return next((k for t, k in _KINDS if t(mode)), "special file")


def short_read(name: str, got: int, length: int) -> OSError:
    """The error for a stored image range that ends early: its shard was cut or replaced."""
    return OSError(
        f"{name}: short read ({got} of {length} bytes); the shard was truncated or replaced"
    )


DIRECT_ALIGN = 4096  # O_DIRECT buffers, offsets and lengths: multiples of the block size
DIRECT_KEEP = 4 << 20  # largest buffer a reading thread keeps between reads
_buffers = threading.local()  # each reading thread's aligned buffer, reused


def read_file_direct(path: str) -> bytes | None:
    """Read a whole regular file around the page cache (``O_DIRECT`` into an aligned buffer,
    then one copy out): no page is cached, so nothing is evicted; pages the file had in the
    cache already are dropped on the same descriptor.
    None where the file system refuses ``O_DIRECT`` (the caller reads it the cached way);
    other errors raise as ``read_file``'s do."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_DIRECT
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            read_file(path)  # raises the same refusal a cached read gives
        want = -(-max(st.st_size, 1) // DIRECT_ALIGN) * DIRECT_ALIGN
        view = _aligned(want)
        done = 0
        while done < st.st_size:
            got = os.preadv(fd, [view[done:want]], done)
            if got <= 0:
                break  # the file shrank under the read: what is there, as a cached read gives
            done += got
        drop_pages(path, fd=fd)  # pages cached before (a warm file): one cheap call on this fd
        return bytes(view[: min(done, st.st_size)])
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    finally:
        os.close(fd)


def _aligned(size: int) -> memoryview:
    """A page-aligned buffer of at least ``size`` bytes: this thread's, reused, up to
    ``DIRECT_KEEP`` bytes (a larger file gets one of its own, freed after the read)."""
    if size > DIRECT_KEEP:
        return memoryview(mmap.mmap(-1, size))
    buf = getattr(_buffers, "buf", None)
    if buf is None or len(buf) < size:
        buf = _buffers.buf = mmap.mmap(-1, max(size, 1 << 20))
    return memoryview(buf)[:size]


_KINDS = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISDIR, "folder"),
)


def drop_pages(path: str, offset: int = 0, length: int = 0, fd: int = -1) -> None:
    """``posix_fadvise(DONTNEED)`` on ``length`` bytes at ``offset`` of a file (0: to the end),
    given by path or by an open ``fd``: its clean pages leave the page cache. Never raises."""
    try:
        if fd >= 0:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
            return
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass

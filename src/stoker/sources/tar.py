"""WebDataset tar shards: samples are groups of members sharing a key (the path up to the first
dot of the file name), e.g. ``n01/img_7.jpg`` + ``n01/img_7.cls``.

The tars are indexed once with :mod:`tarfile` (headers only; label members are small and read
then); ``read(i)`` is then one ``pread`` at the image's offset. A cold scan reads most of the tar
(the kernel reads ahead past each header), so a big tar's scan is cached (``~/.cache/stoker/tar``,
JSON, never pickle; the tar itself is never written) and reused while its stamp is unchanged:
size, mtime, ctime, device and inode, and a hash of its first and last ``EDGE_BYTES`` (the
first members' headers and the end of the archive), so a tar swapped with another of the same
size and mtime, or rewritten in place, is scanned again. Nothing is ever extracted to disk.
Members whose names are absolute or contain ``..`` are refused (counted in ``refused`` and
warned about), and serialised-object members (``.pyd``, ``.pickle``...) are ignored: stoker
never unpickles data. Only uncompressed ``.tar`` files are accepted (a compressed tar cannot be
read at an offset).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SourceError, warn
from . import cachefile
from .base import PathIndex, Source, StoredReads, cache_folder, drop_pages, short_read, stock
from .targets import parse_column

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
LABEL_KEYS = ("cls", "label", "txt")
_MAX_LABEL_BYTES = 4096


def unsafe_member_name(name: str) -> bool:
    """True for a member path that could escape a folder: absolute, drive-qualified or ``..``."""
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return True
    return any(part == ".." for part in name.replace("\\", "/").split("/"))


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's rule: ``dir/base.ext.more`` -> (``dir/base``, ``ext.more``), lowercased ext."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


CACHE_VERSION = 2
MIN_CACHED_BYTES = 64 << 20  # a smaller tar is scanned faster than its cache is checked
EDGE_BYTES = 64 << 10  # the head and tail of a tar hashed into its stamp


class TarSource(StoredReads, Source):
    """WebDataset-style ``.tar`` shards (a folder of them, one file, or a list)."""

    def __init__(
        self,
        tars: str | os.PathLike | list[str | os.PathLike],
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        self.tars = self._list(tars)
        cache = cache_folder(cache_dir, "tar")
        members: list[str] = []
        tar_ids: list[int] = []
        offsets: list[int] = []
        sizes: list[int] = []
        raw_labels: list[Any] = []
        self.refused: list[str] = []
        self._content: list[str] = []
        for t, path in enumerate(self.tars):
            samples, refused, content = self._scan_one(t, path, cache)
            self._content.append(content)
            self.refused.extend(refused)
            for name, offset, size, label in samples:
                members.append(name)
                tar_ids.append(t)
                offsets.append(offset)
                sizes.append(size)
                raw_labels.append(label)
        if not members:
            raise SourceError(
                f"{tars}: no samples with a {'/'.join(IMAGE_KEYS)} member in the tar file(s)"
            )
        if self.refused:
            warn(
                f"stoker refused {len(self.refused)} tar member(s) with unsafe names (absolute or "
                f"containing '..'), first {self.refused[0]!r}; they are not part of the dataset"
            )
        self.index = PathIndex(Path(""), members)
        self.tar_ids = np.asarray(tar_ids, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        if all(v is None for v in raw_labels):
            self.labels, self.classes = np.full(len(members), -1, dtype=np.int64), None
        else:
            cells = ["" if v is None else v.strip() for v in raw_labels]
            self.labels, self.classes = parse_column(cells, f"{tars}: labels")
        self._fds: dict[int, int] = {}

    def _list(self, tars: Any) -> list[str]:
        """The tar files ``tars`` names (a folder of them, one file, or a list)."""
        return _list_tars(tars)

    def _scan_one(self, t: int, path: str, cache: Path) -> tuple[list[Sample], list[str], str]:
        """Tar ``t``'s samples, refused names and content hash (``scan_of``)."""
        return scan_of(path, cache)

    def _tar_size(self, t: int) -> int:
        """Tar ``t``'s size in bytes (for the fingerprint)."""
        return os.path.getsize(self.tars[t])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fds": {}}

    def read(self, index: int) -> bytes:
        """The image member's bytes: one positioned read."""
        size = int(self.sizes[index])
        data = os.pread(self._fd(index), size, int(self.offsets[index]))
        if len(data) != size:
            raise short_read(self.name(index), len(data), size)
        return data

    def native_reads(self) -> str | None:
        """``"ranges"``: an image is one byte range of its tar (None when a subclass or the
        instance reads its own way: then its ``read`` is used)."""
        return "ranges" if stock(self, TarSource, "read") else None

    def file_range(self, index: int) -> tuple[str, int, int, int]:
        """``(tar path, offset, length, fd)`` of sample ``index``'s image member; ``fd``
        duplicates this process's descriptor of the tar (the caller closes it), so reads
        through it keep the kernel's readahead of that tar."""
        path = self.tars[int(self.tar_ids[index])]
        return path, int(self.offsets[index]), int(self.sizes[index]), os.dup(self._fd(index))

    def forget(self, index: int) -> bool:
        """Drop the member's byte range of its tar from the page cache."""
        size, offset = int(self.sizes[index]), int(self.offsets[index])
        drop_pages("", offset, size, fd=self._fd(index))
        return True

    def _fd(self, index: int) -> int:
        """This process's descriptor of sample ``index``'s tar (safe from several threads)."""
        t = int(self.tar_ids[index])
        fd = self._fds.get(t)
        if fd is None:
            fd = os.open(self.tars[t], os.O_RDONLY)
            kept = self._fds.setdefault(t, fd)
            if kept != fd:  # another thread opened it first
                os.close(fd)
                fd = kept
        return fd

    def name(self, index: int) -> str:
        """``shard.tar:member/name.jpg``."""
        return f"{self.tars[int(self.tar_ids[index])]}:{self.index.relative(index)}"

    def fingerprint(self) -> str:
        """Digest of tar names, sizes and head/tail hashes, member names, and labels."""
        h = hashlib.blake2b(self.index.digest().encode(), digest_size=12)
        for t, (path, content) in enumerate(zip(self.tars, self._content, strict=True)):
            h.update(f"{os.path.basename(path)}|{self._tar_size(t)}|{content}\0".encode())
        h.update(self.labels.tobytes())
        return h.hexdigest()

    def older_fingerprints(self) -> list[str]:
        """This dataset's fingerprint as earlier stoker releases computed it (without the
        tars' head/tail hashes): a state they saved still resumes, with a warning."""
        h = hashlib.blake2b(self.index.digest().encode(), digest_size=12)
        for t, path in enumerate(self.tars):
            h.update(f"{os.path.basename(path)}|{self._tar_size(t)}\0".encode())
        h.update(self.labels.tobytes())
        return [h.hexdigest()]

    def close(self) -> None:
        """Close this process's file descriptors."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


Sample = tuple[str, int, int, str | None]  # image member's name, offset, size; label text


def scan_of(path: str, cache_dir: Path) -> tuple[list[Sample], list[str], str]:
    """The samples of one tar, the unsafe member names it refused, and its head/tail hash: from
    the scan cached under ``cache_dir`` while the tar's stamp is unchanged, else scanned (and
    cached when the tar is big enough for its scan to take a while: a cold scan reads the whole
    tar). A tar that changed while it was scanned is not cached."""
    stamp = tar_stamp(path)
    samples, refused = cached_scan(
        _cache_file(cache_dir, path),
        stamp,
        lambda: _scan(path),
        lambda: stamp[0] >= MIN_CACHED_BYTES and tar_stamp(path) == stamp,
    )
    return samples, refused, stamp[-1]


def tar_stamp(path: str) -> list[Any]:
    """``[size, mtime_ns, ctime_ns, device, inode, head/tail hash]`` of a tar: what its cached
    scan is valid for. The hash covers the first and last ``EDGE_BYTES`` (all of a small tar)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        h = hashlib.blake2b(os.pread(fd, EDGE_BYTES, 0), digest_size=16)
        if st.st_size > EDGE_BYTES:
            h.update(os.pread(fd, EDGE_BYTES, max(EDGE_BYTES, st.st_size - EDGE_BYTES)))
    finally:
        os.close(fd)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino, h.hexdigest()]


def _cache_file(cache_dir: Path, path: str) -> Path:
    """Where the scan of the tar at ``path`` (a local path, or a URL) is cached."""
    name = path if "://" in path else os.path.abspath(path)
    key = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=10)
    return cache_dir / f"{key.hexdigest()}.json"


def cached_scan(
    where: Path,
    stamp: list[Any],
    scan: Callable[[], tuple[list[Sample], list[str]]],
    keep: Callable[[], bool],
) -> tuple[list[Sample], list[str]]:
    """A tar's samples and refused names: the scan cached at ``where`` while it is stamped
    ``stamp``, else ``scan()`` (then written to the cache when ``keep()`` says so)."""
    cached = _load_scan(where, stamp)
    if cached is not None:
        return cached
    samples, refused = scan()
    if keep():
        _save_scan(where, stamp, samples, refused)
    return samples, refused


def _load_scan(where: Path, stamp: list[Any]) -> tuple[list[Sample], list[str]] | None:
    """The cached scan at ``where`` if it is this version's and stamped ``stamp``; else None
    (missing, stale or damaged: the tar is scanned again)."""
    data = cachefile.read_cache(where)
    if data is None:
        return None
    try:
        meta = json.loads(data)
        if meta["version"] != CACHE_VERSION or meta["stamp"] != stamp:
            return None
        samples = [
            (str(n), int(o), int(z), None if y is None else str(y))
            for n, o, z, y in meta["samples"]
        ]
        return samples, [str(r) for r in meta["refused"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save_scan(where: Path, stamp: list[Any], samples: list[Sample], refused: list[str]) -> None:
    """Write a tar's scan (JSON, never pickle), atomically; best effort: a read-only home just
    means no cache."""
    meta = {"version": CACHE_VERSION, "stamp": stamp, "samples": samples, "refused": refused}
    cachefile.write_cache(where, lambda f: f.write(json.dumps(meta).encode("utf-8")))


def _scan(path: str, fileobj: Any = None) -> tuple[list[Sample], list[str]]:
    """(name, offset, size, label text) of each sample in one tar (the file ``path``, or
    ``fileobj`` named ``path``), in archive order, and the members refused for unsafe names
    (headers only; label members are small and read here)."""
    groups: dict[str, dict[str, tarfile.TarInfo]] = {}
    refused: list[str] = []
    try:
        with tarfile.open(None if fileobj else path, mode="r:", fileobj=fileobj) as tar:
            for member in tar:
                if not member.isfile() or member.issparse():
                    continue
                if unsafe_member_name(member.name):
                    refused.append(f"{path}:{member.name}")
                    continue
                key, ext = split_key(member.name)
                groups.setdefault(key, {})[ext] = member
            samples = [_sample(tar, parts) for parts in groups.values()]
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(
            f"{path}: cannot read as an uncompressed tar ({exc}); WebDataset shards must be "
            "plain .tar files"
        ) from None
    return [s for s in samples if s is not None], refused


def _sample(tar: tarfile.TarFile, parts: dict[str, tarfile.TarInfo]) -> Sample | None:
    """One key's sample: its image member and its label member's text (None: no image)."""
    image = next((parts[e] for e in IMAGE_KEYS if e in parts), None)
    if image is None:
        return None
    label_member = next((parts[e] for e in LABEL_KEYS if e in parts), None)
    label = None
    if label_member is not None and label_member.size <= _MAX_LABEL_BYTES:
        f = tar.extractfile(label_member)  # a file object; never written out
        if f is not None:
            label = f.read().decode("utf-8", "replace").strip() or None
    return image.name, image.offset_data, image.size, label


def _list_tars(spec: Any) -> list[str]:
    if isinstance(spec, (list, tuple)):
        tars = [os.fspath(p) for p in spec]
    else:
        path = Path(spec)
        if path.is_dir():
            tars = sorted(str(p) for p in path.glob("*.tar") if p.is_file())
        elif path.is_file():
            tars = [str(path)]
        else:
            raise SourceError(f"{path}: no such folder or tar file")
    if not tars:
        raise SourceError(f"{spec}: no .tar files")
    return tars

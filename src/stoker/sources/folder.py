"""The ImageFolder source: one subfolder per class, labels are the sorted class names.

A scan of a big folder is cached on disk (``~/.cache/stoker/scan``: one NPZ file with its JSON
metadata inside, never pickle, written and read by :mod:`.cachefile`) and reused while every
directory's stamp is unchanged: its device, inode, mtime, ctime, link count (subfolders) and size
(entries, on file systems that count them). Adding, removing or renaming a file changes its
directory's mtime and ctime; restoring an mtime (``tar`` or ``rsync`` unpacking the same times)
still changes the ctime, which no user can set; a folder replaced by another has another inode. A
cache is written only from a scan that saw no change while it ran (each directory stamped before it
is listed and again after the whole walk) and no change in the last ``RACY_S`` seconds (a change
inside one tick of the file system's clock leaves its times equal), and a cached stamp that lists no
folder is never valid.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from ..decode import IMAGE_EXTENSIONS
from ..errors import SourceError, warn
from . import cachefile
from .base import FileListSource, PathIndex, cache_folder

CACHE_VERSION = 2
MIN_CACHED = 2000  # smaller folders scan faster than a cache check is worth writing
#: A scan is not cached while a folder changed this recently: two changes within one tick of a
#: file system's clock (up to 2 s on FAT, coarser over some network mounts) leave equal times.
RACY_S = 2.0
#: Attempts at a scan during which no folder changed, before one is used without caching.
SCAN_TRIES = 3

Stamp = list[int]  # dev, inode, mtime_ns, ctime_ns, nlink, size of one directory


def _unreadable(path: str, exc: OSError) -> SourceError:
    return SourceError(
        f"{path}: cannot list this folder ({exc.strerror or exc}); its images would be missing "
        "from the dataset. Fix its permissions (chmod a+rx) or move it out of the dataset"
    )


def _stamp(path: str) -> Stamp:
    """What a directory's stat says about its listing (see the module docstring); ``[]`` for
    one that is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink, st.st_size]


def _stamps(dirs: list[str]) -> list[Stamp]:
    """The stamps of ``dirs``, read after a walk (compared with those read before each listing)."""
    return [_stamp(d) for d in dirs]


def _racy(stamps: list[Stamp], now_ns: int) -> bool:
    """Whether a folder changed within ``RACY_S`` of ``now_ns``: a later change in the same
    clock tick would leave its stamp equal, so such a scan is not cached."""
    newest = max((max(s[2], s[3]) for s in stamps if s), default=now_ns)
    return now_ns - newest < RACY_S * 1e9


def _real_dir(path: str, stamps: dict[str, Stamp] | None = None) -> tuple[int, int]:
    """``(device, inode)`` of a directory; its stamp goes into ``stamps`` (read here, before
    the walk lists it)."""
    st = os.stat(path)
    if stamps is not None:
        stamps[path] = [
            st.st_dev,
            st.st_ino,
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_nlink,
            st.st_size,
        ]
    return (st.st_dev, st.st_ino)


def _scan_class(
    folder: Path,
    dirs: list[str],
    seen: set[tuple[int, int]],
    stamps: dict[str, Stamp] | None = None,
    follow_links: bool = True,
) -> list[str]:
    """Relative paths (``class/…/file``) of the image files under one class folder, sorted.

    Links are followed, but every real directory is walked once: a link back up the tree (a
    loop) or to a folder already walked is skipped with a warning naming it; with
    ``follow_links=False`` every linked subfolder and linked file is skipped instead. A folder
    that cannot be listed is an error naming it, never a silent gap."""

    def fail(exc: OSError) -> None:
        raise _unreadable(exc.filename or str(folder), exc)

    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=follow_links, onerror=fail):
        if not follow_links:  # an lstat per entry, paid only when links are skipped
            dirnames[:] = _unlinked(dirpath, dirnames)
            filenames = _unlinked(dirpath, filenames)
        kept = []
        for name in sorted(dirnames):
            sub = os.path.join(dirpath, name)
            try:
                key = _real_dir(sub, stamps)
            except OSError as exc:
                raise _unreadable(sub, exc) from None
            if key in seen:
                warn(
                    f"{sub} leads to {os.path.realpath(sub)}, a folder already walked (a link "
                    "loop or a second link to it); it was skipped, not counted twice"
                )
                continue
            seen.add(key)
            kept.append(name)
        dirnames[:] = kept
        dirs.append(dirpath)
        rel = os.path.relpath(dirpath, folder.parent)
        for fname in sorted(filenames):
            if os.path.splitext(fname)[1].lower() in IMAGE_EXTENSIONS:
                found.append(os.path.join(rel, fname))
    return found


def _unlinked(folder: str, names: list[str]) -> list[str]:
    """``names`` in ``folder`` that are not symbolic links."""
    return [n for n in names if not os.path.islink(os.path.join(folder, n))]


def warn_empty_class(folder: str, cls: str, label: int) -> None:
    """The warning for a class folder (or prefix) without image files."""
    warn(
        f"{folder}: class folder {cls!r} (label {label}) has no image files "
        f"({', '.join(IMAGE_EXTENSIONS)}); the class gets no samples"
    )


class FolderSettings(Protocol):
    """The Loader options the folder reader reads: the Loader's source group has them, and
    is handed over whole (``open_source(settings=...)``). Each is a read-only property: the
    options are frozen."""

    @property
    def follow_links(self) -> bool:
        """Whether the walk follows symbolic links (see ``_scan_class``)."""
        ...


class FolderSource(FileListSource):
    """Images in ``root/<class>/**/<file>``; classes are the sorted subfolder names.

    ``settings``: the Loader's source group, for the walk's settings (None: the defaults)."""

    def __init__(
        self,
        root: str | os.PathLike,
        cache_dir: str | os.PathLike | None = None,
        settings: FolderSettings | None = None,
    ) -> None:
        self.root = Path(root)
        self.follow_links = True if settings is None else settings.follow_links
        cache = cache_folder(cache_dir, "scan")
        walked = str(self.root.resolve()) + ("" if self.follow_links else "\0no links")
        key = hashlib.blake2b(walked.encode(), digest_size=10).hexdigest()
        self._cache = cache / f"{key}.npz"
        if not self._load_cache():
            self._scan()
        if len(self.labels) == 0:
            raise SourceError(
                f"{self.root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in its class folders"
            )

    def _scan(self) -> None:
        """Walk the folder; cache the result when it is big enough to matter and no folder
        changed while it was walked (else walk again, up to ``SCAN_TRIES`` times)."""
        for _ in range(SCAN_TRIES):
            dirs, before = self._walk()
            after = _stamps(dirs)
            if after == before:
                break
        if len(self.labels) >= MIN_CACHED and after == before and not _racy(after, time.time_ns()):
            self._save_cache(dirs, after)

    def _walk(self) -> tuple[list[str], list[Stamp]]:
        """List the folder into ``classes``, ``index`` and ``labels``; the folders walked and
        each one's stamp, read before it was listed."""
        root = str(self.root)
        seen_stamps: dict[str, Stamp] = {}
        seen = {_real_dir(root, seen_stamps)}
        try:
            entries = list(os.scandir(self.root))
        except OSError as exc:
            raise _unreadable(root, exc) from None
        self.classes = sorted(
            e.name
            for e in entries
            if e.is_dir()
            and not e.name.startswith(".")
            and (self.follow_links or not e.is_symlink())
        )
        if not self.classes:
            raise SourceError(
                f"{self.root}: no class subfolders; an image folder needs one subfolder per class "
                "(root/cat/1.jpg, root/dog/2.jpg), or pass a CSV file or paths=[...]"
            )
        dirs, rel, labels = [root], [], []
        for label, cls in enumerate(self.classes):
            folder = self.root / cls
            key = _real_dir(str(folder), seen_stamps)
            if key in seen:
                raise SourceError(
                    f"{folder} is a link to a folder already in the dataset ("
                    f"{os.path.realpath(folder)}): its images would get two labels. Remove the "
                    "link or copy the images"
                )
            seen.add(key)
            files = _scan_class(folder, dirs, seen, seen_stamps, self.follow_links)
            if not files:
                warn_empty_class(str(folder), cls, label)
            rel.extend(files)
            labels.extend([label] * len(files))
        self.index = PathIndex(self.root, rel)
        self.labels = np.asarray(labels, dtype=np.int64)
        return dirs, [seen_stamps.get(d, []) for d in dirs]

    def _save_cache(self, dirs: list[str], stamps: list[Stamp]) -> None:
        """Write the scan (best effort: a read-only home just means no cache)."""
        meta = {
            "version": CACHE_VERSION,
            "root": str(self.root.resolve()),
            "classes": self.classes,
            "dirs": [os.path.abspath(d) for d in dirs],
            "stamps": stamps,
        }
        arrays = {"blob": self.index.blob, "offsets": self.index.offsets, "labels": self.labels}
        cachefile.save_arrays(self._cache, meta, arrays)

    def _load_cache(self) -> bool:
        """Use the cached scan if every directory is as it was; False otherwise."""
        cached = cachefile.load_arrays(self._cache, ("blob", "offsets", "labels"))
        if cached is None:
            return False
        meta, load = cached
        try:
            if not self._fresh(meta):
                return False
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self.classes = list(meta["classes"])
        self.index = PathIndex.from_arrays(self.root, load["blob"], load["offsets"])
        self.labels = load["labels"].astype(np.int64, copy=False)
        return True

    def _fresh(self, meta: dict) -> bool:
        """Whether a cached scan's stamp still describes this folder: this version's, for this
        root, listing the root first, and every listed folder's stamp unchanged. A stamp that
        lists no folder (or a folder with no stamp) is never fresh."""
        dirs, stamps = meta["dirs"], meta["stamps"]
        root = os.path.abspath(self.root)
        return (
            meta.get("version") == CACHE_VERSION
            and meta["root"] == str(self.root.resolve())
            and isinstance(dirs, list)
            and isinstance(stamps, list)
            and len(dirs) == len(stamps) > 0
            and dirs[0] == root
            and all(stamps)
            and _stamps(dirs) == stamps
        )

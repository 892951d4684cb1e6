"""The ImageFolder source: one subfolder per class, labels are the sorted class names.

A scan of a big folder is cached on disk (``~/.cache/stoker/scan``, NPY + JSON, never pickle)
and reused while every directory's modification time is unchanged: adding, removing or renaming
a file changes its directory's mtime, so the listing is rebuilt exactly when it could differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

from ..decode import IMAGE_EXTENSIONS
from ..errors import SourceError, StokerWarning
from .base import FileListSource, PathIndex, cache_folder

CACHE_VERSION = 1
MIN_CACHED = 2000  # smaller folders scan faster than a cache check is worth writing


def _unreadable(path: str, exc: OSError) -> SourceError:
    return SourceError(
        f"{path}: cannot list this folder ({exc.strerror or exc}); its images would be missing "
        "from the dataset. Fix its permissions (chmod a+rx) or move it out of the dataset"
    )


def _real_dir(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _scan_class(folder: Path, dirs: list[str], seen: set[tuple[int, int]]) -> list[str]:
    """Relative paths (``class/…/file``) of the image files under one class folder, sorted.

    Links are followed, but every real directory is walked once: a link back up the tree (a
    loop) or to a folder already walked is skipped with a warning naming it. A folder that
    cannot be listed is an error naming it, never a silent gap."""

    def fail(exc: OSError) -> None:
        raise _unreadable(exc.filename or str(folder), exc)

    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True, onerror=fail):
        kept = []
        for name in sorted(dirnames):
            sub = os.path.join(dirpath, name)
            try:
                key = _real_dir(sub)
            except OSError as exc:
                raise _unreadable(sub, exc) from None
            if key in seen:
                warnings.warn(
                    f"{sub} leads to {os.path.realpath(sub)}, a folder already walked (a link "
                    "loop or a second link to it); it was skipped, not counted twice",
                    StokerWarning,
                    stacklevel=7,
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


def _mtimes(dirs: list[str]) -> list[int]:
    """Modification times (ns) of ``dirs``; -1 for one that is gone."""
    out = []
    for d in dirs:
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            out.append(-1)
    return out


class FolderSource(FileListSource):
    """Images in ``root/<class>/**/<file>``; classes are the sorted subfolder names."""

    def __init__(self, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> None:
        self.root = Path(root)
        cache = cache_folder(cache_dir, "scan")
        key = hashlib.blake2b(str(self.root.resolve()).encode(), digest_size=10).hexdigest()
        self._cache = cache / key
        if not self._load_cache():
            self._scan()
        if len(self.labels) == 0:
            raise SourceError(
                f"{self.root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in its class folders"
            )

    def _scan(self) -> None:
        """Walk the folder; cache the result when it is big enough to matter."""
        try:
            entries = list(os.scandir(self.root))
        except OSError as exc:
            raise _unreadable(str(self.root), exc) from None
        self.classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
        if not self.classes:
            raise SourceError(
                f"{self.root}: no class subfolders; an image folder needs one subfolder per class "
                "(root/cat/1.jpg, root/dog/2.jpg), or pass a CSV file or paths=[...]"
            )
        dirs, rel, labels = [str(self.root)], [], []
        seen = {_real_dir(str(self.root))}
        for label, cls in enumerate(self.classes):
            folder = self.root / cls
            if _real_dir(str(folder)) in seen:
                raise SourceError(
                    f"{folder} is a link to a folder already in the dataset ("
                    f"{os.path.realpath(folder)}): its images would get two labels. Remove the "
                    "link or copy the images"
                )
            seen.add(_real_dir(str(folder)))
            files = _scan_class(folder, dirs, seen)
            if not files:
                warnings.warn(
                    f"{folder}: class folder {cls!r} (label {label}) has no image files "
                    f"({', '.join(IMAGE_EXTENSIONS)}); the class gets no samples",
                    StokerWarning,
                    stacklevel=6,
                )
            rel.extend(files)
            labels.extend([label] * len(files))
        self.index = PathIndex(self.root, rel)
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(rel) >= MIN_CACHED:
            self._save_cache(dirs)

    def _save_cache(self, dirs: list[str]) -> None:
        """Write the scan (best effort: a read-only home just means no cache)."""
        meta = {
            "version": CACHE_VERSION,
            "root": str(self.root.resolve()),
            "classes": self.classes,
            "dirs": dirs,
            "mtimes": _mtimes(dirs),
        }
        try:
            self._cache.mkdir(parents=True, exist_ok=True)
            for name, arr in (
                ("blob", self.index.blob),
                ("offsets", self.index.offsets),
                ("labels", self.labels),
            ):
                np.save(self._cache / f"{name}.npy", arr, allow_pickle=False)
            tmp = self._cache / "meta.json.tmp"
            tmp.write_text(json.dumps(meta))
            os.replace(tmp, self._cache / "meta.json")
        except OSError:
            pass

    def _load_cache(self) -> bool:
        """Use the cached scan if every directory is as it was; False otherwise."""
        try:
            meta = json.loads((self._cache / "meta.json").read_text())
            if meta.get("version") != CACHE_VERSION or meta["root"] != str(self.root.resolve()):
                return False
            if _mtimes(meta["dirs"]) != meta["mtimes"]:
                return False
            load = {
                n: np.load(self._cache / f"{n}.npy", allow_pickle=False)
                for n in ("blob", "offsets", "labels")
            }
        except (OSError, ValueError, KeyError):
            return False
        self.classes = list(meta["classes"])
        self.index = PathIndex.from_arrays(self.root, load["blob"], load["offsets"])
        self.labels = load["labels"].astype(np.int64, copy=False)
        return True

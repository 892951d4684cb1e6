"""The ImageFolder source: one subfolder per class, labels are the sorted class names."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from ..decode import IMAGE_EXTENSIONS
from ..errors import SourceError
from .base import PathIndex, Source, read_file


def _scan_class(folder: Path) -> list[str]:
    """Relative paths (``class/…/file``) of the image files under one class folder, sorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames.sort()
        rel = os.path.relpath(dirpath, folder.parent)
        for fname in sorted(filenames):
            if os.path.splitext(fname)[1].lower() in IMAGE_EXTENSIONS:
                found.append(os.path.join(rel, fname))
    return found


class FolderSource(Source):
    """Images in ``root/<class>/**/<file>``; classes are the sorted subfolder names."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.classes = sorted(
            e.name for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith(".")
        )
        if not self.classes:
            raise SourceError(
                f"{self.root}: no class subfolders; an image folder needs one subfolder per class "
                "(root/cat/1.jpg, root/dog/2.jpg), or pass a CSV file or paths=[...]"
            )
        rel: list[str] = []
        labels: list[int] = []
        for label, cls in enumerate(self.classes):
            files = _scan_class(self.root / cls)
            rel.extend(files)
            labels.extend([label] * len(files))
        if not rel:
            raise SourceError(
                f"{self.root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in its class folders"
            )
        self.index = PathIndex(self.root, rel)
        self.labels = np.asarray(labels, dtype=np.int64)

    def read(self, index: int) -> bytes:
        """The file's bytes."""
        return read_file(self.index.path(index))

    def name(self, index: int) -> str:
        """The file's path."""
        return self.index.path(index)

    def fingerprint(self) -> str:
        """Digest of the relative paths, labels and class names."""
        h = hashlib.blake2b(self.index.digest().encode(), digest_size=12)
        h.update(self.labels.tobytes())
        h.update("\0".join(self.classes or []).encode())
        return h.hexdigest()

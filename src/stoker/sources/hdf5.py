"""HDF5 files: a dataset of encoded images (variable-length ``uint8``, one file's bytes per row)
or of decoded images (``uint8`` of shape (N, H, W[, C])), plus an optional labels dataset.

Every process opens its own read-only ``h5py`` handle on first use (an HDF5 handle must not
cross a process boundary), so the source pickles as a path and a labels array.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..errors import SourceError
from .arrays import DecodedArrays, check_images, check_labels
from .base import StoredReads, file_fingerprint
from .targets import unlabeled

_OPEN_LOCK = threading.Lock()  # read-ahead threads: one handle per process, opened once


class HDF5Source(StoredReads, DecodedArrays):
    """Images from ``path[images_key]``, labels from ``path[labels_key]`` (-1 if absent)."""

    def __init__(
        self, path: str | os.PathLike, images_key: str = "images", labels_key: str = "labels"
    ) -> None:
        self.path = Path(path)
        self.images_key, self.labels_key = images_key, labels_key
        try:
            with h5py.File(self.path, "r") as f:
                self._describe(f)
        except OSError as exc:
            raise SourceError(f"{self.path}: cannot open as HDF5 ({exc})") from None
        self._file: h5py.File | None = None
        self._images: Any = None

    def _describe(self, f: h5py.File) -> None:
        if self.images_key not in f:
            raise SourceError(
                f"{self.path}: no dataset {self.images_key!r} (has: {', '.join(f.keys())}); "
                "pass images_key="
            )
        ds = f[self.images_key]
        if not isinstance(ds, h5py.Dataset):
            raise SourceError(f"{self.path}: {self.images_key!r} is a group, not a dataset")
        self.encoded = h5py.check_vlen_dtype(ds.dtype) == np.dtype(np.uint8)
        if not self.encoded:
            if ds.dtype != np.uint8 or ds.ndim not in (3, 4):
                raise SourceError(
                    f"{self.path}: {self.images_key!r} is {ds.dtype} of shape {ds.shape}; expected "
                    "variable-length uint8 (encoded image files) or uint8 (N, H, W[, C]) pixels"
                )
            check_images(np.empty((0, *ds.shape[1:]), np.uint8), f"{self.path}:{self.images_key}")
        self.shape = ds.shape
        count = ds.shape[0]
        if self.labels_key in f:
            where = f"{self.path}:{self.labels_key}"
            self.labels, text_classes = check_labels(
                np.asarray(f[self.labels_key][()]), count, where
            )
            self.classes = text_classes
            names = f[self.labels_key].attrs.get("classes", f.attrs.get("classes"))
            if names is not None:
                self.classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        else:
            self.labels = unlabeled(count)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_images": None}

    def _dataset(self) -> Any:
        if self._images is not None:
            return self._images
        with _OPEN_LOCK:
            if self._images is None:
                self._file = h5py.File(self.path, "r")
                self._images = self._file[self.images_key]
        return self._images

    def pixel_size(self) -> tuple[int, int] | None:
        """The images' own ``(height, width)`` for decoded pixels; None for encoded files."""
        return None if self.encoded else super().pixel_size()

    def pixel_channels(self) -> int | None:
        """The images' own channel count for decoded pixels; None for encoded files."""
        return None if self.encoded else super().pixel_channels()

    def read(self, index: int) -> bytes | np.ndarray:
        """Encoded bytes (vlen layout) or the decoded ``uint8`` image (array layout)."""
        value = self._dataset()[index]
        return value.tobytes() if self.encoded else np.asarray(value)

    def name(self, index: int) -> str:
        """``file.h5:images[index]``."""
        return f"{self.path}:{self.images_key}[{index}]"

    def fingerprint(self) -> str:
        """Digest of the path, shape, size, mtime and labels."""
        return file_fingerprint(self.path, (self.images_key, self.shape), self.labels)

    def close(self) -> None:
        """Close this process's handle."""
        f, self._file, self._images = self._file, None, None
        if f is not None:
            f.close()

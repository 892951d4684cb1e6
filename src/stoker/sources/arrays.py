"""Sources of already-decoded images: numpy arrays in memory and ``.npy`` files (memory-mapped)."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SourceError
from ..shm.segments import SharedArrays
from .base import Source, StoredReads, drop_pages, file_fingerprint
from .targets import as_targets


def check_images(images: np.ndarray, where: str) -> None:
    """Refuse arrays that are not (N, H, W), (N, H, W, 1|3|4) uint8 images."""
    if images.dtype != np.uint8:
        raise SourceError(
            f"{where}: images must be uint8, got {images.dtype}; convert with "
            "(x * 255).clip(0, 255).astype('uint8') if they are floats in [0, 1]"
        )
    ok = images.ndim == 3 or (images.ndim == 4 and images.shape[3] in (1, 3, 4))
    if not ok:
        raise SourceError(
            f"{where}: expected images of shape (N, H, W[, 1|3|4]), got {images.shape}"
        )


def check_labels(labels: Any, count: int, where: str) -> tuple[np.ndarray, list[str] | None]:
    """``(labels, class names)``: numeric labels keep their dtype and shape ``(N, ...)``
    exactly (float targets are never cast to ints), text labels become class ids, none are -1.
    ``labels`` may be an array, a list, or the path of a ``.npy`` file (memory-mapped)."""
    out, classes = as_targets(labels, count, where, "images")
    if not out.dtype.isnative:  # same values, in this machine's byte order (torch needs it)
        out = out.astype(out.dtype.newbyteorder("="))
    return out, classes


def check_masks(masks: Any, image_shape: tuple[int, ...], where: str) -> np.ndarray:
    """Masks as a ``uint8`` ``(N, H, W)`` array matching images of shape ``image_shape``."""
    arr = np.asarray(masks)
    if arr.ndim == 4:
        arr = arr[..., 0]  # (N, H, W, C): channel 0
    if arr.ndim != 3 or arr.shape != tuple(image_shape[:3]):
        raise SourceError(
            f"{where}: masks of shape {np.asarray(masks).shape} do not match images of shape "
            f"{tuple(image_shape)}; give one (H, W) mask per image, as (N, H, W) uint8"
        )
    if arr.dtype != np.uint8:
        if arr.dtype.kind not in "iub" or (arr.size and (arr.min() < 0 or arr.max() > 255)):
            raise SourceError(f"{where}: masks must be uint8 class values 0-255, got {arr.dtype}")
        arr = arr.astype(np.uint8)
    return arr


class DecodedArrays(Source):
    """A source of decoded images of one shape ``self.shape`` = (N, H, W[, C])."""

    shape: tuple[int, ...]

    def pixel_size(self) -> tuple[int, int] | None:
        """The images' own ``(height, width)``."""
        return (int(self.shape[1]), int(self.shape[2]))

    def pixel_channels(self) -> int | None:
        """The images' own channel count (1 for (N, H, W))."""
        return int(self.shape[3]) if len(self.shape) == 4 else 1


class ArraySource(DecodedArrays):
    """An in-memory array of images; copied once into shared memory that workers map."""

    from_storage = False  # the images are in memory

    def __init__(self, images: np.ndarray, labels: Any = None, masks: Any = None) -> None:
        check_images(images, "array source")
        self.labels, self.classes = check_labels(labels, images.shape[0], "array source")
        self.shape, self._array = images.shape, images
        self._shared: SharedArrays | None = None
        self._digest = hashlib.blake2b(
            np.ascontiguousarray(images[:: max(1, len(images) // 64)]).tobytes(), digest_size=12
        ).hexdigest()
        self.mask_shape: tuple[int, ...] | None = None
        self._masks: np.ndarray | None = None
        if masks is not None:
            self._masks = check_masks(masks, images.shape, "array source")
            self.mask_shape = self._masks.shape
            self.has_masks = True
            self._digest += hashlib.blake2b(
                np.ascontiguousarray(self._masks[:: max(1, len(images) // 64)]).tobytes(),
                digest_size=12,
            ).hexdigest()

    def __getstate__(self) -> dict[str, Any]:
        """Sent to a worker: images (and masks) move into one shared segment, made once."""
        if self._shared is None or not self._shared.alive:
            arrays = {"images": self._array}
            if self._masks is not None:
                arrays["masks"] = self._masks
            self._shared = SharedArrays(arrays, "arr")
        return {**self.__dict__, "_array": None, "_masks": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        assert self._shared is not None
        self._array = self._shared["images"]
        if self.mask_shape is not None:
            self._masks = self._shared["masks"]

    def read(self, index: int) -> np.ndarray:
        """The image as a view (no copy)."""
        return self._array[index]

    def take(self, indices: np.ndarray, out: np.ndarray) -> bool:
        """Copy images ``indices`` into ``out`` in one vectorised copy, when ``out`` holds them
        exactly as stored (same size and channels, no masks); False when it does not."""
        shape = (len(indices), *self.shape[1:])
        if self._masks is not None or out.size != int(np.prod(shape)):
            return False
        dst = out.reshape(shape)
        for k, index in enumerate(indices.tolist()):  # row copies: faster than np.take(out=)
            dst[k] = self._array[index]
        return True

    def read_mask(self, index: int) -> np.ndarray:
        """The mask as a view (no copy)."""
        if self._masks is None:
            raise NotImplementedError("this array source has no masks")
        return self._masks[index]

    def name(self, index: int) -> str:
        """``array[index]``."""
        return f"array[{index}]"

    def mask_name(self, index: int) -> str:
        """``masks[index]``."""
        return f"masks[{index}]"

    def fingerprint(self) -> str:
        """Digest of shape, labels and a sample of the pixels (and masks)."""
        h = hashlib.blake2b(self._digest.encode(), digest_size=12)
        h.update(str(self.shape).encode() + self.labels.tobytes())
        if self.mask_shape is not None:
            h.update(b"masks" + str(self.mask_shape).encode())
        return h.hexdigest()

    def close(self) -> None:
        """Unlink the shared copy, if one was made."""
        if self._shared is not None:
            self._shared.unlink()


class NpySource(StoredReads, DecodedArrays):
    """A ``.npy`` file of images, memory-mapped in every process and never read whole."""

    def __init__(self, path: str | os.PathLike, labels: Any = None) -> None:
        self.path = Path(path)
        try:
            arr = np.load(self.path, mmap_mode="r", allow_pickle=False)
        except (ValueError, EOFError, OSError) as exc:
            raise SourceError(
                f"{self.path}: not a readable .npy array of images ({type(exc).__name__}: {exc}); "
                "save one with numpy.save(path, images)"
            ) from None
        check_images(arr, str(self.path))
        self.shape = arr.shape
        self.labels, self.classes = check_labels(labels, arr.shape[0], str(self.path))
        self._array: np.ndarray | None = arr

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}

    def _images(self) -> np.ndarray:
        if self._array is None:
            self._array = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return self._array

    def read(self, index: int) -> np.ndarray:
        """The image, a view of the mapping. Its pages are asked for at once
        (``MADV_WILLNEED``): cold, touching them one page fault at a time waits on each
        read-around in turn, 2-3x slower (measured: see benchmarks/README.md)."""
        images = self._images()
        self._advise(images, index, getattr(mmap, "MADV_WILLNEED", -1))
        return np.asarray(images[index])

    def forget(self, index: int) -> bool:
        """Drop the image's rows of the file from the page cache: unmapped from this process
        first (the kernel never drops a page that is mapped), then ``POSIX_FADV_DONTNEED``."""
        images = self._images()
        self._advise(images, index, getattr(mmap, "MADV_DONTNEED", -1))
        drop_pages(str(self.path), *self._span(images, index))
        return True

    @staticmethod
    def _span(images: np.ndarray, index: int) -> tuple[int, int]:
        """(file offset, length) of image ``index``'s bytes."""
        row = int(images.nbytes // max(1, images.shape[0]))
        return int(getattr(images, "offset", 0)) + index * row, row

    def _advise(self, images: np.ndarray, index: int, advice: int) -> None:
        """``madvise`` the pages of image ``index`` in this process's mapping (a hint: a
        platform without it, or an error, changes nothing)."""
        mapping = getattr(images, "_mmap", None)
        if advice < 0 or not isinstance(mapping, mmap.mmap):
            return
        start, length = self._span(images, index)
        offset = int(getattr(images, "offset", 0))
        start -= offset - offset % mmap.ALLOCATIONGRANULARITY  # where numpy's mapping begins
        first = start - start % mmap.PAGESIZE
        try:
            mapping.madvise(advice, first, start + length - first)
        except (OSError, ValueError):
            pass

    def name(self, index: int) -> str:
        """``file.npy[index]``."""
        return f"{self.path}[{index}]"

    def fingerprint(self) -> str:
        """Digest of the path, shape, size and mtime."""
        return file_fingerprint(self.path, (self.shape,), self.labels)

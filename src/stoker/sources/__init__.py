"""Data sources: random access to samples by index, whatever the storage.

A source has ``len()``, ``labels`` (int64 array), ``classes``, ``read(i)`` returning encoded bytes
or a decoded ``uint8`` array, ``name(i)`` for messages, and ``fingerprint()`` for resume checks.
It pickles cheaply (numpy arrays, no Python list per sample) so spawned workers get it whole.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import SourceError
from .arrays import ArraySource, NpySource
from .base import Source
from .bucket import TABLES, folder_kind, open_url, open_urls
from .dataset import DatasetSource, is_dataset
from .folder import FolderSettings, FolderSource
from .parquet_targets import label_names
from .store import LISTING_TTL, shown
from .table import PathSource, TableSource
from .tar import TarSource

__all__ = [
    "Source",
    "open_source",
    "ArraySource",
    "NpySource",
    "FolderSource",
    "TableSource",
    "TarSource",
    "ShardSource",
    "HDF5Source",
    "RemoteShardSource",
]


def __getattr__(name: str) -> Any:
    """ShardSource (pyarrow) and HDF5Source (h5py) are imported on first use."""
    if name == "ShardSource":
        from .shards import ShardSource

        return ShardSource
    if name == "RemoteShardSource":
        from .remote import RemoteShardSource

        return RemoteShardSource
    if name == "HDF5Source":
        from .hdf5 import HDF5Source

        return HDF5Source
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SourceSettings(FolderSettings, Protocol):
    """The Loader options the readers read: the Loader's source group has them and is handed
    over whole (``open_source(settings=...)``); each is a read-only property."""

    @property
    def storage_options(self) -> Any:
        """fsspec options for a bucket (None: the store's defaults)."""
        ...

    @property
    def listing_ttl(self) -> float:
        """Seconds a cached bucket listing is used."""
        ...


def open_source(
    source: Any = None,
    *,
    paths: Any = None,
    labels: Any = None,
    masks: Any = None,
    label_column: Any = None,
    columns: tuple[str, ...] = (),
    spec: Any = None,
    settings: SourceSettings | None = None,
    keep: tuple[str, ...] | None = None,
) -> Source:
    """Recognise what ``source`` is and return the matching Source.

    ``source`` may be a folder (ImageFolder layout, or of Parquet shards or WebDataset tars), a
    CSV/TSV file, a ``.npy``, ``.parquet``, ``.tar`` or ``.h5``/``.hdf5`` file, a URL of any of
    those but ``.npy`` and HDF5 in a bucket (``s3://``, ``gs://``, ``https://``, any fsspec URL:
    see ``bucket.py``), a numpy array of images (then ``labels`` is an array), or None with
    ``paths=`` (and ``labels=``, local paths or URLs).

    ``label_column``: the column(s) holding the target in a CSV/TSV or Parquet shards (a
    name, or a list of names of numeric columns for an ``(N, K)`` target); ``columns``: more
    named numeric columns of a CSV/TSV to read (sample weights), found in ``source.named_columns``.

    Segmentation: ``masks=`` pairs each image with a mask, for an array source (a ``(N, H, W)``
    array) or ``paths=`` (a list of mask files); a CSV/TSV with an ``image,mask`` header pairs
    them by itself.

    ``settings``: the Loader's source group, handed whole to the reader opened, which reads its
    own settings from it (``FolderSource``); None is every setting's default. ``keep``: the
    fields a per-sample dataset's batches hold (``Loader(batch=...)``; None: every field).
    """
    if masks is not None:
        if labels is not None:
            raise SourceError(
                "pass labels= or masks=, not both: a batch carries masks in place of labels"
            )
        if not (source is None or isinstance(source, np.ndarray)):
            raise SourceError(
                "masks= goes with an array of images or paths=[...]; for files, list the pairs "
                "in a CSV with an image,mask header"
            )
    if isinstance(source, Source):
        return source
    if is_dataset(source):
        return DatasetSource(source, spec, keep)
    if spec is not None:
        raise SourceError(
            "spec= declares the fields of a per-sample dataset (an object with __len__ and "
            "__getitem__); this source's fields are known"
        )
    table = isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() in TABLES
    if (label_column is not None or columns) and not (table or _is_shards(source)):
        raise SourceError(
            "label_column= names a column of a CSV/TSV file or of Parquet shards; for arrays, "
            "lists and folders pass the targets as labels= (any numeric array, (N,) or (N, K))"
        )
    storage = None if settings is None else settings.storage_options
    ttl = LISTING_TTL if settings is None else settings.listing_ttl
    if source is None:
        if paths is None:
            raise SourceError("no data given: pass a folder, a CSV file, an array, or paths=[...]")
        return open_urls(paths, labels, masks, storage, ttl) or PathSource(paths, labels, masks)
    if paths is not None:
        raise SourceError("pass either a source or paths=, not both")
    if isinstance(source, np.ndarray):
        return ArraySource(source, labels, masks)
    if isinstance(source, (str, os.PathLike)) and "://" not in str(source):
        _check_path(Path(source))
    if table and Path(source).is_file():
        return TableSource(source, label_column, tuple(columns))
    label_names(label_column)  # checked before any shard is opened
    named = {} if label_column is None else {"label_column": label_column}
    if isinstance(source, str) and "://" in source:  # a bucket or a URL, through fsspec
        if labels is not None:
            raise SourceError(
                f"labels= was given with {shown(source)}, whose labels come from the data "
                "itself (class prefixes, a label column); labels= goes with an array, a .npy "
                "file or paths=[...]"
            )
        return open_url(source, label_column, tuple(columns), storage, ttl)
    if isinstance(source, (str, os.PathLike)):
        return _open_path(Path(source), labels, named, settings)
    raise SourceError(
        f"unsupported source of type {type(source).__name__}: pass a folder, a CSV/TSV file, "
        "a .npy file, a numpy array of images, or paths=[...]"
    )


def _is_shards(source: Any) -> bool:
    """A URL, ``.parquet`` file or folder of Parquet shards."""
    if isinstance(source, str) and "://" in source:
        return True
    if not isinstance(source, (str, os.PathLike)):
        return False
    path = Path(source)
    return path.suffix.lower() == ".parquet" or (path.is_dir() and _folder_kind(path) == "parquet")


def _check_path(path: Path) -> None:
    """A SourceError naming ``path`` when it is missing or cannot even be looked at (a name
    too long for the file system, a NUL in it, no permission to search a parent folder)."""
    try:
        path.stat()
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file or folder") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise SourceError(f"{path}: cannot be opened ({reason}); check the path") from None


def _open_path(
    path: Path, labels: Any, named: dict[str, Any], settings: FolderSettings | None = None
) -> Source:
    """Open a source given as a path, by what the path is."""
    _check_path(path)
    if labels is not None and path.suffix.lower() != ".npy":
        raise SourceError(
            f"labels= was given with {path}, whose labels come from the data itself (class "
            "folders, a label column); labels= goes with an array, a .npy file or paths=[...]"
        )
    if path.is_dir():
        kind = _folder_kind(path)
        if kind == "parquet":
            from .shards import ShardSource

            return ShardSource(path, **named)
        if kind == "tar":
            return TarSource(path)
        return FolderSource(path, settings=settings)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        from .shards import ShardSource

        return ShardSource(path, **named)
    if suffix == ".tar":
        return TarSource(path)
    if suffix in (".h5", ".hdf5"):
        from .hdf5 import HDF5Source

        return HDF5Source(path)
    if suffix == ".npy":
        return NpySource(path, labels)
    raise SourceError(
        f"{path}: cannot tell what this file is from its extension {suffix!r}; "
        "stoker reads folders, .csv/.tsv files of path,label, .npy arrays, .parquet shards, "
        "WebDataset .tar shards and .h5/.hdf5 files"
    )


def _folder_kind(path: Path) -> str:
    """'parquet' or 'tar' for a folder of shards (files directly inside), else 'folder'."""
    return folder_kind([e.name for e in os.scandir(path) if e.is_file()])

"""Image files in a bucket: an ImageFolder under a prefix, a CSV/TSV of object keys or URLs, and
``paths=`` lists of URLs (``s3://``, ``gs://``, ``https://``, any fsspec URL).

Each has the meaning and the rules of its local twin (``folder.py``, ``table.py``): classes are
the sorted names of the prefix's "subfolders" (not starting with a dot), a class's images are
the objects under it with an image extension, in the order a local walk visits them (a
folder's files by name, then its subfolders by name); a CSV's paths are keys relative to the
CSV's own prefix, or full URLs of the same store. The objects are listed once, in the process
that opens the source (``listing.listed``: cached, and rank 0's on every rank of a job; one
listing per distinct parent prefix for a CSV or a path list); each sample keeps the listed size
and version tag, which travel with the source to every worker and cluster node (nothing is
listed again there), and every read asks for exactly that version: an object replaced since is
``ObjectChanged``, never a mix of old and new bytes.
An object listed in a CSV but missing from the store is a bad sample named with its URL, as a
missing local file is.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
from pathlib import Path
from typing import Any

import numpy as np

from ..decode import IMAGE_EXTENSIONS
from ..errors import SourceError
from .base import FileListSource, PathIndex
from .folder import warn_empty_class
from .listing import listed
from .store import Entry, NotInStore, Store, is_url, shown
from .table import given_lists, read_rows

READ_AHEAD_MAX = 64  # requests in flight per worker the auto window may grow to


class BucketFiles(FileListSource):
    """A FileListSource whose files are objects: ``index`` holds full URLs, ``versions`` each
    one's listed tag and ``sizes`` its listed size (-1: not in the store when listed)."""

    read_ahead_max = READ_AHEAD_MAX
    store: Store
    versions: PathIndex
    sizes: np.ndarray
    mask_versions: PathIndex | None = None
    mask_sizes: np.ndarray | None = None

    def _objects(self, entries: list[Entry]) -> None:
        """Take the images' listed entries."""
        self.index = url_index([e.url for e in entries])
        self.versions = PathIndex(Path(""), [e.tag for e in entries])
        self.sizes = np.asarray([e.size for e in entries], dtype=np.int64)

    def _mask_objects(self, entries: list[Entry]) -> None:
        """Take the masks' listed entries."""
        self.mask_index = url_index([e.url for e in entries])
        self.mask_versions = PathIndex(Path(""), [e.tag for e in entries])
        self.mask_sizes = np.asarray([e.size for e in entries], dtype=np.int64)

    def read(self, index: int) -> bytes:
        """The object's bytes, of the version listed: one request."""
        return _get(self.store, self.index, self.versions, self.sizes, index)

    def read_mask(self, index: int) -> bytes:
        """The mask object's bytes, of the version listed."""
        if self.mask_index is None or self.mask_versions is None or self.mask_sizes is None:
            raise NotImplementedError(f"{type(self).__name__} has no masks")
        return _get(self.store, self.mask_index, self.mask_versions, self.mask_sizes, index)

    def forget(self, index: int) -> bool:
        """Nothing to drop: objects read over the network leave no pages in the page cache."""
        return False

    def bypass_page_cache(self) -> bool:
        """Nothing to bypass (see ``forget``)."""
        return False

    def name(self, index: int) -> str:
        """The object's URL (no credential in it)."""
        return shown(self.index.path(index))

    def mask_name(self, index: int) -> str:
        """The mask object's URL."""
        return shown(self.mask_index.path(index)) if self.mask_index is not None else "mask"

    def fingerprint(self) -> str:
        """The file list's digest and every object's listed size and version."""
        h = hashlib.blake2b(super().fingerprint().encode(), digest_size=12)
        h.update(self.versions.digest().encode())
        h.update(self.sizes.tobytes())
        return h.hexdigest()

    def close(self) -> None:
        """Unlink the shared copies of the listing, drop this process's client."""
        super().close()
        self.versions.close()
        if self.mask_versions is not None:
            self.mask_versions.close()
        self.store.close()


def url_index(urls: list[str]) -> PathIndex:
    """URLs of one scheme as a PathIndex: the scheme is its root, the rest each entry."""
    scheme = urls[0].split("://", 1)[0] + "://" if urls else ""
    index = PathIndex(Path(""), [u[len(scheme) :] for u in urls])
    index.root = scheme  # a Path would fold the '//' of a URL
    return index


def _get(store: Store, urls: PathIndex, tags: PathIndex, sizes: np.ndarray, i: int) -> bytes:
    url, size = urls.path(i), int(sizes[i])
    if size < 0:
        raise FileNotFoundError(f"{shown(url)}: not found in the store when it was listed")
    return store.get(url, 0, size, tags.relative(i))


class BucketFolderSource(BucketFiles):
    """An ImageFolder under a bucket prefix; see the module docstring."""

    def __init__(self, store: Store, url: str, listing: list[Entry]) -> None:
        self.store, self.root = store, url.rstrip("/")
        classes, kept, labels = folder_layout(self.root, listing)
        if not classes:
            raise SourceError(
                f"{shown(self.root)}: no class prefixes; an image folder needs one per class "
                f"({shown(self.root)}/cat/1.jpg, .../dog/2.jpg), or pass a CSV or paths=[...]"
            )
        self.classes = classes
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(self.labels) == 0:
            raise SourceError(
                f"{shown(self.root)}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in its "
                "class folders"
            )
        self._objects(kept)


def folder_layout(root: str, listing: list[Entry]) -> tuple[list[str], list[Entry], list[int]]:
    """Classes, image objects (in a local walk's order) and their labels of the ImageFolder
    under ``root``: the local folder's rules applied to a listing (see the module docstring)."""
    top = root + "/"
    found: dict[str, list[tuple[list[tuple[int, str]], Entry]]] = {}
    for entry in listing:
        if not entry.url.startswith(top):
            continue
        parts = entry.url[len(top) :].split("/")
        if len(parts) < 2 or parts[0].startswith(".") or not parts[0]:
            continue  # a file at the root, or under a hidden "folder"
        found.setdefault(parts[0], [])
        if os.path.splitext(parts[-1])[1].lower() not in IMAGE_EXTENSIONS:
            continue
        # a walk visits a folder's files (by name) before its subfolders (by name)
        order = [(1, d) for d in parts[1:-1]] + [(0, parts[-1])]
        found[parts[0]].append((order, entry))
    classes = sorted(found)
    kept: list[Entry] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        files = [e for _, e in sorted(found[cls], key=lambda pair: pair[0])]
        if not files:
            warn_empty_class(shown(top + cls), cls, label)
        kept.extend(files)
        labels.extend([label] * len(files))
    return classes, kept, labels


class BucketTableSource(BucketFiles):
    """A CSV/TSV object of ``path,label`` rows: keys relative to it, or full URLs."""

    def __init__(
        self, store: Store, url: str, label_column: Any = None, columns: tuple[str, ...] = ()
    ) -> None:
        self.store, self.table = store, url
        try:
            text = store.get(url).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError(f"{shown(url)}: not a readable UTF-8 CSV/TSV file ({exc})") from None
        except FileNotFoundError:
            raise SourceError(f"{shown(url)}: not found; check the bucket and the key") from None
        except OSError as exc:
            raise SourceError(f"{exc}; check the URL, the network and the credentials") from None
        base = url.rsplit("/", 1)[0]
        rows = read_rows(
            io.StringIO(text, newline=""),
            shown(url),
            label_column,
            tuple(columns),
            exists=lambda cell: False,  # a first row with no image extension is a header
        )
        self.labels, self.classes = rows.labels()
        self.named_columns = rows.extras()
        images = _resolve(url, base, _cells(rows.blob, rows.offsets))
        if rows.mask_col is not None:
            masks = _resolve(url, base, _cells(rows.mask_blob, rows.mask_offsets))
            found = lookup(store, images + masks)
            self._objects(found[: len(images)])
            self._mask_objects(found[len(images) :])
        else:
            self._objects(lookup(store, images))


class BucketPathSource(BucketFiles):
    """``paths=[...]`` of URLs (and ``labels=``, ``masks=`` as for local paths)."""

    def __init__(self, store: Store, paths: list[str], labels: Any, masks: Any) -> None:
        self.store, self.table = store, "paths="
        plist, mlist, self.labels, self.classes = given_lists(paths, labels, masks)
        if mlist is not None:
            self._mask_objects(lookup(store, _same_store(store, mlist, "masks=")))
        self._objects(lookup(store, _same_store(store, plist, "paths=")))


def _cells(blob: bytearray, offsets: Any) -> list[str]:
    ends = list(offsets)
    raw = bytes(blob)
    return [
        raw[a:b].decode("utf-8", "surrogateescape")
        for a, b in zip(ends[:-1], ends[1:], strict=True)
    ]


def _resolve(table: str, base: str, cells: list[str]) -> list[str]:
    """A bucket CSV's cells as URLs: a full URL as it is, a key relative to the CSV's prefix."""
    scheme = base.split("://", 1)[0].lower()
    urls = []
    for number, cell in enumerate(cells, start=1):
        if is_url(cell):
            if cell.split("://", 1)[0].lower() != scheme:
                raise SourceError(
                    f"{shown(table)}: entry {number} ({shown(cell)}) is in another store; a "
                    f"table in {scheme}:// lists keys relative to it or {scheme}:// URLs"
                )
            urls.append(cell)
        elif cell.startswith("/"):
            raise SourceError(
                f"{shown(table)}: entry {number} ({cell}) is an absolute path; in a bucket, "
                "give keys relative to the table or full URLs"
            )
        else:
            urls.append(f"{base}/{cell}")
    return urls


def _same_store(store: Store, paths: list[str], what: str) -> list[str]:
    """``paths`` when every one is a URL of ``store``'s protocol; else a SourceError."""
    for p in paths:
        if not is_url(p) or p.split("://", 1)[0].lower() != store.protocol:
            raise SourceError(
                f"{what} mixes {store.protocol}:// URLs with {shown(p)!r}; give URLs of one store "
                "(or local paths only)"
            )
    return paths


def lookup(store: Store, urls: list[str]) -> list[Entry]:
    """Each URL's listed entry (size -1 and no tag for one that is not in the store): one
    listing per distinct parent prefix where the store lists (HTTP: one HEAD per URL). A
    cached listing that lacks a URL named is not taken: that prefix is listed again."""
    known: dict[str, Entry] = {}
    seen: set[str] = set()
    if store.protocol not in ("http", "https"):
        wanted: dict[str, set[str]] = {}
        for u in urls:
            wanted.setdefault(posixpath.dirname(u), set()).add(u)
        for parent in sorted(wanted):
            try:
                found = {e.url: e for e in listed(store, parent, recursive=False)}
                if not wanted[parent] <= found.keys():
                    found = {e.url: e for e in listed(store, parent, False, fresh=True)}
            except NotInStore:
                continue  # nothing to list there: each URL is looked up by itself
            known.update(found)
            seen.add(parent)
    out = []
    for url in urls:
        entry = known.get(url)
        if entry is None and posixpath.dirname(url) in seen:
            entry = Entry(url, -1, "")  # its prefix was listed without it
        if entry is None:
            try:
                entry = store.head(url)
            except NotInStore:
                entry = Entry(url, -1, "")
        out.append(entry)
    return out

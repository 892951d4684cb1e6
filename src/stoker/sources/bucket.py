"""Which source a URL is: every local layout, in a bucket (``s3://``, ``gs://``, any fsspec URL).

A URL is recognised by the same rules as a local path (``open_source``): a ``.csv``/``.tsv``/
``.txt`` object is a table (``bucketfiles.BucketTableSource``), a ``.parquet`` object one shard
and a ``.tar`` object one WebDataset shard; a prefix is listed once and is what a local folder
with those files would be (``folder_kind``): Parquet shards (``remote.RemoteShardSource``), tar
shards (``buckettar.BucketTarSource``) or an ImageFolder (``bucketfiles.BucketFolderSource``).
A listing is cached and shared by the ranks of a job (``listing.py``). HTTP(S) has no listing:
a URL there is a file, or a folder of shards with a stoker manifest.
``paths=`` of URLs is ``bucketfiles.BucketPathSource``.
"""

from __future__ import annotations

from typing import Any

from ..errors import SourceError
from .base import Source
from .bucketfiles import BucketFolderSource, BucketPathSource, BucketTableSource
from .buckettar import BucketTarSource
from .listing import listed
from .store import LISTING_TTL, directly_under, is_url, open_store, shown

TABLES = (".csv", ".tsv", ".txt")
MANIFEST = "stoker-manifest.json"


def folder_kind(names: list[str]) -> str:
    """What a folder holds, from the names of the files directly inside it (a local folder's
    or a bucket prefix's): 'parquet' (a stoker manifest or ``.parquet`` files), 'tar'
    (``.tar`` files), else 'folder' (an ImageFolder). Hidden names do not count."""
    if MANIFEST in names:
        return "parquet"
    visible = [n.lower() for n in names if not n.startswith(".")]
    if any(n.endswith(".parquet") for n in visible):
        return "parquet"
    if any(n.endswith(".tar") for n in visible):
        return "tar"
    return "folder"


def open_url(
    url: str,
    label_column: Any = None,
    columns: tuple[str, ...] = (),
    storage_options: Any = None,
    listing_ttl: float = LISTING_TTL,
) -> Source:
    """The source at ``url``; see the module docstring."""
    store = open_store(url, storage_options, listing_ttl=listing_ttl)
    root = url.rstrip("/")
    lower = root.lower()
    if lower.endswith(TABLES):
        return BucketTableSource(store, root, label_column, tuple(columns))
    from .remote import RemoteShardSource

    shards = {
        "label_column": label_column,
        "storage_options": storage_options,
        "listing_ttl": listing_ttl,
    }
    if lower.endswith(".parquet") or store.protocol in ("http", "https"):
        return RemoteShardSource(root, **shards)
    if lower.endswith(".tar"):
        return BucketTarSource(store, [store.head(root)])
    listing = listed(store, root)
    if not listing:
        raise SourceError(
            f"{shown(root)}: no objects under this prefix; check the bucket and the path (keys "
            "are case-sensitive)"
        )
    top = [e.url.rsplit("/", 1)[1] for e in directly_under(listing, root, "")]
    kind = folder_kind(top)
    if kind == "parquet":
        return RemoteShardSource(root, listing=listing, **shards)
    if label_column is not None or columns:
        raise SourceError(
            "label_column= names a column of a CSV/TSV file or of Parquet shards; "
            f"{shown(root)} is {'tar shards' if kind == 'tar' else 'an image folder'}"
        )
    if kind == "tar":
        return BucketTarSource(store, directly_under(listing, root, ".tar"))
    return BucketFolderSource(store, root, listing)


def open_urls(
    paths: list[Any],
    labels: Any,
    masks: Any,
    storage_options: Any,
    listing_ttl: float = LISTING_TTL,
) -> Source | None:
    """``paths=`` as a bucket source when they are URLs (None when they are local paths)."""
    names = list(paths)
    first = next((p for p in names if is_url(p)), None)
    if first is None:
        return None
    store = open_store(first, storage_options, listing_ttl=listing_ttl)
    return BucketPathSource(store, names, labels, masks)

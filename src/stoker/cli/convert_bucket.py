"""``stoker convert SRC s3://bucket/prefix``: shards written to a bucket, resumable as locally.

The shards are written by the local run (``convert._convert``) into a staging folder of this
user's, ``~/.cache/stoker/convert/<hash of the URL>`` (private, as every stoker cache:
``sources.cachefile``), then uploaded: each shard, ``errors.csv``, and the manifest last, so a
prefix with a manifest holds every shard it lists. A run killed at any point resumes the same
way a local one does: the staging folder keeps the plan and the finished shards (only the
others are built again), and a shard already in the bucket with its recorded size is not
uploaded again. The staging folder is removed once the manifest is uploaded.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..sources.base import cache_folder
from ..sources.cachefile import private_folder
from ..sources.store import NotInStore, Store, open_store, shown
from .shard_writer import ERRORS, MANIFEST

__all__ = ["staging", "upload"]


def staging(url: str) -> tuple[Store, Path]:
    """The bucket's store and this URL's private staging folder (created)."""
    store = open_store(url)
    key = hashlib.blake2b(shown(url.rstrip("/")).encode(), digest_size=10).hexdigest()
    folder = private_folder(cache_folder(None, "convert") / key, create=True)
    if folder is None:
        raise ConfigError(
            f"dst {shown(url)}: no private staging folder under {cache_folder(None, 'convert')} "
            "(not writable, or not yours alone: see the warning above); fix its owner and mode"
        )
    return store, folder


def upload(store: Store, out: Path, url: str, manifest: dict[str, Any]) -> None:
    """Put the shards, errors.csv and (last) the manifest from ``out`` under ``url``; a shard
    already there with its recorded size is kept. Then remove the staging folder."""
    root = url.rstrip("/")
    try:
        there = {e.url: e.size for e in store.list(root)}
    except NotInStore:
        there = {}
    for shard in manifest["shards"]:
        target = f"{root}/{shard['file']}"
        if there.get(target) != shard["bytes"]:
            store.put(out / shard["file"], target)
    store.put(out / ERRORS, f"{root}/{ERRORS}")
    store.put(out / MANIFEST, f"{root}/{MANIFEST}")
    shutil.rmtree(out, ignore_errors=True)

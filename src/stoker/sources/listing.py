"""Bucket listings: cached like a folder scan, the same on every rank of a job.

``listed(store, url, recursive)`` is how every bucket source lists a prefix (``bucket.py``,
``bucketfiles.lookup``, ``remote.py``). ``stoker convert`` alone lists with ``Store.list``
itself: it needs what its destination holds now.

The cache. A listing is kept under ``~/.cache/stoker/listing`` (``cachefile``'s rules: a folder
of this user's alone, mode 0700; a file read only when it is this user's and no one else can
write it; written atomically, never through a link), one ``.npz`` per listed prefix, named by a
digest of the URL, whether it was listed recursively and the store's ``scope()`` (the endpoint
and the options that change what a listing shows, never a credential: none is in the name or
the file). Each entry keeps what the store says changes when an object is replaced (its ETag
or generation) and its size.

How a cached listing is trusted without listing again: for ``TTL`` seconds after it was
listed (``Loader(listing_ttl=)``: the store's ``listing_ttl``; 0 lists every time), and no
longer. An object store has no cheap "did this prefix change" question (no
folder mtime; a listing is one request per 1,000 keys), so the cache is a TTL, and what it can
miss is bounded by the reads themselves: every read asks for the listed version (``If-Match``
on the ETag, the GCS generation), so an object replaced since it was listed is
``ObjectChanged`` naming it, never a mix of old and new bytes; an object deleted since is a
bad sample named with its URL. Either removes the cached listings its store was made from
(``Store.listed_from``), so the next Loader lists again. An object added since is not in the
dataset until the cache expires or is deleted (``rm -r ~/.cache/stoker/listing``). A manifest
or a CSV that names an object the cached listing lacks (or with another size) has that prefix
listed again at once.

Every rank the same listing: when ``torch.distributed`` is initialised with several ranks,
rank 0 lists (or takes its cache) and publishes the listing in the process group's key-value
store; the other ranks take it from there and list nothing. Rank 0's listing is used by all
rather than each rank listing and the listings compared: the ranks then cannot differ even
while objects are uploaded between their listings, and a job lists once instead of once per
rank (S3 bills a LIST at 12.5 GETs, and all ranks' LISTs share the prefix's request rate).
Rank 0 never waits for the others; another rank waits at most ``RANK0_WAIT`` seconds for rank 0
(then a ``SourceError`` saying to make the Loader on every rank), and gets rank 0's error when
rank 0's listing failed. Loaders must be made in the same order on every rank (as
``DistributedSampler`` needs): the n-th listing of a prefix on one rank is the n-th on rank 0.
A Loader made before ``init_process_group`` cannot wait for rank 0: each rank lists on its
own, and when the group is found (``agree_early``) the listings are compared with rank 0's;
ranks that listed a prefix differently get one error naming it, both counts and the fix.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import zlib
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SourceError, one_line
from . import cachefile
from .base import cache_folder
from .store import LISTING_TTL, Entry, NotInStore, Store, remove_files, shown

CACHE_VERSION = 1
#: Seconds a cached listing is used for after it was listed, unless ``listing_ttl=`` says
#: otherwise (a store's ``listing_ttl``; see the module docstring).
TTL = LISTING_TTL
#: Seconds a rank other than 0 waits for rank 0's listing of a prefix.
RANK0_WAIT = 1800.0
_ARRAYS = ("urls", "url_ends", "tags", "tag_ends", "sizes")
_rounds: Counter[str] = Counter()  # listings of each key shared so far by this process
_rounds_lock = threading.Lock()
#: Listings this process took while no process group existed: key -> [url, count, digest].
_early: dict[str, list[Any]] = {}
_compared = False  # whether they were compared with rank 0's (once per process)


def listed(store: Store, url: str, recursive: bool = True, fresh: bool = False) -> list[Entry]:
    """The objects under the prefix ``url`` (as ``Store.list``): rank 0's listing in a
    torch.distributed job of several ranks, else this process's, cached for the store's
    ``listing_ttl`` seconds
    (``fresh``: listed now, whatever the cache holds)."""
    url = url.rstrip("/")
    key = listing_key(store, url, recursive)
    group = _torch_group()
    if group is None:
        entries = _cached_list(store, url, recursive, key, fresh)
        if "torch.distributed" in sys.modules:  # a group may be made later: kept to compare
            _early[key] = [shown(url), len(entries), _digest(entries)]
        return entries
    agree_early()
    rank, world, kv = group
    with _rounds_lock:
        _rounds[key] += 1
        name = f"stoker/listing/{key}/{_rounds[key]}"
    if rank != 0:
        return _from_rank0(kv, name, world, url)
    try:
        entries = _cached_list(store, url, recursive, key, fresh)
    except BaseException as exc:  # the other ranks get it too, rather than wait for a listing
        kv.set(name, _encode_error(exc))
        raise
    kv.set(name, _encode(entries))
    return entries


def note(store: Store, url: str, recursive: bool = True) -> None:
    """Tell ``store`` (another Store for the same objects than the one that listed) which
    cached listing its source is made from, so a replaced object removes it."""
    store.listed_from(cache_path(listing_key(store, url.rstrip("/"), recursive)))


def listing_key(store: Store, url: str, recursive: bool) -> str:
    """The cache's name for a listing: a digest of the URL, the depth and the store's scope."""
    what = json.dumps([CACHE_VERSION, shown(url), recursive, store.scope()])
    return hashlib.blake2b(what.encode(), digest_size=12).hexdigest()


def cache_path(key: str) -> Path:
    """Where the listing named ``key`` is cached."""
    return cache_folder(None, "listing") / f"{key}.npz"


# ---------------------------------------------------------------------------- the cache


def _cached_list(store: Store, url: str, recursive: bool, key: str, fresh: bool) -> list[Entry]:
    """The cached listing while it is fresh, else a new one (cached unless it is empty: a
    prefix is empty until its upload begins, and then it is not)."""
    path = cache_path(key)
    store.listed_from(path)
    ttl = store.listing_ttl
    entries = None if fresh or ttl <= 0 else load(path, url, time.time(), ttl)
    if entries is None:
        entries = store.list(url, recursive)
        if entries:
            save(path, url, entries, time.time())
        else:
            remove_files([str(path)])  # an older one would be taken next
    return entries


def save(path: Path, url: str, entries: list[Entry], now: float) -> bool:
    """Cache ``entries``, the listing of ``url`` made at ``now`` (best effort)."""
    urls = [e.url.encode() for e in entries]
    tags = [e.tag.encode() for e in entries]
    meta = {"version": CACHE_VERSION, "url": shown(url), "listed_at": now}
    arrays = {
        "urls": np.frombuffer(b"".join(urls), np.uint8),
        "url_ends": np.cumsum([len(u) for u in urls], dtype=np.int64),
        "tags": np.frombuffer(b"".join(tags), np.uint8),
        "tag_ends": np.cumsum([len(t) for t in tags], dtype=np.int64),
        "sizes": np.asarray([e.size for e in entries], dtype=np.int64),
    }
    return cachefile.save_arrays(path, meta, arrays)


def load(path: Path, url: str, now: float, ttl: float = TTL) -> list[Entry] | None:
    """The listing of ``url`` cached at ``path`` when it is trusted (``cachefile``), whole,
    of this version and URL, and listed less than ``ttl`` seconds before ``now``; else None."""
    cached = cachefile.load_arrays(path, _ARRAYS)
    if cached is None:
        return None
    meta, a = cached
    try:
        at = float(meta["listed_at"])
        if (
            meta["version"] != CACHE_VERSION
            or meta["url"] != shown(url)
            or not (0 <= now - at < ttl)
        ):
            return None
        urls = _split(a["urls"], a["url_ends"])
        tags = _split(a["tags"], a["tag_ends"])
        sizes = [int(s) for s in a["sizes"]]
    except (KeyError, TypeError, ValueError, UnicodeDecodeError):
        return None
    top = url + "/"
    if not len(urls) == len(tags) == len(sizes) or any(not u.startswith(top) for u in urls):
        return None
    return [Entry(u, s, t) for u, s, t in zip(urls, sizes, tags, strict=True)]


def _split(blob: np.ndarray, ends: np.ndarray) -> list[str]:
    raw = blob.tobytes()
    starts = [0, *ends[:-1].tolist()] if len(ends) else []
    return [raw[a:b].decode() for a, b in zip(starts, ends.tolist(), strict=True)]


# ---------------------------------------------------------------------------- ranks


def _torch_group() -> tuple[int, int, Any] | None:
    """(rank, world size, the group's key-value store) of an initialised torch.distributed
    job of several ranks; None otherwise (torch is never imported here)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    if world < 2:
        return None
    from torch.distributed import distributed_c10d

    try:
        kv = distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None  # a group without a key-value store: each rank lists on its own
    return int(dist.get_rank()), world, kv


def agree_early() -> None:
    """Compare the listings this process took before its torch.distributed group existed (a
    Loader made before ``init_process_group``, as Lightning makes it: each rank listed on its
    own) with rank 0's, once, when the group is first seen (``loader.ranks.regroup``, or a
    listing inside the group): a prefix two ranks listed differently is a SourceError naming
    it, both counts and the fix. Rank 0 publishes its own and never waits."""
    global _compared
    group = _torch_group()
    if _compared or group is None:
        return
    _compared = True
    rank, _, kv = group
    name = "stoker/listing/before-the-group"
    if rank == 0:
        kv.set(name, json.dumps(_early).encode())
        return
    if not _early:
        return
    _wait(kv, name, next(iter(_early.values()))[0])
    theirs = json.loads(bytes(kv.get(name)))
    for key, (url, count, digest) in _early.items():
        other = theirs.get(key)
        if other is not None and other[2] != digest:
            raise SourceError(
                f"{url}: rank {rank} listed {count} objects here and rank 0 listed {other[1]}"
                f"{' (other versions)' if other[1] == count else ''}: the objects changed "
                "between the ranks' listings, which each rank made on its own because the "
                "Loader was made before init_process_group. Make the Loader after "
                "init_process_group (every rank then takes rank 0's listing), or finish "
                "the upload before the job starts"
            )


def _digest(entries: list[Entry]) -> str:
    text = "\n".join(f"{e.url}\0{e.size}\0{e.tag}" for e in entries)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _wait(kv: Any, name: str, url: str) -> None:
    """Wait for rank 0 to publish ``name`` (a listing of ``url``, or its digests)."""
    try:
        kv.wait([name], timedelta(seconds=RANK0_WAIT))
    except Exception as exc:  # noqa: BLE001 - torch's store raises its own on a timeout
        raise SourceError(
            f"{shown(url)}: rank 0 did not list this prefix within {RANK0_WAIT:.0f} s "
            f"({type(exc).__name__}). In a torch.distributed job every rank takes rank 0's "
            "listing: make this Loader on every rank, in the same order, or on rank 0 too"
        ) from None


def _from_rank0(kv: Any, name: str, world: int, url: str) -> list[Entry]:
    """Rank 0's listing published under ``name`` (the last rank to take it removes it)."""
    _wait(kv, name, url)
    raw = kv.get(name)
    if kv.add(f"{name}/taken", 1) == world - 1:
        kv.delete_key(name)
        kv.delete_key(f"{name}/taken")
    return _decode(raw, url)


def _encode(entries: list[Entry]) -> bytes:
    body = json.dumps({"entries": [list(e) for e in entries]}).encode()
    return zlib.compress(body, 1)


def _encode_error(exc: BaseException) -> bytes:
    kind = "missing" if isinstance(exc, NotInStore) else "error"
    text = str(exc) if isinstance(exc, SourceError) else f"cannot list ({one_line(exc)})"
    return zlib.compress(json.dumps({kind: text}).encode(), 1)


def _decode(raw: bytes, url: str) -> list[Entry]:
    """Rank 0's listing, or rank 0's error raised here."""
    got = json.loads(zlib.decompress(bytes(raw)))
    if "missing" in got:
        raise NotInStore(f"{got['missing']} (rank 0's listing)")
    if "error" in got:
        raise SourceError(f"{got['error']} (rank 0's listing)")
    return [Entry(str(u), int(s), str(t)) for u, s, t in got["entries"]]

"""Parquet shards on remote storage, through fsspec: ``https://``, ``s3://``, ``gs://``, any URL.

``RemoteShardSource(url)`` reads the same shards as ``ShardSource`` (``stoker convert``'s output,
or foreign Parquet), stored anywhere fsspec reaches (``pip install 'stoker[remote]'``; S3 and GCS
also need ``s3fs`` / ``gcsfs``). The shard list comes from ``stoker-manifest.json`` at the URL
root; HTTP(S) has no directory listing, so there the manifest is required. Other filesystems
fall back to listing ``*.parquet``. A URL ending in ``.parquet`` is one shard.

Each shard's byte-offset index is built once, by the same code as a local shard's
(``shardindex.locate_values``, fed one ranged read per column chunk instead of a memory map),
and cached under ``cache_dir`` (default ``~/.cache/stoker/index``)/<hash of the URL>, keyed by
the shard's size and checksum (the manifest's sha256, else the store's ETag). ``read(i)`` is
then one ranged read (``cat_file(url, start, end)``) of exactly the image's bytes.

Read-ahead is the one every local source has (``sources.readahead``): a window of upcoming
samples' ``read(i)`` calls in flight on threads, sized from the measured latency against the
decode time; a request's latency is far longer than a disk's, so this source lets the window
grow to ``read_ahead_max`` (default 64) requests per worker, still within the window's cap on
bytes held. Each request has its own deadline (``timeout``, enforced on the wait as well as in
the HTTP client), and the window's per-read deadline holds on top of that: a network failure
or a request that never answers is an ``OSError`` naming the URL (the loader counts it as a bad
sample) and never blocks the other samples. Shards whose images are compressed are read a row
group at a time through an fsspec file, as ``ShardSource`` does locally (one at a time: no
read-ahead).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DecodeError, SourceError, one_line
from .base import cache_folder
from .hfpaths import refuse_remote_path_rows
from .shardindex import (
    HEADER_ROWS,
    cache_index,
    cache_path,
    index_valid,
    layout_key,
    locate_values,
    trusted_cached,
)
from .shards import MANIFEST, ShardSource

DEFAULT_TIMEOUT = 60.0  # seconds for one request (connect + transfer)
READ_AHEAD_MAX = 64  # requests in flight per worker the auto window may grow to
_HTTP = ("http", "https")


def is_url(spec: Any) -> bool:
    """True for a string naming remote storage (``scheme://...``)."""
    return isinstance(spec, str) and "://" in spec


class RemoteShardSource(ShardSource):
    """Parquet shards behind an fsspec URL; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        image_column: str = "image",
        label_column: str | list[str] | None = None,
        cache_dir: str | os.PathLike | None = None,
        storage_options: dict[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        read_ahead_max: int = READ_AHEAD_MAX,
    ) -> None:
        if not is_url(url):
            raise SourceError(f"{url!r} is not a URL (scheme://...)")
        self.url = url.rstrip("/")
        self.protocol = self.url.split("://", 1)[0].lower()
        self.storage_options = dict(storage_options or {})
        if (
            isinstance(read_ahead_max, bool)
            or not isinstance(read_ahead_max, int)
            or (read_ahead_max < 1)
        ):
            raise SourceError(
                f"read_ahead_max={read_ahead_max!r}: give the most requests in flight per "
                f"worker, a positive int (default {READ_AHEAD_MAX})"
            )
        self.timeout, self.read_ahead_max = float(timeout), read_ahead_max
        self.access = "remote"
        self.image_column, self.label_column = image_column, label_column
        self._cache_dir = cache_folder(cache_dir, "index")
        self._reset()
        entries, manifest = self._list()
        self.files = [e[0] for e in entries]
        self._entries = entries
        self._sizes: list[int] = []
        self._scan(self.files, manifest, self.url)
        self.close()  # the main process's handles are not needed until read()

    # ------------------------------------------------------------------ setup

    @contextmanager
    def _reading(self, name: str) -> Iterator[None]:
        """A network or Parquet error reading shard ``name`` is a SourceError naming it."""
        try:
            yield
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"{name}: cannot read ({one_line(exc)})") from None

    def _open_shard(self, k: int, url: str, manifest: dict | None) -> pq.ParquetFile:
        """Shard ``k`` through fsspec, checked against the size the manifest or listing gave."""
        size = self._entries[k][1]
        pf, actual, handle = self._open_parquet(url, size)
        self._files_open.append(handle)
        if size is not None and actual != size:
            raise SourceError(
                f"{url}: {actual} bytes, the manifest says {size}; the shard "
                "changed since conversion: upload the matching manifest or convert again"
            )
        self._sizes.append(actual)
        return pf

    def _shard_index(
        self, k: int, url: str, pf: pq.ParquetFile, manifest: dict | None
    ) -> str | None:
        """Shard ``k``'s cached offset index (built if missing or stale), or None."""
        refuse_remote_path_rows(pf, url, self.image_column)
        return self._remote_index(url, pf, self._sizes[k], self._entries[k][2])

    def _list(self) -> tuple[list[tuple[str, int, str]], dict | None]:
        """(url, size, checksum or ETag) of every shard, and the manifest when there is one."""
        fs = self._filesystem()
        if self.url.lower().endswith(".parquet"):
            info = self._info(self.url)
            return [(self.url, int(info["size"]), _tag(info))], None
        where = f"{self.url}/{MANIFEST}"
        raw: bytes | None
        try:
            raw = self._get(where)
        except FileNotFoundError:
            raw = None
        except OSError as exc:
            raise SourceError(
                f"{where}: cannot read ({exc}); check the URL, the network and credentials"
            ) from None
        if raw is not None:
            try:
                manifest = json.loads(raw)
                shards = manifest["shards"]
                entries = [
                    (f"{self.url}/{s['file']}", int(s["bytes"]), str(s.get("sha256") or ""))
                    for s in shards
                ]
            except (ValueError, KeyError, TypeError) as exc:
                raise SourceError(f"{where}: not a stoker manifest ({one_line(exc)})") from None
            if not entries:
                raise SourceError(f"{where}: lists no shards")
            return entries, manifest
        if self.protocol in _HTTP:
            raise SourceError(
                f"{where}: not found. HTTP has no directory listing, so a remote folder of "
                f"shards needs the {MANIFEST} that `stoker convert` writes: upload it next to "
                "the shards (or pass the URL of one .parquet file)"
            )
        try:
            found = fs.glob(f"{self.url}/*.parquet", detail=True)
        except Exception as exc:  # noqa: BLE001 - any backend error: say which URL
            raise SourceError(f"{self.url}: cannot list ({one_line(exc)})") from None
        entries = [
            (fs.unstrip_protocol(p), int(info["size"]), _tag(info))
            for p, info in sorted(found.items())
            if not os.path.basename(p).startswith(".")
        ]
        if not entries:
            raise SourceError(f"{self.url}: no {MANIFEST} and no .parquet files")
        return entries, None

    def _info(self, url: str) -> dict:
        try:
            return self._filesystem().info(url)
        except FileNotFoundError:
            raise SourceError(f"{url}: not found") from None
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{url}: cannot read ({one_line(exc)})") from None

    def _open_parquet(self, url: str, size: int | None) -> tuple[pq.ParquetFile, int, Any]:
        """A ParquetFile reading ``url`` through fsspec, the file's size, the fsspec file."""
        fs = self._filesystem()
        kwargs: dict[str, Any] = {}
        if size is not None and self.protocol in _HTTP:
            kwargs["size"] = size  # no HEAD request needed
        try:
            f = fs.open(url, "rb", **kwargs)
        except FileNotFoundError:
            raise SourceError(
                f"{url}: listed in the manifest but not found; upload it or convert again"
            ) from None
        except Exception as exc:  # noqa: BLE001
            raise OSError(one_line(exc)) from exc
        try:
            return pq.ParquetFile(f), int(f.size), f
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise SourceError(f"{url}: not a readable Parquet file ({one_line(exc)})") from None

    def _remote_index(self, url: str, pf: pq.ParquetFile, size: int, tag: str) -> str | None:
        """Path of a valid cached offset index for ``url`` (built if missing or stale), or
        None when the image bytes are not stored verbatim."""
        key = int.from_bytes(
            hashlib.blake2b(f"{size}|{tag}".encode(), digest_size=7).digest(), "little"
        )
        column = self._value_path(pf)
        header = ((size, key), (layout_key(pf, column), pf.metadata.num_rows))
        folder, name = url.rsplit("/", 1)
        path = cache_path(self._cache_dir, folder, name)
        trusted = trusted_cached(path)
        if trusted is not None and index_valid(trusted, header):
            return str(trusted)
        offsets = locate_values(
            url, pf, column, fetch=lambda start, end: self._get(url, start, end)
        )
        if offsets is None:
            return None
        written = cache_index(path, header, offsets)
        if written is None:
            raise SourceError(
                f"{url}: cannot write its byte-offset index under {self._cache_dir} (not "
                "writable, or not a folder of yours alone: see the warning above); pass "
                "cache_dir= a folder of your own"
            )
        return str(written)

    def _make_digest(self, manifest: dict | None) -> str:
        """The same digest a local ShardSource gives for the same shards (so a resume can
        move between local and remote copies)."""
        h = hashlib.blake2b(digest_size=12)
        for k, url in enumerate(self.files):
            sha = manifest["shards"][k].get("sha256", "") if manifest else ""
            h.update(f"{url.rsplit('/', 1)[-1]}|{self._sizes[k]}|{sha}\0".encode())
        h.update(self.starts.tobytes())
        h.update(self.labels.tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------ per-process handles

    def _reset(self) -> None:
        super()._reset()
        self._fs: Any = None
        self._fs_pid = -1
        self._tables: dict[int, np.ndarray] = {}
        self._files_open: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in ("_fs", "_fs_pid", "_tables", "_files_open"):
            state.pop(key, None)
        return state

    def close(self) -> None:
        """Close this process's open remote files and drop its filesystem."""
        for f in self._files_open:
            try:
                f.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead connection
                pass
        self._reset()

    def _filesystem(self) -> Any:
        """This process's fsspec filesystem (made per process: never shared across a fork;
        shared by the process's reading threads)."""
        with self._lock:
            if self._fs is None or self._fs_pid != os.getpid():
                self._fs = self._make_filesystem()
                self._fs_pid = os.getpid()
            return self._fs

    def _make_filesystem(self) -> Any:
        try:
            import fsspec
        except ImportError:
            raise SourceError(
                f"{self.url}: reading remote shards needs fsspec: pip install 'stoker[remote]'"
            ) from None
        options = dict(self.storage_options)
        if self.protocol in _HTTP:
            import aiohttp

            client = dict(options.pop("client_kwargs", None) or {})
            client.setdefault(
                "timeout",
                aiohttp.ClientTimeout(total=self.timeout, sock_connect=min(self.timeout, 10.0)),
            )
            options["client_kwargs"] = client
        try:
            return fsspec.filesystem(self.protocol, skip_instance_cache=True, **options)
        except (ImportError, ValueError) as exc:
            raise SourceError(
                f"{self.url}: no fsspec filesystem for {self.protocol}:// ({one_line(exc)}); "
                "install its package (s3fs for s3://, gcsfs for gs://)"
            ) from None

    def _table(self, shard: int) -> np.ndarray:
        table = self._tables.get(shard)
        if table is None:
            table = np.load(self.index_files[shard], mmap_mode="r", allow_pickle=False)
            self._tables[shard] = table
        return table

    def _parquet_reader(self, shard: int) -> pq.ParquetFile:
        pf, _, handle = self._open_parquet(self.files[shard], self._sizes[shard])
        self._files_open.append(handle)
        return pf

    # ------------------------------------------------------------------ reading

    def _get(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """One (ranged) request; any failure is an OSError naming the URL. The wait has a
        deadline of its own (``timeout`` + 5 s, on fsspec's async filesystems), so no backend
        can hang the caller even where its client has no timeout."""
        fs = self._filesystem()
        deadline = self.timeout + 5.0
        wait = {"timeout": deadline} if getattr(fs, "async_impl", False) else {}
        span = f" bytes {start}-{end}" if start is not None else ""
        try:
            data = fs.cat_file(url, start=start, end=end, **wait)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{url}: not found ({exc})") from None
        except TimeoutError:  # fsspec's FSTimeoutError, aiohttp's and asyncio's
            raise OSError(f"{url}{span}: no answer within {deadline:.0f} s") from None
        except Exception as exc:  # noqa: BLE001 - network errors of any backend
            raise OSError(f"{url}{span}: {one_line(exc)}") from None
        if start is not None and end is not None and len(data) != end - start:
            raise OSError(
                f"{url} bytes {start}-{end}: got {len(data)} bytes, expected {end - start}; "
                "the server ignored the Range request or the shard changed"
            )
        return data

    def read(self, index: int) -> bytes:
        """The encoded image bytes of sample ``index``: one ranged request."""
        shard, row = self.locate(index)
        if self.modes[shard] != 0:
            try:
                return self._read_group(shard, row, index)
            except (DecodeError, OSError):
                raise
            except Exception as exc:  # noqa: BLE001
                raise OSError(f"{self.name(index)}: {one_line(exc)}") from None
        offset, length = (int(v) for v in self._table(shard)[row + HEADER_ROWS])
        if offset < 0:
            raise DecodeError(f"{self.name(index)}: no image bytes (null)")
        return self._get(self.files[shard], offset, offset + length)

    def forget(self, index: int) -> bool:
        """Nothing to drop: network reads leave no pages of the shard in the page cache."""
        return False


# ---------------------------------------------------------------------------- helpers


def _tag(info: dict) -> str:
    """A version tag of a stored object: its ETag, checksum or modification time."""
    for key in ("ETag", "etag", "md5Hash", "crc32c", "sha256", "mtime", "LastModified"):
        if info.get(key):
            return str(info[key])
    return ""

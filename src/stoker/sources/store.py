"""Object storage for every bucket source: the one place a remote byte is read.

The contract the bucket sources (``bucket.py``, ``remote.py``) and the request engine build on:

- ``open_store(url, storage_options=None, timeout=DEFAULT_TIMEOUT, listing_ttl=LISTING_TTL) ->
  Store`` for any URL with a scheme (``listing_ttl``: seconds a cached listing of its prefixes
  is trusted, ``Loader(listing_ttl=)``): ``s3://`` (s3fs), ``gs://`` (gcsfs), ``http(s)://``
  and any other fsspec protocol.
  Credentials come from each library's own chain (environment, profiles, instance metadata);
  ``storage_options`` go to the fsspec filesystem unchanged (an endpoint, ``anon=True``, keys).
- ``Store.list(url) -> list[Entry]``: every object under a prefix, recursively, sorted by URL
  (the sources list through ``listing.listed``, which caches it and shares rank 0's);
  ``Store.head(url) -> Entry``. An ``Entry`` is ``(url, size, tag)``; ``tag`` is what the store
  says changes when the object is replaced (S3's ETag, GCS's generation, HTTP's ETag). A
  listing that fails is a ``SourceError`` naming the URL and the fix (a bucket that does not
  exist, credentials refused, nothing there).
- ``Store.get(url, start=None, end=None, tag="") -> bytes``: exactly ONE request (a ranged GET
  of ``[start, end)``, or the whole object). Every remote byte stoker reads goes through it, so
  retries, pacing and counters belong here. With a ``tag``, the object must still be that
  version (S3: ``If-Match`` and the reply's ETag; GCS: the reply's generation; HTTP:
  ``If-Match``); otherwise ``ObjectChanged`` (not a bad sample: a silent mix of old and new bytes
  is never served). A missing object is ``FileNotFoundError``, any other failure an
  ``OSError``; each names the URL. ``ObjectChanged`` and ``FileNotFoundError`` also remove the
  cached listings the store's sources were made from (``listed_from``; see ``listing.py``).
- ``Store.put(local, url)`` uploads one file (``stoker convert`` into a bucket).
- A ``Store`` pickles without its client (each process makes its own, never shared across a
  fork). No credential appears in what it shows: ``shown(url)`` drops a URL's user info and
  query string, and no message, ``repr`` or cache key holds a credential (a listing's key holds
  only ``scope()``).
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from ..errors import ObjectChanged, SourceError, one_line
from . import fetch, obstores

DEFAULT_TIMEOUT = 60.0  # seconds for one request (connect + transfer)
_HTTP = ("http", "https")
#: Storage options (also inside ``client_kwargs``) that change which objects a listing shows,
#: and never hold a credential: they, the URL and the endpoint key a cached listing.
SCOPE_OPTIONS = frozenset(
    {"region_name", "region", "requester_pays", "version_aware", "anon", "project", "use_ssl"}
)


class Entry(NamedTuple):
    """One stored object: its URL, size in bytes and version tag ("" when the store has none)."""

    url: str
    size: int
    tag: str


class NotInStore(SourceError):
    """No object (or prefix) at the URL named; the bucket itself exists."""


class StorageOptions(dict):  # type: ignore[type-arg]
    """The user's ``storage_options``: a plain dict whose ``repr`` names the keys only, so a
    printed option group, Recipe or traceback shows no credential."""

    def __repr__(self) -> str:
        return f"StorageOptions(<{', '.join(sorted(map(str, self)))}>)"


def remove_files(paths: list[str]) -> None:
    """Remove cache files (best effort): one already gone, or not on this machine (a cluster
    node's copy of a source names the trainer's files), is no error."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def is_url(spec: Any) -> bool:
    """True for a string naming remote storage (``scheme://...``)."""
    return isinstance(spec, str) and "://" in spec


def shown(url: str) -> str:
    """``url`` as it may appear in a message, a log, ``stats()`` or a cache key: without user
    info (``user:secret@``) and without its query string (a signed URL's signature)."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://<unparsable URL>"
    host = parts.netloc.rpartition("@")[2]
    query = "<query hidden>" if parts.query else ""
    return urlunsplit((parts.scheme, host, parts.path, query, ""))


#: Seconds a cached bucket listing is trusted by default (``Loader(listing_ttl=)``).
LISTING_TTL = 600.0


def open_store(
    url: str,
    storage_options: dict[str, Any] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    listing_ttl: float = LISTING_TTL,
) -> Store:
    """The store holding ``url``, chosen by its scheme (see the module docstring)."""
    if not is_url(url):
        raise SourceError(f"{url!r} is not a URL (scheme://...)")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise SourceError(
            f"storage_options must be a dict of the filesystem's options, got "
            f"{type(storage_options).__name__}"
        )
    protocol = url.split("://", 1)[0].lower()
    kind = {"s3": S3Store, "s3a": S3Store, "gs": GCSStore, "gcs": GCSStore}.get(protocol)
    if kind is None:
        kind = HTTPStore if protocol in _HTTP else Store
    store = kind(protocol, StorageOptions(storage_options or {}), float(timeout))
    store.listing_ttl = float(listing_ttl)
    return store


def directly_under(listing: list[Entry], url: str, suffix: str) -> list[Entry]:
    """The objects of a listing directly under the prefix ``url`` whose names end in
    ``suffix`` (any case) and do not start with a dot: what a local folder's files would be."""
    top = url.rstrip("/") + "/"
    return [
        e
        for e in listing
        if e.url.startswith(top)
        and "/" not in e.url[len(top) :]
        and e.url.lower().endswith(suffix)
        and not e.url[len(top) :].startswith(".")
    ]


class Store:
    """Objects behind one fsspec protocol; see the module docstring."""

    def __init__(self, protocol: str, storage_options: dict[str, Any], timeout: float) -> None:
        self.protocol = protocol
        self.timeout = timeout
        self._options = storage_options
        self._reset()

        self._listings: list[str] = []  # cached listings this store's sources came from
        #: Seconds a cached listing of this store's prefixes is used for (``listing.py``).
        self.listing_ttl = LISTING_TTL

    def _reset(self) -> None:
        self._fs: Any = None
        self._fs_pid = -1
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "timeout": self.timeout,
            "_options": self._options,
            "_listings": self._listings,
            "listing_ttl": self.listing_ttl,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.protocol}://)"

    def scope(self) -> list[str]:
        """What besides a URL decides which objects its listing shows, as a listing cache's key
        may hold it: the protocol, the endpoint (without user info) and the options in
        ``SCOPE_OPTIONS``; never a credential."""
        options = self._options
        client = options.get("client_kwargs")
        client = client if isinstance(client, dict) else {}
        endpoint = options.get("endpoint_url") or client.get("endpoint_url") or self._endpoint()
        picked = [f"{k}={options[k]!r}" for k in sorted(SCOPE_OPTIONS) if k in options]
        picked += [f"client.{k}={client[k]!r}" for k in sorted(SCOPE_OPTIONS) if k in client]
        return [self.protocol, shown(str(endpoint or "")), *picked]

    def _endpoint(self) -> str:
        """The endpoint this store's client finds by itself (its environment), or ""."""
        return ""

    def listed_from(self, path: os.PathLike[str] | str) -> None:
        """Note a cached listing this store's sources are made from: one of its objects found
        replaced (``ObjectChanged``) removes it, so the next Loader lists again."""
        if os.fspath(path) not in self._listings:
            self._listings.append(os.fspath(path))

    def _forget_listings(self) -> None:
        remove_files(self._listings)

    def same_as(self, other: Store) -> bool:
        """Whether ``other`` reaches the same store with the same options."""
        return (self.protocol, self._options) == (other.protocol, other._options)

    # ------------------------------------------------------------------ the client

    def filesystem(self) -> Any:
        """This process's fsspec filesystem (made per process; shared by its threads)."""
        with self._lock:
            if self._fs is None or self._fs_pid != os.getpid():
                self._fs = self._make_filesystem()
                self._fs_pid = os.getpid()
            return self._fs

    def _client_options(self) -> dict[str, Any]:
        """The filesystem's options: the user's, plus this store's request deadline where the
        user set none."""
        return dict(self._options)

    def _make_filesystem(self) -> Any:
        try:
            import fsspec
        except ImportError:
            raise SourceError(
                f"{self.protocol}:// needs fsspec: pip install 'stoker[remote]'"
            ) from None
        try:
            return fsspec.filesystem(
                self.protocol, skip_instance_cache=True, **self._client_options()
            )
        except (ImportError, ValueError, TypeError) as exc:
            raise SourceError(
                f"{self.protocol}://: no fsspec filesystem ({one_line(exc)}); install its package "
                "(pip install 'stoker[s3]' for s3://, 'stoker[gcs]' for gs://) and check "
                "storage_options"
            ) from None

    def close(self) -> None:
        """Drop this process's client (made again on the next request)."""
        self._reset()

    # ------------------------------------------------------------------ listing

    def list(self, url: str, recursive: bool = True) -> list[Entry]:
        """Every object under the prefix ``url`` (recursively, or only those directly under
        it), sorted by URL; names starting with a dot are kept (the caller's rules decide)."""
        fs = self.filesystem()
        prefix = url.rstrip("/")
        try:
            if recursive:
                found = fs.find(prefix, detail=True)
            else:
                found = {i["name"]: i for i in fs.ls(prefix, detail=True)}
        except Exception as exc:  # noqa: BLE001 - any backend's error: named, with the fix
            raise self.problem(exc, prefix, "list") from None
        entries = [
            Entry(fs.unstrip_protocol(path), int(info.get("size") or 0), self.tag(info))
            for path, info in found.items()
            if info.get("type", "file") != "directory" and not path.endswith("/")
        ]
        if not entries:
            self.check_root(prefix)
        return sorted(entries)

    def check_root(self, url: str) -> None:
        """Called when ``url`` lists nothing: raise the reason when there is one to give (the
        bucket does not exist); an empty prefix is the caller's to report."""

    def head(self, url: str) -> Entry:
        """The object at ``url``: ``SourceError`` naming it when it is missing or unreadable."""
        fs = self.filesystem()
        try:
            info = fs.info(url)
        except Exception as exc:  # noqa: BLE001
            raise self.problem(exc, url, "read") from None
        return Entry(url, int(info.get("size") or 0), self.tag(info))

    def tag(self, info: dict[str, Any]) -> str:
        """An object's version tag from its listing or ``info``."""
        for key in ("ETag", "etag", "generation", "md5Hash", "crc32c", "sha256", "mtime"):
            if info.get(key):
                return str(info[key])
        return ""

    def problem(self, exc: BaseException, url: str, what: str) -> SourceError:
        """A SourceError for a failed listing or lookup of ``url``, naming it and the fix."""
        where = shown(url)
        code = error_code(exc)
        if isinstance(exc, PermissionError) or code in DENIED:
            return SourceError(
                f"{where}: cannot {what}: access denied ({code or one_line(exc)}); check the "
                "credentials (the environment, the profile, or storage_options=) and the "
                "bucket's permissions"
            )
        if code == "NoSuchBucket":
            bucket = where.split("://", 1)[-1].split("/", 1)[0]
            return SourceError(
                f"{where}: the bucket {bucket!r} does not exist (or this endpoint does not have "
                "it); check the bucket name, the region and the endpoint (AWS_ENDPOINT_URL, or "
                "storage_options={'endpoint_url': ...})"
            )
        if isinstance(exc, FileNotFoundError) or code in MISSING:
            return NotInStore(f"{where}: not found; check the bucket and the path")
        return SourceError(
            f"{where}: cannot {what} ({one_line(exc)}); check the URL, the network, the endpoint "
            "and the credentials"
        )

    # ------------------------------------------------------------------ reading

    def get(
        self, url: str, start: int | None = None, end: int | None = None, tag: str = ""
    ) -> bytes:
        """One request: bytes ``[start, end)`` of ``url`` (the whole object without them), of
        version ``tag`` when one is given; see the module docstring for the errors."""
        span = f" bytes {start}-{end}" if start is not None else ""
        if start is not None and end is not None and end <= start:
            return b""
        size = end - start if start is not None and end is not None else None
        try:  # paced, retried and counted: sources.fetch
            data = fetch.request(
                url, lambda: self._fetch(url, start, end, tag), size, deadline=self.timeout
            )
        except ObjectChanged:
            self._forget_listings()
            raise
        except FileNotFoundError:
            self._forget_listings()  # listed, and gone since: the listing is stale
            raise FileNotFoundError(f"{shown(url)}: not found") from None
        except TimeoutError:  # fsspec's FSTimeoutError, aiohttp's and asyncio's
            raise OSError(
                f"{shown(url)}{span}: no answer within {self._deadline():.0f} s"
            ) from None
        except Exception as exc:  # noqa: BLE001 - network errors of any backend
            code = error_code(exc)
            if code in MISSING or getattr(exc, "status", 0) == 404:
                self._forget_listings()
                raise FileNotFoundError(f"{shown(url)}: not found") from None
            if code in ("PreconditionFailed", "412") or getattr(exc, "status", 0) == 412:
                self._forget_listings()
                raise changed(url) from None
            raise OSError(f"{shown(url)}{span}: {one_line(exc)}") from None
        if start is not None and end is not None and len(data) != end - start:
            raise OSError(
                f"{shown(url)}{span}: got {len(data)} bytes, expected {end - start}; the server "
                "ignored the Range request, or the object is shorter than listed"
            )
        return data

    def put(self, local: str | os.PathLike[str], url: str) -> None:
        """Upload the file ``local`` to ``url`` (one object, replaced if there); a failure is a
        SourceError naming the URL and the fix."""
        try:
            self.filesystem().put_file(os.fspath(local), url)
        except Exception as exc:  # noqa: BLE001 - any backend's error: named, with the fix
            raise self.problem(exc, url, "write") from None

    def _deadline(self) -> float:
        """How long one request may take in all: the client's timeout and a margin, so no
        backend can hang the caller even where its client has none."""
        return self.timeout + 5.0

    def _fetch(self, url: str, start: int | None, end: int | None, tag: str) -> bytes:
        """The request itself; this default cannot check a version tag."""
        fs = self.filesystem()
        wait = {"timeout": self._deadline()} if getattr(fs, "async_impl", False) else {}
        return fs.cat_file(url, start=start, end=end, **wait)


class S3Store(Store):
    """``s3://`` through obstore where it is installed and the options fit it
    (`obstores.s3_config`), else through s3fs; a tagged read is a GET with ``If-Match`` on the
    listed ETag."""

    def _endpoint(self) -> str:
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""

    def _reset(self) -> None:
        super()._reset()
        self._client: obstores.S3Client | None = None
        self._client_pid = -1
        self._client_lock = threading.Lock()

    def obstore(self) -> obstores.S3Client | None:
        """This process's obstore client, or None where s3fs serves this store."""
        with self._client_lock:
            if self._client_pid != os.getpid():
                config = obstores.s3_config(self._options)
                self._client = None if config is None else obstores.S3Client(config, self.timeout)
                self._client_pid = os.getpid()
            return self._client

    @property
    def backend(self) -> str:
        """The client that serves this store here: ``"obstore"`` or ``"s3fs"``."""
        return "s3fs" if self.obstore() is None else "obstore"

    def list(self, url: str, recursive: bool = True) -> list[Entry]:
        client = self.obstore()
        if client is None:
            return super().list(url, recursive)
        try:  # a bucket that does not exist is refused here: no check_root needed
            found = client.list(url.rstrip("/"), recursive)
        except Exception as exc:  # noqa: BLE001
            raise self.problem(exc, url.rstrip("/"), "list") from None
        return sorted(Entry(*one) for one in found if not one[0].endswith("/"))

    def head(self, url: str) -> Entry:
        client = self.obstore()
        if client is None:
            return super().head(url)
        try:
            size, tag = client.head(url)
        except Exception as exc:  # noqa: BLE001
            raise self.problem(exc, url, "read") from None
        return Entry(url, size, tag)

    def _client_options(self) -> dict[str, Any]:
        options = dict(self._options)
        config = dict(options.pop("config_kwargs", None) or {})
        config.setdefault("connect_timeout", min(self.timeout, 10.0))
        config.setdefault("read_timeout", self.timeout)
        config.setdefault("retries", {"total_max_attempts": 1})  # stoker's own: sources.fetch
        options["config_kwargs"] = config
        return options

    def check_root(self, url: str) -> None:
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        fs = self.filesystem()
        try:
            import fsspec.asyn

            fsspec.asyn.sync(
                fs.loop, fs._call_s3, "head_bucket", Bucket=bucket, timeout=self._deadline()
            )
        except Exception as exc:  # noqa: BLE001
            code = error_code(exc)
            if isinstance(exc, FileNotFoundError) or code in MISSING or code == "404":
                raise SourceError(
                    f"s3://{bucket}: the bucket does not exist (or this endpoint does not have "
                    "it); check the bucket name, the region and the endpoint (AWS_ENDPOINT_URL or "
                    "storage_options={'endpoint_url': ...})"
                ) from None
            raise self.problem(exc, f"s3://{bucket}", "list") from None

    def _fetch(self, url: str, start: int | None, end: int | None, tag: str) -> bytes:
        import fsspec.asyn

        client = self.obstore()
        if client is not None:
            try:
                return client.get(url, start, end, tag)
            except obstores.Changed:
                raise changed(url) from None
        fs = self.filesystem()
        bucket, key, _ = fs.split_path(url)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if start is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if tag:
            kwargs["IfMatch"] = tag

        async def call() -> bytes:
            # the client's own GetObject, not fs._call_s3: s3fs's retry loop there would hide
            # throttling from sources.fetch, which retries, paces and counts every request
            await fs.set_session()
            method = (await fs.get_s3(bucket)).get_object
            reply = await method(**fs._get_s3_method_kwargs(method, **kwargs))
            try:
                if tag and reply.get("ETag") and reply["ETag"] != tag:
                    raise changed(url)
                return bytes(await reply["Body"].read())
            finally:
                reply["Body"].close()

        return fsspec.asyn.sync(fs.loop, call, timeout=self._deadline())


class GCSStore(Store):
    """``gs://`` through gcsfs; a tagged read asks for that generation (``ifGenerationMatch``)
    and checks the reply's."""

    def _make_filesystem(self) -> Any:
        """gcsfs's filesystem; with an ``endpoint_url`` (an emulator, a proxy: not Google),
        its plain one, which does not probe the endpoint over gRPC for a zonal bucket (the probe
        waits a minute on an endpoint that does not speak it)."""
        if not self._options.get("endpoint_url"):
            return super()._make_filesystem()
        try:
            from gcsfs.core import GCSFileSystem
        except ImportError:
            raise SourceError("gs:// needs gcsfs: pip install 'stoker[gcs]'") from None
        return GCSFileSystem(skip_instance_cache=True, **self._client_options())

    def _endpoint(self) -> str:
        return os.environ.get("STORAGE_EMULATOR_HOST") or ""

    def tag(self, info: dict[str, Any]) -> str:
        generation = info.get("generation")
        return str(generation) if generation else super().tag(info)

    def _fetch(self, url: str, start: int | None, end: int | None, tag: str) -> bytes:
        import fsspec.asyn

        fs = self.filesystem()
        headers: dict[str, str] = {}
        if start is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"

        # gcsfs's _request retries by itself (6 tries, its own backoff), hidden from
        # sources.fetch: its undecorated body makes one request, which fetch retries and counts
        once = getattr(type(fs)._request, "__wrapped__", None)

        async def call() -> bytes:
            condition = {"ifGenerationMatch": tag} if tag.isdigit() else {}
            if once is None:
                reply, data = await fs._call("GET", fs.url(url), headers=headers, **condition)
            else:
                _, reply, _, data = await once(fs, "GET", fs.url(url), headers=headers, **condition)
            got = reply.get("x-goog-generation") or reply.get("X-Goog-Generation")
            if tag and got and str(got) != tag:
                raise changed(url)
            return bytes(data)

        return fsspec.asyn.sync(fs.loop, call, timeout=self._deadline())


class HTTPStore(Store):
    """``http(s)://`` through fsspec's HTTP filesystem (aiohttp); no listing (``list`` raises:
    the caller reads a manifest instead); a tagged read sends ``If-Match``."""

    def _client_options(self) -> dict[str, Any]:
        import aiohttp

        options = dict(self._options)
        client = dict(options.pop("client_kwargs", None) or {})
        client.setdefault(
            "timeout",
            aiohttp.ClientTimeout(total=self.timeout, sock_connect=min(self.timeout, 10.0)),
        )
        options["client_kwargs"] = client
        return options

    def list(self, url: str, recursive: bool = True) -> list[Entry]:
        raise SourceError(
            f"{shown(url)}: HTTP has no directory listing; list the files in a CSV (paths "
            "relative to it), pass paths=[...] of URLs, or convert to shards (their "
            "stoker-manifest.json lists them)"
        )

    def _fetch(self, url: str, start: int | None, end: int | None, tag: str) -> bytes:
        fs = self.filesystem()
        extra: dict[str, Any] = {"timeout": self._deadline()}
        if tag:
            extra["headers"] = {"If-Match": tag}
        return fs.cat_file(url, start=start, end=end, **extra)


class ObjectFile(io.RawIOBase):
    """A read-only, seekable file over one object of known size and version: a read the
    buffer does not cover is one ``store.get`` of at least ``block`` bytes from where it
    starts (a Parquet footer, a tar's headers), so every byte still comes through ``get``."""

    def __init__(self, store: Store, entry: Entry, block: int = 64 << 10) -> None:
        super().__init__()
        self.store, self.entry, self.block = store, entry, block
        self.size = entry.size
        self._pos = 0
        self._buf, self._at = b"", 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, out: Any) -> int:
        view = memoryview(out).cast("B")
        want = min(len(view), self.size - self._pos)
        if want <= 0:
            return 0
        buf, offset = self._covering(want)
        view[:want] = buf[offset : offset + want]
        self._pos += want
        return want

    def _covering(self, want: int) -> tuple[bytes, int]:
        """A buffer holding the ``want`` bytes from the position, and where they start in it:
        the last one read, else a new ``store.get`` of at least ``block`` bytes."""
        offset = self._pos - self._at
        if not (0 <= offset and offset + want <= len(self._buf)):
            end = min(self.size, self._pos + max(want, self.block))
            self._buf = self.store.get(self.entry.url, self._pos, end, self.entry.tag)
            self._at, offset = self._pos, 0
        return self._buf, offset


# ---------------------------------------------------------------------------- errors

#: Storage error codes that mean "no such object or bucket" and "credentials refused".
MISSING = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
DENIED = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "403",
        "401",
    }
)


def error_code(exc: BaseException) -> str:
    """The storage service's error code behind ``exc`` (botocore's ``Error.Code``, an HTTP
    status), searched through its causes; "" when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
        status = getattr(current, "status", None) or getattr(current, "code", None)
        if isinstance(status, int) and status >= 400:
            return str(status)
        current = current.__cause__ or current.__context__
    return ""


def changed(url: str) -> ObjectChanged:
    """The error for an object replaced since it was listed."""
    return ObjectChanged(
        f"{shown(url)}: the object was replaced after the dataset was listed (its ETag or "
        "generation changed); its new bytes are not mixed with the old listing. Restart the "
        "loader to list the bucket again, or keep a dataset's objects unchanged while it is read"
    )

"""``s3://`` through obstore (the Rust ``object_store`` crate), the S3 client of `store.S3Store`
wherever obstore is installed and the options fit it; s3fs serves every other case.

Why obstore: on one latency-shaped S3 endpoint it reads the same objects for a fraction of
s3fs's or boto3's CPU per image (its requests run on Rust threads, outside the GIL); see
``benchmarks/README.md#s3-clients``.

`s3_config(storage_options)` says whether obstore can honour a store's options, and how:

- the fsspec options it understands are ``endpoint_url``, ``key``, ``secret``, ``token``,
  ``anon`` and ``client_kwargs={"endpoint_url", "region_name"}``; any other option (s3fs's
  ``config_kwargs``, ``requester_pays``, ``profile``, ...) means s3fs, which knows it;
- credentials otherwise come from obstore's own chain: the environment (``AWS_ACCESS_KEY_ID``,
  ``AWS_ENDPOINT_URL``, ...), web identity, container and instance metadata. It reads no AWS
  profile, so an ``AWS_PROFILE``, or a shared credentials/config file with no key in the
  environment, means s3fs (botocore reads profiles);
- an ``http://`` endpoint (a local test server) is allowed, as s3fs allows it.

Retries are stoker's own (counted and paced by the request engine): obstore retries nothing.
A failure keeps the store's error code and HTTP status where stoker's error handling looks for
them (``exc.response``, as botocore's errors carry them), so both clients' errors read alike.
"""

from __future__ import annotations

import os
import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

#: The fsspec storage options obstore honours (`s3_config`); any other means s3fs.
KNOWN = frozenset({"endpoint_url", "key", "secret", "token", "anon", "client_kwargs"})
_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name"})
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]{0,200})</Message>")
_STATUS = re.compile(r"status code: (\d{3})")
_TRANSPORT = (
    "error sending request",
    "connection",
    "reset",
    "broken pipe",
    "timed out",
    "timeout",
    "response body",
    "incomplete",
    "end of file",
    "eof",
)


def available() -> bool:
    """Whether obstore can be imported here."""
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def s3_config(
    storage_options: dict[str, Any], environ: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """obstore's S3 configuration for fsspec-style ``storage_options``, or None when obstore
    cannot honour them (see the module docstring) or is not installed."""
    env = os.environ if environ is None else environ
    if set(storage_options) - KNOWN or not available():
        return None
    client = storage_options.get("client_kwargs") or {}
    if not isinstance(client, dict) or set(client) - _CLIENT_KWARGS:
        return None
    config: dict[str, Any] = {}
    endpoint = storage_options.get("endpoint_url") or client.get("endpoint_url")
    if endpoint:
        config["endpoint"] = str(endpoint)
    if client.get("region_name"):
        config["region"] = str(client["region_name"])
    for ours, theirs in (("key", "access_key_id"), ("secret", "secret_access_key")):
        if storage_options.get(ours):
            config[theirs] = str(storage_options[ours])
    if storage_options.get("token"):
        config["session_token"] = str(storage_options["token"])
    if storage_options.get("anon"):
        config["skip_signature"] = True
    elif "access_key_id" not in config and _profile_only(env):
        return None
    return config


def _profile_only(env: Any) -> bool:
    """Whether credentials would come from an AWS profile, which obstore does not read."""
    if env.get("AWS_PROFILE"):
        return True
    if env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return False
    home = Path(env.get("HOME") or Path.home())
    files = [env.get("AWS_SHARED_CREDENTIALS_FILE"), env.get("AWS_CONFIG_FILE")]
    files += [str(home / ".aws" / "credentials"), str(home / ".aws" / "config")]
    return any(f and os.path.isfile(f) for f in files)


class StoreError(OSError):
    """A failed obstore request, with the store's error code and status in ``response``
    (botocore's shape), the original error as its cause."""

    def __init__(self, message: str, code: str, status: int | None) -> None:
        super().__init__(message)
        self.response = {
            "Error": {"Code": code or (str(status) if status else "")},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }


class Disconnected(StoreError, ConnectionError):
    """A request that got no HTTP answer: the connection failed, was reset or closed early,
    or the body stopped short (retried by stoker's request engine, as a reset is)."""


class Changed(Exception):  # noqa: N818 (a verdict, not an error: the caller raises its own)
    """The object's ETag is no longer the one asked for (``If-Match`` refused)."""


class S3Client:
    """obstore's S3 stores for one configuration, one per bucket, made on first use; a
    timeout for every request, no retries of obstore's own."""

    def __init__(self, config: dict[str, Any], timeout: float) -> None:
        self.config, self.timeout = config, timeout
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _store(self, bucket: str) -> Any:
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                store = self._stores[bucket] = self._make(bucket)
            return store

    def _make(self, bucket: str) -> Any:
        from obstore.store import S3Store

        endpoint = str(
            self.config.get("endpoint")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or ""
        )
        client: Any = {  # obstore's ClientConfig (a TypedDict it does not export at run time)
            "timeout": timedelta(seconds=self.timeout),
            "connect_timeout": timedelta(seconds=min(self.timeout, 10.0)),
            "allow_http": endpoint.startswith("http://"),
        }
        retry: Any = {"max_retries": 0, "retry_timeout": timedelta(seconds=self.timeout)}
        config: Any = {"endpoint": endpoint} if endpoint else {}
        config.update(self.config)
        return S3Store(bucket, config=config, client_options=client, retry_config=retry)

    def list(self, url: str, recursive: bool = True) -> list[tuple[str, int, str]]:
        """``(url, size, etag)`` of every object under the prefix ``url``, recursively, or only
        those directly under it."""
        import obstore

        bucket, prefix = split(url)
        store = self._store(bucket)
        try:
            if recursive:
                metas = [
                    m
                    for chunk in obstore.list(store, prefix or None, chunk_size=1000)
                    for m in chunk
                ]
            else:
                metas = list(obstore.list_with_delimiter(store, prefix or None)["objects"])
            return [
                (f"s3://{bucket}/{meta['path']}", int(meta["size"]), str(meta.get("e_tag") or ""))
                for meta in metas
            ]
        except Exception as exc:  # noqa: BLE001 - obstore's errors, translated
            raise translate(exc) from exc

    def head(self, url: str) -> tuple[int, str]:
        """``(size, etag)`` of the object at ``url``."""
        import obstore

        bucket, key = split(url)
        try:
            meta = obstore.head(self._store(bucket), key)
        except Exception as exc:  # noqa: BLE001
            raise translate(exc) from exc
        return int(meta["size"]), str(meta.get("e_tag") or "")

    def get(self, url: str, start: int | None, end: int | None, tag: str) -> bytes:
        """One GET of ``[start, end)`` (the whole object without them), ``If-Match: tag`` when
        given; `Changed` when the store refuses the tag."""
        import obstore
        from obstore.exceptions import PreconditionError

        bucket, key = split(url)
        options: Any = {}  # obstore's GetOptions
        if start is not None:
            options["range"] = (start, end) if end is not None else {"offset": start}
        if tag:
            options["if_match"] = tag
        try:
            return bytes(obstore.get(self._store(bucket), key, options=options).bytes())
        except PreconditionError:
            raise Changed(url) from None
        except Exception as exc:  # noqa: BLE001
            raise translate(exc) from exc


def split(url: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``."""
    bucket, _, key = url.split("://", 1)[-1].partition("/")
    return bucket, key.strip("/")


def translate(exc: BaseException) -> BaseException:
    """obstore's error as one stoker's error handling reads: ``FileNotFoundError`` and
    ``PermissionError`` kept, a failure with no HTTP answer `Disconnected`, anything else a
    `StoreError` carrying the code and status found in its message."""
    if isinstance(exc, (FileNotFoundError, PermissionError)):
        return exc
    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    text = str(exc)
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)):
        return PermissionError(text.splitlines()[0] if text else type(exc).__name__)
    status = _STATUS.search(text)
    first = text.splitlines()[0] if text else type(exc).__name__
    if status is None:
        lowered = text.lower()
        if any(word in lowered for word in _TRANSPORT):
            return Disconnected(first, "", None)
        return StoreError(first, "", None)
    code = _CODE.search(text)
    said = _MESSAGE.search(text)
    name = code.group(1) if code else ""
    words = f"{name}: {said.group(1)}" if name and said else name or first
    return StoreError(f"HTTP {status.group(1)} {words}", name, int(status.group(1)))

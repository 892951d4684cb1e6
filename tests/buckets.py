"""A real S3 API for the tests: moto's ``ThreadedMotoServer`` on a free loopback port.

``S3Server`` starts one in this process and gives the environment a client needs to reach it
(``AWS_ENDPOINT_URL`` and dummy credentials, so boto3, s3fs and obstore all find it through
their standard chain). ``bucket(name)`` makes an empty bucket; ``upload(local, url)`` copies a
file or a folder into one, keys relative to the folder, the local file's bytes unchanged.

The fixtures in ``conftest.py`` (``s3_server``, ``s3_env``, ``s3_bucket``) wrap it: one server
for the session, a fresh bucket for each test, the environment set only inside the test.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

from helpers import free_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    """One moto S3 server on 127.0.0.1; ``start()``/``stop()``, or use it as a context manager."""

    def __init__(self, port: int | None = None) -> None:
        from moto.server import ThreadedMotoServer

        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    def start(self) -> S3Server:
        """Serve until ``stop()``."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving (the buckets are gone with it)."""
        self._server.stop()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The variables that point boto3, s3fs and obstore at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            **CREDENTIALS,
        }

    def client(self, endpoint: str | None = None, config: Any = None) -> Any:
        """A boto3 S3 client for this server (for the tests' own setup and checks), or for
        ``endpoint`` in front of it (a proxy), with a botocore ``Config`` when given."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            config=config,
        )

    def bucket(self, name: str | None = None) -> str:
        """Create an empty bucket and return its name (a fresh unique one by default)."""
        name = name or f"bkt-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload(self, local: str | os.PathLike[str], url: str) -> list[str]:
        """Copy a file, or every file under a folder, to ``s3://bucket/prefix``; the keys written.

        A folder's files keep their paths relative to it below ``prefix``; bytes are unchanged.
        """
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        root = pathlib.Path(local)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        client, keys = self.client(), []
        for path in files:
            rel = path.name if root.is_file() else path.relative_to(root).as_posix()
            key = f"{prefix.rstrip('/')}/{rel}" if prefix else rel
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.append(key)
        return keys


@contextlib.contextmanager
def proxied_upload(
    server: S3Server, local: pathlib.Path, monkeypatch: Any, home: pathlib.Path
) -> Iterator[tuple[Any, str]]:
    """``local`` uploaded to a fresh bucket as ``shards/``, a fault proxy in front of
    ``server`` and the environment pointing at it, caches in the test's own ``HOME``: yields
    ``(proxy, URL of the upload)``."""
    from faultproxy import FaultProxy

    bucket = server.bucket()
    server.upload(local, f"s3://{bucket}/shards")
    monkeypatch.setenv("HOME", str(home))
    with FaultProxy(server.endpoint) as proxy:
        for name, value in proxy.env().items():
            monkeypatch.setenv(name, value)
        yield proxy, f"s3://{bucket}/shards"

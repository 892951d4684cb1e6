"""A small, fast S3-compatible endpoint over a local folder, for the bucket benchmarks.

moto's server (the tests' S3 API) copies a whole object for every ranged GET, so it, not the
loader, sets the rate of any benchmark that reads through it. This server answers from the
files themselves: a ranged GET is a ``sendfile`` of those bytes, nothing else is read.

Each first-level folder of ``root`` is a bucket; a file below it is an object whose key is its
path relative to the bucket folder. Path-style addressing only (``http://host:port/bucket/key``),
which boto3, s3fs and obstore use for an ``AWS_ENDPOINT_URL`` on 127.0.0.1. Requests are not
authenticated (any credentials pass). It answers:

- ``GET``/``HEAD`` of an object, with ``Range: bytes=a-b`` / ``a-`` / ``-n`` (206 and
  ``Content-Range``; 416 past the end), ``ETag`` (from size, mtime and inode), ``Last-Modified``;
- ``GET /bucket?list-type=2`` (ListObjectsV2: ``prefix``, ``delimiter``, ``max-keys``,
  ``continuation-token``, ``start-after``, ``encoding-type=url``), ``HEAD /bucket``,
  ``GET /bucket?location``, ``GET /`` (ListBuckets);
- ``PUT /bucket`` (a new bucket) and ``PUT /bucket/key`` (PutObject: a plain, ``chunked`` or
  ``aws-chunked`` body, written to a temporary file and renamed into place);
- anything else: 501 with an S3 error body naming the operation;
- ``GET /?counters``: the requests served by kind and the body bytes sent, as JSON (for the
  benchmarks' GETs-per-image and bytes-per-image figures; not an S3 operation).

``--latency S`` holds every answer's first byte for ``S`` seconds and ``--bandwidth B`` caps
each connection at ``B`` bytes/s (the shape of a remote store; 0: none).

    python benchmarks/s3local.py ROOT --port 9000 [--latency 0.05] [--bandwidth 50e6]
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import hashlib
import http.server
import json
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any
from xml.sax.saxutils import escape

XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
CHUNK = 256 * 1024  # bytes per sendfile call under a bandwidth cap


class Counters:
    """Requests and body bytes served, for the benchmarks' GETs-per-image figures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.bytes_out = 0

    def count(self, op: str, nbytes: int = 0) -> None:
        with self.lock:
            self.requests[op] = self.requests.get(op, 0) + 1
            self.bytes_out += nbytes

    def snapshot(self) -> dict[str, object]:
        with self.lock:
            return {"requests": dict(self.requests), "bytes_out": self.bytes_out}


class Handler(http.server.BaseHTTPRequestHandler):
    """One connection's requests (HTTP/1.1 keep-alive) against ``server.root``."""

    protocol_version = "HTTP/1.1"
    server: S3Local

    def log_message(self, *args: object) -> None:
        pass

    # ------------------------------------------------------------------ routing

    def _route(self) -> tuple[str, str, dict[str, str]]:
        parsed = urllib.parse.urlsplit(self.path)
        bucket, _, key = urllib.parse.unquote(parsed.path).lstrip("/").partition("/")
        query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        return bucket, key, query

    def _file(self, bucket: str, key: str) -> str | None:
        """The file of ``bucket/key``, or None for a name that would leave the bucket."""
        parts = key.split("/")
        if not bucket or bucket.startswith(".") or any(p in ("", ".", "..") for p in parts):
            return None
        return os.path.join(self.server.root, bucket, *parts)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        bucket, key, query = self._route()
        if not bucket:
            if "counters" in query:  # the benchmarks' request counts, not an S3 operation
                return self._counters()
            return self._list_buckets()
        if not key:
            if "location" in query:
                return self._xml(200, f'<LocationConstraint xmlns="{XMLNS}"/>', "location")
            if query.get("list-type") == "2":
                return self._list(bucket, query)
            return self._error(501, "NotImplemented", "only ListObjectsV2 (list-type=2)")
        self._object(bucket, key, body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        bucket, key, _ = self._route()
        if key:
            return self._object(bucket, key, body=False)
        found = bool(bucket) and os.path.isdir(os.path.join(self.server.root, bucket))
        self._wait_first_byte()
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.counters.count("HEAD")

    def do_PUT(self) -> None:  # noqa: N802
        bucket, key, query = self._route()
        body = self._read_body()
        if query:
            return self._error(501, "NotImplemented", f"PUT with ?{'&'.join(query)}")
        if not key:
            os.makedirs(os.path.join(self.server.root, bucket), exist_ok=True)
            return self._empty(200, "PUT bucket")
        path = self._file(bucket, key)
        if path is None or not os.path.isdir(os.path.join(self.server.root, bucket)):
            return self._error(404, "NoSuchBucket", bucket)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{threading.get_ident()}.part"
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
        self._wait_first_byte()
        self.send_response(200)
        self.send_header("ETag", etag(os.stat(path)))
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.counters.count("PUT")

    def do_POST(self) -> None:  # noqa: N802
        self._read_body()
        self._error(501, "NotImplemented", "POST (multipart uploads, batch deletes)")

    def do_DELETE(self) -> None:  # noqa: N802
        self._error(501, "NotImplemented", "DELETE")

    # ------------------------------------------------------------------ objects

    def _object(self, bucket: str, key: str, body: bool) -> None:
        path = self._file(bucket, key)
        try:
            if path is None:
                raise FileNotFoundError(key)
            f = open(path, "rb")  # noqa: SIM115 (closed below, after the sendfile)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return self._error(404, "NoSuchKey", key, head=not body)
        with f:
            st = os.fstat(f.fileno())
            span = byte_range(self.headers.get("Range"), st.st_size)
            if span is None:
                return self._error(416, "InvalidRange", f"bytes */{st.st_size}", head=not body)
            start, end = span
            self._wait_first_byte()
            partial = ranged(self.headers.get("Range"))  # S3 answers any range with a 206
            self.send_response(206 if partial else 200)
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{st.st_size}")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag(st))
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            self.end_headers()
            if body:
                self.wfile.flush()
                self._send(f, start, end - start)
        self.server.counters.count("GET" if body else "HEAD", end - start if body else 0)

    def _send(self, f: object, offset: int, count: int) -> None:
        """``count`` bytes of ``f`` from ``offset``, paced to the bandwidth cap if any."""
        cap, sock = self.server.bandwidth, self.connection
        if not cap:
            sock.sendfile(f, offset, count)  # type: ignore[arg-type]
            return
        t0, sent = time.perf_counter(), 0
        while sent < count:
            n = min(CHUNK, count - sent)
            sock.sendfile(f, offset + sent, n)  # type: ignore[arg-type]
            sent += n
            ahead = sent / cap - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)

    # ------------------------------------------------------------------ listings

    def _list(self, bucket: str, q: dict[str, str]) -> None:
        base = os.path.join(self.server.root, bucket)
        if not bucket or not os.path.isdir(base):
            return self._error(404, "NoSuchBucket", bucket)
        prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
        max_keys = max(0, min(int(q.get("max-keys", "1000") or 1000), 1000))
        token = q.get("continuation-token", "")
        after = base64.urlsafe_b64decode(token).decode() if token else q.get("start-after", "")
        code = (lambda s: urllib.parse.quote(s, safe="/")) if q.get("encoding-type") else str
        contents, prefixes, last, truncated = [], [], "", False
        for key, st in walk(base, prefix):
            if key <= after or (prefixes and key.startswith(prefixes[-1])):
                continue
            cut = key.find(delim, len(prefix)) if delim else -1
            if len(contents) + len(prefixes) == max_keys:
                truncated = True
                break
            if cut >= 0:
                prefixes.append(key[: cut + len(delim)])
                last = prefixes[-1] + "\U0010ffff"  # past every key below the prefix
            else:
                contents.append((key, st))
                last = key
        parts = [f'<ListBucketResult xmlns="{XMLNS}"><Name>{escape(bucket)}</Name>']
        parts.append(f"<Prefix>{escape(code(prefix))}</Prefix><KeyCount>")
        parts.append(f"{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>")
        if delim:
            parts.append(f"<Delimiter>{escape(code(delim))}</Delimiter>")
        if q.get("encoding-type"):
            parts.append("<EncodingType>url</EncodingType>")
        parts.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
        if truncated:
            nxt = base64.urlsafe_b64encode(last.encode()).decode()
            parts.append(f"<NextContinuationToken>{nxt}</NextContinuationToken>")
        for key, st in contents:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(st.st_mtime))
            parts.append(
                f"<Contents><Key>{escape(code(key))}</Key><LastModified>{stamp}</LastModified>"
                f"<ETag>{escape(etag(st))}</ETag><Size>{st.st_size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        for p in prefixes:
            parts.append(f"<CommonPrefixes><Prefix>{escape(code(p))}</Prefix></CommonPrefixes>")
        parts.append("</ListBucketResult>")
        self._xml(200, "".join(parts), "LIST")

    def _list_buckets(self) -> None:
        names = sorted(e.name for e in os.scandir(self.server.root) if e.is_dir())
        rows = "".join(f"<Bucket><Name>{escape(n)}</Name></Bucket>" for n in names)
        self._xml(
            200,
            f'<ListAllMyBucketsResult xmlns="{XMLNS}"><Buckets>{rows}</Buckets>'
            "</ListAllMyBucketsResult>",
            "LIST",
        )

    def _counters(self) -> None:
        data = json.dumps(self.server.counters.snapshot()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # ------------------------------------------------------------------ plumbing

    def _wait_first_byte(self) -> None:
        if self.server.latency > 0:
            time.sleep(self.server.latency)

    def _read_body(self) -> bytes:
        """The request body: plain (Content-Length), ``chunked``, or ``aws-chunked``."""
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            raw = b"".join(self._chunks())
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        if "aws-chunked" in self.headers.get("Content-Encoding", "") or self.headers.get(
            "x-amz-content-sha256", ""
        ).startswith("STREAMING-"):
            raw = aws_unchunk(raw)
        return raw

    def _chunks(self) -> Iterator[bytes]:
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline().strip():
                    pass  # trailers
                return
            yield self.rfile.read(size)
            self.rfile.readline()

    def _xml(self, status: int, body: str, op: str) -> None:
        data = b'<?xml version="1.0" encoding="UTF-8"?>\n' + body.encode()
        self._wait_first_byte()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.server.counters.count(op, len(data))

    def _empty(self, status: int, op: str) -> None:
        self._wait_first_byte()
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.counters.count(op)

    def _error(self, status: int, code: str, detail: str, head: bool = False) -> None:
        if head:
            return self._empty(status, "HEAD")
        body = f"<Error><Code>{code}</Code><Message>{escape(detail)}</Message></Error>"
        self._xml(status, body, "error")


def etag(st: os.stat_result) -> str:
    """A quoted ETag that changes when the file is replaced or rewritten."""
    seed = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode()
    return f'"{hashlib.md5(seed, usedforsecurity=False).hexdigest()}"'


def ranged(header: str | None) -> bool:
    """Whether a ``Range`` header asks for one byte range (several ranges get the whole)."""
    return bool(header) and header.startswith("bytes=") and "," not in header  # type: ignore[union-attr]


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end)`` (end exclusive) of a ``Range`` header; the whole object without one;
    None for a range that starts at or past the end."""
    if not ranged(header):
        return 0, size
    assert header is not None
    first, _, last = header[6:].strip().partition("-")
    if not first:  # the last n bytes
        n = int(last)
        return (max(0, size - n), size) if n > 0 and size > 0 else None
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    return (start, end) if start < size and start < end else None


def walk(base: str, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
    """``(key, stat)`` of every object of the bucket folder ``base`` starting with ``prefix``,
    in key order (the folder named by the prefix's last ``/`` is where the walk starts)."""
    head = prefix.rpartition("/")[0]
    top = os.path.join(base, *head.split("/")) if head else base

    def scan(folder: str, rel: str) -> Iterator[tuple[str, os.stat_result]]:
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return
        named = []
        for e in entries:
            if e.name.endswith(".part"):
                continue  # an upload in progress
            named.append((f"{rel}{e.name}/" if e.is_dir() else f"{rel}{e.name}", e))
        for key, e in sorted(named):
            if not (key.startswith(prefix) or prefix.startswith(key)):
                continue
            if key.endswith("/"):
                yield from scan(e.path, key)
            else:
                yield key, e.stat()

    yield from scan(top, f"{head}/" if head else "")


def aws_unchunk(raw: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (``hex;chunk-signature=...\\r\\n data \\r\\n``)."""
    out, pos = [], 0
    while pos < len(raw):
        eol = raw.index(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";")[0], 16)
        if size == 0:
            break
        out.append(raw[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2
    return b"".join(out)


class S3Local(http.server.ThreadingHTTPServer):
    """The server: ``root`` (a folder of buckets), the latency and bandwidth to shape answers
    with, and its `Counters`."""

    daemon_threads = True
    request_queue_size = 512  # a burst of connections is not left to SYN retries

    def __init__(
        self, root: str, port: int = 0, latency: float = 0.0, bandwidth: float = 0.0
    ) -> None:
        self.root, self.latency, self.bandwidth = os.path.abspath(root), latency, bandwidth
        self.counters = Counters()
        super().__init__(("127.0.0.1", port), Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> S3Local:
        """Serve on a daemon thread until ``shutdown()``."""
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self


def counters(endpoint: str) -> dict[str, Any]:
    """The `Counters` of the server at ``endpoint`` (``GET /?counters``)."""
    import urllib.request

    with urllib.request.urlopen(f"{endpoint}/?counters", timeout=30) as reply:
        return dict(json.loads(reply.read()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="a folder whose subfolders are the buckets")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before a first byte")
    ap.add_argument("--bandwidth", type=float, default=0.0, help="bytes/s per connection")
    args = ap.parse_args(argv)
    server = S3Local(args.root, args.port, args.latency, args.bandwidth)
    print(f"serving {server.root} at {server.endpoint}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

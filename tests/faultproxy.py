"""A fault-injecting HTTP proxy on loopback, between a client and an object-store server.

``FaultProxy(upstream)`` listens on a free 127.0.0.1 port and forwards every request to
``upstream`` (``http://host:port``, e.g. the moto server of ``tests/buckets.py``), the request's
method, path, headers (``Host`` included, so a signed request stays valid) and body unchanged.
Point the client at ``proxy.endpoint`` instead of the server (``AWS_ENDPOINT_URL``:
``proxy.env()`` gives the variables) and the proxy can make the store slow or unreliable:

- ``latency``: seconds before a response's first byte (settable at any time);
- ``bandwidth``: the most bytes/s one connection's response bodies are sent at (None: no cap);
- ``fail(kind, count)``: the next ``count`` matching requests fail with ``kind``: ``"503"``
  (S3's ``SlowDown`` XML error), ``"429"``, ``"500"``, ``"reset"`` (the connection is reset
  before any reply) or ``"truncate"`` (the full ``Content-Length`` is announced, half the body
  is sent, then the connection is closed: a short read). ``method=`` and ``path=`` (a substring
  of the request path) narrow which requests match.

Counters (``stats()``, also the attributes): requests by ``(method, path)``, response body
bytes sent, faults injected, and requests in flight now and at most. ``gets(substring)`` counts
GET requests whose path contains it.

The proxy is bounded and stops by itself: at most ``max_connections`` client connections at once
(one more is closed at once), each idle connection closed after ``idle_timeout`` seconds, the
upstream request given ``upstream_timeout`` seconds, and the whole proxy shut down after
``lifetime`` seconds even if nobody calls ``stop()``. All its threads are daemons. Use it as a
context manager in tests::

    with FaultProxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.fail("503", count=3)
        ...
        assert proxy.faults["503"] == 3

From a benchmark, or by hand against any S3-compatible server, run it as a script; it prints
its endpoint and serves until interrupted or ``--lifetime`` runs out::

    python tests/faultproxy.py --upstream http://127.0.0.1:9000 --latency-ms 50 --mbps 100

or import it (``sys.path.insert(0, "tests")``; ``from faultproxy import FaultProxy``).
"""

from __future__ import annotations

import argparse
import http.client
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KINDS = ("503", "429", "500", "reset", "truncate")
_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}
)
_ERRORS = {
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "429": (429, "TooManyRequests", "Too many requests."),
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
}
_CHUNK = 64 * 1024


class _Rule:
    """The next ``count`` requests matching ``method`` and ``path`` fail with ``kind``."""

    def __init__(self, kind: str, count: int, method: str | None, path: str | None) -> None:
        self.kind, self.count, self.method, self.path = kind, count, method, path

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or self.path in path
        )


def error_body(kind: str, path: str) -> bytes:
    """The XML body S3 sends with error ``kind`` ("503", "429" or "500") for ``path``."""
    _, code, message = _ERRORS[kind]
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{path}</Resource><RequestId>faultproxy</RequestId></Error>"
    ).encode()


class FaultProxy:
    """A forwarding proxy to ``upstream`` that injects latency, a bandwidth cap and faults."""

    def __init__(
        self,
        upstream: str,
        *,
        latency: float = 0.0,
        bandwidth: float | None = None,
        port: int = 0,
        max_connections: int = 256,
        idle_timeout: float = 30.0,
        upstream_timeout: float = 60.0,
        lifetime: float = 900.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream={upstream!r}: give http://host:port")
        self.upstream = (parsed.hostname, parsed.port or 80)
        self.latency, self.bandwidth = float(latency), bandwidth
        self.idle_timeout, self.upstream_timeout = idle_timeout, upstream_timeout
        self.lifetime = lifetime
        self.requests: Counter[tuple[str, str]] = Counter()
        self.faults: Counter[str] = Counter()
        self.bytes_sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.refused = 0
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._sockets: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()
        self._server = _Server(("127.0.0.1", port), _Handler, self)
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # ------------------------------------------------------------------ control

    def start(self) -> FaultProxy:
        """Serve on a daemon thread until ``stop()`` or ``lifetime`` seconds have passed."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="faultproxy", daemon=True
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every client connection (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None and self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        with self._lock:
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            _close(sock, reset=False)
        with self._lock:
            handlers = list(self._handlers)
        for thread in handlers:
            if thread is not threading.current_thread():
                thread.join(timeout=10)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """``AWS_ENDPOINT_URL`` (and the S3-specific one) pointing at this proxy."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint}

    def fail(
        self, kind: str, count: int = 1, *, method: str | None = "GET", path: str | None = None
    ) -> None:
        """Make the next ``count`` requests matching ``method`` (None: any) and ``path`` (a
        substring; None: any) fail with ``kind``, one of ``KINDS``."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: one of {', '.join(KINDS)}")
        with self._lock:
            self._rules.append(_Rule(kind, int(count), method, path))

    def clear(self) -> None:
        """Drop the faults not yet injected."""
        with self._lock:
            self._rules.clear()

    def reset_counts(self) -> None:
        """Zero every counter."""
        with self._lock:
            self.requests.clear()
            self.faults.clear()
            self.bytes_sent = self.max_in_flight = self.refused = 0

    def gets(self, path: str = "") -> int:
        """GET requests so far whose path contains ``path``."""
        with self._lock:
            return sum(n for (m, p), n in self.requests.items() if m == "GET" and path in p)

    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters."""
        with self._lock:
            return {
                "requests": dict(self.requests),
                "faults": dict(self.faults),
                "bytes_sent": self.bytes_sent,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "refused": self.refused,
            }

    # ------------------------------------------------------------------ used by the handler

    def _fault_for(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests[(method, path)] += 1
            for rule in self._rules:
                if rule.count > 0 and rule.matches(method, path):
                    rule.count -= 1
                    self.faults[rule.kind] += 1
                    return rule.kind
            self._rules = [r for r in self._rules if r.count > 0]
            return None

    @contextmanager
    def _flight(self) -> Iterator[None]:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1

    def _sent(self, n: int) -> None:
        with self._lock:
            self.bytes_sent += n


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        proxy = self.proxy
        if not proxy._slots.acquire(blocking=False):
            with proxy._lock:
                proxy.refused += 1
            _close(request, reset=False)
            return
        with proxy._lock:
            proxy._sockets.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that went away (or a connection the proxy reset) is expected."""

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.proxy._lock:
            self.proxy._handlers.add(threading.current_thread())
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.proxy._lock:
                self.proxy._sockets.discard(request)
                self.proxy._handlers.discard(threading.current_thread())
            self.proxy._slots.release()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        self.timeout = self.server.proxy.idle_timeout
        super().setup()
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Quiet: the counters say what happened."""

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        proxy = self.server.proxy
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if (
            body
            or "Content-Length" in self.headers
            or "chunked" in str(self.headers.get("Transfer-Encoding", ""))
        ):
            headers["Content-Length"] = str(len(body))
        for attempt in (0, 1):  # a kept-alive upstream connection may have closed: retry once
            if self._upstream is None:
                host, port = proxy.upstream
                self._upstream = http.client.HTTPConnection(
                    host, port, timeout=proxy.upstream_timeout
                )
            try:
                self._upstream.request(self.command, self.path, body=body, headers=headers)
                reply = self._upstream.getresponse()
                data = reply.read()
            except (OSError, http.client.HTTPException):
                self._upstream.close()
                self._upstream = None
                if attempt:
                    raise
                continue
            return reply.status, reply.reason, reply.getheaders(), data
        raise AssertionError("unreachable")

    def _reply(
        self,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        data: bytes,
        *,
        send: int | None = None,
    ) -> None:
        proxy = self.server.proxy
        if proxy.latency > 0:
            time.sleep(proxy.latency)
        self.send_response_only(status, reason)
        length = str(len(data))
        for key, value in headers:
            if key.lower() == "content-length" and self.command == "HEAD":
                length = value  # a HEAD reply has no body but tells the object's size
            elif key.lower() not in _HOP and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command == "HEAD":
            return
        body = data if send is None else data[:send]
        cap = proxy.bandwidth
        began = time.monotonic()
        for at in range(0, len(body), _CHUNK):
            piece = body[at : at + _CHUNK]
            proxy._sent(len(piece))  # counted before it leaves: a client may check on receipt
            self.wfile.write(piece)
            if cap:
                ahead = (at + len(piece)) / cap - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)
        self.wfile.flush()

    def _handle(self) -> None:
        proxy = self.server.proxy
        path = urllib.parse.urlsplit(self.path).path
        body = self._body()
        kind = proxy._fault_for(self.command, path)
        with proxy._flight():
            if kind == "reset":
                self.close_connection = True
                _close(self.connection, reset=True)
                return
            if kind in _ERRORS:
                status, code, _ = _ERRORS[kind]
                xml = [("Content-Type", "application/xml")]
                if kind != "500":
                    xml.append(("Retry-After", "0"))
                self._reply(status, code, xml, error_body(kind, path))
                return
            try:
                status, reason, headers, data = self._forward(body)
            except (OSError, http.client.HTTPException):
                self._reply(502, "Bad Gateway", [], b"")
                return
            if kind == "truncate":
                self.close_connection = True
                self._reply(status, reason, headers, data, send=len(data) // 2)
                _close(self.connection, reset=False)
                return
            self._reply(status, reason, headers, data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


def _close(sock: socket.socket, *, reset: bool) -> None:
    """Close ``sock``; with ``reset``, abortively (the peer sees a connection reset)."""
    try:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def main(argv: list[str] | None = None) -> None:
    """Serve a proxy from the command line until interrupted (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="http://host:port of the server")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="first-byte latency")
    parser.add_argument("--mbps", type=float, default=None, help="per-connection MB/s cap")
    parser.add_argument("--lifetime", type=float, default=3600.0, help="seconds to serve")
    args = parser.parse_args(argv)
    bandwidth = args.mbps * 1e6 if args.mbps else None
    proxy = FaultProxy(
        args.upstream,
        latency=args.latency_ms / 1000,
        bandwidth=bandwidth,
        port=args.port,
        lifetime=args.lifetime,
    ).start()
    print(proxy.endpoint, flush=True)
    try:
        while proxy._thread is not None and proxy._thread.is_alive():
            proxy._thread.join(timeout=1)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()

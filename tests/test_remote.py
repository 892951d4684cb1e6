"""Remote shards through fsspec, against a real HTTP server on 127.0.0.1 that serves Range."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import threading
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

import stoker  # noqa: E402
from stoker.cli.convert import convert  # noqa: E402
from stoker.errors import SourceError, StokerError  # noqa: E402
from stoker.sources import open_source  # noqa: E402
from stoker.sources.base import Source  # noqa: E402
from stoker.sources.remote import RemoteShardSource  # noqa: E402
from stoker.sources.shards import ShardSource  # noqa: E402

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
GATE_S = 3.0  # how long a gated GET waits for the others (a sequential client waits it out)


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET (with a single ``bytes=a-b`` Range) and HEAD of files under ``server.root``."""

    def log_message(self, *args):  # quiet
        pass

    def _file(self):
        path = os.path.join(self.server.root, self.path.split("?")[0].lstrip("/"))
        return path if os.path.isfile(path) else None

    def do_HEAD(self):  # noqa: N802
        path = self._file()
        self.server.note(self, None)
        if path is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(os.path.getsize(path)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self):  # noqa: N802
        srv = self.server
        with srv.lock:
            srv.inflight += 1
            srv.max_inflight = max(srv.max_inflight, srv.inflight)
            srv.arrived.notify_all()
            # with a gate, hold GETs until `gate` are in flight at once (or GATE_S passed); then
            # it stays open. Overlapping requests open it; one-after-the-other ones never do
            if srv.gate and not srv.arrived.wait_for(srv.gate_reached, GATE_S):
                srv.gate_missed += 1
        try:
            time.sleep(srv.delay)
            path = self._file()
            rng = self.headers.get("Range")
            srv.note(self, rng)
            if path is None:
                self.send_error(404)
                return
            with open(path, "rb") as f:
                data = f.read()
            m = _RANGE.match(rng or "")
            if m:
                start = int(m.group(1))
                end = int(m.group(2)) + 1 if m.group(2) else len(data)
                body = data[start:end]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            else:
                body = data
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self.wfile.write(body)
        finally:
            with srv.lock:
                srv.inflight -= 1


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.delay = str(root), 0.0
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.gate = self.gate_missed = 0
        self.gate_open = False
        self.requests: list[tuple[str, str, str | None]] = []
        self.inflight = self.max_inflight = 0

    def note(self, handler, rng):
        with self.lock:
            self.requests.append((handler.command, handler.path, rng))

    def gate_reached(self) -> bool:
        """True once ``gate`` GETs were in flight at the same time (call with the lock held)."""
        self.gate_open = self.gate_open or self.inflight >= self.gate
        return self.gate_open

    def reset(self):
        with self.lock:
            self.gate_open = False
            self.requests.clear()
            self.max_inflight = self.gate_missed = 0


@pytest.fixture(scope="module")
def shard_dir(image_folder, tmp_path_factory):
    dst = tmp_path_factory.mktemp("remote_src") / "shards"
    convert(image_folder, dst, shard_bytes=60_000, row_group_bytes=12_000, progress=False)
    for p in dst.glob("*.idx.npy"):  # served folder: shards and manifest only
        p.unlink()
    return dst


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    srv = _Server(root)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Index caches go to the test's folder, never ~/.cache; proxies never apply."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def _serve(server, shard_dir, name="shards"):
    shutil.copytree(shard_dir, os.path.join(server.root, name))
    return f"{server.url}/{name}/"


def _batches(source, **kw):
    with stoker.Loader(source, batch_size=5, image_size=48, workers=2, **kw) as loader:
        return [(x.copy(), y.copy()) for x, y in loader]


@pytest.mark.timeout(60)
def test_remote_source_reads_the_same_bytes_with_one_ranged_read_each(server, shard_dir):
    url = _serve(server, shard_dir)
    local = ShardSource(shard_dir, cache_dir=shard_dir.parent / "localidx")
    remote = open_source(url)
    assert isinstance(remote, RemoteShardSource)
    assert set(remote.modes) == {0}
    assert len(remote) == len(local) == 36
    assert remote.classes == local.classes
    np.testing.assert_array_equal(remote.labels, local.labels)
    assert remote.block_sizes == local.block_sizes
    assert remote.fingerprint() == local.fingerprint()
    server.reset()
    assert [remote.read(i) for i in range(36)] == [local.read(i) for i in range(36)]
    gets = [r for r in server.requests if r[0] == "GET"]
    assert len(gets) == 36 and all(r[2] and r[2].startswith("bytes=") for r in gets)
    # the index is cached: a second source makes no index-building reads
    server.reset()
    again = RemoteShardSource(url)
    shards = len(again.files)
    assert len(server.requests) <= 1 + 4 * shards  # manifest + a few footer/label reads each
    assert again.index_files == remote.index_files
    assert all(str(shard_dir) not in f for f in remote.index_files)
    for s in (local, remote, again):
        s.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [False, True])
def test_http_loader_matches_local_loader(server, shard_dir, shuffle):
    url = _serve(server, shard_dir)
    kw = dict(augment="eval", shuffle=shuffle, seed=7, drop_last=False)
    local = _batches(str(shard_dir), **kw)
    remote = _batches(url, **kw)
    assert len(remote) == len(local) == 8
    for (xr, yr), (xl, yl) in zip(remote, local, strict=True):
        np.testing.assert_array_equal(yr, yl)
        np.testing.assert_array_equal(xr, xl)


@pytest.mark.timeout(30)
def test_missing_manifest_is_a_clear_source_error(server, shard_dir):
    url = _serve(server, shard_dir)
    os.remove(os.path.join(server.root, "shards", "stoker-manifest.json"))
    with pytest.raises(SourceError, match="stoker-manifest.json.*not found.*upload"):
        open_source(url)
    with pytest.raises(SourceError, match="not found"):
        RemoteShardSource(f"{server.url}/nowhere/")


@pytest.mark.timeout(30)
def test_unreachable_server_is_a_source_error_not_a_hang():
    # a port nobody listens on (bound then closed)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(SourceError, match=f"127.0.0.1:{port}"):
        RemoteShardSource(f"http://127.0.0.1:{port}/shards/", timeout=5)


@pytest.mark.timeout(90)
def test_server_stopping_mid_run_counts_bad_samples_then_fails(server, shard_dir):
    url = _serve(server, shard_dir)
    server.delay = 0.01
    seen = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(StokerError) as info:
            with stoker.Loader(url, batch_size=2, image_size=32, workers=2, shuffle=False,
                               augment="eval", max_errors=3, timeout=60) as loader:
                for _ in loader:
                    seen += 1
                    if seen == 1:
                        server.shutdown()
                        server.server_close()
    assert seen < 18
    assert "127.0.0.1" in str(info.value)


class _Recorder(Source):
    def __init__(self, n):
        self.labels = np.zeros(n, dtype=np.int64)
        self.calls: list[list[int]] = []

    def prefetch(self, indices):
        self.calls.append([int(i) for i in indices])

    def read(self, index):
        return np.full((8, 8, 3), index, dtype=np.uint8)

    def fingerprint(self):
        return "r"


@pytest.mark.timeout(30)
def test_assembler_announces_each_batch_once():
    src = _Recorder(10)
    with stoker.Loader(src, batch_size=4, image_size=8, workers=0, shuffle=False,
                       augment="eval", drop_last=False) as loader:
        list(loader)
    assert src.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.timeout(60)
def test_read_ahead_issues_a_batch_of_ranged_reads_concurrently(server, shard_dir):
    """Concurrency is counted (requests in flight at once at the server), not timed."""
    url = _serve(server, shard_dir)
    src = RemoteShardSource(url)
    server.reset()
    server.gate = 4  # each GET waits until 4 are in flight together
    indices = np.arange(12)
    try:
        src.prefetch(indices)
        data = [src.read(i) for i in indices]
    finally:
        server.gate = 0
    gets = [r for r in server.requests if r[0] == "GET"]
    assert len(gets) == 12  # one ranged read per image, none repeated by read()
    assert server.max_inflight >= 4 and server.gate_missed == 0  # concurrent, not one by one
    assert not src._ahead  # read() consumed the read-ahead: memory bounded to one batch
    server.reset()
    assert [src.read(i) for i in indices] == data  # without read-ahead: one request each
    assert len([r for r in server.requests if r[0] == "GET"]) == 12
    assert server.max_inflight == 1  # plain reads, one after the other
    src.close()


@pytest.mark.timeout(120)
def test_loader_makes_one_request_per_sample(server, shard_dir):
    url = _serve(server, shard_dir)
    RemoteShardSource(url).close()  # build the index first
    server.delay = 0.02
    with stoker.Loader(url, batch_size=6, image_size=32, workers=2, shuffle=False,
                       augment="eval") as loader:
        server.reset()  # count what iterating costs, not the manifest and footers
        n = sum(len(y) for _, y in loader)
    gets = [r for r in server.requests if r[0] == "GET"]
    assert n == 36
    # one ranged read per sample (6 per batch of 6; workers may also fill batches of the next
    # epoch ahead), and no footer or index reads in the workers
    assert all(r[2] and "shard-" in r[1] for r in gets)
    assert len({(r[1], r[2]) for r in gets}) == 36
    assert len(gets) >= 36
    assert server.max_inflight >= 3  # a batch's reads overlap (read-ahead at work)

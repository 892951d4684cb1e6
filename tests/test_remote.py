"""Remote shards through fsspec, against a real HTTP server on 127.0.0.1 that serves Range; their
reads run ahead through the same window as local sources' (sources/readahead.py)."""

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
from stoker.sources.readahead import MAX_WINDOW, ReadAhead, ReadSettings  # noqa: E402
from stoker.sources.remote import READ_AHEAD_MAX, RemoteShardSource  # noqa: E402
from stoker.sources.shardindex import HEADER_ROWS  # noqa: E402
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
        counted = True
        try:
            time.sleep(srv.delay)
            path = self._file()
            rng = self.headers.get("Range")
            if srv.hang and rng == srv.hang:  # a request that gets no answer until released
                srv.release.wait(60)
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
            # out of flight before the reply goes out: once its bytes are there, the client may
            # send its next request before this thread runs again
            counted = srv.leave()
            self.end_headers()
            self.wfile.write(body)
        finally:
            if counted:
                srv.leave()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of connections is accepted, not left to SYN retries

    def __init__(self, root):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.delay = str(root), 0.0
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.gate = self.gate_missed = 0
        self.gate_open = False
        self.requests: list[tuple[str, str, str | None]] = []
        self.inflight = self.max_inflight = 0
        self.hang: str | None = None  # the Range header of a request left unanswered
        self.release = threading.Event()

    def note(self, handler, rng):
        with self.lock:
            self.requests.append((handler.command, handler.path, rng))

    def gate_reached(self) -> bool:
        """True once ``gate`` GETs were in flight at the same time (call with the lock held)."""
        self.gate_open = self.gate_open or self.inflight >= self.gate
        return self.gate_open

    def leave(self) -> bool:
        """One GET is no longer in flight; returns False (it is counted out)."""
        with self.lock:
            self.inflight -= 1
        return False

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
    srv.release.set()
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
    groups = sum(again._group_starts[k].size - 1 for k in range(shards))
    # the manifest, each shard's footer, and its label chunks (at most one GET per row group,
    # all in flight at once): never an image byte
    assert len(server.requests) <= 1 + shards + groups
    assert all(r[2] and r[2].startswith("bytes=") for r in server.requests[1:])
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
    with pytest.raises(SourceError, match="read_ahead_max=0.*positive int"):
        RemoteShardSource(f"{server.url}/shards/", read_ahead_max=0)


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
            with stoker.Loader(
                url,
                batch_size=2,
                image_size=32,
                workers=2,
                shuffle=False,
                augment="eval",
                max_errors=3,
                timeout=60,
            ) as loader:
                for _ in loader:
                    seen += 1
                    if seen == 1:
                        server.shutdown()
                        server.server_close()
    assert seen < 18
    assert "127.0.0.1" in str(info.value)


def _range(src, index):
    """The Range header of sample ``index``'s one ranged read."""
    shard, row = src.locate(index)
    offset, length = (int(v) for v in src._table(shard)[row + HEADER_ROWS])
    return f"bytes={offset}-{offset + length - 1}"


@pytest.mark.timeout(60)
def test_read_ahead_window_bounds_the_ranged_reads_in_flight(server, shard_dir):
    """Concurrency is counted (requests in flight at once at the server), not timed."""
    url = _serve(server, shard_dir)
    src = RemoteShardSource(url, merge_gap=None)  # one request per image: the window's own
    assert src.parallel_reads  # remote reads run ahead through the window like local ones
    order = np.random.default_rng(1).permutation(len(src))[:12]
    plain = [src.read(int(i)) for i in order]
    reads = ReadAhead(src, ReadSettings(window=4, page_cache="drop"))  # nothing to drop
    reads.start(order[:1])
    reads.take(int(order[0]))  # the window's first read goes alone (no size known yet)
    server.reset()
    server.gate = 4  # each GET waits until 4 are in flight together
    try:
        reads.start(order)
        data = [reads.take(int(i))[0] for i in order]
    finally:
        server.gate = 0
        reads.close()
    assert data == plain  # the same bytes, in the same order, as plain reads
    assert reads.counters.dropped == 0  # network reads leave no pages to drop
    gets = [r for r in server.requests if r[0] == "GET"]
    assert sorted(r[2] for r in gets) == sorted(_range(src, int(i)) for i in order)  # one each
    assert server.gate_missed == 0  # 4 in flight at once: concurrent, not one by one
    assert server.max_inflight == 4  # and never more than the window
    server.reset()
    assert [src.read(int(i)) for i in order] == plain  # plain reads: one request each, in turn
    assert len([r for r in server.requests if r[0] == "GET"]) == 12
    assert server.max_inflight == 1
    src.close()


@pytest.mark.timeout(90)
def test_auto_window_grows_past_the_local_maximum_to_cover_network_latency(server, shard_dir):
    url = _serve(server, shard_dir)
    # merge_gap=None: each sample is a request of its own, so the window is the read-ahead
    src = RemoteShardSource(url, read_ahead_max=MAX_WINDOW + 8, merge_gap=None)
    server.delay = 1.0  # every request takes far longer than a (here empty) decode, and long
    # enough that a busy machine still fills the window before the first ones answer
    server.reset()
    order = np.tile(np.arange(len(src)), 4)
    reads = ReadAhead(src, ReadSettings(window="auto"))
    reads.start(order)
    data = [reads.take(int(i))[0] for i in order]
    reads.close()
    server.delay = 0.0
    assert data == [src.read(int(i)) for i in order]
    assert MAX_WINDOW < server.max_inflight <= MAX_WINDOW + 8  # past 32, within the source's cap
    src.close()


@pytest.mark.timeout(90)
def test_shards_read_out_of_spans_fetched_ahead_open_no_window_threads(server, shard_dir):
    url = _serve(server, shard_dir)
    src = RemoteShardSource(url)
    assert src.chunked  # the fixture's row groups fall into fixed spans, fetched ahead
    server.delay = 0.2  # a window would open at once: every read waits far longer than a decode
    order = np.tile(np.arange(len(src)), 2)
    before = set(threading.enumerate())  # an earlier test's window threads may still be ending
    reads = ReadAhead(src, ReadSettings(window="auto"))
    reads.start(order, order[:8])
    data = [reads.take(int(i))[0] for i in order]
    window_threads = [t for t in set(threading.enumerate()) - before if t.name == "stoker-read"]
    reads.close()
    server.delay = 0.0
    assert data == [src.read(int(i)) for i in order]
    assert window_threads == []  # the spans' own threads read ahead; no thread waits on them
    src.close()


@pytest.mark.timeout(120)
def test_a_span_request_that_never_answers_makes_bad_samples_not_a_wait(server, shard_dir):
    url = _serve(server, shard_dir)
    src = RemoteShardSource(url)
    assert src.chunked  # read plainly out of spans fetched ahead: no window gives a deadline
    key = src.sample_chunks(np.array([2]))[0][1]
    server.hang = f"bytes={key.start}-{key.end - 1}"  # held 60 s, far past the loader's 8 s
    kw = {"batch_size": 3, "image_size": 16, "shuffle": False, "timeout": 8.0, "augment": "eval"}
    with (
        stoker.Loader(src, workers=0, max_errors=0.9, **kw) as loader,
        pytest.warns(stoker.StokerWarning),
    ):
        labels = np.concatenate([y for _, y in loader])
        stats = loader.stats()
    assert len(labels) == len(src) and stats.skipped >= 1
    assert src.name(2) in dict(stats.bad_files)
    assert all("no bytes after" in why for why in dict(stats.bad_files).values())
    src.close()


@pytest.mark.timeout(120)
def test_a_request_that_never_answers_is_a_bad_sample_and_blocks_only_itself(server, shard_dir):
    url = _serve(server, shard_dir)
    src = RemoteShardSource(url, merge_gap=None)  # sample 2's own request is the one to hang
    plain = [src.read(i) for i in range(8)]
    server.hang = _range(src, 2)
    reads = ReadAhead(src, ReadSettings(window=4, timeout=3.0))
    reads.start(np.arange(8))
    for index in (3, 4, 5):  # the samples behind the stuck one arrive while it hangs
        assert reads.take(index)[0] == plain[index]
    with pytest.raises(OSError, match="no bytes after"):
        reads.take(2)
    assert reads.take(7)[0] == plain[7]
    reads.close()
    with (
        stoker.Loader(
            src,
            batch_size=3,
            image_size=16,
            shuffle=False,
            workers=0,
            timeout=8.0,
            augment="eval",
            max_errors=2,
        ) as loader,
        pytest.warns(stoker.StokerWarning),
    ):
        labels = np.concatenate([y for _, y in loader])
        stats = loader.stats()
    assert stats.skipped == 1 and "no bytes after" in dict(stats.bad_files)[src.name(2)]
    expected = src.labels[[0, 1, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11]]  # sample 3 took 2's place
    np.testing.assert_array_equal(labels[:12], expected)
    src.close()


@pytest.mark.timeout(120)
def test_remote_resume_and_split_read_ahead_give_the_plain_batches(server, shard_dir):
    url = _serve(server, shard_dir)
    kw = dict(batch_size=5, image_size=24, seed=3, augment="train")
    with stoker.Loader(url, workers=0, read_ahead=0, **kw) as loader:
        plain = [(x.copy(), y.copy()) for x, y in loader]
    with stoker.Loader(url, workers=0, read_ahead=0, **kw) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    with stoker.Loader(url, workers=2, **kw) as again:  # read ahead, in workers
        again.load_state_dict(state)
        rest = [(x.copy(), y.copy()) for x, y in again]
    assert len(rest) == len(plain) - 2
    for (xa, ya), (xb, yb) in zip(plain[2:], rest, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    with stoker.Loader(url, validation_split=0.25, subset="validation", **kw) as val:
        split = val.recipe.source  # a subset of the remote source reads ahead as its base does
        assert split.parallel_reads and split.read_ahead_max == READ_AHEAD_MAX > MAX_WINDOW


@pytest.mark.timeout(120)
def test_loader_merges_a_batchs_neighbouring_images_into_one_request(server, shard_dir):
    url = _serve(server, shard_dir)
    RemoteShardSource(url).close()  # build the index first
    server.delay = 0.02
    with stoker.Loader(
        url, batch_size=6, image_size=32, workers=2, shuffle=False, augment="eval"
    ) as loader:
        server.reset()  # count what iterating costs, not the manifest and footers
        n = sum(len(y) for _, y in loader)
    gets = [r for r in server.requests if r[0] == "GET"]
    assert n == 36
    # each row group's images are one ranged read, made once for both workers (they share
    # the fetched spans), and no footer or index reads in the workers
    assert all(r[2] and "shard-" in r[1] for r in gets)
    spans = {(r[1], r[2]) for r in gets}
    src = RemoteShardSource(url)
    assert len(gets) == len(spans) == len(src.block_sizes)
    for index in range(36):  # every image's bytes lie inside some requested span
        shard, row = src.locate(index)
        offset, length = (int(v) for v in src._table(shard)[row + HEADER_ROWS])
        name = src.files[shard].rsplit("/", 1)[1]
        assert any(name in path and _covers(rng, offset, offset + length) for path, rng in spans)
    src.close()


def _covers(header: str, start: int, end: int) -> bool:
    m = _RANGE.match(header)
    return bool(m) and int(m.group(1)) <= start and end - 1 <= int(m.group(2))


@pytest.mark.timeout(120)
def test_a_remote_parquet_with_path_only_rows_is_refused_at_construction(server, tmp_path):
    """Rows that ``Dataset.to_parquet()`` writes from local files hold only a path: remote,
    that path names a file on the writer's machine, so the loader refuses it before any
    batch, saying how to embed the bytes (never every row failing at the first batch)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    cells = []
    for i in range(4):
        buf = io.BytesIO()
        Image.fromarray(np.full((6, 6, 3), 20 * i, np.uint8)).save(buf, format="PNG")
        (tmp_path / "imgs" / f"{i}.png").write_bytes(buf.getvalue())  # readable here, too
        cells.append({"bytes": None if i == 2 else buf.getvalue(), "path": f"imgs/{i}.png"})
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array(cells, type=kind), "label": pa.array(range(4))})
    pq.write_table(table, os.path.join(server.root, "train.parquet"), row_group_size=2)
    with pytest.raises(
        stoker.SourceError, match=r"(?s)train\.parquet.*1 rows.*row 2: imgs/2.*embed"
    ):
        stoker.Loader(f"{server.url}/train.parquet", batch_size=2, image_size=6)

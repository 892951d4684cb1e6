"""S3 clients side by side, and the endpoints they talk to: the code of ``storage.py clients``
and ``storage.py s3-ceiling``.

A *trial* runs one client in a fresh process (``python benchmarks/s3clients.py trial ...``) for
a fixed time with a fixed number of requests in flight and prints one JSON line: objects and
bytes read, wall seconds and the process's CPU seconds (``time.process_time()``: every thread
of the process, the clients' own I/O threads and obstore's Rust runtime included). The
clients, each used the way a loader's fetch threads would use it:

- ``boto3``: one client (``max_pool_connections`` = in flight), ``get_object(Range=...)`` from
  a thread pool;
- ``s3fs``: ``S3FileSystem.cat_file(path, start=, end=)`` from a thread pool (each call runs
  on fsspec's event-loop thread);
- ``s3fs-batch``: ``S3FileSystem.cat_ranges`` of ``inflight`` requests at a time (fsspec's own
  concurrency, one call per batch);
- ``obstore``: ``obstore.get_range`` on one ``S3Store`` from a thread pool;
- ``obstore-async``: ``obstore.get_range_async``, ``inflight`` at once on one asyncio loop.

Workloads: ``folder`` (whole objects of a folder of small objects, random order) and
``shards`` (ranges of ``--range-mb`` at random offsets in a few large objects).

Endpoints (`Endpoint`): ``s3local`` (`s3local.S3Local` in its own process, optionally behind
``tests/faultproxy.py``) and ``moto`` (moto's server in its own process, the bucket uploaded).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLIENTS = ("boto3", "s3fs", "s3fs-batch", "obstore", "obstore-async")
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}
BUCKET = "bench"

# ---------------------------------------------------------------------------- data


def make_data(root: Path, objects: int, object_kb: int, shards: int, shard_mb: int) -> Path:
    """``root/bench`` with ``folder/`` (``objects`` random objects of ``object_kb`` KB) and
    ``shards/`` (``shards`` random objects of ``shard_mb`` MB); kept when already there."""
    base = root / BUCKET
    stamp = base / f".made-{objects}-{object_kb}-{shards}-{shard_mb}"
    if stamp.is_file():
        return base
    rng = random.Random(0)
    for sub in ("folder", "shards"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for i in range(objects):
        (base / "folder" / f"{i:06d}.bin").write_bytes(rng.randbytes(object_kb * 1000))
    for i in range(shards):
        (base / "shards" / f"{i:03d}.bin").write_bytes(rng.randbytes(shard_mb * 1_000_000))
    stamp.write_text("")
    return base


def requests_for(base: Path, workload: str, range_mb: float) -> list[tuple[str, int, int]]:
    """The ``(key, start, end)`` requests of a workload, shuffled (end exclusive)."""
    rng = random.Random(1)
    sub = base / workload
    files = sorted(p for p in sub.iterdir() if p.is_file())
    out = []
    if workload == "folder":
        out = [(f"folder/{p.name}", 0, p.stat().st_size) for p in files]
    else:
        span = int(range_mb * 1_000_000)
        for p in files:
            size = p.stat().st_size
            out += [(f"shards/{p.name}", s, min(s + span, size)) for s in range(0, size, span)]
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------------------- endpoints


class Endpoint:
    """A server in its own process (``s3local`` or ``moto``), optionally behind the fault
    proxy (``latency`` seconds to a first byte, ``bandwidth`` bytes/s per connection)."""

    def __init__(
        self,
        kind: str,
        root: Path,
        latency: float = 0.0,
        bandwidth: float = 0.0,
        proxy: bool = False,
    ) -> None:
        self.kind, self.root, self.procs = kind, root, []  # type: ignore[var-annotated]
        try:
            self._start(latency, bandwidth, proxy)
        except BaseException:
            self.close()  # no server left behind by a start that failed half-way
            raise
        self.name = kind + (" via faultproxy" if proxy else "")

    def _start(self, latency: float, bandwidth: float, proxy: bool) -> None:
        port = _free_port()
        if self.kind == "s3local":
            shape = [] if proxy else ["--latency", str(latency), "--bandwidth", str(bandwidth)]
            cmd = [
                sys.executable,
                str(HERE / "s3local.py"),
                str(self.root),
                "--port",
                str(port),
                *shape,
            ]
        elif self.kind == "moto":
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        else:
            raise SystemExit(f"endpoint {self.kind!r}: give s3local or moto")
        self.procs.append(
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        self.url = f"http://127.0.0.1:{port}"
        _wait_port(port, self.procs[-1])
        if self.kind == "moto":
            upload(self.url, self.root / BUCKET)
        if proxy:
            pport = _free_port()
            cmd = [sys.executable, str(HERE.parent / "tests" / "faultproxy.py"), "--upstream"]
            cmd += [self.url, "--port", str(pport), "--latency-ms", str(latency * 1000)]
            if bandwidth:
                cmd += ["--mbps", str(bandwidth / 1e6)]
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
            self.url = f"http://127.0.0.1:{pport}"
            _wait_port(pport, self.procs[-1])

    def env(self) -> dict[str, str]:
        """The variables that point boto3, s3fs and obstore at this endpoint."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ENDPOINT_URL_S3": self.url, **CREDENTIALS}

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait(timeout=30)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import socket

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the server on port {port} exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {timeout:.0f} s")


def upload(url: str, base: Path) -> None:
    """Every file under ``base`` into bucket ``base.name`` at ``url`` (created first)."""
    client = boto3_client(url, 8)
    client.create_bucket(Bucket=base.name)
    files = [p for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")]

    def put(p: Path) -> None:
        client.put_object(Bucket=base.name, Key=p.relative_to(base).as_posix(), Body=p.read_bytes())

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))


def boto3_client(url: str, pool: int) -> Any:
    import boto3
    import botocore.config

    config = botocore.config.Config(max_pool_connections=pool, retries={"max_attempts": 2})
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        config=config,
    )


# ---------------------------------------------------------------------------- clients

Get = Callable[[str, int, int], int]


def threaded_get(client: str, url: str, inflight: int) -> Get:
    """A blocking ``get(key, start, end) -> bytes read`` for ``client``, safe across threads."""
    if client == "boto3":
        s3 = boto3_client(url, inflight)

        def get(key: str, start: int, end: int) -> int:
            rng = f"bytes={start}-{end - 1}"
            return len(s3.get_object(Bucket=BUCKET, Key=key, Range=rng)["Body"].read())

        return get
    if client == "s3fs":
        fs = s3fs_filesystem(url, inflight)
        return lambda key, start, end: len(fs.cat_file(f"{BUCKET}/{key}", start=start, end=end))
    if client == "obstore":
        import obstore

        store = obstore_store(url)
        return lambda key, start, end: len(obstore.get_range(store, key, start=start, end=end))
    raise SystemExit(f"client {client!r} has no threaded form")


def s3fs_filesystem(url: str, inflight: int) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        endpoint_url=url,
        key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        client_kwargs={"region_name": CREDENTIALS["AWS_DEFAULT_REGION"]},
        config_kwargs={"max_pool_connections": inflight},
        skip_instance_cache=True,
    )


def obstore_store(url: str) -> Any:
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=url,
        region=CREDENTIALS["AWS_DEFAULT_REGION"],
        access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        client_options={"allow_http": True, "pool_max_idle_per_host": str(max(32, 2 * 64))},
    )


Runner = Callable[[Iterator[tuple[str, int, int]], float], tuple[int, int]]


def runner(client: str, url: str, inflight: int) -> Runner:
    """``run(requests, seconds) -> (requests done, bytes)`` for ``client``, its client made."""
    if client == "s3fs-batch":
        fs = s3fs_filesystem(url, inflight)

        def batches(reqs: Iterator[tuple[str, int, int]], seconds: float) -> tuple[int, int]:
            stop, n, nbytes = time.perf_counter() + seconds, 0, 0
            while time.perf_counter() < stop:
                batch = [next(reqs) for _ in range(inflight)]
                paths = [f"{BUCKET}/{k}" for k, _, _ in batch]
                starts, ends = [s for _, s, _ in batch], [e for _, _, e in batch]
                out = fs.cat_ranges(paths, starts, ends, batch_size=inflight)
                n, nbytes = n + len(out), nbytes + sum(len(b) for b in out)
            return n, nbytes

        return batches
    if client == "obstore-async":
        return _obstore_async(url, inflight)
    get = threaded_get(client, url, inflight)

    def threads(reqs: Iterator[tuple[str, int, int]], seconds: float) -> tuple[int, int]:
        stop = time.perf_counter() + seconds

        def loop() -> tuple[int, int]:
            n = nbytes = 0
            while time.perf_counter() < stop:
                nbytes += get(*next(reqs))
                n += 1
            return n, nbytes

        with cf.ThreadPoolExecutor(inflight) as pool:
            done = list(pool.map(lambda _: loop(), range(inflight)))
        return sum(d[0] for d in done), sum(d[1] for d in done)

    return threads


def _obstore_async(url: str, inflight: int) -> Runner:
    import obstore

    store = obstore_store(url)

    async def worker(reqs: Iterator[tuple[str, int, int]], stop: float) -> tuple[int, int]:
        n = nbytes = 0
        while time.perf_counter() < stop:
            key, start, end = next(reqs)
            nbytes += len(await obstore.get_range_async(store, key, start=start, end=end))
            n += 1
        return n, nbytes

    async def gather(reqs: Iterator[tuple[str, int, int]], seconds: float) -> list[tuple[int, int]]:
        stop = time.perf_counter() + seconds
        return await asyncio.gather(*(worker(reqs, stop) for _ in range(inflight)))

    def run(reqs: Iterator[tuple[str, int, int]], seconds: float) -> tuple[int, int]:
        done = asyncio.run(gather(reqs, seconds))
        return sum(d[0] for d in done), sum(d[1] for d in done)

    return run


def trial(
    client: str, url: str, reqs: list[tuple[str, int, int]], inflight: int, seconds: float
) -> dict[str, float]:
    """One timed run of ``client`` (in this process) after an untimed second that opens its
    connections: counts, wall and CPU seconds."""
    run = runner(client, url, inflight)
    cycle = _cycle(reqs)
    run(cycle, 1.0)
    cpu0, t0 = time.process_time(), time.perf_counter()
    n, nbytes = run(cycle, seconds)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"requests": n, "bytes": nbytes, "wall_s": wall, "cpu_s": cpu}


def _cycle(reqs: list[tuple[str, int, int]]) -> Iterator[tuple[str, int, int]]:
    import itertools
    import threading

    it, lock = itertools.cycle(reqs), threading.Lock()

    class Shared:
        def __iter__(self) -> Shared:
            return self

        def __next__(self) -> tuple[str, int, int]:
            with lock:
                return next(it)

    return Shared()


def run_trial(
    client: str, endpoint: Endpoint, workload: str, range_mb: float, inflight: int, seconds: float
) -> dict[str, float]:
    """`trial` in a fresh process against ``endpoint``: its JSON figures."""
    cmd = [sys.executable, __file__, "trial", client, endpoint.url, str(endpoint.root / BUCKET)]
    cmd += [workload, str(range_mb), str(inflight), str(seconds)]
    env = {**os.environ, **endpoint.env()}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 300)
    if out.returncode:
        raise RuntimeError(f"{client} {workload}: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one client trial (see the module docstring)")
    ap.add_argument("what", choices=["trial"])
    ap.add_argument("client", choices=CLIENTS)
    ap.add_argument("url")
    ap.add_argument("base")
    ap.add_argument("workload", choices=["folder", "shards"])
    ap.add_argument("range_mb", type=float)
    ap.add_argument("inflight", type=int)
    ap.add_argument("seconds", type=float)
    args = ap.parse_args(argv)
    reqs = requests_for(Path(args.base), args.workload, args.range_mb)
    print(json.dumps(trial(args.client, args.url, reqs, args.inflight, args.seconds)))
    return 0


# ---------------------------------------------------------------------------- cases

IMAGE_BYTES = 100_000  # an "image" in the figures below: 100 KB, the folder's object size

S3_CEILING_DOC = """\
The S3 endpoints' own ceilings: GETs/s and MB/s that moto, the local S3 server and the local
server behind tests/faultproxy.py give one client process, with no latency added.

What it does
Writes a bucket folder under ``--root`` (``--objects`` objects of 100 KB, and ``--shards``
objects of ``--shard-mb`` MB), serves it from each endpoint in its own process (moto's server
gets the files uploaded; ``s3local`` serves the folder itself: ``benchmarks/s3local.py``;
``s3local+proxy`` puts the fault proxy of ``tests/faultproxy.py`` in front of it), and runs
each client of ``--clients`` for ``--seconds`` with ``--inflight`` requests in flight on three
workloads: whole 100 KB objects, 100 KB ranges into the large objects, and ``--range-mb``
ranges into them. Rounds interleave the endpoints (`common.interleave`). The client's own CPU
(cores busy) is printed beside each figure: where it nears 1, the client, not the server, is
the limit of that figure.

Usage
    python benchmarks/storage.py s3-ceiling --rounds 1 --seconds 3
"""


def _figures(r: dict[str, float]) -> dict[str, float]:
    images = r["bytes"] / IMAGE_BYTES
    return {
        "GETs/s": r["requests"] / r["wall_s"],
        "MB/s": r["bytes"] / r["wall_s"] / 1e6,
        "img/s": images / r["wall_s"],
        "img/CPU-s": images / r["cpu_s"] if r["cpu_s"] > 0 else 0.0,
        "client cores": r["cpu_s"] / r["wall_s"],
    }


def _add_data_options(ap: argparse.ArgumentParser, seconds: float, inflight: int) -> None:
    import common

    common.add_round_options(ap, rounds=3, seconds=seconds)
    ap.add_argument("--root", default="/tmp/stoker-s3bench", help="where the bucket folder is")
    ap.add_argument("--objects", type=int, default=1000, help="100 KB objects in the folder")
    ap.add_argument("--shards", type=int, default=2, help="large objects")
    ap.add_argument("--shard-mb", type=int, default=64, help="MB per large object")
    ap.add_argument("--range-mb", type=float, default=2.0, help="MB per ranged GET in a shard")
    ap.add_argument("--inflight", type=int, default=inflight, help="requests in flight")


def s3_ceiling_main(argv: list[str] | None = None) -> int:
    import common

    ap = argparse.ArgumentParser(description=S3_CEILING_DOC.split("\n\n")[0])
    _add_data_options(ap, seconds=3.0, inflight=16)
    ap.add_argument(
        "--clients", default="obstore,boto3", help="comma-separated: " + ",".join(CLIENTS)
    )
    ap.add_argument("--endpoints", default="s3local,s3local+proxy,moto")
    args = ap.parse_args(argv)
    common.print_facts()
    root = Path(args.root)
    make_data(root, args.objects, 100, args.shards, args.shard_mb)
    loads = [("folder", 0.0), ("shards", IMAGE_BYTES / 1e6), ("shards", args.range_mb)]
    endpoints = []
    try:
        for name in args.endpoints.split(","):
            endpoints.append(Endpoint(name.split("+")[0], root, proxy=name.endswith("+proxy")))
        peers = [
            common.Peer(
                f"{ep.name} {client} {wl}{'' if wl == 'folder' else f' {mb:g} MB'}",
                lambda ep=ep, c=client, wl=wl, mb=mb: _figures(
                    run_trial(c, ep, wl, mb, args.inflight, args.seconds)
                ),
            )
            for ep in endpoints
            for client in args.clients.split(",")
            for wl, mb in loads
        ]
        result = common.interleave(peers, args.rounds, warmup=0)
    finally:
        for ep in endpoints:
            ep.close()
    rows = []
    for peer in peers:
        med = {
            k: result.stats(f"{peer.name}: {k}")["median"]
            for k in ("GETs/s", "MB/s", "client cores")
        }
        rows.append(
            [
                peer.name,
                f"{med['GETs/s']:,.0f}",
                f"{med['MB/s']:,.0f}",
                f"{med['client cores']:.2f}",
            ]
        )
    print(common.table(rows, ["endpoint client workload", "GETs/s", "MB/s", "client cores"]))
    common.write_json(args.json, result.to_json())
    return 0


CLIENTS_DOC = """\
S3 clients compared on one latency-shaped endpoint: fsspec + s3fs, obstore and plain boto3
ranged GETs; images per second and images per CPU second of the client process.

What it does
Serves a bucket folder (``--objects`` objects of 100 KB, ``--shards`` objects of
``--shard-mb`` MB, written under ``--root``) from ``benchmarks/s3local.py`` in its own process,
one server per ``--latency`` (seconds before each answer's first byte) with
``--bandwidth`` bytes/s per connection. Each client (``--clients``; the forms are in
``benchmarks/s3clients.py``) runs in a fresh process for ``--seconds`` with ``--inflight``
requests in flight, on the folder (whole objects, random order) and on the shards
(``--range-mb`` ranges at random offsets: the merged ranges a loader asks for). Rounds
interleave every (client, workload, latency) (`common.interleave`). Reported per (workload,
latency): img/s (bytes / 100 KB per second: one image is one folder object), img per CPU
second of the client process (``time.process_time()``, all its threads), and each client's
ratio to s3fs on both.

Usage
    python benchmarks/storage.py clients --rounds 3 --seconds 4
"""


def clients_main(argv: list[str] | None = None) -> int:
    import common

    ap = argparse.ArgumentParser(description=CLIENTS_DOC.split("\n\n")[0])
    _add_data_options(ap, seconds=4.0, inflight=32)
    ap.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated")
    ap.add_argument("--latency", type=float, nargs="+", default=[0.02, 0.05, 0.1])
    ap.add_argument("--bandwidth", type=float, default=50e6, help="bytes/s per connection")
    ap.add_argument("--workloads", default="folder,shards")
    args = ap.parse_args(argv)
    common.print_facts()
    root = Path(args.root)
    make_data(root, args.objects, 100, args.shards, args.shard_mb)
    clients, loads = args.clients.split(","), args.workloads.split(",")
    servers = {lat: Endpoint("s3local", root, lat, args.bandwidth) for lat in args.latency}
    try:
        print(f"endpoint: benchmarks/s3local.py, {args.bandwidth / 1e6:g} MB/s per connection")
        peers = [
            common.Peer(
                f"{wl} {lat * 1000:g} ms {client}",
                lambda ep=ep, c=client, wl=wl: _figures(
                    run_trial(c, ep, wl, args.range_mb, args.inflight, args.seconds)
                ),
            )
            for lat, ep in servers.items()
            for wl in loads
            for client in clients
        ]
        result = common.interleave(peers, args.rounds, warmup=0)
    finally:
        for ep in servers.values():
            ep.close()
    print(common.table(_client_rows(result, clients, loads, args.latency), CLIENT_HEADER))
    common.write_json(args.json, result.to_json())
    return 0


CLIENT_HEADER = "workload latency client img/s img/CPU-s cores /s3fs_img/s /s3fs_img/CPU-s".split()


def _client_rows(
    result: Any, clients: list[str], loads: list[str], latencies: list[float]
) -> list[list[str]]:
    rows = []
    for wl in loads:
        for lat in latencies:
            group = f"{wl} {lat * 1000:g} ms"
            base = "s3fs" if "s3fs" in clients else clients[0]
            for client in clients:
                name = f"{group} {client}"
                if f"{name}: img/s" not in result.values:
                    rows.append([wl, f"{lat * 1000:g} ms", client, "-", "-", "-", "-", "-"])
                    continue
                med = {
                    k: result.stats(f"{name}: {k}")["median"]
                    for k in ("img/s", "img/CPU-s", "client cores")
                }
                ratio = [
                    result.ratio(f"{name}: {k}", f"{group} {base}: {k}")["median"]
                    for k in ("img/s", "img/CPU-s")
                ]
                rows.append(
                    [
                        wl,
                        f"{lat * 1000:g} ms",
                        client,
                        f"{med['img/s']:,.0f}",
                        f"{med['img/CPU-s']:,.0f}",
                        f"{med['client cores']:.2f}",
                        f"{ratio[0]:.2f}",
                        f"{ratio[1]:.2f}",
                    ]
                )
    return rows


if __name__ == "__main__":
    sys.exit(main())

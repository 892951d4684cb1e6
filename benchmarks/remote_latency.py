"""Remote shards behind network latency: img/s through the read-ahead window vs plain reads.

What it does
Serves a folder of stoker shards (``stoker convert`` output) from an HTTP server on 127.0.0.1
that answers every request after ``--delay`` seconds (the latency of an object store), and
times ``Loader(url)`` over it: shuffled, RandomResizedCrop 224 + flip, batch 64, 2 workers, for
``--seconds`` after the first batch, once per ``--read-ahead`` value, alternating for
``--rounds``. ``--src`` imports another stoker checkout instead (to compare an older
read-ahead), in a subprocess per run.

Usage
    python /work/shared/make_dataset.py --out /tmp/rl/images --classes 10 --per-class 60
    stoker convert /tmp/rl/images /tmp/rl/shards
    python benchmarks/remote_latency.py /tmp/rl/shards --delay 0.03 --read-ahead auto 0
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import time

RUN = """
import json, sys, time
import stoker
kw = json.loads(sys.argv[2])
with stoker.Loader(sys.argv[1], batch_size=64, image_size=224, augment="train", seed=0,
                   workers=2, **kw) as loader:
    it, n = iter(loader), 0
    next(it)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < float(sys.argv[3]):
        try:
            n += len(next(it)[1])
        except StopIteration:
            it = iter(loader)
    print(json.dumps({"img_s": n / (time.perf_counter() - t0)}))
"""


class Slow(http.server.SimpleHTTPRequestHandler):
    """Files under the served folder, with Range, each answer after ``delay`` seconds."""

    delay = 0.0

    def log_message(self, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        time.sleep(self.delay)
        rng = self.headers.get("Range", "")
        if not rng.startswith("bytes="):
            return super().send_head()
        path = self.translate_path(self.path)
        start_s, _, end_s = rng[6:].partition("-")
        size = os.path.getsize(path)
        start, end = int(start_s), min(int(end_s) if end_s else size - 1, size - 1)
        f = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        return _Limited(f, end - start + 1)


class _Limited:
    def __init__(self, f, n):  # type: ignore[no-untyped-def]
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        size = self.n if size < 0 else min(size, self.n)
        data = self.f.read(size)
        self.n -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen backlog: a burst of connections is not left to SYN retries


def serve(folder: str, delay: float) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(type("H", (Slow,), {"delay": delay}), directory=folder)
    server = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shards")
    parser.add_argument("--delay", type=float, default=0.03)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--read-ahead", nargs="+", default=["auto", "0"])
    parser.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", "src"))
    args = parser.parse_args()
    server, url = serve(args.shards, args.delay)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.src), "HOME": "/tmp/rl-home"}
    print(f"delay {args.delay * 1e3:.0f} ms per request; load average {os.getloadavg()[0]:.1f}")
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for ra in args.read_ahead:
            kw = {"read_ahead": ra if ra == "auto" else int(ra)}
            out = subprocess.run(
                [sys.executable, "-c", RUN, url, json.dumps(kw), str(args.seconds)],
                env=env,
                capture_output=True,
                text=True,
            )
            if out.returncode:
                sys.exit(out.stderr[-2000:])
            results.setdefault(ra, []).append(json.loads(out.stdout.splitlines()[-1])["img_s"])
            print(f"read_ahead={ra}: {results[ra][-1]:.0f} img/s", flush=True)
    server.shutdown()
    for ra, rates in results.items():
        print(f"read_ahead={ra}: " + ", ".join(f"{r:.0f}" for r in rates) + " img/s")


if __name__ == "__main__":
    main()

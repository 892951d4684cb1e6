"""A cluster loader's start with hostile connections racing its nodes, against the same start
left alone (peers in one run).

    python benchmarks/cluster_start.py --json /tmp/cluster_start.json

A simulated Ray cluster (``ray.cluster_utils.Cluster``: a head without CPUs, where this trainer
runs, and ``--nodes`` 1-CPU nodes). Each trial times ``Loader(cluster="ray", ...)`` from its
construction to its first batch. Peers of `common.interleave`:

- ``plain``: nobody else connects to the trainer's data port;
- ``attacked``: the moment the port opens (``stoker.workers.door.listen`` returns: before any
  node is asked to connect), ``--garbage`` connections that send a wrong greeting, then at
  once ``--silent`` ones that never send and ``--slow`` ones that send a valid greeting one
  byte every 0.25 s; and while the start lasts, a new connection after another.

Reported: seconds to the first batch per peer, attacked / plain per round (goal <= 1.5), and
per attacked trial the refused count and each node's transport (every node must be on tcp).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Peer, interleave, print_facts, table, write_json  # noqa: E402

import stoker  # noqa: E402
from stoker.workers import door, wire  # noqa: E402


class Swarm:
    """Hostile connections to ``address``: opened at once, held until ``close``."""

    def __init__(self, address: tuple[str, int], args: argparse.Namespace) -> None:
        self.address, self.done = address, threading.Event()
        self.socks: list[socket.socket] = []
        for _ in range(args.garbage):  # a wrong greeting each: refused at once
            with contextlib.suppress(OSError):
                sock = socket.create_connection(address, timeout=5)
                self.socks.append(sock)
                sock.sendall(b"\x00" * 40)
        burst = [socket.socket() for _ in range(args.silent + args.slow)]
        for sock in burst:
            sock.setblocking(False)  # never waits for the backlog
            sock.connect_ex(address)
        self.socks += burst
        self.slow = burst[args.silent :]
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._drip, self._more)]
        for thread in self.threads:
            thread.start()

    def _drip(self) -> None:
        for byte in wire.MAGIC + os.urandom(wire.CHALLENGE_BYTES):
            for sock in self.slow:
                with contextlib.suppress(OSError):  # not connected yet: a byte fewer
                    sock.send(bytes([byte]))
            if self.done.wait(0.25):
                return

    def _more(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(OSError):
                self.socks.append(socket.create_connection(self.address, timeout=5))
            self.done.wait(0.01)

    def close(self) -> None:
        """Stop and close every connection."""
        self.done.set()
        for thread in self.threads:
            thread.join(10)
        for sock in self.socks:
            sock.close()


def first_batch(data: Path, args: argparse.Namespace, attacked: bool) -> dict[str, float]:
    """One start: seconds from the Loader's construction to its first batch."""
    swarms: list[Swarm] = []
    listen = door.listen

    def listen_and_attack(host: str) -> socket.socket:
        listener = listen(host)
        swarms.append(Swarm(listener.getsockname()[:2], args))
        return listener

    door.listen = listen_and_attack if attacked else listen  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        with stoker.Loader(
            data,
            batch_size=args.batch,
            image_size=64,
            workers=0,
            cluster="ray",
            cluster_listen="127.0.0.1",
        ) as loader:
            next(iter(loader))
            seconds = time.perf_counter() - t0
            cluster = loader.stats().cluster
    finally:
        door.listen = listen  # type: ignore[assignment]
        for swarm in swarms:
            swarm.close()
    on_tcp = all(n["transport"] == "tcp" for n in cluster["nodes"])
    print(
        f"{'attacked' if attacked else 'plain'}: {seconds:.2f} s, refused {cluster['refused']}, "
        f"transports {[n['transport'] for n in cluster['nodes']]}",
        flush=True,
    )
    return {"seconds": seconds, "refused": float(cluster["refused"]), "all_tcp": float(on_tcp)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="1-CPU Ray nodes")
    parser.add_argument("--silent", type=int, default=100)
    parser.add_argument("--slow", type=int, default=100)
    parser.add_argument("--garbage", type=int, default=100)
    parser.add_argument("--images", type=int, default=60, help="JPEGs in the data set")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", default=None, help="an ImageFolder (default: benchmarks/photos)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    facts = print_facts()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="stoker_cluster_start_"))
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    try:
        if args.data:
            data = Path(args.data)
        else:
            import photo_source

            data = photo_source.make_folder(tmp / "data", 2, args.images // 2, 2)
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        cluster.wait_for_nodes()
        peers = [
            Peer(name, lambda hit=(name == "attacked"): first_batch(data, args, hit))
            for name in ("plain", "attacked")
        ]
        result = interleave(peers, rounds=args.rounds, warmup=1)
        report(result)
        write_json(args.json, {"facts": facts, "args": vars(args), **result.to_json()})
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(result: Any) -> None:
    """Seconds to the first batch per peer, the per-round ratio, and the attack's effects."""
    rows = []
    for name in ("plain", "attacked"):
        st = result.stats(f"{name}: seconds")
        rows.append([name, f"{st['median']:.2f}", f"{st['min']:.2f}-{st['max']:.2f}"])
    print(table(rows, ["peer", "first batch s (median)", "range"]))
    ratio = result.ratio("attacked: seconds", "plain: seconds")
    print(
        f"attacked / plain: {ratio['median']:.2f} ({ratio['ci_low']:.2f}-{ratio['ci_high']:.2f}; "
        "goal <= 1.5)"
    )
    refused = result.values["attacked: refused"]
    tcp = result.values["attacked: all_tcp"]
    print(
        f"attacked: refused {min(refused):.0f}-{max(refused):.0f}; every node on tcp in "
        f"{sum(tcp):.0f} of {len(tcp)} trials"
    )


if __name__ == "__main__":
    sys.exit(main())

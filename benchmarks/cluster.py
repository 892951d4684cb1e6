"""Decoding on a Ray node against decoding locally, on a 2-core machine (peers in one run).

    python benchmarks/cluster.py --json /tmp/cluster.json

The trainer (this process, every thread) runs on core 0 and decodes nothing itself; a
simulated Ray cluster (``ray.cluster_utils.Cluster``: a head without CPUs and one 1-CPU node)
runs on core 1 (its processes inherit the affinity they were started with). Peers of
`common.interleave` (``--rounds`` rounds; each run gives several figures, a series each), each
timed over ``--batches`` batches after a warm-up:

- ``local``: one local worker, pinned to core 1 (the node's core);
- ``remote``: the Ray node only (``workers=0``), over the TCP data path;
- ``remote_store``: the same through Ray's object store (``cluster_transport="object_store"``);
- ``local+remote``: one local worker on core 0 beside the trainer, plus the Ray node.

Then the node throttled to 25/50/75/100 % of its core, for the linearity of rate against CPU
(R², over the median of each limit's rounds): where the CPU cgroup controller can be written
(root), the node's actor and worker share one CFS quota (limit % of every 100 ms period, the
kernel's own scheduler accounting); elsewhere each is held to the limit by ``cpulimit``, whose
stop/continue duty cycle is coarser (``--throttle`` picks one; with neither, or with
``--throttle none``, the throttled runs are left out and the JSON's ``throttled`` is empty).
Reported: img/s, the trainer process's CPU per image (all its threads: receiving, the consumer
loop), the receiver threads' own CPU per image (``stats()``), and bytes on the wire per image.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Peer, Result, interleave, print_facts, table, write_json  # noqa: E402

import stoker  # noqa: E402

TRAINER_CORE, NODE_CORE = {0}, {1}


def pin_threads(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (``sched_setaffinity`` sets one thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass


def start_cluster() -> Any:
    """A head without CPUs and one 1-CPU node, every Ray process on the node's core."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    pin_threads(os.getpid(), NODE_CORE)  # what the cluster's processes inherit
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    cluster.wait_for_nodes()
    pin_threads(os.getpid(), TRAINER_CORE)
    return cluster


def loader_for(kind: str, data: Path, args: argparse.Namespace) -> stoker.Loader:
    common = {"batch_size": args.batch, "image_size": 224, "augment": "train", "seed": 0}
    if kind == "local":
        return stoker.Loader(data, workers=1, **common)
    transport = "object_store" if kind == "remote_store" else "tcp"
    return stoker.Loader(
        data,
        workers=1 if kind == "local+remote" else 0,
        cluster="ray",
        cluster_listen="127.0.0.1",
        cluster_transport=transport,
        **common,
    )


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (cfs quota)


def cgroup_throttle_ok() -> bool:
    """Whether a CPU cgroup with a CFS quota can be made here (root, cgroup v1 cpu)."""
    return (CGROUP_CPU / "cpu.cfs_quota_us").exists() and os.access(CGROUP_CPU, os.W_OK)


THROTTLES = ("auto", "cgroup", "cpulimit", "none")


def throttle_for(requested: str) -> str:
    """The throttle ``--throttle requested`` gets here: ``auto`` is the cgroup where it can be
    written, else ``cpulimit`` where installed, else ``none``; a named one that cannot be used
    raises ``SystemExit`` with what it needs."""
    usable = {"cgroup": cgroup_throttle_ok(), "cpulimit": shutil.which("cpulimit") is not None}
    if requested == "auto":
        return next((name for name, ok in usable.items() if ok), "none")
    if requested != "none" and not usable[requested]:
        need = {"cgroup": "root and cgroup v1's cpu controller", "cpulimit": "cpulimit installed"}
        raise SystemExit(f"--throttle {requested} needs {need[requested]}")
    return requested


@contextlib.contextmanager
def throttled_to(pids: list[int], limit: int, throttle: str) -> Iterator[None]:
    """``pids`` held to ``limit`` % of one core together while the block runs, by ``throttle``
    (``cgroup`` or ``cpulimit``; ``none`` holds nothing back)."""
    if limit >= 100 or throttle == "none":
        yield
        return
    if throttle == "cpulimit":
        yield from _cpulimit(pids, limit)
        return
    group = CGROUP_CPU / f"stoker_bench_{os.getpid()}"
    group.mkdir(exist_ok=True)
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(limit * 1000))
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
        group.rmdir()


def _cpulimit(pids: list[int], limit: int) -> Iterator[None]:
    """The fallback: one ``cpulimit`` per process."""
    throttles = [
        subprocess.Popen(
            ["cpulimit", "-l", str(limit), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid in pids
    ]
    try:
        yield
    finally:
        for throttle in throttles:
            throttle.send_signal(signal.SIGINT)  # cpulimit lets its process run on as it goes
            throttle.wait(10)


def measure(kind: str, data: Path, args: argparse.Namespace, limit: int = 100) -> dict[str, Any]:
    """One timed run of peer ``kind`` (the node held to ``limit`` % of its core)."""
    me = psutil.Process()
    with loader_for(kind, data, args) as loader:
        stream = loader.stream()
        next(stream)  # start-up
        pin_threads(os.getpid(), TRAINER_CORE)  # the threads the loader started
        if kind == "local":
            for proc in loader._supply.running.pool.procs:  # type: ignore[union-attr]
                pin_threads(proc.pid, NODE_CORE)
        node = loader.stats().cluster["nodes"][0] if kind != "local" else {}
        pids = [node["pid"], *node["workers"]] if node else []
        with throttled_to(pids, limit, args.throttle):
            for _ in range(args.warmup):
                next(stream)
            cpu0, t0, images = sum(me.cpu_times()[:2]), time.perf_counter(), 0
            for _ in range(args.batches):
                images += len(next(stream)[1])
            seconds = time.perf_counter() - t0
            cpu = sum(me.cpu_times()[:2]) - cpu0
        cluster = loader.stats().cluster
    return {
        "kind": kind,
        "limit": limit,
        "img_s": images / seconds,
        "trainer_cpu_ms": 1e3 * cpu / images,
        "receive_ms": cluster.get("receive_ms_per_image", 0.0),
        "wire_bytes": cluster.get("wire_bytes_per_image", 0.0),
    }


KINDS = ("local", "remote", "local+remote", "remote_store")
LIMITS = (25, 50, 75, 100)  # % of the node's core
FIGURES = ("trainer_cpu_ms", "receive_ms", "wire_bytes")  # besides img_s
HEADER = "peer|img/s|range|trainer CPU ms/img|receive ms/img|KB/img on the wire".split("|")


def _peer(
    kind: str, data: Path, args: argparse.Namespace, limit: int, runs: list[dict[str, Any]]
) -> Peer:
    """Peer ``kind`` (the node held to ``limit`` %): each run's figures, kept in ``runs``."""

    def run() -> dict[str, float]:
        runs.append(measure(kind, data, args, limit))
        print(runs[-1], flush=True)
        return {k: v for k, v in runs[-1].items() if k not in ("kind", "limit")}

    return Peer(_name(kind, limit), run)


def _name(kind: str, limit: int) -> str:
    """The peer ``kind`` with its node held to ``limit`` %."""
    return kind if limit >= 100 else f"{kind} at {limit} %"


def r_squared(x: list[float], y: list[float]) -> float:
    """R² of the least-squares line through ``(x, y)``."""
    slope, icept = np.polyfit(x, y, 1)
    pred = np.polyval([slope, icept], x)
    total = float(np.sum((np.array(y) - np.mean(y)) ** 2))
    return 1.0 - float(np.sum((np.array(y) - pred) ** 2)) / total if total > 0 else 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=900, help="JPEGs in the data set")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=24, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", default=None, help="an ImageFolder (default: benchmarks/photos)")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--throttle",
        choices=THROTTLES,
        default="auto",
        help="how the node is held to 25/50/75 %% of its core: a CPU cgroup (root), cpulimit, "
        "or none (the throttled runs are left out); auto: the first of these that works here",
    )
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("needs 2 cores (the trainer's and the node's)")
        return 2
    requested, args.throttle = args.throttle, throttle_for(args.throttle)
    if args.throttle == "none" and requested == "auto":
        print("note: no CPU cgroup can be written and cpulimit is not installed: the throttled")
        print("runs are left out (apt-get install -y cpulimit, or run as root, to measure them)")
    facts = print_facts()
    tmp = Path(tempfile.mkdtemp(prefix="stoker_cluster_bench_"))
    try:
        if args.data:
            data = Path(args.data)
        else:
            import photo_source

            data = photo_source.make_folder(tmp / "data", 3, args.images // 3, 2)
        cluster = start_cluster()
        runs: list[dict[str, Any]] = []
        peers = [_peer(kind, data, args, 100, runs) for kind in KINDS]
        result = interleave(peers, rounds=args.rounds, warmup=0)
        throttled: list[dict[str, Any]] = []
        throttled_result = None
        if args.throttle != "none":
            limits = [_peer("remote", data, args, limit, throttled) for limit in LIMITS]
            throttled_result = interleave(limits, rounds=args.rounds, warmup=0)
        for group, size in ((runs, len(KINDS)), (throttled, len(LIMITS))):
            for i, run in enumerate(group):
                run["round"] = i // size
        report(result, throttled_result)
        payload = {"facts": facts, "runs": runs, "throttled": throttled, "args": vars(args)}
        payload["rounds"] = result.to_json("local: img_s")
        payload["throttled_rounds"] = throttled_result.to_json() if throttled_result else None
        write_json(args.json, payload)
        import ray

        ray.shutdown()
        cluster.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(result: Result, throttled: Result | None) -> None:
    """The peers' table, the ratios against one local worker, the table of the per-round
    ratios, and the throttle line (``throttled`` None: the throttled runs were left out)."""
    rows = []
    for kind in KINDS:
        st = result.stats(f"{kind}: img_s")
        cpu, receive, wire = (result.stats(f"{kind}: {f}")["median"] for f in FIGURES)
        rows.append([kind, f"{st['median']:,.0f}", f"{st['min']:,.0f}-{st['max']:,.0f}"])
        rows[-1] += [f"{cpu:.3f}", f"{receive:.3f}", f"{wire / 1e3:,.1f}"]
    print(table(rows, HEADER))
    med = {kind: result.stats(f"{kind}: img_s")["median"] for kind in KINDS}
    print(f"remote / local: {med['remote'] / med['local']:.2f} (goal >= 0.9)")
    print(f"local+remote / local: {med['local+remote'] / med['local']:.2f} (goal >= 1.8)")
    print(f"object store / tcp: {med['remote_store'] / med['remote']:.2f}")
    rates = Result(
        {k: v for k, v in result.values.items() if k.endswith(": img_s")}, result.rounds, 0
    )
    print(table(rates.rows("local: img_s"), rates.header("local: img_s")))
    if throttled is None:
        print("throttled node: not measured (--throttle none)")
        return
    x = [float(limit) for limit in LIMITS]
    y = [throttled.stats(f"{_name('remote', limit)}: img_s")["median"] for limit in LIMITS]
    print(
        "throttled node: "
        + ", ".join(f"{int(a)} % {b:,.0f} img/s" for a, b in zip(x, y, strict=True))
        + f"; R^2 {r_squared(x, y):.3f} (goal >= 0.98)"
    )


if __name__ == "__main__":
    sys.exit(main())

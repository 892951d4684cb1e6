"""The cluster's start, seen from the trainer: joining Ray, placing one decode actor per node,
and the checks before any batch is asked for (same stoker and decoders, the data readable, a
probe batch byte-identical). Any failure is a ClusterError naming the node."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ClusterError
from ..shm.segments import by_value
from . import actor as actor_mod
from .packing import pack

if TYPE_CHECKING:
    from ..recipe import Recipe
    from .clusteroptions import ClusterOptions
    from .runspec import RunSpec

NODE_SLOTS_PER_CORE = 4  # a node's own ring: more than the trainer ever asks of one core
START_TIMEOUT_S = 180.0


@dataclass
class Node:
    """The trainer's view of one node's actor, and what it delivered."""

    index: int
    node_id: str
    ip: str
    cores: int
    first_wid: int
    actor: Any = None
    transport: str = "tcp"
    why: str = ""  # why this node is on the object-store path when TCP was asked for
    sock: socket.socket | None = None
    alive: bool = True
    pid: int = 0  # the actor's process
    workers: list[int] = field(default_factory=list)  # its worker processes
    in_flight: int = 0
    images: int = 0
    bytes: int = 0
    batches: int = 0
    reissued: int = 0
    bad: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    receive_cpu_s: float = 0.0

    @property
    def wids(self) -> range:
        """The engine's worker ids standing for this node's cores."""
        return range(self.first_wid, self.first_wid + self.cores)

    def row(self) -> dict[str, Any]:
        """This node's line in ``stats()``."""
        span = self.last_at - self.first_at
        return {
            "node": self.ip,
            "id": self.node_id[:12],
            "cores": self.cores,
            "transport": self.transport,
            "alive": self.alive,
            "batches": self.batches,
            "images": self.images,
            "img_s": self.images / span if span > 0 else 0.0,
            "wire_mb_s": self.bytes / 1e6 / span if span > 0 else 0.0,
            "wire_bytes": self.bytes,
            "reissued": self.reissued,
            "bad": self.bad,
            "in_flight": self.in_flight,
            "pid": self.pid,
            "workers": list(self.workers),
            **({"why": self.why} if self.why else {}),
        }


def join(ray: Any, address: str) -> None:
    """Join the Ray cluster at ``address``, unless this process already has."""
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except ConnectionError as exc:
        raise ClusterError(
            f"cluster={'ray' if address == 'auto' else address!r}: no Ray cluster to join "
            f"({exc}). Start one (ray start --head) and its nodes (ray start "
            "--address=HEAD:6379), or call ray.init(...) before making the Loader"
        ) from exc


def place(ray: Any, opts: ClusterOptions, first_wid: int) -> list[Node]:
    """Which nodes decode, with how many cores each."""
    here = ray.get_runtime_context().get_node_id()
    others = sorted(
        (
            n
            for n in ray.nodes()
            if n.get("Alive") and n["NodeID"] != here and n["Resources"].get("CPU", 0) >= 1
        ),
        key=lambda n: n["NodeID"],
    )
    have = sum(int(n["Resources"]["CPU"]) for n in others)
    want = opts.cores if opts.cores is not None else have
    if have == 0 or want > have:
        raise ClusterError(
            f"cluster_workers={opts.cores or 'auto'}: the Ray cluster has {have} CPU "
            f"core(s) on {len(others)} node(s) other than this trainer's; add nodes "
            "(ray start --address=HEAD:6379 on each) or ask for fewer cores"
        )
    nodes: list[Node] = []
    wid = first_wid
    for n in others:
        cores = min(int(n["Resources"]["CPU"]), want)
        if cores <= 0:
            break
        nodes.append(Node(len(nodes), n["NodeID"], n["NodeManagerAddress"], cores, wid))
        want -= cores
        wid += cores
    return nodes


def start_actors(
    ray: Any,
    nodes: list[Node],
    recipe: Recipe,
    run: RunSpec,
    secret: bytes,
) -> None:
    """One decode actor per node (``actor.Decoder``), pinned to it, making ``recipe``'s batches
    as ``run`` says and serving only callers that hold ``secret``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with by_value():  # other machines cannot map this one's shared memory
        blob = pack(recipe, {"source": recipe.source})
    remote = ray.remote(actor_mod.Decoder)
    job = os.urandom(4).hex()
    for node in nodes:
        capacity = node.cores * NODE_SLOTS_PER_CORE
        node.actor = remote.options(
            num_cpus=node.cores,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=capacity + 4,
            name=f"stoker-{os.getpid()}-{job}-{node.index}",
        ).remote(blob, secret, node.cores, capacity, run)


def get_all(ray: Any, nodes: list[Node], refs: list[Any], what: str, timeout: float) -> list[Any]:
    """``ray.get`` with the start-up timeout; a node's failure is a ClusterError naming it."""
    out = []
    for node, ref in zip(nodes, refs, strict=True):
        try:
            out.append(ray.get(ref, timeout=max(timeout, START_TIMEOUT_S)))
        except ray.exceptions.GetTimeoutError as exc:
            raise ClusterError(
                f"node {node.ip} did not answer {what} within {max(timeout, START_TIMEOUT_S):.0f} s"
            ) from exc
        except ray.exceptions.RayError as exc:
            raise ClusterError(f"node {node.ip} failed {what}: {cause(exc)}") from exc
    return out


def check(
    ray: Any,
    nodes: list[Node],
    recipe: Recipe,
    probe: Callable[[], dict[str, Any]],
    timeout: float,
    secret: bytes,
) -> None:
    """Same stoker and decoders, the data readable, and a probe batch byte-identical."""
    source = recipe.source
    first = int(recipe.plan.order(0)[0])
    hellos = get_all(
        ray, nodes, [n.actor.hello.remote(first) for n in nodes], "its start-up", timeout
    )
    ours = actor_mod.identity()
    trainer_reads = readable(source, first)
    for node, hello in zip(nodes, hellos, strict=True):
        for what, mine in ours.items():
            theirs = hello["identity"].get(what)
            if theirs != mine:
                raise ClusterError(
                    f"node {node.ip} ({hello['host']}) runs {what} {theirs}, this trainer "
                    f"{mine}: every node must run the same stoker and decoders (pip install "
                    "the same stoker version, and its extension built, on every node)"
                )
        if hello["unreadable"] and trainer_reads:
            raise ClusterError(
                f"node {node.ip} (host {hello['host']}, Ray node {node.node_id[:12]}) cannot "
                f"read {hello['name']}, which this trainer reads: {hello['unreadable']}. "
                "Every node must reach the data at the same path (a shared file system "
                "mounted alike on every node), or put the data in a bucket (s3://, gs://, https://)"
            )
    started = get_all(
        ray, nodes, [n.actor.start.remote(secret) for n in nodes], "starting its workers", timeout
    )
    for node, pids in zip(nodes, started, strict=True):
        node.pid, node.workers = pids["pid"], pids["workers"]
    refs = [n.actor.probe.remote(secret, (0, 0)) for n in nodes]
    own = probe()  # while the nodes make theirs
    found = get_all(ray, nodes, refs, "the probe batch", timeout)
    if "digest" not in own:
        return
    for node, theirs in zip(nodes, found, strict=True):
        if theirs.get("digest") != own["digest"]:
            raise ClusterError(
                f"node {node.ip} made probe batch (epoch 0, batch 0) differently from this "
                f"trainer ({theirs.get('error') or 'other bytes'}): its CPU or libraries "
                "round differently (OpenCV, libjpeg SIMD). Use nodes of the same kind, "
                "with the same packages, as the trainer"
            )


def readable(source: Any, index: int) -> bool:
    """Whether this process can read sample ``index``."""
    try:
        source.read(index)
        return True
    except Exception:  # noqa: BLE001 - a bad sample: counted like any other, not a node's fault
        return False


def cause(exc: BaseException) -> str:
    """The last lines of an exception's text (a Ray error carries the remote traceback)."""
    text = str(exc).strip().splitlines()
    return " ".join(text[-3:]) if text else type(exc).__name__

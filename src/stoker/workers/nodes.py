"""The cluster's nodes, seen from the trainer: placing one decode actor per Ray node, the
checks at start (same stoker and decoders, the data readable, a probe batch byte-identical),
the data connections (``wire``: authenticated TCP, or Ray's object store) and the threads that
receive batches straight into ring slots. Losses and replies go to the engine
(``workers.cluster``) through one event queue."""

from __future__ import annotations

import functools
import itertools
import os
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import errors as errors_mod
from ..assemble import Report
from ..errors import ClusterError, StokerError
from ..schema import SlotLayout
from ..shm.segments import Segment, by_value
from . import actor as actor_mod
from . import wire
from .engine import Key
from .launch import pack

if TYPE_CHECKING:
    from ..loader.recipe import Recipe
    from .cluster import ClusterOptions

NODE_SLOTS_PER_CORE = 4  # a node's own ring: more than the trainer ever asks of one core
START_TIMEOUT_S = 180.0
ACCEPT_S = 0.5
STOP_TIMEOUT_S = 10.0  # a node's pool stops in well under this; then its actor is killed
#: Test-only hook: the stoker version every node started from now on claims to run
#: (``tests/test_cluster.py`` proves a mismatch is refused). Never set it elsewhere.
CLAIMED_VERSION: str | None = None


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


@dataclass
class Ticket:
    """One request to a node: which batch, into which slot."""

    node: Node
    wid: int
    key: Key
    slot: int
    view: memoryview


class Nodes:
    """Every node's actor, the data connections, and the receiving threads."""

    def __init__(
        self,
        opts: ClusterOptions,
        recipe: Recipe,
        first_wid: int,
        timeout: float,
        probe: Callable[[], dict[str, Any]],
        threads: int | None = 1,
    ) -> None:
        import ray

        self.ray, self.opts, self.timeout = ray, opts, timeout
        self.layout: SlotLayout = recipe.schema.slot_layout
        self.offsets = _offsets(self.layout)
        self.secret = wire.new_secret()
        self.tickets: dict[int, Ticket] = {}
        self.counter = itertools.count(1)
        self.lock = threading.Lock()
        self.events: deque[tuple[int, tuple]] = deque()
        self.wake_r, self.wake_w = socket.socketpair()
        self.pending: dict[Any, int] = {}  # object-store refs -> ticket
        self.refused = self.duplicates = 0
        self.closed = False
        self.listener: socket.socket | None = None
        self.listen = ""
        self.threads: list[threading.Thread] = []
        self._join(opts.address)
        self.nodes = self._place(first_wid)
        self.cores = sum(n.cores for n in self.nodes)
        try:
            self._start_actors(recipe, threads)
            self._check(recipe, probe)
            self._connect()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start

    def _join(self, address: str) -> None:
        ray = self.ray
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

    def _place(self, first_wid: int) -> list[Node]:
        """Which nodes decode, with how many cores each."""
        here = self.ray.get_runtime_context().get_node_id()
        others = sorted(
            (
                n
                for n in self.ray.nodes()
                if n.get("Alive") and n["NodeID"] != here and n["Resources"].get("CPU", 0) >= 1
            ),
            key=lambda n: n["NodeID"],
        )
        have = sum(int(n["Resources"]["CPU"]) for n in others)
        want = self.opts.cores if self.opts.cores is not None else have
        if have == 0 or want > have:
            raise ClusterError(
                f"cluster_workers={self.opts.cores or 'auto'}: the Ray cluster has {have} CPU "
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

    def _start_actors(self, recipe: Recipe, threads: int | None) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with by_value():  # other machines cannot map this one's shared memory
            blob = pack(recipe, {"source": recipe.source})
        remote = self.ray.remote(actor_mod.Decoder)
        job = os.urandom(4).hex()
        for node in self.nodes:
            capacity = node.cores * NODE_SLOTS_PER_CORE
            node.actor = remote.options(
                num_cpus=node.cores,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                max_restarts=0,
                max_task_retries=0,
                max_concurrency=capacity + 4,
                name=f"stoker-{os.getpid()}-{job}-{node.index}",
            ).remote(blob, node.cores, capacity, self.timeout, threads, CLAIMED_VERSION)

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """``ray.get`` with the start-up timeout; a node's failure is a ClusterError naming it."""
        out = []
        for node, ref in zip(self.nodes, refs, strict=True):
            try:
                out.append(self.ray.get(ref, timeout=max(self.timeout, START_TIMEOUT_S)))
            except self.ray.exceptions.GetTimeoutError as exc:
                raise ClusterError(
                    f"node {node.ip} did not answer {what} within "
                    f"{max(self.timeout, START_TIMEOUT_S):.0f} s"
                ) from exc
            except self.ray.exceptions.RayError as exc:
                raise ClusterError(f"node {node.ip} failed {what}: {_cause(exc)}") from exc
        return out

    def _check(self, recipe: Recipe, probe: Callable[[], dict[str, Any]]) -> None:
        """Same stoker and decoders, the data readable, and a probe batch byte-identical."""
        source = recipe.source
        first = int(recipe.plan.order(0)[0])
        hellos = self._get([n.actor.hello.remote(first) for n in self.nodes], "its start-up")
        ours = actor_mod.identity()
        trainer_reads = _readable(source, first)
        for node, hello in zip(self.nodes, hellos, strict=True):
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
                    "mounted alike on every node), or use s3:// / gs:// / https:// shards"
                )
        started = self._get([n.actor.start.remote() for n in self.nodes], "starting its workers")
        for node, pids in zip(self.nodes, started, strict=True):
            node.pid, node.workers = pids["pid"], pids["workers"]
        refs = [n.actor.probe.remote((0, 0)) for n in self.nodes]
        own = probe()  # while the nodes make theirs
        found = self._get(refs, "the probe batch")
        if "digest" not in own:
            return
        for node, theirs in zip(self.nodes, found, strict=True):
            if theirs.get("digest") != own["digest"]:
                raise ClusterError(
                    f"node {node.ip} made probe batch (epoch 0, batch 0) differently from this "
                    f"trainer ({theirs.get('error') or 'other bytes'}): its CPU or libraries "
                    "round differently (OpenCV, libjpeg SIMD). Use nodes of the same kind, "
                    "with the same packages, as the trainer"
                )

    def _connect(self) -> None:
        """The data connections (TCP), or the object-store path where asked or where one
        could not be made."""
        if self.opts.transport == "object_store":
            for node in self.nodes:
                node.transport = "object_store"
        else:
            self._connect_tcp()
        if any(n.transport == "object_store" for n in self.nodes):
            self._spawn(self._collect, "stoker-cluster-store")
        if self.listener is not None:
            self._spawn(self._doorman, "stoker-cluster-door")

    def _connect_tcp(self) -> None:
        host = self.opts.listen or self.ray.util.get_node_ip_address()
        self.listener = socket.create_server((host, 0))
        self.listen = f"{host}:{self.listener.getsockname()[1]}"
        self.listener.settimeout(ACCEPT_S)
        port = self.listener.getsockname()[1]
        refs = [n.actor.connect.remote(host, port, self.secret, n.index) for n in self.nodes]
        deadline = time.monotonic() + max(self.timeout, START_TIMEOUT_S)
        while time.monotonic() < deadline:
            self._accept_one()  # a node's connect() returns only after its handshake here
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
            if len(done) == len(refs):
                break
        for node, why in zip(self.nodes, self._get(refs, "the data connection"), strict=True):
            if why and node.sock is not None:
                node.sock.close()
                node.sock = None
            if why or node.sock is None:
                node.transport, node.why = "object_store", why or "no connection arrived"
            else:
                self._spawn(functools.partial(self._receive, node), f"stoker-cluster-{node.index}")

    def _accept_one(self) -> None:
        """Accept one connection and run the challenge; a peer without the secret is refused."""
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except (TimeoutError, OSError):
            return
        try:
            sock.settimeout(10.0)
            wire.prove(sock, self.secret, b"trainer", b"node")
            index = wire.LENGTH.unpack(wire.recv_exact(sock, wire.LENGTH.size))[0]
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            node = self.nodes[index]
            if node.sock is not None:
                raise wire.WireError("a second connection for one node")
            node.sock = sock
        except (OSError, EOFError, IndexError, wire.WireError):
            with self.lock:
                self.refused += 1
            sock.close()

    def _doorman(self) -> None:
        """After the start: every later connection is someone else's, refused and counted."""
        while not self.closed:
            self._accept_one()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    # ------------------------------------------------------------------ requests, replies

    def node_of(self, wid: int) -> Node:
        """The node whose core ``wid`` stands for."""
        return next(n for n in self.nodes if wid in n.wids)

    def request(self, wid: int, key: Key, slot: int, seg: Segment) -> None:
        """Ask the node of ``wid`` for batch ``key``, to be written into ``slot``."""
        node = self.node_of(wid)
        ticket = next(self.counter)
        view = memoryview(seg.map).cast("B")
        with self.lock:
            self.tickets[ticket] = Ticket(node, wid, key, slot, view)
            node.in_flight += 1
        if node.transport == "object_store":
            ref = node.actor.fill.remote(ticket, key[0], key[1])
            with self.lock:
                self.pending[ref] = ticket
            return
        assert node.sock is not None
        try:
            wire.send_request(node.sock, ticket, key)
        except OSError as exc:
            self._lost(node, f"its connection broke ({exc})")

    def _receive(self, node: Node) -> None:
        """One node's frames, straight into their slots (runs on a thread of its own)."""
        assert node.sock is not None
        start = time.thread_time()
        try:
            while True:
                head = wire.read_header(node.sock)
                report = wire.recv_exact(node.sock, head.report_len)
                with self.lock:
                    ticket = self.tickets.get(head.ticket)
                if ticket is None or ticket.node is not node or ticket.key != head.key:
                    wire.drain(node.sock, sum(head.lengths))
                    self._duplicate()
                    continue
                if head.kind == wire.DATA:
                    self._check_lengths(node, head.lengths)
                    for (offset, _), length in zip(self.offsets, head.lengths, strict=True):
                        wire.recv_into_exact(node.sock, ticket.view[offset : offset + length])
                self._deliver(node, head, report, sum(head.lengths))
                node.receive_cpu_s = time.thread_time() - start
        except (OSError, EOFError, wire.WireError, ClusterError) as exc:
            if not self.closed:
                self._lost(node, _why_lost(exc))

    def _collect(self) -> None:
        """The object-store path: results as Ray has them, copied into their slots."""
        start = time.thread_time()
        while not self.closed:
            with self.lock:
                refs = list(self.pending)
            if not refs:
                time.sleep(0.005)
                continue
            ready, _ = self.ray.wait(refs, num_returns=1, timeout=0.05)
            for ref in ready:
                with self.lock:
                    ticket_id = self.pending.pop(ref)
                    ticket = self.tickets.get(ticket_id)
                if ticket is None:
                    self._duplicate()
                    continue
                self._take_stored(ticket, ref)
                ticket.node.receive_cpu_s = time.thread_time() - start

    def _take_stored(self, ticket: Ticket, ref: Any) -> None:
        node = ticket.node
        try:
            frame, payload = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            if not self.closed:
                self._lost(node, _why_lost(exc))
            return
        head = wire.parse_header(
            frame[: wire.HEAD.size], lambda n: frame[wire.HEAD.size : wire.HEAD.size + n]
        )
        body = frame[wire.HEAD.size + len(head.lengths) * wire.LENGTH.size :]
        at = 0
        if head.kind == wire.DATA:
            self._check_lengths(node, head.lengths)
            for (offset, _), length in zip(self.offsets, head.lengths, strict=True):
                ticket.view[offset : offset + length] = payload[at : at + length].data
                at += length
        self._deliver(node, head, bytes(body), at)

    def _check_lengths(self, node: Node, lengths: tuple[int, ...]) -> None:
        if len(lengths) != len(self.offsets) or any(
            n > most for n, (_, most) in zip(lengths, self.offsets, strict=True)
        ):
            raise ClusterError(
                f"node {node.ip} sent a batch of another layout "
                f"({len(lengths)} fields): it runs other settings"
            )

    def _deliver(self, node: Node, head: wire.Header, report: bytes, nbytes: int) -> None:
        """Hand a received batch to the engine (through the event queue)."""
        with self.lock:
            ticket = self.tickets.pop(head.ticket, None)
            if ticket is not None:
                node.in_flight -= 1
        if ticket is None:
            self._duplicate()
            return
        now = time.perf_counter()
        node.first_at = node.first_at or now
        node.last_at, node.bytes, node.batches = now, node.bytes + nbytes, node.batches + 1
        if head.kind == wire.DATA:
            rep = _on_node(wire.report_from(report), node)
            node.images += rep.count
            node.bad += len(rep.bad)
            reply: tuple = ("ok", head.epoch, head.batch, ticket.slot, rep)
        else:
            reply = ("error", head.epoch, head.batch, ticket.slot, _error(report, node))
        self._event(ticket.wid, reply)

    def _duplicate(self) -> None:
        with self.lock:
            self.duplicates += 1

    def _lost(self, node: Node, why: str) -> None:
        """Tell the engine (once) that ``node`` is gone."""
        with self.lock:
            if not node.alive:
                return
            node.alive = False
        self._event(node.first_wid, ("lost", -1, -1, -1, why))

    def _event(self, wid: int, reply: tuple) -> None:
        with self.lock:
            self.events.append((wid, reply))
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    def take_events(self) -> list[tuple[int, tuple]]:
        """The replies and losses received since the last call."""
        try:
            self.wake_r.recv(65536)
        except BlockingIOError:
            pass
        with self.lock:
            out, self.events = list(self.events), deque()
        return out

    def forget(self, node: Node) -> None:
        """``node`` is gone: its requests are void (a late frame for one is dropped) and its
        actor is killed."""
        with self.lock:
            node.alive = False
            for ticket_id in [t for t, tk in self.tickets.items() if tk.node is node]:
                del self.tickets[ticket_id]
            node.in_flight = 0
        self._drop(node)

    def _drop(self, node: Node) -> None:
        if node.sock is not None:
            try:
                node.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            node.sock.close()
        if node.actor is not None:
            try:
                self.ray.kill(node.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def live_cores(self) -> int:
        """Cores of the nodes still decoding."""
        return sum(n.cores for n in self.nodes if n.alive)

    def report(self) -> dict[str, Any]:
        """The cluster's part of ``stats()``."""
        rows = [n.row() for n in self.nodes]
        images = sum(n.images for n in self.nodes)
        cpu = sum(n.receive_cpu_s for n in self.nodes)
        kinds = sorted({n.transport for n in self.nodes})
        return {
            "transport": " + ".join(kinds),
            "listen": self.listen,
            "nodes": rows,
            "cores": sum(n.cores for n in self.nodes if n.alive),
            "refused": self.refused,
            "duplicates_dropped": self.duplicates,
            "receive_ms_per_image": cpu * 1e3 / images if images else 0.0,
            "wire_bytes_per_image": sum(n.bytes for n in self.nodes) / images if images else 0.0,
        }

    def close(self) -> None:
        """Stop every node's pool, close the connections and kill every actor."""
        self.closed = True
        live = [n for n in self.nodes if n.alive and n.actor is not None]
        stops = [n.actor.stop.remote() for n in live]
        if stops:
            self.ray.wait(stops, num_returns=len(stops), timeout=STOP_TIMEOUT_S)
            ends = [n.actor.__ray_terminate__.remote() for n in live]  # a clean exit, no warning
            self.ray.wait(ends, num_returns=len(ends), timeout=STOP_TIMEOUT_S)
        for node in self.nodes:
            self._drop(node)
        if self.listener is not None:
            self.listener.close()
        for thread in self.threads:
            thread.join(2.0)
        self.wake_r.close()
        self.wake_w.close()


def _offsets(layout: SlotLayout) -> list[tuple[int, int]]:
    """``(offset, bytes)`` of each field in a slot."""
    out, at = [], 0
    for spec in layout.fields:
        out.append((at, layout.field_bytes(spec)))
        at += layout.field_bytes(spec)
    return out


def _readable(source: Any, index: int) -> bool:
    """Whether this process can read sample ``index``."""
    try:
        source.read(index)
        return True
    except Exception:  # noqa: BLE001 - a bad sample: counted like any other, not a node's fault
        return False


def _on_node(report: Report, node: Node) -> Report:
    """Bad and warned samples named with the node that met them."""
    report.bad = [(i, name, f"{why} [node {node.ip}]") for i, name, why in report.bad]
    report.warned = [(i, name, f"{why} [node {node.ip}]") for i, name, why in report.warned]
    return report


def _error(data: bytes, node: Node) -> dict[str, Any]:
    """A node's error frame as the engine's packed exception (same type where it is one of
    stoker's or a builtin; rebuilt here, never unpickled from the wire)."""
    import builtins
    import json

    info = json.loads(data)
    cls = getattr(errors_mod, info["type"], None) or getattr(builtins, info["type"], None)
    exc: BaseException
    try:
        exc = (
            cls(info["text"])
            if isinstance(cls, type) and issubclass(cls, Exception)
            else StokerError(f"{info['type']}: {info['text']}")
        )
    except Exception:  # noqa: BLE001 - a constructor with other arguments
        exc = StokerError(f"{info['type']}: {info['text']}")
    if info.get("bad"):
        exc.bad = [(i, n, f"{w} [node {node.ip}]") for i, n, w in info["bad"]]  # type: ignore
    return {
        "blob": pickle.dumps(exc),
        "type": info["type"],
        "text": info["text"],
        "tb": info["tb"],
        "wid": f"{info['wid']} on node {node.ip}",
        "sample": info["sample"],
    }


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(text[-3:]) if text else type(exc).__name__


def _why_lost(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "its connection closed (the actor or its node died)"
    return f"{type(exc).__name__}: {_cause(exc)}"

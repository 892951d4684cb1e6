"""The cluster's nodes, seen from the trainer, once started (``nodestart``): the data
connections (``door`` takes them, ``wire`` frames them; or Ray's object store) and the threads
that receive batches straight into ring slots. Losses and replies go to the engine
(``workers.cluster``) through one event queue."""

from __future__ import annotations

import functools
import itertools
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import errors as errors_mod
from ..assemble import Report
from ..errors import ClusterError, StokerError
from ..schema import SlotLayout
from ..shm.segments import Segment
from . import door, nodestart, wire
from .engine import Key
from .nodestart import Node

if TYPE_CHECKING:
    from ..recipe import Recipe
    from .runspec import RunSpec

__all__ = ["Node", "Nodes", "Ticket"]

STOP_TIMEOUT_S = 10.0  # a node's pool stops in well under this; then its actor is killed


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

    def __init__(self, recipe: Recipe, run: RunSpec, probe: Callable[[], dict[str, Any]]) -> None:
        """Start ``run.cluster``'s nodes (their workers numbered after the ``run.workers``
        local ones), each making ``recipe``'s batches as ``run`` says, checked with ``probe``."""
        import ray

        assert run.cluster is not None
        opts, timeout = run.cluster, run.timeout
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
        self.door: door.Door | None = None
        self.started = False
        self.listen = ""
        self.threads: list[threading.Thread] = []
        nodestart.join(ray, opts.address)
        self.nodes = nodestart.place(ray, opts, run.workers)
        self.cores = sum(n.cores for n in self.nodes)
        try:
            nodestart.start_actors(ray, self.nodes, recipe, run, self.secret)
            nodestart.check(ray, self.nodes, recipe, probe, timeout, self.secret)
            self._connect()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start

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

    def _connect_tcp(self) -> None:
        """Each node dials the door (``door``), retrying within ``timeout``; the door admits
        each node's first authenticated connection while the start lasts."""
        host = self.opts.listen or self.ray.util.get_node_ip_address()
        self.door = door.Door(door.listen(host), self.secret, self._admit, self._refuse)
        self.listen = f"{host}:{self.door.port}"
        refs = [
            n.actor.connect.remote(host, self.door.port, self.secret, n.index) for n in self.nodes
        ]
        whys = nodestart.get_all(self.ray, self.nodes, refs, "the data connection", self.timeout)
        with self.lock:
            self.started = True  # from now on every connection is someone else's
        for node, why in zip(self.nodes, whys, strict=True):
            if why and node.sock is not None:
                node.sock.close()
                node.sock = None
            if why or node.sock is None:
                node.transport, node.why = "object_store", why or "no connection arrived"
            else:
                self._spawn(functools.partial(self._receive, node), f"stoker-cluster-{node.index}")

    def _admit(self, index: int, sock: socket.socket) -> bool:
        """Node ``index`` takes ``sock`` (it proved the secret) while the start lasts; a node
        that tried again replaces the connection it gave up on."""
        with self.lock:
            if self.started or not 0 <= index < len(self.nodes):
                return False
            node = self.nodes[index]
            old, node.sock = node.sock, sock
        if old is not None:
            old.close()
        return True

    def _refuse(self) -> None:
        with self.lock:
            self.refused += 1

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
            ref = node.actor.fill.remote(self.secret, ticket, key[0], key[1])
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
        stops = [n.actor.stop.remote(self.secret) for n in live]
        if stops:
            self.ray.wait(stops, num_returns=len(stops), timeout=STOP_TIMEOUT_S)
            ends = [n.actor.__ray_terminate__.remote() for n in live]  # a clean exit, no warning
            self.ray.wait(ends, num_returns=len(ends), timeout=STOP_TIMEOUT_S)
        for node in self.nodes:
            self._drop(node)
        if self.door is not None:
            self.door.close()
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


def _why_lost(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "its connection closed (the actor or its node died)"
    return f"{type(exc).__name__}: {nodestart.cause(exc)}"

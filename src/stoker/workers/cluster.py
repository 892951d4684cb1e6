"""Decode on a Ray cluster: the trainer's side.

``Loader(cluster="ray", cluster_workers=N)`` places one decode actor (``workers.actor``) on
each Ray node other than the trainer's and gives it the loader's Recipe, the one the local pool
gets. The actors' cores join the prefetch engine as extra workers: :class:`MixedPool` puts the
local worker processes and the remote cores behind the one ``WorkerPool`` interface, and
:class:`ClusterEngine` (the local ``Engine``) asks for a batch only when a ring slot is free and
takes batches in key order ``(epoch, batch)``, whoever made them. Batch ``k`` of epoch ``e``
is a pure function of the plan, so a node makes the same bytes as a local worker; a probe
batch compared byte for byte at start proves it for each node.

Data path: each node streams finished batches over one authenticated TCP connection straight
into the ring slot (``wire``; ``recv_into`` on a receiver thread, no pickle), or through Ray's
object store (``cluster_transport="object_store"``, and for a node whose connection could not
be made). Ray places the actors and reports their deaths; a node that is gone has its batches
reissued to the others, each batch accepted once (a request's ticket dies with its node).
Ray is imported only by this package, when a loader has ``cluster=`` (``address`` checks
the address when the Loader is made).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from ..assemble import Assembler, Report
from ..errors import ClusterError, warn
from ..schema import SlotLayout
from ..shm.segments import Segment
from . import actor as actor_mod
from .engine import Engine, Key, RingSpec
from .nodes import Node, Nodes
from .pool import WorkerPool

__all__ = [
    "ClusterEngine",
    "MixedPool",
    "Node",
    "Nodes",
    "probe_digest",
]

STRIKES = 3  # a batch in flight on this many nodes that died is the cause, not bad luck
REMOTE_EXTRA = 1  # batches in flight per remote core beyond a local worker's (the wire's latency)


def probe_digest(assembler: Assembler, layout: SlotLayout, key: Key) -> dict[str, Any]:
    """Batch ``key`` filled in this process: its digest (as the nodes compute it) or error."""
    arrays = layout.arrays()
    try:
        report = assembler.fill(key[0], key[1], arrays)
    except Exception as exc:  # noqa: BLE001 - then the probe compares nothing
        return {"error": f"{type(exc).__name__}: {exc}"}
    parts = [np.ascontiguousarray(a[: report.count]).data.cast("B") for a in arrays.values()]
    return {"digest": actor_mod.digest(parts), "bad": [list(b) for b in report.bad]}


# ---------------------------------------------------------------------------- pool, engine


class MixedPool:
    """The local worker processes (if any) and the nodes' cores behind ``WorkerPool``'s
    interface: worker ids ``0..local-1`` are local processes, the rest stand for remote cores."""

    def __init__(self, local: WorkerPool | None, nodes: Nodes) -> None:
        self.local, self.nodes = local, nodes
        self.n_local = len(local.procs) if local is not None else 0
        self.procs: list[Any] = [*(local.procs if local else []), *([None] * nodes.cores)]
        self.started = local.started if local is not None else []
        self.segment_of: Callable[[int], Segment] | None = None  # set by the engine

    def send(self, wid: int, task: tuple) -> None:
        """Give worker ``wid`` (local or remote) a task."""
        if wid < self.n_local:
            assert self.local is not None
            self.local.send(wid, task)
            return
        assert self.segment_of is not None
        epoch, batch, slot, _ = task
        self.nodes.request(wid, (epoch, batch), slot, self.segment_of(slot))

    def receive(self, timeout: float) -> list[tuple[int, tuple]]:
        """Replies from local workers and nodes (and losses of nodes) within ``timeout``."""
        conns: list[Any] = [*(self.local.conns if self.local else []), self.nodes.wake_r]
        ready = wait(conns, timeout)
        out: list[tuple[int, tuple]] = []
        if self.local is not None and any(c is not self.nodes.wake_r for c in ready):
            out += self.local.receive(0)
        if self.nodes.wake_r in ready:
            out += self.nodes.take_events()
        return out

    def check_alive(self, context: str) -> None:
        """A dead local worker raises as without a cluster (nodes report their own losses)."""
        if self.local is not None:
            self.local.check_alive(context)

    def current_sample(self, wid: int) -> int:
        """The sample a local worker is on; -1 for a remote core (not known here)."""
        return self.local.current_sample(wid) if self.local and wid < self.n_local else -1

    def forget(self) -> None:
        """In a forked child: drop everything, stop nothing (it is the parent's)."""
        if self.local is not None:
            self.local.forget()
        self.nodes.closed = True

    def close(self, timeout: float = 5.0) -> None:
        """Stop the nodes and the local workers."""
        self.nodes.close()
        if self.local is not None:
            self.local.close(timeout)


class ClusterEngine(Engine):
    """The prefetch engine over a MixedPool: dead nodes' batches go to the others."""

    def __init__(
        self, pool: MixedPool, ring: RingSpec, samples: Callable[[Key], list[str]]
    ) -> None:
        super().__init__(pool, ring)
        self.mixed, self.samples = pool, samples
        pool.segment_of = lambda slot: self.segments[slot]
        self.dead: set[int] = set()
        self.strikes: dict[Key, int] = {}
        self.sent: dict[Key, float] = {}  # when each key in flight on a node was asked for
        self.requested = self.taken = self.max_ahead = 0

    def get(self, key: Key) -> tuple[dict[str, np.ndarray], Report]:
        """As ``Engine.get``; also counts how far requests ran ahead of the consumer."""
        out = super().get(key)
        self.taken += 1
        return out

    def _cap(self, wid: int) -> int:
        return self.per_worker + (REMOTE_EXTRA if wid >= self.mixed.n_local else 0)

    def _live(self) -> list[int]:
        live = [w for w in range(len(self.load)) if w not in self.dead]
        if not live:
            raise ClusterError(
                "every cluster node is gone and this loader has no local workers (workers=0) "
                "to carry on; see the warnings above for why each node left. Pass workers=N "
                "as well to keep training on this machine when the cluster fails"
            )
        return live

    def _fill_window(self) -> None:
        """Schedule keys while a slot is free and some live worker or node has room."""
        while self.free and self.next_key is not None:
            wid = min(self._live(), key=lambda w: self.load[w] / self._cap(w))
            if self.load[wid] >= self._cap(wid):
                return
            slot, key = self.free.popleft(), self.next_key
            self._send(wid, key, slot)
            self.scheduled.append(key)
            self.next_key = self._advance(key)
            self.requested += 1
            self.max_ahead = max(self.max_ahead, len(self.inflight))

    def _send(self, wid: int, key: Key, slot: int) -> None:
        self.pool.send(wid, (key[0], key[1], slot, self.segments[slot].handle()))
        self.load[wid] += 1
        self.inflight[key] = (wid, slot)
        self.sent[key] = time.monotonic()

    def _wait_one(self, key: Key) -> None:
        """As ``Engine._wait_one``; a batch on a node that has not come within ``timeout`` of
        its request makes that node hung: it is dropped as a dead one is, and the batches it
        holds go to the others (a late copy of one is dropped by its ticket)."""
        wid = self.inflight[key][0] if key in self.inflight else -1
        if wid < self.mixed.n_local:
            super()._wait_one(key)
            return
        while True:
            if self._handle_replies():
                return
            self.pool.check_alive(self._context(wid, key))
            if self.inflight.get(key, (-1,))[0] != wid:
                return  # reissued meanwhile
            if time.monotonic() > self.sent[key] + self.timeout:
                self._lost(
                    wid,
                    f"hung: batch {key[1]} of epoch {key[0]} did not come within "
                    f"timeout={self.timeout:g} s of its request",
                )
                return

    def _sample(self, wid: int) -> str:
        """What worker ``wid`` is on, for a hang's message; a remote core names its node."""
        if wid >= self.mixed.n_local:
            return f"a batch on cluster node {self.mixed.nodes.node_of(wid).ip}"
        return super()._sample(wid)

    def _handle(self, wid: int, reply: tuple) -> None:
        if reply[0] == "lost":
            self._lost(wid, reply[4])
            return
        self.sent.pop((reply[1], reply[2]), None)
        super()._handle(wid, reply)

    def _lost(self, wid: int, why: str) -> None:
        """A node is gone: its batches in flight go to the live workers and nodes."""
        nodes = self.mixed.nodes
        node = nodes.node_of(wid)
        nodes.forget(node)
        self.dead.update(node.wids)
        keys = sorted(k for k, (w, _) in self.inflight.items() if w in node.wids)
        warn(
            f"stoker: cluster node {node.ip} left ({why}); its {len(keys)} batch(es) in "
            f"flight go to the others ({nodes.live_cores()} remote core(s) and "
            f"{self.mixed.n_local} local worker(s) left)"
        )
        for key in keys:
            w, slot = self.inflight.pop(key)
            self.load[w] -= 1
            if key in self.discard:  # nobody waits for it any more
                self.discard.discard(key)
                self.sent.pop(key, None)
                self.free.append(slot)
                continue
            self.strikes[key] = self.strikes.get(key, 0) + 1
            if self.strikes[key] >= STRIKES:
                listed = "\n".join(f"  {s}" for s in self.samples(key)[:20])
                raise ClusterError(
                    f"batch {key[1]} of epoch {key[0]} was on {STRIKES} cluster nodes that died "
                    f"(the last: {node.ip}, {why}); one of its samples likely crashes the "
                    f"decoder:\n{listed}\nremove or fix the culprit"
                )
            live = self._live()
            new = min(live, key=lambda w: self.load[w] / self._cap(w))
            self._send(new, key, slot)
            node.reissued += 1

    def report(self) -> dict[str, Any]:
        """The cluster's part of ``stats()``, with the ring's back-pressure figures."""
        out = self.mixed.nodes.report()
        out.update(
            ring_slots=len(self.segments),
            max_in_flight=self.max_ahead,
            local_workers=self.mixed.n_local,
        )
        return out
